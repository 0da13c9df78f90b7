"""Loss and accuracy of one model at many parameter points: the shared evaluator every landscape analysis calls
(it never modifies the caller's model; its methods: docs/ARCHITECTURE.md)."""

from landscape.evaluate.allocator import tuned_allocator
from landscape.evaluate.core import EvalResult, evaluate
from landscape.evaluate.metric import MeanMetric, Metric
from landscape.evaluate.points import Affine, Segment
from landscape.evaluate.runner import recalibrate_batchnorm

__all__ = [
    "Affine", "EvalResult", "MeanMetric", "Metric", "Segment", "evaluate", "recalibrate_batchnorm", "tuned_allocator",
]
