"""Issue 23 item 10: long work is visible when its output is piped or redirected (no terminal, so no bars):
``figures`` prints a line per finished recipe, ``batch`` a line per finished job and ``phases`` a line per
finished run, all on stderr, as each finishes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import run_cli

REPO = Path(__file__).resolve().parents[1]


def test_phases_prints_a_line_per_finished_run(tmp_path, capsys):
    code, out, err = run_cli("--root", str(tmp_path / "ck"), "phases", "--k", "1", "--epochs", "2", "--copies", "2",
                            "--phase1", "sgd", "--phase2", "sgd", "--subset", "100", "--batch-size", "50",
                            "--checkpoint-every", "none", "--group", "g", capsys=capsys)
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("phases: ") and "ETA" not in line]
    assert [line.split("]")[0] for line in lines] == ["phases: [1/3", "phases: [2/3", "phases: [3/3"], err
    assert "phase 1 (sgd) g-sgd finished (epoch 1.0, test acc" in lines[0]
    assert "phase 2 (sgd->sgd, copy 1) g-sgd-sgd-1 finished (epoch 1.0" in lines[2]
    assert "g-sgd-sgd-1" in out  # the table still goes to stdout


def test_figures_prints_a_line_per_finished_recipe(tmp_path, capsys):
    args = ("--root", str(tmp_path / "ck"), "figures", "watson-thm33", "--scale", "test", "--out", str(tmp_path / "f"))
    code, _, err = run_cli(*args, capsys=capsys)
    assert code == 0, err
    line = [ln for ln in err.splitlines() if ln.startswith("figures: ") and "ETA" not in ln]  # not the progress
    assert len(line) == 1 and line[0].startswith("figures: [1/1] watson-thm33 made: "), err
    code, _, err = run_cli(*args, capsys=capsys)
    assert "figures: [1/1] watson-thm33 skipped (finished)" in err


def test_batch_prints_a_line_per_finished_job_when_piped(tmp_path):
    (tmp_path / "spec.yaml").write_text(
        "jobs:\n  t: {kind: train, run: r, data: digits, subset: 100, epochs: 1, checkpoint_every: none}\n"
        "  i: {kind: interpolate, refs: ['r@init', 'r@last'], points: 2, figure: false}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-m", "cli.main", "batch", "spec.yaml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # stderr is a pipe
    assert proc.returncode == 0, proc.stderr
    lines = [line.split(" (")[0].split() for line in proc.stderr.splitlines()
             if "ETA" not in line]  # the progress line every 10 s of a slow machine
    assert lines == [["done", "t"], ["done", "i"]], proc.stderr
    assert "\r" not in proc.stderr and "\x1b" not in proc.stderr  # no bar redrawn into a file
