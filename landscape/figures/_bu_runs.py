"""The runs Bu et al.'s calibration figures (Figs. 6, 7 and 11) are drawn from, trained once per scale.

DP-SGD with noise multiplier 1.1 at several clipping norms C with learning rate 0.15 / C (Bu et al. Fig. 6's
rule: the noise step lr * sigma * C stays fixed while C grows), and non-DP SGD, ``seeds`` seeds each (a seed's
runs share their initialisation). ``bu-fig6-7`` and ``bu-fig11`` read the same runs (names
``bu-calibration-SCALE-...``); their settings include :data:`RUNS`.

Claim-blind learning rate per C: Bu's rule lr = 0.15 / C starves a large C on this small problem (C = 100 at lr
0.0015 ended at 38.5% test accuracy against 86% at C = 1). Each C therefore takes the factor ``f`` of
``lr = f * base_lr / C`` from the grid ``lr_factors`` whose seed-0 run reaches the highest final *train* accuracy
(ties: the smaller lr); every seed then uses it. The grid, the scores and the choices go into both summaries.

Bu et al. compare the clipping norms "at similar accuracy"; :func:`premise` checks that before either recipe's
verdict counts (TOST on the paired test accuracies of two C, margin :data:`MARGIN`). The large C compared with
the smallest is the largest C of the grid for which the premise is shown (:func:`measured`; chosen from test
accuracies alone, before any calibration number is computed); when no C is, the largest C is compared and the
verdict is inconclusive (invalid regime), whatever the calibration numbers say. Only the runs compared (and
non-DP SGD) are end models under the validity gate.

Non-DP SGD (lr ``sgd_lr``, momentum 0.9) ends far more accurate than any DP run, so "C = 1 is worse calibrated
than non-DP SGD" compares at *matched accuracy* (:func:`sgd_matched`): the SGD runs keep a checkpoint every
1/8 epoch (on the steep early part of SGD's accuracy curve one epoch gains ~10 points, too coarse for the
tolerance), and per seed the reference is the SGD checkpoint whose test accuracy is closest to the smallest C's final
test accuracy of the same seed (ties: the earlier checkpoint), chosen from test accuracies alone. When some
seed's closest checkpoint is more than :data:`MATCH_TOLERANCE` away, there is no accuracy-matched reference and
that part is inconclusive (invalid regime). The chosen epochs and both accuracies go into bu-fig6-7's summary.
"""

from __future__ import annotations

import dataclasses

_COMMON = dict(model="lenet", data="digits", sigma=1.1, base_lr=0.15, batch_size=32, sgd_lr=0.03,
               norms=(1.0, 10.0, 100.0), lr_factors=(1.0, 3.0, 10.0))
# Bu et al.: MNIST, the 4-layer CNN of the DP libraries, batch 256, sigma 1.1, lr 0.15 / C, 5 runs.
RUNS = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "seeds": 2, "norms": (1.0, 100.0), "lr_factors": (1.0, 3.0)},
    "cpu": {**_COMMON, "subset": None, "epochs": 20, "seeds": 5},
    "paper": {**_COMMON, "model": "opacus-cnn", "data": "mnist", "subset": None, "batch_size": 256, "epochs": 30,
              "seeds": 5, "norms": (0.1, 1.0, 10.0, 100.0, 200.0)},
}


SCALES = {scale: {"runs": settings} for scale, settings in RUNS.items()}  # the recipes' settings
MARGIN = 0.05  # "similar accuracy": within 5 accuracy points
MATCH_TOLERANCE = 0.02  # an accuracy-matched SGD reference: within 2 test-accuracy points of the DP model
SGD_CHECKPOINTS = "0.125e"  # the SGD runs' checkpoints (runs ``...-sgd-ck8-SEED``): the candidates for the match


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


@dataclasses.dataclass
class Measured:
    """The calibrated runs: ``res``/``rows`` (see :func:`calibrate`), ``norms`` (smallest first), the two C
    compared (``small``, ``large``), the premise verdict between them, and the claim-blind lr choice per C."""

    res: object
    rows: dict
    norms: list
    small: float
    large: float
    premise: object
    lr: dict        # C -> chosen lr
    grid: dict      # C -> seed-0 final train accuracy per factor of lr_factors
    runs: dict      # "sgd" / C -> the runs, one per seed

    def numbers(self) -> dict:
        """What a summary stores about the choices: the lr grid and its scores, the chosen lr, the compared C."""
        s = {f"lr_grid/C{c:g}/train_acc": self.grid[c] for c in self.norms}
        return {**s, **{f"lr_chosen/C{c:g}": self.lr[c] for c in self.norms}, "compared_C": [self.small, self.large]}

    def note(self) -> str:
        lrs = ", ".join(f"C {c:g}: lr {self.lr[c]:g}" for c in self.norms)
        return (f"Compared C = {self.small:g} with C = {self.large:g} (the largest C at similar accuracy). "
                f"Claim-blind lr per C ({lrs}).")


def measured(ctx, source: str) -> Measured:
    """Train (or reuse) the runs, calibrate them and choose the C to compare (see the module docstring)."""
    runs, lr, grid = train_runs(ctx)
    res, rows = calibrate(ctx, runs)
    norms = list(ctx.settings["runs"]["norms"])
    small = norms[0]
    large, shown = norms[-1], None
    for c in reversed(norms[1:]):
        p = premise(res, rows, small, c, source)
        if shown is None and c == norms[-1]:
            shown = p
        if p.held is True:
            large, shown = c, p
            break
    ctx.uses(run for key in ("sgd", small, large) for run in runs[key])
    return Measured(res, rows, norms, small, large, shown, lr, grid, runs)


def train_runs(ctx) -> tuple[dict, dict, dict]:
    """``({"sgd": [run per seed], C: [run per seed] ...}, {C: chosen lr}, {C: seed-0 train accuracy per lr
    factor})`` (trained once, reused after)."""
    from landscape.api import TrainConfig
    from landscape.api.training import ensure
    from landscape.figures.recipe import best, final
    from landscape.store import Store

    s = ctx.settings["runs"]
    store = Store(ctx.root)
    base = TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"],
                       batch_size=s["batch_size"], checkpoint_every="none", data_root=ctx.data_root)
    prefix = f"bu-calibration-{ctx.scale}"
    sgd = dataclasses.replace(base, lr=s["sgd_lr"], checkpoint_every=SGD_CHECKPOINTS)
    out: dict = {"sgd": [ensure(store, dataclasses.replace(sgd, seed=seed, run=f"{prefix}-sgd-ck8-{seed}"))
                         for seed in range(s["seeds"])]}
    lrs, grid = {}, {}
    for c in s["norms"]:
        dp = dataclasses.replace(base, optimizer="dpsgd", noise_multiplier=s["sigma"], max_grad_norm=c, momentum=0.0)

        def run(lr, seed, c=c, dp=dp):
            return ensure(store, dataclasses.replace(dp, lr=lr, seed=seed, run=f"{prefix}-C{c:g}-lr{lr:g}-{seed}"))

        candidates = [f * s["base_lr"] / c for f in s["lr_factors"]]
        grid[c] = [final(run(lr, 0), "train_acc") for lr in candidates]
        lrs[c] = best(candidates, grid[c])
        out[c] = [run(lrs[c], seed) for seed in range(s["seeds"])]
    return out, lrs, grid


def calibrate(ctx, runs: dict, bins: int = 15):
    """One calibration result (test split) over every run's last checkpoint; returns ``(result, rows)`` with
    ``rows[key][seed]`` the index of that run's row in ``result.rows``."""
    from landscape.api import calibration

    refs = [f"{run.name}@last" for group in runs.values() for run in group]
    res = calibration(refs, root=ctx.root, bins=bins, split=("test",), workers=ctx.workers,
                      output=ctx.stem("calibration").with_suffix(".h5"), data_root=ctx.data_root, figure=False)
    where = {r.run: i for i, r in enumerate(res.rows)}
    return res, {key: [where[run.name] for run in group] for key, group in runs.items()}


@dataclasses.dataclass
class Matched:
    """Per seed, the SGD checkpoint accuracy-matched to a DP model (see :func:`sgd_matched`)."""

    epoch: list        # the chosen SGD checkpoint's epoch, per seed
    accuracy: list     # its test accuracy
    dp_accuracy: list  # the test accuracy of the DP model it is matched to
    ece: list          # its ECE (test split)
    matched: bool      # every seed's |accuracy - dp_accuracy| <= MATCH_TOLERANCE
    bin_accuracy: list  # its reliability bins (accuracy per confidence bin, NaN where empty)

    def numbers(self) -> dict:
        return {"sgd_matched/epoch": self.epoch, "sgd_matched/accuracy": self.accuracy,
                "sgd_matched/dp_accuracy": self.dp_accuracy, "sgd_matched/ece": self.ece,
                "sgd_matched/tolerance": MATCH_TOLERANCE}

    def text(self) -> str:
        pairs = ", ".join(f"seed {i}: epoch {e:.3g}, accuracy {a:.3f} vs {d:.3f}"
                          for i, (e, a, d) in enumerate(zip(self.epoch, self.accuracy, self.dp_accuracy, strict=True)))
        return f"SGD reference at matched accuracy: per seed the SGD checkpoint closest in test accuracy ({pairs})"


def sgd_matched(ctx, m: Measured, key: float) -> Matched:
    """Per seed, the SGD checkpoint whose test accuracy is closest to C = ``key``'s final test accuracy of the same
    seed (ties: the earlier checkpoint), with its ECE. Every checkpoint of the SGD runs is calibrated (the
    recipe's file ``sgd-checkpoints``)."""
    from landscape.api import calibration

    refs = [f"{run.name}@step={info.step}" for run in m.runs["sgd"] for info in run.checkpoints()]
    res = calibration(refs, root=ctx.root, bins=15, split=("test",), workers=ctx.workers,
                      output=ctx.stem("sgd-checkpoints").with_suffix(".h5"), data_root=ctx.data_root, figure=False)
    epoch, acc, dp, ece, bins = [], [], [], [], []
    for run, i in zip(m.runs["sgd"], m.rows[key], strict=True):
        target = float(m.res.rows[i].accuracy)
        rows = [j for j, r in enumerate(res.rows) if r.run == run.name]
        j = min(rows, key=lambda j: (abs(float(res.rows[j].accuracy) - target), res.rows[j].step))  # ties: earlier
        r = res.rows[j]
        epoch.append(float(r.epoch)), acc.append(float(r.accuracy)), dp.append(target), ece.append(float(r.ece))
        bins.append(res.bin_accuracy[j])
    ok = all(abs(a - d) <= MATCH_TOLERANCE for a, d in zip(acc, dp, strict=True))
    return Matched(epoch, acc, dp, ece, ok, bins)
