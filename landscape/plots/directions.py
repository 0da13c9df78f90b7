"""Figure of random-direction profiles against the path toward a second solution (Watson et al. Fig. 4); a log
loss axis when the random profiles rise by more than a factor 50, so the flat path stays visible."""

from __future__ import annotations

import numpy as np

from landscape.plots.style import PALETTE, SGD_COLOR, save_figure, styled, subplots


@styled
def plot_directions(result, *, title: str | None = None):
    """A :class:`~landscape.analyze.directions.DirectionsResult` as a figure (returned, not saved)."""
    columns = list(getattr(result, "point_metrics", {}))
    fig, axes = subplots(1, 1 + len(columns), figsize=(5.4 + 4.2 * len(columns), 3.6), squeeze=False)
    dist = np.asarray(result.t) * result.distance
    ax = axes[0, 0]
    _profiles(ax, dist, result.direction_loss, result.toward_loss, log_ok=True)
    ax.set_ylabel(f"{result.config.split} loss")
    cos = result.max_abs_cos
    note = f"max |cos| = {cos:.2g}" if np.isfinite(cos) else ""
    if result.toward_loss is not None:
        s = result.summary()
        note += f"\nrise toward B {s['toward_rise']:.3g}; median random {s['rise_median']:.3g}"
    ax.text(0.02, 0.97, note, transform=ax.transAxes, va="top", ha="left", fontsize=8)
    for panel, col in zip(axes[0, 1:], columns, strict=True):
        _profiles(panel, dist, result.point_metrics[col], result.toward_metrics.get(col), log_ok=False)
        panel.set_ylabel(f"{result.config.split} {col}")
    if title:
        fig.suptitle(title) if columns else ax.set_title(title)
    axes[0, -1].legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


def _profiles(ax, dist: np.ndarray, profiles, toward, *, log_ok: bool) -> None:
    """The random profiles as a band (min-max, 10-90 %) with their median, and the path toward B over it."""
    values = np.asarray(profiles, dtype=np.float64)
    shown = np.where(np.isfinite(values), values, np.nan)
    n = values.shape[0]
    grey = "#777777"
    if n <= 200:
        for row in shown:
            ax.plot(dist, row, color=grey, linewidth=0.4, alpha=0.25)
    ax.fill_between(dist, np.nanmin(shown, axis=0), np.nanmax(shown, axis=0), color=grey, alpha=0.15, linewidth=0,
                    label=f"{n} random directions (min-max)")
    if n >= 5:
        ax.fill_between(dist, np.nanquantile(shown, 0.1, axis=0), np.nanquantile(shown, 0.9, axis=0), color=grey,
                        alpha=0.3, linewidth=0, label="10-90 %")
    ax.plot(dist, np.nanmedian(shown, axis=0), color=PALETTE[7], linewidth=1.4, label="median random direction")
    drawn = [shown]
    if toward is not None:
        ax.plot(dist, toward, color=SGD_COLOR, linewidth=2.2, label="toward B")
        drawn.append(np.asarray(toward, dtype=np.float64)[None, :])
    finite = np.concatenate([v[np.isfinite(v)] for v in drawn])
    if log_ok and finite.size and finite.min() > 0 and finite.max() / finite.min() > 50:
        ax.set_yscale("log")
    ax.set_xlabel("distance from A (parameter units)")


def directions_figure(result, path, title: str = "", options=None) -> list:
    """The ``directions`` figure files beside result file ``path`` (title: A, and B with
    ``options.toward``)."""
    toward = getattr(options, "toward", None)
    return save_figure(plot_directions(result, title=f"A = {title}" + (f"   B = {toward}" if toward else "")), path)
