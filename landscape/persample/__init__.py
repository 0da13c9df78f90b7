"""Per-sample gradients: norms, weighted and clipped sums, materialised gradients, projections.

The one engine every per-example computation goes through (also :mod:`landscape.gram`'s). A "layer" is one
parameter tensor, named as in ``model.named_parameters()``; ``g_i`` is the gradient of
``l_i = cross_entropy(f(x_i), y_i)`` with respect to the trainable parameters.

Exact routes, chosen automatically (``engine.strategy``): ``hooks`` (one forward and one activation-only
backward keeping each handled module's inputs ``A_i`` and output gradients ``B_i``, ``g_i = B_i^T A_i``; norms
by the ghost-norm identity where cheaper, Li et al. 2021, Bu et al. 2023), ``mixed`` (hooks plus ``vmap(grad)``
of the modules without a handler) and ``functorch`` (``vmap(grad)`` of the whole model: root or tied
parameters, random modules, a failed self-check). Projections ``<g_i, v>`` are forward-mode ``jvp``s.
BatchNorm that mixes the samples of a batch (training mode, no running statistics) is refused.
The routes and their handlers in detail: docs/persample.md.
"""

from landscape.persample.capture import Capture, place_batch, probe_calls
from landscape.persample.engine import (
    LOSSES,
    STRATEGIES,
    PerSampleEngine,
    PerSampleNorms,
    flatten_grads,
)
from landscape.persample.functional import FunctionalHandler, functorch_grads
from landscape.persample.handlers import (
    ConvHandler,
    EmbeddingHandler,
    Handler,
    HooksFailed,
    LinearHandler,
    NormHandler,
    handler_for,
    plan_handlers,
    register_handler,
    unregister_handler,
)
from landscape.persample.norm_layers import BatchNormHandler, refuse_batchnorm

__all__ = [
    "LOSSES",
    "STRATEGIES",
    "BatchNormHandler",
    "Capture",
    "ConvHandler",
    "EmbeddingHandler",
    "FunctionalHandler",
    "Handler",
    "HooksFailed",
    "LinearHandler",
    "NormHandler",
    "PerSampleEngine",
    "PerSampleNorms",
    "flatten_grads",
    "functorch_grads",
    "handler_for",
    "place_batch",
    "plan_handlers",
    "probe_calls",
    "refuse_batchnorm",
    "register_handler",
    "unregister_handler",
]
