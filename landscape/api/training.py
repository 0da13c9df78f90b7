"""Python face of training: ``train`` (also ``--from`` and ``--resume``) and ``phases``.

>>> from landscape.api.training import TrainConfig, train
>>> run = train(TrainConfig(model="lenet", data="digits", epochs=3), root="checkpoints")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from landscape import plugins
from landscape.data import load_dataset
from landscape.errors import CheckpointError
from landscape.store import Run, Store
from landscape.train.callbacks import Callback
from landscape.train.config import PhasesConfig, TrainConfig, config_hash
from landscape.train.loop import DEFAULT_DATA, DEFAULT_MODEL, calibrate_noise
from landscape.train.loop import train as _train
from landscape.train.sampling import steps_per_epoch

__all__ = ["PhasesConfig", "RunSummary", "TrainConfig", "phases", "resume", "summarize", "train"]


@dataclass
class RunSummary:
    """One run as the CLI prints it: where it is, how far it got and how good its last checkpoint is."""

    run: str
    path: Path
    step: int
    epoch: float
    epsilon: float | None
    train_loss: float | None
    train_acc: float | None
    test_loss: float | None
    test_acc: float | None
    optimizer: str | None = None
    parent: str | None = None
    phase1: str | None = None
    phase2: str | None = None
    copy: int | None = None
    seconds: float | None = None


def summarize(run: Run) -> RunSummary:
    """The last checkpoint's step, epsilon and train/test metrics, plus lineage and phases labels."""
    infos = run.checkpoints()
    last = infos[-1] if infos else None
    metrics = last.metrics if last is not None else {}
    lineage = run.manifest.get("lineage") or {}
    phases_ = run.manifest.get("phases") or {}
    parent = f"{lineage['parent_run']}@step={lineage['parent_step']}" if lineage.get("parent_run") else None
    return RunSummary(
        run=run.name,
        path=run.path,
        step=last.step if last else 0,
        epoch=last.epoch if last else 0.0,
        epsilon=last.epsilon if last else None,
        train_loss=metrics.get("train_loss"),
        train_acc=metrics.get("train_acc"),
        test_loss=metrics.get("test_loss"),
        test_acc=metrics.get("test_acc"),
        optimizer=(run.manifest.get("config") or {}).get("optimizer"),
        parent=parent,
        phase1=phases_.get("phase1"),
        phase2=phases_.get("phase2"),
        copy=phases_.get("copy"),
        seconds=metrics.get("wall_seconds"),
    )


def train(
    config: TrainConfig,
    *,
    root: str | Path,
    callbacks: Sequence[Callback] = (),
    progress: bool | None = None,
    phases: dict[str, Any] | None = None,
) -> Run:
    """Train a run (from scratch, from ``config.from_ref``, or resume ``config.resume``); see landscape.train.loop."""
    return _train(config, root=root, callbacks=callbacks, progress=progress, phases=phases)


def resume(run: str, *, root: str | Path, data_root: str | None = None, progress: bool | None = None) -> Run:
    """Continue a killed run from its last checkpoint, or from step 0 when it was killed before writing one
    (bit-identical to an uninterrupted run on CPU with fixed seeds). Another process writing the run is a
    RunBusyError (one writer per run)."""
    return _train(TrainConfig(resume=run, data_root=data_root), root=root, progress=progress)


def phases(config: PhasesConfig, *, root: str | Path, progress: bool | None = None) -> list[RunSummary]:
    """Phase 1 / Phase 2 branches (Watson et al. 2023, Sec. 4.1.1); returns one summary per run.

    Every Phase-1 family trains ``k`` epochs from the same initialisation (same seed); from each one's
    last checkpoint every Phase-2 family trains ``epochs - k`` epochs in ``copies`` copies (seed
    ``seed + 1 + i``). DP phases share ONE noise multiplier: ``--noise-multiplier`` or, for
    ``--target-epsilon``, the sigma whose epsilon after ``epochs`` DP epochs equals the target, so the
    DP->DP runs end at the target and SGD->DP runs (only ``epochs - k`` DP epochs) below it. Each Phase-2
    run's recorded epsilon composes its own steps with its Phase-1 parent's when that parent was DP.

    Runs that already exist with the same configuration are reused (resumed when incomplete), so an
    interrupted ``phases`` command can simply be run again.
    """
    config.validate()
    with plugins.trusting(plugins.code_refs(config.base.model, config.base.data)):  # Phase 2 rebuilds Phase 1's
        return _phases(config, root=root, progress=progress)


def _phases(config: PhasesConfig, *, root: str | Path, progress: bool | None) -> list[RunSummary]:
    config = dataclasses.replace(config, base=dataclasses.replace(
        config.base, model=config.base.model or DEFAULT_MODEL, data=config.base.data or DEFAULT_DATA))
    base = config.base
    store = Store(root)
    group = config.group or f"phases-{_phases_hash(config)}"
    sigma = base.noise_multiplier
    uses_dp = "dpsgd" in (*config.phase1, *config.phase2)
    if uses_dp and sigma is None:
        data = load_dataset(base.data, seed=base.data_seed, subset=base.subset, data_root=base.data_root,
                            download=base.download, **base.data_kwargs)
        n = len(data.y_train)
        q = min(1.0, base.batch_size / n)
        total = base.epochs * steps_per_epoch(n, base.batch_size)
        sigma = calibrate_noise(base.target_epsilon, q, total, base.delta, base.accountant)
    label = {"group": group, "k": config.k, "epsilon_target": base.target_epsilon if uses_dp else None,
             "noise_multiplier": sigma if uses_dp else None}
    summaries: list[RunSummary] = []
    for p1 in config.phase1:
        name1 = f"{group}-{p1}"
        cfg1 = config.phase_config(p1, epochs=config.k, seed=base.seed, noise_multiplier=sigma, run=name1)
        run1 = ensure(store, cfg1, {**label, "phase1": p1, "phase2": None, "copy": None}, progress)
        summaries.append(summarize(run1))
        for p2 in config.phase2:
            for i in range(config.copies):
                cfg2 = config.phase_config(
                    p2, epochs=base.epochs - config.k, seed=base.seed + 1 + i, noise_multiplier=sigma,
                    from_ref=f"{name1}@last", run=f"{group}-{p1}-{p2}-{i}",
                )
                run2 = ensure(store, cfg2, {**label, "phase1": p1, "phase2": p2, "copy": i}, progress)
                summaries.append(summarize(run2))
    return summaries


def _phases_hash(config: PhasesConfig) -> str:
    import hashlib
    import json

    blob = json.dumps({"base": config_hash(config.base), "k": config.k, "copies": config.copies,
                       "phase1": list(config.phase1), "phase2": list(config.phase2), "dp_lr": config.dp_lr,
                       "dp_momentum": config.dp_momentum},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def ensure(store: Store, config: TrainConfig, phases_label: dict[str, Any] | None = None,
           progress: bool | None = None) -> Run:
    """Train ``config`` (named: ``config.run``) unless a run of that name with the same config hash exists (then
    resume it; a finished one is returned as it is); a run of that name with another configuration is refused."""
    if config.run in store.run_names():
        run = store.run(config.run)
        if run.manifest.get("config_hash") != config_hash(config):
            raise CheckpointError(
                f"run '{config.run}' already exists with a different configuration; choose another --group"
            )
        return _train(TrainConfig(resume=config.run, data_root=config.data_root), root=store.root, progress=progress)
    return _train(config, root=store.root, progress=progress, phases=phases_label)
