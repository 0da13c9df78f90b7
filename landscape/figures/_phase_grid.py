"""The Phase-1 x Phase-2 grid that Watson et al. Figs. 2, 6, 7 and 8 are drawn from, trained once per scale.

The design notes: docs/figures.md, "What each recipe measures" (phase-grid).
"""

from __future__ import annotations

import math

import numpy as np

from landscape.figures import _selection as selection_rule
from landscape.figures.recipe import checkpoint_curve, eps_text

OPTIMIZERS = ("sgd", "dpsgd")
ARMS = tuple(f"{p1}-{p2}" for p1 in OPTIMIZERS for p2 in OPTIMIZERS)  # the selection's arms
PAPER_LRS = (0.01, 0.05, 0.1, 0.5, 1.0)  # Watson et al., Appendix Sec. 8: the learning rates of their sweeps
PAPER_LR = {"sgd": 0.1, "dpsgd": 0.5}  # Watson et al. Sec. 4.1 "Training": each optimiser's own lr
_COMMON = dict(model="lenet", data="digits", lrs=PAPER_LRS, momenta=(0.0, 0.9), batch_size=32, max_grad_norm=1.0,
               target_epsilon=7.0, noise_multiplier=None, seed=0)
# Watson Fig. 2: sigma 0.55, C 1, epsilon ~ 7 after training; at test and cpu scale the accountant finds sigma for
# epsilon 7 on digits, at paper scale sigma is the paper's 0.55.
GRID = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "k": 1, "copies": 2, "lrs": (0.05, 0.5), "momenta": (0.9,)},
    # cpu: watson-fig16-17's lr grid at momentum 0 and 0.9; one selection copy per arm (docs/figures.md, "Cost")
    "cpu": {**_COMMON, "subset": None, "epochs": 10, "k": 4, "copies": 5, "selection_copies": 1,
            "lrs": (0.01, 0.03, 0.1)},
    "paper": {**_COMMON, "model": "resnet18", "data": "cifar10", "subset": None, "batch_size": 128,
              "target_epsilon": None, "noise_multiplier": 0.55, "momenta": (0.0,), "epochs": 30, "k": 3, "copies": 3},
}
MIN_HEIGHT = 0.02  # a barrier counts when the path rises above both ends by at least this share of ln C


def min_height(classes: int = 10) -> float:
    """The stated minimum barrier height: 2 % of ln C (ln C = the loss of the uniform prediction over C classes)."""
    return MIN_HEIGHT * math.log(classes)


POINTS = {"test": 5, "cpu": 20, "paper": 30}  # points on each interpolation path


def scales(paper: dict | None = None, **per_scale: dict) -> dict:
    """The ``SCALES`` of a recipe on the grid: per scale the grid's settings, the path points and ``per_scale``
    extras (``name -> {scale: value}``); ``paper`` overrides grid settings at paper scale where the recipe's
    figure was made with another setting (Fig. 8: k = 10; Figs. 6-7: k = 20, epsilon 5)."""
    grids = {**GRID, "paper": {**GRID["paper"], **(paper or {})}}
    return {scale: {"grid": settings, "points": POINTS[scale], **{k: v[scale] for k, v in per_scale.items()}}
            for scale, settings in grids.items()}


PREFIX = "watson-phase-grid"


def _own(ctx) -> str:
    """``""``, or ``kK-eE-nN`` (``sS`` for a fixed sigma) when a recipe overrides the shared grid (its own runs)."""
    g = ctx.settings["grid"]
    if g == GRID[ctx.scale]:
        return ""
    noise = f"e{g['target_epsilon']:g}" if g["target_epsilon"] is not None else f"s{g['noise_multiplier']:g}"
    return f"k{g['k']}-{noise}-n{g['epochs']}"


def base_config(ctx, lr: float, momentum: float, selection: bool = False):
    """The grid's base :class:`~landscape.api.TrainConfig` (seed 0, every epoch checkpointed) at ``lr``, ``momentum``;
    ``selection``: as selection runs (:func:`landscape.figures._selection.for_selection`)."""
    from landscape.api import TrainConfig

    g = ctx.settings["grid"]
    config = TrainConfig(model=g["model"], data=g["data"], subset=g["subset"], epochs=g["epochs"],
                         lr=lr, momentum=momentum, batch_size=g["batch_size"],
                         seed=g["seed"], max_grad_norm=g["max_grad_norm"], target_epsilon=g["target_epsilon"],
                         noise_multiplier=g["noise_multiplier"], checkpoint_every="1e", data_root=ctx.data_root)
    return selection_rule.for_selection(config) if selection else config


def _phases(ctx, momentum: float, lr: float, selection: bool = False) -> str:
    """Train (or reuse) the grid at one matched (momentum, lr); returns its group."""
    from landscape.api import PhasesConfig, phases

    g, own = ctx.settings["grid"], _own(ctx)
    name = f"{PREFIX}-{ctx.scale}{'-' + own if own else ''}{'-sel' if selection else ''}-m{momentum:g}-lr{lr:g}"
    phases(PhasesConfig(base=base_config(ctx, lr, momentum, selection), k=g["k"], copies=copies(ctx, selection),
                        phase1=OPTIMIZERS, phase2=OPTIMIZERS, dp_lr=lr, dp_momentum=momentum, group=name), root=ctx.root)
    return name


def copies(ctx, selection: bool = False) -> int:
    """Phase-2 copies per arm: the evaluation grid's ``copies``, a selection grid's ``selection_copies`` (default:
    as many)."""
    g = ctx.settings["grid"]
    return int(g.get("selection_copies", g["copies"])) if selection else int(g["copies"])


def label(candidate) -> str:
    m, lr = candidate
    return f"lr {lr:g}, momentum {m:g}"


def selection(ctx):
    """The claim-neutral choice of (momentum, lr) (:func:`landscape.figures._selection.select`): every candidate's
    selection grid, each arm's Phase-2 copies scored on the validation split."""
    from landscape.store import Store

    store, n, g = Store(ctx.root), copies(ctx, selection=True), ctx.settings["grid"]

    def train(candidate, arm):
        name = _phases(ctx, *candidate, selection=True)
        yield [store.run(f"{name}-{arm}-{i}") for i in range(n)]

    # the (momentum, lr) candidates in tie order: momentum 0 first, then the smaller lr
    candidates = [(float(m), float(lr)) for m in g["momenta"] for lr in g["lrs"]]
    return selection_rule.select(ctx, candidates, ARMS, train, label=label)


def grid_at(ctx, candidate) -> dict:
    """The evaluation grid (seed 0, the full training split) at one (momentum, lr), trained or reused: ``{"phase1":
    {p1: Run}, "phase2": {(p1, p2): [Run per copy]}, "group": name, "lr", "momentum"}``."""
    from landscape.store import Store

    m, lr = candidate
    g = ctx.settings["grid"]
    name = _phases(ctx, m, lr)
    store = Store(ctx.root)
    return {"phase1": {p1: store.run(f"{name}-{p1}") for p1 in OPTIMIZERS},
            "phase2": {(p1, p2): [store.run(f"{name}-{p1}-{p2}-{i}") for i in range(g["copies"])]
                       for p1 in OPTIMIZERS for p2 in OPTIMIZERS},
            "group": name, "lr": lr, "momentum": m}


def arm(setting: dict, sel, p1: str, p2: str) -> tuple[float, float]:
    """The candidate of arm ``p1 -> p2`` in a sensitivity ``setting``."""
    return sel.candidates[setting[f"{p1}-{p2}"]]


def scope_facts(ctx, runs: dict) -> None:
    """The grid's scope: the matched lr against the paper's own, epsilon actually spent per Phase-2 optimiser."""
    g = ctx.settings["grid"]
    ctx.scope(f"one matched lr {runs['lr']:g} (the paper: SGD {PAPER_LR['sgd']:g}, DP-SGD {PAPER_LR['dpsgd']:g}), "
              f"momentum {runs['momentum']:g}, k = {g['k']} of {g['epochs']} epochs",
              " / ".join(t for t in (f"SGD->DP {eps_text(runs['phase2'][('sgd', 'dpsgd')])}",
                                     f"DP->DP {eps_text(runs['phase2'][('dpsgd', 'dpsgd')])}")))


def joined_curve(phase1_run, phase2_run, metric: str):
    """A Phase-2 run's metric per epoch continued from its Phase-1 parent's (epochs counted from the start)."""
    e1, v1 = checkpoint_curve(phase1_run, metric)
    e2, v2 = checkpoint_curve(phase2_run, metric)
    if e2.size and e1.size and e2[0] < e1[-1]:  # the child counts its own epochs from 0
        e2 = e2 + e1[-1]
    return np.concatenate([e1, e2[1:]]), np.concatenate([v1, v2[1:]])


def height(path) -> float:
    """A path's height above both ends: ``max_a L(a) - max(L(0), L(1))`` (>= 0; 0 for a path that never rises above
    its higher end, however it bends)."""
    v = np.asarray(path, dtype=float)
    return float(v.max() - max(v[0], v[-1]))


def barriers_and_paths(table, pairs: list[str], split: str = "test") -> dict:
    """For each of ``pairs`` (``"A:B"`` run names, rows of the instability ``table``): the path's :func:`height`
    (what basin claims are judged on), the loss barrier above the chord and Watson et al.'s Def. 2.3 instability
    (reported beside it) on ``split``, and the path's loss: ``{"height", "chord", "def23", "paths"}``."""
    from landscape.analyze.interpolate import InterpolationResult

    by_pair = {f"{r.ref_a}:{r.ref_b}": r for r in table.rows}
    missing = [p for p in pairs if p not in by_pair]
    if missing:
        raise RuntimeError(f"instability table lacks the pairs {missing}")
    rows = [by_pair[p] for p in pairs]
    paths = [InterpolationResult.from_hdf5(r.result).loss[split] for r in rows]
    return {"height": [height(p) for p in paths], "chord": [float(r.chord_barrier_loss[split]) for r in rows],
            "def23": [float(r.instability_loss[split]) for r in rows], "paths": paths}


def ends(pairs: list[str]) -> list[str]:
    """The run names at both ends of ``"A:B"`` pairs (what a part judged from those pairs rests on)."""
    return [name for p in pairs for name in p.split(":")]


def sibling_pairs(copies: int) -> list[tuple[int, int]]:
    """Every pair of ``copies`` sibling copies, in the order the recipes list them (the pairs' units)."""
    import itertools

    return list(itertools.combinations(range(copies), 2))


BARRIER = ("Barrier = the path's height above both ends on the test loss (max_a L(a) - max(L(0), L(1))), judged "
           "against a minimum height of 2% of ln C; the chord barrier (sup_a L(a) - ((1-a) L(0) + a L(1)), which a "
           "monotone but bent path has too) and Def. 2.3 instability are stored beside it.")
