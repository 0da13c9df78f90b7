"""Watson et al. (2023), Fig. 11 (Sec. 4.2): pruning reduces the clipping ratio R "in the setting described in
Section 3.2" (the signal/noise data of eqs. 6-9), so the clipped gradient is better aligned with the true one.

Measured: a DP-SGD run of the two-layer linear net (balanced init) on ``gaussian-signal``; at each pruning level
its final weights are magnitude-pruned per layer, the survivors rewound to its initialisation and retrained
with its configuration, and R (Sec. 3.1) is measured on ``batches`` disjoint batches at the retrained final
checkpoint (``landscape clipping --prune-levels``), for ``seeds`` independent runs. Verdict
(:func:`landscape.verdict.all_of`): at every pruning level > 0, R is below R without pruning (:func:`landscape.verdict.paired_greater`,
the paired one-sided t-test at alpha 0.05: a seed's runs share their initialisation, data order and noise draws).

Scaled down: d_s 10, d_n 90, n 1,000, 5 epochs, 5 seeds (the paper does not state its sizes).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import all_of, paired_greater

SOURCE = "Watson et al. 2023, Fig. 11, Sec. 4.2"
_COMMON = dict(model="two-layer-linear", model_kwargs={"hidden": 32, "balanced_init": True}, data="gaussian-signal",
               optimizer="dpsgd", noise_multiplier=1.0, max_grad_norm=1.0, lr=0.1, momentum=0.0, batch_size=64,
               levels=(0.0, 0.3, 0.5, 0.7, 0.9), clip_batch=256)
SCALES = {
    "test": {**_COMMON, "data_kwargs": {"n": 300}, "epochs": 1, "seeds": 2, "levels": (0.0, 0.7), "batches": 1},
    "cpu": {**_COMMON, "data_kwargs": {"n": 1000}, "epochs": 5, "seeds": 5, "batches": 3},
    "paper": {**_COMMON, "data_kwargs": {"n": 10000, "dn": 990}, "epochs": 20, "seeds": 5, "batches": 10},
}


def make(ctx):
    from landscape.api import TrainConfig, clipping
    from landscape.plots import style

    s = ctx.settings
    base = TrainConfig(model=s["model"], model_kwargs=dict(s["model_kwargs"]), data=s["data"],
                       data_kwargs=dict(s["data_kwargs"]), epochs=s["epochs"], optimizer=s["optimizer"],
                       noise_multiplier=s["noise_multiplier"], max_grad_norm=s["max_grad_norm"], lr=s["lr"],
                       momentum=s["momentum"], batch_size=s["batch_size"], checkpoint_every="none")
    R = {level: [] for level in s["levels"]}
    for seed in range(s["seeds"]):
        run = ctx.train(f"dp-{seed}", dataclasses.replace(base, seed=seed))
        res = clipping(f"{run.name}@last", root=ctx.root, prune_levels=tuple(s["levels"]),
                       max_grad_norm=s["max_grad_norm"], batch_size=s["clip_batch"], batches=s["batches"],
                       seed=seed, workers=ctx.workers, output=ctx.stem(f"clipping-{seed}").with_suffix(".h5"),
                       data_root=ctx.data_root, figure=False)
        for row in res.rows:
            R[row.prune_level].append(float(row.total.R))
    levels = list(s["levels"])
    parts = [paired_greater(f"pruning {p:g} of the weights lowers R", SOURCE, R[0.0], R[p],
                            names=("R unpruned", f"R pruned {p:g}"), unit="seeds") for p in levels if p > 0]
    verdict = all_of("pruning reduces the clipping ratio R at every level", SOURCE, parts,
                     note=" | ".join(p.line() for p in parts))
    table = np.array([R[p] for p in levels])  # levels x seeds
    numbers = {"levels": levels, "R": table}
    fig, ax = style.subplots(figsize=(4.6, 3.2), layout="constrained")
    ax.errorbar(levels, table.mean(axis=1), yerr=table.std(axis=1, ddof=1) if table.shape[1] > 1 else None,
                marker="o", capsize=3, color=style.method_color("dpsgd"))
    for j in range(table.shape[1]):
        ax.plot(levels, table[:, j], color=style.method_color("dpsgd"), lw=0.6, alpha=0.4)
    ax.set(xlabel="fraction of weights pruned", ylabel="clipping ratio R", title=f"Fig. 11 ({ctx.scale}): {verdict.status}")
    return numbers, verdict, style.save_figure(fig, ctx.stem("figure"))


RECIPE = Recipe(
    name="watson-fig11", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 11",
    claim="pruning reduces the clipping ratio R (signal/noise data of Sec. 3.2)",
    scaled_down="two-layer linear net on gaussian-signal (d_s 10, d_n 90, n 1,000), DP-SGD 5 epochs, 5 seeds",
    scales=SCALES,
    paper_scale=PaperScale(data="gaussian-signal", model="two-layer linear (balanced init)", epochs=20,
                           hyper="sizes not stated in the paper; here d_n 990, n 10,000, 5 seeds", gpu_hours=0.2),
    make=make,
)
