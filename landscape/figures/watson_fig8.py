"""Watson et al. (2023), Fig. 8 (Sec. 4.1.3): the straight path from the Phase-1 model to a Phase-2 model.

Claim: "SGD Phase 1 followed by also SGD Phase 2 is the only setting where the model clearly stays on the same
optimization basin"; DP-SGD in Phase 2 "does not stay in the same basin as in Phase 1 ... and always ends at a
different basin". Measured: the test-loss barrier above the chord between the Phase-1 endpoint and each Phase-2
copy's endpoint, for the four optimiser pairs, with Def. 2.3 instability stored beside it (after an SGD Phase 1
the DP-SGD end is worse, so Def. 2.3 is large on a path without any bump; the chord barrier is not). Verdict:
for each of SGD->DP, DP->SGD and DP->DP, its barrier exceeds the SGD->SGD barrier
(:func:`landscape.verdict.greater`, Welch at alpha 0.05, over the copies); held if all three hold
(:func:`landscape.verdict.all_of`). A part whose Phase-2 end models fail the validity gate is inconclusive.

Fair comparison: both phases of every pair run at one matched learning rate, batch size and momentum (the
grid's, :mod:`landscape.figures._phase_grid`: chosen claim-blind from the paper's lr sweep x momentum {0, 0.9}
by the grid's worst run on train accuracy (over every arm and Phase-2 copy; no arm compared with another); stored as
``lr_grid/*``, ``lr_chosen``, ``momentum_chosen``), so a
DP-SGD Phase 2 does not leave the Phase-1 basin merely by taking larger steps. An earlier version gave DP-SGD
lr 0.5 without momentum against SGD's lr 0.03 with momentum 0.9.

Scaled down: the grid of ``watson-fig2`` (LeNet on digits, 10 epochs, k = 4, 5 copies, epsilon 7; the paper:
Resnet18 on CIFAR10 with k = 10); 20 points on the path.
"""

from __future__ import annotations

import itertools

import numpy as np

from landscape.figures import _phase_grid as grid
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import all_of, greater

SOURCE = "Watson et al. 2023, Fig. 8, Sec. 4.1.3"
SCALES = grid.scales(paper={"k": 10})
LABEL = {"sgd": "SGD", "dpsgd": "DP"}


def make(ctx):
    from landscape.api import InterpolateConfig, instability
    from landscape.plots import style

    runs = grid.train_grid(ctx)
    g, copies = runs["group"], ctx.settings["grid"]["copies"]
    combos = list(itertools.product(grid.OPTIMIZERS, grid.OPTIMIZERS))
    pairs = [f"{g}-{p1}:{g}-{p1}-{p2}-{i}" for p1, p2 in combos for i in range(copies)]
    table = instability(pairs=",".join(pairs), root=ctx.root, workers=ctx.workers,
                        config=InterpolateConfig(points=ctx.settings["points"], split=("test",)),
                        output=ctx.stem("instability").with_suffix(".h5"), data_root=ctx.data_root)
    values, def23, paths = grid.barriers_and_paths(table, pairs)
    barrier = {c: values[j * copies:(j + 1) * copies] for j, c in enumerate(combos)}
    numbers = {f"{p1}-{p2}/barrier": barrier[(p1, p2)] for p1, p2 in combos}
    numbers.update({f"{p1}-{p2}/instability": def23[j * copies:(j + 1) * copies] for j, (p1, p2) in enumerate(combos)})
    children = {c: [f"{g}-{c[0]}-{c[1]}-{i}" for i in range(copies)] for c in combos}
    numbers.update({f"{p1}-{p2}/path": paths[j * copies:(j + 1) * copies] for j, (p1, p2) in enumerate(combos)})
    numbers.update(alpha=np.linspace(0, 1, ctx.settings["points"]), **grid.lr_numbers(runs))
    parts = [ctx.judged(greater(f"{LABEL[p1]}->{LABEL[p2]} leaves the Phase-1 basin more than SGD->SGD", SOURCE,
                                barrier[(p1, p2)], barrier[("sgd", "sgd")],
                                names=(f"{LABEL[p1]}->{LABEL[p2]}", "SGD->SGD"), unit="Phase-2 copies",
                                note=f"Def. 2.3 beside it: {np.mean(numbers[f'{p1}-{p2}/instability']):.3g} vs "
                                     f"{np.mean(numbers['sgd-sgd/instability']):.3g}."),
                         children[(p1, p2)] + children[("sgd", "sgd")])
             for p1, p2 in combos if (p1, p2) != ("sgd", "sgd")]
    verdict = all_of("only SGD -> SGD stays in the Phase-1 basin (every other pair has a higher barrier)", SOURCE,
                     parts, note=" ".join([grid.BARRIER, grid.lr_note(runs), *(p.line() for p in parts)]))
    fig, axes = style.subplots(2, 2, figsize=(7.5, 5.6), sharey=True, sharex=True, layout="constrained")
    for ax, (j, (p1, p2)) in zip(axes.ravel(), enumerate(combos), strict=True):
        for path in paths[j * copies:(j + 1) * copies]:
            ax.plot(numbers["alpha"], path, color=style.method_color(p2), ls=style.method_style(p2), lw=1.2)
        ax.set_title(f"P1 {LABEL[p1]}, P2 {LABEL[p2]}: barrier {np.mean(barrier[(p1, p2)]):.2g}")
    for ax in axes[1]:
        ax.set_xlabel("alpha (0: Phase 1, 1: Phase 2)")
    for ax in axes[:, 0]:
        ax.set_ylabel("test loss")
    style.panel_labels(axes)
    fig.suptitle(f"Fig. 8 ({ctx.scale}): {verdict.status}")
    return numbers, verdict, style.save_figure(fig, ctx.stem("figure"))


RECIPE = Recipe(
    name="watson-fig8", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 8",
    claim="only SGD Phase 1 -> SGD Phase 2 stays in the Phase-1 basin; DP-SGD in either phase leaves it",
    scaled_down="the watson-fig2 grid (LeNet on digits, 10 epochs, k = 4, 5 copies, epsilon 7, one matched lr, "
                "batch and momentum for SGD and DP-SGD), 20 path points; judged on the barrier above the chord",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=30,
                           hyper="k = 10, sigma 0.55, C = 1; one lr for both from the paper's sweep, batch 128, "
                                 "no momentum", gpu_hours=60.0),
    make=make,
)
