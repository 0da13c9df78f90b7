"""The store's low-level HDF5 writes (:func:`landscape.store.codec._create_dataset`, :func:`_set_attr`) make exactly
what h5py's high-level calls make: compared object by object (type, shape, bytes, creation properties, attrs)
with files written through ``create_dataset(name, data=...)`` and ``attrs[name] = ...``."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from landscape.errors import CheckpointError, UsageError
from landscape.store import Store, load_checkpoint
from landscape.store.codec import _create_dataset, _set_attr

ARRAYS = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "f64 scalar": np.array(2.5),
    "f16": np.linspace(0, 1, 5, dtype=np.float16),
    "big-endian": np.arange(4, dtype=">f4"),
    "int8": np.array([-3, 0, 7], dtype=np.int8),
    "uint64": np.array([2**63 + 5], dtype=np.uint64),
    "bool": np.array([[True, False], [False, True]]),
    "complex": np.array([1 + 2j, -3j], dtype=np.complex64),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "strided": np.arange(20, dtype=np.int32).reshape(4, 5)[:, ::2],  # not contiguous: written as C order
    "nested/a/b": np.ones(2, dtype=np.int16),  # '/' makes the groups on the way
    "bytes": np.array([b"ab", b"c"]),  # not numeric: h5py's own call
    "structured": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),  # fields: h5py's own call
}
ATTRS = {"text": "landscape-checkpoint/1", "unicode": "ε = 1.5 → δ", "empty": "", "int": 7, "neg": -2**40,
         "float": 0.1, "nan": float("nan"), "numpy float": np.float32(1.5), "bool": True, "array": np.arange(3.0),
         "list": [1, 2, 3], "bytes": b"raw", "strings": ["a", "b"]}


def _plist(dataset: h5py.Dataset) -> tuple:
    """How a dataset was created: its creation properties as stored, its storage, whether its times were recorded
    (a reopened file's property list does not say: the object header's ctime is 0 when they were not)."""
    p, info = dataset.id.get_create_plist(), h5py.h5o.get_info(dataset.id)
    return (p.get_layout(), p.get_nfilters(), p.get_fill_time(), p.get_alloc_time(), p.get_attr_creation_order(),
            p.fill_value_defined(), dataset.id.get_storage_size(), info.ctime == 0, info.mtime == 0, info.rc,
            info.num_attrs)


def _same(a: h5py.HLObject, b: h5py.HLObject, where: str = "/") -> None:
    assert list(a.attrs) == list(b.attrs), where
    for name in a.attrs:
        ta, tb = a.attrs.get_id(name).get_type(), b.attrs.get_id(name).get_type()
        assert ta.equal(tb) and ta.get_class() == tb.get_class(), (where, name)
        assert a.attrs.get_id(name).shape == b.attrs.get_id(name).shape, (where, name)
        va, vb = a.attrs[name], b.attrs[name]
        assert type(va) is type(vb), (where, name)
        np.testing.assert_array_equal(va, vb)
    if isinstance(a, h5py.Group):
        assert list(a) == list(b), where
        assert type(a) is type(b)
        for name in a:
            assert type(a[name]) is type(b[name]), (where, name)
            _same(a[name], b[name], f"{where}{name}/")
    else:
        assert a.id.get_type().equal(b.id.get_type()), where
        assert a.shape == b.shape and a.dtype == b.dtype, where
        assert _plist(a) == _plist(b), where
        assert a[()].tobytes() == b[()].tobytes(), where


def test_low_level_writes_make_what_h5py_makes(tmp_path):
    with h5py.File(tmp_path / "ours.h5", "w", track_order=True) as ours, \
            h5py.File(tmp_path / "h5py.h5", "w", track_order=True) as theirs:
        for f in (ours, theirs):
            f.create_group("g", track_order=True)
        for name, array in ARRAYS.items():
            _create_dataset(ours["g"], name, array, "float32")
            theirs["g"].create_dataset(name, data=array).attrs["torch_dtype"] = "float32"
        for name, value in ATTRS.items():
            _set_attr(ours, name, value)
            theirs.attrs[name] = value
        _set_attr(ours, "int", 8)  # a second write replaces the first, as attrs[...] = does
        theirs.attrs["int"] = 8
    with h5py.File(tmp_path / "ours.h5", "r") as ours, h5py.File(tmp_path / "h5py.h5", "r") as theirs:
        _same(ours, theirs)
        assert ours["g/nested/a/b"].shape == (2,) and ours["g/strided"][()].tolist() == [[0, 2, 4], [5, 7, 9],
                                                                                          [10, 12, 14],
                                                                                          [15, 17, 19]]


def test_a_checkpoint_written_through_the_store_reads_back_bit_exactly(tmp_path):
    state = {"w": torch.randn(3, 4), "half": torch.randn(5).to(torch.bfloat16), "count": torch.tensor(3),
             "mask": torch.tensor([True, False]), "empty": torch.zeros(0, 2, dtype=torch.float64)}
    run = Store(tmp_path).create_run("r", config={}, seeds={}, model_spec={}, data_spec={})
    path = run.save_checkpoint(state, step=4, epoch=0.5, epsilon=1.25, metrics={"loss": 0.5},
                               extra={"optimizer": {"0/momentum_buffer": torch.ones(3)}, "rng": np.arange(4)})
    ckpt = load_checkpoint(path)
    for key, tensor in state.items():
        got = ckpt.state_dict[key]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape
        assert torch.equal(got.view(torch.int16) if got.dtype == torch.bfloat16 else got,
                           tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor)
    assert (ckpt.step, ckpt.epoch, ckpt.epsilon, ckpt.metrics) == (4, 0.5, 1.25, {"loss": 0.5})
    with h5py.File(path, "r") as f:
        assert isinstance(f.attrs["format"], str) and f.attrs["step"].dtype == np.int64
        assert f["state_dict/half"].attrs["torch_dtype"] == "bfloat16"
        assert f["state_dict/half"].dtype == np.int16
        assert f["extra/optimizer/0/momentum_buffer"][()].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("value", [object(), np.array([object()], dtype=object)])
def test_what_h5py_refuses_is_still_refused(tmp_path, value):
    with h5py.File(tmp_path / "x.h5", "w") as f, pytest.raises(TypeError):
        _set_attr(f, "bad", value)


def test_a_save_rereads_the_manifest_only_when_someone_else_may_have_written(tmp_path, monkeypatch):
    """Run._writing: a run that holds its lock and made the last write keeps its manifest (no re-parse of the
    whole trajectory per save); a write by another Run object of the process, or a failed write, makes the next
    one read the file again, so nothing anyone wrote is lost."""
    import landscape.store.core as core

    reads = []
    real = core._read_manifest
    monkeypatch.setattr(core, "_read_manifest", lambda path: reads.append(path) or real(path))
    store = Store(tmp_path)
    first = store.create_run("r", config={}, seeds={}, model_spec={}, data_spec={})
    state = {"w": torch.zeros(2)}
    for step in range(3):
        first.save_checkpoint(state, step=step, epoch=step)
    assert len(reads) == 2  # the run's creation, then the first write (made under a lock taken before it)
    second = store.open_run("r")  # this process re-enters the lock: a second writer of the same run
    n = len(reads)
    second.save_checkpoint(state, step=10, epoch=10)
    second.update_manifest(note="from the second")
    assert len(reads) == n  # it made the last write through this lock itself
    first.save_checkpoint(state, step=3, epoch=3)  # must see step 10 and the note
    assert len(reads) == n + 1
    assert [e["step"] for e in first.manifest["checkpoints"]] == [0, 1, 2, 3, 10]
    assert first.manifest["note"] == "from the second"
    with pytest.raises(CheckpointError, match="checkpoints"):  # a failed write: its in-memory manifest is not kept
        first.manifest["checkpoints"] = "damaged in memory"
        first.update_manifest(note="x")
    first.save_checkpoint(state, step=4, epoch=4)
    assert len(reads) == n + 2
    on_disk = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert [e["step"] for e in on_disk["checkpoints"]] == [0, 1, 2, 3, 4, 10]
    second.close()
    first.close()


def _checkpoint(seed: int, **change):
    """A checkpoint's state and extra as the recorder's writer process holds them (TensorData, numpy arrays)."""
    from landscape.store import TensorData

    rng = np.random.default_rng(seed)
    state = {"conv.weight": TensorData(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "float32"),
             "norm.running": TensorData(rng.integers(0, 9, 5).astype(np.int16), "bfloat16"),
             "count": TensorData(np.array(seed, dtype=np.int64), "int64")}
    extra = {"optimizer": {"0/momentum_buffer": rng.standard_normal(7), "1/step": np.array(3.0)},
             "rng": {"cpu": rng.integers(0, 255, 16).astype(np.uint8)}, "empty": {}, "mask": np.array([True])}
    for key, value in change.items():
        state[key] = value
    return state, extra


def _write_both(tmp_path, monkeypatch, prepare_from, state, extra, name):
    import landscape.store.core as core

    monkeypatch.setattr(core, "_now", lambda: "2026-11-26T00:00:00+00:00")
    plain = Store(tmp_path / f"plain-{name}").create_run("r", config={}, seeds={}, model_spec={}, data_spec={})
    plain.save_checkpoint(state, step=5, epoch=1.0, metrics={"loss": 0.25}, extra=extra)
    run = Store(tmp_path / f"prepared-{name}").create_run("r", config={}, seeds={}, model_spec={}, data_spec={})
    prepared = run.prepare_checkpoint(*prepare_from)
    assert prepared is not None and prepared.tmp.exists() and prepared.tmp.name.startswith(".next-checkpoint.h5.")
    run.save_checkpoint(state, step=5, epoch=1.0, metrics={"loss": 0.25}, extra=extra, prepared=prepared)
    assert not prepared.tmp.exists() and sorted(p.name for p in run.path.iterdir()) == [
        ".lock", "manifest.json", "step-000005.h5"]
    with h5py.File(plain.path / "step-000005.h5", "r") as a, h5py.File(run.path / "step-000005.h5", "r") as b:
        _same(a, b)
    assert run.checkpoints()[0].sha256 == Store(run.path.parent).load("r@last").sha256  # the manifest's hash holds
    return plain, run


def test_a_prepared_checkpoint_file_holds_what_a_plain_write_gives(tmp_path, monkeypatch):
    """Run.prepare_checkpoint + save_checkpoint(prepared=...): made from the previous checkpoint's arrays (other
    numbers, the same layout), filled with the next one's: object for object, each dataset's bytes, what
    save_checkpoint writes without it."""
    _write_both(tmp_path, monkeypatch, _checkpoint(1), *_checkpoint(2), name="same")


@pytest.mark.parametrize("change", ["shape", "dtype", "torch dtype", "key", "one more", "one fewer", "nesting"])
def test_a_checkpoint_of_another_layout_is_written_plainly_and_the_prepared_file_removed(tmp_path, monkeypatch,
                                                                                            change):
    from landscape.store import TensorData

    state, extra = _checkpoint(2)
    if change == "shape":
        state["conv.weight"] = TensorData(np.zeros((4, 3, 3, 2), dtype=np.float32), "float32")
    elif change == "dtype":
        extra["optimizer"]["1/step"] = np.array(3, dtype=np.int64)
    elif change == "torch dtype":
        state["norm.running"] = TensorData(state["norm.running"].array, "int16")
    elif change == "key":
        state = {("conv.w" if k == "conv.weight" else k): v for k, v in state.items()}
    elif change == "one more":
        extra["rng"]["cuda"] = np.zeros(2, dtype=np.uint8)
    elif change == "one fewer":
        del extra["empty"]
    else:  # the same arrays, nested otherwise
        extra["rng"] = {"cpu": {"state": extra["rng"]["cpu"]}}
    _write_both(tmp_path, monkeypatch, _checkpoint(1), state, extra, name=change.replace(" ", "-"))


def test_a_prepared_file_is_refused_for_non_numeric_arrays_and_removed_on_errors(tmp_path):
    run = Store(tmp_path).create_run("r", config={}, seeds={}, model_spec={}, data_spec={})
    state = {"w": torch.ones(2)}
    assert run.prepare_checkpoint(state, {"names": np.array([b"a", b"b"])}) is None  # h5py's own call writes it
    assert not any(p.name.endswith(".tmp") for p in run.path.iterdir())
    prepared = run.prepare_checkpoint(state)
    with pytest.raises(UsageError, match="state_dict keys must be strings"):
        run.save_checkpoint({0: torch.ones(2)}, step=0, epoch=0, prepared=prepared)
    assert not prepared.tmp.exists() and run.checkpoints() == []
    left = run.prepare_checkpoint(state)  # a writer killed while holding one: swept when the run is reopened
    left.file.close()
    run.close()
    reopened = Store(tmp_path).open_run("r")
    assert not left.tmp.exists()
    reopened.close()
