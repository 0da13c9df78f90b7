"""BatchNorm in the per-sample engine: exact in eval mode (running statistics), refused where it mixes samples.

References: a naive per-example loop in float64 (one forward/backward per example, which no batch statistic can
reach) and the engine's whole-model ``torch.func`` route; the analyses (ntk, norms) on a BatchNorm ResNet-18 run
against the same loop."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_persample import maxdiff, naive_grads  # the per-example loop reference
from torch import nn

from landscape.errors import ModelError, UsageError
from landscape.gram import gram_blocks
from landscape.models import build_model
from landscape.persample import BatchNormHandler, PerSampleEngine, flatten_grads, handler_for


def calibrated(model: nn.Module, shape, seed=0) -> nn.Module:
    """``model`` in float64 with running statistics and affine parameters far from their defaults (so that a
    handler ignoring the mean, the variance or eps would be caught), returned in eval mode."""
    g = torch.Generator().manual_seed(seed)
    model = model.double().train()
    with torch.no_grad():
        for _ in range(3):
            model(2.0 * torch.randn(16, *shape, generator=g, dtype=torch.float64) + 0.5)
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.affine:
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=g, dtype=torch.float64))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g, dtype=torch.float64))
                m.eps = 0.1
    return model.eval()


class SmallBN(nn.Module):
    """Conv + BatchNorm2d twice, a BatchNorm1d on features and a BatchNorm1d on (N, C, L) sequences."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4)
        self.seq = nn.BatchNorm1d(4)
        self.fc = nn.Linear(64, 6)
        self.bn3 = nn.BatchNorm1d(6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        h = self.seq(h.flatten(2)).flatten(1)
        return self.head(torch.tanh(self.bn3(self.fc(h))))


def small_bn():
    torch.manual_seed(0)
    return calibrated(SmallBN(), (2, 6, 6))


def data(shape, n, classes, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=g, dtype=torch.float64), torch.randint(0, classes, (n,), generator=g)


# ---------------------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("strategy", ["auto", "hooks", "functorch"])
def test_small_cnn_in_eval_mode_equals_the_naive_loop(strategy):
    model = small_bn()
    x, y = data((2, 6, 6), 7, 3)
    ref = naive_grads(model, x, y)
    engine = PerSampleEngine(model, strategy=strategy, chunk=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the BatchNorm handler is exact
        g = engine.grads(x, y)
    assert engine.strategy == ("functorch" if strategy == "functorch" else "hooks")
    assert maxdiff(g, ref) < 1e-12
    norms = engine.norms(x, y)
    flat = flatten_grads(ref).norm(dim=1)
    assert torch.allclose(norms.flat, flat, rtol=1e-12, atol=0)
    for k in ref:
        assert torch.allclose(norms.layers[k], ref[k].flatten(1).norm(dim=1), rtol=1e-12, atol=1e-300)
    sums, _ = engine.clipped_sum(x, y, lambda nm: (0.5 / nm.flat).clamp(max=1.0))
    c = (0.5 / flat).clamp(max=1.0)
    assert maxdiff(sums, {k: torch.einsum("n,n...->...", c, v) for k, v in ref.items()}) < 1e-12
    assert maxdiff(engine.mean_grad(x, y), {k: v.mean(0) for k, v in ref.items()}) < 1e-12
    v = torch.randn(2, flatten_grads(ref).shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(engine.projections(x, y, v), flatten_grads(ref) @ v.T, rtol=1e-10, atol=1e-12)


def test_handlers_cover_every_batchnorm_and_batchnorm3d():
    model = small_bn()
    assert all(handler_for(m) is BatchNormHandler for m in model.modules()
               if isinstance(m, nn.modules.batchnorm._BatchNorm))
    torch.manual_seed(0)
    net = calibrated(nn.Sequential(nn.Conv3d(1, 3, 2), nn.BatchNorm3d(3), nn.Flatten(), nn.Linear(3 * 8, 4)),
                     (1, 3, 3, 3))
    x, y = data((1, 3, 3, 3), 5, 4)
    engine = PerSampleEngine(net)  # Conv3d has no handler: the mixed route, BatchNorm3d by its handler
    assert maxdiff(engine.grads(x, y), naive_grads(net, x, y)) < 1e-12
    assert engine.strategy == "mixed"


def test_frozen_or_affine_free_batchnorm():
    """Frozen affine parameters are no per-sample gradient; affine=False (no parameters) needs no handler."""
    model = small_bn()
    model.bn1.weight.requires_grad_(False)
    x, y = data((2, 6, 6), 4, 3)
    engine = PerSampleEngine(model, strategy="hooks")
    g = engine.grads(x, y)
    assert "bn1.weight" not in g and maxdiff(g, naive_grads(model, x, y)) < 1e-12
    torch.manual_seed(0)
    plain = calibrated(nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4, affine=False), nn.Linear(4, 3)), (5,))
    x, y = data((5,), 4, 3)
    assert maxdiff(PerSampleEngine(plain, strategy="hooks").grads(x, y), naive_grads(plain, x, y)) < 1e-12


@pytest.fixture(scope="module")
def resnet():
    from torchvision.models import resnet18

    torch.manual_seed(0)
    return calibrated(resnet18(weights=None, num_classes=5), (3, 32, 32))


def test_torchvision_resnet18_in_eval_mode_equals_the_naive_loop_and_torch_func(resnet):
    x, y = data((3, 32, 32), 3, 5)
    ref = naive_grads(resnet, x, y)
    engine = PerSampleEngine(resnet)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = engine.grads(x, y)
    assert engine.strategy == "hooks"  # every BatchNorm2d by its handler, no fallback
    scale = max(float(v.abs().max()) for v in ref.values())
    assert maxdiff(g, ref) < 1e-10 * scale
    func = PerSampleEngine(resnet, strategy="functorch").grads(x, y)
    assert maxdiff(g, func) < 1e-10 * scale
    bn = [k for k in ref if k.startswith("layer4.1.bn2")]
    assert bn and all(float(ref[k].abs().max()) > 0 for k in bn)  # the BatchNorm gradients compared are not zero
    assert torch.allclose(engine.norms(x, y).flat, flatten_grads(ref).norm(dim=1), rtol=1e-10)


@pytest.mark.parametrize("strategy", ["auto", "ghost", "functorch"])
def test_gram_blocks_of_a_batchnorm_model_equal_the_naive_loop(strategy):
    """gram_blocks runs the model in eval mode: a BatchNorm model in training mode is accepted there (and left
    in training mode), with the eval-mode kernel; the output kind (one backward per logit) too."""
    model = small_bn().train()
    x, y = data((2, 6, 6), 5, 3)
    blocks = gram_blocks(model, x, y, strategy=strategy)
    out = gram_blocks(model, x, kind="output", strategy=strategy)
    assert model.training and all(m.training for m in model.modules())
    ref = naive_grads(model.eval(), x, y)
    for k, G in ref.items():
        G = G.flatten(1)
        assert torch.allclose(blocks[k], G @ G.T, rtol=1e-10, atol=1e-14), k
    from torch.func import functional_call, jacrev, vmap

    params = {k: p.detach() for k, p in model.named_parameters()}
    jac = vmap(jacrev(lambda p, xi: functional_call(model, p, (xi.unsqueeze(0),)).squeeze(0)), in_dims=(None, 0))
    J = jac(params, x)  # (n, M, *shape) per parameter, eval mode
    for k, Jk in J.items():
        Jk = Jk.reshape(5 * 3, -1)
        assert torch.allclose(out[k], Jk @ Jk.T, rtol=1e-10, atol=1e-14), k


# ---------------------------------------------------------------------------------------------- refusals


def test_training_mode_is_refused_in_one_line():
    model = small_bn().train()
    with pytest.raises(ModelError, match="training mode") as e:
        PerSampleEngine(model)
    msg = str(e.value)
    assert "\n" not in msg and "bn1: BatchNorm2d" in msg and "model.eval()" in msg
    assert 'norm="group"' in msg and "convert_batchnorm_to_groupnorm" in msg


def test_batchnorm_without_running_statistics_is_refused_even_in_eval_mode():
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4, track_running_stats=False), nn.Linear(4, 3)).eval()
    for call in (lambda: PerSampleEngine(model), lambda: gram_blocks(model, torch.randn(3, 5), torch.zeros(3).long())):
        with pytest.raises(ModelError, match="track_running_stats=False") as e:
            call()
        assert "\n" not in str(e.value)


def test_switching_to_training_mode_mid_way_is_refused_and_back_to_eval_works():
    model = small_bn()
    x, y = data((2, 6, 6), 4, 3)
    engine = PerSampleEngine(model)
    before = engine.grads(x, y)
    model.bn2.train()  # one layer is enough
    stats = model.bn2.running_mean.clone()
    calls = [engine.norms, engine.grads, engine.mean_grad, lambda a, b: engine.weighted_sum(a, b, torch.ones(4)),
             lambda a, b: engine.clipped_sum(a, b, lambda nm: torch.ones(len(nm))),
             lambda a, b: engine.projections(a, b, torch.zeros(1, flatten_grads(before).shape[1]))]
    for call in calls:
        with pytest.raises(ModelError, match=r"bn2: BatchNorm2d\) that is in training mode"):
            call(x, y)
    assert torch.equal(model.bn2.running_mean, stats)  # refused before any forward: statistics untouched
    model.eval()
    assert maxdiff(engine.grads(x, y), before) == 0


def test_dp_training_with_batchnorm_is_still_refused():
    """DP-SGD trains in training mode, where BatchNorm mixes the batch: the privatizer's engine refuses it."""
    from landscape.train.privatize import PrivacyConfig, Privatizer

    priv = Privatizer(small_bn().train(), PrivacyConfig(), expected_batch_size=4, generator=torch.Generator())
    with pytest.raises(ModelError, match="training mode"):
        priv.engine  # noqa: B018 (the engine is built on first use)


# ---------------------------------------------------------------------------------------------- chunk


def test_chunk_bounds_memory_never_the_gradients():
    model = small_bn()
    x, y = data((2, 6, 6), 5, 3)
    new = PerSampleEngine(model, chunk=2)
    assert new.chunk == 2
    assert maxdiff(new.grads(x, y), PerSampleEngine(model).grads(x, y)) < 1e-14
    with pytest.raises(UsageError, match="chunk must be a positive integer"):
        PerSampleEngine(model, chunk=0)


# ---------------------------------------------------------------------------------------------- analyses


@pytest.fixture(scope="module")
def bn_store(tmp_path_factory):
    """A run of ResNet-18 with BatchNorm on digits, its statistics and affine parameters moved from the
    defaults (as after training)."""
    from landscape.data import load_dataset
    from landscape.store import Store

    root = tmp_path_factory.mktemp("store")
    ds = load_dataset("digits", seed=0)
    torch.manual_seed(0)
    model = build_model("resnet18", input_shape=ds.input_shape, num_classes=ds.num_classes, norm="batch")
    model = calibrated(model, tuple(ds.input_shape)).float()
    run = Store(root).create_run("bn", config={}, seeds={}, model_spec=model.landscape_spec, data_spec=ds.spec)
    run.save_checkpoint(model.state_dict(), step=0, epoch=0.0)
    return root


def _reference(root, indices=None, x=None, y=None):
    from landscape.store import Store

    point = Store(root).load("bn@last")
    model = point.build_model().double().eval()
    if indices is not None:
        from landscape.data import dataset_from_spec

        xs, ys = dataset_from_spec(point.data_spec).split("train")
        x, y = xs[indices], ys[indices]
    return flatten_grads(naive_grads(model, x.double(), y))


def test_ntk_analysis_of_a_batchnorm_model_equals_the_naive_loop(bn_store, tmp_path):
    from landscape.api import ntk

    res = ntk("bn@last", root=bn_store, output=tmp_path / "k.h5", figure=False, subset=6, precision="float64")
    G = _reference(bn_store, indices=torch.as_tensor(res.indices))
    K = (G @ G.T).numpy()
    np.testing.assert_allclose(res.K, K, rtol=1e-9, atol=1e-12 * np.abs(K).max())
    np.testing.assert_allclose(res.norms, G.norm(dim=1).numpy(), rtol=1e-9)
    # a layer subset: the kernel of those layers, the norms (flat clipping's) still of the whole gradient
    part = ntk("bn@last", root=bn_store, output=tmp_path / "p.h5", figure=False, subset=6, precision="float64",
               layers=("layer4.1.bn2.*",))
    assert part.layer_names == ["layer4.1.bn2.weight", "layer4.1.bn2.bias"]
    np.testing.assert_allclose(part.norms, G.norm(dim=1).numpy(), rtol=1e-9)


def test_norms_analysis_of_a_batchnorm_model_equals_the_naive_loop(bn_store, tmp_path):
    from landscape.api import norms
    from landscape.data import dataset_from_spec, take_subset
    from landscape.store import Store

    res = norms(["bn"], root=bn_store, output=tmp_path / "n.h5", figure=False, subset=6, bins=10)
    row = res.runs[0].rows[0]
    spec = Store(bn_store).load("bn@last").data_spec
    xs, ys = take_subset(*dataset_from_spec(spec).split("train"), 6, res.config.subset_seed, split="train")
    ref = _reference(bn_store, x=xs, y=ys).norm(dim=1).numpy()
    np.testing.assert_allclose(row.grad_norms, ref, rtol=1e-4)  # the analysis runs the float32 model


def test_clipping_and_symmetry_put_a_batchnorm_model_in_eval_mode_and_equal_the_naive_loop():
    """Both analyses run the checkpoint's model in eval mode (a rebuilt model starts in training mode), so a
    BatchNorm model is accepted; their numbers equal those from a per-example loop on the eval-mode model."""
    import math
    import types

    from persample_reference import LoopEngine

    from landscape.analyze import clipping, specs, symmetry

    x, y = data((2, 6, 6), 12, 3, seed=4)
    point = types.SimpleNamespace(
        model=lambda: small_bn().train(), split=lambda name, subset=None, seed=0: (x, y), masks=None, ref="bn@0",
        step=0, epoch=0.0, tag={}, init=None, manifest=None, data=types.SimpleNamespace(split=lambda name: (x, y)),
        checkpoint=types.SimpleNamespace(data_spec={"name": "bn"}),
    )
    reference = small_bn()
    c = float(flatten_grads(naive_grads(reference, x, y)).norm(dim=1).quantile(0.5))
    cfg = specs.ClippingConfig(max_grad_norm=c, batch_size=6, batches=2, chunk=5)
    row, _, _ = clipping.compute_point(point, cfg)
    want, _, _ = clipping.clipping_row(reference, x, y, cfg, engine=LoopEngine(reference))
    assert 0 < row.total.fraction_clipped < 1
    for field in ("R", "projection", "bound", "fraction_clipped", "cos_clipped_mean", "mean_grad_norm"):
        assert math.isclose(getattr(row.total, field), getattr(want.total, field), rel_tol=1e-9, abs_tol=1e-12)
    scfg = specs.SymmetryConfig(projections=3, subset=10, permutations=19, chunk=4)
    srow, _ = symmetry.compute_point(point, scfg)
    swant = symmetry.symmetry_row(reference, x, y, scfg, engine=LoopEngine(reference))
    assert np.allclose(srow.stats.plane, swant.stats.plane, rtol=1e-9, atol=1e-12)
    assert np.allclose(srow.stats.skew, swant.stats.skew, rtol=1e-8, atol=1e-10)
