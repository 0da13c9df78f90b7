"""``landscape prune``: magnitude-prune a checkpoint into a new run (Watson et al. Sec. 4 "Pruning").

The new run's step-0 checkpoint holds the pruned weights: with ``rewind="init"`` every tensor takes its
value from the initial weights (the source run's ``@init`` checkpoint unless ``init`` names another
reference) and pruned coordinates are exactly 0; with ``rewind="none"`` the source weights are kept and only
the pruned coordinates are zeroed. The keep-masks are stored as the run array ``mask`` (a mapping
``parameter name -> bool array``, True = keep), which ``landscape train --from RUN@init`` picks up and
enforces (masked gradients, noise and momentum). Lineage points at the source checkpoint. The new run's
data spec is that of the initial weights' run (so ``--init TARGET@init`` with a mask from a run on a 5%
subset, Watson Fig. 13, gives a run that trains on the target's data by default), else the source's.

Privacy: the mask depends on the source weights, hence on the data they were trained on. The new run's
``manifest["privacy"]`` carries the DP history of the source (and of the initial weights when they come from
another run: ``ancestor_events``) and whether any of those steps were non-private (``non_private_ancestors``),
so the accounting of runs trained from it stays honest. This is the same function
(:func:`landscape.train.pruning.prune_into_run`) that ``clipping --prune-levels`` uses. Pruning with a mask
from a run on public data (another data set) costs nothing; the manifest cannot know that, so it records
what the source run did.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from landscape.errors import UsageError
from landscape.store import Checkpoint, Run, Store
from landscape.train.pruning import MASK_ARRAY, prune_into_run

REWINDS = ("init", "none")


@dataclass
class PruneConfig:
    """Options of ``landscape prune`` (mirrored one-to-one by the CLI)."""

    ref: str
    remove: float
    scope: str = "layer"  # layer | global
    rewind: str = "init"  # init | none
    run: str | None = None
    init: str | None = None  # reference of the initial weights; default: the source run's @init

    def validate(self) -> None:
        if self.rewind not in REWINDS:
            raise UsageError(f"unknown --rewind {self.rewind!r}; choose init or none")
        if self.rewind == "none" and self.init is not None:
            raise UsageError("--init only makes sense with --rewind init")


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
    """Prune ``config.ref`` and write the new run into the store at ``root`` (:func:`prune_into_run`)."""
    config.validate()
    store = Store(root)
    source = store.load(config.ref)
    init = init_ref = None
    if config.rewind == "init":
        init_ref = config.init or _default_init_ref(source, config.ref)
        init = store.load(init_ref)
    run, masks = prune_into_run(store, source, config.remove, source_ref=config.ref, scope=config.scope,
                                init=init, init_ref=init_ref, run=config.run)
    layers = []
    for n, m in masks.items():
        kept = int(m.sum())
        layers.append(
            {
                "name": n,
                "shape": list(m.shape),
                "numel": m.numel(),
                "kept": kept,
                "kept_fraction": kept / max(m.numel(), 1),
            }
        )
    total = sum(row["numel"] for row in layers)
    return PruneResult(
        run=run.name,
        checkpoint=run.checkpoints()[0].path,
        source=config.ref,
        init=init_ref,
        layers=layers,
        kept_fraction=sum(row["kept"] for row in layers) / max(total, 1),
    )


def _default_init_ref(source: Checkpoint, ref: str) -> str:
    if source.run is None:
        raise UsageError(
            f"{ref} is a checkpoint file outside a run, so it has no @init; pass --init REF or use --rewind none"
        )
    return f"{source.run}@init"


def load_masks(run: Run) -> dict[str, torch.Tensor] | None:
    """The keep-masks stored with a run (array ``mask``), as bool tensors; None when it has none."""
    if MASK_ARRAY not in run.array_names():
        return None
    return {k: torch.as_tensor(np.asarray(v)).to(torch.bool) for k, v in run.load_array(MASK_ARRAY).items()}
