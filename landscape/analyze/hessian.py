"""Hessian sharpness: top eigenvalues, trace and spectral density of the training loss (PyHessian, Yao et al. 2020).

Everything is measured on one fixed seeded subset of ``n`` examples of a split, with the Hessian-vector
products of :class:`landscape.curvature.HessianOperator` (eval mode, float64 on request, pruning masks kept):

top-k eigenvalues
    Lanczos with full reorthogonalisation (Golub & Van Loan 2013, Alg. 10.1.1 with complete
    reorthogonalisation; Lanczos 1950) from a seeded Gaussian start, stopped when the residual estimates
    ``|beta_m s_{m,i}|`` of the k largest Ritz pairs fall below ``tol * max |theta|``; the reported
    residuals are the true ``||H u_i - theta_i u_i||`` of the returned Ritz vectors (k more products).
    "Top" means algebraically largest. A single Krylov sequence finds one copy of a repeated eigenvalue; an
    exhausted Krylov space (tiny models) restarts from a fresh vector orthogonal to the basis.
trace
    Hutchinson (1990): ``tr H = E[z^T H z]`` for Rademacher ``z``; ``probes`` samples, their mean and its
    standard error ``s / sqrt(probes)``.
spectral density
    Stochastic Lanczos quadrature (Ghorbani, Krishnan & Xiao 2019, Sec. 3, eq. (5)-(7); Lin, Saad & Yang
    2016): per normalised Rademacher start ``q``, ``m`` Lanczos steps give nodes ``theta_j`` (eigenvalues of
    the tridiagonal ``T``) and weights ``tau_j = S_{1j}^2``, a Gauss quadrature with
    ``sum_j tau_j theta_j^p = q^T H^p q`` for ``p < 2m``; the density is the weighted sum of Gaussians of
    width ``sigma`` at the nodes, averaged over starts, on a grid (it integrates to 1).

With masks the operator is ``P H P`` on the unpruned coordinates and the probes live there too (the trace is
that of the unpruned block).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from landscape.analyze._common import check_choice, check_positive_int, device_option
from landscape.analyze.norms import sample_indices
from landscape.analyze.registry import Analysis, option
from landscape.bounds import LANCZOS_STEPS_MAX
from landscape.curvature import HessianOperator
from landscape.errors import UsageError
from landscape.results import InputRef, StoredResult, stored
from landscape.runtime import check_device_name, resolve_device

KIND = "hessian"
PRECISIONS = {"float32": torch.float32, "float64": torch.float64}
SPLITS = ("train", "test")
# Vectors per vectorised product (Hutchinson probes, Ritz residuals, SLQ starts): memory grows with it.
BLOCK = 4
GRID = 1001
COLUMNS = 2**14  # column block of the reorthogonalisation of float32 vectors (blocks added in float64)
DOT_COLUMNS = 2**12  # column block of float32 inner products and norms (block sums added in float64)


@dataclass
class HessianConfig:
    """Options of ``landscape hessian`` (and ``landscape.api.hessian``)."""

    top_k: int = option(5, "Largest Hessian eigenvalues to compute (Lanczos); 0 for none.", min=0)
    trace: bool = option(False, "Also estimate the trace (Hutchinson, Rademacher probes, with its standard error).")
    density: bool = option(False, "Also estimate the spectral density (stochastic Lanczos quadrature).")
    n: int = option(1000, "Examples in the fixed seeded subset the loss is taken over (the same at every checkpoint).",
                    min=1)
    seed: int = option(0, "Seed of the subset, the Lanczos start vector and the probes.")
    split: str = option("train", "Which split the subset comes from.", choices=SPLITS)
    probes: int = option(100, "Rademacher probes of the trace estimate.", min=1)
    density_probes: int = option(1, "Lanczos runs averaged in the density (Ghorbani et al.: one suffices for "
                                    "large models).", min=1)
    lanczos_steps: int = option(80, "Lanczos steps: the cap for the eigenvalues, the number for the density "
                                    "(memory: steps x parameters).", min=1, max=LANCZOS_STEPS_MAX)
    tol: float = option(1e-4, "Relative residual ||Hu - theta u|| / |theta_1| at which the eigenvalues stop.",
                        min=0, min_open=True, max=1)
    sigma: float = option(0.01, "Gaussian width of the density, as a fraction of the spectral range.",
                          min=0, min_open=True)
    precision: str = option("float32", "Precision of the Hessian-vector products.", choices=tuple(PRECISIONS))
    batch_size: int = option(250, "Examples per chunk of each product (memory bound; results do not depend on it).",
                             min=1)
    device: str = device_option()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise UsageError(f"--top-k must be a non-negative integer, got {self.top_k}")
        for flag, value in (("--n", self.n), ("--probes", self.probes), ("--density-probes", self.density_probes),
                            ("--lanczos-steps", self.lanczos_steps), ("--batch-size", self.batch_size)):
            check_positive_int(flag, value)
        if self.top_k == 0 and not self.trace and not self.density:
            raise UsageError("nothing to compute: --top-k 0 without --trace or --density")
        if self.lanczos_steps > LANCZOS_STEPS_MAX:
            raise UsageError(f"--lanczos-steps must be <= {LANCZOS_STEPS_MAX}, got {self.lanczos_steps}")
        if self.top_k > self.lanczos_steps:
            raise UsageError(f"--lanczos-steps ({self.lanczos_steps}) must be at least --top-k ({self.top_k})")
        if not (math.isfinite(self.tol) and 0 < self.tol <= 1):
            raise UsageError(f"--tol must lie in (0, 1], got {self.tol}")
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise UsageError(f"--sigma must be a positive number, got {self.sigma}")
        check_choice("--precision", self.precision, tuple(PRECISIONS))
        check_choice("--split", self.split, SPLITS)
        check_device_name(self.device)


# ------------------------------------------------------------------------------------------- Lanczos


@dataclass
class Lanczos:
    """``B`` independent Lanczos runs of ``m`` steps: ``T_b = tridiag(beta_b, alpha_b, beta_b)``, basis rows
    ``basis[j, b]`` (orthonormal over ``j`` for each ``b``)."""

    alpha: np.ndarray  # (B, m) float64
    beta: np.ndarray  # (B, m - 1) float64; 0 where a run restarted
    basis: Tensor  # (m, B, d)
    last_beta: np.ndarray  # (B,) norm of the residual after step m

    @property
    def steps(self) -> int:
        return int(self.alpha.shape[1])

    def ritz(self, b: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Ritz values (ascending) and the eigenvectors of ``T_b``."""
        return _tridiagonal_eigh(self.alpha[b], self.beta[b])


def _tridiagonal_eigh(alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = np.diag(alpha) + np.diag(beta, 1) + np.diag(beta, -1)
    return np.linalg.eigh(t)


def _norms(w: Tensor) -> Tensor:
    """Row norms of (B, d), accumulated in float64 (see :func:`_dots`)."""
    return _dots(w, w).sqrt()


def _dots(w: Tensor, q: Tensor) -> Tensor:
    """Row-wise inner products of two (B, d) matrices in float64, without a (B, d) temporary.

    float32 rows: products summed in float32 over column blocks of :data:`DOT_COLUMNS`, the block sums added
    in float64. A single float32 reduction over ResNet-18's 11 M parameters was off by 1e-3 (``vector_norm``;
    it un-normalised the Lanczos basis and moved lambda_1 by 6e-4), and casting every element to float64
    (``sum(..., dtype=float64)``) took 58 ms per norm of 11 M entries; the blocks take 1.7 ms, relative error
    6e-10 on 2^23 positive terms."""
    if w.dtype == torch.float64:
        return torch.bmm(w[:, None, :], q[:, :, None]).view(-1)
    batch, d = w.shape
    full = d - d % DOT_COLUMNS
    out = torch.zeros(batch, dtype=torch.float64, device=w.device)
    if full:
        blocks = (w[:, :full].reshape(batch, -1, DOT_COLUMNS), q[:, :full].reshape(batch, -1, DOT_COLUMNS))
        out += torch.einsum("bkc,bkc->bk", *blocks).double().sum(1)
    if full < d:
        out += torch.einsum("bc,bc->b", w[:, full:], q[:, full:]).double()
    return out


def _coefficients(rows: Tensor, w: Tensor) -> Tensor:
    """``rows @ w`` for rows (j, d) and w (d,): in column blocks of :data:`COLUMNS` whose float32 products
    are added in float64 (one float32 product over millions of parameters loses orthogonality: 2e-3 on
    ResNet-18, which moved lambda_1 by 6e-4). Returns the coefficients in ``w``'s dtype."""
    if rows.dtype == torch.float64 or w.shape[0] <= COLUMNS:
        return rows @ w
    c = torch.zeros(rows.shape[0], dtype=torch.float64, device=w.device)
    for s in range(0, w.shape[0], COLUMNS):
        c += (rows[:, s:s + COLUMNS] @ w[s:s + COLUMNS]).double()
    return c.to(w.dtype)


def _orthogonalise_(w: Tensor, basis: Tensor, passes: int = 2) -> Tensor:
    """``w`` (B, d) minus its projection on ``basis`` (j, B, d), run by run, in place; ``passes`` times (classical
    Gram-Schmidt twice is enough, Giraud et al. 2005). Two matrix-vector products per pass, no (j, d) copy."""
    for b in range(w.shape[0]):
        rows = basis[:, b]
        for _ in range(passes):
            w[b].addmv_(rows.t(), _coefficients(rows, w[b]), alpha=-1)
    return w


def lanczos(
    matvec: Callable[[Tensor], Tensor],
    start: Tensor,
    steps: int,
    *,
    draw: Callable[[int], Tensor],
    stop: Callable[[np.ndarray, np.ndarray, float], bool] | None = None,
) -> Lanczos:
    """Lanczos with full reorthogonalisation for ``B`` start vectors ``start`` (B, d) at once.

    At most ``steps`` steps (callers cap them at the dimension of the space ``draw`` samples from).
    ``matvec`` maps (B, d) -> (B, d); ``draw(k)`` gives ``k`` fresh random vectors (k, d) for runs whose
    Krylov space is exhausted (``beta`` below ``100 eps ||T||``); ``stop(alpha, beta, last_beta)`` (one run
    only) ends the iteration early. Vectors are updated in place (a parameter-sized temporary costs page
    faults on every allocation for large models).
    """
    batch, d = start.shape
    steps = int(min(steps, d))
    basis = torch.empty(steps, batch, d, dtype=start.dtype, device=start.device)
    alpha = np.zeros((batch, steps))
    beta = np.zeros((batch, steps))
    eps = torch.finfo(start.dtype).eps
    scale = 0.0
    torch.div(start, _norms(start)[:, None].to(start.dtype), out=basis[0])
    m = steps
    for j in range(steps):
        w = matvec(basis[j])
        # the three-term recurrence (alpha_j = q_j^T H q_j summed in float64), then one full
        # reorthogonalisation pass against the whole basis removes what rounding left (Golub & Van Loan 10.1.5)
        a = _dots(w, basis[j])
        w.addcmul_(basis[j], a.to(w.dtype)[:, None], value=-1)
        if j > 0:
            w.addcmul_(basis[j - 1], torch.as_tensor(beta[:, j - 1], dtype=w.dtype, device=w.device)[:, None],
                       value=-1)
        _orthogonalise_(w, basis[: j + 1], passes=1)
        b = _norms(w)
        alpha[:, j] = a.cpu().numpy()
        beta[:, j] = b.cpu().numpy()
        scale = max(scale, float(np.abs(alpha[:, j]).max()), float(beta[:, j].max()))
        if stop is not None and stop(alpha[0, : j + 1], beta[0, :j], float(beta[0, j])):
            m = j + 1
            break
        if j == steps - 1:
            break
        for r in np.flatnonzero(beta[:, j] <= 100 * eps * max(scale, np.finfo(float).tiny)):
            fresh = draw(1).to(w.device, w.dtype)
            _orthogonalise_(fresh, basis[: j + 1, r: r + 1])
            w[r] = fresh[0]
            beta[r, j] = 0.0
        torch.div(w, _norms(w)[:, None].to(w.dtype), out=basis[j + 1])
    return Lanczos(alpha=alpha[:, :m], beta=beta[:, : m - 1], basis=basis[:m], last_beta=beta[:, m - 1])


# ----------------------------------------------------------------------------------------- estimators


def _draw(op: HessianOperator, k: int, generator: torch.Generator, kind: str, dtype: torch.dtype) -> Tensor:
    """``k`` random flat vectors in the unpruned subspace: ``"gaussian"`` or ``"rademacher"`` (+-1)."""
    v = torch.empty(k, op.numel, dtype=dtype)
    if kind == "gaussian":
        v.normal_(generator=generator)
    else:
        v.bernoulli_(0.5, generator=generator).mul_(2).sub_(1)
    v = v.to(op.device)
    mask = op.mask_vector()
    return v if mask is None else v * mask.to(dtype)


@dataclass
class TopEigen:
    eigenvalues: np.ndarray  # (k,) descending
    residuals: np.ndarray  # (k,) ||H u - theta u|| of the unit Ritz vectors
    steps: int  # Lanczos steps taken


def _into(op: HessianOperator, like: Tensor) -> Callable[[Tensor], Tensor]:
    """``op.matvec`` writing every product into one buffer shaped like ``like``: for :func:`lanczos`, which
    updates the product in place and stores a normalised copy, so each product may overwrite the last."""
    buffer = torch.empty_like(like)
    return lambda v: op.matvec(v, out=buffer)


def top_eigenvalues(op: HessianOperator, k: int, *, steps: int = 80, tol: float = 1e-4, seed: int = 0) -> TopEigen:
    """The ``k`` algebraically largest eigenvalues of ``op`` by Lanczos (see the module docstring)."""
    if k > op.dim:
        raise UsageError(f"--top-k {k} exceeds the model's {op.dim} free parameters")
    gen = torch.Generator().manual_seed(int(seed))
    dtype = op.dtype

    def converged(alpha: np.ndarray, beta: np.ndarray, last: float) -> bool:
        if len(alpha) < k:
            return False
        theta, s = _tridiagonal_eigh(alpha, beta)
        bound = tol * max(float(np.abs(theta).max()), np.finfo(float).tiny)
        return bool(np.all(np.abs(last * s[-1, -k:]) <= bound))

    start = _draw(op, 1, gen, "gaussian", dtype)
    run = lanczos(_into(op, start), start, min(max(steps, k), op.dim),
                  draw=lambda n: _draw(op, n, gen, "gaussian", dtype), stop=converged)
    theta, s = run.ritz()
    theta, s = theta[::-1][:k].copy(), s[:, ::-1][:, :k]
    vectors = torch.as_tensor(s.T.copy(), dtype=dtype, device=op.device) @ run.basis[:, 0]
    residuals = []
    for i in range(0, k, BLOCK):
        u = vectors[i:i + BLOCK]
        hu = op.matvec(u)
        th = torch.as_tensor(theta[i:i + BLOCK], dtype=dtype, device=op.device)[:, None]
        residuals.append(_norms(hu - th * u).cpu().numpy())
    return TopEigen(eigenvalues=theta, residuals=np.concatenate(residuals), steps=run.steps)


@dataclass
class TraceEstimate:
    samples: np.ndarray  # (probes,) z^T H z

    @property
    def mean(self) -> float:
        return float(self.samples.mean())

    @property
    def se(self) -> float:
        """Standard error of the mean, ``s / sqrt(probes)`` (NaN with one probe)."""
        m = self.samples.size
        return float(self.samples.std(ddof=1) / math.sqrt(m)) if m > 1 else math.nan


def hutchinson_trace(op: HessianOperator, probes: int, *, seed: int = 0) -> TraceEstimate:
    """Hutchinson's trace estimate with ``probes`` Rademacher vectors, ``BLOCK`` per vectorised product."""
    gen = torch.Generator().manual_seed(int(seed))
    out = []
    for i in range(0, probes, BLOCK):
        z = _draw(op, min(BLOCK, probes - i), gen, "rademacher", op.dtype)
        out.append(_dots(z.double(), op.matvec(z).double()).cpu().numpy())
    return TraceEstimate(samples=np.concatenate(out))


@dataclass
class SpectralDensity:
    nodes: np.ndarray  # (runs, m) Ritz values of each run
    weights: np.ndarray  # (runs, m) tau_j = (first component of T's eigenvector j)^2; each row sums to 1
    grid: np.ndarray  # (GRID,)
    density: np.ndarray  # (GRID,)
    sigma: float  # absolute Gaussian width

    def moment(self, p: int) -> float:
        """``(1/runs) sum_runs sum_j tau_j theta_j^p``, the SLQ estimate of ``tr(H^p) / dim``."""
        return float((self.weights * self.nodes**p).sum(1).mean())


def broadened_density(grid: np.ndarray, nodes: np.ndarray, weights: np.ndarray, sigma: float) -> np.ndarray:
    """Ghorbani et al.'s eq. (7) on ``grid``: ``phi(t) = (1/runs) sum_runs sum_j tau_j N(t; theta_j, sigma^2)``
    (NaN-padded nodes count as absent)."""
    z = (grid[:, None, None] - nodes[None]) / sigma
    terms = np.where(np.isfinite(nodes)[None], weights[None] * np.exp(-0.5 * z**2), 0.0)
    return terms.sum(2).mean(1) / (sigma * math.sqrt(2 * math.pi))


def density_grid(nodes: np.ndarray, sigma_fraction: float) -> tuple[np.ndarray, float]:
    """A grid over the nodes' range padded by ``6 sigma``, and ``sigma = sigma_fraction * (max - min node)``."""
    lo, hi = float(np.nanmin(nodes)), float(np.nanmax(nodes))
    spread = hi - lo if hi > lo else max(abs(hi), 1.0)
    sigma = sigma_fraction * spread
    return np.linspace(lo - 6 * sigma, hi + 6 * sigma, GRID), sigma


def spectral_density(op: HessianOperator, runs: int, steps: int, *, sigma: float = 0.01, seed: int = 0) -> SpectralDensity:
    """Stochastic Lanczos quadrature with ``runs`` normalised Rademacher starts of ``steps`` steps each."""
    gen = torch.Generator().manual_seed(int(seed))
    nodes, weights = [], []
    for i in range(0, runs, BLOCK):
        start = _draw(op, min(BLOCK, runs - i), gen, "rademacher", op.dtype)
        run = lanczos(_into(op, start), start, min(steps, op.dim),
                      draw=lambda n: _draw(op, n, gen, "gaussian", op.dtype))
        for b in range(start.shape[0]):
            theta, s = run.ritz(b)
            nodes.append(theta)
            weights.append(s[0] ** 2)
    nodes_a, weights_a = np.stack(nodes), np.stack(weights)
    grid, width = density_grid(nodes_a, sigma)
    return SpectralDensity(nodes=nodes_a, weights=weights_a, grid=grid,
                           density=broadened_density(grid, nodes_a, weights_a, width), sigma=width)


# --------------------------------------------------------------------------------------------- rows


def _empty(*shape: int):
    return stored("skip", default_factory=lambda: np.zeros(shape))


@dataclass
class HessianRow:
    """The Hessian measurements of one checkpoint (NaN / empty where not asked for). The scalars are the
    result's table; the arrays are stacked over checkpoints into the result's arrays."""

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
    """Arrays of one rank stacked on a new first axis, NaN-padded to a common shape (ragged when checkpoints
    have different parameter counts)."""
    shape = tuple(max(a.shape[d] for a in arrays) for d in range(arrays[0].ndim)) if arrays else ()
    out = np.full((len(arrays), *shape), np.nan)
    for i, a in enumerate(arrays):
        out[(i, *(slice(0, n) for n in a.shape))] = a
    return out


@dataclass
class HessianResult(StoredResult):
    """``landscape hessian``: one table row per checkpoint, in the order given, and the per-checkpoint arrays
    stacked over checkpoints (``eigenvalues[c, i]`` is lambda_{i+1} of checkpoint ``c``)."""

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
    inputs: list[InputRef] = field(default_factory=list)
    path: Path | None = None
    figures: list[Path] = field(default_factory=list)

    @classmethod
    def from_rows(cls, rows: list[HessianRow], config: HessianConfig) -> HessianResult:
        arrays = {name: _stack([getattr(r, name) for r in rows]) for name in (
            "eigenvalues", "residuals", "trace_samples", "density_nodes", "density_weights", "density_grid",
            "density")}
        return cls(rows=list(rows), config=config, **arrays)

    def table_rows(self) -> list[dict]:
        """One dict per checkpoint: ref, optimizer, epoch, loss, lambda_1..k, trace +- se, residual of lambda_1."""
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


def subset(x: Tensor, y: Tensor, n: int, seed: int) -> tuple[Tensor, Tensor]:
    """The fixed seeded subset of ``min(n, len(y))`` examples every measurement of a run uses."""
    idx = sample_indices(len(y), n, seed)
    return x[idx], y[idx]


def hessian_row(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    config: HessianConfig,
    *,
    ref: str = "",
    step: int = 0,
    epoch: float = math.nan,
    run: str = "",
    optimizer: str = "",
    masks: dict[str, Tensor] | None = None,
) -> HessianRow:
    """Top eigenvalues (and trace, density as configured) of the loss Hessian of ``model`` on the seeded
    subset of ``x, y``. Pure: the model is not modified."""
    config.validate()
    start = time.perf_counter()
    xs, ys = subset(x, y, config.n, config.seed)
    op = HessianOperator(model, xs, ys, masks=masks, dtype=PRECISIONS[config.precision],
                         device=resolve_device(config.device), batch_size=config.batch_size)
    if config.top_k > op.dim:
        raise UsageError(f"--top-k {config.top_k} exceeds the model's {op.dim} free parameters")
    empty = np.zeros(0)
    eig = TopEigen(empty, empty, 0)
    if config.top_k:
        eig = top_eigenvalues(op, config.top_k, steps=config.lanczos_steps, tol=config.tol, seed=config.seed)
    tr = TraceEstimate(empty)
    if config.trace:
        tr = hutchinson_trace(op, config.probes, seed=config.seed + 1)
    dens = SpectralDensity(np.zeros((0, 0)), np.zeros((0, 0)), empty, empty, math.nan)
    if config.density:
        dens = spectral_density(op, config.density_probes, config.lanczos_steps, sigma=config.sigma,
                                seed=config.seed + 2)
    return HessianRow(
        ref=ref, run=run, optimizer=optimizer, step=int(step), epoch=float(epoch), loss=op.loss(),
        num_params=op.dim, top_eigenvalue=float(eig.eigenvalues[0]) if eig.eigenvalues.size else math.nan,
        trace=tr.mean if tr.samples.size else math.nan, trace_se=tr.se if tr.samples.size else math.nan,
        lanczos_steps=eig.steps, products=op.products, seconds=time.perf_counter() - start,
        eigenvalues=eig.eigenvalues, residuals=eig.residuals, trace_samples=tr.samples,
        density_nodes=dens.nodes, density_weights=dens.weights, density_grid=dens.grid, density=dens.density,
    )


# ------------------------------------------------------------------------------------------- the spec


def compute_point(point, config: HessianConfig, _shared=None) -> HessianRow:
    """:func:`hessian_row` at one resolved checkpoint (the run's pruning mask kept, its optimiser named)."""
    x, y = point.split(config.split)
    optimizer = str(((point.manifest or {}).get("config") or {}).get("optimizer") or "")
    return hessian_row(point.model(), x, y, config, ref=point.ref, step=point.step, epoch=point.epoch,
                       run=point.run or "", optimizer=optimizer, masks=point.masks)


def collect(groups, config: HessianConfig, _options=None, _refs=None, _shared=None) -> HessianResult:
    return HessianResult.from_rows([row for group in groups for row in group], config)


SPEC = Analysis(
    name="hessian", config=HessianConfig, compute=compute_point, collect=collect, result=HessianResult,
    inputs="targets", figure="landscape.plots.hessian:plot_hessian", rows=HessianResult.table_rows,
    output="hessian", purpose="take Hessian-vector products", needs=("manifest",),
    doc="""Hessian sharpness (PyHessian, Yao et al. 2020) of runs or checkpoints TARGETS...: top-k eigenvalues
    (Lanczos, with residuals), --trace (Hutchinson, with its standard error), --density (stochastic Lanczos
    quadrature, Ghorbani et al. 2019), on a fixed seeded subset of --n examples. A run means every checkpoint
    (sharpness against epoch, all runs on one figure).""",
)
