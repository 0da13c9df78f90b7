"""The GPU path: ``--device auto`` is the default of training and every analysis with a device option, "auto"
means CUDA when present else CPU, results record the device actually used, and CPU results do not change.

Tests marked ``cuda`` run only where ``torch.cuda.is_available()`` (tests/conftest.py skips them elsewhere): each
computes the same quantity on CUDA and on the CPU (training, interpolation, Hessian-vector products, the NTK Gram
blocks, per-sample gradients) and asserts they agree. cuDNN's TF32 convolutions are switched off inside them, so
float32 agreement is to float32 rounding, not to TF32's 10-bit mantissa.
"""

from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest
import torch

from landscape.analyze.interpolate import interpolate as interpolate_states
from landscape.analyze.specs import DirectionsConfig, HessianConfig, InterpolateConfig, SurfaceConfig
from landscape.api import interpolate as api_interpolate
from landscape.data import load_dataset
from landscape.errors import UsageError
from landscape.models import build_model
from landscape.runtime import resolve_device
from landscape.store import Store
from landscape.train.config import TrainConfig
from landscape.train.loop import train

HERE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = dict(model="lenet", data="digits", subset=200, batch_size=50, lr=0.05, checkpoint_every="1e", epochs=1)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def lenet(seed: int, dtype=torch.float32):
    torch.manual_seed(seed)
    return build_model("lenet", input_shape=(1, 8, 8), num_classes=10).to(dtype)


@pytest.fixture
def store(tmp_path, digits):
    store = Store(tmp_path / "ck")
    for name, seed in (("a", 0), ("b", 1)):
        model = lenet(seed)
        run = store.create_run(name, config={"model": "lenet"}, seeds={"seed": seed}, model_spec=model.landscape_spec,
                               data_spec=digits.spec)
        run.save_checkpoint(model.state_dict(), step=10, epoch=1.0)
    return store


@pytest.fixture
def exact_cuda():
    """No TF32 in cuDNN convolutions or matmuls for the test's duration (restored after)."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


# ------------------------------------------------------------------------------------------ everywhere

def test_auto_is_the_default_device_everywhere():
    for cfg in (InterpolateConfig(), SurfaceConfig(), DirectionsConfig(), HessianConfig(), TrainConfig()):
        assert cfg.device == "auto", type(cfg).__name__
    assert resolve_device("auto") == torch.device(HERE)
    assert resolve_device(None) == torch.device(HERE)
    assert resolve_device("cpu") == torch.device("cpu")


def test_results_and_runs_record_the_device_actually_used(store, tmp_path):
    r = api_interpolate("a", "b", root=store.root, config=InterpolateConfig(points=3, subset=60), figure=False,
                        output=tmp_path / "ab.h5")
    with h5py.File(r.path) as f:
        assert f.attrs["device"] == HERE
        assert '"device": "auto"' in f.attrs["params"]  # what was asked for stays in the config
    r = api_interpolate("a", "b", root=store.root, config=InterpolateConfig(points=3, subset=60, device="cpu"),
                        figure=False, output=tmp_path / "ab-cpu.h5")
    with h5py.File(r.path) as f:
        assert f.attrs["device"] == "cpu"
    run = train(TrainConfig(**SMALL, run="r"), root=tmp_path / "runs")
    assert run.manifest["device"] == HERE


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto is CUDA here: the CPU comparison is the cuda tests'")
def test_auto_changes_no_cpu_result(digits):
    a, b = lenet(0), lenet(1)
    data = {"test": digits.split("test")}
    ra = interpolate_states(a, a.state_dict(), b.state_dict(), data, split=("test",), points=5, device="auto")
    rc = interpolate_states(a, a.state_dict(), b.state_dict(), data, split=("test",), points=5, device="cpu")
    np.testing.assert_array_equal(ra.loss["test"], rc.loss["test"])
    np.testing.assert_array_equal(ra.acc["test"], rc.acc["test"])


# ------------------------------------------------------------------------------------------ CUDA vs CPU

@pytest.mark.cuda
def test_training_on_cuda_matches_cpu(tmp_path, exact_cuda):
    runs = {dev: train(TrainConfig(**SMALL, device=dev, run=f"r-{dev}"), root=tmp_path) for dev in ("cpu", "cuda")}
    assert runs["cuda"].manifest["device"].startswith("cuda") and runs["cpu"].manifest["device"] == "cpu"
    store = Store(tmp_path)
    wc, wg = (store.load(f"r-{dev}@last").state_dict for dev in ("cpu", "cuda"))
    for k in wc:  # 4 SGD steps from the same seed and the same batches
        torch.testing.assert_close(wg[k].cpu(), wc[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.cuda
def test_interpolation_on_cuda_matches_cpu(digits, exact_cuda):
    a, b = lenet(0), lenet(1)
    data = {"train": digits.split("train")}
    out = {dev: interpolate_states(a, a.state_dict(), b.state_dict(), data, split=("train",), points=7, device=dev)
           for dev in ("cpu", "cuda")}
    np.testing.assert_allclose(out["cuda"].loss["train"], out["cpu"].loss["train"], rtol=1e-5)
    np.testing.assert_allclose(out["cuda"].acc["train"], out["cpu"].acc["train"], atol=1 / 1000)


@pytest.mark.cuda
def test_hessian_vector_products_on_cuda_match_cpu(digits):
    from landscape.curvature import HessianOperator

    model = lenet(0, torch.float64)
    x, y = digits.split("train")
    x, y = x[:64].double(), y[:64]
    ops = {dev: HessianOperator(model, x, y, device=dev) for dev in ("cpu", "cuda")}
    g = torch.Generator().manual_seed(0)
    v = {k: torch.randn(p.shape, generator=g, dtype=torch.float64) for k, p in ops["cpu"].params.items()}
    hc, hg = ops["cpu"].hvp(v), ops["cuda"].hvp(v)
    for k in hc:
        torch.testing.assert_close(hg[k].cpu(), hc[k], rtol=1e-9, atol=1e-11, msg=k)


@pytest.mark.cuda
def test_ntk_gram_blocks_on_cuda_match_cpu(digits):
    from landscape.gram import gram_blocks

    model = lenet(0, torch.float64)
    x, y = digits.split("train")
    x, y = x[:48].double(), y[:48]
    cpu = gram_blocks(model, x, y)
    gpu = gram_blocks(model.to("cuda"), x.cuda(), y.cuda())
    for k in cpu:
        torch.testing.assert_close(gpu[k].cpu(), cpu[k], rtol=1e-9, atol=1e-12, msg=k)


@pytest.mark.cuda
def test_per_sample_gradients_on_cuda_match_cpu(digits):
    from landscape.persample import PerSampleEngine

    model = lenet(0, torch.float64)
    x, y = digits.split("train")
    x, y = x[:32].double(), y[:32]
    norms_cpu, grads_cpu = PerSampleEngine(model).norms(x, y), PerSampleEngine(model).grads(x, y)
    gpu_model = lenet(0, torch.float64).to("cuda")
    engine = PerSampleEngine(gpu_model)
    norms_gpu, grads_gpu = engine.norms(x.cuda(), y.cuda()), engine.grads(x.cuda(), y.cuda())
    torch.testing.assert_close(norms_gpu.flat.cpu(), norms_cpu.flat, rtol=1e-10, atol=1e-12)
    for k in grads_cpu:
        torch.testing.assert_close(grads_gpu[k].cpu(), grads_cpu[k], rtol=1e-10, atol=1e-12, msg=k)


@pytest.mark.cuda
def test_an_analysis_by_default_runs_on_cuda_and_says_so(store, tmp_path, exact_cuda):
    cfg = InterpolateConfig(points=5, subset=100)
    auto = api_interpolate("a", "b", root=store.root, config=cfg, figure=False, output=tmp_path / "auto.h5")
    cpu = api_interpolate("a", "b", root=store.root, config=dataclasses.replace(cfg, device="cpu"), figure=False,
                          output=tmp_path / "cpu.h5")
    with h5py.File(auto.path) as f:
        assert f.attrs["device"].startswith("cuda")
    for s in auto.loss:
        np.testing.assert_allclose(auto.loss[s], cpu.loss[s], rtol=1e-5)


# ----------------------------------------------------- per-sample and kernel analyses: the --device option
# ntk, ntk-table, clipping, symmetry and norms take --device like the other analyses: "auto"
# and "cpu" give the same numbers on a CPU machine, CUDA agrees with the CPU, the file records the device used.
DEVICE_ANALYSES = {
    "ntk": (["a@last"], dict(subset=24, clip_style="flat", max_grad_norm=0.5, precision="float64")),
    "ntk-table": (["a"], dict(subset=24, max_grad_norms=(0.1, 10.0), precision="float64")),
    "clipping": (["a"], dict(batch_size=40, batches=2, chunk=16, max_grad_norm=0.5)),
    "symmetry": (["a"], dict(subset=40, projections=3, permutations=20, chunk=16)),
    "norms": (["a"], dict(subset=40, bins=20, chunk=16)),
}


@pytest.fixture(scope="module")
def two_point_run(tmp_path_factory, digits):
    """Run "a": LeNet at @init (step 0) and a perturbed point at step 10."""
    store = Store(tmp_path_factory.mktemp("device") / "ck")
    model = lenet(0)
    run = store.create_run("a", config={"model": "lenet", "optimizer": "sgd"}, seeds={"seed": 0},
                           model_spec=model.landscape_spec, data_spec=digits.spec)
    g = torch.Generator().manual_seed(1)
    run.save_checkpoint(model.state_dict(), step=0, epoch=0.0)
    run.save_checkpoint({k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()},
                        step=10, epoch=1.0)
    return store.root


def _device_run(root, name, device, out):
    from landscape.api.runner import run

    refs, opts = DEVICE_ANALYSES[name]
    return run(name, refs, root=root, output=out, figure=False, device=device, **opts)


def _h5_arrays(path) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    with h5py.File(path) as f:
        f.visititems(lambda k, v: arrays.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset) else None)
        return arrays | {"device-attr": f.attrs["device"]}


def test_per_sample_and_kernel_analyses_take_the_device_option():
    from landscape.analyze import registry

    for name in DEVICE_ANALYSES:
        config = registry.get(name).config()
        assert config.device == "auto", name
        with pytest.raises(UsageError, match="^device must be auto, cpu, cuda or cuda:N, got 'gpu'"):
            bad = dataclasses.replace(config, device="gpu")  # the ntk configs check in __post_init__
            bad.validate()


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto is CUDA here: the CPU comparison is the cuda tests'")
@pytest.mark.parametrize("name", list(DEVICE_ANALYSES))
def test_auto_and_cpu_give_identical_numbers(two_point_run, tmp_path, name):
    auto = _h5_arrays(_device_run(two_point_run, name, "auto", tmp_path / "auto.h5").path)
    cpu = _h5_arrays(_device_run(two_point_run, name, "cpu", tmp_path / "cpu.h5").path)
    assert auto.pop("device-attr") == cpu.pop("device-attr") == "cpu"
    assert auto.keys() == cpu.keys() and len(auto) > 0
    for k in auto:
        np.testing.assert_array_equal(auto[k], cpu[k], err_msg=f"{name}: {k}")


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(DEVICE_ANALYSES))
def test_per_sample_and_kernel_analyses_on_cuda_match_cpu(two_point_run, tmp_path, name, exact_cuda):
    gpu = _h5_arrays(_device_run(two_point_run, name, "cuda", tmp_path / "gpu.h5").path)
    cpu = _h5_arrays(_device_run(two_point_run, name, "cpu", tmp_path / "cpu.h5").path)
    assert gpu.pop("device-attr").startswith("cuda") and cpu.pop("device-attr") == "cpu"
    assert gpu.keys() == cpu.keys()
    for k in gpu:
        if k.endswith("p_value"):  # a permutation count: a statistic on the edge may flip by one
            np.testing.assert_allclose(gpu[k], cpu[k], atol=2 / 21, err_msg=k)
        elif gpu[k].dtype.kind in "fc":
            np.testing.assert_allclose(gpu[k], cpu[k], rtol=2e-4, atol=1e-5, err_msg=f"{name}: {k}")
        else:
            np.testing.assert_array_equal(gpu[k], cpu[k], err_msg=f"{name}: {k}")
