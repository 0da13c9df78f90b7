"""Figures of ``landscape calibration``: reliability diagrams (Bu et al. 2023 Figs. 5, 7, 9), confidence
histograms (Bu Fig. 2, Guo et al. 2017 Fig. 1), the true-class probability (Bu Fig. 11), metrics against
epoch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from landscape.plots.style import PALETTE, save_figure, styled, subplots, titled

MAX_PANELS = 6
RUN_PANELS = 4
CURVES = (("accuracy", "accuracy"), ("nll", "NLL"), ("brier", "Brier score"), ("ece", "ECE"), ("mce", "MCE"),
          ("adaptive_ece", "adaptive ECE"))


def _panels(n: int, height: float = 3.3):
    fig, axes = subplots(1, n, figsize=(3.2 * n + 0.4, height), squeeze=False, sharey=True)
    return fig, axes[0]


@styled
def plot_reliability(entries: Sequence[tuple], *, split: str = "test", title: str | None = None):
    """Reliability diagrams of ``(label, SplitCalibration)`` pairs, side by side."""
    fig, axes = _panels(len(entries))
    for ax, (name, c) in zip(axes, entries, strict=True):
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
        ax.set(xlim=(0, 1), ylim=(0, 1))
        ax.set_aspect("equal")
        ax.grid(False)
        ax.set_title(name)
        ax.set_xlabel("confidence (max softmax probability)")
    axes[0].set_ylabel(f"accuracy ({split})")
    titled(fig, title)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", ncol=3, bbox_to_anchor=(0.5, 0.0))  # below the panels
    return fig


@styled
def plot_confidence_histograms(entries: Sequence[tuple], *, split: str = "test", title: str | None = None):
    """Share of examples per confidence bin, one panel per ``(label, SplitCalibration)``."""
    fig, axes = _panels(len(entries), height=2.8)
    for ax, (name, c) in zip(axes, entries, strict=True):
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
    return titled(fig, title)


@styled
def plot_true_class_probability(entries: Sequence[tuple], *, split: str = "test", title: str | None = None):
    """Distribution of ``pi_i[y_i]`` (the probability of the true class), one line per entry."""
    fig, ax = subplots(figsize=(5.0, 3.4))
    for i, (name, c) in enumerate(entries):
        share = c.true_class_count / max(c.examples, 1)
        ax.stairs(share, c.edges, color=PALETTE[i % len(PALETTE)], linewidth=1.6, label=name)
    ax.set_xlim(0, 1)
    ax.set(xlabel="probability given to the true class", ylabel=f"share of {split} examples")
    ax.legend(loc="upper center")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


@styled
def plot_calibration_curves(records: Sequence, *, split: str = "test", title: str | None = None):
    """Accuracy, NLL, Brier, ECE, MCE and adaptive ECE of ``records`` against epoch; one line per run."""
    runs: dict[str, list] = {}
    for row in records:
        if row.split == split:
            runs.setdefault(row.run, []).append(row)
    fig, axes = subplots(2, 3, figsize=(11.5, 5.6), squeeze=False)
    for i, (run, members) in enumerate(runs.items()):
        members = sorted(members, key=lambda r: (r.epoch if math.isfinite(r.epoch) else math.inf, r.step))
        epochs = [r.epoch for r in members]
        for ax, (key, _) in zip(axes.flat, CURVES, strict=True):
            ax.plot(epochs, [getattr(r, key) for r in members], "o-", ms=3,
                    color=PALETTE[i % len(PALETTE)], label=run)
    for ax, (_, label) in zip(axes.flat, CURVES, strict=True):
        ax.set(xlabel="epoch", ylabel=f"{label} ({split})")
    axes[0, 0].legend(loc="best")
    return titled(fig, title)


def panel_rows(records: Sequence, split: str) -> list[int]:
    """Indices of the rows drawn side by side on ``split``: each run's one checkpoint, up to ``RUN_PANELS`` of
    one run's spread from the first after initialisation to the last, or the last of each of several runs."""
    runs: dict[str, list[int]] = {}
    for i, row in enumerate(records):
        if row.split == split:
            runs.setdefault(row.run, []).append(i)
    if sum(map(len, runs.values())) <= MAX_PANELS and all(len(v) == 1 for v in runs.values()):
        return [i for v in runs.values() for i in v]

    def position(i: int) -> tuple:
        epoch = records[i].epoch
        return records[i].step, epoch if math.isfinite(epoch) else -math.inf

    if len(runs) == 1:
        (members,) = runs.values()
        members = sorted(members, key=position)
        later = [i for i in members if records[i].step > 0] or members
        picks = np.unique(np.linspace(0, len(later) - 1, min(RUN_PANELS, len(later))).round().astype(int))
        return [later[k] for k in picks]
    return [max(v, key=position) for v in runs.values()][:MAX_PANELS]


@styled
def figure(result, stem: str | Path, title: str | None = None) -> list[Path]:
    """Every figure for ``result`` (a CalibrationResult), per split: ``<stem>-<split>-reliability``,
    ``-confidence``, ``-true-class`` and, when some run has several checkpoints, ``-epochs``."""
    stem = Path(stem)
    stem = stem.with_suffix("") if stem.suffix.lower() in (".h5", ".hdf5", ".png", ".pdf") else stem
    paths: list[Path] = []
    for split in result.config.split:
        base = stem.with_name(f"{stem.name}-{split}")
        entries = [(result.rows[i].ref, result.calibration(i)) for i in panel_rows(result.rows, split)]
        if not entries:
            continue
        paths += save_figure(plot_reliability(entries, split=split, title=title), f"{base}-reliability")
        paths += save_figure(plot_confidence_histograms(entries, split=split, title=title), f"{base}-confidence")
        paths += save_figure(plot_true_class_probability(entries, split=split, title=title), f"{base}-true-class")
        runs = [r.run for r in result.rows if r.split == split]
        if len(set(runs)) < len(runs):
            paths += save_figure(plot_calibration_curves(result.rows, split=split, title=title), f"{base}-epochs")
    return paths
