"""Watson et al. (2023), Fig. 8 (Sec. 4.1.3): the straight path from the Phase-1 model to a Phase-2 model.

The design notes: docs/figures.md, "What each recipe measures" (watson-fig8).
"""

from __future__ import annotations

import itertools

import numpy as np

from landscape.figures import _draw
from landscape.figures import _phase_grid as grid
from landscape.figures._selection import judge_with_sensitivity
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import all_of, greater

SOURCE = "Watson et al. 2023, Fig. 8, Sec. 4.1.3"
SCALES = grid.scales(paper={"k": 10})
LABEL = {"sgd": "SGD", "dpsgd": "DP"}
COMBOS = list(itertools.product(grid.OPTIMIZERS, grid.OPTIMIZERS))


def evaluate(ctx, sel, setting: dict) -> tuple[dict, object]:
    from landscape.api import InterpolateConfig, instability

    copies = ctx.settings["grid"]["copies"]
    grids = {c: grid.grid_at(ctx, grid.arm(setting, sel, *c)) for c in COMBOS}
    pairs = {c: [f"{grids[c]['group']}-{c[0]}:{grids[c]['group']}-{c[0]}-{c[1]}-{i}" for i in range(copies)]
             for c in COMBOS}
    tag = "c" + "".join(str(setting[a]) for a in grid.ARMS)  # the file tag: the arms' candidate indices
    table = instability(pairs=",".join(p for c in COMBOS for p in pairs[c]), root=ctx.root, workers=ctx.workers,
                        config=InterpolateConfig(points=ctx.settings["points"], split=("test",)), figure=False,
                        output=ctx.stem(f"instability-{tag}").with_suffix(".h5"),
                        data_root=ctx.data_root)
    b = {c: grid.barriers_and_paths(table, pairs[c]) for c in COMBOS}
    floor = grid.min_height()
    parts = [ctx.judged(greater(f"{LABEL[p1]}->{LABEL[p2]} leaves the Phase-1 basin: its path rises above both ends "
                                "more than SGD->SGD's", SOURCE, b[(p1, p2)]["height"], b[("sgd", "sgd")]["height"],
                                names=(f"{LABEL[p1]}->{LABEL[p2]}", "SGD->SGD"), unit="Phase-2 copies",
                                min_effect=floor,
                                note=f"chord barrier beside it: {np.mean(b[(p1, p2)]['chord']):.3g} vs "
                                     f"{np.mean(b[('sgd', 'sgd')]['chord']):.3g}."),
                        grid.ends(pairs[(p1, p2)] + pairs[("sgd", "sgd")]))
             for p1, p2 in COMBOS if (p1, p2) != ("sgd", "sgd")]
    verdict = all_of("only SGD -> SGD stays in the Phase-1 basin (every other pair's path rises above both ends more)",
                     SOURCE, parts, note=grid.BARRIER)
    if ctx.role:
        return {}, verdict
    grid.scope_facts(ctx, grids[("sgd", "sgd")])
    numbers = {"alpha": np.linspace(0, 1, ctx.settings["points"]), "min_height": floor}
    for (p1, p2), v in b.items():
        numbers.update({f"{p1}-{p2}/height": v["height"], f"{p1}-{p2}/chord": v["chord"],
                        f"{p1}-{p2}/instability": v["def23"], f"{p1}-{p2}/path": v["paths"]})
    return numbers, verdict


def make(ctx):
    sel = grid.selection(ctx)
    return judge_with_sensitivity(ctx, sel, lambda setting: evaluate(ctx, sel, setting))


def draw(d):
    from landscape.plots import style

    n = d.numbers
    fig, axes = style.subplots(2, 3, figsize=(11.0, 6.0), layout="constrained",
                               gridspec_kw={"width_ratios": [1, 1, 1.1]})
    path_axes = [axes[0, 0], axes[0, 1], axes[1, 0], axes[1, 1]]
    top = max(float(np.max(n[f"{a}-{b}/path"])) for a, b in COMBOS)
    low = min(float(np.min(n[f"{a}-{b}/path"])) for a, b in COMBOS)
    for ax, (p1, p2) in zip(path_axes, COMBOS, strict=True):
        for i, path in enumerate(np.atleast_2d(n[f"{p1}-{p2}/path"])):
            ax.plot(n["alpha"], path, color=style.method_color(p2), ls=style.method_style(p2), lw=1.1,
                    label="one Phase-2 copy each" if i == 0 else None)
        ax.set_ylim(low - 0.05 * (top - low), top + 0.05 * (top - low))
        ax.set_title(f"P1 {LABEL[p1]}, P2 {LABEL[p2]}: mean height {np.mean(n[f'{p1}-{p2}/height']):.2g}")
        ax.set(xlabel="alpha (0: Phase 1, 1: Phase 2)", ylabel="test loss")
    path_axes[0].legend(fontsize=7)
    ax = axes[0, 2]  # what was judged: heights above both ends
    for j, (p1, p2) in enumerate(COMBOS):
        v = np.atleast_1d(n[f"{p1}-{p2}/height"])
        ax.plot(np.full(v.size, j) + np.linspace(-0.15, 0.15, v.size), v, ls="none", marker=style.method_marker(p2),
                color=style.method_color(p2), label="one copy" if j == 0 else None)
    ax.axhline(float(n["min_height"]), color="tab:red", ls="--", lw=0.8, label="minimum height")
    ax.set_xticks(range(4), [f"{LABEL[a]}->{LABEL[b]}" for a, b in COMBOS], fontsize=7)
    ax.set(ylabel="height above both ends", title="judged: barrier height")
    ax.legend(fontsize=7)
    ax = axes[1, 2]  # beside it: the chord barrier (concavity), not judged
    for j, (p1, p2) in enumerate(COMBOS):
        v = np.atleast_1d(n[f"{p1}-{p2}/chord"])
        ax.plot(np.full(v.size, j) + np.linspace(-0.15, 0.15, v.size), v, ls="none", marker=style.method_marker(p2),
                color=style.method_color(p2), fillstyle="none")
    ax.set_xticks(range(4), [f"{LABEL[a]}->{LABEL[b]}" for a, b in COMBOS], fontsize=7)
    ax.set(ylabel="barrier above the chord", title="beside it, not judged: chord barrier")
    return _draw.finish(fig, d, f"Fig. 8 ({d.scale}): {d.verdict.status}", [*path_axes, axes[0, 2], axes[1, 2]])


RECIPE = Recipe(
    name="watson-fig8", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 8",
    claim="only SGD Phase 1 -> SGD Phase 2 stays in the Phase-1 basin; DP-SGD in either phase leaves it (its path "
          "rises above both ends)",
    scaled_down="the watson-fig2 grid (LeNet on digits, 10 epochs, k = 4, 5 copies, epsilon 7, one matched lr, "
                "batch and momentum for SGD and DP-SGD), 20 path points; barrier = height above both ends, minimum "
                "2% of ln C; Phase-1 models gated",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=30,
                           hyper="k = 10, sigma 0.55, C = 1; one lr for both from the paper's sweep, batch 128, "
                                 "no momentum", gpu_hours=60.0),
    make=make,
    draw=draw,
)
