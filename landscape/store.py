"""Checkpoint store: run directories of HDF5 checkpoints, references to them, and safe import.

Layout (DESIGN.md "Checkpoint store")::

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

A checkpoint reference is ``PATH.h5`` (a file; relative paths are tried against the working directory,
then the store root) or ``RUN[@SELECTOR]`` with ``@init`` (smallest step), ``@last`` (the default),
``@step=N`` or ``@epoch=E``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import fnmatch
import functools
import json
import math
import os
import pickle
import re
import secrets
import shutil
import struct
import warnings
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import h5py
import numpy as np

from landscape.atomic import atomic_write, stale_temp_files
from landscape.errors import CheckpointError, IncompatibleError, UnsafeFileError, UsageError
from landscape.results import InputRef, is_tensor, sha256_file, to_jsonable

if TYPE_CHECKING:  # torch is imported where tensors are made: `store ls` needs none (issue 14 item 8)
    import torch
    from torch import nn
from landscape.runtime import code_version

MANIFEST = "manifest.json"
ARRAYS = "arrays.h5"
LOCK = ".lock"
MANIFEST_FORMAT = "landscape-run/1"
CHECKPOINT_FORMAT = "landscape-checkpoint/1"
STATE_GROUP = "state_dict"
EXTRA_GROUP = "extra"
WRAPPER_KEYS = ("state_dict", "model_state_dict", "module_state_dict", "model")  # module_: Opacus save_checkpoint
PREFIXES = ("_module.", "module.")  # Opacus GradSampleModule, then DataParallel/DDP

_RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,+=-]{0,199}")
_CHECKPOINT_FILE = re.compile(r"step-(\d+)\.h5")
_MANIFEST_KEYS = frozenset(
    {"format", "name", "created", "code_version", "config", "seeds", "lineage", "model_spec", "data_spec",
     "checkpoints"}
)
_UMASK = os.umask(0o022)
os.umask(_UMASK)


_VIEW_NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


@functools.cache
def _view_dtypes() -> dict[torch.dtype, torch.dtype]:
    """torch dtypes numpy cannot hold: stored bit-exactly as same-width integers, tagged with the torch dtype."""
    import torch

    return {torch.bfloat16: torch.int16,
            **{getattr(torch, n): torch.uint8 for n in _VIEW_NAMES[1:] if hasattr(torch, n)}}


# ---------------------------------------------------------------------------------------------- records


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


# ------------------------------------------------------------------------------------------- the store


class RunBusyError(CheckpointError):
    """Another process holds a run's write lock (one writer per run)."""


class Store:
    """A directory of runs. Nothing is created on disk until a run is."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    def create_run(
        self,
        name: str | None,
        *,
        config: Mapping[str, Any],
        seeds: Mapping[str, Any],
        lineage: Mapping[str, Any] | None = None,
        model_spec: Mapping[str, Any],
        data_spec: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
    ) -> Run:
        """Create a new run directory with its manifest; ``name=None`` generates a unique name.

        ``extra`` adds further top-level manifest fields (e.g. ``phases``). An existing run name is an
        error: runs are never overwritten. The run comes back holding its write lock (see the module
        docstring); :meth:`Run.close` or a ``with`` block releases it.
        """
        clash = set(extra or {}) & _MANIFEST_KEYS
        if clash:
            raise UsageError(f"manifest fields {sorted(clash)} are set by the store, not through extra=")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"cannot create the store root {self.root}: {exc.strerror or exc}") from None
        lock = None
        if name is None:
            path = self._make_unique_dir()
        else:
            check_run_name(name)
            path = self.root / name
            try:
                path.mkdir()
            except FileExistsError:
                lock = self._reclaim(path)
                if lock is None:
                    raise CheckpointError(
                        f"run '{name}' already exists in {self.root}; choose another --run name "
                        f"(or continue it: train --resume {name})"
                    ) from None
            except OSError as exc:
                raise CheckpointError(f"cannot create run directory {path}: {exc.strerror or exc}") from None
        run = Run(path, {})
        run._acquire(lock)
        manifest = {
            "format": MANIFEST_FORMAT,
            "name": path.name,
            "created": _now(),
            "code_version": code_version(),
            "config": dict(config),
            "seeds": dict(seeds),
            "lineage": dict(lineage) if lineage is not None else None,
            "model_spec": dict(model_spec),
            "data_spec": dict(data_spec),
            **dict(extra or {}),
            "checkpoints": [],
        }
        try:
            check_manifest(to_jsonable(manifest), path / MANIFEST)
            _write_json_atomic(path / MANIFEST, manifest)
            run.manifest = _read_manifest(path / MANIFEST)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            run.close()
            raise
        return run

    def _reclaim(self, path: Path) -> _FileLock | None:
        """The lock of a run directory whose creator was killed before writing its manifest (nothing but
        temporary files in it, which are removed), or None when ``path`` is a run or someone else's."""
        if not path.is_dir() or (path / MANIFEST).exists():
            return None
        try:
            lock = _lock(path, path.name)
        except CheckpointError:
            return None  # its creator is alive and about to write the manifest
        left = [p for p in path.iterdir() if p.name != LOCK]
        if (path / MANIFEST).exists() or any(p.is_dir() or not p.name.endswith(".tmp") for p in left):
            _unlock(lock)
            return None
        for p in left:
            p.unlink(missing_ok=True)
        return lock

    def _make_unique_dir(self) -> Path:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        for _ in range(100):
            path = self.root / f"run-{stamp}-{secrets.token_hex(3)}"
            try:
                path.mkdir()
            except FileExistsError:
                continue
            return path
        raise CheckpointError(f"could not create a unique run directory in {self.root}")

    def run(self, name: str) -> Run:
        """An existing run, for reading; CheckpointError listing the runs there are when it is missing."""
        check_run_name(name)
        path = self.root / name
        if not (path / MANIFEST).is_file():
            raise CheckpointError(f"no run '{name}' in {self.root} ({_available(self.run_names(), 'runs')})")
        return Run(path, _read_manifest(path / MANIFEST))

    def open_run(self, name: str) -> Run:
        """An existing run, for writing (``--resume``): take its lock (:class:`RunBusyError` if another
        process holds it), read its manifest, remove the temporary files killed writers left, and adopt the
        complete checkpoint files a writer killed between rename and manifest update left unrecorded
        (:meth:`Run.adopt_unrecorded`). The run keeps the lock until :meth:`Run.close`.
        """
        check_run_name(name)
        path = self.root / name
        if not (path / MANIFEST).is_file():
            raise CheckpointError(f"no run '{name}' in {self.root} ({_available(self.run_names(), 'runs')})")
        run = Run(path, {})
        run._acquire()
        try:
            run.manifest = _read_manifest(path / MANIFEST)
            run.sweep_temporary_files()
            run.adopt_unrecorded()
        except BaseException:
            run.close()
            raise
        return run

    def run_names(self) -> list[str]:
        """Names of the complete runs (directories with a manifest), sorted."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir()
            if _is_run_name(p.name) and (p / MANIFEST).is_file()
        )

    def scan(self, pattern: str = "*") -> tuple[list[Run], dict[str, str]]:
        """Runs whose name matches a shell glob, and the damaged ones apart: ``(runs, {name: one-line error})``.

        A run is damaged when its manifest is not valid (:func:`check_manifest`) or a checkpoint it lists
        is missing; one damaged run never hides the others.
        """
        runs: list[Run] = []
        broken: dict[str, str] = {}
        for name in self.run_names():
            if not fnmatch.fnmatchcase(name, pattern):
                continue
            try:
                run = self.run(name)
                run.checkpoints()
            except CheckpointError as exc:
                broken[name] = str(exc)
                continue
            runs.append(run)
        return runs, broken

    def runs(self) -> list[Run]:
        """Every readable run, sorted by name (damaged ones are skipped with a warning; see :meth:`scan`)."""
        return self.runs_matching("*")

    def runs_matching(self, pattern: str) -> list[Run]:
        """Runs whose name matches a shell glob (``dp-*``), sorted by name; each damaged run is skipped with
        a one-line :class:`DamagedRunWarning`."""
        runs, broken = self.scan(pattern)
        for message in broken.values():
            warnings.warn(f"skipping a damaged run: {message}", DamagedRunWarning, stacklevel=2)
        return runs

    def resolve(self, ref: str) -> Path:
        """The checkpoint file a reference names (see the module docstring for the syntax)."""
        return self._resolve(ref)[0]

    def _resolve(self, ref: str) -> tuple[Path, CheckpointInfo | None]:
        ref = str(ref).strip()
        if not ref:
            raise UsageError("empty checkpoint reference; expected PATH.h5 or RUN[@init|@last|@step=N|@epoch=E]")
        if ref.endswith(".h5") or os.sep in ref or "/" in ref:
            if not ref.endswith(".h5"):
                raise UsageError(
                    f"bad checkpoint reference '{ref}': expected PATH.h5 or RUN[@init|@last|@step=N|@epoch=E]"
                )
            for candidate in (Path(ref), self.root / ref):
                if candidate.is_file():
                    return candidate, None
            raise CheckpointError(f"checkpoint file not found: {ref} (also looked in {self.root})")
        name, at, selector = ref.partition("@")
        if at and not selector:
            raise UsageError(f"bad checkpoint reference '{ref}': after '@' give init, last, step=N or epoch=E")
        run = self.run(name)
        info = run.select(selector or "last")
        return info.path, info

    def load(self, ref: str, *, tensors: bool = True) -> Checkpoint:
        """Load the checkpoint a reference names; files listed in a manifest are checked against its sha256.
        ``tensors=False``: the state dict as numpy arrays (no torch import; see :func:`load_checkpoint`)."""
        path, info = self._resolve(ref)
        ckpt = load_checkpoint(path, ref=str(ref), tensors=tensors)
        if info is not None and info.sha256 and info.sha256 != ckpt.sha256:
            raise CheckpointError(
                f"{path} changed after it was written (sha256 {ckpt.sha256[:12]} != manifest {info.sha256[:12]})"
            )
        return ckpt


class DamagedRunWarning(UserWarning):
    """A run was skipped because its manifest is damaged or lists a missing checkpoint."""


class Run:
    """One run directory: read it freely; every write holds the run's lock (module docstring)."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = Path(path)
        self.name = self.path.name
        self.manifest = manifest
        self._hold: list[Any] = [None, 0]  # [the process-wide lock entry, how many holds this object has]
        self._finalizer: weakref.finalize | None = None

    def __repr__(self) -> str:
        return f"Run({self.name!r}, checkpoints={len(self.manifest.get('checkpoints', []))})"

    # -- the write lock -----------------------------------------------------------------------------

    @property
    def _holds(self) -> int:
        return self._hold[1]

    def _acquire(self, lock: _FileLock | None = None) -> None:
        """Take one hold of the run's lock (``lock``: one already taken for this run)."""
        lock = lock if lock is not None else _lock(self.path, self.name)
        if self._hold[1] > 0 and self._hold[0] is not lock:
            _release_holds(self._hold)  # the directory was made again since: the old hold is meaningless
        self._hold[0] = lock
        self._hold[1] += 1
        if self._finalizer is None:  # an object dropped without close() still lets go of its lock
            self._finalizer = weakref.finalize(self, _release_holds, self._hold)

    def _release(self) -> None:
        if self._hold[1] > 0:
            self._hold[1] -= 1
            _unlock(self._hold[0])

    def close(self) -> None:
        """Release the write lock this object holds (a no-op for a run opened for reading)."""
        _release_holds(self._hold)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _writing(self):
        """Hold the lock for one write and re-read the manifest under it (another writer may have been first)."""
        self._acquire()
        try:
            if (self.path / MANIFEST).exists():
                self.manifest = _read_manifest(self.path / MANIFEST)
            self.manifest.setdefault("checkpoints", [])
            yield
        finally:
            self._release()

    def sweep_temporary_files(self) -> list[Path]:
        """Remove the temporary files of writes killed mid-way (under the lock no write of ours is live)."""
        with self._writing():
            stale = stale_temp_files(self.path, lambda final: final in (MANIFEST, ARRAYS)
                                     or _CHECKPOINT_FILE.fullmatch(final) is not None)
            for path in stale:
                path.unlink(missing_ok=True)
        return stale

    def adopt_unrecorded(self) -> list[int]:
        """Record the complete checkpoint files of this run that its manifest does not list, with their sha256.

        A writer killed after renaming ``step-N.h5`` into place but before updating the manifest leaves
        such a file; it is adopted only when it loads completely and its own attrs name this run and step N
        (anything else is left alone and stays unlisted). Returns the adopted steps.
        """
        with self._writing():
            listed = {int(e["step"]) for e in self.manifest["checkpoints"]}
            entries = []
            for path in sorted(self.path.glob("step-*.h5")):
                match = _CHECKPOINT_FILE.fullmatch(path.name)
                if match is None or int(match.group(1)) in listed:
                    continue
                try:
                    ckpt = load_checkpoint(path)
                except CheckpointError:
                    continue
                if ckpt.run != self.name or ckpt.step != int(match.group(1)):
                    continue
                entries.append({"step": ckpt.step, "epoch": ckpt.epoch, "epsilon": ckpt.epsilon,
                                "metrics": ckpt.metrics, "file": path.name, "sha256": ckpt.sha256})
            if entries:
                self.manifest["checkpoints"] = sorted([*self.manifest["checkpoints"], *entries],
                                                      key=lambda e: int(e["step"]))
                _write_json_atomic(self.path / MANIFEST, self.manifest)
        return [e["step"] for e in entries]

    # -- checkpoints --------------------------------------------------------------------------------

    def save_checkpoint(
        self,
        state_dict: Mapping[str, torch.Tensor],
        *,
        step: int,
        epoch: float,
        epsilon: float | None = None,
        metrics: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write ``step-NNNNNN.h5`` atomically, then record it in the manifest (also atomically).

        ``extra`` holds arrays to keep beside the weights (RNG states, optimizer buffers, sampler
        position); names may nest with ``/`` or as nested mappings. ``attrs`` are further JSON-able
        metadata, returned as :attr:`Checkpoint.attrs`. Saving a step that exists replaces it.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise UsageError(f"checkpoint step must be a non-negative integer, got {step!r}")
        step = int(step)
        epoch = float(epoch)
        epsilon = None if epsilon is None else float(epsilon)
        metrics = {str(k): _plain(v) for k, v in (metrics or {}).items()}
        final = self.path / f"step-{step:06d}.h5"
        meta = {
            "format": CHECKPOINT_FORMAT,
            "step": step,
            "epoch": epoch,
            "metrics": json.dumps(to_jsonable(metrics)),
            "model_spec": json.dumps(to_jsonable(self.manifest.get("model_spec") or {})),
            "data_spec": json.dumps(to_jsonable(self.manifest.get("data_spec") or {})),
            "run": self.name,
            "code_version": code_version(),
            "attrs": json.dumps(to_jsonable(dict(attrs or {}))),
            "created": _now(),
        }
        if epsilon is not None:
            meta["epsilon"] = epsilon

        def write(f: h5py.File) -> None:
            for key, value in meta.items():
                f.attrs[key] = value
            _write_state_dict(f.create_group(STATE_GROUP, track_order=True), state_dict)
            if extra:
                _write_nested(f.create_group(EXTRA_GROUP, track_order=True), extra, escape=False)

        with self._writing():
            sha = _write_h5_atomic(final, write)
            entry = {"step": step, "epoch": epoch, "epsilon": epsilon, "metrics": metrics, "file": final.name,
                     "sha256": sha}
            entries = [e for e in self.manifest["checkpoints"] if int(e["step"]) != step]
            self.manifest["checkpoints"] = sorted([*entries, entry], key=lambda e: int(e["step"]))
            _write_json_atomic(self.path / MANIFEST, self.manifest)
        return final

    def checkpoints(self) -> list[CheckpointInfo]:
        """Checkpoints sorted by step: the manifest's, plus complete files a killed writer left unrecorded
        (those have no sha256 until a writer adopts them, :meth:`adopt_unrecorded`).

        A listed checkpoint whose file is gone is a CheckpointError naming it: ``@last`` must never fall
        back to an earlier checkpoint without a word.
        """
        found: dict[int, CheckpointInfo] = {}
        for e in self.manifest.get("checkpoints", []):
            path = self.path / e["file"]
            if not path.is_file():
                raise CheckpointError(
                    f"run '{self.name}': {self.path / MANIFEST} lists step {e['step']} but its file {e['file']} "
                    "is missing; restore the file, or remove its entry from the manifest"
                )
            found[int(e["step"])] = CheckpointInfo(
                path=path, step=int(e["step"]), epoch=float(e["epoch"]), epsilon=_float_or_none(e.get("epsilon")),
                metrics=_decode_metrics(e.get("metrics") or {}), sha256=e.get("sha256"),
            )
        for path in self.path.glob("step-*.h5"):
            match = _CHECKPOINT_FILE.fullmatch(path.name)
            if match and int(match.group(1)) not in found:
                info = _info_from_file(path)
                if info is not None:
                    found[info.step] = info
        return [found[s] for s in sorted(found)]

    def select(self, selector: str) -> CheckpointInfo:
        """One checkpoint by selector: ``init``, ``last``, ``step=N`` or ``epoch=E``."""
        infos = self.checkpoints()
        if not infos:
            raise CheckpointError(f"run '{self.name}' has no checkpoints yet")
        steps = [i.step for i in infos]
        if selector == "init":
            return infos[0]
        if selector == "last":
            return infos[-1]
        kind, _, value = selector.partition("=")
        if kind == "step":
            try:
                step = int(value)
            except ValueError:
                raise UsageError(f"bad selector '@{selector}': the step must be an integer") from None
            for info in infos:
                if info.step == step:
                    return info
            raise CheckpointError(f"run '{self.name}' has no checkpoint at step {step} ({_available(steps, 'steps')})")
        if kind == "epoch":
            try:
                epoch = float(value)
            except ValueError:
                raise UsageError(f"bad selector '@{selector}': the epoch must be a number") from None
            if not math.isfinite(epoch):
                raise UsageError(f"bad selector '@{selector}': the epoch must be a finite number")
            tol = 1e-6 * max(1.0, abs(epoch))
            hits = [i for i in infos if abs(i.epoch - epoch) <= tol]
            if len(hits) == 1:
                return hits[0]
            if hits:
                raise CheckpointError(
                    f"run '{self.name}' has several checkpoints at epoch {epoch:g} "
                    f"(steps {', '.join(str(i.step) for i in hits)}); use @step=N"
                )
            epochs = [f"{i.epoch:.6g}" for i in infos]
            raise CheckpointError(f"run '{self.name}' has no checkpoint at epoch {epoch:g} ({_available(epochs, 'epochs')})")
        raise UsageError(f"bad selector '@{selector}': expected @init, @last, @step=N or @epoch=E")

    def update_manifest(self, **fields: Any) -> None:
        """Set top-level manifest fields (not the store's own ones) and rewrite the manifest atomically."""
        clash = set(fields) & _MANIFEST_KEYS
        if clash:
            raise UsageError(f"manifest fields {sorted(clash)} are set by the store")
        with self._writing():
            self.manifest.update(fields)
            check_manifest(to_jsonable(self.manifest), self.path / MANIFEST)
            _write_json_atomic(self.path / MANIFEST, self.manifest)

    # -- run-level arrays ---------------------------------------------------------------------------

    def save_array(self, name: str, array: Any) -> None:
        """Store an array (or a mapping of arrays, e.g. a pruning mask per layer) in ``arrays.h5``.

        The file is rewritten atomically; an existing array of the same name is replaced.
        """
        _check_array_name(name)
        target = self.path / ARRAYS

        def write(f: h5py.File) -> None:
            if target.is_file():
                with _open_h5(target) as old:
                    for key in old:
                        if key != name:
                            old.copy(old[key], f, name=key)
            if isinstance(array, Mapping):
                _write_nested(f.create_group(name, track_order=True), array, escape=True)
            else:
                _write_array(f, name, array)

        with self._writing():
            _write_h5_atomic(target, write)

    def load_array(self, name: str) -> np.ndarray | dict[str, np.ndarray]:
        """An array saved with :meth:`save_array` (a dict of arrays when a mapping was saved)."""
        _check_array_name(name)
        target = self.path / ARRAYS
        names = self.array_names()
        if name not in names:
            raise CheckpointError(f"run '{self.name}' has no array '{name}' ({_available(names, 'arrays')})")
        with _open_h5(target) as f:
            obj = f[name]
            if isinstance(obj, h5py.Group):
                return _read_flat(obj, escaped=True)
            return _read_array(obj, as_torch=False)

    def array_names(self) -> list[str]:
        target = self.path / ARRAYS
        if not target.is_file():
            return []
        with _open_h5(target) as f:
            return list(f.keys())


# ------------------------------------------------------------------------------------------ file level


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
                path=path,
                ref=ref if ref is not None else str(path),
                state_dict=state_dict,
                step=int(a.get("step", 0)),
                epoch=float(a.get("epoch", 0.0)),
                epsilon=_float_or_none(a.get("epsilon")),
                metrics=_decode_metrics(_json_attr(a, "metrics")),
                model_spec=_json_attr(a, "model_spec"),
                data_spec=_json_attr(a, "data_spec"),
                run=_str_attr(a, "run"),
                extra=extra,
                sha256="",
                attrs=_json_attr(a, "attrs"),
                code_version=_str_attr(a, "code_version"),
            )
    except CheckpointError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {_one_line(exc)} (truncated or corrupt file?)") from None
    ckpt.sha256 = sha256_file(path)
    return ckpt


def _dtype_kind(dtype: torch.dtype) -> str:
    import torch

    if dtype == torch.bool:
        return "boolean"
    if dtype.is_complex:
        return "complex"
    return "floating point" if dtype.is_floating_point else "integer"


def check_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor], *, source: str) -> None:
    """Raise IncompatibleError naming the first key that is missing, unexpected, of the wrong shape or of the
    wrong kind of dtype (integer weights for a floating-point tensor would be cast without a word by
    ``load_state_dict``; precision within a kind, e.g. float64 into float32, is converted on load)."""
    expected = model.state_dict()
    spec = getattr(model, "landscape_spec", None)
    what = f"model '{spec['name']}'" if isinstance(spec, Mapping) and "name" in spec else "the model"
    for key, tensor in expected.items():
        if key not in state_dict:
            raise IncompatibleError(
                f"{source}: missing tensor '{key}' that {what} expects "
                f"({len(state_dict)} tensors in the file, {len(expected)} in the model)"
            )
        got = tuple(state_dict[key].shape)
        if got != tuple(tensor.shape):
            raise IncompatibleError(f"{source}: tensor '{key}' has shape {got} but {what} expects {tuple(tensor.shape)}")
        have, want = _dtype_kind(state_dict[key].dtype), _dtype_kind(tensor.dtype)
        if have != want:
            raise IncompatibleError(
                f"{source}: tensor '{key}' is {str(state_dict[key].dtype).removeprefix('torch.')} ({have}) but "
                f"{what} expects {str(tensor.dtype).removeprefix('torch.')} ({want}); convert the weights first"
            )
    for key in state_dict:
        if key not in expected:
            raise IncompatibleError(f"{source}: unexpected tensor '{key}' that {what} does not have")


def import_checkpoint(
    store: Store,
    file: str | os.PathLike,
    *,
    model_spec: Mapping[str, Any],
    data_spec: Mapping[str, Any],
    run: str,
    privacy: Mapping[str, Any] | None = None,
    epsilon: float | None = None,
) -> Path:
    """Import a foreign state dict as step 0 of a new run; return the checkpoint path.

    ``.pt``/``.pth`` files are read with ``torch.load(weights_only=True)`` only: a file that would need
    arbitrary code to unpickle is refused with UnsafeFileError and nothing in it runs. ``.safetensors``
    files are read with safetensors. A dict wrapping the weights under ``state_dict``/``model_state_dict``/
    ``model`` is unwrapped; Opacus' ``_module.`` (and DataParallel's ``module.``) key prefix is stripped.
    Keys and shapes are checked against the model ``model_spec`` builds (strict).

    ``privacy`` is the run's ``manifest["privacy"]``: what is known of the weights' privacy history
    (:class:`landscape.train.accounting.PrivacyHistory`); by default nothing (``unknown_ancestors``), so every
    run trained from them says that its epsilon covers only the steps landscape saw. ``epsilon`` is the
    declared epsilon recorded at the checkpoint.
    """
    from landscape.models import model_from_spec
    from landscape.train.accounting import PrivacyHistory

    file = Path(file)
    check_run_name(run)
    if not file.is_file():
        raise CheckpointError(f"file not found: {file}")
    raw = _read_foreign(file)
    model = model_from_spec(dict(model_spec))
    state_dict = _strip_prefixes(_unwrap_state_dict(raw, file), set(model.state_dict()))
    check_state_dict(model, state_dict, source=str(file))
    state_dict = {key: state_dict[key] for key in model.state_dict()}  # the model's order (safetensors sorts keys)
    full_spec = dict(getattr(model, "landscape_spec", None) or model_spec)
    sha = sha256_file(file)
    fmt = "safetensors" if file.suffix == ".safetensors" else "torch"
    new = store.create_run(
        run,
        config={"imported_from": str(file.resolve()), "format": fmt},
        seeds={},
        lineage={"imported_from": str(file.resolve()), "sha256": sha},
        model_spec=full_spec,
        data_spec=dict(data_spec),
        extra={"privacy": dict(privacy) if privacy is not None
               else {"accounted": False, **PrivacyHistory(unknown=True).manifest_fields()}},
    )
    with new:
        try:
            return new.save_checkpoint(state_dict, step=0, epoch=0.0, epsilon=epsilon,
                                       attrs={"imported_from": str(file.resolve())})
        except BaseException:
            shutil.rmtree(new.path, ignore_errors=True)
            raise


def check_run_name(name: str) -> None:
    """Run names are single safe path components: letters, digits and ``_ . , + = -``, not starting with . or -."""
    if not _is_run_name(name):
        raise UsageError(
            f"bad run name {name!r}: use 1-200 letters, digits or _ . , + = - "
            "(not starting with '.' or '-', no '/' or '@', not ending in .h5)"
        )


# ------------------------------------------------------------------------------------------- internals


def _is_run_name(name: object) -> bool:
    return isinstance(name, str) and bool(_RUN_NAME.fullmatch(name)) and not name.endswith(".h5")


def _read_foreign(file: Path) -> Any:
    suffix = file.suffix.lower()
    if suffix in (".pt", ".pth"):
        try:
            import torch

            with warnings.catch_warnings():  # torch warns about pickle protocols before refusing; the error says it
                warnings.simplefilter("ignore")
                return torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            if not _looks_like_torch_file(file):
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


def _looks_like_torch_file(file: Path) -> bool:
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
    while set(state_dict) != wanted:
        for prefix in PREFIXES:
            if all(k.startswith(prefix) for k in state_dict):
                state_dict = {k[len(prefix):]: v for k, v in state_dict.items()}
                break
        else:
            break
    return state_dict


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


def _write_json_atomic(path: Path, obj: Any) -> None:
    text = json.dumps(to_jsonable(obj), indent=2, allow_nan=False) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text))


def _open_h5(path: Path) -> h5py.File:
    """Open for reading without HDF5 file locks: store files never change after their rename, and locks
    fail on some shared file systems (NFS) that a cluster's workers use."""
    return h5py.File(path, "r", locking=False)


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read run manifest {path}: {_one_line(exc)}") from None
    manifest = check_manifest(manifest, path)
    manifest.setdefault("checkpoints", [])
    return manifest


_SHA256 = re.compile(r"[0-9a-f]{64}")
_NON_FINITE = ("nan", "inf", "-inf", "Infinity", "-Infinity", "NaN", "none", "None")


def check_manifest(manifest: Any, path: str | os.PathLike) -> dict[str, Any]:
    """Check a run manifest (as parsed from JSON) against the store's one schema; return it.

    The store's fields: ``config``, ``seeds``, ``model_spec``, ``data_spec`` objects (seeds integers),
    ``lineage`` an object or null, ``checkpoints`` a list of ``{step, epoch, epsilon, metrics, file, sha256}``
    with ``step`` a non-negative integer (each once), ``epoch`` a number, ``file`` exactly ``step-NNNNNN.h5``
    of that step (so no entry can point outside its run directory), ``sha256`` 64 hex digits (the store hashes
    every checkpoint it lists; an unhashed entry could not be verified). ``format``, ``config``, ``seeds``,
    ``model_spec``, ``data_spec`` and ``checkpoints`` must be present: an empty or hand-made manifest (``{}``)
    is damage, never a run whose files nothing vouches for. Fields
    the trainer adds are checked when present: ``schedule`` (``steps_per_epoch``, ``total_steps``,
    ``checkpoint_steps``) and ``privacy`` (numbers, ``ancestor_events`` of ``{noise_multiplier, sample_rate,
    steps}``, the flags ``accounted``, ``non_private_ancestors`` and ``unknown_ancestors``, ``declared_ancestors``
    of ``{epsilon, delta}``; :class:`landscape.train.accounting.PrivacyHistory`). Any violation is a one-line CheckpointError naming the file and the field.
    """
    def bad(field: str, what: str, value: Any = None, show: bool = True) -> CheckpointError:
        got = f", got {_short(value)}" if show else ""
        return CheckpointError(f"damaged run manifest {path}: field '{field}' {what}{got}")

    if not isinstance(manifest, dict):
        raise CheckpointError(f"damaged run manifest {path}: not a JSON object (got {type(manifest).__name__})")
    for key in ("format", "config", "seeds", "model_spec", "data_spec", "checkpoints"):
        if key not in manifest:
            raise bad(key, "is missing (the store writes it with every run)", show=False)
    if manifest["format"] != MANIFEST_FORMAT:
        raise bad("format", f"must be {MANIFEST_FORMAT!r}", manifest["format"])
    if "name" in manifest and not isinstance(manifest["name"], str):
        raise bad("name", "must be a string", manifest["name"])
    for key in ("config", "seeds", "model_spec", "data_spec"):
        if key in manifest and not isinstance(manifest[key], dict):
            raise bad(key, "must be an object", manifest[key])
    for key, value in (manifest.get("seeds") or {}).items():
        if not _is_int(value):
            raise bad(f"seeds.{key}", "must be an integer", value)
    if manifest.get("lineage") is not None and not isinstance(manifest["lineage"], dict):
        raise bad("lineage", "must be an object or null", manifest["lineage"])
    entries = manifest.get("checkpoints", [])
    if not isinstance(entries, list):
        raise bad("checkpoints", "must be a list", entries)
    seen: set[int] = set()
    for i, e in enumerate(entries):
        where = f"checkpoints[{i}]"
        if not isinstance(e, dict):
            raise bad(where, "must be an object", e)
        for key in ("step", "epoch", "file"):
            if key not in e:
                raise bad(f"{where}.{key}", "is missing", show=False)
        step = e["step"]
        if not _is_int(step) or step < 0:
            raise bad(f"{where}.step", "must be a non-negative integer", step)
        if step in seen:
            raise bad(f"{where}.step", "lists a step twice", step)
        seen.add(step)
        if not _is_number(e["epoch"]) or not math.isfinite(e["epoch"]):
            raise bad(f"{where}.epoch", "must be a finite number", e["epoch"])
        if e["file"] != f"step-{step:06d}.h5":
            raise bad(f"{where}.file", f"must be 'step-{step:06d}.h5' (the file of step {step})", e["file"])
        eps = e.get("epsilon")
        if eps is not None and not _is_number(eps) and eps not in _NON_FINITE:
            raise bad(f"{where}.epsilon", "must be a number or null", eps)
        if not isinstance(e.get("metrics", {}), dict):
            raise bad(f"{where}.metrics", "must be an object", e["metrics"])
        if "sha256" not in e:
            raise bad(f"{where}.sha256", "is missing (an unhashed checkpoint cannot be verified)", show=False)
        sha = e["sha256"]
        if not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
            raise bad(f"{where}.sha256", "must be 64 hex digits", sha)
    schedule = manifest.get("schedule")
    if schedule is not None:
        if not isinstance(schedule, dict):
            raise bad("schedule", "must be an object", schedule)
        for key, low in (("steps_per_epoch", 1), ("total_steps", 0)):
            if key not in schedule:
                raise bad(f"schedule.{key}", "is missing", show=False)
            if not (_is_int(schedule[key]) and schedule[key] >= low):
                raise bad(f"schedule.{key}", f"must be an integer >= {low}", schedule[key])
        if "checkpoint_steps" not in schedule:
            raise bad("schedule.checkpoint_steps", "is missing", show=False)
        steps = schedule["checkpoint_steps"]
        if not isinstance(steps, list) or not all(_is_int(t) and t >= 0 for t in steps):
            raise bad("schedule.checkpoint_steps", "must be a list of non-negative integers", steps)
    privacy = manifest.get("privacy")
    if privacy is not None:
        if not isinstance(privacy, dict):
            raise bad("privacy", "must be an object", privacy)
        for key in ("noise_multiplier", "sample_rate", "delta"):
            if key in privacy and not _is_number(privacy[key]):
                raise bad(f"privacy.{key}", "must be a number", privacy[key])
        if "steps" in privacy and not _is_int(privacy["steps"]):
            raise bad("privacy.steps", "must be an integer", privacy["steps"])
        events = privacy.get("ancestor_events", [])
        if not isinstance(events, list):
            raise bad("privacy.ancestor_events", "must be a list", events)
        for i, ev in enumerate(events):
            if not (isinstance(ev, dict) and set(ev) == {"noise_multiplier", "sample_rate", "steps"}
                    and _is_number(ev["noise_multiplier"]) and _is_number(ev["sample_rate"])
                    and _is_int(ev["steps"])):
                raise bad(f"privacy.ancestor_events[{i}]", "must be {noise_multiplier, sample_rate, steps}", ev)
        for key in ("non_private_ancestors", "unknown_ancestors", "accounted"):
            if key in privacy and not isinstance(privacy[key], bool):
                raise bad(f"privacy.{key}", "must be true or false", privacy[key])
        if "note" in privacy and not isinstance(privacy["note"], str):
            raise bad("privacy.note", "must be a string", privacy["note"])
        if "total_delta" in privacy and not _is_number(privacy["total_delta"]):
            raise bad("privacy.total_delta", "must be a number", privacy["total_delta"])
        declared = privacy.get("declared_ancestors", [])
        if not isinstance(declared, list):
            raise bad("privacy.declared_ancestors", "must be a list", declared)
        for i, d in enumerate(declared):
            if not (isinstance(d, dict) and set(d) == {"epsilon", "delta"} and _is_number(d["delta"])
                    and 0 <= d["delta"] < 1 and _is_number(d["epsilon"]) and 0 <= d["epsilon"] < math.inf):
                raise bad(f"privacy.declared_ancestors[{i}]", "must be {epsilon >= 0, delta in [0, 1)}", d)
    return manifest


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ------------------------------------------------------------------------------------------- run locks


@dataclass(eq=False)
class _FileLock:
    """One ``flock`` this process holds on a run's lock file, shared by every hold of the process."""

    key: str
    fd: int
    inode: int
    holds: int = 1


_LOCKS: dict[str, _FileLock] = {}  # realpath of the lock file -> the lock this process holds on it


def _lock(run_dir: Path, name: str) -> _FileLock:
    """Take (or, in this process, re-enter) the exclusive lock of a run directory; RunBusyError if another
    process holds it. The lock file keeps the holder's pid for that message; it is never removed (removing
    a lock file others may have open would let two processes lock two different files)."""
    key = os.path.realpath(run_dir / LOCK)
    held = _LOCKS.get(key)
    if held is not None:
        try:
            same = os.stat(key).st_ino == held.inode
        except OSError:
            same = False
        if same:
            held.holds += 1
            return held
        del _LOCKS[key]  # the run directory was removed and made again; that entry ends with its holders
    try:
        fd = os.open(key, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666 & ~_UMASK)
    except OSError as exc:
        raise CheckpointError(f"cannot lock run '{name}' ({key}): {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        try:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        except OSError:
            holder = ""
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            pid = f" (pid {holder})" if holder.isdigit() else ""
            raise RunBusyError(
                f"run '{name}' is being written by another process{pid}; one writer per run: wait for it to end"
            ) from None
        raise CheckpointError(f"cannot lock run '{name}' ({key}): {exc.strerror or exc}") from None
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    lock = _FileLock(key, fd, os.fstat(fd).st_ino)
    _LOCKS[key] = lock
    return lock


def _unlock(lock: _FileLock | None) -> None:
    if lock is None or lock.holds <= 0:
        return
    lock.holds -= 1
    if lock.holds == 0:
        if _LOCKS.get(lock.key) is lock:
            del _LOCKS[lock.key]
        with contextlib.suppress(OSError):
            os.close(lock.fd)
        lock.fd = -1


def _release_holds(hold: list[Any]) -> None:
    """Give back every hold a Run object has (its ``_hold`` = [lock, count])."""
    while hold[1] > 0:
        hold[1] -= 1
        _unlock(hold[0])


def _forget_locks_in_child() -> None:
    """A forked child holds none of its parent's locks: drop (not unlock) the inherited entries."""
    for lock in _LOCKS.values():
        with contextlib.suppress(OSError):
            os.close(lock.fd)
        lock.fd, lock.holds = -1, 0
    _LOCKS.clear()


os.register_at_fork(after_in_child=_forget_locks_in_child)


def _escape(key: str) -> str:
    """HDF5-safe, reversible member name: '%' and '/' are percent-encoded; '.' alone becomes '%2E'."""
    escaped = quote(key, safe="".join(chr(c) for c in range(32, 127) if chr(c) not in "%/"))
    return "%2E" if escaped == "." else escaped or "%00empty"


def _unescape(name: str) -> str:
    return "" if name == "%00empty" else unquote(name)


def _write_array(group: h5py.Group, name: str, value: Any) -> None:
    if is_tensor(value):
        import torch

        tensor = value.detach().cpu()
        if tensor.is_sparse or tensor.layout != torch.strided:
            raise UsageError(f"cannot store '{name}': only dense tensors are supported")
        torch_dtype = str(tensor.dtype).removeprefix("torch.")
        view = _view_dtypes().get(tensor.dtype)
        if view is not None:
            tensor = tensor.contiguous().view(view)
        ds = group.create_dataset(name, data=tensor.contiguous().numpy())
        ds.attrs["torch_dtype"] = torch_dtype
        return
    array = np.asarray(value)
    if array.dtype == object:
        raise UsageError(f"cannot store '{name}': {type(value).__name__} is not a numeric array")
    group.create_dataset(name, data=array)


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


def _check_array_name(name: str) -> None:
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise UsageError(f"bad array name {name!r}: a non-empty name without '/'")


def _available(items: Iterable[Any], what: str) -> str:
    items = [str(i) for i in items]
    if not items:
        return f"no {what}"
    if len(items) > 20:
        items = [*items[:10], "...", *items[-5:]]
    return f"available {what}: {', '.join(items)}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

