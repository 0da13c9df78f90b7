"""Is the gradient-deviation distribution symmetric? (Zhu & Blaschko 2023 App. F, Chen, Wu & Hong 2020): the
deviations ``g_i - g_bar`` projected with a seeded Gaussian matrix, the same at every checkpoint of a run (two
rows the 2-D picture, more rows 1-D projections); the energy coefficient (Szekely & Rizzo; 0 when symmetric)
with a sign-flip p-value, and the skewness along each 1-D direction."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from landscape.analyze.specs import SymmetryConfig
from landscape.data import sample_subset
from landscape.errors import UsageError, param
from landscape.results import StoredResult, stored
from landscape.runtime import resolve_device

KIND = "symmetry"
PLANE = 2  # rows 0 and 1 of the projection matrix span the 2-D picture


def direction(seed: int, shapes: Sequence[tuple[int, ...]], index: int) -> list[torch.Tensor]:
    """Row ``index`` of the projection matrix as one float32 tensor per parameter (entries i.i.d. N(0, 1)),
    a function of ``seed``, the parameter shapes and ``index`` only."""
    key = f"{int(seed)}|{[tuple(s) for s in shapes]}|{int(index)}".encode()
    gen = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & (2**63 - 1))
    sizes = [math.prod(s) for s in shapes]
    flat = torch.randn(sum(sizes), generator=gen, dtype=torch.float32)
    return [part.view(s) for part, s in zip(flat.split(sizes), shapes, strict=True)]


def matrix_fingerprint(seed: int, shapes: Sequence[tuple[int, ...]], rows: int) -> str:
    """sha256 of the first ``rows`` rows of the projection matrix (float32 bytes)."""
    h = hashlib.sha256()
    for j in range(rows):
        for t in direction(seed, shapes, j):
            h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


@dataclass
class EnergyTest:
    coefficient: float  # H in [0, 1] (U-statistic: may dip slightly below 0)
    distance: float  # energy distance between {x} and {-x}, U-statistic form
    p_value: float
    permutations: int


def energy_symmetry_test(points: np.ndarray, *, permutations: int = 999, seed: int = 0,
                         about: str = "mean") -> EnergyTest:
    """Energy-distance test of ``{x_i}`` against ``{-x_i}`` with a sign-flip permutation p-value, about
    ``"origin"`` (plain sign flips, exact) or the ``"mean"``: the centre is estimated, so the null is the
    *re-centred* flipped sample ``s x - mean(s x)`` (flipping a centred sample alone almost never rejects)."""
    x = np.asarray(points, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    n = x.shape[0]
    if n < 3:
        raise UsageError(f"the symmetry test needs at least 3 samples, got {n}")
    if about not in ("mean", "origin"):
        raise UsageError(f"symmetry is tested about 'mean' or 'origin', got {about!r}")
    recentre = about == "mean"
    if recentre:
        x = x - x.mean(0)
    a = np.linalg.norm(x[:, None, :] - x[None, :, :], axis=-1)
    b = np.linalg.norm(x[:, None, :] + x[None, :, :], axis=-1)
    np.fill_diagonal(a, 0.0)
    np.fill_diagonal(b, 0.0)
    scale = 2.0 / (n * (n - 1))
    observed = scale * (b.sum() - a.sum())
    mean_b = b.sum() / (n * (n - 1))
    coefficient = observed / (2 * mean_b) if mean_b > 0 else 0.0
    half_sum, half_diff = 0.5 * (a.sum() + b.sum()), 0.5 * (a - b)
    rng = np.random.default_rng(seed)
    exceed = 0
    for _ in range(permutations):
        s = rng.choice((-1.0, 1.0), size=n)
        z = s[:, None] * x
        if recentre:
            z -= z.mean(0)
        sq = np.einsum("ij,ij->i", z, z)
        pair_sums = np.sqrt(np.maximum(sq[:, None] + sq[None, :] + 2.0 * (z @ z.T), 0.0))  # |z_i + z_j|
        b_sum = pair_sums.sum() - 2.0 * np.sqrt(sq).sum()  # drop the diagonal |2 z_i|
        a_sum = half_sum + s @ half_diff @ s
        exceed += int(scale * (b_sum - a_sum) >= observed - 1e-12 * abs(observed))
    return EnergyTest(
        coefficient=float(coefficient), distance=float(observed),
        p_value=(1 + exceed) / (1 + permutations), permutations=permutations,
    )


def skewness(z: np.ndarray) -> np.ndarray:
    """Sample skewness of each column of ``z`` (columns centred here): ``mean(z^3) / mean(z^2)^1.5``."""
    z = np.asarray(z, dtype=np.float64)
    if z.ndim == 1:
        z = z[:, None]
    z = z - z.mean(0)
    m2 = (z**2).mean(0)
    m3 = (z**3).mean(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(m2 > 0, m3 / np.power(m2, 1.5), 0.0)


@dataclass
class SymmetryStats:
    energy_coefficient: float
    energy_distance: float
    p_value: float
    mean_abs_skew: float
    max_abs_skew: float
    skew: np.ndarray  # (P,) signed skewness per 1-D direction
    plane: np.ndarray  # (n, 2) projected deviations


def symmetry_stats(projected: np.ndarray, *, permutations: int = 999, seed: int = 0) -> SymmetryStats:
    """Statistics of raw projections ``(n, 2 + P)`` (centred here): columns 0-1 the plane, the rest 1-D."""
    p = np.asarray(projected, dtype=np.float64)
    xi = p - p.mean(0)
    plane = xi[:, :PLANE]
    test = energy_symmetry_test(plane, permutations=permutations, seed=seed)
    skew = skewness(xi[:, PLANE:]) if xi.shape[1] > PLANE else np.zeros(0)
    abs_skew = np.abs(skew)
    return SymmetryStats(
        energy_coefficient=test.coefficient, energy_distance=test.distance, p_value=test.p_value,
        mean_abs_skew=float(abs_skew.mean()) if skew.size else math.nan,
        max_abs_skew=float(abs_skew.max()) if skew.size else math.nan,
        skew=skew, plane=plane,
    )


@dataclass
class CheckpointSymmetry:
    ref: str
    step: int
    epoch: float
    stats: SymmetryStats = stored("nested")  # its scalars, skew (P,) and plane (n, 2) are columns


@dataclass
class SymmetryResult(StoredResult):
    """``landscape symmetry``: one row per checkpoint, all projected with the same matrix."""

    KIND = KIND
    CONFIG = SymmetryConfig
    SCALARS = ("energy_coefficient", "energy_distance", "p_value", "mean_abs_skew", "max_abs_skew")

    config: SymmetryConfig
    rows: list[CheckpointSymmetry] = stored("table", count="checkpoints")
    fingerprint: str = stored("attr", "", name="matrix_fingerprint")
    num_params: int = 0

    def summary_rows(self) -> list[dict]:
        return [
            {"ref": r.ref, "epoch": r.epoch, **{k: getattr(r.stats, k) for k in self.SCALARS}} for r in self.rows
        ]

    def derived(self):
        """The last checkpoint's statistics as root attrs."""
        last = self.rows[-1].stats
        return {}, {name: getattr(last, name) for name in self.SCALARS}, {}


def parameter_shapes(model: nn.Module) -> list[tuple[int, ...]]:
    return [tuple(p.shape) for p in model.parameters() if p.requires_grad]


def sample_indices(y: torch.Tensor, subset: int | float, seed: int, split: str = "") -> torch.Tensor:
    """The examples whose deviations are drawn (the same for every checkpoint; at least 3)."""
    if isinstance(subset, int) and subset > len(y):
        raise UsageError(f"{param('subset', subset)} exceeds the {len(y)} examples of the split")
    idx = sample_subset(y, subset, seed, split=split)
    if len(idx) < 3:
        raise UsageError(f"{param('subset', subset)} draws {len(idx)} of the {len(y)} examples of the split; at least 3")
    return idx


def projected_gradients(engine, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, rows: int, seed: int,
                        chunk: int, directions_per_pass: int, masks: dict[str, torch.Tensor] | None = None
                       ) -> np.ndarray:
    """``<g_i, v_j>`` for the first ``rows`` rows of the seeded matrix, ``(n, rows)`` float64; the directions
    are made a few at a time (never the whole matrix), ``masks`` applied to them (``<mask * g_i, v_j>``)."""
    shapes = parameter_shapes(model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    out = np.empty((len(y), rows), dtype=np.float64)
    for j0 in range(0, rows, directions_per_pass):
        js = range(j0, min(rows, j0 + directions_per_pass))
        dirs = [dict(zip(names, direction(seed, shapes, j), strict=True)) for j in js]
        if masks:
            dirs = [{n: v * masks[n].to(v) if n in masks else v for n, v in d.items()} for d in dirs]
        for start in range(0, len(y), chunk):
            sl = slice(start, start + chunk)
            proj = engine.projections(x[sl], y[sl], dirs)
            out[sl, j0:j0 + len(js)] = proj.detach().to(torch.float64).cpu().numpy()
    return out


def symmetry_row(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: SymmetryConfig, *, engine=None,
                 masks: dict[str, torch.Tensor] | None = None, ref: str = "", step: int = 0,
                 epoch: float = math.nan) -> CheckpointSymmetry:
    """Symmetry statistics at one parameter point (see the module docstring)."""
    if engine is None:
        from landscape.persample import PerSampleEngine

        engine = PerSampleEngine(model)
    idx = sample_indices(y, config.subset, config.subset_seed, config.split)
    projected = projected_gradients(
        engine, model, x[idx], y[idx], rows=PLANE + config.projections, seed=config.seed, chunk=config.chunk,
        directions_per_pass=config.directions_per_pass, masks=masks,
    )
    stats = symmetry_stats(projected, permutations=config.permutations, seed=config.seed)
    return CheckpointSymmetry(ref=ref, step=int(step), epoch=float(epoch), stats=stats)


def gradient_symmetry(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, projections: int = 16,
                      seed: int = 0, subset: int | float = 500, permutations: int = 999, chunk: int = 250,
                      engine=None, ref: str = "", step: int = 0, epoch: float = math.nan) -> SymmetryResult:
    """Zhu & Blaschko App. F at one parameter point (the examples are drawn with ``seed`` too)."""
    config = SymmetryConfig(projections=projections, seed=seed, subset=subset, subset_seed=seed,
                            permutations=permutations, chunk=chunk)
    row = symmetry_row(model, x, y, config, engine=engine, ref=ref, step=step, epoch=epoch)
    return collect([(row, parameter_shapes(model))], config)


def compute_point(point, config: SymmetryConfig):
    """:func:`symmetry_row` at one resolved checkpoint, and its parameter shapes."""
    model = point.model().eval().to(resolve_device(config.device))  # eval: dropout off at the point
    x, y = point.split(config.split)  # the engine moves each chunk to the model's device
    row = symmetry_row(model, x, y, config, masks=point.masks, ref=point.ref, step=point.step, epoch=point.epoch)
    return row, parameter_shapes(model)


def collect(outs, config: SymmetryConfig, _options=None) -> SymmetryResult:
    shapes = outs[0][1]
    if any(s != shapes for _, s in outs):
        raise UsageError("the checkpoints have different parameter shapes; one projection matrix cannot serve them all")
    return SymmetryResult(config=config, rows=[r for r, _ in outs],
                          fingerprint=matrix_fingerprint(config.seed, shapes, PLANE),
                          num_params=sum(math.prod(s) for s in shapes))
