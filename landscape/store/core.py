"""The store and its runs: :class:`Store` (a directory of runs, references to checkpoints) and :class:`Run`
(one run directory: checkpoints, run arrays, manifest fields, written under the run's lock)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import fnmatch
import hashlib
import json
import os
import secrets
import shutil
import warnings
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from landscape.atomic import atomic_write_hdf5, stale_temp_files
from landscape.errors import CheckpointError, UsageError, WriteError, one_line, param
from landscape.jsonable import to_jsonable
from landscape.refs import Ref, check_run_name, is_run_name, parse_selector
from landscape.runtime import code_version, environment, portable_mode
from landscape.store._locks import LOCK, _FileLock, _lock, _release_holds, _unlock
from landscape.store.checkpoint import (
    Checkpoint,
    CheckpointInfo,
    _info_from_file,
    load_checkpoint,
    load_verified,
)
from landscape.store.codec import (
    EXTRA_GROUP,
    STATE_GROUP,
    _decode_metrics,
    _float_or_none,
    _open_h5,
    _plain,
    _read_array,
    _read_flat,
    _write_array,
    _write_nested,
    _write_state_dict,
)
from landscape.store.manifest import (
    _CHECKPOINT_FILE,
    _MANIFEST_KEYS,
    ARRAYS,
    CHECKPOINT_FORMAT,
    MANIFEST,
    MANIFEST_FORMAT,
    _read_manifest,
    _write_json_atomic,
    check_depth,
    check_manifest,
)

if TYPE_CHECKING:
    import torch

class Store:
    """A directory of runs. Nothing is created on disk until a run is."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    def create_run(self, name: str | None, *, config: Mapping[str, Any], seeds: Mapping[str, Any],
                   lineage: Mapping[str, Any] | None = None, model_spec: Mapping[str, Any],
                   data_spec: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> Run:
        """Create a new run directory with its manifest (``name=None``: a unique name; an existing one is an
        error), holding its write lock until :meth:`Run.close`. ``extra``: further top-level manifest fields."""
        clash = set(extra or {}) & _MANIFEST_KEYS
        if clash:
            raise UsageError(f"manifest fields {sorted(clash)} are set by the store, not through extra=")
        check_depth({"config": config, "seeds": seeds, "lineage": lineage, "model_spec": model_spec,
                     "data_spec": data_spec, **dict(extra or {})})
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"cannot create the store root {self.root}: {exc.strerror or exc}") from None
        lock = None
        if name is None:
            stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
            for _ in range(100):
                path = self.root / f"run-{stamp}-{secrets.token_hex(3)}"
                with contextlib.suppress(FileExistsError):
                    path.mkdir()
                    break
            else:
                raise CheckpointError(f"could not create a unique run directory in {self.root}")
        else:
            check_run_name(name)
            path = self.root / name
            try:
                path.mkdir()
            except FileExistsError:
                lock = self._reclaim(path, name)
            except OSError as exc:
                raise CheckpointError(f"cannot create run directory {path}: {exc.strerror or exc}") from None
        run = Run(path, {})
        run._acquire(lock)
        manifest = {
            "format": MANIFEST_FORMAT,
            "name": path.name,
            "created": _now(),
            "code_version": code_version(),
            "environment": environment(),  # python, torch, torchvision, opacus, ... versions
            "portable": portable_mode(),  # made with every float kernel pinned (bit-identical on any x86-64)
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

    def _reclaim(self, path: Path, name: str) -> _FileLock:
        """The lock of the run directory ``path`` that exists already, when its creator was killed before
        writing its manifest (nothing but temporary files in it, which are removed). A directory another process
        holds is :class:`RunBusyError` (with its pid: the loser of two writers racing to create one run hears
        that), a run or anything else there a CheckpointError."""
        if not path.is_dir():
            raise CheckpointError(f"cannot create run '{name}': {path} exists and is not a directory")
        lock = _lock(path, name)  # RunBusyError while its creator (or any writer) is alive
        left = [p for p in path.iterdir() if p.name != LOCK]
        if (path / MANIFEST).exists() or any(p.is_dir() or not p.name.endswith(".tmp") for p in left):
            _unlock(lock)
            raise CheckpointError(f"run '{name}' already exists in {self.root}; choose another {param('run')} "
                                  f"(or continue it: {param('resume', name)})")
        for p in left:
            p.unlink(missing_ok=True)
        return lock

    def run(self, name: str) -> Run:
        """An existing run, for reading; CheckpointError listing the runs there are when it is missing."""
        check_run_name(name)
        path = self.root / name
        if not (path / MANIFEST).is_file():
            raise CheckpointError(f"no run '{name}' in {self.root} ({_available(self.run_names(), 'runs')})")
        return Run(path, _read_manifest(path / MANIFEST))

    def open_run(self, name: str) -> Run:
        """An existing run, for writing (``--resume``), holding its lock until :meth:`Run.close`: temporary files
        of killed writers removed, complete checkpoint files they left unrecorded adopted."""
        run = Run(self.run(name).path, {})
        run._acquire()
        try:
            run.manifest = _read_manifest(run.path / MANIFEST)
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
        return sorted(p.name for p in self.root.iterdir() if is_run_name(p.name) and (p / MANIFEST).is_file())

    def scan(self, pattern: str = "*") -> tuple[list[Run], dict[str, str]]:
        """Runs whose name matches a shell glob, and the damaged ones (invalid manifest, missing checkpoint)
        apart: ``(runs, {name: one-line error})``; one damaged run never hides the others."""
        runs: list[Run] = []
        broken: dict[str, str] = {}
        for name in self.run_names():
            if not fnmatch.fnmatchcase(name, pattern):
                continue
            try:
                run = self.run(name)
                run.checkpoints()
            except CheckpointError as exc:
                broken[name] = str(exc) if str(exc).startswith(f"run '{name}'") else f"run '{name}': {exc}"
                continue
            except Exception as exc:  # what the schema let through: still this run's damage alone
                broken[name] = f"run '{name}': cannot be read: {one_line(exc)}"
                continue
            runs.append(run)
        return runs, broken

    def runs_matching(self, pattern: str = "*") -> list[Run]:
        """Runs whose name matches a shell glob (``dp-*``), sorted by name; each damaged run is skipped with
        a one-line :class:`DamagedRunWarning`."""
        runs, broken = self.scan(pattern)
        for message in broken.values():
            warnings.warn(f"skipping a damaged run: {message}", DamagedRunWarning, stacklevel=2)
        return runs

    def resolve(self, ref: str | Ref) -> Path:
        """The checkpoint file a reference names (:class:`landscape.refs.Ref` or its text)."""
        return self._resolve(Ref.parse(ref))[0]

    def _resolve(self, ref: Ref) -> tuple[Path, CheckpointInfo | None]:
        if ref.file is not None:
            for candidate in (Path(ref.file), self.root / ref.file):
                if candidate.is_file():
                    return candidate, None
            raise CheckpointError(f"checkpoint file not found: {ref.file} (also looked in {self.root})")
        info = self.run(ref.run).checkpoint_at(ref.at or "last", ref.value)
        return info.path, info

    def load(self, ref: str | Ref, *, tensors: bool = True) -> Checkpoint:
        """Load the checkpoint a reference names, verified: a file listed in a manifest must still have the
        sha256 recorded there. ``tensors=False``: the state dict as numpy arrays (no torch import; see
        :func:`load_checkpoint`)."""
        ref = Ref.parse(ref)
        path, info = self._resolve(ref)
        return load_verified(path, ref=str(ref), sha256=info.sha256 if info is not None else None, tensors=tensors)


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

    def _acquire(self, lock: _FileLock | None = None) -> None:
        """Take one hold of the run's lock (``lock``: one already taken for this run)."""
        lock = lock if lock is not None else _lock(self.path, self.name)
        if self._hold[1] > 0 and self._hold[0] is not lock:
            _release_holds(self._hold)  # the directory was made again since: the old hold is meaningless
        self._hold[0] = lock
        self._hold[1] += 1
        if self._finalizer is None:  # an object dropped without close() still lets go of its lock
            self._finalizer = weakref.finalize(self, _release_holds, self._hold)

    def close(self) -> None:
        """Release the write lock this object holds (a no-op for a run opened for reading)."""
        _release_holds(self._hold)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _writing(self):
        """Hold the lock for one write, with the manifest as it is on disk: read again under the lock (another
        writer, or another Run object of this process, may have written since)."""
        self._acquire()
        try:
            if (self.path / MANIFEST).exists():
                self.manifest = _read_manifest(self.path / MANIFEST)
            self.manifest.setdefault("checkpoints", [])
            yield
        finally:
            if self._hold[1] > 0:
                self._hold[1] -= 1
                _unlock(self._hold[0])

    def sweep_temporary_files(self) -> list[Path]:
        """Remove the temporary files of writes killed mid-way (under the lock no write of ours is live)."""
        with self._writing():
            stale = stale_temp_files(self.path, lambda final: final in (MANIFEST, ARRAYS)
                                     or _CHECKPOINT_FILE.fullmatch(final) is not None)
            for path in stale:
                path.unlink(missing_ok=True)
        return stale

    def adopt_unrecorded(self) -> list[int]:
        """Record, with their sha256, the checkpoint files a writer killed between rename and manifest update
        left unlisted, when they load completely and name this run and step; returns the adopted steps."""
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

    def save_checkpoint(self, state_dict: Mapping[str, torch.Tensor], *, step: int, epoch: float,
                        epsilon: float | None = None, metrics: Mapping[str, Any] | None = None,
                        extra: Mapping[str, Any] | None = None,
                        attrs: Mapping[str, Any] | None = None) -> Path:
        """Write ``step-NNNNNN.h5`` atomically, then record it in the manifest (replacing an existing step).
        ``extra``: arrays beside the weights (names may nest with ``/``); ``attrs``: JSON-able metadata."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise UsageError(f"checkpoint step must be a non-negative integer, got {step!r}")
        step = int(step)
        epoch = float(epoch)
        epsilon = None if epsilon is None else float(epsilon)
        metrics = {str(k): _plain(v) for k, v in (metrics or {}).items()}
        for key, value in metrics.items():
            if isinstance(value, (Mapping, list, tuple)):
                raise UsageError(f"metric '{key}' must be a number, got {type(value).__name__}")
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

        def write(f: h5py.File, check: Any) -> None:
            f.attrs.update(meta)
            _write_state_dict(f.create_group(STATE_GROUP, track_order=True), state_dict)
            if extra:
                _write_nested(f.create_group(EXTRA_GROUP, track_order=True), extra, escape=False)

        with self._writing():
            kept = _kept(self.name, self.manifest["checkpoints"])
            hasher = hashlib.sha256()
            try:
                atomic_write_hdf5(final, write, hasher=hasher, track_order=True)
            except WriteError as exc:
                raise exc.noted(f"; {kept}") from None
            sha = hasher.hexdigest()
            entry = {"step": step, "epoch": epoch, "epsilon": epsilon, "metrics": metrics, "file": final.name,
                     "sha256": sha}
            entries = [e for e in self.manifest["checkpoints"] if int(e["step"]) != step]
            self.manifest["checkpoints"] = sorted([*entries, entry], key=lambda e: int(e["step"]))
            try:
                _write_json_atomic(self.path / MANIFEST, self.manifest)
            except WriteError as exc:
                raise exc.noted(f"; {kept}; {final.name} is complete but not listed: continuing the run "
                                "adopts it") from None
        return final

    def checkpoints(self) -> list[CheckpointInfo]:
        """Checkpoints sorted by step: the manifest's, plus complete files a killed writer left unrecorded (no
        sha256 until adopted). A listed checkpoint whose file is gone is an error: ``@last`` never falls back."""
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
        return self.checkpoint_at(*parse_selector(selector))

    def checkpoint_at(self, at: str, value: int | float | None = None) -> CheckpointInfo:
        """One checkpoint by a parsed selector (:class:`landscape.refs.Ref`'s ``at`` and ``value``)."""
        infos = self.checkpoints()
        if not infos:
            raise CheckpointError(f"run '{self.name}' has no checkpoints yet")
        steps = [i.step for i in infos]
        if at == "init":
            return infos[0]
        if at == "last":
            return infos[-1]
        if at == "step":
            for info in infos:
                if info.step == value:
                    return info
            raise CheckpointError(f"run '{self.name}' has no checkpoint at step {value} ({_available(steps, 'steps')})")
        epoch = float(value)
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

    def update_manifest(self, **fields: Any) -> None:
        """Set top-level manifest fields (not the store's own ones) and rewrite the manifest atomically."""
        clash = set(fields) & _MANIFEST_KEYS
        if clash:
            raise UsageError(f"manifest fields {sorted(clash)} are set by the store")
        check_depth(fields)
        with self._writing():
            self.manifest.update(fields)
            check_manifest(to_jsonable(self.manifest), self.path / MANIFEST)
            _write_json_atomic(self.path / MANIFEST, self.manifest)

    def save_array(self, name: str, array: Any) -> None:
        """Store an array (or a mapping of arrays) in ``arrays.h5``, rewritten atomically, replacing one of the
        same name."""
        _check_array_name(name)
        target = self.path / ARRAYS

        def write(f: h5py.File, check: Any) -> None:
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
            atomic_write_hdf5(target, write, track_order=True)

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


def _kept(name: str, entries: list[dict[str, Any]]) -> str:
    """What a run keeps when a save fails: its listed checkpoints (a continued run starts from the last)."""
    if not entries:
        return f"run '{name}' has no checkpoint yet"
    last = max(int(e["step"]) for e in entries)
    return (f"run '{name}' keeps its {len(entries)} checkpoint{'s' if len(entries) > 1 else ''} (the last at step "
            f"{last}), where continuing it starts")


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


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
