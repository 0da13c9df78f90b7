"""Training: optimiser families, privacy accounting, pruning and the training loop.

``landscape.train.train`` is the loop's entry point; it is loaded lazily so importing a small piece
(``landscape.train.privatize``) does not import the loop.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "train":
        from landscape.train.loop import train

        return train
    if name in ("TrainConfig", "PhasesConfig"):
        from landscape.train import config

        return getattr(config, name)
    raise AttributeError(f"module 'landscape.train' has no attribute {name!r}")
