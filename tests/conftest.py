"""Shared test setup: one torch thread (two ran 25-35x slower on the 2-core CI machine), no GUI backend."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import landscape  # noqa: E402,F401,I001 -- first: with $LANDSCAPE_PORTABLE=1 it pins torch's kernels
import torch  # noqa: E402,I001

torch.set_num_threads(1)


import pytest  # noqa: E402


def run_cli(*args, capsys) -> tuple[int, str, str]:
    """Run the ``landscape`` entry point in-process on ``args`` (each passed through ``str``): ``(exit code,
    stdout, stderr)`` of this command alone. A traceback on stderr fails the test: every error is one line.

    The one CLI runner of the test modules (``from conftest import run_cli``); ``capsys`` is the calling test's.
    """
    from cli.main import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return exit_.value.code, out, err


@pytest.fixture(autouse=True)
def _work_in_tmp_path(tmp_path, monkeypatch):
    """Run every test in its own directory, so default outputs (results/, checkpoints/) never land in the repo."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _no_progress_lines(monkeypatch):
    """Tests compare a command's stderr line by line; its progress lines (2 s after work begins, then every 10 s)
    would come and go with the machine's load. Here the first comes after hours; tests/test_progress.py sets the
    interval it tests (subprocesses inherit this one)."""
    monkeypatch.setenv("LANDSCAPE_PROGRESS_INTERVAL", "86400")


@pytest.fixture(autouse=True)
def _progress_ends_with_the_test():
    """A command run by ``main`` turns progress on in a context of its own; a test that invokes the click group
    directly (``CliRunner().invoke(cli, ...)``) turns it on in the test's: it must not outlive that test."""
    from landscape import progress

    token = progress._DISPLAY.set(None)
    yield
    progress._DISPLAY.reset(token)


@pytest.fixture(scope="session")
def figures_test_made(tmp_path_factory):
    """Every registered figure recipe at ``--scale test`` through the CLI, once per session: ``(out, root)``.

    Recipe tests read the summaries and the store from here instead of running their recipes again.
    """
    from unittest import mock

    from cli import main as cli_main
    from landscape.plots import style

    out = tmp_path_factory.mktemp("figs")
    root = out / "store"
    save = style.save_figure

    def save_and_check(fig, stem):  # every recipe figure's text layout, as drawn (test_figures_recipes.py)
        FIGURE_TEXT_PROBLEMS[str(stem)] = text_problems(fig)
        return save(fig, stem)

    with mock.patch.object(style, "save_figure", save_and_check), pytest.raises(SystemExit) as exc:
        cli_main.main(["--root", str(root), "figures", "all", "--scale", "test", "--out", str(out)])
    assert exc.value.code == 0
    return out, root


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped when torch.cuda.is_available() is False)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


FIGURE_TEXT_PROBLEMS: dict[str, list[str]] = {}  # figure stem -> overlapping / clipped text (filled by the above)


def text_problems(fig) -> list[str]:
    """Text elements of ``fig`` that overlap another text element or leave the canvas, from matplotlib's rendered
    bounding boxes (drawn under the recipes' style, as saved)."""
    import itertools
    from unittest import mock

    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    from landscape.plots.style import STYLE

    boxes = []
    draw = Text.draw

    def recording(self, renderer):  # only what is drawn (stale tick labels outside the view are not)
        draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            boxes.append((self, self.get_window_extent(renderer)))

    with matplotlib.rc_context(STYLE), mock.patch.object(Text, "draw", recording):
        FigureCanvasAgg(fig).draw()
    page = fig.bbox
    problems = []
    for t, b in boxes:
        if b.x0 < page.x0 - 1 or b.y0 < page.y0 - 1 or b.x1 > page.x1 + 1 or b.y1 > page.y1 + 1:
            problems.append(f"{t.get_text()!r} leaves the canvas")
    for (t1, b1), (t2, b2) in itertools.combinations(boxes, 2):
        w = min(b1.x1, b2.x1) - max(b1.x0, b2.x0)
        h = min(b1.y1, b2.y1) - max(b1.y0, b2.y0)
        if w > 1 and h > 1:  # more than a pixel each way
            problems.append(f"{t1.get_text()!r} overlaps {t2.get_text()!r}")
    return problems


# ------------------------------------------------------------------------------ parallel runs (pytest-xdist)

#: test files that share an expensive session fixture: one worker runs them, so the fixture is made once
_SAME_WORKER = {"tests/test_figures_recipes.py": "tests/test_figures.py"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``make test`` runs the suite on every core (``-n auto``, one thread each). Work goes out a file at a time, so a
    module's fixtures are made once; the docs pages' examples (tens of seconds each) go out one by one, so no
    worker is left with all of them; files go in collection order (the slow ones are not held back to the end)."""
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            if "::test_every_example_of_the_page_runs[" in nodeid:
                return nodeid
            return _SAME_WORKER.get(file, file)

    config.option.loadscopereorder = False
    return Scheduling(config, log)
