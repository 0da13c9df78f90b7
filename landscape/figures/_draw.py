"""Drawing helpers the recipes share: coinciding series offset sideways (:func:`dodge`), non-positive values kept
off log axes (:func:`positive`), the sensitivity side figure, and the end of every recipe's figure (:func:`finish`).
"""

from __future__ import annotations

import math
import textwrap

import numpy as np

STATUS_MARKER = {"held": ("o", "full"), "did not hold": ("X", "full"), "inconclusive": ("o", "none")}


def dodge(x, i: int, n: int, width: float = 0.12, log: bool = False) -> np.ndarray:
    """``x`` shifted for series ``i`` of ``n`` so that coinciding series stay visible (multiplicative on a log
    axis)."""
    x = np.asarray(x, dtype=float)
    offset = (i - (n - 1) / 2) * width / max(n - 1, 1)
    return x * (10 ** offset) if log else x + offset * (np.min(np.diff(np.unique(x))) if np.unique(x).size > 1
                                                         else 1.0)


def positive(values) -> tuple[np.ndarray, np.ndarray]:
    """``(values with non-positive entries as NaN, mask of those entries)`` for a log axis: a clamp is never drawn as
    data."""
    v = np.asarray(values, dtype=float)
    bad = ~(v > 0)
    return np.where(bad, np.nan, v), bad


def effect(part) -> tuple[float, float, float, str]:
    """``(effect, interval low, interval high, what)`` of a verdict part, from its numbers (NaN where it has none)."""
    n = part.numbers
    if "ratio" in n:
        return float(n["ratio"]), float(n["ratio ci low"]), float(n["ratio ci high"]), "ratio"
    if "difference" in n:
        return float(n["difference"]), float(n["ci low"]), float(n["ci high"]), "difference"
    for k, v in n.items():
        if k.startswith("mean(") and isinstance(v, (int, float)):
            return float(v), float(n["ci low"]), float(n["ci high"]), "mean difference"
    if "bound" in n and "ci low" in n:
        mean = next(float(v) for k, v in n.items() if k.startswith("mean "))
        return mean, float(n["ci low"]), float(n["ci high"]), "mean"
    if "spearman rho" in n:
        return float(n["spearman rho"]), math.nan, math.nan, "Spearman rho"
    return math.nan, math.nan, math.nan, ""


def threshold(part) -> float:
    """The part's stated threshold (minimum effect, margin, bound, minimum ratio), or 0."""
    n = part.numbers
    for k in ("min ratio", "min effect", "margin", "bound"):
        if k in n and isinstance(n[k], (int, float)):
            return float(n[k])
    return 0.0


def finish(fig, d, title: str | None, axes) -> list:
    """Title the recipe's figure, letter its panels and write it, with the sensitivity side figure when the recipe
    has sensitivity entries; every path written."""
    from landscape.plots import style

    if title:
        fig.suptitle(title)
    style.panel_labels(axes)
    return style.save_figure(fig, d.stem("figure")) + sensitivity_figure(d)


def sensitivity_figure(d) -> list:
    """The sensitivity side figure: per verdict part, its effect and 90 % interval at every setting evaluated,
    marked by status, with the part's threshold; ``[]`` without sensitivity entries."""
    from matplotlib.lines import Line2D

    from landscape.plots import style

    entries = d.sensitivity
    if not entries:
        return []
    parts = [p for p in entries[0]["verdict"].parts] or [entries[0]["verdict"]]
    ncols = min(3, len(parts))
    nrows = math.ceil(len(parts) / ncols)
    from matplotlib.ticker import MaxNLocator

    fig, axes = style.subplots(nrows, ncols, figsize=(max(7.0, 3.9 * ncols),
                                                      0.55 * len(entries) * nrows + 1.6 * nrows + 0.6),
                               layout="constrained", squeeze=False)
    rows = np.arange(len(entries))[::-1]
    for j, ax in enumerate(axes.ravel()):
        if j >= len(parts):
            ax.set_visible(False)
            continue
        what = ""
        for y, e in zip(rows, entries, strict=True):
            ps = e["verdict"].parts or (e["verdict"],)
            if j >= len(ps):
                continue
            value, lo, hi, what = effect(ps[j])
            marker, fill = STATUS_MARKER[ps[j].status]
            if math.isfinite(lo) and math.isfinite(hi):
                ax.plot([lo, hi], [y, y], color="0.4", lw=1.2)
            ax.plot([value], [y], marker=marker, fillstyle=fill, color=style.PALETTE[0], ms=7, ls="none")
        t = threshold(parts[j])
        ax.axvline(t, color="tab:red", ls="--", lw=0.8)
        ax.set_yticks(rows, [short_label(e) for e in entries], fontsize=7)
        ax.set_ylim(-0.7, len(entries) - 0.3)
        ax.set_xlabel(what or "effect", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.set_title(textwrap.fill(f"({j + 1}) {parts[j].claim}", 44), fontsize=7)
    handles = [Line2D([], [], marker=m, fillstyle=f, color=style.PALETTE[0], ls="none", label=s)
               for s, (m, f) in STATUS_MARKER.items()]
    handles += [Line2D([], [], color="0.4", lw=1.2, label="90% interval"),
                Line2D([], [], color="tab:red", ls="--", lw=0.8, label="threshold (min effect / margin / bound)")]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=7)
    fig.suptitle(f"{d.name}: the verdict at every setting evaluated", fontsize=9)
    return style.save_figure(fig, d.stem("sensitivity"))


def short_label(entry) -> str:
    """A sensitivity entry's row label: ``chosen``, ``viable: <setting>``, ``own best``."""
    role = entry["role"]
    if role == "own best":
        return "each arm's own best"
    return f"{role}: {entry['label']}" if len(entry["label"]) <= 26 else role
