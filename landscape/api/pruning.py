"""``landscape prune`` (Watson et al. Sec. 4 "Pruning") and ``clipping --prune-levels`` (Watson Fig. 11):
magnitude-pruned checkpoints as new runs whose privacy carries the source's DP history (the mask depends on
the source weights)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from landscape.api.jobkind import JobKind, run_files, run_option
from landscape.errors import UsageError, param
from landscape.options import check_fields, option
from landscape.privacy import PrivacyEvent

if TYPE_CHECKING:
    from landscape.store import Checkpoint, Run, Store

REWINDS = ("init", "none")
SCOPES = ("layer", "global")


@dataclass
class PruneConfig:
    """Options of ``landscape prune`` (its command and batch kind are generated from these fields:
    :data:`JOB`)."""

    ref: str
    remove: float = option(help="Fraction of weights REMOVED (smallest magnitude). Watson et al.'s 'pruning level "
                                "p' = 1 - remove.", min=0.0, max=1.0)
    scope: str = option("layer", "Remove the fraction in every layer, or over all prunable weights together.",
                        choices=SCOPES)
    rewind: str = option("init", "init: survivors take their initial values (the source run's @init); none: keep "
                                 "trained values.", choices=REWINDS)
    init: str | None = option(None, "Initial weights to rewind to (default: the source run's @init).", metavar="REF")
    run: str | None = option(None, "Name of the new run (default: generated).")

    def validate(self) -> None:
        if self.rewind == "none" and self.init is not None:
            raise UsageError(f"{param('init')} only makes sense with {param('rewind', 'init')}")


@dataclass
class PruneResult:
    run: str
    checkpoint: Path
    source: str
    init: str | None
    layers: list[dict[str, Any]] = field(default_factory=list)  # name, shape, numel, kept, kept_fraction
    kept_fraction: float = 1.0  # over the pruned tensors

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "checkpoint": str(self.checkpoint)}


def prune(config: PruneConfig, *, root: str | Path) -> PruneResult:
    """Prune ``config.ref`` and write the new run into the store at ``root``: its step 0 holds the pruned
    weights, rewound to ``init`` (default: the source run's @init) or not, its mask the run array ``mask``."""
    from landscape.store import Store
    from landscape.train.pruning import prune_into_run

    check_fields(config)
    config.validate()
    store = Store(root)
    source = store.load(config.ref)
    init = init_ref = None
    if config.rewind == "init":
        if config.init is None and source.run is None:
            raise UsageError(f"{config.ref} is a checkpoint file outside a run, so it has no @init; pass "
                             f"{param('init')} or use {param('rewind', 'none')}")
        init_ref = config.init or f"{source.run}@init"
        init = store.load(init_ref)
    run, masks = prune_into_run(store, source, config.remove, source_ref=config.ref, scope=config.scope,
                                init=init, init_ref=init_ref, run=config.run)
    layers = [{"name": n, "shape": list(m.shape), "numel": m.numel(), "kept": int(m.sum()),
               "kept_fraction": int(m.sum()) / max(m.numel(), 1)} for n, m in masks.items()]
    total = sum(row["numel"] for row in layers)
    return PruneResult(run=run.name, checkpoint=run.checkpoints()[0].path, source=config.ref, init=init_ref,
                       layers=layers, kept_fraction=sum(row["kept"] for row in layers) / max(total, 1))


def _prune_rows(result: PruneResult) -> list[dict[str, Any]]:
    """One row per pruned tensor, then the total."""
    rows = [{"tensor": r["name"], "shape": "x".join(map(str, r["shape"])), "weights": r["numel"], "kept": r["kept"],
             "kept_fraction": r["kept_fraction"]} for r in result.layers]
    total = {"tensor": "total", "shape": "", "weights": sum(r["numel"] for r in result.layers),
             "kept": sum(r["kept"] for r in result.layers), "kept_fraction": result.kept_fraction}
    return [*rows, total]


def _prune_notes(result: PruneResult) -> list[str]:
    rewound = f"rewound to {result.init}" if result.init else "not rewound"
    return [f"run {result.run}: step 0 = {result.source} pruned ({rewound}), mask in run array 'mask'",
            f"checkpoint: {result.checkpoint}"]


JOB = JobKind(
    name="prune", config=PruneConfig, run=lambda config, *, root, out=None: prune(config, root=root),
    arguments=("ref",), required=("ref", "remove", "run"), produces=run_option, api=prune,
    outcome=lambda result, root, out: ({"kept_fraction": result.kept_fraction}, run_files(root, result.run)),
    rows=_prune_rows, notes=_prune_notes, details=PruneResult.to_dict,
    doc="Prune the Linear/Conv weights of checkpoint REF by magnitude; store the mask with a new run.\n\n"
        "Train from it with `landscape train --from RUN@init ...`: pruned weights stay exactly 0 (masked gradients, "
        "noise and momentum), and its epsilon composes the DP steps of REF (which chose the mask).",
)


def pruned_retrain(store: Store, trained: Checkpoint, init: Checkpoint, level: float) -> Run:
    """Watson et al. Fig. 11: prune ``level`` of each layer at ``trained``, rewind to ``init`` (run
    ``<run>-prune<level*1000>``), retrain with the run's configuration (``...-retrain``; a
    ``--target-epsilon`` run with the noise multiplier it used). Runs made before from the same checkpoint and
    history are reused."""
    from landscape.train.config import TrainConfig
    from landscape.train.loop import train
    from landscape.train.pruning import inherited_privacy, prune_into_run

    tag = f"{trained.run}-prune{int(round(level * 1000)):03d}"
    retrain_name = f"{tag}-retrain"
    source = store.run(trained.run)
    if "recorder" in source.manifest:  # its config is the user's, not a TrainConfig landscape could rerun
        raise UsageError(f"run '{trained.run}' was recorded from your own training loop (landscape.Recorder), which "
                         "landscape cannot rerun: prune it with `landscape prune` and retrain the result in your loop")
    names = store.run_names()
    if tag in names:
        old = store.run(tag)
        if (old.manifest.get("lineage") or {}).get("parent_sha256") != trained.sha256:
            raise UsageError(f"run '{tag}' exists but was not pruned from {trained.ref}; remove it first")
    else:
        prune_into_run(store, trained, level, source_ref=trained.ref, scope="layer", init=init,
                       init_ref=init.ref or f"{trained.run}@init", run=tag)
    expected = inherited_privacy(store, store.load(f"{tag}@init")).events
    if retrain_name in names:
        done = store.run(retrain_name)
        recorded = [PrivacyEvent(**e) for e in (done.manifest.get("privacy") or {}).get("ancestor_events", [])]
        if recorded != expected:
            raise UsageError(
                f"run '{retrain_name}' does not compose the DP history of {trained.ref} (made by an older version "
                f"that dropped it?); remove runs '{tag}' and '{retrain_name}' and run again"
            )
        total = int((done.manifest.get("schedule") or {}).get("total_steps", -1))
        infos = done.checkpoints()
        if infos and infos[-1].step >= total:
            return done
        raise UsageError(f"run '{retrain_name}' exists but is unfinished; resume it (`landscape train --resume`) or remove it")
    stored = dict(source.manifest["config"])
    if stored.get("target_epsilon") is not None:
        stored.update(target_epsilon=None,
                      noise_multiplier=float((source.manifest.get("privacy") or {})["noise_multiplier"]))
    retrain = TrainConfig.from_dict({
        **stored, "run": retrain_name, "from_ref": f"{tag}@init", "resume": None, "model": None,
        "model_kwargs": {}, "data": None, "data_kwargs": {},
    })
    return train(retrain, root=store.root)


def expand_prune_levels(resolver, ref: str, config) -> tuple[list, list]:
    """The ``expand`` hook of ``clipping``: the checkpoints ``ref`` names, or with ``config.prune_levels`` the
    last checkpoint of each level's retrained run (:func:`pruned_retrain`), tagged with the level."""
    if not config.prune_levels:
        return resolver.expand(ref), []
    from landscape.api.resolve import Target

    store = resolver.store
    trained = store.load(ref)
    if trained.run is None:
        raise UsageError(f"{param('prune_levels')} needs a checkpoint of a run (to rewind to its @init), got {ref}")
    if not store.run(trained.run).manifest.get("config"):
        raise UsageError(f"run '{trained.run}' records no training configuration to retrain the pruned models with")
    init = store.load(f"{trained.run}@init")
    targets = []
    for level in config.prune_levels:
        done = pruned_retrain(store, trained, init, level)
        last = done.checkpoints()[-1]
        targets.append(Target.of(done.name, last, tag=(("prune_level", level),)))  # its sha256 checked on load
    return targets, [trained.input_ref(), init.input_ref()]
