"""Linear-mode interpolation between two parameter vectors and its instability.

Loss and accuracy along ``(1 - alpha) theta_A + alpha theta_B`` for ``alpha = linspace(0, 1, points)``
(both endpoints included; Frankle et al. 2020 and Watson et al. use 30 points), per data split, and the
linear interpolation instability of Watson et al. Def. 2.3::

    instability = sup_alpha E_alpha(theta_A, theta_B) - mean(E(theta_A), E(theta_B))

for the loss and for the error ``1 - accuracy`` (Frankle et al.'s error barrier). A path with a
non-finite loss has instability ``inf`` and the reason is kept. Pure: a model, two state dicts and
tensors in, an :class:`InterpolationResult` out; it never opens the store and never changes the model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from landscape.analyze._common import check_positive_int, config_from_params
from landscape.errors import UsageError
from landscape.evaluate import DEFAULT_BATCH_SIZE, EvalResult, Segment, evaluate
from landscape.params import ParamSpace, check_compatible
from landscape.results import InputRef, read_result, write_result

KIND = "interpolation"
SPLITS = ("train", "test")


@dataclass
class InterpolateConfig:
    """Options of ``landscape interpolate`` (stored as the result's ``params``)."""

    points: int = 30
    splits: tuple[str, ...] = SPLITS
    subset: int | float | None = None  # evaluate on a seeded stratified subset of each split
    subset_seed: int = 0
    bn_recalibrate: bool = False  # recompute BatchNorm statistics at every point from the training inputs
    batch_size: int = DEFAULT_BATCH_SIZE
    device: str = "cpu"
    method: str = "auto"  # landscape.evaluate method

    def __post_init__(self) -> None:
        if isinstance(self.splits, str):
            self.splits = tuple(s.strip() for s in self.splits.split(",") if s.strip())
        self.splits = tuple(self.splits)
        if int(self.points) != self.points or self.points < 2:
            raise UsageError(f"--points must be an integer >= 2 (both endpoints are evaluated), got {self.points}")
        self.points = int(self.points)
        if not self.splits:
            raise UsageError("give at least one split (train, test)")
        bad = [s for s in self.splits if s not in SPLITS]
        if bad:
            raise UsageError(f"unknown split {bad[0]!r}; use train and/or test")
        if len(set(self.splits)) != len(self.splits):
            raise UsageError(f"splits repeat: {','.join(self.splits)}")
        check_positive_int("--batch-size", self.batch_size)


@dataclass
class Instability:
    """Watson et al. Def. 2.3 for one curve: ``sup - mean(endpoints)``; ``inf`` with a reason if non-finite."""

    value: float
    reason: str | None = None


def instability(values: Sequence[float] | np.ndarray, alphas: Sequence[float] | np.ndarray | None = None,
                *, what: str = "loss") -> Instability:
    """``max(values) - (values[0] + values[-1]) / 2`` over a path whose first and last points are the ends.

    Any non-finite value makes the instability ``inf``, with the first offending alpha in ``reason``.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        raise ValueError("instability needs both endpoints")
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
        where = f"alpha={float(alphas[bad[0]]):.4g}" if alphas is not None else f"point {int(bad[0])}"
        return Instability(math.inf, f"non-finite {what} ({v[bad[0]]}) at {where} ({bad.size} of {v.size} points)")
    return Instability(float(v.max() - (v[0] + v[-1]) / 2.0))


def chord_barrier(values: Sequence[float] | np.ndarray, alphas: Sequence[float] | np.ndarray) -> float:
    """``sup_alpha E_alpha - ((1 - alpha) E_A + alpha E_B)``: the height above the chord (Entezari et al. 2022).

    Watson et al.'s instability includes the endpoints in the sup, so it is never negative and equals
    ``|E_A - E_B| / 2`` on a convex loss; the chord barrier is exactly 0 there (``<= 0`` up to rounding) and
    isolates a bump between the ends. ``inf`` when any value is non-finite.
    """
    v, a = np.asarray(values, dtype=np.float64), np.asarray(alphas, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        return math.inf
    return float(np.max(v - ((1.0 - a) * v[0] + a * v[-1])))


@dataclass
class InterpolationResult:
    """Loss/accuracy per split along the path, and the instabilities (Watson et al. Def. 2.3)."""

    alpha: np.ndarray
    loss: dict[str, np.ndarray]
    acc: dict[str, np.ndarray]
    instability_loss: dict[str, float]
    instability_error: dict[str, float]
    chord_barrier_loss: dict[str, float] = field(default_factory=dict)  # sup_a E_a - ((1-a) E_A + a E_B)
    reasons: dict[str, str] = field(default_factory=dict)  # "<split>_loss"/"<split>_error" -> why inf
    examples: dict[str, int] = field(default_factory=dict)
    distance: float = math.nan  # ||theta_B - theta_A||_2 over the interpolated tensors
    seconds: float = math.nan
    throughput: float = math.nan  # examples x points per second
    method: str = ""
    config: InterpolateConfig = field(default_factory=InterpolateConfig)
    inputs: list[InputRef] = field(default_factory=list)
    path: Path | None = None
    figures: list[Path] = field(default_factory=list)

    @property
    def splits(self) -> list[str]:
        return list(self.loss)

    def error(self, split: str) -> np.ndarray:
        return 1.0 - self.acc[split]

    def summary(self) -> list[dict]:
        """One row per split: losses at the ends, the maximum, and both instabilities."""
        return [
            {
                "split": s,
                "loss_A": float(self.loss[s][0]),
                "loss_B": float(self.loss[s][-1]),
                "max_loss": float(np.max(self.loss[s])),
                "instability_loss": self.instability_loss[s],
                "instability_error": self.instability_error[s],
            }
            for s in self.splits
        ]

    def to_hdf5(self, path: str | Path, inputs: Sequence[InputRef] = ()) -> Path:
        arrays: dict[str, np.ndarray] = {"alpha": self.alpha}
        attrs: dict[str, object] = {
            "distance": self.distance, "seconds": self.seconds, "throughput": self.throughput, "method": self.method,
            "splits": ",".join(self.splits),
        }
        for s in self.splits:
            arrays[f"{s}_loss"] = self.loss[s]
            arrays[f"{s}_acc"] = self.acc[s]
            attrs[f"instability_{s}_loss"] = self.instability_loss[s]
            attrs[f"instability_{s}_error"] = self.instability_error[s]
            attrs[f"chord_barrier_{s}_loss"] = self.chord_barrier_loss.get(s, math.nan)
            attrs[f"examples_{s}"] = self.examples.get(s, 0)
        for key, reason in self.reasons.items():
            attrs[f"reason_{key}"] = reason
        inputs = list(inputs) or self.inputs
        self.path = write_result(path, KIND, arrays=arrays, attrs=attrs, params=self.config, inputs=inputs)
        self.inputs = inputs
        return self.path

    @classmethod
    def from_hdf5(cls, path: str | Path) -> InterpolationResult:
        r = read_result(path, KIND)
        splits = [s for s in str(r.attrs.get("splits", "")).split(",") if s]
        params = dict(r.params)
        params["splits"] = tuple(params.get("splits", splits))
        return cls(
            alpha=r.arrays["alpha"],
            loss={s: r.arrays[f"{s}_loss"] for s in splits},
            acc={s: r.arrays[f"{s}_acc"] for s in splits},
            instability_loss={s: float(r.attrs[f"instability_{s}_loss"]) for s in splits},
            instability_error={s: float(r.attrs[f"instability_{s}_error"]) for s in splits},
            chord_barrier_loss={s: float(r.attrs.get(f"chord_barrier_{s}_loss", math.nan)) for s in splits},
            reasons={k[len("reason_"):]: str(v) for k, v in r.attrs.items() if k.startswith("reason_")},
            examples={s: int(r.attrs.get(f"examples_{s}", 0)) for s in splits},
            distance=float(r.attrs.get("distance", math.nan)),
            seconds=float(r.attrs.get("seconds", math.nan)),
            throughput=float(r.attrs.get("throughput", math.nan)),
            method=str(r.attrs.get("method", "")),
            config=config_from_params(InterpolateConfig, params),
            inputs=r.inputs,
            path=Path(path),
        )


def interpolation_space(model: nn.Module) -> ParamSpace:
    """What is interpolated: every parameter and every floating-point buffer (BatchNorm running statistics).

    Integer buffers (``num_batches_tracked``) are not interpolated; in eval mode they are unused.
    """
    return ParamSpace.from_model(model, buffers=True)


def interpolate(
    model: nn.Module,
    theta_a: Mapping[str, torch.Tensor] | torch.Tensor,
    theta_b: Mapping[str, torch.Tensor] | torch.Tensor,
    data: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    *,
    config: InterpolateConfig | None = None,
    bn_inputs: torch.Tensor | None = None,
    space: ParamSpace | None = None,
    **overrides,
) -> InterpolationResult:
    """Loss and accuracy along ``lerp(theta_a, theta_b, alpha)`` on each split, and the instabilities.

    ``theta_a``/``theta_b`` are state dicts of ``model``'s architecture (or flat vectors over ``space``);
    ``data`` maps ``"train"``/``"test"`` to ``(x, y)``; the config's ``splits`` pick which are evaluated
    and ``subset`` draws a seeded stratified subset of each. With ``bn_recalibrate`` the BatchNorm
    statistics are recomputed at every point from ``bn_inputs`` (default: the training inputs, same subset).
    Keyword ``overrides`` replace config fields (``interpolate(m, a, b, data, points=10)``).
    """
    config = dataclasses.replace(config or InterpolateConfig(), **overrides)
    space = space or interpolation_space(model)
    a, b = _flat(theta_a, space, model, "A"), _flat(theta_b, space, model, "B")
    alphas = torch.from_numpy(np.linspace(0.0, 1.0, config.points))  # both ends exact
    chosen = {s: _subset(data, s, config) for s in config.splits}
    if config.bn_recalibrate and bn_inputs is None:
        if "train" not in data:
            raise UsageError("BatchNorm recalibration needs the training split")
        bn_inputs = _subset(data, "train", config)[0]
    if not config.bn_recalibrate:
        bn_inputs = None
    identical = torch.equal(a, b)
    segment = Segment(a, b, alphas[:1] if identical else alphas)
    loss, acc, examples = {}, {}, {}
    seconds = 0.0
    method = ""
    for s, (x, y) in chosen.items():
        r: EvalResult = evaluate(model, x, y, segment, space=space, batch_size=config.batch_size,
                                 bn_recalibrate=bn_inputs, device=config.device, method=config.method)
        values_l, values_a = r.loss.numpy(), r.acc.numpy()
        if identical:  # one point is the whole path
            values_l, values_a = np.repeat(values_l, config.points), np.repeat(values_a, config.points)
        loss[s], acc[s], examples[s] = values_l, values_a, int(x.shape[0])
        seconds += r.seconds
        method = r.method
    result = InterpolationResult(
        alpha=alphas.numpy(), loss=loss, acc=acc, instability_loss={}, instability_error={},
        examples=examples, distance=float(torch.linalg.vector_norm((b - a).double())), seconds=seconds,
        throughput=sum(examples.values()) * config.points / seconds if seconds > 0 else math.inf,
        method=method, config=config,
    )
    for s in chosen:
        il = instability(loss[s], result.alpha, what=f"{s} loss")
        if il.reason:  # the error at a non-finite point is meaningless too
            ie = Instability(math.inf, il.reason)
            result.reasons[f"{s}_loss"] = result.reasons[f"{s}_error"] = il.reason
        else:
            ie = instability(1.0 - acc[s], result.alpha, what=f"{s} error")
        result.instability_loss[s], result.instability_error[s] = il.value, ie.value
        result.chord_barrier_loss[s] = chord_barrier(loss[s], result.alpha)
    return result


def _flat(theta, space: ParamSpace, model: nn.Module, label: str) -> torch.Tensor:
    if isinstance(theta, torch.Tensor):
        if theta.dim() != 1 or theta.numel() != space.dim:
            raise UsageError(f"theta_{label} has {theta.numel()} entries, the model's space has {space.dim}")
        return theta.detach()
    check_compatible(model.state_dict(), theta, names=("the model", label))
    return space.flatten(theta)


def _subset(splits: Mapping[str, tuple[torch.Tensor, torch.Tensor]], name: str, config: InterpolateConfig):
    if name not in splits:
        raise UsageError(f"split {name!r} is not in the data (have {', '.join(splits)})")
    x, y = splits[name]
    if config.subset is None:
        return x, y
    from landscape.data import subset_indices

    idx = subset_indices(y, config.subset, config.subset_seed)
    return x[idx], y[idx]
