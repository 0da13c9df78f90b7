"""2-D loss surfaces on a plane ``theta_A + x * dx + y * dy`` (Li et al. 2018: random or PCA of a trajectory;
Garipov et al. 2018: through three checkpoints), resumable row by row: a cell is done when its accuracy is not
NaN, so scheduling is a pure function of the file and every point is evaluated on its own."""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from landscape import metrics as user_metrics
from landscape import progress
from landscape.analyze.directions import nonzero_random_directions
from landscape.analyze.specs import SurfaceConfig
from landscape.directions import trajectory_pca
from landscape.errors import UsageError
from landscape.evaluate import Affine, evaluate
from landscape.options import SPLITS
from landscape.params import ParamSpace
from landscape.results import StoredResult, stored

KIND = "surface"
METRICS = ("loss", "acc")
RESERVED = METRICS  # a metric column is stored as <split>_<column>, beside <split>_loss and <split>_acc
AUTO_MARGIN = 0.25  # auto ranges extend the span of the marked points by this fraction on each side
POINTS_PER_CALL = 64  # auto rows_per_call: enough rows that one evaluate call amortises its fixed cost


@dataclass
class Plane:
    """``origin + x * dx + y * dy``; what to draw on it (markers, trajectory) and how to label the axes."""

    kind: str
    origin: torch.Tensor
    dx: torch.Tensor
    dy: torch.Tensor
    xlabel: str = "x"
    ylabel: str = "y"
    explained_variance: np.ndarray | None = None  # (2,) for pca
    trajectory: np.ndarray | None = None  # (T, 2) projected checkpoints
    trajectory_steps: np.ndarray | None = None  # (T,)
    markers: dict[str, tuple[float, float]] = field(default_factory=dict)

    def fingerprint(self) -> str:
        """sha256 of origin, dx and dy (float64 bytes): a resumed surface must be on the same plane."""
        h = hashlib.sha256()
        for v in (self.origin, self.dx, self.dy):
            h.update(v.detach().double().contiguous().numpy().tobytes())
        return h.hexdigest()

    def auto_ranges(self) -> tuple[tuple[float, float], tuple[float, float]]:
        pts = list(self.markers.values())
        if self.trajectory is not None:
            pts += [tuple(p) for p in self.trajectory]
        if self.kind == "random" or not pts:
            return (-1.0, 1.0), (-1.0, 1.0)
        arr = np.asarray(pts + [(0.0, 0.0)], dtype=np.float64)
        lo, hi = arr.min(axis=0), arr.max(axis=0)
        span = np.maximum(hi - lo, 1e-3 * max(float(np.max(hi - lo)), 1e-12))
        lo, hi = lo - AUTO_MARGIN * span, hi + AUTO_MARGIN * span
        return (float(lo[0]), float(hi[0])), (float(lo[1]), float(hi[1]))


def random_plane(theta: torch.Tensor, space: ParamSpace, *, seed: int = 0, normalize: str = "filter",
                 biasbn: str = "zero") -> Plane:
    """Li et al. 2018: two seeded (filter-normalised) random directions through theta (not orthogonalised)."""
    d, _ = nonzero_random_directions(theta, space, [0, 1], seed=seed, normalize=normalize, biasbn=biasbn)
    label = f"{normalize}-normalised direction" if normalize != "none" else "random direction"
    return Plane("random", theta, d[0], d[1], xlabel=f"{label} 1", ylabel=f"{label} 2", markers={"A": (0.0, 0.0)})


def checkpoint_plane(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *, labels: Sequence[str] = ("A", "B", "C")
                     ) -> Plane:
    """The plane through three points with an orthonormal basis (coordinates = parameter distances)."""
    a64, u, w = a.double(), (b - a).double(), (c - a).double()
    nu = float(torch.linalg.vector_norm(u))
    if nu == 0:
        raise UsageError(f"{labels[1]} is the same point as {labels[0]}; three distinct checkpoints span a plane")
    dx = u / nu
    cx = float(w @ dx)
    v = w - cx * dx
    nv = float(torch.linalg.vector_norm(v))
    if nv <= 1e-9 * max(nu, float(torch.linalg.vector_norm(w))):
        raise UsageError(f"{', '.join(labels)} lie on one line; they do not span a plane")
    dy = v / nv
    markers = {labels[0]: (0.0, 0.0), labels[1]: (nu, 0.0), labels[2]: (cx, nv)}
    return Plane("checkpoints", a64.to(a.dtype), dx.to(a.dtype), dy.to(a.dtype),
                 xlabel=f"distance along {labels[1]} - {labels[0]}", ylabel="orthogonal distance", markers=markers)


def pca_plane(origin: torch.Tensor, trajectory: torch.Tensor, *, steps: Sequence[int] | None = None,
              label: str = "A") -> Plane:
    """Li et al. Sec. 7: the top-2 principal components of ``trajectory - origin``; checkpoints projected."""
    pca = trajectory_pca(trajectory, origin, n_components=2)
    ev = pca.explained_variance_ratio
    return Plane("pca", origin, pca.components[0], pca.components[1],
                 xlabel=f"PC1 ({100 * ev[0]:.1f}% of variance)", ylabel=f"PC2 ({100 * ev[1]:.1f}% of variance)",
                 explained_variance=ev, trajectory=pca.coords,
                 trajectory_steps=None if steps is None else np.asarray(steps, dtype=np.int64),
                 markers={label: (0.0, 0.0)})


@dataclass
class SurfaceResult(StoredResult):
    """Loss/accuracy on a grid (NaN = not computed; ``values[i, j]`` at ``(x[i], y[j])``), and the plane."""

    KIND = KIND
    CONFIG = SurfaceConfig

    xcoordinates: np.ndarray = stored("array", dims=("x",))
    ycoordinates: np.ndarray = stored("array", dims=("y",))
    # "train_loss", "train_acc", "test_loss", "test_acc" -> (nx, ny)
    values: dict[str, np.ndarray] = stored("array", name="{}", keys="(?:train|test)_(?:loss|acc)", dims=("x", "y"))
    plane_kind: str = stored("attr", "random", name="plane")
    xlabel: str = "x"
    ylabel: str = "y"
    explained_variance: np.ndarray | None = stored("array", None, dims=("pc",))
    trajectory: np.ndarray | None = stored("array", None, dims=("step", "pc"))
    trajectory_steps: np.ndarray | None = stored("array", None, dims=("step",))
    markers: dict[str, tuple[float, float]] = stored("attr", default_factory=dict)
    # --metric: column -> split -> (nx, ny) grid (NaN = not computed), datasets <split>_<column>
    point_metrics: dict[str, dict[str, np.ndarray]] = stored("skip", default_factory=dict)
    metric_sources: list[dict] = stored("attr", default_factory=list)
    plane_sha256: str = ""
    examples: dict[str, int] = stored("attr", default_factory=dict)
    seconds: float = 0.0
    method: str = ""
    config: SurfaceConfig = field(default_factory=SurfaceConfig)

    @classmethod
    def empty(cls, plane: Plane, config: SurfaceConfig, columns: Sequence[str] = ()) -> SurfaceResult:
        """An all-NaN grid for ``plane`` and each metric column."""
        (x0, x1), (y0, y1) = config.ranges or plane.auto_ranges()
        nx, ny = config.shape
        values = {f"{s}_{m}": np.full((nx, ny), np.nan) for s in config.split for m in METRICS}
        return cls(
            point_metrics={c: {s: np.full((nx, ny), np.nan) for s in config.split} for c in columns},
            xcoordinates=np.linspace(x0, x1, nx), ycoordinates=np.linspace(y0, y1, ny), values=values,
            plane_kind=plane.kind, xlabel=plane.xlabel, ylabel=plane.ylabel,
            explained_variance=plane.explained_variance, trajectory=plane.trajectory,
            trajectory_steps=plane.trajectory_steps, markers=dict(plane.markers), plane_sha256=plane.fingerprint(),
            config=config,
        )

    @property
    def splits(self) -> list[str]:
        return [s for s in SPLITS if f"{s}_loss" in self.values]

    @property
    def done(self) -> np.ndarray:
        """(nx, ny) bool: the cell is computed for every split."""
        return np.all([~np.isnan(self.values[f"{s}_acc"]) for s in self.splits], axis=0)

    @property
    def complete(self) -> bool:
        return bool(self.done.all())

    def summary(self) -> dict:
        done = self.done
        out = {"grid": f"{len(self.xcoordinates)}x{len(self.ycoordinates)}", "cells_done": int(done.sum()),
               "cells": int(done.size), "plane": self.plane_kind, "seconds": self.seconds}

        def span(v: np.ndarray) -> tuple[float, float]:  # NaN when nothing is finite
            finite = np.isfinite(v).any()
            return (float(np.nanmin(v)), float(np.nanmax(v))) if finite else (math.nan, math.nan)

        for s in self.splits:
            out[f"{s}_loss_min"], out[f"{s}_loss_max"] = span(self.values[f"{s}_loss"])
            for col, by_split in self.point_metrics.items():
                out[f"{s}_{col}_min"], out[f"{s}_{col}_max"] = span(by_split[s])
        if self.explained_variance is not None:
            out["explained_variance"] = [float(v) for v in self.explained_variance]
        return out

    def derived(self):
        """``x``/``y`` coordinates for netCDF readers, the splits, the orientation and how much is done."""
        attrs = {"splits": ",".join(self.splits), "orientation": "values[i, j] at (xcoordinates[i], ycoordinates[j])",
                 "cells_done": int(self.done.sum()), "complete": self.complete}
        arrays, dims = {"x": self.xcoordinates, "y": self.ycoordinates}, {"x": ("x",), "y": ("y",)}
        for col, by_split in self.point_metrics.items():
            for s, grid in by_split.items():
                arrays[f"{s}_{col}"], dims[f"{s}_{col}"] = grid, ("x", "y")
        return arrays, {**attrs, **user_metrics.columns_attr(self.point_metrics)}, dims

    @classmethod
    def from_hdf5(cls, path):
        return user_metrics.read_columns(super().from_hdf5(path), path, {"point_metrics": "{split}_{column}"})


def pending_rows(result: SurfaceResult) -> list[int]:
    """Rows (x indices) with a cell not yet computed, in order: the whole schedule."""
    return [int(i) for i in np.flatnonzero(~result.done.all(axis=1))]


def row_blocks(rows: Sequence[int], ny: int, config: SurfaceConfig, workers: int = 1) -> list[list[int]]:
    """Pending rows grouped into evaluate calls (written to the file together): ``config.rows_per_call``, or
    enough for :data:`POINTS_PER_CALL` points while every one of ``workers`` still gets a block."""
    size = config.rows_per_call or max(1, min(math.ceil(POINTS_PER_CALL / ny), math.ceil(len(rows) / workers)))
    return [list(rows[i : i + size]) for i in range(0, len(rows), size)]


RowValues = dict[str, tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]  # split -> (loss, acc, metric
# column -> values), each (rows, ny)
RowRunner = Callable[[list[list[int]]], Iterable[tuple[list[int], RowValues, float, str]]]


def surface_rows(model: nn.Module, space: ParamSpace, plane: Plane, x_values: Sequence[float], ycoords: np.ndarray,
                 data: Mapping[str, tuple[torch.Tensor, torch.Tensor]], config: SurfaceConfig,
                 metrics: Sequence[user_metrics.Bound] = ()) -> tuple[RowValues, float, str]:
    """Loss, accuracy and the metrics at ``(x, y)`` for the given x values and every y, per split: one
    evaluate call per split (the metrics in the same forward passes)."""
    xs = torch.as_tensor(np.asarray(x_values, dtype=np.float64))
    ys = torch.as_tensor(np.asarray(ycoords, dtype=np.float64))
    coords = torch.stack([xs.repeat_interleave(len(ys)), ys.repeat(len(xs))], dim=1)
    points = Affine(plane.origin, torch.stack([plane.dx, plane.dy]).to(plane.origin.dtype), coords)
    out: RowValues = {}
    seconds, method = 0.0, ""
    for s in config.split:
        x, y = data[s]
        r = evaluate(model, x, y, points, space=space, batch_size=config.chunk, device=config.device,
                     method=config.method, metrics=[b.metric for b in metrics])
        extra = {col: v.reshape(len(xs), len(ys)) for col, v in user_metrics.point_values(metrics, r.metrics,
                                                                                          r.loss).items()}
        out[s] = (r.loss.numpy().reshape(len(xs), len(ys)), r.acc.numpy().reshape(len(xs), len(ys)), extra)
        seconds += r.seconds
        method = r.method
    return out, seconds, method


def compute_surface(model: nn.Module, plane: Plane, data: Mapping[str, tuple[torch.Tensor, torch.Tensor]], *,
                    config: SurfaceConfig | None = None, partial: SurfaceResult | None = None,
                    space: ParamSpace | None = None,
                    on_rows: Callable[[SurfaceResult, list[int]], None] | None = None,
                    row_runner: RowRunner | None = None, workers: int = 1,
                    metrics: Sequence[user_metrics.Bound] | None = None) -> SurfaceResult:
    """Fill every pending row of ``partial`` (or of a fresh grid) and return the result; ``on_rows(result,
    rows)`` runs after each block of rows (the API writes the file there), ``row_runner(blocks)`` may compute
    the blocks elsewhere and yield ``(rows, values, seconds, method)`` in any order."""
    config = config or SurfaceConfig()
    space = space or ParamSpace.from_model(model)
    if metrics is None:
        metrics = user_metrics.load(config.metrics, reserved=RESERVED, analysis="surface")
    columns = [c for b in metrics for c in b.columns]
    result = partial if partial is not None else SurfaceResult.empty(plane, config, columns)
    result.metric_sources = user_metrics.sources(metrics)
    result.examples = {s: int(data[s][0].shape[0]) for s in config.split}
    blocks = row_blocks(pending_rows(result), len(result.ycoordinates), config, workers)
    if row_runner is None:
        def row_runner(todo: list[list[int]]):
            for rows in todo:
                values, seconds, method = surface_rows(model, space, plane, result.xcoordinates[rows],
                                                       result.ycoordinates, data, config, metrics)
                yield rows, values, seconds, method

    start, before = time.perf_counter(), result.seconds
    nx, ny = len(result.xcoordinates), len(result.ycoordinates)
    with progress.task(f"surface {nx}x{ny}", total=nx, unit="rows", done=nx - sum(map(len, blocks))) as task:
        for rows, values, _, method in row_runner(blocks):
            for s, (loss, acc, extra) in values.items():
                result.values[f"{s}_loss"][rows] = loss
                result.values[f"{s}_acc"][rows] = acc
                for col, v in extra.items():
                    result.point_metrics[col][s][rows] = v
            result.method = method
            result.seconds = before + time.perf_counter() - start
            if on_rows is not None:
                on_rows(result, list(rows))
            task.update(len(rows))
    result.seconds = before + time.perf_counter() - start
    return result


def _notes(result: SurfaceResult) -> list[str]:
    ev = result.explained_variance
    return [] if ev is None else [f"explained variance: PC1 {100 * ev[0]:.1f}%, PC2 {100 * ev[1]:.1f}%"]


def _rows(r: SurfaceResult) -> list[dict]:
    return [{k: v for k, v in r.summary().items() if k != "explained_variance"}]
