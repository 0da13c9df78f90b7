"""The Recorder where training loops run: created in a thread that exits before the loop ends, in a process whose
DataLoader forks workers, in a forked child, in a process torch.multiprocessing spawned. Each run is complete
(every checkpoint listed, its sha256 checked on load, the weights that were saved) and its lock is held by the
recording process until close, and by nobody after."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import landscape
from landscape.data import load_dataset
from landscape.models import build_model
from landscape.store import RunBusyError, Store

REPO = Path(__file__).resolve().parents[1]
WRITERS = ["inline", "thread"]


def _lenet():
    data = load_dataset("digits", subset=100)
    return data, build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)


def _record(root, run, writer, steps=3, rec=None):
    """Checkpoints 0..steps-1, the first bias of each filled with its step; the run's steps."""
    data, model = _lenet()
    own = rec is None
    rec = rec or landscape.Recorder(root, run, model, data=data, steps_per_epoch=1, writer=writer)
    for step in range(steps):
        with torch.no_grad():
            rec.model[0].bias.fill_(step)
        rec.save(step)
    rec.close() if own else rec.flush()
    return _check(root, run)


def _check(root, run):
    """The run's steps, each checkpoint loaded (sha256 checked) with the bias it was saved with."""
    store = Store(root)
    steps = [i.step for i in store.run(run).checkpoints()]
    for step in steps:
        assert bool((store.load(f"{run}@step={step}").state_dict["0.bias"] == step).all())
    return steps


def _locked(root, run) -> bool:
    """Whether another process is refused the run's lock."""
    code = f"from landscape.store import Store; Store({str(root)!r}).open_run({run!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    return done.returncode == 1 and "being written by another process" in done.stderr


@pytest.mark.parametrize("writer", WRITERS)
def test_a_recorder_created_in_a_thread_that_exits_keeps_recording(tmp_path, writer):
    data, model = _lenet()
    made = []
    creator = threading.Thread(target=lambda: made.append(
        landscape.Recorder(tmp_path, "t", model, data=data, steps_per_epoch=1, writer=writer)))
    creator.start()
    creator.join()  # the thread that created it is gone
    rec = made[0]
    assert _locked(tmp_path, "t")
    assert _record(tmp_path, "t", writer, rec=rec) == [0, 1, 2]
    assert _locked(tmp_path, "t")
    rec.close()
    assert _check(tmp_path, "t") == [0, 1, 2] and not _locked(tmp_path, "t")


@pytest.mark.parametrize("writer", WRITERS)
def test_recording_beside_dataloader_workers(tmp_path, writer):
    """Forked DataLoader workers come and go every epoch while the run is recorded: none of them writes to, locks
    or releases the run."""
    data, model = _lenet()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.x_train, data.y_train), batch_size=25,
                                         num_workers=2, multiprocessing_context="fork")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with landscape.Recorder(tmp_path, "dl", model, data=data, optimizer=opt, steps_per_epoch=len(loader),
                            writer=writer) as rec:
        rec.save(0)
        step = 0
        for _ in range(2):
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                step += 1
            rec.save(step)
        assert _locked(tmp_path, "dl")
    assert [i.step for i in Store(tmp_path).run("dl").checkpoints()] == [0, 4, 8]
    last = Store(tmp_path).load("dl@last")
    assert all(torch.equal(last.state_dict[k], v) for k, v in model.state_dict().items())
    assert not _locked(tmp_path, "dl")


def _in_fork(root, parent_rec, out):
    """In a forked child: the parent's recorder and run are the parent's (refused here); a Recorder of its own
    records."""
    try:
        parent_rec.save(99)
        out.put("the parent's recorder saved in the child")
    except landscape.errors.UsageError as exc:
        try:
            data, model = _lenet()
            landscape.Recorder(root, "parent", model, data=data)
            out.put("a second Recorder of the parent's run opened in the child")
        except RunBusyError as busy:
            try:
                out.put((str(exc), str(busy), _record(root, "child", "thread")))
            except BaseException as err:  # noqa: BLE001 (reported to the test)
                out.put(repr(err))


def test_a_forked_child_records_its_own_run_and_leaves_the_parents_alone(tmp_path):
    data, model = _lenet()
    context = multiprocessing.get_context("fork")
    torch.nn.init.zeros_(model[0].bias)
    with landscape.Recorder(tmp_path, "parent", model, data=data, steps_per_epoch=1, writer="thread") as rec:
        rec.save(0)
        out = context.Queue()
        child = context.Process(target=_in_fork, args=(tmp_path, rec, out))
        child.start()
        message, busy, steps = out.get(timeout=120)
        child.join(timeout=60)
        assert child.exitcode == 0 and steps == [0, 1, 2]
        assert message.startswith("the recorder of run 'parent' belongs to process ")
        assert busy.startswith(f"run 'parent' is being written by another process (pid {os.getpid()})")
        assert _locked(tmp_path, "parent")  # the child's exit released nothing of the parent's
        torch.nn.init.ones_(model[0].bias)
        rec.save(1)
    assert _check(tmp_path, "parent") == [0, 1] and not _locked(tmp_path, "child")


def _spawned(rank, root):
    assert _record(root, f"spawned-{rank}", "thread") == [0, 1, 2]


def test_a_process_torch_multiprocessing_spawned_records(tmp_path):
    torch.multiprocessing.spawn(_spawned, args=(str(tmp_path),), nprocs=1, join=True)
    assert _check(tmp_path, "spawned-0") == [0, 1, 2] and not _locked(tmp_path, "spawned-0")


def test_two_recorders_of_one_run_are_refused_across_threads(tmp_path):
    """One writer per run holds for threads of one process too (the store's lock is the process')."""
    data, model = _lenet()
    with landscape.Recorder(tmp_path, "one", model, data=data, steps_per_epoch=1, writer="thread"):
        errors = []

        def second():
            try:
                landscape.Recorder(tmp_path, "one", model, data=data, steps_per_epoch=1)
            except RunBusyError as exc:
                errors.append(str(exc))

        worker = threading.Thread(target=second)
        worker.start()
        worker.join()
    assert errors == ["run 'one' is being written by another Recorder of this process; one writer per run: close "
                      "that one first"]
