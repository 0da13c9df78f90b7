"""Random directions, filter normalisation, cosines, trajectory PCA and `landscape directions` (Watson et al. Fig. 4).

References are independent: closed-form quadratic profiles, numpy pairwise cosines, sklearn's PCA, per-filter
norms recomputed from the model, and the evaluator's ``plain`` method at explicit points.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import run_cli
from torch import nn

from landscape.analyze.directions import DirectionsResult, random_profiles, scaled_directions
from landscape.analyze.specs import DirectionsConfig
from landscape.directions import (
    max_abs_cosine,
    normalize_direction,
    random_direction,
    random_directions,
    trajectory_pca,
)
from landscape.errors import UsageError
from landscape.evaluate import evaluate
from landscape.params import ParamSpace

# ------------------------------------------------------------------------------------ quadratic model


class Quadratic(nn.Module):
    """Mean cross-entropy equals ``0.5 (w - w*)^T H (w - w*)`` exactly (every example has label 1).

    Logits ``[log(expm1(q)), 0]``: ``CE = log(exp(log(expm1 q)) + 1) = q``.
    """

    def __init__(self, h: torch.Tensor, w_star: torch.Tensor, w0: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(w0.clone())
        self.register_buffer("h", h)
        self.register_buffer("w_star", w_star)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.w - self.w_star
        q = 0.5 * d @ (self.h @ d)
        row = torch.stack([torch.log(torch.expm1(q)), torch.zeros_like(q)])
        return row.expand(x.shape[0], 2)


def quadratic_problem(dim: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
    eig = torch.linspace(0.1, 3.0, dim, dtype=torch.float64)
    h = q @ torch.diag(eig) @ q.T
    w_star = torch.randn(dim, generator=g, dtype=torch.float64)
    w_a = w_star + 0.3 * torch.randn(dim, generator=g, dtype=torch.float64)
    w_b = w_star + 0.3 * torch.randn(dim, generator=g, dtype=torch.float64)
    model = Quadratic(h, w_star, w_a).double()
    x = torch.zeros(4, 1, dtype=torch.float64)
    y = torch.ones(4, dtype=torch.int64)
    return model, h, w_star, w_a, w_b, x, y


def closed_form(h, w_star, w, u, s):
    """``L(w + s u)`` for unit ``u``: ``q(w) + s g.u + 0.5 s^2 u^T H u``."""
    d = w - w_star
    q0 = 0.5 * d @ h @ d
    return (q0 + s * ((h @ d) @ u) + 0.5 * s**2 * (u @ h @ u)).numpy()


def test_quadratic_profiles_equal_closed_form():
    model, h, w_star, w_a, w_b, x, y = quadratic_problem()
    result = random_profiles(model, w_a, x, y, toward=w_b, directions=7, points=9, distance="auto", seed=3)
    dist = float(torch.linalg.vector_norm(w_b - w_a))
    assert result.distance == pytest.approx(dist, rel=1e-15)
    s = torch.as_tensor(result.t, dtype=torch.float64) * dist
    space = ParamSpace.from_model(model)
    dirs = scaled_directions(w_a, space, range(7), result.config, dist)
    for i in range(7):
        u = dirs[i] / torch.linalg.vector_norm(dirs[i])
        np.testing.assert_allclose(result.direction_loss[i], closed_form(h, w_star, w_a, u, s), rtol=1e-10, atol=1e-12)
    u_b = (w_b - w_a) / dist
    np.testing.assert_allclose(result.toward_loss, closed_form(h, w_star, w_a, u_b, s), rtol=1e-10, atol=1e-12)
    # the target's own loss at the end of the path, and rises as differences of the profile ends
    assert result.toward_loss[-1] == pytest.approx(float(0.5 * (w_b - w_star) @ h @ (w_b - w_star)), rel=1e-10)
    np.testing.assert_allclose(result.rises, result.direction_loss[:, -1] - result.direction_loss[:, 0])


def test_quadratic_fixed_distance_and_normalisations():
    model, h, w_star, w_a, w_b, x, y = quadratic_problem(seed=1)
    result = random_profiles(model, w_a, x, y, toward=w_b, directions=3, points=5, distance=2.5, seed=0)
    s = torch.as_tensor(result.t) * 2.5
    u_b = (w_b - w_a) / torch.linalg.vector_norm(w_b - w_a)
    np.testing.assert_allclose(result.toward_loss, closed_form(h, w_star, w_a, u_b, s), rtol=1e-10)
    # the only tensor is 1-D: Li et al.'s default zeroes it, which leaves no direction at all
    with pytest.raises(UsageError, match="zero"):
        random_profiles(model, w_a, x, y, directions=2, points=3, distance=1.0, normalize="filter")
    kept = random_profiles(model, w_a, x, y, directions=2, points=3, distance=1.0, normalize="filter", biasbn="random")
    assert np.all(np.isfinite(kept.direction_loss))
    with pytest.raises(UsageError, match="needs toward"):
        random_profiles(model, w_a, x, y, directions=2, points=3)


# ------------------------------------------------------------------------------------ directions


def test_max_abs_cos_1e5_dims_100_directions_matches_numpy():
    torch.manual_seed(0)
    model = nn.Linear(1000, 100)  # 100,100 parameters
    space = ParamSpace.from_model(model)
    assert space.dim > 1e5
    theta = space.flatten(model)
    x, y = torch.randn(8, 1000), torch.randint(0, 100, (8,))
    result = random_profiles(model, theta, x, y, directions=100, points=2, distance=1.0, seed=7)
    dirs = scaled_directions(theta, space, range(100), result.config, 1.0).double().numpy()
    norms = np.sqrt((dirs * dirs).sum(axis=1))
    direct = max(abs(float(np.dot(dirs[i], dirs[j]))) / (norms[i] * norms[j])
                 for i in range(100) for j in range(i + 1, 100))
    assert result.max_abs_cos == pytest.approx(direct, rel=1e-9)
    assert result.max_abs_cos < 0.03  # ~ sqrt(2 log(4950) / 1e5) = 0.013 for independent Gaussians
    assert max_abs_cosine(torch.as_tensor(dirs[:1])) != max_abs_cosine(torch.as_tensor(dirs[:1]))  # NaN for one


def lenet_digits():
    from landscape.data import load_dataset
    from landscape.models import build_model

    data = load_dataset("digits", subset=300)
    torch.manual_seed(0)
    model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    return model, data


def test_filter_normalised_directions_have_the_models_filter_norms():
    model, _ = lenet_digits()
    space = ParamSpace.from_model(model)
    theta = space.flatten(model)
    params = dict(model.named_parameters())
    dirs = random_directions(theta, space, 3, seed=5, normalize="filter")
    for row in dirs:
        parts = space.unflatten(row)
        for name, w in params.items():
            d = parts[name]
            if w.dim() <= 1:
                assert torch.count_nonzero(d) == 0, name  # Li et al.'s ignore='biasbn'
            else:
                np.testing.assert_allclose(d.reshape(w.shape[0], -1).double().norm(dim=1),
                                           w.detach().reshape(w.shape[0], -1).double().norm(dim=1), rtol=1e-5)
    # a direction does not depend on which others are drawn with it
    assert torch.equal(random_directions(theta, space, [2], seed=5, normalize="filter")[0], dirs[2])
    copy = random_directions(theta, space, [0], seed=5, normalize="filter", biasbn="copy")[0]
    layer = random_directions(theta, space, [0], seed=5, normalize="layer", biasbn="random")[0]
    for name, w in params.items():
        if w.dim() <= 1:
            assert torch.equal(space.unflatten(copy)[name], w.detach())
        assert float(space.unflatten(layer)[name].double().norm()) == pytest.approx(float(w.detach().double().norm()),
                                                                              rel=1e-5)
    raw = random_direction(space, 5, 0)
    assert torch.equal(normalize_direction(raw, theta, space, normalize="none"), raw)
    with pytest.raises(UsageError):
        normalize_direction(raw, theta, space, normalize="weight")


def test_straight_line_trajectory_is_one_principal_axis():
    g = torch.Generator().manual_seed(0)
    d = 5000
    base, v = torch.randn(d, generator=g, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
    s = torch.tensor([0.0, 0.3, 0.35, 1.1, 2.0, 2.2, 3.0], dtype=torch.float64)
    points = base + s[:, None] * v
    pca = trajectory_pca(points, points[-1])
    assert pca.explained_variance_ratio[0] == pytest.approx(1.0, abs=1e-12)
    assert pca.explained_variance_ratio[1] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(pca.coords[:, 1], 0.0, atol=1e-9)
    np.testing.assert_allclose(pca.coords[:, 0], ((s - s[-1]) * v.norm()).numpy(), rtol=1e-10, atol=1e-9)
    assert abs(float(pca.components[0] @ v / v.norm())) == pytest.approx(1.0, abs=1e-12)
    assert float(pca.components[0] @ pca.components[1]) == pytest.approx(0.0, abs=1e-12)
    assert pca.coords[0, 0] < 0  # the path runs toward +x


def test_trajectory_pca_matches_sklearn():
    from sklearn.decomposition import PCA

    g = torch.Generator().manual_seed(1)
    points = torch.cumsum(torch.randn(9, 300, generator=g, dtype=torch.float64), dim=0)
    pca = trajectory_pca(points, points[-1])
    ref = PCA(n_components=2).fit((points - points[-1]).numpy())
    np.testing.assert_allclose(pca.explained_variance_ratio, ref.explained_variance_ratio_, rtol=1e-10)
    for j in range(2):
        assert abs(float(pca.components[j] @ torch.as_tensor(ref.components_[j]))) == pytest.approx(1.0, abs=1e-10)


def test_rays_match_plain_evaluation_at_explicit_points():
    model, data = lenet_digits()
    x, y = data.split("train")
    space = ParamSpace.from_model(model)
    theta = space.flatten(model)
    result = random_profiles(model, theta, x, y, directions=4, points=4, distance=3.0, normalize="filter")
    dirs = scaled_directions(theta, space, range(4), result.config, 3.0)
    pts = torch.stack([theta + float(t) * dirs[i] for i in range(4) for t in result.t])
    ref = evaluate(model, x, y, pts, method="plain")
    np.testing.assert_allclose(result.direction_loss, ref.loss.numpy().reshape(4, 4), rtol=2e-5)
    np.testing.assert_allclose(result.direction_acc, ref.acc.numpy().reshape(4, 4), atol=1 / len(y) + 1e-12)


# ----------------------------------------------------------------------------- siblings on digits


@pytest.fixture(scope="module")
def siblings(tmp_path_factory):
    """Two Phase-2 SGD copies from one Phase-1 SGD checkpoint (landscape phases), lenet on digits."""
    from landscape.api.training import PhasesConfig, TrainConfig, phases

    root = tmp_path_factory.mktemp("store")
    base = TrainConfig(model="lenet", data="digits", subset=300, epochs=12, lr=0.03, momentum=0.9, batch_size=16,
                       checkpoint_every="none", seed=0)
    phases(PhasesConfig(base=base, k=6, copies=2, phase1=("sgd",), phase2=("sgd",), group="g"), root=root,
           progress=False)
    return root


def test_sibling_rise_far_below_random_rise(siblings, tmp_path, capsys):
    out = tmp_path / "d.h5"
    code, stdout, err = run_cli("--root", siblings, "directions", "g-sgd-sgd-0", "--toward", "g-sgd-sgd-1",
                                "--directions", "16", "--points", "5", "--normalize", "filter", "-o", out, "--json", capsys=capsys)
    assert code == 0, err
    summary = json.loads(stdout)
    result = DirectionsResult.from_hdf5(out)
    assert result.direction_loss.shape == (16, 5) and result.toward_loss.shape == (5,)
    assert result.distance == pytest.approx(result.toward_distance)
    # Watson et al. Sec. 4.1.2: flat toward the sibling, steep along random directions at the same distance.
    # (Filter-normalised as Li et al.: on a 21k-parameter LeNet an isotropic direction puts ~90 % of its length
    # into the robust fully connected layers and rises several times less.)
    median = float(np.median(result.rises))
    assert median > 0.1
    assert result.toward_rise < 0.5 * median
    assert summary["fraction_above_toward"] >= 0.9
    assert [i.ref for i in result.inputs] == ["g-sgd-sgd-0", "g-sgd-sgd-1"]
    assert all(len(i.sha256) == 64 for i in result.inputs)
    assert {p.suffix for p in map(__import__("pathlib").Path, summary["figures"])} == {".png", ".pdf"}
    assert result.config == DirectionsConfig(directions=16, points=5, normalize="filter")


def test_worker_chunks_give_the_same_arrays(siblings):
    """The worker job (run here in-process: spawning is covered by the surface test) regenerates its directions."""
    from landscape.api import loss_surfaces as api
    from landscape.store import Store

    a = Store(siblings).load("g-sgd-sgd-0")
    config = DirectionsConfig(directions=5, points=3, distance=4.0, subset=200)
    from landscape.api.execution import set_worker_state, worker_state

    set_worker_state(api._init_worker(api._Payload(a.model_spec, a.state_dict, a.data_spec, None, False, config)))
    w = worker_state()
    x, y = w["data"]["train"]
    serial = random_profiles(w["model"], w["theta"], x, y, config=config)
    chunked = random_profiles(w["model"], w["theta"], x, y, config=config, workers=2,
                              chunk_runner=lambda chunks, d, steps: (api._direction_job(c, d, steps) for c in chunks))
    np.testing.assert_array_equal(serial.direction_loss, chunked.direction_loss)
    np.testing.assert_array_equal(serial.direction_acc, chunked.direction_acc)


# ----------------------------------------------------------------------------------------- CLI errors


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["directions", "g-sgd-sgd-0", "--distance", "auto"], 2, "--distance auto needs --toward"),
        (["directions", "g-sgd-sgd-0", "--distance", "-3", "--toward", "g-sgd-sgd-1"], 2, "--distance"),
        (["surface", "g-sgd-sgd-0", "--grid", "25by25"], 2, "--grid"),
        (["surface", "g-sgd-sgd-0", "--range", "1:-1"], 2, "--range"),
        (["surface", "g-sgd-sgd-0", "--plane", "pca:"], 2, "--plane"),
        (["directions", "no-such-run", "--distance", "1"], 1, "no run 'no-such-run'"),
        (["surface", "g-sgd-sgd-0", "--plane", "g-sgd-sgd-1,missing@last"], 1, "no run 'missing'"),
    ],
)
def test_cli_errors_are_one_line(siblings, capsys, args, code, message):
    got, out, err = run_cli("--root", siblings, *args, capsys=capsys)
    assert got == code
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], err


def test_distance_parsing():
    assert DirectionsConfig(distance="15").distance == 15.0
    assert DirectionsConfig(distance="AUTO").distance == "auto"
    for bad in ("x", "0", "nan", -1):
        with pytest.raises(UsageError):
            DirectionsConfig(distance=bad)
    assert math.isnan(DirectionsResult(t=np.zeros(2), distance=1.0, direction_loss=np.zeros((1, 2)),
                                       direction_acc=np.zeros((1, 2)), max_abs_cos=math.nan).toward_rise)
