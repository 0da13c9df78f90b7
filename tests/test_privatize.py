"""Privatizer: clipping functions, flat/layerwise clipping, noise scale, masks, sparsification, smoothing."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from persample_reference import LoopEngine
from torch import nn

from landscape.clip import CLIP_FUNCTIONS, clip_factors
from landscape.errors import IncompatibleError, UsageError
from landscape.train.privatize import PrivacyConfig, Privatizer
from landscape.train.smoothing import laplacian_smooth
from landscape.train.sparsify import SparsifySchedule


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def batch(n: int = 12, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def engines(model):
    """The reference loop, and the real engine when it exists."""
    out = [LoopEngine(model)]
    try:
        from landscape.persample import PerSampleEngine
    except ImportError:
        return out
    out.append(PerSampleEngine(model))
    return out


def naive_per_sample(model, x, y):
    names = [n for n, _ in model.named_parameters()]
    rows = []
    for i in range(x.shape[0]):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1], reduction="sum").backward()
        rows.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    model.zero_grad()
    return names, rows


def grads_of(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_clip_functions_norms():
    norms = torch.tensor([0.1, 0.5, 1.0, 2.0, 10.0], dtype=torch.float64)
    c = 1.0
    assert torch.allclose(
        clip_factors(norms, c, "abadi") * norms, torch.minimum(norms, torch.tensor(c).double())
    )
    assert torch.allclose(clip_factors(norms, c, "automatic") * norms, c * norms / (norms + 0.01))
    assert torch.allclose(clip_factors(norms, c, "normalize") * norms, torch.full_like(norms, c))
    assert torch.equal(clip_factors(norms, c, "global"), torch.tensor([1, 1, 1, 0, 0], dtype=torch.float64))
    assert set(CLIP_FUNCTIONS) == {"abadi", "automatic", "normalize", "global"}
    with pytest.raises(UsageError):
        clip_factors(norms, c, "nope")


@pytest.mark.parametrize("fn", ["abadi", "automatic", "normalize", "global"])
def test_flat_clipped_sum_matches_naive(fn):
    model = small_model()
    x, y = batch()
    names, rows = naive_per_sample(model, x, y)
    c = 0.3
    for engine in engines(model):
        priv = Privatizer(
            model,
            PrivacyConfig("clip-only", max_grad_norm=c, clip_fn=fn),
            expected_batch_size=10.0,
            generator=torch.Generator().manual_seed(0),
            engine=engine,
        )
        stats = priv.compute_gradients(x, y)
        norms = torch.stack([torch.cat([r[n].flatten() for n in names]).norm() for r in rows])
        f = clip_factors(norms, c, fn)
        for n in names:
            want = sum(f[i] * rows[i][n] for i in range(len(rows))) / 10.0
            assert torch.allclose(dict(model.named_parameters())[n].grad, want, atol=1e-10)
        clipped_norms = f * norms
        assert bool((clipped_norms <= c + 1e-12).all())
        if fn == "global":  # samples over C contribute nothing
            assert bool((f[norms > c] == 0).all()) and bool((norms > c).any())
        assert math.isclose(float(stats.fraction_clipped), float((norms > c).double().mean()))
        assert math.isclose(float(stats.max_grad_norm), float(norms.max()), rel_tol=1e-9)


def test_layerwise_default_norms_and_clipping():
    model = small_model()
    x, y = batch()
    names, rows = naive_per_sample(model, x, y)
    c = 0.5
    for engine in engines(model):
        priv = Privatizer(
            model,
            PrivacyConfig("clip-only", max_grad_norm=c, clip_style="layerwise"),
            expected_batch_size=12,
            generator=torch.Generator().manual_seed(0),
            engine=engine,
        )
        assert all(math.isclose(v, c / 2.0) for v in priv.layer_max_norms.values())  # 4 tensors -> C/sqrt(4)
        assert math.isclose(priv.sensitivity, c)
        priv.compute_gradients(x, y)
        for n in names:
            cr = priv.layer_max_norms[n]
            want = sum(min(1.0, cr / float(r[n].norm())) * r[n] for r in rows) / 12
            assert torch.allclose(dict(model.named_parameters())[n].grad, want, atol=1e-10)


def test_sgd_is_plain_mean_gradient():
    model = small_model()
    x, y = batch()
    for track in (True, False):
        priv = Privatizer(
            model,
            PrivacyConfig("sgd", track_norms=track),
            expected_batch_size=99,
            generator=torch.Generator(),
            engine=LoopEngine(model),
        )
        priv.compute_gradients(x, y)
        got = grads_of(model)
        model.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        for n, p in model.named_parameters():
            assert torch.allclose(got[n], p.grad, atol=1e-12)


def test_allocator_stays_tuned_while_the_privatizer_lives(monkeypatch):
    """glibc keeps freed blocks from the first step until the Privatizer is released or collected (what runs
    between two steps, the optimiser's step and ``zero_grad``, would otherwise trim the whole step's memory)."""
    import gc

    from landscape.evaluate import allocator

    if allocator._libc() is None:
        pytest.skip("needs glibc")
    monkeypatch.delenv("LANDSCAPE_MALLOC_TUNE", raising=False)
    depth = allocator._allocator_depth
    model = small_model()
    x, y = batch()
    priv = Privatizer(model, PrivacyConfig("dpsgd"), expected_batch_size=12, generator=torch.Generator())
    assert allocator._allocator_depth == depth
    for _ in range(2):
        priv.compute_gradients(x, y)
        assert allocator._allocator_depth == depth + 1
    priv.release_memory()
    assert allocator._allocator_depth == depth
    priv.compute_gradients(x, y)
    assert allocator._allocator_depth == depth + 1
    del priv
    gc.collect()
    assert allocator._allocator_depth == depth


@pytest.mark.parametrize("style", ["flat", "layerwise"])
def test_noise_std_is_sigma_c_over_b(style):
    """Zero data gradient: empirical per-coordinate std = sigma * C / B within 2%."""
    model = nn.Linear(50, 40, bias=True).double()
    for p in model.parameters():
        p.requires_grad_(True)
    sigma, c, b = 1.3, 0.7, 8.0
    priv = Privatizer(
        model,
        PrivacyConfig("dpsgd", max_grad_norm=c, noise_multiplier=sigma, clip_style=style),
        expected_batch_size=b,
        generator=torch.Generator().manual_seed(3),
        engine=LoopEngine(model),
    )
    x, y = torch.zeros(0, 50, dtype=torch.float64), torch.zeros(0, dtype=torch.long)
    samples = []
    for _ in range(12):
        priv.compute_gradients(x, y)
        samples.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    z = torch.cat(samples)  # 12 * 2040 coordinates
    assert abs(float(z.std()) / (sigma * c / b) - 1) < 0.02
    assert abs(float(z.mean())) < 0.05 * sigma * c / b


def test_noise_reproducible_from_generator():
    model = small_model()
    x, y = batch()
    outs = []
    for _ in range(2):
        priv = Privatizer(
            model,
            PrivacyConfig("dpsgd", noise_multiplier=1.0),
            expected_batch_size=12,
            generator=torch.Generator().manual_seed(7),
            engine=LoopEngine(model),
        )
        priv.compute_gradients(x, y)
        outs.append(grads_of(model))
    assert all(torch.equal(outs[0][n], outs[1][n]) for n in outs[0])


def test_noise_only_same_scale_no_clipping():
    model = small_model()
    x, y = batch()
    names, rows = naive_per_sample(model, x, y)
    gen = torch.Generator().manual_seed(5)
    priv = Privatizer(
        model,
        PrivacyConfig("noise-only", max_grad_norm=0.01, noise_multiplier=0.0),
        expected_batch_size=12,
        generator=gen,
        engine=LoopEngine(model),
    )
    priv.compute_gradients(x, y)  # sigma 0: the unclipped sum / B
    for n in names:
        assert torch.allclose(
            dict(model.named_parameters())[n].grad, sum(r[n] for r in rows) / 12, atol=1e-12
        )
    priv = Privatizer(
        model,
        PrivacyConfig("noise-only", max_grad_norm=2.0, noise_multiplier=1.5),
        expected_batch_size=12,
        generator=gen,
        engine=LoopEngine(model),
    )
    assert priv.noise_std == pytest.approx(3.0)


def test_masks_zero_gradient_and_noise_before_clipping():
    model = small_model()
    x, y = batch()
    names, rows = naive_per_sample(model, x, y)
    g = torch.Generator().manual_seed(0)
    masks = {n: torch.rand(p.shape, generator=g) < 0.5 for n, p in model.named_parameters() if "weight" in n}
    c = 0.2
    priv = Privatizer(
        model,
        PrivacyConfig("dpsgd", max_grad_norm=c, noise_multiplier=3.0),
        expected_batch_size=12,
        generator=torch.Generator().manual_seed(1),
        engine=LoopEngine(model),
    )
    priv.compute_gradients(x, y, masks=masks)
    for n, p in model.named_parameters():
        if n in masks:
            assert bool((p.grad[~masks[n]] == 0).all())
            assert bool((p.grad[masks[n]] != 0).all())
    # clipping uses the masked per-sample norms
    priv0 = Privatizer(
        model,
        PrivacyConfig("clip-only", max_grad_norm=c),
        expected_batch_size=12,
        generator=torch.Generator(),
        engine=LoopEngine(model),
    )
    priv0.compute_gradients(x, y, masks=masks)
    masked = [{n: r[n] * masks[n] if n in masks else r[n] for n in names} for r in rows]
    norms = [float(torch.cat([r[n].flatten() for n in names]).norm()) for r in masked]
    for n in names:
        want = sum(min(1.0, c / nm) * r[n] for nm, r in zip(norms, masked, strict=True)) / 12
        assert torch.allclose(dict(model.named_parameters())[n].grad, want, atol=1e-10)
    with pytest.raises(IncompatibleError, match="0.weight"):
        priv0.compute_gradients(x, y, masks={"0.weight": torch.ones(3, 3)})


def test_smoothing_keeps_masked_zero_and_matches_dense():
    model = small_model()
    x, y = batch()
    masks = {"0.weight": torch.arange(20).reshape(4, 5) % 3 == 0}
    priv = Privatizer(
        model,
        PrivacyConfig("dpsgd", noise_multiplier=1.0, smooth=1.0),
        expected_batch_size=12,
        generator=torch.Generator().manual_seed(2),
        engine=LoopEngine(model),
    )
    priv.compute_gradients(x, y, masks=masks)
    w = dict(model.named_parameters())["0.weight"]
    assert bool((w.grad[~masks["0.weight"]] == 0).all())


def dense_a(d: int, s: float) -> torch.Tensor:
    a = torch.eye(d, dtype=torch.float64)
    for i in range(d):
        a[i, i] += 2 * s
        a[i, (i - 1) % d] -= s
        a[i, (i + 1) % d] -= s
    return a


@pytest.mark.parametrize("d", [1, 2, 3, 7, 64, 101])
@pytest.mark.parametrize("s", [0.5, 3.0])
def test_laplacian_smoothing_equals_dense_solve(d, s):
    g = torch.randn(d, generator=torch.Generator().manual_seed(d), dtype=torch.float64)
    want = torch.linalg.solve(dense_a(d, s), g)
    got = laplacian_smooth(g, s)
    assert float((got - want).abs().max()) < 1e-6
    g2 = g.reshape(1, d) if d > 1 else g
    assert torch.allclose(laplacian_smooth(g2, s).reshape(-1), want, atol=1e-6)
    assert torch.equal(laplacian_smooth(g, 0.0), g)


def test_sparsify_schedule_counts_and_reproducibility():
    shapes = {"a": (10, 7), "b": (7,), "c": (3, 3, 3)}
    d = 70 + 7 + 27
    sched = SparsifySchedule(0.9, epochs=4, generator=torch.Generator().manual_seed(11))
    for e in range(4):
        r = 0.9 * e / 3
        assert sched.rate_at(e) == pytest.approx(r)
        m = sched.mask_for_epoch(e, shapes)
        assert {k: tuple(v.shape) for k, v in m.items()} == shapes
        assert sum(int(v.sum()) for v in m.values()) == round((1 - r) * d)
        again = SparsifySchedule(0.9, epochs=4, generator=11).mask_for_epoch(e, shapes)
        assert all(torch.equal(m[k], again[k]) for k in m)  # same mask for the whole epoch / on resume
    m1, m2 = sched.mask_for_epoch(1, shapes), sched.mask_for_epoch(2, shapes)
    assert not all(torch.equal(m1[k], m2[k]) for k in m1)
    assert SparsifySchedule(0.5, epochs=1).rate_at(0) == 0.5
    with pytest.raises(UsageError):
        SparsifySchedule(1.0, epochs=3)


def test_sparsified_noise_is_zero_off_mask():
    model = small_model()
    x, y = batch()
    sched = SparsifySchedule(0.6, epochs=2, generator=4)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    mask = sched.mask_for_epoch(1, shapes)
    priv = Privatizer(
        model,
        PrivacyConfig("dpsgd", noise_multiplier=2.0),
        expected_batch_size=12,
        generator=torch.Generator().manual_seed(2),
        engine=LoopEngine(model),
    )
    for _ in range(3):
        priv.compute_gradients(x[:0], y[:0], masks=mask)  # pure noise
        for n, p in model.named_parameters():
            assert bool((p.grad[~mask[n]] == 0).all())
            assert bool((p.grad[mask[n]] != 0).all())


def test_config_validation():
    with pytest.raises(UsageError):
        PrivacyConfig("adam")
    with pytest.raises(UsageError):
        PrivacyConfig(max_grad_norm=0)
    with pytest.raises(UsageError):
        PrivacyConfig(clip_style="bytensor")
    with pytest.raises(UsageError, match="missing"):
        Privatizer(
            small_model(),
            PrivacyConfig(clip_style="layerwise", layer_max_norms={"0.weight": 1.0}),
            expected_batch_size=1,
            generator=torch.Generator(),
        )


@pytest.mark.filterwarnings("ignore:Full backward hook")
@pytest.mark.parametrize("style", ["flat", "layerwise"])
def test_clipped_sum_matches_opacus(style):
    """noise 0: our clipped sum equals Opacus' DPOptimizer / DPPerLayerOptimizer (within 1e-5)."""
    opacus = pytest.importorskip("opacus")
    from opacus.optimizers import DPOptimizer, DPPerLayerOptimizer

    model = small_model(3)
    x, y = batch(16, seed=4)
    c = 0.4
    ours = Privatizer(
        model,
        PrivacyConfig("clip-only", max_grad_norm=c, clip_style=style),
        expected_batch_size=16.0,
        generator=torch.Generator(),
    )
    ours.compute_gradients(x, y)
    want = {n: p.grad.detach().clone() * 16.0 for n, p in model.named_parameters()}  # the sum
    model.zero_grad()
    gsm = opacus.GradSampleModule(model, loss_reduction="sum")
    sgd = torch.optim.SGD(gsm.parameters(), lr=0.0)
    if style == "flat":
        opt = DPOptimizer(
            sgd, noise_multiplier=0.0, max_grad_norm=c, expected_batch_size=16, loss_reduction="sum"
        )
    else:
        norms = [ours.layer_max_norms[n] for n, _ in model.named_parameters()]
        opt = DPPerLayerOptimizer(
            sgd, noise_multiplier=0.0, max_grad_norm=norms, expected_batch_size=16, loss_reduction="sum"
        )
        assert opt.max_grad_norm == pytest.approx(ours.sensitivity)  # Opacus' noise scale = ours
    nn.functional.cross_entropy(gsm(x), y, reduction="sum").backward()
    opt.pre_step()
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, want[n], atol=1e-5), n
    gsm._close()


@pytest.mark.parametrize("style", ["flat", "layerwise"])
@pytest.mark.parametrize("fn", ["abadi", "automatic"])
def test_engine_matches_loop_on_conv_model_with_masks(style, fn):
    """The real engine (when present) and the per-example loop give the same privatised step on LeNet."""
    from landscape.models import build_model

    torch.manual_seed(0)
    model = build_model("lenet", input_shape=(1, 8, 8), num_classes=10).double()
    g = torch.Generator().manual_seed(9)
    x = torch.randn(6, 1, 8, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (6,), generator=g)
    masks = {n: torch.rand(p.shape, generator=g) < 0.6 for n, p in model.named_parameters()}
    results = []
    for engine in engines(model):
        priv = Privatizer(
            model,
            PrivacyConfig("dpsgd", max_grad_norm=0.5, noise_multiplier=1.0, clip_style=style, clip_fn=fn),
            expected_batch_size=6.0,
            generator=torch.Generator().manual_seed(4),
            engine=engine,
        )
        stats = priv.compute_gradients(x, y, masks=masks)
        results.append((grads_of(model), stats.as_dict()))
    for grads, stats in results[1:]:
        for n in grads:
            assert float((grads[n] - results[0][0][n]).abs().max()) < 1e-9, n
        for k in ("loss", "accuracy", "mean_grad_norm", "max_grad_norm", "fraction_clipped", "noise_norm"):
            assert stats[k] == pytest.approx(results[0][1][k], rel=1e-9), k


@settings(max_examples=40, deadline=None)
@given(
    norms=st.lists(st.floats(0.0, 1e4, allow_nan=False), min_size=1, max_size=20),
    c=st.floats(1e-3, 1e2),
    fn=st.sampled_from(sorted(CLIP_FUNCTIONS)),
)
def test_clipped_norm_never_exceeds_c(norms, c, fn):
    n = torch.tensor(norms, dtype=torch.float64)
    assert bool((clip_factors(n, c, fn) * n <= c * (1 + 1e-12)).all())


@settings(max_examples=30, deadline=None)
@given(d=st.integers(1, 40), s=st.floats(0.0, 20.0), seed=st.integers(0, 2**16))
def test_smoothing_inverts_a(d, s, seed):
    g = torch.randn(d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    assert torch.allclose(dense_a(d, s) @ laplacian_smooth(g, s), g, atol=1e-9)
