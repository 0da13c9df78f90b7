"""Watson et al. (2023), Fig. 10 (Sec. 4.1.4): noise alone does not hurt, clipping does.

The design notes: docs/figures.md, "What each recipe measures" (watson-fig10).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from landscape.figures import _draw
from landscape.figures._selection import judge_with_sensitivity, per_arm
from landscape.figures.recipe import PaperScale, Recipe, checkpoint_curve
from landscape.verdict import all_of, greater, similar

SOURCE = "Watson et al. 2023, Fig. 10, Sec. 4.1.4"
METHODS = {"sgd": {"optimizer": "sgd"},
           "noise-only": {"optimizer": "noise-only", "noise_multiplier": 2.4},
           "clip-only": {"optimizer": "clip-only", "max_grad_norm": 1.0}}
_COMMON = dict(model="lenet", data="digits", lrs=(0.003, 0.01, 0.03), momentum=0.9, batch_size=32)
SCALES = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "seeds": 2, "tolerance": 0.01, "lrs": (0.01, 0.03)},
    "cpu": {**_COMMON, "subset": None, "epochs": 10, "seeds": 3, "tolerance": 0.01},
    "paper": {**_COMMON, "model": "resnet18", "data": "cifar10", "subset": None, "lrs": (0.03, 0.1, 0.3),
              "batch_size": 128,
              "epochs": 30, "seeds": 3, "tolerance": 0.01},
}


def make(ctx):
    from landscape.api import TrainConfig

    s = ctx.settings
    base = TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"],
                       momentum=s["momentum"], batch_size=s["batch_size"], checkpoint_every="1e")
    configs = {m: dataclasses.replace(base, **opts) for m, opts in METHODS.items()}
    sel = per_arm(ctx, [float(lr) for lr in s["lrs"]],
                  {m: (lambda lr, c=c: dataclasses.replace(c, lr=lr, seed=0)) for m, c in configs.items()})

    def evaluate(setting):
        curves = {m: [checkpoint_curve(ctx.train(f"{m}-lr{sel.value(setting[m]):g}-{seed}", dataclasses.replace(
            c, lr=sel.value(setting[m]), seed=seed)), "test_acc") for seed in range(s["seeds"])]
            for m, c in configs.items()}
        runs = {m: [ctx.run_name(f"{m}-lr{sel.value(setting[m]):g}-{seed}") for seed in range(s["seeds"])]
                for m in METHODS}
        final = {m: [float(c[1][-1]) for c in cs] for m, cs in curves.items()}
        minimum = s["tolerance"]  # one margin for "the same" and for "significantly" worse (module docstring)
        parts = [ctx.judged(greater("clip-only ends less accurate than SGD", SOURCE, final["sgd"], final["clip-only"],
                                    names=("SGD", "clip-only"), unit="seeds", min_effect=minimum),
                            runs["sgd"] + runs["clip-only"]),
                 ctx.judged(greater("clip-only ends less accurate than noise-only", SOURCE, final["noise-only"],
                                    final["clip-only"], names=("noise-only", "clip-only"), unit="seeds",
                                    min_effect=minimum), runs["noise-only"] + runs["clip-only"]),
                 ctx.judged(similar("noise-only ends at SGD's test accuracy", SOURCE, final["noise-only"],
                                    final["sgd"], tolerance=s["tolerance"], names=("noise-only", "SGD"),
                                    unit="seeds"), runs["noise-only"] + runs["sgd"])]
        verdict = all_of("clipping, not noise, costs accuracy: noise-only matches SGD, clip-only falls behind both",
                         SOURCE, parts)
        if ctx.role:
            return {}, verdict
        ctx.scope(f"one lr {sel.value(setting['sgd']):g} for all (the paper assumes 0.1), momentum {s['momentum']:g}, "
                  f"batch {s['batch_size']}, {s['epochs']} epochs")
        numbers = {"epoch": curves["sgd"][0][0], **{f"{m}/test_acc": [c[1] for c in cs] for m, cs in curves.items()},
                   **{f"{m}/final": final[m] for m in METHODS}, "min_effect": minimum, "margin": s["tolerance"]}
        return numbers, verdict

    return judge_with_sensitivity(ctx, sel, evaluate)


def draw(d):
    from landscape.plots import style

    n = d.numbers
    fig, axes = style.subplots(1, 3, figsize=(12, 3.9), layout="constrained",
                               gridspec_kw={"width_ratios": [1, 1, 0.8]})
    colors = {"sgd": style.method_color("sgd"), "noise-only": style.method_color("dpsgd"), "clip-only": "0.35"}
    epochs = np.asarray(n["epoch"])
    for ax, other in zip(axes[:2], ("noise-only", "clip-only"), strict=True):
        for m in ("sgd", other):
            a = np.atleast_2d(n[f"{m}/test_acc"])
            ax.plot(epochs, a.mean(axis=0), color=colors[m], lw=1.8, ls=style.method_style(m), label=f"{m} (mean)")
            ax.fill_between(epochs, a.min(axis=0), a.max(axis=0), color=colors[m], alpha=0.2, lw=0,
                            label=f"{m}: min-max over seeds")
        ax.set(xlabel="epoch", ylabel="test accuracy", title=f"{other} vs SGD")
        ax.legend(fontsize=7)
    ax = axes[2]  # what was judged: final accuracies per seed, with the margin around SGD's mean
    for j, m in enumerate(METHODS):
        v = np.atleast_1d(n[f"{m}/final"])
        ax.plot(np.full(v.size, j) + np.linspace(-0.15, 0.15, v.size), v, ls="none", marker="o", color=colors[m],
                label="one seed" if j == 0 else None)
    sgd = float(np.mean(n["sgd/final"]))
    ax.axhspan(sgd - float(n["margin"]), sgd + float(n["margin"]), color=colors["sgd"], alpha=0.15, lw=0,
               label="SGD mean +- the 1-point margin")
    ax.set_xticks(range(len(METHODS)), list(METHODS))
    ax.set(ylabel="final test accuracy", title="judged: final accuracy")
    ax.legend(fontsize=7)
    return _draw.finish(fig, d, f"Fig. 10 ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="watson-fig10", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 10",
    claim="noise-only SGD (sigma 2.4) reaches SGD's accuracy while clip-only SGD (C = 1) falls behind",
    scaled_down="LeNet on digits, 10 epochs, 3 seeds per method, same lr / batch / momentum for all, the lr selected "
                "from {0.003, 0.01, 0.03} on a validation split; 1 accuracy point is both the equivalence margin and "
                "the minimum effect",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=30,
                           hyper="sigma 2.4 (noise-only), C = 1 (clip-only); lr 0.1 / batch 128 assumed",
                           gpu_hours=9.0),
    make=make,
    draw=draw,
)
