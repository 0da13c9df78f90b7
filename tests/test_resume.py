"""Resume: a run killed mid-epoch and resumed ends with bit-identical weights (CPU, fixed seeds)."""

from __future__ import annotations

import json
import multiprocessing
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from landscape.data import load_dataset
from landscape.errors import CheckpointError
from landscape.results import sha256_file
from landscape.store import Store
from landscape.train.callbacks import Callback
from landscape.train.config import PhasesConfig, TrainConfig
from landscape.train.loop import train


class Slow(Callback):
    """Makes each step take a while so the test can kill the process between two checkpoints."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step(self, state, stats):
        time.sleep(self.seconds)


def _train_worker(config: dict, root: str) -> None:
    train(TrainConfig(**config), root=root, callbacks=[Slow(0.05)])


def final_weights(root, run: str) -> dict[str, torch.Tensor]:
    return Store(root).load(f"{run}@last").state_dict


def assert_bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
def test_resume_after_sigkill_mid_epoch_is_bit_identical(tmp_path):
    # DP-SGD with Poisson sampling and momentum: sampler, noise and momentum state must all come back
    cfg = dict(model="lenet", data="digits", subset=300, batch_size=50, epochs=4, optimizer="dpsgd",
               noise_multiplier=1.0, lr=0.1, momentum=0.9, checkpoint_every="5s", run="killed")
    spe, total = 6, 24  # ceil(300 / 50) steps per epoch; checkpoints at 5, 10, 15, 20 are all mid-epoch
    root = tmp_path / "store"
    # import what training loads lazily (sklearn's digits, torch.optim's compiler hooks) once, before forking
    load_dataset("digits", subset=300)
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    # a forked process (torch already imported, so no 10-30 s start-up) that we SIGKILL mid-epoch
    proc = multiprocessing.get_context("fork").Process(target=_train_worker, args=(cfg, str(root)), daemon=True)
    proc.start()
    manifest = root / "killed" / "manifest.json"
    deadline = time.monotonic() + 120
    try:
        while True:
            steps = [int(c["step"]) for c in json.loads(manifest.read_text())["checkpoints"]] if manifest.exists() else []
            if any(0 < s < total for s in steps):
                break
            assert proc.is_alive(), f"the training process ended early (exit code {proc.exitcode})"
            assert time.monotonic() < deadline, "the training process wrote no mid-run checkpoint"
            time.sleep(0.01)
    finally:
        proc.kill()  # SIGKILL
        proc.join()
    assert proc.exitcode == -signal.SIGKILL
    run = Store(root).run("killed")
    last = run.checkpoints()[-1].step
    assert 0 < last < total and last % spe != 0, last

    resumed = train(TrainConfig(resume="killed"), root=root)
    assert resumed.checkpoints()[-1].step == total
    reference = train(TrainConfig(**{**cfg, "run": "reference"}), root=root)
    assert_bit_identical(final_weights(root, "killed"), final_weights(root, "reference"))
    # the per-step metrics and epsilon agree as well
    got, want = resumed.load_array("metrics"), reference.load_array("metrics")
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert resumed.checkpoints()[-1].epsilon == reference.checkpoints()[-1].epsilon


class Interrupt(Exception):
    pass


class StopAt(Callback):
    def __init__(self, step: int):
        self.step = step

    def on_step(self, state, stats):
        if state.step == self.step:
            raise Interrupt


@pytest.mark.parametrize("sampling", ["shuffle", "poisson"])
def test_resume_sgd_mid_epoch_is_bit_identical(tmp_path, sampling):
    cfg = TrainConfig(model="lenet", data="digits", subset=200, batch_size=30, epochs=3, lr=0.05, momentum=0.9,
                      sampling=sampling, checkpoint_every="4s", run="r")
    with pytest.raises(Interrupt):
        train(cfg, root=tmp_path, callbacks=[StopAt(10)])
    assert Store(tmp_path).run("r").checkpoints()[-1].step == 8  # mid-epoch 1 (7 steps per epoch)
    train(TrainConfig(resume="r"), root=tmp_path)
    train(TrainConfig(**{**cfg.to_dict(), "run": "ref"}), root=tmp_path)
    assert_bit_identical(final_weights(tmp_path, "r"), final_weights(tmp_path, "ref"))


def test_resume_of_a_finished_run_changes_nothing(tmp_path):
    run = train(TrainConfig(model="lenet", data="digits", subset=100, batch_size=50, epochs=1, run="done"),
                root=tmp_path)
    before = [c.sha256 for c in run.checkpoints()]
    again = train(TrainConfig(resume="done"), root=tmp_path)
    assert [c.sha256 for c in again.checkpoints()] == before


# ------------------------------------------------------------------------------- kills at the worst moments
# (issue 14 items 10-12) Each child is forked from the test process (torch already imported, so no start-up
# cost), stalls at a chosen point inside the store, and is SIGKILLed there; every child is reaped.

TINY = dict(model="mlp", model_kwargs={"widths": [16]}, data="digits", subset=120, batch_size=40, epochs=2,
            optimizer="dpsgd", noise_multiplier=1.0, lr=0.1, momentum=0.9, checkpoint_every="2s")


def _stall_then_train(mode: str, flag: str, target, kwargs: dict) -> None:
    """Child: patch the store so it stalls at ``mode``, writes FLAG, and waits to be killed; then train."""
    import landscape.store.core as store_module  # where Run looks atomic_write_hdf5 up

    def stall() -> None:
        Path(flag).write_text("stalled")
        time.sleep(300)

    if mode == "before-first-checkpoint":  # the manifest exists, no checkpoint file yet
        def save_checkpoint(self, *args, **kw):
            stall()

        store_module.Run.save_checkpoint = save_checkpoint
    elif mode == "after-rename-of-step-4":  # step-000004.h5 is in place, the manifest does not list it yet
        original = store_module.atomic_write_hdf5

        def write_h5(final, fill, **options):
            original(final, fill, **options)
            if final.name == "step-000004.h5":
                stall()
            return final

        store_module.atomic_write_hdf5 = write_h5
    target(**kwargs)


def kill_when_stalled(tmp_path: Path, mode: str, target, **kwargs) -> None:
    flag = tmp_path / f"stalled-{mode}"
    flag.unlink(missing_ok=True)
    proc = multiprocessing.get_context("fork").Process(target=_stall_then_train, args=(mode, str(flag), target, kwargs),
                                                       daemon=True)
    proc.start()
    try:
        deadline = time.monotonic() + 120
        while not flag.exists():
            assert proc.is_alive(), f"the child ended early (exit code {proc.exitcode})"
            assert time.monotonic() < deadline, f"the child never reached {mode}"
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.join(timeout=60)
    assert proc.exitcode == -signal.SIGKILL


def _train(config: dict, root: str) -> None:
    train(TrainConfig(**config), root=root)


def test_a_run_killed_before_its_first_checkpoint_can_be_finished(tmp_path):
    load_dataset("digits", subset=120)  # imported before forking
    root = tmp_path / "store"
    reference = train(TrainConfig(**TINY, run="reference"), root=root)
    for name in ("by-resume", "by-rerun"):
        kill_when_stalled(tmp_path, "before-first-checkpoint", _train, config={**TINY, "run": name}, root=str(root))
        assert (root / name / "manifest.json").is_file() and Store(root).run(name).checkpoints() == []
    # `train --resume` starts it from step 0 with its recorded config and seeds ...
    train(TrainConfig(resume="by-resume"), root=root)
    # ... and so does the very same command again
    train(TrainConfig(**TINY, run="by-rerun"), root=root)
    want = final_weights(root, "reference")
    for name in ("by-resume", "by-rerun"):
        run = Store(root).run(name)
        assert [c.step for c in run.checkpoints()] == [c.step for c in reference.checkpoints()]
        assert_bit_identical(final_weights(root, name), want)
        got, ref = run.load_array("metrics"), reference.load_array("metrics")
        for column in ref:
            np.testing.assert_array_equal(got[column], ref[column])
    # a different configuration under that name is still refused
    kill_when_stalled(tmp_path, "before-first-checkpoint", _train, config={**TINY, "run": "other"}, root=str(root))
    with pytest.raises(CheckpointError, match="already exists"):
        train(TrainConfig(**{**TINY, "lr": 0.2}, run="other"), root=root)


def test_phases_rerun_finishes_a_group_killed_before_its_first_checkpoint(tmp_path):
    from landscape.api.training import phases

    load_dataset("digits", subset=120)
    base = TrainConfig(**{**TINY, "optimizer": "sgd", "noise_multiplier": None, "epochs": 2})
    config = PhasesConfig(base=base, k=1, copies=1, phase1=("sgd",), phase2=("sgd",), group="g")
    kill_when_stalled(tmp_path, "before-first-checkpoint", phases, config=config, root=str(tmp_path), progress=False)
    assert Store(tmp_path).run("g-sgd").checkpoints() == []
    summaries = phases(config, root=tmp_path, progress=False)
    assert [s.run for s in summaries] == ["g-sgd", "g-sgd-sgd-0"]
    assert [s.epoch for s in summaries] == [1.0, 1.0]  # k = 1 epoch each side of the branch


def test_resume_adopts_a_checkpoint_renamed_in_before_its_manifest_entry(tmp_path):
    load_dataset("digits", subset=120)
    root = tmp_path / "store"
    kill_when_stalled(tmp_path, "after-rename-of-step-4", _train, config={**TINY, "run": "r"}, root=str(root))
    run_dir = root / "r"
    listed = [c["step"] for c in json.loads((run_dir / "manifest.json").read_text())["checkpoints"]]
    assert listed == [0, 2] and (run_dir / "step-000004.h5").is_file()
    # temporary files as killed writers leave them (mid-write of a checkpoint, the manifest, the arrays file)
    stale = [".step-000006.h5.a1b2c3.tmp", ".manifest.json.x_9y8z.tmp", ".arrays.h5.qwerty.tmp"]
    for name in stale:
        (run_dir / name).write_bytes(b"partial")
    (run_dir / "notes.tmp").write_text("not the store's: left alone")

    train(TrainConfig(resume="r"), root=root)
    store = Store(root)
    entries = {c["step"]: c for c in store.run("r").manifest["checkpoints"]}
    assert entries[4]["sha256"] == sha256_file(run_dir / "step-000004.h5")  # adopted, with its hash
    assert all(e["sha256"] for e in entries.values())
    assert not any((run_dir / name).exists() for name in stale) and (run_dir / "notes.tmp").exists()
    assert not list(run_dir.glob(".*.tmp"))
    reference = train(TrainConfig(**TINY, run="reference"), root=root)
    assert_bit_identical(final_weights(root, "r"), final_weights(root, "reference"))
    assert sorted(entries) == [c.step for c in reference.checkpoints()]
    # a byte flipped in the adopted file is now caught
    data = bytearray((run_dir / "step-000004.h5").read_bytes())
    data[-1] ^= 0xFF
    (run_dir / "step-000004.h5").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="changed after it was written"):
        store.load("r@step=4")


def _resume_via_cli(root: str, err_file: str, flag: str | None) -> None:
    """Child: `landscape train --resume r` (stalling in its first step when FLAG is given); exit code as ours."""
    import sys

    from cli.main import main

    sys.stderr = open(err_file, "w", buffering=1)  # noqa: SIM115 (the child's stderr until it exits)
    if flag is not None:
        from landscape.train import callbacks

        original = callbacks.WallClock.on_start

        def on_start(self, state):
            original(self, state)
            Path(flag).write_text("training")
            time.sleep(2.0)  # the second writer arrives while the first is inside the run

        callbacks.WallClock.on_start = on_start
    main(["--root", root, "train", "--resume", "r"])


def test_two_resumes_of_one_run_at_once_one_is_refused(tmp_path):
    load_dataset("digits", subset=120)
    root = tmp_path / "store"
    cfg = {**TINY, "run": "r"}
    with pytest.raises(Interrupt):
        train(TrainConfig(**cfg), root=root, callbacks=[StopAt(3)])
    ctx = multiprocessing.get_context("fork")
    flag = tmp_path / "first-is-training"
    first = ctx.Process(target=_resume_via_cli, args=(str(root), str(tmp_path / "err1"), str(flag)), daemon=True)
    first.start()
    second = None
    try:
        deadline = time.monotonic() + 120
        while not flag.exists():
            assert first.is_alive() and time.monotonic() < deadline, "the first resume did not start"
            time.sleep(0.01)
        second = ctx.Process(target=_resume_via_cli, args=(str(root), str(tmp_path / "err2"), None), daemon=True)
        second.start()
        second.join(timeout=120)
        first.join(timeout=120)
    finally:
        for proc in (first, second):
            if proc is not None and proc.is_alive():
                proc.kill()
                proc.join()
    err2 = (tmp_path / "err2").read_text()
    assert second.exitcode == 1, err2
    assert err2.strip().count("\n") == 0 and err2.startswith("error: run 'r' is being written by another process")
    assert first.exitcode == 0, (tmp_path / "err1").read_text()
    store = Store(root)
    for info in store.run("r").checkpoints():
        store.load(f"r@step={info.step}")  # every hash matches: nothing was written twice
    train(TrainConfig(**{**cfg, "run": "reference"}), root=root)
    assert_bit_identical(final_weights(root, "r"), final_weights(root, "reference"))
