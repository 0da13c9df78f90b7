"""The Python face of landscape: checkpoint references in, result files and figures out.

Every job kind of the registry ``landscape.kinds`` is a function here: each registered analysis, made from
its spec by ``landscape.api.runner.api_function`` (``interpolate``, ``instability``, ...: references, then the
config, then keyword options; the result comes back with ``.path`` and ``.figures``), and the other kinds'
functions (``train``, ``phases``, ``prune``, ``align``, ``import_checkpoint``, ``figures``; a kind without a
hand-written one gets one generated from its spec, ``landscape.kinds.api_function``). ``resolve`` turns
references into checkpoints, ``runner`` runs an analysis; the other modules hold the hand-written
families (``training``, ``pruning``, ``accounting``, ...). Everything is loaded on first use, so
``from landscape.api import interpolate`` imports only what interpolation needs. Modules are named for their
subject so that no module name shadows a function name: ``landscape.api.interpolate`` is always the function.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module under landscape.api (the job kinds' functions come from the registry: landscape.kinds)
_EXPORTS: dict[str, str] = {
    "resume": "training",
    "TrainConfig": "training",
    "PhasesConfig": "training",
    "InterpolateConfig": "interpolation",
    "tour": "interpolation",
    "DirectionsConfig": "loss_surfaces",
    "SurfaceConfig": "loss_surfaces",
    "PruneConfig": "pruning",
    "privacy": "accounting",
    "PrivacyQuery": "accounting",
    "demo": "demo_job",
    "DemoConfig": "demo_job",
    "runs": "store_views", "checkpoint": "store_views", "show": "store_views",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        return getattr(importlib.import_module(f"landscape.api.{module}"), name)
    from landscape import kinds  # the registry sits above the api: read only when a user asks for a name

    kind = kinds.api_names().get(name)
    if kind is None:
        raise AttributeError(f"module 'landscape.api' has no attribute {name!r}")
    function = globals()[name] = kinds.api_function(kind)
    return function


def __dir__() -> list[str]:
    from landscape import kinds

    return sorted(set(_EXPORTS) | set(kinds.api_names()))
