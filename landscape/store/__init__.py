"""Checkpoint store: run directories of HDF5 checkpoints, references to them, and safe import.

Layout::

    <root>/<run>/manifest.json       config, seeds, lineage, code_version, model_spec, data_spec, created,
                                     checkpoints: [{step, epoch, epsilon, metrics, file, sha256}, ...]
    <root>/<run>/step-000120.h5      one file per checkpoint (group ``state_dict``, group ``extra``, attrs)
    <root>/<run>/arrays.h5           run-level arrays (pruning masks, per-step metric tables, ...)

Every file is written atomically (:func:`landscape.atomic.atomic_write`); every write holds the run's
``flock`` (a second writer gets :class:`RunBusyError`), kept by an open :class:`Run` until :meth:`Run.close`.
Manifests are checked against one schema (:func:`check_manifest`) whenever read, and checkpoints against their
recorded sha256 (:func:`load_verified`). Listing runs and reading manifests import no torch.
The layout, locking and references in detail: docs/store.md.
"""

from landscape.refs import check_run_name
from landscape.store._locks import LOCK, RunBusyError
from landscape.store.checkpoint import (
    Checkpoint,
    CheckpointInfo,
    check_state_dict,
    load_checkpoint,
    load_verified,
)
from landscape.store.codec import EXTRA_GROUP, STATE_GROUP
from landscape.store.core import DamagedRunWarning, Run, Store
from landscape.store.foreign import (
    WRAPPER_KEYS,
    check_finite,
    check_regular_file,
    import_checkpoint,
    looks_like_torch_file,
)
from landscape.store.manifest import (
    ARRAYS,
    CHECKPOINT_FORMAT,
    MANIFEST,
    MANIFEST_FORMAT,
    MAX_JSON_DEPTH,
    check_manifest,
)

__all__ = [
    "ARRAYS", "CHECKPOINT_FORMAT", "Checkpoint", "CheckpointInfo", "DamagedRunWarning", "EXTRA_GROUP", "LOCK",
    "MANIFEST", "MANIFEST_FORMAT", "MAX_JSON_DEPTH", "Run", "RunBusyError", "STATE_GROUP", "Store",
    "WRAPPER_KEYS", "check_finite", "check_manifest", "check_regular_file", "check_run_name",
    "check_state_dict", "import_checkpoint", "load_checkpoint", "load_verified", "looks_like_torch_file",
]
