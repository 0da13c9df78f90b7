"""The per-sample engine: ``PerSampleEngine`` chooses the route (hooks, mixed, whole-model ``torch.func``),
checks it once, and answers norms, weighted and clipped sums, materialised gradients and projections."""

from __future__ import annotations

import functools
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, jvp

from landscape.errors import ModelError, UsageError
from landscape.evaluate.allocator import tuned_allocator
from landscape.persample.capture import Capture, place_batch, probe_calls
from landscape.persample.functional import FunctionalHandler, functorch_grads
from landscape.persample.handlers import HooksFailed, _sq, plan_handlers
from landscape.persample.norm_layers import batchnorm_layers, check_batchnorm
from landscape.pooling import exact_fast_pooling
from landscape.runtime import math_attention

STRATEGIES = ("auto", "hooks", "functorch")

Masks = dict[str, Tensor] | None
Weights = Tensor | dict[str, Tensor]


@dataclass
class PerSampleNorms:
    """Per-sample gradient norms (after masks), with the per-sample losses and logits of the same pass."""

    flat: Tensor  # (n,) float64: ||g_i|| over all trainable parameters
    layers: dict[str, Tensor]  # name -> (n,) float64: ||g_{i,r}|| per parameter tensor
    loss: Tensor  # (n,) per-sample losses l_i
    logits: Tensor  # (n, M)

    def __len__(self) -> int:
        return int(self.flat.shape[0])

    @staticmethod
    def cat(parts: list[PerSampleNorms]) -> PerSampleNorms:
        """Concatenate the norms of consecutive chunks of one batch."""
        return PerSampleNorms(flat=torch.cat([p.flat for p in parts]),
                              layers={k: torch.cat([p.layers[k] for p in parts]) for k in parts[0].layers},
                              loss=torch.cat([p.loss for p in parts]), logits=torch.cat([p.logits for p in parts]))


def flatten_grads(grads: dict[str, Tensor], names: list[str] | None = None) -> Tensor:
    """Per-sample gradients ``{name: (n, *shape)}`` as one ``(n, d)`` matrix, columns in ``names`` order
    (default: the dict's order, which for the engine's outputs is ``named_parameters()`` order)."""
    names = list(grads) if names is None else list(names)
    if not names:
        raise UsageError("flatten_grads: no gradients to flatten")
    n = grads[names[0]].shape[0]
    return torch.cat([grads[k].reshape(n, -1) for k in names], dim=1)


def _kept_memory(method):
    """Run an engine method inside ``tuned_allocator``: its large per-batch blocks are otherwise handed back to the
    OS and page-faulted in again on every batch."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with tuned_allocator():
            return method(*args, **kwargs)

    return wrapper


class PerSampleEngine:
    """Per-sample gradients of ``l_i = cross_entropy(model(x_i), y_i)`` w.r.t. the trainable parameters; the model
    is never modified. ``chunk`` bounds the samples of one pass (memory only). ``strategy``: ``"auto"`` (handlers
    by hooks, ``torch.func`` for the other modules, or for the whole model when cheaper or when the first call's
    self-check fails), ``"hooks"`` (handlers only) or ``"functorch"`` (docs/persample.md)."""

    def __init__(self, model: nn.Module, *, chunk: int | None = None, strategy: str = "auto"):
        if strategy not in STRATEGIES:
            raise UsageError(f"unknown per-sample strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if chunk is not None and int(chunk) < 1:
            raise UsageError(f"chunk must be a positive integer, got {chunk}")
        self._batchnorms = batchnorm_layers(model)
        check_batchnorm(self._batchnorms)
        self.model = model
        self.chunk = None if chunk is None else int(chunk)
        self.params: dict[str, nn.Parameter] = {k: p for k, p in model.named_parameters() if p.requires_grad}
        if not self.params:
            raise ModelError("model has no trainable parameters (all have requires_grad=False)")
        self.names = list(self.params)
        self._all_names = {k for k, _ in model.named_parameters()}
        self._handlers, self._uncovered = plan_handlers(model, self.names)
        if strategy == "hooks" and self._uncovered:
            raise ModelError(
                f"strategy='hooks' cannot handle parameter {self._uncovered[0]!r} (no handler for its module); "
                "use strategy='auto' or 'functorch'"
            )
        self.requested = strategy
        # parameters held by two or more modules (tied): no module's call sees all their uses
        owners = Counter(id(p) for m in model.modules() for p in m.parameters(recurse=False))
        shared = {k for k, p in model.named_parameters() if owners[id(p)] > 1} & set(self._uncovered)
        if strategy == "functorch" or shared:
            self.strategy = "functorch"
        else:
            self.strategy = "mixed" if self._uncovered else "hooks"
        self._verified = self.strategy == "functorch"
        self._forward_ad = True  # projections by jvp; False once a module turned out to lack forward AD

    @property
    def _ref(self) -> Tensor:
        return next(iter(self.params.values()))

    def _prepare(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        check_batchnorm(self._batchnorms)  # the model may have been switched to training mode since
        ref = self._ref
        x = torch.as_tensor(x, device=ref.device)
        if x.is_floating_point():
            x = x.to(ref.dtype)
        y = torch.as_tensor(y, device=ref.device).long().reshape(-1)
        if x.shape[0] != y.shape[0]:
            raise UsageError(f"x has {x.shape[0]} samples but y has {y.shape[0]}")
        return x, y

    def _chunks(self, x: Tensor, y: Tensor, *extra: Tensor) -> Iterator[tuple[Tensor, ...]]:
        n = x.shape[0]
        step = n if self.chunk is None else self.chunk
        for s in range(0, n, max(step, 1)):
            yield (x[s : s + step], y[s : s + step], *(e[s : s + step] for e in extra))

    def _masks(self, masks: Masks) -> dict[str, Tensor]:
        if not masks:
            return {}
        unknown = [k for k in masks if k not in self.params and k not in self._all_names]
        if unknown:
            raise UsageError(f"mask for {unknown[0]!r}, which is not a parameter of the model")
        out = {}
        for k, m in masks.items():
            if k not in self.params:  # frozen: it has no gradient to mask
                continue
            p = self.params[k]
            if tuple(m.shape) != tuple(p.shape):
                raise UsageError(f"mask for {k!r} has shape {tuple(m.shape)}, parameter has {tuple(p.shape)}")
            out[k] = m.to(device=p.device, dtype=p.dtype)
        return out

    def _layer_weights(self, weights: Weights, n: int) -> dict[str, Tensor]:
        ref = self._ref
        if isinstance(weights, dict):
            missing = [k for k in self.names if k not in weights]
            if missing:
                raise UsageError(f"per-layer weights lack parameter {missing[0]!r}")
            out = {k: torch.as_tensor(weights[k], device=ref.device).to(ref.dtype).reshape(-1) for k in self.names}
        else:
            w = torch.as_tensor(weights, device=ref.device).to(ref.dtype).reshape(-1)
            out = dict.fromkeys(self.names, w)
        for k, w in out.items():
            if w.shape[0] != n:
                raise UsageError(f"weights for {k!r} have {w.shape[0]} entries for {n} samples")
        return out

    def _empty_norms(self) -> PerSampleNorms:
        ref = self._ref
        z = torch.zeros(0, dtype=torch.float64, device=ref.device)
        return PerSampleNorms(flat=z, layers={k: z.clone() for k in self.names},
                              loss=torch.zeros(0, dtype=ref.dtype, device=ref.device),
                              logits=torch.zeros(0, 0, dtype=ref.dtype, device=ref.device))

    def _zeros(self) -> dict[str, Tensor]:
        return {k: torch.zeros_like(p, memory_format=torch.contiguous_format).detach() for k, p in self.params.items()}

    @staticmethod
    def _norms_from_sq(sq: dict[str, Tensor], losses: Tensor, logits: Tensor) -> PerSampleNorms:
        sq64 = {k: v.double().clamp_min(0) for k, v in sq.items()}
        flat = torch.stack(list(sq64.values())).sum(0).sqrt()
        return PerSampleNorms(flat=flat, layers={k: v.sqrt() for k, v in sq64.items()}, loss=losses, logits=logits)

    def _capture(self, x: Tensor, y: Tensor):
        """One forward + activation-gradient backward; returns ({handler: unit}, losses, logits). After the
        first call's check, a batch the chosen route cannot take (a module called another number of times,
        say) is a one-line ``ModelError``."""
        n = x.shape[0]
        cap = Capture(self._handlers)
        try:
            with cap, torch.enable_grad(), exact_fast_pooling(self.model):
                logits = self.model(x)
                losses = F.cross_entropy(logits, y, reduction="none")
            cap.backward(losses.sum())
            units = {}
            for h in self._handlers:
                calls = cap.calls(h, n)
                if calls:
                    units[h] = h.unit(calls)
        except HooksFailed as e:
            if not self._verified:
                raise
            raise ModelError(f"per-sample gradients: this batch does not fit the route chosen on the first one ({e})") from None
        return units, losses.detach(), logits.detach()

    def _plan(self, x: Tensor) -> None:
        """Once, on the first batch: where each handler's module keeps the batch, then the mixed route: each
        parameter no called handler covers goes to a ``FunctionalHandler`` on the nearest called module (its own
        or an ancestor, e.g. ``nn.MultiheadAttention`` for its ``out_proj``)."""
        calls = probe_calls(self.model, x)
        place_batch(self._handlers, calls)
        dead = [h for h in self._handlers if h.module not in calls]
        if self.requested == "hooks" or not (dead or self._uncovered):
            return  # registered handlers only (the self-check judges them)
        self.strategy = "mixed"
        self._handlers = [h for h in self._handlers if h.module in calls]
        wanted = set(self._uncovered) | {full for h in dead for full in h.pnames.values()}
        groups: dict[str, dict[str, str]] = {}
        for name in self.names:
            if name not in wanted:
                continue
            path = name.rpartition(".")[0]
            while path and self.model.get_submodule(path) not in calls:
                path = path.rpartition(".")[0]
            groups.setdefault(path, {})[name[len(path) + 1 :] if path else name] = name
        if "" in groups:  # a parameter of the root: its torch.func unit is the whole model, so be that once
            raise HooksFailed(f"parameter {next(iter(groups['']))!r} belongs to the root module", planned=True)
        for path, pnames in groups.items():
            module = self.model.get_submodule(path)
            dims = calls.get(module)
            if not isinstance(dims, list):
                raise HooksFailed(f"module {path or 'root'} ({type(module).__name__}) {dims or 'is never called'}")
            self._handlers.append(FunctionalHandler(module, pnames, dims=dims))
        self._uncovered = []

    def _hooks_sq_norms(self, units, masks, n) -> dict[str, Tensor]:
        sq = {}
        for h in self._handlers:
            if h in units:
                local_masks = {k: masks[full] for k, full in h.pnames.items() if full in masks}
                for k, v in h.sq_norms(units[h], local_masks).items():
                    sq[h.pnames[k]] = v
        ref = self._ref
        return {k: sq.get(k, torch.zeros(n, dtype=ref.dtype, device=ref.device)) for k in self.names}

    def _hooks_weighted(self, units, w: dict[str, Tensor], acc: dict[str, Tensor]) -> None:
        for h, u in units.items():
            lw = {k: w[full] for k, full in h.pnames.items()}
            for k, v in h.weighted(u, lw).items():
                acc[h.pnames[k]].add_(v)

    def _verify(self, x: Tensor, y: Tensor) -> None:
        """Once: check the hooks route's summed gradient against autograd's (catches parameters used outside
        their module's forward, batch not on dim 0, ...). Falls back to functorch under strategy='auto'."""
        if self._verified or x.shape[0] < 1:
            return
        x, y = x[:8], y[:8]
        devices = [x.device] if x.device.type == "cuda" else []
        try:
            self._plan(x)
            with torch.random.fork_rng(devices=devices):
                units, _, _ = self._capture(x, y)
                acc = self._zeros()
                ones = torch.ones(x.shape[0], dtype=self._ref.dtype, device=x.device)
                self._hooks_weighted(units, dict.fromkeys(self.names, ones), acc)
            with torch.random.fork_rng(devices=devices), torch.enable_grad():
                total = F.cross_entropy(self.model(x), y, reduction="sum")
                ref = torch.autograd.grad(total, list(self.params.values()), allow_unused=True)
            ok, quiet = True, False
            for (k, a), r in zip(acc.items(), ref, strict=True):
                r = torch.zeros_like(a) if r is None else r
                scale = float(r.abs().max())
                tol = 1e-9 * scale + 1e-12 if r.dtype == torch.float64 else 1e-4 * scale + 1e-6
                if float((a - r).abs().max()) > tol * 10:
                    ok, why = False, f"parameter {k!r} is used outside its module's forward"
                    break
        except HooksFailed as e:
            ok, why, quiet = False, str(e), e.planned
        if not ok:
            if self.requested == "hooks":
                raise ModelError(f"strategy='hooks' is not exact for this model ({why}); use strategy='auto'")
            if any(not type(h).__module__.startswith("landscape.persample.") for h in self._handlers):
                why += "; check the registered handlers"
            if not quiet:
                warnings.warn(f"per-sample gradients: {why}; using torch.func on the whole model", stacklevel=3)
            self.strategy = "functorch"
        self._verified = True

    @_kept_memory
    def norms(self, x: Tensor, y: Tensor, *, masks: Masks = None) -> PerSampleNorms:
        """Per-sample gradient norms, flat and per layer (float64), with per-sample losses and logits."""
        x, y = self._prepare(x, y)
        if x.shape[0] == 0:
            return self._empty_norms()
        m = self._masks(masks)
        self._verify(x, y)
        parts = []
        for xc, yc in self._chunks(x, y):
            if self.strategy != "functorch":
                units, losses, logits = self._capture(xc, yc)
                sq = self._hooks_sq_norms(units, m, xc.shape[0])
            else:
                g, losses, logits = functorch_grads(self.model, self.names, xc, yc)
                sq = {k: _sq(g[k], m.get(k)) for k in self.names}
            parts.append(self._norms_from_sq(sq, losses, logits))
        return parts[0] if len(parts) == 1 else PerSampleNorms.cat(parts)

    @_kept_memory
    def grads(self, x: Tensor, y: Tensor, *, masks: Masks = None) -> dict[str, Tensor]:
        """Materialised per-sample gradients ``{name: (n, *shape)}`` (masked), chunked by ``chunk``."""
        x, y = self._prepare(x, y)
        m = self._masks(masks)
        if x.shape[0] == 0:
            return {k: p.new_zeros(0, *p.shape).detach() for k, p in self.params.items()}
        self._verify(x, y)
        parts = []
        for xc, yc in self._chunks(x, y):
            if self.strategy != "functorch":
                units, _, _ = self._capture(xc, yc)
                g = {}
                for h, u in units.items():
                    u["layout"] = "weight"  # materialised: a handler may form them in the weight's layout
                    g.update({h.pnames[k]: v for k, v in h.per_sample(u).items()})
                zeros = self._ref.new_zeros
                g = {k: g[k] if k in g else zeros(xc.shape[0], *p.shape) for k, p in self.params.items()}
            else:
                g, _, _ = functorch_grads(self.model, self.names, xc, yc)
            parts.append({k: (g[k] * m[k] if k in m else g[k]).detach().contiguous() for k in self.names})
        if len(parts) == 1:
            return parts[0]
        return {k: torch.cat([p[k] for p in parts]) for k in self.names}

    @_kept_memory
    def weighted_sum(
        self, x: Tensor, y: Tensor, weights: Weights, *, masks: Masks = None
    ) -> dict[str, Tensor]:
        """``sum_i w_i g_i`` per layer; ``weights`` is (n,) or ``{name: (n,)}`` (layerwise clipping)."""
        x, y = self._prepare(x, y)
        n = x.shape[0]
        w = self._layer_weights(weights, n)
        m = self._masks(masks)
        acc = self._zeros()
        if n == 0:
            return acc
        self._verify(x, y)
        idx = torch.arange(n, device=x.device)
        for xc, yc, ic in self._chunks(x, y, idx):
            wc = {k: v[ic] for k, v in w.items()}
            if self.strategy != "functorch":
                units, _, _ = self._capture(xc, yc)
                self._hooks_weighted(units, wc, acc)
            elif not isinstance(weights, dict):  # one weight per sample: one ordinary backward
                self._add_grad(acc, xc, yc, wc[self.names[0]])
            else:
                g, _, _ = functorch_grads(self.model, self.names, xc, yc)
                self._add_weighted(acc, wc, g)
        return {k: v * m[k] if k in m else v for k, v in acc.items()}

    def _add_grad(self, acc: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor | None = None) -> None:
        """``acc += grad sum_i w_i l_i`` (all ones without ``w``) by one ordinary backward."""
        with torch.enable_grad():
            losses = F.cross_entropy(self.model(x), y, reduction="none")
            total = losses.sum() if w is None else (losses * w).sum()
            g = torch.autograd.grad(total, list(self.params.values()), allow_unused=True)
        for k, gk in zip(self.names, g, strict=True):
            if gk is not None:
                acc[k].add_(gk)

    def _add_weighted(self, acc: dict[str, Tensor], w: dict[str, Tensor], g: dict[str, Tensor]) -> None:
        for k in self.names:
            acc[k].add_(torch.einsum("n,n...->...", w[k], g[k]))

    @_kept_memory
    def clipped_sum(self, x: Tensor, y: Tensor, factor_fn: Callable[[PerSampleNorms], Weights], *,
                    masks: Masks = None) -> tuple[dict[str, Tensor], PerSampleNorms]:
        """Norms, then ``sum_i c_i g_i`` with ``c = factor_fn(norms)`` ((n,) or ``{name: (n,)}``), masked, from one
        forward and one activation backward (book-keeping, Bu et al. 2023). ``factor_fn`` sees one ``chunk`` at a
        time, so it must act sample by sample (every clipping function does)."""
        x, y = self._prepare(x, y)
        n = x.shape[0]
        m = self._masks(masks)
        acc = self._zeros()
        if n == 0:
            return acc, self._empty_norms()
        self._verify(x, y)
        parts = []
        for xc, yc in self._chunks(x, y):
            nc = xc.shape[0]
            if self.strategy != "functorch":
                units, losses, logits = self._capture(xc, yc)
                norms = self._norms_from_sq(self._hooks_sq_norms(units, m, nc), losses, logits)
                factors = factor_fn(norms)
                self._hooks_weighted(units, self._layer_weights(factors, nc), acc)
            else:
                g, losses, logits = functorch_grads(self.model, self.names, xc, yc)
                g = {k: g[k] * m[k] if k in m else g[k] for k in self.names}
                sq = {k: _sq(g[k], None) for k in self.names}
                norms = self._norms_from_sq(sq, losses, logits)
                self._add_weighted(acc, self._layer_weights(factor_fn(norms), nc), g)
            parts.append(norms)
        sums = {k: v * m[k] if k in m else v for k, v in acc.items()}
        return sums, parts[0] if len(parts) == 1 else PerSampleNorms.cat(parts)

    def mean_grad(self, x: Tensor, y: Tensor, *, masks: Masks = None) -> dict[str, Tensor]:
        """``(1/n) sum_i g_i`` (zeros for an empty batch): plain batched backward, chunked."""
        x, y = self._prepare(x, y)
        n = x.shape[0]
        acc = self._zeros()
        m = self._masks(masks)
        for xc, yc in self._chunks(x, y):
            self._add_grad(acc, xc, yc)
        return {k: (v * m[k] if k in m else v) / max(n, 1) for k, v in acc.items()}

    def projections(self, x: Tensor, y: Tensor, directions: Tensor | list[dict[str, Tensor]]) -> Tensor:
        """``P[i, j] = <g_i, v_j>`` as forward-mode derivatives d/dt l_i(theta + t v_j) (no per-sample gradients;
        attention runs in its math form, which has one; a model with another kernel that has no forward-mode
        rule gets them from per-sample gradients instead, chunk by chunk).

        ``directions`` is (k, d) in ``named_parameters`` order over trainable parameters, or a list of
        ``{name: tensor}``. Masks are not applied here: mask the directions instead."""
        x, y = self._prepare(x, y)
        dirs = self._directions(directions)
        n, k = x.shape[0], len(dirs)
        ref = self._ref
        out = torch.zeros(n, k, dtype=ref.dtype, device=ref.device)
        if n == 0 or k == 0:
            return out
        params = {name: p.detach() for name, p in self.params.items()}
        model = self.model
        idx = torch.arange(n, device=x.device)
        for xc, yc, ic in self._chunks(x, y, idx):

            def losses(p, xc=xc, yc=yc):
                return F.cross_entropy(functional_call(model, p, (xc,)), yc, reduction="none")

            if self._forward_ad:
                try:
                    with torch.no_grad(), math_attention():  # the fused attention kernels lack forward AD
                        for j, v in enumerate(dirs):
                            _, dl = jvp(losses, (params,), (v,))
                            out[ic, j] = dl
                    continue
                except NotImplementedError:  # a kernel without forward AD
                    self._forward_ad = False
            g = self.grads(xc, yc)
            for j, v in enumerate(dirs):
                out[ic, j] = sum((g[name].flatten(1) @ v[name].reshape(-1)) for name in self.names)
        return out

    def _directions(self, directions) -> list[dict[str, Tensor]]:
        ref = self._ref
        if isinstance(directions, Tensor):
            d = sum(p.numel() for p in self.params.values())
            v = directions.to(device=ref.device, dtype=ref.dtype)
            if v.dim() == 1:
                v = v.unsqueeze(0)
            if v.dim() != 2 or v.shape[1] != d:
                raise UsageError(
                    f"directions must be (k, {d}) for this model's trainable parameters, got {tuple(v.shape)}"
                )
            sizes = [p.numel() for p in self.params.values()]
            out = []
            for row in v:
                parts = zip(self.params.items(), row.split(sizes), strict=True)
                out.append({name: part.reshape(p.shape) for (name, p), part in parts})
            return out
        out = []
        for dv in directions:
            missing = [name for name in self.names if name not in dv]
            if missing:
                raise UsageError(f"direction lacks parameter {missing[0]!r}")
            out.append({name: dv[name].to(device=ref.device, dtype=ref.dtype) for name in self.names})
        return out
