"""Points per second of `landscape directions` / `landscape surface` against loss-landscapes' random_line / random_plane.

Issue 5's benchmark. Same model (lenet, seeded) and data (``--case digits``: the digits train split, 1348
examples of 1x8x8; ``--case mnist-shape``: 1000 synthetic 1x28x28 images; one batch for loss-landscapes'
``Loss`` metric), one thread, all four methods interleaved in one process; medians and
ratios are printed. loss-landscapes is run under ``torch.no_grad()`` (its metric otherwise builds an
autograd graph at every point, which would flatter us) with ``deepcopy_model=True`` and filter
normalisation, like ours. Ours evaluates t = 0 once per call and loss-landscapes never does, so points are
counted as evaluated: ours ``n (points - 1) + 1`` and ``grid^2``; theirs ``n * steps`` and ``steps^2``.
Both see the whole split in one forward pass (ours: ``chunk=2048``).

    OMP_NUM_THREADS=1 python benchmarks/directions.py [--n 8] [--steps 10] [--grid 8] [--repeats 5] [--case digits|mnist-shape]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from _common import MIN_REPEATS, forward_flops, interleaved, matmul_peak, medians, one_thread, ratios, record  # noqa: E402

BATCH = 2048  # the whole split in one forward pass, as loss-landscapes' Loss metric does
CASES = ("digits", "mnist-shape")


def _data(case: str):
    import torch

    from landscape.data import load_dataset

    if case == "digits":
        data = load_dataset("digits")
        x, y = data.split("train")
        return x, y, data.input_shape, data.num_classes
    g = torch.Generator().manual_seed(0)
    return torch.randn(1000, 1, 28, 28, generator=g), torch.randint(0, 10, (1000,), generator=g), (1, 28, 28), 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8, help="random directions per call")
    parser.add_argument("--steps", type=int, default=10, help="points per direction (excluding t = 0)")
    parser.add_argument("--grid", type=int, default=8, help="surface grid is grid x grid")
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS)
    parser.add_argument("--case", choices=sorted(CASES), default="digits",
                        help="digits: lenet on the digits train split; mnist-shape: lenet on 1000 synthetic 1x28x28 images")
    args = parser.parse_args()
    one_thread()

    import loss_landscapes
    import torch
    from loss_landscapes.metrics import Loss

    from landscape.analyze.directions import random_profiles
    from landscape.analyze.specs import SurfaceConfig
    from landscape.analyze.surface import compute_surface, random_plane
    from landscape.models import build_model
    from landscape.params import ParamSpace

    x, y, input_shape, num_classes = _data(args.case)
    torch.manual_seed(0)
    model = build_model("lenet", input_shape=input_shape, num_classes=num_classes).eval()
    space = ParamSpace.from_model(model)
    theta = space.flatten(model)
    metric = Loss(torch.nn.CrossEntropyLoss(), x, y)
    surface_config = SurfaceConfig(
        grid=f"{args.grid}x{args.grid}", range="-1:1", split=("train",), chunk=BATCH, device="cpu"
    )

    def ours_directions():
        random_profiles(
            model,
            theta,
            x,
            y,
            directions=args.n,
            points=args.steps + 1,
            distance=1.0,
            normalize="filter",
            chunk=BATCH,
            device="cpu",  # the peers run on the CPU: so do we, also where a GPU is (benchmarks/gpu.py is for it)
        )

    def theirs_directions():
        with torch.no_grad():
            for _ in range(args.n):
                loss_landscapes.random_line(
                    model, metric, distance=1.0, steps=args.steps, normalization="filter", deepcopy_model=True
                )

    def ours_surface():
        plane = random_plane(theta, space, seed=0, normalize="filter")
        compute_surface(model, plane, {"train": (x, y)}, config=surface_config, space=space)

    def theirs_surface():
        with torch.no_grad():
            loss_landscapes.random_plane(
                model, metric, distance=1.0, steps=args.grid, normalization="filter", deepcopy_model=True
            )

    points = {
        "directions (ours)": args.n * args.steps + 1,
        "random_line (loss-landscapes)": args.n * args.steps,
        "surface (ours)": args.grid**2,
        "random_plane (loss-landscapes)": args.grid**2,
    }
    methods = dict(
        zip(points, (ours_directions, theirs_directions, ours_surface, theirs_surface), strict=True)
    )
    times = interleaved(methods, repeats=args.repeats, warmup=1)
    med = medians(times)
    rate = {k: points[k] / med[k] for k in med}
    print(
        f"lenet on {args.case} ({x.shape[0]} examples of {tuple(x.shape[1:])}), {space.dim} parameters, one thread, "
        f"{len(times['surface (ours)'])} interleaved rounds"
    )
    width = max(len(k) for k in med)
    print(f"  {'method':<{width}}  {'points':>6}  {'median s':>9}  {'points/s':>9}")
    for k in med:
        print(f"  {k:<{width}}  {points[k]:>6}  {med[k]:9.3f}  {rate[k]:9.1f}")
    line = rate["directions (ours)"] / rate["random_line (loss-landscapes)"]
    plane = rate["surface (ours)"] / rate["random_plane (loss-landscapes)"]
    # points/s ratio per round: (their time / their points) / (our time / our points)
    scale_line = points["directions (ours)"] / points["random_line (loss-landscapes)"]
    scale_plane = points["surface (ours)"] / points["random_plane (loss-landscapes)"]
    print(f"  points/s x loss-landscapes: random_line {line:.2f}, random_plane {plane:.2f} (ratios of medians)")
    # context for the ratio on this machine: the model's multiply-adds per point over each method's time per point
    # (ours does fewer per point: its first layer is shared between points, its second convolution is one dense
    # product without the padding taps) beside what a large dense float32 product reaches on this core
    macs, peak = forward_flops(model, x) // 2, matmul_peak(n=2048) / 2  # multiply-adds, and per second
    gmacs = {k: rate[k] * macs / 1e9 for k in rate}
    print(f"  the model's arithmetic: {macs / 1e6:.1f} M multiply-adds per point; per second (G): " + ", ".join(
        f"{k} {v:.1f}" for k, v in gmacs.items()) + f"; one 2048^3 float32 product on this core (fastest of 7) {peak / 1e9:.1f}")
    notes = {ours: (f"the model's multiply-adds per second: ours {gmacs[ours]:.1f} G (fewer done per point), "
                    f"loss-landscapes {gmacs[theirs]:.1f} G; a 2048^3 float32 product on this core {peak / 1e9:.1f} G")
             for ours, theirs in (("directions (ours)", "random_line (loss-landscapes)"),
                                  ("surface (ours)", "random_plane (loss-landscapes)"))}
    record("directions, LeNet on digits: points/s x loss-landscapes random_line", goal=3.0, samples=[
        r * scale_line for r in ratios(times, "random_line (loss-landscapes)", "directions (ours)")],
        note=notes["directions (ours)"])
    record("surface, LeNet on digits: points/s x loss-landscapes random_plane", goal=3.0, samples=[
        r * scale_plane for r in ratios(times, "random_plane (loss-landscapes)", "surface (ours)")],
        note=notes["surface (ours)"])


if __name__ == "__main__":
    main()
