"""Per-sample gradients of ``l_i = cross_entropy(f(x_i), y_i)``: the one engine every per-example computation
goes through (routes and handlers: docs/persample.md)."""

from landscape.persample.capture import Capture, place_batch, probe_calls
from landscape.persample.engine import PerSampleEngine, PerSampleNorms, flatten_grads
from landscape.persample.functional import FunctionalHandler, functorch_grads
from landscape.persample.handlers import (
    Handler,
    HooksFailed,
    LinearHandler,
    handler_for,
    plan_handlers,
    register_handler,
    unregister_handler,
)
from landscape.persample.norm_layers import BatchNormHandler, refuse_batchnorm

__all__ = [
    "BatchNormHandler",
    "Capture",
    "FunctionalHandler",
    "Handler",
    "HooksFailed",
    "LinearHandler",
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
