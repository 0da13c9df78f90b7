"""Watson et al. (2023), Fig. 3 (Sec. 4.1.2): SGD from different initialisations reaches similar losses but the
solutions are not linearly mode connected (a loss barrier on the straight path: different basins, or different
regions of a non-convex basin).

Measured: SGD runs from ``seeds`` different initialisations (everything else equal), the test-loss barrier
above the chord of every pair (Def. 2.3 instability stored beside it) and its end losses; as the reference for "connected", the barrier between
Phase-2 SGD siblings of one Phase-1 run (the ``watson-fig2`` grid). Verdict (:func:`landscape.verdict.all_of`)
of two :func:`landscape.verdict.greater` parts: the barrier between different-init solutions exceeds the
sibling barrier, and it exceeds the difference of the pair's own end losses ("similar losses").

Scaled down: LeNet on ``digits``, 10 epochs, 3 initialisations (3 pairs), trained like the grid's SGD runs (its
claim-blind lr and momentum, batch 32; :mod:`landscape.figures._phase_grid`); the paper: CIFAR10 (model per its
Sec. 4.1), 30 alphas.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from landscape.figures import _phase_grid as grid
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import all_of, greater

SOURCE = "Watson et al. 2023, Fig. 3, Sec. 4.1.2"
SEEDS = {"test": 2, "cpu": 3, "paper": 3}
SCALES = grid.scales(seeds=SEEDS)


def make(ctx):
    from landscape.api import InterpolateConfig, TrainConfig, instability
    from landscape.plots import style

    s, g = ctx.settings, ctx.settings["grid"]
    runs = grid.train_grid(ctx)
    lr = runs["lr"]  # the grid's SGD: its claim-blind lr, batch and momentum
    base = TrainConfig(model=g["model"], data=g["data"], subset=g["subset"], epochs=g["epochs"], lr=lr,
                       momentum=runs["momentum"], batch_size=g["batch_size"], checkpoint_every="none")
    names = [ctx.train(f"init{seed}-m{runs['momentum']:g}-lr{lr:g}", dataclasses.replace(base, seed=seed)).name
             for seed in range(s["seeds"])]
    inits = [f"{a}:{b}" for a, b in itertools.combinations(names, 2)]
    gname = runs["group"]
    siblings = [f"{gname}-sgd-sgd-{i}:{gname}-sgd-sgd-{j}" for i, j in itertools.combinations(range(g["copies"]), 2)]
    table = instability(pairs=",".join(inits + siblings), root=ctx.root, workers=ctx.workers,
                        config=InterpolateConfig(points=s["points"], split=("test",)),
                        output=ctx.stem("instability").with_suffix(".h5"), data_root=ctx.data_root)
    values, def23, paths = grid.barriers_and_paths(table, inits + siblings)
    n = len(inits)
    end_gaps = [abs(float(p[-1] - p[0])) for p in paths[:n]]
    parts = [ctx.judged(greater("solutions from different initialisations are separated by a higher barrier than "
                                "siblings", SOURCE, values[:n], values[n:], names=("different inits", "SGD siblings"),
                                unit="pairs"), grid.ends(inits + siblings)),
             ctx.judged(greater("the barrier between different-init solutions exceeds the difference of their end "
                                "losses", SOURCE, values[:n], end_gaps, names=("barrier", "|end-loss gap|"),
                                unit="pairs"), grid.ends(inits))]
    verdict = all_of("SGD from different initialisations: similar losses, not linearly connected", SOURCE, parts,
                     note=grid.BARRIER + " " + " | ".join(p.line() for p in parts))
    alpha = np.linspace(0, 1, s["points"])
    numbers = {"init_barriers": values[:n], "sibling_barriers": values[n:], "end_gaps": end_gaps, "alpha": alpha,
               "init_instability": def23[:n], "sibling_instability": def23[n:],
               "init_paths": paths[:n], "sibling_paths": paths[n:], **grid.lr_numbers(runs)}
    fig, ax = style.subplots(figsize=(4.8, 3.2), layout="constrained")
    for i, path in enumerate(paths[:n]):
        ax.plot(alpha, path, color=style.method_color("sgd"), lw=1.5, label="different inits" if i == 0 else None)
    for i, path in enumerate(paths[n:]):
        ax.plot(alpha, path, color="0.5", lw=1.0, ls="--", label="Phase-2 siblings" if i == 0 else None)
    ax.set(xlabel="alpha", ylabel="test loss", title=f"Fig. 3 ({ctx.scale}): {verdict.status}")
    ax.legend(fontsize=7)
    return numbers, verdict, style.save_figure(fig, ctx.stem("figure"))


RECIPE = Recipe(
    name="watson-fig3", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 3",
    claim="SGD solutions from different initialisations have similar losses but are not linearly connected",
    scaled_down="LeNet on digits, 10 epochs, 3 initialisations; siblings from the watson-fig2 grid as reference",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=30,
                           hyper="3 seeds, 30 alphas; the grid's lr (from the paper's sweep), batch 128, no momentum", gpu_hours=6.0),
    make=make,
)
