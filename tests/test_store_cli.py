"""`landscape store ls|show` and `landscape import`, with the exit codes and error lines users see."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from landscape.data import load_dataset
from landscape.models import build_model
from landscape.store import Store

REPO = Path(__file__).resolve().parent.parent


def test_import_of_a_pipe_a_device_or_a_dangling_link_says_what_it_is(tmp_path, capsys):
    """Not 'file not found' for a file that is there; nothing is opened (a named pipe would wait for a writer)."""
    os.mkfifo(tmp_path / "pipe.pt")
    (tmp_path / "dangling.pt").symlink_to(tmp_path / "gone.pt")
    root = tmp_path / "root"
    for file, what in ((tmp_path / "pipe.pt", "is a named pipe (FIFO), not a regular file"),
                       (Path("/dev/null"), "is a character device, not a regular file"),
                       (tmp_path / "dangling.pt", "file not found")):
        code, _, err = run_cli("--root", root, "import", file, "--model", "mlp", "--data", "digits", "--run", "x",
                               capsys=capsys)
        assert code == 1 and err.startswith(f"error: {file}" if "regular" in what else "error: file not found")
        assert what in err and err.count("\n") == 1
    assert "(a link to a missing file)" in err
    assert not root.exists()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_import_refuses_weights_that_are_not_finite_naming_the_first_tensor(tmp_path, digits_mlp, capsys, bad):
    """All-NaN (or partly infinite) weights are a diverged or damaged model no analysis can use: refused in one
    line, exit 1, no run made (the Recorder refuses such weights too)."""
    _, model = digits_mlp
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["3.weight"][3, 1:4] = bad
    torch.save(state, tmp_path / "diverged.pt")
    code, _, err = run_cli("--root", tmp_path / "root", "import", tmp_path / "diverged.pt", "--model", "mlp",
                           "--model-kwargs", '{"widths": [8]}', "--data", "digits", "--run", "d", capsys=capsys)
    assert code == 1 and err == (f"error: {tmp_path / 'diverged.pt'}: tensor '3.weight' has 3 of 80 values NaN or "
                                 "infinite (a diverged or damaged model); nothing imported\n")
    assert Store(tmp_path / "root").run_names() == []


def start_subprocess(*args: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.Popen([sys.executable, "-m", "cli.main", *args], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def digits_mlp():
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes, widths=[8])
    return data, model


@pytest.fixture
def populated(tmp_path, digits_mlp):
    data, model = digits_mlp
    store = Store(tmp_path / "root")
    run = store.create_run("sgd", config={"lr": 0.1}, seeds={"seed": 0}, model_spec=model.landscape_spec,
                           data_spec=data.spec)
    run.save_checkpoint(model.state_dict(), step=0, epoch=0.0, metrics={"test_acc": 0.1, "test_loss": 2.3})
    run.save_checkpoint(model.state_dict(), step=40, epoch=2.0, epsilon=1.5,
                        metrics={"test_acc": 0.85, "test_loss": 0.4, "train_loss": 0.3})
    store.create_run("fresh", config={}, seeds={}, model_spec=model.landscape_spec, data_spec=data.spec)
    return store


def test_import_and_missing_ref_via_subprocess(tmp_path, digits_mlp):
    _, model = digits_mlp
    source = tmp_path / "opacus.pt"
    torch.save({"model_state_dict": {f"_module.{k}": v for k, v in model.state_dict().items()}}, source)
    root = str(tmp_path / "root")
    importing = start_subprocess("--root", root, "import", str(source), "--model", "mlp", "--model-kwargs",
                                 '{"widths": [8]}', "--data", "digits", "--run", "imported")
    missing = start_subprocess("--root", str(tmp_path / "other"), "store", "show", "nope@step=7")
    out, err = importing.communicate(timeout=300)
    assert importing.returncode == 0, err
    assert "imported@init" in out
    ckpt = Store(root).load("imported@init")
    assert all(torch.equal(ckpt.state_dict[k], v) for k, v in model.state_dict().items())
    assert ckpt.model_spec == model.landscape_spec and ckpt.data_spec["name"] == "digits"

    out, err = missing.communicate(timeout=300)
    assert missing.returncode == 1
    assert out == ""
    assert err.strip() == f"error: no run 'nope' in {tmp_path / 'other'} (no runs)"
    assert err.count("\n") == 1 and "Traceback" not in err


def test_store_ls_table_and_json(populated, capsys, tmp_path):
    root = str(populated.root)
    code, out, err = run_cli("--root", root, "store", "ls", capsys=capsys)
    assert code == 0, err
    header, *rows = out.strip().splitlines()
    assert header.split() == ["run", "model", "data", "ckpts", "steps", "epoch", "epsilon", "test_acc",
                              "test_loss", "train_loss"]
    assert rows[0].split() == ["fresh", "mlp", "digits", "0", "-", "-", "-", "-", "-", "-"]
    assert rows[1].split() == ["sgd", "mlp", "digits", "2", "0-40", "2", "1.5", "0.85", "0.4", "0.3"]

    code, out, _ = run_cli("--root", "/nonexistent", "store", "ls", root, "--json", capsys=capsys)  # ROOT wins
    assert code == 0
    listing = json.loads(out)
    assert [r["name"] for r in listing["runs"]] == ["fresh", "sgd"]
    sgd = listing["runs"][1]
    assert sgd["steps"] == [0, 40] and sgd["epsilon"] == 1.5 and sgd["final_metrics"]["test_acc"] == 0.85

    code, out, err = run_cli("--root", str(populated.root / "empty"), "store", "ls", capsys=capsys)
    assert code == 1 and out == "" and err.startswith("error: no store at")  # as every command on a missing root
    code, out, _ = run_cli("--root", str(tmp_path), "store", "ls", capsys=capsys)  # an empty store is no error
    assert code == 0 and out.startswith("no runs in")


def test_store_show_text_and_json(populated, digits_mlp, capsys):
    _, model = digits_mlp
    root = str(populated.root)
    code, out, err = run_cli("--root", root, "store", "show", "sgd", capsys=capsys)
    assert code == 0, err
    path = populated.resolve("sgd@step=40")
    assert f"path         {path}" in out and "step         40" in out and "epsilon      1.5" in out
    assert "test_acc=0.85" in out and "mlp" in out and "digits" in out
    assert "1.weight  8x64   float32" in out

    code, out, _ = run_cli("--root", root, "store", "show", "sgd@init", "--json", capsys=capsys)
    assert code == 0
    info = json.loads(out)
    assert info["step"] == 0 and info["epsilon"] is None and info["run"] == "sgd"
    assert info["sha256"] == populated.load("sgd@init").sha256
    assert info["model_spec"] == model.landscape_spec
    assert [t["name"] for t in info["tensors"]] == list(model.state_dict())
    assert info["tensors"][0] == {"name": "1.weight", "shape": [8, 64], "dtype": "float32", "numel": 512}
    assert info["parameters"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["store", "show", "nope"], 1, "error: no run 'nope'"),
        (["store", "show", "fresh"], 1, "error: run 'fresh' has no checkpoints yet"),
        (["store", "show", "sgd@epoch=1"], 1, "error: run 'sgd' has no checkpoint at epoch 1 (available epochs: 0, 2)"),
        (["store", "show", "sgd@bogus"], 2, "error: bad selector '@bogus'"),
        (["store", "show", "gone.h5"], 1, "error: checkpoint file not found: gone.h5"),
    ],
)
def test_store_show_errors_are_one_line(populated, capsys, args, code, needle):
    got, out, err = run_cli("--root", str(populated.root), *args, capsys=capsys)
    assert got == code
    assert err.startswith(needle) and err.count("\n") == 1 and "Traceback" not in err


def test_import_errors(tmp_path, digits_mlp, capsys):
    _, model = digits_mlp
    root = str(tmp_path / "root")
    marker = tmp_path / "PWNED"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil.pt"
    torch.save({"1.weight": torch.zeros(1), "x": Exploit()}, evil)
    code, _, err = run_cli("--root", root, "import", str(evil), "--model", "mlp", "--data", "digits", "--run", "e",
                           capsys=capsys)
    assert code == 1 and err.startswith(f"error: refusing {evil}") and err.count("\n") == 1
    assert not marker.exists()

    good = tmp_path / "good.pt"
    torch.save(model.state_dict(), good)
    code, _, err = run_cli("--root", root, "import", str(good), "--model", "mlp", "--data", "digits", "--run", "w",
                           capsys=capsys)  # default widths: shapes differ
    assert code == 1 and "has shape (8, 64) but model 'mlp' expects" in err and err.count("\n") == 1

    code, _, err = run_cli("--root", root, "import", str(good), "--model", "mlp", "--model-kwargs",
                           '{"widths": [8]}', "--data", "digits", "--run", "../up", capsys=capsys)
    assert code == 2 and "bad run name" in err

    code, _, err = run_cli("--root", root, "import", str(good), "--data", "digits", "--run", "x", capsys=capsys)
    assert code == 2 and "--model" in err  # required option
    assert Store(root).run_names() == []
