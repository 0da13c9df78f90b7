"""Loss and accuracy of one model at many parameter points: the shared many-point evaluator.

Interpolation, random directions, surfaces and pruning sweeps all call :func:`evaluate`, which never modifies
the caller's model and returns the mean cross-entropy and accuracy per point, plus any :class:`Metric` values
from the same forward passes. Its methods (``loop``, ``vmap``, the ``plain`` reference): docs/ARCHITECTURE.md.
"""

from landscape.evaluate.allocator import tuned_allocator
from landscape.evaluate.core import EvalResult, evaluate
from landscape.evaluate.metric import MeanMetric, Metric
from landscape.evaluate.points import Affine, Segment
from landscape.evaluate.runner import recalibrate_batchnorm

__all__ = [
    "Affine", "EvalResult", "MeanMetric", "Metric", "Segment", "evaluate", "recalibrate_batchnorm", "tuned_allocator",
]
