"""The clipping ratio R (Watson et al. 2023 Def. 3.1) and whether the assumption and the bound of Thm. 3.2
held (the theorem is false as stated: docs/geometry.md). Everything comes from additive sufficient statistics
(:class:`ClipMoments`): chunks and batches add exactly, without the ``n x d`` gradient matrix; under flat
clipping the per-layer fraction clipped and bound are NaN, the per-layer assumption flags False."""

from __future__ import annotations

import functools
import json
import math
import operator
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from landscape.analyze.specs import ClippingConfig
from landscape.clip import clip_factors, layer_threshold
from landscape.errors import UsageError, param
from landscape.results import StoredResult, stored
from landscape.runtime import resolve_device

KIND = "clipping"
# The bound is checked with this relative slack for floating-point rounding (equality holds when all g_i agree).
BOUND_RTOL = 1e-9


def _per_layer(name: str, dtype: type = float):
    """A per-layer array field of :class:`ClipStats`, stored as the dataset ``layer/<name>``."""
    return stored("array", name=f"layer/{name}", default_factory=lambda: np.zeros(0, dtype))


@dataclass
class ClipStats:
    """Watson Sec. 3.1 quantities of one set of per-sample gradients (flat, plus one entry per layer)."""

    n: int
    R: float
    projection: float
    bound: float
    assumption_held: bool
    bound_held: bool
    fraction_clipped: float
    cos_clipped_mean: float
    mean_grad_norm: float  # ||g_bar||
    clipped_mean_norm: float  # ||c||
    mean_sample_norm: float  # (1/n) sum ||g_i||
    min_sample_norm: float
    layer_R: np.ndarray = _per_layer("R")
    layer_projection: np.ndarray = _per_layer("projection")
    layer_bound: np.ndarray = _per_layer("bound")
    layer_assumption_held: np.ndarray = _per_layer("assumption_held", bool)
    layer_fraction_clipped: np.ndarray = _per_layer("fraction_clipped")
    layer_cos_clipped_mean: np.ndarray = _per_layer("cos_clipped_mean")
    layer_mean_grad_norm: np.ndarray = _per_layer("mean_grad_norm")

    SCALARS = (
        "R", "projection", "bound", "assumption_held", "bound_held", "fraction_clipped", "cos_clipped_mean",
        "mean_grad_norm", "clipped_mean_norm", "mean_sample_norm", "min_sample_norm",
    )


def _ratio(mean_sq_norm: float, mean_grad_sq: float) -> float:
    if mean_grad_sq <= 0:
        return math.inf
    return max(mean_sq_norm - mean_grad_sq, 0.0) / mean_grad_sq


def _bound_held(projection: float, bound: float, scale: float) -> bool:
    if not math.isfinite(projection):
        return False
    return projection >= bound - BOUND_RTOL * max(scale, abs(projection), abs(bound) if math.isfinite(bound) else 0)


def _projection_and_cos(c: np.ndarray, g: np.ndarray) -> tuple[float, float]:
    g_norm = float(np.linalg.norm(g))
    c_norm = float(np.linalg.norm(c))
    if g_norm == 0:
        return math.nan, math.nan
    proj = float(c @ g) / g_norm
    return proj, (proj / c_norm if c_norm > 0 else math.nan)


def clipping_quantities(norms: np.ndarray, mean_grad: np.ndarray, clipped_mean: np.ndarray,
                        max_grad_norm: float) -> ClipStats:
    """R, projection, bound and flags (flat clipping) from per-sample norms, ``g_bar`` and ``c`` only, as the
    analyzer computes them (it never sees the gradients themselves)."""
    norms = np.asarray(norms, dtype=np.float64)
    return _flat_stats(
        n=norms.size,
        mean_sq_norm=float(np.mean(norms**2)),
        mean_sample_norm=float(np.mean(norms)),
        min_sample_norm=float(np.min(norms)),
        n_clipped=int(np.sum(norms > max_grad_norm)),
        g=np.asarray(mean_grad, dtype=np.float64).ravel(),
        c=np.asarray(clipped_mean, dtype=np.float64).ravel(),
        max_grad_norm=max_grad_norm,
    )


def _flat_stats(*, n, mean_sq_norm, mean_sample_norm, min_sample_norm, n_clipped, g, c, max_grad_norm,
                **layers) -> ClipStats:
    g_sq = float(g @ g)
    ratio = _ratio(mean_sq_norm, g_sq)
    proj, cos = _projection_and_cos(c, g)
    bound = max_grad_norm * (1.0 - ratio / 2.0)  # Thm. 3.2: c . g_bar / ||g_bar|| >= C (1 - R/2)
    return ClipStats(
        n=n, R=ratio, projection=proj, bound=bound,
        assumption_held=bool(g_sq > 0 and min_sample_norm >= max_grad_norm),
        bound_held=_bound_held(proj, bound, max_grad_norm),
        fraction_clipped=n_clipped / n, cos_clipped_mean=cos, mean_grad_norm=math.sqrt(g_sq),
        clipped_mean_norm=float(np.linalg.norm(c)), mean_sample_norm=mean_sample_norm,
        min_sample_norm=min_sample_norm, **layers,
    )


@dataclass
class ClipMoments:
    """Additive sufficient statistics of per-sample gradients (chunks add up exactly): per layer the sums of
    ``||g_i||^2``, ``g_i``, the clipped ``w_i g_i`` and ``||g_i||``, the least norm and the count clipped; the
    same over whole gradients (layerwise: clipped (sample, layer) pairs / L, as training reports it)."""

    n: int
    sq_sum: np.ndarray
    norm_sum: np.ndarray
    min_norm: np.ndarray
    n_clipped: np.ndarray
    grad_sum: list[np.ndarray]
    clipped_sum: list[np.ndarray]
    flat_norm_sum: float
    flat_min_norm: float
    flat_n_clipped: float

    def __add__(self, other: ClipMoments) -> ClipMoments:
        return ClipMoments(
            n=self.n + other.n,
            sq_sum=self.sq_sum + other.sq_sum,
            norm_sum=self.norm_sum + other.norm_sum,
            min_norm=np.minimum(self.min_norm, other.min_norm),
            n_clipped=self.n_clipped + other.n_clipped,
            grad_sum=[a + b for a, b in zip(self.grad_sum, other.grad_sum, strict=True)],
            clipped_sum=[a + b for a, b in zip(self.clipped_sum, other.clipped_sum, strict=True)],
            flat_norm_sum=self.flat_norm_sum + other.flat_norm_sum,
            flat_min_norm=min(self.flat_min_norm, other.flat_min_norm),
            flat_n_clipped=self.flat_n_clipped + other.flat_n_clipped,
        )

    @classmethod
    def from_parts(cls, layer_norms: Sequence[np.ndarray], grad_sum: Sequence[np.ndarray],
                   clipped_sum: Sequence[np.ndarray], *, max_grad_norm: float, layer_max_norms: np.ndarray,
                   clip_style: str) -> ClipMoments:
        """Moments of one chunk from its per-layer per-sample norms (L arrays (n,)) and the two sums."""
        per_layer = np.stack([np.asarray(v, dtype=np.float64) for v in layer_norms])  # (L, n)
        flat = np.sqrt((per_layer**2).sum(0))
        layer_clipped = per_layer > layer_max_norms[:, None]
        # layerwise: the fraction of (sample, layer) pairs clipped, as the training's Privatizer reports it
        flat_clipped = (flat > max_grad_norm).sum() if clip_style == "flat" else layer_clipped.mean(0).sum()
        return cls(
            n=per_layer.shape[1],
            sq_sum=(per_layer**2).sum(1),
            norm_sum=per_layer.sum(1),
            min_norm=per_layer.min(1),
            n_clipped=layer_clipped.sum(1),
            grad_sum=[np.asarray(g, dtype=np.float64).ravel() for g in grad_sum],
            clipped_sum=[np.asarray(c, dtype=np.float64).ravel() for c in clipped_sum],
            flat_norm_sum=float(flat.sum()),
            flat_min_norm=float(flat.min()),
            flat_n_clipped=float(flat_clipped),
        )

    def stats(self, *, max_grad_norm: float, layer_max_norms: np.ndarray, clip_style: str) -> ClipStats:
        """Finalise: Watson Def. 3.1 / Thm. 3.2 quantities, flat and per layer."""
        n = self.n
        g_layers = [g / n for g in self.grad_sum]
        c_layers = [c / n for c in self.clipped_sum]
        g, c = np.concatenate(g_layers), np.concatenate(c_layers)
        layer_g_sq = np.array([float(v @ v) for v in g_layers])
        layer_R = np.array([_ratio(s / n, gs) for s, gs in zip(self.sq_sum, layer_g_sq, strict=True)])
        pc = [_projection_and_cos(cl, gl) for cl, gl in zip(c_layers, g_layers, strict=True)]
        if clip_style == "layerwise":
            layer_assume = (self.min_norm >= layer_max_norms) & (layer_g_sq > 0)
            layer_bound = layer_max_norms * (1.0 - layer_R / 2.0)
            layer_fraction = self.n_clipped / n
        else:  # flat: no layer is clipped on its own; the theorem says nothing about a layer's share
            layer_assume = np.zeros(len(layer_R), dtype=bool)  # not evaluated
            layer_bound = np.full(len(layer_R), math.nan)
            layer_fraction = np.full(len(layer_R), math.nan)
        stats = _flat_stats(
            n=n, mean_sq_norm=float(self.sq_sum.sum()) / n, mean_sample_norm=self.flat_norm_sum / n,
            min_sample_norm=self.flat_min_norm, n_clipped=self.flat_n_clipped, g=g, c=c,
            max_grad_norm=max_grad_norm, layer_R=layer_R, layer_projection=np.array([p for p, _ in pc]),
            layer_bound=layer_bound, layer_assumption_held=layer_assume, layer_fraction_clipped=layer_fraction,
            layer_cos_clipped_mean=np.array([q for _, q in pc]), layer_mean_grad_norm=np.sqrt(layer_g_sq),
        )
        if clip_style == "layerwise":
            g_norm = math.sqrt(float(g @ g))
            weights = np.sqrt(layer_g_sq) / g_norm if g_norm > 0 else np.full(len(layer_R), math.nan)
            # a layer with a zero mean gradient (pruned, unused) has weight 0 and bound -inf: it adds nothing
            with np.errstate(invalid="ignore"):  # 0 * -inf in the discarded branch of np.where
                stats.bound = (float(np.sum(np.where(weights > 0, weights * layer_bound, 0.0))) if g_norm > 0
                               else -math.inf)
            stats.assumption_held = bool(layer_assume.all())
            stats.bound_held = _bound_held(stats.projection, stats.bound, max_grad_norm)
        return stats


def layer_max_norms_for(max_grad_norm: float, num_layers: int, clip_style: str) -> np.ndarray:
    """Per-layer thresholds: ``C / sqrt(L)`` for layerwise clipping (training's default); for flat clipping
    ``C``, a placeholder no per-layer result uses."""
    c = layer_threshold(max_grad_norm, num_layers) if clip_style == "layerwise" else max_grad_norm
    return np.full(num_layers, c)


@dataclass
class CheckpointClipping:
    """One row of a clipping result: the aggregate over all ``K x B`` samples and each batch on its own."""

    ref: str
    step: int
    epoch: float
    prune_level: float
    total: ClipStats = stored("nested")  # columns R, projection, ..., layer/R, ...
    batches: list[ClipStats] = stored("nested", name="batch/")  # columns batch/R, ... (checkpoints x K)


@dataclass
class ClippingResult(StoredResult):
    """``landscape clipping``: one row per checkpoint (or per pruning level)."""

    KIND = KIND
    CONFIG = ClippingConfig

    config: ClippingConfig
    layer_names: list[str] = stored("array")
    rows: list[CheckpointClipping] = stored("table", count="checkpoints")
    num_params: int = 0

    def column(self, name: str) -> np.ndarray:
        return np.array([getattr(r.total, name) for r in self.rows], dtype=float)

    def derived(self):
        """The last checkpoint's statistics, the sample count and whether assumption and bound always held."""
        last = self.rows[-1].total
        attrs = {name: getattr(last, name) for name in ClipStats.SCALARS}
        attrs.update(samples=last.n, all_assumption_held=bool(all(r.total.assumption_held for r in self.rows)),
                     all_bound_held=bool(all(r.total.bound_held for r in self.rows)),
                     table=json.dumps(["ref", "step", "epoch", "prune_level", *ClipStats.SCALARS]))  # to_frame()
        return {}, attrs, {}


def batch_indices(num_examples: int, batch_size: int, batches: int, seed: int) -> list[torch.Tensor]:
    """``batches`` disjoint batches of ``batch_size`` examples, drawn without replacement by ``seed``."""
    if batch_size * batches > num_examples:
        raise UsageError(
            f"{batches} batches of {batch_size} need {batch_size * batches} examples but the split has "
            f"{num_examples}; lower {param('batch_size')} or {param('batches')}"
        )
    perm = torch.randperm(num_examples, generator=torch.Generator().manual_seed(int(seed)))
    return [perm[k * batch_size:(k + 1) * batch_size] for k in range(batches)]


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy().ravel()


def chunk_moments(engine, names: list[str], x: torch.Tensor, y: torch.Tensor, *, max_grad_norm: float,
                  layer_max_norms: np.ndarray, clip_style: str, masks: dict[str, torch.Tensor] | None = None
                 ) -> ClipMoments:
    """Moments of one chunk through the engine: norms + clipped sum (ghost norms, one weighted contraction),
    then ``sum_i g_i`` (one plain backward). No per-sample gradient is materialised."""
    thresholds = {n: float(c) for n, c in zip(names, layer_max_norms, strict=True)}

    def factors(norms):
        if clip_style == "flat":
            return clip_factors(norms.flat.to(torch.float64), max_grad_norm)  # Abadi's min(1, C/||g_i||)
        return {n: clip_factors(norms.layers[n].to(torch.float64), thresholds[n]) for n in names}

    clipped, norms = engine.clipped_sum(x, y, factors, masks=masks)
    mean = engine.mean_grad(x, y, masks=masks)
    summed = {n: mean[n].to(torch.float64) * len(y) for n in names}
    return ClipMoments.from_parts(
        [norms.layers[n].detach().to(torch.float64).cpu().numpy() for n in names],
        [_as_numpy(summed[n]) for n in names],
        [_as_numpy(clipped[n]) for n in names],
        max_grad_norm=max_grad_norm, layer_max_norms=layer_max_norms, clip_style=clip_style,
    )


def clipping_geometry(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, max_grad_norm: float,
                      batch_size: int, batches: int = 1, clip_style: str = "flat", seed: int = 0,
                      chunk: int = 250, masks: dict[str, torch.Tensor] | None = None, engine=None,
                      ref: str = "", step: int = 0, epoch: float = math.nan, prune_level: float = math.nan
                     ) -> ClippingResult:
    """Watson et al. Sec. 3.1 at one parameter point: R, c and the Thm. 3.2 bound per batch and over all;
    ``masks`` (1 = keep) restrict the gradients to unpruned weights."""
    config = ClippingConfig(
        max_grad_norm=max_grad_norm, batch_size=batch_size, batches=batches, clip_style=clip_style,
        seed=seed, chunk=chunk,
    )
    row, names, num_params = clipping_row(
        model, x, y, config, masks=masks, engine=engine, ref=ref, step=step, epoch=epoch, prune_level=prune_level
    )
    return ClippingResult(config=config, layer_names=names, rows=[row], num_params=num_params)


def clipping_row(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: ClippingConfig, *, masks=None,
                 engine=None, ref: str = "", step: int = 0, epoch: float = math.nan,
                 prune_level: float = math.nan) -> tuple[CheckpointClipping, list[str], int]:
    """One result row (see :func:`clipping_geometry`), with the layer names and the parameter count."""
    if engine is None:
        from landscape.persample import PerSampleEngine

        engine = PerSampleEngine(model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    num_params = sum(p.numel() for n, p in model.named_parameters() if p.requires_grad)
    thresholds = layer_max_norms_for(config.max_grad_norm, len(names), config.clip_style)
    kwargs = dict(max_grad_norm=config.max_grad_norm, layer_max_norms=thresholds, clip_style=config.clip_style)

    def moments(idx: torch.Tensor) -> ClipMoments:  # one batch, summed chunk by chunk
        return functools.reduce(operator.add, (chunk_moments(engine, names, x[p], y[p], masks=masks, **kwargs)
                                               for p in idx.split(config.chunk)))

    per_batch = [moments(idx) for idx in batch_indices(len(y), config.batch_size, config.batches, config.seed)]
    total = functools.reduce(operator.add, per_batch)
    row = CheckpointClipping(
        ref=ref, step=int(step), epoch=float(epoch), prune_level=float(prune_level),
        total=total.stats(**kwargs), batches=[m.stats(**kwargs) for m in per_batch],
    )
    return row, names, num_params


def compute_point(point, config: ClippingConfig):
    """:func:`clipping_row` at one resolved checkpoint (its run's pruning mask applied)."""
    x, y = point.split(config.split)  # the engine moves each chunk (and the masks) to the model's device
    model = point.model().eval().to(resolve_device(config.device))  # eval: dropout off at the point
    return clipping_row(model, x, y, config, masks=point.masks, ref=point.ref, step=point.step,
                        epoch=point.epoch, prune_level=point.tag.get("prune_level", math.nan))


def collect(outs, config: ClippingConfig, _options=None) -> ClippingResult:
    result = ClippingResult(config=config, layer_names=outs[0][1], rows=[o[0] for o in outs], num_params=outs[0][2])
    bad = [r.ref for r in result.rows if not math.isfinite(r.total.R)]
    if bad:
        warnings.warn(f"non-finite gradients at {', '.join(bad)} (a diverged checkpoint?): R and the bound are NaN",
                      RuntimeWarning, stacklevel=2)
    return result


def _printed(result: ClippingResult) -> list[dict]:
    """What the CLI prints: one row per checkpoint (or pruning level)."""
    shown = ("projection", "bound", "assumption_held", "bound_held", "fraction_clipped", "cos_clipped_mean")
    rows = []
    for r in result.rows:
        level = {"prune_level": r.prune_level} if result.config.prune_levels else {}
        rows.append({**level, "ref": r.ref, "epoch": r.epoch, "R": r.total.R,
                     "R_batch_mean": float(np.mean([b.R for b in r.batches])),
                     **{k: getattr(r.total, k) for k in shown}})
    return rows
