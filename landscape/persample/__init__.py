"""Per-sample gradients: norms, weighted and clipped sums, materialised gradients, projections.

The one engine every per-example computation goes through. A "layer" is one parameter tensor, named as in
``model.named_parameters()``; ``g_i`` is the gradient of ``l_i = cross_entropy(f(x_i), y_i)`` with respect to
the trainable parameters. The routes (hooks, mixed, whole-model ``torch.func``) and their handlers:
docs/persample.md.
"""

from landscape.persample.capture import Capture, place_batch, probe_calls
from landscape.persample.engine import PerSampleEngine, PerSampleNorms, flatten_grads
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
