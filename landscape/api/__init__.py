"""The Python face of landscape: checkpoint references in, result files and figures out.

Every registered analysis (``landscape/analyze/__init__.py``) is a function here, made from its spec by
:func:`landscape.api.runner.api_function` (``interpolate``, ``instability``, ...: references, then the
config, then keyword options; the result comes back with ``.path`` and ``.figures``). :mod:`.resolve` turns
references into checkpoints, :mod:`.runner` runs an analysis; the other modules hold the hand-written
families (``training``, ``pruning``, ``accounting``, ...). Everything is loaded on first use, so
``from landscape.api import interpolate`` imports only what interpolation needs. Modules are named for their
subject so that no module name shadows a function name: ``landscape.api.interpolate`` is always the function.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module under landscape.api (or a full module path)
_EXPORTS: dict[str, str] = {
    "train": "training",
    "resume": "training",
    "phases": "training",
    "TrainConfig": "training",
    "PhasesConfig": "training",
    "InterpolateConfig": "interpolation",
    "tour": "interpolation",
    "DirectionsConfig": "loss_surfaces",
    "SurfaceConfig": "loss_surfaces",
    "prune": "pruning",
    "PruneConfig": "pruning",
    "privacy": "accounting",
    "PrivacyQuery": "accounting",
    "demo": "demo_job",
    "DemoConfig": "demo_job",
    "align": "alignment",
    "runs": "store_views", "checkpoint": "store_views", "show": "store_views", "import_checkpoint": "store_views",
    "figures": "landscape.figures",  # the recipes sit above the api (they call it): re-exported lazily, not imported
}


def _analyses() -> dict[str, str]:
    from landscape.analyze import registry

    return {n.replace("-", "_"): n for n in registry.names()}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        return getattr(importlib.import_module(module if "." in module else f"landscape.api.{module}"), name)
    analysis = _analyses().get(name)
    if analysis is None:
        raise AttributeError(f"module 'landscape.api' has no attribute {name!r}")
    from landscape.api.runner import api_function

    function = globals()[name] = api_function(analysis)
    return function


def __dir__() -> list[str]:
    return sorted(set(_EXPORTS) | set(_analyses()))
