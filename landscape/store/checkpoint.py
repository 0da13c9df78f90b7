"""One checkpoint file: its records (:class:`CheckpointInfo`, :class:`Checkpoint`), reading it back, and the
strict check of a state dict against a model."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from landscape.errors import CheckpointError, IncompatibleError
from landscape.hashing import InputRef, sha256_file
from landscape.store.codec import (
    EXTRA_GROUP,
    STATE_GROUP,
    _decode_metrics,
    _float_or_none,
    _json_attr,
    _open_h5,
    _read_flat,
    _read_state_dict,
    _str_attr,
)
from landscape.store.manifest import _one_line

if TYPE_CHECKING:
    import torch
    from torch import nn

@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint as listed in a run manifest (no tensors loaded)."""

    path: Path
    step: int
    epoch: float
    epsilon: float | None
    metrics: dict[str, Any]
    sha256: str | None = None


@dataclass
class Checkpoint:
    """A checkpoint file read back: tensors with their original dtypes and shapes, plus metadata."""

    path: Path
    ref: str
    state_dict: dict[str, torch.Tensor]
    step: int
    epoch: float
    epsilon: float | None
    metrics: dict[str, Any]
    model_spec: dict[str, Any]
    data_spec: dict[str, Any]
    run: str | None
    extra: dict[str, np.ndarray]
    sha256: str
    attrs: dict[str, Any] = field(default_factory=dict)
    code_version: str | None = None

    def build_model(self) -> nn.Module:
        """Rebuild the model from its spec and load these weights (strict)."""
        from landscape.models import model_from_spec

        model = model_from_spec(self.model_spec)
        check_state_dict(model, self.state_dict, source=str(self.path))
        model.load_state_dict(self.state_dict, strict=True)
        return model

    def input_ref(self) -> InputRef:
        return InputRef(ref=self.ref, path=str(self.path), sha256=self.sha256)


def load_checkpoint(path: str | os.PathLike, *, ref: str | None = None, tensors: bool = True) -> Checkpoint:
    """Read one checkpoint file. A missing, truncated, corrupt or foreign file is a one-line CheckpointError.

    ``tensors=False`` gives the state dict as numpy arrays, so inspecting a checkpoint (``store show``) does not
    import torch; dtypes numpy cannot hold (bfloat16, float8) still come back as torch tensors."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file not found: {path}")
    try:
        with _open_h5(path) as f:
            if STATE_GROUP not in f:
                raise CheckpointError(f"{path} is not a landscape checkpoint (no '{STATE_GROUP}' group)")
            a = f.attrs
            state_dict = _read_state_dict(f[STATE_GROUP], as_torch=tensors)
            extra = _read_flat(f[EXTRA_GROUP], escaped=False) if EXTRA_GROUP in f else {}
            ckpt = Checkpoint(
                path=path, ref=ref if ref is not None else str(path), state_dict=state_dict,
                step=int(a.get("step", 0)), epoch=float(a.get("epoch", 0.0)),
                epsilon=_float_or_none(a.get("epsilon")), metrics=_decode_metrics(_json_attr(a, "metrics")),
                model_spec=_json_attr(a, "model_spec"),
                data_spec=_json_attr(a, "data_spec"), run=_str_attr(a, "run"), extra=extra, sha256="",
                attrs=_json_attr(a, "attrs"), code_version=_str_attr(a, "code_version"),
            )
    except CheckpointError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {_one_line(exc)} (truncated or corrupt file?)") from None
    ckpt.sha256 = sha256_file(path)
    return ckpt


def load_verified(path: str | os.PathLike, *, ref: str | None = None, sha256: str | None = None,
                  tensors: bool = True) -> Checkpoint:
    """:func:`load_checkpoint`, and a CheckpointError when the file's sha256 is not ``sha256`` (what its run's
    manifest recorded when it was written; None: a file outside a run, nothing to check against)."""
    ckpt = load_checkpoint(path, ref=ref, tensors=tensors)
    if sha256 and sha256 != ckpt.sha256:
        raise CheckpointError(
            f"{ckpt.path} changed after it was written (sha256 {ckpt.sha256[:12]} != manifest {sha256[:12]})"
        )
    return ckpt


def check_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor], *, source: str) -> None:
    """Raise IncompatibleError naming the first key that is missing, unexpected, of the wrong shape or of the
    wrong kind of dtype (integer weights for a floating-point tensor would be cast without a word by
    ``load_state_dict``; precision within a kind, e.g. float64 into float32, is converted on load): the one
    check of :func:`landscape.params.first_mismatch`, phrased for a file loaded into a model."""
    from landscape.params import dtype_kind, first_mismatch

    expected = model.state_dict()
    m = first_mismatch(expected, state_dict, dtypes=True)
    if m is None:
        return
    spec = getattr(model, "landscape_spec", None)
    what = f"model '{spec['name']}'" if isinstance(spec, Mapping) and "name" in spec else "the model"
    if m.kind == "only_a":
        raise IncompatibleError(
            f"{source}: missing tensor '{m.name}' that {what} expects "
            f"({len(state_dict)} tensors in the file, {len(expected)} in the model)"
        )
    if m.kind == "only_b":
        raise IncompatibleError(f"{source}: unexpected tensor '{m.name}' that {what} does not have")
    if m.kind == "shape":
        raise IncompatibleError(f"{source}: tensor '{m.name}' has shape {m.b} but {what} expects {m.a}")
    have, want = dtype_kind(m.b), dtype_kind(m.a)
    raise IncompatibleError(
        f"{source}: tensor '{m.name}' is {str(m.b).removeprefix('torch.')} ({have}) but "
        f"{what} expects {str(m.a).removeprefix('torch.')} ({want}); convert the weights first"
    )


def _info_from_file(path: Path) -> CheckpointInfo | None:
    """Metadata of a complete checkpoint file not (yet) in the manifest; None when it cannot be read."""
    try:
        with _open_h5(path) as f:
            if STATE_GROUP not in f:
                return None
            a = f.attrs
            return CheckpointInfo(
                path=path, step=int(a["step"]), epoch=float(a["epoch"]), epsilon=_float_or_none(a.get("epsilon")),
                metrics=_decode_metrics(_json_attr(a, "metrics")), sha256=None,
            )
    except (OSError, KeyError, ValueError, TypeError):
        return None
