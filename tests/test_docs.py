"""The documentation site builds with ``mkdocs build --strict``, and every example in its pages runs.

Each page of ``docs/`` is a tutorial: its ``bash`` / ``sh`` / ``console`` and ``python`` blocks run in order, in
one scratch directory per page (blocks of a page share its files and, for Python, one namespace). Markers, HTML
comments on the lines just before a block (invisible on the site), say how:

- ``<!-- run: skip "why" -->``: the block does not run here (a GPU, real CIFAR data, a cluster, a sketch).
- ``<!-- run: scale --epochs=1 --n=64 -->``: from here to the end of the page, commands that give
  these options run with these values instead (test scale; the page shows the real one);
  ``<!-- run: scale -->`` alone returns to the page's own values.
- ``<!-- run: sub "OLD" "NEW" -->``: replace text in the next block only (repeatable).
- ``<!-- run: tol 0.01 -->``: a ``console`` block's numbers must match within this relative tolerance
  (default: exactly, as printed); a ``*`` in a printed line matches any one word (a time).
- ``<!-- run: record NAME -->``: what the block prints (its commands' output, a Python block's stdout) is the
  generated file ``docs/generated/NAME``, which the page shows (``--8<-- "docs/generated/NAME"``). Here the
  block runs at test scale and must print the committed file's lines with only the numbers changed (at the
  page's own size, with no ``sub`` applied and no snippet made at test scale, the numbers too, within the
  block's ``tol``). ``python tests/test_docs.py --record [PAGE...]`` (``make docs-numbers``) runs the pages
  at their own size, every ``scale`` and ``sub`` ignored, and rewrites the files.

Prose numbers: ``<!-- numbers: NAME... -->`` on the line above a paragraph says where its numbers come from:
a generated file (``docs/generated/NAME``; a path with a ``/`` is relative to the repository, e.g. a
benchmark record or the figure gallery; ``SUMMARY.h5:GROUP`` is one group of a recipe's HDF5 summary) or ``page`` (the outputs the page's ``console`` blocks print, checked within their
tolerance). Every number of the paragraph must be one of theirs at the quoted precision (or a hundredfold, a
percentage) or, for a whole number, one the page's blocks contain (an option such as ``--epochs 10``); inline
code and references to a paper (``Thm. 3.2``) are left out (``test_quoted_numbers_come_from_...``).

A Python block whose first line is ``# NAME.py`` is that file: it is written, not run. A ``console`` block is
commands (``$ ...``) and the output they print: the printed lines must appear in the real output in order
(``...`` skips lines), numbers within the tolerance; an output starting with ``error:`` expects the command to
fail with that line. ``landscape ...`` runs as the ``landscape`` command in this process
(``cli.main.main``; one thread), ``python ...`` as a subprocess with this interpreter; ``examples/`` and
``benchmarks/`` are linked into the scratch directory, as if it were the repository root.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
NOT_RUN = {"ARCHITECTURE.md": "its recipes are followed as written by tests/toy_*.py",
           "api.md": "generated from docstrings"}
PAGES = sorted(p.name for p in DOCS.glob("*.md") if p.name not in NOT_RUN) + ["../README.md"]  # README: its tour
SHELL = {"bash", "sh", "console", "shell"}
SNIPPET = re.compile(r'^--8<-- "(docs/_snippets/[^"]+)"$', re.M)
GENERATED = DOCS / "generated"
SETUP: dict[tuple[str, bool], tuple[Path, bool]] = {}  # (snippet, record): its directory, made at test scale  # a snippet's finished directory, run once and copied into every page that includes it
NUMBER = re.compile(r"[(]?-?\d+(?:\.\d+)?(?:e[-+]?\d+)?%?[),;]?")


# ------------------------------------------------------------------------------------------------ parsing


def blocks(text: str):
    """(language, code, markers, line) for every fenced block of a page, markers = the run: comments before it."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,})(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        markers, j = [], i - 1
        while j >= 0 and lines[j].strip().startswith("<!-- run:"):
            markers.insert(0, lines[j].strip()[len("<!-- run:"):-len("-->")].strip())
            j -= 1
        body, i = [], i + 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        out.append((lang, "\n".join(body) + "\n", markers, j + 2))
        i += 1
    return out


def commands(code: str):
    """Shell commands of a block: continuation lines joined, comments dropped, env assignments split off."""
    joined = re.sub(r"\\\n\s*", " ", code)
    for line in joined.splitlines():
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        env = {}
        while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):
            key, value = argv.pop(0).split("=", 1)
            env[key] = value
        yield env, argv


def console(code: str):
    """(command line, expected output lines) pairs of a console block."""
    pairs = []
    for line in code.splitlines():
        if line.startswith("$ "):
            pairs.append([line[2:], []])
        elif pairs and line.strip():
            pairs[-1][1].append(line)
    return pairs


def scaled(argv: list[str], scale: dict[str, str]) -> list[str]:
    argv = list(argv)
    for i, arg in enumerate(argv[:-1]):
        if arg in scale:
            argv[i + 1] = scale[arg]
    return argv


# ------------------------------------------------------------------------------------------------ running


def run_landscape(argv: list[str]) -> tuple[int, str]:
    from cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main(["--threads", "1", *argv])
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return code, out.getvalue()


def run_command(env: dict, argv: list[str], scale: dict[str, str]) -> tuple[int, str]:
    start, argv = time.perf_counter(), scaled(argv, scale)
    try:
        return _run_command(env, argv)
    finally:
        if os.environ.get("DOCS_TIMES"):  # where the runner's time goes: DOCS_TIMES=1 pytest -s tests/test_docs.py
            print(f"{time.perf_counter() - start:6.1f} s  {shlex.join(argv)[:150]}", file=sys.__stderr__)


def _run_command(env: dict, argv: list[str]) -> tuple[int, str]:
    if argv[0] == "landscape":
        return run_landscape(argv[1:])
    if argv[0] == "python":
        proc = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=300,
                              env={**os.environ, **env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
        return proc.returncode, proc.stdout + proc.stderr
    raise AssertionError(f"cannot run {argv[0]!r} here: mark the block <!-- run: skip \"why\" -->")


def same_line(expected: str, actual: str, tol: float) -> bool:
    """Token by token: ``*`` matches any token (a time), numbers agree within ``tol`` (relative), words exactly."""
    want, got = expected.split(), actual.split()
    if len(want) != len(got):
        return False
    for e, a in zip(want, got, strict=True):
        if e == "*" or e == a:
            continue
        if not (NUMBER.fullmatch(e) and NUMBER.fullmatch(a)):
            return False
        e_, a_ = (float(x.strip("(),;%")) for x in (e, a))
        if abs(e_ - a_) > tol * max(abs(e_), abs(a_)):
            return False
    return True


def check_output(expected: list[str], actual: str, tol: float, where: str) -> None:
    lines = [line for line in actual.splitlines() if line.strip()]
    pos = 0
    for want in expected:
        if want.strip() == "...":
            continue
        while pos < len(lines) and not same_line(want.strip(), lines[pos].strip(), tol):
            pos += 1
        assert pos < len(lines), f"{where}: printed line not found (tolerance {tol}):\n  {want}\nin:\n{actual}"
        pos += 1


def run_page(name: str, scratch: Path, record: bool = False) -> int:
    """Run every block of a page; the number of blocks run. An included snippet (``--8<-- "docs/_snippets/X.md"``:
    the runs a page reads, shown on the page) runs once per session; its directory is copied into the page's.
    ``record``: at the page's own size, writing every ``record`` block's output to ``docs/generated/``; the
    page stops after its last ``record`` block."""
    for link in ("examples", "benchmarks"):
        (scratch / link).symlink_to(REPO / link)
    text = (DOCS / name).read_text()
    if record:  # nothing after the last recorded block
        lines = text.splitlines(keepends=True)
        last = max(i for i, line in enumerate(lines) if line.startswith("<!-- run: record "))
        opening = next(i for i in range(last + 1, len(lines)) if lines[i].lstrip().startswith("```"))
        fence = lines[opening].strip().rstrip("abcdefghijklmnopqrstuvwxyz")
        closing = next(i for i in range(opening + 1, len(lines)) if lines[i].strip() == fence)
        text = "".join(lines[:closing + 1])
    state = {"scale": {}, "namespace": {"__name__": "__docs__"}, "record": record, "reduced": False}
    ran, pos = 0, 0
    for m in SNIPPET.finditer(text):
        ran += run_text(text[pos:m.start()], name, scratch, state)
        snippet = m.group(1)
        if (snippet, record) not in SETUP:
            done = Path(tempfile.mkdtemp(prefix="docs-setup-"))
            for link in ("examples", "benchmarks"):
                (done / link).symlink_to(REPO / link)
            cwd = os.getcwd()
            os.chdir(done)
            setup = {"scale": {}, "namespace": {}, "record": record, "reduced": False}
            try:
                run_text((REPO / snippet).read_text(), snippet, done, setup)
            finally:
                os.chdir(cwd)
            SETUP[snippet, record] = done, setup["reduced"]
        done, reduced = SETUP[snippet, record]
        state["reduced"] = state["reduced"] or reduced  # the page reads runs made at test scale
        shutil.copytree(done, scratch, symlinks=True, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("examples", "benchmarks"))
        pos = m.end()
    return ran + run_text(text[pos:], name, scratch, state)


def run_text(text: str, name: str, scratch: Path, state: dict) -> int:
    scale, namespace, record = state["scale"], state["namespace"], state.get("record", False)
    ran = 0
    for lang, code, markers, line in blocks(text):
        where, tol, skip, target, own_size = f"docs/{name}:{line}", 0.0, None, None, not scale and not state["reduced"]
        for marker in markers:
            verb, *args = shlex.split(marker)
            if verb == "skip":
                assert args and args[0].strip(), f"{where}: a skip says why"
                skip = args[0]
            elif verb == "scale" and not args:  # back to the page's own sizes
                scale.clear()
                own_size = not state["reduced"]
            elif verb == "scale":
                scale.update(a.split("=", 1) for a in args)
                own_size = record
            elif verb == "sub":
                assert len(args) == 2 and args[0] in code, f"{where}: sub {args[0]!r} not in the block"
                if not record:
                    code, own_size = code.replace(args[0], args[1]), False
                    state["reduced"] |= name.startswith("docs/_snippets/")  # what a snippet makes, every page reads
            elif verb == "tol":
                tol = float(args[0])
            elif verb == "record":
                assert len(args) == 1 and re.fullmatch(r"[\w.-]+", args[0]), f"{where}: record NAME"
                target = GENERATED / args[0]
            else:
                raise AssertionError(f"{where}: unknown marker {marker!r}")
        if skip or lang not in SHELL | {"python"}:
            continue
        assert target is None or lang in ("bash", "sh", "python"), f"{where}: record a bash or python block"
        ran += 1
        printed = []
        if lang == "python" and re.match(r"# ([\w.-]+\.py)\n", code):  # a file the next commands name
            (scratch / code.split()[1]).write_text(code)
        elif lang == "python":
            sys.path.insert(0, str(scratch))  # `from metrics import ...`: a file an earlier block wrote
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out) if target else contextlib.nullcontext():
                    exec(compile(code, where, "exec"), namespace)  # noqa: S102 -- the docs' own examples
            finally:
                sys.path.remove(str(scratch))
            printed.append(out.getvalue())
        elif lang == "console":
            for cmd, expected in console(code):
                ((env, argv),) = commands(cmd)
                rc, out = run_command(env, argv, {} if record else scale)
                fails = bool(expected) and expected[0].startswith("error:")
                assert (rc != 0) == fails, f"{where}: `{cmd}` exited {rc}:\n{out}"
                check_output(expected, out, tol, f"{where}: `{cmd}`")
        else:
            for env, argv in commands(code):
                rc, out = run_command(env, argv, {} if record else scale)
                assert rc == 0, f"{where}: `{shlex.join(argv)}` exited {rc}:\n{out[-3000:]}"
                printed.append(out)
        if target and record:
            target.write_text("".join(printed))
            print(f"wrote {target.relative_to(REPO)}", file=sys.__stderr__)
        elif target:
            check_recorded(target, "".join(printed), tol if own_size else None, where)
    return ran


def check_recorded(path: Path, actual: str, tol: float | None, where: str) -> None:
    """The output of a ``record`` block against its committed file: the same lines, word for word, except the
    numbers (``tol`` None: at test scale, any number; else within ``tol``, relative)."""
    assert path.exists(), f"{where}: {path.relative_to(REPO)} is missing: make docs-numbers"
    want = [line.split() for line in path.read_text().splitlines() if line.strip()]
    got = [line.split() for line in actual.splitlines() if line.strip()]
    assert len(want) == len(got), f"{where}: {len(got)} lines printed, {path.name} has {len(want)}:\n{actual}"
    for w, g in zip(want, got, strict=True):
        same = len(w) == len(g) and all(
            a == b or (numeric(a) and numeric(b) and (tol is None or same_line(a, b, tol))) for a, b in zip(w, g, strict=False))
        assert same, f"{where}: printed\n  {' '.join(g)}\nwhere {path.name} has\n  {' '.join(w)}"


def numeric(token: str) -> bool:
    return bool(NUMBER.fullmatch(token)) or token.strip("(),;%").lower() in ("nan", "inf", "-inf")


@pytest.mark.parametrize("name", PAGES)
def test_every_example_of_the_page_runs(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LANDSCAPE_ROOT", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run_page(name, tmp_path)


def test_every_block_runs_or_says_why_not():
    """A shell or Python block that cannot run here carries a reason; the skipped ones are few."""
    kinds = {}
    for name in [*PAGES, *(f"_snippets/{p.name}" for p in (DOCS / "_snippets").glob("*.md"))]:
        lines = (DOCS / name).read_text().splitlines()
        for i, line in enumerate(lines):  # a marker sits directly above a block (or above another marker)
            if line.strip().startswith("<!-- run:"):
                following = next(x for x in lines[i + 1:] if not x.strip().startswith("<!-- run:"))
                assert following.lstrip().startswith("```"), f"docs/{name}:{i + 1}: a run marker not above a block"

        for lang, _, markers, line in blocks((DOCS / name).read_text()):
            if lang in SHELL | {"python"}:
                skip = [m for m in markers if m.startswith("skip")]
                kinds.setdefault("skip" if skip else "run", []).append(f"{name}:{line}")
    assert len(kinds["run"]) > 3 * len(kinds.get("skip", []))


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[dev]' brings it")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed: pip install -e '.[dev]' brings it")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()  # generated functions are documented too
    for name in ("landscape.api.train", "landscape.api.interpolate", "landscape.api.hessian", "landscape.recorder.Recorder",
                 "landscape.plugins.load", "landscape.evaluate.Metric", "landscape.persample.register_handler"):
        assert f'id="{name}"' in api, name


def test_the_demo_page_quotes_its_generated_output():
    """docs/demo.md shows `make demo`'s output from a generated file (docs/generated/demo-output.txt, `make
    docs-demo`), and every decimal number its prose quotes is a number of that file at the quoted precision (or a
    hundredfold: a percentage)."""
    page = (DOCS / "demo.md").read_text()
    output = (DOCS / "generated" / "demo-output.txt").read_text()
    assert '--8<-- "docs/generated/demo-output.txt"' in page
    printed = [abs(float(x)) for x in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", output)]
    quoted = re.findall(r"(?<![\w.])\d+\.\d+", re.sub(r"```.*?```", "", page, flags=re.S))
    assert len(quoted) > 20
    for number in quoted:
        half = 0.5 * 10 ** -len(number.split(".")[1])
        assert any(abs(x - float(number)) <= half + 1e-12 or abs(100 * x - float(number)) <= half + 1e-12
                   for x in printed), f"docs/demo.md quotes {number}"


# ------------------------------------------------------------------------------------------------ quoted numbers

QUOTED = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?=x\b|(?![\w.]))")  # 1.58x: a ratio is a number too
REFERENCE = re.compile(r"\b(?:Thm|Sec|Def|Figs?|Eqs?|eqs?|Table|App|Alg|Fact|Lemma|Prop)\.?\s+[A-Z]?\d+(?:\.\d+)*")
FIGURE = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def numbers_paragraphs(text: str):
    """(sources, paragraph, line) for every ``<!-- numbers: ... -->`` marker: the paragraph is the text below
    it up to the next blank line, inline code (options) and references to a paper (``Thm. 3.2``) left out."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.fullmatch(r"<!-- numbers: (.+) -->", line.strip())
        if m:
            end = next((j for j in range(i + 1, len(lines)) if not lines[j].strip()), len(lines))
            paragraph = re.sub(r"`[^`]*`", "", "\n".join(lines[i + 1:end]))
            yield m.group(1).split(), REFERENCE.sub("", paragraph), i + 1


def source_numbers(name: str, text: str, source: str) -> list[float]:
    if source == "page":  # what the page's console blocks print, which run_text checks within their tolerance
        printed = "\n".join(line for lang, code, _, _ in blocks(text) if lang == "console"
                            for _, lines in console(code) for line in lines)
    else:  # a generated file, or a path in the repository (a benchmark record, the figure gallery, a summary)
        source, _, group = source.partition(":")  # SUMMARY.h5:GROUP: that group of a summary only
        path = REPO / source if "/" in source else GENERATED / source
        assert path.is_file(), f"docs/{name}: numbers from a missing {path.relative_to(REPO)}"
        printed = summary_text(path, group) if path.suffix == ".h5" else path.read_text()
        if "<!-- gallery:begin" in printed:  # the figure gallery: only what `landscape figures` wrote, not the prose
            printed = printed.partition("<!-- gallery:begin")[2].partition("<!-- gallery:end -->")[0]
    return [abs(float(x)) for x in FIGURE.findall(printed)]


def summary_text(path: Path, group: str) -> str:
    """One group of an HDF5 summary (a figure recipe's ``NAME-SCALE.h5``, e.g. ``numbers/lr_grid``) as text: its
    datasets' values in full precision and its attributes. Name the smallest group that holds the quoted numbers:
    a whole summary holds so many numbers that a drifted one could match by chance."""
    import h5py
    import numpy as np

    with h5py.File(path, "r") as f:
        assert group in f, f"{path.relative_to(REPO)} has no group {group!r}"
        top = f[group]
        names: list[str] = []
        if isinstance(top, h5py.Group):
            top.visit(names.append)
        parts: list[str] = []
        for obj in [top, *(top[key] for key in names)]:
            parts += [str(value) for value in obj.attrs.values()]
            if isinstance(obj, h5py.Dataset) and obj.dtype.kind in "fiub":
                parts.append(" ".join(repr(float(x)) for x in np.asarray(obj[()], dtype=float).ravel()))
    return "\n".join(parts)


def check_quoted_numbers(name: str, text: str) -> None:
    """Every number of a ``numbers`` paragraph is one its sources print, at the quoted precision (or a hundredfold:
    a percentage), or a whole number among the page's own command options; a recorded file is shown on its page."""
    for record in re.findall(r"<!-- run: record (\S+) -->", text):
        assert f'--8<-- "docs/generated/{record}"' in text, f"docs/{name}: record {record} is not shown on the page"
    parameters = {abs(float(x)) for _, code, _, _ in blocks(text) for x in FIGURE.findall(code)}
    for sources, paragraph, line in numbers_paragraphs(text):
        printed = [x for source in sources for x in source_numbers(name, text, source)]
        quoted = QUOTED.findall(paragraph)
        assert any("." in q for q in quoted), f"docs/{name}:{line}: a numbers paragraph that quotes no result"
        for number in quoted:
            if "." not in number and float(number) in parameters:  # an option of the page's own commands
                continue
            half = 0.5 * 10 ** -len(number.partition(".")[2]) + 1e-12
            assert any(abs(x - float(number)) <= half or abs(100 * x - float(number)) <= half for x in printed), (
                f"docs/{name}:{line}: {number} is not a number of {', '.join(sources)}")


@pytest.mark.parametrize("name", PAGES)
def test_quoted_numbers_come_from_generated_or_checked_output(name):
    check_quoted_numbers(name, (DOCS / name).read_text())


def test_a_drifted_number_or_line_is_caught():
    """The checks bite: a quoted number the generated file does not print, a number off by more than the
    quoted precision, a recorded line whose words changed, a number outside a block's tolerance."""
    text = (DOCS / "ntk.md").read_text()  # Bu Fact A.4: closed form, the same on every machine
    quoted = "eigenvalues 0.08 and 5.02"
    assert quoted in text
    check_quoted_numbers("ntk.md", text.replace(quoted, "eigenvalues 0.080 and 5.0"))  # other roundings: fine
    for drifted in ("eigenvalues 0.09 and 5.02", "eigenvalues 0.08 and 5.021", "eigenvalues 0.08 and 4.02"):
        with pytest.raises(AssertionError, match="is not a number of ntk-fact-a4.txt"):
            check_quoted_numbers("ntk.md", text.replace(quoted, drifted))
    path = GENERATED / "geometry-theorem.txt"
    committed = path.read_text()
    check_recorded(path, committed.replace("2.4938", "2.5"), None, "here")  # test scale: any number
    check_recorded(path, committed.replace("2.4938", "2.49"), 0.01, "here")  # within a tolerance
    with pytest.raises(AssertionError, match="where geometry-theorem.txt has"):
        check_recorded(path, committed.replace("2.4938", "2.6"), 0.01, "here")
    with pytest.raises(AssertionError, match="where geometry-theorem.txt has"):
        check_recorded(path, committed.replace("bound_held False", "bound_held True"), None, "here")
    with pytest.raises(AssertionError, match="lines printed"):
        check_recorded(path, committed + "one more line\n", None, "here")


def test_a_drifted_gallery_summary_or_record_number_is_caught():
    """figures.md's verdict table is checked against the gallery, its lr-grid sentence against one group of a
    recipe's HDF5 summary (full precision, the quoted rounding), batch.md's speed-up against a benchmark record:
    a number moved past its last digit is caught."""
    text = (DOCS / "figures.md").read_text()
    for quoted, drifted, source in [("+14.8 points (p = 0.00852", "+44.8 points (p = 0.00852", "figures/README.md"),
                                    ("SGD 78.6 / 97.3", "SGD 78.6 / 97.7", "watson-fig16-17-cpu.h5:numbers/lr_grid")]:
        assert quoted in text
        with pytest.raises(AssertionError, match=f"is not a number of .*{re.escape(source)}"):
            check_quoted_numbers("figures.md", text.replace(quoted, drifted))
    with pytest.raises(AssertionError, match="has no group 'numbers/nothing'"):
        check_quoted_numbers("figures.md", text.replace(":numbers/lr_grid ", ":numbers/nothing ", 1))
    batch = (DOCS / "batch.md").read_text()  # a benchmark record; a ratio written 1.53x is a number too
    assert "**1.53x** faster" in batch
    with pytest.raises(AssertionError, match="1.62 is not a number of benchmarks/results/"):
        check_quoted_numbers("batch.md", batch.replace("**1.53x** faster", "**1.62x** faster"))


def test_every_generated_file_is_shown_and_made_by_a_page():
    """docs/generated/ holds what pages record and show (and the demo's output, `make docs-demo`), nothing stale."""
    texts = "\n".join((DOCS / name).read_text() for name in [*PAGES, *(f"_snippets/{p.name}" for p in (DOCS / "_snippets").glob("*.md"))])
    for path in GENERATED.iterdir():
        assert f'--8<-- "docs/generated/{path.name}"' in texts, f"{path.name} is shown by no page"
        assert path.name == "demo-output.txt" or f"<!-- run: record {path.name} -->" in texts, f"{path.name}: no page records it"


def record_pages(names: list[str]) -> None:
    """Rerun the pages that record generated files, at their own size (``make docs-numbers``)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.pop("LANDSCAPE_ROOT", None)
    names = names or [p for p in PAGES if re.search(r"^<!-- run: record ", (DOCS / p).read_text(), re.M)]
    for name in names:
        scratch = Path(tempfile.mkdtemp(prefix=f"docs-record-{Path(name).stem}-"))
        os.chdir(scratch)
        start = time.perf_counter()
        run_page(name, scratch, record=True)
        print(f"docs/{name}: {time.perf_counter() - start:.0f} s in {scratch}", file=sys.stderr)


if __name__ == "__main__":  # python tests/test_docs.py --record [PAGE.md ...]
    if sys.argv[1:2] != ["--record"]:
        sys.exit("usage: python tests/test_docs.py --record [PAGE.md ...]  (rewrites docs/generated/)")
    sys.path.insert(0, str(REPO))
    record_pages(sys.argv[2:])
