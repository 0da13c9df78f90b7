"""The HDF5 codec of the store's files: state dicts and arrays (bit-exact, dtypes numpy lacks as views),
escaped member names, attrs, the atomic HDF5 writer."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import h5py
import numpy as np

from landscape.atomic import atomic_write
from landscape.errors import UsageError
from landscape.hashing import sha256_file
from landscape.jsonable import is_tensor

if TYPE_CHECKING:
    import torch

STATE_GROUP = "state_dict"
EXTRA_GROUP = "extra"
_VIEW_NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


@dataclass(frozen=True)
class TensorData:
    """A torch tensor as the store writes it, held without torch (a writer process that never imports it):
    ``array``, the tensor's values as numpy holds them (for a dtype numpy lacks, the same-width integer view
    :func:`_view_dtypes` names), and ``dtype``, the torch dtype's name (``"float32"``, ``"bfloat16"``). Written
    exactly as the tensor itself is."""

    array: np.ndarray
    dtype: str


@functools.cache
def _view_dtypes() -> dict[torch.dtype, torch.dtype]:
    """torch dtypes numpy cannot hold: stored bit-exactly as same-width integers, tagged with the torch dtype."""
    import torch

    return {torch.bfloat16: torch.int16,
            **{getattr(torch, n): torch.uint8 for n in _VIEW_NAMES[1:] if hasattr(torch, n)}}


def _write_h5_atomic(final: Path, write) -> str:
    """Write an HDF5 file through ``write(f)`` atomically (:func:`atomic_write`); return its sha256."""
    sha = ""

    def write_file(tmp: Path) -> None:
        nonlocal sha
        with h5py.File(tmp, "w", track_order=True, locking=False) as f:  # a private temp file
            write(f)
        sha = sha256_file(tmp)

    atomic_write(final, write_file)
    return sha


def _open_h5(path: Path) -> h5py.File:
    """Open for reading without HDF5 file locks: store files never change after their rename, and locks
    fail on some shared file systems (NFS) that a cluster's workers use."""
    return h5py.File(path, "r", locking=False)


_SAFE = "".join(chr(c) for c in range(32, 127) if chr(c) not in "%/")  # printable ASCII but '%' and '/'


def _escape(key: str) -> str:
    """HDF5-safe, reversible member name: '%' and '/' are percent-encoded; '.' alone becomes '%2E'."""
    escaped = quote(key, safe=_SAFE)
    return "%2E" if escaped == "." else escaped or "%00empty"


def _unescape(name: str) -> str:
    return "" if name == "%00empty" else unquote(name)


def _write_array(group: h5py.Group, name: str, value: Any) -> None:
    if isinstance(value, TensorData):
        _set_attr(_create_dataset(group, name, value.array), "torch_dtype", value.dtype)
        return
    if is_tensor(value):
        import torch

        tensor = value.detach().cpu()
        if tensor.is_sparse or tensor.layout != torch.strided:
            raise UsageError(f"cannot store '{name}': only dense tensors are supported")
        torch_dtype = str(tensor.dtype).removeprefix("torch.")
        view = _view_dtypes().get(tensor.dtype)
        if view is not None:
            tensor = tensor.contiguous().view(view)
        _set_attr(_create_dataset(group, name, tensor.contiguous().numpy()), "torch_dtype", torch_dtype)
        return
    array = np.asarray(value)
    if array.dtype == object:
        raise UsageError(f"cannot store '{name}': {type(value).__name__} is not a numeric array")
    _create_dataset(group, name, array)


# A checkpoint holds a dataset per tensor (and an attr on each): h5py's high-level calls (``create_dataset``,
# ``attrs[...] =``) spend more time in Python checking options the store never uses than HDF5 spends creating the
# object. :func:`_create_dataset` and :func:`_set_attr` make exactly what those calls make, with the same
# low-level calls and property lists (tests/test_store_codec.py compares the two object by object), in 40% less
# time: a LeNet checkpoint with its optimizer state 2.4 -> 1.5 ms. Anything else goes through the high-level call.
_FAST_KINDS = frozenset("biufc")  # bool, integers, floats, complex


@functools.cache
def _dataset_plist() -> h5py.h5p.PropDCID:
    """What h5py's ``create_dataset(name, data=array)`` creates a dataset with: HDF5's defaults (contiguous, no
    filter), times not recorded."""
    plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    plist.set_obj_track_times(False)
    return plist


@functools.cache
def _h5_types(dtype: np.dtype) -> tuple[h5py.h5t.TypeID, h5py.h5t.TypeID]:
    """The HDF5 file type h5py makes for ``dtype`` (logical: bool as its enum) and its in-memory type."""
    return h5py.h5t.py_create(dtype, logical=True), h5py.h5t.py_create(dtype)


@functools.cache
def _str_types() -> tuple[h5py.h5t.TypeID, h5py.h5t.TypeID]:
    """h5py's types for a Python ``str`` attribute (variable-length UTF-8)."""
    dtype = h5py.string_dtype()
    return h5py.h5t.py_create(dtype, logical=True), h5py.h5t.py_create(dtype)


def _create_dataset(group: h5py.Group, name: str, array: np.ndarray) -> h5py.h5d.DatasetID | h5py.Dataset:
    """``group.create_dataset(name, data=array)`` (a '/' in ``name`` makes the groups on its way, as there): the
    low-level id of the new dataset (for :func:`_set_attr`)."""
    array = np.asarray(array, order="C")
    if array.dtype.kind not in _FAST_KINDS or array.dtype.fields is not None:
        return group.create_dataset(name, data=array)
    parent, _, leaf = name.rpartition("/")
    if parent:
        group = group.require_group(parent)
    dataset = h5py.h5d.create(group.id, leaf.encode(), _h5_types(array.dtype)[0],
                              h5py.h5s.create_simple(array.shape), dcpl=_dataset_plist())
    dataset.write(h5py.h5s.ALL, h5py.h5s.ALL, array)
    return dataset


def _set_attr(obj: Any, name: str, value: Any) -> None:
    """``obj.attrs[name] = value`` on a new object (``obj``: an h5py object or its low-level id) for a ``str``, a
    number or a numeric array; anything else through h5py's own call."""
    oid = obj.id if isinstance(obj, h5py.HLObject) else obj
    if isinstance(value, str):
        data, (file_type, memory_type) = np.array(value, dtype=h5py.string_dtype()), _str_types()
    else:
        data = np.asarray(value, order="C")
        if data.dtype.kind not in _FAST_KINDS or data.dtype.fields is not None:
            h5py.AttributeManager(SimpleNamespace(id=oid))[name] = value  # it reads only its parent's id
            return
        file_type, memory_type = _h5_types(data.dtype)
    key = name.encode()
    if h5py.h5a.exists(oid, key):
        h5py.h5a.delete(oid, key)
    attr = h5py.h5a.create(oid, key, file_type, h5py.h5s.create_simple(data.shape))
    try:
        attr.write(data, mtype=memory_type)
    finally:
        attr.close()


def _read_array(ds: h5py.Dataset, *, as_torch: bool) -> Any:
    """A dataset back as a torch tensor of its original dtype (``as_torch``) or as numpy.

    Dtypes numpy cannot hold (bfloat16, float8) always come back as torch tensors.
    """
    array = np.asarray(ds[()])
    name = ds.attrs.get("torch_dtype")
    if not as_torch and str(name) not in _VIEW_NAMES:  # numpy holds it: no torch needed
        return array
    import torch

    dtype = getattr(torch, str(name)) if name is not None else None
    if dtype in _view_dtypes():
        return torch.from_numpy(np.array(array, order="C", copy=True)).view(dtype)
    if as_torch:
        return torch.from_numpy(np.array(array, order="C", copy=True))
    return array


def _write_state_dict(group: h5py.Group, state_dict: Mapping[str, torch.Tensor]) -> None:
    """One dataset per entry, in the state dict's order (the group tracks creation order)."""
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise UsageError(f"state_dict keys must be strings, got {key!r}")
        if not (is_tensor(value) or isinstance(value, TensorData)):
            raise UsageError(f"state_dict entry '{key}' is a {type(value).__name__}, not a tensor")
        _write_array(group, _escape(key), value)


def _read_state_dict(group: h5py.Group, *, as_torch: bool = True) -> dict[str, torch.Tensor]:
    return {_unescape(name): _read_array(ds, as_torch=as_torch) for name, ds in group.items()}


def _write_nested(group: h5py.Group, arrays: Mapping[str, Any], *, escape: bool) -> None:
    """Arrays by name; nested mappings (and, unless ``escape``, '/' in names) become subgroups."""
    for key, value in arrays.items():
        name = _escape(str(key)) if escape else str(key)
        if isinstance(value, Mapping):
            _write_nested(group.create_group(name, track_order=True), value, escape=escape)
        else:
            _write_array(group, name, value)


def _read_flat(group: h5py.Group, *, escaped: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def visit(g: h5py.Group, prefix: str) -> None:
        for name, obj in g.items():
            key = _unescape(name) if escaped else name
            if isinstance(obj, h5py.Group):
                visit(obj, f"{prefix}{key}/")
            else:
                out[f"{prefix}{key}"] = _read_array(obj, as_torch=False)

    visit(group, "")
    return out


def _json_attr(attrs: h5py.AttributeManager, key: str) -> Any:
    value = attrs.get(key)
    if value is None:
        return {}
    if isinstance(value, bytes):
        value = value.decode()
    return json.loads(value)


def _str_attr(attrs: h5py.AttributeManager, key: str) -> str | None:
    value = attrs.get(key)
    if isinstance(value, bytes):
        value = value.decode()
    return None if value is None else str(value)


def _float_or_none(value: Any) -> float | None:
    if value is None or isinstance(value, str) and value in ("none", "None"):
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _decode_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Metrics back from JSON: the non-finite floats that JSON had to carry as strings become floats again."""
    return {k: float(v) if isinstance(v, str) and v in ("nan", "inf", "-inf") else v for k, v in metrics.items()}


def _plain(value: Any) -> Any:
    if is_tensor(value) and value.numel() == 1:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    return value
