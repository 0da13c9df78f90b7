"""Bu et al. (2023), Fig. 11 (Appendix, with Figs. 2 and 5): the probability a model assigns to the true class.
"Clearly the small R clipping gives overly confident prediction: almost half of the time the true class is
assigned close to zero prediction probability. The large R clipping has a more balanced prediction probability
that is less concentrated to 1."

Measured with ``landscape calibration`` (its true-class probability histogram, 15 equal-width bins, test split)
on the runs of ``_bu_runs`` (DP-SGD with sigma 1.1 and lr 0.15 / C at small and large C, non-DP SGD; 5 seeds,
as Bu et al. average 5 runs).
Verdict (:func:`landscape.verdict.all_of` of :func:`landscape.verdict.paired_greater`, paired by seed): the
fraction of test examples whose true class gets probability <= 1/15 is larger at the smallest C than at the
largest, and so is the fraction with probability > 14/15 (concentration at 1).

Scaled down: LeNet on ``digits`` (the paper: a Vision Transformer on CIFAR10).
"""

from __future__ import annotations

import numpy as np

from landscape.figures import _bu_runs as bu
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import all_of, paired_greater

SOURCE = "Bu et al. 2023, Fig. 11, Appendix"
SCALES = bu.SCALES


def make(ctx):
    from landscape.plots import style

    m = bu.measured(ctx, SOURCE)
    res, rows, norms, small, large = m.res, m.rows, m.norms, m.small, m.large
    hist = {k: np.array([res.true_class_count[i] / res.true_class_count[i].sum() for i in rows[k]]) for k in rows}
    low = {k: list(h[:, 0]) for k, h in hist.items()}
    high = {k: list(h[:, -1]) for k, h in hist.items()}
    parts = [paired_greater(f"C = {small:g} puts probability <= 1/15 on the true class more often than C = {large:g}",
                            SOURCE, low[small], low[large], names=(f"C={small:g}", f"C={large:g}")),
             paired_greater(f"C = {small:g} is more concentrated at probability > 14/15 than C = {large:g}", SOURCE,
                            high[small], high[large], names=(f"C={small:g}", f"C={large:g}"))]
    verdict = all_of("small-C clipping is over-confident: more true classes near 0 and more mass near 1 than large C",
                     SOURCE, parts, note=m.note() + " " + " | ".join(p.line() for p in parts))
    verdict = bu.judged(verdict, m.premise)
    keys = ["sgd", *norms]
    label = {k: "non-DP SGD" if k == "sgd" else f"DP C = {k:g}" for k in keys}
    numbers = {f"{'sgd' if k == 'sgd' else f'C{k:g}'}/true_class_histogram": hist[k] for k in keys}
    numbers.update(m.numbers())
    numbers.update({f"{'sgd' if k == 'sgd' else f'C{k:g}'}/fraction_near_0": low[k] for k in keys})
    numbers.update({f"{'sgd' if k == 'sgd' else f'C{k:g}'}/fraction_near_1": high[k] for k in keys})
    fig, axes = style.subplots(1, len(keys), figsize=(3.2 * len(keys), 3.9), sharey=True, layout="constrained")
    edges = np.linspace(0, 1, res.true_class_count.shape[1] + 1)
    for ax, k in zip(axes, keys, strict=True):
        h = hist[k].mean(axis=0)
        ax.bar(edges[:-1], h, width=np.diff(edges), align="edge", edgecolor="white",
               color=style.method_color("sgd" if k == "sgd" else "dpsgd"), alpha=0.75)
        ax.set(xlabel="probability on the true class", title=label[k])
    axes[0].set_ylabel("fraction of test examples (mean over seeds)")
    fig.suptitle(f"Fig. 11 ({ctx.scale}): {verdict.status}")
    style.panel_labels(axes)
    return numbers, verdict, style.save_figure(fig, ctx.stem("figure"))


RECIPE = Recipe(
    name="bu-fig11", paper="Bu et al. 2023 (convergence and calibration of DP deep learning via NTK)",
    figure="Fig. 11",
    claim="small-C clipping is over-confident: true classes often near probability 0, mass concentrated at 1",
    scaled_down="LeNet on digits (the runs of bu-fig6-7, lr per C claim-blind; the largest C at similar accuracy "
                "compared with C = 1) instead of a Vision Transformer on CIFAR10",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="vision transformer (TIMM)", epochs=3,
                           hyper="fine-tuning from ImageNet weights (not available offline): here the bu-fig6-7 "
                           "runs at paper scale", gpu_hours=3.0),
    make=make,
    needs=5,  # Bu et al. average 5 runs
)
