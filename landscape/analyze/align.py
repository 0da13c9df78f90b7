"""Permutation alignment of two networks by weight matching (Ainsworth, Hayase & Srinivasa 2023, "Git
Re-Basin"): permuting hidden units keeps the function, so a barrier may be an artefact of unit order. Pure:
state dicts in and out; the permutation protocol is docs/alignment.md."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from landscape.analyze.permutations import (
    PermutationSpec,
    _check_spec_fits,
    _permuted,
    _units,
    apply_permutation,
    identity,
    permutation_spec,
)
from landscape.errors import ModelError, OptionError


class Permutations(dict):
    """Permutation name -> int64 index tensor, with how weight matching got there."""

    iterations: int = 0  # full passes over the permutations
    converged: bool = True  # the last pass changed no permutation (False: stopped at max_iter)


def assign(similarity: np.ndarray, groups: int = 1) -> np.ndarray:
    """``perm`` maximising ``sum_i S[i, perm[i]]``, mapping whole contiguous groups onto whole groups (exact:
    the best assignment within every pair of groups, then of groups on those values)."""
    s = np.asarray(similarity, dtype=np.float64)
    n = s.shape[0]
    size = n // groups
    if groups == 1 or size == 1:
        return linear_sum_assignment(s, maximize=True)[1]
    blocks = s.reshape(groups, size, groups, size).transpose(0, 2, 1, 3)
    value = np.empty((groups, groups))
    inner = np.empty((groups, groups, size), dtype=np.int64)
    for a in range(groups):
        for b in range(groups):
            _, cols = linear_sum_assignment(blocks[a, b], maximize=True)
            inner[a, b] = cols
            value[a, b] = blocks[a, b][np.arange(size), cols].sum()
    _, to = linear_sum_assignment(value, maximize=True)
    return (to[:, None] * size + inner[np.arange(groups), to]).reshape(-1)


def weight_matching(spec: PermutationSpec, state_a: Mapping[str, torch.Tensor], state_b: Mapping[str, torch.Tensor],
                    seed: int = 0, max_iter: int = 100) -> Permutations:
    """Permutations of B's units that make B's weights most similar to A's (Git Re-Basin Alg. 1), pass after
    seeded pass, until a pass changes nothing (``converged``) or ``max_iter`` passes."""
    from landscape.params import check_compatible

    if int(max_iter) != max_iter or max_iter < 1:
        raise OptionError("max_iter", f"must be a positive integer, got {max_iter}")
    check_compatible(state_a, state_b, names=("A", "B"))
    _check_spec_fits(spec, state_a)
    for label, state in (("A", state_a), ("B", state_b)):
        for key, t in state.items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                bad = int((~torch.isfinite(t)).sum())
                raise ModelError(f"{label} has {bad} non-finite value(s) in {key!r}; alignment needs finite weights "
                                 "(did the run diverge?)")
    a = {k: v.detach().to(torch.float64) for k, v in state_a.items() if k in spec.by_key}
    b = {k: v.detach().to(torch.float64) for k, v in state_b.items() if k in spec.by_key}
    a_units = {(p.name, i): _units(a[ax.key], ax, p.size) for p in spec.perms for i, ax in enumerate(p.axes)
               if ax.match}
    perms = Permutations(identity(spec))
    rng = np.random.default_rng(int(seed))
    for it in range(int(max_iter)):
        changed = False
        for index in rng.permutation(len(spec.perms)):
            p = spec.perms[index]
            sim = torch.zeros(p.size, p.size, dtype=torch.float64)
            for i, ax in enumerate(p.axes):
                if ax.match:
                    wb = _permuted(spec, perms, ax.key, b[ax.key], skip=ax)
                    sim.addmm_(a_units[p.name, i], _units(wb, ax, p.size).T)
            sim_np = sim.numpy()
            new = assign(sim_np, p.groups)
            old = perms[p.name].numpy()
            rows = np.arange(p.size)
            gain = sim_np[rows, new].sum() - sim_np[rows, old].sum()
            if gain > 1e-12 * max(1.0, float(np.abs(sim_np[rows, old]).sum())):
                perms[p.name] = torch.from_numpy(np.asarray(new, dtype=np.int64))
                changed = True
        perms.iterations = it + 1
        if not changed:
            perms.converged = True
            break
    else:
        perms.converged = False
    return perms


def similarity(spec: PermutationSpec, state_a: Mapping[str, torch.Tensor], state_b: Mapping[str, torch.Tensor]) -> float:
    """Weight matching's objective ``sum <W^A, W^B>`` over the tensors that vote (float64)."""
    keys = {ax.key for p in spec.perms for ax in p.axes if ax.match}
    return float(sum(torch.sum(state_a[k].double() * state_b[k].double()) for k in sorted(keys)))


@dataclass
class Alignment:
    """B aligned to A: the permuted state, the permutations, and how much they moved (for reports)."""

    state: dict[str, torch.Tensor]
    perms: Permutations
    spec: PermutationSpec
    distance_before: float  # ||theta_B - theta_A||_2 over the floating tensors
    distance_after: float

    def rows(self) -> list[dict]:
        """One row per permutation: units, norm groups, and how many units it moved."""
        return [{"permutation": p.name, "units": p.size, "groups": p.groups,
                 "moved": int((self.perms[p.name] != torch.arange(p.size)).sum())} for p in self.spec.perms]


def align_states(model: nn.Module, state_a: Mapping[str, torch.Tensor], state_b: Mapping[str, torch.Tensor], *,
                 seed: int = 0, max_iter: int = 100, spec: PermutationSpec | None = None) -> Alignment:
    """B permuted to match A by weight matching, for ``model`` (``spec``: its permutation spec)."""
    spec = spec if spec is not None else permutation_spec(model)
    perms = weight_matching(spec, state_a, state_b, seed=seed, max_iter=max_iter)
    state = apply_permutation(spec, perms, state_b)
    return Alignment(state, perms, spec, _distance(state_a, state_b), _distance(state_a, state))


def _distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(torch.sum((b[k].double() - t.double()) ** 2)) for k, t in a.items()
                         if t.is_floating_point()))
