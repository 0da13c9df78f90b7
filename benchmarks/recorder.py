"""What recording costs a plain training loop: LeNet on digits, one checkpoint per epoch (issue 21's goal <= 5%).

Two loops, identical but for the Recorder: the same model, data order, SGD with momentum and per-epoch
evaluation of the training loss; ``recorded`` also writes a checkpoint (weights + optimizer state) after each
epoch through :class:`landscape.Recorder` into a fresh store (atomic HDF5 write, sha256, manifest). Both are
run interleaved, one thread, and printed as the ratio of median times.

    OMP_NUM_THREADS=1 python benchmarks/recorder.py [--epochs 5] [--repeats 5] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from _common import interleaved, machine_load, medians, one_thread, print_table, record  # noqa: E402


def _loop(data, epochs: int, batch_size: int, root: Path | None):
    import torch

    import landscape
    from landscape.models import build_model

    torch.manual_seed(0)
    model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x_train, y_train = data.x_train, data.y_train
    n = len(y_train)
    spe = -(-n // batch_size)
    recorder = None
    if root is not None:
        recorder = landscape.Recorder(root, "bench", model, data=data, optimizer=opt, steps_per_epoch=spe,
                                      config={"optimizer": "sgd", "lr": 0.05})
        recorder.save(0)
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
        if recorder is not None:
            recorder.save(step, metrics={"train_loss": total / n})
    if recorder is not None:
        recorder.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--subset", type=float, default=None, help="Fraction of digits' training split (default all).")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    one_thread()
    from landscape.data import load_dataset

    data = load_dataset("digits", subset=args.subset)
    scratch = Path(tempfile.mkdtemp(prefix="landscape-bench-recorder-"))
    counter = iter(range(10**6))

    def recorded():
        root = scratch / f"store-{next(counter)}"
        _loop(data, args.epochs, args.batch_size, root)
        shutil.rmtree(root)

    try:
        med = medians(interleaved({"plain loop": lambda: _loop(data, args.epochs, args.batch_size, None),
                                   "recorded": recorded}, repeats=args.repeats, warmup=1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(f"LeNet on digits ({len(data.y_train)} examples), {args.epochs} epochs, batch {args.batch_size}, "
                f"a checkpoint per epoch; load {machine_load()}", med, baseline="plain loop")
    record("Recorder: plain loop + a checkpoint per epoch, time x plain loop", med["recorded"] / med["plain loop"],
           goal=1.05, better="lower")


if __name__ == "__main__":
    main()
