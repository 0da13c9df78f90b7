"""Bad input on the command line: one ``error:`` line and exit 2 (usage) or 1 (failure), never a traceback.

One tiny store is built once (lenet a and b, mlp m, a diverged lenet run) through the library; every case
then runs the entry point ``cli.main.main`` in-process, exactly as ``landscape ...`` maps errors to exit codes.
"""

from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest
from conftest import run_cli

from cli.main import main
from landscape.api.training import train as api_train
from landscape.train.config import TrainConfig

TINY = dict(data="digits", subset=120, epochs=1, batch_size=40, checkpoint_every="none", device="cpu")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-errors") / "ck"
    for run, model, seed in (("a", "lenet", 0), ("b", "lenet", 1), ("m", "mlp", 0)):
        api_train(TrainConfig(model=model, seed=seed, run=run, **TINY), root=root)
    with pytest.warns(UserWarning, match="training loss became"):
        api_train(TrainConfig(model="lenet", lr=1e6, run="diverged", **{**TINY, "batch_size": 10}), root=root)
    return root


@pytest.fixture(scope="module")
def files(root, tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    ckpt = sorted((root / "a").glob("step-*.h5"))[-1]
    (d / "truncated.h5").write_bytes(ckpt.read_bytes()[:3000])
    with h5py.File(d / "plain.h5", "w") as f:
        f["x"] = np.arange(3)
    (d / "text.h5").write_text("not hdf5\n")
    (d / "text.pt").write_text("not a torch file\n")
    return d


def assert_one_error(code: int, err: str, expected_code: int, *fragments: str) -> str:
    assert "Traceback" not in err, err
    assert code == expected_code, err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err  # usage errors too (issue 14 item 16)
    line = lines[0]
    for fragment in fragments:
        assert fragment in line, line
    return line


USAGE = [
    # non-finite and out-of-range numbers
    ("train", "--lr", "nan"),
    ("train", "--lr", "inf"),
    ("train", "--lr", "-1"),
    ("train", "--lr", "abc"),
    ("train", "--epochs", "0"),
    ("train", "--batch-size", "0"),
    ("train", "--weight-decay", "nan"),
    ("train", "--weight-decay", "-0.1"),
    ("train", "--optimizer", "dpsgd", "--noise-multiplier", "1", "--max-grad-norm", "nan"),
    ("train", "--optimizer", "dpsgd", "--target-epsilon", "nan"),
    ("train", "--optimizer", "dpsgd", "--noise-multiplier", "-1"),
    ("train", "--subset", "nan"),
    ("train", "--subset", "0"),
    ("train", "--chunk", "0"),
    ("phases", "--k", "1", "--epochs", "2", "--noise-multiplier", "1", "--dp-lr", "nan"),
    ("phases", "--k", "1", "--epochs", "2", "--noise-multiplier", "1", "--dp-momentum", "-1"),
    ("interpolate", "a", "b", "--points", "1"),
    ("interpolate", "a", "b", "--points", "nan"),
    ("interpolate", "a", "b", "--subset", "nan"),
    ("interpolate", "a", "b", "--subset", "-1"),
    ("interpolate", "a", "b", "--chunk", "0"),
    ("directions", "a", "--distance", "nan"),
    ("directions", "a", "--directions", "0"),
    ("surface", "a", "--grid", "3x0"),
    ("surface", "a", "--range", "nan:1"),
    ("clipping", "a", "--max-grad-norm", "nan"),
    ("clipping", "a", "--prune-levels", "nan"),
    ("norms", "a", "--grad-epochs", "inf"),
    ("ntk-table", "a", "--max-grad-norms", "nan"),
    ("prune", "a", "--remove", "nan"),
    ("privacy", "--noise-multiplier", "nan", "--sample-rate", "0.01", "--steps", "10"),
    ("privacy", "--noise-multiplier", "1", "--target-epsilon", "1", "--sample-rate", "0.01", "--steps", "10"),
    # conflicting options, bad choices
    ("train", "--optimizer", "dpsgd", "--noise-multiplier", "1", "--target-epsilon", "1"),
    ("train", "--resume", "a", "--lr", "0.5"),
    ("train", "--from", "a", "--model", "mlp"),
    ("train", "--run", "bad/name"),
    ("--threads", "0", "store", "ls"),
    # devices: an unknown name and CUDA on this CPU machine
    ("train", "--device", "gpu"),
    ("interpolate", "a", "b", "--device", "gpu"),
    ("directions", "a", "--toward", "b", "--device", "tpu"),
    # malformed references
    ("interpolate", "a@foo", "b"),
    ("interpolate", "a", "b@step=x"),
    ("store", "show", "a@epoch=x"),
    ("store", "show", "a@"),
    ("clipping", "a@foo"),
]


@pytest.mark.parametrize("args", USAGE, ids=[" ".join(a) for a in USAGE])
def test_usage_errors_exit_2_with_one_line(root, args, capsys):
    code, _, err = run_cli("--root", root, *args, capsys=capsys)
    assert_one_error(code, err, 2)


def test_cuda_on_a_cpu_machine_is_one_usage_line(root, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, _, err = run_cli("--root", root, "train", "--device", "cuda", "--run", "gpu", capsys=capsys)
    assert_one_error(code, err, 2, "--device cpu")
    code, _, err = run_cli("--root", root, "interpolate", "a", "b", "--device", "cuda", capsys=capsys)
    assert_one_error(code, err, 2, "--device cpu")


def test_failures_exit_1_with_one_line(root, files, tmp_path, capsys):
    cases = [
        (("interpolate", "a", "nope"), ["no run 'nope'"]),
        (("train", "--from", "a@step=999", "--run", "x"), ["no checkpoint at step 999"]),
        (("interpolate", files / "truncated.h5", "b"), ["truncated.h5"]),
        (("store", "show", files / "text.h5"), ["text.h5"]),
        (("interpolate", files / "plain.h5", "b"), ["not a landscape checkpoint"]),
        (("interpolate", "a", "m", "-o", tmp_path / "x.h5"), ["incompatible"]),
        (("directions", "a", "--toward", "m", "--directions", "2", "--points", "3"), ["incompatible"]),
        (("show", files / "plain.h5"), ["plain.h5"]),
        (("show", files / "missing.h5"), ["missing.h5"]),
        (("train", "--run", "a", "--epochs", "1"), ["already exists"]),
        (("train", "--model-kwargs", '{"foo": 1}', "--run", "x"), ["no option 'foo'"]),
        (("import", files / "text.pt", "--model", "mlp", "--data", "digits", "--run", "imp"), ["not a torch.save()"]),
    ]
    for args, fragments in cases:
        code, _, err = run_cli("--root", root, *args, capsys=capsys)
        assert_one_error(code, err, 1, *fragments)
    assert not (tmp_path / "x.h5").exists()


def test_missing_torchvision_data_names_data_root_and_download(root, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_cli("--root", root, "train", "--data", "cifar10", "--data-root", empty, "--run", "c", capsys=capsys)
    assert_one_error(code, err, 1, "--data-root", "--download")
    assert not (root / "c").exists()


def test_diverged_training_warns_once_and_records_where(root):
    manifest = json.loads((root / "diverged" / "manifest.json").read_text())
    assert manifest["non_finite"]["step"] >= 1 and manifest["non_finite"]["loss"] in ("nan", "inf", "-inf")
    assert len(manifest["checkpoints"]) == 2  # training went on to the end: nothing lost


def test_diverged_training_from_the_cli_is_a_warning_not_a_crash(root, capsys):
    code, out, err = run_cli("--root", root, "train", "--lr", "1e6", "--run", "div2", "--subset", "120", "--epochs", "1",
                             "--batch-size", "10", "--checkpoint-every", "none", capsys=capsys)
    assert code == 0 and "Traceback" not in err
    warnings = [ln for ln in err.splitlines() if ln.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ") and "--lr" in warnings[0], err


def test_interpolation_to_a_diverged_run_is_inf_with_a_reason(root, tmp_path, capsys):
    out_file = tmp_path / "nan.h5"
    code, out, err = run_cli("--root", root, "interpolate", "a", "diverged", "--points", "3", "--no-figure",
                             "-o", out_file, "--json", capsys=capsys)
    assert code == 0 and "Traceback" not in err, err
    assert all(ln.startswith("warning: ") for ln in err.strip().splitlines()), err  # no raw source lines
    summary = json.loads(out)
    assert all(math.isinf(float(r["instability_loss"])) for r in summary["rows"])  # JSON: "inf"
    assert all("non-finite" in reason for reason in summary["reasons"].values())


def test_interpolation_to_a_diverged_run_keeps_a_finite_start(root, tmp_path, capsys):
    code, out, _ = run_cli("--root", root, "interpolate", "a", "diverged", "--points", "3", "--no-figure",
                           "-o", tmp_path / "nan.h5", "--json", capsys=capsys)
    assert code == 0
    assert all(math.isfinite(float(r["loss_A"])) for r in json.loads(out)["rows"])


def test_failed_run_leaves_an_existing_result_intact(root, tmp_path, capsys):
    target = tmp_path / "result.h5"
    code, _, err = run_cli("--root", root, "interpolate", "a", "b", "--points", "2", "--no-figure", "-o", target,
                           capsys=capsys)
    assert code == 0, err
    before = target.read_bytes()
    code, _, err = run_cli("--root", root, "interpolate", "a", "m", "--points", "2", "--no-figure", "-o", target,
                           capsys=capsys)
    assert_one_error(code, err, 1, "incompatible")
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["result.h5"]  # no temporary files left behind


def test_interrupted_result_write_keeps_the_old_file(root, tmp_path, capsys, monkeypatch):
    target = tmp_path / "result.h5"
    code, _, err = run_cli("--root", root, "interpolate", "a", "b", "--points", "2", "--no-figure", "-o", target,
                           capsys=capsys)
    assert code == 0, err
    before = target.read_bytes()

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(h5py.Group, "create_dataset", interrupted)
    code, _, err = run_cli("--root", root, "interpolate", "a", "b", "--points", "3", "--no-figure", "-o", target,
                           capsys=capsys)
    assert code == 130 and "Traceback" not in err
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["result.h5"]


def test_a_run_that_fails_before_its_first_checkpoint_frees_its_name(root, monkeypatch):
    import landscape.train.loop as loop
    from landscape.errors import UsageError

    def broken(*args, **kwargs):
        raise UsageError("boom")

    monkeypatch.setattr(loop, "_build_state", broken)
    with pytest.raises(UsageError):
        api_train(TrainConfig(run="early", **TINY), root=root)
    assert not (root / "early").exists()


def test_output_never_replaces_a_checkpoint_or_sits_below_a_file(root, files, tmp_path, capsys):
    checkpoint = sorted((root / "a").glob("step-*.h5"))[-1]
    before = checkpoint.read_bytes()
    for target, fragment in ((checkpoint, "refusing to overwrite"), (files / "plain.h5", "refusing to overwrite"),
                             (files / "text.h5" / "x.h5", "is a file")):
        code, _, err = run_cli("--root", root, "interpolate", "a", "b", "--points", "2", "--no-figure", "-o", target,
                               capsys=capsys)
        assert_one_error(code, err, 2, fragment)
    assert checkpoint.read_bytes() == before
    # a missing directory is created, and an existing result file is replaced
    target = tmp_path / "new" / "dir" / "r.h5"
    for _ in range(2):
        code, _, err = run_cli("--root", root, "interpolate", "a", "b", "--points", "2", "--no-figure", "-o", target,
                               capsys=capsys)
        assert code == 0, err


@pytest.mark.parametrize("case", ["checkpoint", "other data", "below a file", "a directory", "name too long"])
def test_a_bad_output_is_one_message_from_the_command_line_and_the_api(root, files, tmp_path, capsys, case):
    """The output rule is checked in one place (landscape.results.check_output_path, before any work): the command
    line prints the api's message as it is, exit 2, and nothing is written."""
    from landscape.errors import OutputPathError

    checkpoint = tmp_path / "ckpt.h5"
    checkpoint.write_bytes(sorted((root / "a").glob("step-*.h5"))[-1].read_bytes())
    (tmp_path / "folder.h5").mkdir()
    target, fragment = {
        "checkpoint": (checkpoint, f"refusing to overwrite {checkpoint}: it is not a landscape result file"),
        "other data": (files / "plain.h5", "refusing to overwrite"),
        "below a file": (files / "text.h5" / "x.h5", "text.h5 is a file, not a directory"),
        "a directory": (tmp_path / "folder.h5", f"cannot write result {tmp_path / 'folder.h5'}: it is a directory"),
        "name too long": (tmp_path / ("n" * 300 + ".h5"), "is longer than 255 bytes"),
    }[case]
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(OutputPathError) as caught:
        _api_interpolate(root, target)
    assert fragment in str(caught.value)
    code, _, err = run_cli("--root", root, "interpolate", "a", "b", "--points", "2", "--no-figure", "-o", target,
                           capsys=capsys)
    assert_one_error(code, err, 2, fragment)
    assert err.strip() == f"error: {caught.value}"  # the same line, not click's "Invalid value for '-o'" form
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def _api_interpolate(root, output):
    from landscape.analyze.specs import InterpolateConfig
    from landscape.api import interpolate

    return interpolate("a", "b", root=root, config=InterpolateConfig(points=2), output=output, figure=False)


def test_api_output_below_a_file_is_a_landscape_error(root, files):
    from landscape.errors import LandscapeError

    with pytest.raises(LandscapeError, match="text.h5"):
        _api_interpolate(root, files / "text.h5" / "x.h5")


def test_api_output_never_replaces_a_checkpoint(root, tmp_path):
    from landscape.errors import LandscapeError

    victim = tmp_path / "ckpt.h5"
    victim.write_bytes(sorted((root / "a").glob("step-*.h5"))[-1].read_bytes())
    with pytest.raises(LandscapeError):
        _api_interpolate(root, victim)


def test_norms_grad_epochs_must_name_a_checkpoint_epoch(root, capsys):
    code, _, err = run_cli("--root", root, "norms", "a", "--grad-epochs", "99", "--subset", "8", "--no-figure",
                           capsys=capsys)
    assert_one_error(code, err, 2, "--grad-epochs 99", "available")


def test_clipping_on_a_diverged_run_warns(root, tmp_path, capsys):
    code, _, err = run_cli("--root", root, "clipping", "diverged@last", "--max-grad-norm", "1", "--batch-size", "16",
                           "--batches", "1", "--no-figure", "-o", tmp_path / "c.h5", capsys=capsys)
    assert code == 0, err
    assert "Traceback" not in err
    assert any(line.startswith("warning:") and "non-finite gradients" in line for line in err.splitlines()), err


# ------------------------------------------------------------------ issue 14 items 15, 17, 18 (ntk)


def test_output_guard_checks_every_file_a_command_writes(root, tmp_path, capsys):
    """-o X.h5 also writes X.csv, figures X.png/X.pdf/X-<part>.png and pair results under X-pairs/: a user's
    file at any of those names is never replaced (exit 2, one line, checked before computing)."""
    users = {"X.csv": ("instability", "--pairs", "a:b", "--no-figure"),
             "Y.pdf": ("interpolate", "a", "b"),
             "S-contour.png": ("surface", "a", "--grid", "2x2"),
             "P-pairs/notes.txt": ("instability", "--pairs", "a:b", "--no-figure")}
    for name, args in users.items():
        mine = tmp_path / name
        mine.parent.mkdir(exist_ok=True)
        mine.write_text("my data\n")
        out = tmp_path / (name.split("-")[0].split(".")[0] + ".h5")
        size = ("--subset", "20") if args[0] == "surface" else ("--points", "2")
        code, _, err = run_cli("--root", root, *args, *size, "-o", out, capsys=capsys)
        assert_one_error(code, err, 2, "P-pairs" if "/" in name else name)
        assert mine.read_text() == "my data\n" and not out.exists()
    # a file where the pair directory goes
    (tmp_path / "F-pairs").write_text("x")
    code, _, err = run_cli("--root", root, "instability", "--pairs", "a:b", "--points", "2", "--no-figure",
                           "-o", tmp_path / "F.h5", capsys=capsys)
    assert_one_error(code, err, 2, "F-pairs", "is a file")
    # our own result, CSV and pair files are replaced on a second run
    for _ in range(2):
        code, _, err = run_cli("--root", root, "instability", "--pairs", "a:b", "--points", "2", "--no-figure",
                               "-o", tmp_path / "ours.h5", capsys=capsys)
        assert code == 0, err
    assert (tmp_path / "ours.csv").is_file() and list((tmp_path / "ours-pairs").glob("*.h5"))


def test_companions_ignore_other_results_figures(tmp_path):
    from landscape.results import companions

    # a one-word part may be ours (S-contour.png, S-params.pdf); S-b-contour.png is result S-b's figure
    for name in ("S.png", "S-contour.png", "S-params.pdf", "S-b-contour.png", "S.csv", "Sx.png", "S.txt"):
        (tmp_path / name).write_text("")
    assert sorted(p.name for p in companions(tmp_path / "S.h5")) == ["S-contour.png", "S-params.pdf", "S.csv",
                                                                      "S.png"]
    assert [p.name for p in companions(tmp_path / "S.h5", csv=False, figures=False)] == []


def test_numbers_beyond_float32_and_diverged_inputs_are_one_line(root, tmp_path, capsys):
    code, _, err = run_cli("--root", root, "surface", "a", "--range=-1e39:1e39", "--grid", "2x2", capsys=capsys)
    assert_one_error(code, err, 2, "--range", "float32")
    # a diverged run: its trajectory has no PCA plane and its kernel is not finite -- failures, not usage
    code, _, err = run_cli("--root", root, "surface", "diverged", "--plane", "pca:diverged", "--grid", "2x2", "--no-figure",
                           "-o", tmp_path / "s.h5", capsys=capsys)
    assert_one_error(code, err, 1, "diverged run")
    code, _, err = run_cli("--root", root, "ntk", "diverged", "--subset", "8", "--no-figure", "-o", tmp_path / "n.h5",
                           capsys=capsys)
    assert_one_error(code, err, 1, "non-finite")
    assert not list(tmp_path.iterdir())


def test_store_root_below_a_file_is_one_line(root, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["--root", str(tmp_path / "afile" / "sub"), "train", "--run", "z"])
    assert_one_error(exit_.value.code, capsys.readouterr().err, 1, "afile")


def test_long_names_are_one_line_or_a_short_default(root, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("--root", root, "interpolate", "a", "b", "--points", "2", "--no-figure",
                           "-o", tmp_path / ("o" * 300 + ".h5"), capsys=capsys)
    line = assert_one_error(code, err, 2, "longer than 255 bytes")
    assert len(line) < 400
    long = "r" * 200  # the longest legal run name: default outputs embed it (twice for a pair)
    api_train(TrainConfig(model="lenet", run=long, **TINY), root=root)
    for args in (("interpolate", "a", long, "--points", "2"), ("directions", long, "--directions", "1", "--points", "2",
                                                                 "--distance", "1")):
        code, out, err = run_cli("--root", root, *args, "--no-figure", capsys=capsys)
        assert code == 0, err
    written = list((tmp_path / "results").glob("*.h5"))
    assert len(written) == 2 and all(len(p.name) <= 255 for p in written)


def test_phases_checks_derived_names_before_training(root, capsys):
    group = "g" * 195  # legal alone; G-sgd-sgd-0 is 205 characters
    before = sorted(p.name for p in root.iterdir())
    code, _, err = run_cli("--root", root, "phases", "--data", "digits", "--subset", "120", "--epochs", "2", "--k", "1",
                           "--phase1", "sgd", "--phase2", "sgd", "--group", group, capsys=capsys)
    assert_one_error(code, err, 2, "--group", "205 characters")
    assert sorted(p.name for p in root.iterdir()) == before  # Phase 1 did not train


def test_no_arguments_print_the_help_and_usage_errors_name_it(root, capsys):
    for args in ([], ["store"]):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            main(args)
        out, err = capsys.readouterr()
        assert exit_.value.code == 0 and out.startswith("Usage: landscape") and not err
    for args, hint in ((("nosuch",), "'landscape --help'"), (("train", "--nosuch"), "'landscape train --help'"),
                       (("store", "show"), "'landscape store show --help'")):
        code, _, err = run_cli("--root", root, *args, capsys=capsys)
        assert_one_error(code, err, 2, hint)
