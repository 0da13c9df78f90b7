"""Bu et al. (2023), Table 1 (Sec. 4): what per-sample clipping does to the NTK of the gradient flow.

The design notes: docs/figures.md, "What each recipe measures" (bu-table1).
"""

from __future__ import annotations

import numpy as np

from landscape.figures import _draw
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import Verdict, all_of

SOURCE = "Bu et al. 2023, Table 1, Sec. 4"
_COMMON = dict(model="lenet", data="digits", lr=0.03, batch_size=32, seed=0,
               norms=(0.01, 0.1, 1.0, 10.0, 1e4), styles=("flat", "layerwise"))
SCALES = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "every": "1e", "n": 16},
    "cpu": {**_COMMON, "subset": None, "epochs": 6, "every": "2e", "n": 64},
    "paper": {**_COMMON, "model": "opacus-cnn", "data": "mnist", "subset": None, "lr": 0.15, "batch_size": 256,
              "epochs": 30, "every": "5e", "n": 256},
}


def _every(claim: str, rows, test: str, check) -> Verdict:
    bad = [r for r in rows if not check(r)]
    numbers = {"kernels checked": len(rows), "failing": len(bad),
               "worst asymmetry": max((float(r.asymmetry) for r in rows), default=float("nan")),
               "smallest min_real_eig / norm": min((float(r.min_real_eig) / float(r.norm) for r in rows if r.norm > 0),
                                                   default=float("nan"))}
    return Verdict(claim, SOURCE, test, numbers, None if not rows else not bad)


def _seen(claim: str, rows, check) -> Verdict:
    hits = [r for r in rows if check(r)]
    return Verdict(claim, SOURCE, "observed if at least one kernel shows it (held), else inconclusive: the paper "
                   "says 'not guaranteed', so not seeing it contradicts nothing",
                   {"kernels": len(rows), "showing it": len(hits)}, True if hits else None)


def make(ctx):
    from landscape.api import TrainConfig, ntk_table

    s = ctx.settings
    run = ctx.train("sgd", TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"],
                                       lr=s["lr"], batch_size=s["batch_size"], seed=s["seed"],
                                       checkpoint_every=s["every"]), gated=False)  # the guarantees are algebraic:
    # they hold for any model, so this run is no end model a claim rests on (no validity gate)
    table = ntk_table(run.name, root=ctx.root, subset=s["n"], max_grad_norms=tuple(s["norms"]),
                      clip_styles=tuple(s["styles"]), precision="float64", workers=ctx.workers,
                      output=ctx.stem("ntk-table").with_suffix(".h5"), data_root=ctx.data_root, figure=False)
    rows = table.rows
    unclipped = [r for r in rows if r.style == "none" or r.fraction_clipped == 0]
    flat = [r for r in rows if r.style == "flat"]
    clipped_flat = [r for r in flat if r.fraction_clipped > 0]
    clipped_layer = [r for r in rows if r.style == "layerwise" and r.fraction_clipped > 0]
    guarantees = [
        _every("an unclipped kernel is symmetric and positive (quadratic form and eigenvalues)", unclipped,
               "held if every unclipped kernel (style none, or fraction clipped 0) is symmetric, positive in "
               "quadratic form and in eigenvalues (tolerances of landscape.analyze.ntk)",
               lambda r: r.symmetric and r.positive_quadratic and r.positive_eigenvalues),
        _every("a flat-clipped kernel H C is positive in eigenvalues", flat,
               "held if every flat-clipped kernel's eigenvalues are real and >= 0 (tolerance 1e-6 ||A||_F)",
               lambda r: r.positive_eigenvalues)]
    observations = [
        _seen("small-norm flat clipping breaks symmetry", clipped_flat, lambda r: not r.symmetric),
        _seen("small-norm flat clipping breaks positivity in quadratic form", clipped_flat,
              lambda r: not r.positive_quadratic),
        _seen("layerwise clipping breaks positivity in eigenvalues", clipped_layer,
              lambda r: not r.positive_eigenvalues)]
    verdict = all_of("implementation check of Table 1's guarantees: unclipped kernels symmetric and positive; "
                     "flat-clipped kernels positive in eigenvalues", SOURCE, guarantees,
                     note="Observations beside it (not guarantees): " + " | ".join(p.line() for p in observations))
    ctx.scope(f"{s['n']} examples, float64 kernels, SGD lr {s['lr']:g}, {s['epochs']} epochs")
    norms = list(s["norms"])
    numbers = {"max_grad_norm": norms, "epoch": sorted({float(r.epoch) for r in rows})}
    for style_name in s["styles"]:
        for col in ("asymmetry", "min_sym_eig", "min_real_eig", "fraction_clipped", "norm"):
            numbers[f"{style_name}/{col}"] = [[float(getattr(r, col)) for r in rows if r.style == style_name
                                              and r.epoch == e] for e in numbers["epoch"]]
    for i, obs in enumerate(observations):
        numbers[f"observation_{i}"] = [obs.numbers["kernels"], obs.numbers["showing it"]]
    return numbers, verdict


def draw(d):
    from landscape.plots import style

    n = d.numbers
    norms = np.asarray(n["max_grad_norm"])
    epochs = np.atleast_1d(n["epoch"])
    fig, axes = style.subplots(1, 3, figsize=(12, 4.2), layout="constrained")
    looks = style.series_styles(len(epochs))
    zeros = 0
    for j, e in enumerate(epochs):
        for style_name, ls in (("flat", "-"), ("layerwise", "--")):
            size = np.asarray(n[f"{style_name}/norm"][j])
            asym, dropped = _draw.positive(np.asarray(n[f"{style_name}/asymmetry"][j]))
            zeros += int(dropped.sum())
            x = _draw.dodge(norms, j, len(epochs), width=0.15, log=True)
            lab = f"{style_name}, epoch {e:g}"
            axes[0].plot(x, asym, ls=ls, marker=looks[j]["marker"], color=looks[j]["color"], label=lab)
            axes[1].plot(x, np.asarray(n[f"{style_name}/min_sym_eig"][j]) / size, ls=ls, marker=looks[j]["marker"],
                         color=looks[j]["color"])
            axes[2].plot(x, np.asarray(n[f"{style_name}/min_real_eig"][j]) / size, ls=ls,
                         marker=looks[j]["marker"], color=looks[j]["color"])
    axes[0].set(xscale="log", yscale="log", xlabel="clipping norm C (epochs offset sideways)",
                ylabel="||A - A^T|| / ||A||", title="symmetry" + (f" ({zeros} exactly symmetric: not drawn)"
                                                                  if zeros else ""))
    axes[1].set(xscale="log", xlabel="clipping norm C", ylabel="min eig((A+A^T)/2) / ||A||", title="quadratic form")
    axes[2].set(xscale="log", xlabel="clipping norm C", ylabel="min Re eig(A) / ||A||", title="eigenvalues")
    for ax in axes[1:]:
        ax.axhline(0, color="0.5", lw=0.8, label="0 (positivity boundary)")
    axes[1].legend(fontsize=7)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=4, fontsize=7)
    return _draw.finish(fig, d, f"Table 1 ({d.scale}), implementation check: {d.verdict.status}", axes)


RECIPE = Recipe(
    name="bu-table1", paper="Bu et al. 2023 (convergence and calibration of DP deep learning via NTK)",
    figure="Table 1",
    claim="implementation check (algebraic guarantees, not an empirical claim): unclipped kernels are symmetric and "
          "positive; flat-clipped kernels H C keep positive eigenvalues",
    scaled_down="LeNet on digits, SGD 6 epochs, 64 examples, 4 checkpoints, C from 0.01 to 1e4, float64 kernels",
    scales=SCALES,
    paper_scale=PaperScale(data="mnist", model="opacus-cnn (4-layer CNN)", epochs=30,
                           hyper="n = 256 examples per kernel, C from 0.01 to 1e4, flat and layerwise", gpu_hours=2.0),
    make=make,
    draw=draw,
    kind="check",
)
