"""landscape: see why differentially private training ends up worse than SGD.

Train and store SGD / DP-SGD trajectories, then measure the loss-landscape and gradient geometry around
them. The Python face is :mod:`landscape.api`; the ``landscape`` command is a thin layer over it.
"""

__version__ = "0.1.0"

from landscape.runtime import portable_requested as _portable_requested  # noqa: E402 -- needs __version__

if _portable_requested():  # $LANDSCAPE_PORTABLE=1: the kernels are pinned before anything loads torch
    from landscape.runtime import use_portable as _use_portable

    _use_portable()

__all__ = ["Recorder", "__version__"]


def __getattr__(name: str):
    """``landscape.Recorder`` (:mod:`landscape.recorder`), imported on first use: ``import landscape`` loads no torch
    (but in portable mode, which loads it at once, with its kernels pinned)."""
    if name == "Recorder":
        from landscape.recorder import Recorder

        return Recorder
    raise AttributeError(f"module 'landscape' has no attribute {name!r}")
