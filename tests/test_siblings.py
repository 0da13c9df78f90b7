"""`--pairs siblings`: runs trained from one parent checkpoint the same way, whatever wrote them (`landscape
phases`, `train --from`, a Recorder's `parent=`); copies that were not trained from their parent (prune, align)
and runs of another parent or optimizer are not siblings."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli

import landscape
from cli.main import main
from landscape.analyze.instability import RunInfo, sibling_key, sibling_pairs
from landscape.api import instability, interpolate
from landscape.api.alignment import align
from landscape.api.pruning import PruneConfig, prune
from landscape.api.training import phases, train
from landscape.data import load_dataset
from landscape.models import build_model
from landscape.store import Store
from landscape.train.config import PhasesConfig, TrainConfig

BASE = dict(model="mlp", data="digits", subset=100, batch_size=50, epochs=2, lr=0.05, checkpoint_every="1e", seed=7)


def record_child(root, name: str, parent: str, config: dict | None, seed: int) -> None:
    """A plain loop recorded with ``Recorder(..., parent=)``: a few SGD steps from the parent's weights."""
    data = load_dataset("digits", subset=100, seed=0)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(seed)
    with landscape.Recorder(root, name, model, data=data, parent=parent, config=config, optimizer=optimizer) as rec:
        for _ in range(4):
            idx = torch.randint(0, len(data.y_train), (25,), generator=gen)
            optimizer.zero_grad()
            F.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
            optimizer.step()
        rec.save(4, epoch=1.0)


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """Children of ``g-sgd@last`` by every route, and runs that must not pair with them."""
    root = tmp_path_factory.mktemp("siblings")
    phases(PhasesConfig(base=TrainConfig(**BASE), k=1, copies=2, group="g", phase1=("sgd",), phase2=("sgd",)),
           root=root)  # g-sgd, g-sgd-sgd-0, g-sgd-sgd-1
    cli = ["--root", root, "train", "--model", "mlp", "--data", "digits", "--subset", 100, "--batch-size", 50,
           "--epochs", 1, "--lr", 0.05, "--from"]
    for args in (["g-sgd@last", "--run", "f0", "--seed", 1],                                     # train --from (CLI)
                 ["g-sgd@last", "--run", "fdp", "--optimizer", "dpsgd", "--noise-multiplier", 1.0],  # another optimizer
                 ["g-sgd@init", "--run", "finit", "--seed", 2]):                                  # another parent
        with pytest.raises(SystemExit) as done:
            main([str(a) for a in [*cli, *args]])
        assert done.value.code == 0
    train(TrainConfig(**{**BASE, "epochs": 1}, from_ref="g-sgd@last", run="f1", optimizer="sgd"), root=root)  # api
    record_child(root, "r0", "g-sgd@last", {"optimizer": "sgd", "lr": 0.05}, seed=3)  # names its optimizer
    record_child(root, "u0", "g-sgd@last", {"lr": 0.05}, seed=4)                    # names none
    record_child(root, "u1", "g-sgd@last", None, seed=5)
    prune(PruneConfig(ref="g-sgd@last", remove=0.5, rewind="none", run="pruned"), root=root)
    align("f0@last", "g-sgd@last", run="aligned", root=root)
    return root


def runs_of(ref_a: str, ref_b: str) -> frozenset[str]:
    return frozenset((ref_a.split("@")[0], ref_b.split("@")[0]))


def pairs_of(table) -> set[frozenset[str]]:
    return {runs_of(r.ref_a, r.ref_b) for r in table.rows}


def test_siblings_are_the_children_of_one_checkpoint_by_every_route(family, tmp_path):
    store = Store(family)
    parent = store.load("g-sgd@last")
    for name in ("g-sgd-sgd-0", "f0", "f1", "r0", "u0"):  # every route records the parent checkpoint's sha256
        assert store.run(name).manifest["lineage"]["parent_sha256"] == parent.sha256
    table = instability(["*"], root=family, points=3, subset=30, split=("test",), figure=False,
                        output=tmp_path / "siblings.h5")
    sgd = ["g-sgd-sgd-0", "g-sgd-sgd-1", "f0", "f1", "r0"]
    expected = {frozenset(p) for p in itertools.combinations(sgd, 2)} | {frozenset(("u0", "u1"))}
    assert pairs_of(table) == expected  # not fdp (dpsgd), finit (@init), pruned, aligned, g-sgd (no parent)
    one = interpolate("f0@last", "r0@last", root=family, points=3, subset=30, split=("test",), figure=False,
                      output=tmp_path / "one.h5")
    row = next(r for r in table.rows if runs_of(r.ref_a, r.ref_b) == {"f0", "r0"})
    assert row.instability_loss["test"] == pytest.approx(one.instability_loss["test"], rel=1e-12)


def test_the_command_pairs_recorded_and_trained_children(family, capsys):
    code, out, err = run_cli("--root", family, "instability", "f*", "r0", "--points", 3, "--subset", 30,
                             "--split", "test", "--no-figure", "--json", "-o", "t.h5", capsys=capsys)
    assert code == 0, err
    names = {runs_of(row["ref_a"], row["ref_b"]) for row in json.loads(out)["rows"]}
    assert names == {frozenset(p) for p in itertools.combinations(["f0", "f1", "r0"], 2)}
    code, _, err = run_cli("--root", family, "instability", "pruned", "aligned", "finit", "fdp", "--no-figure",
                           capsys=capsys)
    assert code == 2 and "no sibling pairs among 4 matched run(s)" in err and "parent=" in err


def test_sibling_key_reads_the_manifest_alone():
    lineage = {"parent_run": "p", "parent_step": 9, "parent_sha256": "abc"}
    recorded = RunInfo("r", None, lineage, {"lr": 0.1}, {"accounted": True, "accountant": "prv"})
    trained = RunInfo("t", None, lineage, {"optimizer": "dpsgd"}, {"accounted": True})
    phase2 = RunInfo("c", {"phase2": "dpsgd", "copy": 1}, lineage, {"optimizer": "dpsgd"}, None)
    assert sibling_key(recorded) == sibling_key(trained) == sibling_key(phase2) == ("abc", "dpsgd")
    old = RunInfo("o", None, {"parent_run": "p", "parent_step": 9}, {"optimizer": "sgd"}, None)  # no sha256 recorded
    assert sibling_key(old) == ("('p', 9)", "sgd")
    assert sibling_key(RunInfo("x", None, None, {"optimizer": "sgd"}, None)) is None
    assert sibling_key(RunInfo("a", None, {**lineage, "aligned_to": {}}, {"command": "align"}, None)) is None
    assert [(a.name, b.name) for a, b in sibling_pairs([phase2, trained, recorded])] == [("r", "t"), ("r", "c"),
                                                                                        ("t", "c")]
