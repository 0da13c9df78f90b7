"""The evaluator's runner: one private model copy, points written in place, the shared first layer, cache-sized
chunks, and the batch-outer / point-outer / vmap loops."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from landscape import progress
from landscape.errors import UsageError
from landscape.evaluate.metric import Metric
from landscape.evaluate.rewrites import (
    _DenseConv,
    _graph_successors,
    _identity,
    _modules_graph,
    _rewrite_modules,
    _slice_max_pool,
)
from landscape.params import ParamSpace
from landscape.pooling import pair as _pair
from landscape.pooling import routed_pool_calls
from landscape.pooling import simple_pool as _simple_pool

# The loop methods run each batch in chunks whose activations (all layers' outputs of one forward) take at
# most this many bytes, but never fewer than MIN_CHUNK examples: see _Runner.chunk.
CACHE_BUDGET = 16 << 20
MIN_CHUNK = 64


def recalibrate_batchnorm(model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
    """Recompute every BatchNorm layer's running statistics from ``batches`` as the equal-weight average of the
    per-batch statistics (as ``torch.optim.swa_utils.update_bn``; one batch gives the exact full-set ones). Only
    the BatchNorm layers run in train mode; they end in eval mode with ``momentum`` restored."""
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
        """Whether a forward calls a plain ``F.max_pool2d``: before the rewrites, whether tracing can gain
        anything; after them, whether untraced calls remain that must be routed (``routed_pool_calls``)."""
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
        """Examples per forward: ``batch_size``, or fewer when one forward's activations would pass ``CACHE_BUDGET``
        (passes revisited at every point run faster near the cache; docs/interpolation.md)."""
        per_example = self._activation_bytes(1)
        if per_example <= 0:
            return batch_size
        return max(min(batch_size, MIN_CHUNK), min(batch_size, CACHE_BUDGET // per_example))

    # small convolutions as one matrix product --------------------------------------------------------
    def densify(self) -> int:
        """Run each eligible ``Conv2d`` on small inputs as one matrix product (:class:`_DenseConv`); how many. The
        shared first layer is left alone: its output is computed per generator, not per point."""
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
        """A simple non-overlapping MaxPool2d right after ``first`` (in a Sequential or a traced graph): its windows
        are cut from the shared outputs once per batch, and each point only mixes them and takes the maximum."""
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
    def run_batches_outer(self, pts, x, y, batch_size, shared: bool, hooks=(), task=progress.SILENT):
        n_points = len(pts)
        loss, correct = torch.zeros(2, n_points, dtype=torch.float64, device=self.device)
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
                task.update(1)
            if shared:
                self._unstub()
        return loss.cpu(), correct.cpu()

    def run_points_outer(self, pts, x, y, batch_size, bn_batches, hooks=(), task=progress.SILENT):
        n_points = len(pts)
        loss, correct = torch.zeros(2, n_points, dtype=torch.float64, device=self.device)
        bn_prepared = [self.prepare(b) for b in bn_batches]
        batches = [(self.prepare(x[s : s + batch_size]), y[s : s + batch_size].to(self.device))
                   for s in range(0, x.shape[0], batch_size)]
        for i in range(n_points):
            self.assign(pts.point(i))
            recalibrate_batchnorm(self.model, bn_prepared)
            for xb, yb in batches:
                _accumulate(self.model(xb), yb, loss, correct, i, hooks)
                task.update(1)
        return loss.cpu(), correct.cpu()

    def run_vmap(self, pts, x, y, batch_size, memory_budget: int, hooks=(), task=progress.SILENT):
        n_points = len(pts)
        loss, correct = torch.zeros(2, n_points, dtype=torch.float64, device=self.device)
        per_point = self._activation_bytes(min(batch_size, x.shape[0]))
        chunk = max(1, min(n_points, memory_budget // max(per_point, 1)))
        batched = vmap(lambda params, xb: functional_call(self.model, params, (xb,)), in_dims=(0, None))
        for start in range(0, x.shape[0], batch_size):
            xb = self.prepare(x[start : start + batch_size])
            yb = y[start : start + batch_size].to(self.device)
            for p0 in range(0, n_points, chunk):
                idx = range(p0, min(n_points, p0 + chunk))
                stacked = torch.stack([pts.point(i).to(self.device) for i in idx])
                logits = batched(self.space.unflatten_batch(stacked), xb)  # (c, n, classes)
                for j, i in enumerate(idx):
                    _accumulate(logits[j], yb, loss, correct, i, hooks)
                task.update(len(idx))
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


def _accumulate(logits: torch.Tensor, yb: torch.Tensor, loss: torch.Tensor, correct: torch.Tensor, i: int,
                hooks: Sequence[tuple[Metric, Any]] = ()) -> None:
    # cross-entropy as logsumexp minus the target's logit: F.cross_entropy's value (log-softmax, then the
    # target's entry) summed in another order, without materialising the log-softmax
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
