"""``landscape privacy``: epsilon for a noise multiplier, or the noise multiplier for a target epsilon.

The schedule is ``steps`` Poisson-subsampled Gaussian steps with sample rate ``q``. ``q`` is given directly
or as ``batch_size / dataset_size``; ``steps`` directly or as whole epochs, counted as ``landscape train``
runs them (:func:`landscape.train.accounting.schedule_steps`): ``epochs * ceil(dataset_size / batch_size)``
(``epochs * ceil(1 / q)`` when only ``q`` is known, the same rule with N/B = 1/q).
Accounting is :mod:`landscape.train.accounting` (``rdp``: exact sampled-Gaussian RDP at Opacus' orders, or
``pld`` from dp_accounting).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from landscape.errors import UsageError
from landscape.train import accounting


@dataclass
class PrivacyQuery:
    """Options of ``landscape privacy`` (mirrored one-to-one by the CLI)."""

    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    sample_rate: float | None = None
    batch_size: int | None = None
    dataset_size: int | None = None
    steps: int | None = None
    epochs: int | None = None
    delta: float = 1e-5
    method: str = "rdp"

    def schedule(self) -> tuple[float, int]:
        """``(q, steps)``; a usage error when the options conflict or are missing."""
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise UsageError("give exactly one of --noise-multiplier and --target-epsilon")
        pair = (self.batch_size, self.dataset_size)
        if self.sample_rate is not None and any(v is not None for v in pair):
            raise UsageError("give either --sample-rate or --batch-size with --dataset-size, not both")
        if self.sample_rate is None:
            if any(v is None for v in pair):
                raise UsageError("give --sample-rate, or both --batch-size and --dataset-size")
            if self.batch_size < 1 or self.dataset_size < 1 or self.batch_size > self.dataset_size:
                raise UsageError(
                    f"need 1 <= --batch-size <= --dataset-size, got {self.batch_size} and {self.dataset_size}"
                )
            q = self.batch_size / self.dataset_size
        else:
            q = float(self.sample_rate)
        if (self.steps is None) == (self.epochs is None):
            raise UsageError("give exactly one of --steps and --epochs")
        if self.steps is not None:
            steps = int(self.steps)
        elif self.sample_rate is None:
            steps = accounting.schedule_steps(self.epochs, self.dataset_size, self.batch_size)
        else:
            # ceil(N/B) with N/B = 1/q; the tolerance keeps q = B/N from rounding an exact N/B up
            per_epoch = max(1, math.ceil(1.0 / q - 1e-9)) if q > 0 else 0
            steps = accounting.schedule_steps(self.epochs, per_epoch, 1)
        return q, steps


@dataclass
class PrivacyAnswer:
    noise_multiplier: float
    epsilon: float
    delta: float
    sample_rate: float
    steps: int
    method: str
    target_epsilon: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def privacy(query: PrivacyQuery) -> PrivacyAnswer:
    """Epsilon of the schedule (``noise_multiplier`` given) or the calibrated sigma (``target_epsilon``)."""
    q, steps = query.schedule()
    if query.target_epsilon is not None:
        sigma = accounting.noise_for_epsilon(query.target_epsilon, q, steps, query.delta, query.method)
    else:
        sigma = float(query.noise_multiplier)
    eps = accounting.epsilon(sigma, q, steps, query.delta, query.method)
    return PrivacyAnswer(
        noise_multiplier=sigma,
        epsilon=eps,
        delta=query.delta,
        sample_rate=q,
        steps=steps,
        method=query.method,
        target_epsilon=query.target_epsilon,
    )
