"""What recording costs a training loop: landscape.Recorder against the same loop without checkpoints and with a
durable torch.save.

Goal: on a training loop whose epoch takes at least a second, with a ResNet-18-sized checkpoint (landscape's
``resnet18``, GroupNorm, CIFAR shape: 42.6 MiB of float32 weights; plain SGD, so no optimizer tensors), on the CPU
with synthetic data and a checkpoint per epoch (and one at step 0), the loop recording with the Recorder takes at
most 1.02x the same loop saving nothing, inline (the default: each save written and fsynced before it returns)
and with ``writer="thread"`` (the state copied on the training thread, written by one worker thread). Beside it,
the same loop saving with a durable ``torch.save`` (the file and its directory fsynced). Loops run interleaved,
each timed whole (opening the run, the epochs, close).

Per save, by size (LeNet's weights plus a float32 extra array): the median time of one durable ``torch.save``, of
one inline ``Recorder.save`` (HDF5, sha256, manifest, atomic renames, fsyncs), and of the call of a thread
recorder's ``save`` (what the training thread waits for: the copy), and a least-squares line through each
method's medians, printed as ms + ms/MiB. The LeNet-on-digits loop of the earlier goal (epochs of ~25 ms) is
measured too and reported, not judged: its epochs are shorter than any real one.

    OMP_NUM_THREADS=1 python benchmarks/recorder.py [--repeats 5] [--epochs 4] [--epoch-seconds 2]
    python benchmarks/recorder.py --quick        # seconds, toy sizes: what the tests run
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from _common import interleaved, machine_load, medians, one_thread, print_table, ratios, record  # noqa: E402

LOOPS = {"no checkpoint": "none", "torch.save + fsync": "torch.save", "Recorder, inline": "inline",
         "Recorder, thread": "thread"}


def durable_save(obj, path: Path) -> None:
    """torch.save, then fsync of the file and of its directory: a checkpoint that survives a power cut."""
    import torch

    torch.save(obj, path)
    for target in (path, path.parent):
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Loop:
    """A training loop on synthetic data, saving a checkpoint per epoch by one of :data:`LOOPS`' methods."""

    def __init__(self, model_name: str, input_shape, batch: int, steps: int, epochs: int, scratch: Path) -> None:
        import torch

        from landscape.data import load_dataset
        from landscape.models import build_model

        torch.manual_seed(0)
        self.data = load_dataset("digits", subset=100)  # the run's data spec (the loop trains on synthetic data)
        self.model = build_model(model_name, input_shape=input_shape, num_classes=10)
        self.init = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.x, self.y = torch.randn(batch, *input_shape), torch.randint(0, 10, (batch,))
        self.steps, self.epochs, self.scratch = steps, epochs, scratch
        self.mib = sum(v.numel() * v.element_size() for v in self.init.values()) / 2**20

    def step_seconds(self, n: int = 3) -> float:
        """Median seconds of one training step (after one untimed)."""
        import torch

        opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        times = []
        for i in range(n + 1):
            t = time.perf_counter()
            self._step(opt)
            if i:
                times.append(time.perf_counter() - t)
        self.model.load_state_dict(self.init)
        return statistics.median(times)

    def _step(self, opt) -> None:
        import torch

        opt.zero_grad()
        torch.nn.functional.cross_entropy(self.model(self.x), self.y).backward()
        opt.step()

    def run(self, how: str) -> None:
        import torch

        import landscape

        self.model.load_state_dict(self.init)
        root = self.scratch / "loop"
        opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        rec = None
        if how in ("inline", "thread"):
            rec = landscape.Recorder(root, "bench", self.model, data=self.data, optimizer=opt, writer=how,
                                     steps_per_epoch=self.steps, config={"optimizer": "sgd", "lr": 1e-3})
        elif how == "torch.save":
            root.mkdir()

        def save(step: int) -> None:
            if rec is not None:
                rec.save(step)
            elif how == "torch.save":
                durable_save({"model": self.model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                             root / f"step-{step}.pt")

        save(0)
        for epoch in range(self.epochs):
            for _ in range(self.steps):
                self._step(opt)
            save((epoch + 1) * self.steps)
        if rec is not None:
            rec.close()

    def clean(self, _name: str = "") -> None:
        shutil.rmtree(self.scratch / "loop", ignore_errors=True)


def loops(loop: Loop, repeats: int, label: str, goal: float | None) -> None:
    """Every method of :data:`LOOPS` interleaved; the figures against the loop without checkpoints."""
    times = interleaved({name: (lambda how=how: loop.run(how)) for name, how in LOOPS.items()}, repeats=repeats,
                        warmup=1, after=loop.clean)
    med = medians(times)
    epoch = med["no checkpoint"] / loop.epochs
    print_table(f"{label}: {loop.epochs} epochs of {loop.steps} steps (~{epoch:.2f} s each), a {loop.mib:.1f} MiB "
                f"checkpoint per epoch and at step 0; load {machine_load()}", med, baseline="no checkpoint")
    for name in ("Recorder, inline", "Recorder, thread", "torch.save + fsync"):
        record(f"{label}, {name}: time x the loop without checkpoints", samples=ratios(times, name, "no checkpoint"),
               goal=goal if name.startswith("Recorder") else None, better="lower",
               note=f"epochs of ~{epoch:.2f} s, a {loop.mib:.1f} MiB checkpoint per epoch")
    for name in ("Recorder, inline", "Recorder, thread"):
        record(f"{label}, {name}: time x the loop saving with a durable torch.save",
               samples=ratios(times, name, "torch.save + fsync"), better="lower")


def saves(sizes: list[float], repeats: int, scratch: Path) -> None:
    """Per checkpoint size, median ms of a durable torch.save, an inline Recorder.save, a thread recorder's save
    call (and its save + flush), and a line ms + ms/MiB through each method's medians."""
    import numpy as np
    import torch

    import landscape
    from landscape.data import load_dataset
    from landscape.models import build_model

    data = load_dataset("digits", subset=100)
    model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    weights = sum(v.numel() * v.element_size() for v in model.state_dict().values()) / 2**20
    methods = ("torch.save + fsync", "Recorder, inline", "Recorder, thread: the call", "Recorder, thread: + flush")
    rows = []
    for size in sizes:
        pad = {"pad": torch.zeros(max(0, round((size - weights) * 2**18)))}
        mib = weights + pad["pad"].numel() / 2**18
        ms: dict[str, list[float]] = {m: [] for m in methods}
        recs = {w: landscape.Recorder(scratch / "saves", w, model, data=data, writer=w) for w in ("inline", "thread")}
        (scratch / "pt").mkdir()
        try:
            for step in range(repeats + 1):  # the first of each is untimed (a run's first file)
                t = time.perf_counter()
                durable_save({"model": model.state_dict(), **pad}, scratch / "pt" / f"step-{step}.pt")
                t1 = time.perf_counter()
                recs["inline"].save(step, epoch=step, extra=pad)
                t2 = time.perf_counter()
                recs["thread"].save(step, epoch=step, extra=pad)
                t3 = time.perf_counter()
                recs["thread"].flush()
                t4 = time.perf_counter()
                if step:
                    for name, seconds in zip(methods, (t1 - t, t2 - t1, t3 - t2, t4 - t2), strict=True):
                        ms[name].append(1e3 * seconds)
        finally:
            for rec in recs.values():
                rec.close()
            shutil.rmtree(scratch / "saves", ignore_errors=True)
            shutil.rmtree(scratch / "pt", ignore_errors=True)
        rows.append((mib, {m: statistics.median(v) for m, v in ms.items()}, ms))
    print(f"\none save by checkpoint size, median ms of {repeats}; load {machine_load()}")
    print(f"  {'MiB':>7}  " + "  ".join(f"{m:>26}" for m in methods))
    for mib, med, _ in rows:
        print(f"  {mib:7.2f}  " + "  ".join(f"{med[m]:26.2f}" for m in methods))
    sizes_mib = np.array([mib for mib, _, _ in rows])
    for m in methods:
        if len(rows) >= 2:
            slope, intercept = np.polyfit(sizes_mib, [med[m] for _, med, _ in rows], 1)
            print(f"  {m}: {intercept:.2f} ms + {slope:.3f} ms/MiB")
    mib, _, largest = rows[-1]
    for m in methods[1:]:
        record(f"one save of {mib:.1f} MiB, {m}: time x a durable torch.save",
               samples=[a / b for a, b in zip(largest[m], largest["torch.save + fsync"], strict=True)],
               better="lower")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--epoch-seconds", type=float, default=2.0,
                    help="the ResNet-18 loop's epoch: as many steps as take at least this long")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--sizes", type=float, nargs="+", default=[0.1, 1, 4, 16, 42.6], help="checkpoint MiB")
    ap.add_argument("--quick", action="store_true",
                    help="seconds: toy sizes, LeNet in place of ResNet-18, 2 rounds (not a goal measurement)")
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    one_thread()
    scratch = Path(tempfile.mkdtemp(prefix="landscape-bench-recorder-"))
    try:
        if args.quick:
            saves([0.1, 1.0], 2, scratch)
            loop = Loop("lenet", (1, 8, 8), 16, 2, 2, scratch)
            loops(loop, 2, "LeNet (quick)", None)
            return 0
        saves(args.sizes, args.repeats, scratch)
        loop = Loop("resnet18", (3, 32, 32), args.batch, 1, args.epochs, scratch)
        loop.steps = max(1, math.ceil(args.epoch_seconds / loop.step_seconds()))
        loops(loop, args.repeats, "ResNet-18", 1.02)
        lenet = Loop("lenet", (1, 8, 8), 64, 22, 10, scratch)  # the earlier goal's loop: digits-sized epochs
        loops(lenet, args.repeats, "LeNet, epochs of digits' size (reported, not judged)", None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
