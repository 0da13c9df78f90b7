"""``landscape batch``: spec validation, the job graph, and the same results in-process, on a LocalCluster and on
a ``dask scheduler`` + two ``dask worker`` processes (loopback only); resume after SIGKILL of the client, a
killed worker's job retried, a failing job isolated.

The reference for "same results" is the in-process run (``--workers 1``): every array of every result file and
every tensor of every final checkpoint must be equal, whatever ran the jobs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

SPEC = """\
defaults:
  train: {data: digits, subset: 0.2, epochs: 1, checkpoint_every: none}
  interpolate: {figure: false, points: 3}
jobs:
  base:
    kind: train
    grid: {seed: [0, 1]}
    run: "r-s{seed}"
    epochs: 3
    subset: 0.5
  child:
    kind: train
    grid: {seed: [0, 1], lr: [0.05, 0.1]}
    run: "c-s{seed}-lr{lr}"
    from_ref: "r-s{seed}@last"
  interp:
    kind: interpolate
    grid: {seed: [0, 1]}
    refs: ["r-s{seed}@last", "c-s{seed}-lr0.1@last"]
  bad:
    kind: interpolate
    refs: [r-s0@init, r-s0@step=999999]   # the run exists (base writes it), the step never will: fails at run time
  after-bad:
    kind: norms
    refs: [r-s0]
    figure: false
    after: [bad]
"""
RUNS = ["r-s0", "r-s1", "c-s0-lr0.05", "c-s0-lr0.1", "c-s1-lr0.05", "c-s1-lr0.1"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "MPLBACKEND": "Agg", "LANDSCAPE_THREADS": "1"}


def _batch(cwd: Path, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "cli.main", "batch", *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=timeout)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    """``landscape batch ARGS`` in this process (for the commands that run no job)."""
    from cli.main import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["batch", *args])
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def _write(tmp: Path, text: str, name: str = "spec.yaml") -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / name).write_text(text)
    return tmp / name


def _snapshot(cwd: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every final checkpoint's tensors and every result file's arrays, keyed by run / file."""
    from landscape.results import read_result
    from landscape.store import Store

    store = Store(cwd / "checkpoints")
    out = {run: {k: v.numpy() for k, v in store.load(f"{run}@last").state_dict.items()} for run in RUNS}
    for h5 in sorted((cwd / "results" / "spec").glob("*/*.h5")):
        out[str(h5.relative_to(cwd))] = dict(read_result(h5).arrays)
    return out


def _assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert sorted(a[key]) == sorted(b[key]), key
        for name in a[key]:
            np.testing.assert_array_equal(a[key][name], b[key][name], err_msg=f"{key}:{name}")


def _check_report(proc: subprocess.CompletedProcess, cwd: Path) -> None:
    """Exit 1 for the failing job, its dependant skipped, everything else done, the summary naming both."""
    import csv

    assert proc.returncode == 1, proc.stderr
    assert "error: job bad failed: run 'r-s0' has no checkpoint at step 999999" in proc.stderr
    assert "skipped (upstream failed): after-bad" in proc.stderr
    assert "Traceback" not in proc.stderr
    rows = {r["job"]: r for r in csv.DictReader(open(cwd / "results/spec/summary.csv"))}
    assert rows["bad"]["status"] == "failed" and rows["bad"]["error"].startswith("run 'r-s0' has no checkpoint at step 999999")
    assert rows["after-bad"]["status"] == "skipped" and "bad" in rows["after-bad"]["error"]
    assert {r["status"] for j, r in rows.items() if j not in ("bad", "after-bad")} == {"done"}
    assert float(rows["base-seed0"]["test_acc"]) > 0
    from landscape.results import read_result

    summary = read_result(cwd / "results/spec/summary.h5")
    assert [j.decode() for j in summary.arrays["job"]][:2] == ["base-seed0", "base-seed1"]
    index = list(csv.DictReader(open(cwd / "results/spec/index.csv")))
    assert any(r["path"].endswith("interp-seed0/interpolate.h5") for r in index)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict]:
    cwd = tmp_path_factory.mktemp("inproc")
    _write(cwd, SPEC)
    proc = _batch(cwd, "spec.yaml", "--workers", "1")
    _check_report(proc, cwd)
    return cwd, _snapshot(cwd)


# ------------------------------------------------------------------------------------------- validation


def test_dry_run_infers_dependencies_and_writes_dot(tmp_path, capsys):
    _write(tmp_path, SPEC)
    code, out, err = _cli(capsys, "spec.yaml", "--dry-run", "--dot", "graph.dot")
    assert code == 0, err
    from landscape.batch import load_spec

    spec = load_spec(tmp_path / "spec.yaml")
    deps = {j.id: set(j.deps) for j in spec.jobs}
    assert deps["base-seed0"] == set()
    assert deps["child-seed1-lr0.1"] == {"base-seed1"}  # from_ref names r-s1
    assert deps["interp-seed0"] == {"base-seed0", "child-seed0-lr0.1"}  # both refs
    assert deps["after-bad"] == {"base-seed0", "bad"}  # refs r-s0 + explicit after
    assert len(spec.jobs) == 10 and "child-seed1-lr0.1  [train]" in out
    dot = (tmp_path / "graph.dot").read_text()
    assert '"base-seed1" -> "child-seed1-lr0.1";' in dot and '"bad" -> "after-bad" [style=dashed];' in dot
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "results").exists()


def test_glob_reference_depends_on_every_matching_producer(tmp_path):
    spec = _write(tmp_path, """\
jobs:
  p:
    kind: phases
    grid: {seed: [0, 1]}
    group: "g-s{seed}"
    epochs: 2
    phase1: [sgd]
    phase2: [sgd]
    copies: 2
  i:
    kind: instability
    refs: ["g-s1-*"]
""")
    from landscape.batch import load_spec

    jobs = {j.id: j for j in load_spec(spec).jobs}
    assert jobs["p-seed0"].produces == ("g-s0-sgd", "g-s0-sgd-sgd-0", "g-s0-sgd-sgd-1")
    assert jobs["i"].deps == ("p-seed1",)


BAD_SPECS = {
    "unknown kind": ("jobs:\n  a:\n    kind: trian\n    run: x\n", 3, "unknown job kind 'trian'"),
    "unknown option": ("jobs:\n  a:\n    kind: train\n    run: x\n    epohcs: 2\n", 5,
                       "unknown option 'epohcs' for job kind 'train'"),
    "unknown default option": ("defaults:\n  train:\n    lrr: 1\njobs:\n  a: {kind: train, run: x}\n", 3,
                               "defaults.train.lrr: unknown option 'lrr'"),
    "cycle": ("jobs:\n  a: {kind: train, run: x, from_ref: y@last}\n  b: {kind: train, run: y, from_ref: x@last}\n",
              2, "cyclic dependency: a -> b -> a"),
    "cycle via after": ("jobs:\n  a: {kind: train, run: x, after: [b]}\n  b: {kind: train, run: y, after: [a]}\n",
                        2, "cyclic dependency"),
    "bad grid value (type)": ("jobs:\n  a:\n    kind: train\n    run: 'x{epochs}'\n    grid:\n      epochs: [1, two]\n",
                              6, "jobs.a.grid.epochs: jobs.a (epochs=two): epochs must be an integer, got 'two'"),
    "bad grid value (range)": ("jobs:\n  a:\n    kind: train\n    run: 'x{e}'\n    optimizer: dpsgd\n"
                               "    target_epsilon: '{e}'\n    grid:\n      e: [1, -5]\n", 8,
                               "target_epsilon must be > 0, got -5"),
    "empty grid": ("jobs:\n  a:\n    kind: train\n    run: x\n    grid:\n      seed: []\n", 6, "non-empty list"),
    "duplicate run": ("jobs:\n  a:\n    kind: train\n    run: same\n    grid: {seed: [0, 1]}\n", 2,
                      "duplicate run name 'same' after expansion"),
    "duplicate job name": ("jobs:\n  a:\n    kind: train\n    run: 'x{seed}'\n    name: one\n    grid: {seed: [0, 1]}\n",
                           2, "duplicate job name 'one'"),
    "unknown template variable": ("jobs:\n  a:\n    kind: train\n    run: 'x{sede}'\n    grid: {seed: [0]}\n", 4,
                                  "unknown template variable {sede}"),
    "unknown after": ("jobs:\n  a: {kind: train, run: x, after: [zz]}\n", 2, "no job named 'zz'"),
    "missing run": ("jobs:\n  a: {kind: train, epochs: 1}\n", 2, "needs option 'run'"),
    "wrong ref count": ("jobs:\n  a: {kind: interpolate, refs: [x@last]}\n", 2, "takes 2 reference(s)"),
    "analysis workers": ("jobs:\n  a:\n    kind: norms\n    refs: [x]\n    workers: 2\n", 5,
                         "option 'workers' does not apply in a batch"),
    "unknown top key": ("jobz: {}\n", 1, "unknown top-level key 'jobz'"),
    "unknown recipe": ("jobs:\n  f:\n    kind: figures\n    recipe: watson-fig99\n", 4, "unknown recipe 'watson-fig99'"),
    "bad figure scale": ("jobs:\n  f:\n    kind: figures\n    recipe: watson-fig5\n    scale: huge\n", 5,
                         "'scale' must be one of test, cpu, paper"),
    "align without run": ("jobs:\n  a: {kind: align, ref_a: x@last, ref_b: y@last}\n", 2, "needs option 'run'"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_invalid_spec_fails_before_anything_runs(tmp_path, case):
    from landscape.batch import SpecError, load_spec

    text, line, message = BAD_SPECS[case]
    spec = _write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    assert str(info.value).startswith(f"{spec}:{line}: "), str(info.value)
    assert message in str(info.value)


def test_invalid_spec_cli_is_one_line_and_runs_nothing(tmp_path, capsys):
    _write(tmp_path, BAD_SPECS["unknown option"][0])
    code, _, err = _cli(capsys, "spec.yaml")
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: spec.yaml:5: jobs.a.epohcs: unknown")
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "results").exists()
    _write(tmp_path, "jobs: [1\n")
    code, _, err = _cli(capsys, "spec.yaml")
    assert code == 2 and err.startswith("error: spec.yaml:") and "not valid YAML" in err
    code, _, err = _cli(capsys, "spec.yaml", "--workers", "2", "--scheduler", "tcp://127.0.0.1:1")
    assert code == 2 and err == "error: give --workers N (a local cluster) or --scheduler ADDRESS, not both\n"


# ------------------------------------------------------------------------------------------- execution


def test_rerun_skips_finished_jobs_byte_identical(reference, tmp_path):
    cwd, _ = reference
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (cwd / "checkpoints").rglob("*") if p.is_file()}
    files.update({p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (cwd / "results/spec").glob("*/*")})
    proc = _batch(cwd, "spec.yaml")
    assert proc.returncode == 1 and "0 done, 8 cached" in proc.stdout
    for p, (data, mtime) in files.items():
        assert p.read_bytes() == data and p.stat().st_mtime_ns == mtime, p


def test_local_cluster_gives_the_same_results(reference, tmp_path):
    _write(tmp_path, SPEC)
    proc = _batch(tmp_path, "spec.yaml", "--workers", "2")
    _check_report(proc, tmp_path)
    assert "dask: 2 worker(s) at tcp://127.0.0.1:" in proc.stderr and "dashboard:" in proc.stderr
    _assert_same(reference[1], _snapshot(tmp_path))


def _start(args: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=cwd, env={**_env(), **(env or {})}, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# A dask worker preload: after a worker writes run r-s0's first checkpoint it says so (``waiting-<pid>``) and waits
# until the test writes ``go``, so the test kills it while the job runs, however busy the machine is.
GATE = """\
import os, time
from pathlib import Path

from landscape.store.core import Run

gate = Path(os.environ["LANDSCAPE_TEST_GATE"])


def gated(save):
    def save_and_wait(self, state_dict, *, step, **kwargs):
        out = save(self, state_dict, step=step, **kwargs)
        if self.name == "r-s0" and step == 0:
            (gate / f"waiting-{os.getpid()}").touch()
            while not (gate / "go").exists():
                time.sleep(0.05)
        return out

    save_and_wait.gated = True
    return save_and_wait


if not getattr(Run.save_checkpoint, "gated", False):  # dask may run a preload twice
    Run.save_checkpoint = gated(Run.save_checkpoint)
"""


def test_dask_scheduler_and_workers_killed_worker_retried(reference, tmp_path):
    """``dask scheduler`` + two ``dask worker`` on 127.0.0.1; the worker running training job base-seed0 is
    SIGKILLed while that job waits (after its first checkpoint) on a file the test writes only after the kill:
    Dask reruns the job on the other worker (the run resumes) and every result equals the reference."""
    from distributed import Client

    _write(tmp_path, SPEC)
    gate = tmp_path / "gate"
    gate.mkdir()
    (tmp_path / "gate.py").write_text(GATE)
    env = {"LANDSCAPE_TEST_GATE": str(gate)}
    dask = [PY, "-m", "distributed.cli.dask_scheduler"]
    sched_file = tmp_path / "scheduler.json"
    procs = [_start([*dask, "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                     str(sched_file)], tmp_path, tmp_path / "scheduler.log")]
    client = batch = None
    try:
        _wait_for(sched_file.exists, 300, "the scheduler file")
        for i in range(2):
            procs.append(_start([PY, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(sched_file),
                                 "--nthreads", "1", "--nworkers", "1", "--no-nanny", "--host", "127.0.0.1",
                                 "--no-dashboard", "--name", f"w{i}", "--preload", str(tmp_path / "gate.py")],
                                tmp_path, tmp_path / f"worker{i}.log", env))
        client = Client(scheduler_file=str(sched_file), timeout="120s")
        address = client.scheduler.address
        assert address.startswith("tcp://127.0.0.1:")
        client.wait_for_workers(2, timeout=300)
        workers = {pid: worker for worker, pid in client.run(os.getpid).items()}
        batch = subprocess.Popen([PY, "-m", "cli.main", "batch", "spec.yaml", "--scheduler", address], cwd=tmp_path,
                                 env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        waiting = _wait_for(lambda: list(gate.glob("waiting-*")), 300, "a worker running base-seed0")
        assert len(waiting) == 1 and (tmp_path / "checkpoints/r-s0/manifest.json").exists()
        pid = int(waiting[0].name.removeprefix("waiting-"))
        victim = workers[pid]
        os.kill(pid, signal.SIGKILL)
        (gate / "go").touch()  # the job is running on no worker now: its rerun may go on
        out, err = batch.communicate(timeout=300)
        proc = subprocess.CompletedProcess(batch.args, batch.returncode, out, err)
        _check_report(proc, tmp_path)
        assert len(client.scheduler_info()["workers"]) == 1  # the killed worker is gone; the other did the rest
        # the output says so: the lost worker and the job Dask ran again
        lost = [line for line in err.splitlines() if line.startswith(f"lost worker {victim}")]
        assert len(lost) == 1 and "base-seed0" in lost[0], err
        assert f"1 worker(s) lost mid-batch ({victim}); job(s) rerun on other workers: " in out, out
        assert "base-seed0" in out.split("rerun on other workers: ")[1].splitlines()[0], out
    finally:
        if batch is not None and batch.poll() is None:
            batch.kill()
            batch.wait(timeout=10)
        if client is not None:
            client.close()
        _stop(procs)
    _assert_same(reference[1], _snapshot(tmp_path))


def test_sigkill_of_the_client_then_rerun_completes(tmp_path):
    """Kill the batch (SIGKILL) once a job has finished; the rerun skips them (files byte-identical,
    mtimes unchanged) and completes the rest."""
    spec = _write(tmp_path, """\
defaults:
  train: {data: digits, subset: 0.3, epochs: 1, checkpoint_every: 5s}
jobs:
  t:
    kind: train
    grid: {seed: [0, 1, 2]}
    run: "t{seed}"
""")
    batch = subprocess.Popen([PY, "-m", "cli.main", "batch", spec.name], cwd=tmp_path, env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = tmp_path / "results/spec/.batch"
    try:
        _wait_for(lambda: records.is_dir() and len(list(records.glob("*.json"))) >= 1, 120, "a finished job")
        batch.send_signal(signal.SIGKILL)
    finally:
        batch.kill()
        batch.wait(timeout=10)
    finished = sorted(p.stem for p in records.glob("*.json"))
    assert 1 <= len(finished) < 3
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for job in finished
              for p in (tmp_path / "checkpoints" / f"t{job.removeprefix('t-seed')}").rglob("*") if p.is_file()}
    assert before
    proc = _batch(tmp_path, spec.name)
    assert proc.returncode == 0, proc.stderr
    assert f"{3 - len(finished)} done, {len(finished)} cached" in proc.stdout
    for p, (data, mtime) in before.items():
        assert p.read_bytes() == data and p.stat().st_mtime_ns == mtime, p
    from landscape.store import Store

    store = Store(tmp_path / "checkpoints")
    assert all(store.run(f"t{s}").checkpoints()[-1].epoch == 1 for s in range(3))


def test_a_train_job_killed_between_its_checkpoint_file_and_the_manifest_entry_continues(tmp_path):
    """A kill can land after a checkpoint file is complete and before the manifest lists it: the same batch again
    adopts that file and continues the run (it once said the run 'already exists' when no checkpoint was listed)."""
    import json

    from landscape.store import MANIFEST, Store

    spec = _write(tmp_path, """\
jobs:
  t:
    kind: train
    data: digits
    subset: 0.2
    epochs: 2
    run: t0
""")
    first = _batch(tmp_path, spec.name)
    assert first.returncode == 0, first.stderr
    run_dir = tmp_path / "checkpoints" / "t0"
    files = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name.startswith("step-")}
    assert len(files) >= 2
    last = max(Store(tmp_path / "checkpoints").run("t0").checkpoints(), key=lambda c: c.step).step
    manifest = json.loads((run_dir / MANIFEST).read_text())
    manifest["checkpoints"] = []  # the files complete, their entries not yet written
    (run_dir / MANIFEST).write_text(json.dumps(manifest))
    for record in (tmp_path / "results" / "spec" / ".batch").glob("*.json"):
        record.unlink()  # the job did not finish
    again = _batch(tmp_path, spec.name)
    assert again.returncode == 0, again.stderr
    assert "1 done" in again.stdout
    run = Store(tmp_path / "checkpoints").run("t0")
    assert max(c.step for c in run.checkpoints()) == last
    assert all(c.sha256 for c in run.checkpoints())  # adopted: hashed and listed
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name.startswith("step-")} == files


ALIGN_FIGURES = """\
defaults:
  train: {data: digits, subset: 0.2, epochs: 1, checkpoint_every: none, model_kwargs: {channels: [2, 4], hidden: [8]}}
jobs:
  t:
    kind: train
    grid: {seed: [0, 1]}
    run: "t{seed}"
  match:
    kind: align
    ref_a: t0@last
    ref_b: t1@last
    run: t1-aligned
  fig:
    kind: figures
    recipe: watson-thm33
    scale: test
"""


def test_align_and_figures_jobs(tmp_path):
    """The hand-written kinds beside training: align (its run inferred from both references) and a figure recipe
    (its files in the job's directory, its verdict in the summary)."""
    import csv

    from landscape.batch import load_spec
    from landscape.figures.recipe import read_summary
    from landscape.store import Store

    spec = _write(tmp_path, ALIGN_FIGURES)
    jobs = {j.id: j for j in load_spec(spec).jobs}
    assert jobs["match"].deps == ("t-seed0", "t-seed1") and jobs["match"].produces == ("t1-aligned",)
    assert jobs["fig"].deps == ()
    proc = _batch(tmp_path, "spec.yaml", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    store = Store(tmp_path / "checkpoints")
    assert "t1-aligned" in store.run_names()
    rows = {r["job"]: r for r in csv.DictReader(open(tmp_path / "results/spec/summary.csv"))}
    assert rows["match"]["status"] == "done" and float(rows["match"]["distance_after"]) <= float(
        rows["match"]["distance_before"])
    numbers, verdict, _ = read_summary(tmp_path / "results/spec/fig/watson-thm33/watson-thm33-test.h5")
    assert rows["fig"]["status"] == "done" and "verdict" in rows["fig"]
    assert numbers["population/W_n"][-1] < numbers["population/W_n"][0]
    again = _batch(tmp_path, "spec.yaml", "--workers", "1")  # every job cached, nothing rewritten
    assert again.returncode == 0 and "cached" in again.stderr


def _cmdline(process) -> list[str]:
    """A process' command line, empty for one that has just exited (a zombie or gone: not a live worker)."""
    import psutil

    try:
        return process.cmdline()
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return []


def test_local_cluster_workers_die_with_a_sigkilled_client(tmp_path):
    """`batch --workers 2` starts a LocalCluster (two worker processes forked from the client, and a resource
    tracker) under the client; a SIGKILL of the client mid-job must not leave them running (they would hold the
    store and the cores)."""
    psutil = pytest.importorskip("psutil")
    spec = _write(tmp_path, """\
defaults:
  train: {data: digits, epochs: 300, checkpoint_every: none}
jobs:
  t:
    kind: train
    grid: {seed: [0, 1]}
    run: "long{seed}"
""")
    batch = subprocess.Popen([PY, "-m", "cli.main", "batch", spec.name, "--workers", "2"], cwd=tmp_path, env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def workers():
            try:
                kids = psutil.Process(batch.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                return []
            workers = [k for k in kids if "resource_tracker" not in " ".join(_cmdline(k))]
            return kids if len(workers) >= 2 and (tmp_path / "checkpoints").is_dir() else []

        kids = _wait_for(workers, 120, "the cluster's processes and a training job")
        batch.send_signal(signal.SIGKILL)
    finally:
        batch.kill()
        batch.wait(timeout=10)

    def alive():
        out = []
        for p in kids:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                pass
        return out

    try:
        _wait_for(lambda: not alive(), 30, "the cluster's processes to exit")
    except AssertionError as exc:  # say which ones stayed (a flake seen once under load left no trace)
        raise AssertionError(f"{exc}; still running: {alive()}") from None
    finally:
        for p in kids:  # never leave them behind, whatever the assertion said
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def test_shipped_fig5_spec_is_the_recipes_cpu_scale():
    """examples/watson-fig5.yaml runs exactly the runs `landscape figures watson-fig5 --scale cpu` judges: every
    `phases` job builds the recipe's own PhasesConfig for its arm and k (the DP noise multiplier calibrated for k) at
    the matched Phase-2 lr and momentum the recipe selected (read from its summary), and the instability jobs use
    its path points and split (a change to one without the other fails here). The unused half of the shared
    defaults (dp_* for an SGD family, phase2_sgd_* for a DP one) changes no run."""
    from types import SimpleNamespace

    from landscape.api.training import PHASES_JOB
    from landscape.batch import load_spec
    from landscape.figures.watson_fig5 import SCALES, Sweep

    cpu = SCALES["cpu"]
    path = Path(__file__).resolve().parents[1] / "examples" / "watson-fig5.yaml"
    spec = load_spec(path)
    phases = [j for j in spec.jobs if j.kind == "phases"]
    tables = [j for j in spec.jobs if j.kind == "instability"]
    assert len(spec.jobs) == 19 and len(phases) == 9 and len(tables) == 10
    with h5py.File(Path(__file__).resolve().parents[1] / "figures" / "watson-fig5" / "watson-fig5-cpu.h5") as f:
        if "numbers/selection/chosen" not in f:
            pytest.skip("the committed watson-fig5 summary predates the selection rule: regenerate the gallery")
        momentum, lr = (float(v) for v in f["numbers/selection/candidates"][int(f["numbers/selection/chosen"][()])])
    sweep = Sweep(SimpleNamespace(name="watson-fig5", scale="cpu", data_root=None), cpu)
    unused = {("sgd",): dict(dp_lr=None, dp_momentum=None), ("dpsgd",): dict(phase2_sgd_lr=None,
                                                                              phase2_sgd_momentum=None)}
    arms = []
    for job in phases:
        built = PHASES_JOB.build(dict(job.options))
        arm = "sgd" if built.phase2 == ("sgd",) else "dp-e" + re.search(r"eps(\d+)", job.id).group(1)
        arms.append((arm, built.k))
        recipe = sweep.config(arm, built.k, momentum, lr)
        assert dataclasses.replace(built, group=None, **unused[built.phase2]) == dataclasses.replace(
            recipe, group=None, **unused[built.phase2]), job.id
    assert sorted(arms) == sorted((a, k) for a in ["sgd", *(f"dp-e{e:g}" for e in cpu["epsilons"])]
                                  for k in cpu["ks"])
    for job in tables:
        assert job.options["points"] == cpu["points"] and list(job.options["split"]) == ["test"]
    figure = spec.job("figure")
    assert set(figure.deps) == {j.id for j in phases + tables if j.id != "figure"} and figure.options["figure"] is True
    assert {j.options["pair_dir"] for j in tables} == {"pairs"}  # one directory: the figure job reuses the files


def test_parent_watch_ends_a_worker_whose_batch_process_died(tmp_path):
    """The worker preload: a process that ran ``dask_setup`` exits within a second of its parent's SIGKILL."""
    code = f"""
import os, sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
pid = os.fork()
if pid == 0:
    from landscape.batch.parent_watch import dask_setup
    dask_setup(None)
    open({str(tmp_path / 'ready')!r}, 'w').write(str(os.getpid()))
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""
    parent = subprocess.Popen([PY, "-c", code])
    child = None
    try:
        child = int(_wait_for(lambda: (tmp_path / "ready").exists() and (tmp_path / "ready").read_text(), 30,
                              "the watched child to start"))
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)

        def exited():
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return True
            state = Path(f"/proc/{child}/stat").read_text().split()[2] if Path(f"/proc/{child}").exists() else "X"
            return state in ("Z", "X")

        _wait_for(exited, 3, "the watched child to exit after its parent's SIGKILL")
    finally:
        parent.kill()
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
