"""Shared test setup: one torch thread (two ran 25-35x slower on the 2-core CI machine), no GUI backend."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _work_in_tmp_path(tmp_path, monkeypatch):
    """Run every test in its own directory, so default outputs (results/, checkpoints/) never land in the repo."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session")
def figures_test_made(tmp_path_factory):
    """Every registered figure recipe at ``--scale test`` through the CLI, once per session: ``(out, root)``.

    Recipe tests read the summaries and the store from here instead of running their recipes again.
    """
    from cli import main as cli_main

    out = tmp_path_factory.mktemp("figs")
    root = out / "store"
    with pytest.raises(SystemExit) as exc:
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
