"""The HDF5 codec of the store's files: state dicts and arrays (bit-exact, dtypes numpy lacks as views),
escaped member names, attrs."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import h5py
import numpy as np

from landscape.errors import UsageError
from landscape.jsonable import is_tensor

if TYPE_CHECKING:
    import torch

STATE_GROUP = "state_dict"
EXTRA_GROUP = "extra"
_VIEW_NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


@functools.cache
def _view_dtypes() -> dict[torch.dtype, torch.dtype]:
    """torch dtypes numpy cannot hold: stored bit-exactly as same-width integers, tagged with the torch dtype."""
    import torch

    return {torch.bfloat16: torch.int16,
            **{getattr(torch, n): torch.uint8 for n in _VIEW_NAMES[1:] if hasattr(torch, n)}}


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
    """``value`` (a tensor or an array) as the dataset ``name``; a tensor's dtype is kept in its attr
    ``torch_dtype`` (a dtype numpy lacks is stored as the same-width integers, :func:`_view_dtypes`)."""
    if is_tensor(value):
        import torch

        tensor = value.detach().cpu()
        if tensor.is_sparse or tensor.layout != torch.strided:
            raise UsageError(f"cannot store '{name}': only dense tensors are supported")
        torch_dtype = str(tensor.dtype).removeprefix("torch.")
        view = _view_dtypes().get(tensor.dtype)
        if view is not None:
            tensor = tensor.contiguous().view(view)
        group.create_dataset(name, data=tensor.contiguous().numpy()).attrs["torch_dtype"] = torch_dtype
        return
    array = np.asarray(value)
    if array.dtype == object:
        raise UsageError(f"cannot store '{name}': {type(value).__name__} is not a numeric array")
    group.create_dataset(name, data=array)


def _read_array(ds: h5py.Dataset, *, as_torch: bool) -> Any:
    """A dataset back as a torch tensor of its original dtype (``as_torch``) or as numpy; dtypes numpy cannot
    hold (bfloat16, float8) always come back as torch tensors."""
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
        if not is_tensor(value):
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
