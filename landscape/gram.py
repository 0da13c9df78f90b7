"""Per-layer Gram blocks of per-sample gradients, the empirical NTK layer by layer (docs/ntk.md):
``loss-grad`` K_r = G_r G_r^T (Bu et al. 2023 eq. 4.4), ``output`` J_r J_r^T (rows ``i * M + m``),
``output-trace`` its trace over logits. ``strategy="auto"`` gives each weight layer materialised per-sample
gradients or the ghost cross-sample formula, whichever costs fewer flops (``materialize`` / ``ghost`` force
one, ``functorch`` is the reference); ``precision="auto"`` forms small tensors' products in float64; memory
stays under ``max_memory``.
"""

from __future__ import annotations

import fnmatch
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from landscape.curvature import eval_mode
from landscape.errors import ModelError, OptionError, UsageError
from landscape.options import GRAM_STRATEGIES, KERNELS, PRECISIONS
from landscape.persample import (
    Capture,
    Handler,
    HooksFailed,
    functorch_grads,
    handlers,
    place_batch,
    plan_handlers,
    probe_calls,
    refuse_batchnorm,
)

DEFAULT_MAX_MEMORY = 4 * 1024**3
# parameter tensors with at most this many elements get float64 contractions under precision="auto"
SMALL_PARAM = 16384


def parse_memory(value: str | int | float | None) -> int | None:
    """``"4GB"``, ``"512MiB"``, ``"1e9"``, ``1_000_000`` -> bytes; None/"none" -> None."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    if isinstance(value, (int, float)):
        if not (math.isfinite(value) and 0 < value < 2**63):
            raise UsageError(f"memory budget must be a positive number of bytes below 2**63, got {value}")
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
    if not (math.isfinite(size) and 0 < size < 2**63):
        raise UsageError(f"memory budget must be a positive number of bytes below 2**63, got '{value}'")
    return int(size)


def layer_names(model: nn.Module, layers: Sequence[str] | None = None) -> list[str]:
    """Trainable parameter names (``named_parameters`` order) matching any of the glob ``layers``."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if not layers:
        return names
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in layers)]
    if not chosen:
        raise OptionError("layers", f"{','.join(layers)} matches no trainable parameter; names look like {names[:3]}")
    return chosen


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
    """Per-layer Gram blocks ``{parameter name: block}`` in ``named_parameters`` order (the module docstring).

    ``y`` is needed for ``kind="loss-grad"``; ``layers`` are glob patterns over parameter names. The model
    runs in eval mode (restored after); its parameters and ``.grad`` are not touched.
    """
    engine = _checked_engine(model, x, y, kind, strategy, dtype, max_memory, layers, precision)
    out: dict[str, torch.Tensor] = {}
    for rows, cols, name, tile in _tiles(engine, model, kind, None):
        if name not in out:
            side = engine.n * (engine.M if kind == "output" else 1)
            out[name] = torch.zeros(side, side, dtype=dtype)
        out[name][rows, cols] = tile
        if rows != cols:
            out[name][cols, rows] = tile.T
    return out


def _checked_engine(model, x, y, kind, strategy, dtype, max_memory, layers, precision) -> _Engine:
    """The engine for these options, after the checks every entry point shares (one-line UsageErrors)."""
    if kind not in KERNELS:
        raise UsageError(f"unknown kernel kind '{kind}' (choose from {', '.join(KERNELS)})")
    if strategy not in GRAM_STRATEGIES:
        raise UsageError(f"unknown strategy '{strategy}' (choose from {', '.join(GRAM_STRATEGIES)})")
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision '{precision}' (choose from {', '.join(PRECISIONS)})")
    refuse_batchnorm(model, as_eval=True)  # the blocks are computed in eval mode
    if kind == "loss-grad" and y is None:
        raise UsageError("kind='loss-grad' needs labels y")
    budget = parse_memory(max_memory) or DEFAULT_MAX_MEMORY
    names = layer_names(model, layers)
    if x.shape[0] == 0:
        raise UsageError("need at least one example")
    return _Engine(model, x, y, kind, names, strategy, dtype, budget, precision)


def gram_tiles(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor | None = None,
    *,
    chunk: int,
    kind: str = "loss-grad",
    strategy: str = "auto",
    dtype: torch.dtype = torch.float64,
    max_memory: int | str | None = None,
    layers: Sequence[str] | None = None,
    precision: str = "auto",
) -> Iterator[tuple[slice, slice, str, torch.Tensor]]:
    """The blocks of :func:`gram_blocks` tile by tile, for kernels too large to hold: ``(rows, cols, name,
    tile)`` with ``K_name[rows, cols] = tile`` for each pair of sample chunks (at most ``chunk`` samples) with
    ``rows.start <= cols.start`` (the mirror tile is ``tile.T``). Same numbers as ``gram_blocks``."""
    if int(chunk) != chunk or chunk < 1:
        raise UsageError(f"chunk must be a positive integer, got {chunk}")
    engine = _checked_engine(model, x, y, kind, strategy, dtype, max_memory, layers, precision)
    yield from _tiles(engine, model, kind, int(chunk))


def _tiles(engine: _Engine, model: nn.Module, kind: str, chunk: int | None):
    """The engine's tiles in eval mode, traced over logits for ``output-trace``; diagonal tiles made symmetric
    (each block is G G^T: its symmetric part drops the rounding's asymmetry)."""
    with eval_mode(model):
        engine.plan(chunk)
        M = engine.M
        for ra, rb, name, tile in engine.tiles():
            if kind == "output-trace":
                tile = tile.reshape(-1, M, tile.shape[1] // M, M).diagonal(dim1=1, dim2=3).sum(-1)
                ra, rb = slice(ra.start // M, ra.stop // M), slice(rb.start // M, rb.stop // M)
            if ra == rb:
                tile = (tile + tile.T) / 2
            yield ra, rb, name, tile


class _Engine:
    """The Gram-specific part over the per-sample engine: per-logit passes, chunk pairs under the memory
    bound, the per-layer ghost/materialise choice and the dtypes of the products."""

    def __init__(self, model, x, y, kind, names, strategy, dtype, budget, precision):
        self.model, self.x, self.y, self.kind, self.names = model, x, y, kind, names
        self.strategy, self.dtype, self.budget, self.precision = strategy, dtype, budget, precision
        self.params = dict(model.named_parameters())
        self.model_dtype = next(iter(self.params.values())).dtype
        if strategy == "functorch":
            self.handlers, self.rest = [], list(names)
        else:
            self.handlers, self.rest = plan_handlers(model, names, self.reduce_dtype)
        self.roles = {full: (h, role) for h in self.handlers for role, full in h.pnames.items()}
        self.hooks_checked = False
        self.n, self.M = x.shape[0], 0
        self.modes: dict[str, str] = {}  # weight name -> "ghost" | "materialize" (ghost-capable layers only)
        self.dims: dict[Handler, tuple[int, int, int, int]] = {}  # ghost-capable handler -> (G, D, P, T)

    # -- dtype of a parameter's contractions
    @property
    def contract_dtype(self) -> torch.dtype:  # of weight layers' per-sample / ghost contractions
        return torch.float64 if self.precision == "float64" else self.model_dtype

    @property
    def reduce_dtype(self) -> torch.dtype:  # bias / norm per-sample gradients are summed over positions in it
        return self.model_dtype if self.precision == "float32" else torch.float64

    def cdtype(self, name: str) -> torch.dtype:
        """dtype of the Gram products G_r G_r^T of parameter ``name``."""
        if self.precision == "float64" or (self.precision == "auto" and self.params[name].numel() <= SMALL_PARAM):
            return self.dtype
        return self.model_dtype

    def plan(self, chunk: int | None) -> None:
        """Probe one sample (logits, per-layer ghost/materialise choice) and fix the chunk size: one chunk if
        the whole batch fits the budget, else pairs of chunks must fit together; ``chunk`` caps it."""
        probe = self.capture(slice(0, 1))
        self.M = probe.M
        self.Mb = 1 if self.kind == "loss-grad" else self.M
        self.choose_modes(probe)
        # the parameters without a handler go through functorch: their per-sample buffers
        rest_numel = sum(self.params[k].numel() for k in self.rest)
        per_sample = self._bytes(probe) * 3 + 3 * rest_numel * self.Mb * self.params[self.names[0]].element_size()
        del probe
        share = 0.6 * self.budget
        c = self.n if self.n * per_sample <= share else max(1, int(share / (2 * per_sample)))
        self.chunk = min(c, chunk) if chunk else c
        self.workspace = max(int(0.3 * self.budget), 1 << 20)

    def tiles(self):
        """``(rows of chunk a, rows of chunk b, name, block)`` for chunk pairs a <= b, one block at a time."""
        c = self.chunk
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
                    yield ra, rb, name, self.cross(name, cap_a, cap_b).to(device="cpu", dtype=self.dtype)
                del cap_b

    def _bytes(self, probe: _Chunk) -> int:
        """Bytes one sample keeps: weight layers' inputs and output gradients, the others' gradients."""
        item = torch.finfo(self.reduce_dtype).bits // 8
        total = sum(g.numel() * g.element_size() for g in probe.func.values())
        for h in self.handlers:
            small = [full for role, full in h.pnames.items() if not (role == "weight" and h in self.dims)]
            total += sum(self.params[k].numel() for k in small) * self.Mb * item
            if h in self.dims:
                ts = probe.cap.inputs[h] + [g for gs in probe.cap.grads[h] for g in gs]
                total += sum(t.numel() * t.element_size() for t in ts)
        return total

    # -- capture one chunk of samples
    def capture(self, idx: slice, eager: bool = False) -> _Chunk:
        """Forward + backward pass(es) on samples ``idx`` (one per logit for output kinds); ``eager`` forms
        the chunk's own blocks inside the backward, dropping the factors. Where the hooks cannot capture the
        model, the first capture under ``strategy="auto"`` warns and leaves every parameter to torch.func."""
        try:
            return self._capture(idx, eager)
        except HooksFailed as e:
            if self.strategy != "auto" or self.hooks_checked:
                raise ModelError(f"cannot capture per-sample gradients of this model: {e}") from None
            warnings.warn(f"per-sample gradients: {e}; using torch.func on the whole model", stacklevel=2)
            self.handlers, self.rest, self.roles, self.hooks_checked = [], list(self.names), {}, True
            return self._capture(idx, eager)

    def _capture(self, idx: slice, eager: bool) -> _Chunk:
        x = self.x[idx]
        chunk = _Chunk(n=x.shape[0])
        if self.handlers:
            if not self.hooks_checked:  # where each module sees the batch (attention blocks without batch_first)
                place_batch(self.handlers, probe_calls(self.model, x))
            passes = 1 if self.kind == "loss-grad" else self.M or 1  # M: unknown (0) while probing
            on_complete = (lambda h: self._eager(chunk, h)) if eager else None
            chunk.cap = Capture(self.handlers, passes=passes, on_complete=on_complete)
            with chunk.cap, torch.enable_grad():
                logits = self.model(x)
            chunk.M = logits.shape[1]
            if self.kind == "loss-grad":
                chunk.cap.backward(F.cross_entropy(logits, self.y[idx], reduction="sum"))
            else:
                for m in range(chunk.M):
                    onehot = torch.zeros_like(logits)
                    onehot[:, m] = 1
                    chunk.cap.backward(logits, onehot, retain_graph=m < chunk.M - 1)
            for h in self.handlers:  # the batch must be dim 0 of every kept input and gradient
                chunk.cap.calls(h, chunk.n)
            self.hooks_checked = True  # the first capture went through: no fallback from now on
            missing = [k for h in self.handlers if h not in chunk.eager and not chunk.cap.reached(h)
                       for k in h.pnames.values()]
            if missing:
                raise ModelError(f"no gradient reached parameters {missing[:3]}: they do not influence the output")
        else:
            with torch.no_grad():
                chunk.M = self.model(x[:1]).shape[1]
        if self.rest:
            y = self.y[idx] if self.kind == "loss-grad" else None
            g, _, _ = functorch_grads(self.model, self.rest, x, y)
            chunk.func = {k: v.reshape(-1, self.params[k].numel()) for k, v in g.items()}
        return chunk

    def _eager(self, chunk: _Chunk, h: Handler) -> None:
        chunk.eager.add(h)
        for name in h.pnames.values():
            if name in self.roles:
                chunk.done[name] = self.cross(name, chunk, chunk)
        chunk.cap.release(h)

    # -- per-layer choice
    def choose_modes(self, probe: _Chunk) -> None:
        rows = self.n * self.Mb
        for h in self.handlers:
            name = h.pnames.get("weight")
            factors = self._factors(h, probe, slice(0, 1)) if name is not None else None
            if factors is None:
                continue
            A, B = factors
            G, D, T, P = A.shape[1], A.shape[2], A.shape[3], B.shape[3]
            self.dims[h] = (G, D, P, T)
            if self.strategy in ("materialize", "ghost"):
                self.modes[name] = self.strategy
            else:
                # multiply-adds: per-sample gradients B_i^T A_i, then G G^T; the ghost formula's (A A^T) over
                # sample pairs and (B B^T) over (sample, logit) rows
                mat = G * (rows * T * D * P + rows * rows * D * P)
                gho = G * (self.n * self.n * T * T * D + rows * rows * T * T * (P + 1))
                self.modes[name] = "ghost" if gho < mat else "materialize"

    # -- one block between two chunks for one parameter
    def cross(self, name: str, a: _Chunk, b: _Chunk) -> torch.Tensor:
        if a is b and name in a.done:
            return a.done.pop(name)
        dt = self.cdtype(name)
        if name in self.roles:
            h, role = self.roles[name]
            if self.modes.get(name) == "ghost":
                return self._ghost(h, a, b, dt)
            return self._materialize(h, role, a, b, dt)
        ga = a.func[name].to(dt)
        gb = ga if a is b else b.func[name].to(dt)
        return (ga @ gb.T).to(self.dtype)

    def _calls(self, h: Handler, chunk: _Chunk, idx: slice) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """Per pass, the (input, output gradient) pairs of samples ``idx`` of a chunk; weight layers' in the
        contraction dtype."""
        ct = self.contract_dtype if h in self.dims else None

        def cast(t):
            return t.to(ct) if ct is not None and t.is_floating_point() else t

        passes = 1 if self.kind == "loss-grad" else chunk.M
        return [[(cast(a[idx]), cast(b[idx])) for a, b in chunk.cap.calls(h, chunk.n, p)] for p in range(passes)]

    def _rows(self, h: Handler, role: str, chunk: _Chunk, idx: slice, dt: torch.dtype) -> torch.Tensor:
        """Per-sample (per-logit, sample-major) gradient rows ``(c * Mb, numel)`` of one parameter: weight
        layers from the ghost factors (convolutions with many positions: the handler's grouped kernel), the
        others from the handler's per-sample gradients."""
        if role == "weight" and h in self.dims:
            G, D, P, T = self.dims[h]
            if not (isinstance(h.module, nn.modules.conv._ConvNd) and T >= handlers.GROUPED_MIN_POSITIONS):
                A, B = self._factors(h, chunk, idx)  # (c, G, D, T), (c, Mb, G, P, T)
                parts = [torch.einsum("cmtd,ctp->cmdp", B[:, :, g].transpose(2, 3).contiguous(), A[:, g].transpose(1, 2))
                         for g in range(G)]
                g = parts[0] if G == 1 else torch.cat(parts, dim=2)
                return g.reshape(g.shape[0] * g.shape[1], -1).to(dt)
        key = (h, role, idx.start, idx.stop)
        if key in chunk.rows:  # formed with another role of the same module
            g = chunk.rows.pop(key)
            return g.reshape(g.shape[0], -1).to(dt)
        passes = self._calls(h, chunk, idx)
        if len(passes) == 1:
            calls = passes[0]
        else:
            Mb = len(passes)
            calls = []
            for k, (a, _) in enumerate(passes[0]):
                bs = torch.stack([p[k][1] for p in passes], dim=1)
                calls.append((a.repeat_interleave(Mb, dim=0), bs.reshape(-1, *bs.shape[2:])))
        u = h.unit(calls)
        if h not in self.dims and idx.stop - idx.start == chunk.n:  # norms: every role in one go, keep the others
            for other, g in h.per_sample(u).items():
                if other != role:
                    chunk.rows[(h, other, idx.start, idx.stop)] = g
        g = h.role_per_sample(u, role)
        return g.reshape(g.shape[0], -1).to(dt)

    def _factors(self, h: Handler, chunk: _Chunk, idx: slice) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Ghost factors of samples ``idx``: A (c, G, D, T) and B (c, Mb, G, P, T) over the passes."""
        passes = self._calls(h, chunk, idx)
        f = h.ghost_factors(h.unit(passes[0]))
        if f is None:
            return None
        Bs = [f[1]]
        for calls in passes[1:]:  # the same inputs: only the output-gradient factor is new (calls along T)
            parts = [h.grad_factor(b) for _, b in calls]
            Bs.append(parts[0] if len(parts) == 1 else torch.cat(parts, dim=3))
        return f[0], torch.stack(Bs, dim=1)

    def _materialize(self, h: Handler, role: str, a: _Chunk, b: _Chunk, dt: torch.dtype) -> torch.Tensor:
        ca, cb, Mb = a.n, b.n, self.Mb
        item = torch.finfo(dt).bits // 8
        per_row = self.params[h.pnames[role]].numel() * item * Mb
        if h in self.dims:
            G, D, P, T = self.dims[h]
            unfold_row = T * G * (D + P * Mb) * item
        else:  # bias / normalisation / embedding: nothing is unfolded
            unfold_row = 0
        sub = max(1, min(ca, int(self.workspace / (2 * per_row + 2 * unfold_row))))
        same = a is b
        if same and ca <= sub:
            g = self._rows(h, role, a, slice(0, ca), dt)
            return (g @ g.T).to(self.dtype)
        out = torch.empty(ca * Mb, cb * Mb, dtype=self.dtype)
        for i0 in range(0, ca, sub):
            si = slice(i0, min(i0 + sub, ca))
            gi = self._rows(h, role, a, si, dt)
            for j0 in range(0, cb, sub):
                sj = slice(j0, min(j0 + sub, cb))
                gj = gi if (same and j0 == i0) else self._rows(h, role, b, sj, dt)
                out[si.start * Mb: si.stop * Mb, sj.start * Mb: sj.stop * Mb] = (gi @ gj.T).to(self.dtype)
        return out

    def _ghost(self, h: Handler, a: _Chunk, b: _Chunk, dt: torch.dtype) -> torch.Tensor:
        """K[(i, m), (j, n)] = sum_{g,t,s} (A_i^T A_j)_{g,ts} (B_im^T B_jn)_{g,ts}: the cross-sample form of
        the ghost norm (Bu et al. 2023, eq. 4.4), never forming per-sample gradients."""
        ca, cb, Mb = a.n, b.n, self.Mb
        G, D, P, T = self.dims[h]
        item = torch.finfo(dt).bits // 8
        # sub-block (si x sj): AA (si T x sj T), BB (si Mb T x sj Mb T) of one group, + unfolded inputs
        per_pair = T * T * (1 + 2 * Mb * Mb) * item
        unfold_row = T * G * (D + P * Mb) * item
        sub = max(1, int(math.sqrt(self.workspace / per_pair)))
        sub = max(1, min(sub, ca, cb, int(self.workspace / max(1, 4 * unfold_row))))
        out = torch.empty(ca * Mb, cb * Mb, dtype=self.dtype)
        for i0 in range(0, ca, sub):
            si = slice(i0, min(i0 + sub, ca))
            Ai, Bi = self._factors(h, a, si)
            ni = Ai.shape[0]
            Ai = Ai.permute(1, 0, 3, 2).reshape(G, ni * T, D)
            Bi = Bi.permute(2, 0, 1, 4, 3).reshape(G, ni * Mb * T, P)
            for j0 in range(0, cb, sub):
                sj = slice(j0, min(j0 + sub, cb))
                Aj, Bj = self._factors(h, b, sj)
                nj = Aj.shape[0]
                Aj = Aj.permute(1, 2, 0, 3).reshape(G, D, nj * T)
                Bj = Bj.permute(2, 3, 0, 1, 4).reshape(G, P, nj * Mb * T)
                k = None
                for g in range(G):  # groups one by one: no (G, ni T, nj T) products at once
                    AA = (Ai[g] @ Aj[g]).reshape(ni, T, nj, T)
                    BB = (Bi[g] @ Bj[g]).reshape(ni, Mb, T, nj, Mb, T)
                    term = torch.einsum("itjs,imtjns->imjn", AA.to(dt), BB.to(dt))
                    k = term if k is None else k + term
                out[si.start * Mb: si.stop * Mb, sj.start * Mb: sj.stop * Mb] = k.reshape(ni * Mb, nj * Mb).to(self.dtype)
        return out


@dataclass
class _Chunk:
    n: int = 0
    cap: Capture | None = None
    func: dict[str, torch.Tensor] = field(default_factory=dict)  # torch.func rows (c * Mb, numel)
    done: dict[str, torch.Tensor] = field(default_factory=dict)  # blocks formed during the backward
    eager: set = field(default_factory=set)  # handlers whose blocks were formed during the backward
    rows: dict = field(default_factory=dict)  # (handler, role, start, stop) -> per-sample gradients not yet used
    M: int = 0
