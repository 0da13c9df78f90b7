"""Watson et al. (2023), Fig. 3 (Sec. 4.1.2): SGD from different initialisations reaches similar losses but the
solutions are not linearly mode connected (a loss barrier on the straight path: different basins, or different
regions of a non-convex basin).

The design notes: docs/figures.md, "What each recipe measures" (watson-fig3).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from landscape.figures import _draw
from landscape.figures import _phase_grid as grid
from landscape.figures._selection import judge_with_sensitivity
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import above, all_of, greater

SOURCE = "Watson et al. 2023, Fig. 3, Sec. 4.1.2"
SEEDS = {"test": 2, "cpu": 3, "paper": 3}
SCALES = grid.scales(seeds=SEEDS)


def evaluate(ctx, sel, setting: dict) -> tuple[dict, object]:
    from landscape.api import InterpolateConfig, TrainConfig, instability

    s, g = ctx.settings, ctx.settings["grid"]
    m, lr = sel.candidates[setting["sgd-sgd"]]
    runs = grid.grid_at(ctx, (m, lr))
    base = TrainConfig(model=g["model"], data=g["data"], subset=g["subset"], epochs=g["epochs"], lr=lr, momentum=m,
                       batch_size=g["batch_size"], checkpoint_every="1e", data_root=ctx.data_root)
    names = [ctx.train(f"init{seed}-m{m:g}-lr{lr:g}", dataclasses.replace(base, seed=seed)).name
             for seed in range(s["seeds"])]
    units = list(itertools.combinations(range(s["seeds"]), 2))
    inits = [f"{names[i]}:{names[j]}" for i, j in units]
    gname = runs["group"]
    sib_units = grid.sibling_pairs(g["copies"])
    siblings = [f"{gname}-sgd-sgd-{i}:{gname}-sgd-sgd-{j}" for i, j in sib_units]
    table = instability(pairs=",".join(inits + siblings), root=ctx.root, workers=ctx.workers,
                        config=InterpolateConfig(points=s["points"], split=("test",)), figure=False,
                        output=ctx.stem(f"instability-m{m:g}-lr{lr:g}").with_suffix(".h5"), data_root=ctx.data_root)
    b = grid.barriers_and_paths(table, inits + siblings)
    n = len(inits)
    h = b["height"]
    end_gaps = [abs(float(p[-1] - p[0])) for p in b["paths"][:n]]
    floor = grid.min_height()
    parts = [ctx.judged(greater("solutions from different initialisations are separated by a higher barrier than "
                                "siblings", SOURCE, h[:n], h[n:], names=("different inits", "SGD siblings"),
                                unit="pairs", min_effect=floor, pairs_a=units, pairs_b=sib_units),
                        grid.ends(inits + siblings)),
             ctx.judged(above("the barrier between different-init solutions exceeds the difference of their end "
                              "losses", SOURCE, np.subtract(h[:n], end_gaps), 0.0, name="height - |end-loss gap|",
                              unit="pairs", pairs=units), grid.ends(inits))]
    verdict = all_of("SGD from different initialisations: similar losses, not linearly connected", SOURCE, parts,
                     note=grid.BARRIER)
    if ctx.role:
        return {}, verdict
    grid.scope_facts(ctx, runs)
    numbers = {"init_heights": h[:n], "sibling_heights": h[n:], "end_gaps": end_gaps,
               "alpha": np.linspace(0, 1, s["points"]), "init_chord": b["chord"][:n], "sibling_chord": b["chord"][n:],
               "init_instability": b["def23"][:n], "sibling_instability": b["def23"][n:],
               "init_paths": b["paths"][:n], "sibling_paths": b["paths"][n:], "min_height": floor}
    return numbers, verdict


def make(ctx):
    sel = grid.selection(ctx)
    return judge_with_sensitivity(ctx, sel, lambda setting: evaluate(ctx, sel, setting))


def draw(d):
    from landscape.plots import style

    n = d.numbers
    fig, axes = style.subplots(1, 2, figsize=(9.0, 3.5), layout="constrained")
    ax = axes[0]
    for i, path in enumerate(np.atleast_2d(n["init_paths"])):
        ax.plot(n["alpha"], path, color=style.method_color("sgd"), lw=1.5, label="different inits" if i == 0 else None)
    for i, path in enumerate(np.atleast_2d(n["sibling_paths"])):
        ax.plot(n["alpha"], path, color="0.45", lw=1.0, ls="--", label="Phase-2 SGD siblings" if i == 0 else None)
    ax.set(xlabel="alpha (0: one solution, 1: the other)", ylabel="test loss", title="paths (one line per pair)")
    ax.legend(fontsize=7)
    ax = axes[1]  # what was judged: the height above both ends per pair, against the minimum height
    groups = (("different inits", n["init_heights"], style.method_color("sgd"), "o"),
              ("SGD siblings", n["sibling_heights"], "0.45", "s"))
    for j, (label, values, color, marker) in enumerate(groups):
        v = np.atleast_1d(values)
        ax.plot(np.full(v.size, j) + np.linspace(-0.15, 0.15, v.size), v, ls="none", marker=marker, color=color,
                label=f"{label} (one pair each)")
    ax.axhline(float(n["min_height"]), color="tab:red", ls="--", lw=0.8, label="minimum height (2% of ln C)")
    ax.set_xticks([0, 1], [g[0] for g in groups])
    ax.set_xlim(-0.6, 1.6)
    ax.set(ylabel="height above both ends (test loss)", title="judged: barrier height")
    ax.legend(fontsize=7)
    return _draw.finish(fig, d, f"Fig. 3 ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="watson-fig3", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 3",
    claim="SGD solutions from different initialisations have similar losses but are not linearly connected",
    scaled_down="LeNet on digits, 10 epochs, 3 initialisations; siblings from the watson-fig2 grid as reference; "
                "barrier = height above both ends, minimum 2% of ln C",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=30,
                           hyper="3 seeds, 30 alphas; the grid's lr (from the paper's sweep), batch 128, no momentum",
                           gpu_hours=6.0),
    make=make,
    draw=draw,
)
