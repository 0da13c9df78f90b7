"""Figures of the empirical NTK under clipping: spectra, heatmaps of K and of A - A^T (Bu et al. Thm. 1:
clipping breaks symmetry), and the numbers behind the measured Table 1."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from landscape.analyze.ntk import NTKResult
from landscape.analyze.ntk_table import NTKTable
from landscape.plots.style import PALETTE, save_figure, styled, subplots

STYLE_COLORS = {"none": "#000000", "flat": PALETTE[0], "layerwise": PALETTE[1]}


def _heatmap(ax, M: np.ndarray, title: str) -> None:
    """``M`` on a diverging colour map centred at zero."""
    v = float(np.abs(M).max()) or 1.0
    im = ax.imshow(M, cmap="RdBu_r", vmin=-v, vmax=v, interpolation="nearest")
    ax.set_title(title)
    ax.set(xlabel="j", ylabel="i")
    ax.grid(False)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)


@styled
def plot_ntk(result: NTKResult, stem: str | os.PathLike, title: str = "") -> list[Path]:
    """Spectra and heatmaps of one NTK result, written as ``stem.png`` and ``stem.pdf`` (the panels carry
    their own titles; ``title`` is the runner's and unused)."""
    fig, axes = subplots(1, 3, figsize=(14.0, 3.8))
    ax = axes[0]
    kp, p = result.K_properties, result.properties
    idx = np.arange(1, len(kp.sym_eigvals) + 1)
    ax.plot(idx, np.sort(kp.sym_eigvals)[::-1], color=STYLE_COLORS["none"], label="eig K")
    if result.config.clip_style != "none":
        color = STYLE_COLORS[result.config.clip_style]
        ax.plot(idx, np.sort(p.eigvals.real)[::-1], color=color, label="Re eig A")
        ax.plot(idx, np.sort(p.sym_eigvals)[::-1], color=color, ls="--", label="eig (A+A^T)/2")
        imag = np.abs(p.eigvals.imag)
        if imag.max() > 0:
            ax.plot(idx, np.sort(imag)[::-1], color=color, ls=":", label="|Im eig A|")
    positive = kp.sym_eigvals[kp.sym_eigvals > 1e-12 * max(kp.norm, 1e-300)]
    linthresh = 0.1 * positive.min() if positive.size else 1e-12
    ax.set_yscale("symlog", linthresh=max(linthresh, 1e-12 * max(kp.norm, p.norm, 1e-300)))
    ax.set(xlabel="index (sorted)", ylabel="eigenvalue")
    ax.set_title(f"spectra ({result.config.kernel}, clip {result.config.clip_style})")
    ax.legend()
    _heatmap(axes[1], result.K, "K")
    _heatmap(axes[2], result.A - result.A.T, f"A - A^T (asymmetry {p.asymmetry:.2g})")
    fig.tight_layout()
    return save_figure(fig, stem)


@styled
def plot_ntk_table(table: NTKTable, stem: str | os.PathLike, title: str = "") -> list[Path]:
    """The numbers behind Table 1 against the clipping norm (one step) or against epoch (several)."""
    steps = sorted({r.step for r in table.rows})
    along_run = len(steps) > 1
    panels = [("asymmetry", "asymmetry ||A-A^T||/||A||"), ("min_sym_eig", "min eig (A+A^T)/2 / ||A||"),
              ("min_real_eig", "min Re eig A / ||A||"), ("max_abs_imag_eig", "max |Im eig A| / ||A||"),
              ("fraction_clipped", "fraction clipped")]
    fig, axes = subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4))
    for ax, (col, label) in zip(axes, panels, strict=True):
        if along_run:
            for k, c in enumerate(table.config.max_grad_norms):
                for style in table.config.clip_styles:
                    rows = [r for r in table.rows if r.style == style and r.max_grad_norm == c]
                    rows.sort(key=lambda r: r.epoch)
                    ax.plot([r.epoch for r in rows], [_value(r, col) for r in rows],
                            color=STYLE_COLORS[style], alpha=0.35 + 0.65 * (k + 1) / len(table.config.max_grad_norms),
                            ls="-" if style == "flat" else "--", marker="o", label=f"{style} C={c:g}")
            ax.set_xlabel("epoch")
        else:
            for style in table.config.clip_styles:
                rows = sorted((r for r in table.rows if r.style == style), key=lambda r: r.max_grad_norm)
                ax.plot([r.max_grad_norm for r in rows], [_value(r, col) for r in rows], marker="o",
                        color=STYLE_COLORS[style], label=style)
            ax.set_xscale("log")
            ax.set_xlabel("clipping norm C")
        if col in ("min_sym_eig", "min_real_eig"):
            ax.axhline(0.0, color="#888888", lw=0.8)
        ax.set_title(label)
    axes[0].legend()
    fig.tight_layout()
    return save_figure(fig, stem)


def _value(row, col: str) -> float:
    v = getattr(row, col)
    if col in ("min_sym_eig", "min_real_eig", "max_abs_imag_eig"):
        return v / row.norm if row.norm > 0 else 0.0
    return v
