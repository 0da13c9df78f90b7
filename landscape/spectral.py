"""Spectral estimators of a symmetric :class:`LinearOperator` from its products alone: top eigenvalues
(Lanczos with full reorthogonalisation), trace (Hutchinson), spectral density (stochastic Lanczos quadrature);
docs/hessian.md. An operator on a subspace (the Hessian with pruning masks) also has ``numel`` (its vectors'
length) and ``mask_vector()`` (where probes are drawn).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from landscape import progress
from landscape.errors import UsageError
from landscape.evaluate.allocator import tuned_allocator

# Vectors per vectorised product (Hutchinson probes, Ritz residuals, SLQ starts): memory grows with it.
BLOCK = 4
GRID = 1001
COLUMNS = 2**16  # column block of the reorthogonalisation of float32 vectors (blocks added in float64)
DOT_COLUMNS = 2**12  # column block of float32 inner products and norms (block sums added in float64)


@runtime_checkable
class LinearOperator(Protocol):
    """A symmetric linear operator on flat vectors, known by its products (see the module docstring)."""

    dim: int
    dtype: torch.dtype
    device: torch.device

    def matvec(self, v: Tensor, out: Tensor | None = None) -> Tensor:
        """``A v`` for ``v`` of shape ``(d,)`` or ``A v_b`` for each row of ``(B, d)``, in ``v``'s dtype."""
        ...


class MatrixOperator:
    """An explicit symmetric matrix (a Gram or NTK kernel) as a :class:`LinearOperator`; a matrix that is not
    square, finite and symmetric to ``1e-8`` of its largest entry is a UsageError; ``products`` counts."""

    def __init__(self, matrix: Tensor | np.ndarray, *, dtype: torch.dtype | None = None,
                 device: str | torch.device | None = None) -> None:
        m = torch.as_tensor(matrix)
        if m.dim() != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
            raise UsageError(f"a linear operator needs a non-empty square matrix, got shape {tuple(m.shape)}")
        dtype = dtype or (m.dtype if m.is_floating_point() else torch.float64)
        m = m.to(device if device is not None else m.device, dtype)
        if not bool(torch.isfinite(m).all()):
            raise UsageError("the matrix has NaN or inf entries")
        scale = float(m.abs().max())
        asymmetry = float((m - m.T).abs().max())
        if asymmetry > 1e-8 * scale:
            raise UsageError(f"the matrix is not symmetric (largest |A - A^T| = {asymmetry:.3g}, "
                             f"largest |A| = {scale:.3g}); the estimators need a symmetric operator")
        self.matrix = m
        self.dim = int(m.shape[0])
        self.dtype = m.dtype
        self.device = m.device
        self.products = 0

    def matvec(self, v: Tensor, out: Tensor | None = None) -> Tensor:
        self.products += 1 if v.dim() == 1 else int(v.shape[0])
        product = v.to(self.device, self.dtype) @ self.matrix  # symmetric: v A = (A v)^T row by row
        if out is None:
            return product.to(v.dtype)
        out.copy_(product)
        return out

    def __repr__(self) -> str:
        return f"MatrixOperator(dim={self.dim}, dtype={self.dtype}, device={self.device})"


# ------------------------------------------------------------------------------------------- Lanczos


@dataclass
class Lanczos:
    """``B`` independent Lanczos runs of ``m`` steps: ``T_b = tridiag(beta_b, alpha_b, beta_b)``, basis rows
    ``basis[j, b]`` (orthonormal over ``j`` for each ``b``)."""

    alpha: np.ndarray  # (B, m) float64
    beta: np.ndarray  # (B, m - 1) float64; 0 where a run restarted
    basis: Tensor  # (m, B, d)
    residual: Tensor  # (B, d) the residual after step m

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
    """Row-wise inner products of two (B, d) matrices in float64, without a (B, d) temporary: float32 block
    sums added in float64 (one float32 reduction over ResNet-18's 11 M parameters was off by 1e-3 and moved
    lambda_1 by 6e-4; a float64 cast copies every entry)."""
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
    """``rows @ w`` for rows (j, d) and w (d,), float32 column blocks added in float64 (one float32 product
    over millions of parameters loses orthogonality), in ``w``'s dtype."""
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
    matvec: Callable[[Tensor, Tensor], Tensor],
    start: Tensor,
    steps: int,
    *,
    draw: Callable[[int], Tensor],
    stop: Callable[[np.ndarray, np.ndarray, float], bool] | None = None,
    basis: Tensor | None = None,
) -> Lanczos:
    """Lanczos with full reorthogonalisation, at most ``steps``, for the ``B`` start vectors (B, d) at once.

    ``matvec(v, out)`` writes the rows' products into ``out``; ``draw(k)`` gives fresh vectors for runs whose
    Krylov space is exhausted; ``stop(alpha, beta, last_beta)`` (run 0) ends early. Each product is written
    and normalised in the next row of ``basis`` (``(steps + 1, B, d)``): no parameter-sized temporary, whose
    page faults cost more than the arithmetic on large models.
    """
    batch, d = start.shape
    steps = int(min(steps, d))
    if basis is None:
        basis = torch.empty(steps + 1, batch, d, dtype=start.dtype, device=start.device)
    alpha = np.zeros((batch, steps))
    beta = np.zeros((batch, steps))
    eps = torch.finfo(start.dtype).eps
    scale = 0.0
    torch.div(start, _norms(start)[:, None].to(start.dtype), out=basis[0])
    m = steps
    for j in range(steps):
        w = basis[j + 1]
        matvec(basis[j], w)
        # the three-term recurrence (alpha_j = q_j^T H q_j summed in float64), then one full
        # reorthogonalisation pass against the whole basis removes what rounding left (Golub & Van Loan 10.1.5)
        a = _dots(w, basis[j])
        if j == 0:
            w.addcmul_(basis[j], a.to(w.dtype)[:, None], value=-1)
        else:  # w -= beta_{j-1} q_{j-1} + alpha_j q_j: one pass over w
            coefficients = torch.stack([torch.as_tensor(beta[:, j - 1], device=w.device), a], 1).to(w.dtype)
            for r in range(batch):
                w[r].addmv_(basis[j - 1: j + 1, r].t(), coefficients[r], alpha=-1)
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
        restarts = np.flatnonzero(beta[:, j] <= 100 * eps * max(scale, np.finfo(float).tiny))
        for r in restarts:
            fresh = draw(1).to(w.device, w.dtype)
            _orthogonalise_(fresh, basis[: j + 1, r: r + 1])
            w[r] = fresh[0]
            beta[r, j] = 0.0
        if restarts.size:  # the restarted rows' norms changed; the others' are the beta just computed
            b = _norms(w)
        w.div_(b[:, None].to(w.dtype))
    return Lanczos(alpha=alpha[:, :m], beta=beta[:, : m - 1], basis=basis[:m], residual=basis[m])


# ----------------------------------------------------------------------------------------- estimators


def _counted(matvec: Callable[[Tensor, Tensor], Tensor], task: progress.Task) -> Callable[[Tensor, Tensor], Tensor]:
    """``matvec`` that advances ``task`` by one per product."""
    def counted(v: Tensor, out: Tensor) -> Tensor:
        result = matvec(v, out)
        task.update(1)
        return result

    return counted


def _draw(op: LinearOperator, k: int, generator: torch.Generator, kind: str, dtype: torch.dtype,
          out: Tensor | None = None) -> Tensor:
    """``k`` ``"gaussian"`` or ``"rademacher"`` vectors in the operator's free subspace (into ``out`` when
    given), drawn from the CPU ``generator`` so that they do not depend on the device."""
    shape = (k, int(getattr(op, "numel", op.dim)))
    cpu = out is not None and out.device.type == "cpu"
    v = out if cpu else torch.empty(shape, dtype=dtype)
    if kind == "gaussian":
        v.normal_(generator=generator)
    else:
        v.bernoulli_(0.5, generator=generator).mul_(2).sub_(1)
    if out is not None and not cpu:
        v = out.copy_(v)
    v = v.to(op.device)
    mask = op.mask_vector() if hasattr(op, "mask_vector") else None
    if mask is None:
        return v
    return v.mul_(mask.to(dtype)) if out is not None else v * mask.to(dtype)


@dataclass
class TopEigen:
    eigenvalues: np.ndarray  # (k,) descending
    residuals: np.ndarray  # (k,) ||H u - theta u|| of the unit Ritz vectors
    steps: int  # Lanczos steps taken


@tuned_allocator()
def top_eigenvalues(op: LinearOperator, k: int, *, steps: int = 80, tol: float = 1e-4, seed: int = 0) -> TopEigen:
    """The ``k`` algebraically largest eigenvalues of ``op`` by Lanczos (see the module docstring)."""
    if k > op.dim:
        raise UsageError(f"top-k {k} exceeds the operator's dimension {op.dim}")
    gen = torch.Generator().manual_seed(int(seed))
    dtype = op.dtype

    def converged(alpha: np.ndarray, beta: np.ndarray, last: float) -> bool:
        if len(alpha) < k:
            return False
        theta, s = _tridiagonal_eigh(alpha, beta)
        bound = tol * max(float(np.abs(theta).max()), np.finfo(float).tiny)
        return bool(np.all(np.abs(last * s[-1, -k:]) <= bound))

    steps = min(max(steps, k), op.dim)
    # the start vector is drawn into the basis' first row: no parameter-sized vector of its own (a fresh one
    # costs page faults on its first write, more than the arithmetic on it, for large models)
    basis = torch.empty(steps + 1, 1, int(getattr(op, "numel", op.dim)), dtype=dtype, device=op.device)
    start = _draw(op, 1, gen, "gaussian", dtype, out=basis[0])
    # at most ``steps`` Lanczos products (fewer when it converges), then one per block of residuals
    with progress.task(f"top-{k} eigenvalues (Lanczos)", total=steps + -(-k // BLOCK), unit="products") as task:
        run = lanczos(_counted(op.matvec, task), start, steps, draw=lambda n: _draw(op, n, gen, "gaussian", dtype),
                      stop=converged, basis=basis)
        theta, s = run.ritz()
        theta, s = theta[::-1][:k].copy(), s[:, ::-1][:, :k]
        coefficients = torch.as_tensor(s.T.copy(), dtype=dtype, device=op.device)
        rows = run.basis[:, 0]
        if k == 1:  # u = sum_i s_i q_i formed over q_0's row, H u into the Lanczos residual's: memory already touched
            ritz = rows[:1].mul_(coefficients[0, 0])
            ritz[0].addmv_(rows[1:].t(), coefficients[0, 1:])
            products = run.residual
        else:
            ritz = torch.empty(min(k, BLOCK), rows.shape[1], dtype=dtype, device=op.device)
            products = torch.empty_like(ritz)
        residuals = []
        for i in range(0, k, BLOCK):
            u = ritz if k == 1 else torch.mm(coefficients[i:i + BLOCK], rows, out=ritz[: min(BLOCK, k - i)])
            hu = op.matvec(u, out=products[: len(u)])
            th = torch.as_tensor(theta[i:i + BLOCK], dtype=dtype, device=op.device)[:, None]
            residuals.append(_norms(hu.sub_(u.mul_(th))).cpu().numpy())  # H u - theta u, in place
            task.update(1)
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


@tuned_allocator()
def hutchinson_trace(op: LinearOperator, probes: int, *, seed: int = 0) -> TraceEstimate:
    """Hutchinson's trace estimate with ``probes`` Rademacher vectors, ``BLOCK`` per vectorised product."""
    gen = torch.Generator().manual_seed(int(seed))
    out = []
    with progress.task("trace (Hutchinson)", total=probes, unit="probes") as task:
        for i in range(0, probes, BLOCK):
            z = _draw(op, min(BLOCK, probes - i), gen, "rademacher", op.dtype)
            out.append(_dots(z.double(), op.matvec(z).double()).cpu().numpy())
            task.update(len(z))
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


@tuned_allocator()
def spectral_density(op: LinearOperator, runs: int, steps: int, *, sigma: float = 0.01, seed: int = 0) -> SpectralDensity:
    """Stochastic Lanczos quadrature with ``runs`` normalised Rademacher starts of ``steps`` steps each."""
    gen = torch.Generator().manual_seed(int(seed))
    nodes, weights = [], []
    steps = min(steps, op.dim)
    # one unit: one Lanczos step of a block of up to BLOCK runs (one product of as many vectors)
    with progress.task(f"spectral density (SLQ, {runs} runs)", total=-(-runs // BLOCK) * steps,
                       unit="steps") as task:
        for i in range(0, runs, BLOCK):
            start = _draw(op, min(BLOCK, runs - i), gen, "rademacher", op.dtype)
            run = lanczos(_counted(op.matvec, task), start, steps,
                          draw=lambda n: _draw(op, n, gen, "gaussian", op.dtype))
            for b in range(start.shape[0]):
                theta, s = run.ritz(b)
                nodes.append(theta)
                weights.append(s[0] ** 2)
    nodes_a, weights_a = np.stack(nodes), np.stack(weights)
    grid, width = density_grid(nodes_a, sigma)
    return SpectralDensity(nodes=nodes_a, weights=weights_a, grid=grid,
                           density=broadened_density(grid, nodes_a, weights_a, width), sigma=width)
