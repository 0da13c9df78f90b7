"""Per-layer Gram blocks (empirical loss-gradient NTK): time and peak memory against two peers.

Methods, all computing every per-layer block K_r = G_r G_r^T of the per-sample loss gradients:

- ``ours``: ``landscape.gram.gram_blocks`` (strategy auto: hooks, per layer materialise or ghost);
- ``vmap-grad``: materialised per-sample gradients ``vmap(grad)`` of all parameters, then G_r G_r^T;
- ``jacrev-einsum``: PyTorch's NTK tutorial contraction (``vmap(jacrev)`` Jacobians + ``einsum``)
  applied to the per-sample loss.

The ``-output`` case computes ``kind="output"`` instead: every layer's (n M) x (n M) block of the logits'
Jacobians (the NTK of the network function; M = 10 logits), ours against ``jacrev-einsum`` on the logits
(exactly the tutorial's ``empirical_ntk_jacobian_contraction``) and ``vmap-grad`` does not apply. Every
method's kernel trace is compared with ours (relative 1e-4) before its time counts.

Every measurement runs in its own subprocess with one thread; peak memory is the child's ``ru_maxrss``
(reported as the total and as the increase over the same process's RSS before the computation). Cases
are interleaved and repeated; medians are printed with ratios peer / ours. A baseline whose memory,
scaled from a smaller case, would not fit in half the available RAM is skipped and says so.

    OMP_NUM_THREADS=1 python benchmarks/ntk.py                  # all cases
    OMP_NUM_THREADS=1 python benchmarks/ntk.py --cases resnet18-64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import record  # noqa: E402  (benchmarks/ is the script's directory)

CASES = {  # name -> (model, n, repeats by default, kernel kind)
    "opacus-cnn-256": ("opacus-cnn", 256, 5, "loss-grad"),
    "resnet18-64": ("resnet18", 64, 5, "loss-grad"),
    "resnet18-128": ("resnet18", 128, 5, "loss-grad"),
    "resnet18-16-output": ("resnet18", 16, 5, "output"),
}
METHODS = ("ours", "vmap-grad", "jacrev-einsum")
SHAPE = (3, 32, 32)
CLASSES = 10


def _setup(model_name: str, n: int):
    import torch

    from landscape.models import build_model

    torch.manual_seed(0)
    kwargs = {"norm": "group"} if model_name == "resnet18" else {}
    model = build_model(model_name, input_shape=SHAPE, num_classes=CLASSES, **kwargs).eval()
    x = torch.randn(n, *SHAPE)
    y = torch.randint(0, CLASSES, (n,))
    return model, x, y


def _ours(model, x, y, kind):
    from landscape.gram import gram_blocks

    return gram_blocks(model, x, y, kind=kind, max_memory="4GB")


def _functional(model):
    import torch.nn.functional as F
    from torch.func import functional_call

    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = dict(model.named_buffers())

    def loss(p, xi, yi):
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0), reduction="sum")

    return params, loss


def _vmap_grad(model, x, y, kind):
    import torch
    from torch.func import grad, vmap

    params, loss = _functional(model)
    g = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    out = {}
    for k, v in g.items():
        G = v.reshape(v.shape[0], -1)
        out[k] = (G @ G.T).to(torch.float64)
    return out


def _jacrev_einsum(model, x, y, kind):
    """PyTorch NTK tutorial (empirical_ntk_jacobian_contraction): the per-sample loss as the function, or the
    logits for ``kind="output"`` (blocks ordered sample-major like ours)."""
    import torch
    from torch.func import functional_call, jacrev, vmap

    params, loss = _functional(model)
    if kind == "output":
        buffers = dict(model.named_buffers())

        def logits(p, xi):
            return functional_call(model, (p, buffers), (xi.unsqueeze(0),)).squeeze(0)

        jac = vmap(jacrev(logits), in_dims=(None, 0))(params, x)  # (n, M, *shape)
        return {k: torch.einsum("Naf,Mbf->NaMb", j.flatten(2), j.flatten(2)).reshape(
            j.shape[0] * j.shape[1], -1).to(torch.float64) for k, j in jac.items()}
    jac = vmap(jacrev(loss), in_dims=(None, 0, 0))(params, x, y)
    return {
        k: torch.einsum("Nf,Mf->NM", j.flatten(1), j.flatten(1)).to(torch.float64) for k, j in jac.items()
    }


RUNNERS = {"ours": _ours, "vmap-grad": _vmap_grad, "jacrev-einsum": _jacrev_einsum}


def child(case: str, method: str) -> None:
    import torch

    torch.set_num_threads(1)
    model_name, n, _, kind = CASES[case]
    model, x, y = _setup(model_name, n)
    run = RUNNERS[method]
    run(model, x[:2], y[:2], kind)  # warm-up: torch.func / kernel initialisation, not part of the measurement
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    K = run(model, x, y, kind)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    trace = float(sum(k.trace() for k in K.values()))
    print(
        json.dumps(
            {
                "case": case,
                "method": method,
                "seconds": seconds,
                "peak_gb": peak / 2**20,
                "base_gb": base / 2**20,
                "trace": trace,
            }
        )
    )


def _available_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def _measure(case: str, method: str) -> dict | None:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = f"{root}{os.pathsep}{env.get('PYTHONPATH', '')}"
    res = subprocess.run(
        [sys.executable, __file__, "--child", case, method], capture_output=True, text=True, env=env
    )
    if res.returncode != 0:
        print(
            f"  {case} {method}: failed ({res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode})"
        )
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=2, metavar=("CASE", "METHOD"), help=argparse.SUPPRESS)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--repeats", type=int, default=None, help="override the per-case repeat count")
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    cases = [c for c in args.cases.split(",") if c]
    methods = [m for m in args.methods.split(",") if m]
    results: dict[tuple[str, str], list[dict]] = {}
    skipped: dict[tuple[str, str], str] = {}
    for case in cases:
        repeats = args.repeats or CASES[case][2]
        for r in range(repeats):
            for method in methods:  # interleaved: every method once per round
                key = (case, method)
                if CASES[case][3] == "output" and method == "vmap-grad":
                    skipped[key] = "does not apply to the output kernel"
                if key in skipped:
                    continue
                est = _estimate_gb(results, case, method)
                if est is not None and est > _available_gb() / 2:
                    skipped[key] = f"skipped: needs ~{est:.1f} GB, {_available_gb():.1f} GB available"
                    continue
                m = _measure(case, method)
                if m is not None:
                    m["round"] = r
                    results.setdefault(key, []).append(m)
                    print(
                        f"  [{r + 1}/{repeats}] {case:15s} {method:14s} {m['seconds']:8.2f} s  "
                        f"peak {m['peak_gb']:.2f} GB (+{m['peak_gb'] - m['base_gb']:.2f})",
                        flush=True,
                    )
    print()
    print(
        f"{'case':15s} {'method':14s} {'median s':>9s} {'peak GB':>8s} {'+GB':>6s} {'x time':>7s} {'x mem':>6s}"
    )
    for case in cases:
        ours = results.get((case, "ours"))
        for method in methods:
            key = (case, method)
            if key in skipped:
                print(f"{case:15s} {method:14s} {skipped[key]}")
                continue
            if key not in results:
                continue
            t = statistics.median(m["seconds"] for m in results[key])
            pk = statistics.median(m["peak_gb"] for m in results[key])
            inc = statistics.median(m["peak_gb"] - m["base_gb"] for m in results[key])
            rt = rm = ""
            if ours:
                rt = f"{t / statistics.median(m['seconds'] for m in ours):.2f}"
                rm = f"{pk / statistics.median(m['peak_gb'] for m in ours):.2f}"
            print(f"{case:15s} {method:14s} {t:9.2f} {pk:8.2f} {inc:6.2f} {rt:>7s} {rm:>6s}")
            if ours and method != "ours":
                trace, own = results[key][0]["trace"], ours[0]["trace"]
                if abs(trace - own) > 1e-4 * abs(own):
                    raise SystemExit(f"{case}: {method}'s kernel trace {trace} differs from ours {own}")
                own_by_round = {o["round"]: o["seconds"] for o in ours}
                paired = [m["seconds"] / own_by_round[m["round"]] for m in results[key] if m["round"] in own_by_round]
                record(f"NTK Gram ({CASES[case][3]}), {case}: speed-up over {method}", samples=paired,
                       note=f"peak memory {rm}x ours")
    print(
        "\nx time / x mem: the method's median time / peak RSS divided by ours (> 1: ours is faster / smaller)."
    )


def _estimate_gb(results, case: str, method: str) -> float | None:
    """Scale a measured peak increase of the same model at a smaller n linearly in n."""
    model, n, _, kind = CASES[case]
    for (c, m), runs in results.items():
        cm, cn, _, ck = CASES[c]
        if m == method and cm == model and ck == kind and cn < n:
            return max(r["peak_gb"] - r["base_gb"] for r in runs) * n / cn + runs[0]["base_gb"]
    return None


if __name__ == "__main__":
    main()
