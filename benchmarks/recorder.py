"""What recording costs a training loop, against a durable ``torch.save`` (goal: <= 2% on a 1 s epoch).

Two parts, each timed interleaved in one process with one torch thread:

- **Per-save cost by size**: one checkpoint of LeNet's weights plus a float32 array padding it to each size,
  written by a durable ``torch.save`` (the file and its directory fsynced: what any writer that survives a power cut
  pays) and by :class:`landscape.Recorder` (a store checkpoint: HDF5, sha256, manifest, atomic renames, fsyncs),
  inline (``save`` returns once it is durable) and with ``writer="thread"`` (what ``save`` keeps the caller: the
  copy to CPU memory; and the time until the thread has made it durable). Printed per size, then fitted as
  ``fixed ms + ms per MiB`` (least squares over the sizes).
- **The goal's loop**: ResNet-18 (the project's own, GroupNorm, CIFAR stem: ~43 MiB of weights) on synthetic
  3x32x32 data, SGD, epochs of ``--steps`` steps of batch ``--batch-size`` (>= 1 s each on one core), a checkpoint
  of the weights per epoch and one at step 0. Methods: no checkpoint; ``torch.save``; durable ``torch.save``; the
  Recorder inline; the Recorder with its thread. The figures: each Recorder loop's time x the durable
  ``torch.save`` loop's (goal <= 1.02), medians of per-round ratios; the ratios to the loop without checkpoints
  are printed beside them.

``--lenet`` adds the earlier loop (LeNet on digits, epochs of ~24 ms, a checkpoint each): reported, not judged.
``--quick`` runs everything at toy size once (what the tests run; not a measurement).

    OMP_NUM_THREADS=1 python benchmarks/recorder.py [--repeats 5] [--epochs 4] [--steps 2] [--batch-size 16]
    python benchmarks/run_all.py recorder -- --lenet      # the record, on an idle machine
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from _common import interleaved, machine_load, medians, one_thread, print_table, ratios, record  # noqa: E402

GOAL = 1.02  # the Recorder's loop, time x the same loop saving with a durable torch.save
COUNTER = itertools.count()  # unique names under the scratch directory
SYNTHETIC = {"name": "synthetic", "input_shape": [3, 32, 32], "note": "benchmark data, not analysable"}


def durable_save(obj, path: Path) -> None:
    """``torch.save``, then fsync of the file and of its directory (its name)."""
    import torch

    torch.save(obj, path)
    for target in (path, path.parent):
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ------------------------------------------------------------------------------------------ per-save cost


def per_save(sizes: list[float], repeats: int, scratch: Path) -> None:
    import torch

    from landscape.data import load_dataset
    from landscape.models import build_model

    data = load_dataset("digits", subset=100)
    model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    weights = sum(v.numel() * v.element_size() for v in model.state_dict().values()) / 2**20
    rows = []
    for size in sizes:
        pad = {"pad": torch.zeros(max(0, int((size - weights) * 2**18)))}
        rows.append((weights + pad["pad"].numel() / 2**18, _one_size(model, data, pad, repeats, scratch)))
    names = ["torch.save + fsync", "Recorder inline: save", "Recorder thread: save", "Recorder thread: durable"]
    print(f"\nper-save cost, median ms of {repeats} (LeNet's weights padded to each size); load {machine_load()}")
    print(f"  {'MiB':>7}  " + "  ".join(f"{n:>24}" for n in names) + "  inline x torch.save")
    for mib, med in rows:
        print(f"  {mib:7.2f}  " + "  ".join(f"{med[n]:24.2f}" for n in names)
              + f"  {med['Recorder inline: save'] / med['torch.save + fsync']:8.2f}")
    mibs = np.array([mib for mib, _ in rows])
    for name in names:
        per_mib, fixed = np.polyfit(mibs, [med[name] for _, med in rows], 1) if len(rows) > 1 else (np.nan, np.nan)
        print(f"  {name}: {fixed:.2f} ms + {per_mib:.2f} ms/MiB")
        if name == "Recorder thread: durable":
            continue  # not the caller's time
        record(f"per-save cost, {name}: ms per MiB (fit over {len(rows)} sizes)", float(per_mib), unit=" ms/MiB",
               better="lower")
        record(f"per-save cost, {name}: fixed ms (fit over {len(rows)} sizes)", float(fixed), unit=" ms",
               better="lower")


def _one_size(model, data, pad: dict, repeats: int, scratch: Path) -> dict[str, float]:
    """Median ms of each way of saving LeNet's weights with ``pad``, interleaved (the warm-up call dropped)."""
    import landscape

    ms: dict[str, list[float]] = {}

    def torch_save():
        path = scratch / f"t-{next(COUNTER)}.pt"
        t = time.perf_counter()
        durable_save({"model": model.state_dict(), **pad}, path)
        ms.setdefault("torch.save + fsync", []).append(1e3 * (time.perf_counter() - t))

    def recorder(writer):
        def go():
            with landscape.Recorder(scratch, f"r-{next(COUNTER)}", model, data=data, writer=writer) as rec:
                rec.save(0, epoch=0, extra=pad)  # the run's first file (h5py's first of the run) not counted
                rec.flush()
                t = time.perf_counter()
                rec.save(1, epoch=1, extra=pad)
                called = time.perf_counter()
                rec.flush()
                done = time.perf_counter()
            ms.setdefault(f"Recorder {writer}: save", []).append(1e3 * (called - t))
            if writer == "thread":
                ms.setdefault("Recorder thread: durable", []).append(1e3 * (done - t))
        return go

    interleaved({"torch": torch_save, "inline": recorder("inline"), "thread": recorder("thread")},
                repeats=repeats, warmup=1, after=lambda _: _empty(scratch))
    return {k: statistics.median(v[1:]) for k, v in ms.items()}


# ------------------------------------------------------------------------------------------ training loops


def loop(how: str, root: Path, *, model_name: str, epochs: int, steps: int, batch_size: int, shape, classes: int,
         data=None) -> None:
    """``epochs`` epochs of ``steps`` SGD steps, a checkpoint of the weights at step 0 and after each epoch."""
    import torch

    import landscape
    from landscape.models import build_model

    torch.manual_seed(0)
    model = build_model(model_name, input_shape=shape, num_classes=classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if data is None:
        x, y = torch.randn(steps * batch_size, *shape), torch.randint(0, classes, (steps * batch_size,))
    else:
        x, y = data.x_train[: steps * batch_size], data.y_train[: steps * batch_size]
    rec = None
    if how.startswith("Recorder"):
        rec = landscape.Recorder(root, "bench", model, data=SYNTHETIC if data is None else data,
                                 writer="thread" if "thread" in how else "inline")
        save = lambda step: rec.save(step, epoch=step / steps)  # noqa: E731
    else:
        root.mkdir()

        def save(step):
            if how == "torch.save":
                torch.save(model.state_dict(), root / f"step-{step}.pt")
            elif how == "torch.save + fsync":
                durable_save(model.state_dict(), root / f"step-{step}.pt")
    save(0)
    for epoch in range(epochs):
        for i in range(steps):
            opt.zero_grad()
            batch = slice(i * batch_size, (i + 1) * batch_size)
            torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step()
        save((epoch + 1) * steps)
    if rec is not None:
        rec.close()  # the last checkpoint durable: part of the loop's time


METHODS = ["no checkpoint", "torch.save", "torch.save + fsync", "Recorder inline", "Recorder thread"]


def loops(label: str, repeats: int, scratch: Path, goal: float | None, **kw) -> None:
    times = interleaved({m: lambda m=m: loop(m, scratch / f"l-{next(COUNTER)}", **kw) for m in METHODS},
                        repeats=repeats, warmup=1, after=lambda _: _empty(scratch))
    med = medians(times)
    epoch = med["no checkpoint"] / kw["epochs"]
    print_table(f"{label}: {kw['epochs']} epochs of {kw['steps']} steps (batch {kw['batch_size']}), a checkpoint per "
                f"epoch; an epoch ~{epoch:.2f} s; load {machine_load()}", med, baseline="torch.save + fsync")
    for m in ("Recorder inline", "Recorder thread"):
        plain = statistics.median(ratios(times, m, "no checkpoint"))
        print(f"  {m}: x the loop without checkpoints {plain:.3f}")
        record(f"{label}, {m}: loop + a checkpoint per epoch, time x the loop saving with a durable torch.save",
               samples=ratios(times, m, "torch.save + fsync"), goal=goal, better="lower",
               note=f"epoch ~{epoch:.2f} s")


def _empty(scratch: Path) -> None:
    """Between two timed calls, untimed: what the last one wrote is removed."""
    for path in scratch.iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2, help="ResNet-18 steps per epoch")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--sizes", type=float, nargs="+", default=[0.1, 4, 16, 45, 100], help="MiB per checkpoint")
    ap.add_argument("--lenet", action="store_true", help="also the LeNet loop of ~24 ms epochs (reported, not judged)")
    ap.add_argument("--quick", action="store_true", help="toy sizes, one round: checks the code runs, measures nothing")
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    one_thread()
    from landscape.data import load_dataset

    scratch = Path(tempfile.mkdtemp(prefix="landscape-bench-recorder-"))
    try:
        if args.quick:
            per_save([0.1, 1.0], 1, scratch)
            digits = load_dataset("digits", subset=100)
            loops("quick check, LeNet (not a measurement)", 1, scratch, None, model_name="lenet", epochs=2, steps=1,
                  batch_size=16, shape=digits.input_shape, classes=digits.num_classes, data=digits)
            return 0
        per_save(args.sizes, args.repeats, scratch)
        loops("ResNet-18 (43 MiB of weights)", args.repeats, scratch, GOAL, model_name="resnet18", epochs=args.epochs,
              steps=args.steps, batch_size=args.batch_size, shape=(3, 32, 32), classes=10)
        if args.lenet:
            digits = load_dataset("digits")
            loops("LeNet on digits (epochs of tens of ms; not judged)", max(args.repeats, 7), scratch, None,
                  model_name="lenet", epochs=10, steps=-(-len(digits.y_train) // 64), batch_size=64,
                  shape=digits.input_shape, classes=digits.num_classes, data=digits)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
