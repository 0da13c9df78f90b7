"""Small checks and readers the analyzers' config and result classes share (private to ``landscape.analyze``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from landscape.errors import UsageError
from landscape.evaluate import DEFAULT_BATCH_SIZE, METHODS
from landscape.options import CHUNK_HELP, DEVICE_HELP, SUBSET_HELP, SUBSET_SEED_HELP, Options, option


def device_option() -> Any:
    """The ``--device`` option every analysis that computes on a device shares (default ``auto``; the runner
    records the device actually used as the result file's ``device`` attr)."""
    return option("auto", DEVICE_HELP + " The device used is recorded in the result's attrs.", kind="device")


@dataclasses.dataclass(frozen=True)
class EvaluationOptions(Options):
    """How checkpoints are evaluated (the base of the interpolate, directions, surface and calibration configs): a
    seeded stratified subset of each split, examples per forward pass, device and engine (:mod:`landscape.evaluate`)."""

    subset: int | float | None = option(None, SUBSET_HELP + " Default: all, of each split.", kind="subset")
    subset_seed: int = option(0, SUBSET_SEED_HELP)
    chunk: int = option(DEFAULT_BATCH_SIZE, CHUNK_HELP, min=1)
    device: str = device_option()
    method: str = option("auto", "Evaluation engine (landscape.evaluate).", choices=METHODS)


def check_positive_int(flag: str, value: Any) -> None:
    """UsageError ``<flag> must be a positive integer, got <value>`` unless ``value`` is an integer >= 1."""
    if int(value) != value or value < 1:
        raise UsageError(f"{flag} must be a positive integer, got {value}")


def split_subset(splits: Mapping[str, Any], name: str, subset: int | float | None, seed: int):
    """``(x, y)`` of split ``name``, or the examples of it the one sampler draws (``subset`` a count or a fraction:
    :func:`landscape.data.sample_subset`); a split the data does not have is a UsageError naming the ones it has."""
    if name not in splits:
        raise UsageError(f"split {name!r} is not in the data (have {', '.join(splits)})")
    from landscape.data import take_subset

    return take_subset(*splits[name], subset, seed, split=name)
