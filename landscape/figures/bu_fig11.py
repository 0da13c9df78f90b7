"""Bu et al. (2023), Fig. 11 (Appendix, with Figs. 2 and 5): the probability a model assigns to the true class.
"Clearly the small R clipping gives overly confident prediction: almost half of the time the true class is
assigned close to zero prediction probability. The large R clipping has a more balanced prediction probability
that is less concentrated to 1."

The design notes: docs/figures.md, "What each recipe measures" (bu-fig11).
"""

from __future__ import annotations

import numpy as np

from landscape.figures import _bu_runs as bu
from landscape.figures import _draw
from landscape.figures._selection import judge_with_sensitivity
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import paired_greater

SOURCE = "Bu et al. 2023, Fig. 11, Appendix"
SCALES = bu.SCALES


def make(ctx):
    bu_sel = bu.measured(ctx)
    small, large = bu_sel.small, bu_sel.large

    def evaluate(setting):
        m = bu_sel.at(setting, SOURCE)
        res, rows = m.res, m.rows
        hist = {k: np.array([res.true_class_count[i] / res.true_class_count[i].sum() for i in rows[k]]) for k in rows}
        low = {k: list(h[:, 0]) for k, h in hist.items()}
        high = {k: list(h[:, -1]) for k, h in hist.items()}
        compared = m.runs[small] + m.runs[large]
        parts = [ctx.judged(paired_greater(f"C = {small:g} puts probability <= 1/15 on the true class more often than "
                                           f"C = {large:g}", SOURCE, low[small], low[large],
                                           names=(f"C={small:g}", f"C={large:g}")), compared),
                 ctx.judged(paired_greater(f"C = {small:g} is more concentrated at probability > 14/15 than "
                                           f"C = {large:g}", SOURCE, high[small], high[large],
                                           names=(f"C={small:g}", f"C={large:g}")), compared)]
        verdict = bu_sel.verdict("small-C clipping is over-confident: more true classes near 0 and more mass near 1 "
                                 "than large C", SOURCE, parts, m)
        if ctx.role:
            return {}, verdict
        numbers = dict(bu_sel.numbers())
        for key, k in (("sgd", "sgd"), ("small", small), ("large", large)):
            numbers.update({f"{key}/true_class_histogram": hist[k], f"{key}/fraction_near_0": low[k],
                            f"{key}/fraction_near_1": high[k]})
        return numbers, verdict

    return judge_with_sensitivity(ctx, bu_sel.sel, evaluate)


def draw(d):
    from landscape.plots import style

    n = d.numbers
    small, large = (float(v) for v in n["compared_C"])
    keys = (("sgd", "non-DP SGD", "sgd"), ("large", f"DP C = {large:g}", "dpsgd"), ("small", f"DP C = {small:g}", "dpsgd"))
    fig, axes = style.subplots(1, len(keys), figsize=(3.4 * len(keys), 3.9), sharey=True, layout="constrained")
    for ax, (key, label, method) in zip(axes, keys, strict=True):
        h = np.atleast_2d(n[f"{key}/true_class_histogram"])
        edges = np.linspace(0, 1, h.shape[1] + 1)
        ax.bar(edges[:-1], h.mean(axis=0), width=np.diff(edges), align="edge", edgecolor="white",
               color=style.method_color(method), alpha=0.75, label="mean over seeds")
        ax.errorbar((edges[:-1] + edges[1:]) / 2, h.mean(axis=0), yerr=[h.mean(axis=0) - h.min(axis=0),
                                                                      h.max(axis=0) - h.mean(axis=0)],
                    ls="none", color="k", capsize=2, lw=0.8, label="min-max over seeds")
        for x in (1 / 15, 14 / 15):
            ax.axvline(x, color="tab:red", ls=":", lw=0.8, label="judged bins (<= 1/15, > 14/15)" if x < 0.5 else None)
        ax.set(xlabel="probability on the true class", title=label)
    axes[0].set_ylabel("fraction of test examples")
    axes[0].legend(fontsize=7, loc="upper center")
    return _draw.finish(fig, d, f"Fig. 11 ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="bu-fig11", paper="Bu et al. 2023 (convergence and calibration of DP deep learning via NTK)",
    figure="Fig. 11",
    claim="small-C clipping is over-confident: true classes often near probability 0, mass concentrated at 1",
    scaled_down="LeNet on digits (the runs of bu-fig6-7: lr = f 0.15 / C with f selected on a validation split; the "
                "largest C at similar validation accuracy compared with C = 1) instead of a Vision Transformer on "
                "CIFAR10",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="vision transformer (TIMM)", epochs=3,
                           hyper="fine-tuning from ImageNet weights (not available offline): here the bu-fig6-7 "
                           "runs at paper scale", gpu_hours=3.0),
    make=make,
    draw=draw,
    needs=5,  # Bu et al. average 5 runs
)
