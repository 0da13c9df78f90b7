"""Models by name (:data:`MODELS`, entry points of ``landscape.models``, user code), rebuilt from a spec
``{"name", "kwargs"}``. Building draws the initial weights from torch's global generator: the caller seeds."""

from __future__ import annotations

import copy
import inspect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from landscape import plugins
from landscape.errors import ModelError

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "sigmoid": nn.Sigmoid,
    "elu": nn.ELU,
    "softplus": nn.Softplus,
    "identity": nn.Identity,
}


def _activation(name: str) -> nn.Module:
    try:
        return ACTIVATIONS[name]()
    except (KeyError, TypeError):
        raise ModelError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}") from None


def _image_shape(input_shape: Sequence[int], model: str) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ModelError(f"{model} needs image inputs (C, H, W), got input_shape {list(input_shape)}")
    return tuple(int(s) for s in input_shape)  # type: ignore[return-value]


def _flat_features(features: nn.Module, shape: Sequence[int], model: str) -> int:
    """Size of ``features``' output for one example of ``shape`` (a dry run without gradients)."""
    try:
        with torch.no_grad():
            out = features(torch.zeros(1, *shape))
    except RuntimeError as exc:
        raise ModelError(f"{model} cannot take inputs of shape {list(shape)}: {str(exc).splitlines()[0]}") from None
    return int(out.numel())


# ------------------------------------------------------------------------------------------------ lenet


def lenet(input_shape: Sequence[int], num_classes: int, *, channels: Sequence[int] = (6, 16),
          hidden: Sequence[int] = (120, 84), activation: str = "relu") -> nn.Module:
    """LeNet-5 (LeCun et al. 1998), the small CNN of Watson et al. Convolutions pad by 2 where the input is
    too small for LeNet's 32x32 geometry (MNIST's 28x28, 8x8 digits); the first fully connected layer takes
    whatever the features flatten to."""
    c, h, w = _image_shape(input_shape, "lenet")
    c1, c2 = _pair(channels, "channels")
    pad1 = 2 if min(h, w) < 32 else 0
    side = (min(h, w) + 2 * pad1 - 4) // 2
    pad2 = 2 if side < 10 else 0
    features = nn.Sequential(
        nn.Conv2d(c, c1, 5, padding=pad1), _activation(activation), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=pad2), _activation(activation), nn.MaxPool2d(2),
        nn.Flatten(),
    )
    return nn.Sequential(*features, *_mlp_head(_flat_features(features, (c, h, w), "lenet"), hidden,
                                               num_classes, activation))


def _pair(values: Sequence[int], name: str) -> tuple[int, int]:
    if len(values) != 2 or any(int(v) != v or v < 1 for v in values):
        raise ModelError(f"lenet option {name} must be two positive integers, got {values!r}")
    return int(values[0]), int(values[1])


def _mlp_head(in_features: int, widths: Sequence[int], num_classes: int, activation: str,
              bias: bool = True) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for width in widths:
        if int(width) != width or width < 1:
            raise ModelError(f"layer widths must be positive integers, got {list(widths)}")
        layers += [nn.Linear(in_features, int(width), bias=bias), _activation(activation)]
        in_features = int(width)
    layers.append(nn.Linear(in_features, num_classes, bias=bias))
    return layers


# ------------------------------------------------------------------------------------------- opacus-cnn


def opacus_cnn(input_shape: Sequence[int], num_classes: int, *, activation: str = "relu") -> nn.Module:
    """The MNIST CNN of TensorFlow Privacy / Opacus (Bu et al. App. C.1, ``SampleConvNet``). Other input sizes
    adapt the first fully connected layer; inputs too small for conv2 (8x8 digits) get the least padding that
    keeps a 2x2 map for the last pooling."""
    c, h, w = _image_shape(input_shape, "opacus-cnn")
    side = (min(h, w) + 6 - 8) // 2 + 1 - 1  # after conv1 and the first pool
    if side < 1:
        raise ModelError(f"opacus-cnn needs inputs of at least 4x4, got {list(input_shape)}")
    pad2 = 0
    while (side + 2 * pad2 - 4) // 2 + 1 < 2:
        pad2 += 1
    features = nn.Sequential(
        nn.Conv2d(c, 16, 8, 2, padding=3), _activation(activation), nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, 2, padding=pad2), _activation(activation), nn.MaxPool2d(2, 1),
        nn.Flatten(),
    )
    flat = _flat_features(features, (c, h, w), "opacus-cnn")
    return nn.Sequential(*features, nn.Linear(flat, 32), _activation(activation), nn.Linear(32, num_classes))


# --------------------------------------------------------------------------------------------- resnet18


def _group_norm(channels: int, groups: int) -> nn.GroupNorm:
    """GroupNorm with ``min(groups, channels)`` groups, reduced until it divides ``channels`` (as Opacus)."""
    g = max(1, min(groups, channels))
    while channels % g:
        g -= 1
    return nn.GroupNorm(g, channels)


def resnet18(input_shape: Sequence[int], num_classes: int, *, norm: str = "group", groups: int = 32,
             stem: str = "auto") -> nn.Module:
    """torchvision's ResNet-18 as in Watson et al. Sec. 4. ``norm="group"`` (needed for DP-SGD) puts GroupNorm
    where torchvision has BatchNorm, as Opacus does; ``stem="cifar"`` is a 3x3/1 conv without maxpool
    (``"auto"``: cifar up to 64x64 inputs). ReLUs are not in-place: per-sample hooks see every activation."""
    from torchvision.models import resnet18 as tv_resnet18

    c, h, w = _image_shape(input_shape, "resnet18")
    if norm == "group":
        norm_layer: Callable[[int], nn.Module] = lambda ch: _group_norm(ch, groups)  # noqa: E731
    elif norm == "batch":
        norm_layer = nn.BatchNorm2d
    else:
        raise ModelError(f"resnet18 option norm must be 'group' or 'batch', got {norm!r}")
    if int(groups) != groups or groups < 1:
        raise ModelError(f"resnet18 option groups must be a positive integer, got {groups!r}")
    stem = _resolve_stem(stem, (c, h, w))
    model = tv_resnet18(weights=None, num_classes=num_classes, norm_layer=norm_layer)
    if stem == "cifar":
        model.conv1 = nn.Conv2d(c, 64, 3, 1, 1, bias=False)
        model.maxpool = nn.Identity()
    elif c != 3:
        model.conv1 = nn.Conv2d(c, 64, 7, 2, 3, bias=False)
    if stem == "cifar" or c != 3:
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    for module in model.modules():
        if isinstance(module, nn.ReLU):
            module.inplace = False
    return model


def _resolve_stem(stem: str, shape: Sequence[int]) -> str:
    if stem == "auto":
        return "cifar" if max(shape[1:]) <= 64 else "imagenet"
    if stem not in ("cifar", "imagenet"):
        raise ModelError(f"resnet18 option stem must be 'auto', 'cifar' or 'imagenet', got {stem!r}")
    return stem


# -------------------------------------------------------------------------------------------------- mlp


def mlp(input_shape: Sequence[int], num_classes: int, *, widths: Sequence[int] = (256, 256),
        activation: str = "relu", bias: bool = True) -> nn.Module:
    """Fully connected network on the flattened input: ``widths`` hidden layers, each followed by ``activation``."""
    return nn.Sequential(nn.Flatten(), *_mlp_head(math.prod(input_shape), widths, num_classes, activation, bias))


# ------------------------------------------------------------------------------------- two-layer-linear


class TwoLayerLinear(nn.Module):
    """``f(x) = W2 W1 x`` without biases (Watson et al. eq. (10)); ``layer1.weight`` is W1, ``layer2.weight`` W2."""

    def __init__(self, in_features: int, hidden: int, out_features: int):
        super().__init__()
        self.flatten = nn.Flatten()
        self.layer1 = nn.Linear(in_features, hidden, bias=False)
        self.layer2 = nn.Linear(hidden, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer2(self.layer1(self.flatten(x)))


def balanced_weights(w2: torch.Tensor, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A pair ``(W1, W2)`` with ``W2^T W2 = W1 W1^T`` (Watson Thm. 3.3): ``W1 = V S Q^T`` for ``W2 = U S V^T``
    and a random orthonormal ``Q``; ``W2`` is rebuilt from the same float64 factors: both share rounding."""
    k, m = w2.shape
    r = min(k, m)
    if r > in_features:
        raise ModelError(
            f"balanced_init needs min(num_classes, hidden) <= input size, got {r} > {in_features}"
        )
    u, s, vh = torch.linalg.svd(w2.to(torch.float64), full_matrices=False)
    q, _ = torch.linalg.qr(torch.randn(in_features, r, dtype=torch.float64))
    w1 = vh.T @ torch.diag(s) @ q.T
    return w1, u @ torch.diag(s) @ vh


def two_layer_linear(input_shape: Sequence[int], num_classes: int, *, hidden: int = 32,
                     balanced_init: bool = False) -> nn.Module:
    """Watson et al.'s two-layer linear network (eq. (10)); ``balanced_init`` sets W1 by
    :func:`balanced_weights` (Thm. 3.3's assumption)."""
    if int(hidden) != hidden or hidden < 1:
        raise ModelError(f"two-layer-linear option hidden must be a positive integer, got {hidden!r}")
    d = math.prod(input_shape)
    model = TwoLayerLinear(d, int(hidden), num_classes)
    if balanced_init:
        w1, w2 = balanced_weights(model.layer2.weight.detach(), d)
        with torch.no_grad():
            model.layer1.weight.copy_(w1)
            model.layer2.weight.copy_(w2)
    return model


# ------------------------------------------------------------------------------------------- registry

MODELS: dict[str, Callable[..., nn.Module]] = {
    "lenet": lenet,
    "opacus-cnn": opacus_cnn,
    "resnet18": resnet18,
    "mlp": mlp,
    "two-layer-linear": two_layer_linear,
}

ENTRY_POINT_GROUP = "landscape.models"


@dataclass(frozen=True)
class ModelSource:
    """Where a model name leads: a factory, its ``kind`` (``builtin``, ``entry_point``, ``code``) and the
    provenance a spec records (``{}``, ``{"entry_point": ...}`` or ``{"code": ...}``)."""

    name: str
    factory: Callable[..., Any]
    kind: str
    provenance: dict[str, Any]


def model_source(name: str) -> ModelSource:
    """The factory a name the user gave stands for (a code reference is imported: user-named names only)."""
    if not isinstance(name, str):
        raise ModelError(f"a model name is a string, got {name!r}")
    if name in MODELS:
        return ModelSource(name, MODELS[name], "builtin", {})
    installed = plugins.entry_points(ENTRY_POINT_GROUP)
    if name in installed:
        factory, info = plugins.load_entry_point(ENTRY_POINT_GROUP, name)
        return ModelSource(name, factory, "entry_point", {"entry_point": info})
    if plugins.is_code_ref(name):
        ref = plugins.parse(name)
        factory = plugins.load(ref)
        return ModelSource(plugins.canonical(ref), factory, "code", {"code": plugins.describe(ref)})
    known = ", ".join([*MODELS, *installed])
    raise ModelError(f"unknown model {name!r}; known: {known} (or package.module:factory, path/to/file.py:factory)")


def _stored_source(spec: dict) -> ModelSource:
    """The factory a *stored* spec names: code only when the user named it again, an entry point at its
    recorded version unless changed code is accepted; nothing is imported for an unknown name."""
    name = spec["name"]
    what = "the stored model"
    if "code" in spec:
        ref, current = plugins.checked_code(spec["code"], what)
        return ModelSource(plugins.canonical(ref), plugins.load(ref), "code", {"code": current})
    if "entry_point" in spec:
        factory, info = plugins.checked_entry_point(ENTRY_POINT_GROUP, name, spec["entry_point"], what)
        return ModelSource(name, factory, "entry_point", {"entry_point": info})
    if name in MODELS:
        return ModelSource(name, MODELS[name], "builtin", {})
    raise ModelError(f"unknown model {name!r} in a stored spec; known: {', '.join(MODELS)} (code-named models "
                     "record their code, which this spec does not)")


def model_options(name: str) -> dict[str, Any]:
    """The keyword options model ``name`` accepts, with their JSON defaults."""
    return _options_of(model_source(name))


def _options_of(source: ModelSource) -> dict[str, Any]:
    out = {}
    for p in _parameters(source).values():
        if p.name in _SHAPE_ARGS or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL, p.POSITIONAL_ONLY) \
                or p.default is p.empty:
            continue
        try:
            out[p.name] = json.loads(json.dumps(p.default))
        except (TypeError, ValueError):
            continue  # a default that is no JSON value is pinned by the source's sha256 instead
    return out


_SHAPE_ARGS = ("input_shape", "num_classes")


def _parameters(source: ModelSource) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(source.factory).parameters)
    except (TypeError, ValueError):
        return {"kwargs": inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)}


def _json_form(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        raise ModelError(f"model options must be JSON values, got {value!r}") from None


def build_model(
    name_or_spec: str | dict,
    *,
    input_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Build a model by name (a built-in, an installed entry point, or ``module:factory`` /
    ``file.py:factory``, which naming here lets run) or from a spec dict.

    Every factory is called as ``factory(input_shape=..., num_classes=..., **kwargs)`` (the shape arguments
    only when its signature takes them) and must return an ``nn.Module``. The model gets ``landscape_spec``
    with every option filled in. Anything that cannot be built is a :class:`ModelError`.
    """
    if isinstance(name_or_spec, dict):
        if "name" not in name_or_spec:
            raise ModelError(f"a model spec is a dict with 'name' and 'kwargs', got {name_or_spec!r}")
        source = _stored_source(name_or_spec)
        kwargs = {**(name_or_spec.get("kwargs") or {}), **kwargs}
    else:
        source = model_source(name_or_spec)
    name = source.name
    defaults = _options_of(source)
    params = _parameters(source)
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    spec_shape, spec_classes = kwargs.pop("input_shape", None), kwargs.pop("num_classes", None)
    input_shape = spec_shape if input_shape is None else input_shape
    num_classes = spec_classes if num_classes is None else num_classes
    keywords = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    accepted = {n for n, p in params.items() if p.kind in keywords} - set(_SHAPE_ARGS)
    unknown = [] if open_kwargs else sorted(set(kwargs) - accepted)
    if unknown:
        raise ModelError(
            f"model {name!r} has no option {', '.join(map(repr, unknown))}; its options: "
            f"{', '.join(sorted(accepted)) or 'none'}"
        )
    if input_shape is None or num_classes is None:
        raise ModelError(f"model {name!r} needs input_shape and num_classes (from the data set)")
    shape = _positive_ints(input_shape, "input_shape")
    if not shape:
        raise ModelError("input_shape must not be empty")
    (num_classes,) = _positive_ints([num_classes], "num_classes")
    full = {"input_shape": shape, "num_classes": num_classes, **defaults, **_json_form(kwargs)}
    if source.kind == "builtin" and name == "resnet18":  # "auto" resolved in the stored spec
        full["stem"] = _resolve_stem(full["stem"], shape)
    options = {k: v for k, v in full.items() if k not in _SHAPE_ARGS}
    shape_args = {k: v for k, v in (("input_shape", tuple(shape)), ("num_classes", num_classes))
                  if k in params or open_kwargs}
    try:
        model = source.factory(**shape_args, **options)
    except ModelError:
        raise
    except SystemExit as exc:  # never the command's own exit (sys.exit(0) would be a success that wrote nothing)
        raise ModelError(f"model {name!r}: the factory called sys.exit({exc.code!r}); it must return a model") from None
    except Exception as exc:
        if source.kind == "builtin" and not isinstance(exc, (TypeError, ValueError)):
            raise
        raise ModelError(f"model {name!r} cannot be built with options {options}: "
                         f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}") from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"model {name!r}: the factory returned a {type(model).__name__}, not a torch.nn.Module")
    _check_initialised(model, name)
    model.landscape_spec = {"name": name, "kwargs": full, **source.provenance}
    return model


def _check_initialised(model: nn.Module, name: str) -> None:
    """Refuse ``Lazy`` layers without sizes: a stored model is rebuilt from its factory, then loaded."""
    for path, module in model.named_modules():
        own = [n for n, t in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
               if isinstance(t, nn.parameter.UninitializedTensorMixin)]
        if own:
            raise ModelError(f"model {name!r}: layer '{path or '(the model)'}' ({type(module).__name__}) has "
                             f"uninitialised {', '.join(own)}; a stored model is rebuilt from its factory, so give "
                             f"the layer its sizes (e.g. nn.Linear(in_features, out)) or run the model once on a "
                             f"dummy batch before the factory returns it")


def _positive_ints(values: Any, name: str) -> list[int]:
    try:
        out = [int(v) for v in values]
        ok = all(o == v and o >= 1 and not isinstance(v, bool) for o, v in zip(out, values, strict=True))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ModelError(f"{name} must be positive integers, got {values!r}")
    return out


def model_from_spec(spec: dict) -> nn.Module:
    """Rebuild a model (fresh weights) from its ``landscape_spec``. Code a spec names runs only when the user
    named it in this context (``--code``, ``code=[...]``, ``plugins.trusting``) and is unchanged."""
    if not isinstance(spec, dict):
        raise ModelError(f"a model spec is a dict with 'name' and 'kwargs', got {spec!r}")
    return build_model(spec)


# ------------------------------------------------------------------------------------- the check forward


def check_forward(model: nn.Module, x: torch.Tensor, num_classes: int) -> None:
    """One forward of ``model`` on a few examples ``x`` where a model first meets its data: a failure, or
    logits that are not floats of shape ``(N, num_classes)``, is one :class:`ModelError` line naming the
    layer, not a traceback from deep in training. Changes no weights, statistics, mode or random stream."""
    spec = getattr(model, "landscape_spec", None)
    what = repr(spec["name"]) if isinstance(spec, dict) and "name" in spec else type(model).__name__
    names = {m: n or "(the model)" for n, m in model.named_modules()}
    entered: list[tuple[nn.Module, str]] = []  # modules whose forward is running, outermost first
    last: list[tuple[nn.Module, Any]] = []  # the module that returned most recently, and its output

    def pre(module: nn.Module, args: tuple) -> None:
        entered.append((module, _shapes(args)))

    def post(module: nn.Module, args: tuple, output: Any) -> None:
        if entered and entered[-1][0] is module:
            entered.pop()
        if module is not model:
            last[:] = [(module, output)]

    handles = [h for m in model.modules() for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
    training = model.training
    device = next((t.device for t in [*model.parameters(), *model.buffers()]), x.device)
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            model.eval()
            try:
                out = model(x.to(device))
            except Exception as exc:  # noqa: BLE001  (a user's forward raises anything)
                from landscape.errors import one_line

                raise ModelError(f"model {what} fails on a batch of shape {list(x.shape)} ({_dtype(x)}) "
                                 f"{_where(model, entered, last, names)}: {one_line(exc)}") from None
    finally:
        model.train(training)
        for h in handles:
            h.remove()
    if not isinstance(out, torch.Tensor):
        raise ModelError(f"model {what} returns a {type(out).__name__}, not a tensor of logits (N, {num_classes}); "
                         f"return the logits alone")
    expected = [len(x), int(num_classes)]
    if list(out.shape) != expected or not out.is_floating_point():
        maker = last[0][0] if last and isinstance(last[0][1], torch.Tensor) and last[0][1].shape == out.shape else None
        layer = f" (its last layer '{names[maker]}': {_describe(maker)})" if maker is not None else ""
        raise ModelError(f"model {what} returns {_dtype(out)} logits of shape {list(out.shape)}{layer} for a batch of "
                         f"{list(x.shape)}; the data set has {num_classes} classes, so it must return floats of shape "
                         f"{expected}: build the last layer with the factory's num_classes argument")


def _shapes(value: Any) -> str:
    """The shapes of the tensors in a module's arguments: ``[2, 64]``, ``[2, 3], [2, 3]``; ``-`` for none."""
    if isinstance(value, torch.Tensor):
        return str(list(value.shape))
    if isinstance(value, (tuple, list)):
        parts = [_shapes(v) for v in value]
        return ", ".join(p for p in parts if p != "-") or "-"
    return "-"


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _describe(module: nn.Module) -> str:
    """``Linear(in_features=100, out_features=8, bias=True)``: the module's type and its own settings."""
    extra = module.extra_repr()
    return f"{type(module).__name__}({extra})" if extra and "\n" not in extra and len(extra) < 120 \
        else type(module).__name__


def _where(model: nn.Module, entered: list[tuple[nn.Module, str]], last: list, names: dict) -> str:
    """Where a forward failed: the innermost module still running (its path, type and input shapes), and when
    that is the model itself, the layer that returned last."""
    if entered and entered[-1][0] is not model:
        module, shapes = entered[-1]
        return f"in layer '{names[module]}' ({_describe(module)}) given input {shapes}"
    if last:
        module, output = last[0]
        return (f"in its own forward code, after layer '{names[module]}' ({_describe(module)}) returned "
                f"{_shapes(output)}")
    return "in its own forward code, before any layer"


# ------------------------------------------------------------------------------------------ batch norm


def has_batchnorm(model: nn.Module) -> bool:
    """Whether any submodule is a BatchNorm layer (which mixes examples, so per-sample gradients break)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def convert_batchnorm_to_groupnorm(model: nn.Module, num_groups: int = 32) -> nn.Module:
    """A copy of ``model`` with every BatchNorm replaced by GroupNorm (affine parameters copied), as Opacus'
    ``ModuleValidator.fix`` does; a ``resnet18`` spec is updated to rebuild the converted architecture."""
    converted = copy.deepcopy(model)

    def replace(module: nn.Module) -> None:
        for child_name, child in module.named_children():
            if isinstance(child, nn.modules.batchnorm._BatchNorm):
                gn = _group_norm(child.num_features, num_groups)
                if not child.affine:
                    gn = nn.GroupNorm(gn.num_groups, child.num_features, affine=False)
                else:
                    with torch.no_grad():
                        gn.weight.copy_(child.weight)
                        gn.bias.copy_(child.bias)
                setattr(module, child_name, gn)
            else:
                replace(child)

    replace(converted)
    spec = getattr(converted, "landscape_spec", None)
    if spec is not None and spec.get("name") == "resnet18":
        converted.landscape_spec = {
            "name": "resnet18", "kwargs": {**spec["kwargs"], "norm": "group", "groups": int(num_groups)},
        }
    return converted
