"""The evaluator's entry point: :func:`evaluate` (mean cross-entropy, accuracy and hooked metrics at many
parameter points, one private model copy) and its :class:`EvalResult`."""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from landscape import progress
from landscape.errors import UsageError
from landscape.evaluate.allocator import tuned_allocator
from landscape.evaluate.metric import Metric, _check_metrics
from landscape.evaluate.points import Affine, Segment, _Listed
from landscape.evaluate.rewrites import _slice_pool_call
from landscape.evaluate.runner import _bn_batches, _Runner
from landscape.options import EVAL_CHUNK, EVAL_METHODS
from landscape.params import ParamSpace
from landscape.pooling import routed_pool_calls

DEFAULT_MEMORY_BUDGET = 1 << 30  # bytes of activations / cached first-layer outputs


@dataclass
class EvalResult:
    """Mean cross-entropy ``loss`` and ``acc`` (float64, shape (P,)) at each point, how fast, and each hooked
    metric's ``finish`` value by name."""

    loss: torch.Tensor
    acc: torch.Tensor
    examples: int
    seconds: float
    method: str
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def points(self) -> int:
        return int(self.loss.numel())

    @property
    def throughput(self) -> float:
        """Examples x points per second."""
        return self.examples * self.points / self.seconds if self.seconds > 0 else math.inf

    @property
    def nonfinite(self) -> torch.Tensor:
        return ~torch.isfinite(self.loss)


def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    points: Segment | Affine | torch.Tensor | Iterable[torch.Tensor],
    *,
    space: ParamSpace | None = None,
    batch_size: int | None = None,
    bn_recalibrate: torch.Tensor | Sequence[torch.Tensor] | None = None,
    bn_batch_size: int | None = None,
    device: str | torch.device = "cpu",
    method: str = "auto",
    channels_last: bool = False,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    metrics: Sequence[Metric] | None = None,
) -> EvalResult:
    """Loss and accuracy of ``model`` on ``(x, y)`` at every point (flat vectors over ``space``, default the
    model's parameters; buffers outside it keep the model's values). ``bn_recalibrate``: training inputs (a tensor
    or batches) from which every BatchNorm's statistics are recomputed at each point (``recalibrate_batchnorm``).
    ``metrics`` see the logits of the same forward passes. Non-finite losses are kept and warned about."""
    metrics = _check_metrics(metrics)
    if method not in EVAL_METHODS:
        raise UsageError(f"unknown evaluation method {method!r}; choose from {', '.join(EVAL_METHODS)}")
    if x.shape[0] != y.shape[0]:
        raise UsageError(f"x has {x.shape[0]} examples but y has {y.shape[0]}")
    if x.shape[0] == 0:
        raise UsageError("cannot evaluate on an empty data split")
    pts = points if isinstance(points, (Segment, Affine)) else _Listed(points)
    space = space or ParamSpace.from_model(model)
    if len(pts) and pts.dim != space.dim:
        raise UsageError(f"points have {pts.dim} entries but the parameter space has {space.dim}")
    batch_size = int(batch_size or EVAL_CHUNK)
    if batch_size < 1:
        raise UsageError(f"batch size must be >= 1, got {batch_size}")
    from landscape.runtime import resolve_device

    dev = resolve_device(device)
    bn_batches = _bn_batches(bn_recalibrate, bn_batch_size or batch_size)
    if bn_batches is not None and method == "vmap":
        raise UsageError("method 'vmap' cannot recalibrate BatchNorm statistics; use method 'loop'")

    start = time.perf_counter()
    with tuned_allocator(), torch.inference_mode(), contextlib.ExitStack() as stack:
        fast = method != "plain"  # the plain reference runs the model as given, batches as given
        runner = _Runner(model, space, dev, x, channels_last=channels_last, rewrite=fast)
        if runner.routes_pools:
            stack.enter_context(routed_pool_calls(_slice_pool_call))
        hooks = [(m, m.start(len(pts), dev)) for m in metrics]

        def task(step: int) -> progress.Task:  # one unit: one point's forward pass over one chunk of examples
            return stack.enter_context(progress.task(f"evaluate {len(pts)} points x {x.shape[0]} examples",
                                                     len(pts) * math.ceil(x.shape[0] / step), unit="forward passes"))

        if method == "vmap":
            loss, correct = runner.run_vmap(pts, x, y, batch_size, memory_budget, hooks, task(batch_size))
            used = "vmap"
        elif bn_batches is not None:
            used = "loop+bn" + ("+dense-conv" if fast and runner.densify() else "")
            step = runner.chunk(batch_size) if fast else batch_size
            loss, correct = runner.run_points_outer(pts, x, y, step, bn_batches, hooks, task(step))
        else:
            shared = fast and isinstance(pts, (Segment, Affine)) and runner.enable_first_layer()
            used = ("loop+first-layer" if shared else ("loop" if fast else "plain")) + (
                "+dense-conv" if fast and runner.densify() else "")  # after the first layer is chosen
            step = runner.chunk(batch_size) if fast else batch_size
            loss, correct = runner.run_batches_outer(pts, x, y, step, shared, hooks, task(step))
        values = {m.name: m.finish(state) for m, state in hooks}
        used += runner.normalized
    seconds = time.perf_counter() - start
    n = x.shape[0]
    result = EvalResult(loss=loss / n, acc=correct / n, examples=n, seconds=seconds, method=used, metrics=values)
    bad = int(result.nonfinite.sum())
    if bad:
        warnings.warn(f"non-finite loss at {bad} of {result.points} points", RuntimeWarning, stacklevel=2)
    return result
