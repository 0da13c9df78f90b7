"""What recording costs a plain training loop that saves a checkpoint per epoch (issue 21's goal: <= 5%).

LeNet on digits, SGD with momentum, one checkpoint per epoch. The baseline is the user's own loop saving its
checkpoints with ``torch.save(model and optimizer state_dict)`` per epoch; the recorded loop is the same loop
with :meth:`landscape.Recorder.save` instead (a store run: HDF5 files with sha256, manifest, lock, fsync),
which writes in a background thread (``background=False``, timed too, writes before ``save`` returns). Each
loop includes opening its store run (recorder) or directory (baseline) and the last write; the methods run
interleaved, one torch thread, and print as ratios of median times. Also printed: the median time one
``save`` call keeps the training thread (the copy; the file is written meanwhile).

    OMP_NUM_THREADS=1 python benchmarks/recorder.py [--epochs 10] [--repeats 7] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from _common import interleaved, machine_load, medians, one_thread, print_table, ratios, record  # noqa: E402

PARTS: dict[str, list[float]] = {}  # seconds of the recorder's fixed costs and of its save calls, per method


def _loop(data, epochs: int, batch_size: int, root: Path, how: str):
    import torch

    import landscape
    from landscape.models import build_model

    torch.manual_seed(0)
    model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x_train, y_train = data.x_train, data.y_train
    n = len(y_train)
    spe = -(-n // batch_size)
    t0 = time.perf_counter()
    if how.startswith("torch.save"):
        root.mkdir()

        def save(step, metrics):
            path = root / f"step-{step}.pt"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, **metrics}, path)
            if how == "torch.save+fsync":  # what durability costs any writer: the file, then its directory entry
                for target in (path, root):
                    fd = os.open(target, os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)
        close = None
    else:
        rec = landscape.Recorder(root, "bench", model, data=data, optimizer=opt, steps_per_epoch=spe,
                                 config={"optimizer": "sgd", "lr": 0.05}, background=how == "recorder")

        def save(step, metrics):
            t = time.perf_counter()
            rec.save(step, metrics=metrics)
            PARTS.setdefault(f"{how} save", []).append(time.perf_counter() - t)
        close = rec.close
    PARTS.setdefault(f"{how} open", []).append(time.perf_counter() - t0)
    save(0, {})
    step = 0
    for epoch in range(epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch))
        total = torch.zeros(())
        for i in range(spe):
            idx = order[i * batch_size:(i + 1) * batch_size]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
            total += loss.detach() * len(idx)
            step += 1
        save(step, {"train_loss": total / n})
    if close is not None:
        t = time.perf_counter()
        close()
        PARTS.setdefault(f"{how} close", []).append(time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    one_thread()
    from landscape.data import load_dataset

    data = load_dataset("digits")
    scratch = Path(tempfile.mkdtemp(prefix="landscape-bench-recorder-"))
    counter = iter(range(10**6))

    def method(how):
        def go():
            root = scratch / f"store-{next(counter)}"
            _loop(data, args.epochs, args.batch_size, root, how)
            shutil.rmtree(root)
        return go

    names = {"torch.save per epoch": "torch.save", "torch.save + fsync": "torch.save+fsync", "Recorder": "recorder",
             "Recorder, background=False": "sync"}
    try:
        times = interleaved({k: method(v) for k, v in names.items()}, repeats=args.repeats, warmup=1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = medians(times)
    base = "torch.save per epoch"
    print_table(f"LeNet on digits ({len(data.y_train)} examples), {args.epochs} epochs, batch {args.batch_size}, a "
                f"checkpoint per epoch; load {machine_load()} (a shared machine: read the per-round spread)", med,
                baseline=base)
    ms = {k: 1e3 * statistics.median(v) for k, v in PARTS.items()}
    print(f"  an epoch takes ~{1e3 * med[base] / (args.epochs + 1):.0f} ms; Recorder (median ms): opening the run "
          f"{ms['recorder open']:.1f} (fork of the writer, run created), a save call {ms['recorder save']:.2f}, "
          f"close {ms['recorder close']:.1f} (the last checkpoint made durable)")
    fixed = ratios({"r": [t - 1e-3 * (ms["recorder open"] + ms["recorder close"]) for t in times["Recorder"]],
                    "b": times[base]}, "r", "b")
    print(f"  Recorder without its fixed open + close cost: {statistics.median(fixed):.3f}x (the cost per epoch)")
    record("Recorder: loop + a checkpoint per epoch, time x the loop saving with torch.save",
           samples=ratios(times, "Recorder", base), goal=1.05, better="lower")


if __name__ == "__main__":
    main()
