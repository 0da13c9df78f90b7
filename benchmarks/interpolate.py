"""30-point linear interpolation: landscape vs loss-landscapes vs a batched plain loop vs 30 forward passes.

For ``lenet`` on 2,000 random 1x28x28 inputs and ``resnet18`` (GroupNorm) on 500 random 3x32x32 inputs,
with ONE torch thread, repeats interleaved (the machine is shared, so only ratios measured in the same
run mean anything), medians reported:

* ``ours``            ``landscape.analyze.interpolate.interpolate`` (30 points, both ends included)
* ``loss-landscapes`` ``loss_landscapes.linear_interpolation(steps=30, deepcopy_model=True)``, full batch
* ``plain-loop``      one model, each lerp written in place, batches of 500 under ``inference_mode``
* ``30x forward``     30 plain forward passes over the same examples (the "floor" a naive evaluator sits on)

Achieved FLOP/s counts the FLOPs of 30 plain forward passes (``torch.utils.flop_counter``) over our time,
against this machine's measured float32 matmul peak (one thread). ResNet-18 is expensive on one CPU thread
(~25 s per forward of 500 examples here), so by default it is measured with ``--resnet-points`` points per
method and scaled to 30 (every point costs the same; the scaling is printed). ``--full`` measures 30.

The allocator setting of :mod:`landscape.evaluate` (glibc keeps freed blocks instead of returning them to
the OS; page faults dominate memory-bound layers on this VM) is entered once around the whole benchmark
(``tuned_allocator``), so it applies to every method here; ``LANDSCAPE_MALLOC_TUNE=0`` runs everything with
glibc's defaults instead.

Run: ``OMP_NUM_THREADS=1 python benchmarks/interpolate.py [--repeats 5] [--resnet-points 3] [--full]``
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics

import torch
import torch.nn.functional as F
from _common import MIN_REPEATS, forward_flops, interleaved, matmul_peak, ratios, record  # noqa: E402

from landscape.analyze.interpolate import interpolate
from landscape.evaluate import tuned_allocator
from landscape.models import build_model

POINTS = 30


def make_methods(model_a, model_b, x, y, points: int):
    state_a, state_b = model_a.state_dict(), model_b.state_dict()
    data = {"train": (x, y)}

    def ours():
        interpolate(model_a, state_a, state_b, data, split=("train",), points=points, device="cpu")

    def loss_landscapes_run():
        from loss_landscapes import linear_interpolation
        from loss_landscapes.metrics import Loss

        # steps=points evaluates alpha = k/points, k = 1..points: the same number of forward passes
        linear_interpolation(model_a, model_b, Loss(F.cross_entropy, x, y), steps=points, deepcopy_model=True)

    def plain_loop():
        model = copy.deepcopy(model_a).eval()
        params = list(model.parameters())
        pa = [p.detach().clone() for p in model_a.parameters()]
        pb = [p.detach().clone() for p in model_b.parameters()]
        alphas = torch.linspace(0, 1, points).tolist()
        loss = torch.zeros(points, dtype=torch.float64)
        with torch.inference_mode():
            for i, alpha in enumerate(alphas):
                for p, a, b in zip(params, pa, pb, strict=True):
                    torch.lerp(a, b, alpha, out=p)
                for s in range(0, x.shape[0], 500):
                    loss[i] += F.cross_entropy(model(x[s:s + 500]), y[s:s + 500], reduction="sum")
        return loss

    def forwards():
        model = copy.deepcopy(model_a).eval()
        with torch.inference_mode():
            for _ in range(points):
                model(x)

    return {"ours": ours, "loss-landscapes": loss_landscapes_run, "plain-loop": plain_loop, "30x forward": forwards}


def bench_case(name: str, model_name: str, shape, n: int, points: int, repeats: int, peak: float, **kwargs) -> dict:
    torch.manual_seed(0)
    model_a = build_model(model_name, input_shape=shape, num_classes=10, **kwargs).eval()
    model_b = build_model(model_name, input_shape=shape, num_classes=10, **kwargs).eval()
    x, y = torch.randn(n, *shape), torch.randint(0, 10, (n,))
    methods = make_methods(model_a, model_b, x, y, points)
    flops = forward_flops(model_a, x) * POINTS
    times = interleaved(methods, repeats=repeats, warmup=0)  # the order rotates every round
    times = {k: [t * POINTS / points for t in v] for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{name}: {n} examples, {POINTS} points" + ("" if points == POINTS else
          f" (measured with {points} points per method, times scaled by {POINTS}/{points})")
          + f", {repeats} interleaved repeats, 1 thread")
    print(f"  {'method':<16} {'median s':>9} {'ours is x faster':>17}   all repeats (s)")
    for k, v in med.items():
        print(f"  {k:<16} {v:9.2f} {v / med['ours']:17.2f}   " + " ".join(f"{t:.2f}" for t in times[k]))
    goal = 4.0 if name == "lenet" else 1.2
    record(f"30-point interpolation, {name}: speed-up over the batched plain loop",
           samples=ratios(times, "plain-loop", "ours"), goal=goal)
    record(f"30-point interpolation, {name}: speed-up over loss-landscapes", samples=ratios(times, "loss-landscapes",
                                                                                             "ours"))
    achieved = flops / med["ours"]
    print(f"  30 plain forwards = {flops / 1e9:.1f} GFLOP; ours achieves {achieved / 1e9:.2f} GFLOP/s = "
          f"{achieved / peak:.1%} of the float32 matmul peak ({peak / 1e9:.1f} GFLOP/s); "
          f"loss-landscapes = {med['loss-landscapes'] / med['30x forward']:.2f}x the 30-forward time, "
          f"plain loop = {med['plain-loop'] / med['30x forward']:.2f}x")
    return med


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS)
    parser.add_argument("--resnet-points", type=int, default=3)
    parser.add_argument("--full", action="store_true", help="measure ResNet-18 with all 30 points")
    parser.add_argument("--skip-resnet", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tuned_allocator():  # every method below runs with the same allocator settings
        run(args)


def run(args) -> None:
    tuned = os.environ.get("LANDSCAPE_MALLOC_TUNE", "1") != "0"
    print("allocator: " + ("glibc tuned by landscape.evaluate for ALL methods (keeps freed blocks)" if tuned else
                           "glibc defaults for ALL methods (LANDSCAPE_MALLOC_TUNE=0)"))
    peak = matmul_peak()
    print(f"float32 matmul peak, 1 thread: {peak / 1e9:.1f} GFLOP/s (1024x1024, best of 7)")
    bench_case("lenet", "lenet", (1, 28, 28), 2000, POINTS, args.repeats, peak)
    if not args.skip_resnet:
        bench_case("resnet18 (GroupNorm)", "resnet18", (3, 32, 32), 500,
                   POINTS if args.full else args.resnet_points, args.repeats, peak, norm="group")
    print(f"\nmatmul peak re-measured at the end: {matmul_peak() / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
