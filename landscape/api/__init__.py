"""The Python face of landscape: checkpoint references in, result files and figures out.

Each command family has a module here (``landscape.api.train``, ``landscape.api.interpolate``, ...)
that resolves references through the store, calls a pure analyzer and writes its result. The most used
functions are re-exported lazily so ``from landscape.api import interpolate`` works without importing
every analyzer.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module under landscape.api
_EXPORTS: dict[str, str] = {}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'landscape.api' has no attribute {name!r}")
    return getattr(importlib.import_module(f"landscape.api.{module}"), name)


def __dir__() -> list[str]:
    return sorted(_EXPORTS)
