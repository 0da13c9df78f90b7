"""The plan past one machine, on paper: a batch's speed-up on P workers simulated from measured job durations and
the spec's dependency graph.

For a job graph with durations d_j (seconds, measured with ``--workers 1``) and edges "j waits for i":

- work ``W = sum_j d_j`` (the one-worker time) and span ``L`` = the critical path, the longest chain of
  dependent jobs; no schedule on any number of workers beats ``max(W / P, L)``, so the speed-up is at most
  ``min(P, W / L)`` (the work-span bound);
- ``list_schedule``: greedy list scheduling (Graham 1969): whenever a worker is free it starts the ready job
  of highest priority (spec order, as Dask starts them, or longest remaining path first); its makespan is at
  most ``W / P + L`` (Graham's bound), so the speed-up is at least ``W / (W / P + L)``;
- Amdahl's law with the measured serial part ``s`` (cluster start-up, shutdown: seconds no worker count
  shortens): speed-up ``<= (s + W) / (s + W / P)``, and the simulated one adds ``s`` to the makespan.

``simulate(durations, deps, workers=(8, 64, 512), serial=s)`` gives all of them per P; for any spec and a finished
run of it: ``python benchmarks/scaling_sim.py SPEC.yaml RESULTS/summary.csv --workers 8,64,512``.
"""

from __future__ import annotations

import csv
import heapq
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def _order(durations: Mapping[str, float], deps: Mapping[str, Iterable[str]]) -> list[str]:
    """Jobs in a topological order that keeps the given order where it can (Kahn's algorithm); a cycle or a
    dependency on an unknown job is a ValueError."""
    for job, before in deps.items():
        for b in before:
            if b not in durations:
                raise ValueError(f"job {job!r} waits for unknown job {b!r}")
    index = {j: i for i, j in enumerate(durations)}
    waiting = {j: len(set(deps.get(j, ()))) for j in durations}
    after: dict[str, list[str]] = {j: [] for j in durations}
    for j in durations:
        for b in set(deps.get(j, ())):
            after[b].append(j)
    ready = [(index[j], j) for j, w in waiting.items() if w == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, j = heapq.heappop(ready)
        out.append(j)
        for k in after[j]:
            waiting[k] -= 1
            if waiting[k] == 0:
                heapq.heappush(ready, (index[k], k))
    if len(out) != len(durations):
        raise ValueError("the dependency graph has a cycle")
    return out


def critical_path(durations: Mapping[str, float], deps: Mapping[str, Iterable[str]]) -> tuple[float, list[str]]:
    """Length of the longest chain of dependent jobs and the chain itself (first job first)."""
    finish: dict[str, float] = {}
    via: dict[str, str | None] = {}
    for j in _order(durations, deps):
        before = list(deps.get(j, ()))
        prev = max(before, key=lambda b: finish[b]) if before else None
        finish[j] = durations[j] + (finish[prev] if prev else 0.0)
        via[j] = prev
    if not finish:
        return 0.0, []
    end = max(finish, key=finish.get)
    chain = [end]
    while via[chain[-1]] is not None:
        chain.append(via[chain[-1]])
    return finish[end], chain[::-1]


def remaining_path(durations: Mapping[str, float], deps: Mapping[str, Iterable[str]]) -> dict[str, float]:
    """For each job the longest path from its start to the end of the graph (its "bottom level")."""
    after: dict[str, list[str]] = {j: [] for j in durations}
    for j, before in deps.items():
        for b in set(before):
            after[b].append(j)
    level: dict[str, float] = {}
    for j in reversed(_order(durations, deps)):
        level[j] = durations[j] + max((level[k] for k in after[j]), default=0.0)
    return level


@dataclass
class Schedule:
    makespan: float
    start: dict[str, float]
    worker: dict[str, int]


def list_schedule(durations: Mapping[str, float], deps: Mapping[str, Iterable[str]], workers: int, *,
                  priority: str = "spec") -> Schedule:
    """Greedy list scheduling on ``workers`` identical workers: at every moment a worker is free, it takes the
    ready job of highest priority (``spec``: earliest in ``durations``' order; ``critical``: longest remaining
    path first, ties by spec order). Workers are taken lowest index first. No communication cost."""
    if workers < 1:
        raise ValueError("workers must be >= 1")
    if priority not in ("spec", "critical"):
        raise ValueError(f"unknown priority {priority!r} (spec, critical)")
    _order(durations, deps)  # checks: unknown jobs, cycles
    index = {j: i for i, j in enumerate(durations)}
    level = remaining_path(durations, deps)

    def key(j: str) -> tuple:
        return (-level[j], index[j]) if priority == "critical" else (index[j],)

    waiting = {j: set(deps.get(j, ())) for j in durations}
    ready = [(key(j), j) for j, w in waiting.items() if not w]
    heapq.heapify(ready)
    free = list(range(workers))
    heapq.heapify(free)
    running: list[tuple[float, int, str]] = []  # (finish time, worker, job)
    start: dict[str, float] = {}
    where: dict[str, int] = {}
    now = 0.0
    while ready or running:
        while ready and free:
            _, j = heapq.heappop(ready)
            w = heapq.heappop(free)
            start[j], where[j] = now, w
            heapq.heappush(running, (now + durations[j], w, j))
        now, w, j = heapq.heappop(running)
        done = [(w, j)]
        while running and running[0][0] == now:  # everything finishing at this instant frees at once
            _, w2, j2 = heapq.heappop(running)
            done.append((w2, j2))
        for w, j in done:
            heapq.heappush(free, w)
            for k, wait in waiting.items():
                if j in wait:
                    wait.discard(j)
                    if not wait and k not in start:
                        heapq.heappush(ready, (key(k), k))
    return Schedule(makespan=now, start=start, worker=where)


def amdahl(serial: float, parallel: float, workers: int) -> float:
    """Amdahl's law: speed-up of ``serial + parallel`` seconds when only ``parallel`` divides over ``workers``."""
    return (serial + parallel) / (serial + parallel / workers)


def simulate(durations: Mapping[str, float], deps: Mapping[str, Iterable[str]], workers: Sequence[int] = (8, 64, 512),
             *, serial: float = 0.0, priority: str = "spec") -> dict:
    """Work, span, critical path, and per worker count: the list-scheduled makespan and speed-up (``serial``
    seconds added to both the one-worker time and the makespan), the work-span bound, Graham's guarantee and
    Amdahl's bound."""
    work = float(sum(durations.values()))
    span, chain = critical_path(durations, deps)
    rows = []
    for p in workers:
        plan = list_schedule(durations, deps, p, priority=priority)
        rows.append({
            "workers": int(p),
            "makespan": plan.makespan + serial,
            "speedup": (work + serial) / (plan.makespan + serial),
            "efficiency": (work + serial) / (plan.makespan + serial) / p,
            "work_span_bound": (work + serial) / (max(work / p, span) + serial),
            "graham_guarantee": (work + serial) / (work / p + span + serial),
            "amdahl_bound": amdahl(serial, work, p),
        })
    return {"jobs": len(durations), "work": work, "span": span, "critical_path": chain, "serial": serial,
            "parallelism": work / span if span else float("inf"), "priority": priority, "rows": rows}


def durations_from_summary(path: str | Path) -> dict[str, float]:
    """``{job: seconds}`` from a batch's ``summary.csv`` (what ``landscape batch`` writes under its results)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"job", "seconds"} <= set(rows[0]):
        raise ValueError(f"{path} is not a batch summary (no job and seconds columns)")
    return {row["job"]: float(row["seconds"]) for row in rows}


def format_table(result: dict) -> str:
    lines = [f"{result['jobs']} jobs, work W = {result['work']:.1f} s, critical path L = {result['span']:.1f} s "
             f"({' -> '.join(result['critical_path'])}), parallelism W/L = {result['parallelism']:.2f}, serial "
             f"{result['serial']:.1f} s, {result['priority']} priority",
             f"{'workers':>8} {'makespan s':>11} {'speed-up':>9} {'efficiency':>10} {'work-span':>10} {'Graham':>8} "
             f"{'Amdahl':>8}"]
    for r in result["rows"]:
        lines.append(f"{r['workers']:8d} {r['makespan']:11.1f} {r['speedup']:9.2f} {r['efficiency']:10.2f} "
                     f"{r['work_span_bound']:10.2f} {r['graham_guarantee']:8.2f} {r['amdahl_bound']:8.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/scaling_sim.py SPEC.yaml SUMMARY.csv [--workers 8,64,512] [--serial S]``: the plan for
    any batch spec, from the job seconds of a run of it (``--workers 1`` gives undisturbed durations)."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("summary", type=Path, help="summary.csv of a finished run of the spec")
    ap.add_argument("--workers", default="2,8,64,512")
    ap.add_argument("--serial", type=float, default=0.0, help="seconds no worker count shortens (start-up)")
    ap.add_argument("--priority", choices=("spec", "critical"), default="spec")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from landscape.batch.spec import load_spec
    from landscape.errors import LandscapeError

    try:
        workers = [int(w) for w in args.workers.split(",") if w.strip()]
        graph = load_spec(args.spec)
        seconds = durations_from_summary(args.summary)
        missing = [j.id for j in graph.jobs if j.id not in seconds]
        if missing:
            raise ValueError(f"{args.summary} has no time for job(s) {', '.join(missing[:3])} of {args.spec}")
        deps = {j.id: list(j.deps) for j in graph.jobs}
        print(format_table(simulate({j: seconds[j] for j in deps}, deps, workers, serial=args.serial,
                                    priority=args.priority)))
    except (OSError, ValueError, LandscapeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
