"""Figures of a 2-D loss surface (Li et al. 2018): contour lines, filled contours and an optional 3-D view.
Arrays are stored ``[x, y]``; matplotlib wants ``[y, x]``, so they are transposed here and only here."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from landscape.plots.style import PALETTE, new_figure, save_figure, styled, subplots

N_LEVELS = 20


def plot_surface(result, stem: str | Path, *, three_d: bool = False, title: str | None = None) -> list[Path]:
    """Write ``<stem>-contour``, ``<stem>-filled`` (and ``<stem>-3d``) as PNG + PDF; return the paths."""
    stem = Path(stem)
    paths = save_figure(contour_figure(result, filled=False, title=title), stem.with_name(stem.name + "-contour"))
    paths += save_figure(contour_figure(result, filled=True, title=title), stem.with_name(stem.name + "-filled"))
    if three_d:
        paths += save_figure(surface_3d_figure(result, title=title), stem.with_name(stem.name + "-3d"))
    return paths


def _levels(z: np.ndarray) -> tuple[np.ndarray, bool]:
    finite = z[np.isfinite(z)]
    if finite.size == 0:
        return np.linspace(0, 1, N_LEVELS), False
    lo, hi = float(finite.min()), float(finite.max())
    if hi <= lo:
        hi = lo + 1e-6 * max(abs(lo), 1.0)
    if lo > 0 and hi / lo > 10:
        return np.geomspace(lo, hi, N_LEVELS), True
    return np.linspace(lo, hi, N_LEVELS), False


@styled
def contour_figure(result, *, filled: bool, title: str | None = None):
    """One panel per split of the loss, and below it one row per metric column: contour lines or filled
    ones."""
    from matplotlib.colors import LogNorm

    splits = result.splits
    rows = [("loss", result.values)] + [(col, {f"{s}_{col}": v for s, v in by_split.items()})
                                        for col, by_split in getattr(result, "point_metrics", {}).items()]
    fig, axes = subplots(len(rows), len(splits), figsize=(5.2 * len(splits), 4.0 * len(rows)), squeeze=False,
                         layout="constrained")
    xg, yg = np.meshgrid(result.xcoordinates, result.ycoordinates)  # (ny, nx)
    for (what, grids), panels in zip(rows, axes, strict=True):
        for ax, split in zip(panels, splits, strict=True):
            z = np.asarray(grids[f"{split}_{what}"], dtype=np.float64).T  # [x, y] -> [y, x]
            zm = np.ma.masked_invalid(z)
            levels, log = _levels(z)
            norm = LogNorm(vmin=levels[0], vmax=levels[-1]) if log else None
            if filled:
                cs = ax.contourf(xg, yg, zm, levels=levels, cmap="viridis", norm=norm)
                fig.colorbar(cs, ax=ax, label=f"{split} {what}", format="%.3g", ticks=levels[::3])
            else:
                cs = ax.contour(xg, yg, zm, levels=levels, cmap="viridis", norm=norm, linewidths=0.9)
                ax.clabel(cs, cs.levels[::4], inline=True, fontsize=6, fmt="%.3g")
            if result.trajectory is not None:
                tr = np.asarray(result.trajectory)
                ax.plot(tr[:, 0], tr[:, 1], "-o", color=PALETTE[1], markersize=3, linewidth=1.2, label="trajectory")
                ax.plot(tr[0, 0], tr[0, 1], "s", color=PALETTE[1], markersize=6, label="first checkpoint")
            for name, (mx, my) in result.markers.items():
                ax.plot(mx, my, "*", color=PALETTE[7], markersize=9)
                ax.annotate(name, (mx, my), textcoords="offset points", xytext=(4, 4), fontsize=7)
            ax.set(xlabel=result.xlabel, ylabel=result.ylabel)
            ax.set_title(f"{split} {what}" + (f"\n{title}" if title else ""))
            ax.grid(False)
    return fig


@styled
def surface_3d_figure(result, *, title: str | None = None):
    """The first split's loss as a 3-D surface (log10 when it spans more than an order of magnitude)."""
    split = result.splits[0]
    z = np.asarray(result.values[f"{split}_loss"], dtype=np.float64).T
    _, log = _levels(z)
    zz = np.log10(z) if log else z
    xg, yg = np.meshgrid(result.xcoordinates, result.ycoordinates)
    fig = new_figure(figsize=(5.4, 4.4))
    ax = fig.add_subplot(projection="3d")
    ax.plot_surface(xg, yg, np.ma.masked_invalid(zz), cmap="viridis", linewidth=0, antialiased=True)
    ax.set_xlabel(result.xlabel, fontsize=7)
    ax.set_ylabel(result.ylabel, fontsize=7)
    ax.set_zlabel(f"log10 {split} loss" if log else f"{split} loss", fontsize=7)
    if title:
        ax.set_title(title)
    return fig


def surface_figure(result, path, title: str = "", options=None) -> list[Path]:
    """The ``surface`` figure files beside result file ``path`` (``options.three_d``: also the 3-D view)."""
    return plot_surface(result, Path(path).with_suffix(""), three_d=bool(getattr(options, "three_d", False)),
                        title=f"A = {title}")
