"""Child process for the store's kill and concurrency tests (run as a script, not collected by pytest).

    store_writer.py kill ROOT FLAG          3 checkpoints, then a 4th that stops mid-write: FLAG appears, it sleeps
    store_writer.py loop ROOT               checkpoints of ~4 MB each, forever (killed at an arbitrary moment)
    store_writer.py write ROOT GO N NAME..  wait for the file GO, then create each run NAME ("-" = generated) with
                                            N checkpoints; print the run names
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from landscape.store import Store

SPEC = {"model_spec": {"name": "mlp", "kwargs": {}}, "data_spec": {"name": "digits", "seed": 0}}


def state(step: int, size: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {f"layer{i}.weight": torch.randn(size, size, generator=g) for i in range(4)}


class StallingStateDict(dict):
    """A state dict whose items() stalls after two tensors: the writer is then inside the HDF5 file."""

    def __init__(self, data: dict, flag: Path) -> None:
        super().__init__(data)
        self.flag = flag

    def items(self):
        for i, item in enumerate(super().items()):
            if i == 2:
                self.flag.write_text("writing")
                time.sleep(120)
            yield item


def main(argv: list[str]) -> None:
    mode, root = argv[0], Path(argv[1])
    store = Store(root)
    if mode == "kill":
        run = store.create_run("victim", config={"lr": 0.1}, seeds={"seed": 0}, **SPEC)
        for step in range(3):
            run.save_checkpoint(state(step), step=step * 10, epoch=step, metrics={"loss": 1.0 / (step + 1)})
        run.save_checkpoint(StallingStateDict(state(99, 256), Path(argv[2])), step=30, epoch=3.0)
    elif mode == "loop":
        run = store.create_run("looper", config={}, seeds={"seed": 0}, **SPEC)
        step = 0
        while True:
            run.save_checkpoint(state(step, 512), step=step, epoch=step / 10)
            print(step, flush=True)
            step += 1
    elif mode == "write":
        go, count = Path(argv[2]), int(argv[3])
        while not go.exists():
            time.sleep(0.005)
        for name in argv[4:]:
            run = store.create_run(None if name == "-" else name, config={"who": name}, seeds={"seed": 1}, **SPEC)
            for step in range(count):
                run.save_checkpoint(state(step), step=step, epoch=step, metrics={"acc": step / count})
            print(run.name, flush=True)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
