"""GPU variants of the benchmarks: ours against Opacus and plain PyTorch on the same CUDA device.

Run by ``run_all.py`` (``make bench``) only when ``torch.cuda.is_available()``; without a GPU it says so and exits 0.
Every method runs on ``cuda:0`` in float32 with PyTorch's default TF32 settings (the same for all), timed
interleaved (order rotated each round, at least five rounds) with ``torch.cuda.synchronize()`` before each clock
reading, so asynchronous kernels are timed to their end. Peak memory is ``torch.cuda.max_memory_allocated()``
of one call after ``torch.cuda.reset_peak_memory_stats()`` (model and data included, as they sit on the GPU).

- per-sample gradients (opacus-cnn b=256 1x28x28, resnet18/GroupNorm b=64 3x32x32): ``PerSampleEngine.norms`` /
  ``.grads`` vs Opacus' ``GradSampleModule`` (grads + norms);
- one DP-SGD step: ``Privatizer`` + ``SGD.step`` vs Opacus' ``PrivacyEngine`` (hooks and ghost; its fastest is
  the reference) vs a plain PyTorch SGD step;
- 30-point interpolation (LeNet, 2,000 x 1x28x28): ``interpolate(device="cuda")`` vs a plain loop of
  ``torch.lerp`` + forward on the GPU;
- NTK Gram blocks (opacus-cnn, n=256): ``gram_blocks`` vs ``vmap(grad)`` + G G^T (``benchmarks/ntk.py``'s).

    python benchmarks/gpu.py [--repeats 5] [--parts persample,dpsgd,interpolate,ntk]

``--device cpu --small`` runs the same code on the CPU at toy sizes (opacus-cnn only, batch 8, 200 examples):
what the tests do to keep this script working on machines without a GPU; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import copy
import sys
import warnings
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from _common import MIN_REPEATS, interleaved, medians, out_of_place_residuals, ratios, record  # noqa: E402

PARTS = ("persample", "dpsgd", "interpolate", "ntk")
CASES = {"opacus-cnn": ((1, 28, 28), 256), "resnet18": ((3, 32, 32), 64)}
SMALL_CASES = {"opacus-cnn": ((1, 28, 28), 8)}
DEV = "cuda"  # main() may set "cpu" (--device cpu: a check of this script without a GPU)
EXAMPLES = 2000  # interpolation examples (--small: 200)


def _model(name, shape):
    import torch

    from landscape.models import build_model

    torch.manual_seed(0)
    return build_model(name, input_shape=shape, num_classes=10).to(DEV)


def _data(shape, n):
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(n, *shape, generator=g).to(DEV), torch.randint(0, 10, (n,), generator=g).to(DEV)


def peak_mb(fn) -> float:
    """GPU memory high-water mark of one call of ``fn`` (MB), everything already allocated included (NaN on the
    CPU)."""
    import torch

    if DEV == "cpu":
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20


def measure(title: str, methods: dict, repeats: int, baseline: str) -> dict[str, list[float]]:
    import torch

    on_gpu = DEV != "cpu"
    times = interleaved(methods, repeats=repeats, warmup=2, sync=torch.cuda.synchronize if on_gpu else None)
    med = medians(times)
    where = torch.cuda.get_device_name(0) if on_gpu else "CPU check, not a GPU measurement"
    print(f"\n{title} ({where}; median of {len(times[baseline])} interleaved rounds)")
    print(f"  {'method':<26} {'median ms':>10} {'x ' + baseline:>20} {'peak MB':>9}")
    for k, v in med.items():
        print(f"  {k:<26} {v * 1e3:10.2f} {v / med[baseline]:20.2f} {peak_mb(methods[k]):9.0f}")
    return times


def label() -> str:
    """The figures' prefix: ``GPU`` on CUDA; ``CPU check`` for ``--device cpu`` (not a measurement to quote)."""
    return "GPU" if DEV == "cuda" else "CPU check of the GPU benchmark:"


def cases() -> dict:
    return SMALL_CASES if EXAMPLES < 2000 else CASES


def persample(repeats: int) -> None:
    import torch.nn.functional as F
    from opacus import GradSampleModule

    from landscape.persample import PerSampleEngine

    for name, (shape, n) in cases().items():
        x, y = _data(shape, n)
        engine = PerSampleEngine(_model(name, shape))
        gsm = GradSampleModule(out_of_place_residuals(_model(name, shape)), loss_reduction="sum")
        params = [p for p in gsm.parameters() if p.requires_grad]

        def opacus(gsm=gsm, params=params, x=x, y=y, n=n):
            F.cross_entropy(gsm(x), y, reduction="sum").backward()
            norms = torch_stack_norms(params, n)
            gsm.zero_grad(set_to_none=True)
            return norms

        methods = {"ours norms": lambda e=engine, x=x, y=y: e.norms(x, y),
                   "ours grads": lambda e=engine, x=x, y=y: e.grads(x, y), "opacus grads+norms": opacus}
        times = measure(f"{name}: per-sample gradients, batch {n}", methods, repeats, "opacus grads+norms")
        for what in ("norms", "grads"):
            record(f"{label()} per-sample {what}, {name} b={n}: time x Opacus", better="lower", device=DEV,
                   samples=ratios(times, f"ours {what}", "opacus grads+norms"))


def torch_stack_norms(params, n):
    import torch

    return torch.stack([p.grad_sample.reshape(n, -1).norm(dim=1) for p in params], 1).norm(dim=1)


def dpsgd(repeats: int) -> None:
    import torch
    import torch.nn.functional as F
    from opacus import PrivacyEngine
    from torch import nn

    from landscape.train.privatize import PrivacyConfig, Privatizer

    for name, (shape, n) in cases().items():
        x, y = _data(shape, n)
        model = _model(name, shape)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        priv = Privatizer(model, PrivacyConfig(optimizer="dpsgd", max_grad_norm=1.0, noise_multiplier=1.0),
                          expected_batch_size=n, generator=torch.Generator(device=DEV).manual_seed(1))
        plain_model = _model(name, shape)
        plain_opt = torch.optim.SGD(plain_model.parameters(), lr=0.1)

        def ours(priv=priv, opt=opt, x=x, y=y):
            priv.compute_gradients(x, y)
            opt.step()
            opt.zero_grad(set_to_none=True)

        def plain(m=plain_model, opt=plain_opt, x=x, y=y):
            F.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        methods = {"plain SGD (PyTorch)": plain, "ours dpsgd": ours}
        for mode in ("hooks", "ghost"):
            m = out_of_place_residuals(_model(name, shape))
            o = torch.optim.SGD(m.parameters(), lr=0.1)
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=n)
            kwargs = {"criterion": nn.CrossEntropyLoss()} if mode == "ghost" else {}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    made = PrivacyEngine(accountant="rdp").make_private(
                        module=m, optimizer=o, data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
                        poisson_sampling=False, grad_sample_mode=mode, **kwargs)
            except Exception as e:  # noqa: BLE001 - a mode Opacus cannot run is reported, not fatal
                print(f"  opacus {mode}: unavailable ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
                continue
            pm, po = made[0], made[1]
            crit = made[2] if mode == "ghost" else nn.CrossEntropyLoss()

            def step(pm=pm, po=po, crit=crit, x=x, y=y):
                crit(pm(x), y).backward()
                po.step()
                po.zero_grad(set_to_none=True)

            methods[f"opacus {mode}"] = step
        times = measure(f"{name}: one DP-SGD step, batch {n}", methods, repeats, "plain SGD (PyTorch)")
        med = medians(times)
        record(f"{label()} DP-SGD step, {name} b={n}: time x plain PyTorch SGD", better="lower", device=DEV,
               samples=ratios(times, "ours dpsgd", "plain SGD (PyTorch)"))
        peers = [k for k in med if k.startswith("opacus")]
        if peers:
            best = min(peers, key=med.get)
            record(f"{label()} DP-SGD step, {name} b={n}: time x Opacus' fastest ({best})", better="lower", device=DEV,
                   samples=ratios(times, "ours dpsgd", best))


def interpolate(repeats: int) -> None:
    import torch
    import torch.nn.functional as F

    from landscape.analyze.interpolate import interpolate as ours

    shape, points = (1, 28, 28), 30
    a, b = _model("lenet", shape).eval(), copy.deepcopy(_model("lenet", shape))
    torch.manual_seed(1)
    for p in b.parameters():
        p.data.add_(torch.randn_like(p) * 0.1)
    x, y = _data(shape, EXAMPLES)
    xc, yc = x.cpu(), y.cpu()
    sa, sb = {k: v.cpu() for k, v in a.state_dict().items()}, {k: v.cpu() for k, v in b.state_dict().items()}
    cpu_model = copy.deepcopy(a).cpu()

    def landscape_run():
        ours(cpu_model, sa, sb, {"train": (xc, yc)}, split=("train",), points=points, device=DEV)

    def plain_loop():
        model = copy.deepcopy(a)
        params = list(model.parameters())
        pa, pb = [p.detach().clone() for p in a.parameters()], [p.detach().clone() for p in b.parameters()]
        loss = torch.zeros(points, dtype=torch.float64, device=DEV)
        with torch.inference_mode():
            for i, alpha in enumerate(torch.linspace(0, 1, points).tolist()):
                for p, u, v in zip(params, pa, pb, strict=True):
                    torch.lerp(u, v, alpha, out=p)
                loss[i] = F.cross_entropy(model(x), y, reduction="sum")
        return loss.cpu()

    times = measure(f"lenet: 30-point interpolation, {EXAMPLES} examples", {"ours": landscape_run, "plain loop": plain_loop},
                    repeats, "plain loop")
    record(f"{label()} 30-point interpolation, lenet: speed-up over the plain GPU loop", device=DEV,
           samples=ratios(times, "plain loop", "ours"), note="ours includes moving the data to the GPU")


def ntk(repeats: int) -> None:
    import ntk as ntk_bench

    from landscape.gram import gram_blocks

    shape, n = cases()["opacus-cnn"]
    model = _model("opacus-cnn", shape).eval()
    x, y = _data(shape, n)
    methods = {"ours": lambda: gram_blocks(model, x, y), "vmap-grad": lambda: ntk_bench._vmap_grad(model, x, y,
                                                                                                   "loss-grad")}
    times = measure(f"opacus-cnn: per-layer Gram blocks, n={n}", methods, repeats, "vmap-grad")
    record(f"{label()} NTK Gram (loss-grad), opacus-cnn n={n}: speed-up over vmap-grad", device=DEV,
           samples=ratios(times, "vmap-grad", "ours"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=MIN_REPEATS)
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated: " + ", ".join(PARTS))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: run this script's code on the CPU (a check without a GPU; numbers mean nothing)")
    ap.add_argument("--small", action="store_true", help="toy sizes (with --device cpu: the tests' check)")
    args = ap.parse_args(argv)
    import torch

    global DEV, EXAMPLES
    DEV, EXAMPLES = args.device, 200 if args.small else 2000
    if DEV == "cuda" and not torch.cuda.is_available():
        print("no CUDA device (torch.cuda.is_available() is False): the GPU variants are skipped")
        return 0
    sys.stdout.reconfigure(line_buffering=True)
    warnings.filterwarnings("ignore", category=UserWarning)  # Opacus' secure-RNG and backward-hook notices
    torch.set_num_threads(1)
    parts = {"persample": persample, "dpsgd": dpsgd, "interpolate": interpolate, "ntk": ntk}
    for part in args.parts.split(","):
        if part not in parts:
            print(f"unknown part {part!r}; known: {', '.join(PARTS)}", file=sys.stderr)
            return 2
        parts[part](args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
