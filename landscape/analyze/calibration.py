"""Calibration of a classifier's confidence (Bu et al. 2023 Sec. 5), from float64 softmax probabilities:
accuracy, NLL, Brier score, ECE and MCE over equal-width right-closed bins (Guo et al. 2017), the adaptive ECE
(Nixon et al. 2019) and the reliability and histogram arrays; :class:`ECE` is the same ECE as an evaluator
metric."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from landscape.analyze.interpolate import split_subset
from landscape.analyze.specs import CalibrationConfig
from landscape.errors import OptionError, UsageError
from landscape.evaluate import Metric, evaluate
from landscape.params import ParamSpace
from landscape.refs import Ref
from landscape.results import StoredResult, stored

KIND = "calibration"


def bin_index(values: torch.Tensor, bins: int) -> torch.Tensor:
    """Bin ``m - 1`` of each value in [0, 1] for the right-closed bins ``((m-1)/M, m/M]`` (0 goes to the
    first; Guo et al. 2017's convention: a value equal to an edge joins the bin below it)."""
    interior = torch.linspace(0.0, 1.0, int(bins) + 1, dtype=torch.float64, device=values.device)[1:-1]
    return torch.bucketize(values.to(torch.float64), interior, right=False)


def _binned_errors(count: torch.Tensor, conf_sum: torch.Tensor, correct_sum: torch.Tensor):
    """ECE (Guo Eq. 3) and MCE over non-empty bins (Guo Eq. 5) from per-bin sums (bins the last dim)."""
    n = count.sum(-1)
    gap = (correct_sum - conf_sum).abs()
    ece = gap.sum(-1) / n
    per_bin = torch.where(count > 0, gap / count.clamp_min(1), torch.zeros_like(gap))
    mce = torch.where(n > 0, per_bin.amax(-1), torch.full_like(n, math.nan))
    return ece, mce


def _check_bins(bins: Any) -> None:
    if int(bins) != bins or bins < 1:
        raise OptionError("bins", f"must be a positive integer, got {bins}")


@dataclass
class ExampleStats:
    """Per-example quantities every calibration statistic is a function of (float64, shape (n,))."""

    confidence: torch.Tensor  # max_k pi_i[k]
    correct: torch.Tensor  # 1.0 when argmax pi_i = y_i
    p_true: torch.Tensor  # pi_i[y_i]
    nll: torch.Tensor  # -log pi_i[y_i] (from log_softmax: finite where p_true underflows to 0)
    brier: torch.Tensor  # sum_k (pi_i[k] - 1{k = y_i})^2


def example_stats(logits: torch.Tensor, y: torch.Tensor) -> ExampleStats:
    """:class:`ExampleStats` of a batch of logits ``(n, K)`` and labels ``(n,)``, in float64."""
    if logits.dim() != 2 or y.dim() != 1 or logits.shape[0] != y.shape[0]:
        raise UsageError(f"need (n, K) logits and n labels, got {tuple(logits.shape)} and {tuple(y.shape)}")
    z = logits.detach().to(torch.float64)
    logp = torch.log_softmax(z, dim=1)
    p = logp.exp()
    conf, pred = p.max(dim=1)
    yy = y.to(z.device).long().unsqueeze(1)
    p_true = p.gather(1, yy).squeeze(1)
    brier = (p * p).sum(1) - 2.0 * p_true + 1.0  # sum_k p_k^2 - 2 p_y + 1 = sum_k (p_k - 1{k=y})^2
    return ExampleStats(confidence=conf, correct=(pred == yy.squeeze(1)).to(torch.float64), p_true=p_true,
                        nll=-logp.gather(1, yy).squeeze(1), brier=brier)


@dataclass
class SplitCalibration:
    """Calibration of one checkpoint on one split (see the module docstring for every definition)."""

    examples: int
    accuracy: float
    nll: float
    brier: float
    ece: float
    mce: float
    adaptive_ece: float
    bin_count: np.ndarray  # (M,) samples per confidence bin: the confidence histogram
    bin_confidence: np.ndarray  # (M,) mean confidence per bin, NaN where empty
    bin_accuracy: np.ndarray  # (M,) accuracy per bin, NaN where empty
    true_class_count: np.ndarray  # (M,) samples per bin of pi_i[y_i]

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(0.0, 1.0, int(self.bin_count.size) + 1)

    def scalars(self) -> dict[str, float]:
        return {"examples": self.examples, "accuracy": self.accuracy, "nll": self.nll, "brier": self.brier,
                "ece": self.ece, "mce": self.mce, "adaptive_ece": self.adaptive_ece}


def adaptive_ece(confidence: torch.Tensor, correct: torch.Tensor, bins: int) -> float:
    """Equal-mass ECE: confidences sorted (stable) and cut into ``bins`` contiguous near-equal groups."""
    n = int(confidence.numel())
    if n == 0:
        return math.nan
    order = torch.sort(confidence, stable=True).indices
    conf, corr = confidence[order], correct[order]
    sizes = torch.full((bins,), n // bins, dtype=torch.long)
    sizes[: n % bins] += 1  # numpy.array_split: the first n % M groups get one more
    group = torch.repeat_interleave(torch.arange(bins), sizes).to(conf.device)
    gap = torch.zeros(bins, dtype=torch.float64, device=conf.device).index_add_(0, group, corr - conf)
    return float(gap.abs().sum() / n)


def calibration_from_stats(stats: ExampleStats, bins: int) -> SplitCalibration:
    """All the statistics of one split from its :class:`ExampleStats`."""
    n = int(stats.confidence.numel())
    if n == 0:
        raise UsageError("cannot measure calibration on an empty data split")
    idx = bin_index(stats.confidence, bins)
    sums = torch.zeros(bins, 3, dtype=torch.float64, device=idx.device)
    sums.index_add_(0, idx, torch.stack([torch.ones_like(stats.confidence), stats.confidence, stats.correct], 1))
    count, conf_sum, correct_sum = sums.unbind(1)
    ece, mce = _binned_errors(count, conf_sum, correct_sum)
    true_count = torch.bincount(bin_index(stats.p_true, bins), minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = count.cpu().numpy()
        mean_conf = np.where(c > 0, conf_sum.cpu().numpy() / c, np.nan)
        mean_acc = np.where(c > 0, correct_sum.cpu().numpy() / c, np.nan)
    return SplitCalibration(
        examples=n, accuracy=float(stats.correct.mean()), nll=float(stats.nll.mean()),
        brier=float(stats.brier.mean()), ece=float(ece), mce=float(mce),
        adaptive_ece=adaptive_ece(stats.confidence, stats.correct, bins),
        bin_count=c.astype(np.int64), bin_confidence=mean_conf, bin_accuracy=mean_acc,
        true_class_count=true_count.cpu().numpy().astype(np.int64),
    )


def calibration_metrics(logits: torch.Tensor, y: torch.Tensor, bins: int = 15) -> SplitCalibration:
    """Accuracy, NLL, Brier, ECE, MCE, adaptive ECE and the histograms of ``(n, K)`` logits against ``y``."""
    _check_bins(bins)
    return calibration_from_stats(example_stats(logits, y), int(bins))


class ECE(Metric):
    """Equal-width ECE (Guo et al. 2017 Eq. 3) at every point, as a metric of the evaluator's hook: per point
    and bin the count, confidence sum and correct count, added with one ``index_add_`` per batch."""

    def __init__(self, bins: int = 15, name: str = "ece"):
        _check_bins(bins)
        self.bins, self.name = int(bins), name

    def __repr__(self) -> str:
        return f"ECE(bins={self.bins}, name={self.name!r})"

    def start(self, points: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(points, self.bins, 3, dtype=torch.float64, device=device)

    def update(self, state: torch.Tensor, point: int, logits: torch.Tensor, y: torch.Tensor) -> None:
        p = torch.softmax(logits.to(torch.float64), dim=1)
        conf, pred = p.max(dim=1)
        values = torch.stack([torch.ones_like(conf), conf, (pred == y).to(torch.float64)], 1)
        state[point].index_add_(0, bin_index(conf, self.bins), values)

    @staticmethod
    def errors(state: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """ECE and MCE (non-empty bins) per point from an accumulated state."""
        ece, mce = _binned_errors(*state.unbind(-1))
        return ece.cpu().numpy(), mce.cpu().numpy()

    def finish(self, state: torch.Tensor) -> np.ndarray:
        return self.errors(state)[0]


class _Examples(Metric):
    """Every example's :class:`ExampleStats` at every point (the batches arrive in order)."""

    name = "examples"

    def start(self, points: int, device: torch.device) -> list[list[ExampleStats]]:
        return [[] for _ in range(points)]

    def update(self, state, point: int, logits: torch.Tensor, y: torch.Tensor) -> None:
        state[point].append(example_stats(logits, y))

    def finish(self, state) -> list[ExampleStats]:
        return [ExampleStats(*(torch.cat([getattr(s, f) for s in parts]).cpu()
                               for f in ("confidence", "correct", "p_true", "nll", "brier")))
                for parts in state]


@dataclass
class CalibrationRow:
    """One checkpoint: its reference, run, position and each split."""

    ref: str
    step: int
    epoch: float
    splits: dict[str, SplitCalibration]
    run: str = ""

    def __post_init__(self) -> None:
        if not self.run and self.ref:  # a RUN@SELECTOR reference names its run; a checkpoint file stands for itself
            self.run = Ref.parse(self.ref).name


@dataclass
class CalibrationRecord:
    """One checkpoint on one split: a row of the result's table."""

    ref: str
    run: str
    step: int
    epoch: float
    split: str
    examples: int
    accuracy: float
    nll: float
    brier: float
    ece: float
    mce: float
    adaptive_ece: float


@dataclass
class CalibrationResult(StoredResult):
    """``landscape calibration``: a table row per (checkpoint, split), bins and histograms ``(row, bin)``."""

    KIND = KIND
    CONFIG = CalibrationConfig

    rows: list[CalibrationRecord] = stored("table", count="rows", default_factory=list)
    bin_count: np.ndarray = stored("array", dims=("row", "bin"), default_factory=lambda: np.zeros((0, 0), np.int64))
    bin_confidence: np.ndarray = stored("array", dims=("row", "bin"), default_factory=lambda: np.zeros((0, 0)))
    bin_accuracy: np.ndarray = stored("array", dims=("row", "bin"), default_factory=lambda: np.zeros((0, 0)))
    true_class_count: np.ndarray = stored("array", dims=("row", "bin"),
                                          default_factory=lambda: np.zeros((0, 0), np.int64))
    config: CalibrationConfig = field(default_factory=CalibrationConfig)

    def calibration(self, i: int) -> SplitCalibration:
        """Row ``i`` as a :class:`SplitCalibration` (scalars and bins)."""
        r = self.rows[i]
        return SplitCalibration(
            examples=int(r.examples), accuracy=r.accuracy, nll=r.nll, brier=r.brier, ece=r.ece, mce=r.mce,
            adaptive_ece=r.adaptive_ece, bin_count=np.asarray(self.bin_count[i]),
            bin_confidence=np.asarray(self.bin_confidence[i]), bin_accuracy=np.asarray(self.bin_accuracy[i]),
            true_class_count=np.asarray(self.true_class_count[i]))

    def table(self) -> list[dict[str, Any]]:
        """The rows as dicts (what the command prints)."""
        return [dict(vars(r)) for r in self.rows]


def collect(rows: list[CalibrationRow], config: CalibrationConfig) -> CalibrationResult:
    """The rows of several checkpoints in the given order, each checkpoint's splits in config order."""
    records, parts = [], []
    for row in rows:
        for split, c in row.splits.items():
            records.append(CalibrationRecord(ref=row.ref, run=row.run, step=row.step, epoch=row.epoch, split=split,
                                             **c.scalars()))
            parts.append(c)
    bins = config.bins

    def stack(name: str, dtype) -> np.ndarray:
        return np.stack([getattr(c, name) for c in parts]).astype(dtype) if parts else np.zeros((0, bins), dtype)

    return CalibrationResult(rows=records, bin_count=stack("bin_count", np.int64),
                             bin_confidence=stack("bin_confidence", np.float64),
                             bin_accuracy=stack("bin_accuracy", np.float64),
                             true_class_count=stack("true_class_count", np.int64), config=config)


def calibration_row(model: torch.nn.Module, data: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
                    config: CalibrationConfig | None = None, *, ref: str = "", step: int = 0,
                    epoch: float = math.nan, run: str = "") -> CalibrationRow:
    """Calibration of ``model`` (eval mode, its own BatchNorm statistics) on each split of ``data``."""
    config = config or CalibrationConfig()
    space = ParamSpace.from_model(model)
    point = space.flatten(model).unsqueeze(0)
    out: dict[str, SplitCalibration] = {}
    for s in config.split:
        x, y = split_subset(data, s, config.subset, config.subset_seed)
        r = evaluate(model, x, y, point, space=space, batch_size=config.chunk, device=config.device,
                     method=config.method, metrics=[_Examples()])
        out[s] = calibration_from_stats(r.metrics["examples"][0], config.bins)
    return CalibrationRow(ref=ref, step=int(step), epoch=float(epoch), splits=out, run=run)


def compute_point(point, config: CalibrationConfig, shared: Any = None) -> CalibrationRow:
    """:func:`calibration_row` at one resolved checkpoint on its own data."""
    data = {s: point.split(s) for s in config.split}
    return calibration_row(point.model(), data, config, ref=point.ref, step=point.step, epoch=point.epoch,
                           run=point.run or "")


def collect_groups(groups, config: CalibrationConfig, run_options: Any = None, refs: Any = None,
                   shared: Any = None) -> CalibrationResult:
    """Every checkpoint of every reference, in order (a run's checkpoints by step)."""
    return collect([row for group in groups for row in group], config)


def _rows(result: CalibrationResult) -> list[dict[str, Any]]:
    keep = ("ref", "split", "epoch", "accuracy", "nll", "brier", "ece", "mce", "adaptive_ece")
    return [{k: row[k] for k in keep} for row in result.table()]
