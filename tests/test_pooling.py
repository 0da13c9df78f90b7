"""landscape.pooling: PyTorch's max-pool values and gradients, bit for bit, through its faster CPU kernel."""

import math
import zlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from landscape.models import build_model
from landscape.pooling import exact_fast_pooling, fast_max_pool2d


def _inputs(shape, dtype, special: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(repr((shape, special)).encode()))
    x = torch.randn(*shape, generator=g, dtype=dtype)
    if special == "ties":  # as after a ReLU: about half the values tie at 0
        x.clamp_(min=0)
    elif special == "rounded":  # many equal positive values in a window
        x = (x * 2).round()
    elif special == "nan":
        x.view(-1)[:: 7] = math.nan
    elif special == "inf":
        x.view(-1)[:: 5] = -math.inf
        x.view(-1)[:: 11] = math.inf
    return x


@pytest.mark.parametrize("special", ["plain", "ties", "rounded", "nan", "inf"])
@pytest.mark.parametrize(
    "shape, kernel, stride",
    [
        ((8, 16, 14, 14), 2, 1),  # overlapping windows (opacus-cnn): a value's gradient sums several windows
        ((8, 6, 28, 28), 2, 2),  # LeNet
        ((4, 5, 9, 11), 3, 2),  # sizes the windows do not divide
        ((4, 3, 7, 8), (2, 3), (1, 2)),
        ((2, 32, 5, 5), 2, None),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_and_gradients_are_pytorchs_bit_for_bit(shape, kernel, stride, special, dtype):
    x = _inputs(shape, dtype, special).requires_grad_(True)
    ref = F.max_pool2d(x, kernel, stride)
    out = fast_max_pool2d(x, kernel, stride)
    assert out.shape == ref.shape and out.is_contiguous()
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.nan_to_num(), ref.nan_to_num())
    g = torch.randn(ref.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    (want,) = torch.autograd.grad(ref, x, g)
    (got,) = torch.autograd.grad(out, x, g)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())


def test_the_swap_lasts_only_for_the_block_and_gives_the_models_gradients():
    torch.manual_seed(0)
    model = build_model("opacus-cnn", input_shape=(1, 28, 28), num_classes=10)
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    pools = [m for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    assert len(pools) == 2
    ref = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    with exact_fast_pooling(model):
        assert all("forward" in m.__dict__ for m in pools)
        got = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    assert all("forward" not in m.__dict__ for m in pools)
    assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))
    with pytest.raises(RuntimeError, match="boom"), exact_fast_pooling(model):
        raise RuntimeError("boom")
    assert all("forward" not in m.__dict__ for m in pools)  # restored after an error too


def test_pools_it_cannot_take_are_left_alone():
    padded, ceil = nn.MaxPool2d(2, padding=1), nn.MaxPool2d(2, ceil_mode=True)
    model = nn.Sequential(padded, ceil, nn.MaxPool2d(2))
    with exact_fast_pooling(model):
        assert "forward" not in padded.__dict__ and "forward" not in ceil.__dict__
        assert "forward" in model[2].__dict__
    x = torch.randn(3, 4, 5)  # unbatched input: PyTorch's own route
    assert torch.equal(fast_max_pool2d(x, 2), F.max_pool2d(x, 2))
