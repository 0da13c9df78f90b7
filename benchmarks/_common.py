"""Shared timing helpers for the benchmarks: one thread, interleaved repeats, medians with their spread, peak
memory, the machine a record was made on.

The machine running benchmarks is often shared, so absolute times are noisy; running the compared methods
round-robin in one process (``interleaved``, the order rotated every round so that no method always runs first)
exposes them to the same load, which makes their *ratios* meaningful. A goal figure is the median of at least
``MIN_REPEATS`` per-round ratios (ours and the peer timed in the same round: drift hits both) with the spread of
those ratios (min-max and the interquartile range, ``spread``), so ``compare.py`` can tell a change from noise.
Peak memory is measured in a fresh subprocess per method (``peak_memory``), since a process' high-water mark
cannot be reset; on CUDA it is ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.
"""

from __future__ import annotations

import json
import os
import platform
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


MIN_REPEATS = 5  # every goal figure is the median of at least this many interleaved rounds


def interleaved(
    methods: dict[str, Callable[[], object]],
    *,
    repeats: int = MIN_REPEATS,
    warmup: int = 1,
    budget: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], None] | None = None,
    after: Callable[[str], None] | None = None,
) -> dict[str, list[float]]:
    """Seconds of each method over ``repeats`` rounds; in each round every method runs once, round ``r`` starting
    with method ``r mod k`` (the order rotates, so a method that warms a cache or heats the CPU for the next one
    does not always run first or last).

    ``warmup`` untimed rounds come first. ``budget`` (seconds) stops after the round that exceeds it, but never
    before ``min(repeats, MIN_REPEATS)`` rounds. ``sync`` (e.g. ``torch.cuda.synchronize``) is called before each
    clock reading, so asynchronous GPU work is timed to its end; ``clock`` is replaceable for tests. ``after(name)``
    runs untimed after each call of method ``name`` (removing what it wrote, waiting for what it left running), so
    that no method is timed with its predecessor's leftovers."""
    for _ in range(warmup):
        for name, fn in methods.items():
            fn()
            if after:
                after(name)
    times: dict[str, list[float]] = {k: [] for k in methods}
    order = list(methods)
    floor = min(repeats, MIN_REPEATS)
    start = clock()
    for r in range(repeats):
        k = r % len(order)
        for name in order[k:] + order[:k]:
            if sync:
                sync()
            t0 = clock()
            methods[name]()
            if sync:
                sync()
            times[name].append(clock() - t0)
            if after:
                after(name)
        if budget is not None and r + 1 >= floor and clock() - start > budget:
            break
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in times.items()}


def ratios(times: dict[str, list[float]], num: str, den: str) -> list[float]:
    """Per-round ratios ``times[num][i] / times[den][i]``: both measured in round ``i``, under the same load."""
    return [a / b for a, b in zip(times[num], times[den], strict=True)]


def spread(samples: list[float]) -> dict:
    """Median, min, max, quartiles (linear interpolation, numpy's default) and count of ``samples``."""
    import numpy as np

    a = np.asarray(samples, dtype=float)
    if a.size == 0:
        raise ValueError("no samples")
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return {"median": float(med), "min": float(a.min()), "max": float(a.max()), "q1": float(q1), "q3": float(q3),
            "repeats": int(a.size)}


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
PLOTS_ENV = "LANDSCAPE_BENCH_PLOTS"  # where scaling plots and series go (run_all: next to the record)


def plots_dir(default: str | os.PathLike) -> Path:
    """``$LANDSCAPE_BENCH_PLOTS`` when ``run_all.py`` set it, else ``default``; created."""
    out = Path(os.environ.get(PLOTS_ENV) or default)
    out.mkdir(parents=True, exist_ok=True)
    return out


def record(figure: str, value: float | None = None, *, samples: list[float] | None = None, goal: float | None = None,
           better: str = "higher", unit: str = "x", note: str = "", device: str = "cpu") -> dict:
    """One figure of the issue's goal table: printed with its goal and whether it is met, and appended to the
    JSON-lines file ``$LANDSCAPE_BENCH_RECORDS`` when set (``run_all.py`` collects them into
    ``benchmarks/results/``). ``better``: ``higher`` (a speed-up) or ``lower`` (a time ratio).

    ``samples`` are the per-round values (``ratios``): the figure is then their median, recorded with its spread
    (min, max, quartiles, repeats: what ``compare.py`` judges noise by). A goal figure with fewer than
    ``MIN_REPEATS`` samples is marked so. ``value`` alone (no spread) is for figures that cannot be repeated."""
    if samples is not None:
        stats = spread(samples)
        value = stats["median"]
    elif value is None:
        raise ValueError("record() needs a value or samples")
    else:
        stats = {}
    met = None if goal is None else (value >= goal if better == "higher" else value <= goal)
    cmp = ">=" if better == "higher" else "<="
    status = "" if goal is None else f"  goal {cmp} {goal:g}: {'met' if met else 'NOT met'}"
    if stats:
        status = (f" (median of {stats['repeats']}, range {stats['min']:.3g}-{stats['max']:.3g}, IQR "
                  f"{stats['q1']:.3g}-{stats['q3']:.3g})" + status)
    if goal is not None and stats.get("repeats", 0) < MIN_REPEATS:
        note = f"{note}; " * bool(note) + f"fewer than {MIN_REPEATS} repeats: not a goal measurement"
    print(f"  [figure] {figure}: {value:.3g}{unit}{status}{'  ' + note if note else ''}", flush=True)
    entry = {"figure": figure, "value": value, "goal": goal, "better": better, "unit": unit, "met": met,
             "note": note, "device": device}
    if stats:
        entry.update(spread={k: stats[k] for k in ("min", "max", "q1", "q3")}, repeats=stats["repeats"],
                     samples=[float(x) for x in samples])
    path = os.environ.get(RECORDS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")
    return entry


def machine_load() -> dict:
    """The load average (1, 5, 15 min) and the core count: printed with every run, so a reader can tell a loaded
    machine from a slow method."""
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}


ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile",
             "amx_bf16")


def cpu_info(cpuinfo: str | None = None) -> dict:
    """CPU model and the vector ISA flags that decide kernel speed (AVX2, AVX-512, AMX) from ``/proc/cpuinfo``."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model, flags = "", set()
    for line in cpuinfo.splitlines():
        key, _, val = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = val.strip()
        elif key == "flags" and not flags:
            flags = set(val.split())
    model = model or platform.processor() or "unknown"
    return {"model": model, "isa": [f for f in ISA_FLAGS if f in flags]}


def machine_info(env: dict | None = None, torch_threads: int | None = None) -> dict:
    """What a record must say about where it was measured: CPU model and ISA (AVX2/AVX-512), torch's CPU kernel
    capability, cores (total and usable), load average, torch/numpy/Python versions, thread settings (of ``env``
    and ``torch_threads`` when the benchmarks run with others than this process) and the CUDA device if one is
    visible."""
    import numpy as np
    import torch

    env = os.environ if env is None else env

    info = {"cpu": cpu_info(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "loadavg": [round(x, 2) for x in os.getloadavg()], "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__,
            "torch_threads": torch_threads or torch.get_num_threads(),
            "thread_env": {k: env.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LANDSCAPE_THREADS")},
            "cuda": None}
    if torch.cuda.is_available():
        info["cuda"] = {"device": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
                        "runtime": torch.version.cuda}
    return info


def matmul_peak(n: int = 1024, repeats: int = 7) -> float:
    """Float32 FLOP/s of one n x n x n matrix product on this core (the fastest of ``repeats``): what a dense kernel
    reaches here, beside which a method's rate can be read."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        seconds.append(time.perf_counter() - t0)
    return 2 * n**3 / min(seconds)


def forward_flops(model, x) -> int:
    """FLOPs of one forward pass of ``model`` on ``x`` (torch's FlopCounterMode: 2 per multiply-add)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops()
