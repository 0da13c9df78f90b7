"""Watson et al. (2023), Fig. 5 (Sec. 4.1.3): linear-interpolation barriers of Phase-2 siblings against the SGD
Phase-1 length k, Phase-2 SGD vs Phase-2 DP-SGD at several privacy levels.

Claim (Sec. 4.1.3): "SGD finds its basin early. However, DP-SGD shows high values of instability, implying that
two runs of DP-SGD almost never end in the same linear basin, except perhaps for high values of both k and
epsilon". Measured per sibling pair (same Phase-1 checkpoint, different data order and noise): the test-loss
barrier above the chord (sup_a L(a) - ((1-a) L(0) + a L(1))), with Def. 2.3 instability stored and drawn beside
it. Verdict: per (k, epsilon) the DP siblings' barrier exceeds the SGD siblings' (:func:`landscape.verdict.greater`,
Welch at alpha 0.05 over sibling pairs); the claim is every (k, epsilon) except the largest k with the largest
epsilon (:func:`landscape.verdict.all_of`). That corner is the paper's exception ("perhaps"): it is judged as a
separate part and reported in the note, not required. A part whose end models fail the validity gate (e.g. DP
runs that diverge at a small epsilon) is inconclusive (invalid regime), never "did not hold".

Claim-blind learning rate per epsilon: the Phase-2 DP-SGD lr is chosen from the grid ``dp_lrs`` before any barrier
is computed -- per epsilon, the lr whose first Phase-2 DP copy at the smallest k reaches the highest final *train*
accuracy (ties: the smaller lr); every k and copy at that epsilon then uses it (that copy is reused as copy 0).
The grid, the scores and the choices are stored in the summary (``lr_grid/*``, ``lr_chosen``). With one fixed lr
0.5 the epsilon-1 models diverged (test loss 32-98, accuracy 31-45%: invalid regime).

Fair comparison, matched lr per epsilon: each epsilon's SGD-sibling reference trains Phase 2 at that epsilon's DP
lr, batch size and momentum (0), from the same Phase-1 SGD checkpoint as its DP siblings, so a barrier difference
comes from clipping and noise, not from the step size. SGD siblings are trained once per (k, lr) (group
``NAME-SCALE-sgd-kK-lrLR``): epsilons that chose the same lr share them. Phase 1 (SGD, lr ``lr``, momentum 0.9) is
common to both. The summary stores the reference per epsilon (``sgd``, ``sgd_instability``: epsilon x k x pairs)
and its lr (``sgd_lr``, equal to ``lr_chosen``). Before, every reference ran Phase 2 at the base lr 0.03 with
momentum 0.9.

Scaled down: LeNet on ``digits`` (8x8) instead of Resnet18 on CIFAR10; a few epochs instead of the paper's
schedule; k in epochs of the short run; ``copies`` Phase-2 copies give ``copies*(copies-1)/2`` sibling pairs
per point (>= 3 at cpu scale).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from landscape.figures import _phase_grid as grid
from landscape.figures.recipe import GateResult, PaperScale, Recipe, best, final
from landscape.refs import Ref
from landscape.verdict import all_of, greater

SOURCE = "Watson et al. 2023, Fig. 5"
_COMMON = dict(model="lenet", data="digits", lr=0.03, dp_lrs=(0.1, 0.2, 0.5), batch_size=32, max_grad_norm=1.0, seed=0)
SCALES = {
    "test": {**_COMMON, "subset": 200, "epochs": 2, "ks": (1,), "copies": 3, "epsilons": (8.0,), "points": 5,
             "dp_lrs": (0.5,)},
    "cpu": {**_COMMON, "subset": None, "epochs": 8, "ks": (1, 2, 4), "copies": 3, "epsilons": (1.0, 4.0, 8.0),
            "points": 20},
    # Sec. 4.1: Resnet18 (GroupNorm for DP) on CIFAR10, C = 1, 30 alphas; lr and batch size are not stated in
    # the main text (assumed here), k up to the run length.
    "paper": {**_COMMON, "model": "resnet18", "data": "cifar10", "subset": None, "lr": 0.1, "batch_size": 128,
              "epochs": 20, "ks": (1, 3, 5, 10, 15), "copies": 3, "epsilons": (1.0, 5.0, 50.0), "points": 30},
}


def _group(ctx, eps: float, k: int, lr: float) -> str:
    return f"{ctx.name}-{ctx.scale}-e{eps:g}-k{k}-lr{lr:g}"


def _sgd_group(ctx, k: int, lr: float) -> str:
    return f"{ctx.name}-{ctx.scale}-sgd-k{k}-lr{lr:g}"


def _groups(ctx, lr_of: dict) -> list[tuple[float, int, str]]:
    """(epsilon, k, group name): DP siblings are trained once per (k, epsilon) at the epsilon's chosen DP lr
    ``lr_of[eps]``; that group's Phase-1 SGD run is also the parent of the SGD siblings at that lr (see
    :func:`_sgd_siblings`)."""
    s = ctx.settings
    return [(float(eps), int(k), _group(ctx, float(eps), int(k), lr_of[float(eps)]))
            for eps in s["epsilons"] for k in s["ks"]]


def _sgd_siblings(ctx, config, parent: str, group: str) -> None:
    """The SGD-sibling reference at a matched lr: ``config.copies`` Phase-2 SGD copies from ``parent`` (a DP group's
    Phase-1 SGD run) at ``config.dp_lr`` / ``config.dp_momentum`` and the DP batch size, named and labelled as
    ``landscape phases`` names its copies (``GROUP-sgd-sgd-i``, seed ``seed + 1 + i``) so that they pair as
    siblings; existing runs are reused."""
    from landscape.api.training import ensure
    from landscape.store import Store

    store = Store(ctx.root)
    base = dataclasses.replace(config.base, lr=config.dp_lr, momentum=config.dp_momentum)
    matched = dataclasses.replace(config, base=base)
    label = {"group": group, "k": config.k, "epsilon_target": None, "noise_multiplier": None, "phase1": "sgd",
             "phase2": "sgd"}
    for i in range(config.copies):
        cfg = matched.phase_config("sgd", epochs=base.epochs - config.k, seed=base.seed + 1 + i,
                                   from_ref=f"{parent}@last", run=f"{group}-sgd-sgd-{i}")
        ensure(store, cfg, {**label, "copy": i}, progress=False)


def make(ctx):
    from landscape.api import InterpolateConfig, PhasesConfig, TrainConfig, instability, phases
    from landscape.plots import style
    from landscape.store import Store

    s = ctx.settings
    sgd, dp = {}, {}   # (eps, k) -> [chord barriers] (SGD: the reference at eps's DP lr)
    sgd23, dp23 = {}, {}  # the same for Def. 2.3 instability
    ends: dict = {}      # ("sgd" or "dpsgd", (eps, k)) -> the run names at the pairs' ends

    def base_of(eps):
        return TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["epochs"], lr=s["lr"],
                           batch_size=s["batch_size"], seed=s["seed"], max_grad_norm=s["max_grad_norm"],
                           target_epsilon=eps, checkpoint_every="none", data_root=ctx.data_root)

    lr_of, scores = {}, {}  # claim-blind DP lr per epsilon (see the module docstring)
    k0 = int(min(s["ks"]))
    for eps in map(float, s["epsilons"]):
        scores[eps] = []
        for lr in s["dp_lrs"]:
            group = _group(ctx, eps, k0, lr)
            phases(PhasesConfig(base=base_of(eps), k=k0, copies=1, phase1=("sgd",), phase2=("dpsgd",), dp_lr=lr,
                                dp_momentum=0.0, group=group), root=ctx.root, progress=False)
            scores[eps].append(final(Store(ctx.root).run(f"{group}-sgd-dpsgd-0"), "train_acc"))
        lr_of[eps] = best(s["dp_lrs"], scores[eps])
    sgd_done: dict = {}  # (k, lr) -> the SGD-sibling rows (chord, Def. 2.3, end runs), shared by epsilons
    for eps, k, group in _groups(ctx, lr_of):
        config = PhasesConfig(base=base_of(eps), k=k, copies=s["copies"], phase1=("sgd",), phase2=("dpsgd",),
                              dp_lr=lr_of[eps], dp_momentum=0.0, group=group)
        phases(config, root=ctx.root, progress=False)
        groups = [group]
        if (k, lr_of[eps]) not in sgd_done:
            sgd_group = _sgd_group(ctx, k, lr_of[eps])
            _sgd_siblings(ctx, config, f"{group}-sgd", sgd_group)
            groups.append(sgd_group)
        for g in groups:
            table = instability([f"{g}-*"], pairs="siblings", root=ctx.root, workers=ctx.workers,
                                config=InterpolateConfig(points=s["points"], split=("test",)),
                                output=ctx.stem(f"instability-e{eps:g}-k{k}" if g == group else
                                                f"instability-sgd-k{k}-lr{lr_of[eps]:g}".replace(".", "_")).with_suffix(".h5"),
                                data_root=ctx.data_root)
            rows = [(r.phase2, float(r.chord_barrier_loss["test"]), float(r.instability_loss["test"]),
                     [r.ref_a, r.ref_b]) for r in table.rows if r.phase2 in ("sgd", "dpsgd")]
            if g != group:
                sgd_done[(k, lr_of[eps])] = [r for r in rows if r[0] == "sgd"]
            for _, chord_value, def23_value, refs in (r for r in rows if r[0] == "dpsgd"):
                dp.setdefault((eps, k), []).append(chord_value)
                dp23.setdefault((eps, k), []).append(def23_value)
                ends.setdefault(("dpsgd", (eps, k)), []).extend(refs)
        for _, chord_value, def23_value, refs in sgd_done[(k, lr_of[eps])]:
            sgd.setdefault((eps, k), []).append(chord_value)
            sgd23.setdefault((eps, k), []).append(def23_value)
            ends.setdefault(("sgd", (eps, k)), []).extend(refs)
    ks = sorted({k for _, k in sgd})
    eps_list = sorted({e for e, _ in sgd})
    corner = (eps_list[-1], ks[-1]) if len(ks) > 1 and len(eps_list) > 1 else None

    def part(e, k):
        v = greater(f"DP-SGD (eps {e:g}) siblings are separated by a higher barrier than SGD siblings at k = {k} "
                    f"(matched lr {lr_of[e]:g})", SOURCE, dp.get((e, k), []), sgd.get((e, k), []),
                    names=(f"DP eps {e:g}", f"SGD lr {lr_of[e]:g}"),
                    unit="sibling pairs", note=f"Def. 2.3 beside it: DP {np.mean(dp23.get((e, k), [np.nan])):.3g}, "
                                               f"SGD {np.mean(sgd23.get((e, k), [np.nan])):.3g}. DP lr {lr_of[e]:g} "
                                               f"(claim-blind over {tuple(s['dp_lrs'])}), SGD siblings' Phase 2 "
                                               "at the same lr, batch and momentum.")
        return ctx.judged(v, ends.get(("dpsgd", (e, k)), []) + ends.get(("sgd", (e, k)), []))

    parts = [part(e, k) for e in eps_list for k in ks if (e, k) != corner]
    exception = part(*corner) if corner else None
    note = grid.BARRIER + " " + " | ".join(p.line() for p in parts)
    if exception is not None:
        note += (f" || Exception (the paper: 'except perhaps for high values of both k and epsilon'; separate, not "
                 f"required): {exception.line()}")
    verdict = all_of("DP-SGD siblings almost never end in the same linear basin: a higher barrier than SGD siblings "
                     "at every k and epsilon except perhaps the largest of both", SOURCE, parts, note=note)
    n = s["copies"] * (s["copies"] - 1) // 2

    def table_of(values):
        a = np.full(n, math.nan)
        a[:len(values)] = values[:n]
        return a

    numbers = {"k": ks, "epsilon": eps_list, "sgd": [[table_of(sgd[(e, k)]) for k in ks] for e in eps_list],
               "dp": [[table_of(dp.get((e, k), [])) for k in ks] for e in eps_list],
               "sgd_instability": [[table_of(sgd23[(e, k)]) for k in ks] for e in eps_list],
               "dp_instability": [[table_of(dp23.get((e, k), [])) for k in ks] for e in eps_list],
               "lr_grid/dp_lr": list(s["dp_lrs"]), "lr_grid/train_acc": [scores[e] for e in eps_list],
               "lr_chosen": [lr_of[e] for e in eps_list], "sgd_lr": [lr_of[e] for e in eps_list]}
    def failing(family):  # the epsilons whose DP siblings / SGD reference have an end model failing the gate
        return {e for e in eps_list for k in ks for r in ends.get((family, (e, k)), [])
                if not ctx.gates.get(Ref.parse(r).name, GateResult("", 0, 0, 0, True)).passed}

    invalid, invalid_sgd = failing("dpsgd"), failing("sgd")
    fig, axes = style.subplots(1, 2, figsize=(8.0, 3.3), sharex=True, layout="constrained")
    # one SGD reference per distinct matched lr (epsilons sharing an lr share it), then the DP series
    ref_of = {lr: eps_list.index(next(e for e in eps_list if lr_of[e] == lr)) for lr in dict.fromkeys(
        lr_of[e] for e in eps_list)}
    series = style.series_styles(len(ref_of) + len(eps_list))
    for ax, (key_sgd, key_dp, what) in zip(axes, (("sgd", "dp", "barrier above the chord"),
                                                   ("sgd_instability", "dp_instability", "Def. 2.3 instability")),
                                           strict=True):
        rows = [np.asarray(numbers[key_sgd][i]) for i in ref_of.values()] + [np.asarray(r) for r in numbers[key_dp]]
        labels = [f"SGD lr {lr:g} (" + ", ".join(f"eps {e:g}" for e in eps_list if lr_of[e] == lr) + ")"
                  + (" (invalid regime)" if eps_list[i] in invalid_sgd else "") for lr, i in ref_of.items()]
        labels += [f"DP-SGD eps {e:g}, lr {lr_of[e]:g}" + (" (invalid regime)" if e in invalid else "")
                   for e in eps_list]
        for a, label, st in zip(rows, labels, series, strict=True):
            m = np.nanmean(a, axis=1)
            sd = np.nanstd(a, axis=1, ddof=1) if n > 1 else np.zeros_like(m)
            ax.errorbar(ks, m, yerr=sd, capsize=3, label=label, **st)
        ax.set(xlabel="Phase-1 SGD epochs k", ylabel=f"{what} (test loss)")
    axes[0].set_title(f"judged: {verdict.status}")
    axes[1].set_title("reported beside it")
    style.panel_labels(axes)
    axes[0].legend(fontsize=7)
    figures = style.save_figure(fig, ctx.stem("figure"))
    return numbers, verdict, figures


RECIPE = Recipe(
    name="watson-fig5", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 5",
    claim="two runs of DP-SGD almost never end in the same linear basin (a higher barrier than SGD siblings), except "
          "perhaps for high values of both k and epsilon",
    scaled_down="LeNet on digits, 8 epochs, k in {1,2,4}, 3 copies (3 sibling pairs) per point, DP lr per epsilon "
                "claim-blind from {0.1, 0.2, 0.5}, SGD siblings' Phase 2 at the same lr, batch and momentum (matched lr per "
                "epsilon); judged on the barrier above the chord",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=20,
                           hyper="C=1, eps in {1,5,50} (Fig. 5 b-d), delta 1e-5, 30 alphas; lr 0.1 / batch 128 "
                                 "assumed",
                           gpu_hours=60.0),
    make=make,
)
