"""Watson et al. (2023), Fig. 13 (Sec. 4.2): magnitude pruning raises DP-SGD's test accuracy (epsilon = 1), with
the mask found non-privately on the full training set (a), on a 5% subset (b), or on another data set (c).

The design notes: docs/figures.md, "What each recipe measures" (watson-fig13).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from landscape.figures import _draw
from landscape.figures._selection import judge_with_sensitivity, per_arm
from landscape.figures.recipe import PaperScale, Recipe, checkpoint_curve, eps_text
from landscape.verdict import all_of, paired_greater

SOURCE = "Watson et al. 2023, Fig. 13, Sec. 4.2"
MIN_EFFECT = 0.01  # accuracy (1 point); the paper's gain is about 23 points
_COMMON = dict(model="lenet", data="digits", sgd_lr=0.03, sgd_batch=32, dp_lrs=(0.1, 0.3, 1.0), dp_batch=64, epsilon=1.0,
               max_grad_norm=1.0, remove=0.7, subset_fraction=0.05)
SCALES = {
    "test": {**_COMMON, "subset": 300, "sgd_epochs": 2, "dp_epochs": 2, "seeds": 2, "subset_fraction": 0.2,
             "dp_lrs": (0.3, 1.0)},
    # 5% of digits is 67 examples: its SGD model ends at 33% test accuracy, no usable mask source (the paper's 5% of
    # CIFAR10 is 2,500 examples), so the cpu scale takes a 20% subset (270 examples)
    "cpu": {**_COMMON, "subset": None, "sgd_epochs": 10, "dp_epochs": 10, "seeds": 5, "subset_fraction": 0.2},
    "paper": {**_COMMON, "model": "resnet18", "data": "cifar10", "subset": None, "sgd_lr": 0.1, "sgd_batch": 128,
              "dp_lrs": (0.5, 1.0, 2.0), "dp_batch": 1024, "sgd_epochs": 30, "dp_epochs": 30, "seeds": 3},
}
MASKS = ("full", "subset")
LABEL = {"none": "no pruning", "full": "mask from full data", "subset": "mask from a subset"}


def _mask(ctx, source: str, init: str, what: str, remove: float) -> str:
    """The pruned run ``what`` (made once; a rerun reuses it)."""
    from landscape.api import PruneConfig, prune
    from landscape.store import Store

    name = ctx.run_name(what)
    if name not in Store(ctx.root).run_names():
        prune(PruneConfig(ref=source, remove=remove, init=init, run=name), root=ctx.root)
    return name


def make(ctx):
    from landscape.api import TrainConfig

    s = ctx.settings
    sgd = TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["sgd_epochs"], lr=s["sgd_lr"],
                      batch_size=s["sgd_batch"], seed=0, checkpoint_every="1e")
    full = ctx.train("sgd-full", sgd)
    sub_size = s["subset_fraction"] if s["subset"] is None else int(s["subset"] * s["subset_fraction"])
    # the same number of SGD steps as the full-data run (an earlier 2x epochs left the 5% model at 27% accuracy)
    sub_epochs = round(s["sgd_epochs"] / s["subset_fraction"])
    part = ctx.train(f"sgd-subset-e{sub_epochs}", dataclasses.replace(sgd, subset=sub_size, epochs=sub_epochs))
    init = f"{full.name}@init"
    starts = {"none": init,
              "full": f"{_mask(ctx, f'{full.name}@last', init, 'mask-full', s['remove'])}@init",
              "subset": f"{_mask(ctx, f'{part.name}@last', init, f'mask-subset-e{sub_epochs}', s['remove'])}@init"}
    dp = TrainConfig(epochs=s["dp_epochs"], lr=s["dp_lrs"][0], momentum=0.0, batch_size=s["dp_batch"], optimizer="dpsgd",
                     max_grad_norm=s["max_grad_norm"], target_epsilon=s["epsilon"], checkpoint_every="1e",
                     data=s["data"], subset=s["subset"])  # explicit: the subset mask's run trained on the subset
    tag = {"none": "none", "full": "full", "subset": f"subset-e{sub_epochs}"}  # names follow the mask's source
    sel = per_arm(ctx, [float(v) for v in s["dp_lrs"]],
                  {k: (lambda lr, st=st: dataclasses.replace(dp, lr=lr, from_ref=st, seed=0)) for k, st in starts.items()},
                  name=lambda lr: f"lr{lr:g}")
    source_of = {"full": full, "subset": part}  # each part rests on its mask's source model and both DP arms

    def evaluate(setting):
        runs = {k: [ctx.train(f"dp-{tag[k]}-lr{sel.value(setting[k]):g}-{seed}", dataclasses.replace(
            dp, lr=sel.value(setting[k]), from_ref=start, seed=seed)) for seed in range(s["seeds"])]
            for k, start in starts.items()}
        curves = {k: [checkpoint_curve(r, "test_acc") for r in rs] for k, rs in runs.items()}
        final = {k: [float(c[1][-1]) for c in cs] for k, cs in curves.items()}
        parts = [ctx.judged(paired_greater(
            f"DP-SGD (eps {s['epsilon']:g}) with the {LABEL[m]} ends more accurate than unpruned", SOURCE, final[m],
            final["none"], names=(LABEL[m], "unpruned"), unit="seeds", min_effect=MIN_EFFECT),
            [source_of[m], *runs[m], *runs["none"]]) for m in MASKS]
        verdict = all_of(f"pruning {s['remove']:g} of the weights raises DP-SGD's test accuracy (mask from full data and "
                         f"from a {s['subset_fraction']:.0%} subset)", SOURCE, parts)
        if ctx.role:
            return {}, verdict
        ctx.scope(f"DP lr {sel.value(setting['none']):g}, batch {s['dp_batch']}, no momentum, {s['dp_epochs']} "
                  f"epochs", eps_text(runs["none"] + runs["full"] + runs["subset"]),
                  f"subset mask from {s['subset_fraction']:.0%} of the training split (the paper: 5%)")
        numbers = {"epoch": curves["none"][0][0], **{f"{k}/test_acc": [c[1] for c in cs] for k, cs in curves.items()},
                   **{f"{k}/final": final[k] for k in curves}, "min_effect": MIN_EFFECT}
        return numbers, verdict

    return judge_with_sensitivity(ctx, sel, evaluate)


COLORS = {"none": "#D55E00", "full": "#0072B2", "subset": "#595959"}


def draw(d):
    from landscape.plots import style

    n = d.numbers
    fig, axes = style.subplots(1, 2, figsize=(9.5, 3.6), layout="constrained", gridspec_kw={"width_ratios": [1.3, 1]})
    ax = axes[0]
    epochs = np.asarray(n["epoch"])
    for i, k in enumerate(("none", "full", "subset")):
        a = np.atleast_2d(n[f"{k}/test_acc"])
        ax.plot(epochs, a.mean(axis=0), color=COLORS[k], lw=1.8, ls=style.LINESTYLES[i], label=f"{LABEL[k]} (mean)")
        ax.fill_between(epochs, a.min(axis=0), a.max(axis=0), color=COLORS[k], alpha=0.2, lw=0,
                        label=f"{LABEL[k]}: min-max over seeds")
    ax.set(xlabel="DP-SGD epoch", ylabel="test accuracy", title="test accuracy along training")
    ax.legend(fontsize=6)
    ax = axes[1]  # what was judged: per seed, the pruned minus the unpruned final accuracy
    for j, m in enumerate(MASKS):
        gain = np.atleast_1d(n[f"{m}/final"]) - np.atleast_1d(n["none/final"])
        ax.plot(np.full(gain.size, j) + np.linspace(-0.15, 0.15, gain.size), gain, ls="none", marker="o",
                color=COLORS[m], label="one seed" if j == 0 else None)
        ax.plot([j - 0.25, j + 0.25], [gain.mean()] * 2, color="k", lw=1.5, label="mean" if j == 0 else None)
    ax.axhline(float(n["min_effect"]), color="tab:red", ls="--", lw=0.8, label="minimum effect (1 point)")
    ax.set_xticks(range(len(MASKS)), [LABEL[m] for m in MASKS], fontsize=8)
    ax.set_xlim(-0.6, len(MASKS) - 0.4)
    ax.set(ylabel="final accuracy gain over unpruned", title="judged: paired gain")
    ax.legend(fontsize=7)
    return _draw.finish(fig, d, f"Fig. 13 ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="watson-fig13", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 13",
    claim="magnitude pruning (mask from full data, or from a small subset: 5% of CIFAR10 in the paper, 20% of digits "
          "here) raises DP-SGD test accuracy at epsilon 1",
    scaled_down="LeNet on digits, remove 0.7, DP-SGD 10 epochs at epsilon 1 (lr selected on a validation split from "
                "{0.1, 0.3, 1}), 5 "
                "seeds; subset mask from 20% of digits (5% is 67 examples); mask from another data set not run",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=30,
                           hyper="epsilon 1, remove 0.7; CIFAR100 mask refused (output layer); lr / batch assumed",
                           gpu_hours=20.0),
    make=make,
    draw=draw,
)
