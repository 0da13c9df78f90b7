"""Figures of ``landscape hessian``: sharpness (top eigenvalue, trace) against epoch with every run on one
figure (SGD and DP-SGD in their house colours), and the spectral densities (Ghorbani et al. 2019, Fig. 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from landscape.plots.style import apply_style, method_color, save_figure

MAX_DENSITIES = 6


def runs(result) -> dict[str, list]:
    """Rows grouped by run (a loose checkpoint is its own run), each run's rows in epoch order."""
    out: dict[str, list] = {}
    for row in result.rows:
        out.setdefault(row.run or row.ref.split("@")[0], []).append(row)
    return {k: sorted(v, key=lambda r: (r.epoch, r.step)) for k, v in out.items()}


def _label(name: str, rows: list) -> str:
    opt = rows[0].optimizer
    return f"{name} ({opt})" if opt else name


def plot_sharpness(result, stem) -> list[Path]:
    """Top eigenvalue (left) and, when estimated, the trace with +-2 standard errors (right) against epoch."""
    import matplotlib.pyplot as plt

    apply_style()
    groups = runs(result)
    with_trace = bool(result.config.trace)
    fig, axes = plt.subplots(1, 2 if with_trace else 1, figsize=(9 if with_trace else 5, 3.4), squeeze=False)
    styles = ("o-", "s--", "^-.", "d:")
    for i, (name, rows) in enumerate(groups.items()):
        color = method_color(rows[0].optimizer)
        style = styles[i % len(styles)]
        epochs = np.array([r.epoch for r in rows])
        if result.config.top_k:
            axes[0, 0].plot(epochs, [r.top_eigenvalue for r in rows], style, color=color, label=_label(name, rows))
        if with_trace:
            tr = np.array([r.trace for r in rows])
            se = np.array([r.trace_se for r in rows])
            ax = axes[0, 1]
            ax.plot(epochs, tr, style, color=color, label=_label(name, rows))
            ax.fill_between(epochs, tr - 2 * se, tr + 2 * se, color=color, alpha=0.2, linewidth=0)
    axes[0, 0].set_ylabel("top Hessian eigenvalue $\\lambda_1$")
    axes[0, 0].set_title(f"sharpness on {result.config.n} {result.config.split} examples")
    if with_trace:
        axes[0, 1].set_ylabel("trace (Hutchinson, $\\pm 2$ s.e.)")
    for ax in axes[0]:
        ax.set_xlabel("epoch")
        ax.legend()
    fig.tight_layout()
    return save_figure(fig, stem)


def plot_density(result, stem) -> list[Path]:
    """Spectral densities (log scale) of each run's last checkpoint, or of up to :data:`MAX_DENSITIES`
    checkpoints when there is one run."""
    import matplotlib.pyplot as plt

    apply_style()
    groups = runs(result)
    if len(groups) == 1:
        rows = next(iter(groups.values()))
        idx = np.unique(np.round(np.linspace(0, len(rows) - 1, min(MAX_DENSITIES, len(rows)))).astype(int))
        picked = [(f"epoch {rows[i].epoch:g}", rows[i], None) for i in idx]
    else:
        picked = [(_label(name, rows), rows[-1], method_color(rows[-1].optimizer)) for name, rows in groups.items()]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for label, row, color in picked:
        floor = row.density.max() * 1e-8
        ax.semilogy(row.density_grid, np.maximum(row.density, floor), color=color, label=label)
    ax.set_xlabel("eigenvalue")
    ax.set_ylabel("density (SLQ, Gaussian broadening)")
    ax.set_title("Hessian spectral density")
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, stem)


def plot_hessian(result, path) -> list[Path]:
    """``<stem>-sharpness`` (when eigenvalues or the trace were computed) and ``<stem>-density`` (when asked)."""
    stem = Path(path).with_suffix("")
    files: list[Path] = []
    if result.config.top_k or result.config.trace:
        files += plot_sharpness(result, stem.with_name(f"{stem.name}-sharpness"))
    if result.config.density:
        files += plot_density(result, stem.with_name(f"{stem.name}-density"))
    return files
