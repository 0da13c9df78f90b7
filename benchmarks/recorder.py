"""What recording costs a plain training loop that saves a checkpoint per epoch (issue 21's goal: <= 5%).

LeNet on digits (1348 examples, batch 64: 22 steps, ~30-70 ms an epoch here), SGD with momentum, 10 epochs, one
checkpoint per epoch (and one at step 0). Methods, run interleaved in one process (one torch thread), each loop
timed whole: opening its store run or directory, the epochs, the last write. Between two loops, untimed, the last
one's directory is removed and its writer process (if any) has exited (:func:`_settle`): otherwise each method was
timed beside its predecessor's leftovers, and the rotating order gives every method the same predecessor in
almost every round (the same writer measured 5% slower after one method than after another). Methods:

- ``torch.save per epoch`` (the baseline the goal names): ``torch.save(model and optimizer state_dict)``. It is
  not durable: the file may still be in the page cache when the loop ends (a power cut loses it), and a process
  killed mid-save leaves a torn file under the final name.
- ``torch.save + fsync``: the same made durable (fsync of the file and of its directory), for reference: what
  durability alone costs any writer on this disk.
- ``Recorder``: :class:`landscape.Recorder` as it comes (``writer="auto"``; a store run: HDF5, sha256, manifest,
  run lock, atomic renames, 4 fsyncs per checkpoint): the goal figure. One torch thread on a machine of two or
  more cores leaves a core free, so it chooses its writer process.
- ``Recorder, writer='process'`` and ``Recorder, writer='inline'``: each writer forced, each with its own figure
  (what the default did not choose is not hidden): the writer process (a fresh interpreter started with
  ``posix_spawn``, importing the store but not torch) writing while training goes on, and the training process
  writing each checkpoint before ``save`` returns.
- ``Recorder, writer='process', background=False``: each ``save`` waits until its checkpoint is durable.
- ``store writes in a thread``: the same store calls in a thread of the training process, for comparison
  (what a writer thread costs a CPU-bound loop through the GIL).

Printed: median seconds and ratios; per writer, its fixed costs (opening the run: starting the writer process,
or the run created inline; close: the checkpoints in flight made durable) and the median time a ``save`` call
keeps the training thread (torch.save's too); the CPU time of the training process (all its threads; a writer
process not counted); the figures, medians of per-round ratios with their spread; then, as further figures that
are not the goal's loop, torch.save against each Recorder over ``--long-epochs`` epochs. ``--sizes`` instead
measures an inline save and the writer process' fixed costs by checkpoint size (:func:`_sizes`).

Where the time goes (docs/own-code.md has the numbers, benchmarks/results/ the records). Inline, every
checkpoint costs the training loop its whole write (HDF5, sha256, manifest, four fsyncs; growing with the
checkpoint's size). The writer process takes the write off the training process: what is left there is
starting it (one ``posix_spawn``, independent of the training process' size), a copy of each checkpoint into
an in-memory file per save, and close waiting for the last checkpoint to be durable (its data, attrs, fsyncs
and renames: the writer made its file ahead from the last checkpoint's layout while training ran). The writer's own start
(a Python interpreter importing numpy and h5py) runs on the free core while the first epochs train; the
checkpoints saved meanwhile wait in flight (up to ``landscape.recorder.writer.MAX_IN_FLIGHT``). An earlier
writer process was a fork of the training process: the fork copied the page tables of a process with torch
loaded (the same for any model) and the training process then took copy-on-write faults while the writer
lived, a fixed cost of a few per cent of this loop. On a machine without a free core the writer's start and
writes compete with the loop (run with ``--threads`` = the cores to see ``auto`` choose inline).

    OMP_NUM_THREADS=1 python benchmarks/recorder.py [--epochs 10] [--repeats 7] [--batch-size 64] [--long-epochs 50]
    OMP_NUM_THREADS=1 python benchmarks/recorder.py --sizes
    python benchmarks/recorder.py --threads 2 --long-epochs 0    # on 2 cores: none free, auto writes inline
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
CHOSEN: dict[str, str] = {}  # the writer each recorder method ran with


class _ThreadWriter:
    """A writer thread, for comparison: the same store calls from a thread of the training process (weights and
    optimizer state copied to CPU, at most one checkpoint in flight)."""

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
    else:  # "recorder:<writer>" or "sync" (the writer process, each save waited for)
        rec = landscape.Recorder(root, "bench", model, data=data, optimizer=opt, steps_per_epoch=spe,
                                 config={"optimizer": "sgd", "lr": 0.05}, background=how != "sync",
                                 writer=how.partition(":")[2] or "process")
        CHOSEN[how] = rec.writer

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
                    help="also time torch.save vs each Recorder over this many epochs (0: not)")
    ap.add_argument("--sizes", action="store_true",
                    help="only measure, by checkpoint size, an inline save and the writer process' fixed costs")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of the training loop (as many as the machine has cores: no core is free "
                         "for a writer process, and writer='auto' writes inline)")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    one_thread()
    import torch

    torch.set_num_threads(args.threads)
    from landscape.data import load_dataset

    data = load_dataset("digits")
    if args.sizes:
        return _sizes(data, args.repeats)
    scratch = Path(tempfile.mkdtemp(prefix="landscape-bench-recorder-"))
    counter = iter(range(10**6))

    cpu: dict[str, list[float]] = {}

    def method(how):
        def go():
            root = scratch / f"store-{next(counter)}"
            t = time.process_time()
            _loop(data, args.epochs, args.batch_size, root, how)
            cpu.setdefault(how, []).append(time.process_time() - t)  # this process' CPU (all its threads)
        return go

    names = {"torch.save per epoch": "torch.save", "torch.save + fsync": "torch.save+fsync",
             "Recorder": "recorder:auto", "Recorder, writer='process'": "recorder:process",
             "Recorder, writer='inline'": "recorder:inline", "Recorder, writer='process', background=False": "sync",
             "store writes in a thread": "thread"}
    try:
        times = interleaved({k: method(v) for k, v in names.items()}, repeats=args.repeats, warmup=1,
                            after=lambda _: _settle(scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = medians(times)
    base = "torch.save per epoch"
    print_table(f"LeNet on digits ({len(data.y_train)} examples), {args.epochs} epochs, batch {args.batch_size}, a "
                f"checkpoint per epoch, {args.threads} torch thread(s); load {machine_load()} (a shared machine: read the per-round spread)", med,
                baseline=base)
    ms = {k: 1e3 * statistics.median(v) for k, v in PARTS.items()}
    print(f"  an epoch takes ~{1e3 * med[base] / (args.epochs + 1):.0f} ms; Recorder() chose writer="
          f"'{CHOSEN['recorder:auto']}'. Median ms: torch.save call {ms['torch.save save']:.2f}")
    for mode in ("process", "inline"):
        how = f"recorder:{mode}"
        print(f"  writer='{mode}': opening the run {ms[how + ' open']:.1f}, a save call {ms[how + ' save']:.2f}, "
              f"close {ms[how + ' close']:.1f}")
    cpu = {k: v[1:] for k, v in cpu.items()}  # the warm-up round is not timed
    base_cpu = statistics.median(cpu["torch.save"])
    print("  CPU time of the training process (all its threads; a writer process not counted), x torch.save: "
          + ", ".join(f"{k} {statistics.median(cpu[v]) / base_cpu:.3f}" for k, v in names.items()))
    tag = "" if args.threads == 1 else f" ({args.threads} torch threads)"
    record(f"Recorder{tag}: CPU time of the training process x the loop saving with torch.save",
           samples=[a / b for a, b in zip(cpu["recorder:auto"], cpu["torch.save"], strict=True)],
           better="lower")
    record(f"Recorder{tag}: loop + a checkpoint per epoch, time x the loop saving with torch.save",
           samples=ratios(times, "Recorder", base), goal=1.05 if not tag else None, better="lower",
           note=f"the default, writer='auto', chose '{CHOSEN['recorder:auto']}'")
    for mode in ("process", "inline"):
        record(f"Recorder, writer='{mode}'{tag} (forced; not the goal's default): loop + a checkpoint per epoch, time x "
               "the loop saving with torch.save", samples=ratios(times, f"Recorder, writer='{mode}'", base),
               better="lower")
    if args.long_epochs:
        _longer(data, args, scratch, tag)


def _children() -> list[str]:
    """The process ids of this process' children (Linux ``/proc/PID/task/TID/children``; empty elsewhere)."""
    found: list[str] = []
    tasks = Path(f"/proc/{os.getpid()}/task")
    for task in tasks.iterdir() if tasks.is_dir() else ():
        try:
            found += (task / "children").read_text().split()
        except OSError:
            pass
    return found


def _settle(scratch: Path, timeout: float = 10.0) -> None:
    """Between two timed loops, untimed: remove what the last one wrote and wait until the writer process it
    stopped has exited (close returns once the run is durable and its lock released; the writer's interpreter then
    exits on its own), so that the next loop is not timed beside it."""
    for path in scratch.iterdir():
        shutil.rmtree(path, ignore_errors=True)
    deadline = time.monotonic() + timeout
    while _children() and time.monotonic() < deadline:
        time.sleep(0.001)


def _longer(data, args, scratch: Path, tag: str) -> None:
    """The same loop over ``--long-epochs`` epochs, torch.save against each Recorder: the writer process' fixed
    costs (its start, the last checkpoint made durable at close) spread over a longer run, the inline writer's
    per-checkpoint cost not; not the goal figure."""
    counter = iter(range(10**6))

    def method(how):
        def go():
            _loop(data, args.long_epochs, args.batch_size, scratch / f"long-{next(counter)}", how)
        return go

    names = {"torch.save per epoch": "torch.save", "Recorder": "recorder:auto",
             "Recorder, writer='process'": "recorder:process", "Recorder, writer='inline'": "recorder:inline"}
    scratch.mkdir(exist_ok=True)
    try:
        times = interleaved({k: method(v) for k, v in names.items()}, repeats=args.repeats, warmup=1,
                            after=lambda _: _settle(scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(f"the same, {args.long_epochs} epochs; load {machine_load()}", medians(times),
                baseline="torch.save per epoch")
    for name in names:
        if name.startswith("Recorder"):
            what = "fixed costs spread over a longer loop; not the goal's loop" if name == "Recorder" else "forced"
            record(f"{name}, {args.long_epochs} epochs{tag} ({what}): time x the loop saving with torch.save",
                   samples=ratios(times, name, "torch.save per epoch"), better="lower")


def _sizes(data, repeats: int) -> None:
    """Per checkpoint size (LeNet's weights, 0.08 MiB, plus a float32 extra array), median ms of: one inline save
    (the training thread writes the checkpoint: HDF5, sha256, manifest, fsyncs) and the writer process' fixed
    costs (starting it when the recorder opens, close waiting for the checkpoints in flight: here the writer's
    own start too, as the saves follow one another at once), of which inline pays only the run's creation: the
    per-checkpoint cost inline against the fixed cost of the writer process that ``writer="auto"`` weighs
    (module docstring of :mod:`landscape.recorder`)."""
    import torch

    import landscape
    from landscape.models import build_model

    model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    scratch = Path(tempfile.mkdtemp(prefix="landscape-bench-recorder-"))
    rows = []
    try:
        for mb in (0, 1, 2, 4, 8, 16, 64):
            extra = {"pad": torch.zeros(mb * 2**18)}
            ms: dict[str, list[float]] = {}
            for r in range(repeats):
                for mode in ("inline", "process"):
                    t = time.perf_counter()
                    rec = landscape.Recorder(scratch, f"{mode}-{mb}-{r}", model, data=data, writer=mode)
                    ms.setdefault(f"{mode} open", []).append(time.perf_counter() - t)
                    for step in range(4):
                        t = time.perf_counter()
                        rec.save(step, epoch=step, extra=extra)
                        if step:  # the first inline save also pays h5py's first file of the run
                            ms.setdefault(f"{mode} save", []).append(time.perf_counter() - t)
                    t = time.perf_counter()
                    rec.close()
                    ms.setdefault(f"{mode} close", []).append(time.perf_counter() - t)
                    shutil.rmtree(scratch / f"{mode}-{mb}-{r}")
            med = {k: 1e3 * statistics.median(v) for k, v in ms.items()}
            rows.append(((sum(t.nbytes for t in model.state_dict().values()) + extra['pad'].nbytes) / 2**20,
                         med))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"checkpoint size: median ms of an inline save, the writer process' open (its start) and close (the "
          f"checkpoints in flight made durable), the inline open (the run created); load {machine_load()}")
    for size, med in rows:
        print(f"  {size:7.2f} MiB: inline save {med['inline save']:7.2f}, process: open {med['process open']:6.2f} "
              f"(its start), close {med['process close']:6.2f}; inline open {med['inline open']:6.2f}")


if __name__ == "__main__":
    main()
