"""The scaling benchmarks' pieces: the batch simulator (critical path, list scheduling, Graham's and Amdahl's
bounds) on hand-computed graphs and random DAGs, the log-log fit on exact power laws, and scaling.py end to end
at its tiny size (plots, series, figures)."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import scaling  # noqa: E402
import scaling_sim as sim  # noqa: E402

FORK_JOIN = ({"s": 1.0, "a": 2.0, "b": 2.0, "c": 2.0, "d": 2.0, "t": 1.0},
             {"a": ["s"], "b": ["s"], "c": ["s"], "d": ["s"], "t": ["a", "b", "c", "d"]})


def test_chain_is_its_own_critical_path_on_any_number_of_workers():
    d, deps = {"a": 2.0, "b": 3.0, "c": 1.0}, {"b": ["a"], "c": ["b"]}
    assert sim.critical_path(d, deps) == (6.0, ["a", "b", "c"])
    for p in (1, 2, 8):
        assert sim.list_schedule(d, deps, p).makespan == 6.0


def test_independent_jobs_fill_two_workers():
    d = {"a": 3.0, "b": 3.0, "c": 2.0, "d": 2.0}
    plan = sim.list_schedule(d, {}, 2)
    assert plan.makespan == 5.0
    assert plan.start == {"a": 0.0, "b": 0.0, "c": 3.0, "d": 3.0}
    assert plan.worker == {"a": 0, "b": 1, "c": 0, "d": 1}


def test_spec_order_against_longest_path_first():
    d = {"x": 1.0, "y": 1.0, "z": 3.0}
    assert sim.list_schedule(d, {}, 2, priority="spec").makespan == 4.0  # x, y first; z starts at 1
    assert sim.list_schedule(d, {}, 2, priority="critical").makespan == 3.0  # z first


def test_fork_join_by_hand():
    d, deps = FORK_JOIN
    assert sim.critical_path(d, deps) == (4.0, ["s", "a", "t"])
    assert sim.list_schedule(d, deps, 1).makespan == 10.0
    assert sim.list_schedule(d, deps, 2).makespan == 6.0  # s; a, b; c, d; t
    assert sim.list_schedule(d, deps, 4).makespan == 4.0
    assert sim.remaining_path(d, deps) == {"s": 4.0, "a": 3.0, "b": 3.0, "c": 3.0, "d": 3.0, "t": 1.0}
    out = sim.simulate(d, deps, workers=(2, 4, 512), serial=2.0)
    assert out["work"] == 10.0 and out["span"] == 4.0 and out["parallelism"] == 2.5
    r2, r4, r512 = out["rows"]
    assert r2["speedup"] == pytest.approx(12 / 8) and r2["efficiency"] == pytest.approx(12 / 8 / 2)
    assert r4["speedup"] == pytest.approx(12 / 6) and r512["speedup"] == pytest.approx(12 / 6)
    assert r4["work_span_bound"] == pytest.approx(12 / (max(10 / 4, 4) + 2))
    assert r2["graham_guarantee"] == pytest.approx(12 / (5 + 4 + 2))
    assert r512["amdahl_bound"] == pytest.approx(12 / (2 + 10 / 512))


def test_amdahl_by_hand():
    assert sim.amdahl(1.0, 9.0, 3) == pytest.approx(2.5)
    assert sim.amdahl(0.0, 9.0, 3) == pytest.approx(3.0)


def test_bad_graphs_are_refused():
    with pytest.raises(ValueError, match="cycle"):
        sim.critical_path({"a": 1.0, "b": 1.0}, {"a": ["b"], "b": ["a"]})
    with pytest.raises(ValueError, match="unknown job"):
        sim.list_schedule({"a": 1.0}, {"a": ["zzz"]}, 2)
    with pytest.raises(ValueError, match="workers"):
        sim.list_schedule({"a": 1.0}, {}, 0)


@st.composite
def dags(draw):
    n = draw(st.integers(1, 12))
    durations = {f"j{i}": draw(st.floats(0.1, 10.0)) for i in range(n)}
    deps = {f"j{i}": draw(st.lists(st.sampled_from([f"j{k}" for k in range(i)]), max_size=3)) if i else []
            for i in range(n)}
    return durations, deps


@settings(max_examples=60, deadline=None)
@given(dags(), st.integers(1, 6), st.sampled_from(["spec", "critical"]))
def test_list_schedules_respect_dependencies_and_the_bounds(graph, workers, priority):
    d, deps = graph
    plan = sim.list_schedule(d, deps, workers, priority=priority)
    work, (span, _) = sum(d.values()), sim.critical_path(d, deps)
    for j, before in deps.items():
        for b in before:
            assert plan.start[j] >= plan.start[b] + d[b] - 1e-9
    for w in range(workers):  # no worker runs two jobs at once
        mine = sorted((plan.start[j], plan.start[j] + d[j]) for j in d if plan.worker[j] == w)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(mine, mine[1:], strict=False))
    assert max(work / workers, span) - 1e-9 <= plan.makespan <= work / workers + span * (1 - 1 / workers) + 1e-9


def test_power_law_fit_recovers_the_exponent():
    x = np.array([64, 128, 256, 512, 1024, 2048, 4096])
    fit = scaling.fit_power(x, 3e-6 * x**2.0)
    assert fit["exponent"] == pytest.approx(2.0) and fit["prefactor"] == pytest.approx(3e-6)
    assert fit["r2"] == pytest.approx(1.0)
    noisy = 0.5 * x**1.3 * np.exp(np.random.default_rng(0).normal(0, 0.01, x.size))
    expected = np.polyfit(np.log(x), np.log(noisy), 1)[0]
    assert scaling.fit_power(x, noisy)["exponent"] == pytest.approx(expected)
    assert math.isnan(scaling.fit_power([1], [1])["exponent"])


def test_the_sweep_spec_is_valid_and_its_tables_wait_for_their_trainings(tmp_path):
    from landscape.batch.spec import load_spec

    spec = tmp_path / "sweep.yaml"
    spec.write_text(scaling.sweep_spec(scaling.SIZES["full"]["sweep"]))
    jobs = {j.id: set(j.deps) for j in load_spec(spec).jobs}
    assert len(jobs) == 3 * 3 * 8 + 3 * 3  # noise x lr x seed trainings, one table per (noise, lr)
    assert jobs["instab-n1.0-lr0.05"] == {f"train-n1.0-lr0.05-s{s}" for s in range(8)}
    assert all(not deps for job, deps in jobs.items() if job.startswith("train-"))


@pytest.mark.slow
def test_scaling_runs_at_its_tiny_size(tmp_path, monkeypatch):
    """Every part once at the tiny size: real Gram children, surfaces (one worker: their pool is tested with the
    surface), interpolations; the sweep's batch runs are faked from its job graph (benchmarks/batch.py runs real
    ones), so the efficiency, the simulation and the plots are checked on known durations."""
    import batch as batch_bench

    monkeypatch.setitem(scaling.SIZES["tiny"], "workers", [1])
    calls = []

    def fake_run(spec, workers, jobs=None):
        calls.append(workers)
        if jobs is not None:
            jobs.update({"train-n1.0-lr0.05-s0": 2.0, "train-n1.0-lr0.05-s1": 2.0, "instab-n1.0-lr0.05": 1.0})
        return (7.0, 5.0) if workers == 1 else (5.0, 5.5)

    monkeypatch.setattr(batch_bench, "run", fake_run)
    records = tmp_path / "records.jsonl"
    monkeypatch.setenv("LANDSCAPE_BENCH_RECORDS", str(records))
    assert scaling.main(["--size", "tiny", "--out", str(tmp_path / "out")]) == 0
    assert calls == [1, 2]
    series = json.loads((tmp_path / "out" / "scaling.json").read_text())
    assert set(series) >= {"gram", "surface", "interpolate", "batch", "simulation"}
    for name in ("scaling-gram", "scaling-surface", "scaling-interpolate", "scaling-batch"):
        assert (tmp_path / "out" / f"{name}.png").is_file() and (tmp_path / "out" / f"{name}.pdf").is_file()
    figures = {f["figure"]: f for f in map(json.loads, records.read_text().splitlines())}
    names = " | ".join(figures)
    assert "exponent" in names and "simulated speed-up" in names
    assert figures["batch sweep (3 jobs): parallel efficiency on 2 workers"]["value"] == pytest.approx(7 / 10)
    sim = series["simulation"]
    # work 5 s, critical path 3 s (a training then the table); 2 workers: both trainings, then the table = 3 s,
    # so the serial part is 5 - 3 = 2 s and the simulated speed-up on P >= 2 is (5 + 2) / (3 + 2)
    assert sim["work"] == 5.0 and sim["span"] == 3.0 and sim["serial"] == pytest.approx(2.0)
    rows = {r["workers"]: r for r in sim["rows"]}
    assert set(rows) >= {8, 64, 512}
    assert rows[512]["speedup"] == pytest.approx(7 / 5) == rows[512]["work_span_bound"]
    assert figures["batch sweep: simulated speed-up on 64 workers (list scheduling)"]["value"] == pytest.approx(7 / 5)
    gram = series["gram"]["fits"]["streamed to HDF5"]
    assert gram["time_exponents"] and all(math.isfinite(e) for e in gram["time_exponents"])


def test_simulating_any_spec_from_its_summary(tmp_path, capsys):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(scaling.sweep_spec(scaling.SIZES["tiny"]["sweep"]))
    summary = tmp_path / "summary.csv"
    summary.write_text("job,kind,status,seconds\ntrain-n1.0-lr0.05-s0,train,ok,2.0\ntrain-n1.0-lr0.05-s1,train,ok,2.0\n"
                       "instab-n1.0-lr0.05,instability,ok,1.0\n")
    assert sim.main([str(spec), str(summary), "--workers", "1,2,8", "--serial", "2"]) == 0
    out = capsys.readouterr().out
    assert "critical path L = 3.0 s" in out and "parallelism W/L = 1.67" in out
    row2 = next(line.split() for line in out.splitlines() if line.split()[:1] == ["2"])
    assert float(row2[1]) == 5.0 and float(row2[2]) == pytest.approx(7 / 5, abs=0.005)
    summary.write_text("job,kind,status,seconds\ntrain-n1.0-lr0.05-s0,train,ok,2.0\n")
    assert sim.main([str(spec), str(summary)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no time for job(s) train-n1.0-lr0.05-s1, instab-n1.0-lr0.05" in err and err.count("\n") == 1
