"""Figures of ``landscape calibration`` (Bu et al. 2023 Sec. 5; Guo et al. 2017 Fig. 1).

* :func:`plot_reliability`: reliability diagrams side by side, one panel per checkpoint (Bu Figs. 5, 7, 9):
  per confidence bin the accuracy (bars) and the gap to the bin's mean confidence (hatched), the diagonal of
  perfect calibration, ECE and MCE in the corner;
* :func:`plot_confidence_histograms`: the share of examples per confidence bin, with the accuracy and the
  mean confidence marked (Bu Fig. 2, Guo Fig. 1 top row);
* :func:`plot_true_class_probability`: the distribution of the probability given to the true class, one
  line per checkpoint (Bu Fig. 11);
* :func:`plot_calibration_curves`: accuracy, NLL, Brier, ECE, MCE and adaptive ECE against epoch, one line
  per run (Bu Fig. 6).

:func:`plot_calibration` writes all that apply for a :class:`~landscape.analyze.calibration.CalibrationResult`.
Pure: rows in, figures out (saved with :func:`landscape.plots.style.save_figure`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from landscape.plots.style import PALETTE, apply_style, save_figure

MAX_PANELS = 6
CURVES = (("accuracy", "accuracy"), ("nll", "NLL"), ("brier", "Brier score"), ("ece", "ECE"), ("mce", "MCE"),
          ("adaptive_ece", "adaptive ECE"))


def _labels(rows, labels: Sequence[str] | None) -> list[str]:
    if labels is not None:
        if len(labels) != len(rows):
            raise ValueError(f"{len(labels)} labels for {len(rows)} checkpoints")
        return list(labels)
    return [r.ref or f"checkpoint {i + 1}" for i, r in enumerate(rows)]


def _panels(n: int, height: float = 3.3):
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n + 0.4, height), squeeze=False, sharey=True)
    return fig, axes[0]


def plot_reliability(rows, *, split: str = "test", labels: Sequence[str] | None = None, title: str | None = None):
    """Reliability diagrams of ``rows`` (CalibrationRow) on ``split``, side by side."""
    apply_style()
    names = _labels(rows, labels)
    fig, axes = _panels(len(rows))
    for ax, row, name in zip(axes, rows, names, strict=True):
        c = row.splits[split]
        edges = c.edges
        width, left = np.diff(edges), edges[:-1]
        filled = c.bin_count > 0
        acc = np.where(filled, c.bin_accuracy, 0.0)
        conf = np.where(filled, c.bin_confidence, 0.0)
        ax.bar(left, acc, width=width, align="edge", color=PALETTE[0], edgecolor="white", linewidth=0.6,
               label="accuracy")
        ax.bar(left, conf - acc, bottom=acc, width=width, align="edge", facecolor="none",
               edgecolor=PALETTE[1], hatch="///", linewidth=0.6, label="gap to confidence")
        ax.plot([0, 1], [0, 1], ":", color="black", linewidth=1.0, label="perfect calibration")
        ax.text(0.04, 0.96, f"ECE {100 * c.ece:.2f}%\nMCE {100 * c.mce:.2f}%\nacc {100 * c.accuracy:.1f}%",
                transform=ax.transAxes, va="top", ha="left", fontsize=8,
                bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.8"})
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.grid(False)
        ax.set_title(name)
        ax.set_xlabel("confidence (max softmax probability)")
    axes[0].set_ylabel(f"accuracy ({split})")
    axes[-1].legend(loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_confidence_histograms(rows, *, split: str = "test", labels: Sequence[str] | None = None,
                               title: str | None = None):
    """Share of examples per confidence bin, one panel per checkpoint; accuracy and mean confidence marked."""
    apply_style()
    names = _labels(rows, labels)
    fig, axes = _panels(len(rows), height=2.8)
    for ax, row, name in zip(axes, rows, names, strict=True):
        c = row.splits[split]
        share = c.bin_count / max(c.examples, 1)
        ax.bar(c.edges[:-1], share, width=np.diff(c.edges), align="edge", color=PALETTE[0], edgecolor="white",
               linewidth=0.6)
        mean_conf = float(np.nansum(c.bin_confidence * c.bin_count) / max(c.examples, 1))
        ax.axvline(c.accuracy, color=PALETTE[1], linestyle="--", linewidth=1.2, label=f"accuracy {c.accuracy:.3f}")
        ax.axvline(mean_conf, color=PALETTE[2], linestyle=":", linewidth=1.4, label=f"mean confidence {mean_conf:.3f}")
        ax.set_xlim(0, 1)
        ax.set_title(name)
        ax.set_xlabel("confidence")
        ax.legend(loc="upper left")
    axes[0].set_ylabel(f"share of {split} examples")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_true_class_probability(rows, *, split: str = "test", labels: Sequence[str] | None = None,
                                title: str | None = None):
    """Distribution of ``pi_i[y_i]`` (the probability of the true class), one step line per checkpoint."""
    apply_style()
    names = _labels(rows, labels)
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
    for i, (row, name) in enumerate(zip(rows, names, strict=True)):
        c = row.splits[split]
        share = c.true_class_count / max(c.examples, 1)
        ax.stairs(share, c.edges, color=PALETTE[i % len(PALETTE)], linewidth=1.6, label=name)
    ax.set_xlim(0, 1)
    ax.set_xlabel("probability given to the true class")
    ax.set_ylabel(f"share of {split} examples")
    ax.legend(loc="upper center")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_calibration_curves(rows, *, split: str = "test", title: str | None = None):
    """Accuracy, NLL, Brier, ECE, MCE and adaptive ECE against epoch; one line per run (rows grouped by run)."""
    apply_style()
    runs: dict[str, list] = {}
    for row in rows:
        runs.setdefault(row.run, []).append(row)
    fig, axes = plt.subplots(2, 3, figsize=(11.5, 5.6), squeeze=False)
    for i, (run, members) in enumerate(runs.items()):
        members = sorted(members, key=lambda r: (r.epoch if math.isfinite(r.epoch) else math.inf, r.step))
        epochs = [r.epoch for r in members]
        for ax, (key, _) in zip(axes.flat, CURVES, strict=True):
            ax.plot(epochs, [getattr(r.splits[split], key) for r in members], "o-", ms=3,
                    color=PALETTE[i % len(PALETTE)], label=run)
    for ax, (_, label) in zip(axes.flat, CURVES, strict=True):
        ax.set_xlabel("epoch")
        ax.set_ylabel(f"{label} ({split})")
    axes[0, 0].legend(loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def panel_rows(rows) -> list:
    """The checkpoints drawn side by side: all when there are at most ``MAX_PANELS`` and each run gives one;
    otherwise the last checkpoint of each run (at most ``MAX_PANELS`` runs)."""
    runs: dict[str, list] = {}
    for row in rows:
        runs.setdefault(row.run, []).append(row)
    if len(rows) <= MAX_PANELS and all(len(v) == 1 for v in runs.values()):
        return list(rows)
    return [max(v, key=lambda r: (r.step, r.epoch if math.isfinite(r.epoch) else -math.inf))
            for v in runs.values()][:MAX_PANELS]


def plot_calibration(result, stem: str | Path) -> list[Path]:
    """Every figure for ``result`` (a CalibrationResult), per split: ``<stem>-<split>-reliability``,
    ``-confidence``, ``-true-class`` and, when some run has several checkpoints, ``-epochs``."""
    stem = Path(stem)
    stem = stem.with_suffix("") if stem.suffix.lower() in (".h5", ".hdf5", ".png", ".pdf") else stem
    paths: list[Path] = []
    panels = panel_rows(result.rows)
    multi = any(sum(r.run == row.run for r in result.rows) > 1 for row in result.rows)
    for split in result.config.splits:
        base = stem.with_name(f"{stem.name}-{split}")
        paths += save_figure(plot_reliability(panels, split=split), f"{base}-reliability")
        paths += save_figure(plot_confidence_histograms(panels, split=split), f"{base}-confidence")
        paths += save_figure(plot_true_class_probability(panels, split=split), f"{base}-true-class")
        if multi:
            paths += save_figure(plot_calibration_curves(result.rows, split=split), f"{base}-epochs")
    return paths
