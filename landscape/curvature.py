"""Hessian-vector products of the mean cross-entropy over a fixed batch, the curvature primitive of the
analyzers. Per chunk, two exact ``torch.func`` routes: ``retained`` (``vjp(grad(L_c))`` kept, one second-order
backward per product, as PyHessian) within ``retain_bytes``, else ``forward-over-reverse``
(``jvp(grad(L_c))``, Pearlmutter 1994, keeps nothing). A layer with no second derivative is named in a line.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, jvp, vjp, vmap
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from landscape.errors import ModelError, OptionError, UsageError
from landscape.runtime import math_attention

# Retained graph size / leaf-module output bytes (measured on LeNet and ResNet-18/GroupNorm: 4.5 and 2.7).
GRAPH_FACTOR = 5.0
RETAIN_BYTES = 2 * 2**30

Vector = dict[str, Tensor]

# What torch says when an operation has no second derivative (reverse over reverse, forward over reverse,
# a custom Function that is ``@once_differentiable`` or without ``jvp``).
_NO_SECOND = re.compile(
    r"derivative for (?P<op>\S+) is not implemented"
    r"|forward AD with (?P<fop>\S+) that does not support"
    r"|(?P<once>differentiate twice)"
    r"|(?P<jvp>implement the jvp function for custom autograd.Function)"
)
# Smooth stand-ins of torch's layers without a second derivative (the advice of the error line).
_SMOOTH = {"Hardsigmoid": "a smooth gate such as nn.Sigmoid"}


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


def _no_second(exc: BaseException) -> str | None:
    """The operation named by torch's error when ``exc`` says a second derivative is missing, else None."""
    if not isinstance(exc, (RuntimeError, NotImplementedError)):
        return None
    m = _NO_SECOND.search(str(exc))
    if m is None:
        return None
    if m.group("once"):
        return "a custom autograd.Function marked @once_differentiable"
    if m.group("jvp"):
        return "a custom autograd.Function without a jvp, which forward-over-reverse products need"
    return m.group("op") or m.group("fop")


def _module_inputs(model: nn.Module, tensors: dict[str, Tensor], x1: Tensor) -> dict[str, tuple]:
    """``{module name: (args, kwargs)}`` each module was first called with in a forward of ``x1``."""
    seen: dict[str, tuple] = {}
    hooks = []
    for name, m in model.named_modules():
        def keep(_m, args, kwargs, name=name):
            seen.setdefault(name, (args, kwargs))

        hooks.append(m.register_forward_pre_hook(keep, with_kwargs=True))
    try:
        with torch.no_grad(), eval_mode(model), math_attention():
            functional_call(model, tensors, (x1,))
    finally:
        for h in hooks:
            h.remove()
    return seen


def _twice_differentiable(module: nn.Module, tensors: dict[str, Tensor], args: tuple, kwargs: dict,
                          route: str) -> str | None:
    """None when ``module`` alone has a second derivative at ``args`` through ``route``, else the operation
    torch names (a random projection of the outputs, differentiated in the inputs and parameters)."""
    leaves, spec = tree_flatten((args, kwargs))
    slots = [i for i, t in enumerate(leaves) if isinstance(t, Tensor) and t.is_floating_point()]
    params = {k: t for k, t in tensors.items() if t.requires_grad}
    constants = {k: t.detach() for k, t in tensors.items() if not t.requires_grad}
    primals = ({k: t.detach() for k, t in params.items()}, [leaves[i].detach() for i in slots])
    if not primals[0] and not primals[1]:
        return None
    gen = torch.Generator().manual_seed(0)

    def noise(t: Tensor) -> Tensor:
        return torch.randn(t.shape, generator=gen).to(t)

    def projection(p: Vector, inputs: list[Tensor]) -> Tensor:
        filled = list(leaves)
        for i, t in zip(slots, inputs, strict=True):
            filled[i] = t.clone()  # a layer that works in place must not write into the primal
        a, kw = tree_unflatten(filled, spec)
        outs = [o for o in tree_flatten(functional_call(module, {**p, **constants}, a, kw))[0]
                if isinstance(o, Tensor) and o.is_floating_point()]
        total = x0.new_zeros(())
        for o in outs:
            total = total + (o * noise(o)).sum()
        return total

    x0 = next(iter([*primals[0].values(), *primals[1]]))
    g = grad(projection, argnums=(0, 1))
    try:
        with math_attention():
            if route == "retained":
                vjp(g, *primals)[1](tree_map(noise, primals))
            else:
                jvp(g, primals, tree_map(noise, primals))
    except (RuntimeError, NotImplementedError) as exc:
        return _no_second(exc)
    return None


def second_derivative_culprit(model: nn.Module, tensors: dict[str, Tensor], x1: Tensor,
                              route: str) -> tuple[str, nn.Module, str, int] | None:
    """The first layer whose own second derivative fails on what it sees in a forward of ``x1``, as ``(name,
    module, operation, modules of its type)``, or None. Leaves first (one per distinct layer), then the others
    innermost out, so a module whose own ``forward`` holds the operation is found after its children pass."""
    inputs = _module_inputs(model, {k: t.detach() for k, t in tensors.items()}, x1)
    modules = [(name, m) for name, m in model.named_modules() if name in inputs]
    leaves = [(name, m) for name, m in modules if next(m.children(), None) is None]
    others = [(name, m) for name, m in reversed(modules) if next(m.children(), None) is not None]
    tried: set[tuple] = set()
    for name, m in leaves + others:
        key = (type(m), m.extra_repr()) if next(m.children(), None) is None else (name,)
        if key in tried:
            continue
        tried.add(key)
        prefix = f"{name}." if name else ""
        own = {k[len(prefix):]: t for k, t in tensors.items() if k.startswith(prefix)}
        args, kwargs = inputs[name]
        op = _twice_differentiable(m, own, args, kwargs, route)
        if op is not None:
            alike = sum(type(o) is type(m) for _, o in modules)
            return name, m, op, alike
    return None


def no_second_derivative_error(model: nn.Module, tensors: dict[str, Tensor], x1: Tensor, route: str,
                               exc: BaseException) -> ModelError:
    """The one-line error for a product that failed for want of a second derivative, naming the layer."""
    op = _no_second(exc)
    found = second_derivative_culprit(model, tensors, x1, route)
    if found is None:
        return ModelError(
            f"the model uses an operation without a second derivative in torch ({op}), so its Hessian-vector "
            "products cannot be taken; replace it by a smooth equivalent in the model's code")
    name, module, op, alike = found
    kind = type(module).__name__
    where = f"layer {name} ({kind}" if name else f"the model's own forward ({kind}"
    more = f"; {alike - 1} more {kind} layer{'s' if alike > 2 else ''} in the model" if alike > 1 else ""
    advice = _SMOOTH.get(kind, "a smooth equivalent")
    return ModelError(
        f"{where}{more}) has no second derivative in torch ({op}), so the Hessian-vector products cannot be "
        f"taken: replace it by {advice} in the model factory (and retrain, or import the weights into a run of "
        "the new model), or freeze (requires_grad=False) every parameter before the last such layer")


class HessianOperator:
    """``v -> H v`` for the Hessian of the mean cross-entropy of ``model`` on ``x, y`` at its current weights,
    in eval mode: a :class:`landscape.spectral.LinearOperator`. ``masks`` ``{name: 0/1}`` make it ``P H P``;
    ``batch_size`` bounds the examples per chunk, ``retain_bytes`` the kept graphs; ``products`` counts.
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
            raise OptionError("batch_size", f"must be a positive integer, got {batch_size}")
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
                with self._second_derivative("retained"):
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

    @contextlib.contextmanager
    def _second_derivative(self, route: str) -> Iterator[None]:
        """Turns torch's error for a layer without a second derivative into one line naming the layer."""
        try:
            yield
        except (RuntimeError, NotImplementedError) as exc:
            if _no_second(exc) is None:
                raise
            tensors = {**{k: t.requires_grad_() for k, t in self.params.items()}, **self.constants}
            try:
                error = no_second_derivative_error(self.model, tensors, self.chunks[0][0][:1], route, exc)
            finally:
                for t in self.params.values():
                    t.requires_grad_(False)
            raise error from None

    def _chunk_product(self, c: int, v: Vector, batched: bool) -> Vector:
        fn = self._retained[c]
        if fn is not None:
            with torch.no_grad(), self._second_derivative("retained"):  # no graph of the product itself
                return (vmap(fn) if batched else fn)(v)[0]
        g = grad(self._chunk_loss(c))

        def forward_over_reverse(t: Vector) -> Vector:
            return jvp(g, (self.params,), (t,))[1]

        with eval_mode(self.model), self._second_derivative("forward-over-reverse"):
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
        """``H v_b`` for a batch ``{name: (B, *shape)}``. ``vmap`` is faster for some models, slower for
        others, so the first batch is timed half each way and the faster route serves the rest."""
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
        """``H v`` on flat ``(d,)`` or ``(B, d)`` vectors, in ``flat``'s dtype; into ``out`` when given (an
        iteration reuses one buffer instead of page-faulting a fresh one per product)."""
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

