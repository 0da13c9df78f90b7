"""Verdicts (landscape/verdict.py), the demo's verdicts and its reproducibility, and the digits split numbers.

References are independent: the stdlib's ``statistics.stdev``/``mean``, hand-worked cases on either side of
every rule's threshold, and a second run of the demo (bit-for-bit the same arrays and checkpoints).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from landscape.api.demo_job import DemoConfig, demo, verdicts
from landscape.verdict import (
    Verdict,
    all_of,
    compare,
    far_below,
    greater,
    ordered,
    paired_greater,
    similar,
    spread,
)

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ verdict rules


def test_spread_is_the_sample_standard_deviation():
    xs = [0.3, 1.9, 0.7, 0.25]
    assert spread(xs) == pytest.approx(statistics.stdev(xs), rel=1e-12)
    assert math.isnan(spread([1.0])) and math.isnan(spread([]))


@pytest.mark.parametrize(("gap", "noise", "held"), [(0.5, 0.4, True), (0.3, 0.4, None), (-0.3, 0.4, None),
                                                   (-0.5, 0.4, False), (0.5, math.nan, None), (0.0, 0.0, None)])
def test_compare_is_three_valued(gap, noise, held):
    assert compare(gap, noise) is held


def test_greater_judges_the_gap_of_means_against_the_summed_spreads():
    dp, sgd = [1.8, 1.9, 2.0], [0.01, 0.02, 0.015]
    v = greater("DP > SGD", "paper Fig. 5", dp, sgd, names=("DP", "SGD"))
    assert v.held is True and v.status == "held"
    assert v.numbers["mean DP"] == pytest.approx(statistics.mean(dp))
    assert v.numbers["sd SGD"] == pytest.approx(statistics.stdev(sgd))
    assert v.numbers["n DP"] == 3
    # the same means with a spread wider than the gap: inconclusive; reversed clearly: did not hold
    assert greater("c", "s", [0.1, 2.0, 3.7], [0.5, 0.6, 0.7]).held is None
    assert greater("c", "s", sgd, dp).held is False
    # one pair per side: the spread cannot be measured, however large the gap
    one = greater("c", "s", [1.9], [0.01])
    assert one.held is None and math.isnan(one.numbers["sd A"])
    assert "fewer than 2" in one.test


def test_all_of_and_ordered():
    yes, no, maybe = (Verdict("c", "s", "t", {}, h) for h in (True, False, None))
    assert all_of("c", "s", [yes, yes]).held is True
    assert all_of("c", "s", [yes, maybe]).held is None
    assert all_of("c", "s", [yes, maybe, no]).held is False
    assert all_of("c", "s", []).held is None
    combined = all_of("c", "s", [yes, Verdict("p", "s", "t", {"x": float("nan")}, None)])
    assert combined.parts[1].claim == "p" and combined.parts[0].held is True
    back = Verdict.from_dict(json.loads(json.dumps(combined.to_dict())))  # as a figure summary stores it
    assert back.parts[0] == yes and back.parts[1].held is None and math.isnan(back.parts[1].numbers["x"])
    falling = {1: [1.9, 1.8], 2: [1.0, 1.1], 4: [0.3, 0.4]}
    v = ordered("falls", "s", falling)
    assert v.held is True and v.numbers["k"] == [1, 2, 4]
    assert v.numbers["mean"] == pytest.approx([1.85, 1.05, 0.35])
    assert ordered("rises", "s", falling, decreasing=False).held is False
    assert ordered("falls", "s", {1: [1.9, 1.8], 2: [1.0, 1.1], 4: [1.0, 1.2]}).held is None  # last step in noise
    assert ordered("falls", "s", {1: [1.9], 2: [1.0]}).held is None  # no spread


def test_similar_allows_the_spread_plus_the_stated_tolerance():
    # |0.95 - 0.93| = 0.02; sds 0.01 + 0.01 (two values a side)
    a, b = [0.94, 0.96], [0.92, 0.94]
    assert similar("c", "s", a, b, tolerance=0.0).held is True       # 0.02 <= 0.01414 + 0.01414
    assert similar("c", "s", [0.95, 0.95], [0.93, 0.93], tolerance=0.0).held is False  # no spread, gap 0.02
    v = similar("c", "s", [0.95, 0.95], [0.93, 0.93], tolerance=0.01, names=("noise", "SGD"))
    assert v.held is False and v.numbers["tolerance"] == 0.01 and "0.01" in v.test
    assert similar("c", "s", [0.95, 0.95], [0.93, 0.93], tolerance=0.025).held is True
    assert similar("c", "s", [0.95], [0.93, 0.94], tolerance=1.0).held is None  # one value: no spread


def test_paired_greater_judges_the_differences_within_pairs():
    # a common per-seed offset makes the unpaired test inconclusive; the paired one sees a steady gap of 0.1
    a, b = [1.1, 2.1, 3.1], [1.0, 2.0, 3.0]
    assert greater("c", "s", a, b).held is None
    v = paired_greater("c", "s", a, b, names=("A", "B"))
    assert v.held is True and v.numbers["mean(A - B)"] == pytest.approx(0.1) and v.numbers["n seeds"] == 3
    assert paired_greater("c", "s", b, a).held is False
    assert paired_greater("c", "s", [1.0, 2.5, 3.0], [1.1, 2.0, 3.2]).held is None  # diffs -0.1, 0.5, -0.2
    assert paired_greater("c", "s", [1.0], [0.0]).held is None
    with pytest.raises(ValueError):
        paired_greater("c", "s", [1.0, 2.0], [1.0])


def test_far_below_uses_the_quantile_and_the_median():
    sample = np.linspace(0.0, 1.0, 101)  # q0.1 = 0.1, median = 0.5
    assert far_below("c", "s", 0.05, sample).held is True
    assert far_below("c", "s", 0.3, sample).held is None
    assert far_below("c", "s", 0.5, sample).held is False
    v = far_below("c", "s", 0.05, sample, names=("toward", "random"))
    assert v.numbers["fraction of random above"] == pytest.approx(np.mean(sample > 0.05))
    assert v.numbers["q0.1 random"] == pytest.approx(0.1) and v.numbers["n random"] == 101


def test_verdict_dict_is_json_and_round_trips():
    v = greater("c", "Watson et al. Fig. 5", [1.0], [0.5], note="n")
    d = json.loads(json.dumps(v.to_dict(), allow_nan=False))  # NaN spreads become null
    assert d["numbers"]["sd A"] is None and d["held"] is None and d["status"] == "inconclusive"
    back = Verdict.from_dict(d)
    assert back.claim == v.claim and back.held is None and math.isnan(back.numbers["sd A"])
    assert "[inconclusive] c (Watson et al. Fig. 5)" in v.line() and "Rule:" in v.line()
    with pytest.raises(ValueError):
        Verdict("c", "s", "t", {}, held="yes")


def test_demo_verdicts_follow_the_numbers():
    """The demo's rules on hand-made measurements: a clear Fig. 5 and a contradicted Fig. 4."""
    pairs = [{"k": k, "phase2": p, "instability": v} for k, p, vs in [
        (1, "dpsgd", [1.9, 1.8, 2.0]), (1, "sgd", [0.01, 0.02, 0.012]),
        (4, "dpsgd", [0.4, 0.35, 0.38]), (4, "sgd", [0.07, 0.06, 0.08])] for v in vs]
    out = verdicts(pairs, toward_loss=[0.034, 0.1, 0.172], random_rises=np.full(50, 0.0235) + np.linspace(0, 0.01, 50))
    held = [v.held for v in out]
    assert held == [True, True, True, True, False]
    assert out[4].numbers["rise toward sibling"] == pytest.approx(0.138) and "L(sibling) = 0.172" in out[4].note
    assert "k = 1" in out[0].claim and out[3].numbers["mean"] == pytest.approx([1.9, 0.3766666], rel=1e-5)
    # two copies: one pair per k and optimizer, no spread -> inconclusive, never "held"
    two = verdicts(pairs[::3], toward_loss=[0.03, 0.031], random_rises=np.linspace(0.1, 1, 50))
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
    with --json in a fresh process with another hash seed -- give identical arrays and checkpoints (issue 14
    item 9: no unseeded global RNG, no set/dict-order dependence); the CLI's JSON carries the verdicts, which
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
    """data.py's docstring and the README state the split the code makes (issue 14 item 7)."""
    from landscape.data import digits

    arrays = digits(seed=0)
    n_train, n_test = len(arrays.y_train), len(arrays.y_test)
    assert n_train + n_test == 1797
    doc = digits.__doc__
    assert f"{n_train:,} train and {n_test:,} test" in doc
    readme = (REPO / "README.md").read_text()
    assert f"({n_train:,}/{n_test:,})" in readme and f"q = 64/{n_train}" in readme
    stated = {int(m.replace(",", "")) for m in re.findall(r"\b1,?3[45]\d\b", readme + doc)}
    assert stated <= {n_train}, f"other train sizes stated: {stated}"
