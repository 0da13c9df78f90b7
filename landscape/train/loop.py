"""The training loop (SGD and the DP-SGD family, child runs, resume; docs/training.md): a step samples a batch,
asks the ``Privatizer`` for the gradient, steps ``torch.optim.SGD`` and re-applies pruning masks; everything else
is a callback."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from landscape import plugins
from landscape.data import Dataset, dataset_from_spec, load_dataset
from landscape.errors import CheckpointError, IncompatibleError, LandscapeError, ModelError, UsageError, param
from landscape.models import MODELS, build_model, check_forward, has_batchnorm, model_from_spec, model_options
from landscape.privacy import PrivacyEvent, PrivacyHistory, continuing_accountant
from landscape.refs import Ref
from landscape.runtime import resolve_device, seed_everything
from landscape.store import MANIFEST, Checkpoint, Run, Store, check_state_dict
from landscape.train import accounting
from landscape.train.accounting import AccountantWarning, steps_per_epoch
from landscape.train.callbacks import (
    METRICS_ARRAY,
    Accounting,
    Callback,
    Checkpointer,
    Evaluation,
    NonFinite,
    Progress,
    ResumeState,
    StepMetrics,
    WallClock,
    restore_resume_state,
)
from landscape.train.config import SamplingWarning, TrainConfig, checkpoint_steps, config_hash
from landscape.train.privatize import PrivacyConfig, Privatizer
from landscape.train.pruning import (
    MASK_ARRAY,
    inherited_privacy,
    lineage_of,
    load_masks,
    mask_optimizer_state_,
    mask_params_,
)
from landscape.train.sampling import Sampler, make_sampler
from landscape.train.sparsify import SparsifySchedule

DEFAULT_MODEL = "lenet"
DEFAULT_DATA = "digits"


@dataclass
class TrainState:
    """Everything the loop and its callbacks share."""

    config: TrainConfig
    run: Run
    data: Dataset
    model: nn.Module
    optimizer: torch.optim.Optimizer
    sampler: Sampler
    privatizer: Privatizer
    device: torch.device
    steps_per_epoch: int
    total_steps: int
    noise_generator: torch.Generator | None
    masks: dict[str, torch.Tensor] | None
    sparsify: SparsifySchedule | None
    metrics: StepMetrics
    callbacks: list[Callback] = field(default_factory=list)
    step: int = 0
    epsilon: Any = None
    resumed: bool = False
    seconds_before: float = 0.0

    @property
    def epoch(self) -> float:
        return self.step / self.steps_per_epoch


def train(config: TrainConfig, *, root: str | Path, callbacks: Sequence[Callback] = (),
          progress: bool | None = None, phases: dict[str, Any] | None = None) -> Run:
    """Train one run into the store at ``root`` and return it; ``config.resume`` continues that run from its last
    checkpoint. ``callbacks`` are appended to the standard ones; ``phases`` is stored as ``manifest["phases"]``.
    ``progress``: True shows the steps on stderr, False never, None follows ``landscape.progress``. A model or
    data code reference named here is trusted for this run; resuming it needs the code named again."""
    config.validate()
    store = Store(root)
    with plugins.trusting(plugins.code_refs(config.model, config.data)):
        if config.resume is not None:
            return _resume(store, config.resume, data_root=config.data_root, callbacks=callbacks, progress=progress)
        if config.run is not None and _interrupted_before_first_checkpoint(store, config):
            # the same command again after a kill before the first checkpoint: start that run over, in place
            return _resume(store, config.run, data_root=config.data_root, callbacks=callbacks, progress=progress)
        return _start(store, config, callbacks=callbacks, progress=progress, phases=phases)


def _interrupted_before_first_checkpoint(store: Store, config: TrainConfig) -> bool:
    """Whether run ``config.run`` exists with this configuration (same hash) and no checkpoint yet."""
    if config.run not in store.run_names():
        return False
    with contextlib.suppress(CheckpointError):
        run = store.run(config.run)
        return (not run.checkpoints() and "schedule" in run.manifest
                and run.manifest.get("config_hash") == config_hash(resolved(store, config)))
    return False


def resolved(store: Store, config: TrainConfig) -> TrainConfig:
    """``config`` as a run records it: from scratch, lenet on digits unless told otherwise, and the accountant
    resolved (a child run's default is its parent's, :func:`landscape.privacy.continuing_accountant`)."""
    if config.from_ref is None:
        config = dataclasses.replace(config, model=config.model or DEFAULT_MODEL, data=config.data or DEFAULT_DATA)
    if config.accountant is not None:
        return config
    parent = None
    if config.from_ref is not None:
        with contextlib.suppress(CheckpointError, UsageError):
            name = Ref.parse(config.from_ref).run
            privacy = (store.run(name).manifest.get("privacy") or {}) if name else {}
            parent = privacy.get("accountant") if privacy.get("accounted") else None
    return dataclasses.replace(config, accountant=continuing_accountant(parent))


def _start(
    store: Store, config: TrainConfig, *, callbacks: Sequence[Callback], progress: bool | None,
    phases: dict[str, Any] | None, existing: Run | None = None,
) -> Run:
    """Train a new run; with ``existing`` (a locked run that has a manifest but no checkpoint, its creator
    killed before the first one), train that run from step 0 instead, after checking that its recorded
    manifest is exactly what this configuration gives (so the numbers are those of an uninterrupted run)."""
    config.warn_sampling()
    config = resolved(store, config)
    device = resolve_device(config.device)
    parent: Checkpoint | None = None
    if config.from_ref is not None:
        parent = _load_parent(store, config.from_ref, existing)
    data = _load_data(config, parent)
    # the run's seed and the independent streams drawn from it (sampler, noise, sparsification masks)
    sampling, noise, sparsify = (int(s) for s in np.random.SeedSequence(int(config.seed)).generate_state(3))
    seeds = {"seed": int(config.seed), "sampling": sampling, "noise": noise, "sparsify": sparsify}
    seed_everything(config.seed)
    if parent is None:
        model = build_model(config.model, input_shape=data.input_shape, num_classes=data.num_classes,
                            **config.model_kwargs)
        lineage = None
        masks = None
        history = PrivacyHistory()
    else:
        model = _model_from_parent(config, parent, data)
        lineage = lineage_of(parent, config.from_ref)
        masks = None
        with contextlib.suppress(CheckpointError):  # the pruning mask of the parent's run, if it has one
            masks = load_masks(store.run(parent.run)) if parent.run is not None else None
        history = inherited_privacy(store, parent)
        if history.parent_epsilon is not None:
            history.parent_epsilon["ref"] = config.from_ref
        note = history.accountant_note(config.run or "(new)", config.accountant) if config.accounted else None
        if note is not None:
            warnings.warn(note, AccountantWarning, stacklevel=3)
    _check_dp_model(config, model)
    model.to(device)
    check_forward(model, data.x_train[:2], data.num_classes)  # a failing forward is one line naming its layer

    n = len(data.y_train)
    spe = steps_per_epoch(n, config.batch_size)
    if config.batch_size > n:
        warnings.warn(f"{param('batch_size', config.batch_size)} exceeds the {n} training examples: each step uses all of "
                      f"them (sample rate 1), {spe} step{'s' if spe != 1 else ''} per epoch; give a batch size "
                      f"below {n} for minibatch {'DP-' if config.is_dp else ''}SGD", SamplingWarning, stacklevel=2)
    total = accounting.schedule_steps(config.epochs, n, config.batch_size)
    q = min(1.0, config.batch_size / n)
    if config.optimizer in ("sgd", "clip-only"):
        sigma = 0.0
    elif config.noise_multiplier is not None:
        sigma = float(config.noise_multiplier)
    else:
        sigma = accounting.noise_for_epsilon(config.target_epsilon, q, total, config.delta, config.accountant,
                                             history=history)
    privacy = {
        "noise_multiplier": sigma,
        "sample_rate": q,
        "steps": total,
        "delta": config.delta,
        "accountant": config.accountant,
        "accounted": config.accounted,
        "sampling": config.sampling_method,
        **history.manifest_fields(config.delta),
    }
    stored = {**config.to_dict(), "resume": None}
    extra = {
        "config_hash": config_hash(config),
        "device": str(device),  # the device actually used ("auto" resolved)
        "privacy": privacy,
        "schedule": {"steps_per_epoch": spe, "total_steps": total,
                     "checkpoint_steps": checkpoint_steps(config.checkpoint_every, spe, total)},
    }
    if phases is not None:
        extra["phases"] = phases
    fields = dict(config=stored, seeds=seeds, lineage=lineage, model_spec=dict(model.landscape_spec),
                  data_spec=dict(data.spec), extra=extra)
    if existing is None:
        run = store.create_run(config.run, **fields)
    else:
        run = existing
        _check_restart(run, fields)
    try:
        if masks is not None:
            run.save_array(MASK_ARRAY, {k: v.numpy() for k, v in masks.items()})
        state = _build_state(config, run, data, model, device, masks, seeds, sigma, history)
        _reapply_masks(state)  # a parent's pruned weights are zero from step 0, even if it stored them unmasked
        _run(state, callbacks, progress)
    except BaseException:
        if existing is None:  # a run that failed before its first checkpoint holds nothing: free its name
            with contextlib.suppress(Exception):
                if not run.checkpoints():
                    shutil.rmtree(run.path)
        raise
    finally:
        if existing is None:
            run.close()
    return run


def _load_parent(store: Store, ref: str, existing: Run | None) -> Checkpoint:
    """The parent checkpoint of ``--from ref``; restarting ``existing``, the very one its lineage records
    (``@last`` may have moved on since), checked against the recorded sha256."""
    lineage = (existing.manifest.get("lineage") or {}) if existing is not None else {}
    if not lineage.get("parent_sha256"):
        return store.load(ref)
    for candidate in (ref, f"{lineage.get('parent_run')}@step={lineage.get('parent_step')}"):
        with contextlib.suppress(CheckpointError, UsageError):
            parent = store.load(candidate)
            if parent.sha256 == lineage["parent_sha256"]:
                return parent
    raise CheckpointError(
        f"run '{existing.name}' cannot be restarted: its parent checkpoint ({ref}, sha256 "
        f"{str(lineage['parent_sha256'])[:12]}) is gone or changed"
    )


def _check_restart(run: Run, fields: dict[str, Any]) -> None:
    """Restarting a run from step 0 must reproduce its recorded manifest field by field (seeds, data, model,
    privacy, schedule, ...); otherwise the run would not be the one its manifest describes."""
    from landscape.results import to_jsonable

    recorded = run.manifest
    now = {k: v for k, v in fields.items() if k != "extra"} | fields["extra"]
    for key, value in now.items():
        if key == "config" or key == "phases" and key not in recorded:
            continue  # the config is compared through its hash (device, data root and run name do not count)
        want = json.loads(json.dumps(to_jsonable(value)))
        if recorded.get(key) != want:
            raise CheckpointError(
                f"run '{run.name}' has no checkpoint and cannot be restarted as recorded: its '{key}' differs from "
                f"what its configuration gives now (changed data or code?); remove {run.path} and train it again"
            )


def _resume(
    store: Store, name: str, *, data_root: str | None, callbacks: Sequence[Callback], progress: bool | None
) -> Run:
    """Continue run ``name`` under its lock: from its last checkpoint, or from step 0 when its creator was
    killed before writing one (same recorded config and seeds, so the same numbers as an uninterrupted run)."""
    run = store.open_run(name)  # the lock, stale temporary files swept, unrecorded checkpoints adopted
    try:
        manifest = run.manifest
        if "schedule" not in manifest or "privacy" not in manifest:
            raise CheckpointError(f"run '{name}' was not written by landscape train; it cannot be resumed")
        config = _stored_config(run, data_root)
        infos = run.checkpoints()
        if not infos:
            return _start(store, config, callbacks=callbacks, progress=progress, phases=None, existing=run)
        return _continue(store, run, config, infos[-1], data_root=data_root, callbacks=callbacks, progress=progress)
    finally:
        run.close()


def _damaged(run: Run, field: str, what: str) -> CheckpointError:
    """The one-line error for a manifest field the trainer cannot use (as :func:`landscape.store.check_manifest`)."""
    what = " ".join(what.split())[:240]
    return CheckpointError(f"damaged run manifest {run.path / MANIFEST}: field '{field}' {what}")


def _stored_config(run: Run, data_root: str | None) -> TrainConfig:
    """The run's recorded TrainConfig (validated; a damaged one is a one-line error naming the manifest)."""
    try:
        config = TrainConfig.from_dict(run.manifest.get("config") or {})
        config = dataclasses.replace(config, run=run.name, resume=None, data_root=data_root or config.data_root)
        return config.validate()
    except (TypeError, ValueError, LandscapeError) as exc:
        raise _damaged(run, "config", f"is not a training configuration ({exc})") from None


def _continue(
    store: Store, run: Run, config: TrainConfig, last: Any, *, data_root: str | None,
    callbacks: Sequence[Callback], progress: bool | None,
) -> Run:
    name, manifest = run.name, run.manifest
    total = int(manifest["schedule"]["total_steps"])
    if last.step >= total:
        return run
    ckpt = store.load(f"{name}@step={last.step}")
    device = resolve_device(config.device)
    missing = [k for k in ("sampling", "noise", "sparsify") if k not in manifest["seeds"]]
    if missing:
        raise _damaged(run, f"seeds.{missing[0]}", "is missing")
    try:
        data = dataset_from_spec(manifest["data_spec"], data_root=data_root or config.data_root)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise _damaged(run, "data_spec", f"does not describe a data set ({exc})") from None
    try:
        model = model_from_spec(manifest["model_spec"])
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise _damaged(run, "model_spec", f"does not describe a model ({exc})") from None
    check_state_dict(model, ckpt.state_dict, source=str(last.path))
    model.load_state_dict(ckpt.state_dict, strict=True)
    model.to(device)
    masks = load_masks(run)
    privacy = manifest["privacy"]
    history = PrivacyHistory.from_manifest(privacy)
    if "noise_multiplier" not in privacy:
        raise _damaged(run, "privacy.noise_multiplier", "is missing")
    state = _build_state(config, run, data, model, device, masks, manifest["seeds"],
                         privacy["noise_multiplier"], history)
    if int(manifest["schedule"]["steps_per_epoch"]) != state.steps_per_epoch:
        raise CheckpointError(f"run '{name}': the data set no longer has the size it was trained on")
    if "position" not in ckpt.extra:
        raise CheckpointError(f"{last.path} has no resume state (written by an older version?)")
    restore_resume_state(state, ckpt.extra)
    state.step = last.step
    state.resumed = True
    state.seconds_before = float(last.metrics.get("wall_seconds", 0.0))
    if METRICS_ARRAY in run.array_names():
        state.metrics.restore(run.load_array(METRICS_ARRAY), upto=last.step)
    _run(state, callbacks, progress)
    return run


def _load_data(config: TrainConfig, parent: Checkpoint | None) -> Dataset:
    root, download = config.data_root, config.download
    if config.data is None:
        if config.subset is not None or config.data_kwargs:
            raise UsageError(f"{param('subset')} and {param('data_kwargs')} need {param('data')} (a child run otherwise reuses its parent's data set)")
        if parent is None or not parent.data_spec:
            raise UsageError(f"{config.from_ref} records no data set; give {param('data')}")
        return dataset_from_spec(parent.data_spec, data_root=root, download=download)
    return load_dataset(config.data, seed=config.data_seed, subset=config.subset, data_root=root,
                        download=download, **config.data_kwargs)


def _model_from_parent(config: TrainConfig, parent: Checkpoint, data: Dataset) -> nn.Module:
    spec = parent.model_spec
    named = plugins.canonical(config.model) if plugins.is_code_ref(config.model) else config.model
    if config.model is not None and named != spec.get("name"):
        raise UsageError(
            f"{param('model', config.model)} differs from the model of {config.from_ref} ({spec.get('name')}); "
            f"a child run keeps its parent's model: drop {param('model')}"
        )
    if config.model_kwargs:
        raise UsageError(f"{param('model_kwargs')} cannot change the model of a child run ({param('from_ref')}); drop it")
    model = parent.build_model()
    kwargs = spec.get("kwargs", {})
    shape, classes = kwargs.get("input_shape"), kwargs.get("num_classes")
    if shape is not None and tuple(shape) != tuple(data.input_shape) or classes not in (None, data.num_classes):
        raise IncompatibleError(
            f"{config.from_ref} was built for inputs {tuple(shape or ())} and {classes} classes, but data set "
            f"'{data.name}' has {tuple(data.input_shape)} and {data.num_classes}"
        )
    return model


def _check_dp_model(config: TrainConfig, model: nn.Module) -> None:
    """DP-SGD refuses BatchNorm in one line that says how to replace it: a built-in model's ``norm`` option, or the
    user's factory (which landscape cannot change)."""
    if not (config.is_dp and has_batchnorm(model)):
        return
    name = (getattr(model, "landscape_spec", None) or {}).get("name")
    why = f"{param('optimizer', config.optimizer)} needs per-sample gradients, which BatchNorm mixes across the batch"
    if name in MODELS and "norm" in model_options(name):
        group = param("model_kwargs", '{"norm": "group"}')
        fix = (f"use GroupNorm: train with {group}" if config.from_ref is None else
               f"a child run keeps its parent's model: train the parent ({config.from_ref}) with {group}")
    else:
        fix = (f"replace BatchNorm in the model's factory ({plugins.short_name(name)}): e.g. GroupNorm layers, or "
               "return opacus.validators.ModuleValidator.fix(model), which swaps them for GroupNorm")
    raise ModelError(f"{why}; {fix}")


def epsilon_curve(
    config: TrainConfig, sigma: float, q: float, total: int, history: PrivacyHistory, exact_steps: Sequence[int] = (),
) -> torch.Tensor | None:
    """Epsilon after t = 0..total steps of this run (composed with DP ancestor steps); None if not accounted.
    RDP gives every step; PLD only ``exact_steps`` (checkpoints) and epoch ends, NaN elsewhere."""
    if not config.accounted:
        return None
    curve = torch.full((total + 1,), float("nan"), dtype=torch.float64)
    if config.accountant == "rdp":
        steps = range(total + 1)
    else:
        spe = max(1, total // max(1, config.epochs))
        steps = sorted({0, total, *exact_steps, *range(0, total + 1, spe)})
    for t in steps:
        own = PrivacyEvent(sigma, q, t)
        curve[t] = accounting.history_epsilon(history, own, config.delta, config.accountant)
    return curve


def _build_state(
    config: TrainConfig, run: Run, data: Dataset, model: nn.Module, device: torch.device,
    masks: dict[str, torch.Tensor] | None, seeds: dict[str, int], sigma: float, history: PrivacyHistory,
) -> TrainState:
    data = Dataset(data.name, data.x_train.to(device), data.y_train.to(device), data.x_test.to(device),
                   data.y_test.to(device), data.num_classes, data.spec)
    n = len(data.y_train)
    sampler = make_sampler(config.sampling_method, n, config.batch_size,
                           torch.Generator().manual_seed(int(seeds["sampling"])))
    noise_gen = torch.Generator(device=device).manual_seed(int(seeds["noise"]))
    # the expected batch is q N = min(B, N) (q is capped at 1), not B, when the batch size exceeds the data
    privacy = PrivacyConfig(optimizer=config.optimizer, max_grad_norm=config.max_grad_norm, noise_multiplier=sigma,
                            clip_style=config.clip_style, clip_fn=config.clip_fn, smooth=config.smooth,
                            track_norms=config.is_dp)
    engine = None
    if config.is_dp:
        from landscape.persample import PerSampleEngine

        engine = PerSampleEngine(model, chunk=config.chunk)
    privatizer = Privatizer(model, privacy, expected_batch_size=float(min(config.batch_size, n)),
                            generator=noise_gen, engine=engine)
    optimizer = torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad],
        lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
    )
    if masks is not None:
        params = dict(model.named_parameters())
        masks = {k: v.to(device=params[k].device, dtype=params[k].dtype) for k, v in masks.items()}
    sparsify = SparsifySchedule(config.sparsify, config.epochs, int(seeds["sparsify"])) if config.sparsify > 0 else None
    spe = sampler.steps_per_epoch
    total = config.epochs * spe
    q = sampler.sample_rate
    metrics = StepMetrics(total)
    state = TrainState(
        config=config, run=run, data=data, model=model, optimizer=optimizer, sampler=sampler,
        privatizer=privatizer, device=device, steps_per_epoch=spe, total_steps=total,
        noise_generator=noise_gen, masks=masks, sparsify=sparsify, metrics=metrics,
    )
    state.callbacks = [
        metrics,
        NonFinite(),
        Accounting(epsilon_curve(config, sigma, q, total, history, run.manifest["schedule"]["checkpoint_steps"])),
        Evaluation(),
        ResumeState(),
        WallClock(),
        Checkpointer(run.manifest["schedule"]["checkpoint_steps"]),
    ]
    return state


def _run(state: TrainState, extra: Sequence[Callback], progress: bool | None) -> None:
    """The steps; ``progress`` True / False turns the progress display on / off for this run, None follows the
    caller's (:mod:`landscape.progress`). Ctrl-C leaves a note on the interrupt naming the command that continues
    the run (once it has a checkpoint)."""
    from landscape import progress as display

    try:
        with display.enabled(progress):
            _steps(state, [*state.callbacks, *extra, Progress()])
    except KeyboardInterrupt as exc:
        with contextlib.suppress(Exception):
            if state.run.checkpoints():
                exc.add_note(f"continue it with: {resume_command(state.run, state.config)}")
        raise


def resume_command(run: Run, config: TrainConfig) -> str:
    """The command that continues ``run``: ``landscape --root ROOT [--code REF ...] train --resume NAME``."""
    import shlex

    code = [a for ref in plugins.code_refs(config.model, config.data) for a in ("--code", ref)]
    return shlex.join(["landscape", "--root", str(run.path.parent), *code, "train", "--resume", run.name])


def _steps(state: TrainState, callbacks: list[Callback]) -> None:
    state.callbacks = callbacks
    model, x_train, y_train = state.model, state.data.x_train, state.data.y_train
    model.train()
    for cb in state.callbacks:
        cb.on_start(state)
    step_masks = state.masks
    epoch_of_masks = -1
    try:
        while state.step < state.total_steps:
            epoch, position = divmod(state.step, state.steps_per_epoch)
            if state.sparsify is not None and epoch != epoch_of_masks:
                shapes = {n: p.shape for n, p in model.named_parameters() if p.requires_grad}
                step_masks = _combine_masks(state, state.sparsify.mask_for_epoch(epoch, shapes))
                epoch_of_masks = epoch
            idx = state.sampler.indices(position).to(x_train.device)
            stats = state.privatizer.compute_gradients(x_train[idx], y_train[idx], masks=step_masks)
            state.optimizer.step()
            _reapply_masks(state)
            state.step += 1
            for cb in state.callbacks:
                cb.on_step(state, stats)
    finally:
        for cb in state.callbacks:
            with contextlib.suppress(Exception):
                cb.on_end(state)


def _combine_masks(state: TrainState, sparse: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    params = dict(state.model.named_parameters())
    out = {}
    for name, m in sparse.items():
        m = m.to(device=params[name].device, dtype=params[name].dtype)
        if state.masks is not None and name in state.masks:
            m = m * state.masks[name]
        out[name] = m
    return out


def _reapply_masks(state: TrainState) -> None:
    """Pruned weights and their momentum stay exactly zero (Watson Sec. 4 "Pruning")."""
    if state.masks is not None:
        mask_params_(state.model, state.masks)
        mask_optimizer_state_(state.optimizer, state.model, state.masks)
