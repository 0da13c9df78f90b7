"""Hessian-vector products and sharpness (landscape.curvature, landscape.analyze.hessian) against the exact
Hessian (torch.autograd.functional.hessian + numpy.linalg.eigvalsh) and against PyHessian (Yao et al. 2020)."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from landscape.analyze.hessian import HessianResult, hessian_row, subset
from landscape.analyze.specs import HessianConfig
from landscape.curvature import HessianOperator
from landscape.errors import ModelError, UsageError
from landscape.models import build_model
from landscape.spectral import (
    _coefficients,
    _draw,
    _norms,
    hutchinson_trace,
    lanczos,
    spectral_density,
    top_eigenvalues,
)

N = 48


def small_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", input_shape=(5,), num_classes=3, widths=(8,), activation="tanh").double()


def data(n: int = N, seed: int = 0, features: tuple[int, ...] = (5,)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *features, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def exact_hessian(model: nn.Module, x, y, masks=None) -> np.ndarray:
    """The dense Hessian of the mean cross-entropy over the flat trainable parameters (eval mode)."""
    named = {k: p.detach() for k, p in model.named_parameters()}
    names, shapes = list(named), [p.shape for p in named.values()]
    numels = [p.numel() for p in named.values()]
    buffers = dict(model.named_buffers())
    was = model.training
    model.eval()

    def loss(theta):
        params = {k: t.view(s) for k, t, s in zip(names, torch.split(theta, numels), shapes, strict=True)}
        return F.cross_entropy(functional_call(model, {**params, **buffers}, (x,)), y)

    h = torch.autograd.functional.hessian(loss, torch.cat([p.reshape(-1) for p in named.values()])).numpy()
    model.train(was)
    if masks is not None:
        m = torch.cat([masks[k].reshape(-1) if k in masks else torch.ones(n) for k, n in zip(names, numels, strict=True)])
        p = np.diag(m.double().numpy())
        h = p @ h @ p
    return h


@pytest.fixture(scope="module")
def case():
    model, (x, y) = small_mlp(), data()
    return model, x, y, exact_hessian(model, x, y)


def config(**kw) -> HessianConfig:
    return dataclasses.replace(HessianConfig(precision="float64", subset=N, device="cpu"), **kw)


# ------------------------------------------------------------------------------------------- products


@pytest.mark.parametrize("batch_size, retain", [(None, True), (10, True), (10, False), (17, False)])
def test_hvp_equals_exact_hessian_times_vector(case, batch_size, retain):
    model, x, y, h = case
    op = HessianOperator(model, x, y, dtype=torch.float64, batch_size=batch_size,
                         retain_bytes=2**30 if retain else 0)
    assert op.retained_chunks == (len(op.chunks) if retain else 0)
    v = torch.randn(4, op.numel, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    one = op.flatten(op.hvp(op.unflatten(v[0])))
    np.testing.assert_allclose(one.numpy(), h @ v[0].numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(op.matvec(v).numpy(), v.numpy() @ h, rtol=0, atol=1e-12)
    assert op.products == 5 and op.vectorised in (True, False)  # the first batch chose its route
    for route in (True, False):
        op.vectorised = route
        np.testing.assert_allclose(op.matvec(v).numpy(), v.numpy() @ h, rtol=0, atol=1e-12)
    for shape in ((4, op.numel), (1, op.numel), (op.numel,)):  # into a given buffer: the same products
        w = v[: shape[0]] if len(shape) == 2 else v[0]
        buffer = torch.full(shape, math.nan, dtype=torch.float32)
        assert op.matvec(w, out=buffer) is buffer
        np.testing.assert_allclose(buffer.numpy(), (w.numpy() @ h).astype(np.float32), rtol=1e-6, atol=1e-7)


def test_groupnorm_conv_chunks_sum_to_the_whole_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    model = model.double()
    x, y = data(12, features=(1, 6, 6))
    h = exact_hessian(model, x, y)
    v = torch.randn(2, h.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for kw in ({}, {"batch_size": 5}, {"batch_size": 5, "retain_bytes": 0}):
        op = HessianOperator(model, x, y, dtype=torch.float64, **kw)
        np.testing.assert_allclose(op.matvec(v).numpy(), v.numpy() @ h, rtol=0, atol=1e-11)


def test_batchnorm_is_evaluated_in_eval_mode_and_the_model_is_left_as_it_was():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)).double()
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    model.train()
    before = copy.deepcopy(model.state_dict())
    x, y = data(20)
    h = exact_hessian(model, x, y)  # eval mode: running statistics
    op = HessianOperator(model, x, y, dtype=torch.float64, batch_size=7)
    v = torch.randn(h.shape[0], dtype=torch.float64)
    np.testing.assert_allclose(op.matvec(v).numpy(), h @ v.numpy(), rtol=0, atol=1e-12)
    assert model.training and model[1].training
    for k, t in model.state_dict().items():
        assert torch.equal(t, before[k]), k
    with torch.no_grad():  # the operator holds its own copy of the weights
        model[0].weight.add_(1.0)
    np.testing.assert_allclose(op.matvec(v).numpy(), h @ v.numpy(), rtol=0, atol=1e-12)


def test_masks_give_the_hessian_restricted_to_unpruned_coordinates(case):
    model, x, y, _ = case
    g = torch.Generator().manual_seed(3)
    masks = {k: (torch.rand(p.shape, generator=g) > 0.4).double() for k, p in model.named_parameters()
             if k.endswith("weight")}
    h = exact_hessian(model, x, y, masks)
    op = HessianOperator(model, x, y, masks=masks, dtype=torch.float64)
    free = torch.cat([masks.get(k, torch.ones_like(p)).reshape(-1) for k, p in model.named_parameters()]) > 0
    assert op.dim == int(free.sum())
    v = torch.randn(op.numel, dtype=torch.float64)
    np.testing.assert_allclose(op.matvec(v).numpy(), h @ v.numpy(), rtol=0, atol=1e-12)
    exact = np.linalg.eigvalsh(h[np.ix_(free.numpy(), free.numpy())])[::-1]
    top = top_eigenvalues(op, 3, tol=1e-10)
    np.testing.assert_allclose(top.eigenvalues, exact[:3], rtol=1e-8)
    # the Krylov space lives in the unpruned subspace: asking for more steps than it has stops there, and
    # a full-length SLQ run's nodes are the exact eigenvalues
    full = spectral_density(op, 1, op.numel)
    assert full.nodes.shape == (1, op.dim)
    np.testing.assert_allclose(full.nodes[0], np.sort(exact), rtol=0, atol=1e-10)
    tr = hutchinson_trace(op, 8)
    z = _draw(op, 8, torch.Generator().manual_seed(0), "rademacher", torch.float64)
    assert torch.all(z[:, ~free] == 0) and set(z[:, free].unique().tolist()) == {-1.0, 1.0}
    np.testing.assert_allclose(tr.samples, np.einsum("bi,ij,bj->b", z.numpy(), h, z.numpy()), atol=1e-12)


# ---------------------------------------------------------------------------------------- estimators


def test_top_eigenvalues_and_residuals_match_the_exact_spectrum(case):
    model, x, y, h = case
    exact = np.linalg.eigvalsh(h)[::-1]
    row = hessian_row(model, x, y, config(top_k=5, tol=1e-10))
    np.testing.assert_allclose(row.eigenvalues, exact[:5], rtol=1e-4)
    assert np.all(row.residuals < 1e-7 * exact[0])
    assert row.lanczos_steps < h.shape[0]  # stopped on its residual estimate, before exhausting the space
    assert row.num_params == h.shape[0]
    # float32 products: close, and the residuals say how close
    row32 = hessian_row(model.float(), x.float(), y, config(top_k=2, precision="float32"))
    model.double()
    np.testing.assert_allclose(row32.eigenvalues, exact[:2], rtol=1e-4)


def test_lanczos_returns_the_whole_spectrum_when_k_is_the_dimension(case):
    model, x, y, h = case
    op = HessianOperator(model, x, y, dtype=torch.float64)
    top = top_eigenvalues(op, op.dim, steps=op.dim, tol=1e-12)
    np.testing.assert_allclose(top.eigenvalues, np.linalg.eigvalsh(h)[::-1], rtol=0, atol=1e-10)


def test_lanczos_restarts_when_the_krylov_space_is_exhausted():
    """Each eigenvalue of this matrix is double, so a Krylov space has dimension <= 3: the 6 steps need one
    restart, and together they find both copies of every eigenvalue."""
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    eig = np.array([5.0, 5.0, 2.0, 2.0, -1.0, -1.0])
    a = torch.as_tensor(q @ np.diag(eig) @ q.T)
    gen = torch.Generator().manual_seed(0)
    run = lanczos(lambda v, out: torch.mm(v, a, out=out), torch.randn(1, 6, dtype=torch.float64, generator=gen), 6,
                  draw=lambda k: torch.randn(k, 6, dtype=torch.float64, generator=gen))
    assert (run.beta[0] == 0).sum() == 1 and run.beta[0][2] == 0
    np.testing.assert_allclose(run.ritz()[0], np.sort(eig), atol=1e-10)
    basis = run.basis[:, 0].numpy()
    np.testing.assert_allclose(basis @ basis.T, np.eye(6), atol=1e-12)


def test_lanczos_sums_float32_vectors_in_float64():
    """ResNet-18 has 11 M parameters: float32 norms and inner products of that length are off by 1e-5..1e-3,
    enough to un-normalise the Krylov basis (lambda_1 moved by 6e-4); the basis algebra accumulates in float64."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1, 2**23, generator=g) + 3
    rows = torch.randn(3, 2**23, generator=g) + 1
    exact_norm = torch.linalg.vector_norm(w.double())
    exact_c = rows.double() @ w[0].double()
    assert abs(float(_norms(w)[0] / exact_norm) - 1) < 1e-9
    assert float((_coefficients(rows, w[0]).double() / exact_c - 1).abs().max()) < 1e-6  # float32 rounding only
    assert abs(float(torch.linalg.vector_norm(w) / exact_norm) - 1) > 1e-7  # what plain float32 gives


def test_hutchinson_standard_error_covers_the_exact_trace(case):
    """z^T H z for Rademacher z has mean tr H and variance 2 sum_{i != j} H_ij^2. With 100 probes the mean is
    close to normal, so |estimate - tr H| <= 4 se fails with probability ~1e-4 per seed (t with 99 degrees of
    freedom); the reported se must also be the standard error, not the spread: within [0.6, 1.5] of the exact
    sqrt(var / 100) (the sample sd of 100 such draws is within ~20% of the true sd)."""
    model, x, y, h = case
    exact = float(np.trace(h))
    sd_exact = math.sqrt(2 * (np.sum(h**2) - np.sum(np.diag(h) ** 2)) / 100)
    for seed in range(4):
        row = hessian_row(model, x, y, config(top_k=0, trace=True, probes=100, seed=seed))
        assert abs(row.trace - exact) <= 4 * row.trace_se, (seed, row.trace, row.trace_se, exact)
        assert 0.6 < row.trace_se / sd_exact < 1.5, (seed, row.trace_se, sd_exact)
        assert row.trace_samples.shape == (100,)


def test_slq_density_integrates_to_one_and_its_moments_are_exact_quadratures(case):
    """Gauss quadrature from m Lanczos steps is exact for polynomials of degree < 2m (Golub & Meurant):
    sum_j tau_j theta_j^p = q^T H^p q for the normalised start q = z / sqrt(d); averaged over starts it
    estimates tr(H^p) / d."""
    model, x, y, h = case
    op = HessianOperator(model, x, y, dtype=torch.float64)
    steps, runs = 6, 5
    sd = spectral_density(op, runs, steps, sigma=0.01, seed=7)
    z = _draw(op, runs, torch.Generator().manual_seed(7), "rademacher", torch.float64).numpy()
    q = z / np.sqrt(op.dim)
    for p in range(0, 2 * steps):
        quad = (sd.weights * sd.nodes**p).sum(1)
        exact = np.einsum("bi,ij,bj->b", q, np.linalg.matrix_power(h, p), q)
        np.testing.assert_allclose(quad, exact, rtol=1e-8, atol=1e-14)
    assert abs(np.trapezoid(sd.density, sd.grid) - 1) < 1e-6
    # and the estimate of the spectral moments: first and second against the exact spectrum
    ev = np.linalg.eigvalsh(h)
    many = spectral_density(op, 40, 4, seed=1)
    for p in (1, 2):
        assert abs(many.moment(p) - np.mean(ev**p)) < 0.25 * np.mean(np.abs(ev) ** p)
    # the mean of the density is the first moment
    assert abs(np.trapezoid(sd.grid * sd.density, sd.grid) - sd.moment(1)) < 1e-6 * max(1, abs(sd.moment(1)))


# ------------------------------------------------------------------------------------------ PyHessian


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_agrees_with_pyhessian_eigenvalues_and_trace(case):
    pyhessian = pytest.importorskip("pyhessian", reason="PyHessian (test reference) is not installed")
    model, x, y, h = case
    ev = np.linalg.eigvalsh(h)
    # PyHessian's power iteration finds the largest |eigenvalue|s; here those are the top two.
    assert ev[-2] > abs(ev[0])
    ref = pyhessian.hessian(copy.deepcopy(model), nn.CrossEntropyLoss(), data=(x, y), cuda=False)
    torch.manual_seed(0)
    theirs, _ = ref.eigenvalues(maxIter=2000, tol=1e-12, top_n=2)
    ours = hessian_row(model, x, y, config(top_k=2, tol=1e-10)).eigenvalues
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    # trace: the same Rademacher probes (PyHessian draws them from torch's global generator, parameter by
    # parameter) give the same z^T H z
    torch.manual_seed(5)
    samples = ref.trace(maxIter=30, tol=0.0)
    torch.manual_seed(5)
    op = HessianOperator(model, x, y, dtype=torch.float64)
    mine = []
    for _ in range(len(samples)):
        z = {k: torch.randint_like(p, high=2) for k, p in op.params.items()}
        z = {k: torch.where(t == 0, -1.0, t).to(torch.float64) for k, t in z.items()}
        hz = op.hvp(z)
        mine.append(sum(float((z[k] * hz[k]).sum()) for k in op.names))
    np.testing.assert_allclose(mine, samples, rtol=1e-10, atol=1e-12)
    assert len(samples) == 30


# ---------------------------------------------------------------------------------------------- rows


def test_hessian_row_uses_the_seeded_subset_and_leaves_the_model_alone(case):
    model, x, y, h = case
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    cfg = config(top_k=1, subset=20, subset_seed=3, seed=3, trace=True, probes=4, density=True, lanczos_steps=20)
    row = hessian_row(model, x, y, cfg, ref="r@step=5", step=5, epoch=1.5, run="r", optimizer="sgd")
    xs, ys = subset(x, y, 20, 3)
    exact = np.linalg.eigvalsh(exact_hessian(model, xs, ys))[::-1]
    np.testing.assert_allclose(row.top_eigenvalue, exact[0], rtol=1e-4)
    with torch.no_grad():
        assert row.loss == pytest.approx(float(F.cross_entropy(model(xs), ys)), rel=1e-12)
    assert (row.ref, row.step, row.epoch, row.run, row.optimizer) == ("r@step=5", 5, 1.5, "r", "sgd")
    assert row.density_nodes.shape == (1, 20) and row.density.shape == row.density_grid.shape
    assert row.products >= row.lanczos_steps + 1 + 4 + 20
    for k, p in model.named_parameters():
        assert torch.equal(p, before[k])
    again = hessian_row(model, x, y, cfg)
    np.testing.assert_array_equal(again.eigenvalues, row.eigenvalues)
    np.testing.assert_array_equal(again.trace_samples, row.trace_samples)
    table = HessianResult.from_rows([row], cfg).table_rows()
    assert table[0]["lambda_1"] == row.top_eigenvalue and table[0]["trace_se"] == row.trace_se


def test_bad_input_is_one_clear_error(case):
    model, x, y, h = case
    with pytest.raises(UsageError, match="exceeds the model's 75 free parameters"):
        hessian_row(model, x, y, config(top_k=76, lanczos_steps=80))
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken[1].weight[0, 0] = math.nan
    with pytest.raises(ModelError, match="1.weight has NaN or inf"):
        hessian_row(broken, x, y, config(top_k=1))
    for bad, match in [({"top_k": 0}, "nothing to compute"), ({"precision": "half"}, "^precision "),
                       ({"top_k": 9, "lanczos_steps": 5}, "at least top_k"), ({"subset": 0}, "^subset "),
                       ({"device": "gpu"}, "^device "), ({"tol": 0.0}, "^tol ")]:
        with pytest.raises(UsageError, match=match):
            config(**bad)
    nostats = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4, track_running_stats=False), nn.Linear(4, 3))
    with pytest.raises(ModelError, match="without running statistics"):
        HessianOperator(nostats, x.float(), y)


class _Gated(nn.Module):
    """A block whose gate is a submodule (as torchvision's SqueezeExcitation holds its Hardsigmoid)."""

    def __init__(self, gate: nn.Module):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.gate = gate

    def forward(self, x):
        return x * self.gate(self.fc(x))


class _FunctionalGate(nn.Module):
    """The same gate called as a function in the module's own forward: no submodule to name."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self.head(F.hardsigmoid(self.fc(x)))


def gated(gate: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), _Gated(gate), nn.Linear(6, 3)).double()


@pytest.mark.parametrize("retain", [True, False])  # reverse over reverse, forward over reverse
def test_a_layer_without_a_second_derivative_is_named_in_one_line(retain):
    x, y = data(12)
    for model, where in [(gated(nn.Hardsigmoid()), r"^layer 2\.gate \(Hardsigmoid\)"),
                         (_FunctionalGate().double(), r"^the model's own forward \(_FunctionalGate\)")]:
        op = HessianOperator(model, x, y, dtype=torch.float64, retain_bytes=2**30 if retain else 0)
        v = torch.randn(2, op.numel, dtype=torch.float64)
        for vectors in (v[0], v):  # one vector, a batch (vmap or loop)
            with pytest.raises(ModelError, match=where) as err:
                op.matvec(vectors)
            line = str(err.value)
            assert "\n" not in line and "has no second derivative in torch (aten::hardsigmoid_backward)" in line
            assert "replace it" in line
        assert all(not p.requires_grad for p in op.params.values())  # the search leaves the operator as it was
    many = nn.Sequential(gated(nn.Hardsigmoid()), nn.Tanh(), nn.Linear(3, 6), _Gated(nn.Hardsigmoid()),
                         nn.Linear(6, 3)).double()
    with pytest.raises(ModelError, match=r"^layer 0\.2\.gate \(Hardsigmoid; 1 more Hardsigmoid layer in the model\)"):
        hessian_row(many, x, y, config(top_k=1, subset=12))


def test_hardswish_has_one_and_freezing_before_a_hardsigmoid_measures_the_layers_after_it():
    """Hardswish's backward is differentiable in torch: its products are the exact Hessian's. The way out the
    Hardsigmoid error names (freeze every parameter before it) gives the exact Hessian of the layers after it."""
    x, y = data(20)
    model = gated(nn.Hardswish())
    h = exact_hessian(model, x, y)
    op = HessianOperator(model, x, y, dtype=torch.float64)
    v = torch.randn(2, op.numel, dtype=torch.float64)
    np.testing.assert_allclose(op.matvec(v).numpy(), v.numpy() @ h, rtol=0, atol=1e-12)

    frozen = gated(nn.Hardsigmoid())
    for p in [*frozen[0].parameters(), *frozen[2].fc.parameters()]:
        p.requires_grad_(False)
    head = dict(frozen[3].named_parameters())
    features = frozen[:3](x).detach()

    def loss(theta):
        w, b = theta[:18].view(3, 6), theta[18:]
        return F.cross_entropy(F.linear(features, w, b), y)

    exact = torch.autograd.functional.hessian(loss, torch.cat([head["weight"].reshape(-1), head["bias"]]))
    op = HessianOperator(frozen, x, y, dtype=torch.float64)
    assert op.names == ["3.weight", "3.bias"]
    np.testing.assert_allclose(op.matvec(v[:, :21]).numpy(), v[:, :21].numpy() @ exact.numpy(), rtol=0, atol=1e-12)


def test_mobilenet_v3_hessian_names_its_hardsigmoid_from_the_command_and_python(tmp_path, capsys):
    """torchvision's MobileNetV3-Small (weights=None) gates its squeeze-excitation blocks with nn.Hardsigmoid."""
    from conftest import run_cli

    from landscape import plugins
    from landscape.api import hessian
    from landscape.data import load_dataset
    from landscape.store import Store

    user = Path(__file__).with_name("user_models.py").resolve()
    code = [f"{user}:mobilenet", f"{user}:images"]
    with plugins.trusting(code):
        data = load_dataset(code[1])
        model = build_model(code[0], input_shape=data.input_shape, num_classes=data.num_classes)
    run = Store(tmp_path / "ck").create_run("m", config={}, seeds={}, model_spec=model.landscape_spec,
                                            data_spec=data.spec)
    run.save_checkpoint(model.state_dict(), step=0, epoch=0.0)
    expected = r"^layer features\.1\.block\.1\.scale_activation \(Hardsigmoid; 8 more Hardsigmoid layers"
    with pytest.raises(ModelError, match=expected):
        hessian("m@last", root=tmp_path / "ck", code=code, top_k=1, subset=4, lanczos_steps=2, figure=False)
    status, _, err = run_cli("--root", tmp_path / "ck", "--code", code[0], "--code", code[1], "hessian", "m@last",
                             "--top-k", "1", "--subset", "4", "--lanczos-steps", "2", "--trace", "--probes", "2",
                             "--no-figure", capsys=capsys)
    lines = err.strip().splitlines()
    assert status == 1 and len(lines) == 1 and re.match("error: " + expected[1:], lines[0]), err
    assert "aten::hardsigmoid_backward" in lines[0] and not (tmp_path / "results").exists()


def test_figures_show_every_run(case, tmp_path):
    from landscape.plots.hessian import plot_hessian, runs

    model, x, y, _ = case
    cfg = config(top_k=1, subset=16, trace=True, probes=3, density=True, lanczos_steps=6)
    rows = [hessian_row(model, x, y, cfg, ref=f"{r}@step={s}", run=r, optimizer=o, step=s, epoch=s)
            for r, o in (("sgd-run", "sgd"), ("dp-run", "dpsgd")) for s in (2, 1)]
    result = HessianResult.from_rows(rows, cfg)
    grouped = runs(result)
    assert list(grouped) == ["sgd-run", "dp-run"] and [rows[c].step for c in grouped["dp-run"]] == [1, 2]
    files = plot_hessian(result, tmp_path / "h.h5")
    assert sorted(f.name for f in files) == ["h-density.pdf", "h-density.png", "h-sharpness.pdf", "h-sharpness.png"]
    assert all(f.stat().st_size > 0 for f in files)


# ------------------------------------------------------------------------------------- command and api


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """An SGD run and a pruned DP run (mask kept as the run array 'mask') of one MLP on gaussian-signal."""
    from landscape.data import load_dataset
    from landscape.store import Store

    root = tmp_path_factory.mktemp("store")
    data = load_dataset("gaussian-signal", seed=0, ds=3, dn=5, n=60, n_test=20)
    store = Store(root)
    for name, optimizer in (("plain", "sgd"), ("pruned", "dpsgd")):
        torch.manual_seed(0)
        model = build_model("mlp", input_shape=data.input_shape, num_classes=2, widths=[6], activation="tanh")
        run = store.create_run(name, config={"optimizer": optimizer}, seeds={"seed": 0},
                               model_spec=model.landscape_spec, data_spec=data.spec)
        init = model.state_dict()
        gen = torch.Generator().manual_seed(1)
        mask = {k: (torch.rand(v.shape, generator=gen) > 0.3) for k, v in init.items() if k.endswith("weight")}
        if name == "pruned":
            run.save_array("mask", {k: m.numpy() for k, m in mask.items()})
        for step in range(2):
            state = {k: v + 0.5 * step * torch.randn(v.shape, generator=gen) for k, v in init.items()}
            if name == "pruned":
                state = {k: v * mask[k] if k in mask else v for k, v in state.items()}
            run.save_checkpoint(state, step=5 * step, epoch=float(step))
    return root


def test_api_over_runs_matches_the_exact_masked_hessian_and_reads_back(two_runs, tmp_path):
    import xarray

    from landscape.api import hessian
    from landscape.api._common import checkpoint_dataset
    from landscape.store import Store

    out = tmp_path / "h.h5"
    res = hessian(["plain", "pruned"], root=two_runs, top_k=2, trace=True, probes=5, density=True,
                  lanczos_steps=40, tol=1e-9, subset=40, precision="float64", device="cpu", output=out)
    assert res.path == out and {f.name for f in res.figures} == {
        "h-sharpness.png", "h-sharpness.pdf", "h-density.png", "h-density.pdf"}
    store = Store(two_runs)
    mask = {k: torch.as_tensor(v).double() for k, v in store.run("pruned").load_array("mask").items()}
    assert [r.optimizer for r in res.rows] == ["sgd", "sgd", "dpsgd", "dpsgd"]
    for c, row in enumerate(res.rows):
        ckpt = store.load(row.ref)
        model = ckpt.build_model().double()
        x, y = checkpoint_dataset(ckpt.data_spec).split("train")
        xs, ys = subset(x.double(), y, 40, 0)
        masks = mask if row.run == "pruned" else None
        h = exact_hessian(model, xs, ys, masks)
        if masks is not None:
            free = torch.cat([masks.get(k, torch.ones_like(p)).reshape(-1) for k, p in model.named_parameters()]) > 0
            h = h[np.ix_(free.numpy(), free.numpy())]
        np.testing.assert_allclose(res.eigenvalues[c], np.linalg.eigvalsh(h)[::-1][:2], rtol=1e-6)
        assert np.all(res.residuals[c] < 1e-6)
        assert row.num_params == h.shape[0]
    back = type(res).from_hdf5(out)
    np.testing.assert_array_equal(back.eigenvalues, res.eigenvalues)
    np.testing.assert_array_equal(back.trace_samples, res.trace_samples)
    assert [r.ref for r in back.rows] == [r.ref for r in res.rows] and back.config == res.config
    ds = xarray.open_dataset(out, engine="h5netcdf")
    assert ds["eigenvalues"].dims == ("checkpoint", "k") and ds["density"].shape == res.density.shape
    ds.close()


def test_cli_prints_the_table_and_refuses_bad_input_in_one_line(two_runs, tmp_path, monkeypatch, capsys):
    import json

    from cli import main as cli_main

    monkeypatch.chdir(tmp_path)

    def run(*args):
        with pytest.raises(SystemExit) as exc:
            cli_main.main(["--root", str(two_runs), "hessian", *args])
        captured = capsys.readouterr()
        return exc.value.code, captured.out, captured.err

    code, out, _ = run("plain@last", "--top-k", "2", "--subset", "30", "--no-figure", "--json", "-o", "a.h5")
    rows = json.loads(out)["rows"]
    assert code == 0 and rows[0]["ref"] == "plain@last" and rows[0]["lambda_1"] >= rows[0]["lambda_2"]
    code, _, err = run("plain@last", "--top-k", "70", "--lanczos-steps", "80", "--no-figure")
    assert code == 2 and err == "error: --top-k 70 exceeds the model's 68 free parameters\n"
    code, _, err = run("plain@last", "--top-k", "0", "--no-figure")
    assert code == 2 and "nothing to compute" in err and err.count("\n") == 1
