"""Watson et al. (2023), Fig. 4 (Sec. 4.1.2): the loss along random directions from a Phase-2 SGD solution
against the loss along the straight path to its sibling (same Phase-1 checkpoint, another data order).

The design notes: docs/figures.md, "What each recipe measures" (watson-fig4).
"""

from __future__ import annotations

import math

import numpy as np

from landscape.figures import _draw
from landscape.figures import _phase_grid as grid
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import Verdict, all_of, far_below, most_above

SOURCE = "Watson et al. 2023, Fig. 4, Sec. 4.1.2"
NORMALIZATIONS = ("none", "filter")
_COMMON = dict(model="lenet", data="digits", lr=0.03, batch_size=32, seed=0)
SCALES = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "k": 1, "n": 8, "points": 5},
    "cpu": {**_COMMON, "subset": None, "epochs": 8, "k": 5, "n": 100, "points": 20},
    "paper": {**_COMMON, "model": "resnet18", "data": "cifar10", "subset": None, "lr": 0.1, "batch_size": 128,
              "epochs": 20, "k": 5, "n": 100, "points": 30},
}


def flat(path, scale: float) -> Verdict:
    """Threshold rule for one path: held if its range (max - min) is below ``scale``, did not hold otherwise."""
    v = np.asarray(path, dtype=float)
    spread = float(v.max() - v.min())
    return Verdict("the loss along the path toward the sibling is almost flat", SOURCE,
                   f"threshold rule on one path: held if the range of the loss along it (max - min) is below the stated "
                   f"scale {scale:.3g} (2% of ln C), did not hold if not",
                   {"range along the path": spread, "scale": scale, "start": float(v[0]), "end": float(v[-1])},
                   spread < scale if math.isfinite(spread) else None)


def make(ctx):
    from landscape.api import PhasesConfig, TrainConfig, directions, phases
    from landscape.api.demo_job import path_rise

    s = ctx.settings
    group = f"{ctx.name}-{ctx.scale}"
    base = TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"], lr=s["lr"],
                       batch_size=s["batch_size"], seed=s["seed"], checkpoint_every="1e", data_root=ctx.data_root)
    phases(PhasesConfig(base=base, k=s["k"], copies=2, phase1=("sgd",), phase2=("sgd",), group=group),
           root=ctx.root)
    a, b = f"{group}-sgd-sgd-0@last", f"{group}-sgd-sgd-1@last"
    scale = grid.min_height()
    numbers, parts = {"scale": scale}, []
    for norm in NORMALIZATIONS:
        p = directions(a, toward=b, root=ctx.root, output=ctx.stem(f"directions-{norm}").with_suffix(".h5"),
                       directions=s["n"], points=s["points"], distance="auto", normalize=norm, seed=s["seed"],
                       workers=ctx.workers, data_root=ctx.data_root, figure=False)
        if not parts:
            parts.append(ctx.judged(flat(p.toward_loss, scale), [a, b]))
        end_rise = np.asarray(p.direction_loss)[:, -1] - np.asarray(p.direction_loss)[:, 0]
        toward, rises = float(path_rise(p.toward_loss)[0]), path_rise(p.direction_loss)
        numbers.update({f"{norm}/random_rises": rises, f"{norm}/random_end_rise": end_rise,
                        f"{norm}/toward_rise": toward, f"{norm}/toward_loss": p.toward_loss,
                        f"{norm}/direction_loss": p.direction_loss, f"{norm}/max_abs_cos": p.max_abs_cos,
                        f"{norm}/distance": p.distance})
        parts.append(ctx.judged(most_above(
            f"the loss rises along most {norm}-normalised random directions of the sibling's length", SOURCE,
            end_rise, scale, name="end rise", unit="directions",
            note=f"max |cos(random, path)| = {p.max_abs_cos:.3g}"), [a, b]))
        parts.append(ctx.judged(far_below(
            f"the loss rises less along the path toward the sibling than along {norm}-normalised random directions",
            SOURCE, toward, rises, names=("rise toward sibling", "random rises"),
            note="rise = mean loss along the path above its start"), [a, b]))
        numbers["t"] = np.asarray(p.t)
    verdict = all_of("the loss stays almost flat along the path toward a sibling and rises along random directions of "
                     "the same length (raw and filter-normalised)", SOURCE, parts)
    ctx.scope(f"SGD lr {s['lr']:g}, k = {s['k']} of {s['epochs']} epochs, sibling distance "
              f"{float(numbers['none/distance']):.3g} (the paper: 15)")
    return numbers, verdict


def draw(d):
    from landscape.plots import style

    n = d.numbers
    scale = float(n["scale"])
    fig, axes = style.subplots(1, len(NORMALIZATIONS) + 1, figsize=(12, 3.6), layout="constrained",
                               gridspec_kw={"width_ratios": [1, 1, 0.8]})
    for norm, ax in zip(NORMALIZATIONS, axes, strict=False):
        t = np.asarray(n["t"]) * float(n[f"{norm}/distance"])
        toward = np.asarray(n[f"{norm}/toward_loss"])
        rows = np.atleast_2d(n[f"{norm}/direction_loss"])
        hidden = bool(np.all(np.abs(rows - toward) < 0.01 * scale))
        for i, row in enumerate(rows):
            ax.plot(t, row, color="0.6", lw=0.6, alpha=0.6, label=("random directions" + (
                " (all under the path: within 1% of the scale)" if hidden else "")) if i == 0 else None)
        ax.plot(t, toward, color=style.method_color("sgd"), lw=2, marker="o", label="toward sibling")
        ax.fill_between(t, toward[0] - scale, toward[0] + scale, color="tab:red", alpha=0.12, lw=0,
                        label="start +- the flatness scale (2% of ln C)")
        ax.set(xlabel="distance from solution", ylabel="train loss",
               title=f"{norm} directions (max |cos| {float(n[f'{norm}/max_abs_cos']):.2g})")
        ax.legend(fontsize=7)
    ax = axes[-1]  # what was judged: the end rises along random directions against the scale
    for j, norm in enumerate(NORMALIZATIONS):
        v = np.asarray(n[f"{norm}/random_end_rise"])
        ax.plot(np.full(v.size, j) + np.linspace(-0.2, 0.2, v.size), v, ls="none", marker=".", color="0.4",
                label="one random direction" if j == 0 else None)
    ax.axhline(scale, color="tab:red", ls="--", lw=0.8, label="scale (2% of ln C)")
    ax.set_xticks(range(len(NORMALIZATIONS)), list(NORMALIZATIONS))
    ax.set_xlim(-0.6, len(NORMALIZATIONS) - 0.4)
    ax.set(ylabel="loss rise at the sibling's distance", title="judged: random rises")
    ax.legend(fontsize=7)
    return _draw.finish(fig, d, f"Fig. 4 ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="watson-fig4", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 4",
    claim="the interpolation profile toward a sibling SGD solution is almost flat, while the loss rises rapidly along "
          "random directions of the same length",
    scaled_down="LeNet on digits, 8 epochs, k = 5, 100 raw and 100 filter-normalised directions; flat and rising "
                "judged against 2% of ln C",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=20,
                           hyper="100 ambient random directions, 30 points; lr 0.1 / batch 128 assumed",
                           gpu_hours=10.0),
    make=make,
    draw=draw,
)
