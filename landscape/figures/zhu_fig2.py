"""Zhu & Blaschko (2023), Fig. 2 (Sec. 6.1): random sparsification (RS) trades gradient information for less
noise, and "the trade-off favors RS as Delta_sigma ~ sigma^2 C^2 increasing". Sec. 6.1 states three things of Fig. 2
(panels a-h; 2i, sigma 4 and C 1, is excluded there because the network degrades): more RS is preferred as sigma or
C grows; "as C^2 sigma^2 increases to 2^2, i.e. Figure 2f and 2h, RS can improve the performance of DP-SGD by more
than 4%"; and "when C^2 sigma^2 = 1, i.e. Figure 2c, 2e, 2g, the performance is maintained under RS (or slightly
increased)".

The design notes: docs/figures.md, "What each recipe measures" (zhu-fig2).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from landscape.figures import _draw
from landscape.figures._selection import judge_with_sensitivity, per_arm
from landscape.figures.recipe import PaperScale, Recipe, final
from landscape.verdict import all_of, ordered, paired_greater, similar

SOURCE = "Zhu & Blaschko 2023, Fig. 2, Sec. 6.1"
MARGIN = 0.01  # accuracy (1 point): the margin within which accuracies count as "the same" (watson-fig10)
MIN_GAIN = MARGIN  # accuracy: the smallest gain that is not "maintained" (module docstring, part (b))
_COMMON = dict(model="lenet", data="digits", lrs=(0.3, 1.0), batch_size=64, cells=((1.0, 0.25), (1.0, 1.0), (2.0, 1.0)),
               rates=(0.0, 0.5, 0.8), r_test=0.5, gain_at=2.0, maintained_at=1.0)
SCALES = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "seeds": 2, "rates": (0.0, 0.5)},
    # cpu: only the two rates the parts judge (r* = 0.8 was drawn, never judged; docs/figures.md, "Cost")
    "cpu": {**_COMMON, "subset": None, "epochs": 10, "seeds": 5, "rates": (0.0, 0.5)},
    "paper": {**_COMMON, "data": "cifar10", "model": "opacus-cnn", "subset": None, "batch_size": 1000, "epochs": 100,
              "seeds": 5, "cells": tuple((s, c) for c in (0.25, 0.5, 1.0) for s in (1.0, 2.0, 4.0)),
              "rates": (0.0, 0.3, 0.5, 0.7, 0.9)},
}


def _at(cells, sigma_c: float) -> list[tuple[float, float]]:
    """The cells (sigma, C) whose product is ``sigma_c``."""
    return [(a, b) for a, b in cells if math.isclose(a * b, sigma_c)]


def make(ctx):
    from landscape.api import TrainConfig

    s = ctx.settings
    base = TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"], lr=s["lrs"][0],
                       momentum=0.0, batch_size=s["batch_size"], optimizer="dpsgd", checkpoint_every="1e")
    rt = s["r_test"]
    config = {(sigma, c, r): dataclasses.replace(base, noise_multiplier=sigma, max_grad_norm=c, sparsify=r, seed=0)
              for sigma, c in s["cells"] for r in s["rates"]}
    arms = {f"s{sigma:g}-C{c:g}-r{r:g}": (sigma, c, r) for sigma, c in s["cells"] for r in (0.0, rt)}
    sel = per_arm(ctx, [float(v) for v in s["lrs"]],
                  {a: (lambda lr, key=key: dataclasses.replace(config[key], lr=lr)) for a, key in arms.items()})

    def evaluate(setting):
        def lr_of(sigma, c, r):
            key = f"s{sigma:g}-C{c:g}-r{r:g}"
            return sel.value(setting[key] if key in setting else setting[f"s{sigma:g}-C{c:g}-r{rt:g}"])

        acc, runs = {}, {}
        for sigma, c in s["cells"]:
            for r in s["rates"]:
                lr = lr_of(sigma, c, r)
                runs[(sigma, c, r)] = [ctx.train(f"s{sigma:g}-C{c:g}-r{r:g}-lr{lr:g}-{seed}", dataclasses.replace(
                    config[(sigma, c, r)], lr=lr, seed=seed)) for seed in range(s["seeds"])]
                acc[(sigma, c, r)] = [final(run, "train_acc") for run in runs[(sigma, c, r)]]
        gains = {sigma * c: list(np.asarray(acc[(sigma, c, rt)]) - np.asarray(acc[(sigma, c, 0.0)]))
                 for sigma, c in s["cells"]}

        def compared(cells):  # the end models a part is judged from: RS and plain runs of its cells
            return [run for sigma, c in cells for r in (0.0, rt) for run in runs[(sigma, c, r)]]

        names = (f"RS r*={rt:g}", "plain")
        parts = [ctx.judged(ordered(f"the gain of RS (r* = {rt:g}) over plain DP-SGD rises with sigma C", SOURCE,
                                    gains, decreasing=False, key="sigma C", unit="seeds"), compared(s["cells"]))]
        parts += [ctx.judged(paired_greater(
            f"at sigma^2 C^2 = {s['gain_at'] ** 2:g} (sigma {sigma:g}, C {c:g}) RS (r* = {rt:g}) improves DP-SGD's "
            f"train accuracy by more than {MIN_GAIN:g}", SOURCE, acc[(sigma, c, rt)], acc[(sigma, c, 0.0)],
            names=names, unit="seeds", min_effect=MIN_GAIN), compared([(sigma, c)]))
            for sigma, c in _at(s["cells"], s["gain_at"])]
        parts += [ctx.judged(similar(
            f"at sigma^2 C^2 = {s['maintained_at'] ** 2:g} (sigma {sigma:g}, C {c:g}) the train accuracy is "
            f"maintained under RS (r* = {rt:g})", SOURCE, acc[(sigma, c, rt)], acc[(sigma, c, 0.0)],
            tolerance=MARGIN, names=names, unit="seeds", paired=True), compared([(sigma, c)]))
            for sigma, c in _at(s["cells"], s["maintained_at"])]
        verdict = all_of(RECIPE.claim, SOURCE, parts)
        if ctx.role:
            return {}, verdict
        ctx.scope(f"one lr {lr_of(*s['cells'][0], 0.0):g} for every cell and r*, batch {s['batch_size']}, "
                  f"{s['epochs']} epochs (the paper: 100 epochs, batch 1000)")
        numbers = {"sigma": [a for a, _ in s["cells"]], "C": [b for _, b in s["cells"]], "rates": list(s["rates"]),
                   "r_test": rt, "train_acc": [[acc[(a, b, r)] for r in s["rates"]] for a, b in s["cells"]],
                   "gain": [gains[a * b] for a, b in s["cells"]], "gain_at": s["gain_at"], "min_gain": MIN_GAIN,
                   "maintained_at": s["maintained_at"], "margin": MARGIN}
        return numbers, verdict

    return judge_with_sensitivity(ctx, sel, evaluate)


def draw(d):
    from landscape.plots import style

    n = d.numbers
    sigmas, cs, rates = np.atleast_1d(n["sigma"]), np.atleast_1d(n["C"]), np.asarray(n["rates"])
    acc = np.asarray(n["train_acc"]).reshape(len(sigmas), len(rates), -1)
    fig, axes = style.subplots(1, len(sigmas) + 1, figsize=(3.4 * (len(sigmas) + 1), 3.4), layout="constrained")
    for ax, sigma, c, a in zip(axes, sigmas, cs, acc, strict=False):
        ax.errorbar(rates, a.mean(axis=1), yerr=a.std(axis=1, ddof=1) if a.shape[1] > 1 else None, marker="o",
                    capsize=3, color=style.method_color("dpsgd"), label="mean, bars: sd over seeds")
        ax.axhline(a[0].mean(), color="tab:red", ls="--", lw=0.8, label="plain DP-SGD (r* = 0) mean")
        ax.set(xlabel="final sparsification rate r*", ylabel="final train accuracy", title=f"sigma {sigma:g}, C {c:g}")
    axes[0].legend(fontsize=7)
    ax = axes[-1]  # what was judged: per seed the gain of r_test over r* = 0, against sigma C
    gain = np.asarray(n["gain"]).reshape(len(sigmas), -1)
    sc = sigmas * cs
    for j, g in enumerate(gain):
        ax.plot(np.full(g.size, j) + np.linspace(-0.15, 0.15, g.size), g, ls="none", marker="o",
                color=style.method_color("dpsgd"), label="one seed" if j == 0 else None)
    ax.axhline(float(n["min_gain"]), color="tab:red", ls="--", lw=0.8, label="minimum gain (1 point)")
    ax.axhspan(-float(n["margin"]), float(n["margin"]), color="0.5", alpha=0.15, lw=0, label="'maintained' margin")
    ax.set_xticks(range(len(sc)), [f"sigma C {v:g}" for v in sc], fontsize=8)
    ax.set(ylabel=f"gain of r* = {float(n['r_test']):g} over r* = 0", title="judged: RS gain")
    ax.legend(fontsize=7)
    return _draw.finish(fig, d, f"Zhu & Blaschko Fig. 2 ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="zhu-fig2", paper="Zhu & Blaschko 2023 (random sparsification in DP-SGD)", figure="Fig. 2",
    claim="the trade-off favors random sparsification as sigma^2 C^2 increases: its train-accuracy gain over plain "
          "DP-SGD rises with sigma C, it improves the accuracy at sigma^2 C^2 = 4, and at sigma^2 C^2 = 1 the "
          "performance is maintained",
    scaled_down="LeNet on digits, 10 epochs, one lr for every cell selected on a validation split from {0.3, 1}, "
                "(sigma, C) in "
                "{(1, 1/4), (1, 1), (2, 1)}, r* in {0, 0.5}, 5 seeds",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="opacus-cnn (DP-CNN)", epochs=100,
                           hyper="batch 1000, sigma in {1, 2, 4} x C in {1/4, 1/2, 1}, r* up to 0.9, 5 seeds",
                           gpu_hours=40.0),
    make=make,
    draw=draw,
)
