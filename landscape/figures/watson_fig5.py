"""Watson et al. (2023), Fig. 5 (Sec. 4.1.3): barriers between Phase-2 siblings against the SGD Phase-1 length k,
Phase-2 SGD vs Phase-2 DP-SGD at several privacy levels.

The design notes: docs/figures.md, "What each recipe measures" (watson-fig5).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from landscape.figures import _draw
from landscape.figures import _phase_grid as grid
from landscape.figures import _selection as selection_rule
from landscape.figures._selection import judge_with_sensitivity
from landscape.figures.recipe import PaperScale, Recipe, eps_spent, eps_text, spent_text
from landscape.verdict import all_of, greater

NAME = "watson-fig5"
SOURCE = "Watson et al. 2023, Fig. 5"
_COMMON = dict(model="lenet", data="digits", lr=0.03, phase2_lrs=grid.PAPER_LRS, phase2_momenta=(0.0, 0.9),
               batch_size=32, max_grad_norm=1.0, seed=0)
SCALES = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "ks": (1,), "copies": 3, "epsilons": (8.0,), "points": 5,
             "phase2_lrs": (0.05, 0.5), "phase2_momenta": (0.9,)},
    # cpu: the phase grid's candidates, one selection copy per arm (docs/figures.md, "Cost")
    "cpu": {**_COMMON, "subset": None, "epochs": 8, "ks": (1, 2, 4), "copies": 3, "selection_copies": 1,
            "epsilons": (1.0, 8.0), "points": 20, "phase2_lrs": (0.01, 0.03, 0.1)},
    # Sec. 4.1: Resnet18 (GroupNorm for DP) on CIFAR10, C = 1, 30 alphas; lr and batch size are not stated in
    # the main text (assumed here), k up to the run length.
    "paper": {**_COMMON, "model": "resnet18", "data": "cifar10", "subset": None, "lr": 0.1, "batch_size": 128,
              "epochs": 20, "ks": (1, 3, 5, 10, 15), "copies": 3, "epsilons": (1.0, 5.0, 50.0), "points": 30,
              "phase2_momenta": (0.0,)},
}


@dataclasses.dataclass
class Sweep:
    """The (arm, k) groups of Fig. 5 for a context (``watson-fig6-7`` reads them through its own context with this
    recipe's settings and name)."""

    ctx: object
    settings: dict
    name: str = NAME

    @property
    def ks(self) -> list[int]:
        return sorted(map(int, self.settings["ks"]))

    @property
    def epsilons(self) -> list[float]:
        return sorted(map(float, self.settings["epsilons"]))

    def arms(self) -> list[str]:
        """``sgd``, then ``dp-eE`` per epsilon (ascending)."""
        return ["sgd", *(f"dp-e{e:g}" for e in self.epsilons)]

    def candidates(self) -> list[tuple[float, float]]:
        s = self.settings
        return [(float(m), float(lr)) for m in s["phase2_momenta"] for lr in s["phase2_lrs"]]

    def group(self, arm: str, k: int, momentum: float, lr: float, selection: bool = False) -> str:
        return f"{self.name}-{self.ctx.scale}{'-sel' if selection else ''}-{arm}-k{k}-m{momentum:g}-lr{lr:g}"

    def count(self, selection: bool = False) -> int:
        """Phase-2 copies per group: ``copies``, or ``selection_copies`` for selection groups (default: as many)."""
        s = self.settings
        return int(s.get("selection_copies", s["copies"])) if selection else int(s["copies"])

    def copies(self, arm: str, k: int, momentum: float, lr: float, selection: bool = False) -> list[str]:
        family = "sgd" if arm == "sgd" else "dpsgd"
        return [f"{self.group(arm, k, momentum, lr, selection)}-sgd-{family}-{i}" for i in range(self.count(selection))]

    def base(self, selection: bool = False):
        from landscape.api import TrainConfig

        s = self.settings
        config = TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"], lr=s["lr"],
                             batch_size=s["batch_size"], seed=s["seed"], max_grad_norm=s["max_grad_norm"],
                             checkpoint_every="1e", data_root=self.ctx.data_root)
        return selection_rule.for_selection(config) if selection else config

    def sigma(self, eps: float, k: int, selection: bool = False) -> float:
        """The noise multiplier whose DP Phase 2 (``epochs - k`` epochs, no DP Phase 1) spends ``eps``."""
        from landscape.data import load_dataset
        from landscape.privacy import continuing_accountant
        from landscape.train.accounting import noise_for_epsilon
        from landscape.train.sampling import steps_per_epoch

        b = self.base(selection)
        n = len(load_dataset(b.data, seed=b.data_seed, subset=b.subset, data_root=b.data_root).y_train)
        steps = (b.epochs - k) * steps_per_epoch(n, b.batch_size)
        accountant = b.accountant or continuing_accountant(None)  # the DP child of an SGD Phase 1: no private parent
        return float(noise_for_epsilon(eps, min(1.0, b.batch_size / n), steps, b.delta, accountant))

    def config(self, arm: str, k: int, momentum: float, lr: float, selection: bool = False):
        """The :class:`~landscape.api.PhasesConfig` of one arm: Phase-1 SGD at the ``lr`` setting (momentum 0.9),
        Phase 2 at the candidate ``momentum`` and ``lr``; a DP arm's sigma calibrated to its epsilon for this k."""
        from landscape.api import PhasesConfig

        m = momentum
        group = self.group(arm, k, m, lr, selection)
        if arm == "sgd":
            return PhasesConfig(base=self.base(selection), k=k, copies=self.count(selection), phase1=("sgd",),
                                phase2=("sgd",), phase2_sgd_lr=lr, phase2_sgd_momentum=m, group=group)
        eps = float(arm.removeprefix("dp-e"))
        base = dataclasses.replace(self.base(selection), noise_multiplier=self.sigma(eps, k, selection))
        return PhasesConfig(base=base, k=k, copies=self.count(selection), phase1=("sgd",), phase2=("dpsgd",), dp_lr=lr,
                            dp_momentum=m, group=group)

    def train(self, arm: str, k: int, candidate, selection: bool = False) -> list:
        from landscape.api import phases
        from landscape.store import Store

        phases(self.config(arm, k, *candidate, selection), root=self.ctx.root)
        store = Store(self.ctx.root)
        return [store.run(n) for n in self.copies(arm, k, *candidate, selection)]

    def selection(self):
        def train(candidate, arm):
            for k in self.ks:
                yield self.train(arm, k, candidate, selection=True)

        return selection_rule.select(self.ctx, self.candidates(), self.arms(), train, label=grid.label, cut=True)

    def siblings(self, arm: str, k: int, candidate) -> dict:
        """The sibling pairs of one arm at one k and candidate, interpolated: ``{"pairs", "units", "height", "chord",
        "def23", "paths", "runs"}``."""
        runs = self.train(arm, k, candidate)
        units = grid.sibling_pairs(self.settings["copies"])
        pairs = [f"{runs[i].name}:{runs[j].name}" for i, j in units]
        m, lr = candidate
        tag = f"instability-{arm}-k{k}-m{m:g}-lr{lr:g}".replace(".", "_")
        return {**self.interpolated(pairs, f"{self.name}-{tag}"), "pairs": pairs, "units": units, "runs": runs}


    def mixed(self, eps: float, k: int, sgd_candidate, dp_candidate) -> dict:
        """Fig. 6's pairs: Phase-2 SGD copy i and Phase-2 DP-SGD (``eps``) copy i from the same (bit-identical)
        Phase-1 SGD model at ``k``, interpolated (independent units: the copies)."""
        a, b = self.train("sgd", k, sgd_candidate), self.train(f"dp-e{eps:g}", k, dp_candidate)
        pairs = [f"{x.name}:{y.name}" for x, y in zip(a, b, strict=True)]
        tag = f"mixed-e{eps:g}-k{k}-{'-'.join(f'{v:g}' for v in (*sgd_candidate, *dp_candidate))}".replace(".", "_")
        return {**self.interpolated(pairs, f"{self.ctx.name}-{tag}"), "pairs": pairs, "runs": a + b}

    def interpolated(self, pairs: list[str], stem: str) -> dict:
        """``pairs`` interpolated on the test split (the table in ``STEM-SCALE.h5``), as ``barriers_and_paths``."""
        from landscape.api import InterpolateConfig, instability

        table = instability(pairs=",".join(pairs), root=self.ctx.root, workers=self.ctx.workers, figure=False,
                            config=InterpolateConfig(points=self.settings["points"], split=("test",)),
                            output=self.ctx.out / f"{stem}-{self.ctx.scale}.h5", data_root=self.ctx.data_root)
        return grid.barriers_and_paths(table, pairs)


def evaluate(ctx, sweep: Sweep, sel, setting: dict) -> tuple[dict, object]:
    ks, eps_list = sweep.ks, sweep.epsilons
    at = {(arm, k): sweep.siblings(arm, k, sel.candidates[setting[arm]]) for arm in sweep.arms() for k in ks}
    floor = grid.min_height()
    corner = (eps_list[-1], ks[-1]) if len(ks) > 1 and len(eps_list) > 1 else None

    def part(e, k):
        dp, sgd = at[(f"dp-e{e:g}", k)], at[("sgd", k)]
        v = greater(f"DP-SGD (eps {e:g}) siblings are separated by a higher barrier than SGD siblings at k = {k}",
                    SOURCE, dp["height"], sgd["height"], names=(f"DP eps {e:g}", "SGD"), unit="sibling pairs",
                    min_effect=floor, pairs_a=dp["units"], pairs_b=sgd["units"],
                    note=f"chord barrier beside it: DP {np.mean(dp['chord']):.3g}, SGD {np.mean(sgd['chord']):.3g}.")
        return ctx.judged(v, grid.ends(dp["pairs"] + sgd["pairs"]))

    parts = [part(e, k) for e in eps_list for k in ks if (e, k) != corner]
    exception = part(*corner) if corner else None
    note = grid.BARRIER
    if exception is not None:
        note += (" || Exception (the paper: 'except perhaps for high values of both k and epsilon'; separate, not "
                 f"required): {exception.line()}")
    verdict = all_of("DP-SGD siblings almost never end in the same linear basin: a higher barrier than SGD siblings "
                     "at every k and epsilon except perhaps the largest of both", SOURCE, parts, note=note)
    if ctx.role:
        return {}, verdict
    m, lr = sel.candidates[setting["sgd"]]
    dp_runs = [r for e in eps_list for k in ks for r in at[(f"dp-e{e:g}", k)]["runs"]]
    ctx.scope(f"Phase 2 at one matched lr {lr:g} (the paper: SGD {grid.PAPER_LR['sgd']:g}, DP-SGD "
              f"{grid.PAPER_LR['dpsgd']:g}), momentum {m:g}", eps_text(dp_runs) + " (sigma calibrated per k)")
    n = sweep.settings["copies"] * (sweep.settings["copies"] - 1) // 2
    numbers = {"k": ks, "epsilon": eps_list, "min_height": floor, "alpha": np.linspace(0, 1, sweep.settings["points"]),
               "verdict/exception_held": {True: 1.0, False: 0.0, None: math.nan}[exception.held] if exception else math.nan}
    for key, what in (("height", "height"), ("chord", "chord"), ("instability", "def23")):
        numbers[f"sgd/{key}"] = [at[("sgd", k)][what][:n] for k in ks]
        numbers[f"dp/{key}"] = [[at[(f"dp-e{e:g}", k)][what][:n] for k in ks] for e in eps_list]
    numbers["eps_spent"] = [[float(np.mean(eps_spent(at[(f"dp-e{e:g}", k)]["runs"]))) for k in ks] for e in eps_list]
    return numbers, verdict


def make(ctx):
    sweep = Sweep(ctx, ctx.settings)
    sel = sweep.selection()
    return judge_with_sensitivity(ctx, sel, lambda setting: evaluate(ctx, sweep, sel, setting))


def draw(d):
    from landscape.plots import style

    nb = d.numbers
    ks, eps = np.atleast_1d(nb["k"]), np.atleast_1d(nb["epsilon"])
    fig, axes = style.subplots(1, 2, figsize=(9.5, 3.8), sharex=True, layout="constrained")
    series = style.series_styles(1 + len(eps))
    total = 1 + len(eps)
    for ax, key, what in ((axes[0], "height", "height above both ends"), (axes[1], "chord", "barrier above the chord")):
        rows = [np.atleast_2d(nb[f"sgd/{key}"])] + [np.atleast_2d(r) for r in np.atleast_3d(nb[f"dp/{key}"])
                                                       .reshape(len(eps), len(ks), -1)]
        labels = ["SGD siblings"] + [f"DP-SGD eps {e:g} ({spent_text(np.atleast_2d(nb['eps_spent'])[j])})"
                                     for j, e in enumerate(eps)]
        for i, (a, label, st) in enumerate(zip(rows, labels, series, strict=True)):
            mean = np.nanmean(a, axis=1)
            sd = np.nanstd(a, axis=1, ddof=1) if a.shape[1] > 1 else np.zeros_like(mean)
            ax.errorbar(_draw.dodge(ks, i, total, width=0.3), mean, yerr=sd, capsize=3, label=label, **st)
        if key == "height":
            ax.axhline(float(nb["min_height"]), color="tab:red", ls="--", lw=0.8, label="minimum height")
        ax.set(xlabel="Phase-1 SGD epochs k (series offset sideways)", ylabel=f"{what} (test loss)")
        ax.set_xticks(ks)
        ax.set_xlim(ks.min() - 0.6, ks.max() + 0.6)
    axes[0].set_title(f"judged: {d.verdict.status}")
    axes[1].set_title("beside it, not judged")
    axes[0].legend(fontsize=7, title="mean, bars: sd over sibling pairs", title_fontsize=7)
    return _draw.finish(fig, d, None, axes)


RECIPE = Recipe(
    name=NAME, paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 5",
    claim="two runs of DP-SGD almost never end in the same linear basin (a higher barrier than SGD siblings), except "
          "perhaps for high values of both k and epsilon",
    scaled_down="LeNet on digits, 8 epochs, k in {1,2,4}, epsilon in {1,8}, 3 copies (3 sibling pairs) per point, "
                "DP Phase 2's sigma calibrated per k to the labelled epsilon; SGD and DP-SGD siblings' Phase 2 at one matched lr and "
                "momentum selected on a validation split; barrier = height above both ends, minimum 2% of ln C",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=20,
                           hyper="C=1, eps in {1,5,50} (Fig. 5 b-d), delta 1e-5, 30 alphas; lr 0.1 / batch 128 "
                                 "assumed; the matched Phase-2 lr searched over the paper's sweep, momentum 0",
                           gpu_hours=150.0),
    make=make,
    draw=draw,
)
