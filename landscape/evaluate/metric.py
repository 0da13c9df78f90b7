"""The metric protocol of the evaluator (:class:`Metric`, public) and :class:`MeanMetric`, a metric from a
per-example function."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from landscape.errors import UsageError


class Metric:
    """The evaluator's metric protocol: a per-point statistic streamed from the evaluator's own forward passes,
    so any number of metrics share one pass per (batch, point). Any object with these members is a metric:

    * ``name`` (str): its key in ``EvalResult.metrics`` and its column in the analyses (an identifier that must
      not clash with built-in columns); several numbers: their columns in ``names``, ``finish`` maps each.
    * ``start(points, device)``: a fresh state, device tensors with one slot per point.
    * ``update(state, point, logits, y)``: adds one batch at one point in place (``logits`` ``(n, classes)``
      under ``torch.inference_mode``, never modified; ``y`` ``(n,)`` int64). Batch boundaries and order are
      not part of the contract; no host synchronisation (``.item()``).
    * ``finish(state)``: the ``(P,)`` values (or, with ``names``, a mapping ``column -> (P,)``); the analyses
      check one finite number per point wherever the loss is finite.

    A metric object holds only its options, never state, so one object serves many calls (``--metric
    file.py:Class`` names its class; see ``landscape.metrics``).
    """

    name: str = "metric"

    def start(self, points: int, device: torch.device) -> Any:
        raise NotImplementedError

    def update(self, state: Any, point: int, logits: torch.Tensor, y: torch.Tensor) -> None:
        raise NotImplementedError

    def finish(self, state: Any) -> Any:
        return state


class MeanMetric(Metric):
    """A metric that is the mean over the examples of a per-example value: define :meth:`per_example` (the
    Brier score: ``((softmax(logits) - one_hot(y)) ** 2).sum(1)``); ``finish`` gives the numpy ``(P,)`` means."""

    def per_example(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One value per example of the batch, shape ``(n,)``."""
        raise NotImplementedError

    def start(self, points: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(points, 2, dtype=torch.float64, device=device)

    def update(self, state: torch.Tensor, point: int, logits: torch.Tensor, y: torch.Tensor) -> None:
        values = self.per_example(logits, y)
        state[point, 0] += values.sum(dtype=torch.float64)
        state[point, 1] += values.numel()

    def finish(self, state: torch.Tensor):
        return (state[:, 0] / state[:, 1]).cpu().numpy()


def _check_metrics(metrics: Sequence[Metric] | None) -> list[Metric]:
    metrics = list(metrics or ())
    for m in metrics:  # the protocol as landscape.metrics.is_metric reads it (the analyses' layer: not imported here)
        if not all(callable(getattr(m, k, None)) for k in ("start", "update", "finish")) or not isinstance(
                getattr(m, "name", None), str):
            raise UsageError(f"{m!r} is not an evaluation metric (needs a name and start/update/finish)")
    names = [m.name for m in metrics]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UsageError(f"metric names repeat: {', '.join(repeated)}")
    return metrics
