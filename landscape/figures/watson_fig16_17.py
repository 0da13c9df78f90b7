"""Watson et al. (2023), Figs. 16-17 (Appendix): DP-SGD's gradients stay larger along training (Fig. 16: mean
per-sample gradient norm over training, histograms early and late) and DP-SGD models lie further from the
origin than SGD models (Fig. 17: 142 vs 86, "1.7x", fewer parameters near 0).

The design notes: docs/figures.md, "What each recipe measures" (watson-fig16-17).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from landscape.figures import _draw
from landscape.figures._selection import judge_with_sensitivity, per_arm
from landscape.figures.recipe import PaperScale, Recipe, eps_text
from landscape.verdict import all_of, paired_greater, paired_ratio

SOURCE = "Watson et al. 2023, Figs. 16-17, Appendix"
MIN_RATIO = 1.2  # distance DP/SGD: the paper's pruned DP-SGD ratio, which it counts as "closely replicating" SGD
_COMMON = dict(model="lenet", data="digits", lrs=(0.01, 0.03, 0.1), batch=64, momentum=0.9, epsilon=1.0,
               max_grad_norm=1.0, bins=60)
SCALES = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "seeds": 2, "grad_samples": 32, "lrs": (0.03, 0.1)},
    "cpu": {**_COMMON, "subset": None, "epochs": 10, "seeds": 5, "grad_samples": 256},
    "paper": {**_COMMON, "model": "resnet18", "data": "cifar10", "subset": None, "lrs": (0.03, 0.1, 0.3), "batch": 128,
              "epochs": 30, "seeds": 3, "grad_samples": 1024},
}


def make(ctx):
    from landscape.api import TrainConfig, norms

    s = ctx.settings
    sgd = TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"],
                      batch_size=s["batch"], momentum=s["momentum"], checkpoint_every="1e")
    dp = dataclasses.replace(sgd, optimizer="dpsgd", max_grad_norm=s["max_grad_norm"], target_epsilon=s["epsilon"])
    configs = {"sgd": sgd, "dp": dp}
    sel = per_arm(ctx, [float(v) for v in s["lrs"]],
                  {m: (lambda lr, c=c: dataclasses.replace(c, lr=lr, seed=0)) for m, c in configs.items()})

    def evaluate(setting):
        lr = {m: sel.value(setting[m]) for m in configs}
        results, used = [], []
        for seed in range(s["seeds"]):
            trained = [ctx.train(f"{m}-lr{lr[m]:g}-{seed}", dataclasses.replace(c, lr=lr[m], seed=seed))
                       for m, c in configs.items()]
            used += trained
            names = [r.name for r in trained]
            tag = f"{lr['sgd']:g}-{lr['dp']:g}".replace(".", "_")
            results.append(norms(names, root=ctx.root, bins=s["bins"], subset=s["grad_samples"], subset_seed=seed,
                                 workers=ctx.workers, output=ctx.stem(f"norms-lr{tag}-{seed}").with_suffix(".h5"),
                                 data_root=ctx.data_root, figure=False))
        dist = {m: [r.runs[i].rows[-1].params.dist_origin for r in results] for i, m in enumerate(configs)}
        grad = {m: [r.runs[i].rows[-1].mean_grad_norm for r in results] for i, m in enumerate(configs)}
        parts = [ctx.judged(paired_ratio(
                     f"the DP-SGD model ends further from the origin than the SGD model (ratio above {MIN_RATIO:g})",
                     SOURCE, dist["dp"], dist["sgd"], names=("DP", "SGD"), unit="seeds", min_ratio=MIN_RATIO,
                     note="paper: 1.7x, and 1.2x after pruning ('more closely replicating' SGD)."), used),
                 ctx.judged(paired_greater("DP-SGD's final mean per-sample gradient norm exceeds SGD's", SOURCE,
                                           grad["dp"], grad["sgd"], names=("DP", "SGD"), unit="seeds"), used)]
        verdict = all_of("DP-SGD ends further from the origin with larger gradients than SGD", SOURCE, parts)
        if ctx.role:
            return {}, verdict
        ctx.scope(f"one lr {lr['sgd']:g} for both (the paper: batches of 128, lr assumed), batch {s['batch']}, "
                  f"momentum {s['momentum']:g}", eps_text(used[1::2]))
        first = results[0]
        curve = {m: np.array([r.runs[i].column("mean_grad_norm") for r in results]) for i, m in enumerate(configs)}
        origin = {m: np.array([r.runs[i].column("dist_origin") for r in results]) for i, m in enumerate(configs)}
        numbers = {"epoch": np.array([row.epoch for row in first.runs[0].rows]), "min_effect": MIN_RATIO,
                   "sgd/grad_curve": curve["sgd"], "dp/grad_curve": curve["dp"], "sgd/dist_origin": origin["sgd"],
                   "dp/dist_origin": origin["dp"], "edges": first.edges,
                   "sgd/final_histogram": first.runs[0].rows[-1].histogram,
                   "dp/final_histogram": first.runs[1].rows[-1].histogram,
                   "sgd/final_grad_norms": first.runs[0].rows[-1].grad_norms,
                   "dp/final_grad_norms": first.runs[1].rows[-1].grad_norms}
        return numbers, verdict

    return judge_with_sensitivity(ctx, sel, evaluate)


def draw(d):
    from landscape.plots import style

    n = d.numbers
    epochs = np.asarray(n["epoch"])
    fig, axes = style.subplots(2, 2, figsize=(9.0, 6.4), layout="constrained")
    axes = axes.ravel()
    colors = {"sgd": style.method_color("sgd"), "dp": style.method_color("dpsgd")}
    norms_all = np.concatenate([np.ravel(n["sgd/final_grad_norms"]), np.ravel(n["dp/final_grad_norms"])])
    positive = norms_all[norms_all > 0]
    lo, hi = (positive.min(), positive.max()) if positive.size else (1e-3, 1.0)
    log_bins = np.geomspace(lo * 0.9, hi * 1.1, 31)  # both series visible whatever their scales
    centers = (np.asarray(n["edges"])[:-1] + np.asarray(n["edges"])[1:]) / 2
    for m in ("sgd", "dp"):
        label = "SGD" if m == "sgd" else "DP-SGD"
        ls = style.method_style("sgd" if m == "sgd" else "dpsgd")
        for ax, key in ((axes[0], f"{m}/grad_curve"), (axes[1], f"{m}/dist_origin")):
            data = np.atleast_2d(n[key])
            ax.plot(epochs, data.mean(axis=0), color=colors[m], lw=1.8, ls=ls, label=f"{label} (mean)")
            ax.fill_between(epochs, data.min(axis=0), data.max(axis=0), color=colors[m], alpha=0.2, lw=0,
                            label=f"{label}: min-max over seeds")
        g, zero = _draw.positive(n[f"{m}/final_grad_norms"])
        axes[2].hist(np.log10(g[~zero]), bins=np.log10(log_bins), color=colors[m], histtype="step", lw=1.5, ls=ls,
                     label=label + (f" ({int(zero.sum())} exactly 0, not drawn)" if zero.any() else ""))
        h, empty = _draw.positive(n[f"{m}/final_histogram"])
        axes[3].plot(centers, h, color=colors[m], lw=1.2, ls=ls, label=label + (" (empty bins not drawn)"
                                                                                if empty.any() else ""))
    axes[0].set(xlabel="epoch", ylabel="mean per-sample gradient norm", title="Fig. 16a")
    axes[1].set(xlabel="epoch", ylabel="distance from origin", title=f"Fig. 17: {d.verdict.parts[0].status}"
                if d.verdict.parts else "Fig. 17")
    axes[2].set(xlabel="log10 per-sample gradient norm (final)", ylabel="count", title="Fig. 16c (seed 0)")
    axes[3].set(xlabel="parameter value (final)", ylabel="count", yscale="log", title="Fig. 17 (seed 0)")
    for ax in axes:
        ax.legend(fontsize=7)
    return _draw.finish(fig, d, f"Figs. 16-17 ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="watson-fig16-17", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Figs. 16-17",
    claim="DP-SGD models end significantly further from the origin (e.g. 1.7x; more than the 1.2x the paper calls "
          "closely replicating SGD) with larger per-sample gradients than SGD models",
    scaled_down="LeNet on digits, 10 epochs, SGD vs DP-SGD at epsilon 1 with one matched lr (selected on a "
                "validation split from {0.01, 0.03, 0.1}), batch 64, momentum 0.9, 5 seeds, 256 examples' gradient "
                "norms",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=30,
                           hyper="epsilon 1, C = 1, batches of 128 for both; the matched lr grid assumed", gpu_hours=8.0),
    make=make,
    draw=draw,
)
