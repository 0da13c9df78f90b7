"""Plain JSON values from numpy/torch scalars, arrays, paths and dataclasses (:func:`to_jsonable`), and
:func:`is_tensor` without importing torch (or numpy). Below the store (manifests) and the results (attrs)."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Mapping
from typing import Any


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor, without importing torch (reading and listing results needs none;
    a tensor can only exist once torch is imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def to_jsonable(value: Any) -> Any:
    """Convert numpy/torch scalars, arrays, paths and dataclasses to plain JSON types (NaN/inf as strings)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if is_tensor(value):
        return to_jsonable(value.detach().cpu().numpy())
    np = sys.modules.get("numpy")  # an array exists only once numpy is imported: the command line may not need it
    if np is not None and isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if np is not None and isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, os.PathLike):
        return str(value)
    return value
