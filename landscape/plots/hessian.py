"""Figures of ``landscape hessian``: sharpness (top eigenvalue, trace) against epoch with every run on one
figure (SGD and DP-SGD in their house colours), and the spectral densities (Ghorbani et al. 2019, Fig. 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from landscape.plots.style import method_color, save_figure, styled, subplots, titled
from landscape.refs import Ref
from landscape.spectral import broadened_density, density_grid

MAX_DENSITIES = 6
STYLES = ("o-", "s--", "^-.", "d:")


def runs(result) -> dict[str, list[int]]:
    """Row indices grouped by run (a loose checkpoint is its own run), each run's in epoch order."""
    out: dict[str, list[int]] = {}
    for c, row in enumerate(result.rows):
        out.setdefault(row.run or Ref.parse(row.ref).name, []).append(c)
    return {k: sorted(v, key=lambda c: (result.rows[c].epoch, result.rows[c].step)) for k, v in out.items()}


def _label(result, name: str, idx: list[int]) -> str:
    opt = result.rows[idx[0]].optimizer
    return f"{name} ({opt})" if opt and opt != name else name


@styled
def plot_sharpness(result, stem, title: str = "") -> list[Path]:
    """Top eigenvalue and trace (+-2 standard errors) against epoch, one line per run."""
    panels = [p for p, on in (("eig", result.config.top_k > 0), ("trace", result.config.trace)) if on]
    fig, axes = subplots(1, len(panels), figsize=(4.8 * len(panels), 3.4), squeeze=False)
    ax_of = dict(zip(panels, axes[0], strict=True))
    for i, (name, idx) in enumerate(runs(result).items()):
        color, style, label = method_color(result.rows[idx[0]].optimizer), STYLES[i % len(STYLES)], _label(result, name, idx)
        epochs = np.array([result.rows[c].epoch for c in idx])
        if "eig" in ax_of:
            ax_of["eig"].plot(epochs, result.eigenvalues[idx, 0], style, color=color, label=label)
        if "trace" in ax_of:
            tr = np.array([result.rows[c].trace for c in idx])
            se = np.array([result.rows[c].trace_se for c in idx])
            ax_of["trace"].plot(epochs, tr, style, color=color, label=label)
            ax_of["trace"].fill_between(epochs, tr - 2 * se, tr + 2 * se, color=color, alpha=0.2, linewidth=0)
    if "eig" in ax_of:
        ax_of["eig"].set_ylabel("top Hessian eigenvalue $\\lambda_1$")
    if "trace" in ax_of:
        ax_of["trace"].set_ylabel("Hessian trace (Hutchinson, $\\pm 2$ s.e.)")
    for ax in ax_of.values():
        ax.set_xlabel("epoch")
        ax.legend()
    return save_figure(titled(fig, title or f"sharpness on {result.config.subset} {result.config.split} examples "
                              f"(seed {result.config.subset_seed})"), stem)


@styled
def plot_density(result, stem, title: str = "") -> list[Path]:
    """Spectral densities of each run's last checkpoint, or along the run when there is one."""
    groups = runs(result)
    if len(groups) == 1:
        idx = next(iter(groups.values()))
        keep = np.unique(np.round(np.linspace(0, len(idx) - 1, min(MAX_DENSITIES, len(idx)))).astype(int))
        picked = [(f"epoch {result.rows[idx[i]].epoch:g}", idx[i], None) for i in keep]
    else:
        picked = [(_label(result, name, idx), idx[-1], method_color(result.rows[idx[-1]].optimizer))
                  for name, idx in groups.items()]
    # one grid and one Gaussian width for all curves, so that their shapes compare
    rows = [c for _, c, _ in picked]
    grid, sigma = density_grid(result.density_nodes[rows], result.config.sigma)
    curves = [broadened_density(grid, result.density_nodes[c], result.density_weights[c], sigma) for c in rows]
    top = max(float(d.max()) for d in curves)
    fig, ax = subplots(figsize=(5.5, 3.4))
    for (label, _, color), density in zip(picked, curves, strict=True):
        ax.semilogy(grid, np.maximum(density, top * 1e-12), color=color, label=label)
    ax.set_ylim(top * 1e-7, top * 3)
    ax.set(xlabel="eigenvalue", ylabel=f"density (SLQ, Gaussian width {sigma:.3g})")
    ax.set_title(title or "Hessian spectral density")
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, stem)


def plot_hessian(result, path, title: str = "") -> list[Path]:
    """``<stem>-sharpness`` (when eigenvalues or the trace were computed) and ``<stem>-density`` (when asked)."""
    stem = Path(path).with_suffix("")
    files: list[Path] = []
    if result.config.top_k or result.config.trace:
        files += plot_sharpness(result, stem.with_name(f"{stem.name}-sharpness"), title)
    if result.config.density:
        files += plot_density(result, stem.with_name(f"{stem.name}-density"), title)
    return files
