"""The spectral estimators (landscape.spectral: Lanczos, Hutchinson, SLQ) on any linear operator: an explicit
symmetric matrix and the Gram / NTK kernels of landscape.gram, against numpy.linalg.eigvalsh / scipy's eigsh,
the exact trace and exact Gauss quadratures; the Hessian and kernels read from a Gram file (out of core)
satisfy the same protocol."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse.linalg
import torch
from torch.func import functional_call, grad, vmap

from landscape.curvature import HessianOperator
from landscape.errors import UsageError
from landscape.gram import gram_blocks
from landscape.gram_hdf5 import KernelFileOperator, gram_blocks_to_hdf5
from landscape.models import build_model
from landscape.spectral import (
    LinearOperator,
    MatrixOperator,
    _draw,
    hutchinson_trace,
    spectral_density,
    top_eigenvalues,
)


def symmetric(d: int = 40, seed: int = 0) -> np.ndarray:
    """Q diag(lambda) Q^T with distinct eigenvalues of both signs."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    eig = np.concatenate([np.linspace(-2.0, 1.0, d - 4), [3.0, 4.5, 6.0, 9.0]])
    return (q * eig) @ q.T


def mlp_data(n: int = 20):
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(6,), num_classes=3, widths=(10,), activation="tanh").double()
    g = torch.Generator().manual_seed(1)
    return model, torch.randn(n, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def gram(kind: str) -> np.ndarray:
    model, x, y = mlp_data()
    blocks = gram_blocks(model, x, y, kind=kind)
    return sum(blocks.values()).numpy()


def per_sample_trace(model, x, y) -> float:
    """tr K = sum_i ||grad l_i||^2 from torch.func per-sample gradients (independent of landscape.gram)."""
    params = {k: p.detach() for k, p in model.named_parameters()}

    def loss(p, xi, yi):
        return torch.nn.functional.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    g = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    return float(sum((t.reshape(len(x), -1) ** 2).sum() for t in g.values()))


def check_all_estimators(a: np.ndarray, k: int = 4) -> None:
    """Top-k eigenvalues, the trace and the SLQ quadratures of the operator of ``a`` against exact values."""
    op = MatrixOperator(torch.as_tensor(a))
    assert isinstance(op, LinearOperator)
    d = a.shape[0]
    exact = np.linalg.eigvalsh(a)[::-1]
    top = top_eigenvalues(op, k, steps=d, tol=1e-12, seed=3)
    scale = abs(exact).max()
    np.testing.assert_allclose(top.eigenvalues, exact[:k], rtol=0, atol=1e-9 * scale)
    assert np.all(top.residuals < 1e-8 * scale)
    # scipy's ARPACK (implicitly restarted Lanczos) on the same matrix: a second, independent reference
    arpack = np.sort(scipy.sparse.linalg.eigsh(a, k=k, which="LA", return_eigenvectors=False))[::-1]
    np.testing.assert_allclose(top.eigenvalues, arpack, rtol=0, atol=1e-8 * scale)

    # Hutchinson: mean within 4 standard errors of tr A; the se is the standard error of z^T A z
    # (variance 2 sum_{i != j} A_ij^2 for Rademacher z)
    sd_exact = math.sqrt(2 * (np.sum(a**2) - np.sum(np.diag(a) ** 2)) / 200)
    tr = hutchinson_trace(op, 200, seed=5)
    assert abs(tr.mean - np.trace(a)) <= 4 * tr.se + 1e-12 * scale, (tr.mean, np.trace(a), tr.se)
    if sd_exact > 0:
        assert 0.6 < tr.se / sd_exact < 1.5

    # SLQ: m steps are a Gauss quadrature exact for degree < 2m: sum_j tau_j theta_j^p = q^T A^p q
    steps, runs = 5, 3
    sd = spectral_density(op, runs, steps, seed=7)
    z = _draw(op, runs, torch.Generator().manual_seed(7), "rademacher", torch.float64).numpy()
    q = z / np.sqrt(d)
    for p in range(2 * steps):
        exact_p = np.einsum("bi,ij,bj->b", q, np.linalg.matrix_power(a, p), q)
        np.testing.assert_allclose((sd.weights * sd.nodes**p).sum(1), exact_p, rtol=1e-8, atol=1e-10 * scale**p)
    assert abs(np.trapezoid(sd.density, sd.grid) - 1) < 1e-6
    many = spectral_density(op, 40, 4, seed=1)
    assert abs(many.moment(1) - np.trace(a) / d) < 0.2 * np.mean(np.abs(exact))
    assert op.products > 0


def test_estimators_on_an_explicit_symmetric_matrix():
    check_all_estimators(symmetric())


def test_estimators_on_the_gram_matrix_of_per_sample_loss_gradients():
    """K = G G^T (gram_blocks' blocks summed), n x n: its trace is also sum_i ||grad l_i||^2 (torch.func)."""
    k = gram("loss-grad")
    model, x, y = mlp_data()
    assert abs(np.trace(k) - per_sample_trace(model, x, y)) < 1e-10 * np.trace(k)
    check_all_estimators(k)


def test_estimators_on_the_output_ntk():
    """The empirical NTK J J^T over (sample, logit) pairs, (n M) x (n M)."""
    check_all_estimators(gram("output"), k=3)


def test_the_hessian_is_a_linear_operator_and_agrees_with_its_dense_matrix():
    """The same estimators on HessianOperator and on MatrixOperator of its dense matrix give the same numbers."""
    model, x, y = mlp_data()
    op = HessianOperator(model, x, y, dtype=torch.float64)
    assert isinstance(op, LinearOperator)
    dense = op.matvec(torch.eye(op.dim, dtype=torch.float64))
    mat = MatrixOperator((dense + dense.T) / 2)
    a, b = top_eigenvalues(op, 3, tol=1e-12), top_eigenvalues(mat, 3, tol=1e-12)
    np.testing.assert_allclose(a.eigenvalues, b.eigenvalues, rtol=1e-9)
    np.testing.assert_allclose(hutchinson_trace(op, 8, seed=2).samples, hutchinson_trace(mat, 8, seed=2).samples,
                               rtol=1e-9)


def test_matvec_takes_one_vector_a_batch_and_an_output_buffer():
    a = torch.as_tensor(symmetric(6))
    op = MatrixOperator(a.float(), dtype=torch.float64)
    v = torch.randn(3, 6, dtype=torch.float32)
    expected = (a @ v.double().T).T
    torch.testing.assert_close(op.matvec(v[0]), expected[0].float())
    out = torch.empty(3, 6)
    assert op.matvec(v, out=out) is out
    torch.testing.assert_close(out, expected.float())
    assert op.products == 4 and op.dtype == torch.float64


@pytest.mark.parametrize("matrix, match", [
    (np.ones((2, 3)), "square matrix"),
    (np.zeros((0, 0)), "square matrix"),
    (np.array([[1.0, 2.0], [0.0, 1.0]]), "not symmetric"),
    (np.array([[1.0, math.nan], [math.nan, 1.0]]), "NaN or inf"),
])
def test_bad_matrices_are_one_line_errors(matrix, match):
    with pytest.raises(UsageError, match=match):
        MatrixOperator(matrix)


def test_top_k_beyond_the_dimension_is_refused():
    with pytest.raises(UsageError, match="exceeds the operator's dimension 6"):
        top_eigenvalues(MatrixOperator(symmetric(6)), 7)


def test_estimators_on_an_out_of_core_kernel_file(tmp_path):
    """The kernel gram_blocks_to_hdf5 wrote, streamed in row blocks that do not divide its side, gives the
    products and the spectrum of the in-memory kernel (gram_blocks, numpy eigvalsh)."""
    model, x, y = mlp_data()
    path = gram_blocks_to_hdf5(model, x, y, tmp_path / "k.h5", kind="output", chunk=7)
    dense = sum(gram_blocks(model, x, y, kind="output").values()).numpy()
    with KernelFileOperator(path, rows=16) as op:
        assert isinstance(op, LinearOperator) and op.dim == dense.shape[0] == 60
        v = torch.randn(3, op.dim, dtype=torch.float64)
        np.testing.assert_allclose(op.matvec(v).numpy(), v.numpy() @ dense, rtol=1e-10, atol=1e-12)
        top = top_eigenvalues(op, 3, steps=op.dim, tol=1e-12)
        np.testing.assert_allclose(top.eigenvalues, np.linalg.eigvalsh(dense)[::-1][:3], rtol=1e-9)
        assert abs(hutchinson_trace(op, 64, seed=0).mean - np.trace(dense)) < 0.2 * np.trace(dense)
    name = next(k for k, _ in model.named_parameters())
    block = gram_blocks(model, x, y, kind="output")[name].numpy()
    with KernelFileOperator(path, name) as op:
        np.testing.assert_allclose(op.matvec(torch.eye(op.dim, dtype=torch.float64)).numpy(), block, atol=1e-10)
    with pytest.raises(UsageError, match="has no kernel 'nope'"):
        KernelFileOperator(path, "nope")
    with pytest.raises(UsageError, match="no Gram file"):
        KernelFileOperator(tmp_path / "missing.h5")


def test_estimators_run_with_the_allocator_keeping_freed_blocks(monkeypatch):
    """Every product of an estimator runs inside ``tuned_allocator`` (a large model's product frees
    parameter-sized temporaries; returned to the OS they are page-faulted in again by the next product), and the
    setting is given back when the estimator returns."""
    from landscape.evaluate import allocator

    if allocator._libc() is None:
        pytest.skip("no glibc mallopt here: tuned_allocator is a no-op")
    monkeypatch.delenv("LANDSCAPE_MALLOC_TUNE", raising=False)
    depths = []

    class Recording(MatrixOperator):
        def matvec(self, v, out=None):
            depths.append(allocator._allocator_depth)
            return super().matvec(v, out)

    op = Recording(symmetric(12))
    top_eigenvalues(op, 2)
    hutchinson_trace(op, 5)
    spectral_density(op, 2, 6)
    assert depths and min(depths) >= 1
    assert allocator._allocator_depth == 0


def test_one_eigenvalue_reports_the_true_residual_of_its_ritz_pair():
    """With one eigenvalue the Ritz vector is formed in place over the basis' first row; its residual must still
    be the true ||A u - theta u||, on an early stop: at most the stopping rule's tol |theta| (the Lanczos estimate
    |beta_m s_m| it stopped on equals the true residual up to rounding; a wrong u would be far off), and
    Weinstein's bound (an eigenvalue within r of theta) and Kato-Temple's (lambda_1 - theta <= r^2 /
    (theta - lambda_2)) hold, which a too small r would break."""
    a = symmetric(60, seed=2)
    exact = np.linalg.eigvalsh(a)[::-1]
    for tol in (1e-2, 1e-3):
        top = top_eigenvalues(MatrixOperator(torch.as_tensor(a)), 1, tol=tol, seed=1)
        theta, r = float(top.eigenvalues[0]), float(top.residuals[0])
        assert top.steps < 60 and 0 < r <= tol * abs(theta) * (1 + 1e-6)
        assert np.abs(exact - theta).min() <= r * (1 + 1e-9)
        assert 0 <= exact[0] - theta <= r**2 / (theta - exact[1]) * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("kind", ["gaussian", "rademacher"])
def test_draws_into_given_memory_are_the_same_draws(kind):
    """``_draw(..., out=)`` (the start vector drawn into the Lanczos basis' first row) gives the same vectors as
    a fresh draw from the same generator, masked alike."""
    model, x, y = mlp_data()
    op = HessianOperator(model, x, y, masks={"1.weight": (torch.arange(60).reshape(10, 6) % 3 > 0).double()})
    fresh = _draw(op, 2, torch.Generator().manual_seed(4), kind, torch.float64)
    out = torch.full((2, op.numel), float("nan"), dtype=torch.float64)
    given = _draw(op, 2, torch.Generator().manual_seed(4), kind, torch.float64, out=out)
    assert given.data_ptr() == out.data_ptr()
    torch.testing.assert_close(given, fresh, rtol=0, atol=0)
    assert int((given == 0).sum()) == 2 * (op.numel - op.dim)
