"""Run every benchmark in turn (what `make bench` does); each prints its own ratios against peers, and the figures
of the performance goals are collected into one goal table and a JSON record under ``benchmarks/results/``
(commit, date, the machine: CPU model, ISA, cores, versions, thread settings, CUDA device; load at start and
end; every figure with its goal, its per-round values and their spread) for ``compare.py``. The scaling
benchmarks' plots and series go to the directory named like the record (``<date>-<commit>/``).

Each benchmark runs in its own process with one torch thread. When CUDA is available the ``gpu`` benchmark (GPU
variants against Opacus and PyTorch on the same GPU) is added. Pass names to run only some:
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

from _common import PLOTS_ENV, RECORDS_ENV, machine_info, machine_load

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RESULTS_ENV = "LANDSCAPE_BENCH_RESULTS"  # another directory for the record (the tests' temporary one)
BENCHMARKS = ["persample", "dpsgd_step", "interpolate", "directions", "ntk", "hessian", "user_model", "recorder",
              "batch", "scaling", "gpu"]
CPU_BENCHMARKS = BENCHMARKS[:-1]


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[: argv.index("--")]
    names = argv or (BENCHMARKS if cuda_available() else CPU_BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    records = Path(tempfile.mkstemp(prefix="landscape-bench-", suffix=".jsonl")[1])
    stamp, commit = datetime.datetime.now(datetime.timezone.utc), git_commit()
    results = Path(os.environ.get(RESULTS_ENV) or RESULTS)
    plots = results / f"{stamp:%Y%m%dT%H%M%SZ}-{commit}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LANDSCAPE_THREADS": "1",
           RECORDS_ENV: str(records), PLOTS_ENV: str(plots)}
    machine = machine_info(env, torch_threads=1)  # the settings the scripts run with
    print(f"machine: {machine['cpu']['model']} [{' '.join(machine['cpu']['isa'])}], torch {machine['torch']}, "
          f"CUDA {machine['cuda']['device'] if machine['cuda'] else 'none'}", flush=True)
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
    out = write_record(results, figures, names, seconds, load_start, load_end, machine, stamp, commit,
                       plots if plots.exists() else None)
    print(f"record: {out}  (compare two runs: python benchmarks/compare.py OLD NEW)")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def print_goals(figures: list[dict]) -> None:
    """Every figure of this run with its goal and whether it is met."""
    print("\ngoal table (medians of per-round ratios measured interleaved in each script, [min-max] of the rounds):")
    width = max((len(f["figure"]) for f in figures), default=10)
    for f in figures:
        cmp = ">=" if f["better"] == "higher" else "<="
        goal = "" if f["goal"] is None else f"{cmp} {f['goal']:g}"
        met = "" if f["met"] is None else ("met" if f["met"] else "NOT met")
        s = f.get("spread")
        rng = f"[{s['min']:.3g}-{s['max']:.3g}] n={f['repeats']}" if s else ""
        print(f"  {f['figure']:<{width}}  {f['value']:8.3g}{f['unit']}  {rng:>20}  {goal:>8}  {met}")


def git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def write_record(results: Path, figures: list[dict], names: list[str], seconds: dict, load_start: dict,
                 load_end: dict, machine: dict, stamp: datetime.datetime, commit: str, plots: Path | None) -> Path:
    """``benchmarks/results/<date>-<commit>.json``: what ``compare.py`` reads (format 2: ``machine``, and figures
    with ``samples``/``spread``/``repeats``; format-1 records, without them, stay readable)."""
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"{stamp:%Y%m%dT%H%M%SZ}-{commit}.json"
    out.write_text(json.dumps({"format": 2, "commit": commit, "date": stamp.isoformat(timespec="seconds"),
                               "benchmarks": names, "machine": machine, "seconds": seconds, "load_start": load_start,
                               "load_end": load_end, "plots": plots.name if plots else None,
                               "figures": figures}, indent=1) + "\n")
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
