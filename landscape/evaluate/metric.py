"""The metric protocol of the evaluator (:class:`Metric`, public) and :class:`MeanMetric`, a metric from a
per-example function."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from landscape.errors import UsageError


class Metric:
    """The evaluator's metric protocol: a per-point statistic accumulated from the evaluator's own forward passes.

    loss-landscapes' composable metrics (``Metric.__call__(model)``) evaluate a whole model per call; here a
    metric is streamed instead, so that any number of metrics share one forward pass per (batch, point). Any
    object with these members is a metric (subclassing is optional):

    * **Name(s).** ``name`` (str) identifies the metric: its key in ``EvalResult.metrics`` and, in the
      analyses, its column (``train_<name>`` along an interpolation, ``direction_<name>``, a surface's
      ``test_<name>`` grid). A metric reporting several numbers per point lists them in ``names`` (a tuple of
      column names) and its ``finish`` returns a mapping with exactly those keys. Column names are identifiers
      (``[A-Za-z][A-Za-z0-9_]*``); an analysis refuses one that clashes with its built-in columns (``loss``,
      ``acc``, ...).
    * **Accumulation.** ``start(points, device)`` returns a fresh state for ``points`` parameter points: device
      tensors with one slot per point holding sufficient statistics (sums and counts, not per-example values).
    * **Per batch.** ``update(state, point, logits, y)`` adds one batch at one point in place: ``point`` is the
      0-based index of the point, ``logits`` the model's ``(n, classes)`` output in its dtype on the evaluation
      device (under ``torch.inference_mode``; never modify it), ``y`` the ``(n,)`` int64 targets. Every example
      is seen exactly once per point, in data order, but the batch boundaries depend on ``batch_size`` and on the
      evaluator's cache-sized chunks, and the points of one batch are visited before the next batch (batch-outer
      order): a metric must be a function of the examples, not of the batches. Stay on the device (no
      ``.item()`` or other host synchronisation inside ``update``).
    * **Value.** ``finish(state)`` runs once, after the last batch, and returns the value per point: a ``(P,)``
      tensor or array of floats (or, with ``names``, a mapping ``column -> (P,)``). The analyses check it (one
      finite number per point wherever the loss is finite) and store it beside the loss.

    A metric object holds only its options, never state, so one object can be passed to many calls (and
    its class can be named on the command line: ``--metric file.py:Class``; see ``landscape.metrics``).
    """

    name: str = "metric"

    def start(self, points: int, device: torch.device) -> Any:
        raise NotImplementedError

    def update(self, state: Any, point: int, logits: torch.Tensor, y: torch.Tensor) -> None:
        raise NotImplementedError

    def finish(self, state: Any) -> Any:
        return state


class MeanMetric(Metric):
    """A metric that is the mean over the examples of a per-example value: define :meth:`per_example`.

    The state is ``(points, 2)`` float64 on the device (sum of values, count); ``finish`` gives the means
    (numpy ``(P,)``). E.g. the Brier score: ``((softmax(logits) - one_hot(y)) ** 2).sum(1)``.
    """

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
    for m in metrics:
        if not all(callable(getattr(m, k, None)) for k in ("start", "update", "finish")) or not isinstance(
                getattr(m, "name", None), str):
            raise UsageError(f"{m!r} is not an evaluation metric (needs a name and start/update/finish)")
    names = [m.name for m in metrics]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UsageError(f"metric names repeat: {', '.join(repeated)}")
    return metrics
