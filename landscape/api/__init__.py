"""The Python face of landscape: checkpoint references in, result files and figures out.

Every job kind of ``landscape.kinds`` is a function here, with the command's name and options; an analysis
returns its result, with ``.path`` and ``.figures``. Names load on first use.
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
