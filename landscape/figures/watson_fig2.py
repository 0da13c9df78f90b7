"""Watson et al. (2023), Fig. 2 (Sec. 4.1.1): final performance is decided by the Phase-2 optimiser.

The design notes: docs/figures.md, "What each recipe measures" (watson-fig2).
"""

from __future__ import annotations

import itertools

import numpy as np

from landscape.figures import _draw
from landscape.figures import _phase_grid as grid
from landscape.figures._selection import judge_with_sensitivity
from landscape.figures.recipe import PaperScale, Recipe, final
from landscape.verdict import all_of, greater, paired_greater

SOURCE = "Watson et al. 2023, Fig. 2, Sec. 4.1.1"
MIN_EFFECT = 0.01  # accuracy (1 point): the margin within which accuracies count as "the same" (watson-fig10)
SCALES = {scale: {"grid": settings} for scale, settings in grid.GRID.items()}
LABEL = {"sgd": "SGD", "dpsgd": "DP"}
COMBOS = list(itertools.product(grid.OPTIMIZERS, grid.OPTIMIZERS))


def evaluate(ctx, sel, setting: dict) -> tuple[dict, object]:
    """The verdict with each arm's runs from the evaluation grid at its candidate in ``setting``."""
    grids = {c: grid.grid_at(ctx, sel.candidates[i]) for c, i in ((c, setting[f"{c[0]}-{c[1]}"]) for c in COMBOS)}
    runs = {c: grids[c]["phase2"][c] for c in COMBOS}
    acc = {c: [final(r, "test_acc") for r in runs[c]] for c in COMBOS}
    parts = [ctx.judged(greater(f"after a {LABEL[p1]} Phase 1, SGD in Phase 2 ends more accurate than DP-SGD", SOURCE,
                                acc[(p1, "sgd")], acc[(p1, "dpsgd")], names=(f"{LABEL[p1]}->SGD", f"{LABEL[p1]}->DP"),
                                unit="Phase-2 copies", min_effect=MIN_EFFECT),
                         runs[(p1, "sgd")] + runs[(p1, "dpsgd")])
             for p1 in grid.OPTIMIZERS]
    copies = len(acc[("sgd", "sgd")])
    phase2_gap = [np.mean([abs(acc[(p1, "sgd")][i] - acc[(p1, "dpsgd")][i]) for p1 in grid.OPTIMIZERS])
                  for i in range(copies)]
    phase1_gap = [np.mean([abs(acc[("sgd", p2)][i] - acc[("dpsgd", p2)][i]) for p2 in grid.OPTIMIZERS])
                  for i in range(copies)]
    parts.append(ctx.judged(paired_greater("the Phase-2 choice moves final accuracy more than the Phase-1 choice",
                                           SOURCE, phase2_gap, phase1_gap, names=("Phase-2 gap", "Phase-1 gap"),
                                           unit="copies", min_effect=MIN_EFFECT),
                            [r for c in COMBOS for r in runs[c]]))
    verdict = all_of("the Phase-2 optimiser decides final accuracy (SGD Phase 2 ends well whatever Phase 1 was)",
                     SOURCE, parts)
    if ctx.role:
        return {}, verdict
    chosen = grids[("sgd", "sgd")]
    grid.scope_facts(ctx, chosen)
    numbers = {f"{p1}-{p2}/test_acc": acc[(p1, p2)] for p1, p2 in COMBOS}
    numbers.update({f"{p1}-{p2}/train_loss": [final(r, "train_loss") for r in runs[(p1, p2)]] for p1, p2 in COMBOS})
    numbers.update(phase2_gaps=phase2_gap, phase1_gaps=phase1_gap, min_effect=MIN_EFFECT, k=ctx.settings["grid"]["k"])
    for p1, p2 in COMBOS:
        for metric in ("train_loss", "test_acc"):
            curves = [grid.joined_curve(grids[(p1, p2)]["phase1"][p1], r, metric) for r in runs[(p1, p2)]]
            numbers[f"{p1}-{p2}/curve/{metric}"] = [c[1] for c in curves]
            numbers["epochs"] = curves[0][0]
    return numbers, verdict


def make(ctx):
    sel = grid.selection(ctx)
    return judge_with_sensitivity(ctx, sel, lambda setting: evaluate(ctx, sel, setting))


def draw(d):
    from landscape.plots import style

    n, k = d.numbers, float(d.numbers["k"])
    fig, axes = style.subplots(1, 3, figsize=(11.5, 3.6), layout="constrained")
    styles = {"sgd": "-", "dpsgd": "--"}
    for p1, p2 in COMBOS:
        color = style.method_color(p2)
        for ax, metric in zip(axes[:2], ("train_loss", "test_acc"), strict=True):
            for i, curve in enumerate(np.atleast_2d(n[f"{p1}-{p2}/curve/{metric}"])):
                ax.plot(n["epochs"], curve, ls=styles[p1], color=color, lw=1.0, alpha=0.7,
                        label=f"{LABEL[p1]} -> {LABEL[p2]}" if i == 0 and metric == "train_loss" else None)
    for ax, ylabel in zip(axes[:2], ("train loss", "test accuracy"), strict=True):
        ax.axvline(k, color="0.5", lw=0.8, ls=":", label="end of Phase 1" if ylabel == "train loss" else None)
        ax.set(xlabel="epoch", ylabel=ylabel, title=f"{ylabel}, every copy")
    axes[0].legend(fontsize=7, title="Phase 1 -> Phase 2 (one line per copy)", title_fontsize=7)
    ax = axes[2]  # what was judged: final test accuracy per arm, each copy and the mean
    for j, (p1, p2) in enumerate(COMBOS):
        a = np.asarray(n[f"{p1}-{p2}/test_acc"])
        ax.plot(np.full(a.size, j) + np.linspace(-0.12, 0.12, a.size), a, ls="none",
                marker=style.method_marker(p2), color=style.method_color(p2), alpha=0.7,
                label="one Phase-2 copy" if j == 0 else None)
        ax.plot([j - 0.25, j + 0.25], [a.mean()] * 2, color="k", lw=1.5, label="mean over copies" if j == 0 else None)
    ax.set_xticks(range(4), [f"{LABEL[p1]}->{LABEL[p2]}" for p1, p2 in COMBOS], fontsize=8)
    ax.set(ylabel="final test accuracy", title="judged: final accuracy")
    ax.legend(fontsize=7)
    return _draw.finish(fig, d, f"Fig. 2 ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="watson-fig2", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 2",
    claim="the Phase-2 optimiser decides final accuracy: SGD in Phase 2 ends well whatever Phase 1 was",
    scaled_down="LeNet on digits, 10 epochs, k = 4, 5 Phase-2 copies, epsilon 7 target; SGD and DP-SGD at one matched "
                "lr and momentum (selected on a validation split from lr 0.01 / 0.03 / 0.1 x momentum 0 / 0.9), batch "
                "32; minimum effect 1 accuracy point",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=30,
                           hyper="k = 3, sigma 0.55, C = 1, no momentum; one lr for both from the paper's sweep and "
                                 "the paper's SGD batch 128 (the paper: SGD lr 0.1 / 128, DP-SGD lr 0.5 / 1024)",
                           gpu_hours=60.0),
    make=make,
    draw=draw,
)
