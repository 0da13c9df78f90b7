"""landscape.evaluate: every fast path equals a plain per-point reference; the caller's model is untouched."""

import copy
import ctypes
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from landscape.errors import UsageError
from landscape.evaluate import Affine, Metric, Segment, evaluate, recalibrate_batchnorm, tuned_allocator
from landscape.models import build_model
from landscape.params import ParamSpace, flatten

REPO = Path(__file__).resolve().parents[1]


def reference(model, x, y, points, space=None, bn_x=None):
    """Independent per-point evaluation: a fresh copy per point, plain forward, no tricks."""
    space = space or ParamSpace.from_model(model)
    losses, accs = [], []
    for p in points:
        m = copy.deepcopy(model)
        space.assign_(m, p)
        if bn_x is not None:
            for mod in m.modules():
                if isinstance(mod, nn.BatchNorm2d):
                    mod.reset_running_stats()
                    mod.momentum = None
            m.train()
            with torch.no_grad():
                for xb in bn_x:
                    m(xb)
        m.eval()
        with torch.no_grad():
            logits = m(x)
        losses.append(float(F.cross_entropy(logits.double(), y)))
        accs.append(float((logits.argmax(1) == y).double().mean()))
    return torch.tensor(losses, dtype=torch.float64), torch.tensor(accs, dtype=torch.float64)


@pytest.fixture(scope="module")
def lenet_pair():
    torch.manual_seed(0)
    a = build_model("lenet", input_shape=(1, 12, 12), num_classes=10)
    b = build_model("lenet", input_shape=(1, 12, 12), num_classes=10)
    x = torch.randn(120, 1, 12, 12)
    y = torch.randint(0, 10, (120,))
    return a, flatten(a), flatten(b), x, y


@pytest.mark.parametrize("method", ["auto", "loop", "plain", "vmap"])
def test_every_method_matches_the_per_point_reference(lenet_pair, method):
    model, a, b, x, y = lenet_pair
    alphas = torch.linspace(0, 1, 5, dtype=torch.float64)
    r = evaluate(model, x, y, Segment(a, b, alphas), batch_size=50, method=method)
    ref_loss, ref_acc = reference(model, x, y, [torch.lerp(a, b, float(t)) for t in alphas])
    torch.testing.assert_close(r.loss, ref_loss, atol=2e-6, rtol=1e-6)
    torch.testing.assert_close(r.acc, ref_acc, atol=0, rtol=0)
    assert r.points == 5 and r.examples == 120 and r.throughput > 0
    if method in ("auto", "loop"):
        assert r.method == "loop+first-layer"


def test_affine_and_listed_points_match_reference(lenet_pair):
    model, a, b, x, y = lenet_pair
    dirs = torch.stack([b - a, 0.1 * torch.randn_like(a)])
    coords = torch.tensor([[0.0, 0.0], [0.5, 1.0], [1.0, -1.0]])
    pts = [a + coords[i, 0] * dirs[0] + coords[i, 1] * dirs[1] for i in range(3)]
    ref_loss, _ = reference(model, x, y, pts)
    r_aff = evaluate(model, x, y, Affine(a, dirs, coords))
    r_list = evaluate(model, x, y, torch.stack(pts))
    torch.testing.assert_close(r_aff.loss, ref_loss, atol=2e-6, rtol=1e-6)
    torch.testing.assert_close(r_list.loss, ref_loss, atol=2e-6, rtol=1e-6)
    assert r_aff.method == "loop+first-layer" and r_list.method == "loop"


def test_callers_model_is_never_changed(lenet_pair):
    model, a, b, x, y = lenet_pair
    m = copy.deepcopy(model).train()
    m[0].weight.requires_grad_(False)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    flags = [p.requires_grad for p in m.parameters()]
    evaluate(m, x, y, Segment(a, b, torch.linspace(0, 1, 3)))
    evaluate(m, x, y, torch.stack([a, b]), method="vmap")
    assert m.training and all(mod.training for mod in m.modules())
    assert [p.requires_grad for p in m.parameters()] == flags
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert type(m[2]) is nn.MaxPool2d and "forward" not in m[2].__dict__


def test_first_layer_sharing_is_refused_when_the_input_is_used_elsewhere():
    class Skip(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            return self.lin(x) + x[:, :3]

    torch.manual_seed(1)
    m, x, y = Skip(), torch.randn(30, 4), torch.randint(0, 3, (30,))
    a = flatten(m)
    b = a + 0.5
    r = evaluate(m, x, y, Segment(a, b, torch.linspace(0, 1, 4, dtype=torch.float64)))
    assert r.method == "loop"
    ref, _ = reference(m, x, y, [torch.lerp(a, b, float(t)) for t in torch.linspace(0, 1, 4)])
    torch.testing.assert_close(r.loss, ref, atol=1e-6, rtol=1e-6)


def test_fast_max_pool_is_bit_identical():
    torch.manual_seed(2)
    m = build_model("opacus-cnn", input_shape=(1, 28, 28), num_classes=10)  # MaxPool2d(2, stride 1)
    x, y = torch.randn(20, 1, 28, 28), torch.randint(0, 10, (20,))
    a = flatten(m)
    fast = evaluate(m, x, y, a.unsqueeze(0), channels_last=False)
    plain = evaluate(m, x, y, a.unsqueeze(0), channels_last=False, method="plain")
    assert torch.equal(fast.loss, plain.loss)


def test_nonfinite_points_are_recorded_and_warned(lenet_pair):
    model, a, b, x, y = lenet_pair
    bad = a.clone()
    bad[-1] = math.inf  # last bias -> inf logits
    with pytest.warns(RuntimeWarning, match="non-finite loss at 1 of 3 points"):
        r = evaluate(model, x, y, torch.stack([a, bad, b]))
    assert torch.isfinite(r.loss[[0, 2]]).all() and not torch.isfinite(r.loss[1])
    assert r.nonfinite.tolist() == [False, True, False]


def test_batchnorm_recalibration_matches_by_hand():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3),
                          nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(32, 4))
    other = copy.deepcopy(model)
    xb = torch.randn(8, 3, 4, 4)
    other.train()
    with torch.no_grad():
        other(2.0 * xb + 1.0)  # give B different running statistics
    space = ParamSpace.from_model(model, buffers=True)
    a, b = space.flatten(model), space.flatten(other) + 0.01 * torch.randn(space.dim)
    x, y = torch.randn(6, 3, 4, 4), torch.randint(0, 4, (6,))
    seg = Segment(a, b, torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64))
    plain = evaluate(model, x, y, seg, space=space)
    recal = evaluate(model, x, y, seg, space=space, bn_recalibrate=xb, bn_batch_size=4)
    # by hand: fresh copy per point, statistics reset, cumulative average over the same two batches of 4
    ref_loss, ref_acc = reference(model, x, y, [seg.point(i) for i in range(3)], space=space, bn_x=xb.split(4))
    assert (recal.loss - plain.loss).abs().max() > 1e-3
    torch.testing.assert_close(recal.loss, ref_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(recal.acc, ref_acc, atol=0, rtol=0)
    m = copy.deepcopy(model).train()
    recalibrate_batchnorm(m, [xb])
    assert m.training and all(not mod.training for mod in m.modules() if isinstance(mod, nn.BatchNorm2d))


# ------------------------------------------------------------------------------------------ metric hook


class LogitSum(Metric):
    """Per point: the sum of all logits and the number of examples seen (a minimal hooked metric)."""

    def __init__(self, name="logit_sum"):
        self.name = name

    def start(self, points, device):
        return torch.zeros(points, 2, dtype=torch.float64, device=device)

    def update(self, state, point, logits, y):
        state[point, 0] += logits.double().sum()
        state[point, 1] += y.numel()

    def finish(self, state):
        return state.cpu()


@pytest.mark.parametrize("method", ["auto", "plain", "vmap"])
def test_metric_hook_sees_every_batch_of_every_point(lenet_pair, method):
    model, a, b, x, y = lenet_pair
    seg = Segment(a, b, torch.linspace(0, 1, 3, dtype=torch.float64))
    plain = evaluate(model, x, y, seg, batch_size=50, method=method)
    r = evaluate(model, x, y, seg, batch_size=50, method=method, metrics=[LogitSum()])
    assert torch.equal(r.loss, plain.loss) and torch.equal(r.acc, plain.acc)
    space = ParamSpace.from_model(model)
    for i in range(3):
        m = copy.deepcopy(model)
        space.assign_(m, seg.point(i))
        with torch.no_grad():
            expected = float(m(x).double().sum())
        assert float(r.metrics["logit_sum"][i, 0]) == pytest.approx(expected, rel=1e-5, abs=1e-4)
        assert float(r.metrics["logit_sum"][i, 1]) == len(y)


def test_metric_hook_with_batchnorm_recalibration():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(64, 3))
    space = ParamSpace.from_model(model, buffers=True)
    a = space.flatten(model)
    seg = Segment(a, a + 0.1 * torch.randn(space.dim), torch.tensor([0.0, 1.0], dtype=torch.float64))
    x, y = torch.randn(10, 3, 4, 4), torch.randint(0, 3, (10,))
    r = evaluate(model, x, y, seg, space=space, bn_recalibrate=x, metrics=[LogitSum()])
    plain = evaluate(model, x, y, seg, space=space, bn_recalibrate=x)
    assert r.method == "loop+bn" and torch.equal(r.loss, plain.loss)
    assert r.metrics["logit_sum"][:, 1].tolist() == [10.0, 10.0]


def test_bad_metrics_are_usage_errors(lenet_pair):
    model, a, b, x, y = lenet_pair
    with pytest.raises(UsageError, match="metric names repeat: logit_sum"):
        evaluate(model, x, y, a.unsqueeze(0), metrics=[LogitSum(), LogitSum()])
    with pytest.raises(UsageError, match="is not an evaluation metric"):
        evaluate(model, x, y, a.unsqueeze(0), metrics=[lambda logits: logits])


# ---------------------------------------------------------------------------------------------- allocator


def _mmapped_blocks_after_malloc(libc, size: int) -> int:
    """How many more mmapped blocks glibc holds while one ``size``-byte block is allocated (0: from the heap)."""

    class MallInfo2(ctypes.Structure):
        _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.malloc_trim(0)  # a free chunk left in the heap would serve the block whatever the threshold
    before = libc.mallinfo2().hblks
    ptr = libc.malloc(size)
    try:
        return libc.mallinfo2().hblks - before
    finally:
        libc.free(ptr)


def _allocator_checks() -> None:
    """The body of the allocator test; runs in a fresh interpreter (see below)."""
    import os

    from landscape.evaluate.allocator import _libc

    libc = _libc()
    size = 48 << 20
    with tuned_allocator():
        assert _mmapped_blocks_after_malloc(libc, size) == 0
        with tuned_allocator():
            pass
        assert _mmapped_blocks_after_malloc(libc, size) == 0  # an inner block does not restore
    assert _mmapped_blocks_after_malloc(libc, size) == 1
    os.environ["LANDSCAPE_MALLOC_TUNE"] = "0"
    with tuned_allocator():
        assert _mmapped_blocks_after_malloc(libc, size) == 1


def test_allocator_is_tuned_only_during_the_call():
    """Inside ``tuned_allocator`` a 48 MiB block comes from the heap (mmap threshold 1 GiB); after the outermost
    block exits the threshold is 32 MiB (glibc's dynamic ceiling) again, so the same block is mmapped.

    Checked in a fresh interpreter: in a long test process a free 48 MiB chunk in the middle of the heap (which
    ``malloc_trim`` cannot return) can serve the block whatever the threshold, so the count said nothing there.
    """
    import subprocess
    import sys

    from landscape.evaluate.allocator import _libc

    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        pytest.skip("needs glibc >= 2.33")
    env = {k: v for k, v in os.environ.items() if k not in ("LANDSCAPE_MALLOC_TUNE", "MALLOC_MMAP_THRESHOLD_")}
    code = "import tests.test_evaluate as t; t._allocator_checks()"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_channels_last_opt_in_gives_the_contiguous_numbers():
    """Contiguous is the default layout; channels-last (opt-in) evaluates the same points to float rounding."""
    torch.manual_seed(3)
    m = build_model("lenet", input_shape=(1, 28, 28), num_classes=10)
    x, y = torch.randn(40, 1, 28, 28), torch.randint(0, 10, (40,))
    a = flatten(m)
    seg = Segment(a, a * 0.5, torch.linspace(0, 1, 5, dtype=torch.float64))
    default = evaluate(m, x, y, seg)
    last = evaluate(m, x, y, seg, channels_last=True)
    plain = evaluate(m, x, y, seg, method="plain")
    torch.testing.assert_close(last.loss, default.loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(default.loss, plain.loss, atol=1e-6, rtol=1e-6)
    assert torch.equal(default.acc, plain.acc) and torch.equal(last.acc, default.acc)


# ------------------------------------------------------------------------------ small convolutions, chunks


@pytest.mark.parametrize(
    "cin, size, cout, kernel, stride, padding, dilation, bias",
    [
        (6, (4, 4), 16, 5, 1, 2, 1, True),  # LeNet's second convolution on 8 x 8 digits
        (3, (3, 3), 4, 3, 1, 1, 1, False),
        (5, (2, 3), 7, 3, 2, 1, 1, True),  # rectangular input, stride 2
        (4, (3, 4), 8, (3, 5), (1, 2), (2, 1), 1, True),  # rectangular kernel and padding
        (2, (3, 3), 3, 3, 1, "valid", 1, True),
        (2, (3, 3), 3, 2, 1, 1, 2, True),  # dilation
    ],
)
def test_dense_convolution_is_the_convolution(cin, size, cout, kernel, stride, padding, dilation, bias):
    """The matrix form gives F.conv2d's values (float64, to rounding) and follows a change of the weights."""
    from landscape.evaluate.rewrites import _DenseConv

    torch.manual_seed(5)
    conv = nn.Conv2d(cin, cout, kernel, stride, padding, dilation, bias=bias).double()
    dense = _DenseConv(conv, (cin, *size))
    x = torch.randn(9, cin, *size, dtype=torch.float64)
    with torch.inference_mode():
        torch.testing.assert_close(dense(x), F.conv2d(x, conv.weight, conv.bias, stride, padding, dilation),
                                   rtol=1e-12, atol=1e-12)
        conv.weight.mul_(-3.0)
        stale = dense(x)
        dense.changed()
        torch.testing.assert_close(dense(x), conv(x), rtol=1e-12, atol=1e-12)
        assert not torch.allclose(stale, conv(x))  # without changed() the old matrix is kept: the runner must call it
        other = torch.randn(2, cin, size[0] + 1, size[1], dtype=torch.float64)
        torch.testing.assert_close(dense(other), conv(other))  # another shape: the ordinary convolution


def test_dense_convolution_is_chosen_only_where_it_is_no_more_work():
    from landscape.evaluate.rewrites import _DenseConv

    assert _DenseConv.worthwhile(nn.Conv2d(6, 16, 5, padding=2), (6, 4, 4))  # 16 <= 25 input positions
    assert _DenseConv.worthwhile(nn.Conv2d(6, 16, 5, padding=2), (6, 5, 5))
    assert not _DenseConv.worthwhile(nn.Conv2d(6, 16, 5, padding=2), (6, 6, 6))  # 36 > 25
    assert not _DenseConv.worthwhile(nn.Conv2d(6, 16, 5, padding=2), (6, 14, 14))
    assert not _DenseConv.worthwhile(nn.Conv2d(6, 16, 5, padding=2, groups=2), (6, 4, 4))
    assert not _DenseConv.worthwhile(nn.Conv2d(6, 16, 5, padding="same"), (6, 4, 4))
    assert not _DenseConv.worthwhile(nn.Conv2d(6, 16, 5, padding=2, padding_mode="reflect"), (6, 4, 4))
    assert not _DenseConv.worthwhile(nn.Conv2d(512, 512, 3, padding=1), (512, 3, 3))  # a 4608 x 4608 matrix


@pytest.mark.parametrize("method", ["auto", "loop", "plain", "vmap"])
def test_lenet_on_digits_sized_inputs_matches_the_reference(method):
    """On 8 x 8 inputs LeNet's second convolution runs as a matrix product (loop methods): same numbers."""
    torch.manual_seed(6)
    model = build_model("lenet", input_shape=(1, 8, 8), num_classes=10)
    a, b = flatten(model), flatten(build_model("lenet", input_shape=(1, 8, 8), num_classes=10))
    x, y = torch.randn(150, 1, 8, 8), torch.randint(0, 10, (150,))
    alphas = torch.linspace(0, 1, 4, dtype=torch.float64)
    r = evaluate(model, x, y, Segment(a, b, alphas), batch_size=64, method=method)
    ref_loss, ref_acc = reference(model, x, y, [torch.lerp(a, b, float(t)) for t in alphas])
    torch.testing.assert_close(r.loss, ref_loss, atol=2e-6, rtol=1e-6)
    assert torch.equal(r.acc, ref_acc)
    expected = {"auto": "loop+first-layer+dense-conv", "loop": "loop+first-layer+dense-conv", "plain": "plain",
                "vmap": "vmap"}
    assert r.method == expected[method]
    listed = evaluate(model, x, y, torch.stack([a, b]), method=method)  # no shared first layer: it goes dense too
    torch.testing.assert_close(listed.loss, ref_loss[[0, -1]], atol=2e-6, rtol=1e-6)
    assert listed.method == {"auto": "loop+dense-conv", "loop": "loop+dense-conv"}.get(method, method)
    if method == "auto":  # channels-last inputs reach the matrix product as well
        last = evaluate(model, x, y, Segment(a, b, alphas), batch_size=64, channels_last=True)
        torch.testing.assert_close(last.loss, ref_loss, atol=2e-6, rtol=1e-6)
        assert last.method == "loop+first-layer+dense-conv" and torch.equal(last.acc, ref_acc)
        double = copy.deepcopy(model).double()  # float64 on request: the matrix is float64 too
        r64 = evaluate(double, x.double(), y, Segment(a.double(), b.double(), alphas))
        torch.testing.assert_close(r64.loss, ref_loss, atol=2e-6, rtol=1e-6)
        assert r64.method == "loop+first-layer+dense-conv"


@pytest.mark.parametrize(
    "kernel, stride, size",
    [(2, None, (8, 8)), (2, 1, (7, 9)), (3, 2, (9, 8)), ((2, 3), (2, 1), (6, 7)), (3, 3, (10, 11))],
)
def test_slice_max_pool_is_bit_identical_to_max_pool2d(kernel, stride, size):
    from landscape.evaluate.rewrites import _slice_max_pool

    torch.manual_seed(7)
    pool = nn.MaxPool2d(kernel, stride)
    v = torch.randn(3, 4, *size)
    v[0, 0, :2, :2] = 0.0  # ties
    assert torch.equal(_slice_max_pool(pool)(v), F.max_pool2d(v, kernel, stride))


def test_batches_run_in_cache_sized_chunks(lenet_pair, monkeypatch):
    """``batch_size`` caps the examples per forward; the loop methods take fewer when the activations pass the
    cache budget (never fewer than MIN_CHUNK), with the same numbers."""
    import landscape.evaluate.runner as ev  # where _Runner.chunk looks MIN_CHUNK and CACHE_BUDGET up

    model, a, b, x, y = lenet_pair
    seg = Segment(a, b, torch.linspace(0, 1, 3, dtype=torch.float64))
    whole = evaluate(model, x, y, seg, batch_size=120, metrics=[LogitSum()])
    per_example = ev._Runner(model, ParamSpace.from_model(model), torch.device("cpu"), x,
                             channels_last=False)._activation_bytes(1)
    monkeypatch.setattr(ev, "MIN_CHUNK", 16)
    monkeypatch.setattr(ev, "CACHE_BUDGET", 40 * per_example)  # chunks of 40: three per point

    class Batches(Metric):
        name = "batches"

        def start(self, points, device):
            return torch.zeros(points)

        def update(self, state, point, logits, y):
            state[point] += 1

    r = evaluate(model, x, y, seg, batch_size=120, metrics=[Batches(), LogitSum()])
    assert r.metrics["batches"].tolist() == [3.0, 3.0, 3.0]
    torch.testing.assert_close(r.loss, whole.loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(r.metrics["logit_sum"], whole.metrics["logit_sum"], rtol=1e-5, atol=1e-4)
    monkeypatch.setattr(ev, "CACHE_BUDGET", 1)  # floor: MIN_CHUNK examples
    assert evaluate(model, x, y, seg, batch_size=120, metrics=[Batches()]).metrics["batches"].tolist() == [8.0] * 3
    plain = evaluate(model, x, y, seg, batch_size=120, method="plain", metrics=[Batches()])
    assert plain.metrics["batches"].tolist() == [1.0] * 3  # the reference method keeps the batches as given


@pytest.mark.parametrize("pool_kernel", [2, (2, 1), 3])
def test_dense_convolution_folds_a_following_max_pool(pool_kernel):
    """Columns reordered by window offset: the pool becomes a maximum over column blocks, the same values."""
    from landscape.evaluate.rewrites import _DenseConv

    torch.manual_seed(8)
    conv = nn.Conv2d(6, 16, 5, padding=2).double()
    pool = nn.MaxPool2d(pool_kernel)
    dense = _DenseConv(conv, (6, 5, 4), pool=pool)  # conv output 5 x 4: windows of 3 leave rows and columns out
    x = torch.randn(11, 6, 5, 4, dtype=torch.float64)
    with torch.inference_mode():
        want = F.max_pool2d(conv(x), pool_kernel)
        assert dense(x).shape == want.shape
        torch.testing.assert_close(dense(x), want, rtol=1e-12, atol=1e-12)
        other = torch.randn(3, 6, 6, 6, dtype=torch.float64)  # another shape: convolution, then the pool
        torch.testing.assert_close(dense(other), F.max_pool2d(conv(other), pool_kernel))
