"""The ``Recorder``: what a ``save`` checks and copies, and who writes it (the caller, or one thread)."""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from landscape import plugins
from landscape.errors import IncompatibleError, NonFiniteError, UsageError
from landscape.params import dtype_kind, first_mismatch, plain_names, unwrap
from landscape.privacy import PrivacyEvent
from landscape.recorder.manifest import (
    close_run,
    data_spec,
    jsonable,
    model_spec,
    open_run,
    parent_of,
    recorder_record,
)
from landscape.store import Checkpoint, Run, RunBusyError, Store, check_run_name
from landscape.train.accounting import AccountantWarning

OPTIMIZER_EXTRA = "optimizer"  # checkpoint extra group of the optimizer's tensors
OPTIMIZER_ATTR = "optimizer"  # checkpoint attr: its param groups and non-tensor state (JSON)
PRIVACY_ATTR = "privacy_state"  # checkpoint attr: the privacy source's state (e.g. Opacus' accountant history)
WRITERS = ("inline", "thread")
# The runs open Recorders of this process write: the store's lock is per process, so it would let a second one in.
_OPEN: set[str] = set()
_OPEN_LOCK = threading.Lock()


def _forget_open_runs() -> None:
    """A forked child holds none of its parent's runs (the store forgets their locks there too)."""
    global _OPEN_LOCK
    _OPEN.clear()
    _OPEN_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_open_runs)
# Held by every checkpoint write. A fork waits for it: a child that inherited an HDF5 file half written by another
# thread would write its stale copy into that file when it exits.
_WRITING = threading.Lock()
os.register_at_fork(before=_WRITING.acquire, after_in_parent=_WRITING.release, after_in_child=_WRITING.release)


class PrivacySource(Protocol):
    """What the recorder asks a DP training loop's accountant (``landscape.integrations.opacus.OpacusPrivacy``)."""

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
        """Put a ``state`` back."""


class Recorder:
    """Writes the checkpoints of a training loop landscape does not run into run ``run`` of the store at ``root``;
    use it as a context manager (or call ``close``): it holds the run's write lock while open.

    ``model``: built by ``landscape.models.build_model``, on any device, possibly wrapped (``torch.compile``,
    ``DataParallel``, ``DistributedDataParallel``, Opacus' ``GradSampleModule``: looked through); its tensors must
    stay those of the model its spec builds, checked here and at every save. ``data``: the ``Dataset`` (or its
    spec). ``config``: JSON-able hyper-parameters. ``optimizer``: saved with each checkpoint, put back by
    ``restore``. ``privacy``: a ``PrivacySource`` (checkpoints record its epsilon and step count). ``parent``: a
    checkpoint the run starts from, as ``landscape train --from``. ``steps_per_epoch``: each checkpoint's epoch
    when ``save`` is not told it. ``seed``: recorded in ``manifest["seeds"]``. ``writer``: ``"inline"`` (``save``
    writes durably before it returns) or ``"thread"`` (one background thread writes; a failed write is raised by
    the next ``save``, ``flush`` or ``close``).
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
        if not isinstance(model, nn.Module):
            raise UsageError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if steps_per_epoch is not None and not (_is_whole(steps_per_epoch) and steps_per_epoch >= 1):
            raise UsageError(f"steps_per_epoch must be a whole number >= 1, got {steps_per_epoch!r}")
        if seed is not None and not _is_whole(seed):
            raise UsageError(f"seed must be an integer, got {seed!r}")
        self.model, self.optimizer, self.privacy, self.writer = model, optimizer, privacy, writer
        self.steps_per_epoch = None if steps_per_epoch is None else int(steps_per_epoch)
        fields = dict(config=jsonable(config or {}, "config"), seeds={} if seed is None else {"seed": int(seed)},
                      model_spec=model_spec(model), data_spec=data_spec(data))
        self._reference = _reference(fields["model_spec"])
        self._names = plain_names(model)
        self._state(None)  # the structure check, before anything is written
        self._store, self._name = Store(root), run
        parent_ckpt, lineage, self.history = parent_of(self._store, parent, fields["model_spec"])
        if privacy is not None:  # an accountant other than the one the parent's epsilon came from: say so
            note = self.history.accountant_note(run, str(privacy.record().get("accountant")))
            if note is not None:
                warnings.warn(note, AccountantWarning, stacklevel=2)
        privacy_record = self._privacy_record(0)
        device = next((str(t.device) for t in (*model.parameters(), *model.buffers())), "cpu")  # as train records it
        extra = {"device": device, "privacy": privacy_record, "recorder": recorder_record()}
        self._writer = _Writer(self._store, run, writer == "thread",
                               functools.partial(open_run, self._store, run, fields, lineage, privacy_record, extra))
        self._finalizer = weakref.finalize(self, self._writer.close)
        self._last: int | None = self._writer.last
        if parent_ckpt is not None and self._last is None:
            try:
                self._load(parent_ckpt.state_dict)  # the run starts from its parent
            except BaseException:
                self._finalizer.detach()
                self._writer.close(discard_if_empty=True)
                raise

    @property
    def run(self) -> Run:
        """The run as it is on disk now (for reading; the recorder holds its write lock)."""
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
            self._writer.wait()
        except BaseException:
            self._resync()
            raise

    def close(self) -> None:
        """``flush``, then release the run's write lock (the checkpoints stay). Idempotent."""
        self.__exit__(None)

    def _resync(self) -> None:
        """After a failed write: the last step is the run's on disk (the failed step may be saved again)."""
        infos = self.run.checkpoints()
        self._last = infos[-1].step if infos else None

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
            self._writer.close(discard_if_empty=kind is not None)  # failed before its first checkpoint: free the name

    def save(
        self, step: int | None = None, *, epoch: float | None = None, epsilon: float | None = None,
        metrics: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write the model's current weights as checkpoint ``step`` (after the run's last; with a privacy source,
        its count of noisy steps, the default) and return the file. ``epoch`` defaults to ``step /
        steps_per_epoch``; ``metrics``: numbers stored with the checkpoint; ``extra``: arrays beside the weights."""
        self._writer.check_usable()
        step = self._check_step(step)
        epoch = self._epoch(step, epoch)
        epsilon = self._epsilon(epsilon)
        copy = self.writer == "thread"  # the loop goes on changing the model while the thread writes
        state = {key: value.to("cpu", copy=copy) for key, value in self._state(step).items()}
        arrays = {str(k): _snapshot(v, copy) for k, v in (extra or {}).items()}
        if OPTIMIZER_EXTRA in arrays:
            raise UsageError(f"extra name '{OPTIMIZER_EXTRA}' is the recorder's (the optimizer state); use another")
        numbers = {str(k): _number(k, v) for k, v in (metrics or {}).items()}
        attrs: dict[str, Any] = {}
        if self.optimizer is not None:
            arrays[OPTIMIZER_EXTRA], attrs[OPTIMIZER_ATTR] = _optimizer_state(self.optimizer, copy)
        privacy = None
        if self.privacy is not None:
            attrs[PRIVACY_ATTR] = jsonable(self.privacy.state(), "the privacy state")
            privacy = self._privacy_record(step)
        try:
            self._writer.write(functools.partial(
                _write, state=state, privacy=privacy, step=step, epoch=epoch, epsilon=epsilon, metrics=numbers,
                extra=arrays or None, attrs=attrs))
        except BaseException:
            self._resync()
            raise
        self._last = step
        return self._store.root / self._name / f"step-{step:06d}.h5"

    def _state(self, step: int | None) -> dict[str, torch.Tensor]:
        """The model's state dict under the names of the model its spec builds, refused in one line when it is not
        that model's (``step`` None: at open) or a tensor is not finite."""
        state = self.model.state_dict()
        if state.keys() != self._names.keys():  # a module replaced since: the names again
            self._names = plain_names(self.model)
        state = {self._names[key]: value.detach() for key, value in state.items()}
        _check_structure(self._reference, state, self.model, step)
        if step is not None:
            _check_finite(state, step)
        return state

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

    def restore(self) -> int | None:
        """Put the last checkpoint back: the weights into the model, the optimizer's state, the privacy
        accountant's state. Returns its step (the loop continues after it), or None when there is none."""
        self.flush()
        last = self.last_step
        if last is None:
            return None
        ckpt = self._store.load(f"{self.name}@step={last}")
        self._load(ckpt.state_dict)
        if self.optimizer is not None:
            _load_optimizer_state(self.optimizer, ckpt)
        if self.privacy is not None and PRIVACY_ATTR in ckpt.attrs:
            self.privacy.load_state(ckpt.attrs[PRIVACY_ATTR])
        return last

    def _load(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load a stored state dict (the names of the model its spec builds) into the model, through its wrappers."""
        own = {plain: key for key, plain in plain_names(self.model).items()}
        self.model.load_state_dict({own.get(key, key): value for key, value in state.items()}, strict=True)

    def _privacy_record(self, steps: int) -> dict[str, Any]:
        base: dict[str, Any] = {"accounted": False}
        delta = None
        if self.privacy is not None:
            base = {**jsonable(self.privacy.record(), "the privacy record"), "steps": int(steps), "accounted": True}
            delta = base.get("delta")
        return {**base, **self.history.manifest_fields(delta)}


class _Writer:
    """The open run of a recorder and who writes into it: the caller, or one background thread with at most one
    checkpoint in flight (a save waits for the one before; a failed write's error is raised to the next call)."""

    def __init__(self, store: Store, name: str, thread: bool, opener: Callable[[], tuple[Run, bool]]) -> None:
        self.name, self.pid = name, os.getpid()
        self.run: Run | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.pending: Future | None = None
        self.key = os.path.realpath(store.root / name)
        with _OPEN_LOCK:
            if self.key in _OPEN:
                raise RunBusyError(f"run '{name}' is being written by another Recorder of this process; one writer "
                                   "per run: close that one first")
            _OPEN.add(self.key)
        try:
            self.run, self.created = opener()
            infos = self.run.checkpoints()
        except BaseException:
            self.close()
            raise
        self.last = infos[-1].step if infos else None
        if thread:
            self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"landscape-recorder-{name}")

    def check_usable(self) -> None:
        if self.run is None:
            raise UsageError(f"the recorder of run '{self.name}' is closed")
        if os.getpid() != self.pid:
            raise UsageError(f"the recorder of run '{self.name}' belongs to process {self.pid}, of which this one "
                             "is a fork: save from the process that opened it")

    def write(self, job: Callable[[Run], None]) -> None:
        self.wait()
        self.check_usable()
        if self.pool is None:
            job(self.run)
        else:
            self.pending = self.pool.submit(job, self.run)

    def wait(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def close(self, *, discard_if_empty: bool = False) -> None:
        """Finish the write in flight, then release the run's lock (with ``discard_if_empty``, remove a run this
        recorder created that holds no checkpoint). A no-op in a forked child (its parent holds the lock)."""
        if os.getpid() != self.pid:
            return
        try:
            self.wait()
        except Exception as exc:  # noqa: BLE001 (at exit or when dropped unclosed: nobody to raise to)
            print(f"error: landscape.Recorder could not write the last checkpoint of run '{self.name}': {exc}",
                  file=sys.stderr)
        finally:
            if self.pool is not None:
                self.pool.shutdown()
                self.pool = None
            run, self.run = self.run, None
            with _OPEN_LOCK:
                _OPEN.discard(self.key)
            if run is not None:
                close_run(run, discard_if_empty and self.created)


def _write(run: Run, *, state: dict[str, torch.Tensor], privacy: dict[str, Any] | None, **checkpoint: Any) -> None:
    """One checkpoint through the store, then a DP run's privacy record (its step count) into the manifest."""
    with _WRITING:
        run.save_checkpoint(state, **checkpoint)
        if privacy is not None:
            run.update_manifest(privacy=privacy)


def _reference(spec: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors (on the meta device: names, shapes, dtypes) of the model ``spec`` builds, as every analysis
    rebuilds it; the code it names is the code the caller's model came from. Built on the meta device (no memory
    for weights) unless the factory needs real tensors; torch's random state is left as it was."""
    from landscape.models import model_from_spec

    code = spec.get("code")
    refs = [f"{code.get('file') if code.get('kind') == 'file' else code.get('module')}:{code.get('attr')}"
            ] if isinstance(code, Mapping) else []
    with torch.random.fork_rng(devices=[]), plugins.trusting(refs):
        try:
            with torch.device("meta"):
                built = model_from_spec(spec)
        except Exception:  # noqa: BLE001 (a factory that reads values, say: built as analyses build it)
            built = model_from_spec(spec)
    return {key: value.to("meta") for key, value in built.state_dict().items()}


def _check_structure(reference: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor], model: nn.Module,
                     step: int | None) -> None:
    """Refuse, in one line saying what differs and how to fix it, a model whose state no analysis could load."""
    m = first_mismatch(reference, state, dtypes=True)
    if m is None:
        return
    prefix = next(iter(state), "").partition(".")[0] + "."
    if all(key.startswith(prefix) for key in state) and {k[len(prefix):] for k in state} == set(reference):
        raise UsageError(
            f"the model's state dict names start '{prefix}': a {type(unwrap(model)).__name__} around the model, a "
            "wrapper the Recorder does not look through (it looks through torch.compile, DataParallel, "
            "DistributedDataParallel and Opacus' GradSampleModule); give it the model inside")
    if m.kind == "only_a":
        what = f"tensor '{m.name}' is missing (the spec's model has it)"
    elif m.kind == "only_b":
        what = f"tensor '{m.name}' is not in the spec's model"
    elif m.kind == "shape":
        what = f"tensor '{m.name}' is {tuple(m.b)} here, {tuple(m.a)} in the spec's model"
    else:
        what = f"tensor '{m.name}' is {_dtype(m.b)} here, {_dtype(m.a)} in the spec's model"
    when = "" if step is None else f"step {step}: "
    raise IncompatibleError(
        f"{when}the model is not the one its landscape_spec builds: {what}; analyses rebuild the model from the "
        "spec, so they could not read this run (nothing was written). Make the same change inside the model's "
        "factory (e.g. call Opacus' ModuleValidator.fix there), or build the model with "
        "landscape.models.build_model from a factory that returns the changed model")


def _dtype(dtype: Any) -> str:
    return f"{str(dtype).removeprefix('torch.')} ({dtype_kind(dtype)})"


def _check_finite(state: Mapping[str, torch.Tensor], step: int) -> None:
    """Refuse weights that are not finite, naming the first such tensor. One ``_foreach_norm`` (one
    synchronisation per device) clears them all: a NaN or an infinity makes its tensor's norm one; a norm that
    overflowed only costs the exact check."""
    inexact = [value for value in state.values() if value.is_floating_point() or value.is_complex()]
    if not inexact:
        return
    try:
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for norm in torch._foreach_norm(inexact):
            by_device.setdefault(norm.device, []).append(norm)
        if all(bool(torch.stack(norms).isfinite().all()) for norms in by_device.values()):
            return
    except RuntimeError:  # a tensor _foreach_norm does not take: the exact check decides
        pass
    for key, value in state.items():
        if (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all()):
            raise NonFiniteError(f"step {step}: tensor '{key}' of the model is not finite (NaN or inf); "
                                 "nothing was saved (training diverged? lower the learning rate)")


def _is_whole(value: Any) -> bool:
    """An integer (python or numpy), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _number(name: Any, value: Any) -> float | int:
    """A metric: a number (a one-element tensor or numpy scalar becomes one)."""
    if (torch.is_tensor(value) and value.numel() == 1) or isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"metric '{name}' must be a number, got {type(value).__name__}")
    return value


def _snapshot(value: Any, copy: bool) -> Any:
    """An extra array (or a mapping of them) on the CPU; numeric only."""
    if isinstance(value, Mapping):
        return {str(k): _snapshot(v, copy) for k, v in value.items()}
    if torch.is_tensor(value):
        if value.layout != torch.strided:
            raise UsageError("cannot store a sparse tensor: only dense tensors are supported")
        return value.detach().to("cpu", copy=copy)
    array = np.array(value, copy=copy) if copy else np.asarray(value)
    if array.dtype.hasobject:
        raise UsageError(f"cannot store {type(value).__name__} of dtype {array.dtype}: not a numeric array")
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

