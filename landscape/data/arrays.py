"""What every data set is: :class:`Dataset` (train and test tensors with the spec that rebuilds them) and the
builders' raw ``_Arrays``; the seeded, stratified train subset (:func:`subset_indices`)."""

from __future__ import annotations

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
    """What a builder returns: both splits and the class count."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int


def _stratified_counts(class_sizes: np.ndarray, size: int) -> np.ndarray:
    """Per-class counts summing to ``size``, each within 1 of the exact share (largest remainder)."""
    total = int(class_sizes.sum())
    exact = class_sizes * size / total
    counts = np.floor(exact).astype(np.int64)
    remainder = exact - counts
    missing = size - int(counts.sum())
    order = np.argsort(-remainder, kind="stable")
    counts[order[:missing]] += 1
    return counts


def _subset_value(size: Any) -> int | float:
    """``size`` as a plain int (a count) or float (a fraction); anything else is a DataError."""
    if isinstance(size, bool) or not isinstance(size, (int, float, np.integer, np.floating)):
        raise DataError(f"subset must be a count (int) or a fraction (float), got {size!r}")
    return float(size) if isinstance(size, (float, np.floating)) else int(size)


def _resolve_size(size: int | float, total: int) -> int:
    size = _subset_value(size)
    if isinstance(size, float):
        if not 0.0 < size <= 1.0:
            raise DataError(f"subset fraction must be in (0, 1], got {size}; give a count as an integer")
        count = int(round(size * total))
        if count < 1:
            raise DataError(f"subset fraction {size} of {total} examples selects none; use a larger fraction")
        return count
    count = size
    if not 1 <= count <= total:
        raise DataError(f"subset count must be between 1 and {total} (the split's size), got {count}")
    return count


def subset_indices(y: torch.Tensor, size: int | float, seed: int) -> torch.Tensor:
    """Sorted indices of a seeded, stratified sample of ``size`` examples (a count, or a fraction of ``len(y)``).

    Each class gets its exact share ``size * n_c / n`` rounded down, and the leftover places go to the
    classes with the largest remainders, so every class count is within 1 of its exact share. Within a
    class the examples are drawn without replacement with ``numpy.random.default_rng(seed)``.
    """
    labels = np.asarray(torch.as_tensor(y).cpu().numpy()).reshape(-1)
    count = _resolve_size(size, len(labels))
    classes, inverse = np.unique(labels, return_inverse=True)
    counts = _stratified_counts(np.bincount(inverse, minlength=len(classes)), count)
    rng = np.random.default_rng(seed)
    chosen = [
        rng.choice(np.flatnonzero(inverse == c), size=int(k), replace=False)
        for c, k in enumerate(counts)
    ]
    return torch.from_numpy(np.sort(np.concatenate(chosen))).to(torch.int64)
