"""Watson et al. (2023), Figs. 6 and 7 (Sec. 4.1.3): a Phase-2 SGD model and a Phase-2 DP-SGD model trained
from the same Phase-1 model do not end in the same basin -- after an SGD Phase 1 "unless epsilon and k are large"
(Fig. 6), after a DP-SGD Phase 1 "always" (Fig. 7).

The design notes: docs/figures.md, "What each recipe measures" (watson-fig6-7).
"""

from __future__ import annotations

import numpy as np

from landscape.figures import _draw
from landscape.figures import _phase_grid as grid
from landscape.figures import watson_fig5 as fig5
from landscape.figures._selection import combine, judge_with_sensitivity
from landscape.figures.recipe import PaperScale, Recipe, eps_text
from landscape.verdict import all_of, greater

SOURCE = "Watson et al. 2023, Figs. 6-7, Sec. 4.1.3"
SCALES = {scale: {**settings, "sweep": fig5.SCALES[scale]}
          for scale, settings in grid.scales(paper={"k": 20, "epochs": 40, "target_epsilon": 5.0,
                                                    "noise_multiplier": None}).items()}


def evaluate(ctx, sweep, sel, setting: dict) -> tuple[dict, object]:
    from landscape.api import InterpolateConfig, instability

    floor = grid.min_height()
    ks, eps_list = sweep.ks, sweep.epsilons
    corner = (eps_list[-1], ks[-1]) if len(ks) > 1 and len(eps_list) > 1 else None
    sib = {k: sweep.siblings("sgd", k, sel.candidates[setting["sgd"]]) for k in ks}
    mixed = {(e, k): sweep.mixed(e, k, sel.candidates[setting["sgd"]], sel.candidates[setting[f"dp-e{e:g}"]])
             for e in eps_list for k in ks}

    def fig6(e, k):
        v = greater(f"after an SGD Phase 1 (k = {k}), Phase-2 SGD and DP-SGD (eps {e:g}) models are separated by a "
                    "higher barrier than Phase-2 SGD siblings", SOURCE, mixed[(e, k)]["height"], sib[k]["height"],
                    names=("SGD vs DP", "SGD siblings"), unit="pairs", min_effect=floor, pairs_b=sib[k]["units"],
                    note=f"chord barrier beside it: {np.mean(mixed[(e, k)]['chord']):.3g} vs "
                         f"{np.mean(sib[k]['chord']):.3g}.")
        return ctx.judged(v, grid.ends(mixed[(e, k)]["pairs"] + sib[k]["pairs"]))

    parts = [fig6(e, k) for e in eps_list for k in ks if (e, k) != corner]
    exception = fig6(*corner) if corner else None
    # Fig. 7: after a DP Phase 1, on the grid at the DP -> DP arm's candidate (its pairs need ONE Phase-1 model, so
    # with each arm at its own best both Phase-2 sides take that grid)
    g_sgd = g_dp = grid.grid_at(ctx, grid.arm(setting, sel, "dpsgd", "dpsgd"))
    copies = ctx.settings["grid"]["copies"]
    units = grid.sibling_pairs(copies)
    pairs7 = [f"{g_sgd['group']}-dpsgd-sgd-{i}:{g_dp['group']}-dpsgd-dpsgd-{i}" for i in range(copies)]
    sib7 = [f"{g_sgd['group']}-dpsgd-sgd-{i}:{g_sgd['group']}-dpsgd-sgd-{j}" for i, j in units]
    tag = g_dp["group"].replace(grid.PREFIX + "-", "").replace(".", "_")
    table = instability(pairs=",".join(pairs7 + sib7), root=ctx.root, workers=ctx.workers, figure=False,
                        config=InterpolateConfig(points=ctx.settings["points"], split=("test",)),
                        output=ctx.stem(f"fig7-{tag}").with_suffix(".h5"), data_root=ctx.data_root)
    b7 = grid.barriers_and_paths(table, pairs7 + sib7)
    n = len(pairs7)
    parts.append(ctx.judged(greater(
        "after a DP-SGD Phase 1, Phase-2 SGD and DP-SGD models are separated by a higher barrier than Phase-2 SGD "
        "siblings", SOURCE, b7["height"][:n], b7["height"][n:], names=("SGD vs DP", "SGD siblings"), unit="pairs",
        min_effect=floor, pairs_b=units, note=f"chord barrier beside it: {np.mean(b7['chord'][:n]):.3g} vs "
                                              f"{np.mean(b7['chord'][n:]):.3g}."), grid.ends(pairs7 + sib7)))
    note = grid.BARRIER
    if exception is not None:
        note += (" || Exception (the paper: 'unless epsilon and k are large'; separate, not required): "
                 f"{exception.line()}")
    verdict = all_of("Phase-2 SGD and Phase-2 DP-SGD from one Phase-1 model end in different basins (after an SGD "
                     "Phase 1 at every k and epsilon except perhaps the largest of both; after a DP Phase 1)", SOURCE,
                     parts, note=note)
    if ctx.role:
        return {}, verdict
    dp_runs = [r for v in mixed.values() for r in v["runs"][len(v["runs"]) // 2:]]
    m, lr = sel.candidates[setting["sgd"]]
    ctx.scope(f"one matched lr {lr:g} (the paper: SGD {grid.PAPER_LR['sgd']:g}, DP-SGD {grid.PAPER_LR['dpsgd']:g}), "
              f"momentum {m:g}", f"Fig. 6 {eps_text(dp_runs)} (sigma calibrated per k)",
              f"Fig. 7 on the grid (k = {ctx.settings['grid']['k']} of {ctx.settings['grid']['epochs']} epochs, "
              f"{eps_text(g_dp['phase2'][('dpsgd', 'dpsgd')])} for DP->DP)")
    numbers = {"k": ks, "epsilon": eps_list, "min_height": floor, "alpha": np.linspace(0, 1, ctx.settings["points"]),
               "verdict/exception_held": {True: 1.0, False: 0.0, None: np.nan}[exception.held] if exception else np.nan,
               "fig6/sgd_vs_dp/height": [[mixed[(e, k)]["height"] for k in ks] for e in eps_list],
               "fig6/sgd_vs_dp/chord": [[mixed[(e, k)]["chord"] for k in ks] for e in eps_list],
               "fig6/sgd_siblings/height": [sib[k]["height"] for k in ks],
               "fig6/sgd_siblings/chord": [sib[k]["chord"] for k in ks],
               "fig6/path_sgd_vs_dp": mixed[(eps_list[-1], ks[-1])]["paths"],
               "fig7/sgd_vs_dp/height": b7["height"][:n], "fig7/sgd_siblings/height": b7["height"][n:],
               "fig7/sgd_vs_dp/chord": b7["chord"][:n], "fig7/sgd_siblings/chord": b7["chord"][n:],
               "fig7/sgd_vs_dp/instability": b7["def23"][:n], "fig7/sgd_siblings/instability": b7["def23"][n:],
               "fig7/path_sgd_vs_dp": b7["paths"][:n], "fig7/path_sgd_siblings": b7["paths"][n:]}
    return numbers, verdict


def make(ctx):
    sweep = fig5.Sweep(ctx, ctx.settings["sweep"])
    sel = combine(grid.selection(ctx), sweep.selection())
    return judge_with_sensitivity(ctx, sel, lambda setting: evaluate(ctx, sweep, sel, setting))


def draw(d):
    from landscape.plots import style

    nb = d.numbers
    ks, eps = np.atleast_1d(nb["k"]), np.atleast_1d(nb["epsilon"])
    fig, axes = style.subplots(1, 3, figsize=(12.5, 3.8), layout="constrained")
    ax = axes[0]  # Fig. 6 judged: mean height per (eps, k), SGD siblings beside
    series = style.series_styles(1 + len(eps))
    total = 1 + len(eps)
    sib = np.atleast_2d(nb["fig6/sgd_siblings/height"])
    ax.errorbar(_draw.dodge(ks, 0, total, 0.3), sib.mean(axis=1), yerr=sib.std(axis=1, ddof=1) if sib.shape[1] > 1
                else None, capsize=3, label="SGD siblings", **series[0])
    mixed = np.asarray(nb["fig6/sgd_vs_dp/height"]).reshape(len(eps), len(ks), -1)
    for j, e in enumerate(eps):
        a = mixed[j]
        ax.errorbar(_draw.dodge(ks, j + 1, total, 0.3), a.mean(axis=1), yerr=a.std(axis=1, ddof=1) if a.shape[1] > 1
                    else None, capsize=3, label=f"SGD vs DP-SGD eps {e:g}", **series[j + 1])
    ax.axhline(float(nb["min_height"]), color="tab:red", ls="--", lw=0.8, label="minimum height")
    ax.set_xticks(ks)
    ax.set_xlim(ks.min() - 0.6, ks.max() + 0.6)
    ax.set(xlabel="Phase-1 SGD epochs k (series offset sideways)", ylabel="height above both ends (test loss)",
           title="Fig. 6 (SGD Phase 1): judged")
    ax.legend(fontsize=6, title="mean, bars: sd over pairs", title_fontsize=6)
    ax = axes[1]  # Fig. 7 paths
    for i, path in enumerate(np.atleast_2d(nb["fig7/path_sgd_vs_dp"])):
        ax.plot(nb["alpha"], path, color=style.method_color("dpsgd"), lw=1.4, label="SGD vs DP-SGD" if i == 0 else None)
    for i, path in enumerate(np.atleast_2d(nb["fig7/path_sgd_siblings"])):
        ax.plot(nb["alpha"], path, color=style.method_color("sgd"), lw=1.0, ls="--",
                label="SGD vs SGD sibling" if i == 0 else None)
    ax.set(xlabel="alpha (0: Phase-2 SGD, 1: other)", ylabel="test loss", title="Fig. 7 (DP Phase 1): paths")
    ax.legend(fontsize=7)
    ax = axes[2]  # Fig. 7 judged
    for j, (key, label, color) in enumerate((("fig7/sgd_vs_dp/height", "SGD vs DP", style.method_color("dpsgd")),
                                             ("fig7/sgd_siblings/height", "SGD siblings", style.method_color("sgd")))):
        v = np.atleast_1d(nb[key])
        ax.plot(np.full(v.size, j) + np.linspace(-0.15, 0.15, v.size), v, ls="none", marker="o", color=color,
                label=f"{label} (one pair each)")
    ax.axhline(float(nb["min_height"]), color="tab:red", ls="--", lw=0.8, label="minimum height")
    ax.set_xticks([0, 1], ["SGD vs DP", "SGD siblings"])
    ax.set_xlim(-0.6, 1.6)
    ax.set(ylabel="height above both ends", title="Fig. 7: judged")
    ax.legend(fontsize=7)
    return _draw.finish(fig, d, f"Figs. 6-7 ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="watson-fig6-7", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Figs. 6-7",
    claim="a Phase-2 SGD and a Phase-2 DP-SGD model from one Phase-1 model end in different basins (after an SGD "
          "Phase 1 unless epsilon and k are large; after a DP Phase 1 always)",
    scaled_down="Fig. 6 on the watson-fig5 runs (LeNet on digits, 8 epochs, k in {1,2,4}, eps in {1,8} calibrated "
                "per k, 3 copies), the corner of largest k and eps reported as the exception; Fig. 7 on the "
                "watson-fig2 grid (10 epochs, k = 4, 5 copies, epsilon 7); one matched lr and momentum selected on a "
                "validation split; barrier = height above both ends, minimum 2% of ln C",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=40,
                           hyper="the paper panels k = 20 and epsilon 5; one lr for both from the paper's sweep, "
                                 "batch 128, no momentum",
                           gpu_hours=75.0),
    make=make,
    draw=draw,
)
