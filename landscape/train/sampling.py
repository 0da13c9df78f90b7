"""Which training examples each step sees (Poisson subsampling or shuffled batches, ceil(N/B) steps an epoch);
both expose their generator's state, so a checkpoint taken mid-epoch resumes the same batches."""

from __future__ import annotations

import numpy as np
import torch

# the one epoch rule lives with the accountant (torch-free, so `landscape privacy` does not load torch)
from landscape.train.accounting import steps_per_epoch


class Sampler:
    """Base class: ``indices(position)`` gives the batch for a position within the epoch (called in order)."""

    def __init__(self, n: int, batch_size: int, generator: torch.Generator):
        if n < 1:
            raise ValueError("cannot sample from an empty training set")
        self.n = n
        self.batch_size = batch_size
        self.generator = generator
        self.steps_per_epoch = steps_per_epoch(n, batch_size)

    @property
    def sample_rate(self) -> float:
        return min(1.0, self.batch_size / self.n)

    def indices(self, position: int) -> torch.Tensor:
        raise NotImplementedError

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"generator": self.generator.get_state().numpy().copy()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.generator.set_state(torch.from_numpy(np.asarray(state["generator"], dtype=np.uint8).copy()))


class PoissonSampler(Sampler):
    """Each example independently with probability q = B/N (Abadi et al. 2016); empty batches happen."""

    def indices(self, position: int) -> torch.Tensor:
        keep = torch.rand(self.n, generator=self.generator, dtype=torch.float64) < self.sample_rate
        return keep.nonzero().squeeze(1)


class ShuffleSampler(Sampler):
    """A fresh random permutation each epoch cut into batches of B (the last one may be smaller)."""

    def __init__(self, n: int, batch_size: int, generator: torch.Generator):
        super().__init__(n, batch_size, generator)
        self.perm = torch.arange(n)

    def indices(self, position: int) -> torch.Tensor:
        if position == 0:
            self.perm = torch.randperm(self.n, generator=self.generator)
        return self.perm[position * self.batch_size : (position + 1) * self.batch_size]

    def state_dict(self) -> dict[str, np.ndarray]:
        return {**super().state_dict(), "perm": self.perm.numpy().copy()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        super().load_state_dict(state)
        self.perm = torch.from_numpy(np.asarray(state["perm"], dtype=np.int64).copy())


SAMPLERS: dict[str, type[Sampler]] = {"poisson": PoissonSampler, "shuffle": ShuffleSampler}


def make_sampler(method: str, n: int, batch_size: int, generator: torch.Generator) -> Sampler:
    return SAMPLERS[method](n, batch_size, generator)
