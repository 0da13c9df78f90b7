"""Figures of ``landscape norms``: parameter histograms (Watson Fig. 17), distances along training and
per-sample gradient norms (Fig. 16), several runs overlaid."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from landscape.plots.style import PALETTE, method_color, save_figure, styled, subplots


def _colors(result) -> list[str]:
    out, used = [], set()
    for i, run in enumerate(result.runs):
        base = run.optimizer.split(" ")[0]
        color = method_color(base) if base and "pruned" not in run.optimizer else PALETTE[(i + 2) % len(PALETTE)]
        if color in used:
            color = PALETTE[(i + 4) % len(PALETTE)]
        used.add(color)
        out.append(color)
    return out


def _grad_rows(run, epochs: list[float] | None) -> list:
    """Checkpoints whose gradient-norm histograms are drawn: the asked-for epochs, else the first and last."""
    rows = [r for r in run.rows if r.grad_norms.size]
    if not rows:
        return []
    if epochs:
        return [min(rows, key=lambda r, e=e: abs(r.epoch - e)) for e in epochs]
    later = [r for r in rows if r.step > 0]
    picks = ([later[0]] if later else []) + [rows[-1]]
    return list({id(r): r for r in picks}.values())


@styled
def plot_norms(result, path, title: str = "") -> list[Path]:
    """``<stem>-params`` (histograms + distances) and ``<stem>-grads`` (per-sample gradient norms)."""
    stem = Path(path).with_suffix("")
    colors = _colors(result)
    centers = 0.5 * (result.edges[1:] + result.edges[:-1])
    fig, axes = subplots(1, 3, figsize=(13, 3.4))
    for run, color in zip(result.runs, colors, strict=True):
        last = run.rows[-1]
        label = f"{run.label} ({run.optimizer})" if run.optimizer else run.label
        axes[0].step(centers, np.maximum(last.histogram, 0.5), where="mid", color=color,
                     label=f"{label}: ||theta|| = {last.params.dist_origin:.3g}")
        epochs = [r.epoch for r in run.rows]
        axes[1].plot(epochs, run.column("dist_origin"), "o-", color=color, ms=3, label=label)
        axes[2].plot(epochs, run.column("dist_init"), "o-", color=color, ms=3, label=label)
    axes[0].set_yscale("log")
    axes[0].set(xlabel="parameter value", ylabel="count (final checkpoint)")
    axes[0].legend()
    axes[1].set(xlabel="epoch", ylabel="||theta|| (distance from origin)")
    axes[2].set(xlabel="epoch", ylabel="||theta - theta_0|| (from init)")
    axes[1].legend()
    fig.tight_layout()
    files = save_figure(fig, stem.with_name(f"{stem.name}-params"))
    if not any(r.grad_norms.size for run in result.runs for r in run.rows):
        return files
    fig, axes = subplots(1, 2, figsize=(10, 3.4))
    all_norms = np.concatenate([r.grad_norms for run in result.runs for r in run.rows if r.grad_norms.size])
    bins = np.linspace(0, float(np.quantile(all_norms, 0.995)) * 1.05 or 1.0, 50)
    styles = ["-", "--", ":", "-."]
    for run, color in zip(result.runs, colors, strict=True):
        axes[0].plot([r.epoch for r in run.rows], run.column("mean_grad_norm"), "o-", color=color, ms=3,
                     label=run.label)
        for k, row in enumerate(_grad_rows(run, result.config.grad_epochs)):
            axes[1].hist(np.clip(row.grad_norms, 0, bins[-1]), bins=bins, histtype="step", color=color,
                         ls=styles[k % len(styles)], label=f"{run.label}, epoch {row.epoch:g}")
    axes[0].set(xlabel="epoch", ylabel="mean per-sample ||g_i||")
    axes[0].legend()
    axes[1].set(xlabel="per-sample gradient norm", ylabel="count")
    axes[1].legend()
    fig.tight_layout()
    return files + save_figure(fig, stem.with_name(f"{stem.name}-grads"))
