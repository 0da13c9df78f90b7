"""Figures for linear interpolation: the loss/accuracy profile (Watson et al. Figs. 3, 6-8) and the
instability against the Phase-1 length k for SGD and DP-SGD at each epsilon (Watson et al. Fig. 5)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from matplotlib.ticker import MaxNLocator

from landscape.plots.style import (
    SGD_COLOR,
    SPLIT_COLORS,
    SPLIT_STYLES,
    dp_shades,
    method_color,
    save_figure,
    styled,
    subplots,
    titled,
)


@styled
def plot_interpolation(result, *, labels: tuple[str, str] = ("A", "B"), title: str | None = None):
    """Loss and accuracy against alpha per split, then one panel per metric column (dotted: after
    ``--align``); the loss panel draws each split's chord and the barrier above it, the numbers under the
    panels."""
    from landscape.analyze.interpolate import chord_barrier, rise_above_ends

    columns = list(getattr(result, "point_metrics", {}))
    panels = 2 + len(columns)
    ncols = min(panels, 3)
    nrows = -(-panels // ncols)
    footer = 0.22 * len(result.splits) + 0.1  # inches under the panels for the barriers' lines
    height = 3.2 * nrows + footer
    fig, axes = subplots(nrows, ncols, figsize=(4.0 * ncols, height), squeeze=False)
    flat = list(axes.ravel())
    ax_loss, ax_acc = flat[0], flat[1]
    lines = []
    for split in result.splits:
        color = SPLIT_COLORS.get(split)
        style = SPLIT_STYLES.get(split, "-")
        loss, alpha = np.asarray(result.loss[split], dtype=float), np.asarray(result.alpha, dtype=float)
        barrier = result.chord_barrier_loss.get(split, chord_barrier(loss, alpha))
        rise = getattr(result, "rise_loss", {}).get(split, rise_above_ends(loss))
        lines.append(f"{split}: barrier above the chord {_fmt(barrier)}, rise above both ends {_fmt(rise)}, "
                     f"Def. 2.3 instability {_fmt(result.instability_loss[split])}")
        ax_loss.plot(result.alpha, loss, style, color=color, marker="o", markersize=2.5, label=split)
        if np.all(np.isfinite(loss)):
            chord = (1 - alpha) * loss[0] + alpha * loss[-1]
            ax_loss.plot([alpha[0], alpha[-1]], [loss[0], loss[-1]], ":", color=color, linewidth=1.0,
                         label=f"{split} chord")
            if barrier > 0:  # the barrier: from the chord up to the path, where it is highest above the chord
                i = int(np.argmax(loss - chord))
                ax_loss.vlines(alpha[i], chord[i], loss[i], color=color, linewidth=2.5, alpha=0.5)
        ax_acc.plot(result.alpha, result.acc[split], style, color=color, marker="o", markersize=2.5,
                    label=f"{split} (error barrier {_fmt(result.instability_error[split])})")
        if split in getattr(result, "loss_aligned", {}):  # --align: A -> B permuted to match A, dotted
            ax_loss.plot(result.alpha, result.loss_aligned[split], ":", color=color,
                         label=f"{split} aligned ({_fmt(result.instability_loss_aligned[split])})")
            ax_acc.plot(result.alpha, result.acc_aligned[split], ":", color=color,
                        label=f"{split} aligned ({_fmt(result.instability_error_aligned[split])})")
        for ax, col in zip(flat[2:], columns, strict=False):
            if split in result.point_metrics[col]:
                ax.plot(result.alpha, result.point_metrics[col][split], style, color=color, marker="o",
                        markersize=2.5, label=split)
            if split in getattr(result, "point_metrics_aligned", {}).get(col, {}):
                ax.plot(result.alpha, result.point_metrics_aligned[col][split], ":", color=color,
                        label=f"{split} aligned")
    for ax, ylabel in zip(flat, ["loss (cross-entropy)", "accuracy", *columns], strict=False):
        ax.set(xlabel=r"$\alpha$  ($(1-\alpha)\,\theta_A + \alpha\,\theta_B$)", ylabel=ylabel)
        ax.set_xlim(0, 1)
        ax.set_xticks([0, 0.25, 0.5, 0.75, 1])
        ax.set_xticklabels([labels[0], "0.25", "0.5", "0.75", labels[1]])
        ax.legend(loc="best")
    for ax in flat[panels:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.text(0.5, 0.04 / height, "\n".join(lines), ha="center", va="bottom", fontsize=8)
    fig.tight_layout(rect=(0, footer / height, 1, 1))
    return fig


@styled
def plot_instability(rows: Sequence[dict], *, splits: Sequence[str], title: str | None = None):
    """Instability against k: SGD pairs in one colour, DP-SGD pairs one shade per epsilon (Watson Fig. 5).
    Rows: the loss barrier above the chord (what a basin claim is judged on), Def. 2.3 loss instability, the
    error barrier; pairs with the same (optimizer, epsilon, k) averaged, their spread as error bars."""
    chord = any(f"chord_barrier_{s}_loss" in r for r in rows for s in splits)
    metrics = ((("chord", "loss barrier above chord"),) if chord else ()) + (
        ("loss", "Def. 2.3 loss instability"), ("error", "error barrier"))
    fig, axes = subplots(len(metrics), len(splits), figsize=(4.2 * len(splits), 2.8 * len(metrics)), squeeze=False)
    groups: dict[tuple[str, float | None], dict[float, list[dict]]] = {}
    for row in rows:
        eps = row.get("epsilon")
        eps = None if eps is None or (isinstance(eps, float) and math.isnan(eps)) else float(eps)
        key = (str(row.get("phase2", "?")), eps)
        groups.setdefault(key, {}).setdefault(float(row.get("k", math.nan)), []).append(row)
    dp_keys = sorted((k for k in groups if k[0] != "sgd"), key=lambda k: (k[0], k[1] if k[1] is not None else math.inf))
    shades = dict(zip(dp_keys, dp_shades(len(dp_keys)), strict=True))
    for (opt, eps), by_k in sorted(groups.items(), key=lambda kv: (kv[0][0] != "sgd", kv[0][0], kv[0][1] or 0.0)):
        color = SGD_COLOR if opt == "sgd" else shades.get((opt, eps), method_color(opt))
        label = "SGD" if opt == "sgd" else (f"DP-SGD, ε={eps:g}" if eps is not None and opt == "dpsgd"
                                            else f"{opt}" + (f", ε={eps:g}" if eps is not None else ""))
        ks = sorted(by_k)
        for i, (metric, _) in enumerate(metrics):
            for j, split in enumerate(splits):
                col = f"chord_barrier_{split}_loss" if metric == "chord" else f"instability_{split}_{metric}"
                vals = [np.array([float(r.get(col, math.nan)) for r in by_k[k]]) for k in ks]
                mean = [float(np.mean(v)) if np.all(np.isfinite(v)) else math.nan for v in vals]
                err = [float(np.std(v)) if len(v) > 1 and np.all(np.isfinite(v)) else 0.0 for v in vals]
                axes[i, j].errorbar(ks, mean, yerr=err, color=color, marker="o", capsize=2, label=label)
    for i, (_, ylabel) in enumerate(metrics):
        for j, split in enumerate(splits):
            ax = axes[i, j]
            ax.set_xlabel("k (Phase-1 length)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(f"{split} {ylabel}")
            ax.axhline(0.0, color="0.6", linewidth=0.8, zorder=0)
    axes[0, 0].legend(loc="best")
    return titled(fig, title)


def _fmt(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3g}"


def interpolation_figure(result, stem, title: str = "") -> list:
    """The ``interpolate`` figure files (PNG + PDF at ``stem``): :func:`plot_interpolation`."""
    return save_figure(plot_interpolation(result, title=title or None), stem)


def instability_figure(table, stem, title: str = "", options=None) -> list:
    """The ``instability`` figure files (PNG + PDF at ``stem``): :func:`plot_instability` of the table's
    rows."""
    return save_figure(plot_instability(table.records(), splits=table.splits, title=title or None), stem)
