"""What every data set is (:class:`Dataset`, the builders' ``_Arrays``), the seeded stratified subset, and the one
sampler the analyses draw their examples with, whose draws a caller may record."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from landscape.errors import DataError


@dataclass
class Dataset:
    """A data set held as tensors: float32 inputs (int64 for token ids), int64 labels in ``0..num_classes-1``."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    spec: dict

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-example shape, e.g. ``(1, 8, 8)`` for digits or ``(100,)`` for gaussian-signal."""
        return tuple(self.x_train.shape[1:])

    def split(self, which: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of the ``"train"`` or ``"test"`` split."""
        if which == "train":
            return self.x_train, self.y_train
        if which == "test":
            return self.x_test, self.y_test
        raise DataError(f"unknown split {which!r}; use 'train' or 'test'")


@dataclass
class _Arrays:
    """What a builder returns: both splits and the class count; ``inputs`` names a conversion of the stored inputs
    the data spec records (``"uint8/255"``: image bytes became float32 in [0, 1]), so a rebuild by another version
    that would convert differently is refused instead of giving other tensors."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    inputs: str | None = None


def _subset_value(size: Any) -> int | float:
    """``size`` as a plain int (a count) or float (a fraction); anything else is a DataError."""
    if isinstance(size, bool) or not isinstance(size, (int, float, np.integer, np.floating)):
        raise DataError(f"subset must be a count (int) or a fraction (float), got {size!r}")
    return float(size) if isinstance(size, (float, np.floating)) else int(size)


def subset_indices(y: torch.Tensor, size: int | float, seed: int) -> torch.Tensor:
    """Sorted indices of a seeded, stratified sample of ``size`` examples (a count, or a fraction of ``len(y)``):
    every class count is within 1 of its exact share (largest remainders), drawn without replacement with
    ``numpy.random.default_rng(seed)``."""
    labels = np.asarray(torch.as_tensor(y).cpu().numpy()).reshape(-1)
    size, total = _subset_value(size), len(labels)
    if isinstance(size, float):
        if not 0.0 < size <= 1.0:
            raise DataError(f"subset fraction must be in (0, 1], got {size}; give a count as an integer")
        count = int(round(size * total))
        if count < 1:
            raise DataError(f"subset fraction {size} of {total} examples selects none; use a larger fraction")
    else:
        count = size
        if not 1 <= count <= total:
            raise DataError(f"subset count must be between 1 and {total} (the split's size), got {count}")
    classes, inverse = np.unique(labels, return_inverse=True)
    exact = np.bincount(inverse, minlength=len(classes)) * count / total
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(-(exact - counts), kind="stable")[:count - int(counts.sum())]] += 1  # largest remainder
    rng = np.random.default_rng(seed)
    chosen = [
        rng.choice(np.flatnonzero(inverse == c), size=int(k), replace=False)
        for c, k in enumerate(counts)
    ]
    return torch.from_numpy(np.sort(np.concatenate(chosen))).to(torch.int64)


# The draws of sample_subset while a recording_subsets() block is open in this context (None: not recording).
_DRAWS: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar("landscape_subsets",
                                                                                      default=None)


def sample_subset(y: torch.Tensor, size: int | float, seed: int, *, split: str = "") -> torch.Tensor:
    """The one sampler of the analyses' example subsets: :func:`subset_indices` (seeded, stratified, sorted;
    ``size`` a count or a fraction of ``len(y)``), and, inside :func:`recording_subsets`, a record of the draw:
    ``split``, ``size`` as asked, ``seed``, ``count`` drawn, ``of`` (the split's size) and ``indices_sha256``
    (sha256 of the indices as little-endian int64), which the api runner writes as the result's attr
    ``subsets``."""
    idx = subset_indices(y, size, seed)
    draws = _DRAWS.get()
    if draws is not None:
        record = {"split": split, "size": _subset_value(size), "seed": int(seed), "count": int(idx.numel()),
                  "of": int(len(y)), "indices_sha256": indices_sha256(idx)}
        if record not in draws:
            draws.append(record)
    return idx


def take_subset(x: torch.Tensor, y: torch.Tensor, size: int | float | None, seed: int, *, split: str = ""
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``, or the examples :func:`sample_subset` draws from them (``size`` None: all of them)."""
    if size is None:
        return x, y
    idx = sample_subset(y, size, seed, split=split)
    return x[idx], y[idx]


def indices_sha256(idx: torch.Tensor) -> str:
    """sha256 of example indices as little-endian int64 (what a result records of the examples it used)."""
    return hashlib.sha256(np.ascontiguousarray(torch.as_tensor(idx).cpu().numpy(), dtype="<i8").tobytes()).hexdigest()


@contextlib.contextmanager
def recording_subsets() -> Iterator[list[dict[str, Any]]]:
    """Collect the distinct draws of :func:`sample_subset` made in this block (this thread or task only)."""
    draws: list[dict[str, Any]] = []
    token = _DRAWS.set(draws)
    try:
        yield draws
    finally:
        _DRAWS.reset(token)
