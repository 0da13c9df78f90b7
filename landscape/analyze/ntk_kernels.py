"""What both NTK analyses (``ntk``, ``ntk-table``; Bu et al. 2023) measure: a kernel's symmetry and positivity
(Def. 4.2), the clipped kernel A = K C (flat) or sum_r K_r C_r (layerwise), the per-layer kernels of a model
and the examples drawn from a checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import torch
from torch import nn

from landscape.clip import CLIP_STYLES, clip_factors, layer_threshold
from landscape.curvature import eval_mode
from landscape.errors import NonFiniteError, UsageError, param
from landscape.gram import gram_blocks, layer_names
from landscape.runtime import resolve_device

#: an eigenvalue counts as >= 0 if it is >= -EIG_RTOL * ||A||_F, as real if |imag| <= EIG_RTOL * ||A||_F
EIG_RTOL = 1e-6
#: a matrix counts as symmetric if ||A - A^T||_F / ||A||_F <= SYM_RTOL
SYM_RTOL = 1e-6


@dataclass(frozen=True)
class KernelProperties:
    """Symmetry and positivity of a square matrix A (Bu et al. Def. 4.2), up to tolerances relative to
    ``norm`` = ||A||_F: ``positive_quadratic`` (x^T A x >= 0) iff (A + A^T)/2 has no negative eigenvalue,
    ``positive_eigenvalues`` iff every eigenvalue of A is real and non-negative."""

    n: int
    norm: float
    asymmetry: float
    min_sym_eig: float
    max_sym_eig: float
    n_negative_sym_eigs: int
    min_real_eig: float
    max_abs_imag_eig: float
    n_negative_real_eigs: int
    symmetric: bool
    positive_quadratic: bool
    positive_eigenvalues: bool
    sym_rtol: float
    eig_rtol: float
    eigvals: np.ndarray = field(repr=False, compare=False)
    sym_eigvals: np.ndarray = field(repr=False, compare=False)

    def scalars(self) -> dict[str, float | int | bool]:
        """The scalar fields (no spectra), e.g. for a table row or file attributes."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("eigvals", "sym_eigvals")}


def _as_numpy(A: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(A, torch.Tensor):
        A = A.detach().cpu().to(torch.float64).numpy()
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise UsageError(f"kernel must be a square matrix, got shape {A.shape}")
    if not np.isfinite(A).all():
        raise NonFiniteError("kernel has non-finite entries (NaN or inf): did the checkpoint diverge? check its "
                             "weights (landscape store show), the gradients and clipping factors")
    return A


def kernel_properties(A: np.ndarray | torch.Tensor, *, sym_rtol: float = SYM_RTOL,
                      eig_rtol: float = EIG_RTOL) -> KernelProperties:
    """Symmetry, positivity in quadratic form and positivity in eigenvalues of any square matrix."""
    A = _as_numpy(A)
    n = A.shape[0]
    norm = float(np.linalg.norm(A))
    if n == 0 or norm == 0.0:
        zeros = np.zeros(n)
        return KernelProperties(n, 0.0, 0.0, 0.0, 0.0, 0, 0.0, 0.0, 0, True, True, True, sym_rtol, eig_rtol,
                                zeros.astype(np.complex128), zeros)
    tol = eig_rtol * norm
    asym = float(np.linalg.norm(A - A.T) / norm)
    sym_eigs = np.linalg.eigvalsh((A + A.T) / 2)
    eigs = np.linalg.eigvals(A).astype(np.complex128)  # complex even when every eigenvalue is real
    eigs = eigs[np.lexsort((eigs.imag, eigs.real))]
    min_sym = float(sym_eigs[0])
    return KernelProperties(
        n=n,
        norm=norm,
        asymmetry=asym,
        min_sym_eig=min_sym,
        max_sym_eig=float(sym_eigs[-1]),
        n_negative_sym_eigs=int((sym_eigs < -tol).sum()),
        min_real_eig=float(eigs.real.min()),
        max_abs_imag_eig=float(np.abs(eigs.imag).max()),
        n_negative_real_eigs=int((eigs.real < -tol).sum()),
        symmetric=asym <= sym_rtol,
        positive_quadratic=min_sym >= -tol,
        positive_eigenvalues=bool(eigs.real.min() >= -tol and np.abs(eigs.imag).max() <= tol),
        sym_rtol=sym_rtol,
        eig_rtol=eig_rtol,
        eigvals=eigs,
        sym_eigvals=sym_eigs,
    )


@dataclass
class ClippedKernel:
    """A = K C or sum_r K_r C_r, the factors C ((n,) flat, (L, n) layerwise) and the fraction of samples with
    a clipped layer (``fraction_layers_clipped``: of (sample, layer) pairs)."""

    style: str
    A: np.ndarray
    C: np.ndarray
    fraction_clipped: float
    fraction_layers_clipped: float


def clip_kernel(K_layers: np.ndarray | torch.Tensor, layer_sq_norms: np.ndarray | torch.Tensor, *, style: str,
                max_grad_norm: float, clip_fn: str = "abadi",
                layer_max_norms: float | Sequence[float] | None = None, logits_per_sample: int = 1,
                sample_sq_norms: np.ndarray | torch.Tensor | None = None) -> ClippedKernel:
    """The clipped NTK from per-layer blocks ``K_layers`` (L, R, R), R = n * ``logits_per_sample``, and the
    squared per-layer loss-gradient norms (L, n) (Bu et al. eqs. 4.3, 4.4). ``sample_sq_norms``: the whole
    model's ||g_i||^2 when ``K_layers`` holds only some layers (flat clipping clips the full gradient)."""
    K_layers = torch.as_tensor(K_layers, dtype=torch.float64)
    sq = torch.as_tensor(layer_sq_norms, dtype=torch.float64).clamp_min(0)
    L = K_layers.shape[0]
    M = logits_per_sample
    if style == "flat":
        full = sq.sum(0) if sample_sq_norms is None else torch.as_tensor(np.asarray(sample_sq_norms),
                                                                          dtype=torch.float64).clamp_min(0)
        norms = full.sqrt()
        C = clip_factors(norms, max_grad_norm, clip_fn)
        A = K_layers.sum(0) * C.repeat_interleave(M)[None, :]
        frac = float((norms > max_grad_norm).double().mean())
        return ClippedKernel(style, A.numpy(), C.numpy(), frac, frac)
    if style == "layerwise":
        if layer_max_norms is None:
            layer_max_norms = layer_threshold(max_grad_norm, L)
        thresholds = torch.as_tensor(layer_max_norms, dtype=torch.float64).reshape(-1)
        if thresholds.numel() == 1:
            thresholds = thresholds.expand(L)
        if thresholds.numel() != L:
            raise UsageError(f"need one layer max norm per layer ({L}), got {thresholds.numel()}")
        norms = sq.sqrt()
        C = torch.stack([clip_factors(norms[r], thresholds[r], clip_fn) for r in range(L)])
        A = (K_layers * C.repeat_interleave(M, dim=1)[:, None, :]).sum(0)
        over = norms > thresholds[:, None]
        return ClippedKernel(style, A.numpy(), C.numpy(), float(over.any(0).double().mean()),
                             float(over.double().mean()))
    raise UsageError(f"unknown clip style '{style}' (choose from {', '.join(CLIP_STYLES)})")


@dataclass
class LayerKernels:
    """Per-layer blocks of one kind, plus the squared per-layer loss-gradient norms behind the clipping."""

    kind: str
    layer_names: list[str]
    K_layers: np.ndarray  # (L, R, R)
    layer_sq_norms: np.ndarray  # (L, n)
    logits_per_sample: int  # M for kind "output", else 1
    n_model_layers: int  # trainable parameter tensors of the whole model (for C / sqrt(#layers))
    sample_sq_norms: np.ndarray  # (n,) ||g_i||^2 over the WHOLE model (flat clipping), even for a layer subset

    @property
    def K(self) -> np.ndarray:
        return self.K_layers.sum(0)


def layer_kernels(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, kind: str = "loss-grad",
                  layers: Sequence[str] | None = None, strategy: str = "auto",
                  max_memory: str | int | None = None, precision: str = "auto") -> LayerKernels:
    """Per-layer kernels of ``kind`` and the per-layer loss-gradient norms, with one Gram computation."""
    names = layer_names(model, layers)
    all_names = layer_names(model)
    gram_kind = "loss-grad" if kind == "loss-grad" else "output"
    blocks = gram_blocks(model, x, y, kind=gram_kind, strategy=strategy, max_memory=max_memory,
                         layers=names, precision=precision)
    R = blocks[names[0]].shape[0]
    stacked = torch.empty(len(names), R, R, dtype=torch.float64)  # (L, R, R), filled block by block
    for i, k in enumerate(names):
        stacked[i] = blocks.pop(k)
    n = x.shape[0]
    if kind == "loss-grad":
        sq = stacked.diagonal(dim1=1, dim2=2)
        return LayerKernels(kind, names, stacked.numpy(), sq.numpy(), 1, len(all_names),
                            _full_sq_norms(model, x, y, sq, names, all_names))
    M = stacked.shape[1] // n
    with torch.no_grad(), eval_mode(model):
        logits = model(x).to(device="cpu", dtype=torch.float64)
    v = torch.softmax(logits, dim=1) - torch.nn.functional.one_hot(y.cpu(), M).to(torch.float64)  # dl_i/df_i
    per = stacked.reshape(len(names), n, M, n, M).diagonal(dim1=1, dim2=3)  # (L, M, M, n)
    sq = torch.einsum("im,rmki,ik->ri", v, per, v)
    if kind == "output-trace":
        stacked = stacked.reshape(len(names), n, M, n, M).diagonal(dim1=2, dim2=4).sum(-1)
        M = 1
    return LayerKernels(kind, names, stacked.numpy(), sq.numpy(), M, len(all_names),
                        _full_sq_norms(model, x, y, sq, names, all_names))


def _full_sq_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sq: torch.Tensor, names: Sequence[str],
                   all_names: Sequence[str]) -> np.ndarray:
    """||g_i||^2 of the whole model (flat clipping clips the full gradient, whatever layers are shown)."""
    if list(names) == list(all_names):
        return sq.sum(0).numpy()
    from landscape.persample import PerSampleEngine

    with eval_mode(model):  # as the kernels are computed: dropout off, BatchNorm on its running statistics
        return (PerSampleEngine(model).norms(x, y).flat.to(device="cpu", dtype=torch.float64) ** 2).numpy()


def clip_layer_kernels(lk: LayerKernels, *, style: str, max_grad_norm: float, clip_fn: str,
                       layer_max_norms: float | None = None) -> ClippedKernel:
    """:func:`clip_kernel` on :class:`LayerKernels`, per-layer thresholds C/sqrt(#model layers) by default."""
    if style == "layerwise" and layer_max_norms is None:
        layer_max_norms = layer_threshold(max_grad_norm, lk.n_model_layers)
    return clip_kernel(lk.K_layers, lk.layer_sq_norms, sample_sq_norms=lk.sample_sq_norms, style=style,
                       max_grad_norm=max_grad_norm,
                       clip_fn=clip_fn, layer_max_norms=layer_max_norms, logits_per_sample=lk.logits_per_sample)


def model_and_examples(point, config):
    """The checkpoint's model and the ``config.subset`` examples of its split the one sampler draws (x, y,
    indices), on ``config.device`` (in float64 for ``precision="float64"``)."""
    from landscape.data import sample_subset

    device = resolve_device(config.device)
    model = point.model().eval().to(device)  # eval: dropout off, BatchNorm on its running statistics
    if config.precision == "float64":
        model = model.double()
    x, y = point.data.split(config.split)
    if isinstance(config.subset, int) and config.subset > len(y):
        raise UsageError(f"{param('subset', config.subset)} is more than the {len(y)} {config.split} examples of "
                         f"data set '{point.checkpoint.data_spec.get('name')}'")
    idx = sample_subset(y, config.subset, config.subset_seed, split=config.split)
    x, y = x[idx], y[idx]
    dtype = next(model.parameters()).dtype
    x = x.to(device, dtype) if x.is_floating_point() else x.to(device)  # token ids stay integers
    return model, x, y.to(device), idx.numpy()


def yes_no(flag: bool) -> str:
    return "yes" if flag else "NO"
