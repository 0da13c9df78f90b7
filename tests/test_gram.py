"""Per-layer Gram blocks against independent references: a naive per-example loop and jacrev."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, jacrev

from landscape.errors import ModelError, UsageError
from landscape.gram import gram_blocks, parse_memory
from landscape.models import build_model

STRATEGIES = ["functorch", "materialize", "ghost", "auto"]


class TinyCNN(nn.Module):
    """A small conv/GroupNorm/linear net (fast stand-in for resnet18's layer types)."""

    def __init__(self, classes: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.gn1 = nn.GroupNorm(2, 4)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=2)
        self.gn2 = nn.GroupNorm(3, 6)
        self.fc = nn.Linear(6 * 3 * 3, classes)

    def forward(self, x):
        h = torch.relu(self.gn1(self.conv1(x)))
        h = torch.relu(self.gn2(self.conv2(h)))
        return self.fc(h.flatten(1))


def _model(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    if name == "tiny-cnn":
        model, shape, classes = TinyCNN(), (3, 7, 7), 3
    elif name == "opacus-cnn":
        model, shape, classes = build_model("opacus-cnn", input_shape=(1, 8, 8), num_classes=10), (1, 8, 8), 10
    elif name == "resnet18":
        model, shape, classes = build_model("resnet18", input_shape=(3, 8, 8), num_classes=3, norm="group"), (3, 8, 8), 3
    else:
        model, shape, classes = build_model("mlp", input_shape=(12,), num_classes=4, widths=[7, 5]), (12,), 4
    model = model.double()
    # perturb GroupNorm affine parameters so their gradients are not trivially structured
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x = torch.randn(5, *shape, dtype=torch.float64)
    y = torch.randint(0, classes, (5,))
    return model, x, y


def _naive_loss_grams(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """K_r = G_r G_r^T with G_r from one autograd call per example (reference)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    rows: dict[str, list[torch.Tensor]] = {n: [] for n, _ in named}
    model.eval()
    for i in range(x.shape[0]):
        loss = F.cross_entropy(model(x[i: i + 1]), y[i: i + 1], reduction="sum")
        grads = torch.autograd.grad(loss, [p for _, p in named])
        for (n, _), g in zip(named, grads, strict=True):
            rows[n].append(g.reshape(-1))
    return {n: torch.stack(r) @ torch.stack(r).T for n, r in rows.items()}


def _naive_flat(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(x.shape[0]):
        loss = F.cross_entropy(model(x[i: i + 1]), y[i: i + 1], reduction="sum")
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    return torch.stack(rows)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


@pytest.fixture(scope="module", params=["tiny-cnn", "opacus-cnn", "mlp"])
def case(request):
    model, x, y = _model(request.param)
    return request.param, model, x, y, _naive_loss_grams(model, x, y)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_loss_grad_blocks_match_naive_loop(case, strategy):
    _, model, x, y, ref = case
    K = gram_blocks(model, x, y, strategy=strategy)
    assert list(K) == list(ref)
    for layer, block in K.items():
        assert block.dtype == torch.float64 and block.shape == (5, 5)
        assert _rel(block, ref[layer]) < 1e-6, layer
    total = sum(K.values())
    assert _rel(total, sum(ref.values())) < 1e-6
    # sum_r K_r = K = G G^T with G the flattened per-sample gradients of the naive loop
    G = _naive_flat(model, x, y)
    assert _rel(total, G @ G.T) < 1e-6


def test_resnet18_groupnorm_matches_naive_loop():
    model, x, y = _model("resnet18")
    x, y = x[:3], y[:3]
    ref = _naive_loss_grams(model, x, y)
    K = gram_blocks(model, x, y)
    for layer, block in K.items():
        assert _rel(block, ref[layer]) < 1e-6, layer


def test_memory_bound_chunks_over_sample_pairs(case):
    """A tiny budget forces one-sample chunks, re-captured pairs and sub-blocks: same blocks."""
    _, model, x, y, ref = case
    K = gram_blocks(model, x, y, max_memory=20_000)
    for layer, block in K.items():
        assert _rel(block, ref[layer]) < 1e-6, layer


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_output_kind_matches_jacrev(strategy):
    model, x, _ = _model("tiny-cnn")
    x = x[:4]
    params = {k: v.detach() for k, v in model.named_parameters()}
    jac = jacrev(lambda p: functional_call(model, p, (x,)))(params)  # name -> (n, M, *shape)
    K = gram_blocks(model, x, kind="output", strategy=strategy)
    T = gram_blocks(model, x, kind="output-trace", strategy=strategy)
    for layer, j in jac.items():
        n, M = j.shape[:2]
        J = j.reshape(n * M, -1)
        ref = J @ J.T
        assert K[layer].shape == (n * M, n * M)
        assert _rel(K[layer], ref) < 1e-6, layer
        trace = ref.reshape(n, M, n, M).diagonal(dim1=1, dim2=3).sum(-1)
        assert _rel(T[layer], trace) < 1e-6, layer


def test_blocks_are_symmetric_and_psd(case):
    _, model, x, y, _ = case
    for block in gram_blocks(model, x, y).values():
        assert torch.equal(block, block.T)
        assert torch.linalg.eigvalsh(block).min() >= -1e-10 * max(float(block.norm()), 1e-300)


def test_float32_model_keeps_small_tensors_accurate():
    """precision='auto': GroupNorm biases etc. are contracted in float64 even for a float32 model."""
    model, x, y = _model("tiny-cnn")
    ref = _naive_loss_grams(model, x, y)
    K = gram_blocks(model.float(), x.float(), y)
    small = [k for k in K if "gn" in k or "norm" in k or k.endswith("bias")]
    assert small
    for layer, block in K.items():
        assert block.dtype == torch.float64
        assert _rel(block, ref[layer]) < 1e-4, layer


def test_layers_selection_and_model_left_untouched():
    model, x, y = _model("opacus-cnn")
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    K = gram_blocks(model, x, y, layers=["*.bias"])
    assert K and all(k.endswith("bias") for k in K)
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(UsageError, match="matches no trainable parameter"):
        gram_blocks(model, x, y, layers=["nothing*"])


class _Odd(nn.Module):
    """Modules the hooks do not know (grouped conv, a bare parameter, a Linear used twice) -> torch.func."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, groups=2)
        self.scale = nn.Parameter(torch.tensor(1.3))
        self.shared = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = torch.tanh(self.conv(x)).mean((2, 3)) * self.scale
        return self.head(torch.tanh(self.shared(torch.tanh(self.shared(h)))))


def test_unsupported_modules_fall_back_to_functorch():
    torch.manual_seed(1)
    model = _Odd().double()
    x = torch.randn(4, 2, 5, 5, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0])
    ref = _naive_loss_grams(model, x, y)
    for strategy in ("auto", "ghost"):
        K = gram_blocks(model, x, y, strategy=strategy)
        for layer, block in K.items():
            assert _rel(block, ref[layer]) < 1e-6, (strategy, layer)


def test_batchnorm_without_running_statistics_refused_and_bad_options():
    """The blocks are computed in eval mode, where BatchNorm with running statistics acts per sample (exact:
    tests/test_persample_batchnorm.py); without them it normalises by the batch even there."""
    model = build_model("resnet18", input_shape=(3, 8, 8), num_classes=3, norm="batch")
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.track_running_stats, m.running_mean, m.running_var = False, None, None
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(ModelError, match="norm='group'"):
        gram_blocks(model, x, torch.tensor([0, 1]))
    small, x, y = _model("mlp")
    with pytest.raises(UsageError):
        gram_blocks(small, x, y, kind="nope")
    with pytest.raises(UsageError):
        gram_blocks(small, x, None, kind="loss-grad")


def test_parse_memory():
    assert parse_memory("4GB") == 4 * 10**9
    assert parse_memory("512MiB") == 512 * 1024**2
    assert parse_memory("2e9") == 2 * 10**9
    assert parse_memory(1000) == 1000
    assert parse_memory(None) is None and parse_memory("none") is None
    with pytest.raises(UsageError):
        parse_memory("lots")
    with pytest.raises(UsageError):
        parse_memory("-1GB")


def test_diagonals_agree_with_persample_engine_norms():
    """sqrt(K_r[i, i]) are the per-layer gradient norms the training engine clips with."""
    from landscape.persample import PerSampleEngine

    model, x, y = _model("tiny-cnn")
    K = gram_blocks(model, x, y)
    norms = PerSampleEngine(model).norms(x, y)
    for layer, block in K.items():
        torch.testing.assert_close(block.diagonal().sqrt(), norms.layers[layer].to(torch.float64), rtol=1e-9, atol=0)
    torch.testing.assert_close(sum(K.values()).diagonal().sqrt(), norms.flat.to(torch.float64), rtol=1e-9, atol=0)


class _Wide(nn.Module):
    """Layers the shared per-sample handlers cover beyond Linear/Conv2d/GroupNorm: an embedding, a dilated
    circular Conv1d, a grouped reflect-padded Conv2d, a Linear on sequences, LayerNorm, a Linear called twice."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3, padding_idx=0)
        self.c1d = nn.Conv1d(3, 4, 3, padding=2, dilation=2, padding_mode="circular")
        self.c2 = nn.Conv2d(2, 4, 3, padding=1, padding_mode="reflect", groups=2)
        self.seq = nn.Linear(4, 6)
        self.ln = nn.LayerNorm(6)
        self.shared = nn.Linear(6, 6)
        self.head = nn.Linear(6 + 4, 3)

    def forward(self, inp):
        img, tok = inp[:, :32].reshape(-1, 2, 4, 4), inp[:, 32:].round().long().clamp(0, 4)
        s = torch.tanh(self.c1d(self.emb(tok).transpose(1, 2))).mean(2)
        h = torch.tanh(self.c2(img)).flatten(2).transpose(1, 2)  # (n, 16, 4)
        h = self.ln(torch.tanh(self.seq(h))).mean(1)
        h = torch.tanh(self.shared(torch.tanh(self.shared(h))))
        return self.head(torch.cat([h, s], 1))


@pytest.mark.parametrize("strategy", ["materialize", "ghost", "auto"])
def test_shared_handlers_cover_more_layer_types(monkeypatch, strategy):
    """Every parameter of _Wide goes through the per-sample handlers (torch.func is never called), and the
    blocks equal the naive loop (loss-grad, also under a tiny memory budget) and jacrev (output kind)."""
    import landscape.gram as gram

    def no_functorch(model, names, *args):
        raise AssertionError(f"torch.func called for {names}")

    monkeypatch.setattr(gram, "functorch_grads", no_functorch)
    torch.manual_seed(3)
    model = _Wide().double()
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(4, 32, generator=g, dtype=torch.float64),
                   torch.randint(0, 5, (4, 6), generator=g).double()], 1)
    y = torch.tensor([0, 2, 1, 2])
    ref = _naive_loss_grams(model, x, y)
    for budget in (None, 20_000):
        K = gram_blocks(model, x, y, strategy=strategy, max_memory=budget)
        for layer, block in K.items():
            assert _rel(block, ref[layer]) < 1e-9, (budget, layer)
    params = {k: v.detach() for k, v in model.named_parameters()}
    jac = jacrev(lambda p: functional_call(model, p, (x,)))(params)
    K = gram_blocks(model, x, kind="output", strategy=strategy)
    for layer, j in jac.items():
        J = j.reshape(j.shape[0] * j.shape[1], -1)
        assert _rel(K[layer], J @ J.T) < 1e-9, layer


class _TiedLM(nn.Module):
    """A bag-of-tokens language model whose output layer shares the embedding matrix (weight tying): the
    Embedding and the Linear hold one parameter, so neither module's hooks see all of its gradient."""

    def __init__(self, vocab: int = 5, dim: int = 3):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, vocab)
        self.out.weight = self.emb.weight

    def forward(self, tokens):
        return self.out(torch.tanh(self.mix(self.emb(tokens).mean(1))))


def test_tied_parameter_goes_to_functorch():
    torch.manual_seed(4)
    model = _TiedLM().double()
    tokens = torch.randint(0, 5, (6, 4))
    y = torch.randint(0, 5, (6,))
    ref = _naive_loss_grams(model, tokens, y)
    assert "emb.weight" in ref
    K = gram_blocks(model, tokens, y, strategy="ghost")
    assert list(K) == list(ref)
    for layer, block in K.items():
        assert _rel(block, ref[layer]) < 1e-9, layer
