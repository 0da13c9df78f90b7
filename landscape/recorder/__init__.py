"""Record checkpoints from any training loop into the store (``landscape.Recorder``).

::

    with landscape.Recorder("checkpoints", "my-run", model, data=data, config={"lr": 0.05}) as rec:
        for epoch in range(epochs):
            ...                                   # the user's own loop, on any device
            rec.save(step, epoch=epoch + 1, metrics={"train_loss": loss})

A recorded run is a store run like those ``landscape train`` writes; the model is checked against its spec at
open and at every save, so a run no analysis could read is never written.
"""

from landscape.recorder.core import PrivacySource, Recorder

__all__ = ["PrivacySource", "Recorder"]
