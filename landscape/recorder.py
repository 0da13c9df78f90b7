"""Record checkpoints from any training loop into the store (``landscape.Recorder``).

::

    with landscape.Recorder("checkpoints", "my-run", model, data=data, config={"lr": 0.05}) as rec:
        for epoch in range(epochs):
            ...                                   # the user's own loop, on any device
            rec.save(step, epoch=epoch + 1, metrics={"train_loss": loss})

A recorded run is a store run like the ones ``landscape train`` writes: the same atomic checkpoint and
manifest writes, the run's write lock from the first file to the last (:class:`landscape.store.Run`), sha256
of every checkpoint, the code version of landscape (manifest and checkpoints), and the model and data specs
analyses rebuild the model and data from, so every analysis reads it exactly as a trained run. The manifest
adds ``config`` (the user's, as given), ``recorder`` (format, the ``__main__`` script and its sha256, torch and
python versions), ``device`` (the model's) and ``privacy`` (a DP run's noise multiplier, sample rate, clipping norm, delta, accountant;
:mod:`landscape.integrations.opacus` reads them from an Opacus ``PrivacyEngine``; else a run without privacy
guarantee), so ``landscape train --from`` a recorded checkpoint composes its DP steps like a trained parent's.

A run recorded from a store checkpoint (``parent="base@last"``, as ``landscape train --from``) starts from the
parent's weights, records its lineage (``parent_run``, ``parent_step``, ``parent_sha256``, ...) and the
parent's privacy history (:func:`landscape.train.pruning.inherited_privacy`), and each checkpoint's epsilon
composes the parent's DP steps with the run's own (and adds declared guarantees), as a trained child's does.

The writer process. Writing a checkpoint (HDF5, sha256, the manifest, fsyncs) takes CPU time with Python's GIL
held; in a thread of the training process that stalls a CPU-bound loop for longer than the write itself (the
writer waits up to Python's switch interval for the GIL after every system call; timings: docs/benchmarks.md). So
the run belongs to a *writer process*: a fork of the training process made when the recorder opens (it has
every module the parent has, and writes through the very same :class:`landscape.store.Run` calls, so the files
are byte for byte what an in-process write gives). It takes the run's write lock, creates or opens the run
and writes every file; it ignores Ctrl-C (the parent decides when to stop) and dies with its parent
(:func:`landscape.runtime.die_with_parent`: SIGKILL when the parent dies, however it dies).
:meth:`Recorder.save` checks and copies what it records in the training process (weights and optimizer state
as CPU tensors, metrics, the accountant's epsilon and state), sends the bytes down a pipe and returns while
the writer writes; at most one checkpoint is in flight (the next ``save`` waits for it);
:meth:`Recorder.flush`, :meth:`Recorder.close` and the end of the ``with`` block wait for the last one and raise
a failed write's error (one line), and it is written at interpreter exit too (``background=False`` waits
before ``save`` returns). Crash safety is the store's: a training process killed at any moment (its writer
then dies with it) loses at most the checkpoint in flight, every file and the manifest stay whole, and the
same ``Recorder`` call continues the run. Durability is the store's too: when ``flush`` returns, the checkpoint
file and the manifest that lists it are fsynced, their renames too (a power cut then loses nothing written).

Continuing a killed run: the same ``Recorder(root, run, ...)`` again opens the run (with the same model, data,
config, privacy and parent; anything else is refused in one line), :meth:`Recorder.restore` puts the last
checkpoint's weights, optimizer state and privacy accountant back and returns its step, and
:meth:`Recorder.save` refuses any step that does not come after it. A run written by anyone else (``landscape
train``, ``import``, another model or data set) is never written to. Weights that are not finite are refused,
nothing saved.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import math
import os
import platform
import shutil
import signal
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from landscape.errors import CheckpointError, LandscapeError, NonFiniteError, UsageError
from landscape.results import to_jsonable
from landscape.runtime import die_with_parent
from landscape.store import MANIFEST, Checkpoint, Run, Store, check_run_name
from landscape.train.accounting import PrivacyEvent, PrivacyHistory
from landscape.train.pruning import MASK_ARRAY, inherited_privacy, lineage_of

RECORDER_FORMAT = "landscape-recorder/1"
OPTIMIZER_EXTRA = "optimizer"  # checkpoint extra group of the optimizer's tensors
OPTIMIZER_ATTR = "optimizer"  # checkpoint attr: its param groups and non-tensor state (JSON)
PRIVACY_ATTR = "privacy_state"  # checkpoint attr: the privacy source's state (e.g. Opacus' accountant history)
_PIPE_BYTES = 16 << 20  # the writer's job pipe, when the system allows it (else 1 MiB, else its default)
_ALIGN = 64  # byte alignment of each tensor in the writer's job buffer
_IOV_MAX = 1024  # buffers per writev (POSIX guarantees at least 16; Linux allows 1024)


class PrivacySource(Protocol):
    """What the recorder asks a DP training loop's accountant (:class:`landscape.integrations.opacus.OpacusPrivacy`)."""

    def record(self) -> dict[str, Any]:
        """The run's fixed ``manifest["privacy"]`` fields (noise_multiplier, sample_rate, delta, ...)."""

    def steps(self) -> int:
        """Noisy steps taken so far."""

    def epsilon(self, ancestors: Sequence[PrivacyEvent] = ()) -> float:
        """Epsilon so far at ``record()["delta"]``, composed with the ``ancestors``' DP steps (a run recorded
        from a parent checkpoint; the recorder passes them only when there are some)."""

    def state(self) -> dict[str, Any]:
        """JSON-able state to continue from (stored with each checkpoint)."""

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Put a :meth:`state` back."""


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside wrappers that prefix its state dict keys: Opacus' ``GradSampleModule``
    (``_module.``), ``DataParallel`` / ``DistributedDataParallel`` (``module.``)."""
    while not hasattr(model, "landscape_spec"):
        inner = getattr(model, "_module", None)
        if not isinstance(inner, nn.Module):
            inner = model.module if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)) else None
        if inner is None:
            break
        model = inner
    return model


class Recorder:
    """Writes the checkpoints of a training loop landscape does not run into run ``run`` of the store at ``root``.

    ``model``: the module being trained (any device; wrappers are looked through, :func:`unwrap`), built by
    :func:`landscape.models.build_model` so that it carries the ``landscape_spec`` analyses rebuild it from.
    ``data``: the :class:`landscape.data.Dataset` it is trained on (or its spec). ``config``: the run's
    hyper-parameters as the user names them (JSON-able; ``optimizer`` labels the run in hessian and norms
    tables). ``optimizer``: saved with each checkpoint and put back by :meth:`restore`. ``privacy``: a
    :class:`PrivacySource` (DP-SGD; checkpoints then record its epsilon and its step count). ``parent``: a
    checkpoint of the store (``"base@last"``, ``"base@step=N"``, a file) the run starts from, as ``landscape
    train --from``: the model must be the parent's (same model spec); a new run puts the parent's weights into
    it and records the lineage and the parent's privacy history. ``steps_per_epoch``: gives each checkpoint's
    epoch when :meth:`save` is not told it. ``seed``: recorded in ``manifest["seeds"]``. ``background``: write
    each checkpoint while training goes on (module docstring).

    Use it as a context manager (or call :meth:`close`): its writer process holds the run's write lock while
    it is open.
    """

    def __init__(
        self, root: str | Path, run: str, model: nn.Module, *, data: Any, config: Mapping[str, Any] | None = None,
        optimizer: torch.optim.Optimizer | None = None, privacy: PrivacySource | None = None,
        parent: str | os.PathLike | None = None, steps_per_epoch: int | None = None, seed: int | None = None,
        background: bool = True,
    ) -> None:
        check_run_name(run)
        self.background = bool(background)
        self.model = unwrap(model)
        self.optimizer = optimizer
        self.privacy = privacy
        if steps_per_epoch is not None and not (_is_whole(steps_per_epoch) and steps_per_epoch >= 1):
            raise UsageError(f"steps_per_epoch must be a whole number >= 1, got {steps_per_epoch!r}")
        self.steps_per_epoch = None if steps_per_epoch is None else int(steps_per_epoch)
        if seed is not None and not _is_whole(seed):
            raise UsageError(f"seed must be an integer, got {seed!r}")
        seed = None if seed is None else int(seed)
        fields = dict(config=_jsonable(config or {}, "config"), seeds={} if seed is None else {"seed": seed},
                      model_spec=_model_spec(self.model), data_spec=_data_spec(data))
        store = Store(root)
        self._store = store
        self._name = run
        parent_ckpt, lineage, self.history = _parent(store, parent, fields["model_spec"])
        privacy_record = self._privacy_record(0)
        extra = {"device": _device(self.model), "privacy": privacy_record, "recorder": _recorder_record()}
        self._writer = _Writer(run, functools.partial(_open_run, store, run, fields, lineage, privacy_record, extra,
                                                      self._privacy_record))
        self._finalizer = weakref.finalize(self, self._writer.shutdown)
        self._last: int | None = self._writer.opened
        if parent_ckpt is not None and self._last is None:
            try:
                self.model.load_state_dict(parent_ckpt.state_dict, strict=True)  # the run starts from its parent
            except BaseException:
                self._finalizer.detach()
                self._writer.stop(discard_if_empty=True)
                raise

    # -- the run ------------------------------------------------------------------------------------

    @property
    def run(self) -> Run:
        """The run as it is on disk now (for reading; its writer process holds the lock)."""
        return self._store.run(self._name)

    @property
    def name(self) -> str:
        return self._name

    @property
    def last_step(self) -> int | None:
        """The step of the last checkpoint saved (None before the first): a continued loop starts after it."""
        return self._last

    def flush(self) -> None:
        """Wait until the checkpoint being written is on disk; raise its error if writing it failed."""
        try:
            self._writer.wait()
        except BaseException:
            infos = self.run.checkpoints()  # the failed step was not saved: it may be saved again
            self._last = infos[-1].step if infos else None
            raise

    def close(self) -> None:
        """Write the checkpoint in flight (:meth:`flush`), then stop the writer process, which releases the run's
        write lock (the checkpoints stay)."""
        try:
            self.flush()
        finally:
            self._finalizer.detach()
            self._writer.stop()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        try:
            self.flush()
        except Exception:
            if kind is None:
                raise  # else the block's own error is the one to see
        finally:
            self._finalizer.detach()
            self._writer.stop(discard_if_empty=kind is not None)  # failed before its first checkpoint: free the name

    # -- saving -------------------------------------------------------------------------------------

    def save(
        self, step: int | None = None, *, epoch: float | None = None, epsilon: float | None = None,
        metrics: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write the model's current weights as checkpoint ``step`` (atomically, with its sha256 in the manifest).

        ``step`` must come after the run's last checkpoint; with a privacy source it is the number of noisy
        steps (its count when omitted) and the checkpoint's epsilon is the source's. ``epoch`` defaults to
        ``step / steps_per_epoch``. ``metrics``: numbers (or one-element tensors) stored with the checkpoint;
        ``extra``: arrays stored beside the weights. Returns the checkpoint file.
        """
        self.flush()  # at most one checkpoint in flight; an earlier failure is raised here
        step = self._check_step(step)
        epoch = self._epoch(step, epoch)
        epsilon = self._epsilon(epsilon)
        state = _cpu_state(self.model, step)
        arrays = {str(k): _snapshot(v) for k, v in (extra or {}).items()}
        if OPTIMIZER_EXTRA in arrays:
            raise UsageError(f"extra name '{OPTIMIZER_EXTRA}' is the recorder's (the optimizer state); use another")
        numbers = {str(k): float(v) if torch.is_tensor(v) and v.numel() == 1 else v for k, v in (metrics or {}).items()}
        attrs: dict[str, Any] = {}
        if self.optimizer is not None:
            arrays[OPTIMIZER_EXTRA], attrs[OPTIMIZER_ATTR] = _optimizer_state(self.optimizer)
        privacy = None
        if self.privacy is not None:
            attrs[PRIVACY_ATTR] = _jsonable(self.privacy.state(), "the privacy state")
            privacy = self._privacy_record(step)
        self._writer.send(dict(step=step, epoch=epoch, epsilon=epsilon, metrics=numbers, attrs=attrs),
                          state, arrays, privacy)
        self._last = step
        if not self.background:
            self.flush()
        return self._store.root / self._name / f"step-{step:06d}.h5"

    def _check_step(self, step: Any) -> int:
        if self.privacy is not None:
            counted = int(self.privacy.steps())
            if step is None:
                step = counted
            elif step != counted:
                raise UsageError(f"step {step} but the privacy accountant counted {counted} noisy steps; a DP run's "
                                 "checkpoint steps are its noisy steps (omit step= to use the count)")
        if step is None:
            raise UsageError("give the checkpoint's step: rec.save(step, ...)")
        if torch.is_tensor(step) and step.numel() == 1 and not step.is_floating_point():
            step = int(step)
        if not _is_whole(step):
            raise UsageError(f"the step must be a whole number >= 0, got {step!r}")
        step = int(step)
        if step < 0:
            raise UsageError(f"the step must be a whole number >= 0, got {step}")
        last = self.last_step
        if last is not None and step <= last:
            raise UsageError(f"step {step} does not come after step {last}, the last checkpoint of run "
                             f"'{self.name}': a recorded trajectory only goes forward (continue after {last})")
        return step

    def _epoch(self, step: int, epoch: Any) -> float:
        if epoch is None:
            if self.steps_per_epoch is None:
                raise UsageError("give the checkpoint's epoch (save(step, epoch=...)) or steps_per_epoch= to the Recorder")
            return step / self.steps_per_epoch
        if not isinstance(epoch, (int, float, np.number)) or isinstance(epoch, bool):
            raise UsageError(f"the epoch must be a finite number >= 0, got {epoch!r}")
        epoch = float(epoch)
        if not math.isfinite(epoch) or epoch < 0:
            raise UsageError(f"the epoch must be a finite number >= 0, got {epoch}")
        return epoch

    def _epsilon(self, epsilon: Any) -> float | None:
        history = self.history
        if self.privacy is not None:
            if epsilon is not None:
                raise UsageError("epsilon comes from the privacy accountant; do not give epsilon= as well")
            own = self.privacy.epsilon(history.events) if history.events else self.privacy.epsilon()
            return float(own) + history.declared_epsilon
        if epsilon is None:
            return None
        if history.events or history.declared:
            raise UsageError("the parent checkpoint has a DP history that epsilon= would leave out; give privacy= "
                             "(a PrivacySource) and the recorder composes it")
        if not isinstance(epsilon, (int, float, np.number)) or isinstance(epsilon, bool):
            raise UsageError(f"epsilon must be a number >= 0, got {epsilon!r}")
        epsilon = float(epsilon)
        if math.isnan(epsilon) or epsilon < 0:
            raise UsageError(f"epsilon must be a number >= 0, got {epsilon}")
        return epsilon

    # -- continuing ---------------------------------------------------------------------------------

    def restore(self) -> int | None:
        """Put the last checkpoint back: the weights into the model, the optimizer's state, the privacy
        accountant's state. Returns its step (the loop continues after it), or None when there is none."""
        self.flush()
        last = self.last_step
        if last is None:
            return None
        ckpt = self._store.load(f"{self.name}@step={last}")
        self.model.load_state_dict(ckpt.state_dict, strict=True)
        if self.optimizer is not None:
            _load_optimizer_state(self.optimizer, ckpt)
        if self.privacy is not None and PRIVACY_ATTR in ckpt.attrs:
            self.privacy.load_state(ckpt.attrs[PRIVACY_ATTR])
        return last

    # -- the manifest -------------------------------------------------------------------------------

    def _privacy_record(self, steps: int) -> dict[str, Any]:
        base: dict[str, Any] = {"accounted": False}
        delta = None
        if self.privacy is not None:
            base = {**_jsonable(self.privacy.record(), "the privacy record"), "steps": int(steps), "accounted": True}
            delta = base.get("delta")
        return {**base, **self.history.manifest_fields(delta)}


# ------------------------------------------------------------------------------------- the writer process


def _open_run(store: Store, name: str, fields: dict[str, Any], lineage: dict[str, Any] | None,
              privacy: dict[str, Any], extra: dict[str, Any], privacy_record: Callable[[int], dict[str, Any]],
              ) -> tuple[Run, bool]:
    """In the writer process: create run ``name``, or open it (its lock) when it exists and this recorder would
    have created it. Returns the run and whether it was created."""
    if not (store.root / name / MANIFEST).is_file():
        return store.create_run(name, lineage=lineage, extra=extra, **fields), True
    run = store.open_run(name)
    try:
        _check_same(run, fields, lineage, privacy)
        if privacy.get("accounted"):  # a writer killed between a checkpoint and its manifest update
            infos = run.checkpoints()
            last = infos[-1].step if infos else 0
            if run.manifest["privacy"].get("steps") != last:
                run.update_manifest(privacy=privacy_record(last))
    except BaseException:
        run.close()
        raise
    return run, False


def _check_same(run: Run, fields: dict[str, Any], lineage: dict[str, Any] | None, privacy: dict[str, Any]) -> None:
    """Refuse, in one line, to write into a run this recorder would not have created."""
    manifest, name = run.manifest, run.name
    if not isinstance(manifest.get("recorder"), dict):
        by = ("landscape train" if "schedule" in manifest else
              "landscape import" if (manifest.get("lineage") or {}).get("imported_from") else "another writer")
        raise UsageError(f"run '{name}' was written by {by}, not by a Recorder; record into a new run name")
    for key, value in fields.items():
        if manifest.get(key) != _normal(value):
            raise UsageError(f"run '{name}' was recorded with another {key.replace('_', ' ')} "
                             f"({_short(manifest.get(key))}, now {_short(_normal(value))}); record into a new "
                             "run name")
    recorded_parent = manifest.get("lineage") or {}
    if recorded_parent.get("parent_sha256") != (lineage or {}).get("parent_sha256"):
        was = (f"from parent {recorded_parent.get('parent_run')}@step={recorded_parent.get('parent_step')}"
               if recorded_parent else "without a parent")
        now = f"parent {lineage['parent_ref']}" if lineage else "no parent"
        raise UsageError(f"run '{name}' was recorded {was}, now {now}; give the same parent= (or record into a new "
                         "run name)")
    fixed = {k: v for k, v in _normal(privacy).items() if k != "steps"}
    recorded = {k: v for k, v in (manifest.get("privacy") or {}).items() if k != "steps"}
    if recorded != fixed:
        raise UsageError(f"run '{name}' was recorded with other privacy settings ({_short(recorded)}, now "
                         f"{_short(fixed)}); record into a new run name")


class _Writer:
    """The parent's end of a recorder's writer process (module docstring): ``send`` one checkpoint, ``wait`` for
    it, ``stop``. The child is forked here and runs :func:`_serve`; it opens the run by calling ``opener``.

    Two pipes: jobs (a pickled header of plain values, then the tensors' bytes in one ``writev``: no copy in this
    process) and replies. The jobs pipe is enlarged where the system allows (Linux: up to 1 MiB for anyone), so
    that a small model's checkpoint is in the pipe at once, whether or not the writer runs at that moment."""

    def __init__(self, name: str, opener: Callable[[], tuple[Run, bool]]) -> None:
        self.name = name
        self.in_flight: int | None = None  # the step being written
        jobs_out, self.jobs = Pipe(duplex=False)
        self.replies, replies_in = Pipe(duplex=False)
        for size in (_PIPE_BYTES, 1 << 20):
            with contextlib.suppress(OSError, AttributeError):
                fcntl.fcntl(self.jobs.fileno(), fcntl.F_SETPIPE_SZ, size)
                break
        parent = self.owner = os.getpid()
        with warnings.catch_warnings():  # python >= 3.12 warns of forking a threaded process: the child takes
            warnings.simplefilter("ignore", DeprecationWarning)  # no lock another thread may hold (see _serve)
            pid = os.fork()
        if pid == 0:  # the writer process: never returns into the caller's code
            code = 1
            try:
                self.jobs.close()
                self.replies.close()
                code = _serve(jobs_out, replies_in, parent, opener)
            finally:
                os._exit(code)
        jobs_out.close()
        replies_in.close()
        self.pid: int | None = pid
        try:
            self.opened: int | None = self._reply("the run")
        except BaseException:
            self.stop()
            raise

    def send(self, header: dict[str, Any], state: Mapping[str, torch.Tensor], extra: Mapping[str, Any],
             privacy: dict[str, Any] | None) -> None:
        """Send one checkpoint (its bytes are in the pipe or the writer when this returns)."""
        layout, buffers, offset = [], [], 0
        items = [(("state_dict", key), value) for key, value in state.items()]
        items += [(("extra", *path), value) for path, value in _flatten(extra)]
        for path, value in items:
            spec, data = _pack(value)
            pad = -offset % _ALIGN  # each tensor at an aligned offset of the writer's buffer
            if pad:
                buffers.append(bytes(pad))
            offset += pad
            layout.append((path, spec, offset))
            if len(data):
                buffers.append(data)
            offset += spec[-1]
        if self.pid is None:
            raise UsageError(f"the recorder of run '{self.name}' is closed")
        try:
            self.jobs.send(("write", {**header, "privacy": privacy, "layout": layout, "nbytes": offset}))
            _write_all(self.jobs.fileno(), buffers)
        except OSError:
            raise self._died(f"checkpoint step {header['step']} was not written") from None
        self.in_flight = header["step"]

    def wait(self) -> None:
        """Wait for the checkpoint in flight; raise its error."""
        if self.in_flight is not None:
            step = self.in_flight
            try:
                self._reply(f"checkpoint step {step}")
            finally:
                self.in_flight = None

    def stop(self, *, discard_if_empty: bool = False) -> None:
        """Let the writer finish and release the run's lock (waited for), then exit (reaped in the background:
        tearing down a copy of the training process' address space takes tens of ms). Idempotent; a no-op in
        any other process (another recorder's writer, forked while this one was open, must not stop this one)."""
        if self.pid is None or os.getpid() != self.owner:
            return
        with contextlib.suppress(OSError, EOFError):
            self.jobs.send(("stop", discard_if_empty))
            self.replies.recv()  # the lock is released
        self.jobs.close()
        self.replies.close()
        pid, self.pid = self.pid, None
        with contextlib.suppress(ChildProcessError):  # reaped already (SIGCHLD ignored)
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                threading.Thread(target=_reap, args=(pid,), name=f"landscape-recorder-reap-{pid}", daemon=True).start()

    def shutdown(self) -> None:
        """At interpreter exit (or when a recorder is dropped unclosed): write the checkpoint in flight, stop."""
        if os.getpid() != self.owner:
            return
        try:
            self.wait()
        except Exception as exc:  # noqa: BLE001 (nothing can be raised to anyone here)
            print(f"error: landscape.Recorder could not write the last checkpoint of run '{self.name}': {exc}",
                  file=sys.stderr)
        finally:
            self.stop()

    def _reply(self, what: str) -> Any:
        try:
            status, value = self.replies.recv()
        except (EOFError, OSError):
            raise self._died(f"{what} was not written") from None
        if status == "error":
            raise _rebuild(value)
        return value

    def _died(self, what: str) -> CheckpointError:
        how = "ended"
        if self.pid is not None:
            with contextlib.suppress(ChildProcessError):
                _, status = os.waitpid(self.pid, 0)
                how = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else
                       f"exited with code {os.waitstatus_to_exitcode(status)}")
            self.pid = None
            self.jobs.close()
            self.replies.close()
        return CheckpointError(f"the writer process of run '{self.name}' {how}; {what}")


def _serve(jobs: Connection, replies: Connection, parent: int, opener: Callable[[], tuple[Run, bool]]) -> int:
    """The writer process: open the run, then write each checkpoint the parent sends until it says stop.

    Forked from the training process, it uses only what it made itself after the fork (the pipes, the run and
    its lock, new HDF5 files): no lock another thread of the parent may have held at the fork."""
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler
    try:
        run, created = opener()
        infos = run.checkpoints()
    except BaseException as exc:  # noqa: BLE001 (reported to the parent, which raises it)
        _answer(replies, ("error", _describe(exc)))
        return 1
    _answer(replies, ("ok", infos[-1].step if infos else None))
    discard = False
    try:
        while True:
            try:
                kind, message = jobs.recv()
                if kind == "stop":
                    discard = bool(message)
                    break
                buffer = bytearray(message["nbytes"])
                _read_all(jobs.fileno(), buffer)
            except (EOFError, OSError):
                return 0  # the parent is gone
            try:
                _write(run, message, buffer)
                reply: tuple[str, Any] = ("ok", None)
            except BaseException as exc:  # noqa: BLE001 (reported to the parent, which raises it)
                reply = ("error", _describe(exc))
            _answer(replies, reply)
    finally:
        if discard and created:
            with contextlib.suppress(Exception):
                if not run.checkpoints():
                    shutil.rmtree(run.path, ignore_errors=True)
        run.close()
    _answer(replies, ("ok", None))
    return 0


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _write_all(fd: int, buffers: list[Any]) -> None:
    """All of ``buffers`` into ``fd`` (``writev``: from their memory, no copy; partial writes continued)."""
    views = [memoryview(b).cast("B") for b in buffers]
    while views:
        done = os.writev(fd, views[:_IOV_MAX])
        while views and done >= len(views[0]):
            done -= len(views[0])
            views.pop(0)
        if done:
            views[0] = views[0][done:]


def _read_all(fd: int, buffer: bytearray) -> None:
    view, got = memoryview(buffer), 0
    while got < len(buffer):
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise EOFError("the recorder's parent is gone")
        got += n


def _write(run: Run, message: dict[str, Any], buffer: bytearray) -> None:
    state: dict[str, torch.Tensor] = {}
    extra: dict[str, Any] = {}
    for path, spec, offset in message["layout"]:
        value = _unpack(spec, buffer, offset)
        if path[0] == "state_dict":
            state[path[1]] = value
        else:
            node = extra
            for key in path[1:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = value
    run.save_checkpoint(state, step=message["step"], epoch=message["epoch"], epsilon=message["epsilon"],
                        metrics=message["metrics"], extra=extra or None, attrs=message["attrs"])
    if message["privacy"] is not None:
        run.update_manifest(privacy=message["privacy"])


def _answer(conn: Connection, reply: tuple[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the parent is gone: nobody to tell
        conn.send(reply)


def _describe(exc: BaseException) -> tuple[str, str, str]:
    return type(exc).__module__, type(exc).__qualname__, str(exc)


def _rebuild(described: tuple[str, str, str]) -> BaseException:
    """The writer's error in the parent: the same landscape error class (already imported: nothing is imported
    by name), anything else as a CheckpointError naming it."""
    module, qualname, message = described
    cls = getattr(sys.modules.get(module), qualname, None)
    if isinstance(cls, type) and issubclass(cls, LandscapeError):
        return cls(message)
    return CheckpointError(f"{qualname}: {message}")


def _pack(value: Any) -> tuple[tuple[Any, ...], Any]:
    """``(spec, bytes)`` of a CPU tensor or an array: ``spec`` = (kind, dtype, shape, byte count)."""
    if torch.is_tensor(value):
        flat = value.detach().contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy() if flat.numel() else b""
        return ("torch", str(value.dtype).removeprefix("torch."), tuple(value.shape), len(data)), data
    array = np.ascontiguousarray(value)
    if array.dtype.hasobject:
        raise UsageError(f"cannot store {type(value).__name__} of dtype {array.dtype}: not a numeric array")
    data = array.reshape(-1).view(np.uint8)
    return ("numpy", np.lib.format.dtype_to_descr(array.dtype), array.shape, data.nbytes), data


def _unpack(spec: tuple[Any, ...], buffer: bytearray, offset: int) -> Any:
    """A tensor or array of the writer's job buffer (a view: no copy)."""
    kind, dtype, shape, nbytes = spec
    if kind == "torch":
        dtype = getattr(torch, dtype)
        if not nbytes:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype).reshape(shape)
    dtype = np.lib.format.descr_to_dtype(dtype)
    if not nbytes:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(buffer, dtype=np.uint8, count=nbytes, offset=offset).view(dtype).reshape(shape)


def _flatten(arrays: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    for key, value in arrays.items():
        if isinstance(value, Mapping):
            out.extend(_flatten(value, (*prefix, str(key))))
        else:
            out.append(((*prefix, str(key)), value))
    return out


def _parent(store: Store, parent: Any, model_spec: dict[str, Any]
            ) -> tuple[Checkpoint | None, dict[str, Any] | None, PrivacyHistory]:
    """The parent checkpoint of ``parent=``, the run's lineage and the parent's privacy history."""
    if parent is None:
        return None, None, PrivacyHistory()
    if not isinstance(parent, (str, os.PathLike)) or not str(parent):
        raise UsageError(f"parent= must be a checkpoint reference ('run@last', 'run@step=N' or a file), got {parent!r}")
    ref = str(parent)
    ckpt = store.load(ref)
    if _normal(ckpt.model_spec) != _normal(model_spec):
        raise UsageError(f"the model ({_short(_normal(model_spec))}) is not the model of parent {ref} "
                         f"({_short(_normal(ckpt.model_spec))}); a child run keeps its parent's model")
    if ckpt.run is not None and (store.root / ckpt.run / MANIFEST).is_file() and \
            MASK_ARRAY in store.run(ckpt.run).array_names():
        raise UsageError(f"parent {ref} is a pruned run: a recorder cannot keep its pruned weights at zero in your "
                         "loop; train the child with landscape train --from")
    return ckpt, lineage_of(ckpt, ref), inherited_privacy(store, ckpt)


# ------------------------------------------------------------------------------------------- helpers


def _model_spec(model: nn.Module) -> dict[str, Any]:
    spec = getattr(model, "landscape_spec", None)
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise UsageError(f"the model ({type(model).__name__}) has no landscape_spec: build it with "
                         "landscape.models.build_model(...) so that analyses can rebuild it")
    return _jsonable(spec, "the model spec")


def _data_spec(data: Any) -> dict[str, Any]:
    spec = getattr(data, "spec", data)
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise UsageError("data= must be a landscape.data.Dataset (or its spec): analyses evaluate the run on it")
    return _jsonable(spec, "the data spec")


def _jsonable(value: Any, what: str) -> dict[str, Any]:
    try:
        return json.loads(json.dumps(to_jsonable(dict(value)), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{what} must be JSON-able (numbers, strings, lists, dicts): {exc}") from None


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(to_jsonable(value)))


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _recorder_record() -> dict[str, Any]:
    """How the run was recorded: the script (``__main__``) and its sha256, torch and python versions."""
    record: dict[str, Any] = {"format": RECORDER_FORMAT, "torch": torch.__version__,
                              "python": platform.python_version()}
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    if script and Path(script).is_file():
        record["script"] = str(Path(script).resolve())
        record["script_sha256"] = hashlib.sha256(Path(script).read_bytes()).hexdigest()
    return record


def _cpu_state(model: nn.Module, step: int) -> dict[str, torch.Tensor]:
    """The weights on the CPU (copied off an accelerator; CPU tensors are sent as they are, before
    :meth:`Recorder.save` returns), refused in one line when one is not finite."""
    state = {}
    for key, value in model.state_dict().items():
        value = value.detach()
        if (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all()):
            raise NonFiniteError(f"step {step}: tensor '{key}' of the model is not finite (NaN or inf); nothing "
                                 "was saved (training diverged? lower the learning rate)")
        state[key] = value.to("cpu")
    return state


def _device(model: nn.Module) -> str:
    """Where the model trains (``manifest["device"]``, as ``landscape train`` records it)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return str(tensor.device)
    return "cpu"


def _is_whole(value: Any) -> bool:
    """An integer (python or numpy), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _snapshot(value: Any) -> Any:
    """An extra array (or a mapping of them) on the CPU."""
    if isinstance(value, Mapping):
        return {str(k): _snapshot(v) for k, v in value.items()}
    if torch.is_tensor(value):
        return value.detach().to("cpu")
    return np.asarray(value)


def _optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors by "index/key", {"param_groups", "scalars"})`` of ``optimizer.state_dict()``."""
    sd = optimizer.state_dict()
    tensors: dict[str, Any] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entry in sd["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"{index}/{key}"] = value.detach().to("cpu")
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, _jsonable({"param_groups": sd["param_groups"], "scalars": scalars}, "the optimizer's settings")


def _load_optimizer_state(optimizer: torch.optim.Optimizer, ckpt: Checkpoint) -> None:
    meta = ckpt.attrs.get(OPTIMIZER_ATTR)
    if meta is None:
        raise UsageError(f"{ckpt.path} holds no optimizer state (the run was recorded without optimizer=)")
    state: dict[int, dict[str, Any]] = {}
    for name, value in ckpt.extra.items():
        if name.startswith(OPTIMIZER_EXTRA + "/"):
            index, key = name[len(OPTIMIZER_EXTRA) + 1:].split("/", 1)
            state.setdefault(int(index), {})[key] = torch.as_tensor(value)
    for index, entries in meta["scalars"].items():
        state.setdefault(int(index), {}).update(entries)
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
