"""The runs Bu et al.'s calibration figures (Figs. 6, 7 and 11) are drawn from, trained once per scale.

The design notes: docs/figures.md, "What each recipe measures" (bu-runs).
"""

from __future__ import annotations

import dataclasses

_COMMON = dict(model="lenet", data="digits", sigma=1.1, base_lr=0.15, batch_size=32, sgd_lr=0.03,
               norms=(1.0, 10.0, 100.0), lr_factors=(1.0, 3.0, 10.0))
# Bu et al.: MNIST, the 4-layer CNN of the DP libraries, batch 256, sigma 1.1, lr 0.15 / C, 5 runs.
RUNS = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "seeds": 2, "norms": (1.0, 100.0), "lr_factors": (1.0, 3.0)},
    # cpu: non-DP SGD reaches the DP models' accuracy within its first epochs; 5 epochs still end it converged
    "cpu": {**_COMMON, "subset": None, "epochs": 20, "seeds": 5, "sgd_epochs": 5},
    "paper": {**_COMMON, "model": "opacus-cnn", "data": "mnist", "subset": None, "batch_size": 256, "epochs": 30,
              "seeds": 5, "norms": (0.1, 1.0, 10.0, 100.0, 200.0)},
}


SCALES = {scale: {"runs": settings} for scale, settings in RUNS.items()}  # the recipes' settings
MARGIN = 0.05  # "similar accuracy": within 5 accuracy points
MATCH_TOLERANCE = 0.02  # an accuracy-matched SGD reference: within 2 test-accuracy points of the DP model
SGD_CHECKPOINTS = "0.125e"  # the SGD runs' checkpoints (runs ``...-sgd-ck8-SEED``): the candidates for the match


def arm(c: float) -> str:
    return f"C{c:g}"


@dataclasses.dataclass
class Measured:
    """The evaluation runs at one setting: ``res``/``rows`` (see :func:`calibrate`; keys ``"sgd"``, small, large),
    the two C compared, the premise verdict between them, the lr per C and the runs."""

    res: object
    rows: dict
    small: float
    large: float
    premise: object
    lr: dict        # C -> lr
    runs: dict      # "sgd" / C -> the runs, one per seed


@dataclasses.dataclass
class Bu:
    """The selection (over the factor f, for the two compared norms) and the evaluation at a setting."""

    ctx: object
    sel: object
    norms: list
    small: float
    large: float
    full: object    # the selection over every C (which chose the compared large C)

    def at(self, setting: dict, source: str) -> Measured:
        """Train (or reuse) the evaluation runs at ``setting`` (``{arm(C): factor index}``) and calibrate them; the
        premise: the two C reach similar test accuracy (paired by seed, margin :data:`MARGIN`)."""
        from landscape.verdict import similar

        ctx, s = self.ctx, self.ctx.settings["runs"]
        runs = {"sgd": sgd_runs(ctx)}
        lr = {}
        for c in (self.small, self.large):
            lr[c] = float(self.sel.candidates[setting[arm(c)]]) * s["base_lr"] / c
            runs[c] = [ctx.train(f"C{c:g}-lr{lr[c]:g}-{seed}", dataclasses.replace(dp_config(ctx, c), lr=lr[c],
                                                                                   seed=seed), group=group(ctx))
                       for seed in range(s["seeds"])]
        res, rows = calibrate(ctx, runs, tag="-".join(f"{lr[c]:g}" for c in (self.small, self.large)))
        small, large = self.small, self.large
        acc = {c: [float(res.rows[i].accuracy) for i in rows[c]] for c in (small, large)}
        premise = similar(f"premise: C = {small:g} and C = {large:g} reach similar test accuracy", source, acc[small],
                          acc[large], tolerance=MARGIN, names=(f"accuracy C={small:g}", f"accuracy C={large:g}"),
                          paired=True)
        return Measured(res, rows, small, large, premise, lr, runs)

    def verdict(self, claim: str, source: str, parts: list, m: Measured):
        """The recipe's verdict at one setting: :func:`~landscape.verdict.all_of` of ``parts``, inconclusive (invalid
        regime) when the premise is not shown; at the chosen setting the scope's facts are recorded."""
        from landscape.figures.recipe import eps_text
        from landscape.verdict import all_of, inconclusive

        note = (f"Compared C = {self.small:g} with C = {self.large:g}: the largest C whose best validation accuracy "
                f"(selection runs) is within {MARGIN:g} of C = {self.small:g}'s.")
        verdict = all_of(claim, source, parts, note=note)
        if m.premise.held is not True:
            verdict = inconclusive(verdict, f"the premise of similar accuracy is not shown ({m.premise.status}: "
                                            f"{m.premise.numbers_text()})")
        if not self.ctx.role:
            s = self.ctx.settings["runs"]
            self.ctx.scope(f"sigma {s['sigma']:g}, lr {m.lr[self.small]:g} at C = {self.small:g} and "
                           f"{m.lr[self.large]:g} at C = {self.large:g} (Bu's rule: 0.15 / C), batch {s['batch_size']}, "
                           f"{s['epochs']} epochs", eps_text(m.runs[self.small] + m.runs[self.large]))
        return verdict

    def numbers(self) -> dict:
        """The choice of the compared C: every C's best validation score (over f) on the selection runs."""
        best = [max(self.full.arm_score(i, arm(c)) for i in range(len(self.full.candidates))) for c in self.norms]
        return {"max_grad_norm": self.norms, "compared_C": [self.small, self.large],
                "selection/best_validation_acc_per_C": best}


def base_config(ctx):
    from landscape.api import TrainConfig

    s = ctx.settings["runs"]
    return TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"],
                       batch_size=s["batch_size"], checkpoint_every="1e", data_root=ctx.data_root)


def dp_config(ctx, c: float):
    s = ctx.settings["runs"]
    return dataclasses.replace(base_config(ctx), optimizer="dpsgd", noise_multiplier=s["sigma"], max_grad_norm=c,
                               momentum=0.0)


def sgd_runs(ctx) -> list:
    """Non-DP SGD, one run per seed (``sgd_epochs`` epochs), a checkpoint every 1/8 epoch (the candidates of the
    matched reference)."""
    s = ctx.settings["runs"]
    sgd = dataclasses.replace(base_config(ctx), lr=s["sgd_lr"], momentum=0.9, checkpoint_every=SGD_CHECKPOINTS,
                              epochs=s.get("sgd_epochs", s["epochs"]))
    return [ctx.train(f"sgd-ck8-{seed}", dataclasses.replace(sgd, seed=seed), group=group(ctx))
            for seed in range(s["seeds"])]


def group(ctx) -> str:
    """The shared name prefix of the runs (both Bu recipes read the same runs)."""
    return f"bu-calibration-{ctx.scale}"


def measured(ctx) -> Bu:
    """Select the factor f and the compared C on the validation split (module docstring)."""
    from landscape.figures import _selection

    s = ctx.settings["runs"]
    norms = sorted(map(float, s["norms"]))
    factors = [float(f) for f in s["lr_factors"]]
    full = _selection.per_arm(ctx, factors, {arm(c): (lambda f, c=c: dataclasses.replace(
        dp_config(ctx, c), lr=f * s["base_lr"] / c, seed=0)) for c in norms}, label=lambda f: f"lr factor {f:g}",
        name=lambda f: f"f{f:g}", group=group(ctx))
    small = norms[0]
    best = {c: max(full.arm_score(i, arm(c)) for i in range(len(factors))) for c in norms}
    large = next((c for c in reversed(norms[1:]) if abs(best[c] - best[small]) <= MARGIN), norms[-1])
    sel = _selection.restrict(full, [arm(small), arm(large)])
    return Bu(ctx, sel, norms, small, large, full)


def calibrate(ctx, runs: dict, tag: str):
    """One calibration result (test split) over every run's last checkpoint; returns ``(result, rows)`` with
    ``rows[key][seed]`` the index of that run's row in ``result.rows``."""
    from landscape.api import calibration

    refs = [f"{run.name}@last" for group in runs.values() for run in group]
    res = calibration(refs, root=ctx.root, bins=15, split=("test",), workers=ctx.workers, figure=False,
                      output=ctx.stem(f"calibration-{tag}".replace(".", "_")).with_suffix(".h5"),
                      data_root=ctx.data_root)
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
    train_accuracy: list  # its train accuracy (what was matched)
    dp_train_accuracy: list

    def numbers(self) -> dict:
        return {"sgd_matched/epoch": self.epoch, "sgd_matched/accuracy": self.accuracy,
                "sgd_matched/dp_accuracy": self.dp_accuracy, "sgd_matched/ece": self.ece,
                "sgd_matched/train_accuracy": self.train_accuracy,
                "sgd_matched/dp_train_accuracy": self.dp_train_accuracy, "sgd_matched/tolerance": MATCH_TOLERANCE,
                "reliability/sgd_matched": self.bin_accuracy}

    def text(self) -> str:
        pairs = ", ".join(f"seed {i}: epoch {e:.3g}, test accuracy {a:.3f} vs {d:.3f}"
                          for i, (e, a, d) in enumerate(zip(self.epoch, self.accuracy, self.dp_accuracy, strict=True)))
        return ("SGD reference at matched accuracy: per seed the SGD checkpoint closest in train accuracy to the DP "
                f"model's ({pairs})")


def sgd_matched(ctx, m: Measured, key: float) -> Matched:
    """Per seed, the SGD checkpoint whose *train* accuracy (its manifest's, the full training split) is closest to
    C = ``key``'s final train accuracy of the same seed (ties: the earlier checkpoint), with its test-split ECE."""
    from landscape.api import calibration

    chosen, train, dp_train, dp_test = [], [], [], []
    for run, dp in zip(m.runs["sgd"], m.runs[key], strict=True):
        target = float(dp.checkpoints()[-1].metrics["train_acc"])
        infos = run.checkpoints()
        info = min(infos, key=lambda i: (abs(float(i.metrics["train_acc"]) - target), i.step))
        chosen.append(f"{run.name}@step={info.step}")
        train.append(float(info.metrics["train_acc"]))
        dp_train.append(target)
        dp_test.append(float(dp.checkpoints()[-1].metrics["test_acc"]))
    res = calibration(chosen, root=ctx.root, bins=15, split=("test",), workers=ctx.workers, figure=False,
                      output=ctx.stem(f"sgd-matched-{'-'.join(f'{v:g}' for v in m.lr.values())}".replace(".", "_"))
                      .with_suffix(".h5"), data_root=ctx.data_root)
    acc = [float(r.accuracy) for r in res.rows]
    ok = all(abs(a - d) <= MATCH_TOLERANCE for a, d in zip(acc, dp_test, strict=True))
    return Matched([float(r.epoch) for r in res.rows], acc, dp_test, [float(r.ece) for r in res.rows], ok,
                   [list(res.bin_accuracy[i]) for i in range(len(res.rows))], train, dp_train)
