"""BatchNorm in the per-sample engine: exact in eval mode (a per-channel affine map), refused where it mixes the
samples of a batch (training mode, no running statistics) and "the gradient of l_i" has no meaning."""

from __future__ import annotations

from torch import Tensor, nn

from landscape.errors import ModelError
from landscape.persample.handlers import NormHandler, register_handler

_BatchNorm = nn.modules.batchnorm._BatchNorm


def batchnorm_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every BatchNorm layer of ``model`` with its name (``root`` for the model itself)."""
    return [(name or "root", m) for name, m in model.named_modules() if isinstance(m, _BatchNorm)]


def check_batchnorm(layers: list[tuple[str, nn.Module]], *, as_eval: bool = False) -> None:
    """``ModelError`` (one line) for the first of ``layers`` (from :func:`batchnorm_layers`) that normalises by
    batch statistics (training mode, or no running statistics; ``as_eval``: as it would run in eval mode)."""
    for name, m in layers:
        no_stats = m.running_mean is None or m.running_var is None
        if not no_stats and (as_eval or not m.training):
            continue
        if no_stats:
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
class BatchNormHandler(NormHandler):
    """BatchNorm's affine parameters in eval mode, normalised by the running statistics, per channel (dim 1)."""

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
        return super().per_sample_grads(u)
