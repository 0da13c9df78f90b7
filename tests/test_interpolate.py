"""Linear interpolation and instability (Watson et al. Def. 2.3): analyzer, API, CLI, many pairs."""

import copy
import dataclasses
import json
import math
from pathlib import Path

import click
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from torch import nn

from landscape.analyze.instability import InstabilityTable
from landscape.analyze.interpolate import InterpolationResult, instability
from landscape.analyze.interpolate import interpolate as interpolate_states
from landscape.analyze.specs import InterpolateConfig
from landscape.api import instability as api_instability
from landscape.api import interpolate as api_interpolate
from landscape.data import load_dataset, subset_indices
from landscape.errors import IncompatibleError, OutputPathError
from landscape.models import build_model
from landscape.results import sha256_file
from landscape.store import Store


def plain_eval(model, x, y):
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        logits = model(x)
    return float(F.cross_entropy(logits.double(), y)), float((logits.argmax(1) == y).double().mean())


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def _lenet(seed):
    torch.manual_seed(seed)
    return build_model("lenet", input_shape=(1, 8, 8), num_classes=10)


def _save_run(store, name, model, data_spec, *, phases=None, lineage=None, epsilon=None):
    run = store.create_run(name, config={"model": "lenet"}, seeds={"seed": 0}, lineage=lineage,
                           model_spec=model.landscape_spec, data_spec=data_spec,
                           extra={"phases": phases} if phases else None)
    run.save_checkpoint(model.state_dict(), step=10, epoch=1.0, epsilon=epsilon)
    return run


@pytest.fixture
def store(tmp_path, digits):
    store = Store(tmp_path / "ck")
    _save_run(store, "a", _lenet(0), digits.spec)
    _save_run(store, "b", _lenet(1), digits.spec)
    return store


CFG = InterpolateConfig(points=7, subset=120)


# ------------------------------------------------------------------------------------------ analyzer


def test_self_interpolation_is_flat_with_zero_instability(store, tmp_path):
    r = api_interpolate("a", "a@last", root=store.root, config=CFG, output=tmp_path / "self.h5", figure=False)
    for s in ("train", "test"):
        assert np.all(r.loss[s] == r.loss[s][0]) and np.all(r.acc[s] == r.acc[s][0])
        assert r.instability_loss[s] == 0.0 and r.instability_error[s] == 0.0
    assert r.distance == 0.0


def test_endpoints_equal_an_independent_evaluation(store, digits, tmp_path):
    r = api_interpolate("a", "b", root=store.root, config=CFG, output=tmp_path / "ab.h5", figure=False)
    assert np.array_equal(r.alpha, np.linspace(0, 1, 7)) and r.alpha[0] == 0.0 and r.alpha[-1] == 1.0
    for s in ("train", "test"):
        x, y = digits.split(s)
        idx = subset_indices(y, 120, 0)
        for end, ref in ((0, "a"), (-1, "b")):
            loss, acc = plain_eval(store.load(ref).build_model(), x[idx], y[idx])
            assert abs(r.loss[s][end] - loss) < 1e-6 and r.acc[s][end] == acc
        assert r.instability_loss[s] == pytest.approx(r.loss[s].max() - (r.loss[s][0] + r.loss[s][-1]) / 2, abs=0)


def test_convex_model_has_no_barrier_above_the_chord():
    data = load_dataset("gaussian-signal", seed=0, n=400, n_test=200)
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=2, widths=[])  # logistic regression
    assert [type(m) for m in model] == [nn.Flatten, nn.Linear]
    a = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    b = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    r = interpolate_states(model, a, b, {"train": data.split("train"), "test": data.split("test")}, points=30)
    for s in ("train", "test"):
        # loss convex in the parameters: the path never rises above the chord between its ends ...
        assert r.chord_barrier_loss[s] <= 1e-6
        # ... so Watson's instability (whose sup includes the ends) is exactly half the end-point gap
        assert r.instability_loss[s] == pytest.approx(abs(r.loss[s][0] - r.loss[s][-1]) / 2, abs=1e-6)


def test_barriers_of_a_fixed_curve_by_hand(tmp_path):
    """The table and the figure of ``interpolate`` give the barrier above the chord and the rise above both ends
    beside Def. 2.3, each as computed by hand on a fixed curve; the figure draws the chord."""
    from matplotlib.lines import Line2D

    from landscape.analyze.interpolate import chord_barrier, rise_above_ends
    from landscape.plots.interpolate import plot_interpolation

    alpha = np.linspace(0, 1, 5)  # 0, .25, .5, .75, 1
    bump = np.array([1.0, 2.0, 1.5, 3.0, 0.5])
    # chord (1 - a) 1 + a 0.5 = 1, .875, .75, .625, .5; above it: 0, 1.125, .75, 2.375, 0
    assert chord_barrier(bump, alpha) == pytest.approx(2.375)
    assert rise_above_ends(bump) == pytest.approx(3.0 - 1.0)
    assert instability(bump).value == pytest.approx(3.0 - 0.75)
    falling = np.array([3.0, 2.0, 1.0])  # on its chord: no barrier, no rise, but Def. 2.3 = half the end gap
    assert chord_barrier(falling, np.linspace(0, 1, 3)) == 0 and rise_above_ends(falling) == 0
    assert instability(falling).value == 1.0
    assert rise_above_ends([1.0, math.nan, 0.0]) == math.inf

    r = InterpolationResult(alpha=alpha, loss={"test": bump}, acc={"test": np.full(5, 0.5)},
                            instability_loss={"test": 2.25}, instability_error={"test": 0.0},
                            chord_barrier_loss={"test": 2.375}, rise_loss={"test": 2.0})
    row = r.summary()[0]
    assert list(row)[:8] == ["split", "loss_A", "loss_B", "max_loss", "chord_barrier_loss", "rise_loss",
                             "instability_loss", "instability_error"]
    assert (row["chord_barrier_loss"], row["rise_loss"], row["instability_loss"]) == (2.375, 2.0, 2.25)
    r.to_hdf5(tmp_path / "r.h5")
    back = InterpolationResult.from_hdf5(tmp_path / "r.h5")
    assert back.rise_loss == {"test": 2.0} and back.summary()[0] == row
    old = dataclasses.replace(r, chord_barrier_loss={}, rise_loss={})  # a file written before they were stored
    assert old.summary()[0]["chord_barrier_loss"] == pytest.approx(2.375) and old.summary()[0]["rise_loss"] == 2.0

    fig = plot_interpolation(r)
    ax = fig.axes[0]
    chords = [line for line in ax.get_lines() if line.get_label() == "test chord"]
    assert len(chords) == 1 and list(chords[0].get_xydata().ravel()) == [0.0, 1.0, 1.0, 0.5]
    bar = ax.collections[0].get_segments()[0]  # the barrier: at alpha .75, from the chord (.625) up to 3
    assert np.allclose(bar, [[0.75, 0.625], [0.75, 3.0]])
    text = " ".join(t.get_text() for t in fig.texts)
    assert "test: barrier above the chord 2.38, rise above both ends 2, Def. 2.3 instability 2.25" in text
    assert all(isinstance(h, Line2D) for h in ax.get_legend().legend_handles)
    from conftest import text_problems

    assert text_problems(fig) == []


def test_sign_flipped_tanh_unit_has_the_closed_form_barrier():
    # f(x) = v tanh(w x): its twin (-w, -v) is the same function; the midpoint of the path is the zero net
    net = nn.Sequential(nn.Linear(1, 1, bias=False), nn.Tanh(), nn.Linear(1, 2, bias=False)).double()
    a = {"0.weight": torch.tensor([[3.0]], dtype=torch.float64),
         "2.weight": torch.tensor([[-2.0], [2.0]], dtype=torch.float64)}
    b = {k: -v for k, v in a.items()}
    x = torch.tensor([[-2.0], [-1.0], [-0.5], [0.5], [1.0], [2.0]], dtype=torch.float64)
    y = (x[:, 0] > 0).long()
    r = interpolate_states(net, a, b, {"train": (x, y)}, split=("train",), points=31)
    c = 1.0 - 2.0 * r.alpha[:, None]  # theta_alpha = c * theta_A
    margin = 4.0 * c * np.tanh(3.0 * c * x.numpy()[:, 0][None, :]) * np.where(y.numpy() == 1, 1.0, -1.0)
    closed = np.mean(np.logaddexp(0.0, -margin), axis=1)  # CE of two logits = softplus(-margin)
    np.testing.assert_allclose(r.loss["train"], closed, atol=1e-12)
    end = float(np.mean(np.log1p(np.exp(-4.0 * np.tanh(3.0 * np.abs(x.numpy()[:, 0]))))))
    assert r.instability_loss["train"] == pytest.approx(math.log(2.0) - end, abs=1e-6)
    # at the midpoint both logits are 0 and argmax picks class 0: half right, so the error barrier is 0.5
    assert r.instability_error["train"] == 0.5


def test_batchnorm_resnet18_recalibration_changes_the_path_and_matches_by_hand():
    torch.manual_seed(0)
    model = build_model("resnet18", input_shape=(3, 4, 4), num_classes=3, norm="batch").double()
    x_tr, y_tr = torch.randn(8, 3, 4, 4, dtype=torch.float64), torch.randint(0, 3, (8,))
    x_te, y_te = torch.randn(6, 3, 4, 4, dtype=torch.float64), torch.randint(0, 3, (6,))
    a = {k: v.clone() for k, v in model.state_dict().items()}
    b = {k: (v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v.clone()) for k, v in a.items()}
    b = {k: (v.abs() + 0.5 if k.endswith("running_var") else v) for k, v in b.items()}
    data = {"train": (x_tr, y_tr), "test": (x_te, y_te)}
    plain = interpolate_states(model, a, b, data, points=3)
    recal = interpolate_states(model, a, b, data, points=3, bn_recalibrate=True)
    assert np.abs(recal.loss["test"] - plain.loss["test"]).max() > 1e-3
    for i, alpha in enumerate(recal.alpha):
        m = copy.deepcopy(model)
        m.load_state_dict({k: torch.lerp(a[k], b[k], float(alpha)) if a[k].is_floating_point() else a[k] for k in a})
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):  # statistics by hand: fresh, cumulative, from training inputs
                mod.reset_running_stats()
                mod.momentum = None
        m.train()
        with torch.no_grad():
            m(x_tr)
        loss, _ = plain_eval(m, x_te, y_te)
        assert recal.loss["test"][i] == pytest.approx(loss, abs=1e-9)


def test_parity_with_loss_landscapes_and_the_model_is_left_alone():
    loss_landscapes = pytest.importorskip("loss_landscapes")
    from loss_landscapes.metrics import Loss

    start, end = _lenet(0), _lenet(1)
    x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,))
    start.train()
    start[0].weight.requires_grad_(False)
    before = {k: v.clone() for k, v in start.state_dict().items()}
    ours = interpolate_states(start, start.state_dict(), end.state_dict(), {"train": (x, y)}, split=("train",),
                              points=31)
    assert start.training and not start[0].weight.requires_grad and start[3].weight.requires_grad
    assert all(torch.equal(before[k], v) for k, v in start.state_dict().items())
    theirs = loss_landscapes.linear_interpolation(start.eval(), end.eval(), Loss(F.cross_entropy, x, y), steps=30,
                                                  deepcopy_model=True)
    # loss-landscapes evaluates alpha = k/30 for k = 1..30 (never alpha = 0); ours linspace(0, 1, 31) = k/30, k = 0..30
    np.testing.assert_allclose(ours.loss["train"][1:], theirs, atol=1e-5, rtol=0)


def test_nonfinite_path_gives_inf_instability_with_a_reason(store, digits, tmp_path):
    model = _lenet(2)
    state = model.state_dict()
    state["7.bias"] = torch.full_like(state["7.bias"], math.inf)  # first hidden fc bias: inf everywhere
    _save_run(store, "broken", model, digits.spec)
    store.run("broken").save_checkpoint(state, step=11, epoch=1.1)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        r = api_interpolate("a", "broken", root=store.root, config=CFG, output=tmp_path / "nan.h5", figure=False)
    assert math.isinf(r.instability_loss["test"]) and math.isinf(r.instability_error["test"])
    assert "non-finite" in r.reasons["test_loss"]
    back = InterpolationResult.from_hdf5(tmp_path / "nan.h5")
    assert math.isinf(back.instability_loss["train"]) and "alpha=" in back.reasons["train_loss"]
    assert instability([1.0, 2.0, 1.0]).value == 1.0 and instability([1.0, math.nan]).reason


# ------------------------------------------------------------------------------------------------ api


def test_api_writes_result_and_figure_and_leaves_checkpoints_alone(store, tmp_path):
    files = [store.resolve("a"), store.resolve("b")]
    hashes = [sha256_file(f) for f in files]
    r = api_interpolate("a", "b", root=store.root, config=CFG, output=tmp_path / "out" / "ab.h5")
    assert [sha256_file(f) for f in files] == hashes
    assert sorted(p.suffix for p in r.figures) == [".pdf", ".png"] and all(p.is_file() for p in r.figures)
    back = InterpolationResult.from_hdf5(r.path)
    assert back.config == CFG and [i.sha256 for i in back.inputs] == hashes
    for s in ("train", "test"):
        np.testing.assert_array_equal(back.loss[s], r.loss[s])
        assert back.instability_error[s] == r.instability_error[s]
    import h5py

    with h5py.File(r.path) as f:
        assert {"alpha", "train_loss", "train_acc", "test_loss", "test_acc"} <= set(f)
        assert "instability_test_loss" in f.attrs and "instability_train_error" in f.attrs


def test_incompatible_checkpoints_name_the_first_tensor(store, digits, tmp_path):
    torch.manual_seed(0)
    wide = build_model("lenet", input_shape=(1, 8, 8), num_classes=10, channels=[8, 16])
    _save_run(store, "wide", wide, digits.spec)
    with pytest.raises(IncompatibleError, match=r"tensor '0.weight' has shape \(6, 1, 5, 5\) in A \(a\) "):
        api_interpolate("a", "wide", root=store.root, config=CFG, output=tmp_path / "x.h5")
    relu = build_model("lenet", input_shape=(1, 8, 8), num_classes=10, activation="tanh")
    _save_run(store, "tanh", relu, digits.spec)
    with pytest.raises(IncompatibleError, match="option 'activation'"):
        api_interpolate("a", "tanh", root=store.root, config=CFG, output=tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists()


# ------------------------------------------------------------------------------------------------ cli


def _cli():
    from cli.generate import command


    @click.group()
    @click.option("--root", default="checkpoints")
    @click.pass_context
    def group(ctx, root):
        ctx.obj = {"root": root}

    group.add_command(command("interpolate"))
    group.add_command(command("instability"))
    return group


def test_cli_interpolate_prints_table_and_json(store, tmp_path):
    out = tmp_path / "c.h5"
    res = CliRunner().invoke(_cli(), ["--root", str(store.root), "interpolate", "a", "b", "--points", "5",
                                      "--subset", "100", "-o", str(out), "--no-figure"])
    assert res.exit_code == 0, res.output
    assert "instability_loss" in res.output and "test" in res.output and f"wrote {out}" in res.output
    head = res.output.splitlines()[0].split()
    assert head.index("chord_barrier_loss") < head.index("rise_loss") < head.index("instability_loss")
    res = CliRunner().invoke(_cli(), ["--root", str(store.root), "interpolate", "a", "b", "--points", "5",
                                      "--split", "test", "--subset", "100", "-o", str(out), "--json"])
    payload = json.loads(res.output)
    assert [r["split"] for r in payload["rows"]] == ["test"] and len(payload["figures"]) == 2
    res = CliRunner().invoke(_cli(), ["--root", str(store.root), "interpolate", "a", "b", "--points", "1"])
    assert res.exit_code == 2


def test_cli_incompatible_pair_is_one_line_and_exit_1(store, digits, tmp_path, monkeypatch, capsys):
    import cli.main

    wide = build_model("lenet", input_shape=(1, 8, 8), num_classes=10, hidden=[64, 84])
    _save_run(store, "wide", wide, digits.spec)
    with pytest.raises(SystemExit) as exit_info:
        cli.main.main(["--root", str(store.root), "interpolate", "a", "wide", "-o", str(tmp_path / "w.h5")])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: incompatible models: tensor '7.weight'")


# ----------------------------------------------------------------------------------------- many pairs


@pytest.fixture
def phases_store(tmp_path, digits):
    store = Store(tmp_path / "ph")
    label = {"group": "G", "k": 1, "epsilon_target": 2.0, "noise_multiplier": 1.1}
    parent = _save_run(store, "G-sgd", _lenet(0), digits.spec,
                       phases={**label, "phase1": "sgd", "phase2": None, "copy": None})
    lineage = {"parent_run": parent.name, "parent_step": 10, "parent_epoch": 1.0, "parent_ref": "G-sgd@last",
               "parent_sha256": "x"}
    for opt in ("sgd", "dpsgd"):
        for i in range(2):
            _save_run(store, f"G-sgd-{opt}-{i}", _lenet(10 + 2 * i + (opt == "dpsgd")), digits.spec, lineage=lineage,
                      phases={**label, "phase1": "sgd", "phase2": opt, "copy": i},
                      epsilon=1.7 if opt == "dpsgd" else None)
    return store


def test_instability_of_siblings_table_csv_hdf5_figure(phases_store, tmp_path):
    cfg = InterpolateConfig(points=4, subset=60)
    table = api_instability(["G-*"], root=phases_store.root, config=cfg, output=tmp_path / "inst.h5", figure=False)
    assert [r.pair for r in table.rows] == ["G-sgd-dpsgd-0@last:G-sgd-dpsgd-1@last", "G-sgd-sgd-0@last:G-sgd-sgd-1@last"]
    dp, sgd = table.rows
    assert (dp.k, dp.phase2, dp.epsilon) == (1.0, "dpsgd", 2.0) and sgd.phase2 == "sgd" and math.isnan(sgd.epsilon)
    single = api_interpolate("G-sgd-sgd-0", "G-sgd-sgd-1", root=phases_store.root, config=cfg,
                             output=tmp_path / "one.h5", figure=False)
    assert sgd.instability_loss == single.instability_loss
    back = InstabilityTable.from_hdf5(table.path)
    assert [r.pair for r in back.rows] == [r.pair for r in table.rows]
    assert back.rows[0].instability_error == dp.instability_error
    text = table.csv_path.read_text().splitlines()
    assert text[0].startswith("pair,ref_a,ref_b,group,k,phase1,phase2,epsilon,instability_train_loss")
    assert len(text) == 3
    assert len(list((tmp_path / "inst-pairs").glob("*.h5"))) == 2
    explicit = api_instability([], pairs="G-sgd-sgd-0:G-sgd-dpsgd-1", root=phases_store.root, config=cfg,
                               output=tmp_path / "explicit.h5", figure=False)
    assert explicit.rows[0].phase2 == "sgd/dpsgd" and len(explicit.rows) == 1
    everything = api_instability(["G-sgd-*"], pairs="all", root=phases_store.root, config=cfg,
                                 output=tmp_path / "all.h5", figure=False)
    assert len(everything.rows) == 6  # 4 runs match G-sgd-*


def test_instability_workers_give_the_same_table(phases_store, tmp_path):
    cfg = InterpolateConfig(points=3, subset=50, split=("test",))
    serial = api_instability(["G-*"], root=phases_store.root, config=cfg, output=tmp_path / "s.h5", figure=False)
    res = CliRunner().invoke(_cli(), ["--root", str(phases_store.root), "instability", "G-*", "--points", "3",
                                      "--subset", "50", "--split", "test", "--workers", "2", "-o",
                                      str(tmp_path / "p.h5"), "--no-figure", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)["rows"]
    assert [r["instability_test_loss"] for r in rows] == [r.instability_loss["test"] for r in serial.rows]
    res = CliRunner().invoke(_cli(), ["--root", str(phases_store.root), "instability", "G-sgd", "-o",
                                      str(tmp_path / "none.h5")])
    assert res.exit_code != 0 and "no sibling pairs" in str(res.exception)


def test_tour_for_the_demo(phases_store, tmp_path):
    from landscape.api.interpolation import tour

    t = tour("G-*", root=phases_store.root, out_dir=tmp_path / "demo",
             config=InterpolateConfig(points=3, subset=50, split=("test",)))
    kinds = [r["kind"] for r in t.rows()]
    dp_row = next(r for r in t.table.rows if r.phase2 == "dpsgd")  # labelled with the epsilon spent, not the target
    assert 0 < dp_row.epsilon_spent <= 2.0 + 1e-9 and dp_row.epsilon == 2.0
    assert kinds == [f"siblings dpsgd eps={dp_row.epsilon_spent:.3g}", "siblings sgd", "phase 1 -> phase 2 (dpsgd)",
                     "phase 1 -> phase 2 (sgd)", "phase 2 sgd vs dpsgd"]
    for row, printed in zip(t.table.rows, t.rows(), strict=False):  # the chord barrier beside Def. 2.3
        res = InterpolationResult.from_hdf5(row.result)
        assert printed["chord_barrier_test_loss"] == row.chord_barrier_loss["test"] == res.chord_barrier_loss["test"]
    assert all(p.is_file() for p in t.files()) and len(t.files()) == 4 + 3 * 3


def test_instability_reuses_current_pair_files_and_recomputes_stale_ones(phases_store, tmp_path, monkeypatch):
    """--pair-dir: a pair file made from the same checkpoint files, options, data and code is read back (not
    recomputed, not rewritten); another option, another code version or a damaged file is recomputed."""
    import landscape.analyze.instability as inst
    import landscape.runtime

    cfg = InterpolateConfig(points=4, subset=60, split=("test",))
    pairs = tmp_path / "pairs"
    first = api_instability(["G-*"], root=phases_store.root, config=cfg, output=tmp_path / "one.h5", figure=False,
                            pair_dir=str(pairs))
    files = sorted(pairs.glob("*.h5"))
    assert len(files) == 2 and not (tmp_path / "one-pairs").exists()
    stamps = {f: f.stat().st_mtime_ns for f in files}

    def no_recompute(*a, **k):
        raise AssertionError("a current pair file was recomputed")

    with monkeypatch.context() as m:
        m.setattr(inst, "interpolate_pair", no_recompute)
        again = api_instability(["G-*"], root=phases_store.root, config=cfg, output=tmp_path / "two.h5",
                                figure=False, pair_dir=str(pairs))
    assert [r.instability_loss for r in again.rows] == [r.instability_loss for r in first.rows]
    assert [(r.pair, r.phase2, r.k) for r in again.rows] == [(r.pair, r.phase2, r.k) for r in first.rows]
    assert {f: f.stat().st_mtime_ns for f in files} == stamps  # not rewritten
    # the table says which pairs were read back, and the command says so after it
    assert [r.reused for r in first.rows] == [False, False] and [r.reused for r in again.rows] == [True, True]
    assert [r.reused for r in inst.InstabilityTable.from_hdf5(tmp_path / "two.h5").rows] == [True, True]
    assert inst._notes(first) == []
    assert inst._notes(again)[0].startswith(f"reused 2 of 2 pairs from {pairs} (their checkpoints, options")

    other = api_instability(["G-*"], root=phases_store.root, config=dataclasses.replace(cfg, points=5),
                            output=tmp_path / "three.h5", figure=False, pair_dir=str(pairs))
    for f in files:  # other options: recomputed, on 5 points
        back = InterpolationResult.from_hdf5(f)
        assert back.config.points == 5 and len(back.loss["test"]) == 5
    assert len(other.rows) == 2

    monkeypatch.setattr(landscape.runtime, "code_version", lambda: "0.0.0+other")
    stamps = {f: f.stat().st_mtime_ns for f in files}
    redone = api_instability(["G-*"], root=phases_store.root, config=cfg, output=tmp_path / "four.h5",
                             figure=False, pair_dir=str(pairs))
    assert [r.instability_loss for r in redone.rows] == [r.instability_loss for r in first.rows]
    assert all(f.stat().st_mtime_ns != stamps[f] for f in files)  # another code version: recomputed

    files[0].write_bytes(b"not hdf5")  # not a result file: never overwritten, one clear error
    with pytest.raises(OutputPathError, match="refusing to overwrite .*G-sgd-dpsgd-0"):
        api_instability(["G-*"], root=phases_store.root, config=cfg, output=tmp_path / "five.h5", figure=False,
                        pair_dir=str(pairs))
    assert files[0].read_bytes() == b"not hdf5"


def test_instability_pair_dir_from_the_cli(phases_store, tmp_path):
    pairs = tmp_path / "shared"
    res = CliRunner().invoke(_cli(), ["--root", str(phases_store.root), "instability", "G-*", "--points", "3",
                                      "--subset", "40", "--split", "test", "--pair-dir", str(pairs), "-o",
                                      str(tmp_path / "t.h5"), "--no-figure", "--json"])
    assert res.exit_code == 0, res.output
    assert len(list(pairs.glob("*.h5"))) == 2
    rows = json.loads(res.output)["rows"]
    assert all(Path(r["result"]).parent == pairs for r in rows)
    res = CliRunner().invoke(_cli(), ["--root", str(phases_store.root), "instability", "G-*", "--points", "3",
                                      "--subset", "40", "--split", "test", "--pair-dir", str(pairs), "-o",
                                      str(tmp_path / "t2.h5"), "--no-figure"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert f"reused 2 of 2 pairs from {pairs} " in res.output
    head, sgd = lines[0].split(), next(line.split() for line in lines if "G-sgd-sgd-0" in line)
    assert sgd[head.index("epsilon")] == "-" and sgd[head.index("epsilon_spent")] == "-"  # not applicable
    assert "nan" not in res.output
