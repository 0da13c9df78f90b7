"""Permutation alignment (Git Re-Basin weight matching): same function, exact recovery, lower barriers, bad input.

References: the model's own forward pass (a permutation must not change the logits), brute force over every
permutation (the assignment and one-layer weight matching), hand-written index arithmetic (LeNet's
flattened columns, GroupNorm's whole groups), and Watson et al.'s instability from ``landscape.analyze.
interpolate`` (0 between a model and itself).
"""

from __future__ import annotations

import copy
import itertools
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli
from torch import nn

from landscape.analyze.align import align_states, assign, similarity, weight_matching
from landscape.analyze.interpolate import interpolate as interpolate_states
from landscape.analyze.permutations import apply_permutation, invert, permutation_spec, random_permutation
from landscape.analyze.specs import InterpolateConfig
from landscape.data import load_dataset
from landscape.errors import ModelError, UsageError
from landscape.models import build_model
from landscape.store import Store

MODELS = [
    ("mlp", {"widths": [32, 16]}),
    ("two-layer-linear", {"hidden": 12}),
    ("lenet", {}),
    ("opacus-cnn", {}),
    ("resnet18", {}),  # GroupNorm, 32 groups
    ("resnet18", {"norm": "batch"}),
]


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def _model(name, seed=0, **kwargs):
    torch.manual_seed(seed)
    return build_model(name, input_shape=(1, 8, 8), num_classes=10, **kwargs).eval()


def _fit(model, digits, steps=60, seed=0):
    """A few full-batch Adam steps on 600 training digits (enough for a real basin; plain torch, no landscape)."""
    torch.manual_seed(seed)
    x, y = digits.x_train[:600], digits.y_train[:600]
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval()


def _logits(model, state, x):
    model = copy.deepcopy(model)  # a state_dict() shares its tensors with the model: never load into it
    model.load_state_dict(state)
    with torch.no_grad():
        return model(x)


def _randomise_norm_stats(state):
    """Non-trivial BatchNorm running statistics and norm scales, so that their permutation is tested."""
    g = torch.Generator().manual_seed(5)
    for k, v in state.items():
        if k.endswith("running_var") or k.endswith("bn1.weight") or k.endswith("bn2.weight"):
            state[k] = torch.rand(v.shape, generator=g) + 0.5
        elif k.endswith("running_mean") or k.endswith("bn1.bias"):
            state[k] = torch.randn(v.shape, generator=g)
    return state


# ------------------------------------------------------------------------------------------ same function


@pytest.mark.parametrize("name,kwargs", MODELS, ids=[f"{n}-{k.get('norm', '')}" for n, k in MODELS])
def test_permuted_model_computes_the_same_function(name, kwargs, digits):
    model = _model(name, **kwargs)
    state = _randomise_norm_stats(model.state_dict())
    spec = permutation_spec(model)
    perms = random_permutation(spec, seed=3)
    permuted = apply_permutation(spec, perms, state)
    changed = [k for k in state if not torch.equal(state[k], permuted[k])]
    assert len(changed) >= 2 * len(spec.perms)  # every permutation moved its weights
    x = digits.x_test[:100]
    before, after = _logits(model, state, x), _logits(model, permuted, x)
    assert torch.allclose(after, before, rtol=0, atol=1e-5), float((after - before).abs().max())
    scrambled = dict(permuted)  # the same permutation on one side of a layer only does change the function
    key = spec.perms[0].axes[0].key
    scrambled[key] = state[key]
    assert float((_logits(model, scrambled, x) - before).abs().max()) > 1e-3


def test_lenet_flattened_columns_move_in_channel_blocks():
    model = _model("lenet")
    spec = permutation_spec(model)
    assert [p.name for p in spec.perms] == ["0", "3", "7", "9"]
    state = model.state_dict()
    perms = random_permutation(spec, seed=1)
    out = apply_permutation(spec, perms, state)
    c2 = state["3.weight"].shape[0]
    fc = state["7.weight"].reshape(120, c2, -1)  # by hand: columns c*H*W .. (c+1)*H*W - 1 belong to channel c
    expected = fc[perms["7"]][:, perms["3"]].reshape(120, -1)
    assert torch.equal(out["7.weight"], expected)
    assert torch.equal(out["3.weight"], state["3.weight"][perms["3"]][:, perms["0"]])
    assert torch.equal(out["11.weight"], state["11.weight"][:, perms["9"]])
    assert torch.equal(out["11.bias"], state["11.bias"])  # the logits keep their order


def test_resnet18_groupnorm_permutations_keep_whole_groups():
    spec = permutation_spec(_model("resnet18", groups=4))
    names = [p.name for p in spec.perms]
    assert names[:2] == ["residual0", "layer1.0.inner"] and len(names) == 1 + 8 + 3  # stem + blocks + 3 stages
    assert all(p.groups == 4 for p in spec.perms)
    stream = spec.perm("residual2")
    assert {a.key for a in stream.axes} >= {"layer2.0.downsample.0.weight", "layer2.1.conv2.weight",
                                            "layer3.0.conv1.weight", "layer3.0.downsample.0.weight"}
    perms = random_permutation(spec, seed=0)
    for p in spec.perms:  # by hand: channel i and perm[i] sit in groups that map onto each other as wholes
        groups_of = perms[p.name].view(p.groups, -1) // p.group_size
        assert bool((groups_of == groups_of[:, :1]).all())
    bad = dict(perms)
    bad["residual0"] = torch.arange(64).roll(1)  # shifts every channel into the next group
    with pytest.raises(UsageError, match="splits a GroupNorm group"):
        apply_permutation(spec, bad, {})


# --------------------------------------------------------------------------------------------- matching


def _group_preserving(n, groups):
    size = n // groups
    for order in itertools.permutations(range(groups)):
        for inner in itertools.product(*[list(itertools.permutations(range(size)))] * groups):
            yield np.array([order[a] * size + inner[a][i] for a in range(groups) for i in range(size)])


@pytest.mark.parametrize("n,groups", [(6, 1), (6, 2), (6, 3), (6, 6)])
def test_assignment_is_the_brute_force_optimum(n, groups):
    rng = np.random.default_rng(n * 10 + groups)
    for _ in range(5):
        s = rng.standard_normal((n, n))
        best = max(s[np.arange(n), p].sum() for p in _group_preserving(n, groups))
        got = assign(s, groups)
        assert sorted(got) == list(range(n))
        assert s[np.arange(n), got].sum() == pytest.approx(best, abs=1e-12)


def test_one_hidden_layer_weight_matching_is_the_brute_force_optimum():
    torch.manual_seed(0)
    a = _model("mlp", 0, widths=[6]).state_dict()
    b = _model("mlp", 1, widths=[6]).state_dict()
    spec = permutation_spec(_model("mlp", widths=[6]))
    perms = weight_matching(spec, a, b)
    got = similarity(spec, a, apply_permutation(spec, perms, b))
    best = max(similarity(spec, a, apply_permutation(spec, {"1": torch.tensor(p)}, b))
               for p in itertools.permutations(range(6)))
    assert perms.converged and got == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("name,kwargs", [("mlp", {"widths": [32, 16]}), ("lenet", {}), ("opacus-cnn", {})])
def test_randomly_permuted_copy_aligns_back_exactly(name, kwargs, digits):
    model = _fit(_model(name, **kwargs), digits)
    state = model.state_dict()
    spec = permutation_spec(model)
    perms = random_permutation(spec, seed=7)
    copy = apply_permutation(spec, perms, state)
    aligned = align_states(model, state, copy, seed=0)
    inverse = invert(perms)
    assert all(torch.equal(aligned.perms[k], inverse[k]) for k in perms)  # every permutation recovered
    assert all(torch.equal(aligned.state[k], state[k]) for k in state)  # parameters equal, bit for bit
    assert aligned.distance_after == 0.0 < aligned.distance_before
    cfg = InterpolateConfig(points=5, subset=200)
    data = {s: digits.split(s) for s in ("train", "test")}
    before = interpolate_states(model, state, copy, data, config=cfg)
    after = interpolate_states(model, state, aligned.state, data, config=cfg)
    for split in ("train", "test"):
        assert before.instability_loss[split] > 0.1
        assert after.instability_loss[split] == 0.0 and after.instability_error[split] == 0.0


def test_resnet18_groupnorm_copy_aligns_back_exactly():
    model = _model("resnet18", groups=8)
    state = model.state_dict()
    spec = permutation_spec(model)
    perms = random_permutation(spec, seed=2)
    aligned = align_states(model, state, apply_permutation(spec, perms, state))
    assert all(torch.equal(aligned.perms[k], invert(perms)[k]) for k in perms)
    assert all(torch.equal(aligned.state[k], state[k]) for k in state)


def test_independent_siblings_have_a_lower_barrier_after_alignment(digits):
    """Two MLPs from different initialisations: weight matching lowers the test-loss instability (measured
    0.28 -> 0.03 here; the demo's DP siblings, which share a parent, do not behave so: see docs/alignment.md)."""
    data = {s: digits.split(s) for s in ("train", "test")}
    a = _fit(_model("mlp", 0, widths=[64, 64]), digits, seed=0)
    b = _fit(_model("mlp", 1, widths=[64, 64]), digits, seed=1)
    sa, sb = a.state_dict(), b.state_dict()
    aligned = align_states(a, sa, sb, seed=0)
    spec = aligned.spec
    assert similarity(spec, sa, aligned.state) >= similarity(spec, sa, sb)  # the objective never decreases
    assert aligned.distance_after < aligned.distance_before
    cfg = InterpolateConfig(points=9, split=("test",))
    before = interpolate_states(a, sa, sb, data, config=cfg).instability_loss["test"]
    after = interpolate_states(a, sa, aligned.state, data, config=cfg).instability_loss["test"]
    print(f"siblings test-loss instability before {before:.4f} after {after:.4f}")
    assert after < before


# ------------------------------------------------------------------------------------------- bad input


def test_refusals_are_one_line_model_errors(digits):
    with pytest.raises(ModelError, match="align needs the permutation structure of model 'Sequential'"):
        permutation_spec(nn.Sequential(nn.Linear(3, 2)))
    resnet = _model("resnet18", groups=4)
    resnet.layer1[1].bn2 = nn.GroupNorm(2, 64)  # two norms on one residual stream with different groups
    with pytest.raises(ModelError, match="disagree with 4 of") as info:
        permutation_spec(resnet)
    assert "\n" not in str(info.value)
    lenet = _model("lenet")
    a, b = lenet.state_dict(), _model("lenet", 1).state_dict()
    b["7.bias"][3] = float("nan")
    with pytest.raises(ModelError, match="B has 1 non-finite value"):
        weight_matching(permutation_spec(lenet), a, b)
    with pytest.raises(UsageError, match="^max_iter must be a positive integer"):
        weight_matching(permutation_spec(lenet), a, a, max_iter=0)


def _save(store, name, model, spec, **extra):
    run = store.create_run(name, config={}, seeds={}, model_spec=model.landscape_spec, data_spec=spec,
                           extra=extra or None)
    run.save_checkpoint(model.state_dict(), step=20, epoch=2.0, metrics={"test_acc": 0.5, "step_loss": 1.0})
    return run


@pytest.fixture
def root(tmp_path, digits):
    store = Store(tmp_path / "ck")
    dp = {"accounted": True, "noise_multiplier": 1.1, "sample_rate": 0.05, "ancestor_events": [],
          "non_private_ancestors": False}
    _save(store, "a", _model("lenet", 0), digits.spec, privacy={**dp, "noise_multiplier": 0.8})
    b = _save(store, "b", _model("lenet", 1), digits.spec, privacy=dp)
    from landscape.train.pruning import MASK_ARRAY, magnitude_masks

    b.save_array(MASK_ARRAY, {k: v.numpy() for k, v in magnitude_masks(_model("lenet", 1), 0.5).items()})
    _save(store, "m", _model("mlp", 0), digits.spec)
    nan = _model("lenet", 2)
    with torch.no_grad():
        nan[0].weight[0, 0, 0, 0] = float("inf")
    _save(store, "nan", nan, digits.spec)
    return store.root


def test_cli_writes_the_aligned_run_with_lineage_privacy_and_mask(root, capsys, digits):
    code, out, err = run_cli("--root", root, "align", "a", "b", "--run", "b-to-a", capsys=capsys)
    assert code == 0, err
    assert "run b-to-a: step 0 = b permuted to match a" in out and "converged" in out
    store = Store(root)
    run = store.run("b-to-a")
    lineage = run.manifest["lineage"]
    b = store.load("b")
    assert lineage["parent_run"] == "b" and lineage["parent_step"] == 20 and lineage["parent_sha256"] == b.sha256
    assert lineage["aligned_to"]["run"] == "a" and lineage["aligned_to"]["sha256"] == store.load("a").sha256
    privacy = run.manifest["privacy"]  # B's 20 DP steps, then A's: the permutation is a function of A
    assert privacy["ancestor_events"] == [{"noise_multiplier": 1.1, "sample_rate": 0.05, "steps": 20},
                                          {"noise_multiplier": 0.8, "sample_rate": 0.05, "steps": 20}]
    assert privacy["non_private_ancestors"] is False and privacy["accounted"] is False
    from landscape.train.pruning import inherited_privacy

    history = inherited_privacy(store, store.load("b-to-a@init"))  # what train --from b-to-a@init reads
    assert [vars(e) for e in history.events] == privacy["ancestor_events"] and not history.non_private
    code, _, err = run_cli("--root", root, "align", "m", "m@init", "--run", "m-self", capsys=capsys)  # one run: its later history
    assert code == 0, err
    assert store.run("m-self").manifest["privacy"]["non_private_ancestors"] is True  # m's 20 steps: no DP record
    aligned = store.load("b-to-a@init")
    assert aligned.step == 0 and aligned.metrics == {"test_acc": 0.5}  # same function; no training-step metrics
    model = b.build_model()
    x = digits.x_test[:200]
    assert torch.allclose(_logits(model, aligned.state_dict, x), _logits(model, b.state_dict, x), atol=1e-5)
    perms = {k: torch.as_tensor(v) for k, v in run.load_array("permutation").items()}
    spec = permutation_spec(model)
    assert all(torch.equal(aligned.state_dict[k], v) for k, v in apply_permutation(spec, perms, b.state_dict).items())
    mask = {k: torch.as_tensor(v) for k, v in run.load_array("mask").items()}
    source_mask = {k: torch.as_tensor(v) for k, v in store.run("b").load_array("mask").items()}
    assert all(torch.equal(mask[k], v) for k, v in apply_permutation(spec, perms, source_mask).items())
    code, out, _ = run_cli("--root", root, "align", "a", "b", "--json", capsys=capsys)
    payload = json.loads(out)
    assert code == 0 and payload["distance_after"] < payload["distance_before"]
    assert [r["permutation"] for r in payload["permutations"]] == ["0", "3", "7", "9"]


@pytest.mark.parametrize("args,expected_code,fragment", [
    (["a", "m"], 1, "error: incompatible models"),
    (["a", "nan"], 1, "error: B has 1 non-finite value(s) in '0.weight'"),
    (["nan", "a"], 1, "error: A has 1 non-finite value(s)"),
    (["a", "nope"], 1, "error: no run 'nope'"),
    (["a", "b", "--max-iter", "0"], 2, "Invalid value for '--max-iter'"),
    (["a", "b", "--run", "a"], 1, "error: run 'a' already exists"),
    (["a", "b", "--run", "bad/name"], 2, "error: bad run name"),
])
def test_cli_bad_input_is_one_line(root, capsys, args, expected_code, fragment):
    code, _, err = run_cli("--root", root, "align", *args, capsys=capsys)
    assert code == expected_code
    lines = err.strip().splitlines()
    assert fragment in lines[-1] and (len(lines) == 1 or err.startswith("Usage:")), err
    assert sorted(p.name for p in root.iterdir()) == ["a", "b", "m", "nan"]  # nothing half-written


def test_cli_unsupported_architecture_is_one_line(root, capsys, monkeypatch, digits):
    import landscape.models as models

    def toy(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))

    monkeypatch.setitem(models.MODELS, "toy", toy)
    store = Store(root)
    for name in ("t1", "t2"):
        _save(store, name, build_model("toy", input_shape=(1, 8, 8), num_classes=10), digits.spec)
    code, _, err = run_cli("--root", root, "align", "t1", "t2", capsys=capsys)
    assert code == 1 and err.strip() == ("error: align needs the permutation structure of model 'toy': give it a "
                                         "permutation_spec() method or register_spec() a builder (see "
                                         "landscape.analyze.align); built in: mlp, two-layer-linear, lenet, "
                                         "opacus-cnn, resnet18")


# ----------------------------------------------------------------------- interpolate / instability --align


def test_interpolate_and_instability_align_report_before_and_after(tmp_path, digits, capsys):
    """`interpolate A P(A) --align`: > 0 before, exactly 0 after (P(A) is A with its units randomly permuted);
    `instability --pairs ... --align` puts both in one row; the file reads back with both paths."""
    from landscape.analyze.instability import InstabilityTable
    from landscape.analyze.interpolate import InterpolationResult

    store = Store(tmp_path / "ck")
    model = _fit(_model("lenet"), digits)
    spec = permutation_spec(model)
    _save(store, "a", model, digits.spec)
    shuffled = copy.deepcopy(model)
    shuffled.load_state_dict(apply_permutation(spec, random_permutation(spec, seed=4), model.state_dict()))
    _save(store, "p", shuffled, digits.spec)
    out = tmp_path / "ap.h5"
    code, text, err = run_cli("--root", store.root, "interpolate", "a", "p", "--align", "--points", "5", "--subset", "150",
                              "-o", out, "--no-figure", capsys=capsys)
    assert code == 0, err
    assert "instability_loss_aligned" in text.splitlines()[0]
    r = InterpolationResult.from_hdf5(out)
    assert r.config.align and set(r.loss_aligned) == {"train", "test"}
    for split in ("train", "test"):
        assert r.instability_loss[split] > 0.1
        assert r.instability_loss_aligned[split] == 0.0 and r.instability_error_aligned[split] == 0.0
        np.testing.assert_array_equal(r.loss_aligned[split], np.full(5, r.loss[split][0]))  # flat: A all along
    assert r.distance > 1 and r.distance_aligned == 0.0
    plain = tmp_path / "plain.h5"
    assert run_cli("--root", store.root, "interpolate", "a", "p", "--points", "5", "--subset", "150", "-o", plain,
                   "--no-figure", capsys=capsys)[0] == 0
    again = InterpolationResult.from_hdf5(plain)  # without --align: the same path, no aligned fields
    assert again.loss_aligned == {} and "instability_loss_aligned" not in again.summary()[0]
    np.testing.assert_array_equal(again.loss["test"], r.loss["test"])
    code, text, err = run_cli("--root", store.root, "instability", "--pairs", "a:p", "--align", "--split", "test",
                              "--points", "5", "--subset", "150", "-o", tmp_path / "t.h5", "--no-figure",
                              capsys=capsys)
    assert code == 0, err
    row = InstabilityTable.from_hdf5(tmp_path / "t.h5").records()[0]
    assert row["instability_test_loss"] == pytest.approx(r.instability_loss["test"])
    assert row["instability_test_loss_aligned"] == 0.0 and row["instability_test_error_aligned"] == 0.0
