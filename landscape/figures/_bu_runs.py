"""The runs Bu et al.'s calibration figures (Figs. 6, 7 and 11) are drawn from, trained once per scale.

DP-SGD with noise multiplier 1.1 at several clipping norms C with learning rate 0.15 / C (Bu et al. Fig. 6's
rule: the noise step lr * sigma * C stays fixed while C grows), and non-DP SGD, ``seeds`` seeds each (a seed's
runs share their initialisation). ``bu-fig6-7`` and ``bu-fig11`` read the same runs (names
``bu-calibration-SCALE-...``); their settings include :data:`RUNS`.

Bu et al. compare the clipping norms "at similar accuracy"; :func:`premise` checks that before either recipe's
verdict counts (TOST on the paired test accuracies of the smallest and largest C, margin :data:`MARGIN`): when it
is not shown, the verdict is inconclusive (invalid regime), whatever the calibration numbers say.
"""

from __future__ import annotations

import dataclasses

_COMMON = dict(model="lenet", data="digits", sigma=1.1, base_lr=0.15, batch_size=32, sgd_lr=0.03,
               norms=(1.0, 10.0, 100.0))
# Bu et al.: MNIST, the 4-layer CNN of the DP libraries, batch 256, sigma 1.1, lr 0.15 / C, 5 runs.
RUNS = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "seeds": 2, "norms": (1.0, 100.0)},
    "cpu": {**_COMMON, "subset": None, "epochs": 20, "seeds": 3},
    "paper": {**_COMMON, "model": "opacus-cnn", "data": "mnist", "subset": None, "batch_size": 256, "epochs": 30,
              "seeds": 5, "norms": (0.1, 1.0, 10.0, 100.0, 200.0)},
}


SCALES = {scale: {"runs": settings} for scale, settings in RUNS.items()}  # the recipes' settings
MARGIN = 0.05  # "similar accuracy": within 5 accuracy points


def premise(res, rows, small: float, large: float, source: str):
    """The paper's premise as a verdict: C = ``small`` and C = ``large`` reach similar test accuracy (paired by seed,
    :func:`landscape.verdict.similar` with margin :data:`MARGIN`)."""
    from landscape.verdict import similar

    acc = {c: [float(res.rows[i].accuracy) for i in rows[c]] for c in (small, large)}
    return similar(f"premise: C = {small:g} and C = {large:g} reach similar test accuracy", source, acc[small],
                   acc[large], tolerance=MARGIN, names=(f"accuracy C={small:g}", f"accuracy C={large:g}"),
                   paired=True)


def judged(verdict, premise_verdict):
    """``verdict`` unless the premise was not shown: then inconclusive (invalid regime) with the premise's numbers."""
    from landscape.verdict import inconclusive

    if premise_verdict.held is True:
        return verdict
    return inconclusive(verdict, f"the premise of similar accuracy is not shown ({premise_verdict.status}: "
                                 f"{premise_verdict.numbers_text()})")


def measured(ctx):
    """Train (or reuse) the runs and calibrate them: ``(result, rows, norms)`` (see :func:`calibrate`; ``norms``
    the clipping norms, smallest first)."""
    res, rows = calibrate(ctx, train_runs(ctx))
    return res, rows, list(ctx.settings["runs"]["norms"])


def train_runs(ctx) -> dict:
    """``{"sgd": [run per seed], C: [run per seed] ...}`` (trained once, reused after)."""
    from landscape.api import TrainConfig
    from landscape.api.training import ensure
    from landscape.store import Store

    s = ctx.settings["runs"]
    store = Store(ctx.root)
    base = TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"],
                       batch_size=s["batch_size"], checkpoint_every="none", data_root=ctx.data_root)
    prefix = f"bu-calibration-{ctx.scale}"
    out: dict = {"sgd": [ensure(store, dataclasses.replace(base, lr=s["sgd_lr"], seed=seed, run=f"{prefix}-sgd-{seed}"))
                         for seed in range(s["seeds"])]}
    for c in s["norms"]:
        dp = dataclasses.replace(base, optimizer="dpsgd", noise_multiplier=s["sigma"], max_grad_norm=c,
                                 lr=s["base_lr"] / c, momentum=0.0)
        out[c] = [ensure(store, dataclasses.replace(dp, seed=seed, run=f"{prefix}-C{c:g}-{seed}"))
                  for seed in range(s["seeds"])]
    ctx.uses(run for group in out.values() for run in group)
    return out


def calibrate(ctx, runs: dict, bins: int = 15):
    """One calibration result (test split) over every run's last checkpoint; returns ``(result, rows)`` with
    ``rows[key][seed]`` the index of that run's row in ``result.rows``."""
    from landscape.api import calibration

    refs = [f"{run.name}@last" for group in runs.values() for run in group]
    res = calibration(refs, root=ctx.root, bins=bins, splits=("test",), workers=ctx.workers,
                      output=ctx.stem("calibration").with_suffix(".h5"), data_root=ctx.data_root, figure=False)
    where = {r.run: i for i, r in enumerate(res.rows)}
    return res, {key: [where[run.name] for run in group] for key, group in runs.items()}
