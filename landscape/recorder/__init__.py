"""Record checkpoints from any training loop into the store (``landscape.Recorder``; docs/own-code.md): a store
run like those ``landscape train`` writes, its model checked against its spec at open and at every save."""

from landscape.recorder.core import PrivacySource, Recorder

__all__ = ["PrivacySource", "Recorder"]
