"""``landscape batch`` on 1 vs 2 workers: the Watson Fig. 5 CPU-scale spec (examples/watson-fig5.yaml).

Each repeat runs the whole spec twice from an empty directory, in turn: ``--workers 1`` (every job in the
client process) and ``--workers 2`` (a ``distributed.LocalCluster`` of two one-thread processes; its start-up
and shutdown are counted). Prints each wall time, the medians and the ratio (goal on 2 cores: >= 1.7x). The
jobs are 12 ``phases`` families and 13 ``instability`` tables; both runs must give the same arrays, which
``tests/test_batch.py`` checks, so only time is compared here. CPU seconds (the batch and every process it
started) are printed beside wall time: on a shared machine CPU/wall says how many cores the batch got.

The spec is the ``watson-fig5`` recipe's CPU scale (~35 s of job work in one process). What two workers
cannot share bounds the ratio: cluster start-up (~1.5 s), each worker's first-job warm-up (~1.1 s: lazy
imports, data loading), the final ``figure`` job that waits for all others (~1.5 s: it reads the pair files
the ``instab-*`` jobs wrote) and shutdown (~0.6 s), and jobs take 15-20% more CPU with both cores busy; measured
1.58x (35.6 s vs 22.5 s, median of 3, load < 1.6) on the 2-core machine.

Run: ``python benchmarks/batch.py [--repeats 5] [--spec examples/watson-fig5.yaml]``
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import MIN_REPEATS, record  # noqa: E402  (benchmarks/ is the script's directory)

ROOT = Path(__file__).resolve().parents[1]


def run(spec: Path, workers: int, jobs: dict[str, float] | None = None) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system of the batch and every process it started); ``jobs``, when
    given, is filled with each job's seconds from the batch's ``summary.csv``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LANDSCAPE_THREADS": "1",
           "MPLBACKEND": "Agg", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "cli.main", "batch", str(spec), "--workers", str(workers)],
                              cwd=tmp, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if jobs is not None and proc.returncode == 0:
            for summary in Path(tmp).glob("**/summary.csv"):
                with open(summary, newline="") as f:
                    jobs.update({row["job"]: float(row["seconds"]) for row in csv.DictReader(f)})
    if proc.returncode != 0:
        raise SystemExit(f"batch --workers {workers} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS)
    parser.add_argument("--spec", type=Path, default=ROOT / "examples" / "watson-fig5.yaml")
    args = parser.parse_args(argv)
    spec = args.spec.resolve()
    print(f"spec {spec.relative_to(ROOT) if spec.is_relative_to(ROOT) else spec}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores", flush=True)
    times: dict[int, list[float]] = {1: [], 2: []}
    for r in range(args.repeats):
        for workers in (1, 2) if r % 2 == 0 else (2, 1):  # alternate which runs first
            wall, cpu = run(spec, workers)
            times[workers].append(wall)
            print(f"repeat {r + 1}: --workers {workers}: {wall:.1f} s wall, {cpu:.1f} s CPU "
                  f"(CPU/wall {cpu / wall:.2f}: how many cores the batch got)", flush=True)
    m1, m2 = statistics.median(times[1]), statistics.median(times[2])
    print(f"median wall time: 1 worker {m1:.1f} s, 2 workers {m2:.1f} s")
    record("batch, Watson Fig. 5 spec: speed-up of --workers 2 over --workers 1", goal=1.7,
           samples=[a / b for a, b in zip(times[1], times[2], strict=True)])
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
