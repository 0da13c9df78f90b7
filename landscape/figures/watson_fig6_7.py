"""Watson et al. (2023), Figs. 6 and 7 (Sec. 4.1.3): a Phase-2 SGD model and a Phase-2 DP-SGD model trained
from the same Phase-1 model do not end in the same basin (Fig. 6: after an SGD Phase 1, "unless epsilon and k
are large"; Fig. 7: after a DP-SGD Phase 1, "always ends in a different basin").

Measured: the test-loss barrier above the chord on the straight path between the Phase-2 SGD copy i and the
Phase-2 DP-SGD copy i of the same Phase-1 run, against the same barrier between two Phase-2 SGD copies (siblings
that share a basin when SGD "finds its basin early", Fig. 5a); Def. 2.3 instability is stored beside it. The
chord barrier matters here: the DP end has the higher loss, so Def. 2.3 is large even on a path with no bump.
Verdict per Phase 1 (:func:`landscape.verdict.greater`, Welch at alpha 0.05): the SGD-vs-DP barrier exceeds the
SGD-sibling barrier; held only if it holds after both Phase 1s (:func:`landscape.verdict.all_of`). A part whose
end models fail the validity gate (:class:`landscape.figures.recipe.Gate`) is inconclusive (invalid regime).

Fair comparison: Phase-2 SGD and Phase-2 DP-SGD run at one matched learning rate, batch size and momentum (the
grid's, :mod:`landscape.figures._phase_grid`: chosen claim-blind from the paper's lr sweep x momentum {0, 0.9}
by the grid's worst run on train accuracy (over every arm and Phase-2 copy; no arm compared with another); stored as
``lr_grid/*``, ``lr_chosen``, ``momentum_chosen``), so a
DP-SGD model is not further away because it took larger steps. An earlier version gave DP-SGD lr 0.5 without
momentum against SGD's lr 0.03 with momentum 0.9.

Scaled down: the grid of ``watson-fig2`` (LeNet on digits, 10 epochs, k = 4, 5 copies, epsilon 7; the paper:
Resnet18 on CIFAR10, 20 Phase-2 epochs, k = 20 or epsilon 5); 20 points on the path instead of 30.
"""

from __future__ import annotations

import itertools

import numpy as np

from landscape.figures import _phase_grid as grid
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import all_of, greater

SOURCE = "Watson et al. 2023, Figs. 6-7, Sec. 4.1.3"
SCALES = grid.scales(paper={"k": 20, "epochs": 40, "target_epsilon": 5.0, "noise_multiplier": None})
LABEL = {"sgd": "SGD", "dpsgd": "DP-SGD"}


def make(ctx):
    from landscape.api import InterpolateConfig, instability
    from landscape.plots import style

    runs = grid.train_grid(ctx)
    g, copies = runs["group"], ctx.settings["grid"]["copies"]
    numbers, parts = {}, []
    fig, axes = style.subplots(1, 2, figsize=(8.5, 3.2), sharey=True, layout="constrained")
    for p1, ax in zip(grid.OPTIMIZERS, axes, strict=True):
        mixed = [f"{g}-{p1}-sgd-{i}:{g}-{p1}-dpsgd-{i}" for i in range(copies)]
        siblings = [f"{g}-{p1}-sgd-{i}:{g}-{p1}-sgd-{j}" for i, j in itertools.combinations(range(copies), 2)]
        table = instability(pairs=",".join(mixed + siblings), root=ctx.root, workers=ctx.workers,
                            config=InterpolateConfig(points=ctx.settings["points"], split=("test",)),
                            output=ctx.stem(f"instability-{p1}").with_suffix(".h5"), data_root=ctx.data_root)
        values, def23, paths = grid.barriers_and_paths(table, mixed + siblings)
        n = len(mixed)
        numbers.update({f"{p1}/sgd_vs_dp": values[:n], f"{p1}/sgd_siblings": values[n:],
                        f"{p1}/instability_sgd_vs_dp": def23[:n], f"{p1}/instability_sgd_siblings": def23[n:],
                        f"{p1}/path_sgd_vs_dp": paths[:n], f"{p1}/path_sgd_siblings": paths[n:]})
        parts.append(ctx.judged(greater(
            f"after a {LABEL[p1]} Phase 1, Phase-2 SGD and DP-SGD models are separated by a higher barrier than "
            "Phase-2 SGD siblings", SOURCE, values[:n], values[n:], names=("SGD vs DP", "SGD siblings"),
            unit="pairs", note=f"Def. 2.3 beside it: SGD vs DP {np.mean(def23[:n]):.3g}, siblings "
                               f"{np.mean(def23[n:]):.3g}."), grid.ends(mixed + siblings)))
        alpha = np.linspace(0, 1, ctx.settings["points"])
        for i, path in enumerate(paths[:n]):
            ax.plot(alpha, path, color=style.method_color("dpsgd"), lw=1.5, label="SGD vs DP-SGD" if i == 0 else None)
        for i, path in enumerate(paths[n:]):
            ax.plot(alpha, path, color=style.method_color("sgd"), lw=1.0, ls="--",
                    label="SGD vs SGD sibling" if i == 0 else None)
        ax.set(xlabel="alpha (0: Phase-2 SGD, 1: other)", title=f"Phase 1 {LABEL[p1]}: {parts[-1].status}")
    numbers.update(alpha=np.linspace(0, 1, ctx.settings["points"]), **grid.lr_numbers(runs))
    axes[0].set_ylabel("test loss")
    axes[0].legend(fontsize=7)
    verdict = all_of("Phase-2 SGD and Phase-2 DP-SGD from one Phase-1 model end in different basins (after an SGD "
                     "and after a DP Phase 1)", SOURCE, parts,
                     note=" ".join([grid.BARRIER, grid.lr_note(runs), *(p.line() for p in parts)]))
    style.panel_labels(axes)
    fig.suptitle(f"Figs. 6-7 ({ctx.scale}): {verdict.status}")
    return numbers, verdict, style.save_figure(fig, ctx.stem("figure"))


RECIPE = Recipe(
    name="watson-fig6-7", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Figs. 6-7",
    claim="a Phase-2 SGD and a Phase-2 DP-SGD model from one Phase-1 model end in different basins",
    scaled_down="the watson-fig2 grid (LeNet on digits, 10 epochs, k = 4, 5 copies, epsilon 7, one matched lr, "
                "batch and momentum for SGD and DP-SGD), 20 path points; judged on the barrier above the chord",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=40,
                           hyper="the paper panels k = 20 and epsilon 5; one lr for both from the paper's sweep, batch 128, "
                                 "no momentum",
                           gpu_hours=75.0),
    make=make,
)
