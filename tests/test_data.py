"""Data sets by name: shapes, determinism, stratified subsets, Watson's gaussian-signal, missing files."""

from __future__ import annotations

import json
import struct

import click
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from landscape.data import (
    DATASETS,
    Dataset,
    dataset_from_spec,
    dataset_options,
    gaussian_signal_key,
    load_dataset,
    subset_indices,
)
from landscape.errors import DataError
from landscape.runtime import DATA_ENV

SMALL_SIGNAL = {"ds": 4, "dn": 6, "n": 200, "n_test": 100}


def assert_same(a: Dataset, b: Dataset) -> None:
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert a.num_classes == b.num_classes and a.spec == b.spec


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits")


def test_registry_has_every_named_data_set():
    assert set(DATASETS) == {"gaussian-signal", "digits", "mnist", "fashion-mnist", "cifar10", "cifar100"}


@pytest.mark.parametrize(
    ("name", "options", "shape", "classes"),
    [("gaussian-signal", SMALL_SIGNAL, (10,), 2), ("digits", {}, (1, 8, 8), 10)],
)
def test_shapes_and_dtypes(name, options, shape, classes):
    data = load_dataset(name, **options)
    assert data.input_shape == shape
    assert data.num_classes == classes
    for x, y in (data.split("train"), data.split("test")):
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        assert x.shape[1:] == shape and x.shape[0] == y.shape[0]
        assert y.min() >= 0 and y.max() == classes - 1
    with pytest.raises(DataError, match="'train' or 'test'"):
        data.split("validation")


def test_gaussian_signal_deterministic_by_seed():
    a = load_dataset("gaussian-signal", seed=3, **SMALL_SIGNAL)
    assert_same(a, load_dataset("gaussian-signal", seed=3, **SMALL_SIGNAL))
    b = load_dataset("gaussian-signal", seed=4, **SMALL_SIGNAL)
    assert not torch.equal(a.x_train, b.x_train) and not torch.equal(a.x_test, b.x_test)


def test_gaussian_signal_train_size_does_not_change_test_set():
    a = load_dataset("gaussian-signal", **SMALL_SIGNAL)
    b = load_dataset("gaussian-signal", **{**SMALL_SIGNAL, "n": 50})
    assert torch.equal(a.x_test, b.x_test) and len(b.y_train) == 50


@pytest.mark.parametrize("key", ["ones", "random"])
def test_gaussian_signal_class_means_match_key_vector(key):
    """Watson et al. eqs. (8)-(9): E[x_s | y] = y v, E[x_n] = 0, per-coordinate variance s^2."""
    ds, dn, n, noise = 5, 7, 4000, 1.5
    data = load_dataset("gaussian-signal", seed=1, ds=ds, dn=dn, n=n, noise=noise, signal=3.0, key=key)
    v = gaussian_signal_key(data).to(torch.float64)
    assert v.norm().item() == pytest.approx(3.0)
    if key == "ones":
        assert torch.allclose(v, torch.full((ds,), 3.0 / ds**0.5, dtype=torch.float64))
    x = data.x_train.to(torch.float64)
    for cls, sign in ((0, -1.0), (1, 1.0)):
        rows = x[data.y_train == cls]
        stderr = noise / rows.shape[0] ** 0.5
        assert rows.shape[0] > n / 3
        assert (rows[:, :ds].mean(0) - sign * v).abs().max() < 5 * stderr
        assert rows[:, ds:].mean(0).abs().max() < 5 * stderr
    centred = x.clone()
    centred[:, :ds] -= (2 * data.y_train.to(torch.float64) - 1)[:, None] * v
    assert centred.var(0).sub(noise**2).abs().max() < 5 * noise**2 * (2 / n) ** 0.5


def test_gaussian_signal_rejects_bad_options():
    for bad in ({"ds": 0}, {"n": 2.5}, {"dn": "many"}, {"noise": -1.0}, {"signal": float("nan")}):
        with pytest.raises(DataError, match=f"option {next(iter(bad))} must be"):
            load_dataset("gaussian-signal", **bad)
    with pytest.raises(DataError, match="seed must be an integer"):
        load_dataset("gaussian-signal", seed="one")
    with pytest.raises(DataError, match="key must be"):
        load_dataset("gaussian-signal", key="zeros")


def test_digits_split_is_fixed_stratified_and_standardised(digits):
    assert len(digits.y_train) + len(digits.y_test) == 1797
    assert len(digits.y_test) == round(0.25 * 1797)
    counts = torch.bincount(torch.cat([digits.y_train, digits.y_test]), minlength=10).double()
    exact = counts * len(digits.y_test) / 1797
    assert (torch.bincount(digits.y_test, minlength=10) - exact).abs().max() <= 1
    assert digits.x_train.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert digits.x_train.std().item() == pytest.approx(1.0, abs=1e-4)
    other_seed = load_dataset("digits", seed=5)
    assert torch.equal(other_seed.x_test, digits.x_test) and torch.equal(other_seed.x_train, digits.x_train)
    other_split = load_dataset("digits", split_seed=1)
    assert not torch.equal(other_split.y_test, digits.y_test)


def test_digits_split_partitions_the_images():
    from sklearn.datasets import load_digits

    raw = load_digits()
    data = load_dataset("digits", standardize=False)
    split = torch.cat([data.x_train, data.x_test]).reshape(1797, -1).numpy()
    labels = torch.cat([data.y_train, data.y_test]).numpy()
    rows = sorted(zip(map(bytes, split.astype(np.float32)), labels.tolist(), strict=True))
    expected = sorted(zip(map(bytes, raw.data.astype(np.float32)), raw.target.tolist(), strict=True))
    assert rows == expected


@pytest.mark.parametrize("subset", [100, 0.1])
def test_subset_is_seeded_stratified_and_recorded(digits, subset):
    a = load_dataset("digits", seed=2, subset=subset)
    assert_same(a, load_dataset("digits", seed=2, subset=subset))
    b = load_dataset("digits", seed=3, subset=subset)
    assert not torch.equal(a.x_train, b.x_train)
    expected = subset if isinstance(subset, int) else round(subset * len(digits.y_train))
    assert len(a.y_train) == expected
    exact = torch.bincount(digits.y_train, minlength=10).double() * expected / len(digits.y_train)
    assert (torch.bincount(a.y_train, minlength=10) - exact).abs().max() <= 1
    assert torch.equal(a.x_test, digits.x_test)
    assert a.spec["subset"] == subset


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6).filter(lambda s: sum(s) > 0),
    data=st.data(),
)
def test_subset_indices_property(sizes, data):
    y = torch.cat([torch.full((n,), c, dtype=torch.int64) for c, n in enumerate(sizes)])
    y = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    count = data.draw(st.integers(1, len(y)))
    idx = subset_indices(y, count, seed=data.draw(st.integers(0, 2**31)))
    assert idx.dtype == torch.int64 and len(idx) == count
    assert torch.equal(idx, idx.unique())
    picked = torch.bincount(y[idx], minlength=len(sizes)).double()
    exact = torch.tensor(sizes, dtype=torch.float64) * count / len(y)
    assert (picked - exact).abs().max() <= 1


@pytest.mark.parametrize("bad", [0, -3, 2000, 0.0, 1.5, -0.1, True, "half", 1e-6])
def test_bad_subset_is_a_data_error(bad):
    with pytest.raises(DataError, match="subset"):
        load_dataset("digits", subset=bad)


def test_unknown_name_and_option_are_data_errors():
    with pytest.raises(DataError, match="unknown data set 'mnst'; known: gaussian-signal, digits, mnist"):
        load_dataset("mnst")
    with pytest.raises(DataError, match="no option 'n'; its options: test_fraction, split_seed, standardize"):
        load_dataset("digits", n=5)
    assert dataset_options("gaussian-signal")["ds"] == 10


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [("gaussian-signal", {**SMALL_SIGNAL, "key": "random", "subset": 0.5, "seed": 7}),
     ("digits", {"subset": 50, "seed": 1, "test_fraction": 0.2})],
)
def test_spec_rebuilds_data_set_after_json_round_trip(name, kwargs):
    data = load_dataset(name, **kwargs)
    spec = json.loads(json.dumps(data.spec))
    assert set(spec) == {"name", "seed", "subset", "options"}
    assert_same(data, dataset_from_spec(spec))


def test_cifar10_without_files_names_both_flags(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)
    for kwargs in ({"data_root": tmp_path}, {}):
        with pytest.raises(DataError) as info:
            load_dataset("cifar10", **kwargs)
        message = str(info.value)
        assert "\n" not in message and "pass data_root" in message and "download=True" in message
    assert list(tmp_path.iterdir()) == []  # nothing was downloaded or created
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    with pytest.raises(DataError, match=str(tmp_path)):
        load_dataset("cifar100")


def _write_idx(path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize(("name", "folder", "mean", "std"),
                         [("mnist", "MNIST", 0.1307, 0.3081), ("fashion-mnist", "FashionMNIST", 0.2860, 0.3530)])
def test_torchvision_files_on_disk_load_as_standardised_tensors(tmp_path, name, folder, mean, std):
    rng = np.random.default_rng(0)
    raw = tmp_path / folder / "raw"
    images = {"train": rng.integers(0, 256, (30, 28, 28)), "t10k": rng.integers(0, 256, (12, 28, 28))}
    labels = {"train": np.arange(30) % 10, "t10k": np.arange(12) % 10}
    for prefix in ("train", "t10k"):
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", images[prefix])
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels[prefix])
    data = load_dataset(name, data_root=tmp_path, subset=20, seed=1)
    assert data.input_shape == (1, 28, 28) and data.num_classes == 10
    assert data.x_train.shape == (20, 1, 28, 28) and data.x_test.shape == (12, 1, 28, 28)
    assert torch.equal(data.y_test, torch.from_numpy(labels["t10k"]).long())
    expected = (torch.from_numpy(images["t10k"]).float() / 255 - mean) / std
    assert torch.allclose(data.x_test[:, 0], expected, atol=1e-6)
    assert torch.bincount(data.y_train, minlength=10).tolist() == [2] * 10
    assert_same(data, dataset_from_spec(data.spec, data_root=tmp_path))


def test_cli_data_options_parse_into_load_dataset_arguments(monkeypatch, tmp_path, capsys):
    """The data-set options of train, phases and import (generated from their fields) parse into load_dataset's
    arguments; a bad value is a usage error, also a --data-kwargs key that is an option of its own."""
    import dataclasses

    from conftest import run_cli

    from cli.generate import field_option
    from cli.options import add_options
    from landscape.options import hints
    from landscape.train.config import TrainConfig

    monkeypatch.delenv(DATA_ENV, raising=False)
    seen = {}
    by_name = {f.name: f for f in dataclasses.fields(TrainConfig)}

    def record(data, data_kwargs, **params):
        seen.update({"name": data, **params, **data_kwargs})

    options = [field_option(by_name[n], hints(TrainConfig)[n]) for n in ("data", "data_kwargs", "subset", "data_root",
                                                                          "download")]
    command = click.command()(add_options(options, record))
    runner = CliRunner()
    result = runner.invoke(command, ["--data", "gaussian-signal", "--data-kwargs", '{"ds": 3}', "--subset", "0.5"])
    assert result.exit_code == 0, result.output
    assert seen == {"name": "gaussian-signal", "subset": 0.5, "data_root": None, "download": False, "ds": 3}
    assert len(load_dataset(**seen).y_train) == 500
    result = runner.invoke(command, ["--subset", "40"], env={DATA_ENV: "/data"})
    assert seen["subset"] == 40 and isinstance(seen["subset"], int) and seen["data_root"] == "/data"
    for bad in (["--data", "no-such-data"], ["--subset", "0"], ["--subset", "1.5"], ["--subset", "x"],
                ["--data-kwargs", "[1]"]):
        result = runner.invoke(command, bad)
        assert result.exit_code == 2, (bad, result.output)
    code, _, err = run_cli("--root", tmp_path, "train", "--data-kwargs", '{"subset": 3}', capsys=capsys)
    assert code == 2 and "--data-kwargs cannot hold subset: give the matching option (--subset)" in err


def test_numpy_subset_from_a_file_is_recorded_as_plain_json():
    a = load_dataset("digits", subset=np.int64(30))
    b = load_dataset("digits", subset=np.float64(0.02))
    assert json.loads(json.dumps(a.spec))["subset"] == 30 and type(a.spec["subset"]) is int
    assert type(b.spec["subset"]) is float and len(b.y_train) == round(0.02 * 1348)


def test_digits_arrays_equal_scikit_learns_load_digits(monkeypatch):
    """The file read without importing sklearn.datasets gives load_digits' arrays exactly; so does the fallback."""
    import importlib.util
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from landscape.data import digits_arrays

    bunch = load_digits()
    images, target = digits_arrays()
    np.testing.assert_array_equal(images, bunch.images)
    np.testing.assert_array_equal(target, bunch.target)
    assert images.dtype == bunch.images.dtype and target.dtype.kind == "i"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # the file "not found": fallback
    images2, target2 = digits_arrays()
    np.testing.assert_array_equal(images2, bunch.images)
    np.testing.assert_array_equal(target2, bunch.target)
    code = ("import sys; from landscape.data import load_dataset; load_dataset('digits'); "
            "print('sklearn.datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
