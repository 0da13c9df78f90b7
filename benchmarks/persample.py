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

``transformer`` (batch 64, 32 tokens; not a built-in: token embeddings, learned positions and a
self-attention layer written as custom modules with their own parameters, LayerNorm, GELU MLP) measures the
route for layers without a handler against Opacus' functorch mode
(``GradSampleModule(model, force_functorch=True)``, what ``grad_sample_mode="functorch"`` builds: every
layer re-run under ``vmap(grad)``), on one model object for all methods. (Opacus cannot run
``nn.MultiheadAttention`` in either mode: its ``out_proj`` is used without being called, "No activations
detected"; hence the custom attention module, which both take as a module without grad sampler.)

- ``ours auto grads`` / ``ours auto norms``: the engine's default, the mixed route (Linear, LayerNorm,
  Embedding by their handlers; attention and positions by per-module ``torch.func`` units);
- ``ours functorch grads``: the whole-model ``torch.func`` route (``strategy="functorch"``);
- ``opacus functorch grads+norms`` and ``opacus hooks grads+norms`` (Opacus' default: its grad samplers,
  functorch for the custom modules).

    OMP_NUM_THREADS=1 python benchmarks/persample.py [--repeats 5] [--models opacus-cnn,resnet18,transformer] [--memory]

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

TRANSFORMER = {"tokens": 32, "batch": 64, "vocab": 100}


def token_transformer(d: int = 64, heads: int = 4, blocks: int = 2, t: int = 32, classes: int = 10):
    """A small transformer classifier over tokens whose attention and positions have no handler (custom
    modules with their own parameters), built from plain operations so that ``vmap`` has a rule for each."""
    import math

    import torch
    import torch.nn.functional as F
    from torch import nn

    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Parameter(0.02 * torch.randn(t, d))

        def forward(self, h):
            return h + self.pos

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Parameter(torch.randn(3 * d, d) / math.sqrt(d))
            self.qkv_bias = nn.Parameter(torch.zeros(3 * d))
            self.proj = nn.Parameter(torch.randn(d, d) / math.sqrt(d))
            self.proj_bias = nn.Parameter(torch.zeros(d))

        def forward(self, h):
            n, s, _ = h.shape
            q, k, v = F.linear(h, self.qkv, self.qkv_bias).reshape(n, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // heads), dim=-1) @ v
            return F.linear(a.transpose(1, 2).reshape(n, s, d), self.proj, self.proj_bias)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), SelfAttention(), nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

        def forward(self, h):
            h = h + self.attn(self.ln1(h))
            return h + self.mlp(self.ln2(h))

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.pos = nn.Embedding(TRANSFORMER["vocab"], d), Positions()
            self.blocks = nn.Sequential(*[Block() for _ in range(blocks)])
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

        def forward(self, tok):
            return self.head(self.ln(self.blocks(self.pos(self.emb(tok)))).mean(1))

    return Classifier()


def transformer_methods():
    """The methods on the token transformer (see the module docstring); one model object for all."""
    import copy

    import torch
    from opacus import GradSampleModule

    from landscape.persample import PerSampleEngine

    t, n, vocab = TRANSFORMER["tokens"], TRANSFORMER["batch"], TRANSFORMER["vocab"]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, vocab, (n, t), generator=g), torch.randint(0, 10, (n,), generator=g)
    torch.manual_seed(0)
    model = token_transformer(t=t)
    auto, func = PerSampleEngine(model), PerSampleEngine(model, strategy="functorch")
    auto.norms(x[:2], y[:2])
    assert auto.strategy == "mixed", auto.strategy

    def opacus(force_functorch: bool):
        """Opacus on its own copy of the model (the same weights): hooks are attached once, outside the timing."""
        return opacus_step(GradSampleModule(copy.deepcopy(model), loss_reduction="sum", force_functorch=force_functorch),
                           x, y)

    return n, {
        "ours auto norms": lambda: auto.norms(x, y),
        "ours auto grads": lambda: auto.grads(x, y),
        "ours functorch grads": lambda: func.grads(x, y),
        "opacus functorch grads+norms": opacus(True),
        "opacus hooks grads+norms": opacus(False),
    }


def opacus_step(gsm, x, y):
    """A call of Opacus' GradSampleModule ``gsm``: forward + backward filling ``p.grad_sample``, then the
    per-sample norms (what our norms give), then the gradients dropped."""
    import torch
    import torch.nn.functional as F

    params = [p for p in gsm.parameters() if p.requires_grad]

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            F.cross_entropy(gsm(x), y, reduction="sum").backward()
        norms = torch.stack([p.grad_sample.reshape(len(y), -1).norm(dim=1) for p in params], 1).norm(dim=1)
        gsm.zero_grad(set_to_none=True)
        return norms

    return run


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
    opacus = opacus_step(GradSampleModule(opacus_model, loss_reduction="sum"), x, y)

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


def report_transformer(n: int, times: dict[str, list[float]]) -> None:
    """The transformer case's table and figures: per-round ratios to Opacus' functorch mode (with their spread)."""
    med = medians(times)
    peer = "opacus functorch grads+norms"
    base = med[peer]
    print(f"\ntransformer: batch {n}, {TRANSFORMER['tokens']} tokens, per-sample gradients (one thread, interleaved, medians)")
    print(f"  {'method':<30} {'median s':>10} {'samples/s':>10} {'x Opacus functorch':>19}")
    for k, v in med.items():
        print(f"  {k:<30} {v:10.4f} {n / v:10.1f} {v / base:19.2f}")
    record(f"per-sample grads, transformer b={n}, layers without handler: time x Opacus functorch",
           samples=ratios(times, "ours auto grads", peer), goal=1.5, better="lower")
    record(f"per-sample grads, transformer b={n}, whole-model torch.func: time x Opacus functorch",
           samples=ratios(times, "ours functorch grads", peer), better="lower")


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
    ap.add_argument("--models", default=",".join([*CASES, "transformer"]))
    ap.add_argument("--memory", action="store_true", help="peak memory of each method, one process each")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    warnings.filterwarnings("ignore", category=UserWarning)  # Opacus' secure-RNG and backward-hook notices
    one_thread()
    for name in args.models.split(","):
        if name == "transformer":
            n, methods = transformer_methods()
            report_transformer(n, interleaved(methods, repeats=args.repeats, warmup=1, budget=120))
            continue
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
