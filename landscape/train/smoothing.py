"""Laplacian smoothing of a noisy gradient, DP-LSSGD (Wang et al. 2019): ``A_s^{-1} g`` with ``A_s = I - s L``
(``L`` the periodic 1-D Laplacian of the flattened tensor) is circulant, so one FFT division."""

from __future__ import annotations

import math

import torch

from landscape.errors import OptionError


def laplacian_smooth(g: torch.Tensor, sigma: float) -> torch.Tensor:
    """``A_sigma^{-1} g`` for one tensor, flattened (a new tensor of ``g``'s shape and dtype)."""
    if sigma < 0 or not math.isfinite(sigma):
        raise OptionError("smooth", f"must be a finite number >= 0, got {sigma}")
    if sigma == 0 or g.numel() <= 1:
        return g.clone()
    flat = g.reshape(-1).to(torch.float64)
    d = flat.numel()
    k = torch.arange(d // 2 + 1, dtype=torch.float64, device=flat.device)
    eig = 1.0 + 2.0 * sigma - 2.0 * sigma * torch.cos(2.0 * math.pi * k / d)  # of A_sigma, in rfft order
    out = torch.fft.irfft(torch.fft.rfft(flat) / eig, n=d)
    return out.to(g.dtype).reshape(g.shape)
