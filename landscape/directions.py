"""Directions in parameter space: seeded Gaussian directions (direction ``i`` of seed ``s`` has its own
generator, so it is the same in whatever order or process it is drawn), Li et al. 2018's filter normalisation,
cosines and trajectory PCA (Li et al. Sec. 7), Gram matrices accumulated in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from landscape.errors import NonFiniteError, UsageError
from landscape.options import BIASBN, NORMALIZATIONS
from landscape.params import ParamSpace

_BLOCK = 1 << 20  # columns per float64 block in Gram computations


def random_direction(space: ParamSpace, seed: int, index: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Direction ``index`` of ``seed``: i.i.d. N(0, 1) entries over the whole space (not normalised); the
    generator's seed comes from ``(seed, index)`` through SeedSequence (independent streams)."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(index)]).generate_state(2, dtype=np.uint32)
    g = torch.Generator().manual_seed(int(state[0]) << 31 | int(state[1]) >> 1)
    return torch.randn(space.dim, generator=g, dtype=dtype)


def normalize_direction(direction: torch.Tensor, theta: torch.Tensor, space: ParamSpace, *,
                        normalize: str = "filter", biasbn: str = "zero") -> torch.Tensor:
    """Li et al. 2018 filter (or layer) normalisation of a flat direction against theta, a new tensor; 1-D
    tensors are zeroed, copied from theta or rescaled (``biasbn``). Scales in float64, without an epsilon."""
    check_options(normalize, biasbn)
    out = direction.clone()
    if normalize == "none":
        return out
    for e, stop in zip(space.entries, space.offsets, strict=True):
        d = out[stop - e.numel : stop]
        w = theta[stop - e.numel : stop]
        if len(e.shape) <= 1:
            if biasbn == "zero":
                d.zero_()
            elif biasbn == "copy":
                d.copy_(w)
            else:
                d.mul_(_ratio(w.double().norm(), d.double().norm()).to(d.dtype))
            continue
        if normalize == "filter":
            rows_d = d.view(e.shape[0], -1)
            rows_w = w.view(e.shape[0], -1)
            scale = _ratio(rows_w.double().norm(dim=1), rows_d.double().norm(dim=1))
            rows_d.mul_(scale.to(d.dtype).unsqueeze(1))
        else:
            d.mul_(_ratio(w.double().norm(), d.double().norm()).to(d.dtype))
    return out


def random_directions(theta: torch.Tensor, space: ParamSpace, indices: Sequence[int] | int, *, seed: int = 0,
                      normalize: str = "filter", biasbn: str = "zero") -> torch.Tensor:
    """Rows: normalised directions ``indices`` (or ``range(indices)``) of ``seed``, in theta's dtype; (k, d)."""
    check_options(normalize, biasbn)
    idx = range(indices) if isinstance(indices, int) else list(indices)
    out = torch.empty(len(idx), space.dim, dtype=theta.dtype)
    for row, i in enumerate(idx):
        d = random_direction(space, seed, i, dtype=theta.dtype)
        out[row] = normalize_direction(d, theta, space, normalize=normalize, biasbn=biasbn)
    return out


def check_options(normalize: str, biasbn: str) -> None:
    if normalize not in NORMALIZATIONS:
        raise UsageError(f"unknown normalisation {normalize!r}; choose from {', '.join(NORMALIZATIONS)}")
    if biasbn not in BIASBN:
        raise UsageError(f"unknown bias/norm-layer treatment {biasbn!r}; choose from {', '.join(BIASBN)}")


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / torch.where(den > 0, den, 1.0), torch.zeros_like(den))


# ------------------------------------------------------------------------------------------- cosines


def gram(rows: torch.Tensor) -> torch.Tensor:
    """``rows @ rows.T`` in float64, accumulated over column blocks (rows may be float32)."""
    k = rows.shape[0]
    g = torch.zeros(k, k, dtype=torch.float64)
    for start in range(0, rows.shape[1], _BLOCK):
        block = rows[:, start : start + _BLOCK].double()
        g += block @ block.T
    return g


def max_abs_cosine(directions: torch.Tensor) -> float:
    """Largest ``|cos(d_i, d_j)|`` over pairs ``i != j`` (NaN for fewer than two directions)."""
    n = directions.shape[0]
    if n < 2:
        return math.nan
    g = gram(directions)  # cosines of every pair of rows, float64
    norms = g.diagonal().sqrt()
    c = g / (norms.unsqueeze(0) * norms.unsqueeze(1))
    off = ~torch.eye(n, dtype=torch.bool)
    return float(c[off].abs().max())


# ---------------------------------------------------------------------------------------------- PCA


@dataclass
class TrajectoryPCA:
    """Li et al. Sec. 7: orthonormal principal ``components`` (k, d) of a trajectory around ``origin``, their
    ``explained_variance_ratio`` and the checkpoints' ``coords`` (T, k); the first checkpoint's are <= 0."""

    components: torch.Tensor
    explained_variance_ratio: np.ndarray
    coords: np.ndarray


def trajectory_pca(points: torch.Tensor, origin: torch.Tensor, *, n_components: int = 2) -> TrajectoryPCA:
    """PCA of ``points - origin`` (rows: checkpoints in order), centred over the checkpoints."""
    t = points.shape[0]
    if t < 2:
        raise UsageError(f"a trajectory PCA needs at least 2 checkpoints, got {t}")
    diffs = points - origin.to(points.dtype)
    mean = diffs.double().mean(dim=0)
    g = torch.zeros(t, t, dtype=torch.float64)
    for start in range(0, diffs.shape[1], _BLOCK):
        block = diffs[:, start : start + _BLOCK].double() - mean[start : start + _BLOCK]
        g += block @ block.T
    if not torch.isfinite(g).all():
        raise NonFiniteError("the trajectory's checkpoints hold NaN or infinite weights (a diverged run?); "
                             "no PCA plane through them")
    evals, evecs = torch.linalg.eigh(g)
    order = torch.argsort(evals, descending=True)
    evals, evecs = evals[order].clamp(min=0), evecs[:, order]
    total = float(evals.sum())
    if total <= 0:
        raise UsageError("the trajectory's checkpoints are all identical; nothing to project")
    k = min(n_components, t)
    comps = torch.zeros(n_components, diffs.shape[1], dtype=torch.float64)
    for j in range(k):
        if evals[j] <= total * 1e-12:  # numerically absent: filled below with an orthogonal unit vector
            continue
        for start in range(0, diffs.shape[1], _BLOCK):
            block = diffs[:, start : start + _BLOCK].double() - mean[start : start + _BLOCK]
            comps[j, start : start + _BLOCK] = evecs[:, j] @ block
        for i in range(j):  # re-orthogonalise against rounding
            comps[j] -= (comps[j] @ comps[i]) * comps[i]
        comps[j] /= comps[j].norm()
    comps = _orthonormal_fill(comps, k)
    coords = torch.zeros(t, n_components, dtype=torch.float64)
    for start in range(0, diffs.shape[1], _BLOCK):
        coords += diffs[:, start : start + _BLOCK].double() @ comps[:, start : start + _BLOCK].T
    coords = coords.numpy()
    for j in range(n_components):
        first = coords[0, j]
        if first > 0 or (first == 0 and comps[j][comps[j].abs().argmax()] < 0):
            comps[j].neg_()
            coords[:, j] = -coords[:, j]
    ratio = np.zeros(n_components)
    ratio[:k] = (evals[:k] / total).numpy()
    ratio[ratio < 1e-12] = 0.0
    return TrajectoryPCA(components=comps.to(points.dtype), explained_variance_ratio=ratio, coords=coords)


def _orthonormal_fill(comps: torch.Tensor, k: int) -> torch.Tensor:
    """Replace zero rows (rank-deficient trajectories) by unit vectors orthogonal to the others."""
    for j in range(comps.shape[0]):
        if comps[j].norm() > 0:
            continue
        v = torch.zeros(comps.shape[1], dtype=torch.float64)
        for c in range(comps.shape[1]):
            v.zero_()
            v[c] = 1.0
            for i in range(comps.shape[0]):
                if i != j:
                    v -= (v @ comps[i]) * comps[i]
            if v.norm() > 0.5:
                break
        comps[j] = v / v.norm()
    return comps
