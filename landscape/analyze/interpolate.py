"""Linear-mode interpolation between two parameter vectors: loss and accuracy along ``(1 - alpha) theta_A +
alpha theta_B`` per split, Watson et al. Def. 2.3's instability and, beside it, the barrier above the chord
(Entezari et al. 2022: what the verdicts judge, free of the end-loss gap). Pure: never opens the store."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from landscape import metrics as user_metrics
from landscape.analyze.specs import InterpolateConfig
from landscape.errors import UsageError
from landscape.evaluate import EvalResult, Segment, evaluate
from landscape.options import SPLITS, build
from landscape.params import ParamSpace, check_compatible
from landscape.results import StoredResult, stored

KIND = "interpolation"
# built-in columns a metric may not take: datasets are <split>_<column> (and <split>_<column>_aligned), summary
# columns <column>_A, <column>_B, max_<column>
RESERVED = ("loss", "acc", "error", "alpha")


def split_subset(splits: Mapping[str, Any], name: str, subset: int | float | None, seed: int):
    """``(x, y)`` of split ``name``, or the ``subset`` of it the one sampler draws."""
    if name not in splits:
        raise UsageError(f"split {name!r} is not in the data (have {', '.join(splits)})")
    from landscape.data import take_subset

    return take_subset(*splits[name], subset, seed, split=name)


@dataclass
class Instability:
    """Watson et al. Def. 2.3 for one curve: ``sup - mean(endpoints)``; ``inf`` with a reason."""

    value: float
    reason: str | None = None


def instability(values: Sequence[float] | np.ndarray, alphas: Sequence[float] | np.ndarray | None = None,
                *, what: str = "loss") -> Instability:
    """``max(values) - (values[0] + values[-1]) / 2``; ``inf`` for any non-finite value, the first named in
    ``reason``."""
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        raise ValueError("instability needs both endpoints")
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
        where = f"alpha={float(alphas[bad[0]]):.4g}" if alphas is not None else f"point {int(bad[0])}"
        return Instability(math.inf, f"non-finite {what} ({v[bad[0]]}) at {where} ({bad.size} of {v.size} points)")
    return Instability(float(v.max() - (v[0] + v[-1]) / 2.0))


def chord_barrier(values: Sequence[float] | np.ndarray, alphas: Sequence[float] | np.ndarray) -> float:
    """``sup_alpha E_alpha - ((1 - alpha) E_A + alpha E_B)``: the height above the chord (Entezari et al.
    2022), 0 on a convex loss; ``inf`` when any value is non-finite."""
    v, a = np.asarray(values, dtype=np.float64), np.asarray(alphas, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        return math.inf
    return float(np.max(v - ((1.0 - a) * v[0] + a * v[-1])))


def rise_above_ends(values: Sequence[float] | np.ndarray) -> float:
    """``sup_alpha E_alpha - max(E_A, E_B)``: the rise above both ends; ``inf`` for any non-finite value."""
    v = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        return math.inf
    return float(v.max() - max(v[0], v[-1]))


@dataclass
class InterpolationResult(StoredResult):
    """Loss/accuracy per split along the path, the barriers and the instabilities (Watson Def. 2.3)."""

    KIND = KIND
    CONFIG = InterpolateConfig

    alpha: np.ndarray = stored("array", dims=("alpha",))
    loss: dict[str, np.ndarray] = stored("array", name="{}_loss", dims=("alpha",), order="splits")
    acc: dict[str, np.ndarray] = stored("array", name="{}_acc", dims=("alpha",), order="splits")
    instability_loss: dict[str, float] = stored("attr", name="instability_{}_loss", order="splits")
    instability_error: dict[str, float] = stored("attr", name="instability_{}_error", order="splits")
    # sup_a E_a - ((1-a) E_A + a E_B)
    chord_barrier_loss: dict[str, float] = stored("attr", name="chord_barrier_{}_loss", order="splits",
                                                  default_factory=dict)
    # sup_a E_a - max(E_A, E_B)
    rise_loss: dict[str, float] = stored("attr", name="rise_{}_loss", order="splits", default_factory=dict)
    reasons: dict[str, str] = stored("attr", name="reason_{}", default_factory=dict)  # "<split>_loss" -> why inf
    examples: dict[str, int] = stored("attr", name="examples_{}", order="splits", default_factory=dict)
    # --metric: column -> split -> values along alpha (datasets <split>_<column>); sources in metric_sources
    point_metrics: dict[str, dict[str, np.ndarray]] = stored("skip", default_factory=dict)
    metric_sources: list[dict] = stored("attr", default_factory=list)
    distance: float = math.nan  # ||theta_B - theta_A||_2 over the interpolated tensors
    # --align: the path A -> pi(B), B's units permuted to match A's (Ainsworth et al. 2023); empty without it
    loss_aligned: dict[str, np.ndarray] = stored("array", name="{}_loss_aligned", dims=("alpha",), order="splits",
                                                 default_factory=dict)
    acc_aligned: dict[str, np.ndarray] = stored("array", name="{}_acc_aligned", dims=("alpha",), order="splits",
                                                default_factory=dict)
    instability_loss_aligned: dict[str, float] = stored("attr", name="instability_{}_loss_aligned", order="splits",
                                                        default_factory=dict)
    instability_error_aligned: dict[str, float] = stored("attr", name="instability_{}_error_aligned",
                                                         order="splits", default_factory=dict)
    chord_barrier_loss_aligned: dict[str, float] = stored("attr", name="chord_barrier_{}_loss_aligned",
                                                          order="splits", default_factory=dict)
    point_metrics_aligned: dict[str, dict[str, np.ndarray]] = stored("skip", default_factory=dict)
    distance_aligned: float = math.nan  # ||pi(theta_B) - theta_A||_2
    seconds: float = math.nan
    throughput: float = math.nan  # examples x points per second
    method: str = ""
    config: InterpolateConfig = field(default_factory=InterpolateConfig)

    @property
    def splits(self) -> list[str]:
        return list(self.loss)

    @property
    def ece(self) -> dict[str, np.ndarray]:
        """The built-in ``ece`` metric per split (``--metric ece``), else empty."""
        return dict(self.point_metrics.get("ece", {}))

    def derived(self):
        """The metric columns as ``<split>_<column>`` (and ``..._aligned``) along alpha, and their names."""
        arrays = {f"{s}_{col}{suffix}": v for suffix, table in (("", self.point_metrics),
                                                                ("_aligned", self.point_metrics_aligned))
                  for col, by_split in table.items() for s, v in by_split.items()}
        return arrays, user_metrics.columns_attr(self.point_metrics), {k: ("alpha",) for k in arrays}

    @classmethod
    def from_hdf5(cls, path):
        return user_metrics.read_columns(super().from_hdf5(path), path, {
            "point_metrics": "{split}_{column}", "point_metrics_aligned": "{split}_{column}_aligned"})

    def summary(self) -> list[dict]:
        """One row per split: the end losses, the maximum, the barriers and the instabilities."""
        return [
            {
                "split": s,
                "loss_A": float(self.loss[s][0]),
                "loss_B": float(self.loss[s][-1]),
                "max_loss": float(np.max(self.loss[s])),
                "chord_barrier_loss": self.chord_barrier_loss.get(s, chord_barrier(self.loss[s], self.alpha)),
                "rise_loss": self.rise_loss.get(s, rise_above_ends(self.loss[s])),
                "instability_loss": self.instability_loss[s],
                "instability_error": self.instability_error[s],
                **{key: value for col, by_split in self.point_metrics.items() if s in by_split
                   for key, value in ((f"{col}_A", float(by_split[s][0])), (f"{col}_B", float(by_split[s][-1])),
                                      (f"max_{col}", float(np.max(by_split[s]))))},
                **({"chord_barrier_loss_aligned": self.chord_barrier_loss_aligned.get(
                        s, chord_barrier(self.loss_aligned[s], self.alpha)),
                    "instability_loss_aligned": self.instability_loss_aligned[s],
                    "instability_error_aligned": self.instability_error_aligned[s]} if self.loss_aligned else {}),
            }
            for s in self.splits
        ]


def interpolate(model: nn.Module, theta_a: Mapping[str, torch.Tensor] | torch.Tensor,
                theta_b: Mapping[str, torch.Tensor] | torch.Tensor,
                data: Mapping[str, tuple[torch.Tensor, torch.Tensor]], *,
                config: InterpolateConfig | None = None, bn_inputs: torch.Tensor | None = None,
                space: ParamSpace | None = None, **overrides) -> InterpolationResult:
    """Loss and accuracy along ``lerp(theta_a, theta_b, alpha)`` on each split of ``data`` (``"train"`` /
    ``"test"`` -> ``(x, y)``), and the instabilities; ``theta_a``/``theta_b`` are state dicts (or flat vectors
    over ``space``, by default every parameter and floating-point buffer). ``bn_inputs``: BatchNorm
    recalibration's inputs (default: the training subset). Keyword ``overrides`` replace config fields."""
    config = build(InterpolateConfig, overrides, base=config)
    space = space or ParamSpace.from_model(model, buffers=True)  # integer buffers are unused in eval mode
    a, b = _flat(theta_a, space, model, "A"), _flat(theta_b, space, model, "B")
    alphas = torch.from_numpy(np.linspace(0.0, 1.0, config.points))  # both ends exact
    chosen = {s: split_subset(data, s, config.subset, config.subset_seed) for s in config.split}
    if config.bn_recalibrate and bn_inputs is None:
        if "train" not in data:
            raise UsageError("BatchNorm recalibration needs the training split")
        bn_inputs = split_subset(data, "train", config.subset, config.subset_seed)[0]
    if not config.bn_recalibrate:
        bn_inputs = None
    identical = torch.equal(a, b)
    segment = Segment(a, b, alphas[:1] if identical else alphas)
    bound = user_metrics.load(config.metrics, reserved=RESERVED, analysis="interpolate")
    loss, acc, examples = {}, {}, {}
    extra: dict[str, dict[str, np.ndarray]] = {col: {} for b in bound for col in b.columns}
    seconds = 0.0
    method = ""
    for s, (x, y) in chosen.items():
        r: EvalResult = evaluate(model, x, y, segment, space=space, batch_size=config.chunk,
                                 bn_recalibrate=bn_inputs, device=config.device, method=config.method,
                                 metrics=[b.metric for b in bound])
        values_l, values_a = r.loss.numpy(), r.acc.numpy()
        values_m = user_metrics.point_values(bound, r.metrics, r.loss)
        if identical:  # one point is the whole path
            values_l, values_a = np.repeat(values_l, config.points), np.repeat(values_a, config.points)
            values_m = {col: np.repeat(v, config.points) for col, v in values_m.items()}
        loss[s], acc[s], examples[s] = values_l, values_a, int(x.shape[0])
        for col, v in values_m.items():
            extra[col][s] = v
        seconds += r.seconds
        method = r.method
    result = InterpolationResult(
        alpha=alphas.numpy(), loss=loss, acc=acc, instability_loss={}, instability_error={},
        examples=examples, point_metrics=extra, metric_sources=user_metrics.sources(bound),
        distance=float(torch.linalg.vector_norm((b - a).double())), seconds=seconds,
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
        result.rise_loss[s] = rise_above_ends(loss[s])
    return result


def _flat(theta, space: ParamSpace, model: nn.Module, label: str) -> torch.Tensor:
    if isinstance(theta, torch.Tensor):
        if theta.dim() != 1 or theta.numel() != space.dim:
            raise UsageError(f"theta_{label} has {theta.numel()} entries, the model's space has {space.dim}")
        return theta.detach()
    check_compatible(model.state_dict(), theta, names=("the model", label))
    return space.flatten(theta)


def compute_pair(a, b, config: InterpolateConfig) -> InterpolationResult:
    """:func:`interpolate` between resolved checkpoints A and B on the data the resolver chose."""
    splits = {s: a.data.split(s) for s in SPLITS}
    model = a.model()
    result = interpolate(model, a.state, b.state, splits, config=config)
    if config.align:  # the same path after permuting B's units to match A's (weight matching, seed 0)
        from landscape.analyze.align import align_states
        from landscape.analyze.permutations import verified_spec

        spec = verified_spec(model, splits["test"][0][:16] if "test" in splits else None)
        after = interpolate(model, a.state, align_states(model, a.state, b.state, spec=spec).state, splits,
                            config=config)
        for name in ("loss", "acc", "instability_loss", "instability_error", "chord_barrier_loss", "distance",
                     "point_metrics"):
            setattr(result, f"{name}_aligned", getattr(after, name))
        result.reasons.update({f"{key}_aligned": reason for key, reason in after.reasons.items()})
    return result


def _notes(result: InterpolationResult) -> list[str]:
    return [f"{key}: instability inf ({reason})" for key, reason in result.reasons.items()]


def _details(r: InterpolationResult) -> dict:
    return {"reasons": r.reasons, "seconds": r.seconds, "throughput": r.throughput}
