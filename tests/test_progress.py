"""Progress of long work (landscape/progress.py): off unless turned on; on a pipe a line every interval on stderr
(what, how far, ETA), never on stdout; a bar on a terminal; ``landscape --quiet`` silences it; worker processes
print nothing (their parent counts the jobs as each completes)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import run_cli

from landscape import progress

REPO = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(?P<what>[^:]+): (?P<done>\d+)/(?P<total>\d+) (?P<unit>[a-z ]+) \((?P<pct>\d+)%, ETA [^)]+\)")


def _slow(task, steps: int, pause: float) -> None:
    for _ in range(steps):
        time.sleep(pause)
        task.update(1)


def test_off_unless_turned_on(capfd):
    assert not progress.active()
    with progress.task("work", total=3, unit="steps") as task:
        assert task is progress.SILENT
        _slow(task, 3, 0.02)
    progress.note("finished")
    assert capfd.readouterr() == ("", "")


def test_lines_name_what_how_far_and_the_eta():
    stream = io.StringIO()
    with progress.enabled(stream=stream, bar=False, interval=0.05):
        assert progress.active() and not progress.bars()
        with progress.task("surface 9x9", total=9, unit="rows") as task:
            _slow(task, 9, 0.03)
        progress.note("one finished step")
    assert not progress.active()  # nothing outlives the block
    lines = stream.getvalue().splitlines()
    assert lines[-1] == "one finished step"
    found = [LINE.match(line) for line in lines[:-1]]
    assert len(found) >= 3 and all(found), lines
    assert {m["what"] for m in found} == {"surface 9x9"} and {m["unit"] for m in found} == {"rows"}
    done = [int(m["done"]) for m in found]
    assert done == sorted(done) and all(m["total"] == "9" for m in found)


def test_a_line_comes_on_time_while_one_step_runs_long():
    """The line comes from a watcher: one long step (no update) still gets its lines, every interval."""
    stream = io.StringIO()
    with progress.enabled(stream=stream, bar=False, interval=0.05), progress.task("hessian", total=2,
                                                                                 unit="checkpoints") as task:
        task.update(1)
        time.sleep(0.4)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 4, lines
    assert all(line.startswith("hessian: 1/2 checkpoints (50%, ETA ") for line in lines), lines


def test_nested_tasks_share_one_line():
    stream = io.StringIO()
    with progress.enabled(stream=stream, bar=False, interval=0.05), \
            progress.task("hessian", total=2, unit="checkpoints") as outer:
        outer.update(1)
        with progress.task("trace (Hutchinson)", total=100, unit="probes") as inner:
            inner.describe_as("k=1")
            _slow(inner, 10, 0.02)
    nested = [line for line in stream.getvalue().splitlines() if " > " in line]
    assert nested, stream.getvalue()
    first, second = nested[-1].split(" > ")
    assert first.startswith("hessian: 1/2 checkpoints") and LINE.match(second) and second.endswith(", k=1")


def test_eta_and_duration():
    task = progress.Task.__new__(progress.Task)
    task.total, task.start, task.done = 10, 0, 5
    task.started = time.monotonic() - 10
    task.moved = time.monotonic()
    assert task.eta() == pytest.approx(10, abs=0.5)  # 10 s for 5 units: 10 s for the other 5
    task.done = 0
    assert task.eta() != task.eta()  # NaN before the first unit
    assert [progress._duration(s) for s in (3.4, 65, 3725)] == ["3 s", "1m 05s", "1h 02m"]


def test_threads_start_silent():
    """A context variable: a thread the library did not hand the context to reports nothing."""
    seen = []
    with progress.enabled(stream=io.StringIO(), bar=False):
        thread = threading.Thread(target=lambda: seen.append(progress.active()))
        thread.start()
        thread.join()
    assert seen == [False]


def test_on_off_and_follow():
    with progress.enabled(stream=io.StringIO(), bar=False):
        outer = progress._DISPLAY.get()
        with progress.enabled():  # on inside on: the same display, so tasks nest
            assert progress._DISPLAY.get() is outer
        with progress.enabled(None):
            assert progress._DISPLAY.get() is outer
        with progress.enabled(False):
            assert not progress.active()
        assert progress._DISPLAY.get() is outer


def test_bad_interval_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv(progress.INTERVAL_ENV, "soon")
    code, out, err = run_cli("--root", "ck", "store", "ls", capsys=capsys)
    assert code == 2 and err.startswith(f"error: {progress.INTERVAL_ENV}='soon': give the seconds"), err


def _note_in_worker(i: int) -> int:
    progress.note(f"worker {i} speaking")  # a spawned worker starts silent
    time.sleep(0.2)
    return i * i


def test_pool_jobs_are_counted_in_the_parent(capfd):
    from landscape.api.execution import map_jobs

    stream = io.StringIO()
    with progress.enabled(stream=stream, bar=False, interval=0.05):
        assert map_jobs(_note_in_worker, [(i,) for i in range(4)], 2, what="norms", unit="checkpoints") == [
            0, 1, 4, 9]
    counted = [LINE.match(line) for line in stream.getvalue().splitlines()]
    assert counted and all(m and m["what"] == "norms" and m["total"] == "4" for m in counted), stream.getvalue()
    assert "speaking" not in stream.getvalue() + "".join(capfd.readouterr())


def test_train_bar_ends_with_the_final_epoch_and_epsilon(tmp_path, monkeypatch):
    from landscape.api import TrainConfig, train

    monkeypatch.setattr(progress, "BAR_DELAY", 0)
    stream = io.StringIO()
    with progress.enabled(stream=stream, bar=True):
        run = train(TrainConfig(run="dp", data="digits", subset=200, epochs=2, batch_size=50, optimizer="dpsgd",
                                target_epsilon=3.0, checkpoint_every="none"), root=tmp_path)
    last = stream.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    final = run.checkpoints()[-1]
    assert f"{final.step}/{final.step}" in last and "epoch 2.00" in last, last
    assert f"eps {final.epsilon:.3g}" in last, last


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    from landscape.api import TrainConfig, train

    root = tmp_path_factory.mktemp("progress") / "ck"
    train(TrainConfig(run="r", data="digits", subset=200, epochs=1, checkpoint_every="none"), root=root)
    return root


def _piped(*args: str, cwd: Path, interval: str = "0.1") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg",
           progress.INTERVAL_ENV: interval}
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)  # stdout and stderr are pipes


def test_a_piped_command_prints_progress_on_stderr_and_quiet_silences_it(trained, tmp_path):
    args = ("surface", "r@last", "--grid", "21x21", "--subset", "150", "--no-figure")
    proc = _piped("--root", str(trained), *args, "-o", "a.h5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    found = [LINE.match(line) for line in lines]
    assert len(lines) >= 2 and all(found), proc.stderr  # nothing but progress lines
    assert {m["what"] for m in found} == {"surface 21x21"} and {m["unit"] for m in found} == {"rows"}
    assert "\r" not in proc.stderr and "\x1b" not in proc.stderr  # no bar redrawn into a pipe
    assert "ETA" not in proc.stdout and proc.stdout.splitlines()[0].split()[:2] == ["grid", "cells_done"]
    quiet = _piped("--root", str(trained), "--quiet", *args, "-o", "b.h5", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert quiet.stdout.splitlines()[0] == proc.stdout.splitlines()[0] and "wrote b.h5" in quiet.stdout
