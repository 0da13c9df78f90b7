"""PerSampleEngine against independent references: a naive per-example loop, torch.func, and Opacus."""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from landscape.errors import ModelError, UsageError
from landscape.models import build_model
from landscape.persample import PerSampleEngine, PerSampleNorms, flatten_grads, handlers


def naive_grads(model: nn.Module, x, y) -> dict[str, torch.Tensor]:
    """One forward/backward per example: the obvious reference."""
    named = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
    out = {k: [] for k, _ in named}
    for i in range(len(x)):
        loss = F.cross_entropy(model(x[i : i + 1]), y[i : i + 1], reduction="sum")
        for (k, _), g in zip(named, torch.autograd.grad(loss, [p for _, p in named]), strict=True):
            out[k].append(g)
    return {k: torch.stack(v) for k, v in out.items()}


def maxdiff(a: dict, b: dict) -> float:
    assert list(a) == list(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def batch(shape, n, classes=10, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=g, dtype=dtype), torch.randint(0, classes, (n,), generator=g)


@functools.cache
def _built(name, shape, seed, kw):
    torch.manual_seed(seed)
    return build_model(name, input_shape=shape, num_classes=10, **dict(kw))


def model64(name, shape, seed=0, **kw):
    """A fresh float64 copy of a zoo model (building resnet18 is slow, so each is built once)."""
    return copy.deepcopy(_built(name, tuple(shape), seed, tuple(sorted(kw.items())))).double()


# ---------------------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize(
    ("name", "shape", "n", "kw"),
    [("opacus-cnn", (1, 28, 28), 4, {}), ("resnet18", (3, 8, 8), 3, {"norm": "group"})],
)
@pytest.mark.parametrize("strategy", ["hooks", "functorch"])
def test_grads_equal_naive_loop(name, shape, n, kw, strategy):
    model = model64(name, shape, **kw)
    x, y = batch(shape, n)
    ref = naive_grads(model, x, y)
    engine = PerSampleEngine(model, strategy=strategy)
    assert engine.strategy == strategy
    assert maxdiff(engine.grads(x, y), ref) < 1e-6
    norms = engine.norms(x, y)
    assert torch.allclose(norms.flat, flatten_grads(ref).norm(dim=1), rtol=1e-9, atol=1e-12)
    for k in ref:
        assert torch.allclose(norms.layers[k], ref[k].reshape(n, -1).norm(dim=1), rtol=1e-9, atol=1e-12)


def test_auto_picks_hooks_for_zoo_models():
    for name, shape in [
        ("opacus-cnn", (1, 28, 28)),
        ("resnet18", (3, 8, 8)),
        ("lenet", (1, 8, 8)),
        ("mlp", (1, 8, 8)),
    ]:
        model = build_model(name, input_shape=shape, num_classes=10)
        assert PerSampleEngine(model).strategy == "hooks", name


@pytest.mark.parametrize("strategy", ["hooks", "functorch"])
def test_norms_weighted_and_clipped_sums_match_naive(strategy):
    shape, n = (1, 28, 28), 6
    model = model64("opacus-cnn", shape, activation="tanh")
    x, y = batch(shape, n, seed=1)
    ref = naive_grads(model, x, y)
    engine = PerSampleEngine(model, strategy=strategy, chunk=4)  # two chunks: 4 + 2
    norms = engine.norms(x, y)
    ref_flat = flatten_grads(ref).norm(dim=1)
    assert norms.flat.dtype == torch.float64 and torch.allclose(norms.flat, ref_flat, rtol=1e-10)
    assert torch.allclose(norms.loss, F.cross_entropy(model(x), y, reduction="none"))
    assert torch.allclose(norms.logits, model(x))

    w = torch.rand(n, dtype=torch.float64)
    expect = {k: torch.einsum("n,n...->...", w, g) for k, g in ref.items()}
    assert maxdiff(engine.weighted_sum(x, y, w), expect) < 1e-10

    lw = {k: torch.rand(n, dtype=torch.float64) for k in ref}
    expect = {k: torch.einsum("n,n...->...", lw[k], g) for k, g in ref.items()}
    assert maxdiff(engine.weighted_sum(x, y, lw), expect) < 1e-10

    c = 0.5 * float(ref_flat.median())
    sums, norms2 = engine.clipped_sum(x, y, lambda nm: (c / nm.flat).clamp(max=1.0))
    f = (c / ref_flat).clamp(max=1.0)
    assert maxdiff(sums, {k: torch.einsum("n,n...->...", f, g) for k, g in ref.items()}) < 1e-10
    assert torch.allclose(norms2.flat, ref_flat)

    layer_c = {k: 0.5 * float(g.reshape(n, -1).norm(dim=1).median()) for k, g in ref.items()}
    sums, _ = engine.clipped_sum(
        x, y, lambda nm: {k: (layer_c[k] / nm.layers[k]).clamp(max=1.0) for k in nm.layers}
    )
    expect = {}
    for k, g in ref.items():
        fk = (layer_c[k] / g.reshape(n, -1).norm(dim=1)).clamp(max=1.0)
        expect[k] = torch.einsum("n,n...->...", fk, g)
    assert maxdiff(sums, expect) < 1e-10

    mean = engine.mean_grad(x, y)
    assert maxdiff(mean, {k: g.mean(0) for k, g in ref.items()}) < 1e-10


class Exotic(nn.Module):
    """Every layer type and geometry the hooks route claims, including a module called twice."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 4, padding_idx=0)
        self.c1d = nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2, padding_mode="circular")
        self.c2a = nn.Conv2d(
            2, 6, 3, stride=(2, 1), padding="same" if False else (1, 2), dilation=(1, 2), groups=2
        )
        self.c2b = nn.Conv2d(6, 32, 3, padding="same", padding_mode="reflect")
        self.c2c = nn.Conv2d(32, 32, 3, padding=1, bias=False)  # small T, large p*d: ghost norm
        self.gn = nn.GroupNorm(4, 32)
        self.lin_seq = nn.Linear(32, 64)  # applied to (n, T, d): ghost when T (d + p) < p d
        self.ln = nn.LayerNorm(64)
        self.shared = nn.Linear(64, 64)  # called twice
        self.frozen = nn.Linear(64, 64)
        self.frozen.weight.requires_grad_(False)
        self.head = nn.Linear(64 + 6, 10)

    def forward(self, inp):
        img, tok = inp[:, :32].reshape(-1, 2, 4, 4), inp[:, 32:].round().long().clamp(0, 6)
        e = self.emb(tok).transpose(1, 2)  # (n, 4, T)
        s = torch.tanh(self.c1d(e)).mean(2)  # (n, 6)
        h = torch.tanh(self.c2a(img))
        h = torch.tanh(self.c2b(h))
        h = self.gn(self.c2c(h))  # (n, 32, 2, 4)
        h = torch.tanh(self.lin_seq(h.flatten(2).transpose(1, 2)))  # (n, 8, 64)
        h = self.ln(h).mean(1)
        h = torch.tanh(self.shared(torch.tanh(self.shared(h))))
        h = torch.tanh(self.frozen(h))
        return self.head(torch.cat([h, s], 1))


def exotic_batch(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(n, 32, generator=g, dtype=torch.float64)
    tok = torch.randint(0, 7, (n, 9), generator=g).double()
    return torch.cat([img, tok], 1), torch.randint(0, 10, (n,), generator=g)


@pytest.mark.parametrize(
    ("ghost_ratio", "grouped_min"),
    [(0.5, 256), (0.0, 1), (1e9, 10**9)],
    ids=["default", "grouped-kernel-no-ghost", "unfold-always-ghost"],
)
def test_hooks_route_on_every_supported_layer(monkeypatch, ghost_ratio, grouped_min):
    """Every code path (ghost / materialised by grouped kernel / by unfolded patches) on every geometry."""
    monkeypatch.setattr(handlers, "GHOST_RATIO", ghost_ratio)
    monkeypatch.setattr(handlers, "GROUPED_MIN_POSITIONS", grouped_min)
    torch.manual_seed(0)
    model = Exotic().double()
    x, y = exotic_batch(5)
    ref = naive_grads(model, x, y)
    assert "frozen.weight" not in ref and "frozen.bias" in ref
    hooks = PerSampleEngine(model, strategy="hooks")
    assert hooks.names == list(ref)
    assert maxdiff(hooks.grads(x, y), ref) < 1e-10
    norms = hooks.norms(x, y)
    for k in ref:
        assert torch.allclose(norms.layers[k], ref[k].reshape(5, -1).norm(dim=1), rtol=1e-10, atol=1e-14), k
    w = torch.rand(5, dtype=torch.float64)
    expect = {k: torch.einsum("n,n...->...", w, g) for k, g in ref.items()}
    assert maxdiff(hooks.weighted_sum(x, y, w), expect) < 1e-10
    sums, _ = hooks.clipped_sum(x, y, lambda nm: w)
    assert maxdiff(sums, expect) < 1e-10


class OutsideUse(nn.Module):
    """Uses a Linear's weight outside that Linear's forward: the hooks route would miss it."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 3)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.b(h + F.linear(h, self.a.weight))


class OwnParam(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(6))
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(torch.tanh(x * self.scale))


def test_unsupported_models_fall_back_to_functorch_exactly():
    torch.manual_seed(0)
    x = torch.randn(4, 6, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 1])
    own = OwnParam().double()
    eng = PerSampleEngine(own)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a parameter of the root: the whole model is its unit, chosen quietly
        g = eng.grads(x, y)
    assert maxdiff(g, naive_grads(own, x, y)) < 1e-12
    assert eng.strategy == "functorch"
    with pytest.raises(ModelError, match="strategy='auto'"):
        PerSampleEngine(own, strategy="hooks")

    outside = OutsideUse().double()
    eng = PerSampleEngine(outside)
    with pytest.warns(UserWarning, match="torch.func"):
        g = eng.grads(x, y)
    assert eng.strategy == "functorch"
    assert maxdiff(g, naive_grads(outside, x, y)) < 1e-12
    with pytest.raises(ModelError, match="not exact"):
        PerSampleEngine(outside, strategy="hooks").norms(x, y)


@pytest.mark.parametrize("strategy", ["hooks", "functorch"])
def test_masks_apply_before_norms(strategy):
    shape, n = (1, 8, 8), 5
    model = model64("lenet", shape)
    x, y = batch(shape, n)
    ref = naive_grads(model, x, y)
    g = torch.Generator().manual_seed(3)
    masks = {k: (torch.rand(p.shape, generator=g) > 0.5).double() for k, p in model.named_parameters()}
    masked = {k: v * masks[k] for k, v in ref.items()}
    eng = PerSampleEngine(model, strategy=strategy)
    norms = eng.norms(x, y, masks=masks)
    assert torch.allclose(norms.flat, flatten_grads(masked).norm(dim=1), rtol=1e-10)
    assert maxdiff(eng.grads(x, y, masks=masks), masked) < 1e-12
    f = torch.rand(n, dtype=torch.float64)
    sums, _ = eng.clipped_sum(x, y, lambda nm: f, masks=masks)
    assert maxdiff(sums, {k: torch.einsum("n,n...->...", f, v) for k, v in masked.items()}) < 1e-12


def test_projections_equal_inner_products():
    """Forward-mode <g_i, v> equals the inner product with materialised per-sample gradients."""
    shape, n = (1, 28, 28), 5
    model = model64("opacus-cnn", shape)
    x, y = batch(shape, n)
    eng = PerSampleEngine(model, chunk=2)
    G = flatten_grads(eng.grads(x, y))
    V = torch.randn(3, G.shape[1], dtype=torch.float64)
    P = eng.projections(x, y, V)
    assert P.shape == (n, 3)
    assert torch.allclose(P, G @ V.T, rtol=1e-9, atol=1e-9)
    as_dicts = [
        dict(zip(eng.names, torch.split(v, [p.numel() for p in eng.params.values()]), strict=True))
        for v in V[:2]
    ]
    as_dicts = [{k: t.reshape(eng.params[k].shape) for k, t in d.items()} for d in as_dicts]
    assert torch.allclose(eng.projections(x, y, as_dicts), P[:, :2], rtol=1e-12)


# ---------------------------------------------------------------------------------------------- Opacus


def opacus_clipped_sum(model, x, y, max_grad_norm):
    """Opacus' own per-sample gradients and clipping (flat: float C; per layer: list of C_r), noise 0."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer, DPPerLayerOptimizer

    gsm = GradSampleModule(model, loss_reduction="sum")
    params = [p for p in gsm.parameters() if p.requires_grad]
    cls = DPPerLayerOptimizer if isinstance(max_grad_norm, list) else DPOptimizer
    opt = cls(
        torch.optim.SGD(params, lr=0.1),
        noise_multiplier=0.0,
        max_grad_norm=max_grad_norm,
        expected_batch_size=len(x),
        loss_reduction="sum",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        F.cross_entropy(gsm(x), y, reduction="sum").backward()
    opt.clip_and_accumulate()
    out = {k: p.summed_grad.detach().clone() for k, p in model.named_parameters() if p.requires_grad}
    gsm._close()
    return out


@pytest.mark.parametrize("clipping", ["flat", "layerwise"])
@pytest.mark.parametrize("strategy", ["hooks", "functorch"])
def test_clipped_sum_equals_opacus(clipping, strategy):
    shape, n = (1, 28, 28), 8
    torch.manual_seed(0)
    model = build_model("opacus-cnn", input_shape=shape, num_classes=10, activation="tanh")
    x, y = batch(shape, n, dtype=torch.float32)
    eng = PerSampleEngine(model, strategy=strategy)
    names = eng.names
    if clipping == "flat":
        c = 0.5
        ours, norms = eng.clipped_sum(x, y, lambda nm: (c / (nm.flat + 1e-6)).clamp(max=1.0))
        theirs = opacus_clipped_sum(model, x, y, c)
    else:
        cr = {k: 0.1 for k in names}
        ours, _ = eng.clipped_sum(
            x, y, lambda nm: {k: (cr[k] / (nm.layers[k] + 1e-6)).clamp(max=1.0) for k in names}
        )
        theirs = opacus_clipped_sum(model, x, y, [cr[k] for k in names])
    assert maxdiff(ours, theirs) < 1e-5
    # and clipping was active, so the comparison is not vacuous
    assert any(float((ours[k] - eng.weighted_sum(x, y, torch.ones(n))[k]).abs().max()) > 1e-3 for k in names)


# ---------------------------------------------------------------------------------------------- edges


def test_batchnorm_refused_with_pointer():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, 10))
    with pytest.raises(ModelError, match='norm="group"') as e:
        PerSampleEngine(model)
    assert "\n" not in str(e.value) and "convert_batchnorm_to_groupnorm" in str(e.value)


@pytest.mark.parametrize("strategy", ["hooks", "functorch"])
def test_batch_sizes_zero_and_one(strategy):
    shape = (1, 8, 8)
    model = model64("lenet", shape)
    eng = PerSampleEngine(model, strategy=strategy, chunk=3)
    x0, y0 = batch(shape, 0)
    norms = eng.norms(x0, y0)
    assert isinstance(norms, PerSampleNorms) and len(norms) == 0 and norms.flat.dtype == torch.float64
    sums, _ = eng.clipped_sum(x0, y0, lambda nm: torch.ones(len(nm)))
    assert all(float(v.abs().max()) == 0 for v in sums.values())
    assert all(v.shape[0] == 0 for v in eng.grads(x0, y0).values())
    assert eng.projections(x0, y0, torch.zeros(2, sum(p.numel() for p in model.parameters()))).shape == (0, 2)
    x1, y1 = batch(shape, 1)
    ref = naive_grads(model, x1, y1)
    assert maxdiff(eng.grads(x1, y1), ref) < 1e-12
    assert (
        maxdiff(eng.weighted_sum(x1, y1, torch.tensor([2.0])), {k: 2 * g[0] for k, g in ref.items()}) < 1e-12
    )


def test_model_is_left_untouched_and_bad_input_is_reported():
    shape = (1, 8, 8)
    model = model64("lenet", shape)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    eng = PerSampleEngine(model)
    x, y = batch(shape, 4)
    eng.clipped_sum(x, y, lambda nm: torch.ones(len(nm)))
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(UsageError):
        eng.norms(x, y[:3])
    with pytest.raises(UsageError):
        PerSampleEngine(model, strategy="magic")
    with pytest.raises(UsageError):
        eng.weighted_sum(x, y, torch.ones(3))


def test_masks_for_frozen_parameters_are_ignored_and_unknown_names_refused():
    torch.manual_seed(0)
    model = Exotic().double()
    x, y = exotic_batch(3)
    eng = PerSampleEngine(model)
    plain = eng.norms(x, y).flat
    masked = eng.norms(x, y, masks={"frozen.weight": torch.zeros(64, 64, dtype=torch.float64)}).flat
    assert torch.equal(plain, masked)
    with pytest.raises(UsageError, match="not a parameter"):
        eng.norms(x, y, masks={"nope.weight": torch.ones(3)})


class ConvTwice(nn.Module):
    """A convolution applied to two inputs of different sizes: per-sample gradients add over both calls."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.head = nn.Linear(6, 4)

    def forward(self, x):
        a = torch.tanh(self.conv(x)).mean((2, 3))
        b = torch.tanh(self.conv(x[:, :, ::2, ::2])).mean((2, 3))
        return self.head(torch.cat([a, b], 1))


@pytest.mark.parametrize("grouped_min", [1, 10**9])
def test_module_called_twice(monkeypatch, grouped_min):
    monkeypatch.setattr(handlers, "GROUPED_MIN_POSITIONS", grouped_min)
    torch.manual_seed(0)
    model = ConvTwice().double()
    x, y = torch.randn(4, 2, 6, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 3])
    ref = naive_grads(model, x, y)
    eng = PerSampleEngine(model, strategy="hooks")
    assert maxdiff(eng.grads(x, y), ref) < 1e-12
    w = torch.rand(4, dtype=torch.float64)
    sums, norms = eng.clipped_sum(x, y, lambda nm: w)
    assert maxdiff(sums, {k: torch.einsum("n,n...->...", w, g) for k, g in ref.items()}) < 1e-12
    assert torch.allclose(norms.flat, flatten_grads(ref).norm(dim=1), rtol=1e-12)


class Tied(nn.Module):
    """One weight held by two Linear modules: a handler would see only its own module's use of it."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 5)
        self.b = nn.Linear(5, 5)
        self.b.weight = self.a.weight
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x)))))


def test_tied_parameter_is_left_to_functorch():
    torch.manual_seed(0)
    model = Tied().double()
    x, y = torch.randn(4, 5, dtype=torch.float64), torch.tensor([0, 1, 2, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # planned as functorch up front, not through the failed self-check
        eng = PerSampleEngine(model)
        g = eng.grads(x, y)
    assert eng.strategy == "functorch"
    assert maxdiff(g, naive_grads(model, x, y)) < 1e-12
    with pytest.raises(ModelError, match="cannot handle parameter"):
        PerSampleEngine(model, strategy="hooks")
