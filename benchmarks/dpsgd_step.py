"""Median time of one DP-SGD step: ours (flat and layerwise) vs Opacus' PrivacyEngine vs plain SGD.

For ``opacus-cnn`` (batch 256, 1x28x28) and ``resnet18`` GroupNorm (batch 64,
3x32x32), one thread, all methods interleaved in one process; printed as ratios to plain SGD. Opacus is
timed in each of its grad_sample modes ("hooks", "ew" expanded weights, "ghost" clipping) and its fastest
is the reference (for resnet18 Opacus gets torchvision's BasicBlock with an out-of-place residual add,
the same function, since its hooks refuse the in-place one). Ours is ``landscape.train.privatize.Privatizer`` (``PerSampleEngine.clipped_sum`` +
Gaussian noise) followed by ``optimizer.step()``. Two more plain steps: landscape's own (``landscape train
--optimizer sgd``: the stock backward with max pooling through :mod:`landscape.pooling`) and one through our
per-sample engine's route (DP's own overhead is the DP step over it).

    OMP_NUM_THREADS=1 python benchmarks/dpsgd_step.py [--repeats 7] [--models opacus-cnn,resnet18] [--cpu-time]

Every method runs with glibc keeping freed large blocks (``tuned_allocator`` around the whole comparison, as a
Privatizer keeps it from its first step on), so the ratio of the DP step to the plain step on our route is DP's
own work, not page faults. Beside the times (wall clock, or the CPU clock with ``--cpu-time``) each method's
process CPU time and minor page faults per step are printed (medians over the same rounds), and the DP step's
CPU-time ratio to the plain step on our route (median and IQR of the rounds): a wall-clock ratio far from it
means time spent off the CPU (waiting on memory, descheduled).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from _common import interleaved, medians, one_thread, out_of_place_residuals, print_table, ratios, record  # noqa: E402

CASES = {"opacus-cnn": ((1, 28, 28), 256), "resnet18": ((3, 32, 32), 64)}
C, SIGMA, LR = 1.0, 1.0, 0.1
WARMUP = 1  # untimed rounds


def _data(shape, batch, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *shape, generator=g), torch.randint(0, 10, (batch,), generator=g)


def _ours(name, shape, x, y, clip_style):
    import torch

    from landscape.models import build_model
    from landscape.train.privatize import PrivacyConfig, Privatizer

    torch.manual_seed(0)
    model = build_model(name, input_shape=shape, num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    cfg = PrivacyConfig(optimizer="dpsgd", max_grad_norm=C, noise_multiplier=SIGMA, clip_style=clip_style)
    priv = Privatizer(model, cfg, expected_batch_size=len(x), generator=torch.Generator().manual_seed(1))

    def step():
        priv.compute_gradients(x, y)
        opt.step()
        opt.zero_grad(set_to_none=True)

    _ours.last = priv
    return step, priv.engine.strategy


def _plain(name, shape, x, y):
    import torch
    import torch.nn.functional as F

    from landscape.models import build_model

    torch.manual_seed(0)
    model = build_model(name, input_shape=shape, num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step():
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _plain_landscape(name, shape, x, y):
    """landscape's own plain SGD step (``Privatizer`` with optimizer sgd, as ``landscape train --optimizer sgd``):
    the stock backward, with max pooling through :mod:`landscape.pooling` (PyTorch's values and gradients, its
    faster CPU kernel)."""
    import torch

    from landscape.models import build_model
    from landscape.train.privatize import PrivacyConfig, Privatizer

    torch.manual_seed(0)
    model = build_model(name, input_shape=shape, num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    priv = Privatizer(model, PrivacyConfig(optimizer="sgd", track_norms=False), expected_batch_size=len(x),
                      generator=torch.Generator().manual_seed(1))

    def step():
        priv.compute_gradients(x, y)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _plain_our_route(name, shape, x, y):
    """A plain SGD step through our engine's route: one forward, one activation backward, and each layer's
    gradient summed from the kept activations and output gradients (weights 1, no norms): what our DP step does
    minus the per-sample norms, the clipping and the noise. Against it the DP step's ratio is DP's overhead,
    not the difference between our layer kernels and PyTorch's stock backward."""
    import torch
    import torch.nn.functional as F

    from landscape.models import build_model
    from landscape.train.privatize import PrivacyConfig, Privatizer

    torch.manual_seed(0)
    model = build_model(name, input_shape=shape, num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    engine = Privatizer(model, PrivacyConfig(optimizer="dpsgd", max_grad_norm=C, noise_multiplier=SIGMA),
                        expected_batch_size=len(x), generator=torch.Generator().manual_seed(1)).engine
    named = dict(model.named_parameters())
    ones = torch.ones(len(x))

    def mean_grad():
        xb, yb = engine._prepare(x, y)
        units, _, _ = engine._capture(xb, yb)
        sums = engine._zeros()
        engine._hooks_weighted(units, engine._layer_weights(ones, len(x)), sums)
        return {k: g.div_(len(x)) for k, g in sums.items()}

    # the same gradient as autograd's, or the comparison means nothing
    reference = torch.autograd.grad(F.cross_entropy(model(x), y), list(named.values()))
    for (k, g), r in zip(mean_grad().items(), reference, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6, msg=f"our route's gradient of {k}")

    def step():
        for k, g in mean_grad().items():
            named[k].grad = g
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _opacus(name, shape, x, y, mode):
    import torch
    from opacus import PrivacyEngine
    from torch import nn

    from landscape.models import build_model

    torch.manual_seed(0)
    model = out_of_place_residuals(build_model(name, input_shape=shape, num_classes=10))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=len(x))
    engine = PrivacyEngine(accountant="rdp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "ghost":
            model, opt, crit, _ = engine.make_private(
                module=model,
                optimizer=opt,
                data_loader=loader,
                criterion=nn.CrossEntropyLoss(),
                noise_multiplier=SIGMA,
                max_grad_norm=C,
                poisson_sampling=False,
                grad_sample_mode="ghost",
            )
        else:
            model, opt, _ = engine.make_private(
                module=model,
                optimizer=opt,
                data_loader=loader,
                noise_multiplier=SIGMA,
                max_grad_norm=C,
                poisson_sampling=False,
                grad_sample_mode=mode,
            )
            crit = nn.CrossEntropyLoss()

    def step():
        crit(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def profile(name: str, repeats: int) -> None:
    """Where a step's CPU time goes, per layer (fastest of ``repeats`` by the process' CPU clock): the capture
    (forward + activation backward) both steps share, each handled layer's summed gradient (plain step on our
    route) against its per-sample norm + clipped sum (DP step), and the rest of each whole step (norm assembly,
    clipping factors, noise, the optimiser's step)."""
    import torch

    from landscape.evaluate.allocator import tuned_allocator

    shape, batch = CASES[name]
    x, y = _data(shape, batch)

    def fastest(fn):
        best = float("inf")
        for _ in range(repeats):
            t0 = time.process_time()
            fn()
            best = min(best, time.process_time() - t0)
        return best * 1e3

    with tuned_allocator():
        dp, _ = _ours(name, shape, x, y, "flat")
        plain = _plain_our_route(name, shape, x, y)
        engine = _ours.last.engine
        xb, yb = engine._prepare(x, y)
        units, _, _ = engine._capture(xb, yb)
        ones, w = torch.ones(batch), torch.rand(batch, generator=torch.Generator().manual_seed(0))
        capture = fastest(lambda: engine._capture(xb, yb))
        rows = []
        for h, u in units.items():
            def fresh(u=u):
                return {k: v for k, v in u.items() if k not in ("g", "gw")}  # no cached per-sample gradients

            def summed_grad(h=h, fresh=fresh):  # the plain route: weights 1
                h.weighted(fresh(), dict.fromkeys(h.pnames, ones))

            def clipped_sum(h=h, fresh=fresh):  # DP: per-sample norms, then the weighted sum
                v = fresh()
                h.sq_norms(v, {})
                h.weighted(v, dict.fromkeys(h.pnames, w))

            summed, clipped = fastest(summed_grad), fastest(clipped_sum)
            shapes = ", ".join(f"{k} {tuple(h.module.get_parameter(k).shape)}" for k in h.pnames)
            rows.append((f"{type(h.module).__name__} ({shapes})", summed, clipped))
        plain_total, dp_total = fastest(plain), fastest(dp)
    print(f"\n{name}: batch {batch}, CPU ms per step (fastest of {repeats})")
    print(f"  {'piece':<58} {'plain route':>12} {'DP step':>10}")
    print(f"  {'forward + activation backward (the capture)':<58} {capture:12.2f} {capture:10.2f}")
    for label, a, b in rows:
        print(f"  {label[:58]:<58} {a:12.2f} {b:10.2f}")
    rest_p = plain_total - capture - sum(r[1] for r in rows)
    rest_d = dp_total - capture - sum(r[2] for r in rows)
    print(f"  {'rest (norms, clipping, noise, statistics, optimiser step)':<58} {rest_p:12.2f} {rest_d:10.2f}")
    print(f"  {'whole step':<58} {plain_total:12.2f} {dp_total:10.2f}   ratio {dp_total / plain_total:.3f}")


def metered(methods: dict, log: dict) -> dict:
    """The methods, each also logging the process CPU seconds and minor page faults of every call into ``log``."""

    def wrap(name, step):
        def call():
            c0, f0 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            step()
            log[name].append((time.process_time() - c0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0))

        return call

    log.update({k: [] for k in methods})
    return {k: wrap(k, v) for k, v in methods.items()}


def print_cpu(log: dict, num: str, den: str, warmup: int) -> None:
    """Per method, median CPU ms and minor faults per step; the per-round CPU-time ratio ``num / den`` (the first
    ``warmup`` calls of each method left out)."""
    log = {k: v[warmup:] for k, v in log.items()}
    print("  process CPU time and minor page faults per step (medians of the timed rounds):")
    for k, v in log.items():
        print(f"    {k:<22} {statistics.median(c for c, _ in v) * 1e3:10.2f} ms CPU"
              f" {statistics.median(f for _, f in v):10.0f} minor faults")
    r = sorted(a[0] / b[0] for a, b in zip(log[num], log[den], strict=True))
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0]] * 3
    print(f"  {num} / {den} by CPU time: {statistics.median(r):.3f}x (IQR {q[0]:.3f}-{q[2]:.3f}, {len(r)} rounds)")


def run(name: str, repeats: int, clock=None) -> None:
    from landscape.evaluate.allocator import tuned_allocator

    with tuned_allocator():  # every method with the same allocator settings
        _run(name, repeats, clock)


def _run(name: str, repeats: int, clock=None) -> None:
    shape, batch = CASES[name]
    x, y = _data(shape, batch)
    methods = {"plain SGD": _plain(name, shape, x, y), "plain SGD, landscape": _plain_landscape(name, shape, x, y),
               "plain SGD, our route": _plain_our_route(name, shape, x, y)}
    notes = {"plain SGD": "(stock PyTorch step)", "plain SGD, landscape": "(landscape train --optimizer sgd)"}
    for style in ("flat", "layerwise"):
        step, strategy = _ours(name, shape, x, y, style)
        methods[f"ours dpsgd {style}"] = step
        notes[f"ours dpsgd {style}"] = f"(engine route: {strategy})"
    for mode in ("hooks", "ew", "ghost"):
        try:
            step = _opacus(name, shape, x, y, mode)
            step()
        except Exception as e:  # noqa: BLE001 - a mode Opacus cannot run on this model is reported, not fatal
            print(f"  opacus {mode}: unavailable ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
            continue
        methods[f"opacus {mode}"] = step
    log: dict[str, list] = {}
    times = interleaved(metered(methods, log), repeats=repeats, warmup=WARMUP, budget=150,
                        **({"clock": clock} if clock else {}))
    med = medians(times)
    print_table(
        f"{name}: batch {batch}, input {'x'.join(map(str, shape))}, one DP step",
        med,
        baseline="plain SGD",
        extra=notes,
    )
    print_cpu(log, "ours dpsgd flat", "plain SGD, our route", WARMUP)
    ratio = ratios(times, "ours dpsgd flat", "plain SGD")
    if name == "opacus-cnn":
        record(f"DP-SGD step, {name} b={batch}: time x plain SGD", samples=ratio, goal=1.15, better="lower")
    else:
        record(f"DP-SGD step, {name}/GN b={batch}: time x stock plain SGD", samples=ratio, better="lower",
               note="the stock plain step uses PyTorch's CPU conv weight-gradient, ours the per-sample route")
    record(f"DP-SGD step, {name} b={batch}: time x plain SGD on our route",
           samples=ratios(times, "ours dpsgd flat", "plain SGD, our route"), goal=1.3, better="lower",
           note="DP's own overhead: the same layer kernels on both sides")
    record(f"DP-SGD step, {name} b={batch}: time x landscape's plain SGD step",
           samples=ratios(times, "ours dpsgd flat", "plain SGD, landscape"), better="lower",
           note="what a user of landscape train pays for DP")
    opacus = {k: v for k, v in med.items() if k.startswith("opacus")}
    if opacus:
        best = min(opacus, key=opacus.get)
        for style in ("flat", "layerwise"):
            ours = med[f"ours dpsgd {style}"]
            print(f"  ours {style} / {best} (Opacus' fastest): {ours / opacus[best]:.2f}  (goal <= 0.70)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--models", default=",".join(CASES))
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by the process' CPU clock (time spent descheduled on a shared machine not counted)")
    ap.add_argument("--profile", action="store_true",
                    help="instead: where the plain step on our route and the DP step spend CPU time, per layer")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    warnings.filterwarnings("ignore", category=UserWarning)  # Opacus' secure-RNG and backward-hook notices
    one_thread()
    for name in args.models.split(","):
        if args.profile:
            profile(name, args.repeats)
        else:
            run(name, args.repeats, time.process_time if args.cpu_time else None)


if __name__ == "__main__":
    main()
