"""Parameter and gradient norms along training (Watson et al. 2023 App. Figs. 16-17): per checkpoint the
distances from the origin and the initialisation, a value histogram on edges shared by every checkpoint, and
per-sample gradient norms; runs compared by their final distances."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from landscape.analyze.specs import NormsConfig
from landscape.data import take_subset
from landscape.errors import OptionError, UsageError
from landscape.results import StoredResult, stored
from landscape.runtime import resolve_device

KIND = "norms"


def trainable_names(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


@dataclass
class ParameterNorms:
    dist_origin: float
    dist_init: float  # NaN without an initialisation
    layer_norms: np.ndarray  # (L,)
    layer_dist_init: np.ndarray  # (L,), NaN without an initialisation
    num_params: int


def parameter_norms(state: Mapping[str, torch.Tensor], names: Sequence[str],
                    init: Mapping[str, torch.Tensor] | None = None) -> ParameterNorms:
    """||theta||, ||theta - theta_0|| and the per-layer versions (float64)."""
    layer = np.array([float(torch.linalg.norm(state[n].detach().to(torch.float64))) for n in names])
    if init is not None:
        diff = np.array([
            float(torch.linalg.norm(state[n].detach().to(torch.float64) - init[n].detach().to(torch.float64)))
            for n in names
        ])
    else:
        diff = np.full(len(names), math.nan)
    return ParameterNorms(
        dist_origin=float(np.sqrt(np.sum(layer**2))),
        dist_init=float(np.sqrt(np.sum(diff**2))),
        layer_norms=layer, layer_dist_init=diff,
        num_params=sum(state[n].numel() for n in names),
    )


def histogram_edges(low: float, high: float, bins: int) -> np.ndarray:
    """``bins + 1`` equal-width edges on ``[low, high]`` (widened when the range is empty)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        raise UsageError("parameters contain NaN or inf; cannot build a histogram")
    if high <= low:
        low, high = low - 0.5, high + 0.5
    return np.linspace(low, high, bins + 1)


def value_histogram(values: torch.Tensor | np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts of ``values`` in the bins of ``edges``; values beyond the edges go to the outermost bins."""
    v = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    v = np.clip(v.astype(np.float64).ravel(), edges[0], edges[-1])
    counts, _ = np.histogram(v, bins=edges)
    return counts.astype(np.int64)


def per_sample_grad_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, chunk: int = 250,
                          engine=None, masks: dict[str, torch.Tensor] | None = None) -> np.ndarray:
    """``||g_i||`` for every example (float64), from the engine's norm route, in chunks."""
    if engine is None:
        from landscape.persample import PerSampleEngine

        engine = PerSampleEngine(model)
    out = [engine.norms(x[s:s + chunk], y[s:s + chunk], masks=masks).flat.detach().cpu().numpy()
           for s in range(0, len(y), chunk)]
    return np.concatenate(out) if out else np.zeros(0)


@dataclass
class CheckpointNorms:
    """One checkpoint's row of a run's table (``runs/<i>/...`` in the file)."""

    ref: str
    step: int
    epoch: float
    params: ParameterNorms = stored("nested")
    histogram: np.ndarray  # (bins,)
    grad_norms: np.ndarray  # (samples,) per-sample gradient norms (empty when not asked for)

    @property
    def mean_grad_norm(self) -> float:
        return float(self.grad_norms.mean()) if self.grad_norms.size else math.nan


@dataclass
class RunNorms:
    """One run's (or loose checkpoint's) norms: a row of the run table, with its layer names and checkpoint
    rows in the group ``runs/<i>/``."""

    label: str = stored("array", name="run_labels")
    optimizer: str = stored("array", name="optimizers")
    layer_names: list[str] = stored("group", name="runs/{}/layer_names")
    rows: list[CheckpointNorms] = stored("group", name="runs/{}/", default_factory=list)

    def column(self, name: str) -> np.ndarray:
        if name == "mean_grad_norm":
            return np.array([r.mean_grad_norm for r in self.rows])
        return np.array([getattr(r.params, name) for r in self.rows], dtype=float)


@dataclass
class NormsResult(StoredResult):
    """``landscape norms``: several runs on shared histogram edges, with distance ratios to the first run."""

    KIND = KIND
    CONFIG = NormsConfig

    config: NormsConfig
    edges: np.ndarray
    runs: list[RunNorms] = stored("table", count="runs")

    def ratio_rows(self) -> list[dict]:
        """Final distance from the origin (and from init) per run, and its ratio to the first run's."""
        base = self.runs[0].rows[-1].params.dist_origin
        out = []
        for run in self.runs:
            last = run.rows[-1]
            out.append({
                "run": run.label, "optimizer": run.optimizer, "epoch": last.epoch,
                "dist_origin": last.params.dist_origin,
                "ratio_to_first": last.params.dist_origin / base if base > 0 else math.nan,
                "dist_init": last.params.dist_init, "mean_grad_norm": last.mean_grad_norm,
                "params": last.params.num_params,
            })
        return out

    def derived(self) -> tuple[dict, dict, dict]:
        """Per run the mean gradient norms; the final distances and ratios (the frame's columns) and attrs."""
        table = self.ratio_rows()
        arrays = {f"runs/{i}/mean_grad_norm": run.column("mean_grad_norm") for i, run in enumerate(self.runs)}
        arrays["dist_origin"] = np.array([t["dist_origin"] for t in table])
        arrays["ratio_to_first"] = np.array([t["ratio_to_first"] for t in table])
        first = table[0]
        attrs = {"dist_origin": first["dist_origin"], "dist_init": first["dist_init"],
                 "mean_grad_norm": first["mean_grad_norm"],
                 "table": json.dumps(["run_labels", "optimizers", "dist_origin", "ratio_to_first"])}
        return arrays, attrs, {}


def checkpoint_norms(model: nn.Module, x: torch.Tensor | None, y: torch.Tensor | None, config: NormsConfig,
                     edges: np.ndarray, *, init: Mapping[str, torch.Tensor] | None = None, engine=None,
                     ref: str = "", step: int = 0, epoch: float = math.nan,
                     masks: dict[str, torch.Tensor] | None = None) -> CheckpointNorms:
    """Norm statistics of one parameter point (``x, y`` None when ``config.subset == 0``; ``masks`` prune the
    gradients)."""
    names = trainable_names(model)
    state = {n: p.detach().cpu() for n, p in model.named_parameters()}  # parameter statistics on the CPU
    params = parameter_norms(state, names, init)
    hist = value_histogram(torch.cat([state[n].reshape(-1).to(torch.float64) for n in names]), edges)
    grad_norms = np.zeros(0)
    if config.subset > 0 and x is not None:
        xs, ys = take_subset(x, y, min(config.subset, len(y)), config.subset_seed, split=config.split)
        grad_norms = per_sample_grad_norms(model, xs, ys, chunk=config.chunk, engine=engine, masks=masks)
    return CheckpointNorms(ref=ref, step=int(step), epoch=float(epoch), params=params, histogram=hist,
                           grad_norms=grad_norms)


def value_range(point, config: NormsConfig) -> tuple[float, float, float]:
    """The smallest and largest trainable parameter value of a checkpoint, and its epoch."""
    names = trainable_names(point.model())
    state = point.state
    return (min(float(state[n].detach().min()) for n in names), max(float(state[n].detach().max()) for n in names),
            point.epoch)


def shared_edges(values, config: NormsConfig) -> np.ndarray:
    """Histogram edges common to every checkpoint; each ``grad_epochs`` entry must be a checkpoint epoch."""
    epochs = sorted({v[2] for v in values})
    missing = [e for e in config.grad_epochs or () if not any(math.isclose(e, have, abs_tol=1e-6) for have in epochs)]
    if missing:
        raise OptionError("grad_epochs", f"{', '.join(f'{e:g}' for e in missing)}: no such checkpoint epoch "
                         f"(available: {', '.join(f'{e:g}' for e in epochs)})")
    return histogram_edges(min(v[0] for v in values), max(v[1] for v in values), config.bins)


def compute_point(point, config: NormsConfig, edges: np.ndarray):
    """:func:`checkpoint_norms` at one resolved checkpoint, with its optimizer label and layer names."""
    model = point.model().eval().to(resolve_device(config.device))  # eval: dropout off at the point
    x = y = None
    if config.subset > 0:
        x, y = point.split(config.split)  # the engine moves each chunk (and the masks) to the model's device
    row = checkpoint_norms(model, x, y, config, edges, init=point.init, ref=point.ref, step=point.step,
                           epoch=point.epoch, masks=point.masks)
    optimizer = str(((point.manifest or {}).get("config") or {}).get("optimizer") or "")
    if point.masks is not None:
        optimizer = f"{optimizer} (pruned)" if optimizer else "pruned"
    return row, optimizer, trainable_names(model)


def collect(groups, config: NormsConfig, _options, labels, edges: np.ndarray) -> NormsResult:
    runs = [RunNorms(label=str(label), optimizer=group[0][1], layer_names=group[0][2], rows=[r for r, _, _ in group])
            for label, group in zip(labels, groups, strict=True)]
    return NormsResult(config=config, edges=edges, runs=runs)
