"""Resume: a run killed mid-epoch and resumed ends with bit-identical weights (CPU, fixed seeds)."""

from __future__ import annotations

import json
import multiprocessing
import signal
import time

import numpy as np
import pytest
import torch

from landscape.data import load_dataset
from landscape.store import Store
from landscape.train.callbacks import Callback
from landscape.train.config import TrainConfig
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
