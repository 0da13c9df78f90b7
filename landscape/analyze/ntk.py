"""The empirical NTK under per-sample clipping (Bu et al. 2023 Secs. 3-4): H, H C (flat) or sum_r H_r C_r
(layerwise), and their symmetry and positivity, which small clipping norms break."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from landscape.analyze.ntk_kernels import (
    KernelProperties,
    clip_layer_kernels,
    kernel_properties,
    layer_kernels,
    model_and_examples,
    yes_no,
)
from landscape.analyze.specs import NTKConfig
from landscape.clip import layer_threshold
from landscape.results import StoredResult, stored


@dataclass
class NTKResult(StoredResult):
    """One checkpoint's (clipped) NTK: kernels, clipping factors, spectra and properties (``K_``:
    unclipped)."""

    KIND = "ntk"
    CONFIG = NTKConfig

    config: NTKConfig
    layer_names: list[str] = stored("array")
    K: np.ndarray
    K_layers: np.ndarray
    norms: np.ndarray  # (n,) loss-gradient norms ||g_i||
    layer_norms: np.ndarray  # (L, n) ||g_{i,r}||
    C: np.ndarray  # (n,) flat, (L, n) layerwise, ones for clip none
    A: np.ndarray
    properties: KernelProperties = stored("nested")  # of A
    K_properties: KernelProperties = stored("nested", name="K_")  # of K (unclipped)
    fraction_clipped: float
    fraction_layers_clipped: float
    indices: np.ndarray  # data set indices of the n examples
    labels: np.ndarray
    layer_max_norms: float | None = None

    def summary(self) -> dict:
        """What the CLI prints: the clipped kernel's properties and the unclipped kernel's."""
        out = {"kind": self.config.kernel, "clip_style": self.config.clip_style, "n": int(len(self.labels)),
               "fraction_clipped": self.fraction_clipped}
        out.update(self.properties.scalars())
        out.update({f"K_{k}": v for k, v in self.K_properties.scalars().items()})
        return out

    def derived(self) -> tuple[dict, dict, dict]:
        """``K_eigvals`` (the earlier name of ``K_sym_eigvals``), the frame's columns (one row per example)
        and the labelled dimensions of the arrays whose shapes fit them."""
        arrays = {"K_eigvals": self.K_properties.sym_eigvals}
        n, m = len(self.labels), self.K.shape[0]
        k = ("sample", "sample_j") if m == n else ("entry", "entry_j")
        want = {"K": k, "A": k, "K_layers": ("layer", *k), "layer_names": ("layer",), "norms": ("sample",),
                "layer_norms": ("layer", "sample"), "C": ("sample",) if np.ndim(self.C) == 1 else ("layer", "sample"),
                "indices": ("sample",), "labels": ("sample",)}
        want.update({name: ("eig",) for name in ("eigvals_real", "eigvals_imag", "sym_eigvals", "K_eigvals",
                                                 "K_eigvals_real", "K_eigvals_imag", "K_sym_eigvals")})
        shapes = {"K": self.K, "A": self.A, "K_layers": self.K_layers, "layer_names": self.layer_names,
                  "norms": self.norms, "layer_norms": self.layer_norms, "C": self.C, "indices": self.indices,
                  "labels": self.labels, "K_eigvals": self.K_properties.sym_eigvals}
        for prefix, p in (("", self.properties), ("K_", self.K_properties)):
            shapes.update({f"{prefix}eigvals_real": p.eigvals, f"{prefix}eigvals_imag": p.eigvals,
                           f"{prefix}sym_eigvals": p.sym_eigvals})
        sizes: dict[str, int] = {}
        dims = {}
        for name, names in want.items():
            shape = np.shape(shapes[name])
            if len(shape) == len(names) and all(sizes.setdefault(d, s) == s for d, s in zip(names, shape, strict=True)):
                dims[name] = names
        return arrays, {"table": json.dumps(["indices", "labels", "norms"])}, dims


def compute_ntk(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: NTKConfig, *,
                indices: np.ndarray | None = None) -> NTKResult:
    """The (clipped) NTK of ``model`` on examples ``x, y`` as ``config`` asks (pure: no store I/O)."""
    lk = layer_kernels(model, x, y, kind=config.kernel, layers=config.layers, strategy=config.strategy,
                       max_memory=config.max_memory, precision=config.precision)
    K = lk.K
    L, n = lk.layer_sq_norms.shape
    layer_max = None
    if config.clip_style == "none":
        A, C, frac, frac_layers = K, np.ones(n), 0.0, 0.0
    else:
        ck = clip_layer_kernels(lk, style=config.clip_style, max_grad_norm=config.max_grad_norm, clip_fn=config.clip_fn,
                                layer_max_norms=config.layer_max_norms)
        A, C, frac, frac_layers = ck.A, ck.C, ck.fraction_clipped, ck.fraction_layers_clipped
        if config.clip_style == "layerwise":
            layer_max = (config.layer_max_norms if config.layer_max_norms is not None
                         else layer_threshold(config.max_grad_norm, lk.n_model_layers))
    return NTKResult(
        config=config, layer_names=lk.layer_names, K=K, K_layers=lk.K_layers,
        norms=np.sqrt(np.clip(lk.sample_sq_norms, 0, None)), layer_norms=np.sqrt(np.clip(lk.layer_sq_norms, 0, None)),
        C=C, A=A, properties=kernel_properties(A), K_properties=kernel_properties(K),
        fraction_clipped=frac, fraction_layers_clipped=frac_layers,
        indices=np.arange(n) if indices is None else np.asarray(indices), labels=y.cpu().numpy(),
        layer_max_norms=layer_max,
    )


def compute_point(point, config: NTKConfig) -> NTKResult:
    """:func:`compute_ntk` at one resolved checkpoint (``precision="float64"`` runs the model in float64)."""
    model, x, y, idx = model_and_examples(point, config)
    return compute_ntk(model, x, y, config, indices=idx)


def _ntk_rows(r: NTKResult) -> list[dict]:
    rows = []
    for label, p, frac in (("K", r.K_properties, 0.0), (f"A ({r.config.clip_style})", r.properties, r.fraction_clipped)):
        if label == "K" or r.config.clip_style != "none":
            rows.append({"kernel": label, "size": p.n, "clipped": frac, "symmetric": yes_no(p.symmetric),
                         "asymmetry": p.asymmetry, "pos_quad": yes_no(p.positive_quadratic),
                         "min_sym_eig": p.min_sym_eig, "pos_eig": yes_no(p.positive_eigenvalues),
                         "min_re_eig": p.min_real_eig, "max_|im|": p.max_abs_imag_eig, "norm": p.norm})
    return rows
