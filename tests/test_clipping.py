"""Clipping ratio R, clipped mean and the Thm. 3.2 bound (Watson et al. 2023 Sec. 3.1; landscape clipping)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from landscape.analyze.clipping import (
    ClipMoments,
    ClippingResult,
    clipping_geometry,
    clipping_quantities,
    layer_max_norms_for,
)
from landscape.models import build_model


def brute_force(G: np.ndarray, C: float) -> dict:
    """Watson Def. 3.1 / eqs. (2)-(3) straight from the per-sample gradient matrix (first form of eq. (1))."""
    g = G.mean(0)
    R = np.mean(np.sum((G - g) ** 2, axis=1)) / (g @ g)
    norms = np.linalg.norm(G, axis=1)
    c = np.mean(G * np.minimum(1.0, C / norms)[:, None], axis=0)
    proj = c @ g / np.linalg.norm(g)
    c_norm = np.linalg.norm(c)
    return {"R": R, "c": c, "g": g, "projection": proj, "norms": norms,
            "cos": proj / c_norm if c_norm > 0 else np.nan, "clipped": np.mean(norms > C)}


# ------------------------------------------------------------------------------------------ pure math


@pytest.mark.parametrize("seed", range(5))
def test_quantities_equal_brute_force_on_random_gradients(seed):
    rng = np.random.default_rng(seed)
    n, d, C = 40, 30, 0.8
    G = rng.normal(0.3, 1.0, (n, d)) * rng.exponential(1.0, (n, 1))
    ref = brute_force(G, C)
    q = clipping_quantities(ref["norms"], ref["g"], ref["c"], C)
    assert q.R == pytest.approx(ref["R"], rel=1e-10)
    assert q.projection == pytest.approx(ref["projection"], rel=1e-12)
    assert q.bound == pytest.approx(C * (1 - ref["R"] / 2), rel=1e-10)
    assert q.cos_clipped_mean == pytest.approx(ref["cos"], rel=1e-12)
    assert q.fraction_clipped == pytest.approx(ref["clipped"])
    assert q.assumption_held == bool(np.all(ref["norms"] >= C))


@pytest.mark.parametrize("style", ["flat", "layerwise"])
def test_moments_add_up_exactly_over_chunks_and_layers(style):
    """Chunked per-layer moments give the same R, c, projection as the whole gradient matrix."""
    rng = np.random.default_rng(1)
    n, sizes, C = 50, [7, 3, 12], 1.5
    G = rng.normal(0.2, 1.0, (n, sum(sizes)))
    layers = np.split(G, np.cumsum(sizes)[:-1], axis=1)
    thresholds = layer_max_norms_for(C, len(sizes), style)
    layer_norms = [np.linalg.norm(block, axis=1) for block in layers]
    if style == "flat":
        w = [np.minimum(1, C / np.linalg.norm(G, axis=1))] * len(sizes)
    else:
        w = [np.minimum(1, t / nl) for t, nl in zip(thresholds, layer_norms, strict=True)]
    total = None
    for part in np.array_split(np.arange(n), 4):
        m = ClipMoments.from_parts(
            [nl[part] for nl in layer_norms], [blk[part].sum(0) for blk in layers],
            [(blk[part] * wl[part, None]).sum(0) for blk, wl in zip(layers, w, strict=True)],
            max_grad_norm=C, layer_max_norms=thresholds, clip_style=style,
        )
        total = m if total is None else total + m
    stats = total.stats(max_grad_norm=C, layer_max_norms=thresholds, clip_style=style)
    g = G.mean(0)
    c = np.concatenate([(blk * wl[:, None]).mean(0) for blk, wl in zip(layers, w, strict=True)])
    assert stats.R == pytest.approx(np.mean(np.sum((G - g) ** 2, 1)) / (g @ g), rel=1e-10)
    assert stats.projection == pytest.approx(c @ g / np.linalg.norm(g), rel=1e-12)
    for k, blk in enumerate(layers):
        gl = blk.mean(0)
        assert stats.layer_R[k] == pytest.approx(np.mean(np.sum((blk - gl) ** 2, 1)) / (gl @ gl), rel=1e-10)
    if style == "layerwise":  # per-layer bounds combine into the flat one
        weights = np.array([np.linalg.norm(b.mean(0)) for b in layers]) / np.linalg.norm(g)
        assert stats.bound == pytest.approx(np.sum(weights * thresholds * (1 - stats.layer_R / 2)), rel=1e-10)


def test_layerwise_bound_ignores_a_layer_with_zero_mean_gradient():
    """A pruned/unused layer (mean gradient 0) has weight 0 in the combined bound, not 0 * -inf = NaN."""
    rng = np.random.default_rng(3)
    n, C = 20, 1.0
    live = rng.normal(0.5, 1.0, (n, 6))
    dead = np.zeros((n, 4))
    layers = [live, dead]
    thresholds = layer_max_norms_for(C, 2, "layerwise")
    layer_norms = [np.linalg.norm(b, axis=1) for b in layers]
    w = [np.minimum(1, t / np.maximum(nl, 1e-300)) for t, nl in zip(thresholds, layer_norms, strict=True)]
    m = ClipMoments.from_parts(layer_norms, [b.sum(0) for b in layers],
                               [(b * wl[:, None]).sum(0) for b, wl in zip(layers, w, strict=True)],
                               max_grad_norm=C, layer_max_norms=thresholds, clip_style="layerwise")
    stats = m.stats(max_grad_norm=C, layer_max_norms=thresholds, clip_style="layerwise")
    g = live.mean(0)
    R_live = np.mean(np.sum((live - g) ** 2, 1)) / (g @ g)
    assert stats.bound == pytest.approx(thresholds[0] * (1 - R_live / 2), rel=1e-10)


@st.composite
def theorem_configurations(draw):
    """Per-sample gradients satisfying Thm. 3.2's assumptions: g_bar != 0, every ||g_i|| >= C > 0."""
    n = draw(st.integers(1, 40))
    d = draw(st.integers(1, 12))
    C = draw(st.floats(1e-3, 1e3))
    mean_scale = draw(st.floats(0.0, 5.0))
    spread = draw(st.floats(1e-3, 10.0))
    heavy = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=d)
    noise = rng.standard_t(2, size=(n, d)) if heavy else rng.normal(size=(n, d))
    G = mean_scale * direction + spread * noise
    norms = np.linalg.norm(G, axis=1)
    norms[norms == 0] = 1.0
    target = C * (1 + 1e-9 + rng.exponential(draw(st.floats(0.0, 3.0)), n))  # margin for rounding
    stretch = np.maximum(1.0, target / norms)
    return G * stretch[:, None], C


@settings(max_examples=1000, deadline=None)
@given(theorem_configurations())
def test_theorem_3_2_flags_are_exact_on_configurations_satisfying_its_assumptions(config):
    """On 1,000 configurations meeting every stated assumption the report says, correctly, whether the bound held.

    It does NOT always hold: Thm. 3.2 as stated is false (see the counterexamples below), so the property
    checked here is that ``assumption_held`` is set and ``bound_held`` equals the brute-force inequality.
    """
    G, C = config
    assume(np.linalg.norm(G.mean(0)) > 1e-9 * np.abs(G).max())  # g_bar != 0 (numerically)
    ref = brute_force(G, C)
    q = clipping_quantities(ref["norms"], ref["g"], ref["c"], C)
    assert q.assumption_held
    margin = ref["projection"] - C * (1 - ref["R"] / 2)
    if abs(margin) > 1e-7 * C:
        assert q.bound_held == (margin > 0)


@st.composite
def equal_norm_configurations(draw):
    """Assumptions of Thm. 3.2 with all ||g_i|| equal (= r >= C): here the bound is a theorem,
    since with q = ||g_bar||/r it reads q >= 3/2 - 1/(2 q^2), i.e. (q - 1)^2 (q + 1/2) >= 0."""
    n = draw(st.integers(1, 40))
    d = draw(st.integers(1, 12))
    C = draw(st.floats(1e-3, 1e3))
    r = C * (1 + 1e-9 + draw(st.floats(0.0, 10.0)))  # margin for rounding
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    G = draw(st.floats(0.0, 5.0)) * rng.normal(size=d) + rng.normal(size=(n, d))
    G = G / np.linalg.norm(G, axis=1, keepdims=True) * r
    return G, C


@settings(max_examples=1000, deadline=None)
@given(equal_norm_configurations())
def test_theorem_3_2_bound_holds_when_per_sample_norms_are_equal(config):
    G, C = config
    assume(np.linalg.norm(G.mean(0)) > 1e-6 * np.abs(G).max())
    ref = brute_force(G, C)
    q = clipping_quantities(ref["norms"], ref["g"], ref["c"], C)
    assert q.assumption_held
    assert q.projection >= C * (1 - q.R / 2) - 1e-9 * C * max(1.0, q.R)
    assert q.bound_held


@pytest.mark.parametrize(
    ("G", "C"),
    [
        # d = 1: one gradient against the mean. c = 0, R = (11/9)^2, bound = 1 - 121/162 = 0.2531 > 0.
        (np.array([[10.0], [-1.0]]), 1.0),
        # every g_i has a positive component along g_bar (found by numerical search), bound off by 0.08.
        (np.array([[2.71485666, 0.28869614, -0.00711269], [2.68845536, 0.23664215, 0.13366185],
                   [0.01057564, -0.20857448, 0.0499392]]), 0.2),
    ],
)
def test_theorem_3_2_counterexamples_are_reported(G, C):
    """Watson Thm. 3.2 is false as stated: these satisfy g_bar != 0, g_i != 0, ||g_i|| >= C, yet
    c . g_bar/||g_bar|| < C (1 - R/2). (In the proof, f >= 3 fails: f(10, -1; 0, 0) = 2.494.)"""
    ref = brute_force(G, C)
    assert np.all(ref["norms"] >= C)
    q = clipping_quantities(ref["norms"], ref["g"], ref["c"], C)
    assert q.assumption_held
    assert q.projection < q.bound - 0.05 * C
    assert not q.bound_held


def test_failed_assumption_is_flagged_and_the_bound_can_fail():
    """All gradients small (||g_i|| < C) and aligned: nothing is clipped, R = 0, projection ||g|| < C = bound."""
    C = 1.0
    G = np.tile([0.1, 0.2], (10, 1))
    ref = brute_force(G, C)
    q = clipping_quantities(ref["norms"], ref["g"], ref["c"], C)
    assert not q.assumption_held
    assert q.R == pytest.approx(0.0, abs=1e-12)
    assert q.projection == pytest.approx(np.linalg.norm([0.1, 0.2]))
    assert not q.bound_held
    assert q.fraction_clipped == 0.0


# ----------------------------------------------------------------------------------- on a real model


def per_sample_matrix(model, x, y, masks=None) -> np.ndarray:
    """Naive loop: one backward per example (independent of the engine)."""
    rows = []
    for i in range(len(y)):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum").backward()
        rows.append(torch.cat([
            (p.grad * masks[n] if masks and n in masks else p.grad).reshape(-1)
            for n, p in model.named_parameters()
        ]).detach().numpy().copy())
    model.zero_grad()
    return np.stack(rows)


@pytest.fixture(scope="module")
def small_model():
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(6,), num_classes=3, widths=[5]).double()
    x = torch.randn(45, 6, dtype=torch.float64)
    y = torch.randint(0, 3, (45,))
    return model, x, y


@pytest.mark.parametrize("style", ["flat", "layerwise"])
def test_analyzer_equals_naive_per_sample_gradients(small_model, style):
    model, x, y = small_model
    C, B, K = 0.4, 12, 3
    res = clipping_geometry(model, x, y, max_grad_norm=C, batch_size=B, batches=K, clip_style=style, seed=3,
                            chunk=5)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(3))[: B * K]
    G = per_sample_matrix(model, x[perm], y[perm])
    sizes = [p.numel() for p in model.parameters()]
    blocks = np.split(G, np.cumsum(sizes)[:-1], axis=1)
    if style == "flat":
        ref = brute_force(G, C)
        c = ref["c"]
    else:
        t = C / math.sqrt(len(sizes))
        c = np.concatenate([(b * (t / np.maximum(np.linalg.norm(b, axis=1), t))[:, None]).mean(0) for b in blocks])
    g = G.mean(0)
    total = res.rows[0].total
    assert total.R == pytest.approx(np.mean(np.sum((G - g) ** 2, 1)) / (g @ g), rel=1e-8)
    assert total.projection == pytest.approx(c @ g / np.linalg.norm(g), rel=1e-8)
    assert total.clipped_mean_norm == pytest.approx(np.linalg.norm(c), rel=1e-8)
    assert total.n == B * K
    if style == "flat":
        assert total.fraction_clipped == pytest.approx(np.mean(np.linalg.norm(G, axis=1) > C))
    else:  # (sample, layer) pairs, as training's Privatizer counts them
        t = C / math.sqrt(len(sizes))
        assert total.fraction_clipped == pytest.approx(np.mean([np.linalg.norm(b, axis=1) > t for b in blocks]))
    for k in range(K):  # each batch on its own
        Gk = G[k * B:(k + 1) * B]
        gk = Gk.mean(0)
        assert res.rows[0].batches[k].R == pytest.approx(np.mean(np.sum((Gk - gk) ** 2, 1)) / (gk @ gk), rel=1e-8)


def test_analyzer_applies_pruning_masks(small_model):
    model, x, y = small_model
    names = [n for n, _ in model.named_parameters()]
    gen = torch.Generator().manual_seed(0)
    masks = {names[0]: (torch.rand(model.get_parameter(names[0]).shape, generator=gen) > 0.5).double()}
    res = clipping_geometry(model, x, y, max_grad_norm=0.3, batch_size=45, masks=masks)
    perm = torch.randperm(45, generator=torch.Generator().manual_seed(0))
    ref = brute_force(per_sample_matrix(model, x[perm], y[perm], masks), 0.3)
    assert res.rows[0].total.R == pytest.approx(ref["R"], rel=1e-8)
    assert res.rows[0].total.projection == pytest.approx(ref["projection"], rel=1e-8)


def test_result_round_trip(small_model, tmp_path):
    model, x, y = small_model
    res = clipping_geometry(model, x, y, max_grad_norm=0.5, batch_size=10, batches=2, ref="m@last", epoch=2.0)
    path = res.to_hdf5(tmp_path / "c.h5")
    back = ClippingResult.from_hdf5(path)
    assert back.rows[0].total.R == pytest.approx(res.rows[0].total.R)
    assert back.rows[0].batches[1].projection == pytest.approx(res.rows[0].batches[1].projection)
    np.testing.assert_allclose(back.rows[0].total.layer_R, res.rows[0].total.layer_R)
    from landscape.results import read_result

    attrs = read_result(path).attrs
    for key in ("R", "projection", "bound", "assumption_held", "bound_held", "fraction_clipped", "cos_clipped_mean"):
        assert key in attrs


def test_too_few_examples_is_a_usage_error(small_model):
    from landscape.errors import UsageError

    model, x, y = small_model
    with pytest.raises(UsageError, match="need 100 examples"):
        clipping_geometry(model, x, y, max_grad_norm=1.0, batch_size=50, batches=2)


# --------------------------------------------------------------- Watson Fig. 11 through the store + CLI


@pytest.fixture(scope="module")
def trained_store(tmp_path_factory):
    from landscape.train.config import TrainConfig
    from landscape.train.loop import train

    root = tmp_path_factory.mktemp("store")
    cfg = TrainConfig(
        model="two-layer-linear", model_kwargs={"hidden": 8}, data="gaussian-signal",
        data_kwargs={"ds": 5, "dn": 45, "n": 200, "n_test": 50}, epochs=4, lr=0.1, momentum=0.0,
        batch_size=50, seed=0, run="gs", optimizer="sgd", checkpoint_every="2e",
    )
    train(cfg, root=root, progress=False)
    return root


def test_pruning_lowers_R_gaussian_signal_two_layer_linear(trained_store, tmp_path):
    """Watson Fig. 11: the more (noise-part) weights pruned, the lower R at the retrained checkpoint."""
    from landscape.api import clipping

    out = tmp_path / "prune.h5"
    res = clipping("gs@last", root=trained_store, prune_levels=[0.0, 0.5, 0.9], max_grad_norm=0.1,
                   batch_size=200, output=out)
    r = res.column("R")
    assert np.all(np.diff(r) < 0), r
    assert r[-1] < 0.5 * r[0]
    assert out.is_file() and out.with_suffix(".png").is_file() and out.with_suffix(".pdf").is_file()
    back = ClippingResult.from_hdf5(out)
    np.testing.assert_allclose([row.prune_level for row in back.rows], [0.0, 0.5, 0.9])


def _cli(monkeypatch, capsys, root, *args):
    from cli import main as cli_main

    with pytest.raises(SystemExit) as exc:
        cli_main.main(["--root", str(root), *args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_cli_over_a_run_gives_one_row_per_checkpoint(trained_store, tmp_path, monkeypatch, capsys):
    import json

    out = tmp_path / "run.h5"
    code, stdout, _ = _cli(monkeypatch, capsys, trained_store, "clipping", "gs", "--max-grad-norm", "0.1", "--batch-size", "50",
                           "--batches", "2", "--workers", "2", "-o", str(out), "--json", "--no-figure")
    assert code == 0
    rows = json.loads(stdout)["rows"]
    assert [r["epoch"] for r in rows] == [0.0, 2.0, 4.0]
    single = ClippingResult.from_hdf5(out)
    code, _, _ = _cli(monkeypatch, capsys, trained_store, "clipping", "gs@epoch=2", "--max-grad-norm", "0.1", "--batch-size",
                      "50", "--batches", "2", "-o", str(tmp_path / "one.h5"), "--no-figure")
    assert code == 0
    one = ClippingResult.from_hdf5(tmp_path / "one.h5")
    assert one.rows[0].total.R == pytest.approx(single.rows[1].total.R, rel=1e-12)  # workers change nothing


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["clipping", "nope", "-o", "x.h5"], 1, "no run 'nope'"),
        (["clipping", "gs", "--prune-levels", "a,b"], 2, "comma-separated"),
        (["clipping", "gs", "--max-grad-norm", "-1"], 2, "--max-grad-norm"),
        (["clipping", "gs", "--batch-size", "5000"], 2, "lower --batch-size"),
    ],
)
def test_cli_bad_input_is_one_line(trained_store, tmp_path, monkeypatch, capsys, args, code, message):
    monkeypatch.chdir(tmp_path)
    got, _, err = _cli(monkeypatch, capsys, trained_store, *args)
    assert got == code
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("style", ["flat", "layerwise"])
def test_per_layer_counts_and_flags_only_where_layers_are_clipped(small_model, style, monkeypatch, tmp_path):
    """Issue 14 item 5: under flat clipping no layer is clipped on its own, so no per-layer fraction clipped
    (NaN) and no per-layer assumption (False = not evaluated); per-layer R stays. Under layerwise clipping both
    equal the naive per-sample counts against C_l."""
    model, x, y = small_model
    perm = torch.randperm(45, generator=torch.Generator().manual_seed(0))
    G = per_sample_matrix(model, x[perm], y[perm])
    C = float(np.median(np.linalg.norm(G, axis=1)))  # some samples clipped, some not
    res = clipping_geometry(model, x, y, max_grad_norm=C, batch_size=45, clip_style=style, chunk=7)
    sizes = [p.numel() for p in model.parameters()]
    blocks = np.split(G, np.cumsum(sizes)[:-1], axis=1)
    t = res.rows[0].total
    for k, b in enumerate(blocks):
        gl = b.mean(0)
        assert t.layer_R[k] == pytest.approx(np.mean(np.sum((b - gl) ** 2, 1)) / (gl @ gl), rel=1e-8)
    if style == "flat":
        assert np.isnan(t.layer_fraction_clipped).all() and np.isnan(t.layer_bound).all()
        assert not np.asarray(t.layer_assumption_held).any()
        assert t.fraction_clipped == pytest.approx(np.mean(np.linalg.norm(G, axis=1) > C))  # flat count stays
    else:
        cl = C / math.sqrt(len(sizes))
        norms = [np.linalg.norm(b, axis=1) for b in blocks]
        np.testing.assert_allclose(t.layer_fraction_clipped, [np.mean(nl > cl) for nl in norms])
        np.testing.assert_array_equal(t.layer_assumption_held, [nl.min() >= cl for nl in norms])
    # the single-checkpoint figure says which per-layer numbers it shows
    import landscape.plots.clipping as plots

    seen = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, stem: seen.append(fig) or [])
    plots.plot_clipping(res, tmp_path / "c")
    axes = seen[0].axes
    texts = " ".join(ax.get_title() + " " + ax.get_ylabel() for ax in axes)
    if style == "flat":
        assert "per-layer R only" in texts and "fraction clipped per layer" not in texts
    else:
        assert "fraction clipped per layer" in texts
