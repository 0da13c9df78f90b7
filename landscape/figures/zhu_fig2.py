"""Zhu & Blaschko (2023), Fig. 2 (Sec. 6.1): random sparsification (RS) trades gradient information for less
noise, and "the trade-off favors RS as Delta_sigma ~ sigma^2 C^2 increasing". Sec. 6.1 states three things of Fig. 2
(panels a-h; 2i, sigma 4 and C 1, is excluded there because the network degrades): more RS is preferred as sigma or
C grows; "as C^2 sigma^2 increases to 2^2, i.e. Figure 2f and 2h, RS can improve the performance of DP-SGD by more
than 4%"; and "when C^2 sigma^2 = 1, i.e. Figure 2c, 2e, 2g, the performance is maintained under RS (or slightly
increased)".

Measured: final train accuracy of DP-SGD at several (sigma, C) with final sparsification rates r* (gradual
cooling, ``--sparsify``), ``seeds`` seeds each (a seed's runs share initialisation and sampling, so the RS and plain
runs of a seed are paired). Verdict (:func:`landscape.verdict.all_of`), one part per statement:

(a) the trend (:func:`landscape.verdict.ordered`, rising): the per-seed gain of r* = ``r_test`` over r* = 0 rises
    with sigma C (a one-sided Spearman trend over every seed's gain);
(b) per cell with sigma C = ``gain_at`` (2: sigma^2 C^2 = 4, the paper's Fig. 2f and 2h), RS gains accuracy:
    :func:`landscape.verdict.paired_greater` of the paired gain over the seeds, ``mean(RS - plain) >``
    :data:`MIN_GAIN` (1 accuracy point). Why 1 point and not the paper's 4: the 4% is a magnitude of the paper's
    DP-CNN on CIFAR10 after 100 epochs at its best r*, which a scaled-down model, data set and fixed ``r_test`` need
    not reproduce; what the text asserts at every scale is that RS *improves* the performance at sigma^2 C^2 = 4,
    where at sigma^2 C^2 = 1 it only *maintains* it. The smallest gain that is not "maintained" is the margin within
    which this project calls two accuracies the same (:data:`MARGIN`, as ``watson-fig10`` and ``watson-fig2``), so
    (b) and (c) separate "improves" from "maintained" by one line. The observed gain stands beside it in the
    numbers, so a reader sees how far it is from 4 points;
(c) per cell with sigma C = ``maintained_at`` (1: the paper's Fig. 2c, 2e, 2g), the performance is maintained:
    :func:`landscape.verdict.similar` (paired TOST over the seeds) with margin :data:`MARGIN` (1 accuracy point).
    "(or slightly increased)" is read as an increase within that margin: a larger one is what (b) calls a gain,
    which the paper claims only at sigma^2 C^2 = 4.

Every test is at alpha 0.05; a scale without a cell at ``gain_at`` or ``maintained_at`` has no such part. Each part is
judged from the RS and plain runs of its own cells: one of them failing the validity gate makes only the parts that
use it inconclusive; a failing run no part uses (r* other than 0 and ``r_test``, the lr grid) makes every part so.

Matched, claim-blind learning rate: per (sigma, C) one lr for every r* -- the RS and plain runs compared share it,
so the gain is not a gain from tuning each variant separately. Over the grid ``lrs`` it is the lr whose seed-0
runs at r* = 0 and r* = ``r_test`` reach the highest *lower* of their two final train accuracies (ties: the smaller
lr), chosen before any gain is computed; every seed and every r* of the cell then uses it. The grid, both
variants' scores and the choice per cell are stored in the summary (``lr_grid/train_acc``, ``lr_chosen``). With
one fixed lr 1.0 the plain DP-SGD runs at sigma 2 ended at 36-50% test accuracy, below the validity gate's floor.

Scaled down: LeNet on ``digits``, batch 64, one lr per (sigma, C) from {0.3, 1}, 10 epochs, (sigma, C) in {(1, 0.25),
(1, 1), (2, 1)}, r* in {0, 0.5, 0.8}, 5 seeds (the paper: DP-CNN on CIFAR10, batch 1000, 100 epochs, sigma in
{1, 2, 4} x C in {1/4, 1/2, 1}).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from landscape.figures.recipe import PaperScale, Recipe, best, final, lr_scores
from landscape.verdict import all_of, ordered, paired_greater, similar

SOURCE = "Zhu & Blaschko 2023, Fig. 2, Sec. 6.1"
MARGIN = 0.01  # accuracy (1 point): the margin within which accuracies count as "the same" (watson-fig10)
MIN_GAIN = MARGIN  # accuracy: the smallest gain that is not "maintained" (module docstring, part (b))
_COMMON = dict(model="lenet", data="digits", lrs=(0.3, 1.0), batch_size=64, cells=((1.0, 0.25), (1.0, 1.0), (2.0, 1.0)),
               rates=(0.0, 0.5, 0.8), r_test=0.5, gain_at=2.0, maintained_at=1.0)
SCALES = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "seeds": 2, "rates": (0.0, 0.5)},
    "cpu": {**_COMMON, "subset": None, "epochs": 10, "seeds": 5},
    "paper": {**_COMMON, "data": "cifar10", "model": "opacus-cnn", "subset": None, "batch_size": 1000, "epochs": 100,
              "seeds": 5, "cells": tuple((s, c) for c in (0.25, 0.5, 1.0) for s in (1.0, 2.0, 4.0)),
              "rates": (0.0, 0.3, 0.5, 0.7, 0.9)},
}


def _at(cells, sigma_c: float) -> list[tuple[float, float]]:
    """The cells (sigma, C) whose product is ``sigma_c``."""
    return [(a, b) for a, b in cells if math.isclose(a * b, sigma_c)]


def make(ctx):
    from landscape.api import TrainConfig
    from landscape.plots import style

    s = ctx.settings
    base = TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"], lr=s["lrs"][0],
                       momentum=0.0, batch_size=s["batch_size"], optimizer="dpsgd", checkpoint_every="none")
    rt = s["r_test"]
    acc, runs, grid, chosen = {}, {}, {}, {}
    for sigma, c in s["cells"]:
        config = {r: dataclasses.replace(base, noise_multiplier=sigma, max_grad_norm=c, sparsify=r, seed=0)
                  for r in s["rates"]}
        for r in (0.0, rt):  # the two variants compared score the lrs; the lower of the two decides
            grid[(sigma, c, r)] = lr_scores(ctx, f"s{sigma:g}-C{c:g}-r{r:g}", config[r], s["lrs"])
        lr = chosen[(sigma, c)] = best(s["lrs"], np.minimum(grid[(sigma, c, 0.0)], grid[(sigma, c, rt)]))
        for r in s["rates"]:
            runs[(sigma, c, r)] = [ctx.train(f"s{sigma:g}-C{c:g}-r{r:g}-lr{lr:g}-{seed}", dataclasses.replace(
                config[r], lr=lr, seed=seed)) for seed in range(s["seeds"])]
            acc[(sigma, c, r)] = [final(run, "train_acc") for run in runs[(sigma, c, r)]]
    gains = {sigma * c: list(np.asarray(acc[(sigma, c, rt)]) - np.asarray(acc[(sigma, c, 0.0)]))
             for sigma, c in s["cells"]}

    def compared(cells):  # the end models a part is judged from: RS and plain runs of its cells
        return [run for sigma, c in cells for r in (0.0, rt) for run in runs[(sigma, c, r)]]

    names = (f"RS r*={rt:g}", "plain")
    parts = [ctx.judged(ordered(f"the gain of RS (r* = {rt:g}) over plain DP-SGD rises with sigma C", SOURCE, gains,
                                decreasing=False, key="sigma C", unit="seeds"), compared(s["cells"]))]
    parts += [ctx.judged(paired_greater(
        f"at sigma^2 C^2 = {s['gain_at'] ** 2:g} (sigma {sigma:g}, C {c:g}) RS (r* = {rt:g}) improves DP-SGD's train "
        f"accuracy by more than {MIN_GAIN:g}", SOURCE, acc[(sigma, c, rt)], acc[(sigma, c, 0.0)], names=names,
        unit="seeds", min_effect=MIN_GAIN), compared([(sigma, c)])) for sigma, c in _at(s["cells"], s["gain_at"])]
    parts += [ctx.judged(similar(
        f"at sigma^2 C^2 = {s['maintained_at'] ** 2:g} (sigma {sigma:g}, C {c:g}) the train accuracy is maintained "
        f"under RS (r* = {rt:g})", SOURCE, acc[(sigma, c, rt)], acc[(sigma, c, 0.0)], tolerance=MARGIN, names=names,
        unit="seeds", paired=True), compared([(sigma, c)])) for sigma, c in _at(s["cells"], s["maintained_at"])]
    verdict = all_of(RECIPE.claim, SOURCE, parts,
                     note="one matched lr per (sigma, C) for every r*, claim-blind (best lower seed-0 train accuracy "
                          f"of r* = 0 and r* = {rt:g}): " + ", ".join(
                              f"({a:g}, {b:g}): {lr:g}" for (a, b), lr in chosen.items()) + ".")
    numbers = {"sigma": [a for a, _ in s["cells"]], "C": [b for _, b in s["cells"]], "rates": list(s["rates"]),
               "r_test": rt, "train_acc": [[acc[(a, b, r)] for r in s["rates"]] for a, b in s["cells"]],
               "gain": [gains[a * b] for a, b in s["cells"]], "gain_at": s["gain_at"], "min_gain": MIN_GAIN,
               "maintained_at": s["maintained_at"], "margin": MARGIN, "lr_grid/lr": list(s["lrs"]),
               "lr_grid/rates": [0.0, rt], "lr_grid/train_acc": [[grid[(a, b, r)] for r in (0.0, rt)] for a, b in s["cells"]],
               "lr_chosen": [chosen[(a, b)] for a, b in s["cells"]]}
    fig, axes = style.subplots(1, len(s["cells"]), figsize=(3.4 * len(s["cells"]), 3.0), sharey=True, layout="constrained")
    for ax, (sigma, c) in zip(axes, s["cells"], strict=True):
        a = np.asarray([acc[(sigma, c, r)] for r in s["rates"]])
        ax.errorbar(s["rates"], a.mean(axis=1), yerr=a.std(axis=1, ddof=1) if a.shape[1] > 1 else None, marker="o",
                    capsize=3, color=style.method_color("dpsgd"))
        ax.axhline(a[0].mean(), color="tab:red", ls="--", lw=0.8)
        ax.set(xlabel="final sparsification rate r*", title=f"sigma {sigma:g}, C {c:g}, lr {chosen[(sigma, c)]:g}")
    axes[0].set_ylabel("final train accuracy")
    fig.suptitle(f"Zhu & Blaschko Fig. 2 ({ctx.scale}): {verdict.status}")
    style.panel_labels(axes)
    return numbers, verdict, style.save_figure(fig, ctx.stem("figure"))


RECIPE = Recipe(
    name="zhu-fig2", paper="Zhu & Blaschko 2023 (random sparsification in DP-SGD)", figure="Fig. 2",
    claim="the trade-off favors random sparsification as sigma^2 C^2 increases: its train-accuracy gain over plain "
          "DP-SGD rises with sigma C, it improves the accuracy at sigma^2 C^2 = 4, and at sigma^2 C^2 = 1 the "
          "performance is maintained",
    scaled_down="LeNet on digits, 10 epochs, one matched lr per (sigma, C) claim-blind from {0.3, 1}, (sigma, C) in "
                "{(1, 1/4), (1, 1), (2, 1)}, r* in {0, 0.5, 0.8}, 5 seeds",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="opacus-cnn (DP-CNN)", epochs=100,
                           hyper="batch 1000, sigma in {1, 2, 4} x C in {1/4, 1/2, 1}, r* up to 0.9, 5 seeds",
                           gpu_hours=40.0),
    make=make,
)
