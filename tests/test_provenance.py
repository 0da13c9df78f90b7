"""Provenance: the package versions every run and result records (torch, torchvision, Opacus when installed,
without importing it) and the sha256 of the user's local modules that model / data code imports, which count as
the code itself when a stored run is rebuilt (a changed helper is changed code)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import h5py
import pytest
from conftest import run_cli

from landscape import plugins
from landscape.api import calibration
from landscape.plugins import sha256_file
from landscape.runtime import environment
from landscape.store import Store

MODEL = '''from torch import nn
import {helper} as helpers
from {package}.blocks import Scale


def make(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), helpers.hidden(input_shape), Scale(), nn.Linear(8, num_classes))
'''
HELPER = '''import math
from torch import nn


def hidden(input_shape):
    return nn.Sequential(nn.Linear(math.prod(input_shape), 8), nn.Tanh())
'''
BLOCKS = '''import torch
from torch import nn


class Scale(nn.Module):
    def forward(self, x):
        return 0.5 * x
'''
DATA = '''import {helper} as helpers
import torch


def make(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(60, 6, generator=g)
    y = (x[:, 0] > 0).long()
    return x[:40], y[:40], x[40:], y[40:]
'''


def user_code(folder: Path, tag: str) -> tuple[Path, Path, str, str]:
    """``net.py`` importing a sibling helper module and a local package's module, and ``data.py`` importing the
    helper too (names unique per test: one process imports them all)."""
    folder.mkdir(parents=True, exist_ok=True)
    helper, package = f"helpers_{tag}", f"lib_{tag}"
    (folder / f"{helper}.py").write_text(HELPER)
    (folder / package).mkdir(exist_ok=True)
    (folder / package / "__init__.py").write_text("")
    (folder / package / "blocks.py").write_text(BLOCKS)
    (folder / "net.py").write_text(MODEL.format(helper=helper, package=package))
    (folder / "data.py").write_text(DATA.format(helper=helper))
    return folder / "net.py", folder / "data.py", helper, package


def test_the_environment_names_the_installed_versions_without_importing_opacus():
    env = environment()
    import torch
    import torchvision

    assert env["torch"] == torch.__version__ and env["python"] == ".".join(map(str, sys.version_info[:3]))
    assert env["torchvision"] == torchvision.__version__ and env["opacus"] == metadata.version("opacus")
    code = "import sys, landscape.runtime as r; e = r.environment(); print('opacus' in sys.modules, 'opacus' in e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


def test_runs_and_results_record_versions_and_local_module_hashes(tmp_path, capsys):
    net, data, helper, package = user_code(tmp_path / "code", "a")
    code, _, err = run_cli("--root", tmp_path / "ck", "train", "--model", f"{net}:make", "--data", f"{data}:make",
                           "--epochs", 1, "--batch-size", 20, "--run", "r", capsys=capsys)
    assert code == 0, err
    manifest = Store(tmp_path / "ck").run("r").manifest
    assert manifest["environment"] == environment() and "torchvision" in manifest["environment"]
    expected = {f"{helper}.py": sha256_file(tmp_path / "code" / f"{helper}.py"),
                f"{package}/__init__.py": sha256_file(tmp_path / "code" / package / "__init__.py"),
                f"{package}/blocks.py": sha256_file(tmp_path / "code" / package / "blocks.py")}
    assert manifest["model_spec"]["code"]["modules"] == expected  # not torch, numpy, math, landscape, net.py itself
    assert manifest["data_spec"]["code"]["modules"] == {f"{helper}.py": expected[f"{helper}.py"]}

    refs = [f"{net}:make", f"{data}:make"]
    result = calibration("r@last", root=tmp_path / "ck", code=refs, figure=False, output=tmp_path / "c.h5")
    with h5py.File(result.path) as f:
        assert json.loads(f.attrs["environment"]) == environment()
        recorded = {r["ref"]: r for r in json.loads(f.attrs["code"])["refs"]}
    assert recorded[f"{net}:make"]["modules"] == expected


def test_a_changed_local_module_is_changed_code(tmp_path, capsys):
    net, data, helper, package = user_code(tmp_path / "code", "b")
    refs = [f"{net}:make", f"{data}:make"]
    code, _, err = run_cli("--root", tmp_path / "ck", "train", "--model", refs[0], "--data", refs[1], "--epochs", 1,
                           "--batch-size", 20, "--run", "r", capsys=capsys)
    assert code == 0, err
    blocks = tmp_path / "code" / package / "blocks.py"
    blocks.write_text(BLOCKS.replace("0.5 * x", "0.25 * x"))  # the main file is as it was
    args = ["--root", tmp_path / "ck", "--code", refs[0], "--code", refs[1]]
    code, _, err = run_cli(*args, "calibration", "r@last", "--no-figure", "-o", "c.h5", capsys=capsys)
    assert code == 1 and err.count("\n") == 1 and not Path("c.h5").exists()
    assert f"its local module {package}/blocks.py" in err and "--accept-changed-code" in err
    code, _, err = run_cli(*args, "--accept-changed-code", "calibration", "r@last", "--no-figure", "-o", "c.h5",
                           capsys=capsys)
    assert code == 0, err
    with h5py.File("c.h5") as f:
        recorded = {r["ref"]: r for r in json.loads(f.attrs["code"])["refs"]}
    assert recorded[refs[0]]["modules"][f"{package}/blocks.py"] == sha256_file(blocks)

    blocks.write_text(BLOCKS)  # back as recorded; a removed helper is changed code too
    (tmp_path / "code" / f"{helper}.py").unlink()
    with plugins.trusting(refs), pytest.raises(plugins.CodeChangedError, match=f"{helper}.py: sha256 .* missing now"):
        Store(tmp_path / "ck").load("r@last").build_model()


def test_code_moved_with_its_helpers_is_the_same_code(tmp_path, capsys):
    net, data, _, _ = user_code(tmp_path / "code", "c")
    code, _, err = run_cli("--root", tmp_path / "ck", "train", "--model", f"{net}:make", "--data", f"{data}:make",
                           "--epochs", 1, "--batch-size", 20, "--run", "r", capsys=capsys)
    assert code == 0, err
    shutil.copytree(tmp_path / "code", tmp_path / "moved")
    shutil.rmtree(tmp_path / "code")
    moved = [f"{tmp_path}/moved/net.py:make", f"{tmp_path}/moved/data.py:make"]
    code, _, err = run_cli("--root", tmp_path / "ck", "--code", moved[0], "--code", moved[1], "calibration",
                           "r@last", "--no-figure", "-o", "c.h5", capsys=capsys)
    assert code == 0, err


def test_a_helper_imported_first_by_other_code_still_counts(tmp_path):
    net, _, helper, _ = user_code(tmp_path / "one", "d")
    other = tmp_path / "one" / "other.py"
    other.write_text(f"from {helper} import hidden\n\n\ndef make(input_shape, num_classes):\n"
                     "    return hidden(input_shape)\n")
    plugins.load(f"{net}:make")  # imports the helper first
    described = plugins.describe(f"{other}:make")  # only after its own import is its helper known
    assert described.get("modules") is None
    plugins.load(f"{other}:make")
    assert plugins.describe(f"{other}:make")["modules"] == {f"{helper}.py": sha256_file(tmp_path / "one" /
                                                                                          f"{helper}.py")}
