"""Loss and accuracy of one model at many parameter points: the shared many-point evaluator.

Interpolation (Watson et al. Sec. 2.2, Def. 2.3), random directions, surfaces and pruning sweeps all call
:func:`evaluate`. The caller's model is never modified (one private copy per call, each point written into it
in place); evaluation runs under ``torch.inference_mode`` in large batches and returns the mean cross-entropy
and the accuracy per point, plus any :class:`Metric` values computed in the same forward passes.

``method="loop"`` (default) shares the first layer's output along structured points (:class:`Segment`,
:class:`Affine`) and applies exact module rewrites (:mod:`landscape.evaluate.rewrites`); ``method="vmap"``
evaluates several points per forward over stacked parameters; ``method="plain"`` runs the model as is and is
the reference the others are tested against. What each speed-up does and costs: docs/interpolation.md.
"""

from landscape.evaluate.allocator import tuned_allocator
from landscape.evaluate.core import DEFAULT_MEMORY_BUDGET, EvalResult, evaluate
from landscape.evaluate.metric import MeanMetric, Metric
from landscape.evaluate.points import Affine, Segment
from landscape.evaluate.runner import CACHE_BUDGET, MIN_CHUNK, recalibrate_batchnorm

__all__ = [
    "Affine", "CACHE_BUDGET", "DEFAULT_MEMORY_BUDGET", "EvalResult",
    "MIN_CHUNK", "MeanMetric", "Metric", "Segment", "evaluate", "recalibrate_batchnorm",
    "tuned_allocator",
]
