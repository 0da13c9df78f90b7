"""Per-sample gradient handlers: the protocol, its open registry (``register_handler``, as Opacus'
``register_grad_sampler``) and the built-in layers. Modules without a handler go to
:mod:`landscape.persample.functional`."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from landscape.errors import UsageError

# A convolution's (or a Linear's on sequences) norm is a ghost norm when T (D + P) < GHOST_RATIO * P D. The ghost route also needs one
# weight-gradient kernel for the weighted sum, while materialised gradients make that sum nearly free, so
# it pays only when the Gram matrices are clearly smaller (measured on CPU: ResNet-18 layer3/4 yes,
# layer2 and opacus-cnn's conv2 no).
GHOST_RATIO = 0.5
# Materialised per-sample convolution gradients: with T >= this many output positions one grouped
# weight-gradient kernel (the batch folded into the groups); below, with one input channel per group, one
# grouped convolution of the inputs with the output gradients as kernels, else channels-last unfolded patches
# and a batched matmul (on CPU inside a DP step, faster than the grouped kernel for opacus-cnn's conv2).
GROUPED_MIN_POSITIONS = 256
# Widening sums over positions (float32 gradients summed in float64) go block by block of this many elements.
SUM_BLOCK = 1 << 19


class HooksFailed(Exception):
    """Internal: the hooks route cannot be used for this model. ``planned``: not a failure but the cheaper
    choice (a parameter of the root module: its torch.func unit would be the whole model anyway)."""

    def __init__(self, message: str, planned: bool = False):
        super().__init__(message)
        self.planned = planned


class Handler:
    """Per-sample gradient algebra for one module type (the protocol: docs/persample.md). Built per module with
    ``pnames`` (role -> ``named_parameters`` name); ``unit(calls)`` gets every call's ``(input, output
    gradient)``; a subclass implements ``per_sample_grads(u) -> {role: (n, *shape)}`` and may override
    ``sq_norms`` / ``weighted`` (without materialising) and ``ghost_factors`` / ``grad_factor`` (Gram blocks).
    ``roles``: the parameters it computes (None: all); ``reduce_dtype``: that of sums over positions."""

    roles: tuple[str, ...] | None = ("weight", "bias")

    def __init__(self, module: nn.Module, pnames: dict[str, str], reduce_dtype: torch.dtype | None = None):
        self.module = module
        self.pnames = pnames
        self.reduce_dtype = reduce_dtype
        self.batch_dim = 0  # where the module sees the batch, as the probe found it (``place_batch``)

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
        ``SUM_BLOCK`` elements: the same numbers, without a float64 copy of a whole activation batch at once
        (timings: docs/benchmarks.md)."""
        dt = self.reduce_dtype
        if dt is None or dt == t.dtype or t.numel() <= SUM_BLOCK:
            return t.sum(dim, dtype=dt)
        step = max(1, SUM_BLOCK // max(1, t[0].numel()))
        return torch.cat([t[i : i + step].sum(dim, dtype=dt) for i in range(0, t.shape[0], step)])


# module type -> handler class: the open registry (exact types; see ``register_handler``)
_HANDLERS: dict[type, type[Handler]] = {}


def register_handler(*module_types: type, replace: bool = False) -> Callable[[type[Handler]], type[Handler]]:
    """Class decorator registering a ``Handler`` for modules of exactly these types (not subclasses,
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


def _dense(g: Tensor) -> tuple[Tensor, list[int]]:
    """``g`` (n, ...) with the dimensions after the batch in decreasing-stride order, and that order: a
    contiguous tensor when ``g`` is a permuted view of one (the per-sample convolution gradients formed from
    channels-last patches), so that norms and sums over samples need no copy. A contiguous ``g`` is unchanged."""
    order = sorted(range(1, g.dim()), key=lambda d: -g.stride(d))
    return g.permute(0, *order), order


def _sq(g: Tensor, mask: Tensor | None) -> Tensor:
    if mask is not None:
        g = g * mask
    g = _dense(g)[0]
    return torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1).square()


def ghost_sq(a: Tensor, b: Tensor) -> Tensor:
    """Ghost norm ||B_i A_i^T||^2 = sum_{g,t,s} (A_i^T A_i)_{g,ts} (B_i^T B_i)_{g,ts} per sample, from
    ``ghost_factors`` (Li et al. 2021, eq. 4; Bu et al. 2023): no per-sample gradient is formed."""
    return ((a.transpose(2, 3) @ a) * (b.transpose(2, 3) @ b)).sum((1, 2, 3))


def _acc(total: Tensor | None, term: Tensor) -> Tensor:
    return term if total is None else total + term


def _wsum(w: Tensor, g: Tensor) -> Tensor:
    """``sum_i w_i g_i`` by one matrix-vector product over the samples (in ``g``'s memory order, see ``_dense``)."""
    raw, order = _dense(g)
    out = (w @ raw.reshape(raw.shape[0], -1)).reshape(raw.shape[1:])
    return out.permute(*[order.index(d) for d in range(1, g.dim())]).contiguous()


class _WeightBiasHandler(Handler):
    """A module whose unit holds the per-sample bias gradients (``"gb"``); subclasses do the weight's
    (``_weight_per_sample``, ``_weight_sq``, ``_weight_weighted``)."""

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
    """Conv1d / Conv2d (any stride, padding, padding mode, dilation, groups): per-sample weight gradients by one
    weight-gradient kernel with the batch folded into the groups (many output positions) or from patches; when
    ``T (D + P) < GHOST_RATIO P D`` the ghost norm, and the weighted sum as one ordinary weight-gradient kernel."""

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
                elif m.weight.shape[1] == 1:
                    g = _acc(g, self._correlated_per_sample(x, pad, b))
                else:
                    g = _acc(g, self._unfolded_per_sample(x, pad, b, layout=u.get("layout")))
            u["gw"] = g
        return u["gw"]

    def _correlated_per_sample(self, x: Tensor, pad: list[int], b: Tensor) -> Tensor:
        """Per-sample weight gradients of one call of a convolution with one input channel per group (a first
        layer on one-channel images, a depthwise convolution): one grouped convolution of the inputs with the
        output gradients as kernels (Rochette et al. 2019; the module's stride becomes the dilation, its
        dilation the stride), groups = samples x groups, no unfolded copy of the input."""
        m = self.module
        n, c = x.shape[:2]
        _, stride, dilation = self._geometry()
        conv, nd = (F.conv1d, 1) if isinstance(m, nn.Conv1d) else (F.conv2d, 2)
        stride, dilation = list(stride[-nd:]), list(dilation[-nd:])
        kernel = b.reshape(n * b.shape[1], 1, *b.shape[2:])
        g = conv(x.reshape(1, n * c, *x.shape[2:]), kernel, None, dilation, pad, stride, n * c)
        g = g[(..., *[slice(0, k) for k in m.kernel_size])]
        return g.reshape(n, *m.weight.shape)

    def _unfolded_per_sample(self, x: Tensor, pad: list[int], b: Tensor, layout: str | None = None) -> Tensor:
        """Per-sample weight gradients of one call from channels-last patches: a permuted view in the weight's
        shape, read by ``_sq`` and ``_wsum`` without a copy. With ``layout="weight"`` and more output channels than
        positions, the smaller operand (the patches) is reordered first so the product comes out contiguous."""
        m = self.module
        a, bb = self._patches_last(x, pad, b)
        k = (1, *m.kernel_size) if isinstance(m, nn.Conv1d) else m.kernel_size
        if layout == "weight" and bb.shape[2] > a.shape[2]:
            a = a.reshape(*a.shape[:3], math.prod(k), -1).transpose(-1, -2).reshape(a.shape)
            return (bb @ a).reshape(x.shape[0], *m.weight.shape)
        g = (bb @ a).reshape(*bb.shape[:3], *k, -1).permute(0, 1, 2, 5, 3, 4)
        return g.reshape(x.shape[0], *m.weight.shape)

    def _patches_last(self, x: Tensor, pad: list[int], b: Tensor) -> tuple[Tensor, Tensor]:
        """Unfolded input patches (n, G, T, k_h k_w C_in/G), copied from a channels-last input so the copy runs
        over contiguous channels (several times faster on CPU than ``_patches``' (n, G, D, T), and their
        products need no transposed operand), and output gradients (n, G, P, T) of one call."""
        m = self.module
        n, groups = x.shape[0], m.groups
        if isinstance(m, nn.Conv1d):
            x, b, pad = x.unsqueeze(2), b.unsqueeze(2), [0, *pad]
        (kh, kw), (sh, sw), (dh, dw) = self._geometry()
        ho, wo = b.shape[-2:]
        c, h, w = x.shape[1:]
        if any(pad):
            shape = (n, c, h + 2 * pad[0], w + 2 * pad[1])
            xp = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last).zero_()
            xp[:, :, pad[0] : pad[0] + h, pad[1] : pad[1] + w] = x
        else:
            xp = x.contiguous(memory_format=torch.channels_last)
        cg = c // groups
        sn, sc, sy, sx = xp.stride()
        view = xp.as_strided(
            (n, groups, ho, wo, kh, kw, cg), (sn, cg * sc, sy * sh, sx * sw, sy * dh, sx * dw, sc), xp.storage_offset()
        )
        return view.reshape(n, groups, ho * wo, kh * kw * cg), self.grad_factor(b)

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

    def ghost_factors(self, u):
        """Unfolded patches and output gradients of a module called once (several calls: None)."""
        return self._patches(*u["calls"][0]) if len(u["calls"]) == 1 else None

    def _weight_sq(self, u, mask):
        if mask is None and len(u["calls"]) == 1 and "gw" not in u:
            m = self.module
            t, d, p = u["calls"][0][2][0, 0].numel(), m.weight[0].numel(), m.weight.shape[0] // m.groups
            if t * (d + p) < GHOST_RATIO * p * d:  # the channels-last patches: the same Gram, a faster copy
                a, b = self._patches_last(*u["calls"][0])
                return ghost_sq(a.transpose(2, 3), b)
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
