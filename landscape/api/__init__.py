"""The Python face of landscape: checkpoint references in, result files and figures out.

Each command family has a module here (``landscape.api.training``, ``landscape.api.interpolation``, ...)
that resolves references through the store, calls a pure analyzer and writes its result. The most used
functions are re-exported lazily so ``from landscape.api import interpolate`` works without importing
every analyzer. Modules are named for their subject (``training``, ``interpolation``, ...) so that no
module name shadows a function name: ``landscape.api.interpolate`` is always the function.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module under landscape.api
_EXPORTS: dict[str, str] = {
    "train": "training",
    "resume": "training",
    "phases": "training",
    "TrainConfig": "training",
    "PhasesConfig": "training",
    "interpolate": "interpolation",
    "instability": "interpolation",
    "InterpolateConfig": "interpolation",
    "tour": "interpolation",
    "directions": "loss_surfaces",
    "surface": "loss_surfaces",
    "DirectionsConfig": "loss_surfaces",
    "SurfaceConfig": "loss_surfaces",
    "clipping": "geometry",
    "symmetry": "geometry",
    "norms": "geometry",
    "ntk": "kernels",
    "ntk_table": "kernels",
    "prune": "pruning",
    "PruneConfig": "pruning",
    "privacy": "accounting",
    "PrivacyQuery": "accounting",
    "demo": "demo_job",
    "DemoConfig": "demo_job",
    "align": "alignment",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'landscape.api' has no attribute {name!r}")
    return getattr(importlib.import_module(f"landscape.api.{module}"), name)


def __dir__() -> list[str]:
    return sorted(_EXPORTS)
