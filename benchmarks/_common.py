"""Shared timing helpers for the benchmarks: one thread, interleaved repeats, medians, peak memory.

The machine running benchmarks is often shared, so absolute times are noisy; running the compared methods
round-robin in one process (``interleaved``) exposes them to the same load, which makes their *ratios*
meaningful. Peak memory is measured in a fresh subprocess per method (``peak_memory``), since a process'
high-water mark cannot be reset.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_thread() -> None:
    """Pin torch (and BLAS, for subprocesses) to one thread."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


def interleaved(
    methods: dict[str, Callable[[], object]],
    *,
    repeats: int = 5,
    warmup: int = 1,
    budget: float | None = None,
) -> dict[str, list[float]]:
    """Wall-clock seconds of each method over ``repeats`` rounds, the methods run round-robin in each round.

    ``warmup`` untimed rounds come first. ``budget`` (seconds) stops after the round that exceeds it
    (at least one timed round is always made)."""
    for _ in range(warmup):
        for fn in methods.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in methods}
    start = time.perf_counter()
    for _ in range(repeats):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        if budget is not None and time.perf_counter() - start > budget:
            break
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in times.items()}


def print_table(
    title: str, med: dict[str, float], *, baseline: str, unit: str = "s", extra: dict | None = None
):
    """Print median times and their ratio to ``baseline``."""
    base = med[baseline]
    print(f"\n{title}")
    width = max(len(k) for k in med)
    print(f"  {'method':<{width}}  {'median ' + unit:>12}  {'x ' + baseline:>14}")
    for k, v in med.items():
        note = f"  {extra[k]}" if extra and k in extra else ""
        print(f"  {k:<{width}}  {v:12.4f}  {v / base:14.2f}{note}")


def peak_memory(module: str, function: str, *args: object) -> dict:
    """Run ``module.function(*args)`` in a fresh one-thread Python; return its JSON-able result together with
    ``peak_rss_mb`` (the process' maximum resident set size) and ``seconds``."""
    code = (
        "import json, resource, sys, time, importlib\n"
        f"sys.path[:0] = [{str(ROOT / 'benchmarks')!r}, {str(ROOT)!r}]\n"
        f"mod = importlib.import_module({module!r})\n"
        "t0 = time.perf_counter()\n"
        f"out = getattr(mod, {function!r})(*json.loads(sys.argv[1]))\n"
        "dt = time.perf_counter() - t0\n"
        "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
        "print(json.dumps({'result': out, 'peak_rss_mb': peak, 'seconds': dt}))\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(list(args))],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _basic_block_forward(self, x):
    """torchvision's BasicBlock.forward with ``out = out + identity`` instead of ``out += identity``: the
    same function, but Opacus' full backward hooks refuse the in-place add on a hooked GroupNorm output."""
    identity = x if self.downsample is None else self.downsample(x)
    out = self.relu(self.bn1(self.conv1(x)))
    return self.relu(self.bn2(self.conv2(out)) + identity)


def out_of_place_residuals(model):
    """Give every torchvision BasicBlock of ``model`` the out-of-place residual forward (for Opacus)."""
    import types

    from torchvision.models.resnet import BasicBlock

    for m in model.modules():
        if isinstance(m, BasicBlock):
            m.forward = types.MethodType(_basic_block_forward, m)
    return model


# ------------------------------------------------------------------------------------------ records

RECORDS_ENV = "LANDSCAPE_BENCH_RECORDS"


def record(figure: str, value: float, *, goal: float | None = None, better: str = "higher", unit: str = "x",
           note: str = "") -> None:
    """One figure of the issue's goal table (a time ratio, measured interleaved): printed with its goal and
    whether it is met, and appended to the JSON-lines file ``$LANDSCAPE_BENCH_RECORDS`` when set (``run_all.py``
    collects them into ``benchmarks/results/``). ``better``: ``higher`` (a speed-up) or ``lower`` (a time ratio)."""
    met = None if goal is None else (value >= goal if better == "higher" else value <= goal)
    cmp = ">=" if better == "higher" else "<="
    status = "" if goal is None else f"  goal {cmp} {goal:g}: {'met' if met else 'NOT met'}"
    print(f"  [figure] {figure}: {value:.3g}{unit}{status}{'  ' + note if note else ''}", flush=True)
    path = os.environ.get(RECORDS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"figure": figure, "value": value, "goal": goal, "better": better, "unit": unit,
                                "met": met, "note": note}) + "\n")


def machine_load() -> dict:
    """The load average (1, 5, 15 min) and the core count: printed with every run, so a reader can tell a loaded
    machine from a slow method."""
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
