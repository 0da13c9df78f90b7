"""The :class:`Recorder` (the package docstring, :mod:`landscape.recorder`, says what it guarantees)."""

from __future__ import annotations

import math
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from landscape.errors import CheckpointError, NonFiniteError, UsageError
from landscape.recorder.manifest import (
    RECORDER_FORMAT,
    close_run,
    data_spec,
    jsonable,
    open_run,
    parent_of,
    recorder_record,
)
from landscape.recorder.structure import HOW_TO_FIX, mismatch, model_spec, reference, unwrap
from landscape.store import Checkpoint, Run, RunBusyError, Store, check_run_name
from landscape.train.accounting import AccountantWarning, PrivacyEvent

__all__ = ["OPTIMIZER_ATTR", "OPTIMIZER_EXTRA", "PRIVACY_ATTR", "RECORDER_FORMAT", "WRITERS", "PrivacySource",
           "Recorder", "unwrap"]

OPTIMIZER_EXTRA = "optimizer"  # checkpoint extra group of the optimizer's tensors
OPTIMIZER_ATTR = "optimizer"  # checkpoint attr: its param groups and non-tensor state (JSON)
PRIVACY_ATTR = "privacy_state"  # checkpoint attr: the privacy source's state (e.g. Opacus' accountant history)
WRITERS = ("inline", "thread")
_OPEN: set[str] = set()  # the runs Recorders of this process hold: the store's lock is per process
_OPEN_LOCK = threading.Lock()


def _forget_in_child() -> None:
    """A forked child holds none of its parent's runs (the store forgets their locks there too)."""
    global _OPEN_LOCK
    _OPEN.clear()
    _OPEN_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


class PrivacySource(Protocol):
    """What the recorder asks a DP training loop's accountant (:class:`landscape.integrations.opacus.OpacusPrivacy`)."""

    def record(self) -> dict[str, Any]:
        """The run's fixed ``manifest["privacy"]`` fields (noise_multiplier, sample_rate, delta, accountant, ...)."""

    def steps(self) -> int:
        """Noisy steps taken so far."""

    def epsilon(self, ancestors: Sequence[PrivacyEvent] = ()) -> float:
        """Epsilon so far at ``record()["delta"]``, composed with the ``ancestors``' DP steps (given only when
        there are some: a run recorded from a parent checkpoint)."""

    def state(self) -> dict[str, Any]:
        """JSON-able state to continue from (stored with each checkpoint)."""

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Put a :meth:`state` back."""


class Recorder:
    """Writes the checkpoints of a training loop landscape does not run into run ``run`` of the store at ``root``.

    ``model``: the module being trained (any device; wrappers that only prefix its names are looked through,
    :func:`unwrap`), built by :func:`landscape.models.build_model` and with the tensors of the model its
    ``landscape_spec`` builds (checked here: analyses rebuild it from that spec). ``data``: the
    :class:`landscape.data.Dataset` it is trained on (or its spec). ``config``: the run's hyper-parameters
    (JSON-able; ``optimizer`` labels the run in hessian and norms tables). ``optimizer``: saved with each
    checkpoint and put back by :meth:`restore`. ``privacy``: a :class:`PrivacySource` (DP-SGD: checkpoints record
    its epsilon and step count). ``parent``: a store checkpoint the run starts from, as ``landscape train --from``
    (same model spec; a new run starts from its weights and records the lineage and privacy history).
    ``steps_per_epoch``: each checkpoint's epoch when :meth:`save` is not told it. ``seed``: recorded in
    ``manifest["seeds"]``. ``writer``: ``"inline"`` (each ``save`` writes before it returns) or ``"thread"``
    (``save`` copies the state and one worker thread writes it; a failed write is raised by the next ``save``,
    ``flush`` or ``close``).

    Use it as a context manager (or call :meth:`close`): it holds the run's write lock while it is open.
    """

    def __init__(
        self, root: str | Path, run: str, model: nn.Module, *, data: Any, config: Mapping[str, Any] | None = None,
        optimizer: torch.optim.Optimizer | None = None, privacy: PrivacySource | None = None,
        parent: str | os.PathLike | None = None, steps_per_epoch: int | None = None, seed: int | None = None,
        writer: str = "inline",
    ) -> None:
        check_run_name(run)
        if writer not in WRITERS:
            raise UsageError(f"writer must be one of {', '.join(map(repr, WRITERS))}, got {writer!r}")
        if steps_per_epoch is not None and not (_is_whole(steps_per_epoch) and steps_per_epoch >= 1):
            raise UsageError(f"steps_per_epoch must be a whole number >= 1, got {steps_per_epoch!r}")
        if seed is not None and not _is_whole(seed):
            raise UsageError(f"seed must be an integer, got {seed!r}")
        self.model = unwrap(model)
        spec = jsonable(model_spec(self.model), "the model spec")
        self._built = reference(spec)
        self._check_structure(self.model.state_dict(keep_vars=True), spec["name"])
        self.writer, self.optimizer, self.privacy = writer, optimizer, privacy
        self.steps_per_epoch = None if steps_per_epoch is None else int(steps_per_epoch)
        fields = dict(config=jsonable(config or {}, "config"), seeds={} if seed is None else {"seed": int(seed)},
                      model_spec=spec, data_spec=data_spec(data))
        self._store, self._name = Store(root), run
        parent_ckpt, lineage, self.history = parent_of(self._store, parent, spec)
        if privacy is not None:
            note = self.history.accountant_note(run, str(privacy.record().get("accountant")))
            if note is not None:
                warnings.warn(note, AccountantWarning, stacklevel=2)
        privacy_record = self._privacy_record(0)
        extra = {"device": _device(self.model), "privacy": privacy_record, "recorder": recorder_record()}
        key = os.path.realpath(self._store.root / run)
        with _OPEN_LOCK:
            if key in _OPEN:
                raise RunBusyError(f"run '{run}' is being written by another Recorder of this process; one writer "
                                   "per run: close that one first")
            self._sink = _Sink(*open_run(self._store, run, fields, lineage, privacy_record, extra), key,
                               writer == "thread")
        self._finalizer = weakref.finalize(self, self._sink.close_at_exit)
        infos = self._sink.run.checkpoints()
        self._last: int | None = infos[-1].step if infos else None
        if parent_ckpt is not None and self._last is None:
            try:
                self.model.load_state_dict(parent_ckpt.state_dict, strict=True)  # the run starts from its parent
            except BaseException:
                self._stop(discard=True)
                raise

    # -- the run ------------------------------------------------------------------------------------

    @property
    def run(self) -> Run:
        """The run as it is on disk now (for reading)."""
        return self._store.run(self._name)

    @property
    def name(self) -> str:
        return self._name

    @property
    def last_step(self) -> int | None:
        """The step of the last checkpoint saved (None before the first): a continued loop starts after it."""
        return self._last

    def flush(self) -> None:
        """Wait until the checkpoint being written (``writer="thread"``) is on disk, durably; raise its error."""
        try:
            self._sink.wait()
        except BaseException:
            self._resync()
            raise

    def _resync(self) -> None:
        """After a failed write: the last step is the run's on disk (the failed step may be saved again)."""
        try:
            infos = self.run.checkpoints()
        except CheckpointError:
            infos = []
        self._last = infos[-1].step if infos else None

    def close(self) -> None:
        """Wait for the checkpoint being written (raising its error), then release the run's write lock."""
        self._stop(discard=False)

    def _stop(self, *, discard: bool) -> None:
        self._finalizer.detach()
        try:
            self.flush()
        finally:
            self._sink.close(discard)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        try:
            self._stop(discard=kind is not None)  # failed before its first checkpoint: free the name
        except Exception:
            if kind is None:
                raise  # else the block's own error is the one to see

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
        if self._sink.closed:
            raise UsageError(f"the recorder of run '{self.name}' is closed")
        if os.getpid() != self._sink.owner:
            raise UsageError(f"the recorder of run '{self.name}' belongs to process {self._sink.owner}, which this "
                             "one was forked from; open a Recorder here (one writer per run)")
        self.flush()  # the last write's error first
        step = self._check_step(step)
        epoch = self._epoch(step, epoch)
        epsilon = self._epsilon(epsilon)
        copy = self.writer == "thread"  # training goes on while the thread writes: copy what is on the CPU too
        state = self.model.state_dict()
        self._check_structure(state, None)
        state = _cpu_state(state, step, copy)
        arrays = {str(k): _snapshot(v, str(k), copy) for k, v in (extra or {}).items()}
        if OPTIMIZER_EXTRA in arrays:
            raise UsageError(f"extra name '{OPTIMIZER_EXTRA}' is the recorder's (the optimizer state); use another")
        numbers = {str(k): _metric(str(k), v) for k, v in (metrics or {}).items()}
        attrs: dict[str, Any] = {}
        if self.optimizer is not None:
            arrays[OPTIMIZER_EXTRA], attrs[OPTIMIZER_ATTR] = _optimizer_state(self.optimizer, copy)
        privacy = None
        if self.privacy is not None:
            attrs[PRIVACY_ATTR] = jsonable(self.privacy.state(), "the privacy state")
            privacy = self._privacy_record(step)

        def write(run: Run) -> None:
            run.save_checkpoint(state, step=step, epoch=epoch, epsilon=epsilon, metrics=numbers,
                                extra=arrays or None, attrs=attrs)
            if privacy is not None:
                run.update_manifest(privacy=privacy)

        try:
            self._sink.write(write)
        except BaseException:
            self._resync()
            raise
        self._last = step
        return self._store.root / self._name / f"step-{step:06d}.h5"

    def _check_structure(self, state: Mapping[str, Any], name: str | None) -> None:
        what = mismatch(self._built, state)
        if what is not None:
            model = f"the model is not the one its spec ('{name}') builds" if name else \
                "the model has changed since the Recorder opened"
            raise UsageError(f"{model}: {what}; {HOW_TO_FIX}")

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
        if not _is_whole(step) or step < 0:
            raise UsageError(f"the step must be a whole number >= 0, got {step!r}")
        step = int(step)
        if self._last is not None and step <= self._last:
            raise UsageError(f"step {step} does not come after step {self._last}, the last checkpoint of run "
                             f"'{self.name}': a recorded trajectory only goes forward (continue after {self._last})")
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
        if self._last is None:
            return None
        ckpt = self._store.load(f"{self.name}@step={self._last}")
        self.model.load_state_dict(ckpt.state_dict, strict=True)
        if self.optimizer is not None:
            _load_optimizer_state(self.optimizer, ckpt)
        if self.privacy is not None and PRIVACY_ATTR in ckpt.attrs:
            self.privacy.load_state(ckpt.attrs[PRIVACY_ATTR])
        return self._last

    def _privacy_record(self, steps: int) -> dict[str, Any]:
        base: dict[str, Any] = {"accounted": False}
        delta = None
        if self.privacy is not None:
            base = {**jsonable(self.privacy.record(), "the privacy record"), "steps": int(steps), "accounted": True}
            delta = base.get("delta")
        return {**base, **self.history.manifest_fields(delta)}


class _Sink:
    """The open run and who writes into it: the caller (``write`` returns once the checkpoint is durable) or one
    worker thread (``write`` returns at once; at most one checkpoint is in flight, so the next ``write`` first
    waits for it and raises its error)."""

    def __init__(self, run: Run, created: bool, key: str, threaded: bool) -> None:
        self.run, self.created, self.key, self.owner, self.closed = run, created, key, os.getpid(), False
        _OPEN.add(key)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"landscape-recorder-{run.name}") if threaded else None
        self.pending: Future | None = None

    def write(self, job) -> None:
        if self.pool is None:
            job(self.run)
        else:
            self.wait()
            self.pending = self.pool.submit(job, self.run)

    def wait(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def close(self, discard: bool) -> None:
        if self.closed or os.getpid() != self.owner:  # a forked child shares nothing it may release
            return
        self.closed = True
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        with _OPEN_LOCK:
            _OPEN.discard(self.key)
        close_run(self.run, discard and self.created)

    def close_at_exit(self) -> None:
        """An unclosed recorder at interpreter exit (or garbage collected): write what is in flight, release."""
        if os.getpid() != self.owner:
            return
        try:
            self.wait()
        except Exception as exc:  # noqa: BLE001 (nobody to raise it to)
            print(f"error: landscape.Recorder could not write the last checkpoint of run '{self.run.name}': {exc}",
                  file=sys.stderr)
        finally:
            self.close(False)


# ------------------------------------------------------------------------------------------- helpers


def _cpu_state(state: Mapping[str, torch.Tensor], step: int, copy: bool) -> dict[str, torch.Tensor]:
    """The weights on the CPU (copies when ``copy``), refused in one line when one is not finite."""
    state = {key: value.detach() for key, value in state.items()}
    inexact = [value for value in state.values() if value.is_floating_point() or value.is_complex()]
    if inexact and not _norms_finite(inexact):
        for key, value in state.items():
            if (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all()):
                raise NonFiniteError(f"step {step}: tensor '{key}' of the model is not finite (NaN or inf); "
                                     "nothing was saved (training diverged? lower the learning rate)")
    return {key: value.to("cpu", copy=copy) for key, value in state.items()}


def _norms_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether the 2-norms of ``tensors`` are all finite (one ``torch._foreach_norm``, one synchronisation per
    device). True means every element is finite; False may also be a norm that overflowed."""
    try:
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for norm in torch._foreach_norm(tensors):
            by_device.setdefault(norm.device, []).append(norm)
        return all(bool(torch.stack(norms).isfinite().all()) for norms in by_device.values())
    except RuntimeError:  # a tensor _foreach_norm does not take: the exact check decides
        return False


def _device(model: nn.Module) -> str:
    """Where the model trains (``manifest["device"]``, as ``landscape train`` records it)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return str(tensor.device)
    return "cpu"


def _is_whole(value: Any) -> bool:
    """An integer (python or numpy), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _metric(name: str, value: Any) -> Any:
    """A metric as the manifest holds it (a one-element tensor as a float), refused in one line when it is not one
    number (or a string, a boolean, None)."""
    if torch.is_tensor(value) and value.numel() == 1:
        return float(value)
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise UsageError(f"metric '{name}' must be a number, got {type(value).__name__}")


def _snapshot(value: Any, name: str, copy: bool) -> Any:
    """An extra array (or a mapping of them) on the CPU; a copy when ``copy``."""
    if isinstance(value, Mapping):
        return {str(k): _snapshot(v, f"{name}/{k}", copy) for k, v in value.items()}
    if torch.is_tensor(value):
        return value.detach().to("cpu", copy=copy)
    array = np.array(value, copy=copy or None)
    if array.dtype.hasobject:
        raise UsageError(f"cannot store extra '{name}': {type(value).__name__} of dtype {array.dtype} is not a "
                         "numeric array")
    return array


def _optimizer_state(optimizer: torch.optim.Optimizer, copy: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors by "index/key", {"param_groups", "scalars"})`` of ``optimizer.state_dict()``."""
    sd = optimizer.state_dict()
    tensors: dict[str, Any] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entry in sd["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"{index}/{key}"] = value.detach().to("cpu", copy=copy)
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, jsonable({"param_groups": sd["param_groups"], "scalars": scalars}, "the optimizer's settings")


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
