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
  page's own size, with no ``sub`` applied and no snippet made at test scale, the numbers too: see below).
  ``python tests/test_docs.py --record [PAGE...]`` (``make docs-numbers``) runs the pages at their own size,
  every ``scale`` and ``sub`` ignored, under several float-kernel settings (``KERNELS``: the code paths other
  x86-64 CPUs take), and rewrites the files: a number that differs between the settings is written as the range
  of its values, ``0.0863–0.1176``, a word as its alternatives, ``False/True``.
- ``<!-- run: spread NAME -->``: as ``record``, and the numbers are measured at other seeds too: every
  ``landscape train`` / ``phases`` command of the page without ``--seed`` runs with ``--seed`` 1 and 2 as well
  (``SPREAD_SEEDS``), so the ranges are over seeds and kernel settings. On a ``console`` block (the numbers a
  training prints) NAME holds its commands and the lines the page shows, with the measured numbers; the
  printed lines and the page's own must both be within them.

At the page's own size a number is checked against the generated file's: a range ``lo–hi`` widened by its
width on each side (another machine is one more draw, and a few draws seldom reach the extremes), a single
number within the block's ``tol``.

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
            main(["--threads", "1", "--quiet", *argv])  # progress lines depend on the machine's speed: pages omit them
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


def check_output(expected: list[str], actual: str, tol: float, where: str) -> list[str]:
    """The expected lines in the printed output, in order (``...`` skips lines); the printed lines they matched."""
    lines = [line for line in actual.splitlines() if line.strip()]
    pos, matched = 0, []
    for want in expected:
        if want.strip() == "...":
            continue
        while pos < len(lines) and not same_line(want.strip(), lines[pos].strip(), tol):
            pos += 1
        assert pos < len(lines), f"{where}: printed line not found (tolerance {tol}):\n  {want}\nin:\n{actual}"
        matched.append(lines[pos])
        pos += 1
    return matched


def run_page(name: str, scratch: Path, record: bool = False, seed: int | None = None,
             out: Path = GENERATED) -> int:
    """Run every block of a page; the number of blocks run. An included snippet (``--8<-- "docs/_snippets/X.md"``:
    the runs a page reads, shown on the page) runs once per session; its directory is copied into the page's.
    ``record``: at the page's own size, writing every ``record`` and ``spread`` block's output to ``out``; the
    page stops after its last such block. ``seed``: every ``landscape train`` / ``phases`` command that names no
    ``--seed`` gets this one (and only ``spread`` blocks are recorded, the page stopping after its last)."""
    for link in ("examples", "benchmarks"):
        (scratch / link).symlink_to(REPO / link)
    text = (DOCS / name).read_text()
    if record:  # nothing after the last recorded block
        lines = text.splitlines(keepends=True)
        kinds = ("<!-- run: spread ",) if seed is not None else ("<!-- run: record ", "<!-- run: spread ")
        last = max(i for i, line in enumerate(lines) if line.startswith(kinds))
        opening = next(i for i in range(last + 1, len(lines)) if lines[i].lstrip().startswith("```"))
        fence = lines[opening].strip().rstrip("abcdefghijklmnopqrstuvwxyz")
        closing = next(i for i in range(opening + 1, len(lines)) if lines[i].strip() == fence)
        text = "".join(lines[:closing + 1])
    state = {"scale": {}, "namespace": {"__name__": "__docs__"}, "record": record, "reduced": False, "seed": seed,
             "out": out}
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
            setup = {"scale": {}, "namespace": {}, "record": record, "reduced": False, "seed": seed, "out": out}
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
    scale, namespace, record, seed = state["scale"], state["namespace"], state.get("record", False), state.get("seed")
    ran = 0
    for lang, code, markers, line in blocks(text):
        where, tol, skip, target, own_size = f"docs/{name}:{line}", 0.0, None, None, not scale and not state["reduced"]
        over_seeds = False  # a spread block: measured at other seeds too
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
            elif verb in ("record", "spread"):
                assert len(args) == 1 and re.fullmatch(r"[\w.-]+", args[0]), f"{where}: {verb} NAME"
                target, over_seeds = GENERATED / args[0], verb == "spread"
            else:
                raise AssertionError(f"{where}: unknown marker {marker!r}")
        if skip or lang not in SHELL | {"python"}:
            continue
        assert target is None or over_seeds or lang != "console", f"{where}: a console block's numbers: spread NAME"
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
            shown, transcript = [], []  # a spread block: the page's lines and the printed ones, each command's
            for cmd, expected in console(code):
                ((env, argv),) = commands(cmd)
                rc, out = run_command(env, seeded(argv, seed), {} if record else scale)
                fails = bool(expected) and expected[0].startswith("error:")
                assert (rc != 0) == fails, f"{where}: `{cmd}` exited {rc}:\n{out}"
                if target is None:
                    check_output(expected, out, tol, f"{where}: `{cmd}`")
                    continue
                expected = [want for want in expected if want.strip() != "..."]
                matched = check_output(expected, out, float("inf"), f"{where}: `{cmd}`")  # the lines, any number
                shown += [f"$ {cmd}", *expected]
                transcript += [f"$ {cmd}", *(respell(got, ["*" if w == "*" else g for w, g in zip(want.split(), got.split(),
                                                                                                strict=True)])
                                             for want, got in zip(expected, matched, strict=True))]
            printed.append("\n".join(transcript) + "\n")
            if target and not record:  # what the page shows is within the measured spread, too
                check_recorded(target, "\n".join(shown), tol, f"{where} (the page)")
        else:
            for env, argv in commands(code):
                rc, out = run_command(env, seeded(argv, seed), {} if record else scale)
                assert rc == 0, f"{where}: `{shlex.join(argv)}` exited {rc}:\n{out[-3000:]}"
                printed.append(out)
        if target and record:
            if seed is None or over_seeds:  # a run at another seed records only the spread blocks
                (state["out"] / target.name).write_text("".join(printed))
        elif target:
            check_recorded(target, "".join(printed), tol if own_size else None, where)
    return ran


def seeded(argv: list[str], seed: int | None) -> list[str]:
    """A ``landscape train`` or ``phases`` command that names no ``--seed`` with ``--seed seed`` added (a spread's
    other seeds, ``make docs-numbers``); every other command as it is."""
    if seed is None or argv[:1] != ["landscape"] or not {"train", "phases"} & set(argv[1:4]):
        return argv
    return argv if {"--seed", "--resume"} & set(argv) else [*argv, "--seed", str(seed)]


def check_recorded(path: Path, actual: str, tol: float | None, where: str) -> None:
    """The output of a ``record`` (or ``spread``) block against its committed file: the same lines, word for word,
    except the numbers (``tol`` None: at test scale, any number; else as :func:`within`). A word the file gives as
    alternatives (``True/False``: it differed between kernel settings) may be either."""
    assert path.exists(), f"{where}: {path.relative_to(REPO)} is missing: make docs-numbers"
    want = [line.split() for line in path.read_text().splitlines() if line.strip()]
    got = [line.split() for line in actual.splitlines() if line.strip()]
    assert len(want) == len(got), f"{where}: {len(got)} lines printed, {path.name} has {len(want)}:\n{actual}"
    for w, g in zip(want, got, strict=True):
        same = len(w) == len(g) and all(within(a, b, tol) for a, b in zip(w, g, strict=True))
        assert same, f"{where}: printed\n  {' '.join(g)}\nwhere {path.name} has\n  {' '.join(w)}"


_VALUE = r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?%?)"
WORD_NUMBER = re.compile(rf"([(]?){_VALUE}([),;:]*)")  # a number as a word of a line: (1.71), 97.3%
SPREAD = re.compile(rf"([(]?){_VALUE}–{_VALUE}([),;:]*)")  # a range of numbers, as make docs-numbers writes it


def within(want: str, got: str, tol: float | None) -> bool:
    """A printed word against a generated file's: the same word (one of its ``a/b`` alternatives), or a number
    (``tol`` None: any) within ``tol`` (relative) of the file's number, or within the file's range ``lo–hi``
    (measured over kernel settings and seeds) widened by its own width on each side: another machine is one
    more draw, and a few draws seldom reach the extremes."""
    if want == got or (not numeric(want) and not SPREAD.fullmatch(want) and got in want.split("/")):
        return True
    spread = SPREAD.fullmatch(want)
    if not numeric(got) or not (spread or numeric(want)):
        return False
    if tol is None:
        return True
    lo, hi = (value(spread[2]), value(spread[3])) if spread else (value(want), value(want))
    x, width = value(got), max(hi - lo, tol * max(abs(lo), abs(hi)))
    return lo - width <= x <= hi + width


def value(token: str) -> float:
    return float(token.strip("(),;:%"))


def numeric(token: str) -> bool:
    return bool(NUMBER.fullmatch(token) or WORD_NUMBER.fullmatch(token)) or token.strip("(),;:%").lower() in (
        "nan", "inf", "-inf")


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
    for record in re.findall(r"<!-- run: (?:record|spread) (\S+) -->", text):
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


def test_a_spread_is_merged_and_a_number_outside_it_is_caught(tmp_path):
    """make docs-numbers' merge: numbers that differ between settings become their range (as printed, the table's
    columns padded again), words their alternatives; a line that exists under one setting only is an error. The
    check: a number within the range widened by its width passes, one beyond fails; a single number within tol."""
    native = "run  test_acc  test_loss  held\nsgd  0.98      0.1009     True\n\nratio (1.71), 97.3% done\n"
    other = "run  test_acc  test_loss  held\nsgd  0.9733    0.0863     False\n\nratio (2.05), 97.3% done\n"
    merged = merge_outputs({"native": native, "aten-default": other, "again": native}, "x.txt")
    assert merged == ("run  test_acc     test_loss      held\nsgd  0.9733–0.98  0.0863–0.1009  False/True\n\n"
                      "ratio (1.71–2.05), 97.3% done\n")
    with pytest.raises(AssertionError, match="other lines than under native"):
        merge_outputs({"native": native, "other": native + "one more line\n"}, "x.txt")
    path = tmp_path / "x.txt"
    path.write_text(merged)
    for printed in (native, other, native.replace("0.1009", "0.1155").replace("0.98 ", "0.9666 "),
                    native.replace("(1.71)", "(1.38)")):
        check_recorded(path, printed, 0.01, "here")
    for drifted in (native.replace("0.1009", "0.1156"), native.replace("True", "Maybe"),
                    native.replace("97.3%", "98.3%"), native.replace("(1.71)", "(1.36)")):
        with pytest.raises(AssertionError, match="where x.txt has"):
            check_recorded(path, drifted, 0.01, "here")
    check_recorded(path, native.replace("0.1009", "7"), None, "here")  # test scale: any number
    assert within("97.3%", "98.2%", 0.01) and not within("97.3%", "98.3%", 0.01)
    assert seeded(["landscape", "--root", "r", "train", "--run", "a"], 2) == ["landscape", "--root", "r", "train", "--run",
                                                                             "a", "--seed", "2"]
    assert seeded(["landscape", "train", "--seed", "3"], 2) == ["landscape", "train", "--seed", "3"]
    assert seeded(["landscape", "hessian", "sgd"], 2) == seeded(["landscape", "hessian", "sgd"], None)


def test_a_drifted_gallery_summary_or_record_number_is_caught():
    """figures.md's verdict table is checked against the gallery, its selection numbers against one group of a
    recipe's HDF5 summary (full precision, the quoted rounding), batch.md's speed-up against a benchmark record:
    a number moved past its last digit is caught."""
    text = (DOCS / "figures.md").read_text()
    for quoted, drifted, source in [("+15.0 points (p = 0.00739", "+73.3 points (p = 0.00739", "figures/README.md"),
                                    ("SGD 57.4 / 90.7", "SGD 57.4 / 96.7", "watson-fig16-17-cpu.h5:numbers/selection")]:
        assert quoted in text
        with pytest.raises(AssertionError, match=f"is not a number of .*{re.escape(source)}"):
            check_quoted_numbers("figures.md", text.replace(quoted, drifted))
    with pytest.raises(AssertionError, match="has no group 'numbers/nothing'"):
        check_quoted_numbers("figures.md", text.replace(":numbers/selection ", ":numbers/nothing ", 1))
    batch = (DOCS / "batch.md").read_text()  # a benchmark record; a ratio written 1.53x is a number too
    assert "**1.53x** faster" in batch
    with pytest.raises(AssertionError, match="1.62 is not a number of benchmarks/results/"):
        check_quoted_numbers("batch.md", batch.replace("**1.53x** faster", "**1.62x** faster"))


def test_every_generated_file_is_shown_and_made_by_a_page():
    """docs/generated/ holds what pages record and show (and the demo's output, `make docs-demo`), nothing stale."""
    texts = "\n".join((DOCS / name).read_text() for name in [*PAGES, *(f"_snippets/{p.name}" for p in (DOCS / "_snippets").glob("*.md"))])
    for path in GENERATED.iterdir():
        assert f'--8<-- "docs/generated/{path.name}"' in texts, f"{path.name} is shown by no page"
        assert path.name == "demo-output.txt" or re.search(rf"<!-- run: (record|spread) {re.escape(path.name)} -->", texts), (
            f"{path.name}: no page records it")


# ------------------------------------------------------------------------------------------------ make docs-numbers

#: The float kernels ``make docs-numbers`` runs every recorded page under, each in its own process: x86-64 CPUs
#: differ in which of these code paths torch takes (vector width, FMA, oneDNN's and MKL's CPU-specific code), and
#: training turns the last bit into percent-level differences. Each setting differs from the default on any
#: AVX2 or AVX-512 machine; on an AVX-512 machine the AVX2 paths are added (:func:`kernel_settings`).
KERNELS = {
    "native": {},                                       # what this CPU picks
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},  # ATen's kernels without AVX2 / AVX-512
    "onednn-sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41"},     # oneDNN's (convolutions) SSE4.1 code
    "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"},       # MKL's (matrix products) SSE2 code path
}
#: A ``spread`` block is also measured with every training command of its page at these seeds (None: as written).
SPREAD_SEEDS = (None, 1, 2)


def kernel_settings() -> dict[str, dict[str, str]]:
    import torch

    settings = dict(KERNELS)
    if torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        settings["avx2"] = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    return settings


def record_pages(names: list[str], jobs: int | None = None) -> None:
    """``make docs-numbers``: run the pages that record generated files at their own size, under every kernel
    setting (:data:`KERNELS`; the pages with a ``spread`` block also at :data:`SPREAD_SEEDS`), ``jobs`` processes
    at a time (default: one per core), and write each file merged over them (:func:`merge_outputs`)."""
    marked = re.compile(r"^<!-- run: (record|spread) ", re.M)
    names = names or [p for p in PAGES if marked.search((DOCS / p).read_text())]
    spread_pages = [p for p in names if re.search(r"^<!-- run: spread ", (DOCS / p).read_text(), re.M)]
    work = Path(tempfile.mkdtemp(prefix="docs-numbers-"))
    runs = [(kernel, env, seed, names if seed is None else spread_pages)
            for seed in SPREAD_SEEDS for kernel, env in kernel_settings().items() if seed is None or spread_pages]
    start, waiting, running = time.perf_counter(), list(runs), []
    jobs = jobs or os.cpu_count() or 1
    print(f"make docs-numbers: {len(runs)} page runs ({len(KERNELS)} kernel settings, seeds {SPREAD_SEEDS} for "
          f"{', '.join(spread_pages) or 'no page'}), {jobs} at a time, in {work}", file=sys.stderr)
    failed = []
    while waiting or running:
        while waiting and len(running) < jobs:
            kernel, env, seed, pages = waiting.pop(0)
            out = work / f"{kernel}-seed{seed}"
            out.mkdir()
            log = (work / f"{kernel}-seed{seed}.log").open("w")
            proc = subprocess.Popen([sys.executable, __file__, "--variant", str(out), str(seed), *pages], stdout=log,
                                    stderr=subprocess.STDOUT, env={**os.environ, **env, "OMP_NUM_THREADS": "1",
                                                                   "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
            running.append((proc, out, log, time.perf_counter()))
        time.sleep(1)
        for job in [job for job in running if job[0].poll() is not None]:
            proc, out, log, began = job
            running.remove(job)
            log.close()
            print(f"  {out.name}: {'done' if proc.returncode == 0 else 'FAILED'} in {time.perf_counter() - began:.0f} s",
                  file=sys.stderr)
            if proc.returncode:
                failed.append(f"{out.name}: {Path(log.name).read_text()[-3000:]}")
    if failed:
        sys.exit("make docs-numbers: a page run failed, nothing written\n" + "\n".join(failed))
    outputs: dict[str, dict[str, str]] = {}
    for kernel, _, seed, _ in runs:
        for path in sorted((work / f"{kernel}-seed{seed}").iterdir()):
            outputs.setdefault(path.name, {})[f"{kernel}, seed {seed}"] = path.read_text()
    for name, texts in outputs.items():
        (GENERATED / name).write_text(merge_outputs(texts, name))
        spread = "the same under every setting" if len(set(texts.values())) == 1 else "ranges over " + ", ".join(texts)
        print(f"wrote docs/generated/{name} ({spread})", file=sys.stderr)
    print(f"make docs-numbers: {time.perf_counter() - start:.0f} s", file=sys.stderr)


def record_variant(out: Path, seed: int | None, names: list[str]) -> None:
    """One page run of :func:`record_pages`, in this process's kernel setting: the pages' files into ``out``."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.pop("LANDSCAPE_ROOT", None)
    for name in names:
        scratch = Path(tempfile.mkdtemp(prefix=f"docs-record-{Path(name).stem}-"))
        os.chdir(scratch)
        start = time.perf_counter()
        run_page(name, scratch, record=True, seed=seed, out=out)
        print(f"docs/{name}: {time.perf_counter() - start:.0f} s in {scratch}", file=sys.stderr)


def merge_outputs(texts: dict[str, str], name: str) -> str:
    """One generated file from a block's outputs under several settings (the first one's layout): the same lines,
    word for word; a number that differs becomes the range of its values as printed (``0.0863–0.1176``, widths of
    columns adjusted), a word that differs its alternatives (``False/True``)."""
    (first, base), *others = texts.items()
    base_lines = base.splitlines()
    split = {label: [line.split() for line in text.splitlines()] for label, text in texts.items()}
    for label, lines in split.items():
        shapes = [len(line) for line in lines] == [len(line.split()) for line in base_lines]
        assert shapes, f"{name}: the output under {label} has other lines than under {first}: the page prints " \
                       f"something that depends on the machine beyond its numbers"
    merged = []
    for i, line in enumerate(base_lines):
        words = []
        for column in zip(*(lines[i] for lines in split.values()), strict=True):
            if len(set(column)) == 1:
                words.append(column[0])
            elif all(WORD_NUMBER.fullmatch(w) for w in column) and len({WORD_NUMBER.fullmatch(w).expand(r"\1\3")
                                                                         for w in column}) == 1:
                lo, hi = (WORD_NUMBER.fullmatch(min(column, key=value)), WORD_NUMBER.fullmatch(max(column, key=value)))
                words.append(f"{lo[1]}{lo[2]}–{hi[2]}{lo[3]}")
            else:
                words.append("/".join(sorted(set(column))))
        merged.append(respell(line, words))
    return "\n".join(realign(base_lines, merged)) + ("\n" if base.endswith("\n") else "")


def respell(line: str, words: list[str]) -> str:
    """``line`` with its words replaced by ``words``, in order, the spaces between them kept."""
    spans = list(re.finditer(r"\S+", line))
    assert len(spans) == len(words)
    return "".join(line[(spans[j - 1].end() if j else 0):span.start()] + words[j] for j, span in enumerate(spans)) + (
        line[spans[-1].end():] if spans else line)


def realign(base: list[str], merged: list[str]) -> list[str]:
    """Columns of a table (consecutive lines of as many words, aligned in ``base``) padded again to their widest
    word in ``merged``, two spaces apart."""
    out, i = list(merged), 0
    while i < len(base):
        words = len(base[i].split())
        j = i
        while j < len(base) and words >= 3 and len(base[j].split()) == words:
            j += 1
        starts = {tuple(m.start() for m in re.finditer(r"\S+", base[k])) for k in range(i, j)}
        if j - i >= 2 and len(starts) == 1:
            rows = [out[k].split() for k in range(i, j)]
            widths = [max(len(row[c]) for row in rows) for c in range(words)]
            out[i:j] = ["  ".join(w.ljust(widths[c]) for c, w in enumerate(row)).rstrip() for row in rows]
        i = max(j, i + 1)
    return out


if __name__ == "__main__":  # python tests/test_docs.py --record [PAGE.md ...]
    sys.path.insert(0, str(REPO))
    if sys.argv[1:2] == ["--variant"]:  # one page run of --record (its own process: a kernel setting is per process)
        record_variant(Path(sys.argv[2]), None if sys.argv[3] == "None" else int(sys.argv[3]), sys.argv[4:])
    elif sys.argv[1:2] == ["--record"]:
        record_pages(sys.argv[2:], jobs=int(os.environ.get("DOCS_JOBS", "0")) or None)
    else:
        sys.exit("usage: python tests/test_docs.py --record [PAGE.md ...]  (rewrites docs/generated/; DOCS_JOBS=N: "
                 "N page runs at a time, default one per core)")
