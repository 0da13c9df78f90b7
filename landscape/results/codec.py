"""The dataclass codec of result files: a result dataclass says where each field lives (:func:`stored`, else
its annotation), and one writer and one reader serve every result class, so no attribute is spelled twice."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from landscape.hashing import InputRef
from landscape.results.core import Result, atomic_write, read_result, write_result

_BY_NAME = ("config", "params", "inputs", "path", "figures")


def stored(where: str, default: Any = dataclasses.MISSING, *, name: str | None = None,
           dims: Sequence[str] | None = None, order: str | None = None, count: str | None = None,
           keys: str | None = None, default_factory: Callable | None = None, repr: bool = True,
           compare: bool = True) -> Any:
    """A result dataclass field stored as ``where``: ``"array"``, ``"attr"``, ``"table"`` (a list of row
    dataclasses, one dataset per column), ``"nested"`` (a dataclass whose fields are stored with ``name`` as a
    prefix), ``"group"`` (in a row: stored per row under ``name``, ``{}`` the row index) or ``"skip"``.

    ``name`` (default: the field name) with ``{}`` makes the field a dict whose keys fill the braces
    (``"{}_loss"`` -> ``train_loss``, ...; ``order``: the attr keeping their order; ``keys``: a regular
    expression they match). ``dims``: an array's dimension names; ``count``: the attr holding a table's
    length.
    """
    meta = {"where": where, "name": name, "dims": tuple(dims) if dims else None, "order": order, "count": count,
            "keys": keys}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata={"h5": meta}, repr=repr, compare=compare)
    return field(default=default, metadata={"h5": meta}, repr=repr, compare=compare)


@functools.cache
def _layout(cls: type) -> list[tuple[dataclasses.Field, dict, Any]]:
    import typing

    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = _where(cls, f.name, hints[f.name], f.metadata.get("h5"))
        if meta is not None and meta["where"] != "skip":
            out.append((f, meta, hints[f.name]))
    return out


def _where(cls: type, name: str, hint: Any, meta: dict | None) -> dict | None:
    """Where field ``name`` of ``cls`` lives: its ``stored(...)`` metadata, else by its annotation (a scalar
    is an attr, an ``np.ndarray`` or ``list[float]`` an array); None for the fields handled by name
    (``config``, ``inputs``...). Another type is refused, in the class or in its row and nested
    dataclasses."""
    if meta is None:
        if name in _BY_NAME:
            return None
        plain = _plain_class(hint)
        where = ("attr" if plain in (int, float, str, bool) else
                 "array" if plain is np.ndarray or _vector(plain) else None)
        if where is None:
            raise TypeError(f"{cls.__qualname__} field {name!r}: type {hint} cannot be stored; "
                            "use np.ndarray or stored(...)")
        return {"where": where, "name": None, "dims": None, "order": None, "count": None, "keys": None}
    inner = (_row_class(hint) if meta["where"] == "table" else
             _list_of(hint) or _plain_class(hint) if meta["where"] in ("nested", "group") else None)
    if dataclasses.is_dataclass(inner):
        _layout(inner)
    return meta


def _vector(hint: Any) -> type | None:
    """``list`` or ``tuple`` for an annotation ``list[float]`` / ``tuple[int, ...]`` (numbers), else None."""
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (list, tuple) and args and args[0] in (int, float) and args[1:] in ((), (Ellipsis,)):
        return origin
    return None


def _flatten(obj: Any, layout, out_arrays: dict, out_attrs: dict, dims: dict, orders: dict, prefix: str = "") -> None:
    for f, meta, _ in layout:
        value = getattr(obj, f.name)
        if meta["where"] == "nested":
            _flatten(value, _layout(type(value)), out_arrays, out_attrs, dims, orders, prefix + (meta["name"] or ""))
            continue
        name = prefix + (meta["name"] or f.name)
        if meta["where"] == "table":
            continue
        target = out_arrays if meta["where"] == "array" else out_attrs
        if "{}" in name:
            if value is None:
                continue
            if meta["order"]:
                orders.setdefault(meta["order"], list(value))
            for key, v in value.items():
                target[name.format(key)] = v
                if meta["dims"]:
                    dims[name.format(key)] = meta["dims"]
        elif value is not None or meta["where"] == "attr":
            if isinstance(value, tuple) and meta["where"] == "attr" and all(isinstance(v, str) for v in value):
                value = ",".join(value)
            if meta["where"] == "array" and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                value = np.array([v.encode() for v in value], dtype=object).astype("S")  # names as bytes
            parts = _real_parts(name, value) if meta["where"] == "array" else {name: value}
            for part, v in parts.items():
                target[part] = v
                if meta["dims"]:
                    dims[part] = meta["dims"]


def _real_parts(name: str, value: Any) -> dict[str, Any]:
    """``{name: value}``, or ``{name_real: ..., name_imag: ...}`` for a complex array."""
    if isinstance(value, np.ndarray) and np.iscomplexobj(value):
        return {f"{name}_real": value.real, f"{name}_imag": value.imag}
    return {name: value}


def table_columns(rows: Sequence[Any], row_cls: type, keys: Sequence[str] = ()) -> dict[str, list]:
    """Rows of a table (row dataclasses) as named columns; dict fields expand over ``keys`` (default: their
    own)."""
    columns: dict[str, list] = {}
    layout = _layout(row_cls)
    for f, meta, hint in layout:
        name = meta["name"] or f.name
        if meta["where"] == "group":  # stored per row (write_dataclass), not as a column
            continue
        if meta["where"] == "nested":
            prefix = meta["name"] or ""
            if _list_of(hint) is not None:  # a list of dataclasses per row: columns stacked along a new axis
                inner = _list_of(hint)
                per_row = [table_columns(getattr(r, f.name), inner, keys) for r in rows]
                for col in table_columns([], inner, keys):
                    columns[prefix + col] = [_column_array(c[col]) for c in per_row]
            else:
                sub = table_columns([getattr(r, f.name) for r in rows], _plain_class(hint), keys)
                columns.update({prefix + k: v for k, v in sub.items()})
        elif "{}" in name:
            ks = list(keys) or (list(getattr(rows[0], f.name)) if rows else [])
            for k in ks:
                columns[name.format(k)] = [getattr(r, f.name).get(k, math.nan) for r in rows]
        else:
            columns[name] = [getattr(r, f.name) for r in rows]
    return columns


def _list_of(hint: Any) -> type | None:
    """``X`` for an annotation ``list[X]`` with X a dataclass, else None."""
    import typing

    args = typing.get_args(hint)
    if typing.get_origin(hint) is list and args and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def _plain_class(hint: Any) -> Any:
    """``X`` for ``X | None`` (the first of several), else the annotation itself."""
    import types

    if isinstance(hint, types.UnionType):
        hint = next(a for a in hint.__args__ if a is not type(None))
    return hint


def _column_array(values: list) -> np.ndarray:
    """One table column: bools, int64, float64, stacked arrays, or bytes (text; None as "")."""
    if not values:
        return np.array([], dtype=np.float64)
    if all(isinstance(v, (bool, np.bool_)) for v in values):
        return np.array(values, dtype=bool)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in values):
        return np.array(values, dtype=np.int64)
    if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
           for v in values):
        return np.array(values, dtype=np.float64)
    if all(isinstance(v, (np.ndarray, list, tuple)) for v in values):  # a vector (or array) per row
        return np.stack([np.asarray(v) for v in values])
    return np.array([("" if v is None else str(v)).encode() for v in values], dtype=object).astype("S")


def write_dataclass(obj: Any, path: str | os.PathLike, kind: str, *, inputs: Sequence[InputRef] = (),
                    attrs: Mapping[str, Any] | None = None) -> Path:
    """Write result dataclass ``obj`` as a ``kind`` result file; the ``table`` attr names the columns
    ``to_frame()`` shows (a table's, else the arrays sharing the most common dimension)."""
    layout = _layout(type(obj))
    arrays: dict[str, Any] = {}
    out_attrs: dict[str, Any] = {}
    dims: dict[str, tuple] = {}
    orders: dict[str, list] = {}
    _flatten(obj, layout, arrays, out_attrs, dims, orders)
    if hasattr(obj, "derived"):
        more_arrays, more_attrs, more_dims = obj.derived()
        arrays.update(more_arrays)
        out_attrs.update(more_attrs)
        dims.update({k: v for k, v in more_dims.items() if k in arrays})
    table: list[str] = []
    for f, meta, hint in layout:
        if meta["where"] != "table":
            continue
        rows = getattr(obj, f.name)
        row_cls = _row_class(hint)
        keys = _split_order(out_attrs.get(meta["order"])) if meta["order"] else ()
        for col, values in table_columns(rows, row_cls, keys).items():
            for part, column in _real_parts(col, _column_array(values)).items():
                arrays[part] = column
                if column.ndim <= 2:  # a vector column is one frame column per component
                    table.append(part)
        for i, row in enumerate(rows):
            for g, gmeta, ghint in _layout(row_cls):
                if gmeta["where"] == "group":
                    arrays.update(_group_arrays(getattr(row, g.name), gmeta["name"].format(i), ghint, keys))
        if meta["count"]:
            out_attrs[meta["count"]] = len(rows)
    for attr, keys in orders.items():
        out_attrs.setdefault(attr, ",".join(keys))
    if not table and dims:  # the arrays sharing the most common dimensions, if those are one (alpha, t)
        groups: dict[tuple, list[str]] = {}
        for n, d in dims.items():
            groups.setdefault(tuple(d), []).append(n)
        common = max(groups, key=lambda d: (len(groups[d]), len(d)))  # ties: the grid, not its axes
        if len(common) == 1:
            table = groups[common]
            if common[0] in table:
                table = [common[0]] + [n for n in table if n != common[0]]
    if table and "table" not in out_attrs:  # derived() may name the frame's columns itself
        out_attrs["table"] = json.dumps(table)
    out_attrs.update(attrs or {})
    params = getattr(obj, "config", None) or getattr(obj, "params", None)
    return write_result(path, kind, arrays=arrays, attrs=out_attrs, params=params, inputs=inputs, dims=dims)


def _group_arrays(value: Any, name: str, hint: Any, keys: Sequence[str]) -> dict[str, Any]:
    """One row's ``"group"`` field: a sub-table's columns prefixed ``name``, names as bytes, or one
    dataset."""
    inner = _list_of(hint)
    if inner is not None:
        return {part: column for col, v in table_columns(value, inner, keys).items()
                for part, column in _real_parts(name + col, _column_array(v)).items()}
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return {name: np.array([v.encode() for v in value], dtype=object).astype("S")}
    return {name: np.asarray(value)}


@dataclass(kw_only=True)
class StoredResult:
    """Base of a result dataclass: ``to_hdf5`` / ``from_hdf5`` by its ``KIND`` and ``CONFIG``."""

    KIND = ""
    CONFIG: ClassVar[Any] = None

    inputs: list[InputRef] = field(default_factory=list)
    path: Path | None = None
    figures: list[Path] = field(default_factory=list)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse, when the class is defined, a field the codec could not store (see :func:`_where`)."""
        import typing

        super().__init_subclass__(**kwargs)
        hints = typing.get_type_hints(cls)
        for name in cls.__dict__.get("__annotations__", {}):
            if typing.get_origin(hints[name]) is not ClassVar and hints[name] is not ClassVar:
                default = cls.__dict__.get(name)
                meta = default.metadata.get("h5") if isinstance(default, dataclasses.Field) else None
                _where(cls, name, hints[name], meta)

    def derived(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, tuple]]:
        """``(arrays, attrs, dims)`` written beside the fields (summary statistics...); none by default."""
        return {}, {}, {}

    def to_hdf5(self, path: str | os.PathLike, inputs: Sequence[InputRef] = (),
                attrs: Mapping[str, Any] | None = None) -> Path:
        """Write the result (``inputs`` default to its own), set and return its ``path``."""
        self.inputs = list(inputs) or self.inputs
        self.path = write_dataclass(self, path, self.KIND, inputs=self.inputs, attrs=attrs)
        return self.path

    @classmethod
    def from_hdf5(cls, path: str | os.PathLike) -> Any:
        return read_dataclass(cls, path, cls.KIND, config=cls.CONFIG)


def _row_class(hint: Any) -> type:
    row = _list_of(hint)
    if row is None:
        raise TypeError(f"a table field must be annotated list[RowDataclass], got {hint}")
    return row


def _split_order(value: Any) -> list[str]:
    return [s for s in str(value or "").split(",") if s]


def _decode_value(value: Any, hint: Any) -> Any:
    import types
    import typing

    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, np.generic):
        value = value.item()
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0] if len(args) == 1 else None
    if optional and not isinstance(value, np.ndarray) and (value is None or value in ("", "none")):
        return None
    if hint in (float, int, bool, str, Path):
        return hint(value)
    if typing.get_origin(hint) is tuple and isinstance(value, str):
        return tuple(_split_order(value))
    if _vector(hint) and isinstance(value, np.ndarray):
        return _vector(hint)(value.tolist())
    if typing.get_origin(hint) is list and isinstance(value, np.ndarray) and value.dtype.kind == "S":
        return [v.decode() for v in value]
    if typing.get_origin(hint) in (dict, list) and isinstance(value, str):  # stored as one JSON attr
        parsed = json.loads(value)
        args = typing.get_args(hint)
        if typing.get_origin(hint) is dict and len(args) == 2 and typing.get_origin(args[1]) is tuple:
            parsed = {k: tuple(v) for k, v in parsed.items()}
        return parsed
    return value


def _dict_field(source: Mapping[str, Any], template: str, order: Sequence[str], hint: Any,
                pattern_of_keys: str | None = None) -> dict:
    import re
    import typing

    pattern = re.compile("^" + re.escape(template).replace(r"\{\}", f"({pattern_of_keys or '.+'})") + "$")
    found = {m.group(1): v for k, v in source.items() if (m := pattern.match(k))}
    keys = [k for k in order if k in found] + sorted(k for k in found if k not in order)
    args = typing.get_args(hint)
    value_hint = args[1] if len(args) == 2 else None
    return {k: (found[k] if value_hint is np.ndarray or value_hint is None else _decode_value(found[k], value_hint))
            for k in keys}


def read_dataclass(cls: type, path: str | os.PathLike, kind: str, *, config: type | None = None) -> Any:
    """The result dataclass ``cls`` from a ``kind`` file written by :func:`write_dataclass`."""
    r = read_result(path, kind)
    values = _field_values(cls, r)
    names = {f.name for f in dataclasses.fields(cls)}
    if "config" in names and config is not None:  # old option names read as the current ones
        from landscape.options import from_params

        values["config"] = from_params(config, r.params)
    if "params" in names:
        values["params"] = r.params
    if "inputs" in names:
        values["inputs"] = r.inputs
    if "path" in names:
        values["path"] = Path(path)
    return cls(**values)


def _field_values(cls: type, r: Result, prefix: str = "") -> dict[str, Any]:
    """The stored fields of ``cls`` read from ``r`` (names prefixed ``prefix``, for a nested dataclass)."""
    values: dict[str, Any] = {}
    for f, meta, hint in _layout(cls):
        name = prefix + (meta["name"] or f.name)
        order = _split_order(r.attrs.get(meta["order"])) if meta["order"] else []
        if meta["where"] == "table":
            row_cls = _row_class(hint)
            values[f.name] = _rows_from(r.arrays, row_cls, _table_length(r.arrays, row_cls), order)
            continue
        if meta["where"] == "nested":
            inner = _plain_class(hint)
            values[f.name] = inner(**_field_values(inner, r, prefix + (meta["name"] or "")))
            continue
        source = r.arrays if meta["where"] == "array" else r.attrs
        if "{}" in name:
            values[f.name] = _dict_field(source, name, order, hint, meta.get("keys"))
        elif meta["where"] == "array" and f"{name}_real" in source and f"{name}_imag" in source:
            values[f.name] = source[f"{name}_real"] + 1j * source[f"{name}_imag"]
        elif name in source:
            value = source[name]
            if meta["where"] == "attr" or (isinstance(value, np.ndarray) and value.dtype.kind == "S") or _vector(_plain_class(hint)):
                value = _decode_value(value, hint)
            values[f.name] = value
    return values


def _table_length(arrays: Mapping[str, np.ndarray], row_cls: type) -> int:
    for f, meta, hint in _layout(row_cls):
        name = meta["name"] or f.name
        if meta["where"] == "nested" and _list_of(hint) is None:
            return _table_length(_strip(arrays, meta["name"] or ""), _plain_class(hint))
        if meta["where"] != "nested" and "{}" not in name and name in arrays:
            return len(arrays[name])
    return 0


def _strip(arrays: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)} if prefix else dict(arrays)


def _rows_from(arrays: Mapping[str, np.ndarray], row_cls: type, n: int, order: Sequence[str]) -> list:
    layout = _layout(row_cls)
    columns: dict[str, list] = {}
    for f, meta, hint in layout:
        name = meta["name"] or f.name
        if meta["where"] == "group":
            inner = _list_of(hint)
            if inner is not None:  # row i's sub-table under the prefix name.format(i)
                subs = [_strip(arrays, name.format(i)) for i in range(n)]
                columns[f.name] = [_rows_from(sub, inner, _table_length(sub, inner), order) for sub in subs]
            else:
                columns[f.name] = [_decode_value(arrays[name.format(i)], hint) for i in range(n)]
            continue
        if meta["where"] == "nested":
            sub = _strip(arrays, meta["name"] or "")
            inner = _list_of(hint)
            if inner is None:
                columns[f.name] = _rows_from(sub, _plain_class(hint), n, order)
            else:  # row i's list: the i-th slice of every column
                rows = [{k: v[i] for k, v in sub.items() if v.ndim >= 1 and len(v) == n} for i in range(n)]
                columns[f.name] = [_rows_from(row, inner, _table_length(row, inner), order) for row in rows]
        elif "{}" in name:
            same = {k: v for k, v in arrays.items() if v.ndim >= 1 and len(v) == n}
            columns[f.name] = [_dict_field({k: v[i] for k, v in same.items()}, name, order, hint) for i in range(n)]
        elif f"{name}_real" in arrays and f"{name}_imag" in arrays:
            columns[f.name] = [arrays[f"{name}_real"][i] + 1j * arrays[f"{name}_imag"][i] for i in range(n)]
        elif name in arrays:
            columns[f.name] = [_decode_value(arrays[name][i], hint) for i in range(n)]
    return [row_cls(**{k: v[i] for k, v in columns.items()}) for i in range(n)]


def write_csv(path: str | os.PathLike, records: Sequence[Mapping[str, Any]], columns: Sequence[str], *,
              nan: str = "") -> Path:
    """Write rows as CSV (NaN as ``nan``: an empty cell by default), atomically."""
    import csv

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(columns))
            writer.writeheader()
            for rec in records:
                writer.writerow({k: (nan if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()})

    return atomic_write(path, write)
