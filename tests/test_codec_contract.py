"""The analysis contract of the result codec: a toy analysis result with vector columns round-trips (checked
against the datasets h5py reads, not only the codec's own reading), and a field the codec cannot store is
refused when the class is defined, saying how to store it."""

import dataclasses
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from landscape.results import StoredResult, read_result, stored


@dataclasses.dataclass
class _Row:
    ref: str
    loss: float
    coords: list[float]              # a fixed-length vector per row: a rows x 3 dataset
    spectrum: np.ndarray             # likewise, as an array
    counts: tuple[int, ...] = ()


@dataclasses.dataclass
class _ToyResult(StoredResult):
    KIND = "toy-vector"
    rows: list[_Row] = stored("table", count="checkpoints", default_factory=list)
    weights: list[float] = dataclasses.field(default_factory=list)   # a vector outside a table: a 1-D dataset
    note: str | None = None


def _toy() -> _ToyResult:
    rows = [_Row("a@1", 0.5, [1.0, 2.0, 3.0], np.array([0.25, -1.0]), (1, 2)),
            _Row("a@2", 0.25, [4.0, 5.5, 6.0], np.array([0.5, 2.0]), (3, 4))]
    return _ToyResult(rows=rows, weights=[0.1, 0.9], note="n")


def test_vector_columns_round_trip_as_2d_datasets(tmp_path):
    toy = _toy()
    path = toy.to_hdf5(tmp_path / "toy.h5")
    with h5py.File(path) as f:  # what is on disk, read without the codec
        assert f["coords"].shape == (2, 3) and f["coords"].dtype == np.float64
        np.testing.assert_array_equal(f["coords"][()], [[1.0, 2.0, 3.0], [4.0, 5.5, 6.0]])
        np.testing.assert_array_equal(f["spectrum"][()], [[0.25, -1.0], [0.5, 2.0]])
        assert f["counts"].shape == (2, 2) and f["counts"].dtype == np.int64
        np.testing.assert_array_equal(f["weights"][()], [0.1, 0.9])
        assert f.attrs["checkpoints"] == 2 and f.attrs["note"] == "n"
        assert json.loads(f.attrs["table"]) == ["ref", "loss", "coords", "spectrum", "counts"]
    back = _ToyResult.from_hdf5(path)
    assert [r.ref for r in back.rows] == ["a@1", "a@2"] and back.note == "n" and back.path == Path(path)
    for got, want in zip(back.rows, toy.rows, strict=True):
        assert isinstance(got.coords, list) and isinstance(got.counts, tuple) and got.counts == want.counts
        np.testing.assert_array_equal(got.coords, want.coords)
        np.testing.assert_array_equal(got.spectrum, want.spectrum)
    assert back.weights == [0.1, 0.9]
    frame = read_result(path).to_frame()
    assert list(frame.columns) == ["ref", "loss", "coords[0]", "coords[1]", "coords[2]", "spectrum[0]",
                                   "spectrum[1]", "counts[0]", "counts[1]"]
    assert frame["coords[1]"].tolist() == [2.0, 5.5] and frame["ref"].tolist() == ["a@1", "a@2"]


def test_empty_table_with_a_vector_column_round_trips(tmp_path):
    path = _ToyResult(weights=[1.0]).to_hdf5(tmp_path / "empty.h5")
    back = _ToyResult.from_hdf5(path)
    assert back.rows == [] and back.weights == [1.0]


@pytest.mark.parametrize("annotation", ["set[int]", "Path", "list[str]", "dict[str, float]", "object"])
def test_a_field_the_codec_cannot_store_is_refused_when_the_class_is_defined(annotation):
    namespace = {"Path": Path}
    source = f"""
import dataclasses
from landscape.results import StoredResult

@dataclasses.dataclass
class Bad(StoredResult):
    KIND = "bad"
    ok: float = 0.0
    extra: {annotation} = None
"""
    with pytest.raises(TypeError, match=r"Bad field 'extra': type .* cannot be stored; use np.ndarray or stored\(\.\.\.\)"):
        exec(compile(source, "<bad>", "exec"), namespace)


def test_a_row_field_the_codec_cannot_store_is_refused_with_its_result_class():
    @dataclasses.dataclass
    class Row:
        ref: str
        when: Path   # neither a scalar, an array nor a numeric vector

    with pytest.raises(TypeError, match=r"Row field 'when': type .* cannot be stored; use np.ndarray or stored"):
        @dataclasses.dataclass
        class Result(StoredResult):
            rows: list[Row] = stored("table", default_factory=list)


def test_stored_metadata_makes_any_type_acceptable():
    @dataclasses.dataclass
    class Result(StoredResult):
        extra: set[int] = stored("skip", default_factory=set)
        labels: list[str] = stored("array", default_factory=list)

    assert Result().extra == set()
