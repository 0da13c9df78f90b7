"""The figures gallery and `figures all` robustness: README table and sections from the
summaries, hand-written text outside the markers kept, a failing recipe not stopping the others, settings changes
and --rerun remaking, and a SIGKILLed `figures` run resuming with finished recipes skipped (files untouched)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cli import main as cli_main
from landscape.figures import gallery, registry
from landscape.figures.recipe import PaperScale, Recipe, read_summary, summary_path
from landscape.verdict import Verdict, greater

ROOT = Path(__file__).resolve().parents[1]


def _make_ok(ctx):
    v = greater("A beats B", "toy paper, Fig. 1", [3.0, 3.1, 2.9], [1.0, 1.1, 0.9], names=("A", "B"), unit="seeds")
    return {"a": [3.0, 3.1, 2.9], "b": [1.0, 1.1, 0.9], "slope": ctx.settings["slope"]}, v


def _draw(d):
    from landscape.plots import style

    fig, ax = style.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, float(d.numbers.get("slope", 1.0))])
    return style.save_figure(fig, d.stem("figure"))


def _make_broken(ctx):
    raise RuntimeError("toy recipe exploded")


def _recipe(name, make, slope=1.0):
    return Recipe(name=name, paper="Toy et al. 2024 (a paper)", figure="Fig. 1", claim=f"{name} claim",
                  scaled_down="tiny", scales={"test": {"slope": slope}, "cpu": {"slope": slope}, "paper": {}},
                  paper_scale=PaperScale(data="digits", model="lenet", epochs=1, hyper="none", gpu_hours=0.5),
                  make=make, draw=_draw)


@pytest.fixture
def toys(monkeypatch):
    recipes = {"toy-a": _recipe("toy-a", _make_ok), "toy-b": _recipe("toy-b", _make_ok, slope=2.0)}
    monkeypatch.setattr(registry, "names", lambda: list(recipes))
    monkeypatch.setattr(registry, "get", lambda name: recipes[name])
    return recipes


def run(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        cli_main.main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_gallery_table_sections_and_hand_written_text_survive(toys, tmp_path, capsys):
    out = tmp_path / "gal"
    code, text, _ = run(capsys, "--root", str(tmp_path / "st"), "figures", "toy-a", "--scale", "test", "--out", str(out))
    assert code == 0 and f"gallery: {out / 'README.md'}" in text
    page = (out / "README.md").read_text()
    assert page.count(gallery.BEGIN) == 1 and page.count(gallery.END) == 1
    row_a = next(line for line in page.splitlines() if line.startswith("| [`toy-a`]"))
    row_b = next(line for line in page.splitlines() if line.startswith("| [`toy-b`]"))
    assert "| held |" in row_a and "mean A 3" in row_a and "sd A 0.1" in row_a and "Rule:" in row_a
    assert "| not made |" in row_b and "(1 of 2 recipes made)" in page
    assert "![toy-a](toy-a/toy-a-figure-test.png)" in page and (out / "toy-a" / "toy-a-figure-test.png").is_file()
    assert "`landscape figures toy-a --scale paper --data-root DIR`" in page and "0.5 GPU hours" in page
    assert "**Last made** in" in page and "landscape " in page  # wall time and code version of the run
    # a discussion written by hand outside the markers is kept when the gallery is regenerated
    (out / "README.md").write_text("# My gallery\n\nHand-written intro.\n\n" + page[page.index(gallery.BEGIN):]
                                   + "\n## Discussion\n\nWhat the numbers say.\n")
    code, _, _ = run(capsys, "--root", str(tmp_path / "st"), "figures", "toy-b", "--scale", "test", "--out", str(out))
    page = (out / "README.md").read_text()
    assert code == 0 and page.startswith("# My gallery\n\nHand-written intro.")
    assert page.rstrip().endswith("What the numbers say.") and "(2 of 2 recipes made)" in page
    assert page.count(gallery.BEGIN) == 1


def test_a_failing_recipe_does_not_stop_the_others(toys, tmp_path, capsys):
    toys["toy-a"] = _recipe("toy-a", _make_broken)
    out = tmp_path / "gal"
    code, text, err = run(capsys, "--root", str(tmp_path / "st"), "figures", "all", "--scale", "test", "--out", str(out))
    lines = err.splitlines()  # a progress line per recipe, then the one error line
    assert code == 1 and len(lines) == 3 and lines[-1].startswith("error: 1 of 2 recipes failed: toy-a: ")
    assert lines[0].startswith("figures: [1/2] toy-a failed") and lines[1].startswith("figures: [2/2] toy-b made")
    assert "RuntimeError: toy recipe exploded" in lines[-1]
    assert "toy-b [test] made" in text and summary_path(out, "toy-b", "test").is_file()
    assert not summary_path(out, "toy-a", "test").exists()
    assert "| [`toy-a`]" in (out / "README.md").read_text()  # the gallery is still written, toy-a "not made"


def test_changed_settings_and_rerun_remake_a_finished_recipe(toys, tmp_path, capsys):
    out, root = tmp_path / "gal", str(tmp_path / "st")
    path = summary_path(out, "toy-a", "test")
    run(capsys, "--root", root, "figures", "toy-a", "--scale", "test", "--out", str(out))
    first = path.stat().st_mtime_ns
    code, text, _ = run(capsys, "--root", root, "figures", "toy-a", "--scale", "test", "--out", str(out))
    assert "skipped (finished)" in text and path.stat().st_mtime_ns == first
    time.sleep(0.01)
    code, text, _ = run(capsys, "--root", root, "figures", "toy-a", "--scale", "test", "--out", str(out), "--rerun")
    assert code == 0 and "toy-a [test] made" in text and path.stat().st_mtime_ns != first
    second = path.stat().st_mtime_ns
    toys["toy-a"] = _recipe("toy-a", _make_ok, slope=5.0)  # new settings: the old summary is stale
    code, text, _ = run(capsys, "--root", root, "figures", "toy-a", "--scale", "test", "--out", str(out))
    assert "toy-a [test] made" in text and path.stat().st_mtime_ns != second


def test_killed_figures_run_resumes_with_finished_recipes_skipped(tmp_path):
    out, root = tmp_path / "gal", tmp_path / "st"
    cmd = [sys.executable, "-c", "from cli.main import main; main()", "--threads", "1", "--root", str(root),
           "figures", "watson-thm33", "watson-fig11", "--scale", "test", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    first = summary_path(out, "watson-thm33", "test")
    second = summary_path(out, "watson-fig11", "test")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.exists(), "the first recipe never finished"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert not second.exists()  # killed while the second recipe was running
    before, mtime = first.read_bytes(), first.stat().st_mtime_ns
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "watson-thm33 [test] skipped (finished)" in done.stdout and "watson-fig11 [test] made" in done.stdout
    assert first.read_bytes() == before and first.stat().st_mtime_ns == mtime
    numbers, verdict, _ = read_summary(second)
    assert numbers["R"].shape == (2, 2) and isinstance(verdict, Verdict)


def test_unreachable_scheduler_is_one_line_before_any_recipe_runs(toys, tmp_path, capsys):
    out = tmp_path / "gal"
    code, text, err = run(capsys, "--root", str(tmp_path / "st"), "figures", "toy-a", "--scale", "test", "--out",
                          str(out), "--scheduler", "tcp://127.0.0.1:1")
    # a well-formed address that nobody answers is a failure (exit 1), after the stated wait; malformed ones exit 2
    lines = err.splitlines()
    assert code == 1 and "cannot reach the Dask scheduler at tcp://127.0.0.1:1 within" in lines[-1]
    assert len(lines) == 2 and lines[0].startswith("dask: connecting to the scheduler at tcp://127.0.0.1:1"), err
    assert not out.exists() and text == ""


def _make_gated(ctx):
    """A toy recipe on two tiny real runs: one part judged from run a, one from run b."""
    from landscape.api import TrainConfig

    base = TrainConfig(model="lenet", data="digits", subset=120, epochs=1, batch_size=32, checkpoint_every="1e")
    a, b = ctx.train("a", base), ctx.train("b", base.__class__(**{**base.__dict__, "seed": 1}))
    v1 = ctx.judged(greater("part a", "toy", [3.0, 3.1, 2.9], [1.0, 1.1, 0.9]), [a])
    v2 = ctx.judged(greater("part b", "toy", [3.0, 3.1, 2.9], [1.0, 1.1, 0.9]), [f"{b.name}@last"])
    from landscape.verdict import all_of

    return {"x": [1.0]}, all_of("both", "toy", [v1, v2])


def test_a_run_failing_its_gate_makes_its_parts_inconclusive_invalid_regime(tmp_path):
    """The gate machinery on real runs: a floor no 1-epoch model reaches makes every part judged from those runs
    'inconclusive (invalid regime)' with the run and the reason; a floor of 0 leaves the rule's verdict; the gate
    numbers and which part rests on which run are in the summary."""
    import dataclasses
    import json

    import h5py

    from landscape.figures.recipe import Gate, make
    from landscape.verdict import INVALID

    recipe = dataclasses.replace(_recipe("toy-gate", _make_gated), gates={"test": Gate(min_acc=0.999)})
    made = make(recipe, scale="test", out=tmp_path / "out", root=tmp_path / "store")
    assert made.verdict.held is None and all(p.held is None for p in made.verdict.parts)
    assert made.verdict.parts[0].note.startswith(INVALID) and "toy-gate-test-a: " in made.verdict.parts[0].note \
        and "final test accuracy" in made.verdict.parts[0].note and "< floor 0.999" in made.verdict.parts[0].note
    assert "toy-gate-test-b" in made.verdict.parts[1].note
    numbers, _, _ = read_summary(made.path)
    with h5py.File(made.path, "r") as f:
        assert json.loads(f.attrs["gate_runs"]) == ["toy-gate-test-a", "toy-gate-test-b"]
        assert json.loads(f.attrs["gate_parts"]) == {"part a": ["toy-gate-test-a"], "part b": ["toy-gate-test-b"]}
        assert json.loads(f.attrs["gate"])["min_acc"] == 0.999
    assert numbers["gate/passed"].tolist() == [0.0, 0.0] and np.all(numbers["gate/final_acc"] < 0.999)
    row, section = gallery._section("toy-gate", recipe, tmp_path / "out", "test")  # the gallery says why
    assert "| *inconclusive* (2 parts: invalid regime) |" in row and "toy-gate" in section
    ok = dataclasses.replace(recipe, gates={"test": Gate(min_acc=0.0, max_drop=1.0, chance_loss=False)})
    again = make(ok, scale="test", out=tmp_path / "out2", root=tmp_path / "store")  # runs reused
    assert again.verdict.held is True and INVALID not in again.verdict.note
    assert read_summary(again.path)[0]["gate/passed"].tolist() == [1.0, 1.0]


def _make_weak(ctx):
    from landscape.verdict import all_of, paired_greater

    strong = paired_greater("A beats B", "toy", [3.0, 3.1, 2.9], [1.0, 1.1, 0.9])
    weak = paired_greater("C beats B", "toy", [1.5, 0.9, 1.4], [1.0, 1.1, 0.9])
    return {"a": [3.0]}, all_of("both", "toy", [strong, weak])


def test_parts_state_bounds_and_detectable_effects_and_a_stated_need_is_marked(monkeypatch, tmp_path, capsys):
    """A part that is inconclusive is reported as "no difference beyond X" with its minimum detectable effect; a
    recipe that states it needs 5 seeds has its 3-seed parts marked; the page counts claims and checks apart and
    states the multiplicity rule."""
    import dataclasses
    import json

    import h5py

    recipe = dataclasses.replace(_recipe("toy-w", _make_weak), needs=None)
    monkeypatch.setattr(registry, "names", lambda: ["toy-w"])
    monkeypatch.setattr(registry, "get", lambda name: recipe)
    out = tmp_path / "gal"
    assert run(capsys, "--root", str(tmp_path / "st"), "figures", "toy-w", "--scale", "test", "--out", str(out))[0] == 0
    _, verdict, _ = read_summary(summary_path(out, "toy-w", "test"))
    weak = verdict.parts[1]
    page = (out / "README.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| [`toy-w`]"))
    assert weak.held is None and f"no difference beyond {weak.numbers['ci high']:.3g}" in row
    assert f"detectable at 80% power: {weak.numbers['mde']:.3g}" in row
    assert "Reproduced claims: 0 held, 0 did not hold, 1 inconclusive" in page and "Holm" in page
    assert "**Scope.** at test scale" in page
    monkeypatch.setattr(registry, "get", lambda name: dataclasses.replace(recipe, needs=5))
    assert run(capsys, "--root", str(tmp_path / "st"), "figures", "toy-w", "--scale", "test", "--out", str(out),
               "--rerun")[0] == 0
    with h5py.File(summary_path(out, "toy-w", "test"), "r") as f:
        assert json.loads(f.attrs["needs"]) == 5
    row = next(line for line in (out / "README.md").read_text().splitlines() if line.startswith("| [`toy-w`]"))
    assert "(2 parts with fewer seeds than needed)" in row and "n 3 < the 5 it needs" in row
    assert "**Needs** 5 seeds per tested part" in (out / "README.md").read_text()


GALLERY = ROOT / "figures"


def _committed(name):
    """The committed gallery's summary of ``name`` when it was made by the current recipe code (else skip: the
    gallery predates it and must be regenerated)."""
    from landscape.figures.recipe import SUMMARY_FORMAT, summary_attrs

    path = GALLERY / name / f"{name}-cpu.h5"
    if not path.is_file() or int(summary_attrs(path).get("format", 0)) != SUMMARY_FORMAT:
        pytest.skip(f"{path} predates the current summary format: regenerate the gallery")
    return path


@pytest.mark.parametrize("name", registry.names())
def test_every_committed_gallery_png_redraws_from_its_summary_without_overlapping_text(name, tmp_path):
    """Every PNG the committed gallery shows for a recipe (main and side) is drawn again from the committed summary
    (cpu scale) by the recipe's own ``draw``: the same files, and no text element overlaps another or leaves the
    canvas."""
    from unittest import mock

    from conftest import text_problems

    from landscape.figures.recipe import drawing
    from landscape.plots import style

    path = _committed(name)
    _, _, figures = read_summary(path)
    problems, drawn = {}, []
    save = style.save_figure

    def check(fig, stem):
        problems[Path(stem).name] = text_problems(fig)  # draws the canvas: the layout as it is saved
        # the files' names only: rendering the pixels again (seconds a figure) is checked where recipes are made
        with mock.patch.object(fig, "savefig", lambda path, **_: Path(path).write_bytes(b"")):
            files = save(fig, stem)
        drawn.extend(files)
        return files

    with mock.patch.object(style, "save_figure", check):
        registry.get(name).draw(drawing(path, out=tmp_path))
    assert sorted(p.name for p in drawn) == sorted(p.name for p in figures)
    assert all((GALLERY / name / p.name).is_file() for p in drawn if p.suffix == ".png")
    assert {k: v for k, v in problems.items() if v} == {}


def test_the_committed_gallery_verdicts_recompute_from_its_hdf5():
    """tests/verdict_reference.py (scipy only) recomputes the covered recipes' verdicts from the committed summaries."""
    import verdict_reference as ref

    for name in ref.RECIPES:
        ok, message = ref.recompute(_committed(name))
        assert ok, message
