"""Hessian-vector products and the top eigenvalue: ours (landscape.curvature) vs PyHessian (Yao et al. 2020).

For ``lenet`` (batch 128, 1x28x28) and ``resnet18`` GroupNorm (batch 8, 3x16x16), float32, one thread, methods
interleaved in one process, medians, ratios to PyHessian:

per Hessian-vector product (the operator / PyHessian object built once, at the same point)
- ``pyhessian hvp``: ``hessian_vector_product(gradsH, params, v)`` on its retained double-backward graph;
- ``ours hvp``: ``HessianOperator.hvp`` (graph retained once per chunk);
- ``ours hvp x4 (per vector)``: ``hvp_batch`` of 4 vectors (Hutchinson probes, residuals), per vector, by the
  route its first batch timed faster (vmap or a loop; printed);
- ``ours forward-over-reverse``: the route for chunks beyond the memory budget (``jvp(grad)``, nothing kept).

per top eigenvalue at about the same accuracy (building the object included)
- ``pyhessian eigenvalues()``: power iteration, ``maxIter=100, tol=1e-5``;
- ``ours lanczos``: ``top_eigenvalues(op, 1, tol=3e-3)`` (a residual bound; with the residual product).
Both eigenvalues, their relative errors against a tight float64 Lanczos reference, the number of
Hessian-vector products each took and its median minor page faults per call (``ru_minflt``: the first write of
fresh memory, which costs about as much as arithmetic on it here) are printed.

    OMP_NUM_THREADS=1 python benchmarks/hessian.py [--repeats 5] [--models lenet,resnet18] [--cpu-time]
"""

from __future__ import annotations

import argparse
import copy
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from _common import MIN_REPEATS, interleaved, medians, one_thread, print_table, ratios, record  # noqa: E402

CASES = {"lenet": ((1, 28, 28), 128), "resnet18": ((3, 16, 16), 8)}
# Stopping rules that give about the same eigenvalue accuracy (relative errors ~1e-5 on LeNet; both are
# printed): PyHessian stops on the relative change between power iterations, ours on the relative residual
# ||H u - theta u|| / |theta|, which bounds the eigenvalue error by ~residual^2 / gap.
PYHESSIAN_TOL = 1e-5
OUR_TOL = 3e-3


def case(name: str):
    import torch

    from landscape.models import build_model

    shape, n = CASES[name]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g)
    torch.manual_seed(0)
    return build_model(name, input_shape=shape, num_classes=10).eval(), x, y


def hvp_methods(model, x, y):
    import torch
    from pyhessian import hessian
    from pyhessian.utils import hessian_vector_product

    from landscape.curvature import HessianOperator

    ref = hessian(copy.deepcopy(model), torch.nn.CrossEntropyLoss(), data=(x, y), cuda=False)
    ours = HessianOperator(model, x, y)
    forward = HessianOperator(model, x, y, retain_bytes=0)
    g = torch.Generator().manual_seed(1)
    v = {k: torch.randn(p.shape, generator=g) for k, p in ours.params.items()}
    batch = {k: torch.randn(4, *p.shape, generator=g) for k, p in ours.params.items()}
    vs = [v[k] for k in ours.names]
    a, b = ours.hvp(v), hessian_vector_product(ref.gradsH, ref.params, vs)
    err = max(float((a[k] - bk).abs().max() / bk.abs().max()) for k, bk in zip(ours.names, b, strict=True))
    return err, ours, {
        "pyhessian hvp": lambda: hessian_vector_product(ref.gradsH, ref.params, vs),
        "ours hvp": lambda: ours.hvp(v),
        "ours hvp x4 (per vector)": lambda: ours.hvp_batch(batch),
        "ours forward-over-reverse": lambda: forward.hvp(v),
    }


def eigen_methods(model, x, y, out: dict, faults: dict):
    """The two top-eigenvalue methods; each stores ``(lambda_1, products)`` in ``out`` and appends its minor page
    faults to ``faults[name]``."""
    import torch
    from pyhessian import hessian
    from pyhessian.utils import hessian_vector_product

    from landscape.curvature import HessianOperator
    from landscape.spectral import top_eigenvalues

    def counting(name, fn):
        def run():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            fn()
            faults.setdefault(name, []).append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return run

    def pyh():
        torch.manual_seed(0)
        ref = hessian(copy.deepcopy(model), torch.nn.CrossEntropyLoss(), data=(x, y), cuda=False)
        calls = [0]

        def counted(*args):  # eigenvalues() calls the module-level function: count its products
            calls[0] += 1
            return hessian_vector_product(*args)

        module = sys.modules["pyhessian.hessian"]
        module.hessian_vector_product = counted
        try:
            values, _ = ref.eigenvalues(maxIter=100, tol=PYHESSIAN_TOL, top_n=1)
        finally:
            module.hessian_vector_product = hessian_vector_product
        out["pyhessian eigenvalues()"] = (values[0], calls[0])

    def ours():
        op = HessianOperator(model, x, y)
        top = top_eigenvalues(op, 1, tol=OUR_TOL)
        out["ours lanczos"] = (float(top.eigenvalues[0]), op.products)

    return {"pyhessian eigenvalues()": counting("pyhessian eigenvalues()", pyh),
            "ours lanczos": counting("ours lanczos", ours)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=MIN_REPEATS)
    ap.add_argument("--models", default=",".join(CASES))
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by the process' CPU clock (time spent descheduled on a shared machine not counted)")
    args = ap.parse_args()
    clock = {"clock": time.process_time} if args.cpu_time else {}
    sys.stdout.reconfigure(line_buffering=True)
    warnings.filterwarnings("ignore")  # PyHessian's backward(create_graph=True) reference-cycle notice
    one_thread()
    try:
        import pyhessian  # noqa: F401
    except ImportError:
        print("PyHessian is not installed (pip install pyhessian); nothing to compare against", file=sys.stderr)
        sys.exit(1)
    import torch

    from landscape.curvature import HessianOperator
    from landscape.spectral import top_eigenvalues

    for name in args.models.split(","):
        model, x, y = case(name)
        shape = "x".join(map(str, CASES[name][0]))
        err, ours, methods = hvp_methods(model, x, y)
        med = medians(interleaved(methods, repeats=args.repeats, warmup=1, budget=60, **clock))
        med["ours hvp x4 (per vector)"] /= 4
        print_table(f"{name}: batch {len(y)}, input {shape}, float32, one thread, seconds per Hessian-vector "
                    f"product (max relative difference ours vs PyHessian {err:.1e})", med, baseline="pyhessian hvp",
                    extra={"ours hvp x4 (per vector)": "vmap" if ours.vectorised else "loop"})
        out: dict = {}
        faults: dict = {}
        eig_times = interleaved(eigen_methods(model, x, y, out, faults), repeats=args.repeats, warmup=0, budget=90,
                                **clock)
        med = medians(eig_times)
        reference = HessianOperator(model, x, y, dtype=torch.float64)
        exact = float(top_eigenvalues(reference, 1, tol=1e-5).eigenvalues[0])
        extra = {k: f"lambda_1 {v:.6g} (rel. err {abs(v - exact) / abs(exact):.1e}), {p} products, "
                    f"{statistics.median(faults[k]):.0f} page faults"
                 for k, (v, p) in out.items()}
        print_table(f"{name}: seconds per top eigenvalue (object built + iterations; reference lambda_1 "
                    f"{exact:.6g}: float64 Lanczos, tol 1e-5)", med, baseline="pyhessian eigenvalues()", extra=extra)
        ours_eig = min((k for k in med if k.startswith("ours")), key=med.get)
        record(f"Hessian top eigenvalue, {name}: speed-up over PyHessian ({ours_eig})",
               samples=ratios(eig_times, "pyhessian eigenvalues()", ours_eig),
               goal=1.33 if name.startswith("resnet") else None)


if __name__ == "__main__":
    main()
