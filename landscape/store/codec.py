"""The HDF5 codec of the store's files: state dicts and arrays (bit-exact, dtypes numpy lacks as views),
escaped member names, attrs, the atomic HDF5 writer."""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import h5py
import numpy as np

from landscape.atomic import atomic_write_hdf5, commit
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


def _write_h5_atomic(final: Path, write: Callable[[h5py.File], None]) -> str:
    """Write an HDF5 file through ``write(f)`` atomically (:func:`landscape.atomic.atomic_write_hdf5`: a refused
    write is a :class:`landscape.errors.WriteError` and ``final`` is as it was); return its sha256 (read back
    from ``final``, which nothing else writes: the caller holds the run)."""
    atomic_write_hdf5(final, lambda f, check: write(f), track_order=True)
    return sha256_file(final)


class PreparedFile:
    """A checkpoint file made ahead of its data (:meth:`landscape.store.Run.prepare_checkpoint`): a temporary file
    beside the run's checkpoints (:func:`landscape.atomic.temp_beside`), held open, holding the groups and datasets
    a :class:`Plan` recorded. :meth:`commit` fills it with a checkpoint of that very layout and renames it into
    place; :meth:`discard` removes it."""

    def __init__(self, tmp: Path, file: h5py.File, plan: Plan) -> None:
        self.tmp, self.file, self.plan = tmp, file, plan

    def commit(self, final: Path, attrs: Mapping[str, Any], body: Callable[[h5py.File | None, Plan], None]) -> str | None:
        """The file's attrs, then ``body``'s arrays (the same writing code that prepared it, :meth:`Plan.check`),
        made durable under ``final``: its sha256. None (the file discarded, nothing written) when the checkpoint
        has another layout; any error also discards it."""
        try:
            self.plan.check(lambda group: body(group, self.plan))
        except PlanMismatch:
            self.discard()
            return None
        except BaseException:
            self.discard()
            raise
        try:
            for key, value in attrs.items():
                _set_attr(self.file, key, value)
            self.plan.write()
            self.file.close()
            sha = sha256_file(self.tmp)
            commit(self.tmp, final)
        except BaseException:
            self.discard()
            raise
        return sha

    def discard(self) -> None:
        """Close and remove the file (idempotent)."""
        with contextlib.suppress(Exception):
            self.file.close()
        self.tmp.unlink(missing_ok=True)


def _prepare_h5(tmp: Path, body: Callable[[h5py.File, Plan], None]) -> PreparedFile | None:
    """The objects ``body`` makes, in a new HDF5 file at ``tmp``, without their data; None (``tmp`` removed)
    when some array cannot be written that way."""
    plan = Plan()
    try:
        f = h5py.File(tmp, "w", track_order=True, locking=False)  # a private temp file
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    prepared = PreparedFile(tmp, f, plan)
    try:
        body(f, plan)
    except _NotPlannable:
        prepared.discard()
        return None
    except BaseException:
        prepared.discard()
        raise
    return prepared


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


def _write_array(group: h5py.Group | None, name: str, value: Any, plan: Plan | None = None) -> None:
    if isinstance(value, TensorData):
        _create_dataset(group, name, value.array, value.dtype, plan)
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
        _create_dataset(group, name, tensor.contiguous().numpy(), torch_dtype, plan)
        return
    array = np.asarray(value)
    if array.dtype == object:
        raise UsageError(f"cannot store '{name}': {type(value).__name__} is not a numeric array")
    _create_dataset(group, name, array, None, plan)


# A checkpoint holds a dataset per tensor (and an attr on each): h5py's high-level calls (``create_dataset``,
# ``attrs[...] =``) spend more time in Python checking options the store never uses than HDF5 spends creating the
# object. :func:`_create_dataset` and :func:`_set_attr` make exactly what those calls make, with the same
# low-level calls and property lists (tests/test_store_codec.py compares the two object by object), in 40% less
# time: a LeNet checkpoint with its optimizer state 2.4 -> 1.5 ms. Anything else goes through the high-level call.
_FAST_KINDS = frozenset("biufc")  # bool, integers, floats, complex


def _fast(dtype: np.dtype) -> bool:
    """Whether the low-level calls write this dtype (numeric, no fields); others go through h5py's own."""
    return dtype.kind in _FAST_KINDS and dtype.fields is None


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


def _create_dataset(group: h5py.Group | None, name: str, array: np.ndarray, torch_dtype: str | None = None,
                    plan: Plan | None = None) -> None:
    """``group.create_dataset(name, data=array)`` (a '/' in ``name`` makes the groups on its way, as there), with
    the attr ``torch_dtype`` when given; with a ``plan``, made without its data (its preparing pass) or its data
    written into the dataset the plan made for it (its filling pass, ``group`` None)."""
    array = np.asarray(array, order="C")
    if plan is not None and plan.filling:
        plan.fill(("dataset", name, array.dtype.str, array.shape, torch_dtype), array)
        return
    if not _fast(array.dtype):
        if plan is not None:
            raise _NotPlannable(f"'{name}' is not numeric")
        dataset: Any = group.create_dataset(name, data=array)
    else:
        parent, _, leaf = name.rpartition("/")
        dataset = h5py.h5d.create((group.require_group(parent) if parent else group).id, leaf.encode(),
                                  _h5_types(array.dtype)[0], h5py.h5s.create_simple(array.shape),
                                  dcpl=_dataset_plist())
        if plan is None:
            dataset.write(h5py.h5s.ALL, h5py.h5s.ALL, array)
        else:
            plan.made(("dataset", name, array.dtype.str, array.shape, torch_dtype), dataset)
    if torch_dtype is not None:
        _set_attr(dataset, "torch_dtype", torch_dtype)


class _NotPlannable(Exception):
    """A checkpoint whose file cannot be made ahead of its data (an array h5py's own call writes)."""


class Plan:
    """A checkpoint file's objects made ahead of their data, then filled (``Run.prepare_checkpoint``): the same
    writing code runs twice, first preparing (groups and datasets created, each in the order and with the names,
    dtypes, shapes and attrs a plain write gives it, each recorded as an event by :meth:`made`), then filling
    (:meth:`check`) with the next checkpoint's arrays (``group`` None: nothing is created; each event must be the
    recorded one, in turn, and each array is written into its dataset by :meth:`write`). A checkpoint of another
    layout is a :class:`PlanMismatch` before anything is written."""

    def __init__(self) -> None:
        self.events: list[tuple] = []  # ("group", name), ("end",), ("dataset", name, dtype, shape, torch_dtype)
        self.datasets: list[Any] = []  # the low-level ids of the datasets, in order
        self.filling = False
        self._at = 0
        self._writes: list[tuple[Any, np.ndarray]] = []

    def made(self, event: tuple, dataset: Any = None) -> None:
        self.events.append(event)
        if dataset is not None:
            self.datasets.append(dataset)

    def fill(self, event: tuple, array: np.ndarray | None = None) -> None:
        if self._at >= len(self.events) or self.events[self._at] != event:
            there = self.events[self._at] if self._at < len(self.events) else "nothing more"
            raise PlanMismatch(f"the prepared file has {there} where the checkpoint has {event}")
        self._at += 1
        if array is not None:
            self._writes.append((self.datasets[len(self._writes)], array))

    def check(self, write: Callable[[None], None]) -> None:
        """Walk the writing code in filling mode: raise PlanMismatch unless it makes exactly the recorded objects."""
        self.filling, self._at, self._writes = True, 0, []
        write(None)
        if self._at != len(self.events):
            raise PlanMismatch(f"the prepared file has {len(self.events) - self._at} more objects than the checkpoint")

    def write(self) -> None:
        """Write the arrays :meth:`check` matched into their datasets."""
        for dataset, array in self._writes:
            dataset.write(h5py.h5s.ALL, h5py.h5s.ALL, array)
        self._writes = []


class PlanMismatch(Exception):
    """A checkpoint whose layout is not the one its file was prepared for."""


def _subgroup(group: h5py.Group | None, name: str, plan: Plan | None) -> h5py.Group | None:
    """``group.create_group(name, track_order=True)``, recorded by (or checked against) a plan."""
    if plan is not None and plan.filling:
        plan.fill(("group", name))
        return None
    if plan is not None:
        plan.made(("group", name))
    return group.create_group(name, track_order=True)


def _end_group(plan: Plan | None) -> None:
    if plan is not None:
        (plan.fill if plan.filling else plan.made)(("end",))


def _set_attr(obj: Any, name: str, value: Any) -> None:
    """``obj.attrs[name] = value`` on a new object (``obj``: an h5py object or its low-level id) for a ``str``, a
    number or a numeric array; anything else through h5py's own call."""
    oid = obj.id if isinstance(obj, h5py.HLObject) else obj
    if isinstance(value, str):
        data, (file_type, memory_type) = np.array(value, dtype=h5py.string_dtype()), _str_types()
    else:
        data = np.asarray(value, order="C")
        if not _fast(data.dtype):
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


def _write_state_dict(group: h5py.Group | None, state_dict: Mapping[str, torch.Tensor], plan: Plan | None = None) -> None:
    """One dataset per entry, in the state dict's order (the group tracks creation order)."""
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise UsageError(f"state_dict keys must be strings, got {key!r}")
        if not (is_tensor(value) or isinstance(value, TensorData)):
            raise UsageError(f"state_dict entry '{key}' is a {type(value).__name__}, not a tensor")
        _write_array(group, _escape(key), value, plan)


def _read_state_dict(group: h5py.Group, *, as_torch: bool = True) -> dict[str, torch.Tensor]:
    return {_unescape(name): _read_array(ds, as_torch=as_torch) for name, ds in group.items()}


def _write_nested(group: h5py.Group | None, arrays: Mapping[str, Any], *, escape: bool, plan: Plan | None = None) -> None:
    """Arrays by name; nested mappings (and, unless ``escape``, '/' in names) become subgroups."""
    for key, value in arrays.items():
        name = _escape(str(key)) if escape else str(key)
        if isinstance(value, Mapping):
            _write_nested(_subgroup(group, name, plan), value, escape=escape, plan=plan)
            _end_group(plan)
        else:
            _write_array(group, name, value, plan)


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
