"""Golden-array regression test: today's analyses on fixed seeds give exactly the saved arrays.

``tests/golden/make_golden.py`` trains a tiny Phase 1 / Phase 2 family on digits and runs every analysis
through ``landscape.api``; ``tests/golden/golden.npz`` holds what the code gave when it was written. This
test rebuilds everything in a temporary directory and compares, exactly (NaN equals NaN):

* the trained weights first, so that a change of training is reported as such and not as a change of
  every analysis;
* then, per analysis, every saved array and numeric scalar attr. Keys the new files add are allowed (a
  refactor may record more); a saved key that is missing fails. Timings, dates and versions are excluded
  by name (``make_golden.EXCLUDED``).

Exact where the machine rounds as the saving machine did. Different CPUs round convolutions and matrix products
differently in the last bit (AVX2 / AVX-512 dispatch, MKL and oneDNN code paths), and training amplifies it:
on an AVX-512 Xeon the weights saved on an earlier machine differed by up to 1e-4 relative, the analyses by up
to 4e-5. ``golden.npz`` therefore records the saving machine's fingerprint (``make_golden.machine_fingerprint``:
a hash of what torch's kernels alone give for a fixed LeNet-sized step). Same fingerprint: every value is
compared exactly. Another fingerprint: floats are compared within rtol 1e-3 (atol 1e-5 of the array's largest
magnitude), integers, booleans and NaN patterns still exactly, and the hashes of float arrays not in the file
(``HASH_ATTRS``) are skipped; a failure says which comparison applied. A refactor is checked exactly on a
machine like the one that saved the file: regenerate there, or on your own machine before you start.

An intended change of numbers: regenerate with ``python tests/golden/make_golden.py`` and say why in the
commit. The whole module takes 15-20 s on one thread (measured on the shared 2-core machine: training ~4 s,
analyses ~4 s, the rest imports).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_SPEC = importlib.util.spec_from_file_location("make_golden", Path(__file__).with_name("golden") / "make_golden.py")
golden = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(golden)

with np.load(golden.GOLDEN) as _z:
    SAVED: dict[str, np.ndarray] = {k: _z[k] for k in _z.files}

# The analyses a refactor must keep identical, plus instability and ntk-table: each must be covered by the saved file.
REQUIRED = ("interpolate", "instability", "directions", "surface", "clipping", "symmetry", "norms", "ntk",
            "ntk_table")


def _analysis(key: str) -> str:
    return key.split("/", 1)[0].split("@", 1)[0]


ANALYSES = sorted({_analysis(k) for k in SAVED} - {"weights", "machine"})
SAVED_MACHINE = str(SAVED.pop(golden.MACHINE_KEY, ""))
EXACT = SAVED_MACHINE == golden.machine_fingerprint()
RTOL, ATOL_OF_MAX = 1e-3, 1e-5


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """(weights, {analysis: arrays}) rebuilt from the current code, once for the module."""
    return golden.build(tmp_path_factory.mktemp("golden"))


def _mismatches(saved: dict[str, np.ndarray], new: dict[str, np.ndarray], *, strict_dtype: bool,
                exact: bool = True) -> list[str]:
    problems = []
    for key in sorted(saved):
        if key not in new:
            problems.append(f"{key}: missing from the new result")
            continue
        if not exact and key.rsplit("@", 1)[-1] in golden.HASH_ATTRS:
            continue  # a hash of float arrays: equal only where the floats are bit-identical
        want, got = saved[key], np.asarray(new[key])
        if want.shape != got.shape:
            problems.append(f"{key}: shape {got.shape}, saved {want.shape}")
            continue
        if strict_dtype and want.dtype != got.dtype:
            problems.append(f"{key}: dtype {got.dtype}, saved {want.dtype}")
            continue
        try:
            if exact or want.dtype.kind not in "fc":
                np.testing.assert_array_equal(got, want)  # NaN == NaN
            else:
                finite = np.abs(want[np.isfinite(want)])
                atol = ATOL_OF_MAX * float(finite.max()) if finite.size else 0.0
                np.testing.assert_allclose(got, want, rtol=RTOL, atol=atol)  # NaN where NaN, same shape
        except AssertionError as exc:
            detail = " ".join(line.strip() for line in str(exc).splitlines() if line.strip().startswith(("Mismatched", "Max")))
            problems.append(f"{key}: values differ ({detail or 'see arrays'})")
    return problems


def test_saved_file_covers_every_analysis_and_no_excluded_key():
    assert set(REQUIRED) <= set(ANALYSES), f"golden.npz lacks {sorted(set(REQUIRED) - set(ANALYSES))}"
    assert any(k.startswith("weights/") for k in SAVED)
    assert not [k for k in SAVED if golden.excluded(k)]
    assert golden.GOLDEN.stat().st_size < 1 << 20
    assert len(SAVED_MACHINE) == 64, "golden.npz lacks the saving machine's fingerprint: regenerate it"


def test_machine_fingerprint_is_repeatable_and_sees_the_kernel_path(monkeypatch):
    """The probe gives the same hash twice here, and another when torch is made to use other kernels."""
    import torch

    first = golden.machine_fingerprint()
    assert first == golden.machine_fingerprint() and len(first) == 64
    conv2d = torch.nn.functional.conv2d
    monkeypatch.setattr(torch.nn.functional, "conv2d",  # float32 convolutions rounded once, from float64
                        lambda x, w, padding=0: conv2d(x.double(), w.double(), padding=padding).to(x.dtype))
    assert golden.machine_fingerprint() != first


def test_weights_identical(fresh):
    """Training itself: every stored checkpoint of the five runs, bit for bit (dtype included)."""
    weights, _ = fresh
    saved = {k: v for k, v in SAVED.items() if k.startswith("weights/")}
    problems = _mismatches(saved, weights, strict_dtype=True, exact=EXACT)
    assert not problems, ("" if EXACT else f"(another machine: within rtol {RTOL}) ") + "training changed (every analysis will differ too):\n" + "\n".join(problems)


@pytest.mark.parametrize("analysis", ANALYSES)
def test_analysis_identical(fresh, analysis):
    weights, results = fresh
    saved = {k: v for k, v in SAVED.items() if _analysis(k) == analysis}
    trained = {k: v for k, v in SAVED.items() if k.startswith("weights/")}
    if _mismatches(trained, weights, strict_dtype=True, exact=EXACT):
        pytest.fail(f"{analysis}: not compared, the trained weights differ (see test_weights_identical)")
    assert analysis in results, f"{analysis}: no longer produced by make_golden.run_analyses"
    problems = _mismatches(saved, results[analysis], strict_dtype=False, exact=EXACT)
    assert not problems, ("" if EXACT else f"(another machine: within rtol {RTOL}) ") + f"{analysis} differs from the saved arrays:\n" + "\n".join(f"  {analysis}: {p}" for p in problems)


def test_mismatch_report_names_the_key():
    """The comparison itself can fail: a changed value, a missing key, a new shape are each reported; NaN == NaN."""
    saved = {"a/x": np.array([1.0, np.nan]), "a/y": np.array([1, 2]), "a@s": np.array(0.5)}
    assert _mismatches(saved, {"a/x": np.array([1.0, np.nan]), "a/y": np.array([1, 2]), "a@s": 0.5, "a/new": [3]},
                       strict_dtype=False) == []
    problems = _mismatches(saved, {"a/x": np.array([1.0, 2.0]), "a/y": np.array([1, 2, 3])}, strict_dtype=False)
    assert [p.split(":")[0] for p in problems] == ["a/x", "a/y", "a@s"]
    assert "missing" in problems[2] and "shape" in problems[1] and "values differ" in problems[0]
    assert _mismatches({"w": np.zeros(2, np.float32)}, {"w": np.zeros(2)}, strict_dtype=True) == \
        ["w: dtype float64, saved float32"]
    assert golden.excluded("surface@seconds") and golden.excluded("ntk/timing/seconds_total")
    # another machine: floats within tolerance; integers, NaN patterns exactly; float hashes skipped
    saved = {"a/x": np.array([1.0, np.nan, 0.0]), "a/n": np.array([3]), "a@plane_sha256": np.array("ab")}
    near = {"a/x": np.array([1.0 + 1e-5, np.nan, 1e-7]), "a/n": np.array([3]), "a@plane_sha256": np.array("cd")}
    assert _mismatches(saved, near, strict_dtype=False, exact=False) == []
    assert [p.split(":")[0] for p in _mismatches(saved, near, strict_dtype=False)] == ["a/x", "a@plane_sha256"]
    far = {"a/x": np.array([1.01, np.nan, 0.0]), "a/n": np.array([4]), "a@plane_sha256": np.array("ab")}
    assert [p.split(":")[0] for p in _mismatches(saved, far, strict_dtype=False, exact=False)] == ["a/n", "a/x"]
    assert _mismatches(saved, {**near, "a/x": np.array([1.0, 0.5, 0.0])}, strict_dtype=False, exact=False)
    assert golden.excluded("x@created") and not golden.excluded("clipping/R")
