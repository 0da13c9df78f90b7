"""Per-sample gradients of models landscape has no handler for, against a naive per-example loop.

The mixed route (registered handlers by hooks, every other module by a per-module ``torch.func`` unit), the
whole-model ``torch.func`` route and a user-registered handler, on a small ``nn.TransformerEncoder``
classifier over integer tokens (``nn.MultiheadAttention``, batch first or not), a custom module with its own
parameter, LayerNorm and a mix with convolutions. float64 and smooth activations, so the tolerances are
tight. Then DP-SGD steps, clipping, norms, symmetry and the NTK on such a model through the Python API.
"""

from __future__ import annotations

import math
import types
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from persample_reference import LoopEngine
from test_persample import maxdiff, naive_grads  # the per-example loop reference
from torch import nn

from landscape import persample
from landscape.errors import ModelError, UsageError
from landscape.persample import (
    FunctionalHandler,
    Handler,
    PerSampleEngine,
    flatten_grads,
    register_handler,
    unregister_handler,
)
from landscape.train.privatize import PrivacyConfig, Privatizer

pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor:UserWarning")


class Scale(nn.Module):
    """A custom layer with its own parameter: y = x * scale (scale over the last dimension)."""

    def __init__(self, d: int):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return x * self.scale


class Positions(nn.Module):
    """Learned positional embeddings, added: a parameter used by a custom module's own forward."""

    def __init__(self, t: int, d: int):
        super().__init__()
        self.pos = nn.Parameter(0.1 * torch.randn(t, d))

    def forward(self, h):
        return h + self.pos


class TokenTransformer(nn.Module):
    """Embeddings + positions + nn.TransformerEncoder (MultiheadAttention, LayerNorm) + a custom scale + head."""

    def __init__(self, vocab=11, d=8, heads=2, layers=2, classes=3, t=5, batch_first=True, dropout=0.0):
        super().__init__()
        self.batch_first = batch_first
        self.emb = nn.Embedding(vocab, d)
        self.pos = Positions(t, d)
        layer = nn.TransformerEncoderLayer(d, heads, 16, dropout=dropout, activation="gelu", batch_first=batch_first)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.scale = Scale(d)
        self.head = nn.Linear(d, classes)

    def forward(self, tok):
        h = self.pos(self.emb(tok))
        if not self.batch_first:
            h = h.transpose(0, 1)
        h = self.enc(h)
        if not self.batch_first:
            h = h.transpose(0, 1)
        return self.head(self.scale(h).mean(1))


class Mix(nn.Module):
    """Convolutions and Linear (hooks) around a custom scale, LayerNorm and self-attention (torch.func)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 6, 3, padding=1)
        self.scale = Scale(6)
        self.attn = nn.MultiheadAttention(6, 2, batch_first=True)
        self.norm = nn.LayerNorm(6)
        self.head = nn.Linear(6, 4)

    def forward(self, x):
        h = torch.tanh(self.conv(x)).transpose(1, 2)  # (n, T, 6)
        h = self.scale(h)
        a, _ = self.attn(h, h, h)
        return self.head(self.norm(h + a).mean(1))


def tokens(n, seed=0, vocab=11, t=5, classes=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, t), generator=g), torch.randint(0, classes, (n,), generator=g)


def transformer(batch_first=True, seed=0, **kw):
    torch.manual_seed(seed)
    return TokenTransformer(batch_first=batch_first, **kw).double().eval()


def mix(seed=0):
    torch.manual_seed(seed)
    return Mix().double().eval()


def mix_batch(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 7, generator=g, dtype=torch.float64), torch.randint(0, 4, (n,), generator=g)


def functional_modules(engine) -> set[type]:
    return {type(h.module) for h in engine._handlers if isinstance(h, FunctionalHandler)}


def check_engine_against_naive(engine, model, x, y):
    """grads, per-sample norms (flat and per layer), weighted sums and flat / layerwise clipped sums."""
    n = len(y)
    ref = naive_grads(model, x, y)
    assert maxdiff(engine.grads(x, y), ref) < 1e-10
    norms = engine.norms(x, y)
    ref_flat = flatten_grads(ref).norm(dim=1)
    assert torch.allclose(norms.flat, ref_flat, rtol=1e-10, atol=1e-13)
    for k, g in ref.items():
        assert torch.allclose(norms.layers[k], g.reshape(n, -1).norm(dim=1), rtol=1e-10, atol=1e-13), k
    assert torch.allclose(norms.loss, F.cross_entropy(model(x), y, reduction="none"), rtol=1e-12)

    c = 0.5 * float(ref_flat.median())  # DP-SGD's Abadi clipping, active for half the samples
    sums, _ = engine.clipped_sum(x, y, lambda nm: (c / nm.flat).clamp(max=1.0))
    f = (c / ref_flat).clamp(max=1.0)
    assert float(f.min()) < 1.0
    assert maxdiff(sums, {k: torch.einsum("n,n...->...", f, g) for k, g in ref.items()}) < 1e-10

    layer_c = {k: 0.5 * float(g.reshape(n, -1).norm(dim=1).median()) + 1e-12 for k, g in ref.items()}
    sums, _ = engine.clipped_sum(x, y, lambda nm: {k: (layer_c[k] / nm.layers[k]).clamp(max=1.0) for k in nm.layers})
    expect = {}
    for k, g in ref.items():
        fk = (layer_c[k] / g.reshape(n, -1).norm(dim=1)).clamp(max=1.0)
        expect[k] = torch.einsum("n,n...->...", fk, g)
    assert maxdiff(sums, expect) < 1e-10
    w = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert maxdiff(engine.weighted_sum(x, y, w), {k: torch.einsum("n,n...->...", w, g) for k, g in ref.items()}) < 1e-10


# ---------------------------------------------------------------------------------------------- routes


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "sequence-first"])
def test_transformer_mixed_route_equals_naive_loop(batch_first):
    model = transformer(batch_first)
    x, y = tokens(6)
    engine = PerSampleEngine(model, chunk=4)  # two chunks: 4 + 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback, no vmap performance notice
        check_engine_against_naive(engine, model, x, y)
    assert engine.strategy == "mixed"
    # attention (and its out_proj, used without being called) and the custom modules by torch.func; the
    # Linear, LayerNorm and Embedding layers by their handlers, wherever the batch sits
    assert functional_modules(engine) == {nn.MultiheadAttention, Positions, Scale}
    hooked = {type(h.module) for h in engine._handlers if not isinstance(h, FunctionalHandler)}
    assert hooked == {nn.Embedding, nn.Linear, nn.LayerNorm}


def test_transformer_whole_model_route_equals_naive_loop():
    model = transformer()
    x, y = tokens(5, seed=2)
    engine = PerSampleEngine(model, strategy="functorch")
    check_engine_against_naive(engine, model, x, y)
    assert engine.strategy == "functorch"


def test_mix_of_hooked_and_functional_layers_equals_naive_loop():
    model = mix()
    x, y = mix_batch(5)
    engine = PerSampleEngine(model)
    check_engine_against_naive(engine, model, x, y)
    assert engine.strategy == "mixed"
    assert functional_modules(engine) == {Scale, nn.MultiheadAttention}


class Gated(nn.Module):
    """Holds a Linear it never calls (its weight goes through F.linear in a gated form), like
    nn.MultiheadAttention's out_proj: the Linear's handler would see nothing."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)

    def forward(self, x):
        return torch.tanh(F.linear(x, self.lin.weight, self.lin.bias)) * torch.sigmoid(x)


def test_a_handled_layer_that_is_never_called_goes_to_its_caller():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), Gated(), nn.Linear(5, 3)).double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    engine = PerSampleEngine(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_engine_against_naive(engine, model, x, y)
    assert engine.strategy == "mixed" and functional_modules(engine) == {Gated}


class TorchLayers(nn.Module):
    """PyTorch layers without a landscape handler: transposed and 3-D convolutions, InstanceNorm with affine
    parameters, RMSNorm, PReLU (a parameter of its own) and Bilinear (two inputs)."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(2, 3, 3, stride=2)
        self.inorm = nn.InstanceNorm2d(3, affine=True)
        self.c3 = nn.Conv3d(1, 2, 2)
        self.rms = nn.RMSNorm(4)
        self.act = nn.PReLU(3)
        self.bil = nn.Bilinear(3, 4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = self.act(self.inorm(self.up(x))).mean((2, 3))  # (n, 3)
        v = self.c3(x.unsqueeze(1)).flatten(1)[:, :4]  # (n, 4)
        return self.head(torch.tanh(self.rms(self.bil(h, v))))


def test_other_torch_layers_take_the_functional_route():
    torch.manual_seed(0)
    model = TorchLayers().double()
    x, y = torch.randn(5, 2, 4, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    engine = PerSampleEngine(model, chunk=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "There is a performance drop")  # PyTorch: no vmap rule for bilinear
        check_engine_against_naive(engine, model, x, y)
    assert engine.strategy == "mixed"
    assert functional_modules(engine) == {nn.ConvTranspose2d, nn.InstanceNorm2d, nn.Conv3d, nn.RMSNorm, nn.PReLU,
                                          nn.Bilinear}


def test_masks_apply_on_functional_layers_too():
    model = mix()
    x, y = mix_batch(4, seed=3)
    g = torch.Generator().manual_seed(0)
    masks = {k: (torch.rand(p.shape, generator=g) > 0.4).double() for k, p in model.named_parameters()}
    ref = {k: v * masks[k] for k, v in naive_grads(model, x, y).items()}
    engine = PerSampleEngine(model)
    assert torch.allclose(engine.norms(x, y, masks=masks).flat, flatten_grads(ref).norm(dim=1), rtol=1e-10)
    f = torch.rand(4, dtype=torch.float64)
    sums, _ = engine.clipped_sum(x, y, lambda nm: f, masks=masks)
    assert maxdiff(sums, {k: torch.einsum("n,n...->...", f, v) for k, v in ref.items()}) < 1e-12


def test_dropout_in_training_mode_takes_the_whole_model_route():
    """A torch.func unit cannot redraw the forward's dropout masks: the engine says so and uses one vmap."""
    model = transformer(dropout=0.1).train()
    x, y = tokens(4)
    engine = PerSampleEngine(model)
    with pytest.warns(UserWarning, match="MultiheadAttention"):
        g = engine.grads(x, y)
    assert engine.strategy == "functorch"
    assert all(v.shape == (4, *p.shape) for v, p in zip(g.values(), engine.params.values(), strict=True))
    model.eval()  # without dropout the same engine is exact
    assert maxdiff(engine.grads(x, y), naive_grads(model, x, y)) < 1e-10


def test_batchnorm_in_training_mode_still_refused_in_one_line():
    model = nn.Sequential(nn.Linear(4, 4), Scale(4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    with pytest.raises(ModelError, match="BatchNorm") as e:
        PerSampleEngine(model)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------- registry


class ScaleHandler(Handler):
    """The closed form of Scale: g_i(scale) = sum over positions of input * output gradient."""

    roles = ("scale",)
    used = 0

    def per_sample_grads(self, u):
        ScaleHandler.used += 1
        return {"scale": sum((a * b).reshape(a.shape[0], -1, a.shape[-1]).sum(1) for a, b in u["calls"])}


class WrongScaleHandler(ScaleHandler):
    def per_sample_grads(self, u):
        return {"scale": 2 * super().per_sample_grads(u)["scale"]}


@pytest.fixture
def scale_handler():
    register_handler(Scale)(ScaleHandler)
    yield ScaleHandler
    unregister_handler(Scale)


def test_registered_handler_is_used_and_exact(scale_handler):
    model = mix()
    x, y = mix_batch(5, seed=4)
    engine = PerSampleEngine(model)
    assert any(isinstance(h, ScaleHandler) for h in engine._handlers)
    before = ScaleHandler.used
    check_engine_against_naive(engine, model, x, y)
    assert ScaleHandler.used > before
    assert functional_modules(engine) == {nn.MultiheadAttention}  # Scale no longer by torch.func
    # a model of Linear + Scale only is all hooks now
    torch.manual_seed(0)
    small = nn.Sequential(nn.Linear(4, 5), Scale(5), nn.Tanh(), nn.Linear(5, 3)).double()
    xs, ys = torch.randn(4, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    eng = PerSampleEngine(small, strategy="hooks")
    assert eng.strategy == "hooks"
    assert maxdiff(eng.grads(xs, ys), naive_grads(small, xs, ys)) < 1e-12


def test_a_wrong_registered_handler_is_caught_by_the_self_check():
    register_handler(Scale)(WrongScaleHandler)
    try:
        model = mix()
        x, y = mix_batch(4)
        engine = PerSampleEngine(model)
        with pytest.warns(UserWarning, match="check the registered handlers"):
            g = engine.grads(x, y)
        assert engine.strategy == "functorch"
        assert maxdiff(g, naive_grads(model, x, y)) < 1e-10
    finally:
        unregister_handler(Scale)


def test_registry_bad_input_and_replacement():
    with pytest.raises(UsageError, match="not an nn.Module"):
        register_handler(int)
    with pytest.raises(UsageError, match="Handler subclass"):
        register_handler(Scale)(object)
    with pytest.raises(UsageError, match="already has"):
        register_handler(nn.Linear)(ScaleHandler)
    assert persample.handler_for(nn.Linear(2, 2)) is persample.LinearHandler
    assert persample.handler_for(nn.Embedding(3, 2, sparse=True)) is None  # accepts() refuses it
    assert persample.handler_for(Scale(2)) is None

    class MyLinear(nn.Linear):
        pass

    assert persample.handler_for(MyLinear(2, 2)) is None  # exact types: a subclass may compute otherwise
    register_handler(MyLinear)(persample.LinearHandler)
    try:
        assert persample.handler_for(MyLinear(2, 2)) is persample.LinearHandler
        register_handler(MyLinear, replace=True)(ScaleHandler)
        assert persample.handler_for(MyLinear(2, 2)) is ScaleHandler
    finally:
        unregister_handler(MyLinear)


# ---------------------------------------------------------------------------------------------- analyses


def test_dp_sgd_step_on_a_user_model_equals_the_per_example_loop():
    x, y = tokens(8, seed=5)
    grads = {}
    for name in ("engine", "loop"):
        model = transformer(seed=1)
        cfg = PrivacyConfig(optimizer="dpsgd", max_grad_norm=0.05, noise_multiplier=1.0, clip_style="layerwise")
        engine = LoopEngine(model) if name == "loop" else None
        priv = Privatizer(model, cfg, expected_batch_size=8.0, generator=torch.Generator().manual_seed(3),
                          engine=engine)
        stats = priv.compute_gradients(x, y)
        assert float(stats.fraction_clipped) > 0
        grads[name] = {k: p.grad.clone() for k, p in model.named_parameters()}
    assert maxdiff(grads["engine"], grads["loop"]) < 1e-12


def test_dp_sgd_steps_train_a_user_model_with_dropout_and_odd_batches():
    """What `landscape train --optimizer dpsgd` does per step, on a transformer in training mode (dropout 0.1:
    the whole-model route, said once), through Poisson-like batches of 0, 1 and more examples."""
    model = transformer(dropout=0.1).float().train()
    x, _ = tokens(64, seed=8)
    y = x[:, 0] % 3  # a learnable task: the class of the first token
    cfg = PrivacyConfig(optimizer="dpsgd", max_grad_norm=1.0, noise_multiplier=0.3)
    priv = Privatizer(model, cfg, expected_batch_size=16.0, generator=torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with torch.no_grad():
        before = float(F.cross_entropy(model.eval()(x), y))
    model.train()
    batches = [torch.arange(0), torch.arange(1), *[torch.randperm(64, generator=torch.Generator().manual_seed(s))[:16]
                                                   for s in range(30)]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for idx in batches:
            stats = priv.compute_gradients(x[idx], y[idx])
            assert stats.batch_size == len(idx) and all(torch.isfinite(p.grad).all() for p in model.parameters())
            opt.step()
    said = [w for w in caught if "per-sample gradients" in str(w.message)]
    assert len(said) == 1 and "random" in str(said[0].message)
    assert priv.engine.strategy == "functorch"
    with torch.no_grad():
        after = float(F.cross_entropy(model.eval()(x), y))
    assert after < 0.95 * before, (before, after)  # learning (1.34 -> 1.18 when written)


def _point(model, x, y):
    """What an analysis' compute receives, for a model that landscape did not build."""
    data = types.SimpleNamespace(split=lambda name: (x, y))
    checkpoint = types.SimpleNamespace(data_spec={"name": "tokens"})
    return types.SimpleNamespace(
        model=lambda: model, split=lambda name, subset=None, seed=0: (x, y), data=data, checkpoint=checkpoint,
        masks=None, ref="user@0", step=0, epoch=0.0, tag={}, init=None, manifest=None,
        state=dict(model.named_parameters()),
    )


@pytest.mark.parametrize("clip_style", ["flat", "layerwise"])
def test_clipping_on_a_user_model_equals_the_naive_loop(clip_style):
    from landscape.analyze import clipping, specs

    model = transformer(seed=2)
    x, y = tokens(12, seed=6)
    c = float(flatten_grads(naive_grads(model, x, y)).norm(dim=1).quantile(0.5))  # half clipped, no ties
    cfg = specs.ClippingConfig(max_grad_norm=c, batch_size=6, batches=2, clip_style=clip_style, chunk=5)
    row, names, num_params = clipping.compute_point(_point(model, x, y), cfg)
    ref, _, _ = clipping.clipping_row(model, x, y, cfg, engine=LoopEngine(model))
    assert names == [k for k, _ in model.named_parameters()]
    assert 0 < row.total.fraction_clipped < 1
    for got, want in zip([row.total, *row.batches], [ref.total, *ref.batches], strict=True):
        for field in ("R", "projection", "bound", "fraction_clipped", "cos_clipped_mean", "mean_grad_norm"):
            assert math.isclose(getattr(got, field), getattr(want, field), rel_tol=1e-9, abs_tol=1e-12), field
        assert np.allclose(got.layer_R, want.layer_R, rtol=1e-9)


def test_norms_symmetry_and_ntk_on_a_user_model_equal_the_naive_loop():
    from landscape.analyze import norms, ntk, ntk_kernels, specs, symmetry
    from landscape.data import subset_indices

    model = transformer(seed=2)
    x, y = tokens(12, seed=6)
    ref = naive_grads(model, x, y)
    G = flatten_grads(ref)
    point = _point(model, x, y)

    cfg = specs.NormsConfig(subset=12, chunk=5)
    edges = norms.shared_edges([norms.value_range(point, cfg)], cfg)
    row, _, names = norms.compute_point(point, cfg, edges)
    idx = subset_indices(y, 12, cfg.subset_seed)  # the examples the one sampler draws (here: all 12)
    assert names == list(ref)
    assert np.allclose(row.grad_norms, G[idx].norm(dim=1).numpy(), rtol=1e-10)

    scfg = specs.SymmetryConfig(projections=3, subset=10, permutations=19, chunk=4)
    srow, shapes = symmetry.compute_point(point, scfg)
    want = symmetry.symmetry_row(model, x, y, scfg, engine=LoopEngine(model))
    assert shapes == [tuple(p.shape) for p in model.parameters()]
    assert np.allclose(srow.stats.plane, want.stats.plane, rtol=1e-9, atol=1e-12)
    assert np.allclose(srow.stats.skew, want.stats.skew, rtol=1e-8, atol=1e-10)

    lk = ntk_kernels.layer_kernels(model, x, y)
    for i, k in enumerate(lk.layer_names):
        gk = ref[k].reshape(12, -1)
        assert np.allclose(lk.K_layers[i], (gk @ gk.T).numpy(), rtol=1e-9, atol=1e-12), k
    result = ntk.compute_point(point, specs.NTKConfig(subset=12, clip_style="flat", max_grad_norm=1.0))
    Gs = G[torch.as_tensor(result.indices)]
    assert np.allclose(result.K, (Gs @ Gs.T).numpy(), rtol=1e-9, atol=1e-12)
    c = np.minimum(1.0, 1.0 / Gs.norm(dim=1).numpy())
    assert np.allclose(result.A, (Gs @ Gs.T).numpy() * c[None, :], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "sequence-first"])
def test_gram_blocks_on_the_transformer(batch_first):
    from landscape.gram import gram_blocks

    model = transformer(batch_first, seed=3)
    x, y = tokens(5, seed=7)
    ref = naive_grads(model, x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        blocks = gram_blocks(model, x, y)
    for k, g in ref.items():
        gk = g.reshape(5, -1)
        assert torch.allclose(blocks[k], gk @ gk.T, rtol=1e-9, atol=1e-12), k


def test_output_ntk_blocks_on_the_transformer():
    """kind="output": J_r J_r^T per layer (rows sample-major), against per-sample, per-logit autograd."""
    from landscape.gram import gram_blocks

    model = transformer(False, seed=4)
    x, _ = tokens(3, seed=9)
    named = [(k, p) for k, p in model.named_parameters()]
    rows = {k: [] for k, _ in named}
    for i in range(3):
        out = model(x[i : i + 1])[0]
        for m in range(out.shape[0]):
            gs = torch.autograd.grad(out[m], [p for _, p in named], retain_graph=True)
            for (k, _), g in zip(named, gs, strict=True):
                rows[k].append(g.reshape(-1))
    blocks = gram_blocks(model, x, kind="output")
    for k, r in rows.items():
        J = torch.stack(r)
        assert torch.allclose(blocks[k], J @ J.T, rtol=1e-9, atol=1e-12), k


class Stack(nn.Module):
    """A model assembled from a drawn list of blocks, on sequences (n, T, d) or, per block, (T, n, d)."""

    KINDS = ("linear", "scale", "layernorm", "attention", "gated")

    def __init__(self, kinds, seq_first, d=4):
        super().__init__()
        self.seq_first = seq_first
        blocks = {"linear": lambda: nn.Linear(d, d), "scale": lambda: Scale(d), "layernorm": lambda: nn.LayerNorm(d),
                  "attention": lambda: nn.MultiheadAttention(d, 2, batch_first=not seq_first), "gated": lambda: Gated4()}
        self.blocks = nn.ModuleList([blocks[k]() for k in kinds])
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        h = x.transpose(0, 1) if self.seq_first else x
        for b in self.blocks:
            h = h + (b(h, h, h)[0] if isinstance(b, nn.MultiheadAttention) else torch.tanh(b(h)))
        h = h.transpose(0, 1) if self.seq_first else h
        return self.head(h.mean(1))


class Gated4(Gated):
    def __init__(self):
        nn.Module.__init__(self)
        self.lin = nn.Linear(4, 4)


@settings(max_examples=12, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(Stack.KINDS), min_size=1, max_size=4),
    seq_first=st.booleans(),
    n=st.integers(1, 5),
    chunk=st.sampled_from([None, 2]),
    seed=st.integers(0, 2**16),
)
def test_any_stack_of_blocks_equals_the_naive_loop(kinds, seq_first, n, chunk, seed):
    """Per-sample gradients and clipped sums of models assembled from handled and unhandled blocks, the batch
    first or not, in chunks or not, equal the per-example loop."""
    torch.manual_seed(seed)
    model = Stack(kinds, seq_first).double().eval()
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 3, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)
    ref = naive_grads(model, x, y)
    engine = PerSampleEngine(model, chunk=chunk)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert maxdiff(engine.grads(x, y), ref) < 1e-10
        flat = flatten_grads(ref).norm(dim=1)
        c = float(flat.mean())  # Abadi clipping; the factors are called chunk by chunk
        sums, norms = engine.clipped_sum(x, y, lambda nm: (c / nm.flat).clamp(max=1.0))
    f = (c / flat).clamp(max=1.0)
    assert maxdiff(sums, {k: torch.einsum("n,n...->...", f, v) for k, v in ref.items()}) < 1e-10
    assert torch.allclose(norms.flat, flat, rtol=1e-10, atol=1e-13)
    assert engine.strategy in ("hooks", "mixed")


class Folded(nn.Module):
    """A Linear called on the batch folded with the positions ((n T, d)): no module sees one sample per index."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        n, t, d = x.shape
        return self.head(torch.tanh(self.lin(x.reshape(n * t, d))).reshape(n, t, d).mean(1))


def test_folded_batch_falls_back_to_torch_func_in_the_engine_and_the_gram_blocks():
    from landscape.gram import gram_blocks

    torch.manual_seed(0)
    model = Folded().double()
    x, y = torch.randn(4, 3, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    ref = naive_grads(model, x, y)
    engine = PerSampleEngine(model)
    with pytest.warns(UserWarning, match="batch on dim 0"):
        assert maxdiff(engine.grads(x, y), ref) < 1e-12
    assert engine.strategy == "functorch"
    with pytest.warns(UserWarning, match="using torch.func on the whole model"):
        blocks = gram_blocks(model, x, y)
    for k, g in ref.items():
        assert torch.allclose(blocks[k], g.reshape(4, -1) @ g.reshape(4, -1).T, rtol=1e-10, atol=1e-13), k
    with pytest.raises(ModelError, match="cannot capture"):
        gram_blocks(model, x, y, strategy="materialize")


class DataDependent(nn.Module):
    """Calls its custom layer once or twice depending on the data: a route planned on one batch may not fit."""

    def __init__(self):
        super().__init__()
        self.scale = Scale(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = self.scale(x)
        if float(x.sum()) > 0:
            h = self.scale(h)
        return self.head(h)


def test_a_custom_layer_called_a_varying_number_of_times():
    """The route is planned on the first batch (Scale called twice); a batch that calls it once still fits."""
    torch.manual_seed(0)
    model = DataDependent().double()
    engine = PerSampleEngine(model)
    x, y = torch.rand(3, 4, dtype=torch.float64), torch.tensor([0, 1, 2])
    for xb in (x, -x):  # every sample takes the batch's branch, so the per-example loop is the reference
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert maxdiff(engine.grads(xb, y), naive_grads(model, xb, y)) < 1e-12
    assert engine.strategy == "mixed"
