"""The HDF5 result file: :func:`write_result`, :func:`read_result` and :class:`Result`."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from landscape import atomic
from landscape.errors import ResultError, WriteError
from landscape.hashing import InputRef
from landscape.jsonable import is_tensor, to_jsonable
from landscape.results.paths import check_output_path
from landscape.runtime import code_version, environment, portable_mode

_RESERVED = ("kind", "created", "landscape_version", "torch_version", "environment", "portable", "inputs",
             "params")


@dataclass
class Result:
    """A result file read back: its kind, scalar attrs, options, inputs and arrays."""

    path: Path
    kind: str
    attrs: dict[str, Any]
    params: dict[str, Any]
    inputs: list[InputRef]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def to_frame(self):
        """The result's table as a pandas DataFrame: the datasets the file's ``table`` attr names; for a grid
        (a surface) one row per cell (x, y, train_loss, ...); else every 1-D dataset of the most common
        length. A vector column ``v`` (rows x k) becomes ``v[0]`` ... ``v[k-1]``."""
        import pandas as pd

        if "table" not in self.attrs and any(a.ndim >= 2 for a in self.arrays.values()):
            try:
                with self.to_xarray() as ds:
                    top = max(len(v.dims) for v in ds.data_vars.values())
                    names = [k for k, v in ds.data_vars.items() if len(v.dims) == top]
                    if top >= 2 and len({ds[k].dims for k in names}) == 1:
                        return ds[names].to_dataframe().reset_index()
            except (OSError, ValueError, KeyError):  # no dimension scales: fall back to the 1-D columns
                pass
        if "table" in self.attrs:
            names = json.loads(self.attrs["table"])
        else:  # the 1-D datasets of the most common length
            lengths: dict[int, list[str]] = {}
            for name, value in self.arrays.items():
                if value.ndim == 1:
                    lengths.setdefault(len(value), []).append(name)
            names = max(lengths.values(), key=len) if lengths else []
        columns = {}
        for name in names:
            values = self.arrays[name]
            if values.dtype.kind in "SO" and values.ndim == 1:
                values = np.array([v.decode() if isinstance(v, bytes) else str(v) for v in values], dtype=object)
            if values.ndim == 2:  # a vector column: one column per component
                columns.update({f"{name}[{i}]": values[:, i] for i in range(values.shape[1])})
            else:
                columns[name] = values
        return pd.DataFrame(columns)

    def to_xarray(self):
        """The file as an ``xarray.Dataset`` (through h5netcdf: dimension scales become labelled dims)."""
        import xarray as xr

        return xr.open_dataset(self.path, engine="h5netcdf")


def _attr_value(value: Any) -> Any:
    if value is None:
        return "none"
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str):
        return str(value)  # str subclasses (e.g. torch's version string) are not storable as such
    if isinstance(value, (int, float, np.integer, np.floating)):
        return value
    return json.dumps(to_jsonable(value))


def atomic_write(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """:func:`landscape.atomic.atomic_write` for result files (see :func:`_writing`)."""
    with _writing(path):
        return atomic.atomic_write(path, write)


@contextlib.contextmanager
def _writing(path: str | os.PathLike):
    """The directory of ``path`` created, and an OSError but a refused write one :class:`ResultError` line."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        yield
    except WriteError:
        raise
    except OSError as exc:
        raise ResultError(f"cannot write {path}: {exc.strerror or exc}") from None


def write_result(path: str | os.PathLike, kind: str, *, arrays: Mapping[str, Any],
                 attrs: Mapping[str, Any] | None = None, params: Mapping[str, Any] | Any | None = None,
                 inputs: Sequence[InputRef] = (), dims: Mapping[str, Sequence[str]] | None = None) -> Path:
    """Write a result file atomically and return its path: ``attrs`` hold scalars (others as JSON), ``params``
    the configuration (as JSON); ``dims`` (array name -> dimension names) attaches dimension scales, so netCDF
    readers see labelled dimensions (a dimension named like an array is that array)."""
    path = Path(path)
    clash = set(attrs or {}) & set(_RESERVED)
    if clash:
        raise ValueError(f"attrs {sorted(clash)} are reserved by the result schema")
    check_output_path(path)

    def fill(f: h5py.File, check: Callable[[], None]) -> None:
        import torch

        f.attrs["kind"] = kind
        f.attrs["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        f.attrs["landscape_version"] = code_version()
        f.attrs["torch_version"] = str(torch.__version__)
        f.attrs["environment"] = json.dumps(environment(), sort_keys=True)  # torchvision, opacus, ... too
        f.attrs["portable"] = portable_mode()  # computed with every float kernel pinned (any x86-64 alike)
        f.attrs["inputs"] = json.dumps([dataclasses.asdict(i) for i in inputs])
        f.attrs["params"] = json.dumps(to_jsonable(params if params is not None else {}))
        for key, value in (attrs or {}).items():
            f.attrs[key] = _attr_value(value)
        for key, value in arrays.items():
            if is_tensor(value):
                value = value.detach().cpu().numpy()
            f.create_dataset(key, data=np.asarray(value))
        scales: dict[str, h5py.Dataset] = {}
        for name, names in (dims or {}).items():
            if name not in f:
                continue
            for axis, dim in enumerate(names):
                if dim not in scales:
                    if dim not in f:
                        f.create_dataset(dim, data=np.arange(f[name].shape[axis]))
                    f[dim].make_scale(dim)
                    scales[dim] = f[dim]
                if name != dim:
                    f[name].dims[axis].attach_scale(scales[dim])

    with _writing(path):
        return atomic.atomic_write_hdf5(path, fill)


def read_result(path: str | os.PathLike, kind: str | None = None, *, load_arrays: bool = True) -> Result:
    """Read a result file; ``kind`` (if given) must match. Raises :class:`ResultError` on bad files."""
    path = Path(path)
    if not path.is_file():
        raise ResultError(f"result file not found: {path}")
    try:
        with h5py.File(path, "r") as f:
            file_kind = str(f.attrs.get("kind", ""))
            if not file_kind:
                raise ResultError(f"{path} is not a landscape result file (no 'kind' attribute)")
            if kind is not None and file_kind != kind:
                raise ResultError(f"{path} holds a '{file_kind}' result, expected '{kind}'")
            attrs = {k: _decode_attr(v) for k, v in f.attrs.items() if k not in ("inputs", "params")}
            params = json.loads(f.attrs.get("params", "{}"))
            inputs = [InputRef(**d) for d in json.loads(f.attrs.get("inputs", "[]"))]
            arrays: dict[str, np.ndarray] = {}
            if load_arrays:
                f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    except ResultError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise ResultError(f"cannot read result file {path}: {exc}") from None
    return Result(path=path, kind=file_kind, attrs=attrs, params=params, inputs=inputs, arrays=arrays)


def _decode_attr(value: Any) -> Any:
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value
