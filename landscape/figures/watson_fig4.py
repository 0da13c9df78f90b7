"""Watson et al. (2023), Fig. 4 (Sec. 4.1.2): the loss along random directions from a Phase-2 SGD solution
against the loss along the straight path to its sibling (same Phase-1 checkpoint, another data order).

Claim: the loss stays low toward the sibling but rises fast along random directions of the same length, so
the sibling lies in a special (low-loss) direction. The paper draws 100 random vectors in the ambient
space; this recipe draws them both raw (isotropic Gaussian, ``normalize="none"``) and filter-normalised (Li et
al. 2018), and reports the largest |cos| between a random direction and the path (near 0: the random
directions are not accidentally toward the sibling). The paper compares the loss *along* the paths (Fig. 4:
"the linear mode interpolation profile ... shows an almost flat line"; "in random directions, loss increases
rapidly"), so the measure is the mean rise of the loss along each path above its start,
``mean_{t > 0} L(t) - L(0)`` (:func:`landscape.api.demo_job.path_rise`), not the far end's loss alone (which
would only say whether the sibling is worse). Verdict per normalisation: the rise along the path toward the
sibling is below the 0.1 quantile of the rises along the random directions at the same distances
(:func:`landscape.verdict.far_below`), held only if it holds for both (:func:`landscape.verdict.all_of`); a
sibling that fails the validity gate makes the verdict inconclusive.

Scaled down: LeNet on ``digits`` instead of Resnet18/LeNet on CIFAR10; 8 epochs, k = 5 (the paper's k); the
training split.
"""

from __future__ import annotations

import numpy as np

from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import all_of, far_below

SOURCE = "Watson et al. 2023, Fig. 4, Sec. 4.1.2"
NORMALIZATIONS = ("none", "filter")
_COMMON = dict(model="lenet", data="digits", lr=0.03, batch_size=32, seed=0)
SCALES = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "k": 1, "n": 8, "points": 5},
    "cpu": {**_COMMON, "subset": None, "epochs": 8, "k": 5, "n": 100, "points": 20},
    "paper": {**_COMMON, "model": "resnet18", "data": "cifar10", "subset": None, "lr": 0.1, "batch_size": 128,
              "epochs": 20, "k": 5, "n": 100, "points": 30},
}


def make(ctx):
    from landscape.api import PhasesConfig, TrainConfig, directions, phases
    from landscape.api.demo_job import path_rise
    from landscape.plots import style

    s = ctx.settings
    group = f"{ctx.name}-{ctx.scale}"
    base = TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"], lr=s["lr"],
                       batch_size=s["batch_size"], seed=s["seed"], checkpoint_every="none", data_root=ctx.data_root)
    phases(PhasesConfig(base=base, k=s["k"], copies=2, phase1=("sgd",), phase2=("sgd",), group=group),
           root=ctx.root)
    a, b = f"{group}-sgd-sgd-0@last", f"{group}-sgd-sgd-1@last"
    numbers, parts = {}, []
    fig, axes = style.subplots(1, len(NORMALIZATIONS), figsize=(8, 3.2), sharey=True, layout="constrained")
    for norm, ax in zip(NORMALIZATIONS, axes, strict=True):
        p = directions(a, toward=b, root=ctx.root, output=ctx.stem(f"directions-{norm}").with_suffix(".h5"),
                       directions=s["n"], points=s["points"], distance="auto", normalize=norm, seed=s["seed"],
                       workers=ctx.workers, data_root=ctx.data_root)
        toward, rises = float(path_rise(p.toward_loss)[0]), path_rise(p.direction_loss)
        numbers.update({f"{norm}/random_rises": rises, f"{norm}/toward_rise": toward,
                        f"{norm}/toward_loss": p.toward_loss, f"{norm}/direction_loss": p.direction_loss,
                        f"{norm}/max_abs_cos": p.max_abs_cos, f"{norm}/distance": p.distance})
        parts.append(ctx.judged(far_below(
            f"the loss rises less along the path toward the sibling than along {norm}-normalised random directions",
            SOURCE, toward, rises, names=("rise toward sibling", "random rises"),
            note=f"rise = mean loss along the path above its start; max |cos(random, path)| = {p.max_abs_cos:.3g}"),
            [a, b]))
        t = np.asarray(p.t) * p.distance
        for i, row in enumerate(p.direction_loss):
            ax.plot(t, row, color="0.6", lw=0.6, alpha=0.6, label="random directions" if i == 0 else None)
        ax.plot(t, p.toward_loss, color=style.method_color("sgd"), lw=2, marker="o", label="toward sibling")
        ax.set(xlabel="distance from solution", title=f"{norm} directions (max |cos| {p.max_abs_cos:.2g})")
    numbers["t"] = np.asarray(p.t)
    axes[0].set_ylabel("train loss")
    axes[0].legend(fontsize=7)
    style.panel_labels(axes)
    verdict = all_of("the loss rises far less along the path toward a sibling than along random directions of the "
                     "same length (raw and filter-normalised)", SOURCE, parts, note=" | ".join(x.line() for x in parts))
    fig.suptitle(f"Fig. 4 ({ctx.scale}): {verdict.status}")
    return numbers, verdict, style.save_figure(fig, ctx.stem("figure"))


RECIPE = Recipe(
    name="watson-fig4", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 4",
    claim="the interpolation profile toward a sibling SGD solution is almost flat, while the loss rises rapidly along "
          "random directions of the same length",
    scaled_down="LeNet on digits, 8 epochs, k = 5, 100 raw and 100 filter-normalised directions",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=20,
                           hyper="100 ambient random directions, 30 points; lr 0.1 / batch 128 assumed",
                           gpu_hours=10.0),
    make=make,
)
