"""What recording costs a plain training loop that saves a checkpoint per epoch (issue 21's goal: <= 5%).

LeNet on digits (1348 examples, batch 64: 22 steps, ~30-70 ms an epoch here), SGD with momentum, 10 epochs, one
checkpoint per epoch (and one at step 0). Methods, run interleaved in one process (one torch thread), each loop
timed whole: opening its store run or directory, the epochs, the last write:

- ``torch.save per epoch`` (the baseline the goal names): ``torch.save(model and optimizer state_dict)``. It is
  not durable: the file may still be in the page cache when the loop ends (a power cut loses it), and a process
  killed mid-save leaves a torn file under the final name.
- ``torch.save + fsync``: the same made durable (fsync of the file and of its directory), for reference: what
  durability alone costs any writer on this disk.
- ``Recorder``: :class:`landscape.Recorder` (a store run: HDF5, sha256, manifest, run lock, atomic renames, 4
  fsyncs per checkpoint), written by its writer process (a fork of the training process) while training goes on.
- ``Recorder, background=False``: each ``save`` waits until its checkpoint is durable.
- ``store writes in a thread``: the recorder's earlier design (the same store calls in a thread of the training
  process), kept here for comparison.

Printed: median seconds and ratios; the recorder's fixed costs (opening the run: the fork of its writer, the run
being created by the writer while training starts; close: the last checkpoint made durable) and the median time
a ``save`` call keeps the training thread (torch.save's too); the CPU time of the training process (all its
threads; the writer process not counted); the goal figure, the median of per-round ratios with their spread;
then, as a second figure that is not the goal's loop, torch.save against the Recorder over ``--long-epochs``
epochs (the same fixed costs spread over a longer run).

Where the time goes (profiled, 25 Nov 2026, 2-core machine at load ~0.3-1; the numbers are in
docs/own-code.md and the records under benchmarks/results/). The save calls cost less than torch.save's; what
is left is fixed and comes from the writer being a fork of a process with torch loaded (~370 MB anonymous
memory): the fork (~10-13 ms of page tables), the training process' copy-on-write faults while the writer
lives (~1.2k pages, ~10 ms CPU over the loop, measured against an idle forked child), and close waiting for
the last checkpoint to be durable (~5-7 ms: HDF5 ~3.5 ms, the manifest ~1 ms, fsyncs). Removed since the
record of commit 34281b0 (1.12x): the constructor waiting ~10 ms for the writer to create the run (mostly
the child's own copy-on-write faults right after the fork; now overlapped with the first epoch),
``threading.Thread.start`` of the reaper at close (3-15 ms waiting for the thread to run; now a bare
``_thread`` start), and per-tensor finiteness checks in ``save``. A writer that is not a fork (spawned) would
have none of these costs but takes ~0.1 s to import its modules, which the first checkpoints (at most one in
flight) would wait for: worse at this size.

    OMP_NUM_THREADS=1 python benchmarks/recorder.py [--epochs 10] [--repeats 7] [--batch-size 64] [--long-epochs 50]
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


class _ThreadWriter:
    """The design the recorder had before its writer process, for comparison: the same store calls from a thread of
    the training process (weights and optimizer state copied to CPU, at most one checkpoint in flight)."""

    def __init__(self, root: Path, model, opt, data, spe: int) -> None:
        from landscape.store import Store

        self.model, self.opt, self.spe = model, opt, spe
        self.run = Store(root).create_run("bench", config={"optimizer": "sgd", "lr": 0.05}, seeds={},
                                          model_spec=dict(model.landscape_spec), data_spec=dict(data.spec))
        self.thread = None

    def save(self, step, metrics) -> None:
        import threading

        import torch

        self.close(release=False)
        state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        extra = {"optimizer": {f"{i}/{k}": v.detach().to("cpu", copy=True)
                               for i, entry in self.opt.state_dict()["state"].items() for k, v in entry.items()
                               if torch.is_tensor(v)}}
        numbers = {k: float(v) for k, v in metrics.items()}
        self.thread = threading.Thread(target=self.run.save_checkpoint, args=(state,), daemon=True,
                                       kwargs=dict(step=step, epoch=step / self.spe, metrics=numbers, extra=extra))
        self.thread.start()

    def close(self, release: bool = True) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if release:
            self.run.close()


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

        def write(step, metrics):
            path = root / f"step-{step}.pt"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, **metrics}, path)
            if how == "torch.save+fsync":  # what durability costs any writer: the file, then its directory entry
                for target in (path, root):
                    fd = os.open(target, os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)
        close = None
    elif how == "thread":
        rec = _ThreadWriter(root, model, opt, data, spe)
        write, close = rec.save, rec.close
    else:
        rec = landscape.Recorder(root, "bench", model, data=data, optimizer=opt, steps_per_epoch=spe,
                                 config={"optimizer": "sgd", "lr": 0.05}, background=how == "recorder")

        def write(step, metrics):
            rec.save(step, metrics=metrics)
        close = rec.close
    PARTS.setdefault(f"{how} open", []).append(time.perf_counter() - t0)

    def save(step, metrics):
        t = time.perf_counter()
        write(step, metrics)
        PARTS.setdefault(f"{how} save", []).append(time.perf_counter() - t)

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
    ap.add_argument("--long-epochs", type=int, default=50,
                    help="also time torch.save vs Recorder over this many epochs (0: not)")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    one_thread()
    from landscape.data import load_dataset

    data = load_dataset("digits")
    scratch = Path(tempfile.mkdtemp(prefix="landscape-bench-recorder-"))
    counter = iter(range(10**6))

    cpu: dict[str, list[float]] = {}

    def method(how):
        def go():
            root = scratch / f"store-{next(counter)}"
            t = time.process_time()
            _loop(data, args.epochs, args.batch_size, root, how)
            cpu.setdefault(how, []).append(time.process_time() - t)  # this process' CPU (all its threads)
            shutil.rmtree(root)
        return go

    names = {"torch.save per epoch": "torch.save", "torch.save + fsync": "torch.save+fsync", "Recorder": "recorder",
             "Recorder, background=False": "sync", "store writes in a thread": "thread"}
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
          f"{ms['recorder open']:.1f} (the fork of its writer; a new run is created while training starts), a save "
          f"call {ms['recorder save']:.2f} (torch.save {ms['torch.save save']:.2f}), close "
          f"{ms['recorder close']:.1f} (the last checkpoint made durable)")
    cpu = {k: v[1:] for k, v in cpu.items()}  # the warm-up round is not timed
    base_cpu = statistics.median(cpu["torch.save"])
    print("  CPU time of the training process (all its threads; the writer process not counted), x torch.save: "
          + ", ".join(f"{k} {statistics.median(cpu[v]) / base_cpu:.3f}" for k, v in names.items()))
    record("Recorder: CPU time of the training process x the loop saving with torch.save",
           samples=[a / b for a, b in zip(cpu["recorder"], cpu["torch.save"], strict=True)],
           better="lower")
    record("Recorder: loop + a checkpoint per epoch, time x the loop saving with torch.save",
           samples=ratios(times, "Recorder", base), goal=1.05, better="lower")
    if args.long_epochs:
        _longer(data, args, scratch)


def _longer(data, args, scratch: Path) -> None:
    """The same loop over ``--long-epochs`` epochs, torch.save against the Recorder only: the recorder's fixed
    costs (its fork, the last checkpoint made durable at close) spread over a longer run; not the goal figure."""
    counter = iter(range(10**6))

    def method(how):
        def go():
            root = scratch / f"long-{next(counter)}"
            _loop(data, args.long_epochs, args.batch_size, root, how)
            shutil.rmtree(root)
        return go

    names = {"torch.save per epoch": "torch.save", "Recorder": "recorder"}
    scratch.mkdir(exist_ok=True)
    try:
        times = interleaved({k: method(v) for k, v in names.items()}, repeats=args.repeats, warmup=1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(f"the same, {args.long_epochs} epochs; load {machine_load()}", medians(times),
                baseline="torch.save per epoch")
    record(f"Recorder, {args.long_epochs} epochs (fixed costs spread over a longer loop; not the goal's loop): "
           "time x the loop saving with torch.save", samples=ratios(times, "Recorder", "torch.save per epoch"),
           better="lower")


if __name__ == "__main__":
    main()
