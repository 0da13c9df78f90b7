"""Pruned retraining for ``clipping --prune-levels`` (Watson Fig. 11).

The geometry analyses themselves (clipping, symmetry, norms) are registered specs in ``landscape/analyze``;
``landscape.api.clipping`` etc. are made by :mod:`landscape.api.runner`.
"""

from __future__ import annotations

from landscape.errors import UsageError
from landscape.store import Checkpoint, Store
from landscape.train.pruning import MASK_ARRAY


def pruned_retrain(store: Store, trained: Checkpoint, init: Checkpoint, level: float):
    """The run retrained from ``init`` with a fraction ``level`` of each layer's weights removed by magnitude at
    ``trained`` (``landscape.train.pruning``: Linear/Conv weights, per layer), with the training configuration
    of ``trained``'s run. Two runs are written: ``<run>-prune<level>`` (the rewound, masked weights at step 0,
    the mask as run array ``mask``) and ``<run>-prune<level>-retrain`` (trained from it, masks kept). Existing
    runs made from the same checkpoint are reused, so a repeated command does not train again.
    """
    from landscape.train import pruning
    from landscape.train.config import TrainConfig
    from landscape.train.loop import train

    tag = f"{trained.run}-prune{int(round(level * 1000)):03d}"
    retrain_name = f"{tag}-retrain"
    names = store.run_names()
    if tag in names:
        old = store.run(tag)
        if (old.manifest.get("lineage") or {}).get("parent_sha256") != trained.sha256:
            raise UsageError(f"run '{tag}' exists but was not pruned from {trained.ref}; remove it first")
    else:
        model = trained.build_model()
        masks = pruning.magnitude_masks(model, level, scope="layer")
        rewound = pruning.rewind(dict(model.named_parameters()), init.state_dict, masks)
        state = {**init.state_dict, **rewound}
        source = store.run(trained.run)
        pruned = store.create_run(
            tag, config=source.manifest["config"], seeds=source.manifest.get("seeds") or {},
            lineage={"parent_run": trained.run, "parent_step": trained.step, "parent_epoch": trained.epoch,
                     "parent_ref": trained.ref, "parent_sha256": trained.sha256},
            model_spec=trained.model_spec, data_spec=trained.data_spec,
            extra={"pruning": {"remove": level, "scope": "layer", "rewind": f"{trained.run}@init"}},
        )
        pruned.save_array(MASK_ARRAY, {k: v.numpy() for k, v in masks.items()})
        pruned.save_checkpoint(state, step=0, epoch=0.0)
    if retrain_name in names:
        done = store.run(retrain_name)
        total = int((done.manifest.get("schedule") or {}).get("total_steps", -1))
        infos = done.checkpoints()
        if infos and infos[-1].step >= total:
            return done
        raise UsageError(f"run '{retrain_name}' exists but is unfinished; resume it (train --resume) or remove it")
    stored = dict(store.run(trained.run).manifest["config"])
    retrain = TrainConfig.from_dict({
        **stored, "run": retrain_name, "from_ref": f"{tag}@init", "resume": None, "model": None,
        "model_kwargs": {}, "data": None, "data_kwargs": {},
    })
    return train(retrain, root=store.root, progress=False)
