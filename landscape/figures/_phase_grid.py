"""The Phase-1 x Phase-2 grid that Watson et al. Figs. 2, 6, 7 and 8 are drawn from, trained once per scale.

Sec. 4.1.1: SGD and DP-SGD train ``k`` epochs from one initialisation (Phase 1); from each, SGD and DP-SGD train
the remaining epochs in ``copies`` copies that differ in data order and noise (Phase 2). The recipes
``watson-fig2``, ``watson-fig6-7`` and ``watson-fig8`` (and ``watson-fig3``, for its sibling reference) read the
same runs (group ``watson-phase-grid-SCALE-lrLR``), so whichever runs first trains them and the others reuse them;
their settings include :data:`GRID` so a change of the grid changes all their summaries.

Fair comparison: matched learning rate, batch size and momentum. SGD and DP-SGD use ONE learning rate, the same
batch size and no momentum (the paper trains "without momentum"), so a difference between the optimisers -- in
accuracy, or in how far a Phase-2 run moves from its start -- is not a difference of step size. The lr is chosen
claim-blind by :func:`choose_lr` before any grid run exists: over ``lrs`` (at every scale the learning rates of
the paper's own sweep, Appendix Sec. 8: {0.01, 0.05, 0.1, 0.5, 1.0}), one plain SGD run and one plain DP-SGD run
of the full length (seed 0, the grid's batch, epsilon and epochs) per lr, scored by the *lower* of their two
final train accuracies (the rule of ``watson-fig10`` and ``watson-fig16-17``: both optimisers usable; ties: the
smaller lr). The recipes store the grid, both scores per lr and the choice (:func:`lr_numbers`). An earlier
version compared SGD at lr 0.03 with momentum 0.9 against DP-SGD at lr 0.5 without momentum. The paper itself
tuned each optimiser separately (SGD lr 0.1 / batch 128, DP-SGD lr 0.5 / batch 1024, Sec. 4.1 "Training"); at
paper scale the grid keeps the paper's model, data, epochs, k, sigma 0.55 and C = 1 but matches lr (from the
paper's sweep) and batch (the paper's SGD batch of 128).
"""

from __future__ import annotations

import dataclasses

from landscape.figures.recipe import best, checkpoint_curve, lr_scores

OPTIMIZERS = ("sgd", "dpsgd")
PAPER_LRS = (0.01, 0.05, 0.1, 0.5, 1.0)  # Watson et al., Appendix Sec. 8: the learning rates of their sweeps
_COMMON = dict(model="lenet", data="digits", lrs=PAPER_LRS, momentum=0.0, batch_size=32, max_grad_norm=1.0,
               target_epsilon=7.0, noise_multiplier=None, seed=0)
# Watson Fig. 2: sigma 0.55, C 1, epsilon ~ 7 after training; at test and cpu scale the accountant finds sigma for
# epsilon 7 on digits, at paper scale sigma is the paper's 0.55.
GRID = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "k": 1, "copies": 2, "lrs": (0.1, 0.5)},
    "cpu": {**_COMMON, "subset": None, "epochs": 10, "k": 4, "copies": 5},
    "paper": {**_COMMON, "model": "resnet18", "data": "cifar10", "subset": None, "batch_size": 128,
              "target_epsilon": None, "noise_multiplier": 0.55, "epochs": 30, "k": 3, "copies": 3},
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


def base_config(ctx, lr: float | None = None):
    """The grid's SGD :class:`~landscape.api.TrainConfig` (seed 0, every epoch checkpointed) at ``lr``."""
    from landscape.api import TrainConfig

    g = ctx.settings["grid"]
    return TrainConfig(model=g["model"], data=g["data"], subset=g["subset"], epochs=g["epochs"],
                       lr=g["lrs"][0] if lr is None else lr, momentum=g["momentum"], batch_size=g["batch_size"],
                       seed=g["seed"], max_grad_norm=g["max_grad_norm"], target_epsilon=g["target_epsilon"],
                       noise_multiplier=g["noise_multiplier"], checkpoint_every="1e", data_root=ctx.data_root)


def choose_lr(ctx) -> tuple[float, dict[str, list[float]]]:
    """The one learning rate of both optimisers, chosen claim-blind (module docstring): ``(lr, {optimiser: final
    train accuracy per lr of the grid})``. The selection runs are shared by every recipe on the grid (run names
    ``watson-phase-grid-SCALE-select-OPT-lrLR-0``) and are no end models (not gated)."""
    g, own = ctx.settings["grid"], _own(ctx)
    shared = dataclasses.replace(ctx, name=PREFIX)  # run names PREFIX-SCALE-..., whichever recipe trains them
    dp = dataclasses.replace(base_config(ctx), optimizer="dpsgd", checkpoint_every="none")  # final numbers only
    configs = {"sgd": dataclasses.replace(dp, optimizer="sgd", noise_multiplier=None, target_epsilon=None), "dpsgd": dp}
    scores = {p: lr_scores(shared, f"{own + '-' if own else ''}select-{p}", configs[p], g["lrs"], "train_acc")
              for p in OPTIMIZERS}
    return best(g["lrs"], [min(s) for s in zip(*scores.values(), strict=True)]), scores


def lr_numbers(grid: dict) -> dict:
    """The claim-blind lr choice of a trained grid as summary numbers (``lr_grid/*``, ``lr_chosen``)."""
    return {"lr_grid/lr": list(grid["lrs"]), **{f"lr_grid/{p}/train_acc": grid["scores"][p] for p in OPTIMIZERS},
            "lr_chosen": grid["lr"]}


def lr_note(grid: dict) -> str:
    """One sentence for a verdict's note: the matched lr and how it was chosen."""
    return (f"SGD and DP-SGD at one matched lr {grid['lr']:g}, batch and momentum (lr chosen claim-blind: the best "
            f"lower final train accuracy of a plain SGD and a plain DP-SGD run over {tuple(grid['lrs'])}).")


def train_grid(ctx) -> dict:
    """Choose the lr (:func:`choose_lr`) and train (or reuse) the grid; returns ``{"phase1": {p1: Run}, "phase2":
    {(p1, p2): [Run per copy]}, "group": name, "lr": lr, "lrs": grid, "scores": {opt: [train acc per lr]}}``."""
    from landscape.api import PhasesConfig, phases
    from landscape.store import Store

    g = ctx.settings["grid"]
    lr, scores = choose_lr(ctx)
    own = _own(ctx)
    name = f"{PREFIX}-{ctx.scale}{'-' + own if own else ''}-lr{lr:g}"
    phases(PhasesConfig(base=base_config(ctx, lr), k=g["k"], copies=g["copies"], phase1=OPTIMIZERS,
                        phase2=OPTIMIZERS, dp_lr=lr, dp_momentum=g["momentum"], group=name), root=ctx.root,
           progress=False)
    store = Store(ctx.root)
    return {"phase1": {p1: store.run(f"{name}-{p1}") for p1 in OPTIMIZERS},
            "phase2": {(p1, p2): [store.run(f"{name}-{p1}-{p2}-{i}") for i in range(g["copies"])]
                       for p1 in OPTIMIZERS for p2 in OPTIMIZERS},
            "group": name, "lr": lr, "lrs": tuple(g["lrs"]), "scores": scores}


def joined_curve(phase1_run, phase2_run, metric: str):
    """A Phase-2 run's metric per epoch continued from its Phase-1 parent's (epochs counted from the start)."""
    import numpy as np

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
