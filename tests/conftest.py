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
