"""Permutations of hidden units: the permutation-structure protocol (which tensor axes each permutation
moves), checks that a spec keeps the function, and applying permutations to state dicts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from landscape.curvature import eval_mode
from landscape.errors import IncompatibleError, ModelError, UsageError


@dataclass(frozen=True)
class Axis:
    """One tensor axis a permutation moves: ``inner`` consecutive positions per unit (``H*W`` per channel
    after ``Flatten``); ``match``: whether it votes in weight matching (running statistics move but do not
    vote)."""

    key: str
    axis: int
    inner: int = 1
    match: bool = True


@dataclass(frozen=True)
class Permutation:
    """A group of axes permuted together; ``groups`` contiguous blocks of ``size // groups`` units must map
    onto whole blocks (GroupNorm's groups; 1 = any permutation)."""

    name: str
    size: int
    axes: tuple[Axis, ...]
    groups: int = 1

    @property
    def group_size(self) -> int:
        return self.size // self.groups


@dataclass(frozen=True)
class PermutationSpec:
    """Which axes of which tensors each permutation of a model moves (Git Re-Basin's ``PermutationSpec``)."""

    model: str
    perms: tuple[Permutation, ...]
    by_key: dict[str, tuple[tuple[str, Axis], ...]] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        by_key: dict[str, list[tuple[str, Axis]]] = {}
        for p in self.perms:
            if p.size < 1 or p.groups < 1 or p.size % p.groups:
                raise ModelError(f"permutation {p.name!r}: {p.size} units do not split into {p.groups} groups")
            for ax in p.axes:
                by_key.setdefault(ax.key, []).append((p.name, ax))
        for key, entries in by_key.items():
            axes = [ax.axis for _, ax in entries]
            if len(set(axes)) != len(axes):
                raise ModelError(f"tensor {key!r} has one axis in two permutations")
        object.__setattr__(self, "by_key", {k: tuple(v) for k, v in by_key.items()})

    def perm(self, name: str) -> Permutation:
        for p in self.perms:
            if p.name == name:
                return p
        raise UsageError(f"no permutation {name!r} in the spec of {self.model}")


class SpecBuilder:
    """Collects axes per permutation while a spec builder walks a model (``new``, then ``weight_out``,
    ``add``, ``norm`` per tensor; ``spec()`` at the end); checks norm groups agree."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.axes: dict[str, list[Axis]] = {}
        self.sizes: dict[str, int] = {}
        self.groups: dict[str, tuple[int, str]] = {}

    def new(self, name: str, size: int) -> str:
        self.axes[name], self.sizes[name] = [], int(size)
        return name

    def add(self, perm: str, key: str, axis: int, *, inner: int = 1, match: bool = True) -> None:
        self.axes[perm].append(Axis(key, axis, inner, match))

    def weight_out(self, perm: str, prefix: str, module: nn.Module) -> None:
        """Output units of a Linear/Conv: rows of the weight and the bias."""
        self.add(perm, f"{prefix}.weight", 0)
        if getattr(module, "bias", None) is not None:
            self.add(perm, f"{prefix}.bias", 0)

    def norm(self, perm: str, prefix: str, module: nn.Module) -> None:
        """A BatchNorm/GroupNorm on the permuted channels: affine parameters and running statistics move."""
        if isinstance(module, nn.GroupNorm):
            if module.num_channels != self.sizes[perm]:
                raise ModelError(self._refuse(prefix, f"GroupNorm over {module.num_channels} channels sits on "
                                                      f"{self.sizes[perm]}"))
            seen = self.groups.get(perm)
            if seen is not None and seen[0] != module.num_groups:
                raise ModelError(self._refuse(prefix, f"its {module.num_groups} GroupNorm groups disagree with "
                                                      f"{seen[0]} of '{seen[1]}' on the same channels, so no channel "
                                                      "permutation keeps both"))
            self.groups[perm] = (module.num_groups, prefix)
        elif not isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ModelError(self._refuse(prefix, f"{type(module).__name__} is not a norm alignment knows"))
        if module.affine:
            self.add(perm, f"{prefix}.weight", 0)
            self.add(perm, f"{prefix}.bias", 0)
        if getattr(module, "track_running_stats", False):  # BatchNorm's; GroupNorm keeps no statistics
            self.add(perm, f"{prefix}.running_mean", 0, match=False)
            self.add(perm, f"{prefix}.running_var", 0, match=False)

    def _refuse(self, where: str, why: str) -> str:
        return f"cannot align {self.model_name} at '{where}': {why}"

    def spec(self) -> PermutationSpec:
        perms = tuple(Permutation(n, self.sizes[n], tuple(a), self.groups.get(n, (1, ""))[0])
                      for n, a in self.axes.items())
        return PermutationSpec(self.model_name, perms)


_PASS_THROUGH = (nn.ReLU, nn.Tanh, nn.GELU, nn.Sigmoid, nn.ELU, nn.Softplus, nn.Identity, nn.MaxPool2d,
                 nn.AvgPool2d, nn.Dropout)


def chain_spec(model: nn.Module, name: str | None = None) -> PermutationSpec:
    """Feed-forward models whose children run in registration order (mlp, lenet, opacus-cnn, two-layer-linear;
    any such stack of Linear/Conv2d layers, norms, ``Flatten`` and element-wise activations): one permutation
    per hidden layer's units, named after the layer."""
    name = name or type(model).__name__
    b = SpecBuilder(name)
    children = list(model.named_children())
    weighted = [n for n, m in children if isinstance(m, (nn.Linear, nn.Conv2d))]
    if not weighted:
        raise ModelError(f"cannot align {name}: it has no Linear or Conv2d layer")
    current: str | None = None  # the permutation on the features flowing between layers
    flat = False
    for prefix, m in children:
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            if isinstance(m, nn.Conv2d) and m.groups != 1:
                raise ModelError(b._refuse(prefix, f"grouped convolution (groups={m.groups}) mixes channel blocks"))
            if current is not None:
                fan_in = m.in_features if isinstance(m, nn.Linear) else m.in_channels
                if fan_in % b.sizes[current]:
                    raise ModelError(b._refuse(prefix, f"{fan_in} inputs are not whole blocks of "
                                                       f"{b.sizes[current]} units"))
                inner = fan_in // b.sizes[current]
                if inner != 1 and not flat:
                    raise ModelError(b._refuse(prefix, "inputs do not match the previous layer's units"))
                b.add(current, f"{prefix}.weight", 1, inner=inner)
            if prefix == weighted[-1]:
                current = None  # the logits keep their order
            else:
                out = m.out_features if isinstance(m, nn.Linear) else m.out_channels
                current = b.new(prefix, out)
                b.weight_out(current, prefix, m)
            flat = False
        elif isinstance(m, nn.Flatten):
            flat = True
        elif isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm)) and current is not None:
            b.norm(current, prefix, m)
        elif not isinstance(m, _PASS_THROUGH):
            raise ModelError(b._refuse(prefix, f"{type(m).__name__} is not a layer alignment can permute through"))
    return b.spec()


def _resnet_spec(model: nn.Module, name: str) -> PermutationSpec:
    """torchvision ResNet of BasicBlocks: a permutation per stage's residual stream and per block."""
    from torchvision.models.resnet import BasicBlock

    b = SpecBuilder(name)
    if model.conv1.groups != 1:
        raise ModelError(b._refuse("conv1", "grouped convolution"))
    stream = b.new("residual0", model.conv1.out_channels)
    b.weight_out(stream, "conv1", model.conv1)
    b.norm(stream, "bn1", model.bn1)
    for stage in range(1, 5):
        layer = getattr(model, f"layer{stage}")
        for i, block in enumerate(layer):
            prefix = f"layer{stage}.{i}"
            if type(block) is not BasicBlock:
                raise ModelError(b._refuse(prefix, f"{type(block).__name__} is not a BasicBlock"))
            if block.conv1.groups != 1 or block.conv2.groups != 1:
                raise ModelError(b._refuse(prefix, "grouped convolution"))
            inner = b.new(f"{prefix}.inner", block.conv1.out_channels)
            b.add(stream, f"{prefix}.conv1.weight", 1)
            b.weight_out(inner, f"{prefix}.conv1", block.conv1)
            b.norm(inner, f"{prefix}.bn1", block.bn1)
            b.add(inner, f"{prefix}.conv2.weight", 1)
            if block.downsample is not None:
                conv, norm = block.downsample[0], block.downsample[1]
                if len(block.downsample) != 2 or not isinstance(conv, nn.Conv2d) or conv.groups != 1:
                    raise ModelError(b._refuse(f"{prefix}.downsample", "not a conv followed by a norm"))
                b.add(stream, f"{prefix}.downsample.0.weight", 1)
                stream = b.new(f"residual{stage}", conv.out_channels)
                b.weight_out(stream, f"{prefix}.downsample.0", conv)
                b.norm(stream, f"{prefix}.downsample.1", norm)
            elif block.conv2.out_channels != b.sizes[stream]:
                raise ModelError(b._refuse(prefix, "a shape-changing block without downsample"))
            b.weight_out(stream, f"{prefix}.conv2", block.conv2)
            b.norm(stream, f"{prefix}.bn2", block.bn2)
    b.add(stream, "fc.weight", 1)
    return b.spec()


SpecFunction = Callable[[nn.Module, str], PermutationSpec]


#: model-spec name or model class -> builder(model, name); the built-ins are registered below
SPECS: dict[str | type, SpecFunction] = {}
BUILT_IN = ("mlp", "two-layer-linear", "lenet", "opacus-cnn", "resnet18")


def register_spec(key: str | type, builder: SpecFunction) -> None:
    """Say how to permute a model: ``key`` is a ``landscape_spec`` name (``"mlp"``) or an ``nn.Module`` class
    (its subclasses too); ``builder(model, name) -> PermutationSpec``."""
    if not (isinstance(key, str) or (isinstance(key, type) and issubclass(key, nn.Module))):
        raise UsageError(f"register_spec takes a model name or an nn.Module class, got {key!r}")
    SPECS[key] = builder


for _name in ("mlp", "two-layer-linear", "lenet", "opacus-cnn"):
    register_spec(_name, chain_spec)


register_spec("resnet18", _resnet_spec)


def builder_of(model: nn.Module) -> tuple[SpecFunction | None, str]:
    """How :func:`permutation_spec` gets the model's spec: ``(builder, "method" | "registered" |
    "built-in")``, or ``(None, "")`` when nothing describes the model."""
    own = getattr(model, "permutation_spec", None)
    if callable(own):
        return (lambda m, name: own()), "method"
    spec = getattr(model, "landscape_spec", None)
    name = spec.get("name") if isinstance(spec, Mapping) else None
    if isinstance(name, str) and name in SPECS:
        return SPECS[name], "built-in" if name in BUILT_IN else "registered"
    for cls in type(model).__mro__:
        if cls in SPECS:
            return SPECS[cls], "registered"
    return None, ""


def permutation_spec(model: nn.Module | Mapping) -> PermutationSpec:
    """The permutation spec of a model (or of a ``landscape_spec``): its ``permutation_spec()`` method, a
    registered builder, or a one-line ModelError (also for a spec that does not fit the model's tensors)."""
    if isinstance(model, Mapping):
        from landscape.models import model_from_spec

        model = model_from_spec(dict(model))
    recorded = getattr(model, "landscape_spec", None)
    name = recorded.get("name") if isinstance(recorded, Mapping) else None
    name = str(name) if name else type(model).__name__
    builder, how = builder_of(model)
    if builder is None:
        raise ModelError(f"align needs the permutation structure of model {name!r}: give it a permutation_spec() "
                         "method or register_spec() a builder (see landscape.analyze.align); built in: "
                         f"{', '.join(BUILT_IN)}")
    try:
        out = builder(model, name)
    except (ModelError, UsageError):
        raise
    except Exception as exc:
        raise ModelError(f"the permutation spec of {name!r} failed: {type(exc).__name__}: "
                         f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None
    out = _as_spec(out, model, name)
    _check_spec_fits(out, model.state_dict())
    return out


def _as_spec(value: Any, model: nn.Module, name: str) -> PermutationSpec:
    """A PermutationSpec; ``{perm: [(key, axis[, inner]) | Axis, ...]}`` sized from the tensors."""
    if isinstance(value, PermutationSpec):
        return value
    if not isinstance(value, Mapping) or not value:
        raise ModelError(f"the permutation spec of {name!r} is a {type(value).__name__}; return a PermutationSpec or "
                         "{permutation name: [(state-dict key, axis), ...]}")
    state = model.state_dict()
    perms = []
    for perm, axes in value.items():
        items = []
        for item in axes:
            ax = item if isinstance(item, Axis) else Axis(*item) if isinstance(item, (tuple, list)) else None
            if ax is None or not isinstance(ax.key, str) or not isinstance(ax.axis, int):
                raise ModelError(f"the permutation spec of {name!r}: {item!r} in {perm!r} is not (key, axis[, inner])")
            if ax.key not in state:
                raise ModelError(f"permutation {perm!r} names tensor {ax.key!r} that {name} does not have")
            items.append(ax)
        if not items:
            raise ModelError(f"the permutation spec of {name!r}: permutation {perm!r} moves no tensor")
        first = items[0]
        shape = state[first.key].shape
        if first.axis >= len(shape) or shape[first.axis] % first.inner:
            raise ModelError(f"permutation {perm!r}: tensor {first.key!r} of shape {tuple(shape)} has no axis "
                             f"{first.axis} of whole blocks of {first.inner}")
        perms.append(Permutation(str(perm), shape[first.axis] // first.inner, tuple(items)))
    return PermutationSpec(name, tuple(perms))


def verified_spec(model: nn.Module, x: torch.Tensor | None) -> PermutationSpec:
    """:func:`permutation_spec`, checked on ``x`` to keep the function unless it is built in."""
    spec = permutation_spec(model)
    if builder_of(model)[1] != "built-in" and x is not None:
        check_function_kept(model, spec, x)
    return spec


def check_function_kept(model: nn.Module, spec: PermutationSpec, x: torch.Tensor, *, seed: int = 0,
                        rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """ModelError unless a random permutation of ``spec`` keeps the model's outputs on ``x`` (a spec missing a
    tensor or moving a wrong axis changes the function)."""
    import copy

    state = model.state_dict()
    permuted = apply_permutation(spec, random_permutation(spec, seed), state)
    other = copy.deepcopy(model).eval()
    other.load_state_dict(permuted)
    with torch.no_grad(), eval_mode(model):
        before, after = model(x), other(x)
    if not torch.allclose(before, after, rtol=rtol, atol=atol):
        worst = float((before - after).abs().max())
        raise ModelError(f"the permutation spec of {spec.model!r} changes the model's outputs (by up to {worst:.3g} "
                         "under a random permutation): it misses a tensor or moves a wrong axis")


def _check_spec_fits(spec: PermutationSpec, state: Mapping[str, torch.Tensor]) -> None:
    for p in spec.perms:
        for ax in p.axes:
            t = state.get(ax.key)
            if t is None:
                raise ModelError(f"permutation {p.name!r} names tensor {ax.key!r} that {spec.model} does not have")
            if t.ndim <= ax.axis or t.shape[ax.axis] != p.size * ax.inner:
                raise ModelError(f"permutation {p.name!r}: tensor {ax.key!r} of shape {tuple(t.shape)} has no axis "
                                 f"{ax.axis} of {p.size * ax.inner}")


def _permuted(spec: PermutationSpec, perms: Mapping[str, torch.Tensor], key: str, t: torch.Tensor,
              skip: Axis | None = None) -> torch.Tensor:
    for name, ax in spec.by_key.get(key, ()):
        if ax is not skip:  # unit i's ``inner`` positions move together
            t = t.index_select(ax.axis, (perms[name][:, None] * ax.inner + torch.arange(ax.inner)).reshape(-1))
    return t


def _units(t: torch.Tensor, ax: Axis, n: int) -> torch.Tensor:
    """``t`` with the permuted axis first, one row per unit (its ``inner`` positions and all other axes)."""
    return t.movedim(ax.axis, 0).reshape(n, -1)


def check_permutations(spec: PermutationSpec, perms: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The permutations as int64 tensors; UsageError unless each keeps whole norm groups."""
    out = {}
    for p in spec.perms:
        if p.name not in perms:
            raise UsageError(f"no permutation given for {p.name!r}")
        perm = torch.as_tensor(perms[p.name]).to(torch.int64).reshape(-1)
        if perm.numel() != p.size or not torch.equal(torch.sort(perm).values, torch.arange(p.size)):
            raise UsageError(f"{p.name!r} is not a permutation of {p.size} units")
        if p.groups > 1:
            blocks = perm.view(p.groups, p.group_size) // p.group_size
            if not bool((blocks == blocks[:, :1]).all()):
                raise UsageError(f"{p.name!r} splits a GroupNorm group of {p.group_size} channels (a permutation "
                                 "that keeps the function maps whole groups onto whole groups)")
        out[p.name] = perm
    extra = sorted(set(perms) - {p.name for p in spec.perms})
    if extra:
        raise UsageError(f"{spec.model} has no permutation {extra[0]!r}")
    return out


def apply_permutation(spec: PermutationSpec, perms: Mapping[str, torch.Tensor],
                      state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A new state dict, unit ``i`` of each permuted axis taking the old unit ``perm[i]`` (partial is
    fine)."""
    perms = check_permutations(spec, perms)
    out = {}
    for key, t in state.items():
        for name, ax in spec.by_key.get(key, ()):
            if t.ndim <= ax.axis or t.shape[ax.axis] != len(perms[name]) * ax.inner:
                raise IncompatibleError(f"tensor {key!r} of shape {tuple(t.shape)} does not fit permutation {name!r}")
        out[key] = _permuted(spec, perms, key, t.detach()).clone()
    return out


def identity(spec: PermutationSpec) -> dict[str, torch.Tensor]:
    return {p.name: torch.arange(p.size) for p in spec.perms}


def random_permutation(spec: PermutationSpec, seed: int) -> dict[str, torch.Tensor]:
    """Uniformly random permutations that keep whole norm groups (groups shuffled, then units within each)."""
    g = torch.Generator().manual_seed(int(seed))
    out = {}
    for p in spec.perms:
        s = p.group_size
        blocks = torch.randperm(p.groups, generator=g)
        within = torch.stack([torch.randperm(s, generator=g) for _ in range(p.groups)])
        out[p.name] = (blocks[:, None] * s + within).reshape(-1)
    return out


def invert(perms: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse permutations: ``apply(invert(P), apply(P, s)) == s``."""
    return {k: torch.argsort(torch.as_tensor(v)) for k, v in perms.items()}
