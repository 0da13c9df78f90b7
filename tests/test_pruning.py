"""Magnitude pruning: exact fractions, deterministic ties, rewind to init, zeros kept through DP-SGD."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from landscape.errors import IncompatibleError, UsageError
from landscape.train.privatize import PrivacyConfig, Privatizer
from landscape.train.pruning import (
    apply_masks,
    magnitude_masks,
    mask_optimizer_state_,
    mask_params_,
    rewind,
)


def lenet(seed=0):
    from landscape.models import build_model

    torch.manual_seed(seed)
    return build_model("lenet", input_shape=(1, 8, 8), num_classes=10)


@pytest.mark.parametrize("remove", [0.0, 0.3, 0.7, 0.95, 1.0])
def test_layer_scope_removes_exact_fraction(remove):
    model = lenet()
    masks = magnitude_masks(model, remove)
    names = [n for n, p in model.named_parameters() if n.endswith("weight") and p.ndim >= 2]
    assert sorted(masks) == sorted(names)  # biases (1-D) excluded by default
    params = dict(model.named_parameters())
    for n, m in masks.items():
        assert m.dtype == torch.bool and m.shape == params[n].shape
        assert int((~m).sum()) == round(remove * m.numel())
        if 0 < remove < 1:  # every removed weight is no larger than every kept one
            w = params[n].detach().abs()
            assert float(w[~m].max()) <= float(w[m].min())


def test_global_scope_and_ties():
    state = {"a.weight": torch.tensor([[1.0, -1.0], [1.0, 3.0]]), "b.weight": torch.tensor([[1.0, 0.5]])}
    m = magnitude_masks(state, 0.5, scope="global")
    # 6 weights, remove 3: 0.5 then the first two 1.0s by position
    assert m["a.weight"].tolist() == [[False, False], [True, True]]
    assert m["b.weight"].tolist() == [[True, False]]
    assert magnitude_masks(state, 0.5, scope="global")["a.weight"].equal(m["a.weight"])
    layer = magnitude_masks(state, 0.5)
    assert layer["a.weight"].tolist() == [[False, False], [True, True]]
    assert layer["b.weight"].tolist() == [[True, False]]


def test_bad_inputs():
    model = lenet()
    with pytest.raises(UsageError):
        magnitude_masks(model, 1.5)
    with pytest.raises(UsageError):
        magnitude_masks(model, 0.5, scope="block")
    with pytest.raises(IncompatibleError, match="nope"):
        magnitude_masks(model, 0.5, include=["nope"])
    masks = magnitude_masks(model, 0.5)
    other = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(IncompatibleError):
        mask_params_(other, masks)


def test_mask_from_other_run_needs_same_shapes():
    from landscape.models import build_model

    masks = magnitude_masks(build_model("lenet", input_shape=(1, 8, 8), num_classes=100), 0.5)
    target = lenet().state_dict()
    with pytest.raises(IncompatibleError, match="shape"):
        apply_masks(target, masks)


def test_rewind_survivors_equal_init():
    init = lenet(0).state_dict()
    trained = lenet(1).state_dict()
    masks = magnitude_masks(trained, 0.6)
    out = rewind(trained, init, masks)
    for n, t in out.items():
        if n in masks:
            assert torch.equal(t[masks[n]], init[n][masks[n]])
            assert bool((t[~masks[n]] == 0).all())
        else:
            assert torch.equal(t, init[n])
    with pytest.raises(IncompatibleError, match="initial"):
        rewind(trained, {k: v for k, v in init.items() if k != "0.weight"}, masks)


def test_pruned_weights_stay_zero_through_dp_sgd_with_momentum():
    model = lenet().double()
    masks = magnitude_masks(model, 0.7)
    mask_params_(model, masks)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=1e-3)
    priv = Privatizer(
        model,
        PrivacyConfig("dpsgd", max_grad_norm=1.0, noise_multiplier=2.0),
        expected_batch_size=8,
        generator=torch.Generator().manual_seed(0),
    )
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(8, 1, 8, 8, generator=g, dtype=torch.float64)
        y = torch.randint(0, 10, (8,), generator=g)
        opt.zero_grad()
        priv.compute_gradients(x, y, masks=masks)
        opt.step()
        mask_optimizer_state_(opt, model, masks)
    params = dict(model.named_parameters())
    for n, m in masks.items():
        assert bool((params[n][~m] == 0).all())  # exactly zero, noise included
        assert bool((params[n][m] != 0).all())
        assert bool((opt.state[params[n]]["momentum_buffer"][~m] == 0).all())


def test_training_from_pruned_run_keeps_zeros(tmp_path):
    """Through the real loop: prune -> `train --from RUN@init` with DP-SGD, momentum, sparsification, smoothing."""
    from landscape.api.pruning import PruneConfig, prune
    from landscape.api.training import TrainConfig, train
    from landscape.store import Store
    from landscape.train.pruning import load_masks

    model = lenet()
    store = Store(tmp_path)
    src = store.create_run(
        "src",
        config={},
        seeds={},
        model_spec=model.landscape_spec,
        data_spec={"name": "digits", "seed": 0, "subset": 200, "options": {}},
    )
    src.save_checkpoint(model.state_dict(), step=0, epoch=0.0)
    src.save_checkpoint(
        {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}, step=5, epoch=1.0
    )
    prune(PruneConfig(ref="src", remove=0.8, run="p80"), root=tmp_path)
    train(
        TrainConfig(
            from_ref="p80@init",
            data="digits",
            subset=200,
            epochs=2,
            batch_size=32,
            optimizer="dpsgd",
            noise_multiplier=2.0,
            momentum=0.9,
            sparsify=0.5,
            smooth=0.5,
            run="dp",
            device="cpu",
        ),
        root=tmp_path,
    )
    masks = load_masks(store.run("p80"))
    final = store.load("dp").state_dict
    for n, m in masks.items():
        assert bool((final[n][~m] == 0).all())
        assert bool((final[n][m] != 0).all())


# ------------------------------------------ one pruning/lineage/privacy function for both paths

TINY = dict(model="two-layer-linear", model_kwargs={"hidden": 8}, data="gaussian-signal",
            data_kwargs={"ds": 5, "dn": 45, "n": 130, "n_test": 20}, lr=0.1, momentum=0.0, batch_size=32,
            checkpoint_every="none", max_grad_norm=1.0)  # 5 steps per epoch (ceil(130/32))


def _opacus_epsilon(history, delta=1e-5):
    """Independent accountant: Opacus' RDPAccountant over the whole schedule (sigma, q, steps) per event."""
    import warnings

    accountants = pytest.importorskip("opacus.accountants")
    acc = accountants.RDPAccountant()
    acc.history = list(history)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return acc.get_epsilon(delta)


@pytest.fixture(scope="module")
def dp_source(tmp_path_factory):
    from landscape.train.config import TrainConfig
    from landscape.train.loop import train

    root = tmp_path_factory.mktemp("pruned-privacy")
    run = train(TrainConfig(**TINY, epochs=2, optimizer="dpsgd", noise_multiplier=1.0, run="src"), root=root,
                progress=False)
    return root, run.manifest["privacy"]["sample_rate"]


def test_clipping_prune_levels_retrained_epsilon_includes_the_source_steps(dp_source, tmp_path):
    """`clipping --prune-levels`: the mask came from 10 DP steps of the source; the retrained run's epsilon
    composes them with its own 10 (before the fix it recorded its own steps only)."""
    from landscape.api import clipping
    from landscape.store import Store
    from landscape.train.accounting import epsilon

    root, q = dp_source
    clipping("src@last", root=root, prune_levels=[0.5], batch_size=64, figure=False, output=tmp_path / "c.h5")
    store = Store(root)
    done = store.run("src-prune500-retrain")
    assert done.manifest["lineage"]["parent_run"] == "src-prune500"
    assert store.run("src-prune500").manifest["lineage"]["parent_ref"] == "src@last"
    recorded = done.checkpoints()[-1].epsilon
    assert recorded == pytest.approx(_opacus_epsilon([(1.0, q, 10), (1.0, q, 10)]), rel=1e-6)
    assert recorded > epsilon(1.0, q, 10) * 1.1
    assert done.manifest["privacy"]["non_private_ancestors"] is False
    # a repeated command reuses both runs instead of training again
    again = clipping("src@last", root=root, prune_levels=[0.5], batch_size=64, figure=False,
                     output=tmp_path / "d.h5")
    assert again.rows[0].ref == f"src-prune500-retrain@step={done.checkpoints()[-1].step}"
    assert [i.path for i in store.run("src-prune500-retrain").checkpoints()] == [i.path for i in done.checkpoints()]
    # a retrained run left by the old code (source history dropped) is refused, not silently reused
    store.run("src-prune500-retrain").update_manifest(privacy={**done.manifest["privacy"], "ancestor_events": []})
    with pytest.raises(UsageError, match="does not compose the DP history"):
        clipping("src@last", root=root, prune_levels=[0.5], batch_size=64, figure=False, output=tmp_path / "e.h5")


def test_prune_then_train_from_composes_the_same_way(dp_source):
    """`landscape prune` + `train --from`: the same function, the same composed epsilon."""
    from landscape.api.pruning import PruneConfig, prune
    from landscape.store import Store
    from landscape.train.config import TrainConfig
    from landscape.train.loop import train

    root, q = dp_source
    prune(PruneConfig(ref="src@last", remove=0.5, run="src-p50"), root=root)
    store = Store(root)
    assert store.run("src-p50").manifest["privacy"]["ancestor_events"] == [
        {"noise_multiplier": 1.0, "sample_rate": q, "steps": 10}]
    child = train(TrainConfig(from_ref="src-p50@init", epochs=3, optimizer="dpsgd", noise_multiplier=2.0, lr=0.1,
                              batch_size=32, checkpoint_every="none", run="src-p50-dp"), root=root, progress=False)
    assert child.checkpoints()[-1].epsilon == pytest.approx(_opacus_epsilon([(1.0, q, 10), (2.0, q, 15)]), rel=1e-6)
    assert child.checkpoints()[0].epsilon == pytest.approx(_opacus_epsilon([(1.0, q, 10)]), rel=1e-6)


def test_rewinding_to_another_runs_weights_composes_both_histories(dp_source):
    """Mask from one DP run, weights from another trained one: the pruned run depends on both."""
    from landscape.api.pruning import PruneConfig, prune
    from landscape.store import Store
    from landscape.train.config import TrainConfig
    from landscape.train.loop import train

    root, q = dp_source
    train(TrainConfig(**TINY, epochs=1, optimizer="dpsgd", noise_multiplier=3.0, seed=1, run="other"), root=root,
          progress=False)
    prune(PruneConfig(ref="src@last", remove=0.5, init="other@last", run="src-p50-other"), root=root)
    events = Store(root).run("src-p50-other").manifest["privacy"]["ancestor_events"]
    assert events == [{"noise_multiplier": 1.0, "sample_rate": q, "steps": 10},
                      {"noise_multiplier": 3.0, "sample_rate": q, "steps": 5}]


def test_non_private_source_is_flagged_through_prune_levels(tmp_path):
    from landscape.api import clipping
    from landscape.store import Store
    from landscape.train.config import TrainConfig
    from landscape.train.loop import train

    train(TrainConfig(**TINY, epochs=1, optimizer="sgd", run="sgd"), root=tmp_path, progress=False)
    clipping("sgd@last", root=tmp_path, prune_levels=[0.5], batch_size=64, figure=False, output=tmp_path / "c.h5")
    privacy = Store(tmp_path).run("sgd-prune500-retrain").manifest["privacy"]
    assert privacy["non_private_ancestors"] is True and privacy["ancestor_events"] == []
