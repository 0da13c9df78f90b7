"""Checkpoint references (landscape.refs.Ref), the one load-and-verify step (Resolver.point) and the one subset
sampler (landscape.data.sample_subset) whose draws every analysis records in its result."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from landscape.errors import CheckpointError, IncompatibleError, UsageError
from landscape.refs import Ref, check_run_name, slug
from landscape.store import Store

# --------------------------------------------------------------------------------------------- Ref


@pytest.mark.parametrize("text, fields", [
    ("run", dict(run="run")),
    ("run@init", dict(run="run", at="init")),
    ("run@last", dict(run="run", at="last")),
    ("run@step=12", dict(run="run", at="step", value=12)),
    ("run@epoch=1.5", dict(run="run", at="epoch", value=1.5)),
    ("a.b,c+d=e@step=0", dict(run="a.b,c+d=e", at="step", value=0)),
    ("ckpt.h5", dict(file="ckpt.h5")),
    ("dir/sub/x.h5", dict(file="dir/sub/x.h5")),
    ("/abs/x@y.h5", dict(file="/abs/x@y.h5")),
])
def test_parse_gives_the_fields_and_str_gives_the_text_back(text, fields):
    ref = Ref.parse(text)
    assert ref == Ref(**fields)
    assert str(ref) == text and Ref.parse(str(ref)) == ref
    assert Ref.parse(ref) is ref  # parsed once: a Ref passes through


def test_canonical_text_of_numbers_and_whitespace():
    assert str(Ref.parse("  run@step=007 ")) == "run@step=7"
    assert str(Ref.parse("run@epoch=2")) == "run@epoch=2" and Ref.parse("run@epoch=2").value == 2.0
    assert str(Ref.parse("run@epoch=1e-07")) == "run@epoch=1e-07"
    assert str(Ref.at_step("r", 3)) == "r@step=3"


@pytest.mark.parametrize("text, message", [
    ("", "empty checkpoint reference"),
    ("   ", "empty checkpoint reference"),
    ("run@", "after '@' give init, last, step=N or epoch=E"),
    ("run@first", "bad selector '@first'"),
    ("run@step=x", "the step must be an integer"),
    ("run@step=-1", "non-negative"),
    ("run@epoch=abc", "the epoch must be a number"),
    ("run@epoch=nan", "finite"),
    ("dir/notes.txt", "expected PATH.h5 or RUN"),
    ("-bad@last", "bad run name '-bad'"),
    ("a b", "bad run name"),
])
def test_bad_references_are_one_line_usage_errors(text, message):
    with pytest.raises(UsageError, match=message) as exc:
        Ref.parse(text)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("args", [
    ("interpolate", "a@bogus", "b"),
    ("instability", "--pairs", "a:b@step=x"),
    ("hessian", "dir/notes.txt"),
    ("ntk", "a@"),
])
def test_the_commands_refuse_a_bad_reference_in_one_line_before_anything_runs(tmp_path, capsys, args):
    from conftest import run_cli

    code, _, err = run_cli("--root", tmp_path / "no-store", *args, "--no-figure", capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: bad "), err
    assert not (tmp_path / "no-store").exists() and not (tmp_path / "results").exists()


def test_a_non_string_is_a_usage_error():
    with pytest.raises(UsageError, match="a checkpoint reference is a string"):
        Ref.parse(3)


def test_labels_of_runs_and_files():
    # slug: a file-name part with the selector; label: the run or the file path (default output names); name:
    # the run or the file's stem (the run column of tables)
    assert Ref.parse("r@step=3").slug == "r_step=3" and Ref.parse("dir/a.h5").slug == "a"
    assert Ref.parse("r@step=3").label == "r" and Ref.parse("dir/a.h5").label == "dir_a"
    assert Ref.parse("r@last").name == "r" and Ref.parse("dir/a.h5").name == "a"
    assert Ref.parse("r").bare and not Ref.parse("r@last").bare and not Ref.parse("a.h5").bare
    assert Ref.parse("r").selector == "last" and Ref.parse("r@epoch=0.5").selector == "epoch=0.5"
    assert slug("b@last,c@last") == "b_last_c_last"


def test_the_store_names_runs_by_the_one_rule():
    from landscape.store import check_run_name as store_check

    assert store_check is check_run_name


@given(st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.,+=-]{0,30}", fullmatch=True).filter(lambda s: not s.endswith(".h5")),
       st.one_of(st.none(), st.sampled_from(["init", "last"]), st.integers(0, 10**9),
                 st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)))
def test_round_trip_property(run, selector):
    if selector is None:
        ref = Ref(run=run)
    elif isinstance(selector, str):
        ref = Ref(run=run, at=selector)
    elif isinstance(selector, int):
        ref = Ref.at_step(run, selector)
    else:
        ref = Ref(run=run, at="epoch", value=float(selector))
    assert Ref.parse(str(ref)) == ref


def test_an_invalid_ref_cannot_be_built():
    with pytest.raises(ValueError):
        Ref()
    with pytest.raises(ValueError):
        Ref(file="a.h5", at="last")
    with pytest.raises(ValueError):
        Ref(run="r", at="step")


# ------------------------------------------------------------------------------------ load and verify

MODEL_SPEC = {"name": "mlp", "kwargs": {"input_shape": [4], "num_classes": 3, "widths": [5]}}
DATA_SPEC = {"name": "digits", "seed": 0, "subset": None, "options": {}}


def _state(hidden: int = 5, fill: float = 0.0) -> dict[str, torch.Tensor]:
    from landscape.models import build_model

    model = build_model("mlp", input_shape=(4,), num_classes=3, widths=[hidden])
    return {k: torch.full_like(v, fill) for k, v in model.state_dict().items()}


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "ck")
    for name, hidden in (("a", 5), ("b", 5), ("wide", 7)):
        spec = {**MODEL_SPEC, "kwargs": {**MODEL_SPEC["kwargs"], "widths": [hidden]}}
        with store.create_run(name, config={}, seeds={}, model_spec=spec, data_spec=DATA_SPEC) as run:
            for step in (0, 4):
                run.save_checkpoint(_state(hidden, step), step=step, epoch=step / 4)
    return store


def test_point_checks_the_manifest_sha256_of_expanded_targets_too(store):
    from landscape.api.resolve import Resolver

    resolver = Resolver(store.root)
    targets = resolver.expand("a")
    assert [t.ref for t in targets] == ["a@step=0", "a@step=4"] and all(t.sha256 for t in targets)
    point = resolver.point(targets[1], data=False)
    assert point.ref == "a@step=4" and float(point.state["1.weight"].flatten()[0]) == 4.0
    path = store.root / "a" / "step-000004.h5"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # a changed file: its sha256 no longer matches the manifest
    path.write_bytes(bytes(data))
    for how in (lambda: resolver.point(targets[1], data=False), lambda: resolver.point("a@last", data=False)):
        with pytest.raises(CheckpointError, match="changed after it was written"):
            how()


def test_point_like_checks_compatibility_in_one_place(store):
    from landscape.api.resolve import Resolver

    resolver = Resolver(store.root)
    a = resolver.point("a@last", data=False)
    assert resolver.point("b@init", like=a, data=False).ref == "b@init"
    with pytest.raises(IncompatibleError, match=r"tensor '.*' has shape .* in A \(a@last\) but .* in wide@last"):
        resolver.point("wide@last", like=a, label="wide@last", data=False)
    with pytest.raises(UsageError, match="bad selector"):
        resolver.point("a@nope", data=False)


def test_the_store_and_a_model_use_the_same_first_mismatch():
    from landscape.models import build_model
    from landscape.params import check_compatible, first_mismatch
    from landscape.store import check_state_dict

    model = build_model("mlp", input_shape=(4,), num_classes=3, widths=[5])
    state = dict(model.state_dict())
    key = next(iter(state))
    assert first_mismatch(model, state) is None
    state[key] = state[key].to(torch.int64)
    assert first_mismatch(model, state) is None  # shapes only, unless dtypes are asked for
    m = first_mismatch(model, state, dtypes=True)
    assert (m.kind, m.name) == ("dtype", key)
    with pytest.raises(IncompatibleError, match="is int64 \\(integer\\) but model 'mlp' expects float32"):
        check_state_dict(model, state, source="f.h5")
    state.pop(key)
    assert first_mismatch(model, state).kind == "only_a"
    with pytest.raises(IncompatibleError, match=f"missing tensor '{key}'"):
        check_state_dict(model, state, source="f.h5")
    with pytest.raises(IncompatibleError, match=f"tensor '{key}' is in A but not in B"):
        check_compatible(model, state)


# ------------------------------------------------------------------------------------------ the sampler


def test_sample_subset_is_the_stratified_seeded_sampler_and_records_each_draw():
    from landscape.data import recording_subsets, sample_subset, subset_indices, take_subset

    y = torch.tensor([0] * 60 + [1] * 30 + [2] * 10)
    x = torch.arange(100.0)
    with recording_subsets() as draws:
        idx = sample_subset(y, 20, 7, split="train")
        again = sample_subset(y, 0.2, 7, split="train")  # the same 20 examples asked as a fraction
        xs, ys = take_subset(x, y, None, 7, split="test")  # no subset: nothing drawn
    assert torch.equal(idx, subset_indices(y, 20, 7)) and torch.equal(idx, again)
    assert np.bincount(y[idx].numpy()).tolist() == [12, 6, 2]  # stratified: the class shares of 60/30/10
    assert torch.equal(xs, x) and torch.equal(ys, y)
    sha = hashlib.sha256(idx.numpy().astype("<i8").tobytes()).hexdigest()
    assert draws == [
        {"split": "train", "size": 20, "seed": 7, "count": 20, "of": 100, "indices_sha256": sha},
        {"split": "train", "size": 0.2, "seed": 7, "count": 20, "of": 100, "indices_sha256": sha},
    ]
    assert sample_subset(y, 20, 7) is not None  # outside a recording block nothing is kept


def test_every_subsetting_analysis_records_its_subset(tmp_path):
    """The runner writes the draws of the one sampler as the result attr ``subsets``: one checkpoint
    (interpolate pair, ntk), a run's checkpoints in workers (hessian), a pair of runs (instability)."""
    from landscape import api
    from landscape.api.training import train
    from landscape.data import load_dataset, subset_indices
    from landscape.results import read_result
    from landscape.train.config import TrainConfig

    root = tmp_path / "ck"
    for name, seed in (("a", 0), ("b", 1)):
        train(TrainConfig(data="digits", subset=120, epochs=1, batch_size=40, checkpoint_every="none", seed=seed,
                          device="cpu", run=name), root=root, progress=False)
    y = load_dataset("digits", subset=120, seed=0).split("train")[1]
    want = hashlib.sha256(subset_indices(y, 30, 2).numpy().astype("<i8").tobytes()).hexdigest()

    def subsets(path):
        return json.loads(read_result(path, load_arrays=False).attrs["subsets"])

    r = api.interpolate("a@last", "b@last", root=root, points=2, subset=30, subset_seed=2, split=("train",),
                        figure=False, output=tmp_path / "i.h5")
    assert subsets(r.path) == [{"count": 30, "indices_sha256": want, "of": 120, "seed": 2, "size": 30,
                                "split": "train"}]
    n = api.ntk("a@last", root=root, subset=30, subset_seed=2, figure=False, output=tmp_path / "n.h5")
    assert subsets(n.path)[0]["indices_sha256"] == want and n.indices.tolist() == subset_indices(y, 30, 2).tolist()
    h = api.hessian(["a"], root=root, subset=30, subset_seed=2, top_k=1, lanczos_steps=5, figure=False, output=tmp_path / "h.h5",
                    workers=1)
    assert [d["indices_sha256"] for d in subsets(h.path)] == [want]  # one draw, shared by the run's checkpoints
    full = api.interpolate("a@last", "b@last", root=root, points=2, figure=False, output=tmp_path / "full.h5")
    assert "subsets" not in read_result(full.path, load_arrays=False).attrs  # nothing drawn, nothing recorded
