"""Per-sample gradients: norms, weighted and clipped sums, materialised gradients, projections.

The one engine every per-example computation goes through. A "layer"
is one parameter tensor, named as in ``model.named_parameters()``. The per-sample loss is
``l_i = cross_entropy(f(x_i), y_i)`` and ``g_i`` is its gradient with respect to the trainable parameters.

Exact routes, chosen automatically (``engine.strategy``):

``hooks``
    One batched forward and one backward that keeps, for every module with a registered handler (the open
    registry ``register_handler``, in the spirit of Opacus' ``register_grad_sampler``; built in: ``nn.Linear``,
    ``nn.Conv1d``/``nn.Conv2d`` with any stride, padding, dilation and groups, ``nn.GroupNorm``,
    ``nn.LayerNorm``, ``nn.Embedding``, ``nn.BatchNorm1d/2d/3d`` in eval mode), its input activations ``A_i``
    and output gradients ``B_i``, so
    ``g_i = B_i^T A_i``. Per-sample squared norms use the "ghost norm" identity
    ``||B_i^T A_i||^2 = sum_{t,s} (A_i A_i^T)_{ts} (B_i B_i^T)_{ts}`` when it is clearly cheaper than
    materialising (Li et al. 2021; Bu et al. 2023, "book-keeping"), and the clipped sum
    ``sum_i c_i g_i = sum_i c_i B_i^T A_i`` re-uses the kept ``A, B`` (one weight-gradient kernel on
    re-weighted ``B``, or a weighted sum of the gradients already materialised for the norms): no second
    backward. The backward itself only computes activation gradients, never the weight gradients.
    Convolutions materialise per-sample gradients with one grouped weight-gradient kernel (batch folded
    into the groups) or, for few output positions, one grouped convolution of the inputs with the output
    gradients as kernels (one input channel per group) or channels-last unfolded patches and a batched
    matmul. The engine's calls run with glibc keeping freed large blocks (``tuned_allocator``), so these
    per-batch tensors are not page-faulted in afresh on every step.
``mixed``
    The hooks route for the modules with a handler, and in the same forward/backward a ``FunctionalHandler``
    for every other module owning trainable parameters (or the nearest called ancestor of one that is never
    called itself, like ``nn.MultiheadAttention.out_proj``): its inputs and output gradients are kept and
    ``vmap(grad)`` of the module alone gives the per-sample vector-Jacobian products. Where every module keeps
    the batch is measured by ``probe_calls`` (forwards on one and two copies of the first example).
``functorch``
    ``torch.func.functional_call`` + ``vmap(grad)`` of the whole model (chunked by ``chunk``). Used when a
    trainable parameter belongs to the root module or is tied between modules, when a module draws random
    numbers (dropout in training mode), or when the one-off self-check of the hooks route fails (a parameter
    used outside its module's ``forward``, a wrong registered handler).

The pieces are shared with :mod:`landscape.gram` (per-layer Gram blocks, the empirical NTK), so there is one
per-sample engine: ``Capture`` (inputs in the forward; output gradients by tensor hooks during a backward
whose ``inputs`` are the outputs' gradient edges, so only activation gradients are computed, and a caller
may reduce a layer's factors as soon as they are complete), the per-module handlers (``plan_handlers``:
per-sample gradients, ghost factors, weighted sums), ``probe_calls`` / ``place_batch`` and ``functorch_grads``.

Projections ``<g_i, v>`` do not need per-sample gradients: they are the forward-mode directional
derivatives ``d/dt l_i(theta + t v)`` at ``t = 0`` (one ``torch.func.jvp`` per direction); a model with a
kernel that has no forward-mode rule gets them from per-sample gradients.

BatchNorm in eval mode (running statistics) is a per-channel affine map of each sample: exact, by its handler
(:mod:`landscape.persample.norm_layers`). In training mode, or without running statistics, it mixes the samples
of a batch, so per-sample gradients are undefined: such models are refused (when the engine is built and on
every call).
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
