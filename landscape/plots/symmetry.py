"""Figures of ``landscape symmetry``: projected gradient deviations per checkpoint (Zhu & Blaschko Figs. 6-9)
and the symmetry statistics against epoch."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.colors import LogNorm

from landscape.plots.style import PALETTE, save_figure, styled, subplots, titled

MAX_PANELS = 8


@styled
def plot_deviations(result, stem) -> list[Path]:
    """Scatter (top) and density (bottom) of the 2-D projected deviations, one column per checkpoint."""
    rows = result.rows
    if len(rows) > MAX_PANELS:  # evenly spread, first and last included
        rows = [rows[i] for i in np.unique(np.round(np.linspace(0, len(rows) - 1, MAX_PANELS)).astype(int))]
    k = len(rows)
    fig, axes = subplots(2, k, figsize=(2.6 * k, 5.2), squeeze=False)
    for j, row in enumerate(rows):
        pts = row.stats.plane
        lim = float(np.quantile(np.abs(pts), 0.99)) * 1.1 or 1.0
        ax = axes[0, j]
        ax.scatter(pts[:, 0], pts[:, 1], s=3, alpha=0.5, color=PALETTE[0], linewidths=0)
        ax.scatter(-pts[:, 0], -pts[:, 1], s=3, alpha=0.25, color=PALETTE[1], linewidths=0)
        ax.set_title(f"epoch {row.epoch:g}\nH={row.stats.energy_coefficient:.3f}, p={row.stats.p_value:.3g}",
                     fontsize=8)
        ax2 = axes[1, j]
        ax2.hist2d(pts[:, 0], pts[:, 1], bins=40, range=[[-lim, lim], [-lim, lim]], cmap="viridis", cmin=1,
                   norm=LogNorm())
        ax2.set_title(f"|skew| mean {row.stats.mean_abs_skew:.2f}", fontsize=8)
        for a in (ax, ax2):
            a.set(xlim=(-lim, lim), ylim=(-lim, lim))
            a.set_aspect("equal")
            a.axhline(0, color="#999999", lw=0.5)
            a.axvline(0, color="#999999", lw=0.5)
            a.tick_params(labelsize=6)
            a.grid(False)
    axes[0, 0].set_ylabel("xi (blue), -xi (orange)")
    axes[1, 0].set_ylabel("density of xi (log colour)")
    return save_figure(titled(fig, "gradient deviations xi_i = g_i - g_bar, random 2-D projection "
                              "(same matrix for all panels)"), stem)


@styled
def plot_statistics(result, stem) -> list[Path]:
    """Energy coefficient (with p-value) and skewness of the deviations against epoch."""
    epochs = np.array([r.epoch for r in result.rows])
    order = np.argsort(epochs)
    epochs = epochs[order]
    h, p, mean_skew, max_skew = (np.array([getattr(r.stats, k) for r in result.rows])[order]
                                 for k in ("energy_coefficient", "p_value", "mean_abs_skew", "max_abs_skew"))
    fig, axes = subplots(1, 2, figsize=(9, 3.2))
    ax = axes[0]
    ax.plot(epochs, h, "o-", color=PALETTE[0], label="energy coefficient H(xi, -xi)")
    ax.set(xlabel="epoch", ylabel="H (0 = symmetric)")
    ax_p = ax.twinx()
    ax_p.plot(epochs, p, "s--", color=PALETTE[1], ms=3, label="permutation p-value")
    ax_p.set_ylim(0, 1.05)
    ax_p.set_ylabel("p-value")
    ax_p.grid(False)
    lines = ax.get_lines() + ax_p.get_lines()
    ax.legend(lines, [line.get_label() for line in lines])
    ax = axes[1]
    if not np.isnan(mean_skew).all():
        ax.plot(epochs, mean_skew, "o-", color=PALETTE[2], label="mean |skewness|")
        ax.plot(epochs, max_skew, "s--", color=PALETTE[3], label="max |skewness|")
        n = result.rows[0].stats.plane.shape[0]
        ax.axhline(math.sqrt(6 / n), color="#888888", ls=":", lw=0.8, label="sd under symmetry ~ sqrt(6/n)")
        ax.legend()
    ax.set(xlabel="epoch", ylabel=f"skewness along {result.config.projections} random directions")
    fig.tight_layout()
    return save_figure(fig, stem)


def plot_symmetry(result, path, title: str = "") -> list[Path]:
    """``<stem>-deviations`` (grid over checkpoints) and ``<stem>-stats`` (statistics vs epoch)."""
    stem = Path(path).with_suffix("")
    files = plot_deviations(result, stem.with_name(f"{stem.name}-deviations"))
    files += plot_statistics(result, stem.with_name(f"{stem.name}-stats"))
    return files
