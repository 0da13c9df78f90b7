"""Random sparsification with gradual cooling (Zhu & Blaschko 2023, Alg. 1): one mask over the whole flattened
model per epoch, drawn from the seed and the epoch only, so a resumed run draws the same masks."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from landscape.errors import OptionError, UsageError


class SparsifySchedule:
    """Per-epoch random masks; ``generator``: a seed, or a ``torch.Generator`` whose ``initial_seed()`` is it."""

    def __init__(self, rate: float, epochs: int, generator: torch.Generator | int = 0):
        if not (0.0 <= rate < 1.0) or not math.isfinite(rate):
            raise OptionError("sparsify", f"must be in [0, 1), got {rate}")
        if epochs < 1:
            raise UsageError(f"sparsification needs epochs >= 1, got {epochs}")
        self.rate = float(rate)
        self.epochs = int(epochs)
        self.seed = generator.initial_seed() if isinstance(generator, torch.Generator) else int(generator)

    def rate_at(self, epoch: int) -> float:
        """``r(e) = R* e / (E - 1)`` (Zhu Alg. 1 line 3); ``R*`` when ``E = 1``; epochs past E-1 keep ``R*``."""
        if epoch < 0:
            raise UsageError(f"epoch must be >= 0, got {epoch}")
        if self.epochs == 1:
            return self.rate
        return self.rate * min(epoch, self.epochs - 1) / (self.epochs - 1)

    def kept_count(self, epoch: int, d: int) -> int:
        """Number of coordinates the mask of ``epoch`` keeps: ``round((1 - r(e)) d)``."""
        return int(round((1.0 - self.rate_at(epoch)) * d))

    def mask_for_epoch(
        self, epoch: int, param_shapes: Mapping[str, Sequence[int] | torch.Size]
    ) -> dict[str, torch.Tensor]:
        """Bool masks (True = keep) for every named shape, with exactly ``kept_count`` True in total."""
        names = list(param_shapes)
        sizes = [math.prod(param_shapes[n]) for n in names]
        d = sum(sizes)
        keep = self.kept_count(epoch, d)
        flat = torch.zeros(d, dtype=torch.bool)
        if keep == d:
            flat[:] = True
        else:
            gen = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) % 2**63)
            flat[torch.randperm(d, generator=gen)[:keep]] = True
        return {
            n: part.reshape(tuple(param_shapes[n]))
            for n, part in zip(names, torch.split(flat, sizes), strict=True)
        }
