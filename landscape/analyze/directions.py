"""Loss profiles ``L(theta_A + t * D * d_i / ||d_i||)`` along seeded random directions, against the straight
path toward a second solution (Watson et al. Sec. 4.1.2, Fig. 4: from a basin floor the loss stays flat toward
a sibling but rises fast along random directions). Only parameters move; buffers stay theta_A's."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from landscape import metrics as user_metrics
from landscape import progress
from landscape.analyze.specs import DirectionsConfig
from landscape.directions import max_abs_cosine, random_directions
from landscape.errors import NonFiniteError, UsageError, param
from landscape.evaluate import Affine, Segment, evaluate
from landscape.options import build
from landscape.params import ParamSpace
from landscape.results import StoredResult, stored

KIND = "directions"
GENERATOR_BUDGET = 1 << 29  # bytes of cached first-layer outputs per evaluate call (chooses the chunk size)
RESERVED = ("loss", "acc", "distance", "distances", "rise")  # direction_<column>, toward_<column> are taken


def rays(origin: torch.Tensor, directions: torch.Tensor, steps: torch.Tensor) -> Affine:
    """Points ``origin + s * directions[j]`` for every direction j (outer) and step s (inner)."""
    k, p = directions.shape[0], steps.numel()
    coords = torch.zeros(k * p, k, dtype=torch.float64)
    for j in range(k):
        coords[j * p : (j + 1) * p, j] = steps
    return Affine(origin, directions, coords)


def scaled_directions(theta: torch.Tensor, space: ParamSpace, indices: Sequence[int], config: DirectionsConfig,
                      distance: float) -> torch.Tensor:
    """Directions ``indices`` of ``config.seed``, normalised per config, rescaled to length ``distance``."""
    dirs, norms = nonzero_random_directions(theta, space, indices, seed=config.seed, normalize=config.normalize,
                                            biasbn=config.biasbn)
    return (dirs.double() * (distance / norms).unsqueeze(1)).to(theta.dtype)


def nonzero_random_directions(theta: torch.Tensor, space: ParamSpace, indices: Sequence[int], *, seed: int,
                              normalize: str, biasbn: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`landscape.directions.random_directions` and their float64 norms; a UsageError if one is zero."""
    dirs = random_directions(theta, space, indices, seed=seed, normalize=normalize, biasbn=biasbn)
    norms = torch.linalg.vector_norm(dirs.double(), dim=1)
    if bool((norms == 0).any()):
        raise UsageError(f"a random direction is zero (every tensor was zeroed by {param('biasbn', 'zero')}); use {param('biasbn', 'random')}")
    return dirs, norms


def direction_chunk(model: nn.Module, space: ParamSpace, theta: torch.Tensor, dirs: torch.Tensor,
                    steps: torch.Tensor, x: torch.Tensor, y: torch.Tensor, config: DirectionsConfig,
                    metrics: Sequence[user_metrics.Bound] = ()
                    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], float]:
    """Loss, accuracy and metric columns (k, len(steps)) at ``theta + s * dirs[j]``, and the seconds."""
    r = evaluate(model, x, y, rays(theta, dirs, steps), space=space, batch_size=config.chunk,
                 device=config.device, method=config.method, metrics=[b.metric for b in metrics])
    k = dirs.shape[0]
    values = {col: v.reshape(k, -1) for col, v in user_metrics.point_values(metrics, r.metrics, r.loss).items()}
    return r.loss.numpy().reshape(k, -1), r.acc.numpy().reshape(k, -1), values, r.seconds


def chunk_size(model: nn.Module, x: torch.Tensor, batch_size: int, budget: int = GENERATOR_BUDGET) -> int:
    """How many directions one evaluate call may hold: the cached first-layer outputs within ``budget``."""
    sizes: list[int] = []  # the output size of each layer with parameters, on one example
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    hooks = [m.register_forward_hook(lambda mod, a, out: sizes.append(out.numel()) if isinstance(out, torch.Tensor)
                                     else None) for m in owners]
    try:
        with torch.inference_mode():
            model(x[:1])
    finally:
        for h in hooks:
            h.remove()
    per_direction = max(1, (sizes[0] if sizes else 1) * min(batch_size, x.shape[0]) * 4)
    return max(1, budget // per_direction - 1)


@dataclass
class DirectionsResult(StoredResult):
    """Profiles along ``n`` random directions (rows) at ``t * distance``, and toward a target if given."""

    KIND = KIND
    CONFIG = DirectionsConfig

    t: np.ndarray = stored("array", dims=("t",))
    distance: float = stored("attr")
    direction_loss: np.ndarray = stored("array", dims=("direction", "t"))  # (n, points)
    direction_acc: np.ndarray = stored("array", dims=("direction", "t"))
    max_abs_cos: float = stored("attr")
    toward_loss: np.ndarray | None = stored("array", None, dims=("t",))  # (points,)
    toward_acc: np.ndarray | None = stored("array", None, dims=("t",))
    toward_distance: float = math.nan  # ||theta_B - theta_A||
    # --metric: column -> (n, points) along the directions, (points,) toward B (direction_/toward_<column>)
    point_metrics: dict[str, np.ndarray] = stored("skip", default_factory=dict)
    toward_metrics: dict[str, np.ndarray] = stored("skip", default_factory=dict)
    metric_sources: list[dict] = stored("attr", default_factory=list)
    examples: int = 0
    seconds: float = math.nan
    throughput: float = math.nan  # points per second
    method: str = ""
    config: DirectionsConfig = field(default_factory=DirectionsConfig)

    @property
    def rises(self) -> np.ndarray:
        """``L(theta_A + D d_i) - L(theta_A)`` per direction."""
        return self.direction_loss[:, -1] - self.direction_loss[:, 0]

    @property
    def toward_rise(self) -> float:
        return math.nan if self.toward_loss is None else float(self.toward_loss[-1] - self.toward_loss[0])

    def summary(self) -> dict[str, float]:
        """Rise statistics of the random directions against the rise toward the target."""
        r = self.rises
        finite = r[np.isfinite(r)]

        def stat(f) -> float:
            return float(f(finite)) if finite.size else math.nan

        out = {
            "n": int(r.size), "distance": self.distance, "max_abs_cos": self.max_abs_cos,
            "base_loss": float(self.direction_loss[0, 0]),
            "rise_mean": stat(np.mean), "rise_median": stat(np.median), "rise_min": stat(np.min),
            "rise_max": stat(np.max), "toward_rise": self.toward_rise,
        }
        if self.toward_loss is not None:
            out["fraction_above_toward"] = float(np.mean(r > self.toward_rise))
            out["median_over_toward"] = (out["rise_median"] / self.toward_rise if self.toward_rise > 0 else math.inf)
        return out

    def derived(self):
        """The distances ``t * D``, each direction's rise, the summary statistics, ``n`` and the split."""
        attrs = {k: v for k, v in self.summary().items() if k != "n"}
        attrs.update(n=int(self.direction_loss.shape[0]), split=self.config.split)
        arrays = {"distances": self.t * self.distance, "rise": self.rises}
        dims = {"distances": ("t",), "rise": ("direction",)}
        for col, v in self.point_metrics.items():
            arrays[f"direction_{col}"], dims[f"direction_{col}"] = v, ("direction", "t")
        for col, v in self.toward_metrics.items():
            arrays[f"toward_{col}"], dims[f"toward_{col}"] = v, ("t",)
        return arrays, {**attrs, **user_metrics.columns_attr(self.point_metrics)}, dims

    @classmethod
    def from_hdf5(cls, path):
        return user_metrics.read_columns(super().from_hdf5(path), path, {
            "point_metrics": "direction_{column}", "toward_metrics": "toward_{column}"})


ChunkRunner = Callable[[list[list[int]], float, torch.Tensor],
                       Iterable[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], float]]]


def random_profiles(model: nn.Module, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, *,
                    config: DirectionsConfig | None = None, toward: torch.Tensor | None = None,
                    space: ParamSpace | None = None, chunk_runner: ChunkRunner | None = None,
                    workers: int = 1, metrics: Sequence[user_metrics.Bound] | None = None, **overrides
                   ) -> DirectionsResult:
    """Watson et al. Fig. 4 for one model: profiles along ``config.directions`` random directions (and toward
    ``toward``), ``theta``/``toward`` flat vectors over ``space``. ``chunk_runner(chunks, distance, steps)``
    may evaluate the chunks of direction indices elsewhere, yielding ``(loss, acc, metric values, seconds)``
    in order. Keyword ``overrides`` replace config fields."""
    config = build(DirectionsConfig, overrides, base=config)
    space = space or ParamSpace.from_model(model)
    theta = theta.detach()
    if theta.numel() != space.dim:
        raise UsageError(f"theta has {theta.numel()} entries, the model's space has {space.dim}")
    toward_distance = math.nan
    if toward is not None:
        toward = toward.detach().to(theta.dtype)
        toward_distance = float(torch.linalg.vector_norm((toward - theta).double()))
    if config.distance == "auto":
        if toward is None:
            raise UsageError(f"{param('distance', 'auto')} needs {param('toward')} (or give a number)")
        if toward_distance == 0:
            raise UsageError(f"{param('distance', 'auto')}: A and B are the same point (distance 0); give a number")
        distance = toward_distance
    else:
        distance = float(config.distance)
    t = torch.linspace(0.0, 1.0, config.points, dtype=torch.float64)
    t[0], t[-1] = 0.0, 1.0
    steps = t[1:]  # fractions of the directions, which have length `distance`
    start = time.perf_counter()
    bound = metrics if metrics is not None else user_metrics.load(config.metrics, reserved=RESERVED,
                                                                  analysis="directions")

    # t = 0 (theta_A, shared by every profile), on the path toward B when there is one
    path = theta.unsqueeze(0)
    if toward is not None:
        if config.distance == "auto":
            end = toward
        elif toward_distance > 0:
            end = (theta.double() + (toward - theta).double() * (distance / toward_distance)).to(theta.dtype)
        else:
            raise UsageError(f"{param('toward')} is the same point as A; there is no direction toward it")
        path = Segment(theta, end, t)
    r0 = evaluate(model, x, y, path, space=space, batch_size=config.chunk, device=config.device,
                  method=config.method, metrics=[b.metric for b in bound])
    values = user_metrics.point_values(bound, r0.metrics, r0.loss)
    base_loss, base_acc, method = float(r0.loss[0]), float(r0.acc[0]), r0.method
    base_metrics = {col: v[0] for col, v in values.items()}
    toward_loss, toward_acc, toward_metrics = ((r0.loss.numpy(), r0.acc.numpy(), values) if toward is not None
                                               else (None, None, {}))

    # the random directions: all of them for the cosines, evaluated in chunks
    dirs = scaled_directions(theta, space, range(config.directions), config, distance)
    cos = max_abs_cosine(dirs)
    size = chunk_size(model, x, config.chunk)
    if chunk_runner is not None:
        size = min(size, max(1, math.ceil(config.directions / (2 * workers))))
    chunks = [list(range(i, min(config.directions, i + size))) for i in range(0, config.directions, size)]
    if chunk_runner is None:
        outs: Iterator = (direction_chunk(model, space, theta, dirs[c[0] : c[-1] + 1], steps, x, y, config, bound)
                          for c in chunks)
    else:
        outs = iter(chunk_runner(chunks, distance, steps))
    losses, accs, extras = [], [], []
    with progress.task("directions", total=config.directions, unit="directions") as task:
        for chunk, (loss, acc, extra, _) in zip(chunks, outs, strict=True):  # a chunk's profiles, in order
            losses.append(loss)
            accs.append(acc)
            extras.append(extra)
            task.update(len(chunk))
    n = config.directions

    def profiles(base: float, chunks: list[np.ndarray]) -> np.ndarray:  # t = 0, then the chunks' steps
        return np.concatenate([np.full((n, 1), base), np.concatenate(chunks)], axis=1)

    direction_loss, direction_acc = profiles(base_loss, losses), profiles(base_acc, accs)
    direction_metrics = {col: profiles(base, [e[col] for e in extras]) for col, base in base_metrics.items()}
    seconds = time.perf_counter() - start
    total_points = n * (config.points - 1) + (config.points if toward is not None else 1)
    if not np.isfinite(direction_loss[:, 1:]).any():
        raise NonFiniteError(f"every loss along the {n} direction(s) at distance {distance:g} is non-finite (NaN or "
                             f"inf): the distance overflows float32 weights or the checkpoint diverged; give a "
                             f"smaller {param('distance')}")
    return DirectionsResult(
        t=t.numpy(), distance=distance, direction_loss=direction_loss, direction_acc=direction_acc,
        max_abs_cos=cos, toward_loss=toward_loss, toward_acc=toward_acc, toward_distance=toward_distance,
        point_metrics=direction_metrics, toward_metrics=toward_metrics, metric_sources=user_metrics.sources(bound),
        examples=int(x.shape[0]), seconds=seconds, throughput=total_points / seconds if seconds > 0 else math.inf,
        method=method, config=config,
    )


def _rows(result: DirectionsResult) -> list[dict]:
    """The rise of the loss, then of each metric, along the random directions and toward B."""
    stats = ("mean", "median", "min", "max")
    rows = []
    metrics = [(f": {c}", v, result.toward_metrics.get(c)) for c, v in result.point_metrics.items()]
    for col, values, toward in [("", result.direction_loss, result.toward_loss), *metrics]:
        rise = values[:, -1] - values[:, 0]
        finite = rise[np.isfinite(rise)]
        rows.append({"": f"random{col}", "n": int(rise.size),
                     **{k: float(f(finite)) if finite.size else math.nan
                        for k, f in zip(stats, (np.mean, np.median, np.min, np.max), strict=True)}})
        if toward is not None:
            rows.append({"": f"toward B{col}", "n": 1, **dict.fromkeys(stats, float(toward[-1] - toward[0]))})
    return rows


def _notes(result: DirectionsResult) -> list[str]:
    s = result.summary()
    lines = [f"loss rise at distance {result.distance:.4g} ({result.config.split} loss at A {s['base_loss']:.4g}); "
             f"max |cos| between directions {result.max_abs_cos:.3g}"]
    if result.toward_loss is not None:
        lines.append(f"{100 * s['fraction_above_toward']:.0f}% of random directions rise more than toward B")
    return lines


def _details(r: DirectionsResult) -> dict:
    return {**r.summary(), "seconds": r.seconds, "points_per_second": r.throughput}
