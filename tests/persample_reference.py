"""The slow, obviously correct per-sample engine the per-sample tests compare every route with: one
forward/backward per example."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn


class LoopEngine:
    """Reference per-sample engine: one forward/backward per example (slow, obviously correct).

    Implements the parts of the ``PerSampleEngine`` interface the Privatizer and the analyses use (``grads``,
    ``norms``, ``clipped_sum``, ``mean_grad``, ``projections`` with ``{name: tensor}`` directions); the loss is
    ``cross_entropy(f(x_i), y_i)``. Works on any model: the reference for models without a handler.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def _per_sample(self, x, y, masks):
        names = [n for n, _ in self.named]
        params = [p for _, p in self.named]
        grads: dict[str, list[torch.Tensor]] = {n: [] for n in names}
        losses, logits_all = [], []
        for i in range(x.shape[0]):
            logits = self.model(x[i : i + 1])
            loss = F.cross_entropy(logits, y[i : i + 1], reduction="sum")
            gs = torch.autograd.grad(loss, params)
            for n, g in zip(names, gs, strict=True):
                if masks is not None and n in masks:
                    g = g * masks[n]
                grads[n].append(g.detach())
            losses.append(loss.detach())
            logits_all.append(logits.detach())
        stacked = {n: torch.stack(v) for n, v in grads.items()}
        return stacked, torch.stack(losses), torch.cat(logits_all)

    def grads(self, x, y, *, masks=None) -> dict[str, torch.Tensor]:
        return self._per_sample(x, y, masks)[0]

    def norms(self, x, y, *, masks=None):
        return self._norms(*self._per_sample(x, y, masks))

    @staticmethod
    def _norms(grads, losses, logits):
        from landscape.persample import PerSampleNorms

        layers = {n: g.flatten(1).to(torch.float64).norm(dim=1) for n, g in grads.items()}
        flat = torch.stack(list(layers.values())).pow(2).sum(0).sqrt()
        return PerSampleNorms(flat=flat, layers=layers, loss=losses, logits=logits)

    def mean_grad(self, x, y, *, masks=None) -> dict[str, torch.Tensor]:
        return {n: g.mean(0) for n, g in self.grads(x, y, masks=masks).items()}

    def projections(self, x, y, directions: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """``P[i, j] = <g_i, v_j>`` from the per-example gradients."""
        grads = self.grads(x, y)
        return torch.stack(
            [sum((g.flatten(1) * v[n].reshape(-1).to(g.dtype)).sum(1) for n, g in grads.items()) for v in directions],
            dim=1,
        )

    def clipped_sum(self, x, y, factor_fn, *, masks=None):
        grads, losses, logits = self._per_sample(x, y, masks)
        norms = self._norms(grads, losses, logits)
        factors = factor_fn(norms)
        out = {}
        for n, g in grads.items():
            f = factors[n] if isinstance(factors, Mapping) else factors
            out[n] = torch.einsum("i,i...->...", f.to(g.dtype), g)
        return out, norms
