"""How cost grows with the work: log-log plots and fitted exponents (least squares on log time against log size).

Four series, every size measured in each of ``--repeats`` rounds (sizes interleaved, so drift hits all of
them); an exponent is fitted per round and the figure is their median with its spread:

- ``gram``: the per-layer Gram blocks of LeNet's loss gradients (1x28x28 inputs, 10 classes; the empirical NTK
  the ``ntk`` analysis builds on) against n: ``landscape.gram.gram_blocks`` in memory and
  ``landscape.gram_hdf5.gram_blocks_to_hdf5`` streamed tile by tile into HDF5 (``--chunk`` samples per
  chunk). Each measurement runs in a fresh one-thread process: time and peak resident memory (``ru_maxrss``,
  and its increase over the process before the computation).
- ``surface``: ``landscape.api.surface`` (LeNet on the digits test split, random filter-normalised plane) against
  the grid (N x N points) on 1 and 2 worker processes (the pool's start-up included).
- ``interpolate``: ``landscape.analyze.interpolate.interpolate`` on the same model and split against the points.

Everything runs on the CPU with one thread (``device="cpu"`` even where a GPU is: ``gpu.py`` measures that).
- ``batch``: a sweep spec (DP-SGD LeNet trainings on digits over a grid of noise multipliers, learning rates
  and seeds with a checkpoint per epoch, then one ``instability`` table per (noise, learning rate) over its
  seeds) run with ``landscape batch --workers 1`` and ``--workers 2`` in turn; the parallel efficiency
  ``T1 / (2 T2)`` per round (goal >= 0.85 on 2 workers, for a quiet machine with two free cores). At the full
  size the sweep is 81 jobs with about 5.3 minutes of job work on one worker, so a round takes about 8
  minutes. The jobs' durations from the one-worker runs and the spec's dependency graph feed
  :mod:`scaling_sim`: speed-up on 8, 64 and 512 workers by list scheduling, the critical path, the work-span and
  Amdahl bounds (the serial part: what the two-worker run spent beyond its simulated schedule).

``--size full`` is the issue's range (n = 64 .. 4,096; grids 11^2 .. 101^2; 3 .. 300 points; a sweep with over
5 minutes of job work), for ``make bench``; ``--size tiny`` proves the machinery in seconds (the tests run it).
Plots (PNG + PDF, ``landscape.plots.style``) and ``scaling.json`` (every measurement, fit and the simulation)
go to ``--out`` (default: next to the benchmark record when ``run_all.py`` runs it, else
``benchmarks/results/scaling``).

    OMP_NUM_THREADS=1 python benchmarks/scaling.py [--size tiny|full] [--only gram,surface,interpolate,batch]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from _common import MIN_REPEATS, ROOT, plots_dir, record  # noqa: E402

PARTS = ("gram", "surface", "interpolate", "batch")
SIZES = {
    "tiny": {"gram_n": [8, 16], "chunk": 8, "grids": [3, 5], "workers": [1, 2], "points": [3, 6],
             "sweep": {"lrs": [0.05], "noises": [1.0], "seeds": 2, "epochs": 1, "subset": 0.1, "points": 3},
             "repeats": 1, "batch_repeats": 1, "sim_workers": [1, 2, 8, 64, 512]},
    "full": {"gram_n": [64, 128, 256, 512, 1024, 2048, 4096], "chunk": 512, "grids": [11, 21, 41, 71, 101],
             "workers": [1, 2], "points": [3, 10, 30, 100, 300],
             "sweep": {"lrs": [0.05, 0.1, 0.2], "noises": [0.5, 1.0, 2.0], "seeds": 8, "epochs": 55, "subset": None,
                       "points": 10},
             "repeats": MIN_REPEATS, "batch_repeats": MIN_REPEATS, "sim_workers": [1, 2, 4, 8, 16, 64, 512]},
}
GRAM_METHODS = ("in memory", "streamed to HDF5")
GRAM_SHAPE = (1, 28, 28)


def fit_power(x, y) -> dict:
    """Least squares of ``log y = log c + k log x``: ``{"exponent": k, "prefactor": c, "r2": R^2}`` (NaN with
    fewer than two distinct sizes)."""
    import numpy as np

    lx, ly = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    if lx.size < 2 or np.ptp(lx) == 0:
        return {"exponent": float("nan"), "prefactor": float("nan"), "r2": float("nan")}
    k, b = np.polyfit(lx, ly, 1)
    resid = ly - (k * lx + b)
    total = float(((ly - ly.mean()) ** 2).sum())
    return {"exponent": float(k), "prefactor": float(np.exp(b)), "r2": 1 - float((resid**2).sum()) / total if total
            else 1.0}


# ------------------------------------------------------------------------------------------------------ gram

def gram_child(method: str, n: int, chunk: int) -> dict:
    """One Gram measurement in this (fresh, one-thread) process: seconds, peak RSS and its increase."""
    import torch

    from landscape.gram import gram_blocks
    from landscape.gram_hdf5 import gram_blocks_to_hdf5
    from landscape.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("lenet", input_shape=GRAM_SHAPE, num_classes=10).eval()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, *GRAM_SHAPE, generator=g), torch.randint(0, 10, (n,), generator=g)
    with tempfile.TemporaryDirectory(prefix="bench-gram-") as tmp:
        def run(xs, ys, name):
            if method == "in memory":
                return float(sum(float(k.trace()) for k in gram_blocks(model, xs, ys).values()))
            import h5py

            path = gram_blocks_to_hdf5(model, xs, ys, Path(tmp) / name, chunk=chunk)
            with h5py.File(path) as f:
                return float(sum(f["K"][i, i] for i in range(len(ys))))

        run(x[:2], y[:2], "warm.h5")  # kernel initialisation, lazy imports: not part of the measurement
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        trace = run(x, y, "gram.h5")
        seconds = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"method": method, "n": n, "seconds": seconds, "peak_mb": peak / 1024, "increase_mb": (peak - base) / 1024,
            "trace": trace}


def _child(args: list[str]) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        raise SystemExit(f"scaling child {' '.join(args)} failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_gram(size: dict, repeats: int) -> dict:
    rows = []
    for r in range(repeats):
        sizes = size["gram_n"] if r % 2 == 0 else size["gram_n"][::-1]
        for n in sizes:
            for method in GRAM_METHODS:
                m = _child(["gram", method, str(n), str(size["chunk"])])
                m["round"] = r
                rows.append(m)
                print(f"  [{r + 1}/{repeats}] gram n={n:5d} {method:17s} {m['seconds']:8.2f} s  peak "
                      f"{m['peak_mb']:7.0f} MB (+{m['increase_mb']:.0f})", flush=True)
    for n in size["gram_n"]:  # both routes compute the same kernel
        traces = [m["trace"] for m in rows if m["n"] == n]
        if max(traces) - min(traces) > 1e-6 * abs(traces[0]):
            raise SystemExit(f"gram n={n}: the in-memory and streamed kernels differ (traces {traces})")
    fits = {}
    for method in GRAM_METHODS:
        mine = [m for m in rows if m["method"] == method]
        per_round = [fit_power([m["n"] for m in mine if m["round"] == r], [m["seconds"] for m in mine
                                                                           if m["round"] == r])["exponent"]
                     for r in range(repeats)]
        med = _medians(mine, "n", ("seconds", "peak_mb", "increase_mb"))
        fits[method] = {"time_exponents": per_round,
                        "time": fit_power(list(med), [v["seconds"] for v in med.values()]),
                        "memory": fit_power(list(med), [max(v["increase_mb"], 1e-3) for v in med.values()]),
                        "medians": med}
        record(f"Gram blocks, LeNet, {method}: time exponent in n ({size['gram_n'][0]}-{size['gram_n'][-1]})",
               samples=per_round, unit="", better="lower")
        record(f"Gram blocks, LeNet, {method}: peak memory at n={size['gram_n'][-1]}",
               med[size["gram_n"][-1]]["peak_mb"], unit=" MB", better="lower",
               note=f"memory-increase exponent {fits[method]['memory']['exponent']:.2f}")
    return {"rows": rows, "fits": fits, "chunk": size["chunk"]}


def _medians(rows: list[dict], by: str, keys: tuple[str, ...]) -> dict:
    out: dict = {}
    for value in sorted({m[by] for m in rows}):
        mine = [m for m in rows if m[by] == value]
        out[value] = {k: statistics.median(m[k] for m in mine) for k in keys}
    return out


# ------------------------------------------------------------------------------------------- surface / interp

def _lenet_store(root: Path):
    """A store with one LeNet checkpoint ``a`` on digits (seeded initialisation) and the digits data set."""
    import torch

    from landscape.data import load_dataset
    from landscape.models import build_model
    from landscape.store import Store

    data = load_dataset("digits", seed=0)
    torch.manual_seed(0)
    model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    run = Store(root).create_run("a", config={"model": "lenet"}, seeds={"seed": 0}, model_spec=model.landscape_spec,
                                 data_spec=data.spec)
    run.save_checkpoint(model.state_dict(), step=0, epoch=0.0)
    torch.manual_seed(1)
    other = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    return model, other, data


def bench_surface(size: dict, repeats: int, tmp: Path) -> dict:
    from landscape.api import surface

    _lenet_store(tmp / "store")
    rows = []
    cells = [(g, w) for g in size["grids"] for w in size["workers"]]
    for r in range(repeats):
        for g, w in cells if r % 2 == 0 else cells[::-1]:
            out = tmp / f"surface-{g}-{w}-{r}.h5"
            t0 = time.perf_counter()
            surface("a", root=tmp / "store", grid=f"{g}x{g}", split=("test",), workers=w, output=out, figure=False,
                    restart=True, device="cpu")
            rows.append({"grid": g, "points": g * g, "workers": w, "seconds": time.perf_counter() - t0, "round": r})
            out.unlink()
            print(f"  [{r + 1}/{repeats}] surface {g}x{g} workers={w}: {rows[-1]['seconds']:.2f} s", flush=True)
    fits = {}
    for w in size["workers"]:
        mine = [m for m in rows if m["workers"] == w]
        per_round = [fit_power([m["points"] for m in mine if m["round"] == r],
                               [m["seconds"] for m in mine if m["round"] == r])["exponent"] for r in range(repeats)]
        med = _medians(mine, "points", ("seconds",))
        fits[w] = {"time_exponents": per_round, "time": fit_power(list(med), [v["seconds"] for v in med.values()]),
                   "medians": med}
        record(f"surface, LeNet on digits, {w} worker(s): time exponent in grid points "
               f"({size['grids'][0]}^2-{size['grids'][-1]}^2)", samples=per_round, unit="", better="lower")
    if len(size["workers"]) > 1:
        big = size["grids"][-1]
        one = {m["round"]: m["seconds"] for m in rows if m["grid"] == big and m["workers"] == 1}
        two = {m["round"]: m["seconds"] for m in rows if m["grid"] == big and m["workers"] == 2}
        record(f"surface {big}x{big}, LeNet on digits: speed-up of 2 workers over 1",
               samples=[one[r] / two[r] for r in one if r in two])
    return {"rows": rows, "fits": {str(k): v for k, v in fits.items()}}


def bench_interpolate(size: dict, repeats: int) -> dict:
    from landscape.analyze.interpolate import interpolate

    with tempfile.TemporaryDirectory(prefix="bench-interp-") as tmp:
        model, other, data = _lenet_store(Path(tmp))
    split = {"test": data.split("test")}
    rows = []
    for r in range(repeats):
        for p in size["points"] if r % 2 == 0 else size["points"][::-1]:
            t0 = time.perf_counter()
            interpolate(model, model.state_dict(), other.state_dict(), split, split=("test",), points=p,
                        device="cpu")
            rows.append({"points": p, "seconds": time.perf_counter() - t0, "round": r})
    per_round = [fit_power([m["points"] for m in rows if m["round"] == r],
                           [m["seconds"] for m in rows if m["round"] == r])["exponent"] for r in range(repeats)]
    med = _medians(rows, "points", ("seconds",))
    for p, v in med.items():
        print(f"  interpolate {p:4d} points: {v['seconds']:.3f} s (median)", flush=True)
    record(f"interpolation, LeNet on digits: time exponent in points ({size['points'][0]}-{size['points'][-1]})",
           samples=per_round, unit="", better="lower")
    return {"rows": rows, "time_exponents": per_round,
            "time": fit_power(list(med), [v["seconds"] for v in med.values()]), "medians": med}


# ---------------------------------------------------------------------------------------------------- batch

def sweep_spec(sweep: dict) -> str:
    """The sweep: DP-SGD LeNet trainings on digits over noise multipliers x learning rates x seeds, a checkpoint
    per epoch (trajectories, as a study stores them), then one instability table per (noise, lr) over its seeds."""
    lrs = ", ".join(str(lr) for lr in sweep["lrs"])
    noises = ", ".join(str(s) for s in sweep["noises"])
    seeds = ", ".join(str(s) for s in range(sweep["seeds"]))
    subset = "" if sweep["subset"] is None else f", subset: {sweep['subset']}"
    return f"""\
# written by benchmarks/scaling.py: independent DP-SGD trainings, then tables that wait for them
root: checkpoints/sweep
results: results/sweep
defaults:
  train: {{model: lenet, data: digits, optimizer: dpsgd, epochs: {sweep['epochs']}, batch_size: 64,
          momentum: 0.9, max_grad_norm: 1.0, checkpoint_every: 1e{subset}}}
  instability: {{points: {sweep['points']}, split: [test], figure: false, pairs: all}}
jobs:
  train:
    kind: train
    grid: {{noise_multiplier: [{noises}], lr: [{lrs}], seed: [{seeds}]}}
    name: "train-n{{noise_multiplier}}-lr{{lr}}-s{{seed}}"
    run: "sweep-n{{noise_multiplier}}-lr{{lr}}-s{{seed}}"
  instab:
    kind: instability
    grid: {{noise_multiplier: [{noises}], lr: [{lrs}]}}
    name: "instab-n{{noise_multiplier}}-lr{{lr}}"
    refs: ["sweep-n{{noise_multiplier}}-lr{{lr}}-s*"]
"""


def bench_batch(size: dict, repeats: int, tmp: Path) -> dict:
    import batch as batch_bench
    from scaling_sim import simulate

    from landscape.batch.spec import load_spec

    spec = tmp / "sweep.yaml"
    spec.write_text(sweep_spec(size["sweep"]))
    graph = load_spec(spec)
    deps = {j.id: list(j.deps) for j in graph.jobs}
    walls: dict[int, list[float]] = {1: [], 2: []}
    durations: list[dict[str, float]] = []
    for r in range(repeats):
        for workers in (1, 2) if r % 2 == 0 else (2, 1):
            jobs: dict[str, float] = {}
            wall, cpu = batch_bench.run(spec, workers, jobs)
            walls[workers].append(wall)
            if workers == 1:
                durations.append(jobs)
            print(f"  [{r + 1}/{repeats}] sweep, --workers {workers}: {wall:.1f} s wall, {cpu:.1f} s CPU, "
                  f"{sum(jobs.values()):.1f} s of job work", flush=True)
    efficiency = [a / (2 * b) for a, b in zip(walls[1], walls[2], strict=True)]
    record(f"batch sweep ({len(deps)} jobs): parallel efficiency on 2 workers", samples=efficiency, goal=0.85,
           note=f"{statistics.median(sum(d.values()) for d in durations):.0f} s of job work")
    job_seconds = {j: statistics.median(d[j] for d in durations) for j in deps}
    from scaling_sim import list_schedule

    two = list_schedule(job_seconds, deps, 2).makespan
    serial = max(0.0, statistics.median(walls[2]) - two)
    sim = simulate(job_seconds, deps, size["sim_workers"], serial=serial)
    for row in sim["rows"]:
        if row["workers"] in (8, 64, 512):
            record(f"batch sweep: simulated speed-up on {row['workers']} workers (list scheduling)", row["speedup"],
                   note=f"work-span bound {row['work_span_bound']:.2f}, Amdahl bound {row['amdahl_bound']:.1f}")
    print(f"  sweep: work {sim['work']:.1f} s, critical path {sim['span']:.1f} s ({' -> '.join(sim['critical_path'])}"
          f"), parallelism W/L {sim['parallelism']:.1f}, serial part {serial:.1f} s", flush=True)
    return {"spec": spec.read_text(), "deps": deps, "walls": {str(k): v for k, v in walls.items()},
            "efficiency": efficiency, "job_seconds": job_seconds, "simulation": sim}


# ---------------------------------------------------------------------------------------------------- plots

def plot_all(series: dict, out: Path) -> list[Path]:
    from landscape.plots.style import PALETTE, save_figure, styled, subplots

    @styled
    def loglog(name, curves, xlabel, ylabel, title, extra=None):
        fig, axes = subplots(1, len(curves), figsize=(5.2 * len(curves), 4.0), layout="constrained", squeeze=False)
        for ax, (panel_title, lines) in zip(axes[0], curves, strict=True):
            for i, (label, xs, ys) in enumerate(lines):
                fit = fit_power(xs, ys)
                color = PALETTE[i % len(PALETTE)]
                ax.loglog(xs, ys, "o", color=color)
                if not math.isnan(fit["exponent"]):
                    grid = [min(xs), max(xs)]
                    ax.loglog(grid, [fit["prefactor"] * v ** fit["exponent"] for v in grid], "-", color=color,
                              label=f"{label}: slope {fit['exponent']:.2f}")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel if ax is axes[0][0] else panel_title)
            ax.set_title(panel_title)
            ax.legend(fontsize="small")
        fig.suptitle(title)
        return save_figure(fig, out / name)

    files = []
    if "gram" in series:
        fits = series["gram"]["fits"]
        curves = [("time (s)", [(m, list(map(int, f["medians"])), [v["seconds"] for v in f["medians"].values()])
                                for m, f in fits.items()]),
                  ("peak memory increase (MB)", [(m, list(map(int, f["medians"])),
                                                  [max(v["increase_mb"], 1e-3) for v in f["medians"].values()])
                                                 for m, f in fits.items()])]
        files += loglog("scaling-gram", curves, "n (examples)", "time (s)",
                        f"LeNet Gram blocks vs n (chunk {series['gram']['chunk']})")
    if "surface" in series:
        curves = [("time (s)", [(f"{w} worker(s)", list(map(int, f["medians"])),
                                 [v["seconds"] for v in f["medians"].values()])
                                for w, f in series["surface"]["fits"].items()])]
        files += loglog("scaling-surface", curves, "grid points", "time (s)", "surface, LeNet on digits")
    if "interpolate" in series:
        med = series["interpolate"]["medians"]
        curves = [("time (s)", [("interpolate", list(map(int, med)), [v["seconds"] for v in med.values()])])]
        files += loglog("scaling-interpolate", curves, "points", "time (s)", "interpolation, LeNet on digits")
    if "batch" in series:
        files += _plot_batch(series["batch"], out)
    return files


def _plot_batch(batch: dict, out: Path) -> list[Path]:
    from landscape.plots.style import PALETTE, save_figure, styled, subplots

    @styled
    def draw():
        sim = batch["simulation"]
        rows = sim["rows"]
        p = [r["workers"] for r in rows]
        fig, ax = subplots(figsize=(5.6, 4.2), layout="constrained")
        ax.loglog(p, p, ":", color="#666666", label="linear")
        ax.loglog(p, [r["work_span_bound"] for r in rows], "--", color=PALETTE[1],
                  label=f"work-span bound (W/L = {sim['parallelism']:.1f})")
        ax.loglog(p, [r["amdahl_bound"] for r in rows], "-.", color=PALETTE[2],
                  label=f"Amdahl (serial {sim['serial']:.1f} s)")
        ax.loglog(p, [r["speedup"] for r in rows], "o-", color=PALETTE[0], label="list scheduling (simulated)")
        measured = statistics.median(batch["walls"]["1"]) / statistics.median(batch["walls"]["2"])
        ax.loglog([2], [measured], "s", color=PALETTE[3], ms=8, label=f"measured, 2 workers ({measured:.2f}x)")
        ax.set_xlabel("workers")
        ax.set_ylabel("speed-up over one worker")
        ax.set_title(f"batch sweep: {sim['jobs']} jobs, {sim['work']:.0f} s of work")
        ax.legend(fontsize="small")
        return save_figure(fig, out / "scaling-batch")

    return draw()


# ----------------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--size", choices=sorted(SIZES), default="full")
    ap.add_argument("--only", default=",".join(PARTS), help="comma-separated: " + ", ".join(PARTS))
    ap.add_argument("--repeats", type=int, default=None, help="rounds per series (default: the size's)")
    ap.add_argument("--out", type=Path, default=None, help="plots and scaling.json (default: see the docstring)")
    args = ap.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        print(json.dumps(gram_child(rest[0], int(rest[1]), int(rest[2]))))
        return 0
    parts = [p for p in args.only.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        print(f"unknown part(s) {', '.join(unknown)}; known: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    size = SIZES[args.size]
    out = args.out if args.out is not None else plots_dir(ROOT / "benchmarks" / "results" / "scaling")
    out.mkdir(parents=True, exist_ok=True)
    repeats = args.repeats or size["repeats"]
    series: dict = {"size": args.size}
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        if "gram" in parts:
            print(f"\nGram blocks vs n ({args.size})", flush=True)
            series["gram"] = bench_gram(size, repeats)
        if "surface" in parts:
            print(f"\nsurface vs grid ({args.size})", flush=True)
            series["surface"] = bench_surface(size, repeats, Path(tmp))
        if "interpolate" in parts:
            print(f"\ninterpolation vs points ({args.size})", flush=True)
            series["interpolate"] = bench_interpolate(size, repeats)
        if "batch" in parts:
            print(f"\nbatch sweep on 1 and 2 workers ({args.size})", flush=True)
            series["batch"] = bench_batch(size, args.repeats or size["batch_repeats"], Path(tmp))
            series["simulation"] = series["batch"]["simulation"]
    files = plot_all(series, out)
    (out / "scaling.json").write_text(json.dumps(series, indent=1, default=str) + "\n")
    print(f"\nplots: {', '.join(str(f) for f in files)}\nseries: {out / 'scaling.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
