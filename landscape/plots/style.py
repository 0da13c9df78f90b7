"""Shared publication style for every landscape figure: plot functions draw under :data:`STYLE`
(:func:`styled`) on ``Figure`` objects pyplot does not know, so plotting changes no global state; SGD and
DP-SGD always get the same colours, line styles and markers, so figures read together and in greyscale."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib
from cycler import cycler
from matplotlib.figure import Figure

from landscape.atomic import atomic_write

# Okabe & Ito (2008) colour-blind-safe palette.
PALETTE: tuple[str, ...] = (
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#E69F00",  # orange
    "#56B4E9",  # sky blue
    "#F0E442",  # yellow
    "#000000",  # black
)
SGD_COLOR = PALETTE[0]
DP_COLOR = PALETTE[1]
SPLIT_COLORS: dict[str, str] = {"train": PALETTE[0], "test": PALETTE[1]}
SPLIT_STYLES: dict[str, str] = {"train": "-", "test": "--"}

_METHOD_COLORS = {"sgd": SGD_COLOR, "dpsgd": DP_COLOR, "dp-sgd": DP_COLOR, "dp": DP_COLOR,
                  "clip-only": PALETTE[2], "noise-only": PALETTE[3]}
_METHOD_STYLES = {"sgd": "-", "dpsgd": "--", "dp-sgd": "--", "dp": "--", "clip-only": "-.", "noise-only": ":"}
_METHOD_MARKERS = {"sgd": "o", "dpsgd": "s", "dp-sgd": "s", "dp": "s", "clip-only": "^", "noise-only": "v"}
LINESTYLES: tuple = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 1)), (0, (8, 2)), (0, (3, 1, 3, 3)))
MARKERS: tuple[str, ...] = ("o", "s", "^", "v", "D", "P", "X", "*")

DPI = 200


def method_color(optimizer: str) -> str:
    """The colour of a training method ("sgd", "dpsgd", "clip-only", "noise-only"); grey otherwise."""
    return _METHOD_COLORS.get(str(optimizer).lower(), "#666666")


def method_style(optimizer: str) -> str:
    """The line style of a training method (solid SGD, dashed DP-SGD, ...): readable without colour."""
    return _METHOD_STYLES.get(str(optimizer).lower(), "-")


def method_marker(optimizer: str) -> str:
    return _METHOD_MARKERS.get(str(optimizer).lower(), "o")


def series_styles(n: int) -> list[dict]:
    """``n`` plot keyword sets (``color``, ``ls``, ``marker``) that differ in all three (greyscale-safe)."""
    return [{"color": PALETTE[i % len(PALETTE)], "ls": LINESTYLES[i % len(LINESTYLES)],
             "marker": MARKERS[i % len(MARKERS)]} for i in range(n)]


def panel_labels(axes) -> None:
    """Bold (a), (b), ... in front of each panel's title (one title line, so label and title cannot
    overlap)."""
    import numpy as np

    for label, ax in zip("abcdefghijklmnopqrstuvwxyz", np.ravel(axes), strict=False):
        title = ax.get_title()
        ax.set_title(rf"$\mathbf{{({label})}}$ {title}".rstrip())


def dp_shades(n: int) -> list[str]:
    """``n`` distinguishable shades of the DP colour family (e.g. one per epsilon), light to dark."""
    from matplotlib.colors import to_rgb

    if n <= 1:  # none (a table of SGD pairs only) or one
        return [DP_COLOR] * n
    # mixed with white: light (small eps) -> full colour (large eps)
    return [tuple(1 - (0.35 + 0.65 * i / (n - 1)) * (1 - c) for c in to_rgb(DP_COLOR)) for i in range(n)]


STYLE: dict[str, Any] = {
    "figure.figsize": (5.0, 3.4),
    "figure.dpi": 100,
    "savefig.dpi": DPI,
    "savefig.bbox": "tight",
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.6,
    "lines.markersize": 4,
    "axes.prop_cycle": cycler(color=list(PALETTE)),
    "pdf.fonttype": 42,  # embed TrueType: editable text in the PDF
    "ps.fonttype": 42,
}


def styled(fn: Callable) -> Callable:
    """Run a plot function under :data:`STYLE` (a ``matplotlib.rc_context``: the caller's rcParams are
    restored)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(STYLE):
            return fn(*args, **kwargs)

    return wrapper


def new_figure(**kwargs) -> Figure:
    """A ``matplotlib.figure.Figure`` that pyplot does not know (nothing to close, no backend needed)."""
    return Figure(**kwargs)


def subplots(*args, figsize=None, layout=None, **kwargs):
    """``(fig, axes)`` like ``plt.subplots`` on a :func:`new_figure` (the recipes pass
    ``layout="constrained"``)."""
    fig = new_figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(*args, **kwargs)


def titled(fig, title: str | None):
    """``fig`` with ``title`` as its suptitle (when given), laid out tight."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_figure(fig, stem: str | os.PathLike) -> list[Path]:
    """Write ``stem.png`` (200 dpi) and ``stem.pdf`` atomically (``stem`` may carry a suffix); both paths."""
    stem = Path(stem)
    if stem.suffix.lower() in (".png", ".pdf", ".h5", ".hdf5", ".csv"):
        stem = stem.with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    with matplotlib.rc_context(STYLE):
        for ext in ("png", "pdf"):
            path = stem.with_name(f"{stem.name}.{ext}")
            atomic_write(path, lambda tmp, ext=ext: fig.savefig(tmp, dpi=DPI, format=ext))
            paths.append(path)
    return paths
