"""Commands that need no tensors, and every command's ``--help``, do not import torch (~2 s of CPU each
otherwise).

Each command runs in a fresh interpreter (the test process has torch loaded already) and reports whether
``torch`` ended up in ``sys.modules``; the store and the result file they read are real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from landscape.api.training import train as api_train
from landscape.results import write_result
from landscape.train.config import TrainConfig

REPO = Path(__file__).resolve().parent.parent
PROBE = """
import json, sys
from cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("lazy")
    api_train(TrainConfig(data="digits", subset=60, epochs=1, batch_size=30, checkpoint_every="none", run="a"),
              root=d / "ck")
    write_result(d / "r.h5", "interpolation", arrays={"alpha": np.linspace(0, 1, 3)}, attrs={"points": 3})
    return d


def probe(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LANDSCAPE_THREADS",)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=REPO)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [
    ("--help",),
    ("store", "ls", "{root}/ck"),
    ("--root", "{root}/ck", "store", "show", "a"),
    ("--threads", "1", "store", "ls", "{root}/ck"),
    ("show", "{root}/r.h5"),
    ("privacy", "--noise-multiplier", "1", "--batch-size", "64", "--dataset-size", "1348", "--epochs", "3"),
    ("store", "--help"),
    ("privacy", "--help"),
], ids=lambda a: " ".join(a).replace("{root}/", ""))
def test_command_imports_no_torch(store, args):
    result = probe(*(a.format(root=store) for a in args))
    assert result == {"code": 0, "torch": False}


HELPS = """
import json, sys
import click
from cli.main import cli
ctx = click.Context(cli)
def walk(cmd, path):
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            walk(cmd.get_command(ctx, name), path + [name])
    else:
        cmd.get_help(click.Context(cmd, info_name=" ".join(path)))
        seen.append(" ".join(path))
seen = []
walk(cli, [])
print(json.dumps({"commands": seen, "loaded": [m for m in ("torch", "numpy", "h5py") if m in sys.modules]}))
"""


def test_every_commands_help_imports_no_torch():
    """Every command's help built in one fresh interpreter: no torch, numpy or h5py (a --help answers at once;
    the specs name their code as strings, imported when it runs)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LANDSCAPE_THREADS",)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", HELPS], capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"train", "interpolate", "ntk-table", "figures", "store ls", "privacy"} <= set(result["commands"])
    assert result["loaded"] == []


def test_the_probe_sees_torch_when_a_command_needs_it(store, tmp_path):
    # the same probe on an analysis that runs: torch is there (the probe can fail)
    result = probe("--root", str(store / "ck"), "interpolate", "a@init", "a@last", "--points", "2", "--no-figure",
                   "-o", str(tmp_path / "i.h5"))
    assert result == {"code": 0, "torch": True}


def test_threads_given_before_torch_loads_still_apply(store):
    """--threads on a torch-free command sets $OMP_NUM_THREADS, which torch reads when a later import loads it."""
    env = {k: v for k, v in os.environ.items() if k not in ("LANDSCAPE_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    code = ("import sys\nfrom cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "loaded = 'torch' in sys.modules\nimport torch\nprint(loaded, torch.get_num_threads())")
    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-c", code, *args, "store", "ls", str(store / "ck")],
                              capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
        return done.stdout.strip().splitlines()[-1]

    default = run()
    if default == "False 1":
        pytest.skip("torch uses one thread here by default: --threads 1 would change nothing")
    assert run("--threads", "1") == "False 1"
