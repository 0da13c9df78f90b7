"""landscape.Recorder: checkpoints from a user's training loop, indistinguishable from `landscape train`'s.

The reference is the trainer itself: a run `landscape train` wrote, recorded again through the Recorder from
its own weights, must give the same manifest (apart from provenance) and bit-identical analysis results.
Opacus: the recorded epsilon is the engine's accountant's and landscape's own accountant's.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import landscape
import landscape.errors
import landscape.recorder.core
import landscape.store
from landscape import api
from landscape.data import load_dataset
from landscape.errors import NonFiniteError, UsageError
from landscape.models import build_model
from landscape.privacy import PrivacyEvent
from landscape.results import read_result
from landscape.store import Store
from landscape.train.accounting import AccountantWarning, composed_epsilon
from landscape.train.pruning import inherited_privacy

# Opacus' own notices (secure RNG off; its hooks on inputs without grad): not ours to report
pytestmark = pytest.mark.filterwarnings("ignore:Secure RNG turned off", "ignore:Full backward hook is firing")
REPO = Path(__file__).resolve().parent.parent
CONFIG = dict(model="lenet", data="digits", subset=200, batch_size=50, lr=0.05, epochs=2, checkpoint_every="1e")
# manifest fields that say who wrote the run and when, not what it holds
PROVENANCE = {"name", "created", "code_version", "config", "config_hash", "seeds", "schedule", "recorder"}
WRITERS = ["inline", "thread"]  # every guarantee holds for both writers (the tests that apply run with each)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """Run 't' trained by `landscape train` in one store and recorded from its weights in another."""
    base = tmp_path_factory.mktemp("twins")
    trained_root, recorded_root = base / "trained", base / "recorded"
    api.train(api.TrainConfig(**CONFIG, run="t"), root=trained_root, progress=False)
    trained = Store(trained_root)
    data = load_dataset("digits", subset=200)
    model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    with landscape.Recorder(recorded_root, "t", model, data=data, config={"optimizer": "sgd", "lr": 0.05}) as rec:
        for info in trained.run("t").checkpoints():
            ckpt = trained.load(f"t@step={info.step}")
            model.load_state_dict(ckpt.state_dict)
            rec.save(info.step, epoch=info.epoch, metrics=info.metrics)
    return trained_root, recorded_root


def test_recorded_manifest_matches_the_trained_one_field_by_field(twins):
    trained_root, recorded_root = twins
    a, b = Store(trained_root).run("t").manifest, Store(recorded_root).run("t").manifest
    for key in (set(a) | set(b)) - PROVENANCE - {"checkpoints", "privacy"}:
        assert a.get(key) == b.get(key), key
    assert [{k: v for k, v in e.items() if k != "sha256"} for e in a["checkpoints"]] == \
           [{k: v for k, v in e.items() if k != "sha256"} for e in b["checkpoints"]]
    shared = set(a["privacy"]) & set(b["privacy"])
    assert shared >= {"accounted", "ancestor_events", "non_private_ancestors"}
    assert {k: a["privacy"][k] for k in shared} == {k: b["privacy"][k] for k in shared}
    assert b["config"] == {"optimizer": "sgd", "lr": 0.05} and b["code_version"] == a["code_version"]
    assert b["recorder"]["format"] == "landscape-recorder/1" and b["recorder"]["torch"] == torch.__version__
    for step in (0, 4, 8):  # what a child run (train --from) learns from either
        ta, tb = Store(trained_root).load(f"t@step={step}"), Store(recorded_root).load(f"t@step={step}")
        assert inherited_privacy(Store(trained_root), ta) == inherited_privacy(Store(recorded_root), tb)
        assert ta.model_spec == tb.model_spec and ta.data_spec == tb.data_spec and ta.code_version == tb.code_version
        for key, value in ta.state_dict.items():
            assert tb.state_dict[key].dtype == value.dtype and torch.equal(tb.state_dict[key], value)


ANALYSES = [
    ("interpolate", ["t@init", "t@last"], dict(points=5)),
    ("instability", [], dict(pairs="t@init:t@last", points=5)),
    ("hessian", ["t"], dict(top_k=2, subset=64, lanczos_steps=10, device="cpu")),
    ("calibration", ["t@last"], dict(bins=5)),
    ("ntk", ["t@last"], dict(subset=8)),
    ("norms", ["t"], dict(subset=16, bins=10)),
    ("clipping", ["t"], dict(batch_size=32)),
    ("symmetry", ["t@last"], dict(projections=4, permutations=19, subset=64)),
    ("ntk-table", ["t@last"], dict(subset=8, max_grad_norms=(0.1, 1.0))),
    ("directions", ["t@last"], dict(directions=3, points=5, toward="t@init")),
    ("surface", ["t@last"], dict(grid="4x3", plane="t@init,t@step=4")),
]


@pytest.mark.parametrize("name,refs,options", ANALYSES, ids=[a[0] for a in ANALYSES])
def test_every_analysis_gives_bit_identical_results_on_the_recorded_run(twins, tmp_path, name, refs, options):
    results = []
    for root in twins:
        out = tmp_path / f"{name}-{root.name}.h5"
        function = getattr(api, name.replace("-", "_"))
        function(*([refs] if name in ("hessian", "norms") else refs), root=root, output=out, figure=False,
                 **options)
        results.append(read_result(out))
    a, b = results
    assert a.params == b.params
    assert set(a.arrays) == set(b.arrays) and set(a.attrs) == set(b.attrs)
    for key, value in a.arrays.items():
        if not _timing(key) and key != "result":  # "result": the pair files' paths (under each output)
            assert np.array_equal(value, b.arrays[key], equal_nan=value.dtype.kind == "f"), key
    assert [i.ref for i in a.inputs] == [i.ref for i in b.inputs]
    for key, value in a.attrs.items():
        if key not in {"created", "inputs"} and not _timing(key):
            assert value == b.attrs[key] or value != value and b.attrs[key] != b.attrs[key], key


def _timing(name: str) -> bool:
    """Wall times and throughputs: measured, not computed from the checkpoints."""
    return any(word in name for word in ("seconds", "throughput"))


# --------------------------------------------------------------------------------- continuing, refusals


def _digits_lenet(seed=0):
    data = load_dataset("digits", subset=100)
    torch.manual_seed(seed)
    return data, build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)


def _steps(model, optimizer, data, n, start=0):
    for i in range(start, start + n):
        idx = torch.arange(i * 10, i * 10 + 10) % len(data.y_train)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
        optimizer.step()


@pytest.mark.parametrize("writer", WRITERS)
def test_a_killed_run_continues_its_trajectory_exactly(tmp_path, writer):
    """Interrupted after step 3 and continued from the store equals an uninterrupted loop (weights, momentum)."""
    data, model = _digits_lenet()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with landscape.Recorder(tmp_path, "r", model, data=data, optimizer=opt, steps_per_epoch=3, writer=writer) as rec:
        rec.save(0)
        _steps(model, opt, data, 3)
        rec.save(3, metrics={"loss": torch.tensor(0.5)})
    # a fresh process: new model and optimizer, the same Recorder call
    _, model2 = _digits_lenet(seed=1)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.05, momentum=0.9)
    with landscape.Recorder(tmp_path, "r", model2, data=data, optimizer=opt2, steps_per_epoch=3,
                            writer=writer) as rec:
        assert rec.last_step == 3 and rec.restore() == 3
        with pytest.raises(UsageError, match="step 3 does not come after step 3"):
            rec.save(3)
        with pytest.raises(UsageError, match="does not come after"):
            rec.save(1)
        _steps(model2, opt2, data, 3, start=3)
        rec.save(6)
    # the reference: six steps in one go
    model.load_state_dict(init)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    _steps(model, opt, data, 6)
    last = Store(tmp_path).load("r@last")
    assert last.step == 6 and last.epoch == 2.0
    for k, v in model.state_dict().items():
        assert torch.equal(last.state_dict[k], v), k
    run = Store(tmp_path).run("r")
    assert [e["step"] for e in run.manifest["checkpoints"]] == [0, 3, 6]
    assert all(e["sha256"] for e in run.manifest["checkpoints"])
    assert run.manifest["checkpoints"][1]["metrics"] == {"loss": 0.5}


@pytest.mark.parametrize("writer", WRITERS)
def test_recorder_refuses_someone_elses_run_in_one_line(tmp_path, writer):
    api.train(api.TrainConfig(**{**CONFIG, "epochs": 1}, run="trained"), root=tmp_path, progress=False)
    data, model = _digits_lenet()
    with pytest.raises(UsageError, match="run 'trained' was written by landscape train, not by a Recorder"):
        landscape.Recorder(tmp_path, "trained", model, data=data, writer=writer)
    with landscape.Recorder(tmp_path, "mine", model, data=data, config={"lr": 0.1}, writer=writer) as rec:
        rec.save(0, epoch=0)
    other = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
    with pytest.raises(UsageError, match="run 'mine' was recorded with another model spec"):
        landscape.Recorder(tmp_path, "mine", other, data=data, config={"lr": 0.1}, writer=writer)
    with pytest.raises(UsageError, match="run 'mine' was recorded with another data spec"):
        landscape.Recorder(tmp_path, "mine", model, data=load_dataset("digits", subset=50), config={"lr": 0.1},
                           writer=writer)
    with pytest.raises(UsageError, match="run 'mine' was recorded with another config"):
        landscape.Recorder(tmp_path, "mine", model, data=data, config={"lr": 0.2}, writer=writer)
    assert [i.step for i in Store(tmp_path).run("mine").checkpoints()] == [0]
    assert len(Store(tmp_path).run("trained").checkpoints()) == 2


KILLED_SCRIPT = """
import sys, time, torch, landscape
from landscape.data import load_dataset
from landscape.models import build_model
data = load_dataset("digits", subset=100)
torch.manual_seed(0)
model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
with landscape.Recorder(sys.argv[1], "k", model, data=data, steps_per_epoch=1, writer=sys.argv[2]) as rec:
    for step in range(1000):
        with torch.no_grad():
            model[0].bias.fill_(step)
        rec.save(step)
        print(step, flush=True)
"""


@pytest.mark.parametrize("writer", WRITERS)
def test_a_sigkilled_recorder_leaves_a_run_that_continues(tmp_path, writer):
    """SIGKILL mid-recording: every listed checkpoint is complete, the lock is free, and the same Recorder call
    continues after the last one; meanwhile a second writer is refused in one line."""
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT, str(tmp_path), writer], stdout=subprocess.PIPE,
                            text=True, env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    for line in proc.stdout:
        if int(line) >= 3:
            break
    deadline = time.monotonic() + 60  # steps 0-2 written (the thread may still be writing the last one)
    while not (tmp_path / "k" / landscape.store.MANIFEST).is_file() or len(Store(tmp_path).run("k").checkpoints()) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    data, model = _digits_lenet()
    assert int((tmp_path / "k" / ".lock").read_text()) == proc.pid  # the training process holds the run
    with pytest.raises(landscape.store.RunBusyError, match=f"run 'k' is being written by another process .pid {proc.pid}"):
        landscape.Recorder(tmp_path, "k", model, data=data, steps_per_epoch=1, writer=writer)
    proc.kill()
    proc.wait()
    torch.manual_seed(0)
    model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    rec = landscape.Recorder(tmp_path, "k", model, data=data, steps_per_epoch=1, writer=writer)  # the lock is free
    with rec:
        last = rec.restore()
        assert last >= 2 and [i.step for i in rec.run.checkpoints()] == list(range(last + 1))
        for info in rec.run.checkpoints():  # each one complete, its sha256 checked on load
            ckpt = Store(tmp_path).load(f"k@step={info.step}")
            assert bool((ckpt.state_dict["0.bias"] == info.step).all())
        rec.save(last + 1)
    assert not list((tmp_path / "k").glob(".*.tmp"))


UNCLOSED_SCRIPT = """
import sys, torch, landscape
from landscape.data import load_dataset
from landscape.models import build_model
data = load_dataset("digits", subset=100)
model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
rec = landscape.Recorder(sys.argv[1], "k", model, data=data, steps_per_epoch=1, writer="thread")
for step in range(3):
    rec.save(step)
"""


def test_thread_writes_finish_at_exit_and_failures_are_raised_at_the_next_call(tmp_path):
    """writer="thread": a recorder never closed still writes its last checkpoint at interpreter exit; a failed
    write is raised by the next save, flush or close, the failed step is not the run's, and it may be saved again."""
    subprocess.run([sys.executable, "-c", UNCLOSED_SCRIPT, str(tmp_path)], check=True, capture_output=True,
                   env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert [i.step for i in Store(tmp_path).run("k").checkpoints()] == [0, 1, 2]
    data, model = _digits_lenet()
    rec = landscape.Recorder(tmp_path, "f", model, data=data, steps_per_epoch=1, writer="thread")
    (tmp_path / "f" / "step-000000.h5").mkdir()  # the rename onto it fails
    rec.save(0)  # returns at once; the write fails in the thread
    with pytest.raises(Exception, match="step-000000.h5") as failed:
        rec.save(1)  # raised here: nothing is written after a failed checkpoint
    assert "Traceback" not in str(failed.value)
    assert rec.last_step is None and Store(tmp_path).run("f").checkpoints() == []
    rec.save(0)
    with pytest.raises(Exception, match="step-000000.h5"):
        rec.flush()
    rec.save(0)
    with pytest.raises(Exception, match="step-000000.h5"):
        rec.close()
    assert rec.last_step is None and Store(tmp_path).run("f").checkpoints() == []
    with pytest.raises(UsageError, match="^the recorder of run 'f' is closed$"):
        rec.save(0)
    with landscape.Recorder(tmp_path, "f", model, data=data, steps_per_epoch=1, writer="thread") as rec:
        (tmp_path / "f" / "step-000000.h5").rmdir()
        rec.save(0)
        rec.save(1)
    assert [i.step for i in Store(tmp_path).run("f").checkpoints()] == [0, 1]


def test_thread_writes_what_was_saved_while_the_loop_changes_the_model(tmp_path):
    """The thread's checkpoint is the CPU copy taken when save was called, whatever the loop does next."""
    data, model = _digits_lenet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    saved = {}
    with landscape.Recorder(tmp_path, "t", model, data=data, optimizer=opt, steps_per_epoch=1, writer="thread") as rec:
        for step in range(4):
            _steps(model, opt, data, 1, start=step)
            saved[step] = {k: v.clone() for k, v in model.state_dict().items()}
            rec.save(step, extra={"seen": np.arange(step + 1)})
            with torch.no_grad():  # changed at once, while the thread writes
                for p in model.parameters():
                    p.add_(1.0)
    for step, state in saved.items():
        ckpt = Store(tmp_path).load(f"t@step={step}")
        assert all(torch.equal(ckpt.state_dict[k], v) for k, v in state.items()), step
        assert np.array_equal(ckpt.extra["seen"], np.arange(step + 1))


def test_two_recorders_open_at_once(tmp_path):
    data, model = _digits_lenet()
    a = landscape.Recorder(tmp_path, "a", model, data=data, steps_per_epoch=1, writer="thread")
    b = landscape.Recorder(tmp_path, "b", model, data=data, steps_per_epoch=1)
    for step in range(3):
        a.save(step)
        b.save(step)
    a.close()
    b.save(3)
    b.close()
    assert [i.step for i in Store(tmp_path).run("a").checkpoints()] == [0, 1, 2]
    assert [i.step for i in Store(tmp_path).run("b").checkpoints()] == [0, 1, 2, 3]


@pytest.mark.parametrize("writer", WRITERS)
def test_every_dtype_and_a_large_checkpoint_reach_the_file_bit_exactly(tmp_path, writer):
    """Every dtype reaches the file exactly: dtypes numpy cannot hold (bfloat16), empty and 0-d tensors, numpy
    arrays, nested extras, a non-contiguous tensor, a large one."""
    data, model = _digits_lenet()
    extra = {"bf16": torch.randn(3, 5).to(torch.bfloat16), "empty": torch.zeros(0, 4), "scalar": torch.tensor(7),
             "flags": torch.tensor([True, False]), "complex": torch.randn(4, dtype=torch.complex64),
             "nested": {"np": np.arange(6, dtype=np.int16).reshape(2, 3), "big": torch.randn(5_000_000)},
             "strided": torch.arange(20.0).reshape(4, 5).t()}
    with landscape.Recorder(tmp_path, "dt", model, data=data, writer=writer) as rec:
        rec.save(0, epoch=0, extra=extra)
    ckpt = Store(tmp_path).load("dt@init")
    with h5py.File(ckpt.path, "r") as f:  # the torch dtype tags an in-process write gives
        assert {f["state_dict"][k].attrs["torch_dtype"] for k in f["state_dict"]} == {"float32"}
        assert f["extra/bf16"].attrs["torch_dtype"] == "bfloat16" and "torch_dtype" not in f["extra/nested/np"].attrs
    for key, value in ckpt.extra.items():
        want = extra
        for part in key.split("/"):
            want = want[part]
        want = torch.as_tensor(want)
        got = torch.as_tensor(value)
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), key
    for k, v in model.state_dict().items():
        assert torch.equal(ckpt.state_dict[k], v)


def test_a_recorded_run_cannot_be_rerun_by_landscape(tmp_path):
    data, model = _digits_lenet()
    with landscape.Recorder(tmp_path, "mine", model, data=data, config={"optimizer": "sgd", "epochs": 3}) as rec:
        rec.save(0, epoch=0)
        rec.save(5, epoch=1)
    with pytest.raises(landscape.errors.CheckpointError, match="was not written by landscape train"):
        api.train(api.TrainConfig(resume="mine"), root=tmp_path)
    with pytest.raises(UsageError, match="recorded from your own training loop"):
        api.clipping("mine@last", root=tmp_path, prune_levels=(0.5,), figure=False)


@pytest.mark.parametrize("writer", WRITERS)
def test_recorder_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path, writer):
    data, model = _digits_lenet()
    with pytest.raises(UsageError, match="^writer must be one of 'inline', 'thread', got 'process'$"):
        landscape.Recorder(tmp_path, "x", model, data=data, writer="process")
    with pytest.raises(UsageError, match="no landscape_spec"):
        landscape.Recorder(tmp_path, "x", torch.nn.Linear(64, 10), data=data)
    with pytest.raises(UsageError, match="data= must be"):
        landscape.Recorder(tmp_path, "x", model, data=None)
    with pytest.raises(UsageError, match="config must be JSON-able"):
        landscape.Recorder(tmp_path, "x", model, data=data, config={"f": object()})
    for bad in ("3", 0, 2.5, True):
        with pytest.raises(UsageError, match="steps_per_epoch must be a whole number >= 1"):
            landscape.Recorder(tmp_path, "x", model, data=data, steps_per_epoch=bad)
    with pytest.raises(UsageError, match="seed must be an integer"):
        landscape.Recorder(tmp_path, "x", model, data=data, seed="0")
    assert not (tmp_path / "x").exists()
    with landscape.Recorder(tmp_path, "x", model, data=data, writer=writer) as rec:
        for bad in ("1", 1.5, None):
            with pytest.raises(UsageError, match="the step must be a whole number >= 0|give the checkpoint's step"):
                rec.save(bad, epoch=0)
        with pytest.raises(UsageError, match="the epoch must be a finite number"):
            rec.save(0, epoch=float("inf"))
        with pytest.raises(UsageError, match="the epoch must be a finite number"):
            rec.save(0, epoch="1")
        with pytest.raises(UsageError, match="give the checkpoint's epoch"):
            rec.save(0)
        with pytest.raises(UsageError, match="whole number >= 0"):
            rec.save(-1, epoch=0)
        with pytest.raises(UsageError, match="epsilon must be a number >= 0"):
            rec.save(0, epoch=0, epsilon=float("nan"))
        for bad in (torch.ones(3), "0.5", None, True, {"a": 1}):  # refused by save itself, whatever the writer
            with pytest.raises(UsageError, match="^metric 'loss' must be a number, got "):
                rec.save(0, epoch=0, metrics={"loss": bad})
        with pytest.raises(UsageError, match="^cannot store ndarray of dtype object: not a numeric array$"):
            rec.save(0, epoch=0, extra={"bad": np.array([object()])})
        with torch.no_grad():
            model[0].weight.view(-1)[0] = float("nan")
        with pytest.raises(NonFiniteError, match="is not finite"):
            rec.save(0, epoch=0)
    assert Store(tmp_path).run("x").checkpoints() == [] and not list((tmp_path / "x").glob("*.h5"))


def test_finite_weights_are_told_from_non_finite_ones_exactly(tmp_path):
    """save checks all weights at once by their norms; a norm that overflows (finite weights near float32's
    maximum) is checked element by element: saved, bit-exactly; an infinity is refused, naming its tensor."""
    data, model = _digits_lenet()
    with torch.no_grad():
        model[0].weight.view(-1)[:2] = 3e38
    assert not torch.isfinite(torch.linalg.vector_norm(model[0].weight))
    with landscape.Recorder(tmp_path, "big", model, data=data) as rec:
        rec.save(0, epoch=0)
        with torch.no_grad():
            model[0].bias.view(-1)[1] = -float("inf")
        with pytest.raises(NonFiniteError, match="^step 1: tensor '0.bias' of the model is not finite"):
            rec.save(1, epoch=1)
    ckpt = Store(tmp_path).load("big@last")
    assert ckpt.step == 0 and torch.equal(ckpt.state_dict["0.weight"], model.state_dict()["0.weight"])


@pytest.mark.parametrize("writer", WRITERS)
def test_the_recorder_copies_weights_off_the_model_device(tmp_path, writer):
    """Whatever the model's device, the stored tensors are CPU copies (here CPU; CUDA when present)."""
    data, model = _digits_lenet()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    with landscape.Recorder(tmp_path, "dev", model, data=data, writer=writer) as rec:
        rec.save(0, epoch=0.0)
    ckpt = Store(tmp_path).load("dev@init")
    for k, v in model.state_dict().items():
        assert ckpt.state_dict[k].device.type == "cpu" and torch.equal(ckpt.state_dict[k], v.cpu())


def test_both_writers_write_the_same_run(tmp_path):
    """The same checkpoints recorded inline and by a thread: the same manifest and files, apart from when they
    were written."""
    data, model = _digits_lenet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    for writer in WRITERS:
        model.load_state_dict(init)
        opt.state.clear()
        with landscape.Recorder(tmp_path / writer, "r", model, data=data, optimizer=opt, steps_per_epoch=2,
                                config={"lr": 0.05}, writer=writer) as rec:
            rec.save(0)
            _steps(model, opt, data, 2)
            rec.save(2, metrics={"loss": 0.25}, extra={"seen": np.arange(3)})
    runs = [Store(tmp_path / w).run("r") for w in WRITERS]

    def timeless(manifest):
        return {k: v for k, v in manifest.items() if k not in ("created", "checkpoints")}, [
            {k: v for k, v in e.items() if k != "sha256"} for e in manifest["checkpoints"]]

    assert timeless(runs[0].manifest) == timeless(runs[1].manifest)
    for step in (0, 2):
        a, b = (Store(tmp_path / w).load(f"r@step={step}") for w in WRITERS)  # sha256 checked on load
        assert a.attrs == b.attrs and a.metrics == b.metrics and a.epoch == b.epoch
        assert a.state_dict.keys() == b.state_dict.keys() and a.extra.keys() == b.extra.keys()
        assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
        assert all(np.array_equal(a.extra[k], b.extra[k]) for k in a.extra)


def test_the_recorder_holds_the_lock_in_this_process_and_raises_at_once(tmp_path, monkeypatch):
    data, model = _digits_lenet()
    rec = landscape.Recorder(tmp_path, "w", model, data=data, steps_per_epoch=1, writer="inline")
    assert rec.writer == "inline" and (tmp_path / "w" / ".lock").read_text().strip() == str(os.getpid())
    for writer in WRITERS:  # a second recorder of the run in this process (the store's lock is the process')
        with pytest.raises(landscape.store.RunBusyError, match="^run 'w' is being written by another Recorder of "
                                                               "this process; one writer per run"):
            landscape.Recorder(tmp_path, "w", model, data=data, steps_per_epoch=1, writer=writer)
    code = f"from landscape.store import Store; Store({str(tmp_path)!r}).open_run('w')"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert other.returncode == 1 and f"being written by another process (pid {os.getpid()})" in other.stderr
    rec.save(0)
    assert [i.step for i in Store(tmp_path).run("w").checkpoints()] == [0]  # on disk when save returns

    def fail(*args, **kwargs):
        raise landscape.errors.CheckpointError("disk full")

    monkeypatch.setattr(landscape.store.Run, "save_checkpoint", fail)
    with pytest.raises(landscape.errors.CheckpointError, match="^disk full$"):
        rec.save(1)  # raised by save itself
    assert rec.last_step == 0
    monkeypatch.undo()
    rec.save(1)
    rec.close()
    Store(tmp_path).open_run("w").close()  # the lock is free when close returns
    with pytest.raises(UsageError, match="the recorder of run 'w' is closed"):
        rec.save(2)
    with landscape.Recorder(tmp_path, "w", model, data=data, steps_per_epoch=1, writer="inline") as rec:
        assert rec.last_step == 1
    with pytest.raises(ZeroDivisionError):  # an error before the first checkpoint frees the name
        with landscape.Recorder(tmp_path, "fresh", model, data=data, steps_per_epoch=1, writer="inline"):
            raise ZeroDivisionError
    assert not (tmp_path / "fresh").exists()


def test_import_landscape_loads_neither_torch_nor_opacus():
    code = ("import sys, landscape; assert 'torch' not in sys.modules and 'opacus' not in sys.modules; "
            "import landscape.integrations.opacus; assert 'opacus' not in sys.modules; "
            "assert landscape.Recorder.__name__ == 'Recorder'; assert 'opacus' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env={"PYTHONPATH": str(REPO),
                                                                            "OMP_NUM_THREADS": "1"})


# ------------------------------------------------------------------------------------------ Opacus


def _opacus_loop(accountant="rdp", sigma=1.1, steps=6):
    from opacus import PrivacyEngine

    data, model = _digits_lenet()
    dataset = torch.utils.data.TensorDataset(data.x_train, data.y_train)
    loader = torch.utils.data.DataLoader(dataset, batch_size=20)
    engine = PrivacyEngine(accountant=accountant)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gsm, opt, loader = engine.make_private(module=model, optimizer=opt, data_loader=loader, noise_multiplier=sigma,
                                           max_grad_norm=1.0)
    return data, model, gsm, opt, loader, engine


def _opacus_steps(gsm, opt, loader, n):
    done = 0
    while done < n:
        for x, y in loader:
            if done == n:
                break
            opt.zero_grad()
            torch.nn.functional.cross_entropy(gsm(x), y).backward()
            opt.step()
            done += 1


def test_opacus_privacy_is_recorded_as_landscape_train_records_it(tmp_path):
    from landscape.integrations.opacus import OpacusPrivacy
    from landscape.train.accounting import epsilon as landscape_epsilon

    data, model, gsm, opt, loader, engine = _opacus_loop()
    privacy = OpacusPrivacy(engine, opt, loader, delta=1e-5)
    with landscape.Recorder(tmp_path, "dp", gsm, data=data, optimizer=opt, privacy=privacy,
                            config={"optimizer": "dpsgd"}, steps_per_epoch=len(loader)) as rec:
        rec.save()
        _opacus_steps(gsm, opt, loader, 6)
        rec.save()
        with pytest.raises(UsageError, match="step 7 but the privacy accountant counted 6"):
            rec.save(7)
    store = Store(tmp_path)
    run = store.run("dp")
    p = run.manifest["privacy"]
    q = 1 / len(loader)
    assert p["noise_multiplier"] == 1.1 and p["sample_rate"] == pytest.approx(q) and p["max_grad_norm"] == 1.0
    assert p["delta"] == 1e-5 and p["accountant"] == "rdp" and p["accounted"] is True and p["steps"] == 6
    assert p["sampling"] == "poisson" and p["ancestor_events"] == [] and p["non_private_ancestors"] is False
    last = store.load("dp@last")
    assert last.step == 6 and last.epoch == pytest.approx(6 / len(loader))
    assert last.epsilon == engine.accountant.get_epsilon(1e-5)
    assert last.epsilon == pytest.approx(landscape_epsilon(1.1, q, 6, 1e-5, "rdp"), rel=1e-6)
    assert store.load("dp@init").epsilon == 0.0
    assert set(last.state_dict) == set(model.state_dict())  # no `_module.` prefix
    for k, v in model.state_dict().items():
        assert torch.equal(last.state_dict[k], v)
    history = inherited_privacy(store, last)  # what `train --from dp@last` composes
    assert [vars(e) for e in history.events] == [{"noise_multiplier": 1.1, "sample_rate": q, "steps": 6}]
    assert not history.non_private and not history.unknown
    child = api.train(api.TrainConfig(from_ref="dp@last", optimizer="dpsgd", noise_multiplier=1.0, batch_size=20,
                                      epochs=1, run="child"), root=tmp_path, progress=False)
    own = PrivacyEvent(1.0, 20 / 100, 5)
    assert store.load("child@last").epsilon == pytest.approx(composed_epsilon([PrivacyEvent(1.1, q, 6), own]),
                                                             rel=1e-9)
    assert child.manifest["privacy"]["ancestor_events"] == [{"noise_multiplier": 1.1, "sample_rate": q, "steps": 6}]


@pytest.mark.parametrize("writer", WRITERS)
def test_opacus_run_continues_with_its_accountant(tmp_path, writer):
    from landscape.integrations.opacus import OpacusPrivacy

    data, _, gsm, opt, loader, engine = _opacus_loop()
    with landscape.Recorder(tmp_path, "dp", gsm, data=data, optimizer=opt, steps_per_epoch=len(loader),
                            privacy=OpacusPrivacy(engine, opt, loader), writer=writer) as rec:
        _opacus_steps(gsm, opt, loader, 3)
        rec.save()
    data, _, gsm, opt, loader, engine = _opacus_loop()  # the script started again
    with landscape.Recorder(tmp_path, "dp", gsm, data=data, optimizer=opt, steps_per_epoch=len(loader),
                            privacy=OpacusPrivacy(engine, opt, loader), writer=writer) as rec:
        assert rec.restore() == 3 and engine.accountant.history == [(1.1, pytest.approx(1 / len(loader)), 3)]
        _opacus_steps(gsm, opt, loader, 2)
        rec.save()
    last = Store(tmp_path).load("dp@last")
    assert last.step == 5 and last.epsilon == engine.accountant.get_epsilon(1e-5)
    assert Store(tmp_path).run("dp").manifest["privacy"]["steps"] == 5


@pytest.mark.parametrize("accountant", ["prv", "gdp"])
def test_opacus_other_accountants_agree_with_landscape_pld_and_rdp(tmp_path, accountant):
    from landscape.integrations.opacus import OpacusPrivacy
    from landscape.train.accounting import epsilon as landscape_epsilon

    data, _, gsm, opt, loader, engine = _opacus_loop(accountant, sigma=1.0, steps=5)
    with landscape.Recorder(tmp_path, "dp", gsm, data=data, privacy=OpacusPrivacy(engine, opt, loader),
                            steps_per_epoch=len(loader)) as rec:
        _opacus_steps(gsm, opt, loader, 5)
        rec.save()
    last = Store(tmp_path).load("dp@last")
    assert last.epsilon == engine.accountant.get_epsilon(1e-5)
    assert Store(tmp_path).run("dp").manifest["privacy"]["accountant"] == accountant
    q = 1 / len(loader)
    if accountant == "prv":  # both numerical PLD/PRV: tighter than RDP, and close to each other
        assert last.epsilon == pytest.approx(landscape_epsilon(1.0, q, 5, 1e-5, "pld"), rel=0.05)
    assert last.epsilon <= landscape_epsilon(1.0, q, 5, 1e-5, "rdp") * 1.01


@pytest.mark.parametrize("writer", WRITERS)
def test_a_run_recorded_from_a_parent_has_the_lineage_and_history_train_from_gives(tmp_path, writer):
    """parent= is `landscape train --from`: same lineage, same inherited privacy, the parent's weights at step 0."""
    api.train(api.TrainConfig(**{**CONFIG, "epochs": 1}, run="base"), root=tmp_path, progress=False)  # SGD
    trained = api.train(api.TrainConfig(from_ref="base@last", epochs=1, batch_size=50, run="trained-child"),
                        root=tmp_path, progress=False)
    store = Store(tmp_path)
    parent = store.load("base@last")
    data, model = _digits_lenet(seed=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with landscape.Recorder(tmp_path, "child", model, data=data, optimizer=opt, parent="base@last",
                            steps_per_epoch=2, writer=writer) as rec:
        for k, v in model.state_dict().items():  # the run starts from its parent
            assert torch.equal(v, parent.state_dict[k]), k
        rec.save(0)
        _steps(model, opt, data, 2)
        rec.save(2)
    recorded = store.run("child").manifest
    assert recorded["lineage"] == {**trained.manifest["lineage"], "parent_ref": "base@last"}
    assert recorded["lineage"]["parent_sha256"] == parent.sha256 and recorded["lineage"]["parent_step"] == parent.step
    for key in ("ancestor_events", "non_private_ancestors"):
        assert recorded["privacy"][key] == trained.manifest["privacy"][key], key
    assert recorded["privacy"]["non_private_ancestors"] is True and recorded["privacy"]["accounted"] is False
    assert inherited_privacy(store, store.load("child@last")) == inherited_privacy(store, store.load(
        "trained-child@last"))
    assert torch.equal(store.load("child@init").state_dict["0.weight"], parent.state_dict["0.weight"])
    # continuing: the same parent= again; the model is not reset to the parent's weights
    _, model2 = _digits_lenet(seed=4)
    before = {k: v.clone() for k, v in model2.state_dict().items()}
    with landscape.Recorder(tmp_path, "child", model2, data=data, parent="base@last", steps_per_epoch=2, writer=writer) as rec:
        assert all(torch.equal(v, before[k]) for k, v in model2.state_dict().items())
        assert rec.restore() == 2
    for parent_ref, message in ((None, "was recorded from parent base@step=4, now no parent"),
                                ("trained-child@last", "was recorded from parent base@step=4, now parent trained-child")):
        with pytest.raises(UsageError, match=message):
            landscape.Recorder(tmp_path, "child", model2, data=data, parent=parent_ref, steps_per_epoch=2, writer=writer)
    with pytest.raises(UsageError, match="was recorded without a parent, now parent base@last"):
        with landscape.Recorder(tmp_path, "plain", model2, data=data, steps_per_epoch=2, writer=writer) as rec:
            rec.save(0)
        landscape.Recorder(tmp_path, "plain", model2, data=data, parent="base@last", steps_per_epoch=2, writer=writer)


def test_a_dp_run_recorded_from_a_dp_parent_composes_its_epsilon(tmp_path):
    """An Opacus loop from a DP-SGD parent: each checkpoint's epsilon is the parent's steps composed with its own,
    by Opacus' accountant (as landscape's RDP gives it, and as a trained child records it)."""
    from landscape.integrations.opacus import OpacusPrivacy

    api.train(api.TrainConfig(**{**CONFIG, "epochs": 1}, optimizer="dpsgd", noise_multiplier=1.2, run="dp-base"),
              root=tmp_path, progress=False)
    store = Store(tmp_path)
    base = store.run("dp-base").manifest["privacy"]
    ancestors = [PrivacyEvent(base["noise_multiplier"], base["sample_rate"], 4)]
    data, model, gsm, opt, loader, engine = _opacus_loop(sigma=1.1)
    privacy = OpacusPrivacy(engine, opt, loader, delta=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AccountantWarning)  # the parent's accountant: nothing to say
        with landscape.Recorder(tmp_path, "dp-child", gsm, data=data, optimizer=opt, privacy=privacy,
                                parent="dp-base@last", steps_per_epoch=len(loader)) as rec:
            rec.save()
            _opacus_steps(gsm, opt, loader, 5)
            rec.save()
    q = 1 / len(loader)
    init, last = store.load("dp-child@init"), store.load("dp-child@last")
    assert init.epsilon == pytest.approx(composed_epsilon(ancestors), rel=1e-6) and init.epsilon > 0
    assert last.epsilon == pytest.approx(composed_epsilon([*ancestors, PrivacyEvent(1.1, q, 5)]), rel=1e-6)
    assert engine.accountant.get_epsilon(1e-5) < last.epsilon  # the engine's own accountant is left as it was
    assert engine.accountant.history == [(1.1, pytest.approx(q), 5)]
    manifest = store.run("dp-child").manifest
    assert manifest["privacy"]["ancestor_events"] == [vars(e) for e in ancestors]
    assert manifest["lineage"]["parent_run"] == "dp-base" and manifest["lineage"]["parent_step"] == 4
    assert [vars(e) for e in inherited_privacy(store, last).events] == [vars(e) for e in ancestors] + [
        {"noise_multiplier": 1.1, "sample_rate": q, "steps": 5}]
    # without a privacy source, epsilon= would leave the parent's DP steps out
    _, plain = _digits_lenet()
    with landscape.Recorder(tmp_path, "sgd-child", plain, data=data, parent="dp-base@last", steps_per_epoch=5) as rec:
        with pytest.raises(UsageError, match="the parent checkpoint has a DP history that epsilon= would leave out"):
            rec.save(0, epsilon=1.0)
        rec.save(0)
    assert store.load("sgd-child@init").epsilon is None
    # another accountant than the parent's: the warning line train --from gives, and the parent's epsilon kept
    data, model, gsm, opt, loader, engine = _opacus_loop(accountant="prv", sigma=1.1)
    with pytest.warns(AccountantWarning, match="^run 'prv-child' accounts every step, its parent's too, with prv; "
                                               "its parent dp-base@last reported epsilon"):
        with landscape.Recorder(tmp_path, "prv-child", gsm, data=data, privacy=OpacusPrivacy(engine, opt, loader),
                                parent="dp-base@last", steps_per_epoch=len(loader)) as rec:
            rec.save()
    parent_epsilon = store.run("prv-child").manifest["privacy"]["parent_epsilon"]
    assert parent_epsilon["ref"] == "dp-base@last" and parent_epsilon["accountant"] == "rdp"
    assert parent_epsilon["epsilon"] == store.load("dp-base@last").epsilon


def test_recorder_refuses_a_bad_parent_in_one_line(tmp_path):
    api.train(api.TrainConfig(**{**CONFIG, "epochs": 1}, run="base"), root=tmp_path, progress=False)
    data, model = _digits_lenet()
    with pytest.raises(landscape.errors.CheckpointError, match="no run 'nope'"):
        landscape.Recorder(tmp_path, "c", model, data=data, parent="nope@last")
    with pytest.raises(UsageError, match="parent= must be a checkpoint reference"):
        landscape.Recorder(tmp_path, "c", model, data=data, parent=3)
    mlp = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
    with pytest.raises(UsageError, match="is not the model of parent base@last.*keeps its parent's model"):
        landscape.Recorder(tmp_path, "c", mlp, data=data, parent="base@last")
    api.prune(api.PruneConfig(ref="base@last", remove=0.5, run="pruned"), root=tmp_path)
    with pytest.raises(UsageError, match="parent pruned@init is a pruned run"):
        landscape.Recorder(tmp_path, "c", model, data=data, parent="pruned@init")
    assert not (tmp_path / "c").exists()


def test_opacus_helper_refuses_an_engine_without_an_accountant(tmp_path):
    from landscape.integrations.opacus import OpacusPrivacy

    data, _, gsm, opt, loader, engine = _opacus_loop()
    engine.accountant = None
    with pytest.raises(UsageError, match="the PrivacyEngine has no accountant"):
        OpacusPrivacy(engine, opt, loader)
    with pytest.raises(UsageError, match="DPOptimizer"):
        OpacusPrivacy(_opacus_loop()[-1], torch.optim.SGD(gsm.parameters(), lr=0.1), loader)
    with pytest.raises(UsageError, match="delta must be in"):
        OpacusPrivacy(_opacus_loop()[-1], opt, loader, delta=2.0)


# ------------------------------------------------------------------------------------------ examples


def _example(tmp_path, script, *args):
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, str(REPO / "examples" / script), "--root", str(tmp_path / "ck"), *args],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def test_examples_record_runs_that_the_analyses_read(tmp_path, capsys):
    from cli.main import main

    _example(tmp_path, "train_plain.py", "--epochs", "2")
    _example(tmp_path, "train_plain.py", "--epochs", "2", "--run", "plain-thread", "--writer", "thread")
    _example(tmp_path, "train_opacus.py", "--epochs", "2")
    store = Store(tmp_path / "ck")
    plain, dp = store.run("plain"), store.run("opacus")
    for info in plain.checkpoints():  # the same loop saved by the thread: the same weights at every checkpoint
        a, b = store.load(f"plain@step={info.step}"), store.load(f"plain-thread@step={info.step}")
        assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    assert [i.step for i in plain.checkpoints()][0] == 0 and len(plain.checkpoints()) == 3
    assert dp.manifest["privacy"]["accounted"] is True and store.load("opacus@last").epsilon > 0
    assert plain.manifest["model_spec"]["name"] == dp.manifest["model_spec"]["name"]
    code = f"{REPO / 'examples' / 'my_model.py'}:small_cnn"  # the model's code, named for the analyses
    for args in (["interpolate", "plain@init", "plain@last", "--points", "3", "-o", tmp_path / "i.h5"],
                 ["hessian", "opacus", "--top-k", "1", "--subset", "64", "--lanczos-steps", "8"]):
        with pytest.raises(SystemExit) as exit_:
            main(["--root", str(tmp_path / "ck"), "--code", code, *map(str, args), "--no-figure"])
        assert exit_.value.code == 0, capsys.readouterr().err
    # the interpolation's end points are the plain PyTorch losses of the recorded weights
    sys.path.insert(0, str(REPO / "examples"))
    try:
        from my_model import small_cnn
    finally:
        sys.path.pop(0)
    data = load_dataset("digits")
    result = read_result(tmp_path / "i.h5").to_frame()
    for ref, alpha in (("plain@init", 0.0), ("plain@last", 1.0)):
        model = small_cnn(data.input_shape, data.num_classes, width=8)
        model.load_state_dict(store.load(ref).state_dict)
        model.eval()
        with torch.no_grad():
            loss = torch.nn.functional.cross_entropy(model(data.x_train), data.y_train).item()
        row = result[np.isclose(result["alpha"], alpha)]
        assert float(row["train_loss"].iloc[0]) == pytest.approx(loss, rel=1e-5)


def test_recorded_epsilon_of_a_run_is_json(tmp_path):
    """The manifest stays plain JSON (no NaN) whatever the metrics hold."""
    data, model = _digits_lenet()
    with landscape.Recorder(tmp_path, "m", model, data=data) as rec:
        rec.save(0, epoch=0, metrics={"loss": float("nan"), "acc": 1})
    text = (tmp_path / "m" / "manifest.json").read_text()
    assert "NaN" not in text
    assert math.isnan(Store(tmp_path).run("m").checkpoints()[0].metrics["loss"])
    json.loads(text)
