"""One privatised gradient step (the optimizers of docs/training.md): ``dpsgd`` divides by the EXPECTED batch
size (a data-dependent denominator would leak it; Opacus does the same); under ``layerwise`` clipping the noise
stays ``sigma * sqrt(sum_r C_r^2)`` per coordinate, as the accountant assumes. Masks apply to the per-sample
gradients and to the noise, so masked coordinates get exactly zero (Zhu Thm. 3.1)."""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from landscape.clip import CLIP_FUNCTIONS, CLIP_STYLES, layer_threshold
from landscape.errors import IncompatibleError, OptionError, UsageError
from landscape.evaluate.allocator import tuned_allocator
from landscape.pooling import exact_fast_pooling
from landscape.train.config import OPTIMIZERS
from landscape.train.smoothing import laplacian_smooth


@dataclass
class PrivacyConfig:
    """How one gradient step is privatised (mirrored by ``landscape train`` options)."""

    optimizer: str = "dpsgd"  # sgd | dpsgd | clip-only | noise-only
    max_grad_norm: float = 1.0  # C
    noise_multiplier: float = 1.0  # sigma (ignored by sgd and clip-only)
    clip_style: str = "flat"  # flat | layerwise
    clip_fn: str = "abadi"  # abadi | automatic | normalize | global
    layer_max_norms: dict[str, float] | None = None  # layerwise C_r; None -> C / sqrt(#layers)
    smooth: float = 0.0  # Laplacian smoothing sigma_LS (DP-LSSGD); 0 = off
    track_norms: bool = True  # sgd / noise-only: also compute per-sample norms for the step metrics

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise OptionError("optimizer", f"must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.clip_style not in CLIP_STYLES:
            raise OptionError("clip_style", f"must be flat or layerwise, got {self.clip_style!r}")
        if self.clip_fn not in CLIP_FUNCTIONS:
            raise OptionError("clip_fn", f"must be one of {', '.join(CLIP_FUNCTIONS)}, got {self.clip_fn!r}")
        if not (self.max_grad_norm > 0 and math.isfinite(self.max_grad_norm)):
            raise OptionError("max_grad_norm", f"must be a positive number, got {self.max_grad_norm}")
        if not (self.noise_multiplier >= 0 and math.isfinite(self.noise_multiplier)):
            raise OptionError("noise_multiplier", f"must be a number >= 0, got {self.noise_multiplier}")
        if not (self.smooth >= 0 and math.isfinite(self.smooth)):
            raise OptionError("smooth", f"must be a number >= 0, got {self.smooth}")
        if self.layer_max_norms is not None:
            bad = {k: v for k, v in self.layer_max_norms.items() if not (v > 0 and math.isfinite(v))}
            if bad:
                raise OptionError("layer_max_norms", f"must be positive, got {bad}")

    @property
    def clips(self) -> bool:
        return self.optimizer in ("dpsgd", "clip-only")

    @property
    def adds_noise(self) -> bool:
        return self.optimizer in ("dpsgd", "noise-only") and self.noise_multiplier > 0


@dataclass
class StepStats:
    """Metrics of one step, as 0-dim float64 tensors on the model's device (no host sync until read). Gradient
    norms are per-sample, after masks and before clipping (NaN when not computed); ``fraction_clipped`` counts
    (sample, layer) pairs under layerwise clipping; ``noise_norm`` is taken after the division by ``B``."""

    loss: torch.Tensor
    accuracy: torch.Tensor
    mean_grad_norm: torch.Tensor
    max_grad_norm: torch.Tensor
    fraction_clipped: torch.Tensor
    noise_norm: torch.Tensor
    update_norm: torch.Tensor
    batch_size: int = 0

    def as_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}


def _total_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of a list of tensors taken as one vector (float64 0-dim)."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors)).to(torch.float64))


class Privatizer:
    """Computes one (privatised) gradient step into ``p.grad`` of the trainable parameters. ``expected_batch_size``
    is ``B`` in ``(clipped sum + noise) / B``; ``generator`` draws the noise. From its first step until collected
    (or ``release_memory()``) it holds ``tuned_allocator``, so each step reuses the previous step's memory."""

    def __init__(self, model: nn.Module, config: PrivacyConfig, *, expected_batch_size: float,
                 generator: torch.Generator, engine: Any | None = None):
        if not (expected_batch_size > 0):
            raise UsageError(f"expected batch size must be > 0, got {expected_batch_size}")
        self.model = model
        self.config = config
        self.expected_batch_size = float(expected_batch_size)
        self.generator = generator
        self._engine = engine
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.named:
            raise UsageError("the model has no trainable parameters")
        self.layer_max_norms = self._layer_norms()
        if config.clip_style == "layerwise":
            self.sensitivity = math.sqrt(sum(c * c for c in self.layer_max_norms.values()))
        else:
            self.sensitivity = float(config.max_grad_norm)
        # std of the noise added to the SUM of (clipped) per-sample gradients
        self.noise_std = config.noise_multiplier * self.sensitivity if config.adds_noise else 0.0
        self._mask_cache: tuple[Any, dict[str, torch.Tensor]] | None = None
        self._kept: weakref.finalize | None = None

    def _layer_norms(self) -> dict[str, float]:
        names = [n for n, _ in self.named]
        given = self.config.layer_max_norms
        if given is None:
            c = layer_threshold(self.config.max_grad_norm, len(names))
            return {n: c for n in names}
        unknown = sorted(set(given) - set(names))
        missing = [n for n in names if n not in given]
        if unknown or missing:
            raise UsageError(
                "layer_max_norms must name every trainable parameter; "
                + (f"unknown: {unknown[0]}" if unknown else f"missing: {missing[0]}")
            )
        return {n: float(given[n]) for n in names}

    @property
    def engine(self):
        if self._engine is None:
            from landscape.persample import PerSampleEngine

            self._engine = PerSampleEngine(self.model)
        return self._engine

    def prepare_masks(self, masks: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
        """Masks as tensors of each parameter's dtype and device (cached for a repeated mask object)."""
        if not masks:
            return None
        if self._mask_cache is not None and self._mask_cache[0] is masks:
            return self._mask_cache[1]
        params = dict(self.named)
        out = {}
        for name, m in masks.items():
            p = params.get(name)
            if p is None:
                raise IncompatibleError(f"mask for {name!r} names no trainable parameter of the model")
            if tuple(m.shape) != tuple(p.shape):
                raise IncompatibleError(
                    f"mask for {name!r} has shape {tuple(m.shape)}, the parameter {tuple(p.shape)}"
                )
            out[name] = torch.as_tensor(m).to(device=p.device, dtype=p.dtype)
        self._mask_cache = (masks, out)
        return out

    def _factor_fn(self):
        cfg = self.config
        fn = CLIP_FUNCTIONS[cfg.clip_fn]
        if not cfg.clips:
            return lambda norms: torch.ones_like(norms.flat)
        if cfg.clip_style == "flat":
            return lambda norms: fn(norms.flat, cfg.max_grad_norm)
        return lambda norms: {n: fn(norms.layers[n], c) for n, c in self.layer_max_norms.items()}

    def _fraction_clipped(self, norms) -> torch.Tensor:
        cfg = self.config
        if not cfg.clips:
            return torch.zeros((), dtype=torch.float64, device=norms.flat.device)
        if cfg.clip_style == "flat":
            return (norms.flat > cfg.max_grad_norm).to(torch.float64).mean()
        over = [(norms.layers[n] > c).to(torch.float64) for n, c in self.layer_max_norms.items()]
        return torch.stack(over).mean()

    def _noise(self, p: torch.Tensor) -> torch.Tensor:
        gen = self.generator
        z = torch.randn(p.shape, generator=gen, device=gen.device, dtype=p.dtype)
        return z.to(p.device).mul_(self.noise_std)

    @staticmethod
    def _mask_(names: list[str], tensors: list[torch.Tensor], masks_t: dict[str, torch.Tensor] | None) -> None:
        if masks_t is None:
            return
        for name, t in zip(names, tensors, strict=True):
            m = masks_t.get(name)
            if m is not None:
                t.mul_(m)

    def release_memory(self) -> None:
        """End the allocator tuning of the steps (``tuned_allocator``) now rather than when this object is collected;
        a later step starts it again."""
        if self._kept is not None:
            self._kept()

    def compute_gradients(
        self, x: torch.Tensor, y: torch.Tensor, *, masks: Mapping[str, torch.Tensor] | None = None
    ) -> StepStats:
        """Fill ``p.grad`` with the step's gradient; return the step's metrics."""
        if self._kept is None or not self._kept.alive:
            kept = tuned_allocator()
            kept.__enter__()
            self._kept = weakref.finalize(self, kept.__exit__, None, None, None)
        cfg = self.config
        masks_t = self.prepare_masks(masks)
        n = int(x.shape[0])
        dev = self.named[0][1].device
        nan = torch.full((), math.nan, dtype=torch.float64, device=dev)
        loss = acc = mean_norm = max_norm = nan
        frac = torch.zeros((), dtype=torch.float64, device=dev)

        names = [name for name, _ in self.named]
        if n == 0:
            sums = {name: torch.zeros_like(p) for name, p in self.named}
        else:
            if cfg.optimizer in ("sgd", "noise-only") and not cfg.track_norms:  # one backward, no norms
                with exact_fast_pooling(self.model):  # PyTorch's values and gradients, its faster CPU kernel
                    logits = self.model(x)
                    losses = F.cross_entropy(logits, y, reduction="none")
                    grads = torch.autograd.grad(losses.sum(), [p for _, p in self.named])
                sums = dict(zip(names, grads, strict=True))
            else:
                sums, norms = self.engine.clipped_sum(x, y, self._factor_fn(), masks=masks_t)
                losses, logits = norms.loss, norms.logits
                mean_norm = norms.flat.mean().to(torch.float64)
                max_norm = norms.flat.max().to(torch.float64)
                frac = self._fraction_clipped(norms)
            loss = losses.detach().to(torch.float64).mean()
            acc = (logits.detach().argmax(dim=1) == y).to(torch.float64).mean()

        divisor = max(n, 1) if cfg.optimizer == "sgd" else self.expected_batch_size
        grads = [sums[name].detach().to(p.dtype) for name, p in self.named]
        grads = [g.clone() if g._base is not None else g for g in grads]  # never write into a view
        self._mask_(names, grads, masks_t)
        noise_norm = torch.zeros((), dtype=torch.float64, device=dev)
        if self.noise_std > 0:
            noises = [self._noise(p) for _, p in self.named]
            self._mask_(names, noises, masks_t)
            noise_norm = _total_norm(noises) / divisor
            torch._foreach_add_(grads, noises)
        torch._foreach_div_(grads, divisor)
        if cfg.smooth > 0:
            grads = [laplacian_smooth(g, cfg.smooth) for g in grads]
            self._mask_(names, grads, masks_t)
        for (_, p), g in zip(self.named, grads, strict=True):
            p.grad = g
        return StepStats(loss=loss, accuracy=acc, mean_grad_norm=mean_norm, max_grad_norm=max_norm,
                         fraction_clipped=frac, noise_norm=noise_norm, update_norm=_total_norm(grads), batch_size=n)
