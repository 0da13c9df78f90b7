"""Watson et al. (2023), Fig. 11 (Sec. 4.2): pruning reduces the clipping ratio R "in the setting described in
Section 3.2" (the signal/noise data of eqs. 6-9), so the clipped gradient is better aligned with the true one.

The design notes: docs/figures.md, "What each recipe measures" (watson-fig11).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from landscape.figures import _draw
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

    s = ctx.settings
    base = TrainConfig(model=s["model"], model_kwargs=dict(s["model_kwargs"]), data=s["data"],
                       data_kwargs=dict(s["data_kwargs"]), epochs=s["epochs"], optimizer=s["optimizer"],
                       noise_multiplier=s["noise_multiplier"], max_grad_norm=s["max_grad_norm"], lr=s["lr"],
                       momentum=s["momentum"], batch_size=s["batch_size"], checkpoint_every="1e")
    R = {level: [] for level in s["levels"]}
    cos = {level: [] for level in s["levels"]}
    for seed in range(s["seeds"]):
        run = ctx.train(f"dp-{seed}", dataclasses.replace(base, seed=seed))
        res = clipping(f"{run.name}@last", root=ctx.root, prune_levels=tuple(s["levels"]),
                       max_grad_norm=s["max_grad_norm"], batch_size=s["clip_batch"], batches=s["batches"],
                       seed=seed, workers=ctx.workers, output=ctx.stem(f"clipping-{seed}").with_suffix(".h5"),
                       data_root=ctx.data_root, figure=False)
        for row in res.rows:
            R[row.prune_level].append(float(row.total.R))
            cos[row.prune_level].append(float(row.total.cos_clipped_mean))
    levels = list(s["levels"])
    parts = [paired_greater(f"pruning {p:g} of the weights lowers R", SOURCE, R[0.0], R[p],
                            names=("R unpruned", f"R pruned {p:g}"), unit="seeds") for p in levels if p > 0]
    parts += [paired_greater(f"pruning {p:g} of the weights aligns the clipped gradient better with the true one",
                             SOURCE, cos[p], cos[0.0], names=(f"cos pruned {p:g}", "cos unpruned"), unit="seeds")
              for p in levels if p > 0]
    verdict = all_of("pruning reduces the clipping ratio R and so better aligns the clipped gradient, at every level",
                     SOURCE, parts)
    ctx.scope(f"d_s 10, d_n {s['data_kwargs'].get('dn', 90)}, n {s['data_kwargs']['n']}, DP-SGD sigma "
              f"{s['noise_multiplier']:g}, C {s['max_grad_norm']:g}, lr {s['lr']:g}, {s['epochs']} epochs")
    numbers = {"levels": levels, "R": np.array([R[p] for p in levels]), "cos": np.array([cos[p] for p in levels])}
    return numbers, verdict


def draw(d):
    from landscape.plots import style

    n = d.numbers
    levels = np.asarray(n["levels"])
    fig, axes = style.subplots(1, 2, figsize=(9.0, 3.5), layout="constrained")
    for ax, key, label in ((axes[0], "R", "clipping ratio R"), (axes[1], "cos", "cos(clipped mean, true mean)")):
        table = np.atleast_2d(n[key])  # levels x seeds
        for j in range(table.shape[1]):
            ax.plot(levels, table[:, j], color=style.method_color("dpsgd"), lw=0.6, alpha=0.4,
                    label="one seed" if j == 0 else None)
        ax.errorbar(levels, table.mean(axis=1), yerr=table.std(axis=1, ddof=1) if table.shape[1] > 1 else None,
                    marker="o", capsize=3, color="k", label="mean, bars: sd over seeds")
        ax.set(xlabel="fraction of weights pruned", ylabel=label)
        ax.legend(fontsize=7)
    axes[0].set_title("R (judged: lower than unpruned)")
    axes[1].set_title("alignment (judged: higher than unpruned)")
    return _draw.finish(fig, d, f"Fig. 11 ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="watson-fig11", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 11",
    claim="pruning reduces the clipping ratio R, better aligning the clipped gradient with the true one (signal/noise "
          "data of Sec. 3.2)",
    scaled_down="two-layer linear net on gaussian-signal (d_s 10, d_n 90, n 1,000), DP-SGD 5 epochs, 5 seeds",
    scales=SCALES,
    paper_scale=PaperScale(data="gaussian-signal", model="two-layer linear (balanced init)", epochs=20,
                           hyper="sizes not stated in the paper; here d_n 990, n 10,000, 5 seeds", gpu_hours=0.2),
    make=make,
    draw=draw,
)
