"""Phase 1 / Phase 2 branches (Watson et al. Sec. 4.1.1): shared init, lineage, sibling seeds, epsilon."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import cli.main
from landscape.api.training import phases
from landscape.errors import UsageError
from landscape.store import Store
from landscape.train import accounting
from landscape.train.config import PhasesConfig, TrainConfig
from landscape.train.loop import PrivacyEvent

BASE = dict(model="lenet", data="digits", subset=200, batch_size=50, epochs=3, lr=0.05,
            max_grad_norm=1.0, noise_multiplier=1.0, checkpoint_every="1e", seed=7)


def equal_states(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_phases_builds_four_combinations_from_one_init(tmp_path):
    summaries = phases(PhasesConfig(base=TrainConfig(**BASE), k=1, copies=2, group="g"), root=tmp_path)
    names = [s.run for s in summaries]
    assert names == ["g-sgd", "g-sgd-sgd-0", "g-sgd-sgd-1", "g-sgd-dpsgd-0", "g-sgd-dpsgd-1",
                     "g-dpsgd", "g-dpsgd-sgd-0", "g-dpsgd-sgd-1", "g-dpsgd-dpsgd-0", "g-dpsgd-dpsgd-1"]
    store = Store(tmp_path)
    # Phase 1 SGD and Phase 1 DP start from the same initial weights
    assert equal_states(store.load("g-sgd@init").state_dict, store.load("g-dpsgd@init").state_dict)
    assert not equal_states(store.load("g-sgd@last").state_dict, store.load("g-dpsgd@last").state_dict)
    for p1 in ("sgd", "dpsgd"):
        parent = store.load(f"g-{p1}@last")
        assert parent.epoch == 1.0
        for p2 in ("sgd", "dpsgd"):
            runs = [store.run(f"g-{p1}-{p2}-{i}") for i in range(2)]
            for i, run in enumerate(runs):
                m = run.manifest
                assert m["phases"]["group"] == "g" and m["phases"]["k"] == 1
                assert (m["phases"]["phase1"], m["phases"]["phase2"], m["phases"]["copy"]) == (p1, p2, i)
                assert m["lineage"]["parent_run"] == f"g-{p1}" and m["lineage"]["parent_step"] == parent.step
                assert m["lineage"]["parent_sha256"] == parent.sha256
                assert m["config"]["optimizer"] == p2 and m["config"]["epochs"] == 2
                assert equal_states(store.load(f"{run.name}@init").state_dict, parent.state_dict)
            # siblings differ only in their seed (data order / noise) and name
            a, b = (dict(r.manifest["config"]) for r in runs)
            assert a.pop("seed") != b.pop("seed")
            assert a.pop("run") != b.pop("run")
            assert a == b
            assert not equal_states(store.load(f"g-{p1}-{p2}-0@last").state_dict,
                                    store.load(f"g-{p1}-{p2}-1@last").state_dict)
    assert store.run("g-sgd").manifest["phases"]["phase2"] is None

    # epsilon: SGD -> DP counts Phase-2 steps only; DP -> DP composes both phases
    q = store.run("g-dpsgd").manifest["privacy"]["sample_rate"]
    spe = store.run("g-dpsgd").manifest["schedule"]["steps_per_epoch"]
    by_name = {s.run: s for s in summaries}
    assert by_name["g-sgd-dpsgd-0"].epsilon == pytest.approx(accounting.epsilon(1.0, q, 2 * spe, 1e-5), rel=1e-12)
    assert by_name["g-dpsgd"].epsilon == pytest.approx(accounting.epsilon(1.0, q, spe, 1e-5), rel=1e-12)
    assert by_name["g-dpsgd-dpsgd-0"].epsilon == pytest.approx(
        accounting.composed_epsilon([PrivacyEvent(1.0, q, spe), PrivacyEvent(1.0, q, 2 * spe)], 1e-5), rel=1e-9)
    # the same sigma and q for all 3 epochs: the composition equals 3 epochs of one run (RDP is additive)
    assert by_name["g-dpsgd-dpsgd-0"].epsilon == pytest.approx(accounting.epsilon(1.0, q, 3 * spe, 1e-5), rel=1e-9)
    assert by_name["g-sgd-sgd-0"].epsilon is None
    assert store.run("g-dpsgd-sgd-0").manifest["privacy"]["ancestor_events"] == [
        {"noise_multiplier": 1.0, "sample_rate": q, "steps": spe}]
    assert store.run("g-sgd-dpsgd-0").manifest["privacy"]["non_private_ancestors"] is True

    # running the same command again reuses every run
    again = phases(PhasesConfig(base=TrainConfig(**BASE), k=1, copies=2, group="g"), root=tmp_path)
    assert [s.run for s in again] == names
    assert [s.test_acc for s in again] == [s.test_acc for s in summaries]


def test_phases_restricted_combinations_and_target_epsilon(tmp_path):
    base = TrainConfig(**{**BASE, "noise_multiplier": None, "target_epsilon": 4.0, "epochs": 2})
    summaries = phases(PhasesConfig(base=base, k=1, copies=1, phase1=("sgd",), phase2=("sgd", "dpsgd"),
                                    group="h"), root=tmp_path)
    assert [s.run for s in summaries] == ["h-sgd", "h-sgd-sgd-0", "h-sgd-dpsgd-0"]
    store = Store(tmp_path)
    label = store.run("h-sgd-dpsgd-0").manifest["phases"]
    assert label["epsilon_target"] == 4.0
    sigma = label["noise_multiplier"]
    q = store.run("h-sgd-dpsgd-0").manifest["privacy"]["sample_rate"]
    spe = store.run("h-sgd").manifest["schedule"]["steps_per_epoch"]
    # sigma is calibrated for the full DP schedule (2 epochs): a DP->DP pipeline would end at the target
    assert 4.0 * 0.99 <= accounting.epsilon(sigma, q, 2 * spe, 1e-5) <= 4.0
    # SGD -> DP spends only Phase 2's epoch
    assert summaries[-1].epsilon == pytest.approx(accounting.epsilon(sigma, q, spe, 1e-5), rel=1e-12)
    assert summaries[-1].epsilon < 4.0


def test_phases_validation():
    with pytest.raises(UsageError, match="^k must be between 1 and epochs - 1"):
        PhasesConfig(base=TrainConfig(**BASE), k=3).validate()
    with pytest.raises(UsageError, match="^phase1 takes"):
        PhasesConfig(base=TrainConfig(**BASE), k=1, phase1=("adam",)).validate()
    with pytest.raises(UsageError, match="noise"):
        PhasesConfig(base=TrainConfig(**{**BASE, "noise_multiplier": None}), k=1).validate()


def test_cli_phases_prints_the_runs(tmp_path, capsys):
    args = ["--root", str(tmp_path), "phases", "--k", "1", "--epochs", "2", "--copies", "1", "--subset", "100",
            "--batch-size", "50", "--phase1", "sgd", "--phase2", "sgd,dpsgd", "--noise-multiplier", "1.0",
            "--group", "demo"]
    with pytest.raises(SystemExit) as exc:
        cli.main.main(args)
    out = capsys.readouterr().out
    assert exc.value.code == 0
    for name in ("demo-sgd", "demo-sgd-sgd-0", "demo-sgd-dpsgd-0"):
        assert name in out
    assert "3 runs" in out


def test_phase2_sgd_lr_and_momentum_set_phase2_sgd_only(tmp_path):
    """``phase2_sgd_lr`` / ``phase2_sgd_momentum`` (the matched-lr SGD sibling reference): Phase-2 SGD copies take
    them; Phase-1 SGD keeps the base lr and momentum, DP phases keep ``dp_lr`` / ``dp_momentum``. The Phase-2 SGD
    copy is bit-identical to the same run trained by hand with ``train --from`` (independent reference)."""
    from landscape.api.training import train

    config = PhasesConfig(base=TrainConfig(**BASE), k=1, copies=1, phase1=("sgd", "dpsgd"), phase2=("sgd", "dpsgd"),
                          dp_lr=0.2, dp_momentum=0.0, phase2_sgd_lr=0.1, phase2_sgd_momentum=0.5, group="m")
    phases(config, root=tmp_path, progress=False)
    store = Store(tmp_path)
    settings = {name: (store.run(name).manifest["config"]["lr"], store.run(name).manifest["config"]["momentum"])
                for name in config.run_names("m")}
    assert settings == {"m-sgd": (0.05, 0.9), "m-sgd-sgd-0": (0.1, 0.5), "m-sgd-dpsgd-0": (0.2, 0.0),
                        "m-dpsgd": (0.2, 0.0), "m-dpsgd-sgd-0": (0.1, 0.5), "m-dpsgd-dpsgd-0": (0.2, 0.0)}
    by_hand = TrainConfig(**{**BASE, "model": None, "data": None, "subset": None, "noise_multiplier": None,
                             "from_ref": "m-sgd@last", "epochs": 2, "seed": BASE["seed"] + 1, "lr": 0.1,
                             "momentum": 0.5, "run": "hand"})
    train(by_hand, root=tmp_path, progress=False)
    assert equal_states(store.load("hand@last").state_dict, store.load("m-sgd-sgd-0@last").state_dict)


def test_phase2_sgd_options_unset_keep_every_run_and_group_hash():
    """Unset (the default), the new options change no run configuration hash and no default group name: the
    values below were computed before the options existed."""
    from landscape.api.training import _phases_hash
    from landscape.train.config import config_hash

    base = TrainConfig(**BASE)
    for config, group, hashes in (
            (PhasesConfig(base=base, k=1, copies=2), "c08ceef8", ["fbd0e6ba8f0e8a1a", "3c7e4c9997381fce"]),
            (PhasesConfig(base=base, k=2, copies=3, phase1=("sgd",), dp_lr=0.5, dp_momentum=0.0), "4c83efb0",
             ["fbd0e6ba8f0e8a1a", "740cb81ce0d53122"])):
        assert _phases_hash(config) == group
        assert [config_hash(config.phase_config(f, epochs=2, seed=8, from_ref="g-sgd@last", run=f"g-sgd-{f}-0",
                                                phase=2)) for f in ("sgd", "dpsgd")] == hashes
        moved = dataclasses.replace(config, phase2_sgd_lr=0.01)
        assert _phases_hash(moved) != group


def test_phase2_sgd_options_are_validated_in_one_line():
    for kwargs, match in (({"phase2_sgd_lr": 0.0}, "^phase2_sgd_lr must be > 0"),
                          ({"phase2_sgd_lr": float("nan")}, "^phase2_sgd_lr must be a finite"),
                          ({"phase2_sgd_momentum": 1.0}, "^phase2_sgd_momentum must be < 1, got 1.0"),
                          ({"dp_momentum": -0.5}, "^dp_momentum must be >= 0, got -0.5"),
                          ({"dp_lr": float("inf")}, "^dp_lr must be a finite")):
        with pytest.raises(UsageError, match=match):
            PhasesConfig(base=TrainConfig(**BASE), k=1, **kwargs).validate()


def test_phase2_sgd_options_from_the_command_line_and_a_batch_job(tmp_path, capsys):
    from landscape.api.training import PHASES_JOB

    args = ["--root", str(tmp_path), "phases", "--k", "1", "--epochs", "2", "--copies", "1", "--subset", "100",
            "--batch-size", "50", "--phase1", "sgd", "--phase2", "sgd", "--phase2-sgd-lr", "0.02",
            "--phase2-sgd-momentum", "0", "--group", "c"]
    with pytest.raises(SystemExit) as exc:
        cli.main.main(args)
    assert exc.value.code == 0, capsys.readouterr().err
    store = Store(tmp_path)
    assert (store.run("c-sgd-sgd-0").manifest["config"]["lr"], store.run("c-sgd-sgd-0").manifest["config"]["momentum"],
            store.run("c-sgd").manifest["config"]["lr"]) == (0.02, 0.0, 0.05)
    with pytest.raises(SystemExit) as exc:
        cli.main.main([*args[:-2], "--phase2-sgd-lr", "-1", "--group", "d"])
    assert exc.value.code == 2
    built = PHASES_JOB.build({"group": "b", "k": 1, "epochs": 2, "phase1": ["sgd"], "phase2": ["sgd"],
                              "phase2_sgd_lr": 0.3, "phase2_sgd_momentum": 0.0})
    assert (built.phase2_sgd_lr, built.phase2_sgd_momentum) == (0.3, 0.0)
