"""Figures of ``landscape clipping``: R and the Thm. 3.2 bound against epoch, pruning level or layer."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from landscape.plots.style import PALETTE, save_figure, styled, subplots, titled


@styled
def plot_clipping(result, stem, title: str = "") -> list[Path]:
    """One figure: against pruning level (Watson Fig. 11), against epoch, or per layer."""
    levels = np.array([r.prune_level for r in result.rows])
    if not np.isnan(levels).all():
        return _against(result, levels, "fraction of weights pruned", stem, title="R vs pruning (Watson Fig. 11)")
    if len(result.rows) > 1:
        return _against(result, np.array([r.epoch for r in result.rows]), "epoch", stem, title="clipping geometry")
    return _single(result, stem)


def _against(result, x, xlabel: str, stem, *, title: str) -> list[Path]:
    fig, axes = subplots(1, 3, figsize=(12, 3.4))
    order = np.argsort(x)
    x = x[order]
    col = {name: result.column(name)[order] for name in ("R", "projection", "bound", "fraction_clipped",
                                                        "cos_clipped_mean")}
    batch_r = np.array([[b.R for b in r.batches] for r in result.rows])[order]
    ax = axes[0]
    ax.plot(x, col["R"], "o-", color=PALETTE[0], label="R (all samples)")
    if batch_r.shape[1] > 1:
        ax.errorbar(x, batch_r.mean(1), yerr=batch_r.std(1), fmt="s--", color=PALETTE[1], ms=3,
                    label="R per batch (mean ± sd)")
    else:
        ax.plot(x, batch_r[:, 0], "s--", color=PALETTE[1], ms=3, label="R per batch")
    if np.all(col["R"] > 0) and np.isfinite(col["R"]).all():
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("R = Tr Cov / ||g_bar||^2")
    ax.legend()
    ax = axes[1]
    c = result.config.max_grad_norm
    ax.plot(x, col["projection"], "o-", color=PALETTE[0], label="c · g_bar/||g_bar||")
    ax.plot(x, col["bound"], "s--", color=PALETTE[1], label="C (1 - R/2)")
    ax.axhline(c, color="#888888", lw=0.8, ls=":", label="C")
    held = np.array([r.total.assumption_held for r in result.rows])[order]
    if (~held).any():
        ax.scatter(x[~held], col["projection"][~held], marker="x", color="k", zorder=5,
                   label="assumption ||g_i|| >= C fails")
    finite = col["bound"][np.isfinite(col["bound"])]
    if finite.size:
        low = min(np.nanmin(col["projection"]), max(finite.min(), -2 * c))
        ax.set_ylim(low - 0.05 * c, 1.1 * c)
        if (col["bound"] < low - 0.05 * c).any():
            ax.text(0.02, 0.02, f"bound below the axis where off-scale (min {np.nanmin(col['bound']):.3g})",
                    transform=ax.transAxes, fontsize=7, color=PALETTE[1])
    ax.set(xlabel=xlabel, ylabel="projection of clipped mean")
    ax.legend()
    ax = axes[2]
    ax.plot(x, col["fraction_clipped"], "o-", color=PALETTE[2], label="fraction clipped")
    ax.plot(x, col["cos_clipped_mean"], "s-", color=PALETTE[3], label="cos(c, g_bar)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel(xlabel)
    ax.legend()
    return save_figure(titled(fig, f"{title}: C = {c:g}, {result.config.clip_style} clipping, "
                              f"{result.config.batches} x {result.config.batch_size} samples"), stem)


def _single(result, stem) -> list[Path]:
    row = result.rows[0]
    t = row.total
    names = result.layer_names
    fig, axes = subplots(1, 2, figsize=(max(8, 0.35 * len(names) + 4), 3.6),
                             gridspec_kw={"width_ratios": [3, 1]})
    ax = axes[0]
    pos = np.arange(len(names))
    ax.bar(pos, t.layer_R, color=PALETTE[0])
    ax.axhline(t.R, color=PALETTE[1], ls="--", label=f"flat R = {t.R:.3g}")
    ax.set_xticks(pos, names, rotation=90, fontsize=6)
    if np.all(t.layer_R > 0) and np.isfinite(t.layer_R).all():
        ax.set_yscale("log")
    ax.set_ylabel("R per layer")
    ax.legend(loc="upper left")
    if result.config.clip_style == "layerwise":  # each layer is clipped to C_l: its own fraction and assumption
        twin = ax.twinx()
        twin.plot(pos, t.layer_fraction_clipped, "o", color=PALETTE[2], ms=4, label="fraction clipped (||g_il|| > C_l)")
        failed = ~np.asarray(t.layer_assumption_held, bool)
        if failed.any():
            twin.plot(pos[failed], np.asarray(t.layer_fraction_clipped)[failed], "x", color="k", ms=6,
                      label="assumption ||g_il|| >= C_l fails")
        twin.set_ylim(-0.05, 1.05)
        twin.set_ylabel("fraction clipped per layer")
        twin.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=7, frameon=False)
    else:
        ax.set_title("flat clipping scales whole gradients: per-layer R only (no per-layer clipping counts)",
                     fontsize=8)
    ax = axes[1]
    values = [t.projection, t.bound, result.config.max_grad_norm]
    ax.bar([0, 1, 2], values, color=[PALETTE[0], PALETTE[1], "#888888"])
    ax.set_xticks([0, 1, 2], ["c·ĝ", "C(1-R/2)", "C"])
    flag = "held" if t.assumption_held else "FAILED"
    ax.set_title(f"assumption {flag}, bound {'held' if t.bound_held else 'violated'}", fontsize=8)
    if math.isfinite(t.bound) and t.bound < -2 * result.config.max_grad_norm:
        ax.set_ylim(-2 * result.config.max_grad_norm, 1.2 * result.config.max_grad_norm)
    return save_figure(titled(fig, f"{row.ref}: R = {t.R:.3g}, fraction clipped {t.fraction_clipped:.2f}"), stem)
