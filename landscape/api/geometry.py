"""Gradient geometry from checkpoint references: clipping ratio R (+ pruning levels), symmetry, norms.

Targets are checkpoint references (``PATH.h5``, ``RUN@init|@last|@step=N|@epoch=E``) or a bare run name,
which means *every* checkpoint of that run (one result row per checkpoint, against epoch). Data come from
each checkpoint's ``data_spec``; a run with a pruning mask (run array ``mask``) is analysed with its
gradients masked, as it is trained. ``workers > 1`` spreads the checkpoints of a run over processes (spawn
context, one torch thread each); the results are the same.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from landscape.analyze.clipping import ClippingConfig, ClippingResult, clipping_row
from landscape.analyze.norms import (
    NormsConfig,
    NormsResult,
    RunNorms,
    checkpoint_norms,
    histogram_edges,
    trainable_names,
)
from landscape.analyze.symmetry import (
    PLANE,
    SymmetryConfig,
    SymmetryResult,
    matrix_fingerprint,
    parameter_shapes,
    symmetry_row,
)
from landscape.api._common import (
    ProcessPool,
    checkpoint_dataset,
    config_with,
    default_output,
    map_jobs,
    run_label,
)
from landscape.errors import CheckpointError, UsageError
from landscape.results import InputRef
from landscape.store import Checkpoint, Store, load_checkpoint
from landscape.train.pruning import MASK_ARRAY, pruned_retrain

# ------------------------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    """One checkpoint to analyse: its reference, file, run (if any), step and epoch."""

    ref: str
    path: str
    run: str | None
    step: int
    epoch: float


def expand_target(store: Store, target: str) -> list[Target]:
    """A bare run name -> every checkpoint of the run; anything else -> the one checkpoint it names."""
    target = str(target).strip()
    if target and "@" not in target and not target.endswith(".h5") and "/" not in target:
        if target in store.run_names():
            run = store.run(target)
            infos = run.checkpoints()
            if not infos:
                raise CheckpointError(f"run '{target}' has no checkpoints yet")
            return [Target(f"{target}@step={i.step}", str(i.path), target, i.step, i.epoch) for i in infos]
    ckpt = store.load(target)
    return [Target(target, str(ckpt.path), ckpt.run, ckpt.step, ckpt.epoch)]


def _load(target: Target) -> Checkpoint:
    return load_checkpoint(target.path, ref=target.ref)


def _checkpoint_data(ckpt: Checkpoint, data_root: str | None, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    return checkpoint_dataset(ckpt.data_spec, data_root, purpose="draw per-sample gradients").split(split)


def _run_masks(root: str, run: str | None) -> dict[str, np.ndarray] | None:
    if run is None:
        return None
    try:
        r = Store(root).run(run)
    except CheckpointError:
        return None
    if MASK_ARRAY not in r.array_names():
        return None
    return {k: np.asarray(v) for k, v in r.load_array(MASK_ARRAY).items()}


def _torch_masks(masks: dict[str, np.ndarray] | None) -> dict[str, torch.Tensor] | None:
    return None if masks is None else {k: torch.as_tensor(v) for k, v in masks.items()}


def _inputs(targets: Sequence[Target]) -> list[InputRef]:
    return [InputRef.of(t.ref, t.path) for t in targets]


def _default_output(kind: str, targets: Sequence[Target]) -> Path:
    return default_output(f"{kind}-{run_label(targets[0].ref)}")


# ------------------------------------------------------------------------------------------ clipping


def _clipping_job(target: Target, config: ClippingConfig, masks, data_root, prune_level=math.nan):
    ckpt = _load(target)
    model = ckpt.build_model()
    x, y = _checkpoint_data(ckpt, data_root, config.split)
    row, names, num_params = clipping_row(
        model, x, y, config, masks=_torch_masks(masks), ref=target.ref, step=target.step, epoch=target.epoch,
        prune_level=prune_level,
    )
    return row, names, num_params


def clipping(
    target: str,
    *,
    root: str | os.PathLike = "checkpoints",
    config: ClippingConfig | None = None,
    output: str | os.PathLike | None = None,
    figure: bool = True,
    data_root: str | None = None,
    **options: Any,
) -> ClippingResult:
    """Watson et al. Sec. 3.1 at a checkpoint or along a run: R, the clipped mean, the Thm. 3.2 bound.

    With ``prune_levels`` the target must be a trained checkpoint of a run: for every level the run's
    trained weights give per-layer magnitude masks removing that fraction, the survivors are rewound to the
    run's initialisation, the pruned model is retrained with the run's own training configuration, and R is
    measured at the retrained final checkpoint (Watson Fig. 11). Writes ``output`` (default
    ``results/clipping-<run>.h5``) and, with ``figure``, PNG + PDF beside it.
    """
    config = config_with(ClippingConfig, config, options)
    store = Store(root)
    if config.prune_levels:
        result, inputs = _prune_levels(store, target, config, data_root)
    else:
        targets = expand_target(store, target)
        masks = {t.run: _run_masks(str(root), t.run) for t in targets}
        jobs = [(t, config, masks[t.run], data_root) for t in targets]
        outs = map_jobs(_clipping_job, jobs, config.workers)
        result = ClippingResult(config=config, layer_names=outs[0][1], rows=[o[0] for o in outs],
                                num_params=outs[0][2])
        inputs = _inputs(targets)
    bad = [r.ref for r in result.rows if not math.isfinite(r.total.R)]
    if bad:
        warnings.warn(f"non-finite gradients at {', '.join(bad)} (a diverged checkpoint?): R and the bound are NaN",
                      RuntimeWarning, stacklevel=2)
    path = Path(output) if output is not None else _default_output("clipping", [Target(target, "", None, 0, 0)])
    result.to_hdf5(path, inputs=inputs)
    result.output = path
    if figure:
        from landscape.plots.clipping import plot_clipping

        result.figures = plot_clipping(result, path)
    return result


def _prune_levels(store: Store, target: str, config: ClippingConfig, data_root):
    """Watson Fig. 11: prune (magnitude, per layer) -> rewind to init -> retrain -> R at the trained checkpoint."""
    trained = store.load(target)
    if trained.run is None:
        raise UsageError(f"--prune-levels needs a checkpoint of a run (to rewind to its @init), got {target}")
    run = store.run(trained.run)
    if not run.manifest.get("config"):
        raise UsageError(f"run '{trained.run}' records no training configuration to retrain the pruned models with")
    init = store.load(f"{trained.run}@init")
    rows, names, num_params = [], None, 0
    inputs = [trained.input_ref(), init.input_ref()]
    for level in config.prune_levels:
        done = pruned_retrain(store, trained, init, level)
        last = done.checkpoints()[-1]
        t = Target(f"{done.name}@step={last.step}", str(last.path), done.name, last.step, last.epoch)
        row, names, num_params = _clipping_job(t, config, _run_masks(str(store.root), done.name), data_root,
                                               prune_level=level)
        rows.append(row)
        inputs.append(InputRef.of(t.ref, t.path))
    return ClippingResult(config=config, layer_names=names, rows=rows, num_params=num_params), inputs


# ------------------------------------------------------------------------------------------ symmetry


def _symmetry_job(target: Target, config: SymmetryConfig, masks, data_root):
    ckpt = _load(target)
    model = ckpt.build_model()
    x, y = _checkpoint_data(ckpt, data_root, config.split)
    row = symmetry_row(model, x, y, config, masks=_torch_masks(masks), ref=target.ref, step=target.step,
                       epoch=target.epoch)
    shapes = parameter_shapes(model)
    return row, shapes


def symmetry(
    target: str,
    *,
    root: str | os.PathLike = "checkpoints",
    config: SymmetryConfig | None = None,
    output: str | os.PathLike | None = None,
    figure: bool = True,
    data_root: str | None = None,
    **options: Any,
) -> SymmetryResult:
    """Zhu & Blaschko App. F at a checkpoint or along a run: projected gradient deviations and how symmetric
    they are (energy test of xi vs -xi, skewness). Every checkpoint uses the same projection matrix."""
    config = config_with(SymmetryConfig, config, options)
    store = Store(root)
    targets = expand_target(store, target)
    masks = {t.run: _run_masks(str(root), t.run) for t in targets}
    outs = map_jobs(_symmetry_job, [(t, config, masks[t.run], data_root) for t in targets], config.workers)
    shapes = outs[0][1]
    if any(s != shapes for _, s in outs):
        raise UsageError("the checkpoints have different parameter shapes; one projection matrix cannot serve them all")
    result = SymmetryResult(
        config=config, rows=[r for r, _ in outs], fingerprint=matrix_fingerprint(config.seed, shapes, PLANE),
        num_params=sum(math.prod(s) for s in shapes),
    )
    path = Path(output) if output is not None else _default_output("symmetry", targets)
    result.to_hdf5(path, inputs=_inputs(targets))
    result.output = path
    if figure:
        from landscape.plots.symmetry import plot_symmetry

        result.figures = plot_symmetry(result, path)
    return result


# --------------------------------------------------------------------------------------------- norms


def _range_job(target: Target) -> tuple[float, float]:
    ckpt = _load(target)
    model = ckpt.build_model()
    names = trainable_names(model)
    lo = min(float(ckpt.state_dict[n].min()) for n in names)
    hi = max(float(ckpt.state_dict[n].max()) for n in names)
    return lo, hi


def _norms_job(target: Target, init_path: str | None, config: NormsConfig, edges, masks, data_root):
    ckpt = _load(target)
    model = ckpt.build_model()
    init = load_checkpoint(init_path).state_dict if init_path else None
    x = y = None
    if config.grad_samples > 0:
        x, y = _checkpoint_data(ckpt, data_root, config.split)
    from landscape.persample import PerSampleEngine

    engine = None
    if masks is not None:
        engine = _MaskedNorms(PerSampleEngine(model), _torch_masks(masks))
    return checkpoint_norms(model, x, y, config, edges, init=init, engine=engine, ref=target.ref,
                            step=target.step, epoch=target.epoch)


class _MaskedNorms:
    """An engine whose ``norms`` apply a run's pruning mask."""

    def __init__(self, engine, masks):
        self.engine, self.masks = engine, masks

    def norms(self, x, y, *, masks=None):
        return self.engine.norms(x, y, masks=self.masks)


def norms(
    targets: str | Sequence[str],
    *,
    root: str | os.PathLike = "checkpoints",
    config: NormsConfig | None = None,
    output: str | os.PathLike | None = None,
    figure: bool = True,
    data_root: str | None = None,
    **options: Any,
) -> NormsResult:
    """Watson App. Figs. 16-17 for one or more runs / checkpoints: parameter histograms, distances from the
    origin and from initialisation, per-layer norms, per-sample gradient norms; ratios to the first target."""
    config = config_with(NormsConfig, config, options)
    store = Store(root)
    labels = [targets] if isinstance(targets, str) else list(targets)
    groups = [expand_target(store, t) for t in labels]
    if not groups:
        raise UsageError("norms needs at least one run or checkpoint")
    flat = [t for g in groups for t in g]
    epochs = sorted({t.epoch for t in flat})
    missing = [e for e in config.grad_epochs or () if not any(math.isclose(e, have, abs_tol=1e-6) for have in epochs)]
    if missing:
        raise UsageError(f"--grad-epochs {', '.join(f'{e:g}' for e in missing)}: no such checkpoint epoch "
                         f"(available: {', '.join(f'{e:g}' for e in epochs)})")
    with ProcessPool(config.workers) as pool:
        ranges = pool.map(_range_job, [(t,) for t in flat])
        edges = histogram_edges(min(r[0] for r in ranges), max(r[1] for r in ranges), config.bins)
        jobs, runs = [], []
        for label, group in zip(labels, groups, strict=True):
            init_path = _init_path(store, group[0].run)
            masks = _run_masks(str(root), group[0].run)
            jobs += [(t, init_path, config, edges, masks, data_root) for t in group]
            model = _load(group[0]).build_model()
            runs.append(RunNorms(label=str(label), optimizer=_optimizer(store, group[0].run),
                                 layer_names=trainable_names(model)))
        rows = iter(pool.map(_norms_job, jobs))
    for run, group in zip(runs, groups, strict=True):
        run.rows = [next(rows) for _ in group]
    result = NormsResult(config=config, edges=edges, runs=runs)
    path = Path(output) if output is not None else _default_output("norms", flat)
    result.to_hdf5(path, inputs=_inputs(flat))
    result.output = path
    if figure:
        from landscape.plots.norms import plot_norms

        result.figures = plot_norms(result, path)
    return result


def _init_path(store: Store, run: str | None) -> str | None:
    if run is None:
        return None
    try:
        return str(store.run(run).select("init").path)
    except CheckpointError:
        return None


def _optimizer(store: Store, run: str | None) -> str:
    if run is None:
        return ""
    try:
        manifest = store.run(run).manifest
    except CheckpointError:
        return ""
    opt = str((manifest.get("config") or {}).get("optimizer") or "")
    if MASK_ARRAY in store.run(run).array_names():
        opt = f"{opt} (pruned)" if opt else "pruned"
    return opt
