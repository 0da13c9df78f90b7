"""Options: one declaration (:func:`option`, the type is the annotation) and one coercion (:func:`coerce`) for
the command line, the Python api and batch specs; configs derive from :class:`Options`. Imports nothing heavy:
the command line reads it before torch is loaded.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from landscape.bounds import COUNT_MAX, SEED_MAX, int_or_float, is_seed, subset_value
from landscape.errors import OptionError, UsageError, param

FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max: models and evaluations run in float32
KINDS = ("subset", "device", "text", "metrics", "model", "data", "json", "directory", "file", "scheduler")


# the help of the model and data-set options, the same in every command that builds a model
SOURCE_HELP = {
    "data": "Data set: a built-in name (docs/data-models.md), a torchvision set by name (svhn, kmnist, ...) or imagefolder (both with --data-root), "
            "a .npz/.h5 tensor file, or module:factory / file.py:factory.",
    "data_kwargs": 'Data set options as a JSON object, e.g. \'{"ds": 10, "dn": 90}\'.',
    "subset": "Train on a stratified subset: a count or a fraction of the train split.",
    "data_root": "Where torchvision data sets live (default $LANDSCAPE_DATA).",
    "download": "Download a torchvision data set into --data-root if absent.",
    "model": "Model: a built-in name (docs/data-models.md), or module:factory / file.py:factory (called with input_shape, num_classes and "
             "--model-kwargs).",
    "model_kwargs": 'Model options as a JSON object, e.g. \'{"norm": "batch"}\'.',
}
# the values of options that a lower layer checks (the numerics) and the configs offer
SPLITS = ("train", "test")
EVAL_METHODS = ("auto", "loop", "plain", "vmap")  # landscape.evaluate's engines
EVAL_CHUNK = 1000  # examples per forward pass of landscape.evaluate
KERNELS = ("loss-grad", "output", "output-trace")  # landscape.gram's kernels
GRAM_STRATEGIES = ("auto", "hooks", "materialize", "ghost", "functorch")
PRECISIONS = ("auto", "float64", "float32")  # of products: landscape.gram's; the Hessian's without auto
NORMALIZATIONS = ("none", "filter", "layer")  # of random directions (landscape.directions)
BIASBN = ("zero", "copy", "random")  # 1-D tensors of normalised random directions

# the help of the options that mean the same in every command (one vocabulary: tests/test_vocabulary.py)
SUBSET_HELP = "Examples used: a count, or a fraction of the split (a seeded stratified draw)."
SUBSET_SEED_HELP = "Seed of the examples' draw (--subset)."
CHUNK_HELP = "Examples per pass: bounds memory; results do not depend on it beyond float rounding."
DEVICE_HELP = "auto (CUDA when available, else CPU), cpu, cuda or cuda:N."
CLIP_STYLE_HELP = "flat: one norm per sample; layerwise: one per layer (parameter tensor)."
CLIP_FN_HELP = "Clipping function (Bu et al. Sec. 2.2): abadi min(1, C/|g|), automatic, normalize or global."

# keys of --data-kwargs / --model-kwargs that are options of their own, or come from the data set
DATA_RESERVED = ("name", "subset", "data_root", "download")
MODEL_RESERVED = ("input_shape", "num_classes")


def check_kwargs(data_kwargs: Mapping[str, Any] | None, model_kwargs: Mapping[str, Any] | None) -> None:
    """Refuse keys of ``--data-kwargs`` that are options of their own and keys of ``--model-kwargs`` that come from
    the data set (one UsageError line naming the parameter)."""
    clash = [k for k in DATA_RESERVED if k in (data_kwargs or {})]
    if clash:
        raise OptionError("data_kwargs", f"cannot hold {', '.join(clash)}: give the matching option "
                                         f"({', '.join(map(param, clash))}) instead")
    clash = [k for k in MODEL_RESERVED if k in (model_kwargs or {})]
    if clash:
        raise OptionError("model_kwargs", f"cannot hold {', '.join(clash)}: they come from the data set")


def option(default: Any = dataclasses.MISSING, help: str = "", *, flag: str | tuple[str, ...] | None = None,
           choices: tuple | None = None, metavar: str | None = None, min: float | None = None,
           max: float | None = None, min_open: bool = False, max_open: bool = False, kind: str | None = None,
           cli: bool = True, default_factory: Callable | None = None, envvar: str | None = None,
           required: bool = False) -> Any:
    """A config dataclass field with its option in the field's metadata.

    The annotation gives the type: ``int``/``float`` (finite, within ``min``/``max``, exclusive with
    ``min_open``/``max_open``; a field ``seed`` or ``*_seed`` is a seed), ``bool`` (a flag), ``str`` (one of
    ``choices`` when given), ``tuple[str | float, ...]`` (a comma list). ``kind`` names a special type instead
    (:data:`KINDS`). ``flag`` overrides ``--field-name`` (a tuple adds aliases); ``cli=False`` keeps the field
    off the command line; ``required`` requires the flag although the api has a default (``phases --k``).
    """
    if kind is not None and kind not in KINDS:
        raise ValueError(f"option kind must be one of {KINDS}, got {kind!r}")
    meta = {"help": help, "flag": flag, "choices": choices, "metavar": metavar, "min": min, "max": max,
            "min_open": min_open, "max_open": max_open, "kind": kind, "cli": cli, "envvar": envvar,
            "required": required}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# ------------------------------------------------------------------------------------------ fields


def cli_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of ``cls`` that are command-line options: its own first, then inherited ones."""
    own = set(cls.__dict__.get("__annotations__", {}))
    fields = [f for f in dataclasses.fields(cls) if f.metadata.get("cli", False)]
    return [f for f in fields if f.name in own] + [f for f in fields if f.name not in own]


def flags_of(f: dataclasses.Field) -> tuple[str, ...]:
    """``("--bn-recalibrate",)`` for field ``bn_recalibrate``, or the metadata's flag(s)."""
    flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
    return (flag,) if isinstance(flag, str) else tuple(flag)


def flag_of(f: dataclasses.Field) -> str:
    """The main flag of a field (the first of :func:`flags_of`; ``--resume`` of ``--resume/--no-resume``)."""
    return flags_of(f)[0].split("/")[0]


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of dataclass ``cls`` (strings under ``from __future__ import``)."""
    return typing.get_type_hints(cls)


# ------------------------------------------------------------------------------------------ coercion


def split_optional(hint: Any) -> tuple[tuple[Any, ...], bool]:
    """The members of a union annotation without None, and whether None was among them."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = typing.get_args(hint)
        return tuple(a for a in args if a is not type(None)), type(None) in args
    return (hint,), hint is type(None)


def _resolve(annotation: Any) -> Any:
    """A string annotation (our own kind tables', never user input) as a type; ``Any`` if unknown."""
    if not isinstance(annotation, str):
        return annotation
    names = {"Any": Any, "Optional": typing.Optional, "Path": Path, "Callable": Callable,
             "Sequence": collections.abc.Sequence, "Mapping": collections.abc.Mapping}
    try:
        return eval(annotation, {"__builtins__": {}}, {"int": int, "float": float, "bool": bool, "str": str,
                                                        "tuple": tuple, "list": list, "dict": dict, "None": None,
                                                        **names})
    except Exception:
        return Any


def _number(value: Any, integer: bool, name: str) -> int | float:
    wanted = "an integer" if integer else "a number"
    if isinstance(value, bool):
        raise OptionError(name, f"must be {wanted}, got {value!r}")
    number: Any = value
    if isinstance(value, str):
        try:
            number = int_or_float(value)
        except ValueError:
            raise OptionError(name, f"must be {wanted}, got {value!r}") from None
    elif not isinstance(value, (int, float)):
        with contextlib.suppress(TypeError, ValueError):
            number = value.item() if hasattr(value, "item") else value  # numpy scalars
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise OptionError(name, f"must be {wanted}, got {value!r}")
    if isinstance(number, float) and not math.isfinite(number):
        raise OptionError(name, f"must be a finite number, got {value!r}")
    if integer:
        if isinstance(number, float):
            if number != int(number):
                raise OptionError(name, f"must be an integer, got {value!r}")
            number = int(number)
        return number
    if abs(number) > FLOAT32_MAX:
        raise OptionError(name, f"{value!r} is too large (float32 holds magnitudes up to {FLOAT32_MAX:.4g})")
    return float(number)


def _bounds(number: int | float, meta: Mapping[str, Any], name: str, integer: bool) -> None:
    lo, hi = meta.get("min"), meta.get("max")
    if hi is None and integer and meta.get("kind") is None:
        hi = COUNT_MAX
    if lo is not None and (number < lo or (meta.get("min_open") and number == lo)):
        raise OptionError(name, f"must be {'>' if meta.get('min_open') else '>='} {lo}, got {number}")
    if hi is not None and (number > hi or (meta.get("max_open") and number == hi)):
        raise OptionError(name, f"must be {'<' if meta.get('max_open') else '<='} {hi}, got {number}")


def _choice(value: Any, meta: Mapping[str, Any], name: str) -> str:
    if not isinstance(value, str):
        raise OptionError(name, f"must be a string, got {value!r}")
    text = value.strip()
    choices = meta.get("choices")
    if choices and text not in choices:
        raise OptionError(name, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
    return text


def _items(value: Any, item: Any, meta: Mapping[str, Any], name: str) -> tuple:
    if isinstance(value, str):
        raw = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)):
        raw = list(value)
    else:
        raise OptionError(name, f"must be a comma list or a list, got {value!r}")
    if not raw:
        raise OptionError(name, "needs at least one value")
    if item is float or item is int:
        out = []
        for v in raw:
            try:
                number = _number(v, item is int, name)
            except OptionError:
                kind = "integers" if item is int else "finite numbers"
                raise OptionError(name, f"must be a comma-separated list of {kind}, got {value!r}") from None
            _bounds(number, meta, name, item is int)
            out.append(number)
        return tuple(out)
    items = tuple(_choice(v, meta, name) for v in raw)
    if meta.get("choices") and len(set(items)) != len(items):
        repeated = next(v for v in items if items.count(v) > 1)
        raise OptionError(name, f"repeats {repeated!r} in {','.join(items)}")
    return items


def coerce(value: Any, annotation: Any, meta: Mapping[str, Any] | None = None, *, name: str = "value") -> Any:
    """``value`` (a command-line string, a YAML value or a Python value) as an option annotated ``annotation``
    with :func:`option` metadata ``meta`` holds it, else an :class:`OptionError` naming parameter ``name``.
    What is not an option type (``dict``, ``Any``) passes through unchanged."""
    meta = meta or {}
    kind = meta.get("kind")
    if kind == "subset":
        least = meta.get("min")
        if least == 0 and not isinstance(value, bool) and str(value).strip() == "0":
            return 0  # none at all, where the option allows it (norms)
        number = subset_value(value, name)
        if isinstance(number, int) and least is not None and number < least:
            raise OptionError(name, f"a count must be >= {least}, got {number}")
        return number
    members, optional = split_optional(_resolve(annotation))
    if kind == "json":
        return _json_object(value, optional, name)
    if value is None:
        if optional or kind in ("metrics",) or not members or members == (Any,):
            return None
        raise OptionError(name, "needs a value, got None")
    if kind == "device":
        from landscape.runtime import check_device_name

        try:
            return check_device_name(str(value).strip().lower())
        except UsageError:
            raise OptionError(name, f"must be auto, cpu, cuda or cuda:N, got {value!r}") from None
    if kind == "metrics":
        if isinstance(value, list):
            return tuple(value)
        return value  # landscape.metrics.normalize (the config's validate) checks references and objects
    if kind in ("text", "model", "data", "scheduler"):
        return value.strip() if isinstance(value, str) else value
    if kind in ("directory", "file"):
        return str(value) if isinstance(value, Path) else value
    if len(members) > 1:  # e.g. str | int: keep a value one member holds as it is
        for member in members:
            if isinstance(member, type) and isinstance(value, member) and not isinstance(value, bool):
                return value
        if isinstance(value, bool) and bool in members:
            return value
        for member in members:
            try:
                return coerce(value, member, meta, name=name)
            except OptionError:
                continue
        raise OptionError(name, f"must be {' or '.join(getattr(m, '__name__', str(m)) for m in members)}, "
                                f"got {value!r}")
    hint = members[0]
    origin = typing.get_origin(hint)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.strip().lower() in ("true", "yes", "1")
        raise OptionError(name, f"must be true or false, got {value!r}")
    if hint is int:
        if is_seed(name):  # the one seed rule of landscape.bounds
            try:
                number = _number(value, True, name)
            except OptionError:
                raise OptionError(name, f"must be an integer seed in [0, 2**63 - 1], got {value!r}") from None
            if not 0 <= number <= SEED_MAX:
                raise OptionError(name, "must be an integer seed in [0, 2**63 - 1] (seeds are never negative), "
                                        f"got {number}")
            return number
        number = _number(value, True, name)
        _bounds(number, meta, name, True)
        return number
    if hint is float:
        number = _number(value, False, name)
        _bounds(number, meta, name, False)
        return number
    if hint is str:
        if meta.get("choices"):
            return _choice(value, meta, name)
        if isinstance(value, Path):
            return str(value)
        if not isinstance(value, str):
            raise OptionError(name, f"must be a string, got {value!r}")
        return value
    if origin is tuple:
        args = typing.get_args(hint)
        return _items(value, args[0] if args else str, meta, name)
    if origin is list and isinstance(value, (list, tuple)):
        return list(value)
    if (hint is dict or origin is dict) and not isinstance(value, Mapping):
        raise OptionError(name, f"must be a mapping, got {value!r}")
    return value


def _json_object(value: Any, optional: bool, name: str) -> dict[str, Any] | None:
    """A ``"json"`` option: a mapping as a dict, its JSON text parsed (empty text: no options)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None if optional and value is None else {}
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise OptionError(name, f"not valid JSON: {exc.msg}") from None
    if not isinstance(value, Mapping):
        raise OptionError(name, "must be a JSON object")
    return dict(value)


def coerce_field(cls: type, f: dataclasses.Field, value: Any) -> Any:
    """``value`` as field ``f`` of dataclass ``cls`` holds it."""
    return coerce(value, hints(cls).get(f.name, f.type), f.metadata, name=f.name)


def check_fields(config: Any) -> None:
    """Check every option field of a dataclass that is not :class:`Options` (those are checked when made)."""
    for f in dataclasses.fields(config):
        if "help" in f.metadata or "cli" in f.metadata:
            coerce_field(type(config), f, getattr(config, f.name))


# ------------------------------------------------------------------------------------------ configs


class Options:
    """Base of the frozen option dataclasses: fields coerced, then :meth:`validate`, when made."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, coerce_field(type(self), f, getattr(self, f.name)))
        self.validate()

    def validate(self) -> None:
        """Checks that span fields (one UsageError line); normalise with :meth:`_set`."""

    def _set(self, name: str, value: Any) -> None:
        """Set a field of the frozen object while it is being validated."""
        object.__setattr__(self, name, value)


def build(cls: type, options: Mapping[str, Any] | None = None, *, base: Any = None) -> Any:
    """A ``cls`` from keyword ``options``, replacing the fields of ``base`` when given; unknown options are
    one UsageError naming the known ones."""
    options = dict(options or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if base is not None and not options and isinstance(base, cls):
        return base
    if issubclass(cls, Options):
        return dataclasses.replace(base, **options) if base is not None else cls(**options)
    by_name = {f.name: f for f in dataclasses.fields(cls)}  # a plain dataclass (a user's, a test's): coerced here
    options = {k: coerce_field(cls, by_name[k], v) for k, v in options.items()}
    out = dataclasses.replace(base, **options) if base is not None else cls(**options)
    if callable(getattr(out, "validate", None)):
        out.validate()
    return out


def from_params(cls: type, params: Mapping[str, Any]) -> Any:
    """A ``cls`` rebuilt from a result file's stored ``params`` (unknown keys dropped)."""
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in params.items() if k in known})


def field_default(f: dataclasses.Field, missing: Any = None) -> Any:
    """The field's default (its factory called), ``missing`` when it has none."""
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else missing


def describe(cls: type) -> list[tuple[str, str, str, str]]:
    """``(name, type, default, help)`` of every option field of ``cls`` (for generated docstrings)."""
    out = []
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata and "cli" not in f.metadata:
            continue
        out.append((f.name, type_name(hints(cls).get(f.name, f.type), f.metadata), repr(field_default(f)),
                    f.metadata.get("help") or ""))
    return out


def type_name(annotation: Any, meta: Mapping[str, Any] | None = None) -> str:
    """A readable type: ``int``, ``tuple[str, ...] | None``, ``{'float32', 'float64'}`` for choices."""
    meta = meta or {}
    if meta.get("choices") and annotation is str:
        return "{" + ", ".join(repr(c) for c in meta["choices"]) + "}"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("collections.abc.", "").replace("pathlib.", "")
