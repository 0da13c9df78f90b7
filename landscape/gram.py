"""Per-layer Gram blocks of per-sample gradients: the empirical NTK, layer by layer.

``gram_blocks(model, x, y)`` returns, for every trainable parameter tensor r (its ``named_parameters``
name: a "layer" in the sense of layerwise clipping),

- ``kind="loss-grad"``: K_r[i, j] = <grad_r l_i, grad_r l_j>, n x n, with l_i = cross_entropy(f(x_i), y_i).
  sum_r K_r = K = G G^T, the Gram matrix of the per-sample gradients (Bu et al. 2023, eq. 3.1 with the
  loss folded in; H_r of eq. 4.4).
- ``kind="output"``: the output NTK block J_r J_r^T of shape (n M) x (n M) for M logits, rows and
  columns ordered sample-major (row ``i * M + m`` is d f_m(x_i) / d w_r).
- ``kind="output-trace"``: its trace over logits, n x n: sum_m <d f_m(x_i)/d w_r, d f_m(x_j)/d w_r>.

Strategies (all exact):

- ``"hooks"`` (what ``"auto"`` uses): one batched forward and one backward per logit pass, keeping each
  layer's inputs A_i (unfolded for convolutions, T positions x p features) and output gradients B_i
  (T x d). Per weight layer it either materialises per-sample gradients B_i^T A_i and takes G G^T
  (cost ~ n T p d + n^2 p d) or uses the "ghost" cross-sample formula
  K_r[i, j] = sum_{t,s} (A_i A_j^T)_{ts} (B_i B_j^T)_{ts}  (cost ~ n^2 T^2 (p + d)),
  whichever needs fewer flops for its (T, p, d). Biases and normalisation affine parameters have tiny
  per-sample gradients, which are materialised during the backward pass. Parameters of modules the hooks
  do not know (anything but Linear, Conv2d with groups=1, GroupNorm, LayerNorm, or a module called
  twice) are handled by ``torch.func`` (``vmap(grad)`` / ``vmap(jacrev)``) restricted to them.
- ``"materialize"`` / ``"ghost"``: the hook route with that choice forced for every weight layer.
- ``"functorch"``: ``vmap(grad)`` (``vmap(jacrev)`` for output kinds) per-sample gradients for every
  parameter, then G G^T per layer: the reference route.

Memory is bounded by ``max_memory`` (bytes or "4GB", default 4 GiB): when the whole batch fits, each
weight layer's block is computed inside the backward pass as soon as its output gradient arrives and its
factors are dropped (so they never all coexist); when it does not fit, samples are processed in chunks and
blocks of sample pairs are computed from re-captured chunks; per-layer work is split into sub-blocks.
Convolutions with many output positions get per-sample gradients from a vmapped convolution backward
(no unfolded input), others from unfold + einsum.

Precision: blocks are returned in ``dtype`` (float64). ``precision="auto"`` sums bias / norm gradients over
positions in float64 and forms the Gram products of small tensors (<= ``SMALL_PARAM`` elements) in float64,
large contractions in the model's dtype; ``"double"`` does every contraction in float64; ``"single"``
everything in the model's dtype. The accuracy of a float32 model is limited by its float32 backward pass
itself (measured on resnet18/GroupNorm: total K to ~2e-5, single GroupNorm-bias blocks to ~3e-3 relative);
run the model in float64 (``model.double()``, ``--precision double`` in the CLI) when per-layer blocks of
tiny tensors must be exact.
BatchNorm couples the samples of a batch, so per-sample gradients are undefined: such models are refused.

This module has its own activation / output-gradient capture: ``landscape.persample``'s capture is private
and does a single loss backward, while Gram blocks also need one backward per logit (output kinds), blocks
between re-captured sample chunks, and blocks formed during the backward pass. The two should eventually
share one capture utility.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, jacrev, vmap

from landscape.errors import ModelError, UsageError

KINDS = ("loss-grad", "output", "output-trace")
STRATEGIES = ("auto", "hooks", "materialize", "ghost", "functorch")
PRECISIONS = ("auto", "double", "single")
DEFAULT_MAX_MEMORY = 4 * 1024**3
# parameter tensors with at most this many elements get float64 contractions under precision="auto"
SMALL_PARAM = 16384
# convolutions with at least this many output positions get per-sample grads by batched conv backward
CONV_BACKWARD_MIN_T = 256

__all__ = [
    "DEFAULT_MAX_MEMORY",
    "KINDS",
    "STRATEGIES",
    "gram_blocks",
    "layer_names",
    "parse_memory",
    "ghost_cost",
    "materialize_cost",
]


def parse_memory(value: str | int | float | None) -> int | None:
    """``"4GB"``, ``"512MiB"``, ``"1e9"``, ``1_000_000`` -> bytes; None/"none" -> None."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    if isinstance(value, (int, float)):
        if value <= 0:
            raise UsageError(f"memory budget must be positive, got {value}")
        return int(value)
    text = value.strip().upper().replace(" ", "")
    units = {"TIB": 1024**4, "GIB": 1024**3, "MIB": 1024**2, "KIB": 1024, "TB": 1e12, "GB": 1e9, "MB": 1e6,
             "KB": 1e3, "T": 1024**4, "G": 1024**3, "M": 1024**2, "K": 1024, "B": 1}
    for unit, factor in units.items():
        if text.endswith(unit):
            number, scale = text[: -len(unit)], factor
            break
    else:
        number, scale = text, 1
    try:
        size = float(number) * scale
    except ValueError:
        raise UsageError(f"cannot read memory size '{value}' (examples: 4GB, 512MiB, 2e9)") from None
    if size <= 0:
        raise UsageError(f"memory budget must be positive, got '{value}'")
    return int(size)


def layer_names(model: nn.Module, layers: Sequence[str] | None = None) -> list[str]:
    """Trainable parameter names (``named_parameters`` order) matching any of the glob ``layers``."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if not layers:
        return names
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in layers)]
    if not chosen:
        raise UsageError(f"--layers {','.join(layers)} matches no trainable parameter; names look like {names[:3]}")
    return chosen


def materialize_cost(rows: int, n: int, T: int, p: int, d: int) -> float:
    """Multiply-adds of per-sample gradients B_i^T A_i for ``rows`` (sample, logit) pairs, then G G^T."""
    return rows * T * p * d + rows * rows * p * d


def ghost_cost(rows: int, n: int, T: int, p: int, d: int) -> float:
    """Multiply-adds of the ghost formula: (A A^T) over sample pairs, (B B^T) over row pairs, product."""
    return n * n * T * T * p + rows * rows * T * T * (d + 1)


# ---------------------------------------------------------------------------------------------- capture
@dataclass
class _Weight:
    """A weight layer's captured factors: per-sample gradient of row (i, m) is B[i, m]^T A[i]."""

    raw: torch.Tensor  # module input as seen in forward (c, ...)
    unfold: Callable[[torch.Tensor], torch.Tensor]  # raw sub-batch -> A (c', T, p)
    B: list[torch.Tensor] = field(default_factory=list)  # per pass: (c, T, d)
    T: int = 0
    p: int = 0
    d: int = 0
    conv: nn.Conv2d | None = None  # set for convolutions: per-sample grads by a batched convolution backward
    out_hw: tuple[int, int] = (0, 0)

    def A(self, idx: slice) -> torch.Tensor:
        return self.unfold(self.raw[idx])

    def Bs(self, idx: slice) -> torch.Tensor:  # (c', Mb, T, d)
        return torch.stack([b[idx] for b in self.B], dim=1)


class _Capture:
    """Hooks on the supported modules of one model: inputs in forward, output gradients in backward."""

    def __init__(self, model: nn.Module, owners: dict[nn.Module, dict[str, str]], reduce_dtype: torch.dtype,
                 on_ready: Callable[[str, _Weight], torch.Tensor] | None = None, passes: int = 1):
        self.model = model
        # on_ready(name, weight) turns a weight layer's factors into its block as soon as its last output
        # gradient arrives, so the factors are freed during the backward pass (lower peak memory)
        self.on_ready, self.passes = on_ready, passes
        self.done: dict[str, torch.Tensor] = {}
        self.rdt = reduce_dtype  # sums over positions for biases / norm parameters are accumulated in this
        self.owners = owners  # module -> {role ("weight"/"bias"): parameter name}
        self.weights: dict[str, _Weight] = {}
        self.direct: dict[str, list[torch.Tensor]] = {}  # name -> per pass (c, numel)
        self.calls: dict[nn.Module, int] = {}
        self._saved: dict[nn.Module, torch.Tensor] = {}
        self._handles: list = []

    def __enter__(self) -> _Capture:
        for module in self.owners:
            self._handles.append(module.register_forward_hook(self._forward_hook))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._saved.clear()

    def _forward_hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        self.calls[module] = self.calls.get(module, 0) + 1
        inp = inputs[0].detach()
        roles = self.owners[module]
        if isinstance(module, (nn.GroupNorm, nn.LayerNorm)):
            self._saved[module] = inp  # shares storage with what autograd saves; normalised in the grad hook
        elif "weight" in roles:
            self.weights[roles["weight"]] = _weight_factors(module, inp)
        if output.requires_grad:
            output.register_hook(lambda g, m=module: self._grad_hook(m, g))

    def _grad_hook(self, module: nn.Module, g: torch.Tensor) -> None:
        g = g.detach()
        roles = self.owners[module]
        c = g.shape[0]
        if isinstance(module, nn.GroupNorm):
            xhat = F.group_norm(self._saved[module], module.num_groups, None, None, module.eps)
            if "weight" in roles:
                self._add(roles["weight"], (xhat * g).reshape(c, g.shape[1], -1).sum(-1, dtype=self.rdt))
            if "bias" in roles:
                self._add(roles["bias"], g.reshape(c, g.shape[1], -1).sum(-1, dtype=self.rdt))
            return
        if isinstance(module, nn.LayerNorm):
            xhat = F.layer_norm(self._saved[module], module.normalized_shape, None, None, module.eps)
            k = len(module.normalized_shape)
            shape = (c, -1, *g.shape[g.dim() - k:])
            if "weight" in roles:
                self._add(roles["weight"], (xhat * g).reshape(shape).sum(1, dtype=self.rdt).reshape(c, -1))
            if "bias" in roles:
                self._add(roles["bias"], g.reshape(shape).sum(1, dtype=self.rdt).reshape(c, -1))
            return
        if isinstance(module, nn.Conv2d):
            gb = g.reshape(c, g.shape[1], -1).transpose(1, 2)  # (c, T, d)
        else:  # Linear: (c, ..., d)
            gb = g.reshape(c, -1, g.shape[-1])
        if "weight" in roles:
            name = roles["weight"]
            self.weights[name].B.append(gb)
            if self.on_ready is not None and len(self.weights[name].B) == self.passes:
                self.done[name] = self.on_ready(name, self.weights.pop(name))
        if "bias" in roles:
            self._add(roles["bias"], gb.sum(1, dtype=self.rdt))

    def _add(self, name: str, value: torch.Tensor) -> None:
        self.direct.setdefault(name, []).append(value)


def _weight_factors(module: nn.Module, inp: torch.Tensor) -> _Weight:
    c = inp.shape[0]
    if isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        H, W = inp.shape[-2:]
        pad = module.padding
        if isinstance(pad, str):
            raise _Unsupported
        oh = (H + 2 * pad[0] - module.dilation[0] * (kh - 1) - 1) // module.stride[0] + 1
        ow = (W + 2 * pad[1] - module.dilation[1] * (kw - 1) - 1) // module.stride[1] + 1

        def unfold(raw: torch.Tensor, m=module) -> torch.Tensor:
            return F.unfold(raw, m.kernel_size, dilation=m.dilation, padding=m.padding, stride=m.stride).transpose(1, 2)

        return _Weight(raw=inp, unfold=unfold, T=oh * ow, p=inp.shape[1] * kh * kw, d=module.out_channels,
                       conv=module, out_hw=(oh, ow))
    flat = inp.reshape(c, -1, inp.shape[-1])
    return _Weight(raw=flat, unfold=lambda raw: raw, T=flat.shape[1], p=flat.shape[2], d=module.out_features)


class _Unsupported(Exception):
    pass


def _hook_owners(model: nn.Module, names: Sequence[str]) -> tuple[dict[nn.Module, dict[str, str]], list[str]]:
    """Map supported modules to the selected parameters they own; the rest go to torch.func."""
    wanted = set(names)
    owners: dict[nn.Module, dict[str, str]] = {}
    covered: set[str] = set()
    seen: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    for mod_name, module in model.named_modules():
        supported = (
            isinstance(module, nn.Linear)
            or (isinstance(module, nn.Conv2d) and module.groups == 1 and not isinstance(module.padding, str)
                and module.padding_mode == "zeros")
            or (isinstance(module, (nn.GroupNorm, nn.LayerNorm)) and module.weight is not None)
        )
        if not supported:
            continue
        roles = {}
        for role, p in module.named_parameters(recurse=False):
            full = f"{mod_name}.{role}" if mod_name else role
            if full in wanted and role in ("weight", "bias") and seen[id(p)] == 1:
                roles[role] = full
        if roles:
            owners[module] = roles
            covered.update(roles.values())
    rest = [n for n in names if n not in covered]
    return owners, rest


# ------------------------------------------------------------------------------------------ main entry
def gram_blocks(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor | None = None,
    *,
    kind: str = "loss-grad",
    strategy: str = "auto",
    dtype: torch.dtype = torch.float64,
    max_memory: int | str | None = None,
    layers: Sequence[str] | None = None,
    precision: str = "auto",
) -> dict[str, torch.Tensor]:
    """Per-layer Gram blocks of per-sample gradients (see the module docstring); ordered like ``named_parameters``.

    ``y`` (class indices) is needed for ``kind="loss-grad"``. ``layers`` are glob patterns over parameter
    names (default: all trainable). The model is put in eval mode for the computation and restored;
    its parameters and their ``.grad`` are not touched.
    """
    if kind not in KINDS:
        raise UsageError(f"unknown kernel kind '{kind}' (choose from {', '.join(KINDS)})")
    if strategy not in STRATEGIES:
        raise UsageError(f"unknown strategy '{strategy}' (choose from {', '.join(STRATEGIES)})")
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision '{precision}' (choose from {', '.join(PRECISIONS)})")
    _refuse_batchnorm(model)
    if kind == "loss-grad" and y is None:
        raise UsageError("kind='loss-grad' needs labels y")
    budget = parse_memory(max_memory) or DEFAULT_MAX_MEMORY
    names = layer_names(model, layers)
    n = x.shape[0]
    if n == 0:
        raise UsageError("need at least one example")
    was_training = model.training
    model.eval()
    try:
        if strategy == "functorch":
            owners, rest = {}, names
        else:
            owners, rest = _hook_owners(model, names)
        engine = _Engine(model, x, y, kind, names, owners, rest, strategy, dtype, budget, precision)
        blocks = engine.run()
    finally:
        model.train(was_training)
    if kind == "output-trace":
        M = engine.M
        blocks = {k: v.reshape(n, M, n, M).diagonal(dim1=1, dim2=3).sum(-1) for k, v in blocks.items()}
    # each block is G G^T, symmetric by definition: keep the symmetric part (removes rounding asymmetry)
    out = {}
    for k in names:  # pop as we go: never two copies of every block
        b = blocks.pop(k)
        out[k] = (b + b.T) / 2
    return out


def _refuse_batchnorm(model: nn.Module) -> None:
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise ModelError(
            "model has BatchNorm, which mixes samples so per-sample gradients are undefined; "
            "use norm='group' (or convert_batchnorm_to_groupnorm)"
        )


class _Engine:
    def __init__(self, model, x, y, kind, names, owners, rest, strategy, dtype, budget, precision):
        self.model, self.x, self.y, self.kind = model, x, y, kind
        self.names, self.owners, self.rest = names, owners, rest
        self.strategy, self.dtype, self.budget, self.precision = strategy, dtype, budget, precision
        self.params = dict(model.named_parameters())
        self.model_dtype = next(iter(self.params.values())).dtype
        self.n = x.shape[0]
        self.modes: dict[str, str] = {}

    # -- dtype of a parameter's contractions
    @property
    def contract_dtype(self) -> torch.dtype:
        """dtype of per-sample gradient / ghost contractions of weight layers."""
        return torch.float64 if self.precision == "double" else self.model_dtype

    @property
    def reduce_dtype(self) -> torch.dtype:
        """dtype in which bias / norm per-sample gradients are summed over positions."""
        return self.model_dtype if self.precision == "single" else torch.float64

    def cdtype(self, name: str) -> torch.dtype:
        """dtype of the Gram products G_r G_r^T of parameter ``name``."""
        if self.precision == "double" or (self.precision == "auto" and self.params[name].numel() <= SMALL_PARAM):
            return torch.float64 if self.dtype == torch.float64 else self.dtype
        return self.model_dtype

    def run(self) -> dict[str, torch.Tensor]:
        probe = self.capture(slice(0, 1))
        self.M = probe.M
        self.Mb = 1 if self.kind == "loss-grad" else self.M
        for module, count in probe.cap.calls.items():
            if count != 1:  # called twice (weight sharing): hooks would mix uses -> torch.func
                for name in self.owners.pop(module).values():
                    self.rest.append(name)
        per_sample = probe.nbytes() * 3 + self._functorch_bytes()
        self.choose_modes(probe)
        del probe
        # chunk size: one chunk if the whole batch fits, else pairs of chunks must fit together
        share = 0.6 * self.budget
        c = self.n if self.n * per_sample <= share else max(1, int(share / (2 * per_sample)))
        self.workspace = max(int(0.3 * self.budget), 1 << 20)
        rows = self.n * self.Mb
        out = {k: torch.zeros(rows, rows, dtype=self.dtype) for k in self.names}
        starts = list(range(0, self.n, c))
        for ai, a0 in enumerate(starts):
            sa = slice(a0, min(a0 + c, self.n))
            cap_a = self.capture(sa, eager=len(starts) == 1)
            for b0 in starts[ai:]:
                sb = slice(b0, min(b0 + c, self.n))
                cap_b = cap_a if b0 == a0 else self.capture(sb)
                ra = slice(sa.start * self.Mb, sa.stop * self.Mb)
                rb = slice(sb.start * self.Mb, sb.stop * self.Mb)
                for name in self.names:
                    block = self.cross(name, cap_a, cap_b).to(device="cpu", dtype=self.dtype)
                    out[name][ra, rb] = block
                    if b0 != a0:
                        out[name][rb, ra] = block.T
                del cap_b
        return out

    def _functorch_bytes(self) -> int:
        numel = sum(self.params[k].numel() for k in self.rest)
        return 3 * numel * self.Mb * self.params[self.names[0]].element_size() if self.rest else 0

    # -- capture one chunk of samples
    def capture(self, idx: slice, eager: bool = False) -> _Chunk:
        """Forward + backward pass(es) on samples ``idx``; ``eager``: weight blocks of this chunk with itself
        are computed inside the backward pass and the factors dropped."""
        x = self.x[idx]
        chunk = _Chunk()
        if self.owners:
            on_ready = self._self_block if eager else None
            passes = 1 if self.kind == "loss-grad" else self._n_logits()
            with _Capture(self.model, self.owners, self.reduce_dtype, on_ready, passes) as cap, torch.enable_grad():
                xin = x.detach().requires_grad_(True) if x.is_floating_point() else x
                logits = self.model(xin)
                chunk.M = logits.shape[1]
                targets = [xin] if xin.requires_grad else [p for p in self.params.values() if p.requires_grad]
                if self.kind == "loss-grad":
                    loss = F.cross_entropy(logits, self.y[idx], reduction="sum")
                    torch.autograd.grad(loss, targets, allow_unused=True)
                else:
                    for m in range(logits.shape[1]):
                        onehot = torch.zeros_like(logits)
                        onehot[:, m] = 1
                        torch.autograd.grad(logits, targets, onehot, retain_graph=m < logits.shape[1] - 1,
                                            allow_unused=True)
            chunk.cap = cap
            missing = [n for roles in self.owners.values() for n in roles.values()
                       if n not in cap.direct and n not in cap.done and (n not in cap.weights or not cap.weights[n].B)]
            if missing:
                raise ModelError(f"no gradient reached parameters {missing[:3]}: they do not influence the output")
        else:
            chunk.cap = _Capture(self.model, {}, self.reduce_dtype)
            with torch.no_grad():
                chunk.M = self.model(x[:1]).shape[1]
        if self.rest:
            chunk.func = _functorch_grads(self.model, x, None if self.y is None else self.y[idx], self.kind,
                                          self.rest, self.params)
        return chunk

    # -- per-layer choice
    def choose_modes(self, probe: _Chunk) -> None:
        rows = self.n * self.Mb
        for name, w in probe.cap.weights.items():
            if self.strategy in ("materialize", "ghost"):
                self.modes[name] = self.strategy
            else:
                mat = materialize_cost(rows, self.n, w.T, w.p, w.d)
                gho = ghost_cost(rows, self.n, w.T, w.p, w.d)
                self.modes[name] = "ghost" if gho < mat else "materialize"

    # -- one block between two chunks for one parameter
    def _n_logits(self) -> int:
        return getattr(self, "M", 0) or 1

    def _self_block(self, name: str, w: _Weight) -> torch.Tensor:
        if self.modes[name] == "ghost":
            return self._ghost(w, w, self.cdtype(name))
        return self._materialize(w, w, self.cdtype(name), same=True)

    def cross(self, name: str, a: _Chunk, b: _Chunk) -> torch.Tensor:
        dt = self.cdtype(name)
        if a is b and name in a.cap.done:
            return a.cap.done[name]
        if name in a.cap.weights:
            wa, wb = a.cap.weights[name], b.cap.weights[name]
            if self.modes[name] == "ghost":
                return self._ghost(wa, wb, dt)
            return self._materialize(wa, wb, dt, same=a is b)
        ga, gb = a.direct_grads(name), b.direct_grads(name)
        ga = ga.to(dt)
        gb = ga if a is b else gb.to(dt)
        return (ga @ gb.T).to(self.dtype)

    def _materialize(self, wa: _Weight, wb: _Weight, dt: torch.dtype, same: bool) -> torch.Tensor:
        ca, cb = wa.raw.shape[0], wb.raw.shape[0]
        Mb = len(wa.B)
        per_row = wa.p * wa.d * torch.finfo(dt).bits // 8 * Mb
        unfold_row = wa.T * (wa.p + wa.d * Mb) * torch.finfo(dt).bits // 8
        sub = max(1, min(ca, int(self.workspace / (2 * per_row + 2 * unfold_row))))
        if same and ca <= sub:
            g = self._grads(wa, slice(0, ca), dt)
            return (g @ g.T).to(self.dtype)
        out = torch.empty(ca * Mb, cb * Mb, dtype=self.dtype)
        for i0 in range(0, ca, sub):
            si = slice(i0, min(i0 + sub, ca))
            gi = self._grads(wa, si, dt)
            for j0 in range(0, cb, sub):
                sj = slice(j0, min(j0 + sub, cb))
                gj = gi if (same and j0 == i0) else self._grads(wb, sj, dt)
                out[si.start * Mb: si.stop * Mb, sj.start * Mb: sj.stop * Mb] = (gi @ gj.T).to(self.dtype)
        return out

    def _grads(self, w: _Weight, idx: slice, dt: torch.dtype) -> torch.Tensor:
        """Per-sample (per-logit) weight gradients, rows (c * Mb, d * p), contracted in ``contract_dtype``."""
        ct = self.contract_dtype
        B = w.Bs(idx).to(ct)  # (c, Mb, T, d)
        c, Mb = B.shape[:2]
        if w.conv is not None and w.T >= CONV_BACKWARD_MIN_T:
            return _conv_weight_grads(w, w.raw[idx].to(ct), B).reshape(c * Mb, -1).to(dt)
        A = w.A(idx).to(ct)  # (c, T, p)
        return torch.einsum("cmtd,ctp->cmdp", B, A).reshape(c * Mb, -1).to(dt)

    def _ghost(self, wa: _Weight, wb: _Weight, dt: torch.dtype) -> torch.Tensor:
        ca, cb = wa.raw.shape[0], wb.raw.shape[0]
        Mb, T = len(wa.B), wa.T
        ct = self.contract_dtype
        item = torch.finfo(dt).bits // 8
        # sub-block (si x sj): AA (si T x sj T), BB (si Mb T x sj Mb T), + unfolded inputs
        per_pair = T * T * (1 + 2 * Mb * Mb) * item
        unfold_row = T * (wa.p + wa.d * Mb) * item
        sub = max(1, int(math.sqrt(self.workspace / per_pair)))
        sub = max(1, min(sub, ca, cb, int(self.workspace / max(1, 4 * unfold_row))))
        out = torch.empty(ca * Mb, cb * Mb, dtype=self.dtype)
        for i0 in range(0, ca, sub):
            si = slice(i0, min(i0 + sub, ca))
            Ai = wa.A(si).to(ct)
            Bi = wa.Bs(si).to(ct)
            ni = Ai.shape[0]
            for j0 in range(0, cb, sub):
                sj = slice(j0, min(j0 + sub, cb))
                Aj = wb.A(sj).to(ct)
                Bj = wb.Bs(sj).to(ct)
                nj = Aj.shape[0]
                AA = (Ai.reshape(ni * T, -1) @ Aj.reshape(nj * T, -1).T).reshape(ni, T, nj, T)
                BB = (Bi.reshape(ni * Mb * T, -1) @ Bj.reshape(nj * Mb * T, -1).T).reshape(ni, Mb, T, nj, Mb, T)
                k = torch.einsum("itjs,imtjns->imjn", AA.to(dt), BB.to(dt)).reshape(ni * Mb, nj * Mb)
                out[si.start * Mb: si.stop * Mb, sj.start * Mb: sj.stop * Mb] = k.to(self.dtype)
        return out


def _conv_weight_grads(w: _Weight, raw: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Per-sample conv weight gradients (c, Mb, d, C, kh, kw) by a vmapped convolution backward.

    For convolutions with many output positions this beats unfold + einsum (no unfolded input in memory).
    """
    m = w.conv
    c, Mb = B.shape[:2]
    grads = B.transpose(2, 3).reshape(c, Mb, w.d, *w.out_hw)

    def one(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.convolution_backward(
            b[None], a[None], m.weight.detach().to(a.dtype), None, m.stride, m.padding, m.dilation, False, [0, 0], 1,
            [False, True, False])[1]

    return vmap(vmap(one, in_dims=(None, 0)), in_dims=(0, 0))(raw, grads)


@dataclass
class _Chunk:
    cap: _Capture | None = None
    func: dict[str, torch.Tensor] = field(default_factory=dict)
    M: int = 0

    def direct_grads(self, name: str) -> torch.Tensor:
        """(c * Mb, numel) per-sample (per-logit) gradient rows of a directly materialised parameter."""
        if name in self.func:
            return self.func[name]
        passes = self.cap.direct[name]
        return torch.stack(passes, dim=1).reshape(passes[0].shape[0] * len(passes), -1)

    def nbytes(self) -> int:
        total = 0
        if self.cap is not None:
            for w in self.cap.weights.values():
                total += w.raw.numel() * w.raw.element_size() + sum(b.numel() * b.element_size() for b in w.B)
            for passes in self.cap.direct.values():
                total += sum(g.numel() * g.element_size() for g in passes)
        for g in self.func.values():
            total += g.numel() * g.element_size()
        return total


def _functorch_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None, kind: str,
                     names: Sequence[str], params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-sample (loss-grad: (c, numel)) or per-sample per-logit ((c, M, numel)) gradients by torch.func."""
    train = {k: params[k].detach() for k in names}
    fixed = {k: v.detach() for k, v in params.items() if k not in train}
    buffers = dict(model.named_buffers())

    def f(tp: dict, xi: torch.Tensor) -> torch.Tensor:
        return functional_call(model, ({**fixed, **tp}, buffers), (xi.unsqueeze(0),)).squeeze(0)

    with torch.enable_grad():
        if kind == "loss-grad":
            def loss(tp: dict, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
                return F.cross_entropy(f(tp, xi).unsqueeze(0), yi.unsqueeze(0), reduction="sum")

            g = vmap(grad(loss), in_dims=(None, 0, 0))(train, x, y)
            return {k: v.reshape(v.shape[0], -1) for k, v in g.items()}
        g = vmap(jacrev(f), in_dims=(None, 0))(train, x)
        return {k: v.reshape(v.shape[0] * v.shape[1], -1) for k, v in g.items()}
