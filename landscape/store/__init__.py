"""Checkpoint store: run directories of HDF5 checkpoints, references to them, and safe import.

Layout::

    <root>/<run>/manifest.json       config, seeds, lineage, code_version, model_spec, data_spec, created,
                                     checkpoints: [{step, epoch, epsilon, metrics, file, sha256}, ...]
    <root>/<run>/step-000120.h5      one file per checkpoint (group ``state_dict``, group ``extra``, attrs)
    <root>/<run>/arrays.h5           run-level arrays (pruning masks, per-step metric tables, ...)

Every file is written to a hidden temporary file in the same directory and renamed over its final name
(:func:`landscape.atomic.atomic_write`), so a process killed mid-write never leaves a half-written
checkpoint or manifest under a final name; nothing lists or loads the stale ``.*.tmp`` files it may leave,
and :meth:`Store.open_run` sweeps them. Run directories are created with an atomic ``mkdir``, so several
processes may write *different* runs into one root at once.

One writer per run. Every write (creating a run, a checkpoint, a run array, a manifest field) holds an
exclusive ``fcntl.flock`` on ``<run>/.lock``; a second process that tries to write the same run gets
:class:`RunBusyError` (one line, exit 1) instead of interleaving its files with the first one's. The run
returned by :meth:`Store.create_run` or :meth:`Store.open_run` keeps the lock until :meth:`Run.close` (or
the end of a ``with`` block, or of the process), so a training run excludes other writers from its first
file to its last. The lock is per process and reentrant: threads of one process are not told apart.

Manifests are checked against one schema (:func:`check_manifest`) whenever they are read: a damaged one
is a one-line :class:`~landscape.errors.CheckpointError` naming the file and the field at fault.

torch is imported only where tensors are made (inside functions; annotations under ``TYPE_CHECKING``): listing
runs and reading manifests (``landscape store ls``) need none.

A checkpoint reference (:class:`landscape.refs.Ref`) is ``PATH.h5`` (a file; relative paths are tried against
the working directory, then the store root) or ``RUN[@SELECTOR]`` with ``@init`` (smallest step), ``@last``
(the default), ``@step=N`` or ``@epoch=E``; :meth:`Store.load` checks a run's checkpoint against the sha256 its
manifest recorded (:func:`load_verified`).
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
