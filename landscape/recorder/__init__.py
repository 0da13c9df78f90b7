"""Record checkpoints from any training loop into the store (``landscape.Recorder``).

::

    with landscape.Recorder("checkpoints", "my-run", model, data=data, config={"lr": 0.05}) as rec:
        for epoch in range(epochs):
            ...                                   # the user's own loop, on any device
            rec.save(step, epoch=epoch + 1, metrics={"train_loss": loss})

A recorded run is a store run like the ones ``landscape train`` writes (atomic, fsynced checkpoint and manifest
writes through :class:`landscape.store.Run`, the run's write lock while the recorder is open, sha256 of every
checkpoint, code version, model and data specs), so every analysis reads it as a trained run. The manifest adds
``config`` (the user's), ``recorder`` (the ``__main__`` script and its sha256, torch and python versions),
``device`` and ``privacy`` (a DP run's noise multiplier, sample rate, clipping norm, delta, accountant;
:mod:`landscape.integrations.opacus` reads them from Opacus), so ``landscape train --from`` composes its steps.

The recorder refuses, when it opens and before it writes anything, a model whose tensors are not those of the
model its ``landscape_spec`` builds (a layer swapped or fixed after ``build_model``): analyses rebuild the model
from that spec, so such a run could never be read. Wrappers that only prefix the names (``torch.compile``,
Opacus' ``GradSampleModule``, ``DataParallel``, ``DistributedDataParallel``) are looked through.

``parent="base@last"`` records a run that starts from a store checkpoint, as ``landscape train --from``: its
lineage, the parent's privacy history, and epsilons that compose the parent's DP steps with the run's own.

Writes: ``writer="inline"`` (the default) writes each checkpoint, durably, before ``save`` returns: a few
milliseconds for a small model, tens for a ResNet-18 (``benchmarks/recorder.py``). ``writer="thread"`` copies the
state on the caller's thread and returns while one worker thread writes it; its error is raised by the next
``save``, ``flush`` or ``close``, and ``close`` (or interpreter exit) waits for it. A training process killed at
any moment loses at most the checkpoint being written; the same ``Recorder(...)`` call continues the run
(:meth:`Recorder.restore`), and refuses a run written by anyone else or with other model, data, config,
privacy or parent.
"""

from __future__ import annotations

from landscape.recorder.core import (
    OPTIMIZER_ATTR,
    OPTIMIZER_EXTRA,
    PRIVACY_ATTR,
    RECORDER_FORMAT,
    WRITERS,
    PrivacySource,
    Recorder,
    unwrap,
)

__all__ = ["OPTIMIZER_ATTR", "OPTIMIZER_EXTRA", "PRIVACY_ATTR", "RECORDER_FORMAT", "WRITERS", "PrivacySource",
           "Recorder", "unwrap"]
