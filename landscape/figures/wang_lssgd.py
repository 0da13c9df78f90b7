"""Wang (DP-LSSGD; Wang, Gu, Boedihardjo, Barekat & Osher 2019), slides "DP-LSSGD improves utility of logistic
regression over DP-SGD (MNIST)": multiplying the noisy gradient by (I - S L)^-1 (Laplacian smoothing, a
post-processing that costs no privacy) raises accuracy at the same (epsilon, delta) for every epsilon of the
sweep (their table: S = 1 and S = 2 above S = 0 at epsilon 0.25 ... 0.10).

The design notes: docs/figures.md, "What each recipe measures" (wang-lssgd).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from landscape.figures import _draw
from landscape.figures.recipe import PaperScale, Recipe, eps_text, final
from landscape.verdict import all_of, paired_greater

SOURCE = "Wang et al. 2019 (DP-LSSGD), Wang slides Sec. III"
MIN_EFFECT = 0.01  # accuracy (1 point): below the slides' smallest gain (1.8 points)
_COMMON = dict(model="mlp", model_kwargs={"widths": []}, data="digits", lr=1.0, batch_size=64, weight_decay=1e-4,
               epsilons=(0.5, 1.0, 2.0), smooth=(0.0, 1.0, 2.0))
SCALES = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "seeds": 2, "epsilons": (1.0,)},
    "cpu": {**_COMMON, "subset": None, "epochs": 10, "seeds": 5},
    "paper": {**_COMMON, "data": "mnist", "subset": None, "epochs": 30, "seeds": 5, "batch_size": 256,
              "epsilons": (0.1, 0.15, 0.2, 0.25)},
}


def make(ctx):
    from landscape.api import TrainConfig

    s = ctx.settings
    base = TrainConfig(model=s["model"], model_kwargs=dict(s["model_kwargs"]), data=s["data"], subset=s["subset"],
                       epochs=s["epochs"], lr=s["lr"], momentum=0.0, weight_decay=s["weight_decay"],
                       batch_size=s["batch_size"], optimizer="dpsgd", max_grad_norm=1.0, checkpoint_every="1e")
    runs = {(e, S): [ctx.train(f"e{e:g}-S{S:g}-{seed}", dataclasses.replace(base, target_epsilon=e, smooth=S,
                                                                             seed=seed)) for seed in range(s["seeds"])]
            for e in s["epsilons"] for S in s["smooth"]}
    acc = {key: [final(r, "test_acc") for r in rs] for key, rs in runs.items()}
    parts = [ctx.judged(paired_greater(f"at epsilon {e:g}, smoothing S = {S:g} beats DP-SGD", SOURCE, acc[(e, S)],
                                       acc[(e, 0.0)], names=(f"S={S:g}", "S=0"), unit="seeds", min_effect=MIN_EFFECT),
                        [ctx.run_name(f"e{e:g}-S{v:g}-{seed}") for v in (0.0, S) for seed in range(s["seeds"])])
             for e in s["epsilons"] for S in s["smooth"] if S > 0]
    verdict = all_of("Laplacian smoothing raises DP-SGD's accuracy at equal epsilon, for every epsilon", SOURCE, parts)
    ctx.scope(f"epsilon {', '.join(f'{e:g}' for e in s['epsilons'])} (the slides: 0.1-0.25, outside this range), "
              f"lr {s['lr']:g} constant (the slides: 1/t), batch {s['batch_size']}, {s['epochs']} epochs",
              eps_text([r for rs in runs.values() for r in rs]))
    numbers = {"epsilon": list(s["epsilons"]), "smooth": list(s["smooth"]),
               "test_acc": [[acc[(e, S)] for S in s["smooth"]] for e in s["epsilons"]], "min_effect": MIN_EFFECT}
    return numbers, verdict


def draw(d):
    from landscape.plots import style

    n = d.numbers
    eps, smooth = np.atleast_1d(n["epsilon"]), np.atleast_1d(n["smooth"])
    acc = np.asarray(n["test_acc"]).reshape(len(eps), len(smooth), -1)
    fig, axes = style.subplots(1, 2, figsize=(9.5, 3.6), layout="constrained")
    ax = axes[0]
    looks = style.series_styles(len(smooth))
    for j, S in enumerate(smooth):
        a = acc[:, j]
        ax.errorbar(_draw.dodge(eps, j, len(smooth), width=0.25, log=True), a.mean(axis=1),
                    yerr=a.std(axis=1, ddof=1) if a.shape[1] > 1 else None, capsize=3, **looks[j],
                    label="DP-SGD" if S == 0 else f"DP-LSSGD S = {S:g}")
    ax.set(xscale="log", xlabel="epsilon (delta 1e-5; series offset sideways)", ylabel="test accuracy",
           title="accuracy")
    ax.legend(fontsize=7, title="mean, bars: sd over seeds", title_fontsize=7)
    ax = axes[1]  # what was judged: per seed the gain of S over S = 0
    for j, S in enumerate(smooth[1:], start=1):
        gain = acc[:, j] - acc[:, 0]
        for i in range(len(eps)):
            ax.plot(np.full(gain.shape[1], i) + (j - 1.5) * 0.3 + np.linspace(-0.08, 0.08, gain.shape[1]), gain[i],
                    ls="none", marker=looks[j]["marker"], color=looks[j]["color"],
                    label=f"S = {S:g}, one seed" if i == 0 else None)
    ax.axhline(float(n["min_effect"]), color="tab:red", ls="--", lw=0.8, label="minimum effect (1 point)")
    ax.set_xticks(range(len(eps)), [f"eps {e:g}" for e in eps])
    ax.set(ylabel="accuracy gain over S = 0", title="judged: paired gain")
    ax.legend(fontsize=7)
    return _draw.finish(fig, d, f"DP-LSSGD ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="wang-lssgd", paper="Wang et al. 2019 (DP-LSSGD), Wang's slides", figure="DP-LSSGD table (MNIST)",
    claim="Laplacian smoothing (S = 1, 2) raises DP-SGD's accuracy at equal epsilon",
    scaled_down="logistic regression on digits, epsilon in {0.5, 1, 2}, S in {0, 1, 2}, 10 epochs, 5 seeds",
    scales=SCALES,
    paper_scale=PaperScale(data="mnist", model="logistic regression", epochs=30,
                           hyper="epsilon 0.1-0.25, delta 1e-5, S in {0, 1, 2}, weight decay 1e-4", gpu_hours=0.5),
    make=make,
    draw=draw,
    needs=5,
)
