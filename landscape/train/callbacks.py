"""Training callbacks (open_lth style): everything the loop does besides stepping. Per-step values stay in
preallocated tensors; nothing calls ``.item()`` per batch."""

from __future__ import annotations

import math
import random
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from landscape.errors import LandscapeWarning, param

if TYPE_CHECKING:
    from landscape.train.loop import TrainState

# Columns of the per-step metrics table (run array "metrics"); NaN = not measured for this optimizer.
STEP_METRICS = ("loss", "accuracy", "batch_size", "mean_grad_norm", "max_grad_norm", "fraction_clipped", "noise_norm",
                "epsilon")
METRICS_ARRAY = "metrics"


@dataclass
class CheckpointRecord:
    """What callbacks contribute to one checkpoint before it is written."""

    metrics: dict[str, Any] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    epsilon: float | None = None


class Callback:
    """Base class; override the hooks you need. ``on_start`` runs before the first step (also after a resume),
    ``on_step`` after each optimizer step (``state.step`` counts it), ``on_checkpoint`` before a checkpoint is
    written (each callback adds its part to the record), ``on_end`` after the last step."""

    def on_start(self, state: TrainState) -> None:
        pass

    def on_step(self, state: TrainState, stats: Any) -> None:
        pass

    def on_checkpoint(self, state: TrainState, record: CheckpointRecord) -> None:
        pass

    def on_end(self, state: TrainState) -> None:
        pass


class StepMetrics(Callback):
    """The per-step table (:data:`STEP_METRICS`), saved as run array ``metrics`` at every checkpoint, before the
    checkpoint file, so a resumed run finds every row it needs."""

    def __init__(self, total_steps: int):
        self.table = {name: torch.full((total_steps,), float("nan"), dtype=torch.float64) for name in STEP_METRICS}

    def restore(self, saved: dict[str, np.ndarray], upto: int) -> None:
        """Take rows ``[0, upto)`` from a saved table (resume)."""
        for name, column in self.table.items():
            if name in saved:
                values = torch.as_tensor(np.asarray(saved[name], dtype=np.float64))
                n = min(upto, len(values), len(column))
                column[:n] = values[:n]

    def on_step(self, state: TrainState, stats: Any) -> None:
        t = state.step - 1
        for name in STEP_METRICS:
            value = getattr(stats, name, None)
            if value is not None:
                self.table[name][t] = value.detach().to("cpu", torch.float64) if torch.is_tensor(value) else value

    def on_checkpoint(self, state: TrainState, record: CheckpointRecord) -> None:
        if state.step > 0:
            t = state.step - 1
            record.metrics["step_loss"] = self.table["loss"][t]
            record.metrics["step_accuracy"] = self.table["accuracy"][t]
        state.run.save_array(METRICS_ARRAY, {k: v.numpy() for k, v in self.table.items()})


class NonFiniteLossWarning(LandscapeWarning):
    """Training diverged: a step's loss was NaN or infinite (the weights after it are usually not finite)."""


class NonFinite(Callback):
    """Warn once when the training loss stops being finite and record where in ``manifest["non_finite"]``;
    checked at checkpoints only (no per-step sync). Training goes on, so the run stays inspectable."""

    def __init__(self) -> None:
        self.reported = False

    def on_start(self, state: TrainState) -> None:
        self.reported = "non_finite" in state.run.manifest

    def on_checkpoint(self, state: TrainState, record: CheckpointRecord) -> None:
        if self.reported or state.step == 0:
            return
        losses = state.metrics.table["loss"][: state.step]
        sampled = state.metrics.table["batch_size"][: state.step] > 0  # an empty Poisson batch's loss is NaN
        bad = ~torch.isfinite(losses) & sampled
        if not bool(bad.any()):
            return
        step = int(torch.nonzero(bad)[0, 0]) + 1
        epoch = step / state.steps_per_epoch
        self.reported = True
        loss = float(losses[step - 1])
        state.run.update_manifest(non_finite={"step": step, "epoch": epoch, "loss": str(loss)})
        warnings.warn(f"run '{state.run.name}': the training loss became {loss} at step {step} (epoch {epoch:.3g}) "
                      f"and the weights after it are not usable; try a smaller {param('lr')} (was {state.config.lr:g})",
                      NonFiniteLossWarning, stacklevel=2)


class Accounting(Callback):
    """Epsilon after every step from ``curve[t]`` (computed up front, ancestors included; None: not accounted)."""

    def __init__(self, curve: torch.Tensor | None):
        self.curve = curve

    def on_step(self, state: TrainState, stats: Any) -> None:
        if self.curve is not None:
            state.metrics.table["epsilon"][state.step - 1] = self.curve[state.step]
            state.epsilon = self.curve[state.step]

    def on_start(self, state: TrainState) -> None:
        if self.curve is not None:
            state.epsilon = self.curve[state.step]

    def on_checkpoint(self, state: TrainState, record: CheckpointRecord) -> None:
        record.epsilon = None if self.curve is None else float(self.curve[state.step])


class Evaluation(Callback):
    """Full train and test loss/accuracy at every checkpoint, by the shared evaluator, so these are the numbers
    interpolation reports at alpha = 0 and 1."""

    def __init__(self, batch_size: int = 1024):
        self.batch_size = batch_size

    def on_checkpoint(self, state: TrainState, record: CheckpointRecord) -> None:
        from landscape.evaluate import evaluate
        from landscape.params import ParamSpace

        space = ParamSpace.from_model(state.model)
        point = space.flatten(state.model).detach()
        for split in ("train", "test"):
            x, y = state.data.split(split)
            if len(y) == 0:
                continue
            with warnings.catch_warnings():  # a diverged run is reported once, by NonFinite
                warnings.filterwarnings("ignore", message="non-finite loss at", category=RuntimeWarning)
                result = evaluate(state.model, x, y, [point], space=space, batch_size=self.batch_size,
                                  device=state.device)
            record.metrics[f"{split}_loss"] = float(result.loss[0])
            record.metrics[f"{split}_acc"] = float(result.acc[0])


class ResumeState(Callback):
    """Everything a bit-identical resume needs (RNGs, sampler, noise generator, momentum, position), saved in
    each checkpoint's ``extra`` group."""

    def on_checkpoint(self, state: TrainState, record: CheckpointRecord) -> None:
        extra = record.extra
        extra["rng/torch"] = torch.get_rng_state().numpy().copy()
        np_state = np.random.get_state()  # noqa: NPY002 (the legacy global state is what seed_everything seeds)
        extra["rng/numpy_keys"] = np.asarray(np_state[1], dtype=np.uint32)
        extra["rng/numpy_pos"] = np.asarray([np_state[2], np_state[3]], dtype=np.int64)
        extra["rng/numpy_gauss"] = np.asarray([np_state[4]], dtype=np.float64)
        py_state = random.getstate()
        extra["rng/python"] = np.asarray(py_state[1], dtype=np.int64)
        for key, value in state.sampler.state_dict().items():
            extra[f"sampler/{key}"] = value
        if state.noise_generator is not None:
            extra["noise/generator"] = state.noise_generator.get_state().numpy().copy()
        names = {id(p): n for n, p in state.model.named_parameters()}
        for group in state.optimizer.param_groups:
            for p in group["params"]:
                buf = state.optimizer.state.get(p, {}).get("momentum_buffer")
                if buf is not None:
                    extra[f"momentum/{names[id(p)]}"] = buf.detach().cpu()
        extra["position"] = np.asarray(
            [state.step, state.step // state.steps_per_epoch, state.step % state.steps_per_epoch], dtype=np.int64
        )


def restore_resume_state(state: TrainState, extra: dict[str, np.ndarray]) -> None:
    """Inverse of :class:`ResumeState`: put RNGs, sampler, noise generator and momentum back."""
    torch.set_rng_state(torch.from_numpy(np.asarray(extra["rng/torch"], dtype=np.uint8).copy()))
    pos = extra["rng/numpy_pos"]
    np.random.set_state(  # noqa: NPY002
        ("MT19937", np.asarray(extra["rng/numpy_keys"], dtype=np.uint32), int(pos[0]), int(pos[1]),
         float(extra["rng/numpy_gauss"][0]))
    )
    random.setstate((3, tuple(int(v) for v in extra["rng/python"]), None))
    state.sampler.load_state_dict({k.split("/", 1)[1]: v for k, v in extra.items() if k.startswith("sampler/")})
    if state.noise_generator is not None and "noise/generator" in extra:
        state.noise_generator.set_state(torch.from_numpy(np.asarray(extra["noise/generator"], dtype=np.uint8).copy()))
    params = dict(state.model.named_parameters())
    for key, value in extra.items():
        if key.startswith("momentum/"):
            p = params[key.split("/", 1)[1]]
            state.optimizer.state[p]["momentum_buffer"] = torch.as_tensor(np.asarray(value)).to(p.device, p.dtype).clone()


class WallClock(Callback):
    """Training wall time so far (seconds, across resumes) as checkpoint metric ``wall_seconds``."""

    def on_start(self, state: TrainState) -> None:
        self.start = time.perf_counter() - state.seconds_before

    def on_checkpoint(self, state: TrainState, record: CheckpointRecord) -> None:
        record.metrics["wall_seconds"] = time.perf_counter() - self.start


class Checkpointer(Callback):
    """Write a checkpoint at the scheduled steps (init and final always): every callback contributes first."""

    def __init__(self, steps: Sequence[int]):
        self.steps = set(int(s) for s in steps)

    def on_start(self, state: TrainState) -> None:
        if state.step == 0 and not state.resumed:
            self.write(state)

    def on_step(self, state: TrainState, stats: Any) -> None:
        if state.step in self.steps:
            self.write(state)

    def write(self, state: TrainState) -> None:
        record = CheckpointRecord()
        for cb in state.callbacks:
            if cb is not self:
                cb.on_checkpoint(state, record)
        record.attrs.setdefault("epoch_position", state.step % state.steps_per_epoch)
        state.run.save_checkpoint(
            {k: v.detach().cpu() for k, v in state.model.state_dict().items()},
            step=state.step,
            epoch=state.step / state.steps_per_epoch,
            epsilon=record.epsilon,
            metrics={k: float(v) for k, v in record.metrics.items()},
            extra=record.extra,
            attrs=record.attrs,
        )


class Progress(Callback):
    """The run's steps done of its total (:mod:`landscape.progress`: a bar on a terminal, else a line every ~10 s),
    with the epoch, the loss and epsilon; shown when progress is on, drawn again with the final values at the end."""

    def __init__(self, every: int = 10):
        self.every = every
        self.task = None
        self.loss: float | None = None
        self.epsilon: float | None = None

    def on_start(self, state: TrainState) -> None:
        from landscape import progress

        self.task = progress.task(f"train {state.run.name}", total=state.total_steps, unit="steps", done=state.step,
                                  leave=True)
        self._describe(state)

    def on_step(self, state: TrainState, stats: Any) -> None:
        if self.task is None:
            return
        if state.step % self.every == 0 or state.step == state.total_steps:  # the loss read costs a device sync
            self.loss = float(stats.loss)
        self._describe(state)
        self.task.update(1)

    def _describe(self, state: TrainState) -> None:
        if state.epsilon is not None and math.isfinite(float(state.epsilon)):  # PLD: only at epochs/checkpoints
            self.epsilon = float(state.epsilon)
        info = f"epoch {state.step / state.steps_per_epoch:.2f}"
        if self.loss is not None:
            info += f", loss {self.loss:.4f}"
        if self.epsilon is not None:
            info += f", eps {self.epsilon:.3g}"
        self.task.describe_as(info)

    def on_end(self, state: TrainState) -> None:
        if self.task is not None:
            self._describe(state)  # the final epoch and epsilon, not those of the last 10-step mark
            self.task.close()
            self.task = None
