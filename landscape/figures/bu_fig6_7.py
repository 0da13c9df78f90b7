"""Bu et al. (2023), Figs. 6-7 (Sec. 5.2): the clipping norm C trades accuracy for calibration.

Fig. 6: DP-SGD (sigma 1.1, lr 0.15 / C) with a large C "leads to smaller loss (or NLL)" at similar accuracy, and
across C there is "a clear accuracy-calibration trade-off"; Fig. 7: reliability diagrams of non-DP, large-C and
small-C models: small C is mis-calibrated (over-confident), "large R training again mitigates the
mis-calibration". Measured with ``landscape calibration`` (test split, 15 equal-width bins) on the runs of
``_bu_runs`` (each C and non-DP SGD, 5 seeds). Verdict (:func:`landscape.verdict.all_of`): the largest C has a
lower ECE and a lower NLL than the smallest C (:func:`landscape.verdict.paired_greater`, paired by seed: a
seed's runs share their initialisation), and the smallest C is worse calibrated than non-DP SGD at matched
accuracy (:func:`landscape.verdict.greater`): per seed against the SGD checkpoint whose test accuracy is closest
to the smallest C's (``_bu_runs.sgd_matched``; inconclusive when some seed has none within 2 points, as final SGD
is far more accurate than any DP run). The SGD panels and ``sgd/*`` numbers show the final SGD models;
``sgd_matched/*`` holds the chosen epochs, both accuracies and the matched ECE.

Scaled down: LeNet on ``digits``, batch 32, 20 epochs, C in {1, 10, 100}, lr per C claim-blind (``_bu_runs``),
5 seeds (as the paper averages 5 runs; the recipe states it needs 5) (the paper: the 4-layer CNN on MNIST,
batch 256, C from 0.1 to 200; Fig. 7 compares C = 200 with C = 1).
"""

from __future__ import annotations

import numpy as np

from landscape.figures import _bu_runs as bu
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import all_of, greater, inconclusive, paired_greater

SOURCE = "Bu et al. 2023, Figs. 6-7, Sec. 5.2"
SCALES = bu.SCALES


def make(ctx):
    from landscape.plots import style

    m = bu.measured(ctx, SOURCE)
    res, rows, norms, small, large = m.res, m.rows, m.norms, m.small, m.large
    matched = bu.sgd_matched(ctx, m, small)

    def metric(key, name):
        return [float(getattr(res.rows[i], name)) for i in rows[key]]

    parts = [paired_greater(f"C = {large:g} is better calibrated (lower ECE) than C = {small:g}", SOURCE,
                            metric(small, "ece"), metric(large, "ece"), names=(f"ECE C={small:g}", f"ECE C={large:g}")),
             paired_greater(f"C = {large:g} has the lower test NLL", SOURCE, metric(small, "nll"), metric(large, "nll"),
                            names=(f"NLL C={small:g}", f"NLL C={large:g}")),
             greater(f"C = {small:g} is worse calibrated than non-DP SGD at matched accuracy", SOURCE,
                     metric(small, "ece"), matched.ece, names=(f"ECE C={small:g}", "ECE SGD matched"), unit="seeds",
                     note=matched.text() + ".")]
    if not matched.matched:
        parts[2] = inconclusive(parts[2], f"no accuracy-matched SGD reference (some seed's closest SGD checkpoint is "
                                          f"more than {bu.MATCH_TOLERANCE:g} in test accuracy away)")
    verdict = all_of("a large clipping norm mitigates DP-SGD's mis-calibration (lower ECE and NLL than a small one)",
                     SOURCE, parts, note=m.note() + " " + " | ".join(p.line() for p in parts))
    verdict = bu.judged(verdict, m.premise)
    keys = ["sgd", *norms]
    numbers = {"max_grad_norm": norms, **m.numbers(), **matched.numbers()}
    for name in ("accuracy", "nll", "ece"):
        numbers.update({f"{'sgd' if k == 'sgd' else f'C{k:g}'}/{name}": metric(k, name) for k in keys})
    # the reliability bins (NaN in empty bins) stay in the calibration files beside the summary; the last panel is
    # seed 0's accuracy-matched SGD checkpoint
    fig, grid = style.subplots(2, 3, figsize=(11, 6.4), layout="constrained")
    axes = [*grid[0], *grid[1]]
    for ax, name in zip(axes[:2], ("nll", "accuracy"), strict=True):
        vals = np.array([metric(c, name) for c in norms])
        ax.errorbar(norms, vals.mean(axis=1), yerr=vals.std(axis=1, ddof=1) if vals.shape[1] > 1 else None,
                    marker="o", capsize=3, color=style.method_color("dpsgd"), label="DP-SGD")
        ax.axhline(np.mean(metric("sgd", name)), color=style.method_color("sgd"), ls="--", label="non-DP SGD")
        ax.set(xscale="log", xlabel="clipping norm C (lr per C, claim-blind)", ylabel=f"test {name}")
    axes[0].legend(fontsize=7)
    eces = np.array([metric(c, "ece") for c in norms])
    twin = axes[1].twinx()
    twin.plot(norms, eces.mean(axis=1), color="0.3", marker="s", ls=":", label="ECE")
    twin.axhline(np.mean(matched.ece), color=style.method_color("sgd"), ls=":", lw=0.8,
                 label="ECE of SGD at C = 1's accuracy")
    twin.legend(fontsize=7, loc="center right")
    panels = [(res.bin_accuracy[rows[k][0]], "sgd" if k == "sgd" else "dpsgd",
               f"{title}: ECE {res.rows[rows[k][0]].ece:.3f} (seed 0)")
              for k, title in (("sgd", "non-DP"), (large, f"C = {large:g}"), (small, f"C = {small:g}"))]
    panels.append((matched.bin_accuracy[0], "sgd", f"non-DP, epoch {matched.epoch[0]:.3g}: ECE {matched.ece[0]:.3f}"))
    for ax, (bins, method, title) in zip(axes[2:], panels, strict=True):
        edges = np.linspace(0, 1, len(bins) + 1)
        ax.bar(edges[:-1], np.nan_to_num(bins), width=np.diff(edges), align="edge",
               color=style.method_color(method), alpha=0.7, edgecolor="white")
        ax.plot([0, 1], [0, 1], color="0.4", ls="--", lw=0.8)
        ax.set(xlabel="confidence", ylabel="accuracy", title=title)
    fig.suptitle(f"Figs. 6-7 ({ctx.scale}): {verdict.status}")
    style.panel_labels(axes)
    return numbers, verdict, style.save_figure(fig, ctx.stem("figure"))


RECIPE = Recipe(
    name="bu-fig6-7", paper="Bu et al. 2023 (convergence and calibration of DP deep learning via NTK)",
    figure="Figs. 6-7",
    claim="a large clipping norm (lr 0.15 / C) gives lower NLL and ECE than a small one; small C is mis-calibrated",
    scaled_down="LeNet on digits, batch 32, 20 epochs, sigma 1.1, C in {1, 10, 100} with lr = f 0.15 / C, f from "
                "{1, 3, 10} per C (claim-blind), 5 seeds; the largest C at similar accuracy is compared with C = 1; "
                "non-DP SGD at matched accuracy (its checkpoint, every 1/8 epoch, closest in test accuracy to C = 1, per seed)",
    scales=SCALES,
    paper_scale=PaperScale(data="mnist", model="opacus-cnn (4-layer CNN)", epochs=30,
                           hyper="batch 256, sigma 1.1, lr 0.15 / C, C from 0.1 to 200, 5 runs", gpu_hours=3.0),
    make=make,
    needs=5,  # Bu et al. average 5 runs
)
