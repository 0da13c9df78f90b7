"""Hessian-vector products of the mean training loss: the one curvature primitive the analyzers build on.

The loss is ``L(theta) = (1/n) sum_i l(f(x_i; theta), y_i)`` with ``l`` the cross-entropy, over a fixed batch
``x, y`` (split into chunks of ``batch_size`` examples whose contributions ``(1/n) sum_{i in chunk} l_i`` add
up to ``L`` exactly, so ``H v = sum_c H_c v``). Parameters and vectors are dicts ``{name: tensor}`` in
``model.named_parameters()`` order (trainable parameters only); nothing is flattened except where a caller
asks for the flat view (:meth:`HessianOperator.matvec`, for Krylov methods that keep a basis as one matrix).

Two exact routes per chunk, both ``torch.func`` on ``functional_call`` (the model is never modified):

``retained``
    ``torch.func.vjp(grad(L_c), theta)`` once per chunk: the forward and first backward are done once and
    their graph kept, so every product is one second-order backward pass, ``H_c v = vjp_fn(v)`` (``H`` is
    symmetric, so the vector-Jacobian product of the gradient is the Hessian-vector product). This is what
    PyHessian does for a single batch (Yao et al. 2020), and the fastest on CPU when many products are taken
    at one point (Lanczos, Hutchinson).
``forward-over-reverse``
    ``torch.func.jvp(grad(L_c), (theta,), (v,))`` (Pearlmutter 1994; the torch.func recipe): nothing is kept
    between products, so memory is one chunk's forward and backward. Used for the chunks beyond the memory
    budget ``retain_bytes``.

A chunk is retained while the estimated size of all retained graphs stays within ``retain_bytes``: the
estimate is :data:`GRAPH_FACTOR` times the bytes of every leaf module's outputs on one example (measured
with a dry forward), times the chunk size (measured: LeNet 4.5x, ResNet-18 2.7x).

Several vectors at once (:meth:`HessianOperator.hvp_batch`) go through ``vmap`` (which shares the primal
computation of the forward-over-reverse route and batches the convolutions of the retained one) or a loop,
whichever the first batch measured faster.

Models are evaluated in eval mode (BatchNorm uses its running statistics, so the loss is a sum over examples;
dropout is off); GroupNorm and LayerNorm act per example and need nothing. Computation runs in the dtype
asked for (float64 casts parameters, floating buffers and inputs). With pruning ``masks`` the operator is
the Hessian restricted to the unpruned coordinates, ``P H P`` with ``P = diag(mask)``: vectors are masked
before and after each product.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, jvp, vjp, vmap

from landscape.errors import ModelError, UsageError
from landscape.runtime import math_attention

# Retained graph size / leaf-module output bytes (measured on LeNet and ResNet-18/GroupNorm: 4.5 and 2.7).
GRAPH_FACTOR = 5.0
RETAIN_BYTES = 2 * 2**30

Vector = dict[str, Tensor]


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode for the block; every module's own ``training`` flag is restored after."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, flag in flags:
            m.training = flag


def _check_model(model: nn.Module, names: list[str], params: dict[str, Tensor]) -> None:
    if not names:
        raise ModelError("the model has no trainable parameters; its Hessian is empty")
    for name in names:
        if not bool(torch.isfinite(params[name]).all()):
            raise ModelError(f"parameter {name} has NaN or inf values; the Hessian is undefined there")
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats:
            raise ModelError(
                f"{name or 'root'} is BatchNorm without running statistics, so even in eval mode it mixes the "
                "examples of a batch and the loss is not a sum over examples; use GroupNorm or track_running_stats"
            )


class HessianOperator:
    """``v -> H v`` for the Hessian of the mean cross-entropy of ``model`` on ``x, y`` at its current weights.

    ``dtype`` (default: the parameters' dtype) is the computation's precision; ``device`` (default: the
    parameters' device) where it runs; ``masks`` ``{name: 0/1 tensor}`` restricts it to unpruned coordinates;
    ``batch_size`` bounds the examples per chunk (default: all in one); ``retain_bytes`` bounds the memory of
    kept graphs (0 keeps none). ``products`` counts the Hessian-vector products taken (a batch of ``B``
    vectors counts ``B``). A :class:`landscape.spectral.LinearOperator` (``dim``, ``dtype``, ``device``,
    ``matvec``; ``numel`` and ``mask_vector`` restrict probes to the unpruned coordinates), so the spectral
    estimators run on it.
    """

    def __init__(
        self,
        model: nn.Module,
        x: Tensor,
        y: Tensor,
        *,
        masks: dict[str, Tensor] | None = None,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        batch_size: int | None = None,
        retain_bytes: float = RETAIN_BYTES,
    ):
        named = dict(model.named_parameters())
        self.names = [k for k, p in named.items() if p.requires_grad]
        _check_model(model, self.names, named)
        if len(y) == 0:
            raise UsageError("the Hessian needs at least one example")
        first = named[self.names[0]]
        self.dtype = dtype or first.dtype
        self.device = torch.device(device) if device is not None else first.device
        if batch_size is not None and batch_size < 1:
            raise UsageError(f"--batch-size must be a positive integer, got {batch_size}")
        self.model = model
        # a copy: the operator stays the Hessian at these weights even if the caller then changes the model
        self.params = {k: named[k].detach().to(self.device, self.dtype, copy=True) for k in self.names}
        # Frozen parameters and buffers enter as constants (floating ones in the computation's dtype).
        self.constants = {
            k: t.detach().to(self.device, self.dtype if t.is_floating_point() else t.dtype)
            for k, t in [*named.items(), *model.named_buffers()]
            if k not in self.params
        }
        self.shapes = [self.params[k].shape for k in self.names]
        self.numels = [self.params[k].numel() for k in self.names]
        self.masks = self._masks(masks)
        self.numel = sum(self.numels)
        self.dim = self.numel if self.masks is None else sum(
            int(self.masks[k].count_nonzero()) if k in self.masks else n for k, n in zip(self.names, self.numels, strict=True)
        )
        self.n = len(y)
        x = x.to(self.device)
        x = x.to(self.dtype) if x.is_floating_point() else x
        y = y.to(self.device)
        size = self.n if batch_size is None else int(batch_size)
        self.chunks = [(x[s:s + size], y[s:s + size]) for s in range(0, self.n, size)]
        self.products = 0
        self.vectorised: bool | None = None  # decided by timing on the first batch (see hvp_batch)
        self._retained: list = [None] * len(self.chunks)
        per_example = GRAPH_FACTOR * self._activation_bytes(x[:1])
        budget = float(retain_bytes)
        with eval_mode(model):
            for c, (xc, _) in enumerate(self.chunks):
                cost = per_example * len(xc)
                if cost > budget:
                    break
                budget -= cost
                self._retained[c] = vjp(grad(self._chunk_loss(c)), self.params)[1]

    # ------------------------------------------------------------------------------------------ set-up

    def _masks(self, masks: dict[str, Tensor] | None) -> dict[str, Tensor] | None:
        if not masks:
            return None
        out = {}
        for k, m in masks.items():
            if k not in self.params:
                continue
            if tuple(m.shape) != tuple(self.params[k].shape):
                raise UsageError(f"mask {k} has shape {list(m.shape)}, the parameter {list(self.params[k].shape)}")
            out[k] = (torch.as_tensor(m) != 0).to(self.device, self.dtype)
        return out or None

    def _activation_bytes(self, x1: Tensor) -> int:
        """Bytes of every leaf module's output on one example (a dry forward without gradients)."""
        total = [0]

        def count(_m, _i, out):
            if isinstance(out, Tensor):
                total[0] += out.numel() * out.element_size()

        leaves = [m for m in self.model.modules() if not any(True for _ in m.children())]
        hooks = [m.register_forward_hook(count) for m in leaves]
        try:
            with torch.no_grad(), eval_mode(self.model):
                functional_call(self.model, {**self.params, **self.constants}, (x1,))
        finally:
            for h in hooks:
                h.remove()
        return total[0]

    def _chunk_loss(self, c: int):
        xc, yc = self.chunks[c]
        n, model, constants = self.n, self.model, self.constants

        def loss(params: Vector) -> Tensor:
            # attention's fused CPU kernels have no second derivative; the math kernel is the same function
            with math_attention():
                logits = functional_call(model, {**params, **constants}, (xc,))
            return F.cross_entropy(logits, yc, reduction="sum") / n

        return loss

    # ---------------------------------------------------------------------------------------- products

    @property
    def retained_chunks(self) -> int:
        return sum(fn is not None for fn in self._retained)

    def _mask(self, v: Vector) -> Vector:
        if self.masks is None:
            return v
        return {k: t * self.masks[k] if k in self.masks else t for k, t in v.items()}

    def _chunk_product(self, c: int, v: Vector, batched: bool) -> Vector:
        fn = self._retained[c]
        if fn is not None:
            with torch.no_grad():  # no graph of the product itself (vjp_fn would build one)
                return (vmap(fn) if batched else fn)(v)[0]
        g = grad(self._chunk_loss(c))

        def forward_over_reverse(t: Vector) -> Vector:
            return jvp(g, (self.params,), (t,))[1]

        with eval_mode(self.model):
            return (vmap(forward_over_reverse) if batched else forward_over_reverse)(v)

    def _product(self, v: Vector, batched: bool) -> Vector:
        v = self._mask({k: v[k].to(self.device, self.dtype) for k in self.names})
        total: Vector | None = None
        for c in range(len(self.chunks)):
            part = self._chunk_product(c, v, batched)
            if total is None:
                total = dict(part)
            else:
                torch._foreach_add_([total[k] for k in self.names], [part[k] for k in self.names])
        return self._mask(total)

    def hvp(self, v: Vector) -> Vector:
        """``H v`` for one vector ``{name: tensor of the parameter's shape}``."""
        self.products += 1
        return self._product(v, batched=False)

    def hvp_batch(self, v: Vector) -> Vector:
        """``H v_b`` for a batch of vectors ``{name: (B, *shape)}``: one vectorised pass (``vmap``) or a loop.

        ``vmap`` is faster for some models and slower for others (docs/benchmarks.md), so the first batch of two
        or more vectors is timed half each way and the faster route (``vectorised``) serves the rest."""
        b = int(v[self.names[0]].shape[0])
        self.products += b
        if self.vectorised is None and b >= 2:
            h = b // 2
            t0 = time.perf_counter()
            head = self._product({k: t[:h] for k, t in v.items()}, batched=True)
            t1 = time.perf_counter()
            tail = self._loop({k: t[h:] for k, t in v.items()})
            t2 = time.perf_counter()
            self.vectorised = (t1 - t0) / h <= (t2 - t1) / (b - h)
            return {k: torch.cat([head[k], tail[k]]) for k in self.names}
        return self._product(v, batched=True) if self.vectorised is not False else self._loop(v)

    def _loop(self, v: Vector) -> Vector:
        outs = [self._product({k: t[i] for k, t in v.items()}, batched=False)
                for i in range(v[self.names[0]].shape[0])]
        return {k: torch.stack([o[k] for o in outs]) for k in self.names}

    # ------------------------------------------------------------------------------------ flat vectors

    def unflatten(self, flat: Tensor) -> Vector:
        """Views of a flat ``(d,)`` or ``(B, d)`` vector as a parameter dict (no copy)."""
        lead = flat.shape[:-1]
        parts = torch.split(flat, self.numels, dim=-1)
        return {k: p.reshape(*lead, *s) for k, p, s in zip(self.names, parts, self.shapes, strict=True)}

    def flatten(self, v: Vector, batched: bool = False) -> Tensor:
        """A parameter dict as one flat ``(d,)`` (or ``(B, d)`` when ``batched``) vector, ``names`` order."""
        lead = 1 if batched else 0
        return torch.cat([v[k].reshape(*v[k].shape[:lead], -1) for k in self.names], dim=-1)

    def matvec(self, flat: Tensor, out: Tensor | None = None) -> Tensor:
        """``H v`` on flat vectors: ``(d,) -> (d,)`` or, for a batch, ``(B, d) -> (B, d)``, in ``flat``'s dtype.

        ``out`` (``flat``'s shape) receives the product and is returned: an iteration can reuse one buffer,
        already touched, instead of a fresh vector per product (11 M entries for ResNet-18, page-faulted in
        on first touch)."""
        if flat.dim() == 2 and flat.shape[0] == 1:  # one vector: no vmap
            if out is None:
                return self.matvec(flat[0])[None]
            self.matvec(flat[0], out[0])
            return out
        batched = flat.dim() == 2
        v = self.unflatten(flat.to(self.device, self.dtype))
        product = self.hvp_batch(v) if batched else self.hvp(v)
        if out is None:
            return self.flatten(product, batched).to(flat.dtype)
        views = self.unflatten(out)
        torch._foreach_copy_([views[k] for k in self.names], [product[k] for k in self.names])
        return out

    def mask_vector(self) -> Tensor | None:
        """The flat 0/1 mask (None without masks), for drawing vectors in the unpruned subspace."""
        if self.masks is None:
            return None
        return self.flatten({k: self.masks.get(k, torch.ones_like(self.params[k])) for k in self.names})

    def loss(self) -> float:
        """``L(theta)`` on the batch (eval mode)."""
        with torch.no_grad(), eval_mode(self.model):
            total = sum(self._chunk_loss(c)(self.params) for c in range(len(self.chunks)))
        return float(total)

    def __repr__(self) -> str:
        return (f"HessianOperator(d={self.numel}, dim={self.dim}, n={self.n}, chunks={len(self.chunks)}, "
                f"retained={self.retained_chunks}, dtype={self.dtype})")

