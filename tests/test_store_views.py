"""The api behind `store ls`, `store show`, `show` and `import` (landscape/api/store_views.py), called directly.

References are independent of the module: the run's own manifest and the HDF5 file hash (``hashlib``), the
model's state dict (names, shapes, element counts), the arrays written to the result file, numpy's min/max.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

import landscape.api as api
from landscape.data import load_dataset
from landscape.models import build_model
from landscape.results import write_result
from landscape.store import Store


@pytest.fixture(scope="module")
def digits_mlp():
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes, widths=[8])
    return data, model


@pytest.fixture
def store(tmp_path, digits_mlp):
    data, model = digits_mlp
    st = Store(tmp_path / "root")
    for name in ("a", "b", "c"):
        run = st.create_run(name, config={}, seeds={"seed": 0}, model_spec=model.landscape_spec,
                            data_spec=data.spec)
        run.save_checkpoint(model.state_dict(), step=0, epoch=0.0, metrics={"test_acc": 0.1})
        run.save_checkpoint(model.state_dict(), step=40, epoch=2.0, epsilon=1.5,
                            metrics={"test_acc": 0.85, "test_loss": 0.4})
    return st


def test_runs_rows_equal_the_manifests_and_report_a_damaged_run(store):
    (store.root / "b" / "manifest.json").write_text('{"checkpoints": [')  # truncated
    listing = api.runs(store.root)
    assert listing["root"] == str(store.root)
    assert [r["name"] for r in listing["runs"]] == ["a", "c"]
    assert [d["name"] for d in listing["damaged"]] == ["b"]
    assert str(store.root / "b" / "manifest.json") in listing["damaged"][0]["error"]
    manifest = json.loads((store.root / "a" / "manifest.json").read_text())
    row = listing["runs"][0]
    assert row["steps"] == [c["step"] for c in manifest["checkpoints"]] == [0, 40]
    assert row["last_epoch"] == 2.0 and row["epsilon"] == 1.5
    assert row["final_metrics"] == manifest["checkpoints"][-1]["metrics"] == {"test_acc": 0.85, "test_loss": 0.4}
    assert row["model"] == "mlp" and row["data"] == "digits"
    assert api.runs(store.root, pattern="c")["runs"][0]["name"] == "c"
    assert api.runs(store.root / "absent") == {"root": str(store.root / "absent"), "runs": [], "damaged": []}


def test_checkpoint_describes_the_state_dict_and_file(store, digits_mlp):
    _, model = digits_mlp
    info = api.checkpoint("a@init", store.root)
    sd = model.state_dict()
    assert [t["name"] for t in info["tensors"]] == list(sd)
    assert [t["shape"] for t in info["tensors"]] == [list(v.shape) for v in sd.values()]
    assert info["parameters"] == sum(v.numel() for v in sd.values())
    assert info["step"] == 0 and info["run"] == "a" and info["metrics"] == {"test_acc": 0.1}
    with open(info["path"], "rb") as f:
        assert info["sha256"] == hashlib.sha256(f.read()).hexdigest()
    assert api.checkpoint("a", store.root)["step"] == 40  # RUN alone is @last


def test_import_round_trip_is_bit_exact(tmp_path, digits_mlp):
    _, model = digits_mlp
    source = tmp_path / "w.pt"
    torch.save({f"_module.{k}": v for k, v in model.state_dict().items()}, source)
    done = api.import_checkpoint(source, run="imp", model="mlp", model_kwargs={"widths": [8]}, data="digits",
                                 root=tmp_path / "root")
    assert done["ref"] == "imp@init" and done["tensors"] == len(model.state_dict())
    ckpt = Store(tmp_path / "root").load("imp@init")
    assert str(ckpt.path) == done["path"] and ckpt.sha256 == done["sha256"]
    for k, v in model.state_dict().items():
        assert ckpt.state_dict[k].dtype == v.dtype and torch.equal(ckpt.state_dict[k], v)
    assert ckpt.model_spec == model.landscape_spec


def test_show_summarises_a_result_file(tmp_path):
    values = np.array([3.0, np.nan, -1.5])
    big = np.arange(100.0).reshape(10, 10)
    path = write_result(tmp_path / "r.h5", "interpolation", arrays={"loss": values, "grid": big},
                        attrs={"points": 3})
    info = api.show(path)
    assert info["kind"] == "interpolation" and info["attrs"]["points"] == 3
    assert info["arrays"]["grid"] == {"shape": [10, 10], "dtype": "float64"}
    assert set(info["values"]) == {"loss"} and np.array_equal(info["values"]["loss"], values, equal_nan=True)
    assert info["stats"]["loss"] == {"min": -1.5, "max": 3.0}
    assert info["stats"]["grid"] == {"min": float(big.min()), "max": float(big.max())}
