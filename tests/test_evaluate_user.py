"""The many-point evaluator on models written in the functional style (a user copy of a built-in runs as
fast as the built-in, with the same numbers).

A hand-written ``nn.Module`` that calls ``F.max_pool2d`` / ``F.relu`` / ``x.flatten(1)`` in its ``forward`` is
traced into a graph of modules (method ``...+graph``) and then evaluated exactly like the built-in ``lenet``:
its losses and accuracies equal the built-in's on the same weights bit for bit, and a plain PyTorch loop over
blended state dicts (no landscape code) within float rounding. A forward that cannot be traced has its plain pool
calls routed to the same strided-slice maximum (``...+pool-calls``). The caller's model is never changed.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from landscape.analyze.interpolate import interpolate
from landscape.evaluate import Affine, Segment, evaluate
from landscape.models import build_model
from landscape.params import flatten
from landscape.pooling import fast_functional_pooling, routed_pool_calls, simple_pool_call

SHAPE = (1, 8, 8)  # digits: the built-in runs its second convolution as a matrix product (dense-conv)


class FunctionalLeNet(nn.Module):
    """The built-in ``lenet`` on 1x8x8 as a researcher writes it: modules for the weights, functions between."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5, padding=2)
        self.fc1 = nn.Linear(64, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), kernel_size=2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(self.fc2(x).relu())


class SharedPoolLeNet(FunctionalLeNet):
    """One ``nn.MaxPool2d`` module called twice, outside any ``Sequential``."""

    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))))


class UntraceableLeNet(FunctionalLeNet):
    """Control flow on the input's rank: ``torch.fx`` cannot trace it, so its pool calls are routed instead."""

    def forward(self, x):
        if x.dim() == 3:
            x = x.unsqueeze(0)
        return super().forward(x)


class ResidualStem(nn.Module):
    """The first layer's output is used twice and pooled with padding: nothing may be folded or swapped wrongly."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(4 * 4 * 4 + 4 * 5 * 5, 10)

    def forward(self, x):
        z = self.conv(x)
        a = F.max_pool2d(F.relu(z), 2)
        b = F.max_pool2d(z, 2, padding=1)
        return self.head(torch.cat([a.flatten(1), F.relu(b, inplace=True).flatten(1)], 1))


NAMES = {"0": "conv1", "3": "conv2", "7": "fc1", "9": "fc2", "11": "fc3"}


def as_user(builtin_state: dict) -> dict:
    return {f"{NAMES[k.split('.')[0]]}.{k.split('.')[1]}": v for k, v in builtin_state.items()}


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    builtin = build_model("lenet", input_shape=SHAPE, num_classes=10)
    other = build_model("lenet", input_shape=SHAPE, num_classes=10)
    users = {}
    for cls in (FunctionalLeNet, SharedPoolLeNet, UntraceableLeNet):
        m = cls()
        m.load_state_dict(as_user(builtin.state_dict()))
        users[cls.__name__] = m
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(150, *SHAPE, generator=g), torch.randint(0, 10, (150,), generator=g)
    return builtin, other, users, x, y


def blended_loop(model, state_a, state_b, alphas, x, y):
    """Plain PyTorch: per alpha a fresh model with lerped tensors, one forward, F.cross_entropy (no landscape)."""
    losses, accs = [], []
    for alpha in alphas.tolist():
        m = copy.deepcopy(model)
        m.load_state_dict({k: torch.lerp(state_a[k], state_b[k], alpha) for k in state_a})
        with torch.no_grad():
            logits = m.eval()(x)
        losses.append(float(F.cross_entropy(logits.double(), y)))
        accs.append(float((logits.argmax(1) == y).double().mean()))
    return torch.tensor(losses, dtype=torch.float64), torch.tensor(accs, dtype=torch.float64)


@pytest.mark.parametrize("name", ["FunctionalLeNet", "SharedPoolLeNet", "UntraceableLeNet"])
def test_interpolation_of_a_functional_model_equals_a_plain_loop_and_the_builtin(setup, name):
    builtin, other, users, x, y = setup
    user = users[name]
    a_state = as_user(builtin.state_dict())
    b_state = as_user(other.state_dict())
    alphas = torch.linspace(0, 1, 7, dtype=torch.float64)
    ref_loss, ref_acc = blended_loop(user, a_state, b_state, alphas, x, y)

    result = interpolate(user, a_state, b_state, {"train": (x, y)}, points=7, split=("train",))
    torch.testing.assert_close(torch.as_tensor(result.loss["train"]), ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.as_tensor(result.acc["train"]), ref_acc, rtol=0, atol=1e-12)

    user_b = copy.deepcopy(user)
    user_b.load_state_dict(b_state)
    seg_user = Segment(flatten(user), flatten(user_b), alphas)
    seg_builtin = Segment(flatten(builtin), flatten(other), alphas)
    assert torch.equal(seg_user.a, seg_builtin.a) and torch.equal(seg_user.b, seg_builtin.b)
    r_user = evaluate(user, x, y, seg_user, batch_size=64)
    r_builtin = evaluate(builtin, x, y, seg_builtin, batch_size=64)
    expected = {"UntraceableLeNet": "loop+first-layer+dense-conv+pool-calls"}.get(name, "loop+first-layer+dense-conv+graph")
    assert r_builtin.method == "loop+first-layer+dense-conv" and r_user.method == expected
    if name == "UntraceableLeNet":  # same operations, but its ReLUs run before the pools: rounding only
        torch.testing.assert_close(r_user.loss, r_builtin.loss, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(r_user.acc, r_builtin.acc, rtol=0, atol=1e-12)
    else:  # the same modules in the same order and chunks: bit-identical
        assert torch.equal(r_user.loss, r_builtin.loss) and torch.equal(r_user.acc, r_builtin.acc)


@pytest.mark.parametrize("name", ["FunctionalLeNet", "SharedPoolLeNet", "UntraceableLeNet"])
def test_random_directions_and_listed_points_on_a_functional_model(setup, name):
    builtin, other, users, x, y = setup
    user = users[name]
    origin = flatten(user)
    dirs = torch.randn(2, origin.numel(), generator=torch.Generator().manual_seed(3)) * 0.05
    coords = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.5, -1.0]], dtype=torch.float64)
    listed = torch.stack([origin + c[0] * dirs[0] + c[1] * dirs[1] for c in coords.float()])
    plain = evaluate(user, x, y, listed, method="plain")
    for points in (Affine(origin, dirs, coords), listed):
        r = evaluate(user, x, y, points, batch_size=64)
        torch.testing.assert_close(r.loss, plain.loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r.acc, plain.acc, rtol=0, atol=1e-12)
        assert r.method.endswith("+pool-calls" if name == "UntraceableLeNet" else "+graph")


def test_the_callers_model_is_unchanged(setup):
    builtin, other, users, x, y = setup
    user = users["SharedPoolLeNet"]
    before = {k: v.clone() for k, v in user.state_dict().items()}
    forward, modules = type(user).forward, [type(m) for m in user.modules()]
    evaluate(user, x, y, Segment(flatten(builtin), flatten(other), torch.linspace(0, 1, 3, dtype=torch.float64)))
    assert type(user) is SharedPoolLeNet and type(user).forward is forward and "forward" not in user.__dict__
    assert [type(m) for m in user.modules()] == modules and all(
        "forward" not in m.__dict__ for m in user.modules())
    assert all(torch.equal(before[k], v) for k, v in user.state_dict().items())
    # no mode is left active: a plain pool call after the evaluation is PyTorch's own
    assert F.max_pool2d(x[:2], 2).grad_fn is None and torch.overrides._get_current_function_mode() is None


def test_a_first_layer_used_twice_and_padded_pools_are_left_alone(setup):
    *_, x, y = setup
    torch.manual_seed(4)
    a, b = ResidualStem(), ResidualStem()
    alphas = torch.linspace(0, 1, 5, dtype=torch.float64)
    ref_loss, ref_acc = blended_loop(a, a.state_dict(), b.state_dict(), alphas, x, y)
    r = evaluate(a, x, y, Segment(flatten(a), flatten(b), alphas), batch_size=64)
    assert r.method == "loop+first-layer+graph"  # traced (one plain pool), but nothing folded into the conv
    torch.testing.assert_close(r.loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r.acc, ref_acc, rtol=0, atol=1e-12)


def test_vmap_and_bn_recalibration_on_a_functional_model(setup):
    builtin, other, users, x, y = setup
    user = users["FunctionalLeNet"]
    alphas = torch.linspace(0, 1, 3, dtype=torch.float64)
    seg = Segment(flatten(builtin), flatten(other), alphas)
    plain = evaluate(user, x, y, seg, method="plain")
    for kwargs in ({"method": "vmap"}, {"bn_recalibrate": x[:40]}):
        r = evaluate(user, x, y, seg, batch_size=64, **kwargs)
        torch.testing.assert_close(r.loss, plain.loss, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------- pooling's function mode


def test_simple_pool_call_accepts_only_plain_pools():
    x = torch.randn(2, 3, 8, 8)
    assert simple_pool_call(F.max_pool2d, (x, 2), {"stride": None})[1:] == ((2, 2), (2, 2))
    assert simple_pool_call(torch.max_pool2d, (x, [3, 2], []))[1:] == ((3, 2), (3, 2))
    assert simple_pool_call(F.max_pool2d, (x, 3, 2))[1:] == ((3, 3), (2, 2))
    for kwargs in ({"padding": 1}, {"dilation": 2}, {"ceil_mode": True}, {"return_indices": True}):
        assert simple_pool_call(F.max_pool2d, (x, 2), kwargs) is None
    assert simple_pool_call(F.avg_pool2d, (x, 2)) is None
    assert simple_pool_call(F.max_pool2d, (x.flatten(1), 2)) is None  # 2-d: not an image


def test_fast_functional_pooling_gives_pytorchs_values_and_gradients():
    """What the per-sample engine and training can enter for functional forwards: F.max_pool2d's numbers."""
    torch.manual_seed(5)
    model = FunctionalLeNet()
    x = torch.randn(6, *SHAPE).round(decimals=1).requires_grad_()  # ties inside pooling windows
    y = torch.randint(0, 10, (6,))
    F.cross_entropy(model(x), y).backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    calls = []
    with routed_pool_calls(lambda *a: calls.append(a[1:]) or F.max_pool2d(*a)):
        model(x)
    assert calls == [((2, 2), (2, 2))] * 2
    with fast_functional_pooling():
        out = model(x)
        F.cross_entropy(out, y).backward()
        pooled = F.max_pool2d(x, 2)
        assert type(pooled.grad_fn).__name__ == "_ChannelsLastMaxPool2dBackward"
        # torch.func transforms keep PyTorch's kernel (the autograd.Function has no vmap rule)
        per = torch.func.vmap(lambda t: F.max_pool2d(t, 2))(x.detach())
    assert all(torch.equal(p.grad, r) for p, r in zip(model.parameters(), ref, strict=True))
    assert torch.equal(per, F.max_pool2d(x.detach(), 2))


class LayerCallsLeNet(FunctionalLeNet):
    """Its layers' weights applied with ``F.conv2d`` / ``F.linear``: they are traced back to the layers' calls."""

    def forward(self, x):
        x = F.max_pool2d(F.relu(F.conv2d(x, self.conv1.weight, self.conv1.bias, padding=2)), 2)
        x = F.max_pool2d(F.relu(F.conv2d(x, self.conv2.weight, self.conv2.bias, 1, 2)), 2)
        x = F.relu(F.linear(x.view(x.size(0), -1), self.fc1.weight, self.fc1.bias))
        return F.linear(F.relu(self.fc2(x)), self.fc3.weight, self.fc3.bias)


class OtherOptionsConv(FunctionalLeNet):
    """``F.conv2d`` with the layer's weights but another padding is not the layer's call (left as it is)."""

    def forward(self, x):
        x = F.max_pool2d(F.relu(F.conv2d(x, self.conv1.weight, self.conv1.bias, padding=1)), 2)
        x = F.max_pool2d(F.relu(self.conv2(F.pad(x, (1, 0, 1, 0)))), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


@pytest.mark.parametrize("cls", [LayerCallsLeNet, OtherOptionsConv])
def test_functional_layer_calls_with_a_layers_weights(setup, cls):
    builtin, other, *_, x, y = setup
    user, user_b = cls(), cls()
    user.load_state_dict(as_user(builtin.state_dict()))
    user_b.load_state_dict(as_user(other.state_dict()))
    alphas = torch.linspace(0, 1, 5, dtype=torch.float64)
    ref_loss, ref_acc = blended_loop(user, user.state_dict(), user_b.state_dict(), alphas, x, y)
    seg = Segment(flatten(user), flatten(user_b), alphas)
    r = evaluate(user, x, y, seg, batch_size=64)
    torch.testing.assert_close(r.loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r.acc, ref_acc, rtol=0, atol=1e-12)
    if cls is LayerCallsLeNet:  # the built-in's path and numbers
        r_builtin = evaluate(builtin, x, y, Segment(flatten(builtin), flatten(other), alphas), batch_size=64)
        assert r.method == r_builtin.method + "+graph"
        torch.testing.assert_close(r.loss, r_builtin.loss, rtol=1e-6, atol=1e-7)  # its view is no Flatten
    else:  # conv1 with another padding is not conv1's call: no shared first layer
        assert r.method == "loop+dense-conv+graph"


class FunctionalBatchNorm(nn.Module):
    """A BatchNorm used through its tensors: tracing would freeze ``self.bn.training``, so it is not traced."""

    def __init__(self, traced_bn: bool):
        super().__init__()
        self.traced_bn = traced_bn
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        z = self.conv(x)
        if self.traced_bn:
            z = self.bn(z)
        else:
            z = F.batch_norm(z, self.bn.running_mean, self.bn.running_var, self.bn.weight, self.bn.bias,
                             self.bn.training, 0.1, self.bn.eps)
        return self.fc(F.max_pool2d(F.relu(z), 2).flatten(1))


@pytest.mark.parametrize("traced_bn", [True, False])
def test_batchnorm_recalibration_on_a_functional_model(setup, traced_bn):
    *_, x, y = setup
    torch.manual_seed(6)
    a, b = FunctionalBatchNorm(traced_bn), FunctionalBatchNorm(traced_bn)
    alphas = torch.linspace(0, 1, 4, dtype=torch.float64)
    seg = Segment(flatten(a), flatten(b), alphas)
    plain = evaluate(a, x, y, seg, bn_recalibrate=x[:50], method="plain")
    r = evaluate(a, x, y, seg, bn_recalibrate=x[:50], batch_size=64)
    assert r.method.endswith("+graph" if traced_bn else "+pool-calls")
    torch.testing.assert_close(r.loss, plain.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r.acc, plain.acc, rtol=0, atol=1e-12)


def test_exact_fast_pooling_routes_a_functional_forwards_pool_calls():
    """The per-sample engine and SGD training enter exact_fast_pooling: a model with code of its own also has its
    F.max_pool2d calls routed there (PyTorch's gradients), a model of torch.nn layers only keeps no mode."""
    from landscape.pooling import exact_fast_pooling

    torch.manual_seed(7)
    user = FunctionalLeNet()
    x = torch.randn(5, *SHAPE).round(decimals=1)
    y = torch.randint(0, 10, (5,))
    F.cross_entropy(user(x), y).backward()
    ref = [p.grad.clone() for p in user.parameters()]
    user.zero_grad()
    with exact_fast_pooling(user):
        assert torch.overrides._get_current_function_mode() is not None
        out = user(x)
        assert autograd_nodes(out).count("_ChannelsLastMaxPool2dBackward") == 2
        F.cross_entropy(out, y).backward()
    assert all(torch.equal(p.grad, r) for p, r in zip(user.parameters(), ref, strict=True))
    assert torch.overrides._get_current_function_mode() is None
    builtin = build_model("lenet", input_shape=SHAPE, num_classes=10)
    with exact_fast_pooling(builtin):
        assert torch.overrides._get_current_function_mode() is None


def autograd_nodes(t: torch.Tensor) -> list[str]:
    seen, stack, names = set(), [t.grad_fn], []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.append(type(fn).__name__)
        stack.extend(f for f, _ in fn.next_functions)
    return names
