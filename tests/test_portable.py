"""Portable mode (``landscape --portable``, ``LANDSCAPE_PORTABLE=1``): the float kernels pinned to code that every
x86-64 CPU runs alike, so that runs and results are bit-identical across machines.

Another CPU cannot be had in a test; another CPU's kernels can: ``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``,
``MKL_CBWR`` and ``NPY_DISABLE_CPU_FEATURES`` make torch, oneDNN, MKL and numpy take the code paths other CPUs take.
The reference is the control: in normal mode the same training under two such settings gives other weights (so
the settings reach the kernels), in portable mode the same bits. Each case is a process of its own (the kernels
are chosen when torch loads).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch
from conftest import run_cli

from landscape import runtime

REPO = Path(__file__).resolve().parents[1]
PORTABLE_SUITE = runtime.portable_mode()  # the whole suite runs in portable mode (LANDSCAPE_PORTABLE=1 make test)

# Train LeNet on a fifth of digits for an epoch, interpolate between init and the end, print a hash of both.
JOB = """
import hashlib, sys
from cli.main import main  # loads neither torch nor numpy: --portable pins their kernels first
try:
    main(sys.argv[1:] + ["-q", "--root", "ck", "train", "--model", "lenet", "--data", "digits", "--subset", "0.2",
                         "--epochs", "1", "--batch-size", "16", "--run", "r"])
except SystemExit as exit_:
    assert exit_.code == 0
try:
    main(sys.argv[1:] + ["-q", "--root", "ck", "interpolate", "r@init", "r@last", "--points", "3", "--no-figure", "-o", "i.h5"])
except SystemExit as exit_:
    assert exit_.code == 0
import numpy as np
from landscape.results import read_result
from landscape.store import Store
weights = Store("ck").load("r@last").state_dict
result = read_result("i.h5")
digest = hashlib.sha256()
for name in sorted(weights):
    digest.update(weights[name].numpy().tobytes())
for name in sorted(result.arrays):
    digest.update(np.ascontiguousarray(result.arrays[name]).tobytes())
manifest = Store("ck").run("r").manifest
print(digest.hexdigest(), manifest["portable"], bool(result.attrs["portable"]))
"""


def job(tmp_path: Path, name: str, *flags: str, **env: str) -> tuple[str, bool, bool]:
    """JOB in a fresh process with ``env`` added (and LANDSCAPE_PORTABLE cleared): (hash, manifest's and result's
    ``portable``)."""
    cwd = tmp_path / name
    cwd.mkdir()
    clean = {k: v for k, v in os.environ.items() if k not in runtime.PORTABLE_SETTINGS and k != runtime.PORTABLE_ENV}
    proc = subprocess.run([sys.executable, "-c", JOB, "--threads", "1", *flags], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env={**clean, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                                                       "MKL_NUM_THREADS": "1", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    digest, manifest, result = proc.stdout.splitlines()[-1].split()
    return digest, manifest == "True", result == "True"


OTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "AVX2",
             "NPY_DISABLE_CPU_FEATURES": "X86_V3 AVX2"}


def test_portable_runs_are_bit_identical_under_another_cpus_kernels_and_normal_ones_are_not(tmp_path):
    normal, normal_flags = job(tmp_path, "normal"), None
    other, *_ = job(tmp_path, "normal-other", **OTHER_CPU)
    assert other != normal[0], "the simulated CPU takes the same kernels: the check below would prove nothing"
    assert normal[1:] == (False, False)
    portable = job(tmp_path, "portable", "--portable")
    assert portable[1:] == (True, True)  # recorded in the run's manifest and the result file
    assert job(tmp_path, "portable-other", "--portable", **OTHER_CPU) == portable
    assert job(tmp_path, "portable-env", LANDSCAPE_PORTABLE="1", **OTHER_CPU) == portable
    assert portable[0] != normal[0] and normal_flags is None


def test_use_portable_pins_the_kernels_before_torch_loads(tmp_path):
    code = ("import sys, os; import landscape.runtime as r; assert 'torch' not in sys.modules; r.use_portable(); "
            "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.backends.mkldnn.enabled, "
            "torch._C._get_nnpack_enabled(), torch.get_num_threads(), os.environ['MKL_CBWR'], r.portable_mode(), "
            "r.resolve_device('auto'))")
    env = {k: v for k, v in os.environ.items() if k not in runtime.PORTABLE_SETTINGS and k != runtime.PORTABLE_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "4"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["DEFAULT", "False", "False", "1", "COMPATIBLE", "True", "cpu"]


@pytest.mark.skipif(PORTABLE_SUITE, reason="this process was started in portable mode")
def test_portable_mode_once_torch_is_loaded_is_refused_with_how_to_start_it(capsys):
    environment = dict(os.environ)
    with pytest.raises(runtime.UsageError, match="must be chosen before torch and numpy are loaded"):
        runtime.use_portable()
    assert not runtime.portable_mode() and torch.backends.mkldnn.enabled
    code, out, err = run_cli("--portable", "privacy", "--noise-multiplier", "1", "--sample-rate", "0.01",
                             "--steps", "10", capsys=capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("error: portable mode must be chosen before torch and numpy are loaded") and \
        "start the process with LANDSCAPE_PORTABLE=1" in err
    # it names what is not pinned: torch's kernels here, or (under ATEN_CPU_CAPABILITY=default) the libraries' settings
    assert re.search(r"loaded them without it \((torch runs its \w+ kernels|\$[A-Z_]+ is not)", err), err
    assert dict(os.environ) == environment  # refused, it leaves nothing behind: the next command is a normal one
    assert run_cli("privacy", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10",
                   capsys=capsys)[0] == 0


def test_portable_mode_computes_on_this_machines_cpus_only(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "_PORTABLE", True)
    monkeypatch.setattr(runtime, "portable_mode", lambda: True)
    assert runtime.resolve_device("auto") == torch.device("cpu")
    with pytest.raises(runtime.UsageError, match="portable mode computes on the CPU"):
        runtime.resolve_device("cuda")
    from landscape.api.execution import connect_client

    with pytest.raises(runtime.UsageError, match="computes in this machine's processes only"):
        connect_client("tcp://127.0.0.1:1")
    monkeypatch.setattr(runtime, "use_portable", lambda: None)  # as if this process had been started portable
    code, _, err = run_cli("--portable", "--threads", "2", "store", "ls", capsys=capsys)
    assert code == 2 and "--portable runs one thread (--threads 2 given)" in err


def test_a_normal_run_and_result_record_portable_false(tmp_path):
    from landscape.results import write_result

    path = write_result(tmp_path / "r.h5", kind="x", inputs=[], arrays={"a": [1.0]})
    with h5py.File(path) as f:
        assert bool(f.attrs["portable"]) is PORTABLE_SUITE
    from landscape.store import Store

    run = Store(tmp_path / "ck").create_run("r", config={}, seeds={}, model_spec={}, data_spec={})
    run.close()
    assert json.loads((tmp_path / "ck/r/manifest.json").read_text())["portable"] is PORTABLE_SUITE
