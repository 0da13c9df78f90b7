"""A batch spec cannot escape its directories, blow up or hang, and what it names is checked
before anything runs.

* every path a spec writes resolves (``..`` and symbolic links followed) inside the results directory or the
  store root; ``data_root`` is written only with ``download: true``, which needs it inside them;
* grids are counted before they are built (at most ``MAX_JOBS``), YAML aliases and merge keys are bounded,
  non-UTF-8 text and deep nesting are one line;
* ``subset: 300`` is 300 examples, as on the command line; references to missing runs or to paths are refused.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from cli.main import main
from landscape.batch import load_spec
from landscape.batch.spec import MAX_JOBS, SpecError


def write(tmp: Path, text: str | bytes, name: str = "spec.yaml") -> Path:
    path = tmp / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def batch(capsys, tmp_path, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["--root", str(tmp_path / "checkpoints"), "batch", *args])
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def one_line(code: int, err: str, *fragments: str) -> str:
    assert "Traceback" not in err, err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


TRAIN = "  base: {kind: train, run: r0, data: digits, subset: 0.2, epochs: 1, checkpoint_every: none}\n"


# --------------------------------------------------------------------------------------------- escapes (2)


def test_spec_paths_cannot_escape_the_results_directory_or_store(tmp_path, capsys, monkeypatch):
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    monkeypatch.chdir(work)
    (work / "results" / "spec").mkdir(parents=True)
    os.symlink(outside, work / "results" / "spec" / "link")  # a symlinked directory inside the results
    escapes = [str(outside / "pairs"), "../../../outside/pairs", "link/pairs", "link"]
    for pair_dir in escapes:
        write(work, f"jobs:\n{TRAIN}  i: {{kind: instability, refs: ['r0'], pair_dir: '{pair_dir}'}}\n")
        code, _, err = batch(capsys, work, "spec.yaml")
        one_line(code, err, "'pair_dir'", "outside the results directory")
    # ... and the run of the spec did not start: nothing was written outside or in the store
    assert tree(outside) == [] and not (work / "checkpoints").exists()
    assert tree(work / "results") == ["spec", "spec/link"]
    # the results directory itself may be a link the user made: what lies inside it is inside
    write(work, f"results: results/spec/link\njobs:\n{TRAIN}  i: {{kind: instability, refs: ['r0'], "
                f"pair_dir: pairs}}\n")
    assert load_spec(work / "spec.yaml").job("i").options["pair_dir"] == "pairs"


def test_data_root_is_written_only_inside_with_download(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    body = "jobs:\n  t: {kind: train, run: r0, data: mnist, epochs: 1, %s}\n"
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    for options, needle in ((f"download: true, data_root: {elsewhere}", "'data_root'"),
                            ("download: true, data_root: ../x", "'data_root'"),
                            ("download: true", "needs a 'data_root'")):
        write(tmp_path, body % options)
        code, _, err = batch(capsys, tmp_path, "spec.yaml", "--dry-run")
        one_line(code, err, needle)
        code, _, err = batch(capsys, tmp_path, "spec.yaml")  # not only --dry-run: nothing is downloaded or made
        one_line(code, err, needle)
    assert not elsewhere.exists() and not (tmp_path.parent / "x").exists() and tree(tmp_path) == ["spec.yaml"]
    # inside the results directory or the store root: fine; a data_root that is only read may be anywhere
    for options in ("download: true, data_root: results/spec/data", "download: true, data_root: checkpoints/data",
                    "data_root: /srv/datasets"):
        write(tmp_path, body % options)
        assert load_spec(tmp_path / "spec.yaml").jobs[0].options["data_root"]


# ---------------------------------------------------------------------------------------- size bounds (3)


@pytest.mark.parametrize("grid, size", [
    ({f"v{i}": list(range(10)) for i in range(9)}, "1,000,000,000"),
    ({"a": list(range(1000)), "b": list(range(1000)), "c": list(range(1000))}, "1,000,000,000"),
    ({"a": list(range(101)), "b": list(range(100))}, "10,100"),
])
def test_grids_are_counted_before_they_are_built(tmp_path, capsys, grid, size):
    import json

    write(tmp_path, "jobs:\n  t:\n    kind: train\n    run: r\n    name: j\n    grid: " + json.dumps(grid) + "\n")
    start = time.perf_counter()
    code, _, err = batch(capsys, tmp_path, "spec.yaml", "--dry-run")
    one_line(code, err, f"expands to {size} jobs", f"at most {MAX_JOBS:,}")
    assert time.perf_counter() - start < 5


def test_many_grids_together_are_bounded_too(tmp_path, capsys):
    jobs = "".join(f"  t{i}: {{kind: train, run: 'r{i}-{{s}}', grid: {{s: {list(range(100))}}}}}\n" for i in range(101))
    write(tmp_path, "jobs:\n" + jobs)
    code, _, err = batch(capsys, tmp_path, "spec.yaml", "--dry-run")
    one_line(code, err, f"more than {MAX_JOBS:,} jobs")


ALIAS_BOMB = "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))
MERGE_BOMB = "".join(f"      m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: 1}}\n" for i in range(1, 40))


@pytest.mark.parametrize("text, needle", [
    ("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + ALIAS_BOMB
     + "jobs:\n  t: {kind: train, run: r, model_kwargs: {x: *a8}}\n", "expands to more than"),
    ("jobs: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested deeper than"),
    ("jobs: " + "{a: " * 100_000 + "1" + "}" * 100_000 + "\n", "nested deeper than"),
    ("jobs:\n  t: {kind: train, run: caf\xe9}\n".encode("latin-1"), "spec.yaml:2: not UTF-8"),
])
def test_bombs_deep_nesting_and_bad_encodings_are_one_line(tmp_path, capsys, text, needle):
    write(tmp_path, text)
    start = time.perf_counter()
    code, _, err = batch(capsys, tmp_path, "spec.yaml", "--dry-run")
    one_line(code, err, needle)
    assert time.perf_counter() - start < 10


def test_a_job_name_too_long_for_its_directory_is_refused(tmp_path, capsys):
    write(tmp_path, "jobs:\n  " + "j" * 250 + ": {kind: train, run: r}\n")
    code, _, err = batch(capsys, tmp_path, "spec.yaml", "--dry-run")
    one_line(code, err, "a job name of 250 characters", "at most 200")


def test_merge_keys_of_merge_keys_do_not_multiply(tmp_path):
    """``<<: [*m, *m]`` 39 levels deep: the merged mappings are counted (each once) before PyYAML flattens them."""
    write(tmp_path, "jobs:\n  t:\n    kind: train\n    run: r\n    model_kwargs:\n      m0: &m0 {k0: 1}\n"
          + MERGE_BOMB)
    start = time.perf_counter()
    kwargs = load_spec(tmp_path / "spec.yaml").jobs[0].options["model_kwargs"]
    assert kwargs["m39"] == {f"k{i}": 1 for i in range(40)}
    assert time.perf_counter() - start < 5


# ------------------------------------------------------------------------------- subsets, references (4)


def test_subset_is_a_count_or_a_fraction_as_on_the_command_line(tmp_path, capsys):
    for value, expected in (("300", 300), ("0.3", 0.3), ("1", 1), ("1.0", 1.0)):
        write(tmp_path, f"jobs:\n  t: {{kind: train, run: r, subset: {value}}}\n  i: {{kind: interpolate, "
                        f"refs: [r, r], subset: {value}}}\n")
        spec = load_spec(tmp_path / "spec.yaml")
        for job in spec.jobs:
            got = job.options["subset"]
            assert got == expected and type(got) is type(expected), (value, job.kind, got)
    for value in ("0", "-3", "1.5", "abc"):
        write(tmp_path, f"jobs:\n  t: {{kind: train, run: r, subset: {value}}}\n")
        code, _, err = batch(capsys, tmp_path, "spec.yaml", "--dry-run")
        one_line(code, err, "spec.yaml:2", "jobs.t: subset must be")


def test_a_spec_subset_count_trains_on_that_many_examples(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "jobs:\n  t: {kind: train, run: r, data: digits, subset: 300, epochs: 1, batch_size: 100, "
                    "checkpoint_every: none}\n")
    code, out, err = batch(capsys, tmp_path, "spec.yaml")
    assert code in (0, None), err
    from landscape.store import Store

    spec = Store(tmp_path / "checkpoints").run("r").manifest["data_spec"]
    assert spec["subset"] == 300


@pytest.mark.parametrize("job, needle", [
    ("{kind: interpolate, refs: [r0, nosuch]}", "names the run 'nosuch', which is not in the store"),
    ("{kind: interpolate, refs: [r0, '../other/step-000000.h5']}", "names the path '../other/step-000000.h5'"),
    ("{kind: interpolate, refs: [r0, '/abs/x.h5']}", "names the path '/abs/x.h5'"),
    ("{kind: instability, refs: ['zz-*']}", "'zz-*' matches no run"),
    ("{kind: directions, refs: [r0], toward: gone@last}", "'toward' names the run 'gone'"),
    ("{kind: surface, refs: [r0], plane: 'pca:gone'}", "'plane' names the run 'gone'"),
    ("{kind: train, run: c, from_ref: 'gone@step=3'}", "'from_ref' names the run 'gone'"),
    ("{kind: prune, run: p, ref: ../r0, remove: 0.5}", "'ref' names the path '../r0'"),
])
def test_references_are_checked_before_anything_runs(tmp_path, capsys, job, needle):
    write(tmp_path, f"jobs:\n{TRAIN}  j: {job}\n")
    code, _, err = batch(capsys, tmp_path, "spec.yaml")
    one_line(code, err, "spec.yaml:3: jobs.j", needle)
    assert not (tmp_path / "checkpoints").exists()  # the train job before it did not run


def test_references_to_runs_the_spec_writes_or_the_store_holds_are_fine(tmp_path):
    write(tmp_path, f"jobs:\n  late: {{kind: interpolate, refs: [r0@init, r0@last]}}\n{TRAIN}"
                    f"  glob: {{kind: instability, refs: ['r*']}}\n"
                    f"  plane: {{kind: surface, refs: [r0], plane: random}}\n")
    spec = load_spec(tmp_path / "spec.yaml")
    assert [j.id for j in spec.jobs][0] == "base" and spec.job("late").deps == ("base",)
    (tmp_path / "checkpoints" / "old").mkdir(parents=True)
    from landscape.store import Store

    Store(tmp_path / "checkpoints").create_run("kept", config={}, seeds={}, lineage=None, model_spec={},
                                               data_spec={}).close()
    write(tmp_path, "jobs:\n  i: {kind: interpolate, refs: [kept@init, kept]}\n")
    assert load_spec(tmp_path / "spec.yaml", root=tmp_path / "checkpoints").jobs[0].options["refs"]
    write(tmp_path, "jobs:\n  i: {kind: interpolate, refs: [old, kept]}\n")  # a directory without a manifest
    with pytest.raises(SpecError, match="'old'"):
        load_spec(tmp_path / "spec.yaml", root=tmp_path / "checkpoints")


@pytest.mark.parametrize("job, needle", [
    ("{kind: calibration, refs: [r0], bins: 1000000000}", "jobs.j: bins must be <= 10000"),
    ("{kind: interpolate, refs: [r0, r0], points: 1000000000}", "jobs.j: points must be <= 10000"),
    ("{kind: interpolate, refs: [r0, r0], subset_seed: -1}", "jobs.j: subset_seed must be an integer seed"),
    ("{kind: train, run: c, seed: -1}", "jobs.j: seed must be an integer seed"),
])
def test_a_spec_has_the_command_lines_limits(tmp_path, capsys, job, needle):
    write(tmp_path, f"jobs:\n{TRAIN}  j: {job}\n")
    code, _, err = batch(capsys, tmp_path, "spec.yaml", "--dry-run")
    one_line(code, err, "spec.yaml:3", needle)


# --------------------------------------------------------------------------- run names (round four)


@pytest.mark.parametrize("job, run", [
    ("{kind: train, run: ../x}", "../x"),
    ("{kind: prune, run: ../p, ref: r0, remove: 0.5}", "../p"),
    ("{kind: align, run: ../al, ref_a: r0, ref_b: r0}", "../al"),
    ("{kind: import, run: /tmp/imp, file: w.pt, model: mlp, data: digits}", "/tmp/imp"),
    ("{kind: train, run: 'r-{s}', grid: {s: [1, ../y]}}", "r-../y"),
])
def test_a_run_name_that_escapes_is_refused_with_the_spec(tmp_path, capsys, monkeypatch, job, run):
    """Every kind's written runs follow the store's run-name rule at spec load (exit 2, before anything runs);
    train, align and prune used to be refused only when their job ran (exit 1)."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path, f"jobs:\n{TRAIN}  j: {job}\n")
    for args in (("--dry-run",), ()):
        code, _, err = batch(capsys, tmp_path, "spec.yaml", *args)
        one_line(code, err, "spec.yaml:3: jobs.j", f"it would write the run {run!r}", "bad run name")
    assert not (tmp_path / "checkpoints").exists() and tree(tmp_path) == ["spec.yaml"]
    with pytest.raises(SpecError, match=re.escape(f"it would write the run {run!r}")):
        load_spec(tmp_path / "spec.yaml")
