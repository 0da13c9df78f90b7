"""landscape.params: flat vectors, lerp, distance and the compatibility check."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from landscape.errors import IncompatibleError
from landscape.params import ParamSpace, check_compatible, distance, flatten, lerp, unflatten


def _net(out: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, out))


def test_flatten_unflatten_round_trip_and_kinds():
    m = _net()
    space = ParamSpace.from_model(m, buffers=True)
    assert space.parameter_names() == [n for n, _ in m.named_parameters()]
    assert space.buffer_names() == ["1.running_mean", "1.running_var"]  # num_batches_tracked is not floating
    v = space.flatten(m)
    assert v.shape == (space.dim,) and space.dim == sum(p.numel() for p in m.parameters()) + 4
    back = unflatten(v, space)
    for name, t in back.items():
        assert torch.equal(t, m.state_dict()[name])
    assert torch.equal(flatten(m), torch.cat([p.detach().reshape(-1) for p in m.parameters()]))


def test_assign_writes_in_place():
    m = _net()
    space = ParamSpace.from_model(m)
    ids = [id(p) for p in m.parameters()]
    w = torch.arange(space.dim, dtype=torch.float32)
    space.assign_(m, w)
    assert [id(p) for p in m.parameters()] == ids
    assert torch.equal(flatten(m), w)
    assert all(p.requires_grad for p in m.parameters())


def test_state_dict_space_and_dtype_promotion():
    sd = {"a": torch.ones(2, dtype=torch.float32), "n": torch.tensor(3), "b": torch.ones(1, dtype=torch.float64)}
    space = ParamSpace.from_state_dict(sd)
    assert space.names == ["a", "b"] and space.dtype == torch.float64
    assert unflatten(space.flatten(sd), space)["a"].dtype == torch.float32


def test_lerp_exact_at_ends_and_keeps_integer_buffers():
    a, b = _net().state_dict(), _net().state_dict()
    for t in b.values():
        if t.is_floating_point():
            t.add_(1.0)
    b["1.num_batches_tracked"].fill_(7)
    assert all(torch.equal(lerp(a, b, 0.0)[k], a[k]) for k in a)
    one = lerp(a, b, 1.0)
    assert all(torch.equal(one[k], b[k]) for k in a if a[k].is_floating_point())
    assert int(one["1.num_batches_tracked"]) == int(a["1.num_batches_tracked"])
    va, vb = flatten(a), flatten(b)
    assert torch.allclose(lerp(va, vb, 0.25), 0.75 * va + 0.25 * vb)


def test_distance():
    a, b = _net().state_dict(), _net().state_dict()
    b["3.bias"] = b["3.bias"] + torch.tensor([3.0, 4.0, 0.0])
    assert distance(a, b) == pytest.approx(5.0, rel=1e-6)
    assert distance(flatten(a), flatten(b)) == pytest.approx(5.0, rel=1e-6)


def test_incompatible_names_first_mismatching_tensor_in_one_line():
    with pytest.raises(IncompatibleError) as err:
        check_compatible(_net(3), _net(4))
    msg = str(err.value)
    assert "'3.weight'" in msg and "(3, 8)" in msg and "(4, 8)" in msg and "\n" not in msg
    a = _net().state_dict()
    b = dict(a)
    del b["1.running_var"]
    with pytest.raises(IncompatibleError, match="'1.running_var' is in A but not in B"):
        check_compatible(a, b)
    with pytest.raises(IncompatibleError, match="shape"):
        ParamSpace.from_model(_net(3)).flatten(_net(4))


@settings(max_examples=30, deadline=None)
@given(alpha=st.floats(0, 1), seed=st.integers(0, 10_000))
def test_lerp_lies_on_the_segment(alpha, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(20, generator=g, dtype=torch.float64), torch.randn(20, generator=g, dtype=torch.float64)
    p = lerp(a, b, alpha)
    assert distance(a, p) + distance(p, b) == pytest.approx(distance(a, b), rel=1e-9, abs=1e-12)
    assert distance(a, p) == pytest.approx(alpha * distance(a, b), rel=1e-9, abs=1e-12)
    assert math.isclose(distance(a, b), distance(b, a))
