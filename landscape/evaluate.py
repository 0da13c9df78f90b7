"""Loss and accuracy of one model at many parameter points: the shared many-point evaluator.

Interpolation (Watson et al. Sec. 2.2, Def. 2.3), random directions, surfaces and pruning sweeps all call
:func:`evaluate`. The caller's model is never modified: one private copy is made per call (never one per
point) and each point is written into it in place. Evaluation runs under ``torch.inference_mode`` in
large batches, accumulates loss and correct counts in tensors (no ``.item()`` in the loops) and returns
the mean cross-entropy and the accuracy per point.

**Metric hook** (a public protocol: :class:`Metric`). ``evaluate(..., metrics=[...])`` records more than loss
and accuracy at every point in the same forward passes (the idea of loss-landscapes' small composable ``Metric``
objects, streamed here batch by batch): each metric keeps per-point sufficient statistics in device tensors, is
handed the logits and targets of every (batch, point), and its final value is returned in
``EvalResult.metrics[name]``. For example ``landscape.analyze.calibration.ECE`` gives the expected calibration
error along an interpolation path; :class:`MeanMetric` makes a per-example quantity (a Brier score, the
top-1 confidence) a metric in one method. interpolate, directions and surface take user metrics through
:mod:`landscape.metrics`. Without metrics nothing extra runs.

What makes many points cheaper than many independent evaluations (``method="loop"``, the default):

* **Shared first layer.** When the points have structure (:class:`Segment`: ``lerp(a, b, alpha)``;
  :class:`Affine`: ``origin + coords @ directions``) and the model's first parametrised layer is a
  ``Linear`` or ``Conv`` fed by the input alone, that layer's output is affine in its parameters:
  ``W_alpha x + b_alpha = lerp(W_a x + b_a, W_b x + b_b, alpha)``. It is computed once per generator and
  batch and mixed per point, instead of once per point. Exact up to float rounding, and bit-exact at the
  ends of a segment (``torch.lerp`` returns ``a`` at 0 and ``b`` at 1).
  A non-overlapping ``MaxPool2d`` right after that layer is folded in: its windows are cut from the
  shared outputs once per batch as contiguous tensors, and each point mixes them and takes the maximum
  (bit-identical to pooling the mixed output, without strided passes over it).
* **Exact module rewrites** in the private copy: ``MaxPool2d`` as a maximum over strided slices, window rows
  first, then columns (PyTorch's CPU kernel also computes argmax indices and was 5-10x slower here), and
  ``ReLU -> MaxPool2d`` in a ``Sequential`` swapped to pool-then-ReLU (both monotone: identical values, a
  quarter of the ReLU work).
* **Functional forwards** (a model brought as code that calls ``F.max_pool2d``, ``F.relu``, ``x.flatten(1)``
  in its ``forward``): the private copy is traced with ``torch.fx`` into a graph of modules
  (:func:`_modules_graph`: pool, ReLU and flatten calls become the modules the built-ins use, a shared pool
  module one copy per call, ``F.conv2d`` / ``F.linear`` with a layer's own weights and options that layer's
  call), so the rewrites above and the first-layer fold apply as to the built-ins, with the
  same numbers on the same weights (method ``...+graph``). A forward that cannot be traced keeps its calls, and
  its plain ``F.max_pool2d`` calls run as the strided-slice maximum through a ``TorchFunctionMode``
  (:func:`landscape.pooling.routed_pool_calls`; method ``...+pool-calls``). Either is checked bit for bit
  against the model on a probe batch and otherwise not used.
* **Small convolutions as one matrix product** (:class:`_DenseConv`): a ``Conv2d`` whose input has no more
  positions than its kernel (``H * W <= kh * kw``: LeNet's second convolution on 8 x 8 digits) runs as
  ``x.flatten(1) @ M + b``, no more multiply-adds and 2.6x faster here; a max pool right after it is folded
  into the product's columns. Same values up to the order of the float sums.
* **Cache-sized chunks**: each batch runs in chunks whose activations take at most ``CACHE_BUDGET`` bytes
  (:meth:`_Runner.chunk`), so the per-point element-wise passes stay near the cache.
* **Loss**: cross-entropy as ``logsumexp(logits) - logits[y]`` (F.cross_entropy's value, another summation
  order; 4x faster for 10 classes).
* **Memory format**: contiguous (NCHW) by default; ``channels_last=True`` runs convolutions channels-last.
  Which is faster depends on the CPU: on an AVX-512 Xeon channels-last was 5-15% slower for LeNet and
  ResNet-18/GroupNorm (and the plain loop 10% slower with it too); on an earlier machine it was the faster.
* **Batch-outer order**: each batch is moved and its shared work done once for all points.
* **Allocator**: on glibc, during the call (:func:`tuned_allocator`), freed large blocks are kept instead of
  being returned to the OS, so the many same-sized activations of a sweep do not page-fault afresh; on return the
  thresholds are set back to glibc's converged dynamic state (see there; ``LANDSCAPE_MALLOC_TUNE=0`` skips it).

``method="vmap"`` evaluates several points per forward with ``torch.func.functional_call`` + ``vmap`` over
stacked parameters (chunk size from a memory budget); on CPU it is slower for convolutional models
(grouped convolutions) and kept selectable. ``method="plain"`` writes each point and runs the model as
is (the reference the others are tested against).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import math
import os
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from landscape.errors import UsageError
from landscape.params import ParamSpace, lerp_tensor
from landscape.pooling import pair as _pair
from landscape.pooling import routed_pool_calls, simple_pool_call
from landscape.pooling import simple_pool as _simple_pool

METHODS = ("auto", "loop", "plain", "vmap")
DEFAULT_BATCH_SIZE = 1000
DEFAULT_MEMORY_BUDGET = 1 << 30  # bytes of activations / cached first-layer outputs
# The loop methods run each batch in chunks whose activations (all layers' outputs of one forward) take at
# most this many bytes, but never fewer than MIN_CHUNK examples: see _Runner.chunk.
CACHE_BUDGET = 16 << 20
MIN_CHUNK = 64


# ------------------------------------------------------------------------------------------------ points


@dataclass(frozen=True)
class Segment:
    """Points ``lerp_tensor(a, b, alpha)`` (exact ends) for each ``alpha`` (Watson et al. Sec. 2.2: ``(1-a) A + a B``)."""

    a: torch.Tensor
    b: torch.Tensor
    alphas: torch.Tensor

    def __len__(self) -> int:
        return int(self.alphas.numel())

    @property
    def dim(self) -> int:
        return int(self.a.numel())

    def point(self, i: int) -> torch.Tensor:
        return lerp_tensor(self.a, self.b, float(self.alphas[i]))

    def generators(self) -> list[torch.Tensor]:
        return [self.a, self.b]

    def mix(self, outputs: Sequence[torch.Tensor], i: int) -> torch.Tensor:
        return lerp_tensor(outputs[0], outputs[1], float(self.alphas[i]))


@dataclass(frozen=True)
class Affine:
    """Points ``origin + sum_j coords[p, j] * directions[j]`` (random directions and surfaces).

    Zero coordinates are skipped (adding ``0 * d`` changes nothing for finite ``d``), so a point with one
    non-zero coordinate (a ray ``origin + s d_j``, a grid line) costs one vector add, not ``k``.
    """

    origin: torch.Tensor
    directions: torch.Tensor  # (k, d)
    coords: torch.Tensor  # (P, k)

    def __post_init__(self) -> None:
        terms: list[list[tuple[int, float]]] = [[] for _ in range(len(self))]
        nz = torch.nonzero(self.coords)
        for (p, j), c in zip(nz.tolist(), self.coords[nz[:, 0], nz[:, 1]].tolist(), strict=True):
            terms[p].append((j, c))
        object.__setattr__(self, "_terms", terms)  # per point: (direction index, coordinate) where non-zero

    def __len__(self) -> int:
        return int(self.coords.shape[0])

    @property
    def dim(self) -> int:
        return int(self.origin.numel())

    def point(self, i: int) -> torch.Tensor:
        return _combine(self.origin, self.directions, self._terms[i])

    def generators(self) -> list[torch.Tensor]:
        return [self.origin, *self.directions.unbind(0)]

    def mix(self, outputs: Sequence[torch.Tensor], i: int) -> torch.Tensor:
        return _combine(outputs[0], outputs[1:], self._terms[i])


def _combine(base: torch.Tensor, vectors, terms: Sequence[tuple[int, float]]) -> torch.Tensor:
    """``base + sum c * vectors[j]`` over ``terms`` (a new tensor; ``base`` is not changed)."""
    if not terms:
        return base.clone()
    (j, c), rest = terms[0], terms[1:]
    out = torch.add(base, vectors[j], alpha=c)
    for j, c in rest:
        out.add_(vectors[j], alpha=c)
    return out


class _Listed:
    """Unstructured points: a (P, d) tensor or a list of flat vectors."""

    def __init__(self, points: torch.Tensor | Iterable[torch.Tensor]):
        if isinstance(points, torch.Tensor):
            if points.dim() == 1:
                points = points.unsqueeze(0)
            if points.dim() != 2:
                raise UsageError(f"points must be a (P, d) tensor, got shape {tuple(points.shape)}")
            self.rows = list(points.unbind(0))
        else:
            self.rows = [p.reshape(-1) for p in points]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def dim(self) -> int:
        return int(self.rows[0].numel()) if self.rows else 0

    def point(self, i: int) -> torch.Tensor:
        return self.rows[i]


# ----------------------------------------------------------------------------------------------- metrics


class Metric:
    """The evaluator's metric protocol: a per-point statistic accumulated from the evaluator's own forward passes.

    loss-landscapes' composable metrics (``Metric.__call__(model)``) evaluate a whole model per call; here a
    metric is streamed instead, so that any number of metrics share one forward pass per (batch, point). Any
    object with these members is a metric (subclassing is optional):

    * **Name(s).** ``name`` (str) identifies the metric: its key in ``EvalResult.metrics`` and, in the
      analyses, its column (``train_<name>`` along an interpolation, ``direction_<name>``, a surface's
      ``test_<name>`` grid). A metric reporting several numbers per point lists them in ``names`` (a tuple of
      column names) and its ``finish`` returns a mapping with exactly those keys. Column names are identifiers
      (``[A-Za-z][A-Za-z0-9_]*``); an analysis refuses one that clashes with its built-in columns (``loss``,
      ``acc``, ...).
    * **Accumulation.** ``start(points, device)`` returns a fresh state for ``points`` parameter points: device
      tensors with one slot per point holding sufficient statistics (sums and counts, not per-example values).
    * **Per batch.** ``update(state, point, logits, y)`` adds one batch at one point in place: ``point`` is the
      0-based index of the point, ``logits`` the model's ``(n, classes)`` output in its dtype on the evaluation
      device (under ``torch.inference_mode``; never modify it), ``y`` the ``(n,)`` int64 targets. Every example
      is seen exactly once per point, in data order, but the batch boundaries depend on ``batch_size`` and on the
      evaluator's cache-sized chunks, and the points of one batch are visited before the next batch (batch-outer
      order): a metric must be a function of the examples, not of the batches. Stay on the device (no
      ``.item()`` or other host synchronisation inside ``update``).
    * **Value.** ``finish(state)`` runs once, after the last batch, and returns the value per point: a ``(P,)``
      tensor or array of floats (or, with ``names``, a mapping ``column -> (P,)``). The analyses check it (one
      finite number per point wherever the loss is finite) and store it beside the loss.

    A metric object holds only its options, never state, so one object can be passed to many calls (and
    its class can be named on the command line: ``--metric file.py:Class``; see :mod:`landscape.metrics`).
    """

    name: str = "metric"

    def start(self, points: int, device: torch.device) -> Any:
        raise NotImplementedError

    def update(self, state: Any, point: int, logits: torch.Tensor, y: torch.Tensor) -> None:
        raise NotImplementedError

    def finish(self, state: Any) -> Any:
        return state


class MeanMetric(Metric):
    """A metric that is the mean over the examples of a per-example value: define :meth:`per_example`.

    The state is ``(points, 2)`` float64 on the device (sum of values, count); ``finish`` gives the means
    (numpy ``(P,)``). E.g. the Brier score: ``((softmax(logits) - one_hot(y)) ** 2).sum(1)``.
    """

    def per_example(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One value per example of the batch, shape ``(n,)``."""
        raise NotImplementedError

    def start(self, points: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(points, 2, dtype=torch.float64, device=device)

    def update(self, state: torch.Tensor, point: int, logits: torch.Tensor, y: torch.Tensor) -> None:
        values = self.per_example(logits, y)
        state[point, 0] += values.sum(dtype=torch.float64)
        state[point, 1] += values.numel()

    def finish(self, state: torch.Tensor):
        return (state[:, 0] / state[:, 1]).cpu().numpy()


def _check_metrics(metrics: Sequence[Metric] | None) -> list[Metric]:
    metrics = list(metrics or ())
    for m in metrics:
        if not all(callable(getattr(m, k, None)) for k in ("start", "update", "finish")) or not isinstance(
                getattr(m, "name", None), str):
            raise UsageError(f"{m!r} is not an evaluation metric (needs a name and start/update/finish)")
    names = [m.name for m in metrics]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UsageError(f"metric names repeat: {', '.join(repeated)}")
    return metrics


# ------------------------------------------------------------------------------------------------ result


@dataclass
class EvalResult:
    """Mean cross-entropy ``loss`` and ``acc`` (float64, shape (P,)) at each point, and how fast.

    ``metrics`` maps each hooked :class:`Metric`'s name to its ``finish`` value (empty without metrics).
    """

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


# ------------------------------------------------------------------------------------------------ public


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
    """Loss and accuracy of ``model`` on ``(x, y)`` at every point (flat vectors over ``space``).

    ``space`` defaults to the model's parameters (``ParamSpace.from_model``); buffers not in the space
    keep the model's values. ``bn_recalibrate`` is training inputs (a tensor, or a sequence of batches):
    for each point every BatchNorm layer's statistics are reset and recomputed as the cumulative average
    (``momentum=None``) over those inputs in train mode, then the model is evaluated in eval mode.
    Non-finite losses are recorded as NaN/inf and warned about. ``metrics`` (:class:`Metric` objects) see the
    logits of every batch at every point in the same forward passes; their values are in ``result.metrics``.
    """
    metrics = _check_metrics(metrics)
    if method not in METHODS:
        raise UsageError(f"unknown evaluation method {method!r}; choose from {', '.join(METHODS)}")
    if x.shape[0] != y.shape[0]:
        raise UsageError(f"x has {x.shape[0]} examples but y has {y.shape[0]}")
    if x.shape[0] == 0:
        raise UsageError("cannot evaluate on an empty data split")
    pts = points if isinstance(points, (Segment, Affine)) else _Listed(points)
    space = space or ParamSpace.from_model(model)
    if len(pts) and pts.dim != space.dim:
        raise UsageError(f"points have {pts.dim} entries but the parameter space has {space.dim}")
    batch_size = int(batch_size or DEFAULT_BATCH_SIZE)
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
        if method == "vmap":
            loss, correct = runner.run_vmap(pts, x, y, batch_size, memory_budget, hooks)
            used = "vmap"
        elif bn_batches is not None:
            used = "loop+bn" + ("+dense-conv" if fast and runner.densify() else "")
            step = runner.chunk(batch_size) if fast else batch_size
            loss, correct = runner.run_points_outer(pts, x, y, step, bn_batches, hooks)
        else:
            shared = fast and isinstance(pts, (Segment, Affine)) and runner.enable_first_layer()
            used = ("loop+first-layer" if shared else ("loop" if fast else "plain")) + (
                "+dense-conv" if fast and runner.densify() else "")  # after the first layer is chosen
            step = runner.chunk(batch_size) if fast else batch_size
            loss, correct = runner.run_batches_outer(pts, x, y, step, shared, hooks)
        values = {m.name: m.finish(state) for m, state in hooks}
        used += runner.normalized
    seconds = time.perf_counter() - start
    n = x.shape[0]
    result = EvalResult(loss=loss / n, acc=correct / n, examples=n, seconds=seconds, method=used, metrics=values)
    bad = int(result.nonfinite.sum())
    if bad:
        warnings.warn(f"non-finite loss at {bad} of {result.points} points", RuntimeWarning, stacklevel=2)
    return result


def recalibrate_batchnorm(model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
    """Recompute every BatchNorm layer's running statistics from ``batches`` (cumulative average).

    As ``torch.optim.swa_utils.update_bn``: the running mean and variance are the equal-weight average of the
    per-batch statistics (a short last batch counts like a full one, and the variance is the mean of
    per-batch variances). Pass the data as one batch for the exact full-set statistics.

    Only the BatchNorm layers are put in train mode (dropout and the rest stay as they are); afterwards
    they are back in eval mode with ``momentum`` restored. Runs without autograd.
    """
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    saved = [(m.momentum, m.training) for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
        m.train()
    try:
        with torch.no_grad():
            for xb in batches:
                model(xb)
    finally:
        for m, (momentum, training) in zip(bns, saved, strict=True):
            m.momentum = momentum
            m.train(training)
    for m in bns:
        m.eval()


# ----------------------------------------------------------------------------------------------- runner


class _Stop(Exception):
    pass


_AFFINE_FIRST = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


class _Runner:
    """A private copy of the model, prepared for fast repeated evaluation."""

    def __init__(self, model: nn.Module, space: ParamSpace, device: torch.device, x: torch.Tensor,
                 *, channels_last: bool, rewrite: bool = True):
        self.space = space
        self.model = copy.deepcopy(model).to(device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.channels_last = bool(channels_last) and x.dim() == 4
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.device = device
        self._x = x
        self.successor: dict[nn.Module, nn.Module] = {}  # from a traced graph: the module after each
        self.routes_pools = False
        self.normalized = ""  # the method string's record of a functional forward's rewrites
        if rewrite:
            pools = self._calls_plain_pools()
            graph = _modules_graph(self.model, self.prepare(self._probe_x)) if pools else None
            if graph is not None:
                self.model, self.successor = graph, _graph_successors(graph)
                self.normalized += "+graph"
            _rewrite_modules(self.model)
            self.routes_pools = pools and self._calls_plain_pools()
            self.normalized += "+pool-calls" if self.routes_pools else ""
        self.targets = space.tensors_of(self.model)
        self.first: nn.Module | None = None
        self.fold: nn.MaxPool2d | None = None
        self.dense: list[_DenseConv] = []

    def _calls_plain_pools(self) -> bool:
        """Whether a forward calls a plain ``F.max_pool2d`` (an ``nn.MaxPool2d`` module's forward does, until
        :func:`_rewrite_modules`). Before the rewrites: whether tracing the forward can gain anything (a model
        without plain pools is not traced). After them: whether calls that could not be traced into modules
        remain; they then run as the strided-slice maximum too (:func:`landscape.pooling.routed_pool_calls`
        around the evaluation), and a model without them runs without the mode's per-call overhead.
        """
        calls = []

        def note(v: torch.Tensor, kernel, stride) -> torch.Tensor:
            calls.append(kernel)
            return F.max_pool2d(v, kernel, stride)

        with routed_pool_calls(note):
            self.model(self.prepare(self._probe_x))
        return bool(calls)

    def prepare(self, xb: torch.Tensor) -> torch.Tensor:
        xb = xb.to(self.device, non_blocking=True)
        if self.channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        return xb

    def assign(self, vector: torch.Tensor) -> None:
        vector = vector.to(self.device)
        sources = [vector[o - e.numel : o].view(e.shape) for e, o in zip(self.space.entries, self.space.offsets,
                                                                          strict=True)]
        torch._foreach_copy_(self.targets, sources)
        for conv in self.dense:
            conv.changed()

    def chunk(self, batch_size: int) -> int:
        """Examples per forward: ``batch_size``, or fewer when one forward's activations would pass ``CACHE_BUDGET``.

        The loop methods revisit each batch's activations (and the shared first layer's outputs) at every point;
        kept near the cache, the many small element-wise passes (mixing, pooling, ReLU) run faster. Measured for
        a 30-point LeNet interpolation on 2,000 28 x 28 inputs (41 kB of activations per example): 0.90 s with
        batches of 1,000, 0.78 s with 400 (the chunk this gives); ResNet-18 (7.4 MB per example, so ``MIN_CHUNK``)
        took the same time with 25 to 200 examples per forward. Chunks only change the order of the float sums.
        """
        per_example = self._activation_bytes(1)
        if per_example <= 0:
            return batch_size
        return max(min(batch_size, MIN_CHUNK), min(batch_size, CACHE_BUDGET // per_example))

    # small convolutions as one matrix product --------------------------------------------------------
    def densify(self) -> int:
        """Run each eligible ``Conv2d`` on small inputs as one matrix product (:class:`_DenseConv`); how many.

        The input shapes come from one probe forward. The shared first layer (when in use) is left alone: its
        output is computed per generator, not per point.
        """
        shapes: dict[nn.Module, tuple[int, ...]] = {}
        convs = [m for m in self.model.modules() if type(m) is nn.Conv2d and m is not self.first]

        def record(mod, args) -> None:  # a pre-hook's return value would replace the arguments
            shapes.setdefault(mod, tuple(args[0].shape[1:]))

        hooks = [m.register_forward_pre_hook(record) for m in convs]
        try:
            if self.first is not None:
                self._stub(self._first_reference_output)
            self.model(self.prepare(self._probe_x))
        finally:
            if self.first is not None:
                self._unstub()
            for h in hooks:
                h.remove()
        for m in convs:
            if m in shapes and "forward" not in m.__dict__ and _DenseConv.worthwhile(m, shapes[m]):
                pool = self._foldable_pool(m)
                m.forward = _DenseConv(m, shapes[m], pool=pool)
                if pool is not None and m.forward.pool is not None:
                    pool.forward = _identity  # folded into the product's columns
                self.dense.append(m.forward)
        return len(self.dense)

    # shared first layer -------------------------------------------------------------------------------
    def enable_first_layer(self) -> bool:
        """Find the first parametrised layer; use the shared-output path if it is provably safe."""
        order: list[nn.Module] = []
        hooks = []
        owners = [m for m in self.model.modules() if any(True for _ in m.parameters(recurse=False))]
        for m in owners:
            hooks.append(m.register_forward_pre_hook(lambda mod, args: order.append(mod)))
        probe = self.prepare(self._probe_x)
        try:
            reference = self.model(probe)
        finally:
            for h in hooks:
                h.remove()
        if not order or type(order[0]) not in _AFFINE_FIRST or order.count(order[0]) != 1:
            return False
        first = order[0]
        name = next(n for n, m in self.model.named_modules() if m is first)
        local = dict(first.named_parameters(recurse=False))
        keys = [f"{name}.{k}" if name else k for k in local]
        if not set(keys) <= set(self.space.names) or any(b is not None for b in first._buffers.values()):
            return False
        self.first, self.first_name, self.first_keys = first, name, dict(zip(keys, local, strict=True))
        self.first_ref = copy.deepcopy(first)
        self.fold = self._foldable_pool(first)
        u = self._first_input(probe)
        z = self.first_ref(u)
        if self.fold is not None:
            z = _slice_max_pool(self.fold)(z)
        # the first layer's input must not depend on any other parameter
        saved = [t.clone() for t in self.targets]
        try:
            for t, e in zip(self.targets, self.space.entries, strict=True):
                if e.name not in self.first_keys:
                    t.fill_(math.nan)
            u_nan = self._first_input(probe)
        finally:
            torch._foreach_copy_(self.targets, saved)
        # and the rest of the network must see the input only through the first layer
        self._stub(z)
        out = self.model(torch.full_like(probe, math.nan))
        self._unstub()
        if not (torch.equal(u, u_nan) and torch.equal(out, reference)):
            self.first = None
            return False
        self._first_reference_output = z
        return True

    def _foldable_pool(self, first: nn.Module) -> nn.MaxPool2d | None:
        """A simple non-overlapping MaxPool2d right after the first layer (after ``_rewrite_modules``): its successor
        in a Sequential, or in a traced graph (:func:`_modules_graph`) the one module that consumes its output.

        Its windows are then cut from the shared outputs once per batch as contiguous tensors, and each point
        only mixes and takes the maximum over them (bit-identical to pooling the mixed output).
        """
        candidates = [self.successor[first]] if first in self.successor else []
        for parent in self.model.modules():
            if type(parent) is nn.Sequential:
                children = list(parent._modules.values())
                candidates += [nxt for child, nxt in zip(children[:-1], children[1:], strict=True) if child is first]
        for nxt in candidates:
            if type(nxt) is not nn.MaxPool2d or not _simple_pool(nxt):
                continue
            if _pair(nxt.stride if nxt.stride is not None else nxt.kernel_size) == _pair(nxt.kernel_size):
                uses = sum(m is nxt for _, m in self.model.named_modules(remove_duplicate=False))
                return nxt if uses == 1 else None
        return None

    def _windows(self, z: torch.Tensor) -> list[torch.Tensor]:
        m = self.fold
        kh, kw = _pair(m.kernel_size)
        sh, sw = _pair(m.stride if m.stride is not None else m.kernel_size)
        h, w = z.shape[-2:]
        oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
        fmt = torch.channels_last if self.channels_last and z.dim() == 4 else torch.contiguous_format
        return [z[..., i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw].contiguous(memory_format=fmt)
                for i in range(kh) for j in range(kw)]

    def _mixed(self, pts, zs, i: int) -> torch.Tensor:
        if self.fold is None:
            return pts.mix(zs, i)
        out = None
        for w in range(len(zs[0])):
            part = pts.mix([z[w] for z in zs], i)
            out = part if out is None else torch.maximum(out, part, out=out)
        return out

    @property
    def _probe_x(self) -> torch.Tensor:
        return self._x[:2]

    def _first_input(self, xb: torch.Tensor) -> torch.Tensor:
        captured: list[torch.Tensor] = []

        def grab(mod, args):
            captured.append(args[0])
            raise _Stop

        h = self.first.register_forward_pre_hook(grab)
        try:
            self.model(xb)
        except _Stop:
            pass
        finally:
            h.remove()
        return captured[0]

    def _first_outputs(self, xb: torch.Tensor, generators: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        u = self._first_input(xb)
        outs = []
        for g in generators:
            params = {local: self.space.unflatten(g)[full].to(self.device) for full, local in self.first_keys.items()}
            z = functional_call(self.first_ref, params, (u,))
            outs.append(self._windows(z) if self.fold is not None else z)
        return outs

    def _stub(self, value: torch.Tensor) -> None:
        self.first.forward = lambda *args, **kwargs: value
        if self.fold is not None:
            self.fold.forward = _identity

    def _unstub(self) -> None:
        self.first.__dict__.pop("forward", None)
        if self.fold is not None:
            self.fold.forward = _slice_max_pool(self.fold)

    # evaluation orders -------------------------------------------------------------------------------
    def run_batches_outer(self, pts, x, y, batch_size, shared: bool, hooks=()):
        n_points = len(pts)
        loss = torch.zeros(n_points, dtype=torch.float64, device=self.device)
        correct = torch.zeros(n_points, dtype=torch.float64, device=self.device)
        generators = pts.generators() if shared else None
        for start in range(0, x.shape[0], batch_size):
            xb = self.prepare(x[start : start + batch_size])
            yb = y[start : start + batch_size].to(self.device)
            zs = self._first_outputs(xb, generators) if shared else None
            for i in range(n_points):
                self.assign(pts.point(i))
                if shared:
                    self._stub(self._mixed(pts, zs, i))
                logits = self.model(xb)
                _accumulate(logits, yb, loss, correct, i, hooks)
            if shared:
                self._unstub()
        return loss.cpu(), correct.cpu()

    def run_points_outer(self, pts, x, y, batch_size, bn_batches, hooks=()):
        n_points = len(pts)
        loss = torch.zeros(n_points, dtype=torch.float64, device=self.device)
        correct = torch.zeros(n_points, dtype=torch.float64, device=self.device)
        bn_prepared = [self.prepare(b) for b in bn_batches]
        batches = [(self.prepare(x[s : s + batch_size]), y[s : s + batch_size].to(self.device))
                   for s in range(0, x.shape[0], batch_size)]
        for i in range(n_points):
            self.assign(pts.point(i))
            recalibrate_batchnorm(self.model, bn_prepared)
            for xb, yb in batches:
                _accumulate(self.model(xb), yb, loss, correct, i, hooks)
        return loss.cpu(), correct.cpu()

    def run_vmap(self, pts, x, y, batch_size, memory_budget: int, hooks=()):
        n_points = len(pts)
        loss = torch.zeros(n_points, dtype=torch.float64, device=self.device)
        correct = torch.zeros(n_points, dtype=torch.float64, device=self.device)
        per_point = self._activation_bytes(min(batch_size, x.shape[0]))
        chunk = max(1, min(n_points, memory_budget // max(per_point, 1)))

        def logits_of(params, xb):
            return functional_call(self.model, params, (xb,))

        batched = vmap(logits_of, in_dims=(0, None))
        for start in range(0, x.shape[0], batch_size):
            xb = self.prepare(x[start : start + batch_size])
            yb = y[start : start + batch_size].to(self.device)
            for p0 in range(0, n_points, chunk):
                idx = range(p0, min(n_points, p0 + chunk))
                stacked = torch.stack([pts.point(i).to(self.device) for i in idx])
                logits = batched(self.space.unflatten_batch(stacked), xb)  # (c, n, classes)
                for j, i in enumerate(idx):
                    _accumulate(logits[j], yb, loss, correct, i, hooks)
        return loss.cpu(), correct.cpu()

    def _activation_bytes(self, n: int) -> int:
        total = 0

        def count(mod, args, out):
            nonlocal total
            if isinstance(out, torch.Tensor):
                total += out.numel() * out.element_size()

        hooks = [m.register_forward_hook(count) for m in self.model.modules() if not list(m.children())]
        try:
            self.model(self.prepare(self._x[:1]))
        finally:
            for h in hooks:
                h.remove()
        return total * n


def _rewrite_modules(model: nn.Module) -> None:
    """Exact, faster equivalents inside the private copy (never the caller's model).

    * ``MaxPool2d`` without padding/dilation/ceil mode becomes a maximum over strided slices (bit-identical;
      PyTorch's CPU kernel also computes the argmax indices it then throws away, ~5x slower here).
    * In a ``Sequential``, ``ReLU`` directly followed by such a pool is swapped to pool-then-ReLU: both are
      monotone so ``relu(max(v)) == max(relu(v))`` exactly, and the ReLU then touches a quarter of the values.
    """
    for module in model.modules():
        if type(module) is nn.MaxPool2d and _simple_pool(module):
            module.forward = _slice_max_pool(module)
        if type(module) is nn.Sequential:
            keys = list(module._modules)
            for k0, k1 in zip(keys[:-1], keys[1:], strict=True):
                a, b = module._modules[k0], module._modules[k1]
                if type(a) is nn.ReLU and type(b) is nn.MaxPool2d and _simple_pool(b):
                    module._modules[k0], module._modules[k1] = b, a


_RELU_FUNCTIONS = (F.relu, torch.relu)
_FLATTEN_FUNCTIONS = (torch.flatten,)


def _modules_graph(model: nn.Module, probe: torch.Tensor) -> torch.fx.GraphModule | None:
    """The model as a graph of modules, for the module rewrites, when its ``forward`` is written with functions.

    A hand-written ``forward`` calls ``F.max_pool2d``, ``F.relu``, ``x.flatten(1)``; the rewrites of
    :func:`_rewrite_modules` and the first-layer fold need modules and their order. ``torch.fx`` traces the
    forward into a graph (the model's own submodules and parameter names), then each plain max-pool call
    becomes an ``nn.MaxPool2d`` node, each ReLU call an ``nn.ReLU`` and each flatten an ``nn.Flatten`` (the
    layers of the built-in models, so the evaluation runs the same operations in the same chunks), a pool module
    called at several places becomes one copy per call (each can be folded), ``F.conv2d(x, self.conv.weight,
    self.conv.bias, ...)`` with the layer's own options (and ``F.linear`` likewise) becomes the layer's call (so
    it can be the shared first layer or a dense convolution), and a ReLU whose only user is a
    plain pool is swapped behind it (both monotone: identical values). None, and the model runs as it is, when
    it has no plain max pool, the forward cannot be traced (data-dependent control flow, ...), the graph lacks
    a tensor of the model, or its output on ``probe`` is not bit-identical to the model's.
    """
    if type(model) is nn.Sequential:
        return None  # the Sequential rewrites see its order already
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gm = torch.fx.symbolic_trace(model)
    except Exception:  # noqa: BLE001 - any failure to trace leaves the model as it is
        return None
    graph, added = gm.graph, [0]

    def module_node(node: torch.fx.Node, module: nn.Module, source: torch.fx.Node) -> torch.fx.Node:
        name = f"_landscape_{type(module).__name__.lower()}_{added[0]}"
        added[0] += 1
        gm.add_submodule(name, module)
        with graph.inserting_before(node):
            new = graph.call_module(name, (source,))
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        return new

    uses: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            uses[node.target] = uses.get(node.target, 0) + 1
    pools = []
    for node in list(graph.nodes):
        module = gm.get_submodule(node.target) if node.op == "call_module" else None
        if node.op == "call_function" and any(node.target is f for f in (F.max_pool2d, torch.max_pool2d)):
            pool = _pool_module(node)
            if pool is not None:
                pools.append(module_node(node, pool, node.args[0]))
        elif type(module) is nn.MaxPool2d and _simple_pool(module):
            if uses[node.target] > 1 and len(node.args) == 1 and not node.kwargs:
                node = module_node(node, copy.deepcopy(module), node.args[0])
            pools.append(node)
        elif _is_relu_call(node):
            module_node(node, nn.ReLU(), node.args[0])
        elif _is_flatten_call(node):
            start, end = _flatten_dims(*node.args[1:], **node.kwargs)
            module_node(node, nn.Flatten(start, end), node.args[0])
        else:
            owner = _layer_call_owner(node, model)
            if owner is not None:  # F.conv2d / F.linear with a layer's own weights: that layer's call
                parent, _, leaf = owner.rpartition(".")
                (gm.get_submodule(parent) if parent else gm).register_module(leaf, model.get_submodule(owner))
                tensors = [a for a in node.all_input_nodes if a.op == "get_attr"]
                with graph.inserting_before(node):
                    new = graph.call_module(owner, (node.args[0],))
                node.replace_all_uses_with(new)
                graph.erase_node(node)
                for t in tensors:
                    if not t.users:
                        graph.erase_node(t)
    called = {node.target for node in graph.nodes if node.op == "call_module"}
    norms = [name for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not pools or not set(norms) <= called:
        # a BatchNorm used through its tensors (F.batch_norm(..., self.bn.training)) would have its train flag
        # frozen into the graph, and BatchNorm recalibration switches that flag: keep such a model as it is
        return None
    for pool in pools:
        relu = pool.args[0]
        if (len(pool.args) == 1 and not pool.kwargs and isinstance(relu, torch.fx.Node)
                and relu.op == "call_module" and len(relu.users) == 1
                and type(gm.get_submodule(relu.target)) is nn.ReLU and not gm.get_submodule(relu.target).inplace):
            source = relu.args[0]
            pool.replace_all_uses_with(relu)
            relu.args, pool.args = (pool,), (source,)
            pool.append(relu)  # the ReLU now runs after the pool
    graph.lint()
    gm.recompile()
    own = dict(model.named_parameters()) | dict(model.named_buffers())
    traced = dict(gm.named_parameters()) | dict(gm.named_buffers())
    if own.keys() != traced.keys() or any(own[k] is not traced[k] for k in own):
        return None
    try:
        same = torch.equal(gm(probe), model(probe))
    except Exception:  # noqa: BLE001 - a graph that does not run like the model is not used
        return None
    return gm if same else None


_LAYER_CALLS = ((F.conv2d, nn.Conv2d), (torch.conv2d, nn.Conv2d), (F.linear, nn.Linear))


def _conv_signature(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return weight, bias, stride, padding, dilation, groups


def _linear_signature(input, weight, bias=None):
    return weight, bias


def _layer_call_owner(node: torch.fx.Node, model: nn.Module) -> str | None:
    """The name of the ``Conv2d`` / ``Linear`` whose own call ``node`` is: ``F.conv2d(x, self.conv.weight,
    self.conv.bias, ...)`` with the layer's stride, padding, dilation and groups, or ``F.linear(x, self.fc.weight,
    self.fc.bias)``; None for anything else (other tensors, other options, a bias left out that the layer has)."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    kind = next((cls for fn, cls in _LAYER_CALLS if node.target is fn), None)
    if kind is None:
        return None
    try:
        bound = (_conv_signature if kind is nn.Conv2d else _linear_signature)(*node.args, **node.kwargs)
    except TypeError:
        return None
    weight, bias = bound[:2]
    if not (isinstance(weight, torch.fx.Node) and weight.op == "get_attr" and weight.target.endswith(".weight")):
        return None
    owner = weight.target[: -len(".weight")]
    try:
        layer = model.get_submodule(owner)
    except AttributeError:
        return None
    if type(layer) is not kind or len(weight.users) != 1:
        return None
    if layer.bias is None:
        if bias is not None:
            return None
    elif not (isinstance(bias, torch.fx.Node) and bias.op == "get_attr" and bias.target == f"{owner}.bias"):
        return None
    if kind is nn.Conv2d:
        stride, padding, dilation, groups = bound[2:]
        if isinstance(padding, str) or any(isinstance(v, torch.fx.Node) for v in (stride, padding, dilation, groups)):
            return None
        if (layer.padding_mode != "zeros" or isinstance(layer.padding, str) or _pair(stride) != layer.stride
                or _pair(padding) != layer.padding or _pair(dilation) != layer.dilation or groups != layer.groups):
            return None
    return owner


def _pool_module(node: torch.fx.Node) -> nn.MaxPool2d | None:
    """The ``nn.MaxPool2d`` of a plain ``F.max_pool2d`` / ``torch.max_pool2d`` call node with constant options."""
    if not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    constants = [*node.args[1:], *node.kwargs.values()]
    if any(isinstance(c, torch.fx.Node) for c in constants):
        return None
    probe = torch.empty(1, 1, 1, 1)
    call = simple_pool_call(node.target, (probe, *node.args[1:]), node.kwargs)
    return None if call is None else nn.MaxPool2d(call[1], call[2])


def _is_relu_call(node: torch.fx.Node) -> bool:
    if node.op == "call_function" and any(node.target is f for f in _RELU_FUNCTIONS):
        return len(node.args) == 1 and node.kwargs.get("inplace", False) is False and set(node.kwargs) <= {"inplace"}
    return node.op == "call_method" and node.target == "relu" and len(node.args) == 1 and not node.kwargs


def _is_flatten_call(node: torch.fx.Node) -> bool:
    flatten = (node.op == "call_function" and any(node.target is f for f in _FLATTEN_FUNCTIONS)) or (
        node.op == "call_method" and node.target == "flatten")
    if not flatten or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    try:
        _flatten_dims(*node.args[1:], **node.kwargs)
    except TypeError:
        return False
    return True


def _flatten_dims(start_dim: int = 0, end_dim: int = -1) -> tuple[int, int]:
    if not isinstance(start_dim, int) or not isinstance(end_dim, int):
        raise TypeError("flatten dimensions are not constants")
    return start_dim, end_dim


def _graph_successors(gm: torch.fx.GraphModule) -> dict[nn.Module, nn.Module]:
    """Module -> the module that alone consumes its output, for modules called at one place of the graph."""
    calls: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    nxt = {}
    for node in gm.graph.nodes:
        if node.op != "call_module" or calls[node.target] != 1 or len(node.users) != 1:
            continue
        (user,) = node.users
        if user.op == "call_module" and user.args[:1] == (node,) and len(user.args) == 1 and not user.kwargs:
            nxt[gm.get_submodule(node.target)] = gm.get_submodule(user.target)
    return nxt


class _DenseConv:
    """A ``Conv2d``'s forward on small inputs as one matrix product: ``x.flatten(1) @ M + b``.

    On an input of ``C x H x W`` a convolution is a linear map of the ``C*H*W`` input values; its matrix ``M``
    holds each output's weights at the input positions they touch (zeros elsewhere, padding dropped). That is
    no more multiply-adds than the convolution when ``H * W <= kh * kw`` (LeNet's second convolution on 8 x 8
    digits sees 6 x 4 x 4 inputs with 5 x 5 kernels: 96 x 256 against 16 x 150 x 16 per example) and runs as
    one matrix multiplication, 2.6x faster than PyTorch's CPU convolution for that layer. ``M`` is gathered from
    the weights (an index built once) at the first call after :meth:`changed` (the runner calls it whenever it
    writes a point's parameters), so once per evaluated point. Same values as the convolution up to float
    rounding (the sums run in another order); inputs of another shape take the ordinary convolution.
    """

    MAX_ENTRIES = 1 << 22  # M at most 16 MiB in float32

    def __init__(self, module: nn.Conv2d, in_shape: tuple[int, ...], pool: nn.MaxPool2d | None = None):
        self.module, self.in_shape = module, tuple(in_shape)
        c, h, w = self.in_shape
        weight = module.weight
        dev = weight.device
        oh, ow = _conv_output_size(module, h, w)
        self.out_shape = (module.out_channels, oh, ow)
        self.pool: nn.MaxPool2d | None = None
        self.bias_channel = torch.arange(module.out_channels, device=dev).repeat_interleave(oh * ow)
        # matrix entry (input position, output channel * L + output position) is weight entry (output channel,
        # column of the unfolded input) or, where no tap connects them, the zero appended to the weights
        positions = torch.arange(1, c * h * w + 1, dtype=torch.float64, device=dev).view(1, c, h, w)
        cols = F.unfold(positions, module.kernel_size, dilation=module.dilation, padding=_padding(module),
                        stride=module.stride)[0]  # (C*kh*kw, L): input position + 1, or 0 in the padding
        co, ck, length = module.out_channels, cols.shape[0], cols.shape[1]
        if length != oh * ow:  # pragma: no cover - unfold and conv2d disagree on the output size
            raise RuntimeError("dense convolution: unfold and conv2d give different output sizes")
        inside = cols > 0
        rows = cols[inside].long() - 1
        place = torch.arange(length, device=dev).expand(ck, length)[inside]
        tap = torch.arange(ck, device=dev).view(ck, 1).expand(ck, length)[inside]
        out_channel = torch.arange(co, device=dev).view(co, 1)
        self.index = torch.full((c * h * w, co * length), weight.numel(), dtype=torch.long, device=dev)
        self.index[rows.expand(co, -1), out_channel * length + place] = out_channel * ck + tap
        self.matrix: torch.Tensor | None = None  # gathered on first use after each change of the weights
        if pool is not None:
            self._fold(pool, oh, ow)

    def _fold(self, pool: nn.MaxPool2d, oh: int, ow: int) -> None:
        """Take a following non-overlapping max pool into the product: its columns are reordered (window
        offset, channel, pooled row, pooled column), so that the pool is a maximum over ``kh * kw`` contiguous
        column blocks (about 3x faster here than the strided slices of the pooled map), bit-identical."""
        kh, kw = _pair(pool.kernel_size)
        ph, pw = (oh - kh) // kh + 1, (ow - kw) // kw + 1
        if ph < 1 or pw < 1:
            return
        dev = self.index.device
        co = self.out_shape[0]
        a = torch.arange(kh, device=dev).view(kh, 1, 1, 1, 1)
        b = torch.arange(kw, device=dev).view(1, kw, 1, 1, 1)
        channel = torch.arange(co, device=dev).view(1, 1, co, 1, 1)
        row = torch.arange(ph, device=dev).view(1, 1, 1, ph, 1) * kh + a
        col = torch.arange(pw, device=dev).view(1, 1, 1, 1, pw) * kw + b
        columns = (channel * (oh * ow) + row * ow + col).reshape(-1)  # (offset, channel, P, Q) -> conv column
        self.index = self.index[:, columns].contiguous()
        self.bias_channel = self.bias_channel[columns]
        self.pool, self.windows, self.out_shape = pool, kh * kw, (co, ph, pw)

    def changed(self) -> None:
        """The layer's weights were written: gather ``M`` again at the next call."""
        self.matrix = None

    @staticmethod
    def worthwhile(module: nn.Conv2d, in_shape: tuple[int, ...]) -> bool:
        """Dense when it is no more multiply-adds (``H * W <= kh * kw``) and the matrix is small."""
        if len(in_shape) != 3 or module.groups != 1 or module.padding_mode != "zeros":
            return False
        if isinstance(module.padding, str) and module.padding != "valid":
            return False  # 'same': left to the convolution
        c, h, w = in_shape
        oh, ow = _conv_output_size(module, h, w)
        if oh < 1 or ow < 1:
            return False
        kh, kw = module.kernel_size
        return h * w <= kh * kw and c * h * w * module.out_channels * oh * ow <= _DenseConv.MAX_ENTRIES

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        m = self.module
        if v.dim() != 4 or tuple(v.shape[1:]) != self.in_shape or v.dtype != m.weight.dtype:
            out = nn.Conv2d.forward(m, v)
            return _slice_max_pool(self.pool)(out) if self.pool is not None else out
        if self.matrix is None:
            weights = torch.cat([m.weight.reshape(-1), m.weight.new_zeros(1)])
            self.matrix = weights[self.index]
            self.bias = None if m.bias is None else m.bias[self.bias_channel]
        flat = v.reshape(v.shape[0], -1)
        out = torch.addmm(self.bias, flat, self.matrix) if self.bias is not None else flat @ self.matrix
        if self.pool is not None:
            blocks = out.shape[1] // self.windows
            pooled = out[:, :blocks]
            for k in range(1, self.windows):
                pooled = torch.maximum(pooled, out[:, k * blocks : (k + 1) * blocks])
            out = pooled
        return out.view(v.shape[0], *self.out_shape)


def _padding(module: nn.Conv2d) -> tuple[int, int]:
    return (0, 0) if module.padding == "valid" else _pair(module.padding)


def _conv_output_size(module: nn.Conv2d, h: int, w: int) -> tuple[int, int]:
    (kh, kw), (sh, sw), (dh, dw) = module.kernel_size, module.stride, module.dilation
    ph, pw = _padding(module)
    return (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1


def _identity(v: torch.Tensor) -> torch.Tensor:
    return v


def _slice_max_pool(m: nn.MaxPool2d):
    return _slice_max(_pair(m.kernel_size), _pair(m.stride if m.stride is not None else m.kernel_size))


def _slice_max(kernel: tuple[int, int], stride: tuple[int, int]):
    (kh, kw), (sh, sw) = kernel, stride

    def forward(v: torch.Tensor) -> torch.Tensor:
        # rows first: the window rows' maximum reads whole contiguous rows (1.4-1.6x faster here than taking
        # the kh*kw doubly strided slices in turn), then the columns' maximum over that half-size result
        h, w = v.shape[-2:]
        oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
        rows = None
        for i in range(kh):
            part = v[..., i : i + sh * (oh - 1) + 1 : sh, :]
            rows = part if rows is None else torch.maximum(rows, part)
        out = None
        for j in range(kw):
            part = rows[..., j : j + sw * (ow - 1) + 1 : sw]
            out = part if out is None else torch.maximum(out, part)
        return out

    return forward


def _slice_pool_call(x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int]) -> torch.Tensor:
    """A plain ``F.max_pool2d`` call inside a model's ``forward`` as the strided-slice maximum (bit-identical)."""
    if x.shape[-2] < kernel[0] or x.shape[-1] < kernel[1]:
        return F.max_pool2d(x, kernel, stride)  # PyTorch's own error for a window larger than the input
    return _slice_max(kernel, stride)(x)


def _accumulate(logits: torch.Tensor, yb: torch.Tensor, loss: torch.Tensor, correct: torch.Tensor, i: int,
                hooks: Sequence[tuple[Metric, Any]] = ()) -> None:
    # cross-entropy as logsumexp minus the target's logit: F.cross_entropy's value (log-softmax, then the
    # target's entry) summed in another order, ~4x faster for 10 classes on CPU
    picked = logits.gather(1, yb.view(-1, 1)).view(-1)
    loss[i] += (torch.logsumexp(logits, dim=1) - picked).sum().double()
    correct[i] += (logits.argmax(dim=1) == yb).sum()
    for metric, state in hooks:
        metric.update(state, i, logits, yb)


def _bn_batches(bn: torch.Tensor | Sequence[torch.Tensor] | None, batch_size: int) -> list[torch.Tensor] | None:
    if bn is None:
        return None
    if isinstance(bn, torch.Tensor):
        if bn.shape[0] == 0:
            raise UsageError("BatchNorm recalibration needs at least one training example")
        return list(bn.split(batch_size))
    batches = [b for b in bn]
    if not batches:
        raise UsageError("BatchNorm recalibration needs at least one training batch")
    return batches


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (glibc malloc.h)
_RESTORED_MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX (64-bit): the dynamic threshold's ceiling
_allocator_lock = threading.Lock()
_allocator_depth = 0


@contextlib.contextmanager
def tuned_allocator() -> Iterator[None]:
    """Within the block, glibc keeps freed large blocks in the process so repeated activations do not page-fault.

    Measured on the project machine: a ReLU over 7 MB of activations took 37 ms with glibc's default
    (mmap + munmap per call, every page faulted again) and 0.7 ms with this. :func:`evaluate` enters it for
    the duration of its call; nested blocks (a benchmark or an analysis wrapping many calls) tune once, and
    the outermost block restores on exit. ``LANDSCAPE_MALLOC_TUNE=0`` (or a platform without glibc) makes it
    a no-op.

    Restoring is approximate, because glibc cannot report these settings (``mallopt(3)`` has no getter) and
    any ``mallopt`` of them switches off its *dynamic* mmap threshold for good. On exit the thresholds are set
    to the state that dynamic threshold converges to in a process that frees large tensors (``mallopt(3)``:
    mmap threshold ``DEFAULT_MMAP_THRESHOLD_MAX`` = 32 MiB on 64-bit, trim threshold twice that), or to the
    values given in ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``. So after the call blocks of 32 MiB
    or more are mmapped again and at most 64 MiB of free heap top is kept, instead of everything below 1 GiB
    being kept for the rest of the process (what a process-wide, never-restored setting did). Restoring
    glibc's 128 KiB start values instead would be worse than never having tuned: with the dynamic threshold
    off, every block over 128 KiB would be mmapped and page-faulted afresh.
    """
    global _allocator_depth
    libc = _libc() if os.environ.get("LANDSCAPE_MALLOC_TUNE", "1") != "0" else None
    if libc is None:
        yield
        return
    with _allocator_lock:
        _allocator_depth += 1
        if _allocator_depth == 1:
            libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30)
            libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1)
    try:
        yield
    finally:
        with _allocator_lock:
            _allocator_depth -= 1
            if _allocator_depth == 0:
                mmap_threshold = _env_threshold("MALLOC_MMAP_THRESHOLD_", _RESTORED_MMAP_THRESHOLD)
                libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
                libc.mallopt(_M_TRIM_THRESHOLD, _env_threshold("MALLOC_TRIM_THRESHOLD_", 2 * mmap_threshold))


def _env_threshold(name: str, default: int) -> int:
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if 0 <= value < (1 << 31) else default


_LIBC: list = []


def _libc():
    """glibc through ctypes (cached), or None where there is no glibc ``mallopt`` (macOS, Windows, musl)."""
    if not _LIBC:
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        except (OSError, AttributeError):
            libc = None
        _LIBC.append(libc)
    return _LIBC[0]
