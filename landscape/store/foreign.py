"""Import of foreign weights (``.pt``/``.pth`` through ``torch.load(weights_only=True)`` only,
``.safetensors``) as step 0 of a new run."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import stat
import struct
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from landscape.errors import CheckpointError, NonFiniteError, UnsafeFileError, UsageError
from landscape.hashing import sha256_file
from landscape.refs import check_run_name
from landscape.store.checkpoint import check_state_dict
from landscape.store.manifest import _one_line

if TYPE_CHECKING:
    import torch

    from landscape.store.core import Store

WRAPPER_KEYS = ("state_dict", "model_state_dict", "module_state_dict", "model")  # module_: Opacus save_checkpoint


def import_checkpoint(store: Store, file: str | os.PathLike, *, model_spec: Mapping[str, Any],
                      data_spec: Mapping[str, Any], run: str, privacy: Mapping[str, Any] | None = None,
                      epsilon: float | None = None) -> Path:
    """Import a foreign state dict as step 0 of a new run; return the checkpoint path. Wrapping dicts and key
    prefixes are undone, and the tensors checked against the model ``model_spec`` builds. ``privacy``: the run's
    ``manifest["privacy"]`` (default: unknown ancestors); ``epsilon``: the declared one."""
    from landscape.models import model_from_spec
    from landscape.privacy import PrivacyHistory

    file = Path(file)
    check_run_name(run)
    check_regular_file(file)
    raw = _read_foreign(file)
    model = model_from_spec(dict(model_spec))
    state_dict = _strip_prefixes(_unwrap_state_dict(raw, file), set(model.state_dict()))
    check_state_dict(model, state_dict, source=str(file))
    check_finite(state_dict, source=str(file))
    state_dict = {key: state_dict[key] for key in model.state_dict()}  # the model's order (safetensors sorts keys)
    full_spec = dict(getattr(model, "landscape_spec", None) or model_spec)
    sha = sha256_file(file)
    fmt = "safetensors" if file.suffix == ".safetensors" else "torch"
    privacy = dict(privacy) if privacy is not None else {"accounted": False,
                                                         **PrivacyHistory(unknown=True).manifest_fields()}
    origin = str(file.resolve())
    new = store.create_run(run, config={"imported_from": origin, "format": fmt}, seeds={},
                           lineage={"imported_from": origin, "sha256": sha}, model_spec=full_spec,
                           data_spec=dict(data_spec), extra={"privacy": privacy})
    with new:
        try:
            return new.save_checkpoint(state_dict, step=0, epoch=0.0, epsilon=epsilon,
                                       attrs={"imported_from": origin})
        except BaseException:
            shutil.rmtree(new.path, ignore_errors=True)
            raise


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_regular_file(file: Path) -> None:
    """A one-line CheckpointError unless ``file`` is a regular file (a link: what it points to), judged without
    opening it (opening a named pipe waits for a writer). Another OSError (a name too long, a permission) is
    raised as it is."""
    try:
        mode = os.stat(file).st_mode
    except FileNotFoundError:
        link = " (a link to a missing file)" if os.path.islink(file) else ""
        raise CheckpointError(f"file not found: {file}{link}") from None
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise CheckpointError(f"{file} is {kind}, not a regular file: import reads a .pt, .pth or .safetensors file")


def check_finite(state_dict: Mapping[str, torch.Tensor], *, source: str) -> None:
    """A one-line NonFiniteError naming the first floating-point tensor with a NaN or an infinity: no analysis
    can use such weights (a diverged or damaged model), so none is imported."""
    import torch

    for key, value in state_dict.items():
        if (value.is_floating_point() or value.is_complex()) and value.numel():
            bad = int((~torch.isfinite(value)).sum())
            if bad:
                raise NonFiniteError(
                    f"{source}: tensor '{key}' has {bad} of {value.numel()} values NaN or infinite (a diverged or "
                    "damaged model); nothing imported")


def _read_foreign(file: Path) -> Any:
    suffix = file.suffix.lower()
    if suffix in (".pt", ".pth"):
        try:
            import torch

            with warnings.catch_warnings():  # torch warns about pickle protocols before refusing; the error says it
                warnings.simplefilter("ignore")
                return torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            if not looks_like_torch_file(file):
                raise CheckpointError(
                    f"cannot read {file} as a PyTorch file: not a torch.save() file (neither a zip archive nor a "
                    "binary pickle); is it the right file?"
                ) from None
            culprit = re.search(r"GLOBAL ([\w.]+)", str(exc))
            detail = f" (it references {culprit.group(1)})" if culprit else ""
            raise UnsafeFileError(
                f"refusing {file}: torch.load(weights_only=True) cannot load it{detail}, so unpickling it could "
                "run code; re-save the weights as a plain state dict (torch.save(model.state_dict())) or .safetensors"
            ) from None
        except (OSError, RuntimeError, ValueError, EOFError, KeyError, IndexError, struct.error) as exc:  # damaged
            raise CheckpointError(f"cannot read {file} as a PyTorch file: {_one_line(exc)}") from None
    if suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(file), device="cpu")
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"cannot read {file} as safetensors: {_one_line(exc)}") from None
    raise UsageError(f"cannot import {file}: expected a .pt, .pth or .safetensors file")


def looks_like_torch_file(file: Path) -> bool:
    """torch.save writes a zip archive (``PK``) or, in the legacy format, a binary pickle (PROTO ``0x80``)."""
    with open(file, "rb") as f:
        head = f.read(2)
    return head.startswith(b"PK") or head[:1] == b"\x80"


def _unwrap_state_dict(obj: Any, file: Path) -> dict[str, torch.Tensor]:
    if isinstance(obj, Mapping) and not _all_tensors(obj):
        for key in WRAPPER_KEYS:
            if isinstance(obj.get(key), Mapping) and _all_tensors(obj[key]):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not obj or not _all_tensors(obj):
        keys = ", ".join(map(str, list(obj)[:8])) if isinstance(obj, Mapping) else type(obj).__name__
        raise CheckpointError(
            f"{file} holds no state dict (found: {keys}); expected tensors by name, possibly under "
            f"{'/'.join(WRAPPER_KEYS)}"
        )
    return {str(k): v for k, v in obj.items()}


def _all_tensors(d: Mapping) -> bool:
    import torch

    return all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in d.items())


def _strip_prefixes(state_dict: dict[str, torch.Tensor], wanted: set[str]) -> dict[str, torch.Tensor]:
    from landscape.params import WRAPPER_PREFIXES

    while set(state_dict) != wanted:
        for prefix in WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in state_dict):
                state_dict = {k[len(prefix):]: v for k, v in state_dict.items()}
                break
        else:
            break
    return state_dict
