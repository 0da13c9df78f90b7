"""BatchNorm in the per-sample engine: exact in eval mode (a per-channel affine map, ``BatchNormHandler``),
refused in training mode or without running statistics, where it mixes the samples of a batch and "the gradient
of l_i" has no meaning.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from landscape.errors import ModelError
from landscape.persample.handlers import Handler, register_handler

_BatchNorm = nn.modules.batchnorm._BatchNorm


def batchnorm_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every BatchNorm layer of ``model`` with its name (``root`` for the model itself)."""
    return [(name or "root", m) for name, m in model.named_modules() if isinstance(m, _BatchNorm)]


def mixes_samples(module: nn.Module, *, as_eval: bool = False) -> bool:
    """Whether this BatchNorm normalises by batch statistics (training mode, or no running statistics), as
    ``torch.nn.functional.batch_norm`` decides; ``as_eval``: as it would run in eval mode."""
    no_stats = module.running_mean is None or module.running_var is None
    return no_stats or (module.training and not as_eval)


def check_batchnorm(layers: list[tuple[str, nn.Module]], *, as_eval: bool = False) -> None:
    """``ModelError`` (one line) for the first of ``layers`` (from :func:`batchnorm_layers`) that mixes samples."""
    for name, m in layers:
        if not mixes_samples(m, as_eval=as_eval):
            continue
        if m.running_mean is None or m.running_var is None:
            why = ("has no running statistics (track_running_stats=False), so even in eval mode it normalises by "
                   "the statistics of the batch and per-sample gradients are undefined; build it with "
                   "track_running_stats=True")
        else:
            why = ("is in training mode, where it normalises by the statistics of the batch, so per-sample "
                   "gradients are undefined; call model.eval() to use its running statistics")
        raise ModelError(
            f"model has BatchNorm ({name}: {type(m).__name__}) that {why}, or build the model with norm=\"group\" "
            "(build_model(..., norm='group')) or convert it with landscape.models.convert_batchnorm_to_groupnorm(model)"
        )


def refuse_batchnorm(model: nn.Module, *, as_eval: bool = False) -> None:
    """Refuse a model with a BatchNorm layer that mixes the samples of a batch (training mode, or no running
    statistics); BatchNorm in eval mode with running statistics is exact. ``as_eval``: judge the model as it
    will run in eval mode (callers that put it there, such as :func:`landscape.gram.gram_blocks`)."""
    check_batchnorm(batchnorm_layers(model), as_eval=as_eval)


@register_handler(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
class BatchNormHandler(Handler):
    """BatchNorm's affine parameters in eval mode (running statistics; see the module docstring):
    g_i(weight) = sum over positions of B * xhat, g_i(bias) = sum of B, per channel (dim 1)."""

    @classmethod
    def accepts(cls, module):
        return module.running_mean is not None and module.running_var is not None

    def _xhat(self, a: Tensor) -> Tensor:
        m = self.module
        shape = (1, -1) + (1,) * (a.dim() - 2)
        mean = m.running_mean.to(a.dtype).reshape(shape)
        return (a - mean) * (m.running_var.to(a.dtype).reshape(shape) + m.eps).rsqrt()

    def _reduce(self, t: Tensor) -> Tensor:
        return self._sum(t.reshape(t.shape[0], t.shape[1], -1), 2)

    def per_sample_grads(self, u):
        if self.module.training:  # the engine refuses this before any forward; a direct user of the handler
            raise ModelError(f"{type(self.module).__name__} in training mode has no per-sample gradients")
        parts: dict[str, list[Tensor]] = {role: [] for role in self.pnames}
        for a, b in u["calls"]:
            if "weight" in parts:
                parts["weight"].append(self._reduce(b * self._xhat(a)))
            if "bias" in parts:
                parts["bias"].append(self._reduce(b))
        return {role: gs[0] if len(gs) == 1 else torch.stack(gs).sum(0) for role, gs in parts.items()}
