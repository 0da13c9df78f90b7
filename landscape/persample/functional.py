"""``torch.func`` per-sample gradients: of one module inside the mixed route, or of the whole model."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, jacrev, vmap
from torch.utils._pytree import tree_flatten, tree_unflatten

from landscape.persample.handlers import Handler, HooksFailed
from landscape.runtime import math_attention


class FunctionalHandler(Handler):
    """Any module, by ``torch.func``: the per-sample vector-Jacobian products of its outputs with their captured
    gradients, ``vmap(grad)`` over one call's samples (Opacus' functorch mode, generalised to keyword inputs and
    to descendants' parameters its ``forward`` uses). ``dims``: per call, each input and output leaf's batch
    dimension from ``probe_calls``. Random operations are refused; the engine then takes the whole-model route."""

    roles = None

    def __init__(self, module, pnames, reduce_dtype=None, dims=None):
        super().__init__(module, pnames, reduce_dtype)
        self.dims: list[tuple[list[int | None], list[int | None]]] = dims or []

    def unit(self, calls):
        layouts = self.dims
        if len(calls) != len(layouts):  # called another number of times than in the probe: fine if all alike
            if any(d != layouts[0] for d in layouts):
                raise HooksFailed(
                    f"module {type(self.module).__name__} was called {len(calls)} times, {len(layouts)} in the "
                    "probe, with different layouts"
                )
            layouts = layouts[:1] * len(calls)
        g = None
        for (inputs, grads), (in_dims, out_dims) in zip(calls, layouts, strict=True):
            try:
                gk = self._call_grads(inputs, grads, in_dims, out_dims)
            except (RuntimeError, NotImplementedError, ValueError, TypeError) as e:
                name = type(self.module).__name__
                if "randomness" in str(e):
                    raise HooksFailed(f"module {name} draws random numbers (dropout in training mode?)") from e
                why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise HooksFailed(f"torch.func cannot take module {name} apart: {why}") from e
            g = gk if g is None else {k: g[k] + gk[k] for k in g}
        return {"g": g}

    def per_sample_grads(self, u):
        return u["g"]

    def _call_grads(self, inputs, grads, in_dims, out_dims) -> dict[str, Tensor]:
        leaves, spec = tree_flatten(inputs)
        bidx = [i for i, d in enumerate(in_dims) if d is not None]
        outs = [(j, g) for j, g in enumerate(grads) if g is not None]
        if any(out_dims[j] is None for j, _ in outs):
            raise HooksFailed(f"module {type(self.module).__name__} has an output shared by all samples")
        params = dict(self.module.named_parameters(remove_duplicate=False))
        params = {role: params[role].detach() for role in self.pnames}
        module = self.module

        def vjp_one(p, xs, gs):
            full = list(leaves)
            for i, t in zip(bidx, xs, strict=True):
                full[i] = t.unsqueeze(in_dims[i])
            args, kwargs = tree_unflatten(full, spec)
            out = tree_flatten(functional_call(module, p, tuple(args), kwargs))[0]
            total = None
            for (j, _), g in zip(outs, gs, strict=True):
                term = (out[j] * g.unsqueeze(out_dims[j]).to(out[j].dtype)).sum()
                total = term if total is None else total + term
            return total

        if not outs:
            n = next(leaves[i].shape[in_dims[i]] for i in bidx)
            return {k: v.new_zeros(n, *v.shape) for k, v in params.items()}
        fn = vmap(
            grad(vjp_one),
            in_dims=(None, [in_dims[i] for i in bidx], [out_dims[j] for j, _ in outs]),
            randomness="error",
        )
        with torch.no_grad(), math_attention():
            return fn(params, [leaves[i] for i in bidx], [g for _, g in outs])


def functorch_grads(
    model: nn.Module, names: list[str], x: Tensor, y: Tensor | None = None
) -> tuple[dict[str, Tensor], Tensor | None, Tensor | None]:
    """Per-sample gradients by ``torch.func`` w.r.t. the parameters ``names`` (the others held fixed).

    With labels ``y``: ``vmap(grad)`` of l_i = cross_entropy(f(x_i), y_i), returning ``({name: (n, *shape)},
    losses, logits)``; without: ``vmap(jacrev)`` of the logits f(x_i), returning ``({name: (n, M, *shape)},
    None, None)``. Any model; ``randomness="different"`` (dropout draws per sample)."""
    fixed = {k: p.detach() for k, p in model.named_parameters()}
    params = {k: fixed[k] for k in names}

    def logits_one(p, xi):
        return functional_call(model, {**fixed, **p}, (xi.unsqueeze(0),))

    with torch.enable_grad(), math_attention():
        if y is None:
            jac = vmap(jacrev(lambda p, xi: logits_one(p, xi).squeeze(0)), in_dims=(None, 0), randomness="different")
            return jac(params, x), None, None

        def loss_one(p, xi, yi):
            out = logits_one(p, xi)
            loss = F.cross_entropy(out, yi.unsqueeze(0), reduction="sum")
            return loss, (loss.detach(), out.squeeze(0).detach())

        g, (losses, logits) = vmap(grad(loss_one, has_aux=True), in_dims=(None, 0, 0), randomness="different")(
            params, x, y
        )
    return g, losses, logits
