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
python versions) and ``privacy`` (a DP run's noise multiplier, sample rate, clipping norm, delta, accountant;
:mod:`landscape.integrations.opacus` reads them from an Opacus ``PrivacyEngine``; else a run without privacy
guarantee), so ``landscape train --from`` a recorded checkpoint composes its DP steps like a trained parent's.

Writing in the background: :meth:`Recorder.save` copies what it records (weights and optimizer state to CPU
tensors, metrics to numbers, the privacy accountant's epsilon and state) before it returns, and writes the
files in the recorder's writer thread while training goes on; at most one checkpoint is in flight (the next
``save`` waits for it), :meth:`Recorder.flush`, :meth:`Recorder.close` and the end of the ``with`` block wait
for the last one and raise a failed write's error, and it is written at interpreter exit too. A process killed mid-write loses at
most that checkpoint; the store's atomic writes keep every file and the manifest whole (``background=False``
writes before ``save`` returns).

Continuing a killed run: the same ``Recorder(root, run, ...)`` again opens the run (with the same model, data,
config and privacy; anything else is refused in one line), :meth:`Recorder.restore` puts the last checkpoint's
weights, optimizer state and privacy accountant back and returns its step, and :meth:`Recorder.save` refuses
any step that does not come after it. A run written by anyone else (``landscape train``, ``import``, another
model or data set) is never written to. Weights that are not finite are refused, nothing saved.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import math
import platform
import queue
import shutil
import sys
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from landscape.errors import NonFiniteError, UsageError
from landscape.results import to_jsonable
from landscape.store import MANIFEST, Checkpoint, Run, Store, check_run_name
from landscape.train.accounting import PrivacyHistory

RECORDER_FORMAT = "landscape-recorder/1"
OPTIMIZER_EXTRA = "optimizer"  # checkpoint extra group of the optimizer's tensors
OPTIMIZER_ATTR = "optimizer"  # checkpoint attr: its param groups and non-tensor state (JSON)
PRIVACY_ATTR = "privacy_state"  # checkpoint attr: the privacy source's state (e.g. Opacus' accountant history)


class PrivacySource(Protocol):
    """What the recorder asks a DP training loop's accountant (:class:`landscape.integrations.opacus.OpacusPrivacy`)."""

    def record(self) -> dict[str, Any]:
        """The run's fixed ``manifest["privacy"]`` fields (noise_multiplier, sample_rate, delta, ...)."""

    def steps(self) -> int:
        """Noisy steps taken so far."""

    def epsilon(self) -> float:
        """Epsilon so far at ``record()["delta"]``."""

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
    :class:`PrivacySource` (DP-SGD; checkpoints then record its epsilon and its step count). ``steps_per_epoch``:
    gives each checkpoint's epoch when :meth:`save` is not told it. ``seed``: recorded in ``manifest["seeds"]``.
    ``background``: write each checkpoint in a thread while training goes on (module docstring).

    Use it as a context manager (or call :meth:`close`): it holds the run's write lock while open.
    """

    def __init__(
        self, root: str | Path, run: str, model: nn.Module, *, data: Any, config: Mapping[str, Any] | None = None,
        optimizer: torch.optim.Optimizer | None = None, privacy: PrivacySource | None = None,
        steps_per_epoch: int | None = None, seed: int | None = None, background: bool = True,
    ) -> None:
        check_run_name(run)
        self.background = bool(background)
        self._queue: queue.Queue = queue.Queue()
        self._writer: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._at_exit: Any = None
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
        privacy_record = self._privacy_record(0)
        store = Store(root)
        if (store.root / run / MANIFEST).is_file():
            self._run = store.open_run(run)
            self._created = False
            try:
                self._check_same(fields, privacy_record)
                if privacy is not None:
                    self._sync_privacy_steps()
            except BaseException:
                self._run.close()
                raise
        else:
            first = next(self.model.parameters(), None)  # the device the loop trains on, as train records it
            extra = {"privacy": privacy_record, "recorder": _recorder_record(),
                     "device": str(first.device) if first is not None else "cpu"}
            self._run = store.create_run(run, lineage=None, extra=extra, **fields)
            self._created = True
        infos = self._run.checkpoints()
        self._last: int | None = infos[-1].step if infos else None

    # -- the run ------------------------------------------------------------------------------------

    @property
    def run(self) -> Run:
        return self._run

    @property
    def name(self) -> str:
        return self._run.name

    @property
    def last_step(self) -> int | None:
        """The step of the last checkpoint saved (None before the first): a continued loop starts after it."""
        return self._last

    def flush(self) -> None:
        """Wait until the checkpoint being written is on disk; raise its error if writing it failed."""
        if self._writer is not None:
            self._queue.join()
        if self._failure is not None:
            failure, self._failure = self._failure, None
            infos = self._run.checkpoints()  # the failed step was not saved: it may be saved again
            self._last = infos[-1].step if infos else None
            raise failure

    def close(self) -> None:
        """Write the checkpoint in flight (:meth:`flush`) and release the run's write lock (the checkpoints stay)."""
        try:
            self.flush()
        finally:
            self._stop_writer()
            self._run.close()

    def _stop_writer(self) -> None:
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join()
            self._writer = None
            atexit.unregister(self._at_exit)

    def _start_writer(self) -> None:
        """One daemon thread per recorder writes its checkpoints; an exit hook writes the last one."""
        self._writer = threading.Thread(target=self._serve, name=f"landscape-recorder-{self.name}", daemon=True)
        self._writer.start()
        self._at_exit = functools.partial(_flush_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    def _serve(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._write(*job)
            finally:
                self._queue.task_done()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        try:
            self.flush()
        except Exception:
            if kind is None:
                raise  # else the block's own error is the one to see
        finally:
            if kind is not None and self._created and not self._run.checkpoints():
                shutil.rmtree(self._run.path, ignore_errors=True)  # failed before its first checkpoint: free the name
            self._stop_writer()
            self._run.close()

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
        job = dict(state_dict=state, step=step, epoch=epoch, epsilon=epsilon, metrics=numbers, extra=arrays,
                   attrs=attrs)
        self._last = step
        if self.background:
            if self._writer is None:
                self._start_writer()
            self._queue.put((job, privacy))
        else:
            self._write(job, privacy)
            self.flush()
        return self._run.path / f"step-{step:06d}.h5"

    def _write(self, job: dict[str, Any], privacy: dict[str, Any] | None) -> None:
        try:
            self._run.save_checkpoint(**job)
            if privacy is not None:
                self._run.update_manifest(privacy=privacy)
        except BaseException as exc:  # raised by the next save / flush / close
            self._failure = exc

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
        if self.privacy is not None:
            if epsilon is not None:
                raise UsageError("epsilon comes from the privacy accountant; do not give epsilon= as well")
            return float(self.privacy.epsilon())
        if epsilon is None:
            return None
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
        ckpt = self._run_store().load(f"{self.name}@step={last}")
        self.model.load_state_dict(ckpt.state_dict, strict=True)
        if self.optimizer is not None:
            _load_optimizer_state(self.optimizer, ckpt)
        if self.privacy is not None and PRIVACY_ATTR in ckpt.attrs:
            self.privacy.load_state(ckpt.attrs[PRIVACY_ATTR])
        return last

    def _run_store(self) -> Store:
        return Store(self._run.path.parent)

    # -- the manifest -------------------------------------------------------------------------------

    def _privacy_record(self, steps: int) -> dict[str, Any]:
        base = {"accounted": False}
        if self.privacy is not None:
            base = {**_jsonable(self.privacy.record(), "the privacy record"), "steps": int(steps), "accounted": True}
        return {**base, **PrivacyHistory().manifest_fields()}

    def _sync_privacy_steps(self) -> None:
        """A writer killed between a checkpoint and its manifest update leaves ``privacy.steps`` behind."""
        infos = self._run.checkpoints()
        last = infos[-1].step if infos else 0
        if (self._run.manifest.get("privacy") or {}).get("steps") != last:
            self._run.update_manifest(privacy=self._privacy_record(last))

    def _check_same(self, fields: dict[str, Any], privacy: dict[str, Any]) -> None:
        """Refuse, in one line, to write into a run this recorder would not have created."""
        manifest, name = self._run.manifest, self._run.name
        if not isinstance(manifest.get("recorder"), dict):
            by = ("landscape train" if "schedule" in manifest else
                  "landscape import" if (manifest.get("lineage") or {}).get("imported_from") else "another writer")
            raise UsageError(f"run '{name}' was written by {by}, not by a Recorder; record into a new run name")
        for key, value in fields.items():
            if manifest.get(key) != _normal(value):
                raise UsageError(f"run '{name}' was recorded with another {key.replace('_', ' ')} "
                                 f"({_short(manifest.get(key))}, now {_short(_normal(value))}); record into a new "
                                 "run name")
        fixed = {k: v for k, v in _normal(privacy).items() if k != "steps"}
        recorded = {k: v for k, v in (manifest.get("privacy") or {}).items() if k != "steps"}
        if recorded != fixed:
            raise UsageError(f"run '{name}' was recorded with other privacy settings ({_short(recorded)}, now "
                             f"{_short(fixed)}); record into a new run name")


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
    """The weights on the CPU (copied off an accelerator), refused in one line when one is not finite."""
    state = {}
    for key, value in model.state_dict().items():
        value = value.detach()
        if (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all()):
            raise NonFiniteError(f"step {step}: tensor '{key}' of the model is not finite (NaN or inf); nothing "
                                 "was saved (training diverged? lower the learning rate)")
        state[key] = value.to("cpu", copy=True)  # a copy: training goes on while it is written
    return state


def _is_whole(value: Any) -> bool:
    """An integer (python or numpy), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _flush_at_exit(ref: weakref.ref) -> None:
    """Interpreter exit: write a recorder's last checkpoint; a failure is one line on stderr."""
    recorder = ref()
    if recorder is None:
        return
    try:
        recorder.flush()
    except Exception as exc:  # noqa: BLE001 (nothing can be raised to anyone at exit)
        print(f"error: landscape.Recorder could not write the last checkpoint of run '{recorder.name}': {exc}",
              file=sys.stderr)


def _snapshot(value: Any) -> Any:
    """A copy of an extra array (or a mapping of them) that later training cannot change."""
    if isinstance(value, Mapping):
        return {str(k): _snapshot(v) for k, v in value.items()}
    if torch.is_tensor(value):
        return value.detach().to("cpu", copy=True)
    return np.array(value, copy=True)


def _optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors by "index/key", {"param_groups", "scalars"})`` of ``optimizer.state_dict()``."""
    sd = optimizer.state_dict()
    tensors: dict[str, Any] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entry in sd["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"{index}/{key}"] = value.detach().to("cpu", copy=True)
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
