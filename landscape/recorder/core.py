"""The :class:`Recorder` (the package docstring, :mod:`landscape.recorder`, says what it guarantees): what a
``save`` checks and copies in the training process, the run's manifest record, continuing a run."""


from __future__ import annotations

import functools
import math
import os
import sys
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from landscape.errors import CheckpointError, NonFiniteError, UsageError
from landscape.privacy import PrivacyEvent
from landscape.recorder.manifest import (
    RECORDER_FORMAT,
    data_spec,
    jsonable,
    model_spec,
    open_run,
    parent_of,
    recorder_record,
)
from landscape.recorder.writer import InlineWriter, Writer
from landscape.store import Checkpoint, Run, Store, check_run_name

__all__ = ["OPTIMIZER_ATTR", "OPTIMIZER_EXTRA", "PRIVACY_ATTR", "RECORDER_FORMAT", "PrivacySource", "Recorder", "unwrap"]

OPTIMIZER_EXTRA = "optimizer"  # checkpoint extra group of the optimizer's tensors
OPTIMIZER_ATTR = "optimizer"  # checkpoint attr: its param groups and non-tensor state (JSON)
PRIVACY_ATTR = "privacy_state"  # checkpoint attr: the privacy source's state (e.g. Opacus' accountant history)
WRITERS = ("auto", "process", "inline")


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
    epoch when :meth:`save` is not told it. ``seed``: recorded in ``manifest["seeds"]``. ``writer``: where
    checkpoints are written, ``"auto"`` (``"process"`` when a CPU core is free for it, else ``"inline"``),
    ``"inline"`` (in this process, before ``save`` returns) or ``"process"`` (a writer process, while training
    goes on); the module docstring says what each costs. ``background``: with the
    writer process, ``False`` makes each ``save`` wait until its checkpoint is written.

    Use it as a context manager (or call :meth:`close`): it holds the run's write lock (through its writer
    process, or this process inline) while it is open. :attr:`writer` is the writer chosen.
    """

    def __init__(
        self, root: str | Path, run: str, model: nn.Module, *, data: Any, config: Mapping[str, Any] | None = None,
        optimizer: torch.optim.Optimizer | None = None, privacy: PrivacySource | None = None,
        parent: str | os.PathLike | None = None, steps_per_epoch: int | None = None, seed: int | None = None,
        background: bool = True, writer: str = "auto",
    ) -> None:
        check_run_name(run)
        if writer not in WRITERS:
            raise UsageError(f"writer must be one of {', '.join(map(repr, WRITERS))}, got {writer!r}")
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
        fields = dict(config=jsonable(config or {}, "config"), seeds={} if seed is None else {"seed": seed},
                      model_spec=model_spec(self.model), data_spec=data_spec(data))
        store = Store(root)
        self._store = store
        self._name = run
        parent_ckpt, lineage, self.history = parent_of(store, parent, fields["model_spec"])
        privacy_record = self._privacy_record(0)
        extra = {"device": _device(self.model), "privacy": privacy_record, "recorder": recorder_record()}
        if writer == "auto":
            writer = "process" if spare_cores(self.model) >= 1 and sys.executable else "inline"
        self.writer = writer
        init = dict(root=os.path.abspath(store.root), name=run, fields=fields, lineage=lineage,
                    privacy=privacy_record, extra=extra)
        # A run to continue (or a name taken) is opened before this returns, so that a run written by anyone
        # else, or by a live writer, is refused here; a writer process creates a new run while training starts.
        self._writer: Writer | InlineWriter = (
            InlineWriter(run, functools.partial(open_run, store, **{k: v for k, v in init.items() if k != "root"}))
            if writer == "inline" else Writer(run, init, wait_open=os.path.lexists(store.root / run)))
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
        """The run as it is on disk now (for reading; the recorder's writer holds the lock)."""
        self._writer.wait_open()
        return self._store.run(self._name)

    @property
    def name(self) -> str:
        return self._name

    @property
    def last_step(self) -> int | None:
        """The step of the last checkpoint saved (None before the first): a continued loop starts after it."""
        return self._last

    def flush(self) -> None:
        """Wait until every checkpoint in flight is on disk (durably); raise a failed write's error."""
        try:
            self._writer.wait()
        except BaseException:
            self._resync()
            raise

    def _resync(self) -> None:
        """After a failed write: the last step is the run's on disk (the failed step may be saved again)."""
        try:
            infos = self.run.checkpoints()
        except CheckpointError:
            infos = []  # the run could not be created
        self._last = infos[-1].step if infos else None

    def close(self) -> None:
        """Write the checkpoints in flight (as :meth:`flush`: a failed write's error is raised), then stop the
        writer (a writer process exits), which releases the run's write lock (the checkpoints stay)."""
        try:
            self._finish()
        finally:
            self._finalizer.detach()
            self._writer.stop()

    def _finish(self, *, discard_if_empty: bool = False) -> None:
        """Write what is in flight and stop the writer (one round trip: :meth:`Writer.finish`)."""
        try:
            self._writer.finish(discard_if_empty=discard_if_empty)
        except BaseException:
            self._resync()
            raise

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        try:
            self._finish(discard_if_empty=kind is not None)  # failed before its first checkpoint: free the name
        except Exception:
            if kind is None:
                raise  # else the block's own error is the one to see
        finally:
            self._finalizer.detach()
            self._writer.stop(discard_if_empty=kind is not None)

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
            attrs[PRIVACY_ATTR] = jsonable(self.privacy.state(), "the privacy state")
            privacy = self._privacy_record(step)
        try:
            self._writer.send(dict(step=step, epoch=epoch, epsilon=epsilon, metrics=numbers, attrs=attrs),
                              state, arrays, privacy)
        except BaseException:
            self._resync()
            raise
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
            base = {**jsonable(self.privacy.record(), "the privacy record"), "steps": int(steps), "accounted": True}
            delta = base.get("delta")
        return {**base, **self.history.manifest_fields(delta)}


# ------------------------------------------------------------------------------------------- helpers



def _cpu_state(model: nn.Module, step: int) -> dict[str, torch.Tensor]:
    """The weights on the CPU (copied off an accelerator; CPU tensors are sent as they are, before
    :meth:`Recorder.save` returns), refused in one line when one is not finite."""
    state = {key: value.detach() for key, value in model.state_dict().items()}
    inexact = [value for value in state.values() if value.is_floating_point() or value.is_complex()]
    if inexact and not _norms_finite(inexact):
        for key, value in state.items():
            if (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all()):
                raise NonFiniteError(f"step {step}: tensor '{key}' of the model is not finite (NaN or inf); "
                                     "nothing was saved (training diverged? lower the learning rate)")
    return {key: value.to("cpu") for key, value in state.items()}


def _norms_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether the 2-norms of ``tensors`` are all finite, from one ``torch._foreach_norm`` call and one
    synchronisation per device. A NaN or an infinity makes its tensor's norm one, so True means every element
    is finite; False may also be a norm that overflowed (the caller then checks tensor by tensor)."""
    try:
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for norm in torch._foreach_norm(tensors):
            by_device.setdefault(norm.device, []).append(norm)
        return all(bool(torch.stack(norms).isfinite().all()) for norms in by_device.values())
    except RuntimeError:  # a tensor _foreach_norm does not take: the exact check decides
        return False


def spare_cores(model: nn.Module) -> int:
    """CPU cores this process may run on that its training loop leaves free (``writer="auto"``): the loop of a
    model on the CPU keeps ``torch.get_num_threads()`` cores busy, one on an accelerator (its Python thread)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return cores - (torch.get_num_threads() if _device(model) == "cpu" else 1)


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
