"""Max pooling on CPU through PyTorch's own channels-last kernel, faster than its NCHW one, with values and
gradients bit for bit PyTorch's; :func:`exact_fast_pooling` swaps it in for a model's modules and calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode


def simple_pool(m: nn.MaxPool2d) -> bool:
    """No padding, dilation, ceil mode or returned indices: the pools the fast routes handle."""
    return (m.padding in (0, (0, 0)) and m.dilation in (1, (1, 1)) and not m.ceil_mode
            and not m.return_indices)


def pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


class _ChannelsLastMaxPool2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int]) -> torch.Tensor:
        out, indices = F.max_pool2d(x.contiguous(memory_format=torch.channels_last), kernel, stride,
                                    return_indices=True)
        ctx.save_for_backward(x, indices)
        ctx.kernel, ctx.stride = kernel, stride
        return out.contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, indices = ctx.saved_tensors
        grad_x = torch.ops.aten.max_pool2d_with_indices_backward(
            grad.contiguous(), x, list(ctx.kernel), list(ctx.stride), [0, 0], [1, 1], False, indices.contiguous())
        return grad_x, None, None


def fast_max_pool2d(x: torch.Tensor, kernel_size, stride=None) -> torch.Tensor:
    """``F.max_pool2d(x, kernel_size, stride)`` (no padding/dilation), the same values and gradients, faster on CPU."""
    kernel = pair(kernel_size)
    stride = pair(stride if stride is not None else kernel_size)
    if x.dim() != 4 or x.device.type != "cpu" or not x.dtype.is_floating_point:
        return F.max_pool2d(x, kernel, stride)
    return _ChannelsLastMaxPool2d.apply(x, kernel, stride)


@contextlib.contextmanager
def exact_fast_pooling(model: nn.Module) -> Iterator[None]:
    """Within the block, the model's plain ``MaxPool2d`` modules run :func:`fast_max_pool2d`, and so do
    functional calls when the model has code of its own (not for ``torch.nn`` layers alone)."""
    swapped = []
    for m in model.modules():
        if type(m) is nn.MaxPool2d and simple_pool(m) and "forward" not in m.__dict__:
            m.forward = _pool_forward(m)
            swapped.append(m)
    own_code = any(not type(m).__module__.startswith("torch.nn.") for m in model.modules())
    try:
        with fast_functional_pooling() if own_code else contextlib.nullcontext():
            yield
    finally:
        for m in swapped:
            m.__dict__.pop("forward", None)


def _pool_forward(m: nn.MaxPool2d):
    kernel, stride = m.kernel_size, m.stride if m.stride is not None else m.kernel_size

    def forward(x: torch.Tensor) -> torch.Tensor:
        return fast_max_pool2d(x, kernel, stride)

    return forward


# ------------------------------------------------------------------------------------- functional calls

_POOL_FUNCTIONS = (F.max_pool2d, torch.max_pool2d)


def _pool_signature(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return input, kernel_size, stride, padding, dilation, ceil_mode, return_indices


def simple_pool_call(func, args: tuple, kwargs: dict | None = None):
    """``(x, kernel, stride)`` when ``func(*args, **kwargs)`` is a plain max pool (as :func:`simple_pool`),
    else None."""
    if not any(func is f for f in _POOL_FUNCTIONS):
        return None
    try:
        x, kernel, stride, padding, dilation, ceil_mode, return_indices = _pool_signature(*args, **(kwargs or {}))
    except TypeError:
        return None
    if not isinstance(x, torch.Tensor) or x.dim() not in (3, 4) or ceil_mode or return_indices:
        return None
    try:
        padding, dilation = pair(padding), pair(dilation)
        kernel = pair(kernel)
        stride = kernel if stride is None or (not isinstance(stride, int) and len(stride) == 0) else pair(stride)
    except (TypeError, ValueError, IndexError):
        return None
    if padding != (0, 0) or dilation != (1, 1):
        return None
    return x, kernel, stride


class _RoutedPooling(TorchFunctionMode):
    def __init__(self, route):
        super().__init__()
        self.route = route

    def __torch_function__(self, func, types, args=(), kwargs=None):
        call = simple_pool_call(func, args, kwargs)
        if call is not None and not torch._C._functorch.is_functorch_wrapped_tensor(call[0]):
            return self.route(*call)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def routed_pool_calls(route) -> Iterator[None]:
    """Within the block, each plain max pool call (outside ``torch.func`` transforms) is ``route(x, kernel,
    stride)``, which must give the same values and gradients."""
    with _RoutedPooling(route):
        yield


def fast_functional_pooling():
    """Within the block, plain ``F.max_pool2d`` calls (a functional ``forward``'s too) run :func:`fast_max_pool2d`."""
    return routed_pool_calls(fast_max_pool2d)
