"""The shared HDF5 result schema: one self-describing file per analysis.

Every result file carries root attrs ``kind``, ``created``, ``landscape_version``, ``torch_version``,
``inputs`` (JSON list of ``{"ref", "path", "sha256"}``) and ``params`` (JSON of the analysis options),
plus analysis-specific scalar attrs; datasets are named for what they hold (``alpha``, ``train_loss``).
Array keys may contain ``/`` to form groups. Files are written to a temporary name and renamed, so a
killed process never leaves a half-written result.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from landscape.errors import ResultError
from landscape.runtime import code_version

_RESERVED = ("kind", "created", "landscape_version", "torch_version", "inputs", "params")


@dataclass(frozen=True)
class InputRef:
    """A checkpoint (or other file) a result was computed from, with its content hash."""

    ref: str
    path: str
    sha256: str

    @classmethod
    def of(cls, ref: str, path: str | os.PathLike) -> InputRef:
        return cls(ref=ref, path=str(path), sha256=sha256_file(path))


@dataclass
class Result:
    """A result file read back: its kind, scalar attrs, options, inputs and arrays."""

    path: Path
    kind: str
    attrs: dict[str, Any]
    params: dict[str, Any]
    inputs: list[InputRef]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def to_jsonable(value: Any) -> Any:
    """Convert numpy/torch scalars, arrays, paths and dataclasses to plain JSON types (NaN/inf as strings)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return to_jsonable(value.detach().cpu().numpy())
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, os.PathLike):
        return str(value)
    return value


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


def write_result(
    path: str | os.PathLike,
    kind: str,
    *,
    arrays: Mapping[str, Any],
    attrs: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | Any | None = None,
    inputs: Sequence[InputRef] = (),
) -> Path:
    """Write a result file atomically and return its path.

    ``arrays`` values may be numpy arrays, tensors or lists; ``attrs`` hold scalars (others are stored
    as JSON strings); ``params`` is the analysis configuration (a dataclass or mapping), stored as JSON.
    """
    path = Path(path)
    clash = set(attrs or {}) & set(_RESERVED)
    if clash:
        raise ValueError(f"attrs {sorted(clash)} are reserved by the result schema")
    check_output_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise ResultError(f"cannot write result {path}: {exc.strerror or exc}") from None
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary files
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["kind"] = kind
            f.attrs["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            f.attrs["landscape_version"] = code_version()
            f.attrs["torch_version"] = str(torch.__version__)
            f.attrs["inputs"] = json.dumps([dataclasses.asdict(i) for i in inputs])
            f.attrs["params"] = json.dumps(to_jsonable(params if params is not None else {}))
            for key, value in (attrs or {}).items():
                f.attrs[key] = _attr_value(value)
            for key, value in arrays.items():
                if isinstance(value, torch.Tensor):
                    value = value.detach().cpu().numpy()
                f.create_dataset(key, data=np.asarray(value))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def is_result_file(path: str | os.PathLike) -> bool:
    """True when ``path`` is an HDF5 file carrying the result schema's ``kind`` attribute."""
    try:
        with h5py.File(path, "r") as f:
            return "kind" in f.attrs
    except OSError:
        return False


def check_output_path(path: str | os.PathLike) -> None:
    """Refuse an output path that would replace anything but a result file, or that lies below a file.

    Results are often written next to checkpoints; a mistyped ``-o`` must never destroy a checkpoint.
    """
    path = Path(path)
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ResultError(f"cannot write result {path}: {parent} is a file, not a directory")
            break
    if path.is_dir():
        raise ResultError(f"cannot write result {path}: it is a directory")
    if path.exists() and not is_result_file(path):
        raise ResultError(f"refusing to overwrite {path}: it is not a landscape result file (a checkpoint or other "
                          "data?); choose another output")


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
