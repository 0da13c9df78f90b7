"""Python face of training: ``train`` (also ``--from`` and ``--resume``) and ``phases``, and their job
kinds."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from landscape import plugins
from landscape import progress as display
from landscape.api.jobkind import JobKind, files_under, run_files, run_option, validated
from landscape.errors import CheckpointError, UsageError, param
from landscape.train.config import PhasesConfig, TrainConfig, config_hash

if TYPE_CHECKING:
    from landscape.store import Run, Store


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
    accountant: str | None = None  # the accountant the epsilon comes from
    parent_epsilon: dict[str, Any] | None = None  # what the parent reported, and by which accountant


def train(config: TrainConfig, *, root: str | Path, **options: Any) -> Run:
    """Train one run into the store at ``root`` (:func:`landscape.train.loop.train`, imported when it
    runs)."""
    from landscape.train.loop import train as train_loop

    return train_loop(config, root=root, **options)


def summarize(run: Run) -> RunSummary:
    """The last checkpoint's step, epsilon and train/test metrics, plus lineage and phases labels."""
    infos = run.checkpoints()
    last = infos[-1] if infos else None
    metrics = last.metrics if last is not None else {}
    lineage = run.manifest.get("lineage") or {}
    phases_ = run.manifest.get("phases") or {}
    privacy = run.manifest.get("privacy") or {}
    parent = f"{lineage['parent_run']}@step={lineage['parent_step']}" if lineage.get("parent_run") else None
    return RunSummary(
        run=run.name, path=run.path, step=last.step if last else 0, epoch=last.epoch if last else 0.0,
        epsilon=last.epsilon if last else None, train_loss=metrics.get("train_loss"),
        train_acc=metrics.get("train_acc"), test_loss=metrics.get("test_loss"),
        test_acc=metrics.get("test_acc"),
        optimizer=(run.manifest.get("config") or {}).get("optimizer"), parent=parent,
        phase1=phases_.get("phase1"), phase2=phases_.get("phase2"), copy=phases_.get("copy"),
        seconds=metrics.get("wall_seconds"), parent_epsilon=privacy.get("parent_epsilon"),
        accountant=privacy.get("accountant") if last is not None and last.epsilon is not None else None,
    )


def resume(run: str, *, root: str | Path, data_root: str | None = None, progress: bool | None = None) -> Run:
    """Continue a killed run from its last checkpoint (bit-identical to an uninterrupted run on CPU with fixed
    seeds); another process writing the run is a RunBusyError."""
    return train(TrainConfig(resume=run, data_root=data_root), root=root, progress=progress)


def phases(config: PhasesConfig, *, root: str | Path, progress: bool | None = None,
           report: Callable[[str], None] | None = None) -> list[RunSummary]:
    """Phase 1 / Phase 2 branches (Watson et al. 2023, Sec. 4.1.1); returns one summary per run.

    Every Phase-1 family trains ``k`` epochs from one initialisation; from each one's last checkpoint every
    Phase-2 family trains ``epochs - k`` epochs in ``copies`` copies (seed ``seed + 1 + i``). DP phases share
    one noise multiplier (for ``target_epsilon``: the one reached after ``epochs`` DP epochs). Existing runs
    with the same configuration are reused (resumed when incomplete); ``report`` receives one line per
    finished run.
    """
    config.validate()
    with plugins.trusting(plugins.code_refs(config.base.model, config.base.data)):  # Phase 2 rebuilds Phase 1's
        return _phases(config, root=root, progress=progress, report=report)


def _phases(config: PhasesConfig, *, root: str | Path, progress: bool | None,
            report: Callable[[str], None] | None) -> list[RunSummary]:
    from landscape.data import load_dataset
    from landscape.store import Store
    from landscape.train.accounting import noise_for_epsilon, steps_per_epoch
    from landscape.train.loop import DEFAULT_DATA, DEFAULT_MODEL

    config = dataclasses.replace(config, base=dataclasses.replace(
        config.base, model=config.base.model or DEFAULT_MODEL, data=config.base.data or DEFAULT_DATA,
        accountant=config.base.accountant or "rdp"))
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
        sigma = noise_for_epsilon(base.target_epsilon, q, total, base.delta, base.accountant)
    label = {"group": group, "k": config.k, "epsilon_target": base.target_epsilon if uses_dp else None,
             "noise_multiplier": sigma if uses_dp else None}
    summaries: list[RunSummary] = []
    total = len(config.phase1) * (1 + len(config.phase2) * config.copies)

    def finished(run: Run, what: str) -> None:
        task.update(1)
        summaries.append(summarize(run))
        if report is not None:
            s = summaries[-1]
            eps = f", epsilon {s.epsilon:.3g}" if s.epsilon is not None and math.isfinite(s.epsilon) else ""
            acc = f", test acc {s.test_acc:.4f}" if s.test_acc is not None else ""
            report(f"phases: [{len(summaries)}/{total}] {what} {s.run} finished (epoch {s.epoch}{acc}{eps})")

    with display.enabled(progress), display.task(f"phases {group}", total=total, unit="runs") as task:
        for p1 in config.phase1:
            name1 = f"{group}-{p1}"
            cfg1 = config.phase_config(p1, epochs=config.k, seed=base.seed, noise_multiplier=sigma, run=name1)
            finished(ensure(store, cfg1, {**label, "phase1": p1, "phase2": None, "copy": None}, progress),
                     f"phase 1 ({p1})")
            for p2 in config.phase2:
                for i in range(config.copies):
                    cfg2 = config.phase_config(
                        p2, epochs=base.epochs - config.k, seed=base.seed + 1 + i, noise_multiplier=sigma,
                        from_ref=f"{name1}@last", run=f"{group}-{p1}-{p2}-{i}", phase=2,
                    )
                    finished(ensure(store, cfg2, {**label, "phase1": p1, "phase2": p2, "copy": i}, progress),
                             f"phase 2 ({p1}->{p2}, copy {i})")
    return summaries


def _phases_hash(config: PhasesConfig) -> str:
    import hashlib
    import json

    blob = json.dumps({"base": config_hash(config.base), "k": config.k, "copies": config.copies,
                       "phase1": list(config.phase1), "phase2": list(config.phase2), "dp_lr": config.dp_lr,
                       "dp_momentum": config.dp_momentum,
                       **{k: v for k in ("phase2_sgd_lr", "phase2_sgd_momentum")  # only when set: old hashes kept
                          if (v := getattr(config, k)) is not None}},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def ensure(store: Store, config: TrainConfig, phases_label: dict[str, Any] | None = None,
           progress: bool | None = None, *, hint: str = f"; choose another {param('group')}") -> Run:
    """Train ``config`` unless a run of that name with the same config hash exists, which is resumed (a
    finished one returns at once); a run of that name with another configuration is refused (``hint``
    added)."""
    from landscape.train.loop import resolved

    if config.run in store.run_names():
        if store.run(config.run).manifest.get("config_hash") != config_hash(resolved(store, config)):
            raise CheckpointError(f"run '{config.run}' already exists with a different configuration{hint}")
        config = TrainConfig(resume=config.run, data_root=config.data_root, device=config.device)
        return train(config, root=store.root, progress=progress)
    return train(config, root=store.root, progress=progress, phases=phases_label)


_NUMBERS = ("step", "epoch", "epsilon", "train_loss", "train_acc", "test_loss", "test_acc")


def _train_job(config: TrainConfig, *, root: Path, out: Path | None = None) -> Run:
    """A train job: the same job again after a kill resumes its run (:func:`ensure`)."""
    from landscape.store import Store

    return ensure(Store(root), config, hint="")


def _train_outcome(run: Run, root: Path, out: Path | None) -> tuple[dict[str, Any], list[Path]]:
    summary = summarize(run)
    return {k: getattr(summary, k) for k in _NUMBERS}, files_under(run.path)


_COLUMNS = ("run", "optimizer", "parent", "step", "epoch", "epsilon", "train_acc", "test_acc", "test_loss", "seconds")
_PHASES_COLUMNS = ("run", "phase1", "phase2", "copy", "parent", "epoch", "epsilon", "test_acc", "test_loss")


def _train_given(given: dict[str, str]) -> None:
    """``resume`` continues with the run's stored options: no other option but ``data_root``."""
    others = [param(name) for name in given if name not in ("resume", "data_root")]
    if "resume" in given and others:
        raise UsageError(f"{param('resume')} continues with the run's stored options; drop {', '.join(others)}")


def _train_command(config: TrainConfig, *, root: Path, progress: bool | None,
                   report: Callable[[str], None] | None) -> Run:
    """``train``; ``--resume`` of a run that is already complete says so (its table follows, nothing is
    trained)."""
    from landscape.store import Store

    if config.resume is not None and report is not None and config.resume in Store(root).run_names():
        run = Store(root).run(config.resume)
        total, last = run.manifest.get("schedule", {}).get("total_steps"), run.checkpoints()
        if total is not None and last and last[-1].step >= int(total):
            report(f"run '{run.name}' is already complete (step {last[-1].step} of {total}): nothing to train")
    return train(config, root=root, progress=progress)


TRAIN_JOB = JobKind(
    name="train", config=TrainConfig, run=_train_job, skip=("resume",), required=("run",), produces=run_option,
    outcome=_train_outcome, api="landscape.train.loop:train", command=_train_command, given=_train_given,
    rows=lambda run: [_columns(summarize(run), _COLUMNS)], notes=lambda run: [f"run written to {run.path}"],
    details=lambda run: dataclasses.asdict(summarize(run)),
    doc="Train a model (SGD or the DP-SGD family) into the checkpoint store.",
)


def _columns(summary: RunSummary, columns: Sequence[str]) -> dict[str, Any]:
    return {c: getattr(summary, c) for c in columns}


def _phases_build(options: dict[str, Any]) -> PhasesConfig:
    own_fields = {f.name for f in dataclasses.fields(PhasesConfig)} - {"base"}
    own = {k: options.pop(k) for k in list(options) if k in own_fields}
    own = {k: tuple(v) if isinstance(v, list) else v for k, v in own.items()}
    return validated(PhasesConfig(base=TrainConfig(**options), **own))


def _phases_command(config: PhasesConfig, *, root: Path, progress: bool | None,
                    report: Callable[[str], None] | None) -> list[RunSummary]:
    """One line per finished run on the progress display (:func:`landscape.progress.note`)."""
    from landscape.progress import note

    return phases(config, root=root, progress=progress, report=note)


def _phases_produces(options: dict[str, Any]) -> list[str]:
    """``GROUP-P1`` and ``GROUP-P1-P2-I`` for every family and copy (the job's ``group`` is required)."""
    defaults = {f.name: f.default for f in dataclasses.fields(PhasesConfig) if f.name != "base"}
    group, copies = options["group"], options.get("copies", defaults["copies"])
    out = []
    for p1 in options.get("phase1", defaults["phase1"]):
        out.append(f"{group}-{p1}")
        out.extend(f"{group}-{p1}-{p2}-{i}" for p2 in options.get("phase2", defaults["phase2"]) for i in range(copies))
    return out


def _phases_outcome(summaries: list[RunSummary], root: Path, out: Path | None) -> tuple[dict[str, Any], list[Path]]:
    accs = [s.test_acc for s in summaries if s.test_acc is not None]
    eps = [s.epsilon for s in summaries if s.epsilon is not None and math.isfinite(s.epsilon)]
    numbers = {"runs": len(summaries), "test_acc_min": min(accs) if accs else None,
               "test_acc_max": max(accs) if accs else None, "epsilon": max(eps) if eps else None}
    return numbers, run_files(root, *(s.run for s in summaries))


PHASES_JOB = JobKind(
    name="phases", config=PhasesConfig, run=lambda config, *, root, out=None: phases(config, root=root),
    fields=((TrainConfig, ("optimizer", "run", "from_ref", "resume")), (PhasesConfig, ("base",))),
    required=("group",), build=_phases_build, produces=_phases_produces, outcome=_phases_outcome, api=phases,
    command=_phases_command, rows=lambda summaries: [_columns(s, _PHASES_COLUMNS) for s in summaries],
    notes=lambda summaries: [f"{len(summaries)} runs in {summaries[0].path.parent if summaries else '-'}"],
    details=lambda summaries: [dataclasses.asdict(s) for s in summaries],
    doc="Phase 1 / Phase 2 branches: SGD and DP-SGD for k epochs from one init, then each way for the rest.",
)
