"""Per-sample gradient throughput: ours vs Opacus' GradSampleModule vs a naive per-example loop.

For ``opacus-cnn`` (batch 256, 1x28x28) and ``resnet18`` GroupNorm (batch 64, 3x32x32), one thread, all
methods interleaved in one process, medians, samples per second and ratios to Opacus:

- ``ours norms``: ``PerSampleEngine.norms`` (hooks route: ghost norms where cheaper, no full per-sample
  gradients where avoidable) - what clipping, R and the norm statistics need;
- ``ours grads``: ``PerSampleEngine.grads`` (materialised per-sample gradients, hooks route);
- ``ours grads functorch``: the same through ``vmap(grad)``;
- ``opacus grads+norms``: GradSampleModule forward + backward filling ``p.grad_sample``, then the norms
  (resnet18 with an out-of-place residual add, the same function: Opacus' hooks refuse the in-place one);
- ``naive loop``: one forward/backward per example.

    OMP_NUM_THREADS=1 python benchmarks/persample.py [--repeats 5] [--models opacus-cnn,resnet18] [--memory]

``--memory`` also runs each method once in its own fresh process and prints its peak resident memory
(the process' high-water mark, model and data included; "baseline" is building the model and data only).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from _common import interleaved, medians, one_thread, out_of_place_residuals, peak_memory, ratios, record  # noqa: E402

CASES = {"opacus-cnn": ((1, 28, 28), 256), "resnet18": ((3, 32, 32), 64)}


def methods_for(name: str):
    import torch
    import torch.nn.functional as F
    from opacus import GradSampleModule

    from landscape.models import build_model
    from landscape.persample import PerSampleEngine

    shape, n = CASES[name]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g)
    torch.manual_seed(0)
    model = build_model(name, input_shape=shape, num_classes=10)
    hooks = PerSampleEngine(model, strategy="hooks")
    func = PerSampleEngine(model, strategy="functorch")
    torch.manual_seed(0)
    opacus_model = out_of_place_residuals(build_model(name, input_shape=shape, num_classes=10))
    gsm = GradSampleModule(opacus_model, loss_reduction="sum")
    params = [p for p in gsm.parameters() if p.requires_grad]

    def opacus():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            F.cross_entropy(gsm(x), y, reduction="sum").backward()
        norms = torch.stack([p.grad_sample.reshape(n, -1).norm(dim=1) for p in params], 1).norm(dim=1)
        gsm.zero_grad(set_to_none=True)
        return norms

    def naive():
        named = [p for p in model.parameters() if p.requires_grad]
        out = []
        for i in range(n):
            loss = F.cross_entropy(model(x[i : i + 1]), y[i : i + 1], reduction="sum")
            out.append(torch.autograd.grad(loss, named))
        return out

    return n, {
        "ours norms": lambda: hooks.norms(x, y),
        "ours grads": lambda: hooks.grads(x, y),
        "ours grads functorch": lambda: func.grads(x, y),
        "opacus grads+norms": opacus,
        "naive loop": naive,
    }


def run_once(name: str, method: str) -> float:
    """One call of ``method`` (in a fresh process, for ``peak_memory``); returns its seconds."""
    import time

    one_thread()
    warnings.filterwarnings("ignore", category=UserWarning)
    _, methods = methods_for(name)
    t0 = time.perf_counter()
    if method != "baseline":
        methods[method]()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", default=",".join(CASES))
    ap.add_argument("--memory", action="store_true", help="peak memory of each method, one process each")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    warnings.filterwarnings("ignore", category=UserWarning)  # Opacus' secure-RNG and backward-hook notices
    one_thread()
    for name in args.models.split(","):
        n, methods = methods_for(name)
        times = interleaved(methods, repeats=args.repeats, warmup=1, budget=120)
        med = medians(times)
        shape = "x".join(map(str, CASES[name][0]))
        print(f"\n{name}: batch {n}, input {shape}, per-sample gradients (one thread, interleaved, medians)")
        base = med["opacus grads+norms"]
        print(f"  {'method':<22} {'median s':>10} {'samples/s':>10} {'x Opacus time':>14}")
        for k, v in med.items():
            print(f"  {k:<22} {v:10.4f} {n / v:10.1f} {v / base:14.2f}")
        goal = 0.6 if name == "opacus-cnn" else None
        record(f"per-sample norms, {name} b={n}: time x Opacus", samples=ratios(times, "ours norms", "opacus grads+norms"),
               goal=goal, better="lower")
        record(f"per-sample grads, {name} b={n}: time x Opacus", samples=ratios(times, "ours grads", "opacus grads+norms"),
               goal=goal, better="lower")
        if args.memory:
            print("  peak resident memory, one fresh process per method:")
            for k in ["baseline", *med]:
                r = peak_memory("persample", "run_once", name, k)
                print(f"    {k:<22} {r.get('peak_rss_mb', float('nan')):8.0f} MB  {r.get('error', '')}")


if __name__ == "__main__":
    main()
