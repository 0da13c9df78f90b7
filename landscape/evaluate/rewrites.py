"""Exact rewrites of the evaluator's private model copy: max pools as strided-slice maxima, ReLU -> pool
swaps, ``torch.fx`` tracing of functional forwards into a graph of modules (:func:`_modules_graph`), and
small convolutions as one matrix product (:class:`_DenseConv`, with a following max pool folded in)."""

from __future__ import annotations

import copy
import warnings
from collections import Counter

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from landscape.pooling import pair as _pair
from landscape.pooling import simple_pool as _simple_pool
from landscape.pooling import simple_pool_call


def _rewrite_modules(model: nn.Module) -> None:
    """Exact, faster equivalents inside the private copy: plain max pools as strided-slice maxima, and in a
``Sequential`` a ReLU followed by such a pool swapped behind it (both monotone; docs/ARCHITECTURE.md)."""
    for module in model.modules():
        if type(module) is nn.MaxPool2d and _simple_pool(module):
            module.forward = _slice_max_pool(module)
        if type(module) is nn.Sequential:
            keys = list(module._modules)
            for k0, k1 in zip(keys[:-1], keys[1:], strict=True):
                a, b = module._modules[k0], module._modules[k1]
                if type(a) is nn.ReLU and type(b) is nn.MaxPool2d and _simple_pool(b):
                    module._modules[k0], module._modules[k1] = b, a


_RELU_FUNCTIONS = (F.relu, torch.relu)


def _modules_graph(model: nn.Module, probe: torch.Tensor) -> torch.fx.GraphModule | None:
    """The model as a graph of modules (``torch.fx``), for the module rewrites, when its ``forward`` calls plain
functions; None (the model runs as it is) unless the graph's output on ``probe`` is bit-identical to the model's."""
    if type(model) is nn.Sequential:
        return None  # the Sequential rewrites see its order already
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gm = torch.fx.symbolic_trace(model)
    except Exception:  # noqa: BLE001 - any failure to trace leaves the model as it is
        return None
    graph, added = gm.graph, [0]

    def module_node(node: torch.fx.Node, module: nn.Module, source: torch.fx.Node) -> torch.fx.Node:
        name = f"_landscape_{type(module).__name__.lower()}_{added[0]}"
        added[0] += 1
        gm.add_submodule(name, module)
        with graph.inserting_before(node):
            new = graph.call_module(name, (source,))
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        return new

    uses = _module_calls(gm)
    pools = []
    for node in list(graph.nodes):
        module = gm.get_submodule(node.target) if node.op == "call_module" else None
        if node.op == "call_function" and any(node.target is f for f in (F.max_pool2d, torch.max_pool2d)):
            pool = _pool_module(node)
            if pool is not None:
                pools.append(module_node(node, pool, node.args[0]))
        elif type(module) is nn.MaxPool2d and _simple_pool(module):
            if uses[node.target] > 1 and len(node.args) == 1 and not node.kwargs:
                node = module_node(node, copy.deepcopy(module), node.args[0])
            pools.append(node)
        elif _is_relu_call(node):
            module_node(node, nn.ReLU(), node.args[0])
        elif _is_flatten_call(node):
            start, end = _flatten_dims(*node.args[1:], **node.kwargs)
            module_node(node, nn.Flatten(start, end), node.args[0])
        else:
            owner = _layer_call_owner(node, model)
            if owner is not None:  # F.conv2d / F.linear with a layer's own weights: that layer's call
                parent, _, leaf = owner.rpartition(".")
                (gm.get_submodule(parent) if parent else gm).register_module(leaf, model.get_submodule(owner))
                tensors = [a for a in node.all_input_nodes if a.op == "get_attr"]
                with graph.inserting_before(node):
                    new = graph.call_module(owner, (node.args[0],))
                node.replace_all_uses_with(new)
                graph.erase_node(node)
                for t in tensors:
                    if not t.users:
                        graph.erase_node(t)
    called = {node.target for node in graph.nodes if node.op == "call_module"}
    norms = [name for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not pools or not set(norms) <= called:
        # a BatchNorm used through its tensors (F.batch_norm(..., self.bn.training)) would have its train flag
        # frozen into the graph, and BatchNorm recalibration switches that flag: keep such a model as it is
        return None
    for pool in pools:
        relu = pool.args[0]
        if (len(pool.args) == 1 and not pool.kwargs and isinstance(relu, torch.fx.Node)
                and relu.op == "call_module" and len(relu.users) == 1
                and type(gm.get_submodule(relu.target)) is nn.ReLU and not gm.get_submodule(relu.target).inplace):
            source = relu.args[0]
            pool.replace_all_uses_with(relu)
            relu.args, pool.args = (pool,), (source,)
            pool.append(relu)  # the ReLU now runs after the pool
    graph.lint()
    gm.recompile()
    own = dict(model.named_parameters()) | dict(model.named_buffers())
    traced = dict(gm.named_parameters()) | dict(gm.named_buffers())
    if own.keys() != traced.keys() or any(own[k] is not traced[k] for k in own):
        return None
    try:
        same = torch.equal(gm(probe), model(probe))
    except Exception:  # noqa: BLE001 - a graph that does not run like the model is not used
        return None
    return gm if same else None


_LAYER_CALLS = ((F.conv2d, nn.Conv2d), (torch.conv2d, nn.Conv2d), (F.linear, nn.Linear))


def _conv_signature(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return weight, bias, stride, padding, dilation, groups


def _linear_signature(input, weight, bias=None):
    return weight, bias


def _layer_call_owner(node: torch.fx.Node, model: nn.Module) -> str | None:
    """The name of the ``Conv2d`` / ``Linear`` whose own call ``node`` is: ``F.conv2d(x, self.conv.weight,
    self.conv.bias, ...)`` with the layer's stride, padding, dilation and groups, or ``F.linear(x, self.fc.weight,
    self.fc.bias)``; None for anything else (other tensors, other options, a bias left out that the layer has)."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    kind = next((cls for fn, cls in _LAYER_CALLS if node.target is fn), None)
    if kind is None:
        return None
    try:
        bound = (_conv_signature if kind is nn.Conv2d else _linear_signature)(*node.args, **node.kwargs)
    except TypeError:
        return None
    weight, bias = bound[:2]
    if not (isinstance(weight, torch.fx.Node) and weight.op == "get_attr" and weight.target.endswith(".weight")):
        return None
    owner = weight.target[: -len(".weight")]
    try:
        layer = model.get_submodule(owner)
    except AttributeError:
        return None
    if type(layer) is not kind or len(weight.users) != 1:
        return None
    if layer.bias is None:
        if bias is not None:
            return None
    elif not (isinstance(bias, torch.fx.Node) and bias.op == "get_attr" and bias.target == f"{owner}.bias"):
        return None
    if kind is nn.Conv2d:
        stride, padding, dilation, groups = bound[2:]
        if isinstance(padding, str) or any(isinstance(v, torch.fx.Node) for v in (stride, padding, dilation, groups)):
            return None
        if (layer.padding_mode != "zeros" or isinstance(layer.padding, str) or _pair(stride) != layer.stride
                or _pair(padding) != layer.padding or _pair(dilation) != layer.dilation or groups != layer.groups):
            return None
    return owner


def _pool_module(node: torch.fx.Node) -> nn.MaxPool2d | None:
    """The ``nn.MaxPool2d`` of a plain ``F.max_pool2d`` / ``torch.max_pool2d`` call node with constant options."""
    if not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    constants = [*node.args[1:], *node.kwargs.values()]
    if any(isinstance(c, torch.fx.Node) for c in constants):
        return None
    probe = torch.empty(1, 1, 1, 1)
    call = simple_pool_call(node.target, (probe, *node.args[1:]), node.kwargs)
    return None if call is None else nn.MaxPool2d(call[1], call[2])


def _is_relu_call(node: torch.fx.Node) -> bool:
    if node.op == "call_function" and any(node.target is f for f in _RELU_FUNCTIONS):
        return len(node.args) == 1 and node.kwargs.get("inplace", False) is False and set(node.kwargs) <= {"inplace"}
    return node.op == "call_method" and node.target == "relu" and len(node.args) == 1 and not node.kwargs


def _is_flatten_call(node: torch.fx.Node) -> bool:
    flatten = (node.op == "call_function" and node.target is torch.flatten) or (
        node.op == "call_method" and node.target == "flatten")
    if not flatten or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    try:
        _flatten_dims(*node.args[1:], **node.kwargs)
    except TypeError:
        return False
    return True


def _flatten_dims(start_dim: int = 0, end_dim: int = -1) -> tuple[int, int]:
    if not isinstance(start_dim, int) or not isinstance(end_dim, int):
        raise TypeError("flatten dimensions are not constants")
    return start_dim, end_dim


def _module_calls(gm: torch.fx.GraphModule) -> Counter[str]:
    return Counter(node.target for node in gm.graph.nodes if node.op == "call_module")


def _graph_successors(gm: torch.fx.GraphModule) -> dict[nn.Module, nn.Module]:
    """Module -> the module that alone consumes its output, for modules called at one place of the graph."""
    calls = _module_calls(gm)
    nxt = {}
    for node in gm.graph.nodes:
        if node.op != "call_module" or calls[node.target] != 1 or len(node.users) != 1:
            continue
        (user,) = node.users
        if user.op == "call_module" and user.args[:1] == (node,) and len(user.args) == 1 and not user.kwargs:
            nxt[gm.get_submodule(node.target)] = gm.get_submodule(user.target)
    return nxt


class _DenseConv:
    """A ``Conv2d``'s forward on small inputs as one matrix product ``x.flatten(1) @ M + b``, ``M`` gathered from the
weights once per evaluated point (after :meth:`changed`); inputs of another shape take the ordinary convolution
(docs/ARCHITECTURE.md)."""

    MAX_ENTRIES = 1 << 22  # M at most 16 MiB in float32

    def __init__(self, module: nn.Conv2d, in_shape: tuple[int, ...], pool: nn.MaxPool2d | None = None):
        self.module, self.in_shape = module, tuple(in_shape)
        c, h, w = self.in_shape
        weight = module.weight
        dev = weight.device
        oh, ow = _conv_output_size(module, h, w)
        self.out_shape = (module.out_channels, oh, ow)
        self.pool: nn.MaxPool2d | None = None
        self.bias_channel = torch.arange(module.out_channels, device=dev).repeat_interleave(oh * ow)
        # matrix entry (input position, output channel * L + output position) is weight entry (output channel,
        # column of the unfolded input) or, where no tap connects them, the zero appended to the weights
        positions = torch.arange(1, c * h * w + 1, dtype=torch.float64, device=dev).view(1, c, h, w)
        cols = F.unfold(positions, module.kernel_size, dilation=module.dilation, padding=_padding(module),
                        stride=module.stride)[0]  # (C*kh*kw, L): input position + 1, or 0 in the padding
        co, ck, length = module.out_channels, cols.shape[0], cols.shape[1]
        if length != oh * ow:  # pragma: no cover - unfold and conv2d disagree on the output size
            raise RuntimeError("dense convolution: unfold and conv2d give different output sizes")
        inside = cols > 0
        rows = cols[inside].long() - 1
        place = torch.arange(length, device=dev).expand(ck, length)[inside]
        tap = torch.arange(ck, device=dev).view(ck, 1).expand(ck, length)[inside]
        out_channel = torch.arange(co, device=dev).view(co, 1)
        self.index = torch.full((c * h * w, co * length), weight.numel(), dtype=torch.long, device=dev)
        self.index[rows.expand(co, -1), out_channel * length + place] = out_channel * ck + tap
        self.matrix: torch.Tensor | None = None  # gathered on first use after each change of the weights
        if pool is not None:
            self._fold(pool, oh, ow)

    def _fold(self, pool: nn.MaxPool2d, oh: int, ow: int) -> None:
        """Take a following non-overlapping max pool into the product: its columns are reordered (window
        offset, channel, pooled row, pooled column), so that the pool is a maximum over ``kh * kw`` contiguous
        column blocks (contiguous reads instead of the strided slices of the pooled map), bit-identical."""
        kh, kw = _pair(pool.kernel_size)
        ph, pw = (oh - kh) // kh + 1, (ow - kw) // kw + 1
        if ph < 1 or pw < 1:
            return
        dev = self.index.device
        co = self.out_shape[0]
        a = torch.arange(kh, device=dev).view(kh, 1, 1, 1, 1)
        b = torch.arange(kw, device=dev).view(1, kw, 1, 1, 1)
        channel = torch.arange(co, device=dev).view(1, 1, co, 1, 1)
        row = torch.arange(ph, device=dev).view(1, 1, 1, ph, 1) * kh + a
        col = torch.arange(pw, device=dev).view(1, 1, 1, 1, pw) * kw + b
        columns = (channel * (oh * ow) + row * ow + col).reshape(-1)  # (offset, channel, P, Q) -> conv column
        self.index = self.index[:, columns].contiguous()
        self.bias_channel = self.bias_channel[columns]
        self.pool, self.windows, self.out_shape = pool, kh * kw, (co, ph, pw)

    def changed(self) -> None:
        """The layer's weights were written: gather ``M`` again at the next call."""
        self.matrix = None

    @staticmethod
    def worthwhile(module: nn.Conv2d, in_shape: tuple[int, ...]) -> bool:
        """Dense when it is no more multiply-adds (``H * W <= kh * kw``) and the matrix is small."""
        if len(in_shape) != 3 or module.groups != 1 or module.padding_mode != "zeros":
            return False
        if isinstance(module.padding, str) and module.padding != "valid":
            return False  # 'same': left to the convolution
        c, h, w = in_shape
        oh, ow = _conv_output_size(module, h, w)
        if oh < 1 or ow < 1:
            return False
        kh, kw = module.kernel_size
        return h * w <= kh * kw and c * h * w * module.out_channels * oh * ow <= _DenseConv.MAX_ENTRIES

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        m = self.module
        if v.dim() != 4 or tuple(v.shape[1:]) != self.in_shape or v.dtype != m.weight.dtype:
            out = nn.Conv2d.forward(m, v)
            return _slice_max_pool(self.pool)(out) if self.pool is not None else out
        if self.matrix is None:
            weights = torch.cat([m.weight.reshape(-1), m.weight.new_zeros(1)])
            self.matrix = weights[self.index]
            self.bias = None if m.bias is None else m.bias[self.bias_channel]
        flat = v.reshape(v.shape[0], -1)
        out = torch.addmm(self.bias, flat, self.matrix) if self.bias is not None else flat @ self.matrix
        if self.pool is not None:
            blocks = out.shape[1] // self.windows
            pooled = out[:, :blocks]
            for k in range(1, self.windows):
                pooled = torch.maximum(pooled, out[:, k * blocks : (k + 1) * blocks])
            out = pooled
        return out.view(v.shape[0], *self.out_shape)


def _padding(module: nn.Conv2d) -> tuple[int, int]:
    return (0, 0) if module.padding == "valid" else _pair(module.padding)


def _conv_output_size(module: nn.Conv2d, h: int, w: int) -> tuple[int, int]:
    (kh, kw), (sh, sw), (dh, dw) = module.kernel_size, module.stride, module.dilation
    ph, pw = _padding(module)
    return (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1


def _identity(v: torch.Tensor) -> torch.Tensor:
    return v


def _slice_max_pool(m: nn.MaxPool2d):
    return _slice_max(_pair(m.kernel_size), _pair(m.stride if m.stride is not None else m.kernel_size))


def _slice_max(kernel: tuple[int, int], stride: tuple[int, int]):
    (kh, kw), (sh, sw) = kernel, stride

    def forward(v: torch.Tensor) -> torch.Tensor:
        # rows first: the window rows' maximum reads whole contiguous rows (instead of taking the kh*kw doubly
        # strided slices in turn), then the columns' maximum over that half-size result
        h, w = v.shape[-2:]
        oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
        rows = None
        for i in range(kh):
            part = v[..., i : i + sh * (oh - 1) + 1 : sh, :]
            rows = part if rows is None else torch.maximum(rows, part)
        out = None
        for j in range(kw):
            part = rows[..., j : j + sw * (ow - 1) + 1 : sw]
            out = part if out is None else torch.maximum(out, part)
        return out

    return forward


def _slice_pool_call(x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int]) -> torch.Tensor:
    """A plain ``F.max_pool2d`` call inside a model's ``forward`` as the strided-slice maximum (bit-identical)."""
    if x.shape[-2] < kernel[0] or x.shape[-1] < kernel[1]:
        return F.max_pool2d(x, kernel, stride)  # PyTorch's own error for a window larger than the input
    return _slice_max(kernel, stride)(x)
