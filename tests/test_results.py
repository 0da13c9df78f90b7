"""The shared result schema and the `show` command."""

import json
import subprocess
import sys
from dataclasses import dataclass

import h5py
import numpy as np
import pytest
import torch

from landscape.errors import ResultError
from landscape.results import InputRef, read_result, sha256_file, to_jsonable, write_result


@dataclass
class _Cfg:
    points: int = 30
    splits: tuple = ("train", "test")


def test_write_read_round_trip(tmp_path):
    src = tmp_path / "a.bin"
    src.write_bytes(b"abc")
    ref = InputRef.of("run@last", src)
    assert ref.sha256 == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # sha256("abc")
    out = write_result(
        tmp_path / "r.h5", "interpolation",
        arrays={"alpha": np.linspace(0, 1, 5), "group/x": torch.arange(3)},
        attrs={"instability": float("inf"), "flag": True, "note": None, "dims": [1, 2]},
        params=_Cfg(), inputs=[ref],
    )
    res = read_result(out, "interpolation")
    assert res.kind == "interpolation"
    np.testing.assert_array_equal(res.arrays["alpha"], np.linspace(0, 1, 5))
    np.testing.assert_array_equal(res.arrays["group/x"], [0, 1, 2])
    assert res.attrs["instability"] == float("inf") and res.attrs["flag"] is True
    assert res.attrs["note"] == "none" and json.loads(res.attrs["dims"]) == [1, 2]
    assert res.params == {"points": 30, "splits": ["train", "test"]}
    assert res.inputs == [ref]
    assert res.attrs["landscape_version"].startswith("0.")
    assert not list(tmp_path.glob(".r.h5.*"))  # no temporary file left behind


def test_wrong_kind_and_bad_files(tmp_path):
    out = write_result(tmp_path / "r.h5", "ntk", arrays={})
    with pytest.raises(ResultError, match="holds a 'ntk' result"):
        read_result(out, "interpolation")
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5")
    with pytest.raises(ResultError, match="junk.h5"):
        read_result(junk)
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["x"] = [1]
    with pytest.raises(ResultError, match="not a landscape result"):
        read_result(tmp_path / "plain.h5")
    with pytest.raises(ValueError, match="reserved"):
        write_result(tmp_path / "s.h5", "x", arrays={}, attrs={"kind": "y"})


def test_to_jsonable_handles_numpy_torch_and_nonfinite():
    assert to_jsonable({"a": np.float32(1.5), "b": torch.tensor([1, 2]), "c": float("nan")}) == {
        "a": 1.5, "b": [1, 2], "c": "nan"}
    assert sha256_file  # imported for InputRef; covered above


def _landscape(*args):
    return subprocess.run([sys.executable, "-m", "landscape", *args], capture_output=True, text=True)


def test_show_command(tmp_path):
    out = write_result(tmp_path / "r.h5", "interpolation", arrays={"alpha": np.linspace(0, 1, 3)},
                       attrs={"instability_test_loss": 0.25})
    proc = _landscape("show", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "interpolation" in proc.stdout and "instability_test_loss = 0.25" in proc.stdout
    proc = _landscape("show", str(out), "--json")
    assert json.loads(proc.stdout)["values"]["alpha"] == [0.0, 0.5, 1.0]
    proc = _landscape("show", str(tmp_path / "missing.h5"))
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "missing.h5" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_version_help_and_usage_errors():
    proc = _landscape("--version")
    assert proc.returncode == 0 and "landscape, version" in proc.stdout
    proc = _landscape("--help")
    assert proc.returncode == 0 and "show" in proc.stdout
    proc = _landscape("no-such-command")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    proc = _landscape("--threads", "0", "show", "x.h5")
    assert proc.returncode == 2
