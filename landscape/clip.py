"""Per-sample clipping factors: the one definition that training, the clipping analysis and the clipped NTK use.

Bu et al. 2023 Sec. 2.2 / App. D, each scaled so that a clipped gradient has norm ``<= C``: ``abadi``
``min(1, C/||g||)`` (Abadi et al. 2016; Watson et al. eq. (2)), ``automatic`` ``C/(||g|| + 0.01)``, ``normalize``
``C/||g||``, ``global`` ``1{||g|| <= C}``. Clipping styles: ``flat`` clips the whole per-sample gradient to ``C``,
``layerwise`` each layer (one parameter tensor) ``r`` to its own ``C_r``, by default ``C / sqrt(#layers)`` so that
``sqrt(sum_r C_r^2) = C`` (:func:`layer_threshold`).

Pure numerics: a tensor of norms in, a tensor of factors out (same dtype), no store, no model. Importing it
imports no torch (the command line's option checks read :data:`CLIP_STYLES`).
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


# name -> (per-sample norms, clipping norm C) -> per-sample factors c_i   (Bu et al. Sec. 2.2 / App. D)
CLIP_FUNCTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor | float], torch.Tensor]] = {
    "abadi": _abadi,
    "automatic": _automatic,
    "normalize": _normalize,
    "global": _global,
}


def clip_factors(norms: torch.Tensor, max_norm: float | torch.Tensor, fn: str = "abadi") -> torch.Tensor:
    """Per-sample clipping factors ``c_i`` for per-sample gradient norms (``||c_i g_i|| <= C``), in ``norms``'
    dtype. An unknown ``fn`` is one UsageError line."""
    try:
        func = CLIP_FUNCTIONS[fn]
    except KeyError:
        raise UsageError(f"unknown clipping function {fn!r}; choose one of {', '.join(CLIP_FUNCTIONS)}") from None
    return func(norms, max_norm)


def layer_threshold(max_grad_norm: float, n_layers: int) -> float:
    """The default per-layer threshold of layerwise clipping, ``C / sqrt(#layers)``: the squares sum to ``C^2``."""
    return max_grad_norm / math.sqrt(n_layers)


__all__ = ["CLIP_FUNCTIONS", "CLIP_STYLES", "clip_factors", "layer_threshold"]
