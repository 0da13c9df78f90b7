"""Hessian sharpness (PyHessian, Yao et al. 2020) on one seeded subset: top eigenvalues by Lanczos with their
residuals (Golub & Van Loan 2013, Alg. 10.1.1), the trace (Hutchinson 1990) and the spectral density by
stochastic Lanczos quadrature (Ghorbani et al. 2019); with masks on the unpruned coordinates (``P H P``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from landscape.analyze.specs import HessianConfig
from landscape.curvature import HessianOperator
from landscape.data import take_subset
from landscape.errors import UsageError, param
from landscape.evaluate.allocator import tuned_allocator
from landscape.results import StoredResult, stored
from landscape.runtime import resolve_device
from landscape.spectral import (
    SpectralDensity,
    TopEigen,
    TraceEstimate,
    hutchinson_trace,
    spectral_density,
    top_eigenvalues,
)

KIND = "hessian"
PRECISIONS = {"float32": torch.float32, "float64": torch.float64}


def _empty(*shape: int):
    return stored("skip", default_factory=lambda: np.zeros(shape))


@dataclass
class HessianRow:
    """The Hessian measurements of one checkpoint (NaN / empty where not asked for)."""

    ref: str
    run: str
    optimizer: str
    step: int
    epoch: float
    loss: float  # mean loss on the subset
    num_params: int  # free (unpruned) trainable parameters
    top_eigenvalue: float
    trace: float
    trace_se: float
    lanczos_steps: int
    products: int  # Hessian-vector products taken
    seconds: float
    eigenvalues: np.ndarray = _empty(0)  # (top_k,) descending
    residuals: np.ndarray = _empty(0)  # (top_k,)
    trace_samples: np.ndarray = _empty(0)  # (probes,) z^T H z
    density_nodes: np.ndarray = _empty(0, 0)  # (density_probes, m)
    density_weights: np.ndarray = _empty(0, 0)
    density_grid: np.ndarray = _empty(0)  # (GRID,)
    density: np.ndarray = _empty(0)


def _stack(arrays: list[np.ndarray]) -> np.ndarray:
    """Arrays of one rank stacked on a new first axis, NaN-padded to a common shape."""
    shape = tuple(max(a.shape[d] for a in arrays) for d in range(arrays[0].ndim)) if arrays else ()
    out = np.full((len(arrays), *shape), np.nan)
    for i, a in enumerate(arrays):
        out[(i, *(slice(0, n) for n in a.shape))] = a
    return out


@dataclass
class HessianResult(StoredResult):
    """``landscape hessian``: a table row per checkpoint, the per-checkpoint arrays stacked over them."""

    KIND = KIND
    CONFIG = HessianConfig

    rows: list[HessianRow] = stored("table", count="checkpoints", default_factory=list)
    eigenvalues: np.ndarray = stored("array", dims=("checkpoint", "k"), default_factory=lambda: np.zeros((0, 0)))
    residuals: np.ndarray = stored("array", dims=("checkpoint", "k"), default_factory=lambda: np.zeros((0, 0)))
    trace_samples: np.ndarray = stored("array", dims=("checkpoint", "probe"),
                                       default_factory=lambda: np.zeros((0, 0)))
    density_nodes: np.ndarray = stored("array", dims=("checkpoint", "run", "node"),
                                       default_factory=lambda: np.zeros((0, 0, 0)))
    density_weights: np.ndarray = stored("array", dims=("checkpoint", "run", "node"),
                                         default_factory=lambda: np.zeros((0, 0, 0)))
    density_grid: np.ndarray = stored("array", dims=("checkpoint", "grid"), default_factory=lambda: np.zeros((0, 0)))
    density: np.ndarray = stored("array", dims=("checkpoint", "grid"), default_factory=lambda: np.zeros((0, 0)))
    config: HessianConfig = field(default_factory=HessianConfig)

    @classmethod
    def from_rows(cls, rows: list[HessianRow], config: HessianConfig) -> HessianResult:
        arrays = {name: _stack([getattr(r, name) for r in rows]) for name in (
            "eigenvalues", "residuals", "trace_samples", "density_nodes", "density_weights", "density_grid",
            "density")}
        return cls(rows=list(rows), config=config, **arrays)

    def table_rows(self) -> list[dict]:
        """One dict per checkpoint: ref, optimizer, epoch, loss, lambda_i, trace +- se, residual_1."""
        out = []
        for c, r in enumerate(self.rows):
            row = {"ref": r.ref, "optimizer": r.optimizer, "epoch": r.epoch, "loss": r.loss}
            row.update({f"lambda_{i + 1}": float(v) for i, v in enumerate(self.eigenvalues[c])})
            if self.config.top_k:
                row["residual_1"] = float(self.residuals[c, 0])
            if self.config.trace:
                row.update({"trace": r.trace, "trace_se": r.trace_se})
            out.append(row)
        return out


def subset(x: Tensor, y: Tensor, n: int | float, seed: int, split: str = "") -> tuple[Tensor, Tensor]:
    """The fixed subset every measurement of a run uses (a count, at most the split's size, or a fraction)."""
    return take_subset(x, y, min(n, len(y)), seed, split=split)


@tuned_allocator()  # one block for the operator and every estimator: the products' temporaries are reused
def hessian_row(model: nn.Module, x: Tensor, y: Tensor, config: HessianConfig, *, ref: str = "",
                step: int = 0, epoch: float = math.nan, run: str = "", optimizer: str = "",
                masks: dict[str, Tensor] | None = None) -> HessianRow:
    """Top eigenvalues (trace, density as configured) of the loss Hessian on the seeded subset."""
    start = time.perf_counter()
    xs, ys = subset(x, y, config.subset, config.subset_seed, config.split)
    op = HessianOperator(model, xs, ys, masks=masks, dtype=PRECISIONS[config.precision],
                         device=resolve_device(config.device), batch_size=config.chunk)
    if config.top_k > op.dim:
        raise UsageError(f"{param('top_k', config.top_k)} exceeds the model's {op.dim} free parameters")
    empty = np.zeros(0)
    eig = (top_eigenvalues(op, config.top_k, steps=config.lanczos_steps, tol=config.tol, seed=config.seed)
           if config.top_k else TopEigen(empty, empty, 0))
    tr = hutchinson_trace(op, config.probes, seed=config.seed + 1) if config.trace else TraceEstimate(empty)
    no_density = SpectralDensity(np.zeros((0, 0)), np.zeros((0, 0)), empty, empty, math.nan)
    dens = (spectral_density(op, config.density_probes, config.lanczos_steps, sigma=config.sigma,
                             seed=config.seed + 2) if config.density else no_density)
    return HessianRow(
        ref=ref, run=run, optimizer=optimizer, step=int(step), epoch=float(epoch), loss=op.loss(),
        num_params=op.dim, top_eigenvalue=float(eig.eigenvalues[0]) if eig.eigenvalues.size else math.nan,
        trace=tr.mean if tr.samples.size else math.nan, trace_se=tr.se if tr.samples.size else math.nan,
        lanczos_steps=eig.steps, products=op.products, seconds=time.perf_counter() - start,
        eigenvalues=eig.eigenvalues, residuals=eig.residuals, trace_samples=tr.samples,
        density_nodes=dens.nodes, density_weights=dens.weights, density_grid=dens.grid, density=dens.density,
    )


def compute_point(point, config: HessianConfig, _shared=None) -> HessianRow:
    """:func:`hessian_row` at one resolved checkpoint (the run's pruning mask kept, its optimiser named)."""
    x, y = point.split(config.split)
    optimizer = str(((point.manifest or {}).get("config") or {}).get("optimizer") or "")
    return hessian_row(point.model(), x, y, config, ref=point.ref, step=point.step, epoch=point.epoch,
                       run=point.run or "", optimizer=optimizer, masks=point.masks)


def collect(groups, config: HessianConfig, _options=None, _refs=None, _shared=None) -> HessianResult:
    return HessianResult.from_rows([row for group in groups for row in group], config)
