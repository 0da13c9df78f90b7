"""Per-sample gradients: norms, weighted and clipped sums, materialised gradients, projections.

The one engine every per-example computation goes through (DESIGN.md, "Per-sample gradients"). A "layer"
is one parameter tensor, named as in ``model.named_parameters()``. The per-sample loss is
``l_i = cross_entropy(f(x_i), y_i)`` and ``g_i`` is its gradient with respect to the trainable parameters.

Exact routes, chosen automatically (``engine.strategy``):

``hooks``
    One batched forward and one backward that keeps, for every module with a registered handler (the open
    registry ``register_handler``, in the spirit of Opacus' ``register_grad_sampler``; built in: ``nn.Linear``,
    ``nn.Conv1d``/``nn.Conv2d`` with any stride, padding, dilation and groups, ``nn.GroupNorm``,
    ``nn.LayerNorm``, ``nn.Embedding``), its input activations ``A_i`` and output gradients ``B_i``, so
    ``g_i = B_i^T A_i``. Per-sample squared norms use the "ghost norm" identity
    ``||B_i^T A_i||^2 = sum_{t,s} (A_i A_i^T)_{ts} (B_i B_i^T)_{ts}`` when it is clearly cheaper than
    materialising (Li et al. 2021; Bu et al. 2023, "book-keeping"), and the clipped sum
    ``sum_i c_i g_i = sum_i c_i B_i^T A_i`` re-uses the kept ``A, B`` (one weight-gradient kernel on
    re-weighted ``B``, or a weighted sum of the gradients already materialised for the norms): no second
    backward. The backward itself only computes activation gradients, never the weight gradients.
    Convolutions materialise per-sample gradients with one grouped weight-gradient kernel (batch folded
    into the groups) or, for few output positions, a strided unfold and a batched matmul.
``mixed``
    The hooks route for the modules with a handler, and in the same forward/backward a ``FunctionalHandler``
    for every other module owning trainable parameters (or the nearest called ancestor of one that is never
    called itself, like ``nn.MultiheadAttention.out_proj``): its inputs and output gradients are kept and
    ``vmap(grad)`` of the module alone gives the per-sample vector-Jacobian products. Where every module keeps
    the batch is measured by ``probe_calls`` (forwards on one and two copies of the first example).
``functorch``
    ``torch.func.functional_call`` + ``vmap(grad)`` of the whole model (chunked by ``microbatch``). Used when a
    trainable parameter belongs to the root module or is tied between modules, when a module draws random
    numbers (dropout in training mode), or when the one-off self-check of the hooks route fails (a parameter
    used outside its module's ``forward``, a wrong registered handler).

The pieces are shared with :mod:`landscape.gram` (per-layer Gram blocks, the empirical NTK), so there is one
per-sample engine: ``Capture`` (inputs in the forward; output gradients by tensor hooks during a backward
whose ``inputs`` are the outputs' gradient edges, so only activation gradients are computed, and a caller
may reduce a layer's factors as soon as they are complete), the per-module handlers (``plan_handlers``:
per-sample gradients, ghost factors, weighted sums), ``probe_calls`` / ``place_batch`` and ``functorch_grads``.

Projections ``<g_i, v>`` do not need per-sample gradients: they are the forward-mode directional
derivatives ``d/dt l_i(theta + t v)`` at ``t = 0`` (one ``torch.func.jvp`` per direction); a model with a
kernel that has no forward-mode rule gets them from per-sample gradients.

BatchNorm mixes the samples of a batch, so per-sample gradients are undefined: such models are refused.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.graph import get_gradient_edge
from torch.func import functional_call, grad, jacrev, jvp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from landscape.errors import ModelError, UsageError
from landscape.pooling import exact_fast_pooling

STRATEGIES = ("auto", "hooks", "functorch")
# A convolution's (or a Linear's on sequences) norm is a ghost norm when T (D + P) < GHOST_RATIO * P D. The ghost route also needs one
# weight-gradient kernel for the weighted sum, while materialised gradients make that sum nearly free, so
# it pays only when the Gram matrices are clearly smaller (measured on CPU: ResNet-18 layer3/4 yes,
# layer2 and opacus-cnn's conv2 no).
GHOST_RATIO = 0.5
# Materialised per-sample convolution gradients: with T >= this many output positions one grouped
# weight-gradient kernel (the batch folded into the groups); below, unfolded patches and a batched matmul.
GROUPED_MIN_POSITIONS = 256
# Widening sums over positions (float32 gradients summed in float64) go block by block of this many elements.
SUM_BLOCK = 1 << 19
LOSSES = ("cross_entropy",)

Masks = dict[str, Tensor] | None
Weights = Tensor | dict[str, Tensor]


@dataclass
class PerSampleNorms:
    """Per-sample gradient norms (after masks), with the per-sample losses and logits of the same pass."""

    flat: Tensor  # (n,) float64: ||g_i|| over all trainable parameters
    layers: dict[str, Tensor]  # name -> (n,) float64: ||g_{i,r}|| per parameter tensor
    loss: Tensor  # (n,) per-sample losses l_i
    logits: Tensor  # (n, M)

    def __len__(self) -> int:
        return int(self.flat.shape[0])

    @staticmethod
    def cat(parts: list[PerSampleNorms]) -> PerSampleNorms:
        """Concatenate the norms of consecutive chunks of one batch."""
        return PerSampleNorms(
            flat=torch.cat([p.flat for p in parts]),
            layers={k: torch.cat([p.layers[k] for p in parts]) for k in parts[0].layers},
            loss=torch.cat([p.loss for p in parts]),
            logits=torch.cat([p.logits for p in parts]),
        )


def flatten_grads(grads: dict[str, Tensor], names: list[str] | None = None) -> Tensor:
    """Per-sample gradients ``{name: (n, *shape)}`` as one ``(n, d)`` matrix, columns in ``names`` order
    (default: the dict's order, which for the engine's outputs is ``named_parameters()`` order)."""
    names = list(grads) if names is None else list(names)
    if not names:
        raise UsageError("flatten_grads: no gradients to flatten")
    n = grads[names[0]].shape[0]
    return torch.cat([grads[k].reshape(n, -1) for k in names], dim=1)


def refuse_batchnorm(model: nn.Module) -> None:
    """Refuse models with BatchNorm: it mixes the samples of a batch, so per-sample gradients are undefined."""
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            raise ModelError(
                f"model has BatchNorm ({name or 'root'}: {type(m).__name__}), which mixes the samples of a batch "
                'so per-sample gradients are undefined; build it with norm="group" '
                "(build_model(..., norm='group')) or convert it with "
                "landscape.models.convert_batchnorm_to_groupnorm(model)"
            )


# --------------------------------------------------------------------------------------------------------
# Hooks route: per-module handlers. Each turns the captured (input, output-gradient) pairs of one module
# into a "unit" that holds everything needed, then answers per-sample grads / squared norms / weighted sums
# (this engine) and per-sample rows / ghost factors (the Gram blocks of ``landscape.gram``).
# --------------------------------------------------------------------------------------------------------


class Handler:
    """Per-sample gradient algebra for one module type (the base of every handler; see ``register_handler``).

    A handler is built per module instance with ``pnames``, which maps the names of the module's own
    parameters it computes (``roles``, e.g. 'weight'/'bias') to their full ``named_parameters`` names.
    The engine keeps, for every call of the module in one batched forward, its first positional input and
    the gradient of the summed loss with respect to its output (the batch on dim 0 of both), and hands the
    list of these ``(input, output gradient)`` pairs to ``unit(calls)``, which packs them in a dict (default:
    ``{"calls": calls}``). A subclass implements ``per_sample_grads(u) -> {role: (n, *param.shape)}``; it may
    also override ``sq_norms`` / ``weighted`` (norms and weighted sums without materialising, e.g. ghost
    norms), ``ghost_factors`` / ``grad_factor`` (Gram blocks of ``landscape.gram``).

    ``roles`` (class attribute) names the module's own parameters the handler can compute (None: all of
    them); a module with another trainable parameter of its own goes to the ``torch.func`` route instead.
    ``accepts(module)`` may refuse a configuration (e.g. a sparse Embedding). ``reduce_dtype`` (None: the
    gradients' own) is the dtype in which bias and normalisation gradients are summed over positions.
    Materialised per-sample gradients are cached in the unit (key ``"g"``), so a norm computation followed by
    a weighted sum materialises at most once."""

    roles: tuple[str, ...] | None = ("weight", "bias")

    def __init__(self, module: nn.Module, pnames: dict[str, str], reduce_dtype: torch.dtype | None = None):
        self.module = module
        self.pnames = pnames
        self.reduce_dtype = reduce_dtype
        self.batch_dims: list[int] = []  # per call, where the probe found the batch (empty: dim 0)

    @classmethod
    def accepts(cls, module: nn.Module) -> bool:
        """Whether this handler can do this module instance (default: yes)."""
        return True

    def movable_batch(self) -> bool:
        """Whether the module treats all leading dimensions of its input alike (Linear, LayerNorm, Embedding),
        so that a batch found on another dimension (``batch_first=False`` attention blocks) may be moved to
        dim 0 before the handler sees it (default: no; the batch must be dim 0)."""
        return False

    def unit(self, calls: list[tuple[Tensor, Tensor]]) -> dict:
        return {"calls": calls}

    def per_sample_grads(self, u: dict) -> dict[str, Tensor]:
        raise NotImplementedError

    def per_sample(self, u: dict) -> dict[str, Tensor]:
        if "g" not in u:
            u["g"] = self.per_sample_grads(u)
        return u["g"]

    def role_per_sample(self, u: dict, role: str) -> Tensor:
        """Per-sample gradients ``(n, *shape)`` of one role ('weight' or 'bias') only."""
        return self.per_sample(u)[role]

    def ghost_factors(self, u: dict) -> tuple[Tensor, Tensor] | None:
        """``(A, B)`` of shapes (n, G, D, T) and (n, G, P, T) with g_i(weight) = B_i A_i^T per group (T
        positions), when the weight gradient is one such product per sample; else None."""
        return None

    def grad_factor(self, b: Tensor) -> Tensor:
        """The ``B`` of ``ghost_factors`` for one output gradient ``b`` (another backward pass over the same
        inputs: their ``A`` is unchanged)."""
        raise NotImplementedError

    def sq_norms(self, u: dict, masks: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k: _sq(g, masks.get(k)) for k, g in self.per_sample(u).items()}

    def weighted(self, u: dict, w: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k: _wsum(w[k], g) for k, g in self.per_sample(u).items()}

    def _sum(self, t: Tensor, dim) -> Tensor:
        """``t.sum(dim)`` (dim > 0) in ``reduce_dtype``; a widening sum is done in blocks of samples of at most
        ``SUM_BLOCK`` elements: the same numbers, but float32 -> float64 sums of a whole resnet activation
        batch are ~25x slower on CPU than block by block (measured: (64, 64, 1024) 36 ms vs 1.5 ms)."""
        dt = self.reduce_dtype
        if dt is None or dt == t.dtype or t.numel() <= SUM_BLOCK:
            return t.sum(dim, dtype=dt)
        step = max(1, SUM_BLOCK // max(1, t[0].numel()))
        return torch.cat([t[i : i + step].sum(dim, dtype=dt) for i in range(0, t.shape[0], step)])


# module type -> handler class: the open registry (exact types; see ``register_handler``)
_HANDLERS: dict[type, type[Handler]] = {}


def register_handler(*module_types: type, replace: bool = False) -> Callable[[type[Handler]], type[Handler]]:
    """Class decorator registering a :class:`Handler` for modules of exactly these types (not subclasses,
    whose ``forward`` may do something else: register them too if they compute the same function).

    ``@register_handler(MyLayer) class MyLayerHandler(Handler): ...``. Registering a type that already has
    another handler raises ``UsageError`` unless ``replace=True``. Modules without a handler take the
    ``torch.func`` route automatically, so a handler is only ever a speed-up; the engine's first call checks
    the summed per-sample gradients against autograd's and falls back to ``torch.func`` if a handler is wrong.
    Register next to the layer's class, so that worker processes importing the model's code register too."""
    for t in module_types:
        if not (isinstance(t, type) and issubclass(t, nn.Module)):
            raise UsageError(f"register_handler: {t!r} is not an nn.Module subclass")
    if not module_types:
        raise UsageError("register_handler: name at least one module type")

    def deco(cls: type[Handler]) -> type[Handler]:
        if not (isinstance(cls, type) and issubclass(cls, Handler)):
            raise UsageError(f"register_handler: {cls!r} is not a landscape.persample.Handler subclass")
        for t in module_types:
            old = _HANDLERS.get(t)
            if old is not None and old is not cls and not replace:
                raise UsageError(
                    f"{t.__name__} already has the per-sample handler {old.__name__}; pass replace=True to replace it"
                )
            _HANDLERS[t] = cls
        return cls

    return deco


def unregister_handler(module_type: type) -> None:
    """Remove the handler of ``module_type`` (its modules then take the ``torch.func`` route)."""
    _HANDLERS.pop(module_type, None)


def handler_for(module: nn.Module) -> type[Handler] | None:
    """The handler class registered for ``type(module)`` that accepts this module, or None."""
    cls = _HANDLERS.get(type(module))
    return cls if cls is not None and cls.accepts(module) else None


def _sq(g: Tensor, mask: Tensor | None) -> Tensor:
    if mask is not None:
        g = g * mask
    return torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1).square()


def ghost_sq(a: Tensor, b: Tensor) -> Tensor:
    """Ghost norm ||B_i A_i^T||^2 = sum_{g,t,s} (A_i^T A_i)_{g,ts} (B_i^T B_i)_{g,ts} per sample, from
    ``ghost_factors`` (Li et al. 2021, eq. 4; Bu et al. 2023): no per-sample gradient is formed."""
    return ((a.transpose(2, 3) @ a) * (b.transpose(2, 3) @ b)).sum((1, 2, 3))


def _acc(total: Tensor | None, term: Tensor) -> Tensor:
    return term if total is None else total + term


def _wsum(w: Tensor, g: Tensor) -> Tensor:
    return (w @ g.reshape(g.shape[0], -1)).reshape(g.shape[1:])


class _WeightBiasHandler(Handler):
    """A module whose unit holds the per-sample bias gradients (``"gb"``); subclasses do the weight's."""

    def _weight_per_sample(self, u: dict) -> Tensor:
        raise NotImplementedError

    def _weight_sq(self, u: dict, mask: Tensor | None) -> Tensor:
        raise NotImplementedError

    def _weight_weighted(self, u: dict, w: Tensor) -> Tensor:
        raise NotImplementedError

    def role_per_sample(self, u, role):
        return self._weight_per_sample(u) if role == "weight" else u["gb"]

    def per_sample_grads(self, u):
        return {role: self.role_per_sample(u, role) for role in ("weight", "bias") if role in self.pnames}

    def sq_norms(self, u, masks):
        out = {}
        if "weight" in self.pnames:
            out["weight"] = self._weight_sq(u, masks.get("weight"))
        if "bias" in self.pnames:
            out["bias"] = _sq(u["gb"], masks.get("bias"))
        return out

    def weighted(self, u, w):
        out = {}
        if "weight" in self.pnames:
            out["weight"] = self._weight_weighted(u, w["weight"])
        if "bias" in self.pnames:
            out["bias"] = _wsum(w["bias"], u["gb"])
        return out


@register_handler(nn.Linear)
class LinearHandler(_WeightBiasHandler):
    """nn.Linear on inputs (n, ..., D): g_i(weight) = sum_t B_t^T A_t over the T positions of sample i.

    Unit: ``a`` (n, 1, D, T) and ``b`` (n, 1, P, T), and for a module called once, ``direct(w)``:
    ``sum_i w_i g_i(weight)`` by one matmul. T = 1 (the usual case): ||g_i||^2 = ||A_i||^2 ||B_i||^2."""

    def movable_batch(self):
        return True

    def _ab(self, a, b):
        return a.reshape(a.shape[0], -1, a.shape[-1]).transpose(1, 2).unsqueeze(1), self.grad_factor(b)

    def grad_factor(self, b):
        return b.reshape(b.shape[0], -1, b.shape[-1]).transpose(1, 2).unsqueeze(1)

    def _direct(self, a, b):
        n = a.shape[0]
        a2, b2 = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
        t = a2.shape[0] // max(n, 1)

        def direct(w):
            wr = w if t == 1 else w.repeat_interleave(t)
            return (b2 * wr.unsqueeze(1)).transpose(0, 1) @ a2

        return direct

    def unit(self, calls):
        pairs = [self._ab(a, b) for a, b in calls]
        if len(pairs) == 1:
            u = {"a": pairs[0][0], "b": pairs[0][1]}
            if "weight" in self.pnames:
                u["direct"] = self._direct(*calls[0])
        else:
            u = {"a": torch.cat([p[0] for p in pairs], dim=3), "b": torch.cat([p[1] for p in pairs], dim=3)}
        if "bias" in self.pnames:
            u["gb"] = self._sum(u["b"], 3).reshape(u["b"].shape[0], -1)
        return u

    def ghost_factors(self, u):
        return u["a"], u["b"]

    def _weight_per_sample(self, u: dict) -> Tensor:
        if "gw" not in u:
            a, b = u["a"], u["b"]
            if a.shape[3] == 1:
                g = b * a.transpose(2, 3)
            else:
                g = b @ a.transpose(2, 3)
            u["gw"] = g.reshape(a.shape[0], *self.module.weight.shape)
        return u["gw"]

    def _weight_sq(self, u, mask):
        a, b = u["a"], u["b"]
        t, d, p = a.shape[3], a.shape[2], b.shape[2]
        if mask is not None or "gw" in u:
            return _sq(self._weight_per_sample(u), mask)
        if t == 1:
            return (a.pow(2).sum(2) * b.pow(2).sum(2)).sum((1, 2))
        if t * (d + p) < GHOST_RATIO * p * d:
            return ghost_sq(a, b)
        return _sq(self._weight_per_sample(u), None)

    def _weight_weighted(self, u, w):
        if "gw" in u:
            return _wsum(w, u["gw"])
        if "direct" in u:
            return u["direct"](w)
        a, b = u["a"], u["b"]
        bw = b * w.reshape(-1, 1, 1, 1)
        return torch.einsum("ngpt,ngdt->gpd", bw, a).reshape(self.module.weight.shape)


@register_handler(nn.Conv1d, nn.Conv2d)
class ConvHandler(_WeightBiasHandler):
    """Conv1d / Conv2d (any stride, padding, padding mode, dilation, groups).

    Per-sample weight gradients come from ONE weight-gradient kernel with the batch folded into the groups
    (input (1, n C_in, H, W), groups n G; no im2col) for many output positions, else from unfolded patches
    and a batched matmul. When ``T (D + P) < GHOST_RATIO P D`` (T output positions,
    D = C_in/G k_h k_w, P = C_out/G) the norm is the ghost norm over unfolded patches and the weighted sum
    one ordinary weight-gradient kernel on the re-weighted output gradients."""

    def _geometry(self):
        m = self.module
        if isinstance(m, nn.Conv1d):
            return (1, *m.kernel_size), (1, *m.stride), (1, *m.dilation)
        return m.kernel_size, m.stride, m.dilation

    def _padded(self, a: Tensor) -> tuple[Tensor, list[int]]:
        """Input padded as the module pads it, and the padding still to apply (symmetric zero padding is
        left to the kernels)."""
        m = self.module
        if m.padding_mode == "zeros" and not isinstance(m.padding, str):
            return a, list(m.padding)
        mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
        pad = list(m._reversed_padding_repeated_twice)
        return (F.pad(a, pad, mode=mode) if any(pad) else a), [0] * len(m.kernel_size)

    def _wgrad(self, gy: Tensor, x: Tensor, pad: list[int], groups: int, wshape) -> Tensor:
        m = self.module
        return torch.ops.aten.convolution_backward(
            gy,
            x,
            gy.new_zeros(wshape),
            None,
            list(m.stride),
            pad,
            list(m.dilation),
            False,
            [0] * len(pad),
            groups,
            [False, True, False],
        )[1]

    def unit(self, calls):
        u = {"calls": [(*self._padded(a), b) for a, b in calls]}
        if "bias" in self.pnames:
            u["gb"] = functools.reduce(_acc, [self._sum(b.flatten(2), 2) for _, b in calls], None)
        return u

    def _weight_per_sample(self, u: dict) -> Tensor:
        if "gw" not in u:
            m, g = self.module, None
            for x, pad, b in u["calls"]:
                n = x.shape[0]
                if b[0, 0].numel() >= GROUPED_MIN_POSITIONS:
                    xg = x.reshape(1, n * x.shape[1], *x.shape[2:])
                    bg = b.reshape(1, n * b.shape[1], *b.shape[2:])
                    wshape = (n * m.weight.shape[0], *m.weight.shape[1:])
                    g = _acc(g, self._wgrad(bg, xg, pad, n * m.groups, wshape).reshape(n, *m.weight.shape))
                else:
                    a, bb = self._patches(x, pad, b)
                    g = _acc(g, (bb @ a.transpose(2, 3)).reshape(n, *m.weight.shape))
            u["gw"] = g
        return u["gw"]

    def _patches(self, x: Tensor, pad: list[int], b: Tensor) -> tuple[Tensor, Tensor]:
        """Unfolded input patches (n, G, D, T) and output gradients (n, G, P, T) of one call."""
        m = self.module
        n, groups = x.shape[0], m.groups
        if isinstance(m, nn.Conv1d):
            x, b, pad = x.unsqueeze(2), b.unsqueeze(2), [0, *pad]
        if any(pad):
            x = F.pad(x, [pad[1], pad[1], pad[0], pad[0]])
        kernel, stride, dilation = self._geometry()
        t = b.shape[-2] * b.shape[-1]
        a = _unfold(x, kernel, stride, dilation, b.shape[-2:]).reshape(n, groups, -1, t)
        return a, self.grad_factor(b)

    def grad_factor(self, b):
        return b.reshape(b.shape[0], self.module.groups, -1, b[0, 0].numel())

    def _ghost_ok(self, u: dict) -> bool:
        if len(u["calls"]) != 1 or "gw" in u:
            return False
        m = self.module
        t = u["calls"][0][2][0, 0].numel()
        d, p = m.weight[0].numel(), m.weight.shape[0] // m.groups
        return t * (d + p) < GHOST_RATIO * p * d

    def ghost_factors(self, u):
        """Unfolded patches and output gradients of a module called once (several calls: None)."""
        return self._patches(*u["calls"][0]) if len(u["calls"]) == 1 else None

    def _weight_sq(self, u, mask):
        if mask is None and self._ghost_ok(u):
            return ghost_sq(*self.ghost_factors(u))
        return _sq(self._weight_per_sample(u), mask)

    def _weight_weighted(self, u, w):
        if "gw" not in u and len(u["calls"]) == 1:
            x, pad, b = u["calls"][0]
            gy = b * w.reshape(-1, *[1] * (b.dim() - 1))
            return self._wgrad(gy, x, pad, self.module.groups, self.module.weight.shape)
        return _wsum(w, self._weight_per_sample(u))


def _unfold(x: Tensor, kernel, stride, dilation, out_hw) -> Tensor:
    """``F.unfold`` of an already padded (n, C, H, W) input, as a strided view copied once (several times
    faster than ATen's im2col on CPU)."""
    n, c = x.shape[:2]
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = kernel, stride, dilation, out_hw
    sn, sc, sy, sx = x.stride()
    view = x.as_strided(
        (n, c, kh, kw, ho, wo), (sn, sc, sy * dh, sx * dw, sy * sh, sx * sw), x.storage_offset()
    )
    return view.reshape(n, c * kh * kw, ho * wo)


@register_handler(nn.GroupNorm, nn.LayerNorm)
class NormHandler(Handler):
    """GroupNorm / LayerNorm affine parameters: g_i(weight) = sum over positions of B * xhat, g_i(bias) = sum B."""

    def movable_batch(self):
        return isinstance(self.module, nn.LayerNorm)

    def _xhat(self, a: Tensor) -> Tensor:
        m = self.module
        if isinstance(m, nn.GroupNorm):
            return F.group_norm(a, m.num_groups, eps=m.eps)
        return F.layer_norm(a, m.normalized_shape, eps=m.eps)

    def _reduce(self, t: Tensor) -> Tensor:
        m = self.module
        n = t.shape[0]
        if isinstance(m, nn.GroupNorm):
            return self._sum(t.reshape(n, t.shape[1], -1), 2)
        k = len(m.normalized_shape)
        return self._sum(t.reshape(n, -1, *t.shape[t.dim() - k :]), 1)

    def per_sample_grads(self, u):
        out = {}
        for a, b in u["calls"]:
            if "weight" in self.pnames:
                out["weight"] = _acc(out.get("weight"), self._reduce(b * self._xhat(a)))
            if "bias" in self.pnames:
                out["bias"] = _acc(out.get("bias"), self._reduce(b))
        return out


@register_handler(nn.Embedding)
class EmbeddingHandler(Handler):
    """nn.Embedding: g_i = sum_t onehot(idx_t)^T B_t (rows at padding_idx get no gradient)."""

    roles = ("weight",)

    @classmethod
    def accepts(cls, module):
        return not module.scale_grad_by_freq and not module.sparse

    def movable_batch(self):
        return True

    def unit(self, calls):
        m = self.module
        idx = [a.reshape(a.shape[0], -1) for a, _ in calls]
        bs = [b.reshape(b.shape[0], -1, m.embedding_dim) for _, b in calls]
        idx = torch.cat(idx, 1) if len(idx) > 1 else idx[0]
        b = torch.cat(bs, 1) if len(bs) > 1 else bs[0]
        if m.padding_idx is not None:
            b = b * (idx != m.padding_idx).unsqueeze(-1).to(b.dtype)
        return {"idx": idx, "b": b}

    def per_sample_grads(self, u):
        idx, b = u["idx"], u["b"]
        n, t = idx.shape
        g = b.new_zeros(n, self.module.num_embeddings, self.module.embedding_dim)
        g.scatter_add_(1, idx.unsqueeze(-1).expand(n, t, b.shape[-1]), b)
        return {"weight": g}

    def sq_norms(self, u, masks):
        if "weight" in masks or "g" in u:
            return super().sq_norms(u, masks)
        idx, b = u["idx"], u["b"]
        same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(b.dtype)
        return {"weight": (same * (b @ b.transpose(1, 2))).sum((1, 2))}

    def weighted(self, u, w):
        if "g" in u:
            return super().weighted(u, w)
        idx, b = u["idx"], u["b"]
        g = b.new_zeros(self.module.num_embeddings, self.module.embedding_dim)
        g.index_add_(0, idx.reshape(-1), (b * w["weight"].reshape(-1, 1, 1)).reshape(-1, b.shape[-1]))
        return {"weight": g}


class FunctionalHandler(Handler):
    """Any module, by ``torch.func``: the per-sample gradients of the parameters ``pnames`` (its own, and
    those of descendants its ``forward`` uses without calling them, like ``nn.MultiheadAttention.out_proj``)
    are the per-sample vector-Jacobian products ``g_i = grad_theta sum_k <f_k(theta, inputs_i), B_{k,i}>``
    of the module's output tensors f_k with their captured output gradients B_k, by ``vmap(grad)`` over the
    samples of one call's inputs (positional and keyword; Opacus' functorch mode, generalised).

    ``dims`` gives, per call, the batch dimension of every input leaf and every output leaf (None: shared by
    all samples), as ``probe_batch_dims`` measured them. Random operations inside the module (dropout in
    training mode) would draw other numbers than the forward did, so they are refused (vmap's
    ``randomness="error"``) and the engine takes the whole-model route."""

    roles = None

    def __init__(self, module, pnames, reduce_dtype=None, dims=None):
        super().__init__(module, pnames, reduce_dtype)
        self.dims: list[tuple[list[int | None], list[int | None]]] = dims or []

    def unit(self, calls):
        if len(calls) != len(self.dims):
            raise HooksFailed(
                f"module {type(self.module).__name__} was called {len(calls)} times, {len(self.dims)} in the probe"
            )
        g = None
        for (inputs, grads), dims in zip(calls, self.dims, strict=True):
            try:
                gk = self._call_grads(inputs, grads, *dims)
            except (RuntimeError, NotImplementedError, ValueError, TypeError) as e:
                name = type(self.module).__name__
                if "randomness" in str(e):
                    raise HooksFailed(f"module {name} draws random numbers (dropout in training mode?)") from e
                why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise HooksFailed(f"torch.func cannot take module {name} apart: {why}") from e
            g = gk if g is None else {k: g[k] + gk[k] for k in g}
        return {"g": g}

    def per_sample_grads(self, u):
        return u["g"]

    def _call_grads(self, inputs, grads, in_dims, out_dims) -> dict[str, Tensor]:
        leaves, spec = tree_flatten(inputs)
        bidx = [i for i, d in enumerate(in_dims) if d is not None]
        outs = [(j, g) for j, g in enumerate(grads) if g is not None]
        if any(out_dims[j] is None for j, _ in outs):
            raise HooksFailed(f"module {type(self.module).__name__} has an output shared by all samples")
        params = dict(self.module.named_parameters(remove_duplicate=False))
        params = {role: params[role].detach() for role in self.pnames}
        module = self.module

        def vjp_one(p, xs, gs):
            full = list(leaves)
            for i, t in zip(bidx, xs, strict=True):
                full[i] = t.unsqueeze(in_dims[i])
            args, kwargs = tree_unflatten(full, spec)
            out = tree_flatten(functional_call(module, p, tuple(args), kwargs))[0]
            total = None
            for (j, _), g in zip(outs, gs, strict=True):
                term = (out[j] * g.unsqueeze(out_dims[j]).to(out[j].dtype)).sum()
                total = term if total is None else total + term
            return total

        if not outs:
            n = next(leaves[i].shape[in_dims[i]] for i in bidx)
            return {k: v.new_zeros(n, *v.shape) for k, v in params.items()}
        fn = vmap(
            grad(vjp_one),
            in_dims=(None, [in_dims[i] for i in bidx], [out_dims[j] for j, _ in outs]),
            randomness="error",
        )
        # attention's fused kernels have no vmap batching rule (a per-sample loop); its math form has
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
            return fn(params, [leaves[i] for i in bidx], [g for _, g in outs])


def plan_handlers(
    model: nn.Module, names: list[str], reduce_dtype: torch.dtype | None = None
) -> tuple[list[Handler], list[str]]:
    """Handlers for the modules owning parameters ``names``; the names no handler covers (a module type
    without handler, a parameter outside any module, or one tied between modules: torch.func's business)."""
    wanted = set(names)
    owners: dict[int, set[int]] = {}  # parameter -> the modules holding it (two or more: tied)
    for m in model.modules():
        for p in m.parameters(recurse=False):
            owners.setdefault(id(p), set()).add(id(m))
    handlers, covered = [], set()
    for mname, m in model.named_modules(remove_duplicate=True):
        own = {k: (f"{mname}.{k}" if mname else k) for k, p in m.named_parameters(recurse=False) if len(owners[id(p)]) == 1}
        own = {k: full for k, full in own.items() if full in wanted}
        cls = handler_for(m) if own else None
        if cls is None or (cls.roles is not None and not set(own) <= set(cls.roles)):
            continue
        handlers.append(cls(m, own, reduce_dtype))
        covered.update(own.values())
    return handlers, [k for k in names if k not in covered]


def _shared_parameters(model: nn.Module) -> list[str]:
    """Names of parameters held by two or more modules (tied): no module's call sees all their uses."""
    owners: dict[int, int] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    return [k for k, p in model.named_parameters() if owners.get(id(p), 0) > 1]


def _leaf_shapes(tree) -> list[tuple[int, ...] | None]:
    return [tuple(t.shape) if isinstance(t, Tensor) else None for t in tree_flatten(tree)[0]]


def _batch_dims(s1: list, s2: list) -> list[int | None] | None:
    """Per leaf, the one dimension that is 1 with one sample and 2 with two (None: the same size, shared by
    the samples); None when some leaf changes otherwise (its samples are not kept apart on one dimension)."""
    if len(s1) != len(s2):
        return None
    dims = []
    for a, b in zip(s1, s2, strict=True):
        if a is None or a == b:
            dims.append(None)
            continue
        if b is None or len(a) != len(b):
            return None
        diff = [d for d in range(len(a)) if a[d] != b[d]]
        if len(diff) != 1 or (a[diff[0]], b[diff[0]]) != (1, 2):
            return None
        dims.append(diff[0])
    return dims


def probe_calls(model: nn.Module, x: Tensor) -> dict[nn.Module, list | str]:
    """Every module the forward calls with grad enabled -> per call, ``(input dims, output dims)``: the batch
    dimension of each input leaf (positional and keyword) and output leaf, None where the leaf is shared by
    the samples. Measured by two forwards, on one and on two copies of the first sample (no assumption on
    where modules keep the batch: ``nn.MultiheadAttention`` without ``batch_first`` has it on dim 1). A
    module whose leaves do not keep the samples apart gets a reason instead. The RNG state is left as it was."""
    runs: list[dict[nn.Module, list]] = []
    devices = [x.device] if x.device.type == "cuda" else []
    for xb in (x[:1], x[:1].expand(2, *x.shape[1:]).contiguous()):
        seen: dict[nn.Module, list] = {}

        def hook(m, args, kwargs, out, seen=seen):
            if torch.is_grad_enabled():
                seen.setdefault(m, []).append((_leaf_shapes((args, kwargs)), _leaf_shapes(out)))

        handles = [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules()]
        try:
            with torch.random.fork_rng(devices=devices), torch.enable_grad(), exact_fast_pooling(model):
                model(xb)
        finally:
            for hd in handles:
                hd.remove()
        runs.append(seen)
    out: dict[nn.Module, list | str] = {}
    for m, one in runs[0].items():
        two = runs[1].get(m, [])
        if len(one) != len(two):
            out[m] = "is called a different number of times for one and two samples"
            continue
        dims = [(_batch_dims(a1, a2), _batch_dims(o1, o2)) for (a1, o1), (a2, o2) in zip(one, two, strict=True)]
        ok = all(i is not None and o is not None for i, o in dims)
        out[m] = dims if ok else "does not keep the samples apart along one dimension of its inputs and outputs"
    return out


def place_batch(handlers: list[Handler], calls: dict[nn.Module, list | str]) -> None:
    """Set ``Handler.batch_dims`` from ``probe_calls``: where each handler's module sees the batch, per call;
    ``HooksFailed`` when it is not dim 0 and the handler cannot move it there."""
    for h in handlers:
        dims = calls.get(h.module)
        if not isinstance(dims, list):
            continue  # never called (its parameters get no gradient) or not one sample per index
        found = [(i[0] if i else 0, o[0] if o else 0) for i, o in dims]
        if all(d == (0, 0) for d in found):
            continue
        if not (h.movable_batch() and all(a == b and a is not None for a, b in found)):
            raise HooksFailed(f"module {type(h.module).__name__} does not see the batch on dim 0")
        h.batch_dims = [a for a, _ in found]


class Capture:
    """The one capture of the hooks routes: module inputs in the forward, output gradients in the backward.

    Inside ``with Capture(handlers):`` every call of a handler's module (grad enabled, output requiring
    grad) keeps its input (detached) and puts a hook on its output. ``backward(root, grad)`` then runs one
    backward that computes activation gradients only (``inputs`` = the outputs' gradient edges: no weight
    gradient is formed and no ``.grad`` touched), and the hooks receive each output gradient as it is formed.
    ``passes`` backwards (``retain_graph=True`` but for the last; e.g. one per logit) give every call one
    gradient per pass. ``on_complete(handler)``, if given, is called inside the backward as soon as every
    call of that handler has all its gradients, so that a caller can reduce them and ``release`` them before
    the backward goes on (lower peak memory: the Gram blocks of ``landscape.gram``)."""

    def __init__(
        self, handlers: list[Handler], *, passes: int = 1, on_complete: Callable[[Handler], None] | None = None
    ):
        self.handlers = list(handlers)
        self.passes, self.on_complete = passes, on_complete
        self.inputs: dict[Handler, list[Tensor]] = {h: [] for h in self.handlers}
        self.shapes: dict[Handler, list[torch.Size]] = {h: [] for h in self.handlers}
        self.grads: dict[Handler, list[list[Tensor]]] = {h: [] for h in self.handlers}  # per call, per pass
        self._edges: list = []
        self._handles: list = []

    def __enter__(self) -> Capture:
        for h in self.handlers:
            if isinstance(h, FunctionalHandler):
                hook = functools.partial(self._call_hook, h)
                self._handles.append(h.module.register_forward_hook(hook, with_kwargs=True))
            else:
                self._handles.append(h.module.register_forward_hook(functools.partial(self._forward_hook, h)))
        return self

    def __exit__(self, *exc) -> None:
        for hd in self._handles:
            hd.remove()
        self._handles.clear()

    def _forward_hook(self, h: Handler, _module, inputs, output) -> None:
        if torch.is_grad_enabled() and isinstance(output, Tensor) and output.requires_grad:
            k = len(self.inputs[h])
            self.inputs[h].append(inputs[0].detach())
            self.shapes[h].append(output.shape)
            self.grads[h].append([])
            self._edges.append(get_gradient_edge(output))
            output.register_hook(functools.partial(self._grad_hook, h, k))

    def _call_hook(self, h: FunctionalHandler, _module, args, kwargs, output) -> None:
        """A functional handler's call: all its inputs (positional and keyword) and a hook on every output
        tensor that requires grad (one backward pass: its gradients go to ``grads[h][k][0]`` by leaf)."""
        if not torch.is_grad_enabled():
            return
        leaves = tree_flatten(output)[0]
        outs = [(j, t) for j, t in enumerate(leaves) if isinstance(t, Tensor) and t.requires_grad]
        if not outs:
            return
        k = len(self.inputs[h])
        self.inputs[h].append(tree_map(lambda t: t.detach() if isinstance(t, Tensor) else t, (args, kwargs)))
        self.shapes[h].append(
            [(t.shape, t.dtype, t.device) if isinstance(t, Tensor) and t.requires_grad else None for t in leaves]
        )
        self.grads[h].append([{}])
        for j, t in outs:
            self._edges.append(get_gradient_edge(t))
            t.register_hook(functools.partial(self._leaf_hook, h, k, j))

    def _leaf_hook(self, h: FunctionalHandler, k: int, j: int, g: Tensor) -> None:
        self.grads[h][k][0][j] = g.detach()

    def _grad_hook(self, h: Handler, k: int, g: Tensor) -> None:
        self.grads[h][k].append(g.detach())
        if self.on_complete is not None and all(len(gs) == self.passes for gs in self.grads[h]):
            self.on_complete(h)

    def backward(self, root: Tensor, grad: Tensor | None = None, *, retain_graph: bool = False) -> None:
        if not self._edges:
            raise HooksFailed("no supported module was called")
        torch.autograd.backward(root, grad, retain_graph=retain_graph, inputs=self._edges)

    def calls(self, h: Handler, n: int, pass_: int = 0) -> list[tuple[Tensor, Tensor]]:
        """(input, output gradient of pass ``pass_``) per call of ``h``'s module; zeros where no gradient
        reached an output. The batch (``n`` samples) must be dim 0 of both, or where ``h.batch_dims`` says
        (then moved to dim 0)."""
        if isinstance(h, FunctionalHandler):  # ((args, kwargs), [output gradient or None per output leaf])
            return [
                (inp, [None if t is None else gs[0].get(j, torch.zeros(t[0], dtype=t[1], device=t[2]))
                       for j, t in enumerate(leaves)])
                for inp, leaves, gs in zip(self.inputs[h], self.shapes[h], self.grads[h], strict=True)
            ]
        out = []
        for k, (a, shape, gs) in enumerate(zip(self.inputs[h], self.shapes[h], self.grads[h], strict=True)):
            b = gs[pass_] if len(gs) > pass_ else a.new_zeros(shape)
            if h.batch_dims and h.batch_dims[k % len(h.batch_dims)]:
                d = h.batch_dims[k % len(h.batch_dims)]
                a, b = a.movedim(d, 0), b.movedim(d, 0)
            if a.shape[0] != n or b.shape[0] != n:
                raise HooksFailed(f"module {type(h.module).__name__} does not see the batch on dim 0")
            out.append((a, b))
        return out

    def reached(self, h: Handler) -> bool:
        """Whether some output gradient of ``h``'s module arrived."""
        return any(self.grads[h][k] for k in range(len(self.grads[h])))

    def release(self, h: Handler) -> None:
        """Drop what was kept for ``h``'s module."""
        self.inputs[h], self.shapes[h], self.grads[h] = [], [], []

    def nbytes(self) -> int:
        """Bytes of the kept inputs and output gradients."""
        ts = [a for v in self.inputs.values() for a in v] + [g for v in self.grads.values() for gs in v for g in gs]
        return sum(t.numel() * t.element_size() for t in ts)


def functorch_grads(
    model: nn.Module, names: list[str], x: Tensor, y: Tensor | None = None
) -> tuple[dict[str, Tensor], Tensor | None, Tensor | None]:
    """Per-sample gradients by ``torch.func`` w.r.t. the parameters ``names`` (the others held fixed).

    With labels ``y``: ``vmap(grad)`` of l_i = cross_entropy(f(x_i), y_i), returning ``({name: (n, *shape)},
    losses, logits)``; without: ``vmap(jacrev)`` of the logits f(x_i), returning ``({name: (n, M, *shape)},
    None, None)``. Any model; ``randomness="different"`` (dropout draws per sample)."""
    fixed = {k: p.detach() for k, p in model.named_parameters()}
    params = {k: fixed[k] for k in names}

    def logits_one(p, xi):
        return functional_call(model, {**fixed, **p}, (xi.unsqueeze(0),))

    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):  # fused attention has no vmap rule: a slow loop
        if y is None:
            jac = vmap(jacrev(lambda p, xi: logits_one(p, xi).squeeze(0)), in_dims=(None, 0), randomness="different")
            return jac(params, x), None, None

        def loss_one(p, xi, yi):
            out = logits_one(p, xi)
            loss = F.cross_entropy(out, yi.unsqueeze(0), reduction="sum")
            return loss, (loss.detach(), out.squeeze(0).detach())

        g, (losses, logits) = vmap(grad(loss_one, has_aux=True), in_dims=(None, 0, 0), randomness="different")(
            params, x, y
        )
    return g, losses, logits


# --------------------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------------------


class PerSampleEngine:
    """Per-sample gradients of ``l_i = cross_entropy(model(x_i), y_i)`` w.r.t. the trainable parameters.

    ``microbatch`` bounds how many samples go through one pass (memory); ``strategy`` is ``"auto"`` (hooks
    when every trainable parameter sits in a supported module, else functorch), ``"hooks"`` or
    ``"functorch"``. The model is never modified (no ``.grad``, no mode change).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        loss: str = "cross_entropy",
        microbatch: int | None = None,
        strategy: str = "auto",
    ):
        if loss not in LOSSES:
            raise UsageError(f"unknown per-sample loss {loss!r}; choose one of {', '.join(LOSSES)}")
        if strategy not in STRATEGIES:
            raise UsageError(
                f"unknown per-sample strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
            )
        if microbatch is not None and int(microbatch) < 1:
            raise UsageError(f"microbatch must be a positive integer, got {microbatch}")
        refuse_batchnorm(model)
        self.model = model
        self.loss = loss
        self.microbatch = None if microbatch is None else int(microbatch)
        self.params: dict[str, nn.Parameter] = {k: p for k, p in model.named_parameters() if p.requires_grad}
        if not self.params:
            raise ModelError("model has no trainable parameters (all have requires_grad=False)")
        self.names = list(self.params)
        self._all_names = {k for k, _ in model.named_parameters()}
        self._handlers, self._uncovered = plan_handlers(model, self.names)
        if strategy == "hooks" and self._uncovered:
            raise ModelError(
                f"strategy='hooks' cannot handle parameter {self._uncovered[0]!r} (no handler for its module); "
                "use strategy='auto' or 'functorch'"
            )
        self.requested = strategy
        shared = set(_shared_parameters(model)) & set(self._uncovered)
        if strategy == "functorch" or shared:
            self.strategy = "functorch"
        else:
            self.strategy = "mixed" if self._uncovered else "hooks"
        self._verified = self.strategy == "functorch"
        self._forward_ad = True  # projections by jvp; False once a module turned out to lack forward AD

    # ---------------------------------------------------------------- helpers
    @property
    def _ref(self) -> Tensor:
        return next(iter(self.params.values()))

    def _prepare(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        ref = self._ref
        x = torch.as_tensor(x, device=ref.device)
        if x.is_floating_point():
            x = x.to(ref.dtype)
        y = torch.as_tensor(y, device=ref.device).long().reshape(-1)
        if x.shape[0] != y.shape[0]:
            raise UsageError(f"x has {x.shape[0]} samples but y has {y.shape[0]}")
        return x, y

    def _chunks(self, x: Tensor, y: Tensor, *extra: Tensor) -> Iterator[tuple[Tensor, ...]]:
        n = x.shape[0]
        step = n if self.microbatch is None else self.microbatch
        for s in range(0, n, max(step, 1)):
            yield (x[s : s + step], y[s : s + step], *(e[s : s + step] for e in extra))

    def _masks(self, masks: Masks) -> dict[str, Tensor]:
        if not masks:
            return {}
        unknown = [k for k in masks if k not in self.params and k not in self._all_names]
        if unknown:
            raise UsageError(f"mask for {unknown[0]!r}, which is not a parameter of the model")
        out = {}
        for k, m in masks.items():
            if k not in self.params:  # frozen: it has no gradient to mask
                continue
            p = self.params[k]
            if tuple(m.shape) != tuple(p.shape):
                raise UsageError(f"mask for {k!r} has shape {tuple(m.shape)}, parameter has {tuple(p.shape)}")
            out[k] = m.to(device=p.device, dtype=p.dtype)
        return out

    def _layer_weights(self, weights: Weights, n: int) -> dict[str, Tensor]:
        ref = self._ref
        if isinstance(weights, dict):
            missing = [k for k in self.names if k not in weights]
            if missing:
                raise UsageError(f"per-layer weights lack parameter {missing[0]!r}")
            out = {
                k: torch.as_tensor(weights[k], device=ref.device).to(ref.dtype).reshape(-1)
                for k in self.names
            }
        else:
            w = torch.as_tensor(weights, device=ref.device).to(ref.dtype).reshape(-1)
            out = dict.fromkeys(self.names, w)
        for k, w in out.items():
            if w.shape[0] != n:
                raise UsageError(f"weights for {k!r} have {w.shape[0]} entries for {n} samples")
        return out

    def _empty_norms(self, n: int = 0) -> PerSampleNorms:
        ref = self._ref
        z = torch.zeros(n, dtype=torch.float64, device=ref.device)
        return PerSampleNorms(
            flat=z,
            layers={k: z.clone() for k in self.names},
            loss=torch.zeros(0, dtype=ref.dtype, device=ref.device),
            logits=torch.zeros(0, 0, dtype=ref.dtype, device=ref.device),
        )

    def _zeros(self) -> dict[str, Tensor]:
        return {
            k: torch.zeros_like(p, memory_format=torch.contiguous_format).detach()
            for k, p in self.params.items()
        }

    @staticmethod
    def _norms_from_sq(sq: dict[str, Tensor], losses: Tensor, logits: Tensor) -> PerSampleNorms:
        sq64 = {k: v.double().clamp_min(0) for k, v in sq.items()}
        flat = torch.stack(list(sq64.values())).sum(0).sqrt()
        return PerSampleNorms(
            flat=flat, layers={k: v.sqrt() for k, v in sq64.items()}, loss=losses, logits=logits
        )

    # ---------------------------------------------------------------- hooks route
    def _capture(self, x: Tensor, y: Tensor):
        """One forward + activation-gradient backward; returns ({handler: unit}, losses, logits)."""
        n = x.shape[0]
        cap = Capture(self._handlers)
        with cap, torch.enable_grad(), exact_fast_pooling(self.model):
            logits = self.model(x)
            losses = F.cross_entropy(logits, y, reduction="none")
        cap.backward(losses.sum())
        units = {}
        for h in self._handlers:
            calls = cap.calls(h, n)
            if calls:
                units[h] = h.unit(calls)
        return units, losses.detach(), logits.detach()

    def _plan_units(self, x: Tensor) -> None:
        """The probe, then the mixed route: every parameter no registered handler covers goes to a ``FunctionalHandler`` on
        the nearest module (itself or an ancestor) that the forward calls, with the batch dimensions the
        probe measured. A registered handler whose module is never called gives its parameters up too (they
        are used elsewhere, e.g. ``nn.MultiheadAttention.out_proj``)."""
        calls = probe_calls(self.model, x)
        place_batch(self._handlers, calls)
        if self.strategy != "mixed":
            return
        dead = [h for h in self._handlers if h.module not in calls]
        self._handlers = [h for h in self._handlers if h.module in calls]
        wanted = set(self._uncovered) | {full for h in dead for full in h.pnames.values()}
        groups: dict[str, dict[str, str]] = {}
        for name in self.names:
            if name not in wanted:
                continue
            path = name.rpartition(".")[0]
            while path and self.model.get_submodule(path) not in calls:
                path = path.rpartition(".")[0]
            groups.setdefault(path, {})[name[len(path) + 1 :] if path else name] = name
        if "" in groups:  # a parameter of the root: its torch.func unit is the whole model, so be that once
            raise HooksFailed(f"parameter {next(iter(groups['']))!r} belongs to the root module", planned=True)
        for path, pnames in groups.items():
            module = self.model.get_submodule(path)
            dims = calls.get(module)
            if not isinstance(dims, list):
                raise HooksFailed(f"module {path or 'root'} ({type(module).__name__}) {dims or 'is never called'}")
            self._handlers.append(FunctionalHandler(module, pnames, dims=dims))
        self._uncovered = []

    def _hooks_sq_norms(self, units, masks, n) -> dict[str, Tensor]:
        sq = {}
        for h in self._handlers:
            if h in units:
                local_masks = {k: masks[full] for k, full in h.pnames.items() if full in masks}
                for k, v in h.sq_norms(units[h], local_masks).items():
                    sq[h.pnames[k]] = v
        ref = self._ref
        return {k: sq.get(k, torch.zeros(n, dtype=ref.dtype, device=ref.device)) for k in self.names}

    def _hooks_weighted(self, units, w: dict[str, Tensor], acc: dict[str, Tensor]) -> None:
        for h, u in units.items():
            lw = {k: w[full] for k, full in h.pnames.items()}
            for k, v in h.weighted(u, lw).items():
                acc[h.pnames[k]].add_(v)

    def _hooks_per_sample(self, units, n) -> dict[str, Tensor]:
        out = {}
        for h, u in units.items():
            for k, v in h.per_sample(u).items():
                out[h.pnames[k]] = v
        return {k: out[k] if k in out else self._ref.new_zeros(n, *self.params[k].shape) for k in self.names}

    def _user_handlers(self) -> bool:
        return any(type(h).__module__ != __name__ for h in self._handlers)

    def _verify(self, x: Tensor, y: Tensor) -> None:
        """Once: check the hooks route's summed gradient against autograd's (catches parameters used outside
        their module's forward, batch not on dim 0, ...). Falls back to functorch under strategy='auto'."""
        if self._verified or x.shape[0] < 1:
            return
        x, y = x[:8], y[:8]
        devices = [x.device] if x.device.type == "cuda" else []
        try:
            self._plan_units(x)
            with torch.random.fork_rng(devices=devices):
                units, _, _ = self._capture(x, y)
                acc = self._zeros()
                self._hooks_weighted(
                    units,
                    dict.fromkeys(self.names, torch.ones(x.shape[0], dtype=self._ref.dtype, device=x.device)),
                    acc,
                )
            with torch.random.fork_rng(devices=devices), torch.enable_grad():
                total = F.cross_entropy(self.model(x), y, reduction="sum")
                ref = torch.autograd.grad(total, list(self.params.values()), allow_unused=True)
            ok, quiet = True, False
            for (k, a), r in zip(acc.items(), ref, strict=True):
                r = torch.zeros_like(a) if r is None else r
                tol = (
                    1e-4 * float(r.abs().max()) + 1e-6
                    if r.dtype != torch.float64
                    else 1e-9 * float(r.abs().max()) + 1e-12
                )
                if float((a - r).abs().max()) > tol * 10:
                    ok, why = False, f"parameter {k!r} is used outside its module's forward"
                    break
        except HooksFailed as e:
            ok, why, quiet = False, str(e), e.planned
        if not ok:
            if self.requested == "hooks":
                raise ModelError(f"strategy='hooks' is not exact for this model ({why}); use strategy='auto'")
            if self._user_handlers():
                why += "; check the registered handlers"
            if not quiet:
                warnings.warn(f"per-sample gradients: {why}; using torch.func on the whole model", stacklevel=3)
            self.strategy = "functorch"
        self._verified = True

    # ---------------------------------------------------------------- functorch route
    def _func_grads(self, x: Tensor, y: Tensor) -> tuple[dict[str, Tensor], Tensor, Tensor]:
        return functorch_grads(self.model, self.names, x, y)

    # ---------------------------------------------------------------- public API
    def norms(self, x: Tensor, y: Tensor, *, masks: Masks = None) -> PerSampleNorms:
        """Per-sample gradient norms, flat and per layer (float64), with per-sample losses and logits."""
        x, y = self._prepare(x, y)
        if x.shape[0] == 0:
            return self._empty_norms()
        m = self._masks(masks)
        self._verify(x, y)
        parts = []
        for xc, yc in self._chunks(x, y):
            if self.strategy != "functorch":
                units, losses, logits = self._capture(xc, yc)
                sq = self._hooks_sq_norms(units, m, xc.shape[0])
            else:
                g, losses, logits = self._func_grads(xc, yc)
                sq = {k: _sq(g[k], m.get(k)) for k in self.names}
            parts.append(self._norms_from_sq(sq, losses, logits))
        return parts[0] if len(parts) == 1 else PerSampleNorms.cat(parts)

    def grads(self, x: Tensor, y: Tensor, *, masks: Masks = None) -> dict[str, Tensor]:
        """Materialised per-sample gradients ``{name: (n, *shape)}`` (masked), chunked by ``microbatch``."""
        x, y = self._prepare(x, y)
        m = self._masks(masks)
        if x.shape[0] == 0:
            return {k: p.new_zeros(0, *p.shape).detach() for k, p in self.params.items()}
        self._verify(x, y)
        parts = []
        for xc, yc in self._chunks(x, y):
            if self.strategy != "functorch":
                units, _, _ = self._capture(xc, yc)
                g = self._hooks_per_sample(units, xc.shape[0])
            else:
                g, _, _ = self._func_grads(xc, yc)
            parts.append({k: (g[k] * m[k] if k in m else g[k]).detach() for k in self.names})
        if len(parts) == 1:
            return parts[0]
        return {k: torch.cat([p[k] for p in parts]) for k in self.names}

    def weighted_sum(
        self, x: Tensor, y: Tensor, weights: Weights, *, masks: Masks = None
    ) -> dict[str, Tensor]:
        """``sum_i w_i g_i`` per layer; ``weights`` is (n,) or ``{name: (n,)}`` (layerwise clipping)."""
        x, y = self._prepare(x, y)
        n = x.shape[0]
        w = self._layer_weights(weights, n)
        m = self._masks(masks)
        acc = self._zeros()
        if n == 0:
            return acc
        self._verify(x, y)
        shared = not isinstance(weights, dict)
        idx = torch.arange(n, device=x.device)
        for xc, yc, ic in self._chunks(x, y, idx):
            wc = {k: v[ic] for k, v in w.items()}
            self._accumulate(xc, yc, wc, shared, acc)
        return {k: v * m[k] if k in m else v for k, v in acc.items()}

    def _accumulate(self, x, y, w: dict[str, Tensor], shared: bool, acc: dict[str, Tensor]) -> None:
        if self.strategy != "functorch":
            units, _, _ = self._capture(x, y)
            self._hooks_weighted(units, w, acc)
        elif shared:
            with torch.enable_grad():
                losses = F.cross_entropy(self.model(x), y, reduction="none")
                g = torch.autograd.grad(
                    (losses * w[self.names[0]]).sum(), list(self.params.values()), allow_unused=True
                )
            for k, gk in zip(self.names, g, strict=True):
                if gk is not None:
                    acc[k].add_(gk)
        else:
            g, _, _ = self._func_grads(x, y)
            for k in self.names:
                acc[k].add_(torch.einsum("n,n...->...", w[k], g[k]))

    def clipped_sum(
        self,
        x: Tensor,
        y: Tensor,
        factor_fn: Callable[[PerSampleNorms], Weights],
        *,
        masks: Masks = None,
    ) -> tuple[dict[str, Tensor], PerSampleNorms]:
        """Norms, then ``sum_i c_i g_i`` with ``c = factor_fn(norms)`` ((n,) or ``{name: (n,)}``), masked.

        Hooks route: one forward and one activation backward; the sum re-uses the kept activations and
        output gradients (book-keeping, Bu et al. 2023). ``factor_fn`` is called once per ``microbatch``
        chunk with that chunk's norms, so it must act sample by sample (every clipping function does).
        """
        x, y = self._prepare(x, y)
        n = x.shape[0]
        m = self._masks(masks)
        acc = self._zeros()
        if n == 0:
            return acc, self._empty_norms()
        self._verify(x, y)
        parts = []
        for xc, yc in self._chunks(x, y):
            nc = xc.shape[0]
            if self.strategy != "functorch":
                units, losses, logits = self._capture(xc, yc)
                norms = self._norms_from_sq(self._hooks_sq_norms(units, m, nc), losses, logits)
                factors = factor_fn(norms)
                self._hooks_weighted(units, self._layer_weights(factors, nc), acc)
            else:
                g, losses, logits = self._func_grads(xc, yc)
                g = {k: g[k] * m[k] if k in m else g[k] for k in self.names}
                sq = {k: _sq(g[k], None) for k in self.names}
                norms = self._norms_from_sq(sq, losses, logits)
                w = self._layer_weights(factor_fn(norms), nc)
                for k in self.names:
                    acc[k].add_(torch.einsum("n,n...->...", w[k], g[k]))
            parts.append(norms)
        sums = {k: v * m[k] if k in m else v for k, v in acc.items()}
        return sums, parts[0] if len(parts) == 1 else PerSampleNorms.cat(parts)

    def mean_grad(self, x: Tensor, y: Tensor, *, masks: Masks = None) -> dict[str, Tensor]:
        """``(1/n) sum_i g_i`` (zeros for an empty batch): plain batched backward, chunked."""
        x, y = self._prepare(x, y)
        n = x.shape[0]
        acc = self._zeros()
        m = self._masks(masks)
        for xc, yc in self._chunks(x, y):
            with torch.enable_grad():
                total = F.cross_entropy(self.model(xc), yc, reduction="sum")
                g = torch.autograd.grad(total, list(self.params.values()), allow_unused=True)
            for k, gk in zip(self.names, g, strict=True):
                if gk is not None:
                    acc[k].add_(gk)
        return {k: (v * m[k] if k in m else v) / max(n, 1) for k, v in acc.items()}

    def projections(self, x: Tensor, y: Tensor, directions: Tensor | list[dict[str, Tensor]]) -> Tensor:
        """``P[i, j] = <g_i, v_j>`` as forward-mode derivatives d/dt l_i(theta + t v_j) (no per-sample gradients;
        a model with a kernel that has no forward-mode rule, such as PyTorch's fused inference-mode transformer
        layer, gets them from per-sample gradients instead, chunk by chunk).

        ``directions`` is (k, d) in ``named_parameters`` order over trainable parameters, or a list of
        ``{name: tensor}``. Masks are not applied here: mask the directions instead."""
        x, y = self._prepare(x, y)
        dirs = self._directions(directions)
        n, k = x.shape[0], len(dirs)
        ref = self._ref
        out = torch.zeros(n, k, dtype=ref.dtype, device=ref.device)
        if n == 0 or k == 0:
            return out
        params = {name: p.detach() for name, p in self.params.items()}
        model = self.model
        idx = torch.arange(n, device=x.device)
        for xc, yc, ic in self._chunks(x, y, idx):

            def losses(p, xc=xc, yc=yc):
                return F.cross_entropy(functional_call(model, p, (xc,)), yc, reduction="none")

            if self._forward_ad:
                try:
                    with torch.no_grad():
                        for j, v in enumerate(dirs):
                            _, dl = jvp(losses, (params,), (v,))
                            out[ic, j] = dl
                    continue
                except NotImplementedError:  # a fused kernel without forward AD (inference-mode attention)
                    self._forward_ad = False
            g = self.grads(xc, yc)
            for j, v in enumerate(dirs):
                out[ic, j] = sum((g[name].flatten(1) @ v[name].reshape(-1)) for name in self.names)
        return out

    def _directions(self, directions) -> list[dict[str, Tensor]]:
        ref = self._ref
        if isinstance(directions, Tensor):
            d = sum(p.numel() for p in self.params.values())
            v = directions.to(device=ref.device, dtype=ref.dtype)
            if v.dim() == 1:
                v = v.unsqueeze(0)
            if v.dim() != 2 or v.shape[1] != d:
                raise UsageError(
                    f"directions must be (k, {d}) for this model's trainable parameters, got {tuple(v.shape)}"
                )
            out = []
            for row in v:
                parts, s = {}, 0
                for name, p in self.params.items():
                    parts[name] = row[s : s + p.numel()].reshape(p.shape)
                    s += p.numel()
                out.append(parts)
            return out
        out = []
        for dv in directions:
            missing = [name for name in self.names if name not in dv]
            if missing:
                raise UsageError(f"direction lacks parameter {missing[0]!r}")
            out.append({name: dv[name].to(device=ref.device, dtype=ref.dtype) for name in self.names})
        return out


class HooksFailed(Exception):
    """Internal: the hooks route cannot be used for this model. ``planned``: not a failure but the cheaper
    choice (a parameter of the root module: its torch.func unit would be the whole model anyway)."""

    def __init__(self, message: str, planned: bool = False):
        super().__init__(message)
        self.planned = planned
