"""How ``directions`` and ``surface`` run (their ``execute`` hooks): the extra checkpoints resolved, the work
spread over worker processes (each rebuilds the model and data once), the surface written after every block
of rows and resumed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from landscape import metrics as user_metrics
from landscape.analyze import directions as directions_analysis
from landscape.analyze import surface as surface_analysis
from landscape.analyze.directions import DirectionsResult, direction_chunk, random_profiles, scaled_directions
from landscape.analyze.specs import DirectionsConfig, SurfaceConfig
from landscape.analyze.surface import (
    Plane,
    SurfaceResult,
    checkpoint_plane,
    compute_surface,
    pca_plane,
    random_plane,
    surface_rows,
)
from landscape.api._common import checkpoint_dataset
from landscape.api.execution import ExecutionOptions, ProcessPool, worker_state
from landscape.api.resolve import Point, Resolver, Target, compare_others
from landscape.errors import CheckpointError, UsageError, param
from landscape.params import ParamSpace
from landscape.refs import Ref
from landscape.results import InputRef
from landscape.store import Checkpoint


def run_directions(resolver: Resolver, ref_a: str, config: DirectionsConfig, options, execution: ExecutionOptions,
                   out: Path) -> tuple[DirectionsResult, list[InputRef], dict]:
    """Resolve A (and ``options.toward``) and evaluate :func:`random_profiles`; the runner writes and
    draws."""
    toward = options.toward
    if config.distance == "auto" and toward is None:  # before anything is loaded
        raise UsageError(f"{param('distance', 'auto')} needs {param('toward')} (or give a number)")
    point_a = resolver.point(ref_a, data=False)
    a = point_a.checkpoint
    b = _checked(resolver, toward, point_a) if toward is not None else None
    model = a.build_model()
    space = ParamSpace.from_model(model)
    theta = space.flatten(a.state_dict)
    x, y = _split_data(a.data_spec, config.split, config.subset, config.subset_seed, resolver.data_root,
                       resolver.download)
    metrics = user_metrics.load(config.metrics, reserved=directions_analysis.RESERVED, analysis="directions")
    runner = None
    if execution.workers > 1:
        payload = _Payload(a.model_spec, a.state_dict, a.data_spec, resolver.data_root, resolver.download, config,
                           metric_sources=user_metrics.sources(metrics), workers=execution.workers)
        def runner(chunks: list[list[int]], distance: float, steps: torch.Tensor) -> Iterator:
            return _in_workers(payload, _direction_job, [(c, distance, steps) for c in chunks], ordered=True)
    result = random_profiles(model, theta, x, y, config=config, toward=None if b is None else space.flatten(b.state_dict),
                             space=space, chunk_runner=runner, workers=execution.workers, metrics=metrics)
    attrs = compare_others(a, [b] if b is not None else [], what="B")
    return result, [a.input_ref()] + ([b.input_ref()] if b is not None else []), attrs


def _checked(resolver: Resolver, ref, a: Point) -> Checkpoint:
    """B, C or a trajectory checkpoint, loaded, verified and checked against A."""
    return resolver.point(ref, like=a, label=str(ref.ref if isinstance(ref, Target) else Ref.parse(ref)),
                          data=False).checkpoint


@dataclasses.dataclass
class _Payload:
    """What a worker process needs to rebuild the model, theta_A and the data (sent once per worker)."""

    model_spec: dict
    state_dict: dict
    data_spec: dict
    data_root: str | None
    download: bool
    config: Any
    plane: Plane | None = None
    metric_sources: list | None = None  # the parent's metric provenance: a worker refuses code changed since
    workers: int = 1  # how many processes share the chunks / row blocks


def _init_worker(payload: _Payload) -> dict[str, Any]:
    """The worker state: the model, theta_A and the data rebuilt once per worker process."""
    from landscape.models import model_from_spec

    model = model_from_spec(payload.model_spec)
    model.load_state_dict(payload.state_dict, strict=True)
    space = ParamSpace.from_model(model)
    cfg = payload.config
    splits = cfg.split if isinstance(cfg, SurfaceConfig) else (cfg.split,)
    data = {s: _split_data(payload.data_spec, s, cfg.subset, cfg.subset_seed, payload.data_root, payload.download)
            for s in splits}
    analysis = surface_analysis if isinstance(cfg, SurfaceConfig) else directions_analysis
    metrics = user_metrics.load(cfg.metrics, reserved=analysis.RESERVED, analysis=analysis.KIND,
                                sources=payload.metric_sources)  # the references, loaded in this process
    return dict(model=model, space=space, theta=space.flatten(payload.state_dict), data=data, config=cfg,
                plane=payload.plane, metrics=metrics)


def _direction_job(indices: list[int], distance: float, steps: torch.Tensor):
    w = worker_state()
    cfg: DirectionsConfig = w["config"]
    dirs = scaled_directions(w["theta"], w["space"], indices, cfg, distance)
    x, y = w["data"][cfg.split]
    return direction_chunk(w["model"], w["space"], w["theta"], dirs, steps, x, y, cfg, w["metrics"])


def _in_workers(payload: _Payload, job: Callable, jobs: list[tuple], *, ordered: bool) -> Iterator:
    """``job(*args)`` for each of ``jobs`` in worker processes (or Dask workers) initialised once with
    ``payload``: the results in order, or as they finish. On an error or interrupt the jobs not started are
    dropped (rows already written stay; a rerun resumes them)."""
    if not jobs:
        return
    pool = ProcessPool(min(payload.workers, len(jobs)), initializer=_init_worker, initargs=(payload,))
    try:
        futures = [pool.submit(job, *args) for args in jobs]
        for f in futures if ordered else pool.as_completed(futures):
            yield f.result()
    finally:
        pool.shutdown(cancel=True)


def run_surface(resolver: Resolver, ref_a: str, config: SurfaceConfig, options, execution: ExecutionOptions,
                out: Path) -> tuple[SurfaceResult, list[InputRef], dict]:
    """The surface around A, written to ``out`` after every block of rows, resumed unless ``restart``."""
    point_a = resolver.point(ref_a, data=False)
    a = point_a.checkpoint
    model = a.build_model()
    space = ParamSpace.from_model(model)
    theta = space.flatten(a.state_dict)
    plane, extra_inputs, others = _plane(resolver, point_a, space, theta, config)
    attrs = compare_others(a, others, what="the plane's checkpoint" + ("s" if len(others) > 1 else ""))
    inputs = [a.input_ref(), *extra_inputs]
    metrics = user_metrics.load(config.metrics, reserved=surface_analysis.RESERVED, analysis="surface")
    partial = _resume(out, config, inputs, plane) if options.resume else None
    if partial is None:
        partial = SurfaceResult.empty(plane, config, [c for b in metrics for c in b.columns])
    partial.config, partial.metric_sources = config, user_metrics.sources(metrics)
    partial.to_hdf5(out, inputs=inputs, attrs=attrs)
    data = {s: _split_data(a.data_spec, s, config.subset, config.subset_seed, resolver.data_root, resolver.download)
            for s in config.split}

    def written(result: SurfaceResult, rows: list[int]) -> None:
        result.to_hdf5(out, inputs=inputs, attrs=attrs)
        if options.on_rows is not None:
            options.on_rows(result, rows)

    runner = None
    if execution.workers > 1:
        payload = _Payload(a.model_spec, a.state_dict, a.data_spec, resolver.data_root, resolver.download, config,
                           plane, metric_sources=user_metrics.sources(metrics), workers=execution.workers)
        xs, ys = partial.xcoordinates, partial.ycoordinates

        def runner(blocks: list[list[int]]) -> Iterator:
            return _in_workers(payload, _rows_job, [(rows, xs[rows], ys) for rows in blocks], ordered=False)
    result = compute_surface(model, plane, data, config=config, partial=partial, space=space, on_rows=written,
                             row_runner=runner, workers=execution.workers, metrics=metrics)
    return result, inputs, attrs


def _plane(resolver: Resolver, point_a: Point, space: ParamSpace, theta: torch.Tensor, config: SurfaceConfig
           ) -> tuple[Plane, list[InputRef], list[Checkpoint]]:
    """The plane, the inputs it adds and the checkpoints that placed it."""
    kind = config.plane_kind
    if kind == "random":
        return random_plane(theta, space, seed=config.seed, normalize=config.normalize, biasbn=config.biasbn), [], []
    if kind == "checkpoints":
        ref_b, ref_c = config.plane_refs
        b, c = _checked(resolver, ref_b, point_a), _checked(resolver, ref_c, point_a)
        plane = checkpoint_plane(theta, space.flatten(b.state_dict), space.flatten(c.state_dict),
                                 labels=(point_a.ref, ref_b, ref_c))
        return plane, [b.input_ref(), c.input_ref()], [b, c]
    name = config.plane_refs[0]
    run = resolver.store.run(name)
    targets = [Target.of(run.name, info) for info in run.checkpoints()]
    if len(targets) < 2:
        raise CheckpointError(f"run '{run.name}' has {len(targets)} checkpoint(s); a trajectory PCA needs at least 2")
    points, steps, refs, others = [], [], [], []
    for target in targets:
        ckpt = _checked(resolver, target, point_a)
        points.append(space.flatten(ckpt.state_dict))
        steps.append(target.step)
        refs.append(ckpt.input_ref())
        others.append(dataclasses.replace(ckpt, state_dict={}))  # keep the specs, not every state in memory
    plane = pca_plane(theta, torch.stack(points), steps=steps, label=point_a.ref)
    return plane, refs, others


def _resume(out: Path, config: SurfaceConfig, inputs: list[InputRef], plane: Plane) -> SurfaceResult | None:
    if not out.exists():
        return None
    prev = SurfaceResult.from_hdf5(out)
    same = (prev.config.analysis_params() == config.analysis_params()
            and [i.sha256 for i in prev.inputs] == [i.sha256 for i in inputs]
            and prev.plane_sha256 == plane.fingerprint())
    if not same:
        raise UsageError(f"{out} holds a different surface (other options, checkpoints or plane); "
                         f"remove it, pass {param('restart', True)}, or choose another {param('output')}")
    if not user_metrics.same_code(prev.metric_sources):  # its cells would mix two versions of a metric
        raise UsageError(f"{out} was computed with other metric code (a source file changed, or a Python object); "
                         f"remove it, pass {param('restart', True)}, or choose another {param('output')}")
    return prev


def _rows_job(rows: list[int], x_values, ys):
    w = worker_state()
    values, seconds, method = surface_rows(w["model"], w["space"], w["plane"], x_values, ys, w["data"], w["config"],
                                           w["metrics"])
    return rows, values, seconds, method


def _split_data(data_spec: dict, split: str, subset, subset_seed: int, data_root: str | None, download: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
    from landscape.data import take_subset

    data = checkpoint_dataset(data_spec, data_root, download)
    return take_subset(*data.split(split), subset, subset_seed, split=split)
