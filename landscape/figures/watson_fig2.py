"""Watson et al. (2023), Fig. 2 (Sec. 4.1.1): final performance is decided by the Phase-2 optimiser.

SGD and DP-SGD train k epochs from one initialisation (Phase 1); from each, SGD and DP-SGD train the rest
(Phase 2). Claim (testing Ganesh et al.'s conjecture that the early phase decides): "the losses are determined by
the mode of operation in Phase 2": runs with SGD in Phase 2 end well whatever Phase 1 was, runs with DP-SGD in
Phase 2 end worse. Verdict (:func:`landscape.verdict.all_of`) of three :func:`landscape.verdict.greater` parts
on final test accuracy over the Phase-2 copies: after an SGD Phase 1 and after a DP Phase 1, SGD in Phase 2
beats DP-SGD in Phase 2; and the accuracy gaps between the two Phase-2 choices (same Phase 1, same copy) exceed
the gaps between the two Phase-1 choices (same Phase 2, same copy) -- the paper's "larger impact".

Minimum effect :data:`MIN_EFFECT` = 1 accuracy point for every part (Welch's test is of ``A - B > 0.01``, not
``A > B``): the paper calls the Phase-2 SGD runs' accuracies "similar" and the DP-SGD ones "higher loss", and this
project calls accuracies "the same" within 1 point (``watson-fig10``'s equivalence margin), so a gap inside that
margin cannot count as "worse" or as "a larger impact". The paper's own gaps (CIFAR10) are tens of points.

Fair comparison: matched learning rate, momentum and batch size (32) for both optimisers in both phases, the
one (momentum, lr) chosen claim-blind over the paper's lr sweep {0.01, 0.05, 0.1, 0.5, 1.0} x momentum {0, 0.9}
by the grid's worst run (the lowest, over the four arms and every Phase-2 copy, of the worst train accuracy over
the last 3 epochs; :mod:`landscape.figures._phase_grid`, which also says what was tried first;
the grid, every score and the choice are in the summary: ``lr_grid/*``, ``lr_chosen``, ``momentum_chosen``). An
earlier version ran SGD at lr 0.03 with momentum 0.9 against DP-SGD at lr 0.5 without momentum. Every Phase-2
end model must pass the validity gate.

Scaled down: LeNet on ``digits`` for 10 epochs with k = 4 and 5 Phase-2 copies (the paper: a CNN with k = 15
and Resnet18 with k = 3 on CIFAR10, 3-5 runs); sigma from the accountant for epsilon 7 (the paper: sigma 0.55,
C = 1, epsilon ~ 7). The grid is shared with ``watson-fig6-7`` and ``watson-fig8``.
"""

from __future__ import annotations

import itertools

from landscape.figures import _phase_grid as grid
from landscape.figures.recipe import PaperScale, Recipe, final
from landscape.verdict import all_of, greater

SOURCE = "Watson et al. 2023, Fig. 2, Sec. 4.1.1"
MIN_EFFECT = 0.01  # accuracy (1 point): the margin within which accuracies count as "the same" (watson-fig10)
SCALES = {scale: {"grid": settings} for scale, settings in grid.GRID.items()}
LABEL = {"sgd": "SGD", "dpsgd": "DP"}


def make(ctx):
    from landscape.plots import style

    runs = grid.train_grid(ctx)
    combos = list(itertools.product(grid.OPTIMIZERS, grid.OPTIMIZERS))
    acc = {c: [final(r, "test_acc") for r in runs["phase2"][c]] for c in combos}
    loss = {c: [final(r, "train_loss") for r in runs["phase2"][c]] for c in combos}
    parts = [ctx.judged(greater(f"after a {LABEL[p1]} Phase 1, SGD in Phase 2 ends more accurate than DP-SGD", SOURCE,
                                acc[(p1, "sgd")], acc[(p1, "dpsgd")], names=(f"{LABEL[p1]}->SGD", f"{LABEL[p1]}->DP"),
                                unit="Phase-2 copies", min_effect=MIN_EFFECT),
                         runs["phase2"][(p1, "sgd")] + runs["phase2"][(p1, "dpsgd")])
             for p1 in grid.OPTIMIZERS]
    phase2_gaps = [abs(a - b) for p1 in grid.OPTIMIZERS for a, b in zip(acc[(p1, "sgd")], acc[(p1, "dpsgd")],
                                                                          strict=True)]
    phase1_gaps = [abs(a - b) for p2 in grid.OPTIMIZERS for a, b in zip(acc[("sgd", p2)], acc[("dpsgd", p2)],
                                                                          strict=True)]
    parts.append(ctx.judged(greater("the Phase-2 choice moves final accuracy more than the Phase-1 choice", SOURCE,
                                    phase2_gaps, phase1_gaps, names=("Phase-2 gap", "Phase-1 gap"), unit="copies",
                                    min_effect=MIN_EFFECT),
                            [r for c in combos for r in runs["phase2"][c]]))
    verdict = all_of("the Phase-2 optimiser decides final accuracy (SGD Phase 2 ends well whatever Phase 1 was)",
                     SOURCE, parts, note=grid.lr_note(runs) + " " + " | ".join(p.line() for p in parts))

    numbers = {f"{p1}-{p2}/test_acc": acc[(p1, p2)] for p1, p2 in combos}
    numbers.update({f"{p1}-{p2}/train_loss": loss[(p1, p2)] for p1, p2 in combos})
    numbers.update(phase2_gaps=phase2_gaps, phase1_gaps=phase1_gaps, min_effect=MIN_EFFECT, **grid.lr_numbers(runs))
    fig, axes = style.subplots(1, 2, figsize=(8.5, 3.2), layout="constrained")
    styles = {"sgd": "-", "dpsgd": "--"}
    for (p1, p2) in combos:
        color = style.method_color(p2)
        for i, (r1, r2) in enumerate(zip([runs["phase1"][p1]] * len(runs["phase2"][(p1, p2)]),
                                         runs["phase2"][(p1, p2)], strict=True)):
            for ax, metric in zip(axes, ("train_loss", "test_acc"), strict=True):
                e, v = grid.joined_curve(r1, r2, metric)
                ax.plot(e, v, ls=styles[p1], color=color, lw=1.2, alpha=0.8,
                        label=f"{LABEL[p1]} -> {LABEL[p2]}" if i == 0 and metric == "train_loss" else None)
        if p1 == "sgd":
            numbers[f"{p2}/epochs"] = grid.joined_curve(runs["phase1"][p1], runs["phase2"][(p1, p2)][0], "test_acc")[0]
    k = ctx.settings["grid"]["k"]
    for ax, ylabel in zip(axes, ("train loss", "test accuracy"), strict=True):
        ax.axvline(k, color="0.5", lw=0.8, ls=":")
        ax.set(xlabel="epoch", ylabel=ylabel)
    axes[0].legend(fontsize=7, title="Phase 1 -> Phase 2", title_fontsize=7)
    fig.suptitle(f"Fig. 2 ({ctx.scale}): {verdict.status}")
    style.panel_labels(axes)
    return numbers, verdict, style.save_figure(fig, ctx.stem("figure"))


RECIPE = Recipe(
    name="watson-fig2", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 2",
    claim="the Phase-2 optimiser decides final accuracy: SGD in Phase 2 ends well whatever Phase 1 was",
    scaled_down="LeNet on digits, 10 epochs, k = 4, 5 Phase-2 copies, epsilon 7; SGD and DP-SGD at one matched lr "
                "and momentum (claim-blind from the paper's lr sweep x momentum 0 / 0.9), batch 32; minimum effect 1 "
                "accuracy point",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=30,
                           hyper="k = 3, sigma 0.55, C = 1, no momentum; one lr for both from the paper's sweep and "
                                 "the paper's SGD batch 128 (the paper: SGD lr 0.1 / 128, DP-SGD lr 0.5 / 1024)",
                           gpu_hours=60.0),
    make=make,
)
