"""Per-point metrics named by the user (built-in names, ``module:Name{JSON}`` references, or
:class:`landscape.evaluate.Metric` objects): loading, checks, guarded calls, provenance (ARCHITECTURE.md).
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from landscape import plugins
from landscape.errors import LandscapeError, UsageError, one_line
from landscape.hashing import sha256_file

if TYPE_CHECKING:
    import numpy as np

#: Built-in metric names -> (module, class, default keyword arguments); our own code, imported directly.
BUILTIN: dict[str, tuple[str, str, dict[str, Any]]] = {
    "ece": ("landscape.analyze.calibration", "ECE", {"bins": 15}),
}
COLUMN = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
OBJECT_PREFIX = "<object "
METRIC_HELP = ("Also record a per-point metric in the same forward passes: ece (built in), package.module:Class or "
               "file.py:Class, optionally with keyword arguments as JSON (file.py:Class{\"k\": 5}); repeatable.")


class MetricError(LandscapeError):
    """A user metric failed while running or returned values that are not one finite number per point."""


def is_metric(obj: Any) -> bool:
    """Whether ``obj`` follows the protocol: a str ``name`` and callable ``start``, ``update``, ``finish``."""
    return (not isinstance(obj, type) and isinstance(getattr(obj, "name", None), str)
            and all(callable(getattr(obj, k, None)) for k in ("start", "update", "finish")))


def columns_of(metric: Any) -> tuple[str, ...]:
    """The columns a metric reports: its ``names`` when it has them, else ``(name,)``."""
    names = getattr(metric, "names", None)
    if names is None:
        return (metric.name,)
    if isinstance(names, str) or not all(isinstance(n, str) for n in names) or not names:
        raise UsageError(f"metric {metric.name!r}: names must be a non-empty tuple of strings, got {names!r}")
    return tuple(names)


class MetricObject(str):
    """A metric object given in Python as it stands in a config: its label (what results record) carrying the
    object in ``.metric``; refused in one line where it would have to travel to a worker."""

    metric: Any

    def __new__(cls, metric: Any) -> MetricObject:
        kind = type(metric)
        label = f"{OBJECT_PREFIX}{kind.__module__}:{kind.__qualname__} name={metric.name}>"
        self = super().__new__(cls, label)
        self.metric = metric
        return self

    def __deepcopy__(self, memo: dict) -> MetricObject:
        return self

    def __copy__(self) -> MetricObject:
        return self

    def __reduce__(self):
        raise UsageError(f"metric {self} is a Python object and cannot be sent to worker processes; name its class "
                         "as a reference (module:Class or file.py:Class) or use one worker")


def parse(text: str) -> tuple[str, dict[str, Any]]:
    """``(reference or built-in name, keyword arguments)`` from ``REF`` or ``REF{JSON}``; UsageError otherwise."""
    text = str(text).strip()
    brace = text.find("{")
    ref, kwargs = (text[:brace].strip(), text[brace:]) if brace >= 0 else (text, None)
    if kwargs is not None:
        try:
            kwargs = json.loads(kwargs)
        except json.JSONDecodeError as exc:
            raise UsageError(f"metric {text!r}: the keyword arguments after the reference are not JSON ({exc.msg})"
                             ) from None
        if not isinstance(kwargs, dict):
            raise UsageError(f"metric {text!r}: the keyword arguments must be a JSON object {{\"name\": value}}")
    if ref in BUILTIN:
        return ref, kwargs or {}
    if not plugins.is_code_ref(ref):
        raise UsageError(f"metric {text!r} is neither a built-in metric ({', '.join(BUILTIN)}) nor a code reference "
                         "(package.module:Class or file.py:Class)")
    plugins.parse(ref)
    return ref, kwargs or {}


def normalize(items: Any) -> tuple[str, ...]:
    """A config's ``metrics`` as a tuple: strings checked for form (nothing is imported), objects wrapped in
    :class:`MetricObject`; UsageError for anything else and for repeats."""
    if items is None:
        return ()
    if isinstance(items, str) or is_metric(items):
        items = (items,)
    out: list[str] = []
    for item in items:
        if isinstance(item, MetricObject):
            out.append(item)
        elif isinstance(item, str):
            text = item.strip()
            if not text.startswith(OBJECT_PREFIX):  # an object's label read back from a result file
                parse(text)
            out.append(text)
        elif is_metric(item):
            out.append(MetricObject(item))
        else:
            raise UsageError(f"{item!r} is not a metric: give a reference (module:Class, file.py:Class), a built-in "
                             f"name ({', '.join(BUILTIN)}) or an object with name, start, update and finish "
                             "(landscape.evaluate.Metric)")
    repeated = sorted({m for m in out if out.count(m) > 1})
    if repeated:
        raise UsageError(f"metrics repeat: {', '.join(repeated)}")
    return tuple(out)


@dataclass
class Bound:
    """One loaded metric: the (guarded) object, its columns and where it came from."""

    metric: Any
    columns: tuple[str, ...]
    source: dict[str, Any]


def load(items: Sequence[str], *, reserved: Collection[str] = (), analysis: str = "this analysis",
         sources: Sequence[Mapping[str, Any]] | None = None) -> list[Bound]:
    """The guarded metric objects of a config's ``metrics`` with their columns and sources. ``reserved``: the
    analysis' own column names; ``sources``: the parent's, so that a worker refuses code changed since."""
    bound: list[Bound] = []
    for i, item in enumerate(normalize(items)):
        metric, source = _build(item)
        if sources is not None and i < len(sources):
            changed = plugins.check_unchanged(dict(sources[i]), source)
            if changed and source.get("sha256") is not None:
                raise MetricError(f"metric {item}: {changed}")
        columns = columns_of(metric)
        for col in columns:
            if not COLUMN.match(col):
                raise UsageError(f"metric {item}: column name {col!r} is not an identifier ([A-Za-z][A-Za-z0-9_]*)")
            if col in reserved or col.endswith("_aligned"):
                raise UsageError(f"metric {item}: column name {col!r} clashes with a built-in column of {analysis} "
                                 f"({', '.join(sorted(reserved))}, *_aligned); give the metric another name")
        bound.append(Bound(_Guarded(metric, str(item)), columns, source))
    seen: dict[str, str] = {}
    for b in bound:
        for col in b.columns:
            if col in seen:
                raise UsageError(f"metric column {col!r} is reported by two metrics ({seen[col]}, {b.metric.label})")
            seen[col] = b.metric.label
    return bound


def _build(item: str) -> tuple[Any, dict[str, Any]]:
    if isinstance(item, MetricObject):
        return _checked(item.metric, item), describe_object(item.metric)
    if item.startswith(OBJECT_PREFIX):
        raise UsageError(f"metric {item} was a Python object when it was recorded; pass the object again or name "
                         "its class as a reference")
    ref, kwargs = parse(item)
    if ref in BUILTIN:
        module, attr, defaults = BUILTIN[ref]
        cls = getattr(importlib.import_module(module), attr)
        try:
            metric = cls(**{**defaults, **kwargs})
        except (TypeError, ValueError, UsageError) as exc:
            raise UsageError(f"metric {item!r}: {one_line(exc)}") from None
        return metric, {"ref": item, "kind": "builtin", "builtin": f"{module}:{attr}", "kwargs": kwargs}
    target = plugins.load(ref, callable_=False)
    source = {**plugins.describe(ref), "kwargs": kwargs}
    if is_metric(target):
        if kwargs:
            raise UsageError(f"metric {item!r}: {ref} is a metric object; keyword arguments need a class or factory")
        return target, source
    if not callable(target):
        raise UsageError(f"metric {item!r}: {ref} is a {type(target).__name__}, neither a metric nor a class or "
                         "factory of one")
    try:
        metric = target(**kwargs)
    except Exception as exc:
        raise plugins.PluginError(f"metric {item!r}: calling {plugins.parse(ref).attr} failed: {one_line(exc)}"
                                  ) from None
    return _checked(metric, item), source


def _checked(metric: Any, item: str) -> Any:
    if not is_metric(metric):
        missing = [k for k in ("start", "update", "finish") if not callable(getattr(metric, k, None))]
        what = f"no {', '.join(missing)}" if missing else "no str name"
        raise UsageError(f"metric {item}: a {type(metric).__name__} is not a metric ({what}; see "
                         "landscape.evaluate.Metric: name, start(points, device), update(state, point, logits, y), "
                         "finish(state))")
    return metric


def describe_object(metric: Any) -> dict[str, Any]:
    """Provenance of a metric object: its class, the class' source file and that file's sha256."""
    kind = type(metric)
    try:
        path = inspect.getsourcefile(kind)
    except TypeError:
        path = None
    return {"ref": str(MetricObject(metric)), "kind": "object", "class": f"{kind.__module__}:{kind.__qualname__}",
            "file": path, "sha256": sha256_file(path) if path else None}


class _Guarded:
    """A metric whose exceptions become one :class:`MetricError` line naming it (the evaluator calls it)."""

    def __init__(self, metric: Any, label: str):
        self.inner, self.label, self.name = metric, label, metric.name

    def _call(self, step: str, *args: Any) -> Any:
        try:
            return getattr(self.inner, step)(*args)
        except Exception as exc:
            raise MetricError(f"metric {self.label} failed in {step}: {one_line(exc)}") from None

    def start(self, points, device):
        return self._call("start", points, device)

    def update(self, state, point, logits, y) -> None:
        self._call("update", state, point, logits, y)

    def finish(self, state):
        return self._call("finish", state)


def point_values(bound: Sequence[Bound], finished: Mapping[str, Any], loss: Any) -> dict[str, np.ndarray]:
    """Column -> float64 ``(P,)`` from the metrics' ``finish`` values, checked: one number per point, finite
    wherever ``loss`` is."""
    import numpy as np

    loss = np.asarray(loss.cpu().numpy() if hasattr(loss, "cpu") else loss, dtype=np.float64).reshape(-1)
    points = loss.size
    out: dict[str, np.ndarray] = {}
    for b in bound:
        value = finished[b.metric.name]
        if len(b.columns) > 1 or getattr(b.metric.inner, "names", None) is not None:
            if not isinstance(value, Mapping) or set(value) != set(b.columns):
                got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
                raise MetricError(f"metric {b.metric.label}: finish must return a mapping with keys "
                                  f"{', '.join(b.columns)} (its names), got {got}")
            parts = {c: value[c] for c in b.columns}
        else:
            parts = {b.columns[0]: value}
        for col, v in parts.items():
            out[col] = _numbers(b.metric.label, col, v, points, loss)
    return out


def _numbers(label: str, col: str, value: Any, points: int, loss: np.ndarray) -> np.ndarray:
    import numpy as np

    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise MetricError(f"metric {label}: {col!r} is not numbers ({type(value).__name__})") from None
    if arr.shape != (points,) and not (points == 1 and arr.size == 1):
        raise MetricError(f"metric {label}: {col!r} has shape {tuple(arr.shape)}; a metric gives one number per "
                          f"point, shape ({points},)")
    arr = arr.reshape(points)
    bad = ~np.isfinite(arr) & np.isfinite(loss)
    if bad.any():
        where = int(np.flatnonzero(bad)[0])
        raise MetricError(f"metric {label}: {col!r} is {arr[where]} at point {where} ({int(bad.sum())} of {points} "
                          "points) where the loss is finite")
    return arr


def same_code(recorded: Sequence[Mapping[str, Any]]) -> bool:
    """Whether metrics recorded with a result would run the same code now (never for objects)."""
    for source in recorded:
        if source.get("kind") == "object":
            return False
        if source.get("kind") in ("file", "module"):
            try:
                if plugins.check_unchanged(dict(source), plugins.describe(str(source["ref"]))) is not None:
                    return False
            except UsageError:
                return False
    return True


COLUMNS_ATTR = "metric_columns"  # a result file's attr naming its metric columns (what read_columns reads back)


def columns_attr(columns: Iterable[str]) -> dict[str, str]:
    """The attr a result writes beside its metric datasets (none without metrics)."""
    names = list(columns)
    return {COLUMNS_ATTR: ",".join(names)} if names else {}


def read_columns(result: Any, path: Any, tables: Mapping[str, str]) -> Any:
    """``result``, just read from ``path`` by ``from_hdf5``, with its metric tables filled from the file's metric
    columns (its ``metric_columns`` attr): field -> dataset name template over ``{column}`` and, for one dataset
    per split of ``result.splits``, ``{split}``. A column without a dataset in the file stays out."""
    from landscape.results import read_result

    r = read_result(path)
    for col in (c for c in str(r.attrs.get(COLUMNS_ATTR, "")).split(",") if c):
        for name, template in tables.items():
            if "{split}" in template:
                found = {s: r.arrays[n] for s in result.splits
                         if (n := template.format(split=s, column=col)) in r.arrays}
                if found:
                    getattr(result, name)[col] = found
            elif template.format(column=col) in r.arrays:
                getattr(result, name)[col] = r.arrays[template.format(column=col)]
    return result


def sources(bound: Iterable[Bound]) -> list[dict[str, Any]]:
    """The provenance records of loaded metrics (stored with the result)."""
    return [b.source for b in bound]


def check_workers(items: Sequence[str], workers: int) -> None:
    """UsageError when metric objects would have to travel to ``workers > 1`` processes."""
    objects = [m for m in items if isinstance(m, MetricObject)]
    if objects and workers > 1:
        raise UsageError(f"metric {objects[0]} is a Python object and cannot be sent to {workers} worker processes; "
                         "name its class as a reference (module:Class or file.py:Class) or use one worker")
