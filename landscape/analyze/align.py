"""Permutation alignment of two networks by weight matching (Ainsworth, Hayase & Srinivasa 2023, "Git Re-Basin").

Hidden units can be permuted without changing the function a network computes: permute the output units of
a layer and, the same way, the input units of every layer that reads them. Two independently trained
networks may sit in different "basins" only because their units are in different orders, so a barrier on
the straight path between them (Watson et al. Def. 2.3) may be an artefact of that symmetry. Weight
matching (Git Re-Basin Sec. 3.2, Alg. 1) looks for the permutation ``pi`` of B's units that maximises
``sum_l <W_l^A, P_l W_l^B P_{l-1}^T>_F``; it is solved one permutation ``P_l`` at a time (the others held
fixed) as a linear assignment problem over the sum, over every tensor that ``P_l`` touches, of the unit
similarities ``W^A (W^B)^T`` (units along that tensor's permuted axis, everything else flattened), iterated
over the permutations in random order until a full pass changes none.

**The permutation-structure protocol.** A :class:`PermutationSpec` says which tensor axes each permutation moves.
:func:`permutation_spec` finds a model's spec, in this order:

1. the model's own ``permutation_spec()`` method (any ``nn.Module``, e.g. one from user code): it returns a
   :class:`PermutationSpec` (build it with :class:`SpecBuilder`, or :func:`chain_spec` for a feed-forward
   stack) or a plain mapping ``{permutation name: [(state-dict key, axis), (key, axis, inner), ...]}`` whose unit
   counts are read from the tensors;
2. a builder registered with :func:`register_spec` for the model's ``landscape_spec`` name or for its class
   (``builder(model, name) -> PermutationSpec``);
3. otherwise alignment refuses in one line (a :class:`~landscape.errors.ModelError` naming the model).

A spec is checked against the state dict (every key present, every axis of the right size);
:func:`check_function_kept` checks on inputs that a random permutation leaves the logits unchanged (the api runs
it for a spec that is not built in). The built-in architectures are registered examples:

- ``mlp``, ``two-layer-linear``: one permutation per hidden layer (rows of its weight and bias, columns of
  the next weight). Element-wise activations commute with permutations.
- ``lenet``, ``opacus-cnn``: one per conv layer's output channels (also the next conv's input channels;
  max-pooling acts per channel) and per hidden fully connected layer. The first Linear after ``Flatten``
  reads ``C x H x W`` features channel-major, so channel ``c`` moves its block of ``H*W`` columns.
- ``resnet18``: the residual stream of each stage shares one permutation (the stem conv and norm, every
  block's second conv and norm, the downsample conv and norm that opens the stage, the next blocks' first
  convs, and ``fc``'s columns after the last stage), and every block has one for its inner channels.
  BatchNorm's running mean and variance move with their channels (they do not vote in the matching).
  GroupNorm normalises over contiguous groups of channels, so a permutation keeps the function only if it
  maps whole groups onto whole groups; the assignment is then solved exactly under that constraint (best
  within-group assignment for every pair of groups, then an assignment of groups). Layers alignment does
  not know (depthwise convs, other block types, a norm whose groups disagree with another on the same
  permutation) are refused with a one-line :class:`~landscape.errors.ModelError`.

Permutations are index tensors ``perm`` with the convention of the reference implementation: the permuted
state takes unit ``i`` from B's unit ``perm[i]`` (``index_select(axis, perm)``). Pure: state dicts in, state
dicts out; it never opens the store.
"""

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
from landscape.errors import ModelError, UsageError


class Permutations(dict):
    """Permutation name -> int64 index tensor, with how weight matching got there."""

    iterations: int = 0  # full passes over the permutations
    converged: bool = True  # the last pass changed no permutation (False: stopped at max_iter)


def _check_states(spec: PermutationSpec, state_a: Mapping[str, torch.Tensor],
                  state_b: Mapping[str, torch.Tensor]) -> None:
    from landscape.params import check_compatible

    check_compatible(state_a, state_b, names=("A", "B"))
    _check_spec_fits(spec, state_a)
    for label, state in (("A", state_a), ("B", state_b)):
        for key, t in state.items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                bad = int((~torch.isfinite(t)).sum())
                raise ModelError(f"{label} has {bad} non-finite value(s) in {key!r}; alignment needs finite weights "
                                 "(did the run diverge?)")


def assign(similarity: np.ndarray, groups: int = 1) -> np.ndarray:
    """``perm`` maximising ``sum_i S[i, perm[i]]``, mapping whole contiguous groups onto whole groups.

    With ``groups > 1`` the optimum under that constraint is exact: for every pair of groups the best
    within-group assignment (a small linear assignment), then the best assignment of groups on those values.
    """
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
    """Permutations of B's units that make B's weights most similar to A's (Git Re-Basin Alg. 1).

    Start from the identity; in each pass visit the permutations in a seeded random order and replace ``P_l``
    by the linear assignment maximising ``sum_{(W, axis) in P_l} <W^A, W^B permuted by the others>`` when
    that strictly improves the objective; stop after a pass that changes nothing (``converged``) or after
    ``max_iter`` passes. Similarities are accumulated in float64. Only parameters vote (not running stats).
    """
    if int(max_iter) != max_iter or max_iter < 1:
        raise UsageError(f"--max-iter must be a positive integer, got {max_iter}")
    _check_states(spec, state_a, state_b)
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
    """B permuted to match A by weight matching, for ``model``'s architecture (see :func:`weight_matching`;
    ``spec`` defaults to :func:`permutation_spec` of the model)."""
    spec = spec if spec is not None else permutation_spec(model)
    perms = weight_matching(spec, state_a, state_b, seed=seed, max_iter=max_iter)
    state = apply_permutation(spec, perms, state_b)
    return Alignment(state, perms, spec, _distance(state_a, state_b), _distance(state_a, state))


def _distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    total = 0.0
    for k, t in a.items():
        if t.is_floating_point():
            total += float(torch.sum((b[k].double() - t.double()) ** 2))
    return math.sqrt(total)
