"""Record checkpoints from any training loop into the store (``landscape.Recorder``).

::

    with landscape.Recorder("checkpoints", "my-run", model, data=data, config={"lr": 0.05}) as rec:
        for epoch in range(epochs):
            ...                                   # the user's own loop, on any device
            rec.save(step, epoch=epoch + 1, metrics={"train_loss": loss})

A recorded run is a store run like those ``landscape train`` writes (the same ``landscape.store.Run``
calls: atomic, fsynced checkpoint files with their sha256 in the manifest, one writer per run), with the model
and data specs analyses rebuild the model and data from. The model is checked against the model its spec builds
when the recorder opens and at every save, so a run no analysis could read is never written.
"""

from landscape.recorder.core import (
    OPTIMIZER_ATTR,
    OPTIMIZER_EXTRA,
    PRIVACY_ATTR,
    RECORDER_FORMAT,
    PrivacySource,
    Recorder,
)

__all__ = ["OPTIMIZER_ATTR", "OPTIMIZER_EXTRA", "PRIVACY_ATTR", "RECORDER_FORMAT", "PrivacySource", "Recorder"]
