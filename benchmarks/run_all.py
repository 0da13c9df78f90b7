"""Run every benchmark in turn (what `make bench` does); each prints its own ratios against peers, and the figures
of the performance goals are collected into one goal table and a JSON record under ``benchmarks/results/``
(commit, date, machine load at start and end, every figure with its goal) for ``compare.py``.

Each benchmark runs in its own process with one torch thread. Pass names to run only some:
``python benchmarks/run_all.py persample dpsgd_step``. Extra arguments after ``--`` go to every script.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import RECORDS_ENV, machine_load

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BENCHMARKS = ["persample", "dpsgd_step", "interpolate", "directions", "ntk", "hessian", "batch"]


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[: argv.index("--")]
    names = argv or BENCHMARKS
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    records = Path(tempfile.mkstemp(prefix="landscape-bench-", suffix=".jsonl")[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LANDSCAPE_THREADS": "1",
           RECORDS_ENV: str(records)}
    load_start = machine_load()
    print(f"machine: {load_start['cpus']} cores, load average {load_start['loadavg']} at the start", flush=True)
    failed, seconds = [], {}
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, str(HERE / f"{name}.py"), *extra], env=env)
        seconds[name] = time.perf_counter() - start
        print(f"=== {name}: {seconds[name]:.0f} s, exit {proc.returncode} ===", flush=True)
        if proc.returncode != 0:
            failed.append(name)
    figures = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    records.unlink()
    load_end = machine_load()
    print(f"\nload average {load_end['loadavg']} at the end (a loaded machine moves times, less so interleaved "
          "ratios)")
    print_goals(figures)
    out = write_record(figures, names, seconds, load_start, load_end)
    print(f"record: {out}  (compare two runs: python benchmarks/compare.py OLD NEW)")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def print_goals(figures: list[dict]) -> None:
    """Every figure of this run with its goal and whether it is met."""
    print("\ngoal table (time ratios measured interleaved in each script):")
    width = max((len(f["figure"]) for f in figures), default=10)
    for f in figures:
        cmp = ">=" if f["better"] == "higher" else "<="
        goal = "" if f["goal"] is None else f"{cmp} {f['goal']:g}"
        met = "" if f["met"] is None else ("met" if f["met"] else "NOT met")
        print(f"  {f['figure']:<{width}}  {f['value']:8.3g}{f['unit']}  {goal:>8}  {met}")


def write_record(figures: list[dict], names: list[str], seconds: dict, load_start: dict, load_end: dict) -> Path:
    """``benchmarks/results/<date>-<commit>.json``: what ``compare.py`` reads."""
    try:
        commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, timeout=5).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    stamp = datetime.datetime.now(datetime.timezone.utc)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp:%Y%m%dT%H%M%SZ}-{commit}.json"
    out.write_text(json.dumps({"commit": commit, "date": stamp.isoformat(timespec="seconds"), "benchmarks": names,
                               "seconds": seconds, "load_start": load_start, "load_end": load_end,
                               "figures": figures}, indent=1) + "\n")
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
