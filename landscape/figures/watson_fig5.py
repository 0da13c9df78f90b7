"""Watson et al. (2023), Fig. 5: linear-interpolation instability of Phase-2 siblings against the SGD Phase-1
length k, Phase-2 SGD vs Phase-2 DP-SGD at several privacy levels.

Claim: DP-SGD siblings (same Phase-1 checkpoint, different data order and noise) are less linearly connected
than SGD siblings at every k: their instability (Def. 2.3: the loss barrier on the straight path between the
two solutions) is larger. Verdict: per (k, epsilon) DP > SGD by more than the summed sample sd over sibling
pairs (:func:`landscape.verdict.greater`), and held only if it holds at every point
(:func:`landscape.verdict.all_of`).

Scaled down: LeNet on ``digits`` (8x8) instead of Resnet18 on CIFAR10; a few epochs instead of the paper's
schedule; k in epochs of the short run; ``copies`` Phase-2 copies give ``copies*(copies-1)/2`` sibling pairs
per point (>= 3 at cpu scale).
"""

from __future__ import annotations

import math

import numpy as np

from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import all_of, greater

SOURCE = "Watson et al. 2023, Fig. 5"
_COMMON = dict(model="lenet", data="digits", lr=0.03, dp_lr=0.5, batch_size=32, max_grad_norm=1.0, seed=0)
SCALES = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "ks": (1,), "copies": 3, "epsilons": (8.0,), "points": 5},
    "cpu": {**_COMMON, "subset": None, "epochs": 8, "ks": (1, 2, 4), "copies": 3, "epsilons": (1.0, 4.0, 8.0),
            "points": 20},
    # Sec. 4.1: Resnet18 (GroupNorm for DP) on CIFAR10, C = 1, 30 alphas; lr and batch size are not stated in
    # the main text (assumed here), k up to the run length.
    "paper": {**_COMMON, "model": "resnet18", "data": "cifar10", "subset": None, "lr": 0.1, "batch_size": 128,
              "epochs": 20, "ks": (1, 3, 5, 10, 15), "copies": 3, "epsilons": (1.0, 2.0, 7.0), "points": 30},
}


def _groups(ctx) -> list[tuple[float, int, str, tuple[str, ...]]]:
    """(epsilon, k, group name, Phase-2 families): SGD siblings are trained once per k (with the first epsilon's
    group), DP siblings once per (k, epsilon)."""
    s = ctx.settings
    out = []
    for i, eps in enumerate(s["epsilons"]):
        for k in s["ks"]:
            out.append((float(eps), int(k), f"{ctx.name}-{ctx.scale}-e{eps:g}-k{k}",
                        ("sgd", "dpsgd") if i == 0 else ("dpsgd",)))
    return out


def make(ctx):
    from landscape.api import InterpolateConfig, PhasesConfig, TrainConfig, instability, phases
    from landscape.plots import style

    s = ctx.settings
    sgd, dp = {}, {}   # k -> [instabilities]; (eps, k) -> [instabilities]
    for eps, k, group, phase2 in _groups(ctx):
        base = TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"], lr=s["lr"],
                           batch_size=s["batch_size"], seed=s["seed"], max_grad_norm=s["max_grad_norm"],
                           target_epsilon=eps, checkpoint_every="none", data_root=ctx.data_root)
        phases(PhasesConfig(base=base, k=k, copies=s["copies"], phase1=("sgd",), phase2=phase2,
                            dp_lr=s["dp_lr"], dp_momentum=0.0, group=group), root=ctx.root, progress=False)
        table = instability([f"{group}-*"], pairs="siblings", root=ctx.root, workers=ctx.workers,
                            config=InterpolateConfig(points=s["points"], splits=("test",)),
                            output=ctx.stem(f"instability-e{eps:g}-k{k}").with_suffix(".h5"),
                            data_root=ctx.data_root)
        for r in table.rows:
            value = float(r.instability_loss["test"])
            if r.phase2 == "sgd":
                sgd.setdefault(k, []).append(value)
            elif r.phase2 == "dpsgd":
                dp.setdefault((eps, k), []).append(value)
    ks = sorted(sgd)
    eps_list = sorted({e for e, _ in dp})
    parts = [greater(f"DP-SGD (eps {e:g}) siblings are less stable than SGD siblings at k = {k}", SOURCE,
                     dp.get((e, k), []), sgd.get(k, []), names=(f"DP eps {e:g}", "SGD"), unit="sibling pairs")
             for e in eps_list for k in ks]
    verdict = all_of("DP-SGD siblings are less stable than SGD siblings at every k and epsilon", SOURCE, parts,
                     note="Instability = test loss barrier (Def. 2.3). " + " | ".join(p.line() for p in parts))
    n = s["copies"] * (s["copies"] - 1) // 2

    def table_of(values):
        a = np.full(n, math.nan)
        a[:len(values)] = values[:n]
        return a

    numbers = {"k": ks, "epsilon": eps_list, "sgd": [table_of(sgd[k]) for k in ks],
               "dp": [[table_of(dp.get((e, k), [])) for k in ks] for e in eps_list]}
    fig, ax = style.subplots(figsize=(4.5, 3.2))
    mean_sd = lambda rows: (np.nanmean(rows, axis=1), np.nanstd(rows, axis=1, ddof=1) if n > 1 else 0 * rows[:, 0])  # noqa: E731
    m, sd = mean_sd(np.asarray(numbers["sgd"]))
    ax.errorbar(ks, m, yerr=sd, marker="o", capsize=3, color=style.method_color("sgd"), label="SGD")
    for e, rows, color in zip(eps_list, numbers["dp"], style.dp_shades(len(eps_list)), strict=True):
        m, sd = mean_sd(np.asarray(rows))
        ax.errorbar(ks, m, yerr=sd, marker="s", capsize=3, color=color, label=f"DP-SGD eps {e:g}")
    ax.set(xlabel="Phase-1 SGD epochs k", ylabel="instability (test loss barrier)",
           title=f"Fig. 5 ({ctx.scale}): {verdict.status}")
    ax.legend(fontsize=7)
    figures = style.save_figure(fig, ctx.stem("figure"))
    return numbers, verdict, figures


RECIPE = Recipe(
    name="watson-fig5", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 5",
    claim="DP-SGD siblings are less linearly connected (higher instability) than SGD siblings at every k",
    scaled_down="LeNet on digits, 8 epochs, k in {1,2,4}, 3 copies (3 sibling pairs) per point",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=20,
                           hyper="C=1, eps in {1,2,7}, delta 1e-5, 30 alphas; lr 0.1 / batch 128 assumed",
                           gpu_hours=60.0),
    make=make,
)
