"""What one batched forward/backward keeps per module (``Capture``), and where each module keeps the batch
(``probe_calls``, ``place_batch``)."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.autograd.graph import get_gradient_edge
from torch.utils._pytree import tree_flatten, tree_map

from landscape.persample.functional import FunctionalHandler
from landscape.persample.handlers import Handler, HooksFailed
from landscape.pooling import exact_fast_pooling


def _leaf_shapes(tree) -> list[tuple[int, ...] | None]:
    return [tuple(t.shape) if isinstance(t, Tensor) else None for t in tree_flatten(tree)[0]]


def _batch_dims(s1: list, s2: list) -> list[int | None] | None:
    """Per leaf, the one dimension that is 1 with one sample and 2 with two (None: the same size, shared by
    the samples); None when some leaf changes otherwise (its samples are not kept apart on one dimension)."""
    if len(s1) != len(s2):
        return None
    dims = []
    for a, b in zip(s1, s2, strict=True):
        if a is None or a == b:
            dims.append(None)
            continue
        if b is None or len(a) != len(b):
            return None
        diff = [d for d in range(len(a)) if a[d] != b[d]]
        if len(diff) != 1 or (a[diff[0]], b[diff[0]]) != (1, 2):
            return None
        dims.append(diff[0])
    return dims


def probe_calls(model: nn.Module, x: Tensor) -> dict[nn.Module, list | str]:
    """Every module the forward calls with grad enabled -> per call, the batch dimension of each input and output
    leaf (None: shared by the samples), measured by forwards on one and on two copies of the first sample (a
    module that does not keep the samples apart gets a reason instead). The RNG state is left as it was."""
    runs: list[dict[nn.Module, list]] = []
    devices = [x.device] if x.device.type == "cuda" else []
    for xb in (x[:1], x[:1].expand(2, *x.shape[1:]).contiguous()):
        seen: dict[nn.Module, list] = {}

        def hook(m, args, kwargs, out, seen=seen):
            if torch.is_grad_enabled():
                seen.setdefault(m, []).append((_leaf_shapes((args, kwargs)), _leaf_shapes(out)))

        handles = [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules()]
        try:
            with torch.random.fork_rng(devices=devices), torch.enable_grad(), exact_fast_pooling(model):
                model(xb)
        finally:
            for hd in handles:
                hd.remove()
        runs.append(seen)
    out: dict[nn.Module, list | str] = {}
    for m, one in runs[0].items():
        two = runs[1].get(m, [])
        if len(one) != len(two):
            out[m] = "is called a different number of times for one and two samples"
            continue
        dims = [(_batch_dims(a1, a2), _batch_dims(o1, o2)) for (a1, o1), (a2, o2) in zip(one, two, strict=True)]
        ok = all(i is not None and o is not None for i, o in dims)
        out[m] = dims if ok else "does not keep the samples apart along one dimension of its inputs and outputs"
    return out


def place_batch(handlers: list[Handler], calls: dict[nn.Module, list | str]) -> None:
    """Set ``Handler.batch_dim`` from ``probe_calls``: the one dimension where each handler's module sees the
    batch in every call; ``HooksFailed`` when it is not dim 0 and the handler cannot move it there."""
    for h in handlers:
        dims = calls.get(h.module)
        if not isinstance(dims, list):
            continue  # never called (its parameters get no gradient) or not one sample per index
        found = {(i[0] if i else 0, o[0] if o else 0) for i, o in dims}
        if found == {(0, 0)}:
            continue
        (a, b), *others = found
        if others or a != b or a is None or not h.movable_batch():
            raise HooksFailed(f"module {type(h.module).__name__} does not see the batch on dim 0")
        h.batch_dim = a


def _weakly(method, *args) -> Callable[[Tensor], None]:
    """A tensor hook calling ``method(*args, grad)`` that holds its ``Capture`` only weakly: the Capture holds the
    hook's autograd node, and a strong reference would be a cycle through C++ the collector cannot see (every
    batch's activations kept for good)."""
    ref = weakref.WeakMethod(method)

    def hook(grad: Tensor) -> None:
        bound = ref()
        if bound is not None:
            bound(*args, grad)

    return hook


class Capture:
    """The one capture of the hooks routes: inside ``with Capture(handlers):`` every call of a handler's module
    keeps its input (detached) and hooks its output; ``backward`` then computes activation gradients only (no
    weight gradient, no ``.grad`` touched). ``passes`` backwards give every call one gradient per pass;
    ``on_complete(handler)`` runs as soon as a handler has all its gradients, so the caller can reduce and
    ``release`` them before the backward goes on (lower peak memory for ``landscape.gram``)."""

    def __init__(
        self, handlers: list[Handler], *, passes: int = 1, on_complete: Callable[[Handler], None] | None = None
    ):
        self.handlers = list(handlers)
        self.passes, self.on_complete = passes, on_complete
        self.inputs: dict[Handler, list[Tensor]] = {h: [] for h in self.handlers}
        self.shapes: dict[Handler, list[torch.Size]] = {h: [] for h in self.handlers}
        self.grads: dict[Handler, list[list[Tensor]]] = {h: [] for h in self.handlers}  # per call, per pass
        self._edges: list = []
        self._handles: list = []

    def __enter__(self) -> Capture:
        for h in self.handlers:
            if isinstance(h, FunctionalHandler):
                hook = functools.partial(self._call_hook, h)
                self._handles.append(h.module.register_forward_hook(hook, with_kwargs=True))
            else:
                self._handles.append(h.module.register_forward_hook(functools.partial(self._forward_hook, h)))
        return self

    def __exit__(self, *exc) -> None:
        for hd in self._handles:
            hd.remove()
        self._handles.clear()

    def _forward_hook(self, h: Handler, _module, inputs, output) -> None:
        if torch.is_grad_enabled() and isinstance(output, Tensor) and output.requires_grad:
            k = len(self.inputs[h])
            self.inputs[h].append(inputs[0].detach())
            self.shapes[h].append(output.shape)
            self.grads[h].append([])
            self._edges.append(get_gradient_edge(output))
            output.register_hook(_weakly(self._grad_hook, h, k))

    def _call_hook(self, h: FunctionalHandler, _module, args, kwargs, output) -> None:
        """A functional handler's call: all its inputs (positional and keyword) and a hook on every output
        tensor that requires grad (one backward pass: its gradients go to ``grads[h][k][0]`` by leaf)."""
        if not torch.is_grad_enabled():
            return
        leaves = tree_flatten(output)[0]
        outs = [(j, t) for j, t in enumerate(leaves) if isinstance(t, Tensor) and t.requires_grad]
        if not outs:
            return
        k = len(self.inputs[h])
        self.inputs[h].append(tree_map(lambda t: t.detach() if isinstance(t, Tensor) else t, (args, kwargs)))
        self.shapes[h].append(
            [(t.shape, t.dtype, t.device) if isinstance(t, Tensor) and t.requires_grad else None for t in leaves]
        )
        self.grads[h].append([{}])
        for j, t in outs:
            self._edges.append(get_gradient_edge(t))
            t.register_hook(_weakly(self._leaf_hook, h, k, j))

    def _leaf_hook(self, h: FunctionalHandler, k: int, j: int, g: Tensor) -> None:
        self.grads[h][k][0][j] = g.detach()

    def _grad_hook(self, h: Handler, k: int, g: Tensor) -> None:
        self.grads[h][k].append(g.detach())
        if self.on_complete is not None and all(len(gs) == self.passes for gs in self.grads[h]):
            self.on_complete(h)

    def backward(self, root: Tensor, grad: Tensor | None = None, *, retain_graph: bool = False) -> None:
        if not self._edges:
            raise HooksFailed("no supported module was called")
        torch.autograd.backward(root, grad, retain_graph=retain_graph, inputs=self._edges)

    def calls(self, h: Handler, n: int, pass_: int = 0) -> list[tuple[Tensor, Tensor]]:
        """(input, output gradient of pass ``pass_``) per call of ``h``'s module; zeros where no gradient
        reached an output. The batch (``n`` samples) must be dim 0 of both, or where ``h.batch_dim`` says
        (then moved to dim 0)."""
        if isinstance(h, FunctionalHandler):  # ((args, kwargs), [output gradient or None per output leaf])
            return [
                (inp, [None if t is None else gs[0].get(j, torch.zeros(t[0], dtype=t[1], device=t[2]))
                       for j, t in enumerate(leaves)])
                for inp, leaves, gs in zip(self.inputs[h], self.shapes[h], self.grads[h], strict=True)
            ]
        out = []
        for a, shape, gs in zip(self.inputs[h], self.shapes[h], self.grads[h], strict=True):
            b = gs[pass_] if len(gs) > pass_ else a.new_zeros(shape)
            if h.batch_dim:
                a, b = a.movedim(h.batch_dim, 0), b.movedim(h.batch_dim, 0)
            if a.shape[0] != n or b.shape[0] != n:
                raise HooksFailed(f"module {type(h.module).__name__} does not see the batch on dim 0")
            out.append((a, b))
        return out

    def reached(self, h: Handler) -> bool:
        """Whether some output gradient of ``h``'s module arrived."""
        return any(self.grads[h][k] for k in range(len(self.grads[h])))

    def release(self, h: Handler) -> None:
        """Drop what was kept for ``h``'s module."""
        self.inputs[h], self.shapes[h], self.grads[h] = [], [], []
