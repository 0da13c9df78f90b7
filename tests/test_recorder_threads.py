"""landscape.Recorder in the threads and processes real training loops use: opened in a thread that then exits,
saving from other threads, beside DataLoader worker processes, in a forked child, in a forked process' parent, in
and after processes started by torch.multiprocessing.spawn. Each keeps the run's lock in the process that opened it
(another process is refused) and writes every checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import landscape
from landscape.data import load_dataset
from landscape.errors import UsageError
from landscape.models import build_model
from landscape.store import Store

REPO = Path(__file__).resolve().parent.parent
WRITERS = ["inline", "thread"]


def _lenet():
    data = load_dataset("digits", subset=100)
    torch.manual_seed(0)
    return data, build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)


def _mark(model, step):
    with torch.no_grad():
        model[0].bias.fill_(step)


def _check(root, name, steps):
    store = Store(root)
    assert [i.step for i in store.run(name).checkpoints()] == steps
    for step in steps:  # each checkpoint holds the weights it was saved with (sha256 checked on load)
        assert bool((store.load(f"{name}@step={step}").state_dict["0.bias"] == step).all())


def _refused_elsewhere(root, name):
    """Whether another process is refused the run (one writer per run): the store's lock is held."""
    code = f"from landscape.store import Store; Store({str(root)!r}).open_run({name!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    return done.returncode == 1 and "is being written by another process" in done.stderr


@pytest.mark.parametrize("writer", WRITERS)
def test_a_recorder_opened_in_a_thread_that_exits_keeps_working(tmp_path, writer):
    """The old writer process died with the thread that started it; nothing here belongs to a thread."""
    data, model = _lenet()
    made = {}
    opener = threading.Thread(target=lambda: made.setdefault("rec", landscape.Recorder(
        tmp_path, "r", model, data=data, steps_per_epoch=1, writer=writer)))
    opener.start()
    opener.join()
    rec = made["rec"]
    for step in range(2):  # from this thread
        _mark(model, step)
        rec.save(step)
    with ThreadPoolExecutor(2) as pool:  # from a pool's threads, one after the other
        for step in (2, 3):
            _mark(model, step)
            pool.submit(rec.save, step).result()
    assert _refused_elsewhere(tmp_path, "r")
    rec.close()
    _check(tmp_path, "r", [0, 1, 2, 3])


def test_a_recorder_beside_dataloader_worker_processes(tmp_path):
    """Forked DataLoader workers start and exit around each epoch: the parent's recorder, its thread and its lock
    are untouched by them."""
    data, model = _lenet()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.x_train, data.y_train), batch_size=25,
                                         num_workers=2)
    assert loader.multiprocessing_context is None or loader.multiprocessing_context.get_start_method() == "fork"
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with landscape.Recorder(tmp_path, "dl", model, data=data, optimizer=opt, steps_per_epoch=len(loader),
                            writer="thread") as rec:
        rec.save(0)
        step = 0
        for _ in range(2):
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                step += 1
            rec.save(step)
        assert _refused_elsewhere(tmp_path, "dl")
    assert [i.step for i in Store(tmp_path).run("dl").checkpoints()] == [0, 4, 8]
    Store(tmp_path).open_run("dl").close()  # free once closed


FORK_SCRIPT = """
import os, sys, torch, landscape
from landscape.data import load_dataset
from landscape.models import build_model
from landscape.errors import UsageError
from landscape.store import RunBusyError
root = sys.argv[1]
data = load_dataset("digits", subset=100)
model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
def mark(step):
    with torch.no_grad():
        model[0].bias.fill_(step)
rec = landscape.Recorder(root, "parent", model, data=data, steps_per_epoch=1, writer="thread")
mark(0); rec.save(0, extra={"pad": torch.zeros(4_000_000)})  # a write long enough to be in flight at the fork
pid = os.fork()
if pid == 0:  # the child: the parent's recorder is not its own; a recorder of its own works
    try:
        rec.save(1)
    except UsageError as exc:
        print("child:", exc, flush=True)
    try:  # nor is the parent's run: its lock is the parent's
        landscape.Recorder(root, "parent", model, data=data, steps_per_epoch=1)
    except RunBusyError as exc:
        print("child:", str(exc).replace(str(os.getppid()), "PARENT"), flush=True)
    with landscape.Recorder(root, "child", model, data=data, steps_per_epoch=1, writer="thread") as mine:
        for step in range(3):
            mark(step); mine.save(step)
    sys.exit(0)  # a normal exit: atexit and finalizers run in the child
_, status = os.waitpid(pid, 0)
assert status == 0, status
mark(1); rec.save(1)  # the parent's recorder, its thread and its lock outlived the child
with open(os.path.join(root, "parent", ".lock")) as f:
    assert int(f.read()) == os.getpid()
rec.close()
print("parent: done", flush=True)
"""


def test_a_forked_child_records_its_own_run_and_leaves_its_parents_alone(tmp_path):
    done = subprocess.run([sys.executable, "-c", FORK_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "error" not in done.stderr
    lines = done.stdout.splitlines()
    assert lines == [f"child: the recorder of run 'parent' belongs to process {_parent_pid(lines)}, of which this "
                     "one is a fork: save from the process that opened it",
                     "child: run 'parent' is being written by another process (pid PARENT); one writer per run: wait "
                     "for it to end", "parent: done"]
    _check(tmp_path, "parent", [0, 1])
    _check(tmp_path, "child", [0, 1, 2])


def _parent_pid(lines):
    return lines[0].split("belongs to process ")[1].split(",")[0]


def _spawned(rank, root):
    """A process of torch.multiprocessing.spawn: rank 0 records, as distributed training does."""
    torch.set_num_threads(1)
    data, model = _lenet()
    with landscape.Recorder(root, "spawned", model, data=data, steps_per_epoch=1, writer="thread") as rec:
        for step in range(2):
            _mark(model, step)
            rec.save(step)


def test_recorders_in_and_after_torch_multiprocessing_spawn(tmp_path):
    torch.multiprocessing.spawn(_spawned, args=(str(tmp_path),), nprocs=1, join=True)
    _check(tmp_path, "spawned", [0, 1])
    data, model = _lenet()
    with landscape.Recorder(tmp_path, "after", model, data=data, steps_per_epoch=1, writer="thread") as rec:
        for step in range(2):
            _mark(model, step)
            rec.save(step)
    _check(tmp_path, "after", [0, 1])


def test_save_after_close_is_one_line(tmp_path):
    data, model = _lenet()
    for writer in WRITERS:
        rec = landscape.Recorder(tmp_path, writer, model, data=data, steps_per_epoch=1, writer=writer)
        rec.save(0)
        rec.close()
        rec.close()  # idempotent
        with pytest.raises(UsageError, match=f"^the recorder of run '{writer}' is closed$"):
            rec.save(1)
        assert [i.step for i in Store(tmp_path).run(writer).checkpoints()] == [0]
    assert os.getpid() == int((tmp_path / "inline" / ".lock").read_text())  # the last holder, now released
    Store(tmp_path).open_run("inline").close()
