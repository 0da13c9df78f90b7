"""A user-code copy of a built-in model runs as fast as the built-in (goal: ratio <= 1.05).

LeNet-5 on random 1x28x28 inputs, four ways with the same weights: the built-in ``lenet``, the same layers from
a user file (``benchmarks/user_lenet.py:sequential``, built through ``--model file.py:factory``'s path), a
hand-written ``nn.Module`` with a functional ``forward`` (``F.relu``, ``F.max_pool2d``: ``user_lenet.py:module``)
and the same with its pooling as one ``nn.MaxPool2d`` module called twice (``user_lenet.py:module_pools``). For
each, interleaved in one process with one thread:

* ``interpolate``: ``landscape.analyze.interpolate.interpolate`` (``--points`` points, train split);
* ``norms``: ``PerSampleEngine.norms`` (per-sample gradient norms of a batch).

The numbers of all must agree (checked before timing); each figure is the median of the per-round user/built-in
time ratios, with its spread. The evaluator traces a functional ``forward`` into the built-in's modules
(``torch.fx``; method ``...+graph``), so its pooling, ReLU/pool order and first-layer fold are the built-in's;
the per-sample engine's ``landscape.pooling.exact_fast_pooling`` routes its ``F.max_pool2d`` calls to the fast
kernel.

Run: ``OMP_NUM_THREADS=1 python benchmarks/user_model.py [--n 2000] [--batch 256] [--points 30] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from _common import interleaved, medians, one_thread, print_table, ratios, record  # noqa: E402


def models():
    import torch

    from landscape.models import build_model

    torch.manual_seed(0)
    builtin = build_model("lenet", input_shape=(1, 28, 28), num_classes=10)
    same = build_model(f"{HERE / 'user_lenet.py'}:sequential", input_shape=(1, 28, 28), num_classes=10)
    same.load_state_dict(builtin.state_dict())
    module = build_model(f"{HERE / 'user_lenet.py'}:module", input_shape=(1, 28, 28), num_classes=10)
    from user_lenet import as_module_state

    module.load_state_dict(as_module_state(builtin.state_dict()))
    pools = build_model(f"{HERE / 'user_lenet.py'}:module_pools", input_shape=(1, 28, 28), num_classes=10)
    pools.load_state_dict(as_module_state(builtin.state_dict()))
    return {"built-in": builtin, "user same layers": same, "user nn.Module": module,
            "user nn.Module, pool modules": pools}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="examples of the interpolation")
    parser.add_argument("--batch", type=int, default=256, help="examples of the per-sample norms")
    parser.add_argument("--points", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    one_thread()
    import torch

    from landscape.analyze.interpolate import interpolate
    from landscape.persample import PerSampleEngine

    nets = models()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(args.n, 1, 28, 28, generator=g), torch.randint(0, 10, (args.n,), generator=g)
    xb, yb = x[: args.batch], y[: args.batch]
    ends = {}
    for name, net in nets.items():
        a = {k: v.clone() for k, v in net.state_dict().items()}
        b = {k: v + 0.05 * torch.randn(v.shape, generator=torch.Generator().manual_seed(2)) for k, v in a.items()}
        ends[name] = (a, b)

    def interp(name):
        return lambda: interpolate(nets[name], *ends[name], {"train": (x, y)}, points=args.points,
                                   split=("train",))

    def norms(name):
        engine = PerSampleEngine(nets[name])
        return lambda: engine.norms(xb, yb)

    reference = interp("built-in")().loss["train"]
    ref_norms = norms("built-in")().flat
    for name in nets:
        loss = interp(name)().loss["train"]
        flat = norms(name)().flat
        assert torch.allclose(torch.as_tensor(loss), torch.as_tensor(reference), rtol=1e-5, atol=1e-6), name
        assert torch.allclose(torch.as_tensor(flat), torch.as_tensor(ref_norms), rtol=1e-4, atol=1e-6), name
    for what, make in (("interpolate", interp), ("norms", norms)):
        methods = {name: make(name) for name in nets}
        times = interleaved(methods, repeats=args.repeats)
        print_table(f"{what}: LeNet-5, 1x28x28 ({args.n if what == 'interpolate' else args.batch} examples)",
                    medians(times), baseline="built-in")
        for name in list(methods)[1:]:
            record(f"user-code LeNet ({name}) / built-in, {what}", samples=ratios(times, name, "built-in"),
                   goal=1.05, better="lower")


if __name__ == "__main__":
    main()
