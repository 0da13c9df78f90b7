"""Issue 23 items 5-8: bad input that used to hang, print a traceback or pass silently is one line now.

Seeds follow one rule everywhere (integers in [0, 2**63 - 1]), counts whose size is allocated up front have
stated maxima, derived file names are checked before anything is written, non-finite results fail, a
manifest without the store's fields is damage, a malformed ``--scheduler`` is a usage error before anything
runs and an unreachable one a failure. Every case runs the entry point in-process (``cli.main.main``).
"""

from __future__ import annotations

import json
import os
import time

import click
import pytest
from conftest import run_cli
from test_cli_errors import assert_one_error  # noqa: I001
from test_cli_fuzz import walk

from cli.main import cli
from landscape.api.training import train as api_train
from landscape.bounds import (
    BINS_MAX,
    DIRECTIONS_MAX,
    LANCZOS_STEPS_MAX,
    POINTS_MAX,
    SEED_MAX,
    check_seed,
    is_seed,
    subset_value,
)
from landscape.errors import UsageError
from landscape.train.config import TrainConfig

TINY = dict(data="digits", subset=120, epochs=1, batch_size=40, checkpoint_every="none", device="cpu")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("trust") / "ck"
    api_train(TrainConfig(model="lenet", seed=0, run="a", **TINY), root=root)
    return root


def one_error(code: int, err: str, expected: int, *fragments: str) -> str:
    """``assert_one_error`` after dropping the line a ``--scheduler`` command prints while it connects."""
    kept = "\n".join(line for line in err.splitlines() if not line.startswith("dask: connecting"))
    return assert_one_error(code, kept, expected, *fragments)


SEED_OPTIONS = [(path, command, p) for path, command in walk(cli) for p in command.params
                if isinstance(p, click.Option) and is_seed(p.name)]


# ------------------------------------------------------------------------------------------------ seeds (7)


def test_every_command_has_the_same_seed_rule():
    found = {(" ".join(path), p.opts[0]) for path, _, p in SEED_OPTIONS}
    # the commands that used to accept -1 and those that printed a traceback for it
    assert {("train", "--seed"), ("phases", "--data-seed"), ("interpolate", "--subset-seed"), ("symmetry", "--seed"),
            ("ntk", "--seed"), ("ntk-table", "--seed"), ("directions", "--subset-seed"),
            ("surface", "--subset-seed"), ("instability", "--subset-seed"), ("align", "--seed")} <= found
    for _, _, p in SEED_OPTIONS:
        assert (p.type.min, p.type.max) == (0, SEED_MAX), p.opts


@pytest.mark.parametrize("path, command, param", SEED_OPTIONS,
                         ids=[f"{' '.join(p)} {q.opts[0]}" for p, _, q in SEED_OPTIONS])
def test_a_negative_seed_is_one_usage_line_everywhere(tmp_path, capsys, path, command, param):
    arguments = ["x" for p in command.params if isinstance(p, click.Argument)]
    code, _, err = run_cli("--root", tmp_path, *path, f"{param.opts[0]}=-1", *arguments, capsys=capsys)
    one_error(code, err, 2, param.opts[0], "[0, 2**63 - 1]")


def test_the_seed_rule_holds_in_the_api_and_batch_configs():
    from landscape.analyze.interpolate import InterpolateConfig
    from landscape.options import build

    with pytest.raises(UsageError, match=r"--subset-seed must be an integer seed in \[0, 2\*\*63 - 1\]"):
        build(InterpolateConfig, {"subset_seed": -1})
    with pytest.raises(UsageError, match="--seed must be an integer seed"):
        TrainConfig(seed=-1).validate()
    with pytest.raises(UsageError, match="--data-seed"):
        TrainConfig(data_seed=2**63).validate()
    assert check_seed("--seed", 2**63 - 1) == SEED_MAX and check_seed("--seed", 3.0) == 3
    with pytest.raises(UsageError):
        check_seed("--seed", 1.5)


# ------------------------------------------------------------------------------------------------ bounds (6)


@pytest.mark.parametrize("args, flag, limit", [
    (("calibration", "a", "--bins", "1000000000"), "--bins", BINS_MAX),
    (("norms", "a", "--bins", "1000000000"), "--bins", BINS_MAX),
    (("interpolate", "a", "a", "--points", "1000000000"), "--points", POINTS_MAX),
    (("directions", "a", "--points", "1000000000"), "--points", POINTS_MAX),
    (("instability", "a", "--points", "1000000000"), "--points", POINTS_MAX),
    (("demo", "--points", "1000000000"), "--points", POINTS_MAX),
    (("directions", "a", "--directions", "1000000"), "--directions", DIRECTIONS_MAX),
    (("demo", "--directions", "1000000"), "--directions", DIRECTIONS_MAX),
    (("hessian", "a@last", "--lanczos-steps", "1000000000"), "--lanczos-steps", LANCZOS_STEPS_MAX),
    (("train", "--epochs", str(2**63)), "--epochs", 2**31 - 1),
    (("train", "--subset", str(2**63)), "--subset", 2**31 - 1),
])
def test_huge_counts_are_refused_at_once(root, capsys, args, flag, limit):
    start = time.perf_counter()
    code, _, err = run_cli("--root", root, *args, capsys=capsys)
    one_error(code, err, 2, flag, str(limit))
    assert time.perf_counter() - start < 5


def test_huge_surface_grid_and_api_counts_are_refused(root, capsys):
    code, _, err = run_cli("--root", root, "surface", "a", "--grid", "100000x100000", capsys=capsys)
    one_error(code, err, 2, "--grid", "1000000 cells")
    from landscape.api import calibration

    with pytest.raises(UsageError, match=f"--bins must be <= {BINS_MAX}"):
        calibration("a", root=str(root), bins=10**9)
    from landscape.analyze.hessian import HessianConfig
    from landscape.api import hessian

    for refuse in (lambda: hessian("a@last", root=str(root), lanczos_steps=10**9),
                   lambda: HessianConfig(lanczos_steps=LANCZOS_STEPS_MAX + 1)):
        with pytest.raises(UsageError, match=f"^--lanczos-steps must be <= {LANCZOS_STEPS_MAX}, got "):
            refuse()
    assert HessianConfig(lanczos_steps=LANCZOS_STEPS_MAX).lanczos_steps == LANCZOS_STEPS_MAX
    assert subset_value(300) == 300 and subset_value("0.3") == 0.3
    for bad in (0, -1, 1.5, float("nan"), "abc", True):
        with pytest.raises(UsageError):
            subset_value(bad)


# ------------------------------------------------------------------------ memory, distance, names (7)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400GB", "0"])
def test_ntk_max_memory_must_be_a_finite_positive_size(root, capsys, value):
    code, _, err = run_cli("--root", root, "ntk", "a", "--max-memory", value, capsys=capsys)
    one_error(code, err, 2, "memory budget")


def test_directions_distance_beyond_float32_and_non_finite_profiles(root, tmp_path, capsys):
    code, _, err = run_cli("--root", root, "directions", "a", "--distance", "1e39", capsys=capsys)
    one_error(code, err, 2, "--distance", "float32")
    # finite in float32, but every step away from A overflows the weights: a failure, not all-NaN results
    code, _, err = run_cli("--root", root, "directions", "a", "--distance", "3e38", "--directions", "2", "--points", "2",
                           "--no-figure", "-o", tmp_path / "d.h5", capsys=capsys)
    one_error(code, err, 1, "non-finite", "--distance")
    assert not (tmp_path / "d.h5").exists()


def test_output_names_are_checked_with_their_derived_files(root, tmp_path, capsys):
    name = "o" * 249 + ".h5"  # 252 bytes: legal itself, but o...o.png / -reliability.pdf / its temp file are not
    code, _, err = run_cli("--root", root, "interpolate", "a", "a", "--points", "2", "-o", tmp_path / name, capsys=capsys)
    one_error(code, err, 2, "no room for the figures")
    deep = tmp_path / "/".join(["d" * 200] * 21) / "r.h5"  # past PATH_MAX (4096 bytes)
    code, _, err = run_cli("--root", root, "interpolate", "a", "a", "--points", "2", "-o", deep, capsys=capsys)
    one_error(code, err, 2, "4096")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    ok = tmp_path / ("o" * 200 + ".h5")
    code, _, err = run_cli("--root", root, "interpolate", "a", "a", "--points", "2", "-o", ok, capsys=capsys)
    assert code == 0, err
    assert ok.exists() and ok.with_suffix(".png").exists()


def test_paths_past_the_system_limits_are_one_usage_line(root, tmp_path, capsys):
    deep = "/".join(["d" * 200] * 22)  # 4,421 bytes: past PATH_MAX wherever the command meets it
    for args in (("--root", deep, "store", "ls"), ("interpolate", f"{deep}/x.h5", "a"), ("show", f"{deep}/x.h5"),
                 ("import", f"{deep}/x.pt", "--model", "mlp", "--data", "digits", "--run", "q"),
                 ("store", "show", "n" * 300 + ".h5")):
        code, _, err = run_cli("--root", root, *args, capsys=capsys)
        line = one_error(code, err, 2, "file name too long", "255 a name and 4096 a path")
        assert len(line) < 300


def test_import_of_a_link_to_a_non_checkpoint_is_one_line(root, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "abc.pt").write_bytes(b"abc")  # torch's unpickler raised IndexError on this
    os.symlink(tmp_path / "notes.txt", tmp_path / "link.pt")
    os.symlink(tmp_path / "abc.pt", tmp_path / "link2.pt")
    for name in ("link.pt", "link2.pt", "abc.pt"):
        code, _, err = run_cli("--root", tmp_path / "ck", "import", tmp_path / name, "--run", "imp", "--model", "mlp", "--data", "digits",
                               capsys=capsys)
        line = one_error(code, err, 1, "not a torch.save() file")
        assert ("a link to" in line) == name.startswith("link")
    (tmp_path / "pickle.pt").write_bytes(b"\x80\x02abc")  # a pickle header, then garbage: IndexError in torch
    os.symlink(tmp_path / "pickle.pt", tmp_path / "link3.pt")
    code, _, err = run_cli("--root", tmp_path / "ck", "import", tmp_path / "link3.pt", "--run", "imp", "--model", "mlp",
                           "--data", "digits", capsys=capsys)
    one_error(code, err, 1, "cannot read", "link3.pt as a PyTorch file")
    assert not (tmp_path / "ck" / "imp").exists()


# ------------------------------------------------------------------------------------------- manifest (8)


@pytest.mark.parametrize("manifest, field", [({}, "format"), ({"checkpoints": []}, "format")])
def test_an_empty_manifest_is_damage(root, tmp_path, capsys, manifest, field):
    import shutil

    store = tmp_path / "ck"
    shutil.copytree(root / "a", store / "a")
    (store / "a" / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_cli("--root", store, "store", "show", "a", capsys=capsys)
    one_error(code, err, 1, "damaged run manifest", f"'{field}' is missing")


def test_an_unhashed_checkpoint_entry_is_damage(root, tmp_path, capsys):
    import shutil

    store = tmp_path / "ck"
    shutil.copytree(root / "a", store / "a")
    path = store / "a" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["checkpoints"][0]["sha256"] = None
    path.write_text(json.dumps(manifest))
    code, _, err = run_cli("--root", store, "store", "show", "a", capsys=capsys)
    one_error(code, err, 1, "checkpoints[0].sha256", "64 hex digits")


# ------------------------------------------------------------------------------------------ scheduler (5)

BAD_ADDRESSES = ["tcp://", "tcp://[::1", "tcp://127.0.0.1:abc", "inproc://x", "127.0.0.1:8786", "tcp://:8786",
                 "tcp://127.0.0.1:0", "tcp://127.0.0.1:99999", "tcp://a b:1"]
SCHEDULER_COMMANDS = [path for path, command in walk(cli)
                      if any(isinstance(p, click.Option) and p.name == "scheduler" for p in command.params)]


def test_every_parallel_command_takes_a_checked_scheduler():
    names = {" ".join(p) for p in SCHEDULER_COMMANDS}
    assert {"batch", "figures", "surface", "instability", "directions", "norms", "hessian"} <= names


@pytest.mark.parametrize("address", BAD_ADDRESSES)
@pytest.mark.parametrize("path", SCHEDULER_COMMANDS, ids=[" ".join(p) for p in SCHEDULER_COMMANDS])
def test_a_malformed_scheduler_is_one_usage_line(tmp_path, capsys, path, address):
    command = dict(walk(cli))[path]
    arguments = ["x" for p in command.params if isinstance(p, click.Argument)]
    start = time.perf_counter()
    code, _, err = run_cli("--root", tmp_path, *path, "--scheduler", address, *arguments, capsys=capsys)
    one_error(code, err, 2, "--scheduler", "tcp://HOST:PORT")
    assert time.perf_counter() - start < 5


def test_an_unreachable_scheduler_is_one_failure_line_saying_how_long(root, tmp_path, capsys, monkeypatch):
    from landscape import bounds

    monkeypatch.setattr(bounds, "SCHEDULER_TIMEOUT_S", 1)
    (tmp_path / "spec.yaml").write_text("jobs:\n  i: {kind: interpolate, refs: [a, a], points: 2}\n")
    monkeypatch.chdir(tmp_path)
    for args in (("batch", "spec.yaml"), ("surface", "a", "--grid", "2x2")):
        code, _, err = run_cli("--root", root, *args, "--scheduler", "tcp://127.0.0.1:1", capsys=capsys)
        one_error(code, err, 1, "cannot reach the Dask scheduler at tcp://127.0.0.1:1 within 1 s")
        assert "dask: connecting to the scheduler at tcp://127.0.0.1:1 (waiting up to 1 s)" in err
