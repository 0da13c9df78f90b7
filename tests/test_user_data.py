"""Data from files and user code: tensor files (.npz / HDF5), ImageFolder trees, torchvision sets by name,
data factories (tensors or torch Datasets) and entry points; their specs record where the data came from and
rebuilding checks it."""

from __future__ import annotations

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import run_cli
from test_user_models import one_error

from landscape import plugins
from landscape.api.training import train as api_train
from landscape.data import dataset_from_spec, directory_digest, load_dataset
from landscape.errors import DataError, ModelError
from landscape.models import build_model, model_from_spec
from landscape.plugins import sha256_file
from landscape.train.config import TrainConfig

USER = Path(__file__).with_name("user_models.py").resolve()


def arrays(n=30, n_test=12, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return {"x_train": rng.standard_normal((n, 4)).astype(np.float32), "y_train": np.arange(n) % classes,
            "x_test": rng.standard_normal((n_test, 4)).astype(np.float32), "y_test": np.arange(n_test) % classes}


# ------------------------------------------------------------------------------------------ tensor files


@pytest.mark.parametrize("suffix", [".npz", ".h5"])
def test_tensor_files_load_record_their_sha256_and_rebuild(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    a = arrays()
    if suffix == ".npz":
        np.savez(path, **a)
    else:
        with h5py.File(path, "w") as f:
            for k, v in a.items():
                f[k] = v
    data = load_dataset(str(path), subset=12, seed=1)
    assert data.spec["source"] == {"path": str(path.resolve()), "sha256": sha256_file(path)}
    assert data.num_classes == 3 and data.x_test.dtype == torch.float32
    torch.testing.assert_close(data.x_test, torch.from_numpy(a["x_test"]))
    again = dataset_from_spec(data.spec)
    assert again.spec == data.spec and torch.equal(again.x_train, data.x_train)
    moved = tmp_path / "moved"
    moved.mkdir()
    path.rename(moved / path.name)
    with pytest.raises(DataError, match="not found"):
        dataset_from_spec(data.spec)
    assert torch.equal(dataset_from_spec(data.spec, data_root=moved).x_train, data.x_train)  # found by name
    (moved / path.name).write_bytes((moved / path.name).read_bytes() + b"\0")
    with pytest.raises(DataError, match="changed since it was recorded"):
        dataset_from_spec(data.spec, data_root=moved)


@pytest.mark.parametrize("change, words", [
    (lambda a: a.pop("y_test"), "has no y_test"),
    (lambda a: a.update(y_train=a["y_train"][:-1]), "x_train has 30 examples but y_train has 29"),
    (lambda a: a.update(y_train=a["y_train"].astype(np.float32)), "integer class labels"),
    (lambda a: a.update(y_test=-a["y_test"] - 1), "class indices >= 0"),
    (lambda a: a.update(x_test=a["x_test"][:, :3]), "train examples have shape [4] but test examples [3]"),
])
def test_bad_tensor_files_are_one_line(tmp_path, capsys, change, words):
    a = arrays()
    change(a)
    np.savez(tmp_path / "bad.npz", **a)
    with pytest.raises(DataError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_dataset(str(tmp_path / "bad.npz"))
    code, _, err = run_cli("--root", tmp_path / "ck", "train", "--data", tmp_path / "bad.npz", "--model", "mlp",
                           "--run", "x", capsys=capsys)
    assert code == 1 and words in one_error(err) and not (tmp_path / "ck" / "x").exists()


def test_missing_tensor_file_is_one_line(tmp_path, capsys):
    code, _, err = run_cli("--root", tmp_path / "ck", "train", "--data", tmp_path / "absent.npz", capsys=capsys)
    assert code == 1 and "not found" in one_error(err)


def test_integer_inputs_are_token_ids(tmp_path):
    a = arrays()
    a["x_train"] = np.arange(30 * 5).reshape(30, 5) % 7
    a["x_test"] = np.arange(12 * 5).reshape(12, 5) % 7
    np.savez(tmp_path / "tokens.npz", **a)
    data = load_dataset(str(tmp_path / "tokens.npz"))
    assert data.x_train.dtype == torch.int64 and data.input_shape == (5,)


# ------------------------------------------------------------------------------------------ image folders


def _image_tree(root: Path, sizes=((6, 6),)) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", 3), ("test", 2)):
        for cls in ("cat", "dog"):
            folder = root / split / cls
            folder.mkdir(parents=True)
            for i in range(count):
                h, w = sizes[i % len(sizes)]
                Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def test_imagefolder_reads_both_splits_and_checks_the_tree(tmp_path):
    from PIL import Image

    root = tmp_path / "images"
    _image_tree(root)
    data = load_dataset("imagefolder", data_root=root, standardize=False)
    assert data.input_shape == (3, 6, 6) and data.num_classes == 2 and len(data.y_train) == 6
    first = np.asarray(Image.open(root / "train" / "cat" / "0.png"), dtype=np.float32) / 255
    np.testing.assert_allclose(data.x_train[0].permute(1, 2, 0).numpy(), first)
    assert data.y_train.tolist() == [0, 0, 0, 1, 1, 1]
    assert data.spec["source"] == directory_digest(root) and data.spec["source"]["files"] == 10
    standardized = load_dataset("imagefolder", data_root=root)
    assert abs(float(standardized.x_train[:, 0].mean())) < 1e-5
    assert torch.equal(dataset_from_spec(standardized.spec).x_test, standardized.x_test)  # the recorded path
    (root / "test" / "dog" / "9.png").write_bytes((root / "test" / "dog" / "0.png").read_bytes())
    with pytest.raises(DataError, match="changed since it was recorded"):
        dataset_from_spec(standardized.spec)


def test_imagefolder_errors(tmp_path):
    root = tmp_path / "mixed"
    _image_tree(root, sizes=((6, 6), (5, 7)))
    with pytest.raises(DataError, match="different sizes.*size"):
        load_dataset("imagefolder", data_root=root)
    assert load_dataset("imagefolder", data_root=root, size=4).input_shape == (3, 4, 4)
    with pytest.raises(DataError, match="not found"):
        load_dataset("imagefolder", data_root=tmp_path / "empty-dir-x")
    (tmp_path / "only").mkdir()
    with pytest.raises(DataError, match="missing"):
        load_dataset("imagefolder", data_root=tmp_path / "only")


# ------------------------------------------------------------------------------ torchvision sets by name


def _idx(path: Path, array: np.ndarray) -> None:
    """An MNIST-format (idx) file: magic (0, 0, type 0x08 = uint8, ndim), big-endian sizes, the bytes."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_a_torchvision_set_by_name_from_data_root(tmp_path):
    raw = tmp_path / "KMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (20, 28, 28))
    labels = np.arange(20) % 10
    for prefix, n in (("train", 20), ("t10k", 8)):
        _idx(raw / f"{prefix}-images-idx3-ubyte", images[:n])
        _idx(raw / f"{prefix}-labels-idx1-ubyte", labels[:n])
    data = load_dataset("kmnist", data_root=tmp_path, standardize=False)
    assert data.input_shape == (1, 28, 28) and data.num_classes == 10 and len(data.y_test) == 8
    np.testing.assert_allclose(data.x_train[:, 0].numpy(), images / 255, rtol=1e-6)
    assert data.spec["source"]["class"] == "KMNIST" and data.spec["source"]["files"] == 4
    assert torch.equal(dataset_from_spec(data.spec, data_root=tmp_path).x_train, data.x_train)


def test_a_torchvision_set_without_files_is_one_line(tmp_path, capsys):
    with pytest.raises(DataError, match="svhn files not found under .*download=True"):
        load_dataset("svhn", data_root=tmp_path)
    code, _, err = run_cli("--root", tmp_path / "ck", "train", "--data", "svhn", "--data-root", tmp_path,
                           capsys=capsys)
    assert code == 1 and "not found" in one_error(err)
    code, _, err = run_cli("--root", tmp_path / "ck", "train", "--data", "no-such-set", capsys=capsys)
    assert code == 2 and "no-such-set" in one_error(err)


# ----------------------------------------------------------------------------------------- data factories


def test_data_factories_return_tensors_or_datasets():
    seq = load_dataset(f"{USER}:sequences", seed=3, n=10, n_test=5)
    x_tr, y_tr, x_te, y_te = plugins.load(f"{USER}:sequences")(seed=3, n=10, n_test=5)
    assert torch.equal(seq.x_train, x_tr) and torch.equal(seq.y_test, y_te)
    assert seq.spec["code"]["sha256"] == sha256_file(USER) and seq.spec["options"] == {"n": 10, "n_test": 5}
    imgs = load_dataset(f"{USER}:images", n=9, n_test=6, side=4)
    assert imgs.num_classes == 3 and imgs.input_shape == (3, 4, 4)
    splits = load_dataset(f"{USER}:dataset_splits")
    expected = plugins.load(f"{USER}:images")(0, n=20, n_test=10, side=8)
    assert torch.equal(splits.x_train, expected["x_train"]) and torch.equal(splits.y_test, expected["y_test"])
    with pytest.raises(plugins.PluginError, match="pass code="):
        dataset_from_spec(splits.spec)
    with plugins.trusting([f"{USER}:dataset_splits"]):
        assert torch.equal(dataset_from_spec(splits.spec).x_test, splits.x_test)


@pytest.mark.parametrize("body, words", [
    ("return 3", "returned a int"),
    ("return ([1], [0], [1], [0])", "one row per example"),
    ("return {'x_train': 1}", "without x_train"),
    ("return [(torch.zeros(2), 'a')], [(torch.zeros(2), 0)]", r"item 0 of the train Dataset is \(Tensor, str\)"),
    ("return [torch.zeros(2)], [(torch.zeros(2), 0)]", "item 0 of the train Dataset is a Tensor"),
    ("raise KeyError('k')", "the factory failed: KeyError"),
])
def test_bad_data_factories_are_one_line(tmp_path, body, words):
    path = tmp_path / "make_data.py"
    path.write_text(f"import torch\ndef make(seed):\n    {body}\n")
    with pytest.raises(DataError, match=words):
        load_dataset(f"{path}:make")


def test_train_and_analyse_on_data_from_code(tmp_path, capsys):
    root = tmp_path / "ck"
    code = f"{USER}:images"
    api_train(TrainConfig(model="mlp", model_kwargs={"widths": [8]}, data=code, data_kwargs={"side": 4, "n": 24},
                          epochs=1, batch_size=8, run="a", checkpoint_every="none"), root=root)
    status, _, err = run_cli("--root", root, "calibration", "a@last", "--no-figure", capsys=capsys)
    assert status == 2 and f"pass --code {code}" in one_error(err)
    status, _, err = run_cli("--root", root, "--code", code, "calibration", "a@last", "--no-figure", capsys=capsys)
    assert status == 0, err


# ------------------------------------------------------------------------------------------- entry points


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A package ``toy_landscape_plugin`` 1.0 registering a model and a data set through entry points."""
    site = tmp_path / "site"
    (site / "toy_landscape_plugin").mkdir(parents=True)
    (site / "toy_landscape_plugin" / "__init__.py").write_text(
        "import torch\nfrom torch import nn\n"
        "def model(input_shape, num_classes, hidden=5):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], hidden), nn.Linear(hidden, num_classes))\n"
        "def data(seed=0):\n"
        "    g = torch.Generator().manual_seed(seed)\n"
        "    return torch.randn(12, 3, generator=g), torch.arange(12) % 2, torch.randn(4, 3, generator=g), "
        "torch.arange(4) % 2\n")

    def version(v):
        dist = site / "toy_landscape_plugin-1.0.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: toy-landscape-plugin\nVersion: {v}\n")
        (dist / "entry_points.txt").write_text("[landscape.models]\ntoy-net = toy_landscape_plugin:model\n\n"
                                               "[landscape.datasets]\ntoy-data = toy_landscape_plugin:data\n")

    version("1.0")
    monkeypatch.syspath_prepend(str(site))
    yield version
    sys.modules.pop("toy_landscape_plugin", None)


def test_entry_points_are_names_of_the_registry(installed):
    data = load_dataset("toy-data", seed=2)
    assert data.spec["entry_point"]["package"] == "toy-landscape-plugin" and data.spec["entry_point"]["version"] == "1.0"
    model = build_model("toy-net", input_shape=data.input_shape, num_classes=data.num_classes, hidden=4)
    spec = model.landscape_spec
    assert spec["entry_point"]["value"] == "toy_landscape_plugin:model" and spec["kwargs"]["hidden"] == 4
    assert model_from_spec(spec).landscape_spec == spec  # installed code needs no --code
    assert torch.equal(dataset_from_spec(data.spec).x_train, data.x_train)
    installed("2.0")
    with pytest.raises(plugins.CodeChangedError, match="1.0 when recorded.*2.0 now"):
        model_from_spec(spec)
    with pytest.raises(plugins.CodeChangedError):
        dataset_from_spec(data.spec)
    with plugins.trusting(accept_changed=True):
        assert model_from_spec(spec).landscape_spec["entry_point"]["accepted_change_from"] == "1.0"


def test_a_stored_entry_point_that_is_not_installed_is_refused():
    spec = {"name": "gone", "kwargs": {"input_shape": [3], "num_classes": 2},
            "entry_point": {"package": "gone", "version": "1"}}
    with pytest.raises(plugins.PluginError, match="no installed package provides 'gone'"):
        model_from_spec(spec)
    with pytest.raises(ModelError, match="unknown model"):
        model_from_spec({"name": "gone", "kwargs": {"input_shape": [3], "num_classes": 2}})
