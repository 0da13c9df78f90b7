"""The permutation-structure protocol of landscape.analyze.align on models landscape does not know.

A residual MLP defined here describes its own units with ``permutation_spec()`` (the skip connection ties two
layers to one permutation: a structure the built-in chain walker cannot infer). References: the model's own
forward pass (a permutation keeps the logits), exact recovery of a random permutation, the weight-matching
objective and distance (never worse), and Watson et al.'s instability from landscape.analyze.interpolate
(lower after alignment for independently trained siblings, as the built-in tests check for the mlp).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli
from torch import nn

from landscape.analyze.align import align_states, similarity
from landscape.analyze.interpolate import interpolate as interpolate_states
from landscape.analyze.permutations import (
    PermutationSpec,
    SpecBuilder,
    apply_permutation,
    check_function_kept,
    invert,
    permutation_spec,
    random_permutation,
    register_spec,
)
from landscape.analyze.specs import InterpolateConfig
from landscape.data import load_dataset
from landscape.errors import ModelError
from landscape.store import Store


class ResidualMLP(nn.Module):
    """inp -> relu(h) ; h + relu(block(h)) -> head: the residual stream is one permutation, the block's inside
    another."""

    def __init__(self, width: int = 48, inner: int = 32, classes: int = 10, features: int = 64):
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.block_in = nn.Linear(width, inner)
        self.block_out = nn.Linear(inner, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = torch.relu(self.inp(x.flatten(1)))
        h = h + self.block_out(torch.relu(self.block_in(h)))
        return self.head(h)

    def permutation_spec(self) -> PermutationSpec:
        b = SpecBuilder("residual-mlp")
        stream = b.new("stream", self.inp.out_features)
        b.weight_out(stream, "inp", self.inp)
        b.add(stream, "block_in.weight", 1)
        b.weight_out(stream, "block_out", self.block_out)
        b.add(stream, "head.weight", 1)
        inner = b.new("inner", self.block_in.out_features)
        b.weight_out(inner, "block_in", self.block_in)
        b.add(inner, "block_out.weight", 1)
        return b.spec()


class MappingMLP(nn.Module):
    """Two hidden layers described as a plain mapping {permutation: [(key, axis), ...]} (units read from shapes)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(64, 24), nn.Linear(24, 16), nn.Linear(16, 10)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x.flatten(1))))))

    def permutation_spec(self):
        return {"h1": [("a.weight", 0), ("a.bias", 0), ("b.weight", 1)],
                "h2": [("b.weight", 0), ("b.bias", 0), ("c.weight", 1)]}


class Unknown(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 8), nn.Linear(8, 10)

    def forward(self, x):
        return self.b(torch.relu(self.a(x.flatten(1))))


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def _fit(model, digits, seed, steps=80):
    torch.manual_seed(seed)
    x, y = digits.x_train[:600], digits.y_train[:600]
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval()


def _built(cls, seed):
    torch.manual_seed(seed)
    return cls()


@pytest.mark.parametrize("cls", [ResidualMLP, MappingMLP])
def test_user_spec_keeps_the_function_and_a_permuted_copy_aligns_back_exactly(cls, digits):
    model = _fit(_built(cls, 0), digits, 0, steps=30)
    spec = permutation_spec(model)
    x = digits.x_test[:100]
    check_function_kept(model, spec, x)
    perms = random_permutation(spec, seed=3)
    state = model.state_dict()
    shuffled = apply_permutation(spec, perms, state)
    other = copy.deepcopy(model)
    other.load_state_dict(shuffled)
    with torch.no_grad():
        torch.testing.assert_close(other(x), model(x), rtol=1e-5, atol=1e-5)
    aligned = align_states(model, state, shuffled)
    assert all(torch.equal(aligned.perms[k], invert(perms)[k]) for k in perms)
    assert all(torch.equal(aligned.state[k], state[k]) for k in state)
    assert aligned.distance_after == 0.0 < aligned.distance_before


def test_independent_user_models_have_a_lower_barrier_and_distance_after_alignment(digits):
    data = {s: digits.split(s) for s in ("train", "test")}
    a, b = _fit(_built(ResidualMLP, 0), digits, 0), _fit(_built(ResidualMLP, 1), digits, 1)
    sa, sb = a.state_dict(), b.state_dict()
    aligned = align_states(a, sa, sb)
    assert similarity(aligned.spec, sa, aligned.state) >= similarity(aligned.spec, sa, sb)
    assert aligned.distance_after < aligned.distance_before
    cfg = InterpolateConfig(points=9, split=("test",))
    before = interpolate_states(a, sa, sb, data, config=cfg).instability_loss["test"]
    after = interpolate_states(a, sa, aligned.state, data, config=cfg).instability_loss["test"]
    print(f"residual MLP siblings: test-loss instability {before:.4f} -> {after:.4f}, distance "
          f"{aligned.distance_before:.2f} -> {aligned.distance_after:.2f}")
    assert after < before


def test_registered_builder_and_refusals(digits):
    with pytest.raises(ModelError, match="^align needs the permutation structure of model 'Unknown': give it a "
                                         "permutation_spec"):
        permutation_spec(Unknown())
    from landscape.analyze import permutations as align_module

    try:
        register_spec(Unknown, lambda model, name: {"hidden": [("a.weight", 0), ("a.bias", 0), ("b.weight", 1)]})
        assert [p.name for p in permutation_spec(Unknown()).perms] == ["hidden"]
    finally:
        align_module.SPECS.pop(Unknown)

    class Wrong(MappingMLP):  # forgets the bias of the first layer: the function changes
        def permutation_spec(self):
            return {"h1": [("a.weight", 0), ("b.weight", 1)]}

    with pytest.raises(ModelError, match="changes the model's outputs"):
        check_function_kept(Wrong(), permutation_spec(Wrong()), digits.x_test[:20])

    class Missing(MappingMLP):
        def permutation_spec(self):
            return {"h1": [("nope.weight", 0)]}

    with pytest.raises(ModelError, match="names tensor 'nope.weight'"):
        permutation_spec(Missing())

    class Broken(MappingMLP):
        def permutation_spec(self):
            raise KeyError("x")

    with pytest.raises(ModelError, match="permutation spec of 'Broken' failed: KeyError"):
        permutation_spec(Broken())

    class Listed(MappingMLP):
        def permutation_spec(self):
            return []

    with pytest.raises(ModelError, match="is a list; return a PermutationSpec"):
        permutation_spec(Listed())


# ------------------------------------------------------------------------------------ CLI on a user model


def _save(store, name, model, spec):
    run = store.create_run(name, config={}, seeds={}, model_spec=model.landscape_spec, data_spec=spec)
    run.save_checkpoint(model.state_dict(), step=10, epoch=1.0)


def test_cli_align_and_interpolate_align_on_a_user_model(tmp_path, digits, capsys, monkeypatch):
    """A user model in the store (a factory named in the model registry, as user code is), aligned by the CLI;
    `interpolate --align` reports a lower barrier; a model without a spec is refused in one line."""
    import landscape.models as models

    def residual(input_shape, num_classes):
        return ResidualMLP(classes=num_classes)

    def unknown(input_shape, num_classes):
        return Unknown()

    monkeypatch.setitem(models.MODELS, "residual-mlp", residual)
    monkeypatch.setitem(models.MODELS, "unknown", unknown)
    store = Store(tmp_path / "ck")
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        model = models.build_model("residual-mlp", input_shape=(1, 8, 8), num_classes=10)
        _fit(model, digits, seed)
        _save(store, name, model, digits.spec)
    for name in ("u1", "u2"):
        _save(store, name, models.build_model("unknown", input_shape=(1, 8, 8), num_classes=10), digits.spec)

    def cli(*args):
        return run_cli("--root", store.root, *args, capsys=capsys)

    code, out, err = cli("align", "a", "b", "--run", "b-to-a")
    assert code == 0, err
    assert "stream" in out and "inner" in out and "run b-to-a" in out
    b, moved = store.load("b"), store.load("b-to-a@init")
    x = digits.x_test[:200]
    model = b.build_model().eval()
    other = copy.deepcopy(model)
    other.load_state_dict(moved.state_dict)
    model.load_state_dict(b.state_dict)
    with torch.no_grad():
        torch.testing.assert_close(other(x), model(x), rtol=1e-5, atol=1e-5)  # the same function as B
    code, out, err = cli("interpolate", "a", "b", "--align", "--points", "5", "--split", "test", "-o",
                         tmp_path / "ab.h5", "--no-figure")
    assert code == 0, err
    from landscape.analyze.interpolate import InterpolationResult

    r = InterpolationResult.from_hdf5(tmp_path / "ab.h5")
    assert r.distance_aligned < r.distance
    assert r.instability_loss_aligned["test"] < r.instability_loss["test"]
    code, _, err = cli("align", "u1", "u2")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: align needs the permutation structure of model 'unknown'")
    assert sorted(p.name for p in store.root.iterdir()) == ["a", "b", "b-to-a", "u1", "u2"]
