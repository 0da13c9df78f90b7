"""What the command line says where a user trips: a mistyped command, a store root that is not there, Ctrl-C (and
the command that continues the work), a finished run resumed, DP-SGD on a model with BatchNorm, a batch larger than
the training set."""

from __future__ import annotations

import shlex

import pytest
from conftest import run_cli

from landscape.errors import ModelError
from landscape.train import callbacks

TINY = ("--data", "digits", "--subset", "200", "--batch-size", "50")


def test_a_mistyped_command_gets_the_nearest_name(capsys):
    code, out, err = run_cli("interpoalte", "a", "b", capsys=capsys)
    assert code == 2 and out == ""
    assert err.strip() == "error: No such command 'interpoalte'. Did you mean 'interpolate'? (see 'landscape --help')"
    code, _, err = run_cli("xyzzy", capsys=capsys)
    assert code == 2 and "Did you mean" not in err and err.count("\n") == 1


def test_store_ls_of_a_missing_root_is_an_error_as_elsewhere(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    code, out, err = run_cli("--root", missing, "store", "ls", capsys=capsys)
    assert (code, out) == (1, "")
    assert err.strip() == f"error: no store at {missing} (no such directory); give its directory with --root or " \
                          "LANDSCAPE_ROOT"
    code, _, other = run_cli("--root", missing, "store", "show", "r@last", capsys=capsys)  # the same exit code
    assert code == 1 and other.startswith("error: no run 'r'")
    code, out, err = run_cli("--root", missing, "store", "ls", "--json", capsys=capsys)
    assert code == 1 and out == ""
    missing.mkdir()
    code, out, _ = run_cli("--root", missing, "store", "ls", capsys=capsys)  # an empty store is no error
    assert code == 0 and out.strip() == f"no runs in {missing}"


def _interrupt_at(monkeypatch, step: int) -> None:
    """Ctrl-C in the training loop once ``step`` steps are done (a checkpoint per epoch: 4 steps)."""
    on_step = callbacks.Progress.on_step

    def interrupted(self, state, stats):
        on_step(self, state, stats)
        if state.step == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(callbacks.Progress, "on_step", interrupted)


def test_ctrl_c_in_train_prints_the_command_that_continues_the_run(tmp_path, capsys, monkeypatch):
    root = tmp_path / "ck"
    with monkeypatch.context() as m:
        _interrupt_at(m, 6)
        code, out, err = run_cli("--root", root, "train", "--run", "r", "--epochs", "3", *TINY, capsys=capsys)
    assert code == 130 and out == ""
    line = err.strip().splitlines()[-1]
    command = f"landscape --root {root} train --resume r"
    assert line == f"interrupted; continue it with: {command}", err
    code, out, err = run_cli(*shlex.split(command)[1:], capsys=capsys)  # the command it printed finishes the run
    assert code == 0, err
    assert out.splitlines()[1].split()[:4] == ["r", "sgd", "-", "12"]


def test_ctrl_c_in_a_command_that_resumes_when_given_again(tmp_path, capsys, monkeypatch):
    _interrupt_at(monkeypatch, 3)  # in the Phase-1 run
    args = ["--root", str(tmp_path / "ck"), "phases", "--k", "1", "--epochs", "2", "--copies", "2", "--phase1", "sgd",
            "--phase2", "sgd", *TINY, "--group", "g"]
    code, _, err = run_cli(*args, capsys=capsys)
    assert code == 130
    assert err.strip().splitlines()[-1] == ("interrupted; continue where it stopped with the same command: "
                                            + shlex.join(["landscape", *args]))


def test_interrupted_lines():
    from cli.main import interrupted

    note = KeyboardInterrupt()
    note.add_note("continue it with: landscape --root ck train --resume r")
    assert interrupted(["train", "--run", "r"], "train", note) == \
        "interrupted; continue it with: landscape --root ck train --resume r"
    assert interrupted(["hessian", "r"], "hessian", KeyboardInterrupt()) == "interrupted"  # nothing kept to resume
    surface = ["surface", "r@last", "--grid", "51x51"]
    assert interrupted(surface, "surface", note).endswith(": landscape surface r@last --grid 51x51")  # rows kept
    assert interrupted([*surface, "--restart"], "surface", None) == "interrupted"


def test_resuming_a_finished_run_says_so(tmp_path, capsys):
    root = tmp_path / "ck"
    code, first, _ = run_cli("--root", root, "train", "--run", "r", "--epochs", "1", *TINY, capsys=capsys)
    assert code == 0
    code, out, err = run_cli("--root", root, "train", "--resume", "r", capsys=capsys)
    assert code == 0 and out.splitlines()[1].split()[:5] == first.splitlines()[1].split()[:5]
    assert err.strip() == "run 'r' is already complete (step 4 of 4): nothing to train"


def test_dp_on_batchnorm_says_how_to_replace_it(tmp_path):
    from landscape.api import TrainConfig, train

    common = dict(data="digits", subset=100, batch_size=16, optimizer="dpsgd", noise_multiplier=1.0, epochs=1)
    with pytest.raises(ModelError, match=r"use GroupNorm: train with model_kwargs='\{\"norm\": \"group\"\}'$"):
        train(TrainConfig(model="resnet18", model_kwargs={"norm": "batch"}, **common), root=tmp_path)
    (tmp_path / "bn.py").write_text(
        "from torch import nn\n\n"
        "def make(input_shape, num_classes):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, num_classes))\n")
    with pytest.raises(ModelError) as caught:
        train(TrainConfig(model=f"{tmp_path / 'bn.py'}:make", **common), root=tmp_path)
    message = str(caught.value)
    assert "replace BatchNorm in the model's factory (bn.py:make)" in message
    assert "opacus.validators.ModuleValidator.fix(model)" in message and "--model-kwargs" not in message
    train(TrainConfig(model="resnet18", model_kwargs={"norm": "batch"}, data="digits", subset=100, batch_size=16,
                      epochs=1, run="p", checkpoint_every="none"), root=tmp_path)
    with pytest.raises(ModelError, match=r"a child run keeps its parent's model: train the parent \(p@last\) with"):
        train(TrainConfig(from_ref="p@last", optimizer="dpsgd", noise_multiplier=1.0, epochs=1), root=tmp_path)


def test_a_batch_larger_than_the_training_set_is_one_warning(tmp_path, capsys):
    code, out, err = run_cli("--root", tmp_path, "train", "--run", "big", "--epochs", "2", "--batch-size", "5000",
                             capsys=capsys)
    assert code == 0
    assert err.strip() == ("warning: --batch-size 5000 exceeds the 1348 training examples: each step uses all of "
                           "them (sample rate 1), 1 step per epoch; give a batch size below 1348 for minibatch SGD")
    assert out.splitlines()[1].split()[3] == "2"  # two steps in two epochs
