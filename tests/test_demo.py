"""Verdicts (landscape/verdict.py), the demo's verdicts and its reproducibility, and the digits split numbers.

References are independent: the stdlib's ``statistics.stdev``/``mean``, hand-worked cases on either side of
every rule's threshold, and a second run of the demo (bit-for-bit the same arrays and checkpoints).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from landscape.api.demo_job import DemoConfig, demo, verdicts
from landscape.verdict import Verdict

REPO = Path(__file__).resolve().parents[1]


def test_demo_verdicts_follow_the_numbers():
    """The demo's rules on hand-made measurements: a clear Fig. 5 and a contradicted Fig. 4; and the barrier the
    verdicts use is the chord barrier, not Def. 2.3 (which here only says that one end is worse)."""
    from scipy import stats

    from landscape.api.demo_job import path_rise

    rows = [(1, "dpsgd", [1.9, 1.8, 2.0]), (1, "sgd", [0.01, 0.02, 0.012]),
            (4, "dpsgd", [0.4, 0.35, 0.38]), (4, "sgd", [0.07, 0.06, 0.08])]
    pairs = [{"k": k, "phase2": p, "chord_barrier": v, "instability": v + 1.0} for k, p, vs in rows for v in vs]
    random_loss = np.linspace(0.0235, 0.0335, 50)[:, None] * np.linspace(0, 1, 3)[None, :] + 0.034
    out = verdicts(pairs, toward_loss=[0.034, 0.1, 0.172], random_loss=random_loss)
    assert [v.held for v in out] == [True, True, True, True, False]
    welch = stats.ttest_ind([1.9, 1.8, 2.0], [0.01, 0.02, 0.012], equal_var=False, alternative="greater")
    assert out[0].numbers["p"] == pytest.approx(welch.pvalue) and "Def. 2.3 instability beside" in out[0].note
    assert out[0].numbers["mean DP"] == pytest.approx(1.9)  # the chord barrier, not the instability (2.9)
    # rise along the path = mean over t > 0 of L(t) - L(0): (0.066 + 0.138) / 2
    assert out[4].numbers["rise toward sibling"] == pytest.approx(0.102) and "L(sibling) = 0.172" in out[4].note
    assert path_rise([[1.0, 3.0, 2.0]])[0] == pytest.approx(1.5)
    assert "k = 1" in out[0].claim and out[3].numbers["mean"] == pytest.approx([1.9, 0.3766666], rel=1e-5)
    # chord barriers of exactly 0 (no bump on any path) beside a large Def. 2.3: the barrier decides; with no spread
    # on either side the sign test over the pairs decides (3 pairs: p 0.125, not a certain "did not hold")
    flat = [{"k": 1, "phase2": p, "chord_barrier": 0.0, "instability": i} for p, i in
            (("dpsgd", 2.0), ("dpsgd", 2.1), ("dpsgd", 1.9), ("sgd", 0.01), ("sgd", 0.02), ("sgd", 0.03))]
    assert verdicts(flat, [0.0, 0.0], [[0.0, 1.0]] * 20)[0].held is None
    # two copies: one pair per k and optimizer, no spread -> inconclusive, never "held"
    two = verdicts(pairs[::3], toward_loss=[0.03, 0.031], random_loss=np.linspace(0.1, 1, 50)[:, None] * [0, 1])
    assert [v.held for v in two] == [None, None, None, None, True]


# ------------------------------------------------------------------------------------------ the demo


def _arrays(root: Path) -> dict[str, np.ndarray]:
    """Every HDF5 dataset and every checkpoint tensor under ``root``, by relative path; ``root`` itself in
    stored strings (the pair tables name their result files) becomes ``OUT``."""
    out: dict[str, np.ndarray] = {}

    def add(path: Path, name: str, obj) -> None:
        if isinstance(obj, h5py.Dataset):
            value = obj[()]
            if isinstance(value, np.ndarray) and value.dtype.kind in "SO":
                value = np.array([v.replace(str(root).encode(), b"OUT") for v in value.ravel()]).reshape(value.shape)
            out[f"{path.relative_to(root)}:{name}"] = value

    for path in sorted(root.rglob("*.h5")):
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, obj, p=path: add(p, name, obj))
    for path in sorted(root.rglob("*.pt")):
        state = torch.load(path, weights_only=True, map_location="cpu")
        tensors = state if isinstance(state, dict) else {"": state}
        for key, value in tensors.items():
            if isinstance(value, torch.Tensor):
                out[f"{path.relative_to(root)}:{key}"] = value.numpy()
    return out


TIMING = re.compile(r"(^|/)(seconds|throughput|.*_seconds|time.*)$")


def test_demo_is_bit_reproducible_and_the_cli_prints_its_verdicts(tmp_path):
    """Two runs of a small demo on one thread -- the API in this process (after whatever ran before it), the CLI
    with --json in a fresh process with another hash seed -- give identical arrays and checkpoints (no
    unseeded global RNG, no set/dict-order dependence); the CLI's JSON carries the verdicts, which
    are also written to results/verdicts.json."""
    config = DemoConfig(epochs=2, ks=(1,), copies=2, directions=3, points=3)
    first = demo(tmp_path / "a", config=config, progress=False)
    assert len(first.verdicts) == 4 and all(isinstance(v, Verdict) for v in first.verdicts)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "12345", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "landscape", "--threads", "1", "demo", "--out", str(tmp_path / "b"),
                           "--epochs", "2", "--k", "1", "--copies", "2", "--directions", "3", "--points", "3",
                           "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [v["claim"] for v in data["verdicts"]] == [v.claim for v in first.verdicts]
    assert json.loads((tmp_path / "b" / "results" / "verdicts.json").read_text()) == data["verdicts"]
    a, b = _arrays(tmp_path / "a"), _arrays(tmp_path / "b")
    assert sorted(a) == sorted(b) and len(a) > 20
    assert any(k.endswith(":result") for k in a)  # the path-bearing column is compared too
    differ = [k for k in a if not TIMING.search(k.split(":")[1])
              and not np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f")]
    assert differ == []


# ------------------------------------------------------------------------------------------ digits numbers


def test_the_digits_split_numbers_are_the_codes_everywhere():
    """data.py's docstring and the docs state the split the code makes."""
    from landscape.data import digits

    arrays = digits(seed=0)
    n_train, n_test = len(arrays.y_train), len(arrays.y_test)
    assert n_train + n_test == 1797
    doc = digits.__doc__
    assert f"{n_train:,} train and {n_test:,} test" in doc
    readme = "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
    assert f"({n_train:,}/{n_test:,})" in readme and f"q = {64 / n_train:.3g}" in readme  # batch 64 of the train split
    stated = {int(m.replace(",", "")) for m in re.findall(r"\b1,?3[45]\d\b", readme + doc)}
    assert stated <= {n_train}, f"other train sizes stated: {stated}"
