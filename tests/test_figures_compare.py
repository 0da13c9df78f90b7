"""Comparing two summaries of one recipe (``landscape figures NAMES --out B --compare A``): which verdict parts move
between machines or float kernels.

The per-part report is checked against summaries written by hand from verdicts the rules computed on chosen numbers
(one part made to flip, one to stay, one present on one side only), and end to end on a recipe made twice at
``--scale test``: in this process on this machine's kernels and in a fresh process on torch's baseline kernels with
oneDNN held to SSE4.1 and MKL's compatible path (the code paths of another x86-64 CPU). There the report is
recomputed from the two HDF5 files with h5py and numpy alone: every part's two outcomes and p-values, which moved,
the arrays that are not bit-identical, the kernels each records.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import run_cli

from landscape import runtime
from landscape.errors import UsageError
from landscape.figures.compare import WHOLE, compare
from landscape.verdict import STATUS, all_of, greater

REPO = Path(__file__).resolve().parents[1]
OTHER_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "COMPATIBLE"}


def _summary(path: Path, verdict, numbers: dict, *, recipe: str = "watson-fig9", scale: str = "cpu",
             settings: dict | None = None, chosen: str | None = None, kernels: str = "torch AVX2") -> Path:
    """A summary with the attributes and layout the runner writes (``landscape.figures.recipe.make``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sensitivity = [] if chosen is None else [{"role": "chosen", "setting": {}, "label": chosen,
                                              "verdict": verdict.to_dict()}]
    with h5py.File(path, "w") as f:
        g = f.create_group("numbers")
        for k, v in numbers.items():
            g.create_dataset(k, data=np.asarray(v, dtype=float))
        f.attrs.update(kind="figure-recipe", recipe=recipe, scale=scale, settings=json.dumps(settings or {"seeds": 5}),
                       verdict=json.dumps(verdict.to_dict()), sensitivity=json.dumps(sensitivity),
                       figures="[]", portable=False, kernels=kernels)
    return path


def _claim(values_b, name: str):
    return greater(name, "paper", [1.0, 1.1, 0.9, 1.05, 0.95], values_b)


def test_compare_reports_each_part_with_both_outcomes_and_p_values_and_which_moved(tmp_path):
    clear = [0.0, 0.1, -0.1, 0.05, -0.05]  # far below A: held on both machines
    near = {"a": [0.8, 0.9, 0.7, 0.85, 0.75], "b": [0.95, 1.05, 0.85, 1.0, 0.9]}  # held on one, not on the other
    a_parts = [_claim(clear, "part one"), _claim(near["a"], "part two"), _claim(clear, "only here")]
    b_parts = [_claim(clear, "part one"), _claim(near["b"], "part two")]
    va, vb = all_of("claim", "paper", a_parts), all_of("claim", "paper", b_parts)
    assert [p.held for p in va.parts[:2]] == [True, True] and [p.held for p in vb.parts] == [True, None]
    a = _summary(tmp_path / "a.h5", va, {"x": [1.0, 2.0], "y": [3.0], "nan": [math.nan]}, chosen="lr 0.01")
    b = _summary(tmp_path / "b.h5", vb, {"x": [1.0, 2.0 + 1e-12], "y": [3.0], "nan": [math.nan], "z": [0.0]},
                 chosen="lr 0.03", kernels="torch DEFAULT")
    c = compare(a, b)
    assert c.recipe == "watson-fig9" and c.scale == "cpu" and c.kernels == ("torch AVX2", "torch DEFAULT")
    assert [p.claim for p in c.parts] == [WHOLE, "part one", "part two", "only here"]
    whole, one, two, only = c.parts
    assert whole.status == ("held", "inconclusive") and whole.moved
    assert one.status == ("held", "held") and not one.moved
    assert two.status == ("held", "inconclusive") and two.moved
    assert only.status == ("held", "absent") and only.moved and math.isnan(only.p[1])
    for change, pa, pb in ((one, va.parts[0], vb.parts[0]), (two, va.parts[1], vb.parts[1])):
        assert change.p == (pa.numbers["p"], pb.numbers["p"])
        assert change.p_against == (pa.numbers["p against (Holm)"], pb.numbers["p against (Holm)"])
    assert two.p[0] < 0.05 <= two.p[1]
    assert [p.claim for p in c.moved] == [WHOLE, "part two", "only here"]
    assert c.chosen == ("lr 0.01", "lr 0.03") and c.arrays == 4 and c.arrays_differ == ("x", "z")  # NaN = NaN
    text = "\n".join(c.lines())
    assert text.startswith("compare watson-fig9 [cpu]: 2 of 3 parts moved; the whole claim moved")
    assert f"moved  part two: held (p {two.p[0]:.3g}" in text and "| inconclusive (p " in text
    assert "moved  chosen setting: lr 0.01 | lr 0.03" in text and "2 of 4 arrays differ (x, z)" in text
    assert json.loads(json.dumps(c.to_dict()))["moved"] == [WHOLE, "part two", "only here"]
    same = compare(a, a)
    assert not same.moved and same.arrays_differ == () and "numbers: bit-identical" in same.lines()[-1]


def test_compare_refuses_what_is_not_the_same_recipe_and_scale(tmp_path):
    v = _claim([0.0, 0.1, -0.1], "part")
    a = _summary(tmp_path / "a.h5", v, {"x": [1.0]})
    with pytest.raises(UsageError, match="not the same recipe and scale"):
        compare(a, _summary(tmp_path / "b.h5", v, {"x": [1.0]}, recipe="watson-fig10"))
    with pytest.raises(UsageError, match="not the same recipe and scale"):
        compare(a, _summary(tmp_path / "c.h5", v, {"x": [1.0]}, scale="test"))
    (tmp_path / "d.h5").write_text("not hdf5")
    with pytest.raises(UsageError, match=r"cannot read the summary .*d\.h5"):
        compare(a, tmp_path / "d.h5")
    with h5py.File(tmp_path / "e.h5", "w") as f:
        f.attrs["kind"] = "instability"
    with pytest.raises(UsageError, match="is not a figure recipe's summary"):
        compare(a, tmp_path / "e.h5")
    settings = compare(a, _summary(tmp_path / "f.h5", v, {"x": [1.0]}, settings={"seeds": 3}))
    assert settings.settings_differ == ("seeds",) and "settings differ: seeds" in settings.lines()[-1]


def test_compare_with_a_missing_reference_is_one_line_before_anything_runs(tmp_path, capsys):
    (tmp_path / "ref").mkdir()
    code, out, err = run_cli("--root", tmp_path / "store", "figures", "watson-fig11", "--scale", "test", "--out",
                             tmp_path / "out", "--compare", tmp_path / "ref", capsys=capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "no summary to compare with at" in err and "watson-fig11-test.h5" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "store").exists()


def _parts(path: Path) -> list[tuple[str, str, float, float]]:
    """(claim, status, p, p against) of the whole verdict and each part, read from the HDF5 with json alone."""
    with h5py.File(path, "r") as f:
        verdict = json.loads(f.attrs["verdict"])

    def num(v, *keys):
        found = [v["numbers"][k] for k in keys if isinstance(v["numbers"].get(k), (int, float))]
        return float(found[0]) if found else math.nan

    return [(claim, STATUS[v["held"]], num(v, "p"), num(v, "p against (Holm)", "p against"))
            for claim, v in [(WHOLE, verdict), *((p["claim"], p) for p in verdict.get("parts", []))]]


def test_figures_compare_a_recipe_made_under_another_cpus_kernels(tmp_path, capsys):
    """The same recipe at --scale test here and in a process on another CPU's kernels: the comparison's every part,
    p-value, moved flag and differing array recomputed from the two files."""
    ref, other = tmp_path / "ref", tmp_path / "other"
    code, _, err = run_cli("-q", "--root", tmp_path / "store", "figures", "watson-fig11", "--scale", "test", "--out",
                           ref, capsys=capsys)
    assert code == 0, err
    code, out, err = run_cli("-q", "--root", tmp_path / "store", "figures", "watson-fig11", "--scale", "test",
                             "--out", ref, "--compare", ref, capsys=capsys)  # finished: compared with itself
    assert code == 0 and "skipped (finished)" in out, err
    assert "compare watson-fig11 [test]: 0 of " in out and "the whole claim did not move" in out
    assert "numbers: bit-identical" in out and "moved  " not in out
    env = {k: v for k, v in os.environ.items() if k not in runtime.PORTABLE_SETTINGS and k != runtime.PORTABLE_ENV}
    env.update(OTHER_KERNELS, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())", "-q",
                           "--threads", "1", "--root", str(tmp_path / "store-other"), "figures", "watson-fig11",
                           "--scale", "test", "--out", str(other), "--compare", str(ref), "--json"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)["recipes"][0]["comparison"]
    a, b = ref / "watson-fig11" / "watson-fig11-test.h5", other / "watson-fig11" / "watson-fig11-test.h5"
    assert got["paths"] == [str(a), str(b)]
    expected = [(x[0], (x[1], y[1]), (x[2], y[2]), (x[3], y[3])) for x, y in zip(_parts(a), _parts(b), strict=True)]
    assert len(got["parts"]) == len(expected) > 2
    for part, (claim, status, p, p_against) in zip(got["parts"], expected, strict=True):
        assert (part["claim"], tuple(part["status"]), part["moved"]) == (claim, status, status[0] != status[1])
        for got_p, want in ((part["p"], p), (part["p_against"], p_against)):
            assert [math.nan if v is None else v for v in got_p] == pytest.approx(list(want), nan_ok=True)
    assert got["moved"] == [c for c, s, _, _ in expected if s[0] != s[1]]
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        arrays = [{}, {}]
        for f, into in ((fa, arrays[0]), (fb, arrays[1])):
            f["numbers"].visititems(lambda k, v, into=into: into.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset)
                                    else None)
        kernels = [str(fa.attrs["kernels"]), str(fb.attrs["kernels"])]
    names = sorted(set(arrays[0]) | set(arrays[1]))
    differ = [n for n in names if n not in arrays[0] or n not in arrays[1]
              or not np.array_equal(arrays[0][n], arrays[1][n], equal_nan=True)]
    assert got["arrays_differ"] == differ and got["arrays"] == len(names)
    assert got["kernels"] == ["portable" if runtime.portable_mode() else kernels[0], kernels[1]]
    assert kernels[1].startswith("torch DEFAULT") and "SSE41" in kernels[1] and "MKL COMPATIBLE" in kernels[1]


def test_figures_api_compare_puts_a_comparison_on_each_made(tmp_path):
    """The api's ``compare``: a finished recipe compared with its own folder moves nothing and is bit-identical."""
    from landscape.api import figures

    made = figures(["watson-thm33"], scale="test", out=tmp_path / "out", root=tmp_path / "store")
    assert made[0].comparison is None
    again = figures(["watson-thm33"], scale="test", out=tmp_path / "out", root=tmp_path / "store",
                    compare=tmp_path / "out")
    c = again[0].comparison
    assert again[0].skipped and c.paths == (made[0].path, made[0].path)
    assert c.moved == [] and c.arrays_differ == () and c.arrays > 0
    assert [p.status[0] for p in c.parts] == [made[0].verdict.status, *(p.status for p in made[0].verdict.parts)]
