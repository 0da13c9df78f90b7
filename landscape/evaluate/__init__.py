"""Loss and accuracy of one model at many parameter points: the shared many-point evaluator.

Interpolation (Watson et al. Sec. 2.2, Def. 2.3), random directions, surfaces and pruning sweeps all call
:func:`evaluate`. The caller's model is never modified: one private copy is made per call (never one per
point) and each point is written into it in place. Evaluation runs under ``torch.inference_mode`` in
large batches, accumulates loss and correct counts in tensors (no ``.item()`` in the loops) and returns
the mean cross-entropy and the accuracy per point.

**Metric hook** (a public protocol: :class:`Metric`). ``evaluate(..., metrics=[...])`` records more than loss
and accuracy at every point in the same forward passes (the idea of loss-landscapes' small composable ``Metric``
objects, streamed here batch by batch): each metric keeps per-point sufficient statistics in device tensors, is
handed the logits and targets of every (batch, point), and its final value is returned in
``EvalResult.metrics[name]``. For example ``landscape.analyze.calibration.ECE`` gives the expected calibration
error along an interpolation path; :class:`MeanMetric` makes a per-example quantity (a Brier score, the
top-1 confidence) a metric in one method. interpolate, directions and surface take user metrics through
:mod:`landscape.metrics`. Without metrics nothing extra runs.

What makes many points cheaper than many independent evaluations (``method="loop"``, the default):

* **Shared first layer.** When the points have structure (:class:`Segment`: ``lerp(a, b, alpha)``;
  :class:`Affine`: ``origin + coords @ directions``) and the model's first parametrised layer is a
  ``Linear`` or ``Conv`` fed by the input alone, that layer's output is affine in its parameters:
  ``W_alpha x + b_alpha = lerp(W_a x + b_a, W_b x + b_b, alpha)``. It is computed once per generator and
  batch and mixed per point, instead of once per point. Exact up to float rounding, and bit-exact at the
  ends of a segment (``torch.lerp`` returns ``a`` at 0 and ``b`` at 1).
  A non-overlapping ``MaxPool2d`` right after that layer is folded in: its windows are cut from the
  shared outputs once per batch as contiguous tensors, and each point mixes them and takes the maximum
  (bit-identical to pooling the mixed output, without strided passes over it).
* **Exact module rewrites** in the private copy: ``MaxPool2d`` as a maximum over strided slices, window rows
  first, then columns (PyTorch's CPU kernel also computes the argmax indices, which are thrown away), and
  ``ReLU -> MaxPool2d`` in a ``Sequential`` swapped to pool-then-ReLU (both monotone: identical values, a
  quarter of the ReLU work).
* **Functional forwards** (a model brought as code that calls ``F.max_pool2d``, ``F.relu``, ``x.flatten(1)``
  in its ``forward``): the private copy is traced with ``torch.fx`` into a graph of modules
  (:func:`_modules_graph`: pool, ReLU and flatten calls become the modules the built-ins use, a shared pool
  module one copy per call, ``F.conv2d`` / ``F.linear`` with a layer's own weights and options that layer's
  call), so the rewrites above and the first-layer fold apply as to the built-ins, with the
  same numbers on the same weights (method ``...+graph``). A forward that cannot be traced keeps its calls, and
  its plain ``F.max_pool2d`` calls run as the strided-slice maximum through a ``TorchFunctionMode``
  (:func:`landscape.pooling.routed_pool_calls`; method ``...+pool-calls``). Either is checked bit for bit
  against the model on a probe batch and otherwise not used.
* **Small convolutions as one matrix product** (:class:`_DenseConv`): a ``Conv2d`` whose input has no more
  positions than its kernel (``H * W <= kh * kw``: LeNet's second convolution on 8 x 8 digits) runs as
  ``x.flatten(1) @ M + b``, no more multiply-adds in one matrix product; a max pool right after it is folded
  into the product's columns. Same values up to the order of the float sums.
* **Cache-sized chunks**: each batch runs in chunks whose activations take at most ``CACHE_BUDGET`` bytes
  (:meth:`_Runner.chunk`), so the per-point element-wise passes stay near the cache.
* **Loss**: cross-entropy as ``logsumexp(logits) - logits[y]`` (F.cross_entropy's value, another summation
  order, without materialising the log-softmax).
* **Memory format**: contiguous (NCHW) by default; ``channels_last=True`` runs convolutions channels-last.
  Which is faster depends on the CPU and the model (measured per machine: docs/benchmarks.md).
* **Batch-outer order**: each batch is moved and its shared work done once for all points.
* **Allocator**: on glibc, during the call (:func:`tuned_allocator`), freed large blocks are kept instead of
  being returned to the OS, so the many same-sized activations of a sweep do not page-fault afresh; on return the
  thresholds are set back to glibc's converged dynamic state (see there; ``LANDSCAPE_MALLOC_TUNE=0`` skips it).

``method="vmap"`` evaluates several points per forward with ``torch.func.functional_call`` + ``vmap`` over
stacked parameters (chunk size from a memory budget); on CPU it is slower for convolutional models
(grouped convolutions) and kept selectable. ``method="plain"`` writes each point and runs the model as
is (the reference the others are tested against).
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
