"""Symmetry of the gradient-deviation distribution (Zhu & Blaschko 2023 App. F; landscape symmetry)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from landscape.analyze.symmetry import (
    SymmetryResult,
    direction,
    energy_symmetry_test,
    gradient_symmetry,
    matrix_fingerprint,
    parameter_shapes,
    skewness,
)
from landscape.data import subset_indices
from landscape.models import build_model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_symmetric_sample_gives_zero_statistic_and_large_p(seed):
    rng = np.random.default_rng(seed)
    pts = rng.standard_t(5, size=(300, 2)) * [1.0, 3.0]  # symmetric, heavy-ish tails, anisotropic
    test = energy_symmetry_test(pts, permutations=499, seed=seed)
    assert abs(test.coefficient) < 0.01
    assert test.p_value > 0.05
    assert np.abs(skewness(rng.normal(size=(300, 8)))).mean() < 0.3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_skewed_sample_gives_clearly_nonzero_statistic_and_small_p(seed):
    rng = np.random.default_rng(seed)
    pts = rng.exponential(1.0, size=(300, 2))
    pts -= pts.mean(0)  # centred like the deviations: the asymmetry is in the shape, not the mean
    test = energy_symmetry_test(pts, permutations=499, seed=seed)
    assert test.coefficient > 0.03
    assert test.p_value < 0.01
    skew = skewness(rng.exponential(size=(300, 8)))
    assert np.all(skew > 1.0) and abs(skew.mean() - 2.0) < 0.6  # exponential: skewness 2


def test_energy_statistic_matches_definition():
    """H = 1 - mean|x_i - x_j| / mean|x_i + x_j| over i != j (energy distance of {x} vs {-x}, normalised)."""
    rng = np.random.default_rng(5)
    x = rng.gamma(2.0, size=(40, 2)) - 1.0
    a = np.array([[np.linalg.norm(p - q) for q in x] for p in x])
    b = np.array([[np.linalg.norm(p + q) for q in x] for p in x])
    off = ~np.eye(40, dtype=bool)
    test = energy_symmetry_test(x, permutations=10, about="origin")
    assert test.coefficient == pytest.approx(1 - a[off].mean() / b[off].mean(), rel=1e-12)
    assert test.distance == pytest.approx(2 * b[off].mean() - 2 * a[off].mean(), rel=1e-12)
    xc = x - x.mean(0)  # about the mean: the same definition on the centred points
    bc = np.array([[np.linalg.norm(p + q) for q in xc] for p in xc])
    centred = energy_symmetry_test(x, permutations=10)
    assert centred.coefficient == pytest.approx(1 - a[off].mean() / bc[off].mean(), rel=1e-12)


def test_sign_flip_p_values_are_calibrated_for_centred_deviations():
    """Under symmetry the p-value is ~uniform; flipping the centred sample without re-centring gave p ~ 1."""
    rng = np.random.default_rng(11)
    p = [energy_symmetry_test(rng.normal(size=(30, 2)), permutations=99, seed=r).p_value for r in range(60)]
    assert 0.35 < np.mean(p) < 0.65
    assert 0.0 < np.mean(np.array(p) <= 0.2) < 0.4


def test_projection_matrix_depends_only_on_seed_and_shapes():
    shapes = [(4, 3), (4,), (2, 4)]
    a = [torch.cat([t.ravel() for t in direction(7, shapes, j)]) for j in range(3)]
    b = [torch.cat([t.ravel() for t in direction(7, shapes, j)]) for j in range(3)]
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert not torch.equal(a[0], a[1])
    other = torch.cat([t.ravel() for t in direction(8, shapes, 0)])
    assert not torch.equal(a[0], other)
    assert matrix_fingerprint(7, shapes, 2) == matrix_fingerprint(7, shapes, 2) != matrix_fingerprint(8, shapes, 2)


def _brute_projections(model, x, y, seed, rows):
    """<g_i - g_bar, v_j> from a naive per-example loop and explicitly built directions."""
    shapes = parameter_shapes(model)
    V = torch.stack([torch.cat([t.ravel() for t in direction(seed, shapes, j)]) for j in range(rows)]).double()
    G = []
    for i in range(len(y)):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum").backward()
        G.append(torch.cat([p.grad.ravel() for p in model.parameters()]).detach().clone())
    model.zero_grad()
    G = torch.stack(G)
    return ((G - G.mean(0)) @ V.T).numpy()


def test_analyzer_projections_equal_brute_force():
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(5,), num_classes=3, widths=[4]).double()
    x = torch.randn(30, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (30,))
    res = gradient_symmetry(model, x, y, projections=3, seed=4, subset=30, permutations=50, chunk=7)
    idx = subset_indices(y, 30, 4)  # the one sampler's examples (here all 30)
    ref = _brute_projections(model, x[idx], y[idx], 4, 5)
    np.testing.assert_allclose(res.rows[0].stats.plane, ref[:, :2], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(res.rows[0].stats.skew, skewness(ref[:, 2:]), rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def run_store(tmp_path_factory):
    """A run with three checkpoints of an MLP on gaussian-signal (weights perturbed, no training needed)."""
    from landscape.data import load_dataset
    from landscape.store import Store

    root = tmp_path_factory.mktemp("store")
    data = load_dataset("gaussian-signal", seed=0, ds=3, dn=5, n=120, n_test=20)
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=2, widths=[6])
    run = Store(root).create_run("r", config={"optimizer": "sgd"}, seeds={"seed": 0},
                                 model_spec=model.landscape_spec, data_spec=data.spec)
    for step in range(3):
        state = {k: v + 0.3 * step * torch.randn_like(v) for k, v in model.state_dict().items()}
        run.save_checkpoint(state, step=10 * step, epoch=float(step))
    return root


def test_same_matrix_for_every_checkpoint_of_a_run(run_store, tmp_path):
    """Every checkpoint's stored plane equals the brute-force projection with ONE matrix from the seed."""
    from landscape.api import symmetry
    from landscape.store import Store

    out = tmp_path / "sym.h5"
    res = symmetry("r", root=run_store, projections=2, seed=9, subset=40, subset_seed=9, permutations=50, output=out)
    assert [r.epoch for r in res.rows] == [0.0, 1.0, 2.0]
    back = SymmetryResult.from_hdf5(out)
    store = Store(run_store)
    for row in back.rows:
        ckpt = store.load(row.ref)
        model = ckpt.build_model().double()
        from landscape.data import dataset_from_spec

        x, y = dataset_from_spec(ckpt.data_spec).split("train")
        idx = subset_indices(y, 40, 9)  # the one sampler's (seeded, stratified) examples
        ref = _brute_projections(model, x[idx].double(), y[idx], 9, 2)
        np.testing.assert_allclose(row.stats.plane, ref, rtol=1e-4, atol=1e-5)
    shapes = parameter_shapes(store.load("r@init").build_model())
    assert back.fingerprint == matrix_fingerprint(9, shapes, 2)
    stem = out.with_suffix("")
    for suffix in ("-deviations.png", "-deviations.pdf", "-stats.png", "-stats.pdf"):
        assert stem.with_name(stem.name + suffix).is_file()
