"""Zhu & Blaschko (2023), Appendix F (Figs. 6-9): the gradient-deviation distribution p(xi_t), xi_i = g_i - g_bar,
"approximates symmetry during training with DP-SGD", and "this property is also valid for DP-SGD with RS"
(random sparsification). Their evidence is 2-D random projections at epochs 0 to 79.

The design notes: docs/figures.md, "What each recipe measures" (zhu-figF).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from landscape.figures import _draw
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import Verdict, all_of, below

SOURCE = "Zhu & Blaschko 2023, App. F (Figs. 6-9)"
_COMMON = dict(model="lenet", data="digits", lr=1.0, batch_size=64, sigma=1.0, C=1.0, sparsify=0.5,
               projections=16, permutations=199)
SCALES = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "seeds": 2, "examples": 64},
    "cpu": {**_COMMON, "subset": None, "epochs": 10, "seeds": 5, "examples": 256},
    "paper": {**_COMMON, "data": "cifar10", "model": "opacus-cnn", "subset": None, "batch_size": 1000,
              "epochs": 80, "seeds": 5, "examples": 1000},
}
METHODS = ("dpsgd", "dpsgd-rs")
LABEL = {"dpsgd": "DP-SGD", "dpsgd-rs": "DP-SGD + RS"}


ALPHA = 0.05


REFERENCE_SKEW = 0.5  # "approximately symmetric": |skewness| below 0.5 (Bulmer 1979), calibrated into a bound on H
REPLICATES = 20  # Monte Carlo draws of the reference sample per bound


def calibrated_bound(examples: int, checkpoints: int, skew: float = REFERENCE_SKEW, replicates: int = REPLICATES,
                     seed: int = 0) -> float:
    """The bound on the per-seed largest energy coefficient H: its mean over ``replicates`` seeded draws of
    ``checkpoints`` 2-D samples of ``examples`` points with i.i.d. skew-normal coordinates of skewness ``skew``."""
    from scipy import optimize, stats

    from landscape.analyze.symmetry import energy_symmetry_test

    shape = optimize.brentq(lambda a: float(stats.skewnorm.stats(a, moments="s")) - skew, 0.0, 50.0)
    rng = np.random.default_rng(seed)
    worst = [max(energy_symmetry_test(stats.skewnorm.rvs(shape, size=(examples, 2), random_state=rng),
                                      permutations=1).coefficient for _ in range(checkpoints))
             for _ in range(replicates)]
    return float(np.mean(worst))


def _symmetric_throughout(method: str, p: np.ndarray, h: np.ndarray, skew: np.ndarray, bound: float) -> Verdict:
    """Per seed the largest H over the checkpoints; held if their mean is below ``bound`` at alpha 0.05
    (:func:`landscape.verdict.below`). The sign-flip test's rejections are reported beside it: with hundreds of
    examples it rejects exact symmetry at H ~ 0.01 already (at initialisation), which "approximately" allows."""
    from scipy.stats import binom

    n = int(p.size)
    rejected = int((p < ALPHA).sum())
    allowed = int(binom.ppf(0.95, n, ALPHA))
    note = (f"sign-flip test of exact symmetry: {rejected} of {n} checkpoints x seeds reject at {ALPHA:g} "
            f"(chance allows {allowed}); max H {float(h.max()):.3g}, mean |skew| {float(skew.mean()):.3g}")
    return below(f"{LABEL[method]}: the deviations stay approximately symmetric at every checkpoint", SOURCE,
                 h.max(axis=1), bound, name="max H over checkpoints", unit="seeds", note=note)


def make(ctx):
    from landscape.api import TrainConfig, symmetry

    s = ctx.settings
    base = TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"], lr=s["lr"],
                       momentum=0.0, batch_size=s["batch_size"], optimizer="dpsgd", noise_multiplier=s["sigma"],
                       max_grad_norm=s["C"], checkpoint_every="1e")
    H, P, skew, epochs = {}, {}, {}, None
    for m in METHODS:
        H[m], P[m], skew[m] = [], [], []
        for seed in range(s["seeds"]):
            cfg = dataclasses.replace(base, seed=seed, sparsify=s["sparsify"] if m == "dpsgd-rs" else 0.0)
            run = ctx.train(f"{m}-{seed}", cfg)
            res = symmetry(run.name, root=ctx.root, projections=s["projections"], permutations=s["permutations"],
                           subset=s["examples"], subset_seed=seed, seed=seed, workers=ctx.workers,
                           data_root=ctx.data_root,
                           output=ctx.stem(f"symmetry-{m}-{seed}").with_suffix(".h5"), figure=False)
            epochs = np.array([r.epoch for r in res.rows])
            H[m].append([r.stats.energy_coefficient for r in res.rows])
            P[m].append([r.stats.p_value for r in res.rows])
            skew[m].append([r.stats.mean_abs_skew for r in res.rows])
    bound = calibrated_bound(s["examples"], len(epochs))
    parts = [_symmetric_throughout(m, np.asarray(P[m]), np.asarray(H[m]), np.asarray(skew[m]), bound) for m in METHODS]
    verdict = all_of("the gradient-deviation distribution stays approximately symmetric during DP-SGD training, with "
                     "and without random sparsification", SOURCE, parts)
    ctx.scope(f"sigma {s['sigma']:g}, C {s['C']:g}, lr {s['lr']:g}, batch {s['batch_size']}, RS rate {s['sparsify']:g}, "
              f"{s['examples']} examples per checkpoint; bound on H calibrated at skewness {REFERENCE_SKEW:g}")
    numbers = {"epoch": epochs, **{f"{m}/energy_coefficient": H[m] for m in METHODS},
               **{f"{m}/p_value": P[m] for m in METHODS}, **{f"{m}/mean_abs_skew": skew[m] for m in METHODS},
               "bound": bound, "reference_skew": REFERENCE_SKEW}
    return numbers, verdict


def draw(d):
    from landscape.plots import style

    n = d.numbers
    epochs = np.asarray(n["epoch"])
    fig, axes = style.subplots(1, 2, figsize=(9.5, 3.5), layout="constrained")
    colors = {"dpsgd": style.method_color("dpsgd"), "dpsgd-rs": "0.3"}
    for i, m in enumerate(METHODS):
        for ax, key in ((axes[0], "energy_coefficient"), (axes[1], "mean_abs_skew")):
            data = np.atleast_2d(n[f"{m}/{key}"])
            ax.plot(epochs, data.mean(axis=0), color=colors[m], lw=1.8, ls=style.LINESTYLES[i], label=f"{LABEL[m]} (mean)")
            ax.fill_between(epochs, data.min(axis=0), data.max(axis=0), color=colors[m], alpha=0.2, lw=0,
                            label=f"{LABEL[m]}: min-max over seeds")
    axes[0].axhline(float(n["bound"]), color="tab:red", ls="--", lw=0.8,
                    label=f"bound: H of skewness {float(n['reference_skew']):g} (calibrated)")
    axes[1].axhline(float(n["reference_skew"]), color="tab:red", ls="--", lw=0.8,
                    label="|skewness| 0.5 ('approximately symmetric')")
    axes[0].set(xlabel="epoch", ylabel="energy coefficient H (0: symmetric)", title="judged: 2-D random projection")
    axes[1].set(xlabel="epoch", ylabel="mean |skewness| (1-D projections)", title="beside it: 16 random directions")
    axes[0].legend(fontsize=6)
    axes[1].legend(fontsize=6)
    return _draw.finish(fig, d, f"Zhu & Blaschko App. F ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="zhu-figF", paper="Zhu & Blaschko 2023 (random sparsification in DP-SGD)", figure="App. F, Figs. 6-9",
    claim="the gradient-deviation distribution \"approximates symmetry during training with DP-SGD\", with and "
          "without RS (energy coefficient H at every checkpoint below that of a skewness-0.5 distribution)",
    scaled_down="LeNet on digits, 10 epochs, sigma 1, C 1, RS final rate 0.5, 256 examples per checkpoint, 5 seeds",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="opacus-cnn (DP-CNN)", epochs=80,
                           hyper="batch 1000, 2-D random projections at every epoch; sigma / C as in Fig. 2",
                           gpu_hours=6.0),
    make=make,
    draw=draw,
)
