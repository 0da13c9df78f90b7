"""Checkpoint store: run directories of HDF5 checkpoints and a manifest each, written atomically under the run's
lock, checked when read and against their sha256 when loaded (docs/store.md)."""

from landscape.refs import check_run_name
from landscape.store._locks import RunBusyError
from landscape.store.checkpoint import (
    Checkpoint,
    CheckpointInfo,
    check_state_dict,
    load_checkpoint,
    load_verified,
)
from landscape.store.core import Run, Store
from landscape.store.foreign import check_regular_file, import_checkpoint, looks_like_torch_file
from landscape.store.manifest import MANIFEST, MANIFEST_FORMAT, MAX_JSON_DEPTH, check_manifest

__all__ = [
    "Checkpoint", "CheckpointInfo", "MANIFEST", "MANIFEST_FORMAT", "MAX_JSON_DEPTH", "Run", "RunBusyError", "Store",
    "check_manifest", "check_regular_file", "check_run_name", "check_state_dict", "import_checkpoint",
    "load_checkpoint", "load_verified", "looks_like_torch_file",
]
