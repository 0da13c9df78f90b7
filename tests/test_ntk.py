"""Empirical NTK under clipping: Bu et al. (2023) App. A facts, Thm. 1-2 on real models, files, API and CLI."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from landscape.analyze.ntk import NTKResult, compute_ntk
from landscape.analyze.ntk_kernels import clip_kernel, kernel_properties, layer_kernels
from landscape.analyze.ntk_table import NTKTable, ntk_table
from landscape.analyze.specs import NTKConfig, NTKTableConfig
from landscape.clip import clip_factors
from landscape.errors import NonFiniteError, UsageError
from landscape.models import build_model

# ------------------------------------------------------------------------------ Bu et al. App. A fixtures


@pytest.fixture
def fact_a1_counterexample():
    """Fact A.1: M1 SPD, M2 positive diagonal; A = M1 M2 = [[1, .1], [1, .2]], (1,-2) A (1,-2)^T = -0.4."""
    M1 = np.array([[1.0, 1.0], [1.0, 2.0]])
    M2 = np.diag([1.0, 0.1])
    return M1, M2


@pytest.fixture
def fact_a2():
    """Fact A.2: eigenvalues (7 +- 3 sqrt 5)/2 > 0, yet e_1^T A e_1 = -1."""
    return np.array([[-1.0, 3.0], [-3.0, 8.0]])


@pytest.fixture
def fact_a3():
    """Fact A.3: x^T A x = x^2 + y^2 > 0, eigenvalues 1 +- i."""
    return np.array([[1.0, 1.0], [-1.0, 1.0]])


def fact_a4(h11: float) -> tuple[np.ndarray, np.ndarray]:
    """Fact A.4: K_layers = (H_1, H_2), factors C_r as (L, n) rows; H_1[1,1] = ``h11``."""
    H1 = np.array([[h11, 2.0], [2.0, 7.0]])
    H2 = np.array([[3.0, 2.0], [2.0, 2.0]])
    return np.stack([H1, H2]), np.array([[0.9, 0.4], [0.1, 0.6]])


def _layerwise(K_layers: np.ndarray, C: np.ndarray) -> np.ndarray:
    return sum(K_layers[r] @ np.diag(C[r]) for r in range(len(K_layers)))


def test_fact_a1_counterexample(fact_a1_counterexample):
    M1, M2 = fact_a1_counterexample
    A = M1 @ M2
    np.testing.assert_allclose(A, [[1.0, 0.1], [1.0, 0.2]])
    v = np.array([1.0, -2.0])
    assert v @ A @ v == pytest.approx(-0.4)
    p = kernel_properties(A)
    assert not p.symmetric and not p.positive_quadratic and p.positive_eigenvalues
    assert p.min_real_eig > 0 and p.max_abs_imag_eig == 0


def test_fact_a2_positive_eigenvalues_not_quadratic(fact_a2):
    p = kernel_properties(fact_a2)
    np.testing.assert_allclose(np.sort(p.eigvals.real), [(7 - 3 * math.sqrt(5)) / 2, (7 + 3 * math.sqrt(5)) / 2])
    assert p.max_abs_imag_eig == 0
    assert p.positive_eigenvalues and not p.positive_quadratic and not p.symmetric
    assert p.min_sym_eig == pytest.approx(-1.0)  # (A + A^T)/2 = diag(-1, 8)
    assert p.n_negative_sym_eigs == 1


def test_fact_a3_positive_quadratic_complex_eigenvalues(fact_a3):
    p = kernel_properties(fact_a3)
    np.testing.assert_allclose(p.eigvals, [1 - 1j, 1 + 1j])
    assert p.positive_quadratic and not p.positive_eigenvalues
    assert p.min_sym_eig == pytest.approx(1.0) and p.max_abs_imag_eig == pytest.approx(1.0)
    assert p.min_real_eig == pytest.approx(1.0)  # "all eigenvalues have positive real part"


def test_fact_a4_layerwise_zero_and_negative_eigenvalue():
    """Bu Fact A.4. The zero eigenvalue needs H_1[1,1] = 7/9 (A = [[1, 2], [2, 4]], eigenvalues 0 and 5); the
    8/9 printed in the paper gives [[1.1, 2], [2, 4]] with det 0.4 > 0. With H_1[1,1] = 0.7: a negative one."""
    for h11 in (7 / 9, 8 / 9, 0.7):
        K_layers, _ = fact_a4(h11)
        assert np.all(np.linalg.eigvalsh(K_layers) > 0)  # every H_r positive definite
    K_layers, C = fact_a4(7 / 9)
    A = _layerwise(K_layers, C)
    np.testing.assert_allclose(A, [[1.0, 2.0], [2.0, 4.0]], atol=1e-15)
    p = kernel_properties(A)
    np.testing.assert_allclose(p.eigvals.real, [0.0, 5.0], atol=1e-12)
    assert abs(p.min_real_eig) < 1e-12 and p.positive_eigenvalues  # zero counts as non-negative
    K_layers, C = fact_a4(8 / 9)  # as printed
    assert np.linalg.det(_layerwise(K_layers, C)) == pytest.approx(0.4)
    K_layers, C = fact_a4(0.7)
    p = kernel_properties(_layerwise(K_layers, C))
    assert p.min_real_eig == pytest.approx((4.93 - math.sqrt(4.93**2 - 4 * -0.28)) / 2)
    assert p.min_real_eig < 0 and not p.positive_eigenvalues and not p.positive_quadratic
    assert p.n_negative_real_eigs == 1


def test_fact_a4_through_clip_kernel():
    """clip_kernel builds the same layerwise sum from per-layer blocks and norms (factors via privatize)."""
    K_layers, C = fact_a4(0.7)
    # choose per-layer norms so abadi factors min(1, c_r / ||g_{i,r}||) equal C with c_r = 1
    sq = (1.0 / C) ** 2
    ck = clip_kernel(K_layers, sq, style="layerwise", max_grad_norm=1.0, layer_max_norms=1.0)
    np.testing.assert_allclose(ck.C, C)
    np.testing.assert_allclose(ck.A, _layerwise(K_layers, C))
    assert ck.fraction_clipped == 1.0
    assert not kernel_properties(ck.A).positive_eigenvalues


# -------------------------------------------------------------------------------- kernel_properties API


def test_zero_matrix_torch_input_and_bad_input():
    p = kernel_properties(torch.zeros(3, 3))
    assert p.symmetric and p.positive_quadratic and p.positive_eigenvalues and p.asymmetry == 0.0
    q = kernel_properties(torch.eye(4, dtype=torch.float32))
    assert q.min_sym_eig == pytest.approx(1.0) and q.n == 4
    with pytest.raises(UsageError, match="square"):
        kernel_properties(np.ones((2, 3)))
    with pytest.raises(NonFiniteError, match="non-finite"):  # a failure of the input (exit 1), not usage
        kernel_properties(np.array([[1.0, np.nan], [0.0, 1.0]]))


def test_tolerances_are_relative_to_the_norm():
    """Scaling a matrix never changes its verdicts."""
    A = np.array([[1.0, 1e-8], [0.0, 1.0]])
    for s in (1e-12, 1.0, 1e12):
        p = kernel_properties(s * A)
        assert p.symmetric and p.positive_quadratic and p.positive_eigenvalues
        assert p.asymmetry == pytest.approx(1e-8, rel=1e-6)  # sqrt(2) 1e-8 / sqrt(2)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 7),
    rank=st.integers(1, 7),
    seed=st.integers(0, 2**31 - 1),
    logc=st.lists(st.floats(-3, 0), min_size=7, max_size=7),
    zeros=st.lists(st.booleans(), min_size=7, max_size=7),
)
def test_fact_a1_flat_kernel_spectrum(n, rank, seed, logc, zeros):
    """Bu Fact A.1: K C has the eigenvalues of K^{1/2} C K^{1/2}: real and >= 0 for any C >= 0."""
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((n, min(rank, n) + 1))
    K = G @ G.T
    c = np.array([0.0 if z else 10.0**v for v, z in zip(logc[:n], zeros[:n], strict=True)])
    w, V = np.linalg.eigh(K)
    root = V @ np.diag(np.sqrt(np.clip(w, 0, None))) @ V.T
    ref = np.linalg.eigvalsh(root @ np.diag(c) @ root)
    p = kernel_properties(K @ np.diag(c))
    scale = np.linalg.norm(K) * max(c.max(), 1e-300)
    np.testing.assert_allclose(np.sort(p.eigvals.real), ref, atol=1e-9 * scale)
    assert p.max_abs_imag_eig <= 1e-7 * scale
    assert p.positive_eigenvalues


# ------------------------------------------------------------------------------------------ real models


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    model = build_model("opacus-cnn", input_shape=(1, 8, 8), num_classes=10).double()
    x = torch.randn(12, 1, 8, 8, dtype=torch.float64)
    y = torch.arange(12) % 10
    return model, x, y


@pytest.fixture(scope="module")
def cnn_kernels(cnn):
    model, x, y = cnn
    return layer_kernels(model, x, y)


def test_unclipped_kernels_symmetric_psd(cnn, cnn_kernels):
    model, x, y = cnn
    for kind in ("loss-grad", "output", "output-trace"):
        lk = cnn_kernels if kind == "loss-grad" else layer_kernels(model, x[:6], y[:6], kind=kind)
        for A in [lk.K, *lk.K_layers]:
            p = kernel_properties(A)
            assert p.asymmetry < 1e-10, kind
            assert p.min_sym_eig >= -1e-10 * p.norm, kind
            assert p.positive_quadratic and p.positive_eigenvalues


def test_clip_kernel_matches_definition(cnn_kernels):
    lk = cnn_kernels
    L, n = lk.layer_sq_norms.shape
    np.testing.assert_allclose(lk.layer_sq_norms, np.stack([np.diag(k) for k in lk.K_layers]))
    norms = np.sqrt(np.diag(lk.K))
    C = 0.5 * np.median(norms)
    flat = clip_kernel(lk.K_layers, lk.layer_sq_norms, style="flat", max_grad_norm=C)
    c = clip_factors(torch.as_tensor(norms), C, "abadi").numpy()
    np.testing.assert_allclose(flat.A, lk.K @ np.diag(c), rtol=1e-12)
    assert flat.fraction_clipped == pytest.approx(np.mean(norms > C))
    layer = clip_kernel(lk.K_layers, lk.layer_sq_norms, style="layerwise", max_grad_norm=C)
    cr = np.stack([clip_factors(torch.as_tensor(np.sqrt(np.diag(k))), C / math.sqrt(L), "abadi").numpy()
                   for k in lk.K_layers])
    np.testing.assert_allclose(layer.A, sum(k @ np.diag(f) for k, f in zip(lk.K_layers, cr, strict=True)), rtol=1e-12)
    for fn in ("automatic", "normalize", "global"):
        a = clip_kernel(lk.K_layers, lk.layer_sq_norms, style="flat", max_grad_norm=C, clip_fn=fn)
        f = clip_factors(torch.as_tensor(norms), C, fn).numpy()
        np.testing.assert_allclose(a.A, lk.K @ np.diag(f), rtol=1e-12)


def test_small_clipping_norm_thm1_flat(cnn_kernels):
    """Thm. 1.1: flat clipping breaks symmetry but keeps real, non-negative eigenvalues."""
    ck = clip_kernel(cnn_kernels.K_layers, cnn_kernels.layer_sq_norms, style="flat", max_grad_norm=1e-3)
    p = kernel_properties(ck.A)
    assert ck.fraction_clipped == 1.0
    assert not p.symmetric and p.asymmetry > 1e-3
    assert p.positive_eigenvalues


def test_huge_clipping_norm_gives_k(cnn, cnn_kernels):
    """Thm. 2: nothing clipped -> both kernels are K."""
    model, x, y = cnn
    for style in ("flat", "layerwise"):
        r = compute_ntk(model, x, y, NTKConfig(subset=12, clip_style=style, max_grad_norm=1e6))
        assert r.fraction_clipped == 0.0
        np.testing.assert_array_equal(r.A, r.K)
        np.testing.assert_allclose(r.K, cnn_kernels.K, rtol=1e-12)
        assert r.properties.symmetric and r.properties.positive_eigenvalues


def test_output_kind_norms_from_output_blocks(cnn, cnn_kernels):
    """||g_{i,r}||^2 recovered from the output NTK (v_i^T H_r[i,i] v_i) equals diag K_r of loss-grad."""
    model, x, y = cnn
    out = layer_kernels(model, x, y, kind="output")
    assert out.K.shape == (12 * 10, 12 * 10) and out.logits_per_sample == 10
    np.testing.assert_allclose(out.layer_sq_norms, cnn_kernels.layer_sq_norms, rtol=1e-9)
    trace = layer_kernels(model, x, y, kind="output-trace")
    np.testing.assert_allclose(trace.K, out.K.reshape(12, 10, 12, 10).trace(axis1=1, axis2=3), rtol=1e-12)
    ck = clip_kernel(out.K_layers, out.layer_sq_norms, style="flat", max_grad_norm=0.01, logits_per_sample=10)
    np.testing.assert_allclose(ck.A, out.K * np.repeat(ck.C, 10)[None, :], rtol=1e-12)


def test_result_and_table_files_round_trip(cnn, tmp_path):
    model, x, y = cnn
    r = compute_ntk(model, x, y, NTKConfig(subset=12, clip_style="layerwise", max_grad_norm=0.1, layers=("0.*", "3.*")))
    assert r.layer_names == ["0.weight", "0.bias", "3.weight", "3.bias"]
    path = r.to_hdf5(tmp_path / "ntk.h5")
    back = NTKResult.from_hdf5(path)
    assert back.config == r.config and back.properties == r.properties and back.layer_names == r.layer_names
    for k in ("K", "K_layers", "A", "C", "norms", "layer_norms"):
        np.testing.assert_array_equal(getattr(back, k), getattr(r, k))
    np.testing.assert_array_equal(back.properties.eigvals, r.properties.eigvals)
    import h5py

    with h5py.File(path) as f:
        assert {"K", "K_layers", "C", "A", "eigvals_real", "eigvals_imag", "sym_eigvals"} <= set(f)
        assert f.attrs["kind"] == "ntk" and "min_real_eig" in f.attrs

    table = ntk_table(model, x, y, NTKTableConfig(max_grad_norms=(1e-3, 1e6), subset=12), step=7, epoch=1.5)
    assert [(r.style, r.max_grad_norm) for r in table.rows[1:]] == [
        ("flat", 1e-3), ("layerwise", 1e-3), ("flat", 1e6), ("layerwise", 1e6)]
    none, flat_small, _, flat_big, layer_big = table.rows
    assert none.symmetric and none.positive_quadratic and none.positive_eigenvalues
    assert not flat_small.symmetric and flat_small.positive_eigenvalues
    assert flat_big.symmetric and layer_big.symmetric and flat_big.fraction_clipped == 0.0
    back = NTKTable.from_hdf5(table.to_hdf5(tmp_path / "t.h5"))
    assert len(back.rows) == 5 and back.config == table.config
    assert back.rows[1:] == table.rows[1:] and math.isnan(back.rows[0].max_grad_norm)
    assert back.rows[1].step == 7 and back.rows[1].epoch == 1.5
    csv = table.to_csv(tmp_path / "t.csv").read_text().splitlines()
    assert csv[0].startswith("step,epoch,max_grad_norm,style") and len(csv) == 6


# ------------------------------------------------------------------------------------------ API and CLI


@pytest.fixture(scope="module")
def store_root(tmp_path_factory):
    from landscape.data import load_dataset
    from landscape.store import Store

    root = tmp_path_factory.mktemp("store")
    data = load_dataset("digits", seed=0)
    torch.manual_seed(0)
    model = build_model("opacus-cnn", input_shape=data.input_shape, num_classes=data.num_classes)
    run = Store(root).create_run("cnn", config={}, seeds={}, model_spec=model.landscape_spec, data_spec=data.spec)
    for step in (0, 5):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.1)
        run.save_checkpoint(model.state_dict(), step=step, epoch=step / 5)
    return root


def test_cli_ntk_and_table(store_root, tmp_path):
    from cli.main import cli

    runner = CliRunner()
    out = tmp_path / "k.h5"
    res = runner.invoke(cli, ["--root", str(store_root), "ntk", "cnn@last", "--subset", "20", "--clip-style", "flat",
                              "--max-grad-norm", "0.01", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "A (flat)" in res.output and out.exists() and out.with_suffix(".png").exists()
    r = NTKResult.from_hdf5(out)
    assert r.K.shape == (20, 20) and r.fraction_clipped > 0 and r.config.max_grad_norm == 0.01
    assert len(set(r.labels.tolist())) == 10  # stratified subset of digits

    tab = tmp_path / "tab.h5"
    res = runner.invoke(cli, ["--root", str(store_root), "ntk-table", "cnn", "--subset", "12", "--max-grad-norms",
                              "0.01,1e6", "--clip-styles", "flat,layerwise", "-o", str(tab), "--json"])
    assert '"rows"' in res.output
    assert res.exit_code == 0, res.output
    table = NTKTable.from_hdf5(tab)
    assert sorted({r.step for r in table.rows}) == [0, 5] and len(table.rows) == 2 * 5
    assert tab.with_suffix(".csv").exists() and tab.with_suffix(".pdf").exists()


def test_api_ntk_output_trace(store_root, tmp_path):
    from landscape.api import ntk

    out = ntk("cnn@init", root=store_root, output=tmp_path / "t.h5", figure=False, subset=10, kernel="output-trace",
              clip_style="layerwise", max_grad_norm=0.05)
    assert out.K.shape == (10, 10) and out.figures == [] and out.path == tmp_path / "t.h5"
    assert out.K_properties.symmetric


def test_cli_errors_are_one_line(store_root, tmp_path):
    code = "import sys; from cli.main import main; sys.argv = ['landscape'] + sys.argv[1:]; main()"
    res = subprocess.run([sys.executable, "-c", code, "--root", str(store_root), "ntk", "nope@last"],
                         capture_output=True, text=True)
    assert res.returncode == 1 and res.stderr.startswith("error: ") and len(res.stderr.strip().splitlines()) == 1
    from cli.main import cli

    res = CliRunner().invoke(cli, ["--root", str(store_root), "ntk", "cnn@last", "--subset", "100000",
                                   "-o", str(tmp_path / "x.h5")])
    assert isinstance(res.exception, UsageError) and "subset=100000 is more than" in str(res.exception)
    from cli.common import error_line  # main() prints it with the command's flags

    assert "--subset 100000 is more than" in error_line(res.exception, cli.get_command(None, "ntk"))


def test_flat_clipping_of_a_layer_subset_uses_the_whole_gradient_norm(cnn, cnn_kernels):
    """Flat clipping clips ||g_i|| of the whole model (Bu eq. 4.3), whichever layers the kernel shows."""
    model, x, y = cnn
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    subset = layer_kernels(model, x, y, layers=names[-2:])
    np.testing.assert_allclose(subset.sample_sq_norms, np.diag(cnn_kernels.K), rtol=1e-5)
    assert (subset.layer_sq_norms.sum(0) < 0.999 * subset.sample_sq_norms).any()  # the subset alone is smaller
    C = 0.5 * float(np.median(np.sqrt(np.diag(cnn_kernels.K))))
    from landscape.analyze.ntk_kernels import clip_layer_kernels

    flat = clip_layer_kernels(subset, style="flat", max_grad_norm=C, clip_fn="abadi")
    c = clip_factors(torch.as_tensor(np.sqrt(np.diag(cnn_kernels.K))), C, "abadi").numpy()
    np.testing.assert_allclose(flat.C, c, rtol=1e-5)
    np.testing.assert_allclose(flat.A, subset.K @ np.diag(flat.C), rtol=1e-12)
