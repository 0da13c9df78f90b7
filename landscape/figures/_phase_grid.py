"""The Phase-1 x Phase-2 grid that Watson et al. Figs. 2, 6, 7 and 8 are drawn from, trained once per scale.

Sec. 4.1.1: SGD and DP-SGD train ``k`` epochs from one initialisation (Phase 1); from each, SGD and DP-SGD train
the remaining epochs in ``copies`` copies that differ in data order and noise (Phase 2). The recipes
``watson-fig2``, ``watson-fig6-7`` and ``watson-fig8`` read the same runs (group ``watson-phase-grid-SCALE``),
so whichever runs first trains them and the others reuse them; their settings include :data:`GRID` so a
change of the grid changes all three summaries.
"""

from __future__ import annotations

from landscape.figures.recipe import checkpoint_curve

OPTIMIZERS = ("sgd", "dpsgd")
_COMMON = dict(model="lenet", data="digits", lr=0.03, dp_lr=0.5, batch_size=32, max_grad_norm=1.0,
               target_epsilon=7.0, seed=0)
# Watson Fig. 2: sigma 0.55, C 1, epsilon ~ 7 after training; here the accountant finds sigma for epsilon 7.
GRID = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "k": 1, "copies": 2},
    "cpu": {**_COMMON, "subset": None, "epochs": 10, "k": 4, "copies": 3},
    "paper": {**_COMMON, "model": "resnet18", "data": "cifar10", "subset": None, "lr": 0.1, "batch_size": 128,
              "epochs": 30, "k": 3, "copies": 3},
}


POINTS = {"test": 5, "cpu": 20, "paper": 30}  # points on each interpolation path


def scales(paper: dict | None = None, **per_scale: dict) -> dict:
    """The ``SCALES`` of a recipe on the grid: per scale the grid's settings, the path points and ``per_scale``
    extras (``name -> {scale: value}``); ``paper`` overrides grid settings at paper scale where the recipe's
    figure was made with another setting (Fig. 8: k = 10; Figs. 6-7: k = 20, epsilon 5)."""
    grids = {**GRID, "paper": {**GRID["paper"], **(paper or {})}}
    return {scale: {"grid": settings, "points": POINTS[scale], **{k: v[scale] for k, v in per_scale.items()}}
            for scale, settings in grids.items()}


def group(ctx) -> str:
    """``watson-phase-grid-SCALE``, with ``-kK-eE-nN`` when a recipe overrides the shared grid (its own runs)."""
    g, shared = ctx.settings["grid"], GRID[ctx.scale]
    own = "" if g == shared else f"-k{g['k']}-e{g['target_epsilon']:g}-n{g['epochs']}"
    return f"watson-phase-grid-{ctx.scale}{own}"


def train_grid(ctx) -> dict:
    """Train (or reuse) the grid; returns ``{"phase1": {p1: Run}, "phase2": {(p1, p2): [Run per copy]}}``."""
    from landscape.api import PhasesConfig, TrainConfig, phases
    from landscape.store import Store

    g = ctx.settings["grid"]
    base = TrainConfig(model=g["model"], data=g["data"], subset=g["subset"], epochs=g["epochs"], lr=g["lr"],
                       batch_size=g["batch_size"], seed=g["seed"], max_grad_norm=g["max_grad_norm"],
                       target_epsilon=g["target_epsilon"], checkpoint_every="1e", data_root=ctx.data_root)
    phases(PhasesConfig(base=base, k=g["k"], copies=g["copies"], phase1=OPTIMIZERS, phase2=OPTIMIZERS,
                        dp_lr=g["dp_lr"], dp_momentum=0.0, group=group(ctx)), root=ctx.root, progress=False)
    store = Store(ctx.root)
    name = group(ctx)
    return {"phase1": {p1: store.run(f"{name}-{p1}") for p1 in OPTIMIZERS},
            "phase2": {(p1, p2): [store.run(f"{name}-{p1}-{p2}-{i}") for i in range(g["copies"])]
                       for p1 in OPTIMIZERS for p2 in OPTIMIZERS}}


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
