"""The Phase-1 x Phase-2 grid that Watson et al. Figs. 2, 6, 7 and 8 are drawn from, trained once per scale.

Sec. 4.1.1: SGD and DP-SGD train ``k`` epochs from one initialisation (Phase 1); from each, SGD and DP-SGD train
the remaining epochs in ``copies`` copies that differ in data order and noise (Phase 2). The recipes
``watson-fig2``, ``watson-fig6-7`` and ``watson-fig8`` (and ``watson-fig3``, for its sibling reference) read the
same runs (group ``watson-phase-grid-SCALE-mM-lrLR``, named by the matched momentum and lr), so whichever runs first
trains them and the others reuse them; their settings include :data:`GRID` so a change of the grid changes all
their summaries. At cpu scale the grid has 5 Phase-2 copies (3 before; set before any matched run was made, the
paper averages 3-5 runs).

Fair comparison: matched learning rate, batch size and momentum. SGD and DP-SGD use ONE learning rate, ONE
momentum and the same batch size in both phases, so a difference between the optimisers -- in accuracy, or in
how far a Phase-2 run moves from its start -- is not a difference of step size. The pair (momentum, lr) is chosen
claim-blind by :func:`choose_lr`: over ``momenta`` x ``lrs`` (the lrs of the paper's own sweep, Appendix Sec. 8:
{0.01, 0.05, 0.1, 0.5, 1.0}; momentum 0 as in the paper's "without momentum", and 0.9 at the scaled-down scales)
the whole grid is trained -- every Phase-2 copy the recipes will judge -- and each candidate is scored by its
*worst run* (:func:`worst_run`): the lowest, over the four Phase-1 -> Phase-2 arms and every copy, of the worst
train accuracy over the run's last 3 checkpoints. That is the validity gate's concern (every end model usable and
not collapsing in its last epochs) measured on train data, on exactly the runs the gate will check; ties:
momentum 0 first, then the smaller lr. The selection reads train accuracy only (never test accuracy,
interpolations, barriers or any verdict input), never compares arms, and maximising the worst run works against a
large gap between arms, not for it. The chosen candidate's grid is the grid (reused, not retrained). The recipes
store the grid, every run's score and the choice (:func:`lr_numbers`). :func:`search` makes the same choice for a
recipe whose arms are trained separately (``watson-fig5``), leaving untrained what could not be chosen.

What was tried, in order (each change made because end models failed the validity gate, never for a verdict):
an earlier version compared SGD at lr 0.03 with momentum 0.9 against DP-SGD at lr 0.5 without momentum
(unmatched). A first matched version searched the lr at the paper's momentum 0 only, scored by the lower final
train accuracy of a plain SGD and a plain DP-SGD run from scratch: it chose lr 0.1, where plain SGD on digits
oscillates (test accuracy swinging between 0.95 and 0.75 between epochs) and 2 of the 20 Phase-2 runs collapsed.
A second one added momentum 0.9 and the last-3 window to that from-scratch score: it chose lr 0.05 with momentum
0.9, where every DP -> SGD run diverged to chance (SGD with momentum from the DP Phase-1 model), which no
from-scratch run can show -- hence the grid's own arms. A third scored each candidate's grid by its worst arm with
ONE Phase-2 copy (copy 0): it chose lr 0.1 / momentum 0 again, and with all 5 copies 2 of the 20 Phase-2 runs
collapsed in their last epochs (SGD -> SGD copy 1, DP -> SGD copy 3), so every grid recipe was an invalid regime:
one copy cannot see an oscillation that strikes some copies only. The fourth rule (this one) scores every copy,
the quantity the gate checks; it was fixed before any verdict under it was looked at. It trains every candidate's
whole grid, about four times the one-copy selection's training. The paper itself tuned each optimiser
separately (SGD lr 0.1 / batch 128, DP-SGD lr 0.5 / batch 1024, Sec. 4.1 "Training"); at paper scale the grid
keeps the paper's model, data, epochs, k, sigma 0.55, C = 1 and momentum 0, and matches the lr (from the
paper's sweep) and the batch (the paper's SGD batch of 128).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from landscape.figures.recipe import best, checkpoint_curve, worst_recent

OPTIMIZERS = ("sgd", "dpsgd")
PAPER_LRS = (0.01, 0.05, 0.1, 0.5, 1.0)  # Watson et al., Appendix Sec. 8: the learning rates of their sweeps
_COMMON = dict(model="lenet", data="digits", lrs=PAPER_LRS, momenta=(0.0, 0.9), batch_size=32, max_grad_norm=1.0,
               target_epsilon=7.0, noise_multiplier=None, seed=0)
NOT_TRAINED = -1.0  # a score of :func:`search` for a run it did not need to train (below every accuracy)
WINDOW = 3  # the selection score: the worst train accuracy over a run's last WINDOW checkpoints (the gate's window)
# Watson Fig. 2: sigma 0.55, C 1, epsilon ~ 7 after training; at test and cpu scale the accountant finds sigma for
# epsilon 7 on digits, at paper scale sigma is the paper's 0.55.
GRID = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "k": 1, "copies": 2, "lrs": (0.05, 0.5)},
    "cpu": {**_COMMON, "subset": None, "epochs": 10, "k": 4, "copies": 5},
    "paper": {**_COMMON, "model": "resnet18", "data": "cifar10", "subset": None, "batch_size": 128,
              "target_epsilon": None, "noise_multiplier": 0.55, "momenta": (0.0,), "epochs": 30, "k": 3, "copies": 3},
}


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


def base_config(ctx, lr: float, momentum: float):
    """The grid's base :class:`~landscape.api.TrainConfig` (seed 0, every epoch checkpointed) at ``lr``, ``momentum``."""
    from landscape.api import TrainConfig

    g = ctx.settings["grid"]
    return TrainConfig(model=g["model"], data=g["data"], subset=g["subset"], epochs=g["epochs"],
                       lr=lr, momentum=momentum, batch_size=g["batch_size"],
                       seed=g["seed"], max_grad_norm=g["max_grad_norm"], target_epsilon=g["target_epsilon"],
                       noise_multiplier=g["noise_multiplier"], checkpoint_every="1e", data_root=ctx.data_root)


def _group(ctx, momentum: float, lr: float) -> str:
    own = _own(ctx)
    return f"{PREFIX}-{ctx.scale}{'-' + own if own else ''}-m{momentum:g}-lr{lr:g}"


def _phases(ctx, momentum: float, lr: float, copies: int) -> str:
    """Train (or reuse) the grid at one matched (momentum, lr) with ``copies`` Phase-2 copies; returns its group."""
    from landscape.api import PhasesConfig, phases

    g, name = ctx.settings["grid"], _group(ctx, momentum, lr)
    phases(PhasesConfig(base=base_config(ctx, lr, momentum), k=g["k"], copies=copies, phase1=OPTIMIZERS,
                        phase2=OPTIMIZERS, dp_lr=lr, dp_momentum=momentum, group=name), root=ctx.root)
    return name


def choose_lr(ctx) -> tuple[float, float, dict[str, list[list[list[float]]]]]:
    """The one (momentum, lr) of both optimisers, chosen claim-blind (module docstring): ``(momentum, lr, {arm:
    score per momentum per lr per copy})`` with arms ``"P1-P2"``. Each candidate trains the whole grid (every
    Phase-2 copy; the chosen candidate's grid is the grid: reused, not retrained) and is scored by its worst run
    (:func:`worst_run`); the selection never compares arms and reads train accuracy only."""
    from landscape.store import Store

    g = ctx.settings["grid"]
    store, scores = Store(ctx.root), {f"{p1}-{p2}": [] for p1 in OPTIMIZERS for p2 in OPTIMIZERS}
    for m in g["momenta"]:
        for arm in scores.values():
            arm.append([])
        for lr in g["lrs"]:
            name = _phases(ctx, m, lr, g["copies"])
            for arm, values in scores.items():
                values[-1].append([worst_recent(store.run(f"{name}-{arm}-{i}"), "train_acc", WINDOW)
                                   for i in range(g["copies"])])
    candidates = [(m, lr) for m in g["momenta"] for lr in g["lrs"]]
    momentum, lr = best(candidates, worst_run(scores))
    return momentum, lr, scores


def worst_run(scores: dict) -> np.ndarray:
    """Each candidate's selection score, flattened ``(momenta x lrs)``: the lowest, over every arm and every Phase-2
    copy, of the worst train accuracy over the run's last :data:`WINDOW` checkpoints (NaN, e.g. a diverged run,
    loses)."""
    a = np.stack([np.asarray(v, dtype=float) for v in scores.values()])  # (arms, momenta, lrs, copies)
    a = np.nan_to_num(a, nan=-np.inf)
    return a.min(axis=(0, 3)).ravel()


def search(candidates: list, arms: list, score: Callable[[Any, Any], list[float]]) -> tuple[Any, dict]:
    """The same worst-run choice (:func:`worst_run` then :func:`best`, ties: the earlier candidate) without training
    what cannot be chosen: ``(choice, {arm: score per candidate per run})`` for a recipe whose arms are trained
    separately. ``score(candidate, arm)`` trains (or reuses) one arm's runs at ``candidate`` and returns their
    scores (:func:`~landscape.figures.recipe.worst_recent` over the last :data:`WINDOW` checkpoints). Candidates go
    in tie order, each one's arms in ``arms`` order; as soon as a candidate has a run scoring no higher than the
    best worst run of an earlier, fully scored candidate, its remaining arms are not trained (:data:`NOT_TRAINED`,
    below every accuracy): its worst run can be no better and the tie goes to the earlier one, so it could not be
    chosen. The result is therefore the choice of training every candidate (the exhaustive argmax is never cut: it
    beats every earlier candidate), and :func:`worst_run` / :func:`best` on the returned table give it again."""
    scores: dict[Any, list[list[float]]] = {arm: [] for arm in arms}
    complete = -np.inf  # the best worst run of the fully scored candidates so far
    for candidate in candidates:
        low = np.inf
        for arm in arms:
            if low <= complete:
                scores[arm].append([NOT_TRAINED] * len(scores[arms[0]][-1]))  # cannot be chosen
                continue
            values = [float(v) for v in score(candidate, arm)]
            scores[arm].append(values)
            low = min(low, float(np.min(np.nan_to_num(values, nan=-np.inf))))
        if low > complete:
            complete = low
    choice = best(candidates, worst_run({arm: [table] for arm, table in scores.items()}))  # one "momentum" axis
    return choice, scores


def lr_numbers(grid: dict) -> dict:
    """The claim-blind choice of a trained grid as summary numbers (``lr_grid/*``, ``lr_chosen``,
    ``momentum_chosen``); the scores are ``(momenta, lrs, copies)`` tables per arm."""
    return {"lr_grid/lr": list(grid["lrs"]), "lr_grid/momentum": list(grid["momenta"]),
            **{f"lr_grid/{arm}/train_acc": v for arm, v in grid["scores"].items()},
            "lr_chosen": grid["lr"], "momentum_chosen": grid["momentum"]}


def lr_note(grid: dict) -> str:
    """One sentence for a verdict's note: the matched settings and how they were chosen."""
    return (f"SGD and DP-SGD at one matched lr {grid['lr']:g}, momentum {grid['momentum']:g} and batch (chosen "
            f"claim-blind: the best lowest worst-of-the-last-{WINDOW} train accuracy over every arm and Phase-2 copy, "
            f"over lr {tuple(grid['lrs'])} x momentum {tuple(grid['momenta'])}).")


def train_grid(ctx) -> dict:
    """Choose the momentum and lr (:func:`choose_lr`, which trains every candidate's whole grid) and return the
    chosen grid: ``{"phase1": {p1: Run}, "phase2": {(p1, p2): [Run per copy]}, "group": name, "lr", "momentum",
    "lrs", "momenta", "scores"}``."""
    from landscape.store import Store

    g = ctx.settings["grid"]
    momentum, lr, scores = choose_lr(ctx)
    name = _group(ctx, momentum, lr)
    store = Store(ctx.root)
    return {"phase1": {p1: store.run(f"{name}-{p1}") for p1 in OPTIMIZERS},
            "phase2": {(p1, p2): [store.run(f"{name}-{p1}-{p2}-{i}") for i in range(g["copies"])]
                       for p1 in OPTIMIZERS for p2 in OPTIMIZERS},
            "group": name, "lr": lr, "momentum": momentum, "lrs": tuple(g["lrs"]), "momenta": tuple(g["momenta"]),
            "scores": scores}


def joined_curve(phase1_run, phase2_run, metric: str):
    """A Phase-2 run's metric per epoch continued from its Phase-1 parent's (epochs counted from the start)."""
    e1, v1 = checkpoint_curve(phase1_run, metric)
    e2, v2 = checkpoint_curve(phase2_run, metric)
    if e2.size and e1.size and e2[0] < e1[-1]:  # the child counts its own epochs from 0
        e2 = e2 + e1[-1]
    return np.concatenate([e1, e2[1:]]), np.concatenate([v1, v2[1:]])


def pair_rows(table, pairs: list[str]) -> list:
    """The rows of an instability table for the explicit ``pairs`` (``"A:B"`` run names), in that order."""
    rows = {f"{r.ref_a}:{r.ref_b}": r for r in table.rows}
    missing = [p for p in pairs if p not in rows]
    if missing:
        raise RuntimeError(f"instability table lacks the pairs {missing}")
    return [rows[p] for p in pairs]


def barriers_and_paths(table, pairs: list[str], split: str = "test") -> tuple[list[float], list[float], list]:
    """For each of ``pairs``: the loss barrier above the chord (what basin claims are judged on), Watson et al.'s
    Def. 2.3 instability (reported beside it) on ``split``, and the path's loss (from the pair's own file)."""
    from landscape.analyze.interpolate import InterpolationResult

    rows = pair_rows(table, pairs)
    return ([float(r.chord_barrier_loss[split]) for r in rows], [float(r.instability_loss[split]) for r in rows],
            [InterpolationResult.from_hdf5(r.result).loss[split] for r in rows])


def ends(pairs: list[str]) -> list[str]:
    """The run names at both ends of ``"A:B"`` pairs (what a part judged from those pairs rests on)."""
    return [name for p in pairs for name in p.split(":")]


BARRIER = ("Barrier = the test loss above the chord between the end losses (sup_a L(a) - ((1-a) L(0) + a L(1))); "
           "Def. 2.3 instability (sup minus the end losses' mean) is stored beside it but not judged on, since it "
           "is never below half the end-loss gap and so also 'holds' when one end model is merely worse.")
