"""Book-keeping DP: the engine's clipped sums and norms against a per-example loop, in float64.

One forward and one activation backward per batch; per-sample norms from the kept activations and output
gradients (ghost norms or materialised per-sample gradients, by whichever kernel the layer's geometry picks:
grouped weight-gradient kernel, grouped correlation for one input channel per group, channels-last patches);
then the clipped sum from the same kept tensors. Every route is compared to ``LoopEngine`` (one backward per
example) on the layer types the handlers cover (Linear, Conv1d/2d, GroupNorm, LayerNorm, Embedding) and on a
model whose custom layer has no handler (the mixed route), flat and layerwise, with and without masks.
"""

from __future__ import annotations

import pytest
import torch
from persample_reference import LoopEngine
from torch import nn

from landscape.clip import CLIP_FUNCTIONS
from landscape.persample import PerSampleEngine, handlers
from landscape.train.privatize import PrivacyConfig, Privatizer


class ConvNet(nn.Module):
    """One-channel first layer (grouped correlation), a strided conv at few positions (channels-last patches
    or ghost norm), a depthwise conv, a Conv1d, GroupNorm and a Linear head."""

    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(1, 4, 4, stride=2, padding=1)
        self.c1 = nn.Conv2d(4, 6, 3, stride=2)
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6, padding_mode="reflect")
        self.gn = nn.GroupNorm(2, 6)
        self.c1d = nn.Conv1d(6, 5, 2, dilation=2, groups=1)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        h = torch.tanh(self.c0(x))
        h = torch.tanh(self.gn(self.dw(torch.tanh(self.c1(h)))))
        h = torch.tanh(self.c1d(h.flatten(2)))
        return self.head(h.mean(2))


class TokenNet(nn.Module):
    """Embedding (with padding), LayerNorm and a Linear applied over a sequence (the Gram-trick norm)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(9, 6, padding_idx=0)
        self.seq = nn.Linear(6, 8)
        self.ln = nn.LayerNorm(8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.ln(torch.tanh(self.seq(self.emb(x.long()))))
        return self.head(h.mean(1))


class Gate(nn.Module):
    """A layer with its own parameter and no handler: the mixed route takes it by torch.func."""

    def __init__(self, d):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return x * torch.sigmoid(self.scale * x)


def mixed():
    return nn.Sequential(nn.Linear(7, 6), Gate(6), nn.Tanh(), nn.Linear(6, 3))


CASES = {
    "linear": (lambda: nn.Sequential(nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 3)), (7,), "hooks"),
    "conv": (ConvNet, (1, 12, 12), "hooks"),
    "tokens": (TokenNet, None, "hooks"),
    "mixed": (mixed, (7,), "mixed"),
}


def data(name, n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = CASES[name][1]
    x = torch.randint(0, 9, (n, 5), generator=g).double() if shape is None else torch.randn(n, *shape, generator=g,
                                                                                          dtype=torch.float64)
    return x, torch.randint(0, 3, (n,), generator=g)


def model_of(name, seed=0):
    torch.manual_seed(seed)
    return CASES[name][0]().double()


def close(a: dict, b: dict, tol=1e-10):
    assert set(a) == set(b)
    for k in a:
        scale = 1.0 + float(b[k].abs().max())
        assert float((a[k] - b[k]).abs().max()) < tol * scale, k


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("style", ["flat", "layerwise"])
@pytest.mark.parametrize("fn", ["abadi", "automatic"])
def test_clipped_sum_and_norms_match_the_loop(name, style, fn):
    model = model_of(name)
    x, y = data(name)
    engine = PerSampleEngine(model)
    ref = LoopEngine(model)
    loop_norms = ref.norms(x, y)
    c = 0.5 * float(loop_norms.flat.median())
    clip = CLIP_FUNCTIONS[fn]
    if style == "flat":
        factor = lambda nm: clip(nm.flat, c)  # noqa: E731
    else:
        factor = lambda nm: {k: clip(v, c / 2) for k, v in nm.layers.items()}  # noqa: E731
    sums, norms = engine.clipped_sum(x, y, factor)
    assert engine.strategy == CASES[name][2]
    want, want_norms = ref.clipped_sum(x, y, factor)
    close(sums, want)
    assert torch.allclose(norms.flat, want_norms.flat, rtol=1e-10, atol=1e-14)
    for k in want_norms.layers:
        assert torch.allclose(norms.layers[k], want_norms.layers[k], rtol=1e-10, atol=1e-14), k
    assert torch.allclose(norms.loss.double(), want_norms.loss.double(), rtol=1e-12)


@pytest.mark.parametrize(
    "grouped_min", [1, 10**9], ids=["grouped-kernel", "correlation-and-patches"]
)
@pytest.mark.parametrize("ghost_ratio", [0.0, 1e9], ids=["materialised", "ghost"])
def test_every_convolution_route_with_masks(monkeypatch, grouped_min, ghost_ratio):
    """Each way a convolution's per-sample gradients or norms are formed, with masks (which force the
    materialised gradients) and without, gives the loop's clipped sum."""
    monkeypatch.setattr(handlers, "GROUPED_MIN_POSITIONS", grouped_min)
    monkeypatch.setattr(handlers, "GHOST_RATIO", ghost_ratio)
    used = []
    for route in ("_correlated_per_sample", "_unfolded_per_sample", "_patches_last", "_wgrad"):
        original = getattr(handlers.ConvHandler, route)
        monkeypatch.setattr(handlers.ConvHandler, route,
                            lambda self, *a, _f=original, _r=route, **kw: used.append(_r) or _f(self, *a, **kw))
    model = model_of("conv", seed=3)
    x, y = data("conv", n=6, seed=4)
    engine = PerSampleEngine(model, strategy="hooks")
    ref = LoopEngine(model)
    g = torch.Generator().manual_seed(5)
    masks = {k: (torch.rand(p.shape, generator=g) > 0.3).double() for k, p in model.named_parameters() if p.dim() > 1}
    for m in (None, masks):
        w = torch.rand(6, dtype=torch.float64, generator=g)
        sums, norms = engine.clipped_sum(x, y, lambda nm, w=w: w / (1 + nm.flat), masks=m)
        want, want_norms = ref.clipped_sum(x, y, lambda nm, w=w: w / (1 + nm.flat), masks=m)
        close(sums, want)
        assert torch.allclose(norms.flat, want_norms.flat, rtol=1e-10)
    if grouped_min > 1:  # the one-channel layers by correlation, the others by channels-last patches
        assert {"_correlated_per_sample", "_unfolded_per_sample"} <= set(used)
    else:
        assert "_correlated_per_sample" not in used and "_unfolded_per_sample" not in used
    assert ("_patches_last" in used) == (ghost_ratio > 1 or grouped_min > 1)  # the ghost norms read them too


@pytest.mark.parametrize("name", ["conv", "mixed"])
def test_privatized_step_matches_the_loop(name):
    """A whole DP step (clip-only: no noise to draw) through the engine and through the loop."""
    x, y = data(name)
    grads = []
    for engine_of in (PerSampleEngine, LoopEngine):
        model = model_of(name, seed=1)
        cfg = PrivacyConfig(optimizer="clip-only", max_grad_norm=0.05)
        priv = Privatizer(model, cfg, expected_batch_size=len(y), generator=torch.Generator().manual_seed(0),
                          engine=engine_of(model))
        stats = priv.compute_gradients(x, y)
        assert 0 < float(stats.fraction_clipped) <= 1
        grads.append({k: p.grad for k, p in model.named_parameters()})
    close(*grads)


def test_float32_conv_step_close_to_float64():
    """The channels-last and correlation kernels in float32 stay within float32 rounding of float64."""
    model = model_of("conv", seed=2)
    x, y = data("conv", n=16, seed=2)
    sums64, norms64 = PerSampleEngine(model).clipped_sum(x, y, lambda nm: CLIP_FUNCTIONS["abadi"](nm.flat, 0.1))
    model32 = model_of("conv", seed=2).float()
    sums32, norms32 = PerSampleEngine(model32).clipped_sum(x.float(), y,
                                                           lambda nm: CLIP_FUNCTIONS["abadi"](nm.flat, 0.1))
    assert torch.allclose(norms32.flat, norms64.flat, rtol=1e-5)
    close({k: v.double() for k, v in sums32.items()}, sums64, tol=1e-5)


def test_materialised_gradients_are_contiguous_and_exact(monkeypatch):
    """``grads()`` hands out ordinary contiguous tensors, also where the channels-last route formed a permuted view."""
    monkeypatch.setattr(handlers, "GROUPED_MIN_POSITIONS", 10**9)
    model = model_of("conv", seed=6)
    x, y = data("conv", n=5, seed=6)
    got = PerSampleEngine(model, strategy="hooks").grads(x, y)
    want = LoopEngine(model).grads(x, y)
    assert all(g.is_contiguous() for g in got.values())
    close(got, want)


def test_a_capture_is_freed_with_its_batch():
    """What one batch kept (inputs, output gradients) is freed when the batch is done, by reference counting:
    the hooks on the graph's nodes must not hold the Capture that holds those nodes (a cycle through autograd's
    C++ nodes, which the collector cannot break, kept every batch's activations for good)."""
    import gc
    import weakref

    from landscape.persample.capture import Capture

    model = model_of("conv")
    x, y = data("conv")
    engine = PerSampleEngine(model)
    engine.clipped_sum(x, y, lambda nm: 1 / (1 + nm.flat))  # plans the route
    cap = Capture(engine._handlers)
    with cap, torch.enable_grad():
        loss = torch.nn.functional.cross_entropy(model(x), y)
    cap.backward(loss)
    kept = weakref.ref(cap.inputs[engine._handlers[0]][0])
    assert kept() is not None
    gone = weakref.ref(cap)
    del cap
    gc.collect()
    assert gone() is None and kept() is None  # loss and its graph are still alive here

    seen = []
    original = Capture.__init__
    try:
        Capture.__init__ = lambda self, *a, **k: seen.append(weakref.ref(self)) or original(self, *a, **k)
        for _ in range(2):
            engine.clipped_sum(x, y, lambda nm: 1 / (1 + nm.flat))
            engine.weighted_sum(x, y, torch.ones(len(y), dtype=torch.float64))
    finally:
        Capture.__init__ = original
    assert len(seen) == 4 and all(r() is None for r in seen)


@pytest.mark.parametrize("conv", ["conv2d", "conv1d", "grouped"])
def test_materialised_gradients_in_the_weights_layout_equal_a_per_example_loop(monkeypatch, conv):
    """Layers with more output channels than positions form materialised per-sample gradients from patches
    reordered to the weight's layout (no permuted copy of the larger product): each equals autograd's gradient of
    that example alone, in float64."""
    monkeypatch.setattr(handlers, "GROUPED_MIN_POSITIONS", 10**9)  # the patches route for every layer
    torch.manual_seed(0)
    if conv == "conv1d":
        model = torch.nn.Sequential(torch.nn.Conv1d(3, 12, 3), torch.nn.Tanh(), torch.nn.Flatten(),
                                    torch.nn.Linear(12 * 3, 4)).double()
        x = torch.randn(5, 3, 5, dtype=torch.float64)
    else:
        groups = 2 if conv == "grouped" else 1
        model = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 3, padding=1, groups=groups), torch.nn.Tanh(),
                                    torch.nn.Conv2d(16, 24, 2, groups=groups), torch.nn.Tanh(), torch.nn.Flatten(),
                                    torch.nn.Linear(24 * 2 * 2, 4)).double()
        x = torch.randn(5, 4, 3, 3, dtype=torch.float64)
    y = torch.randint(0, 4, (5,))
    layouts = []
    original = handlers.ConvHandler._unfolded_per_sample

    def spy(self, x, pad, b, layout=None):
        layouts.append((layout, b[0, 0].numel() < b.shape[1]))  # (asked layout, fewer positions than channels)
        return original(self, x, pad, b, layout=layout)

    monkeypatch.setattr(handlers.ConvHandler, "_unfolded_per_sample", spy)
    grads = PerSampleEngine(model, strategy="hooks").grads(x, y)
    assert ("weight", True) in layouts  # the reordered-patches branch ran
    for i in range(5):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum").backward()
        for name, p in model.named_parameters():
            assert grads[name][i].is_contiguous()
            assert torch.allclose(grads[name][i], p.grad, rtol=1e-10, atol=1e-12), (name, i)
