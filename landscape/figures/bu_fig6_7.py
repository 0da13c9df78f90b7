"""Bu et al. (2023), Figs. 6-7 (Sec. 5.2): the clipping norm C trades accuracy for calibration.

The design notes: docs/figures.md, "What each recipe measures" (bu-fig6-7).
"""

from __future__ import annotations

import numpy as np

from landscape.figures import _bu_runs as bu
from landscape.figures import _draw
from landscape.figures._selection import judge_with_sensitivity
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import greater, inconclusive, paired_greater

SOURCE = "Bu et al. 2023, Figs. 6-7, Sec. 5.2"
SCALES = bu.SCALES


def make(ctx):
    bu_sel = bu.measured(ctx)
    small, large = bu_sel.small, bu_sel.large

    def evaluate(setting):
        m = bu_sel.at(setting, SOURCE)
        matched = bu.sgd_matched(ctx, m, small)
        res, rows = m.res, m.rows

        def metric(key, name):
            return [float(getattr(res.rows[i], name)) for i in rows[key]]

        compared = m.runs[small] + m.runs[large]
        parts = [ctx.judged(paired_greater(f"C = {large:g} is better calibrated (lower ECE) than C = {small:g}", SOURCE,
                                           metric(small, "ece"), metric(large, "ece"),
                                           names=(f"ECE C={small:g}", f"ECE C={large:g}")), compared),
                 ctx.judged(paired_greater(f"C = {large:g} has the lower test NLL", SOURCE, metric(small, "nll"),
                                           metric(large, "nll"), names=(f"NLL C={small:g}", f"NLL C={large:g}")),
                            compared),
                 ctx.judged(greater(f"C = {small:g} is worse calibrated than non-DP SGD at matched accuracy", SOURCE,
                                    metric(small, "ece"), matched.ece, names=(f"ECE C={small:g}", "ECE SGD matched"),
                                    unit="seeds", note=matched.text() + "."), m.runs[small] + m.runs["sgd"])]
        if not matched.matched:
            parts[2] = inconclusive(parts[2], f"no accuracy-matched SGD reference (some seed's reference is more than "
                                              f"{bu.MATCH_TOLERANCE:g} in test accuracy away)")
        verdict = bu_sel.verdict("a large clipping norm mitigates DP-SGD's mis-calibration (lower ECE and NLL than "
                                 "a small one)", SOURCE, parts, m)
        if ctx.role:
            return {}, verdict
        numbers = {**bu_sel.numbers(), **matched.numbers(), "premise/difference": m.premise.numbers["difference"]}
        for key, runs_key in (("sgd", "sgd"), ("small", small), ("large", large)):
            for name in ("accuracy", "nll", "ece"):
                numbers[f"{key}/{name}"] = metric(runs_key, name)
            numbers[f"reliability/{key}"] = res.bin_accuracy[rows[runs_key][0]]  # NaN: an empty bin
        return numbers, verdict

    return judge_with_sensitivity(ctx, bu_sel.sel, evaluate)


def draw(d):
    from landscape.plots import style

    n = d.numbers
    small, large = (float(v) for v in n["compared_C"])
    groups = (("small", f"DP\nC = {small:g}", "dpsgd"), ("large", f"DP\nC = {large:g}", "dpsgd"),
              ("sgd_matched", "SGD\nmatched", "sgd"), ("sgd", "SGD\nfinal", "sgd"))
    fig, grid = style.subplots(2, 3, figsize=(11, 6.6), layout="constrained")
    axes = [*grid[0], *grid[1]]
    for ax, name in zip(axes[:3], ("ece", "nll", "accuracy"), strict=True):  # what was judged, per seed
        for j, (key, _, method) in enumerate(groups):
            k = f"{key}/{name}"
            if k not in n:
                continue
            v = np.atleast_1d(n[k])
            ax.plot(np.full(v.size, j) + np.linspace(-0.15, 0.15, v.size), v, ls="none",
                    marker="o" if key != "large" else "s", color=style.method_color(method),
                    fillstyle="none" if key.startswith("sgd") else "full", label="one seed" if j == 0 else None)
            ax.plot([j - 0.25, j + 0.25], [v.mean()] * 2, color="k", lw=1.4, label="mean" if j == 0 else None)
        ax.set_xticks(range(len(groups)), [g[1] for g in groups], fontsize=7)
        ax.set(ylabel=f"test {name}", title=f"test {name}" + (" (judged)" if name != "accuracy" else " (premise)"))
        ax.legend(fontsize=7)
    panels = [("reliability/sgd", "sgd", "non-DP final, seed 0"),
              ("reliability/large", "dpsgd", f"C = {large:g}, seed 0"),
              ("reliability/small", "dpsgd", f"C = {small:g}, seed 0")]
    for ax, (key, method, title) in zip(axes[3:], panels, strict=True):
        bins = np.asarray(n[key], dtype=float)
        edges = np.linspace(0, 1, len(bins) + 1)
        shown = np.isfinite(bins)
        ax.bar(edges[:-1][shown], bins[shown], width=np.diff(edges)[shown], align="edge",
               color=style.method_color(method), alpha=0.7, edgecolor="white",
               label="accuracy per bin")
        ax.plot([0, 1], [0, 1], color="0.4", ls="--", lw=0.8, label="perfect calibration")
        ax.set(xlabel="confidence", ylabel="accuracy", title=title, xlim=(0, 1), ylim=(0, 1))
        ax.legend(fontsize=7, loc="upper left", title="empty bins not drawn" if not shown.all() else None,
                  title_fontsize=6)
    return _draw.finish(fig, d, f"Figs. 6-7 ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="bu-fig6-7", paper="Bu et al. 2023 (convergence and calibration of DP deep learning via NTK)",
    figure="Figs. 6-7",
    claim="a large clipping norm (lr 0.15 / C) gives lower NLL and ECE than a small one; small C is mis-calibrated",
    scaled_down="LeNet on digits, batch 32, 20 epochs, sigma 1.1, C in {1, 10, 100} with lr = f 0.15 / C, f from "
                "{1, 3, 10} selected on a validation split, 5 seeds; the largest C at similar validation accuracy is "
                "compared with C = 1; non-DP SGD at matched accuracy (its checkpoint, every 1/8 epoch, closest in train "
                "accuracy to C = 1, per seed; 5 epochs)",
    scales=SCALES,
    paper_scale=PaperScale(data="mnist", model="opacus-cnn (4-layer CNN)", epochs=30,
                           hyper="batch 256, sigma 1.1, lr 0.15 / C, C from 0.1 to 200, 5 runs", gpu_hours=3.0),
    make=make,
    draw=draw,
    needs=5,  # Bu et al. average 5 runs
)
