"""Per-sample clipping factors (Bu et al. 2023 Sec. 2.2 / App. D), the one definition training, the clipping
analysis and the clipped NTK use: a clipped gradient has norm ``<= C``. ``layerwise`` clipping gives each
parameter tensor ``C / sqrt(#layers)``. Imports no torch (the command line reads :data:`CLIP_STYLES`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from landscape.errors import UsageError

if TYPE_CHECKING:
    import torch

CLIP_STYLES = ("flat", "layerwise")
_TINY = 1e-12  # a zero gradient: abadi's factor is 1, normalize's finite


def _abadi(norms: torch.Tensor, c: torch.Tensor | float) -> torch.Tensor:
    return (c / norms.clamp_min(_TINY)).clamp(max=1.0)


def _automatic(norms: torch.Tensor, c: torch.Tensor | float) -> torch.Tensor:
    return c / (norms + 0.01)


def _normalize(norms: torch.Tensor, c: torch.Tensor | float) -> torch.Tensor:
    return c / norms.clamp_min(_TINY)


def _global(norms: torch.Tensor, c: torch.Tensor | float) -> torch.Tensor:
    return (norms <= c).to(norms.dtype)


# name -> (per-sample norms, clipping norm C) -> per-sample factors c_i
CLIP_FUNCTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor | float], torch.Tensor]] = {
    "abadi": _abadi,  # min(1, C/|g|), Abadi et al. 2016
    "automatic": _automatic,  # C/(|g| + 0.01)
    "normalize": _normalize,  # C/|g|
    "global": _global,  # 1{|g| <= C}
}


def clip_factors(norms: torch.Tensor, max_norm: float | torch.Tensor, fn: str = "abadi") -> torch.Tensor:
    """Per-sample clipping factors ``c_i`` (``||c_i g_i|| <= C``) in ``norms``' dtype."""
    try:
        func = CLIP_FUNCTIONS[fn]
    except KeyError:
        raise UsageError(f"unknown clipping function {fn!r}; choose one of {', '.join(CLIP_FUNCTIONS)}") from None
    return func(norms, max_norm)


def layer_threshold(max_grad_norm: float, n_layers: int) -> float:
    """The default per-layer threshold of layerwise clipping: the squares sum to ``C^2``."""
    return max_grad_norm / math.sqrt(n_layers)
