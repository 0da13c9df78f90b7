"""Parameters as flat vectors and back (:class:`ParamSpace`: which named tensors, in which order, make a point);
interpolation, distance and compatibility of two models; a state dict seen through training's wrappers
(:func:`plain_names`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from landscape.errors import IncompatibleError

PARAMETER = "parameter"
BUFFER = "buffer"

StateLike = nn.Module | Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor of a parameter space."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str  # PARAMETER | BUFFER

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class ParamSpace:
    """Names, shapes, dtypes and kinds of the tensors that form a flat parameter vector, in order."""

    def __init__(self, entries: Sequence[TensorSpec]):
        self.entries: tuple[TensorSpec, ...] = tuple(entries)
        names = [e.name for e in self.entries]
        if len(set(names)) != len(names):
            raise ValueError("duplicate tensor names in a ParamSpace")
        self.offsets: tuple[int, ...] = tuple(itertools.accumulate(e.numel for e in self.entries))
        self.dim: int = self.offsets[-1] if self.entries else 0

    # construction -------------------------------------------------------------------------------------
    @classmethod
    def from_model(cls, model: nn.Module, *, buffers: bool = False) -> ParamSpace:
        """All parameters of ``model`` (trainable or not); with ``buffers`` also its floating buffers."""
        entries = [TensorSpec(n, tuple(p.shape), p.dtype, PARAMETER) for n, p in model.named_parameters()]
        if buffers:
            entries += [
                TensorSpec(n, tuple(b.shape), b.dtype, BUFFER)
                for n, b in model.named_buffers()
                if b.is_floating_point()
            ]
        return cls(entries)

    @classmethod
    def from_state_dict(cls, state: Mapping[str, torch.Tensor]) -> ParamSpace:
        """The floating-point entries of a state dict, in its order."""
        return cls([TensorSpec(n, tuple(t.shape), t.dtype, PARAMETER)
                    for n, t in state.items() if t.is_floating_point()])

    # views ----------------------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [e.shape for e in self.entries]

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the flat vector: the promotion of all entry dtypes (float32 if empty)."""
        dtypes = [e.dtype for e in self.entries]
        return functools.reduce(torch.promote_types, dtypes) if dtypes else torch.float32

    def parameter_names(self) -> list[str]:
        return [e.name for e in self.entries if e.kind == PARAMETER]

    def buffer_names(self) -> list[str]:
        return [e.name for e in self.entries if e.kind == BUFFER]

    def __len__(self) -> int:
        return len(self.entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ParamSpace) and self.entries == other.entries

    def __hash__(self) -> int:
        return hash(self.entries)

    def __repr__(self) -> str:
        return f"ParamSpace({len(self.entries)} tensors, dim={self.dim})"

    # conversion -----------------------------------------------------------------------------------------
    def flatten(self, state: StateLike) -> torch.Tensor:
        """One flat vector (on the tensors' device) from a model or a state dict holding every entry."""
        tensors = _tensors_of(state)
        missing = [e.name for e in self.entries if e.name not in tensors]
        if missing:
            raise IncompatibleError(f"tensor '{missing[0]}' is missing (expected by the parameter space)")
        for e in self.entries:
            got = tuple(tensors[e.name].shape)
            if got != e.shape:
                raise IncompatibleError(f"tensor '{e.name}' has shape {_fmt(got)}, expected {_fmt(e.shape)}")
        if not self.entries:
            return torch.zeros(0, dtype=self.dtype)
        return torch.cat([tensors[e.name].detach().reshape(-1).to(self.dtype) for e in self.entries])

    def unflatten(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """Name -> tensor (views of ``vector`` when no dtype cast is needed)."""
        self._check_dim(vector)
        return {e.name: vector[stop - e.numel:stop].view(e.shape).to(e.dtype)
                for e, stop in zip(self.entries, self.offsets, strict=True)}

    def unflatten_batch(self, vectors: torch.Tensor) -> dict[str, torch.Tensor]:
        """(P, d) -> name -> (P, *shape) views, dtype of ``vectors`` kept (for stacked ``functional_call``)."""
        if vectors.dim() != 2 or vectors.shape[1] != self.dim:
            raise IncompatibleError(f"points have shape {_fmt(tuple(vectors.shape))}, expected (P, {self.dim})")
        return {e.name: vectors[:, stop - e.numel:stop].view(vectors.shape[0], *e.shape)
                for e, stop in zip(self.entries, self.offsets, strict=True)}

    def tensors_of(self, model: nn.Module) -> list[torch.Tensor]:
        """The model's own tensors for every entry, in order (parameters and buffers, not copies)."""
        named = _tensors_of(model)
        missing = [e.name for e in self.entries if e.name not in named]
        if missing:
            raise IncompatibleError(f"tensor '{missing[0]}' of the parameter space is not in the model")
        return [named[e.name] for e in self.entries]

    def assign_(self, model: nn.Module, vector: torch.Tensor) -> None:
        """Write ``vector`` into ``model``'s tensors in place (no new tensors, no autograd history)."""
        targets = self.tensors_of(model)
        self._check_dim(vector)
        sources = [vector[o - e.numel : o].view(e.shape) for e, o in zip(self.entries, self.offsets, strict=True)]
        with torch.no_grad():
            torch._foreach_copy_(targets, sources)

    def _check_dim(self, vector: torch.Tensor) -> None:
        if vector.dim() != 1 or vector.numel() != self.dim:
            raise IncompatibleError(
                f"parameter vector has shape {_fmt(tuple(vector.shape))}, expected ({self.dim},)"
            )


def flatten(state: StateLike | Sequence[torch.Tensor], space: ParamSpace | None = None) -> torch.Tensor:
    """Flat vector of a model's parameters, a state dict's floating entries (or ``space``'s), or a list of
    tensors."""
    if space is not None:
        return space.flatten(state)
    if isinstance(state, nn.Module):
        return ParamSpace.from_model(state).flatten(state)
    if isinstance(state, Mapping):
        return ParamSpace.from_state_dict(state).flatten(state)
    tensors = list(state)
    if not tensors:
        return torch.zeros(0)
    dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors])
    return torch.cat([t.detach().reshape(-1).to(dtype) for t in tensors])


def unflatten(vector: torch.Tensor, space: ParamSpace) -> dict[str, torch.Tensor]:
    """Name -> tensor in each entry's shape and dtype."""
    return space.unflatten(vector)


def lerp_tensor(a: torch.Tensor, b: torch.Tensor, alpha: float) -> torch.Tensor:
    """:func:`torch.lerp`, but exactly ``a`` at ``alpha=0`` and ``b`` at ``alpha=1``: ``a + alpha (b - a)`` is
    NaN at 0 when ``b`` holds NaN/inf (a diverged checkpoint), and a path's ends must be the checkpoints."""
    if alpha == 0:
        return a.clone()
    if alpha == 1:
        return b.to(a.dtype, copy=True)
    return torch.lerp(a, b.to(a.dtype), alpha)


def lerp(a, b, alpha: float):
    """``(1 - alpha) a + alpha b`` for flat tensors or compatible state dicts (Watson et al. Sec. 2.2), exact
    at both ends; a state dict's non-floating entries come from ``a``."""
    alpha = float(alpha)
    if isinstance(a, Mapping):
        check_compatible(a, b)
        return {k: (lerp_tensor(v, b[k], alpha) if v.is_floating_point() else v.clone()) for k, v in a.items()}
    return lerp_tensor(a, b, alpha)


def distance(a, b) -> float:
    """``||a - b||_2`` of two flat vectors or compatible state dicts (floating entries), in float64."""
    if isinstance(a, Mapping):
        check_compatible(a, b)
        total = 0.0
        for k, v in a.items():
            if v.is_floating_point():
                total += float(torch.sum((v.double() - b[k].double()) ** 2))
        return math.sqrt(total)
    return float(torch.linalg.vector_norm(a.double() - b.double()))


@dataclass(frozen=True)
class Mismatch:
    """The first difference of two sets of named tensors: ``kind`` ``only_a``, ``only_b``, ``shape`` or
    ``dtype`` (:func:`dtype_kind`); ``a`` and ``b`` the two shapes or dtypes."""

    kind: str
    name: str
    a: object = None
    b: object = None


def first_mismatch(a, b, *, dtypes: bool = False) -> Mismatch | None:
    """The one compatibility check of two models, state dicts or mappings name -> shape: the first tensor in
    one only, of another shape or (``dtypes``) kind of dtype, in ``a``'s order, or None."""
    ta, tb = _specs_of(a), _specs_of(b)
    for name, (shape, dtype) in ta.items():
        if name not in tb:
            return Mismatch("only_a", name)
        other_shape, other_dtype = tb[name]
        if other_shape != shape:
            return Mismatch("shape", name, shape, other_shape)
        if dtypes and dtype is not None and other_dtype is not None and dtype_kind(dtype) != dtype_kind(other_dtype):
            return Mismatch("dtype", name, dtype, other_dtype)
    for name in tb:
        if name not in ta:
            return Mismatch("only_b", name)
    return None


def check_compatible(a, b, *, names: tuple[str, str] = ("A", "B")) -> None:
    """Raise :class:`IncompatibleError` naming the first tensor where ``a`` and ``b`` differ."""
    m = first_mismatch(a, b)
    if m is None:
        return
    na, nb = names
    if m.kind == "only_a":
        raise IncompatibleError(f"incompatible models: tensor '{m.name}' is in {na} but not in {nb}")
    if m.kind == "only_b":
        raise IncompatibleError(f"incompatible models: tensor '{m.name}' is in {nb} but not in {na}")
    raise IncompatibleError(f"incompatible models: tensor '{m.name}' has shape {_fmt(m.a)} in {na} but {_fmt(m.b)} in {nb}")


def dtype_kind(dtype: torch.dtype) -> str:
    """``boolean``, ``complex``, ``floating point`` or ``integer``: what ``load_state_dict`` does not convert
    between without changing values."""
    if dtype == torch.bool:
        return "boolean"
    if dtype.is_complex:
        return "complex"
    return "floating point" if dtype.is_floating_point else "integer"


# The wrappers a training loop puts around a model, by class (and the top package that defines it): the attribute
# that holds the wrapped module, which their state dicts put before each name (``_orig_mod.0.weight``).
WRAPPERS = {("torch", "OptimizedModule"): "_orig_mod",  # torch.compile
            ("torch", "DataParallel"): "module", ("torch", "DistributedDataParallel"): "module",
            ("opacus", "AbstractGradSampleModule"): "_module",  # every GradSampleModule mode
            ("opacus", "DifferentiallyPrivateDistributedDataParallel"): "module"}
WRAPPER_PREFIXES = tuple(f"{attr}." for attr in dict.fromkeys(WRAPPERS.values()))  # of a state dict saved wrapped


def wrapped(module: nn.Module) -> str | None:
    """The attribute of ``module`` that holds the module it wraps (:data:`WRAPPERS`), or None: not a wrapper."""
    for cls in type(module).__mro__:
        attr = WRAPPERS.get((cls.__module__.partition(".")[0], cls.__name__))
        if attr is not None and isinstance(module._modules.get(attr), nn.Module):
            return attr
    return None


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside the wrappers around ``model`` (nested in any order)."""
    while (attr := wrapped(model)) is not None:
        model = model._modules[attr]
    return model


def plain_names(model: nn.Module) -> dict[str, str]:
    """``{name in model.state_dict(): the name without wrappers}``, wrappers at any depth looked through."""
    skip = {f"{name}.{attr}" if name else attr for name, module in model.named_modules(remove_duplicate=False)
            if (attr := wrapped(module)) is not None}
    names = {}
    for key in model.state_dict(keep_vars=True):
        parts, path = [], ""
        for part in key.split("."):
            path = f"{path}.{part}" if path else part
            if path not in skip:
                parts.append(part)
        names[key] = ".".join(parts)
    return names


def _specs_of(x) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
    """name -> (shape, dtype or None) of a model, state dict or mapping name -> shape."""
    if isinstance(x, nn.Module):
        x = x.state_dict()
    out = {}
    for k, v in x.items():
        if isinstance(v, torch.Tensor) or hasattr(v, "dtype") and hasattr(v, "shape"):
            out[k] = (tuple(v.shape), v.dtype if isinstance(v.dtype, torch.dtype) else None)
        else:
            out[k] = (tuple(v), None)
    return out


def _tensors_of(state: StateLike) -> dict[str, torch.Tensor]:
    if isinstance(state, nn.Module):
        named = dict(state.named_parameters())
        named.update(dict(state.named_buffers()))
        return named
    return dict(state)


def _fmt(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"
