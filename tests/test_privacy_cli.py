"""`landscape privacy` and `landscape prune` as users run them: output, exit codes, one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from cli import main as cli_main

COMMANDS = {
    "privacy": ("cli.privacy:privacy", "Epsilon of a DP-SGD schedule, or sigma for a target epsilon."),
}


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    for name, entry in COMMANDS.items():
        if name not in cli_main.COMMANDS:
            monkeypatch.setitem(cli_main.COMMANDS, name, entry)


def run(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        cli_main.main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_privacy_epsilon_reference(capsys):
    code, out, err = run(
        capsys,
        "privacy",
        "--noise-multiplier",
        "1.1",
        "--batch-size",
        "256",
        "--dataset-size",
        "60000",
        "--epochs",
        "60",
        "--json",
    )
    assert code == 0, err
    got = json.loads(out)
    assert got["steps"] == 60 * 235  # epochs * ceil(60000 / 256), as the trainer runs them
    assert got["epsilon"] == pytest.approx(2.6003, abs=1e-3)
    code, out, _ = run(
        capsys, "privacy", "--noise-multiplier", "1.1", "--sample-rate", str(256 / 60000), "--steps", "14062"
    )
    assert code == 0 and "epsilon 2.5966" in out


def test_privacy_target_epsilon(capsys):
    code, out, err = run(
        capsys,
        "privacy",
        "--target-epsilon",
        "3",
        "--batch-size",
        "256",
        "--dataset-size",
        "60000",
        "--epochs",
        "60",
        "--json",
    )
    assert code == 0, err
    got = json.loads(out)
    assert 2.97 <= got["epsilon"] <= 3.0
    assert got["noise_multiplier"] < 1.1


@pytest.mark.parametrize(
    "args",
    [
        ["--noise-multiplier", "1", "--target-epsilon", "2", "--sample-rate", "0.01", "--steps", "10"],
        ["--noise-multiplier", "1", "--sample-rate", "0.01", "--batch-size", "5", "--steps", "10"],
        ["--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10", "--epochs", "1"],
        ["--noise-multiplier", "1", "--batch-size", "5", "--steps", "10"],
        ["--noise-multiplier", "1", "--sample-rate", "2", "--steps", "10"],
        ["--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "10", "--method", "prv"],
    ],
)
def test_privacy_usage_errors_exit_2(capsys, args):
    code, out, err = run(capsys, "privacy", *args)
    assert code == 2
    assert "Traceback" not in err and err.strip()


def test_privacy_unreachable_target_exit_1(capsys):
    code, _, err = run(
        capsys, "privacy", "--target-epsilon", "1e-9", "--sample-rate", "1", "--steps", "1000000"
    )
    assert code == 1
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def make_source_run(root, name="src", subset=None):
    from landscape.models import build_model
    from landscape.store import Store

    torch.manual_seed(0)
    model = build_model("lenet", input_shape=(1, 8, 8), num_classes=10)
    run = Store(root).create_run(
        name,
        config={},
        seeds={},
        model_spec=model.landscape_spec,
        data_spec={"name": "digits", "seed": 0, "subset": subset, "options": {}},
    )
    init = {k: v.clone() for k, v in model.state_dict().items()}
    run.save_checkpoint(init, step=0, epoch=0.0)
    trained = {k: v + 0.1 * torch.randn_like(v) for k, v in init.items()}
    run.save_checkpoint(trained, step=10, epoch=1.0)
    return init, trained


def test_prune_cli_creates_rewound_run_with_mask(capsys, tmp_path):
    from landscape.store import Store
    from landscape.train.pruning import load_masks

    init, trained = make_source_run(tmp_path)
    code, out, err = run(capsys, "--root", str(tmp_path), "prune", "src", "--remove", "0.7", "--run", "p70")
    assert code == 0, err
    assert "kept_fraction" in out and "total" in out and "p70" in out
    store = Store(tmp_path)
    masks = load_masks(store.run("p70"))
    ckpt = store.load("p70@init")
    assert ckpt.step == 0
    assert store.run("p70").manifest["lineage"]["parent_run"] == "src"
    assert store.run("p70").manifest["lineage"]["parent_step"] == 10
    for n, t in ckpt.state_dict.items():
        if n in masks:
            m = masks[n]
            assert int((~m).sum()) == round(0.7 * m.numel())
            assert torch.equal(t[m], init[n][m]) and bool((t[~m] == 0).all())
            # the mask came from the TRAINED magnitudes
            assert float(trained[n].abs()[~m].max()) <= float(trained[n].abs()[m].min())
        else:
            assert torch.equal(t, init[n])


def test_prune_cli_json_global_and_no_rewind(capsys, tmp_path):
    from landscape.store import Store

    _, trained = make_source_run(tmp_path)
    code, out, err = run(
        capsys,
        "--root",
        str(tmp_path),
        "prune",
        "src@step=10",
        "--remove",
        "0.5",
        "--scope",
        "global",
        "--rewind",
        "none",
        "--run",
        "g50",
        "--json",
    )
    assert code == 0, err
    got = json.loads(out)
    assert got["kept_fraction"] == pytest.approx(0.5, abs=1e-3) and got["init"] is None
    state = Store(tmp_path).load("g50").state_dict
    nonzero = state["0.weight"] != 0
    assert torch.equal(state["0.weight"][nonzero], trained["0.weight"][nonzero])


def test_prune_cli_errors(capsys, tmp_path):
    make_source_run(tmp_path)
    code, _, err = run(capsys, "--root", str(tmp_path), "prune", "nope", "--remove", "0.5")
    assert code == 1 and err.startswith("error: ")
    code, _, err = run(capsys, "--root", str(tmp_path), "prune", "src", "--remove", "1.5")
    assert code == 2
    code, _, err = run(
        capsys,
        "--root",
        str(tmp_path),
        "prune",
        "src",
        "--remove",
        "0.5",
        "--rewind",
        "none",
        "--init",
        "src@init",
    )
    assert code == 2 and err.startswith("error: ")


def test_prune_with_mask_from_subset_run_and_init_of_target(capsys, tmp_path):
    """Watson Fig. 13: the mask from a run on a 5% subset, rewound to the target run's initialisation."""
    from landscape.store import Store

    make_source_run(tmp_path, "subset-run", subset=0.05)
    target_init, _ = make_source_run(tmp_path, "target")
    store = Store(tmp_path)
    code, _, err = run(
        capsys,
        "--root",
        str(tmp_path),
        "prune",
        "subset-run",
        "--remove",
        "0.5",
        "--init",
        "target@init",
        "--run",
        "p",
    )
    assert code == 0, err
    assert store.run("p").manifest["config"]["init_ref"] == "target@init"
    assert store.run("p").manifest["data_spec"]["subset"] is None  # trains on the target's data
    state = store.load("p").state_dict
    nz = state["7.weight"] != 0
    assert torch.equal(state["7.weight"][nz], target_init["7.weight"][nz])


def test_privacy_prediction_equals_what_training_records(capsys, tmp_path):
    """One step rule (issue 14 item 3): `privacy --epochs` predicts the epsilon a trained run records, and its
    sigma for a target is the sigma training uses. N = 130, B = 32: ceil(N/B) = 5 steps per epoch, not
    int(3 * 130 / 32) = 12 over three epochs."""
    from landscape.data import load_dataset
    from landscape.train.config import TrainConfig
    from landscape.train.loop import train

    data = dict(data="gaussian-signal", data_kwargs={"ds": 5, "dn": 45, "n": 130, "n_test": 20})
    n = len(load_dataset("gaussian-signal", seed=0, **data["data_kwargs"]).y_train)
    common = dict(model="two-layer-linear", model_kwargs={"hidden": 4}, **data, epochs=3, batch_size=32,
                  optimizer="dpsgd", checkpoint_every="none")
    ran = train(TrainConfig(**common, noise_multiplier=0.9, run="dp"), root=tmp_path, progress=False)
    code, out, err = run(capsys, "privacy", "--noise-multiplier", "0.9", "--batch-size", "32", "--dataset-size",
                         str(n), "--epochs", "3", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["steps"] == ran.manifest["schedule"]["total_steps"] == 15
    assert got["epsilon"] == pytest.approx(ran.checkpoints()[-1].epsilon, rel=1e-12)
    target = train(TrainConfig(**common, target_epsilon=6.0, run="dp6"), root=tmp_path, progress=False)
    code, out, err = run(capsys, "privacy", "--target-epsilon", "6", "--batch-size", "32", "--dataset-size", str(n),
                         "--epochs", "3", "--json")
    got = json.loads(out)
    assert got["noise_multiplier"] == target.manifest["privacy"]["noise_multiplier"]
    assert got["epsilon"] == pytest.approx(target.checkpoints()[-1].epsilon, rel=1e-12)
    # with only q the same rule reads ceil(1/q) steps per epoch
    code, out, err = run(capsys, "privacy", "--noise-multiplier", "0.9", "--sample-rate", str(32 / n),
                         "--epochs", "3", "--json")
    assert json.loads(out)["steps"] == 15


def test_privacy_epochs_must_be_whole(capsys):
    code, _, err = run(capsys, "privacy", "--noise-multiplier", "1", "--batch-size", "64", "--dataset-size",
                       "1348", "--epochs", "2.5")
    assert code == 2 and "Traceback" not in err
