"""One executor for every analysis' parallel parts: ``--workers N`` (local spawned processes) and
``--scheduler ADDRESS`` (a Dask cluster) run the same jobs and give identical arrays; the two are exclusive; an
unreachable scheduler is one line. The cluster is a LocalCluster on 127.0.0.1 that the test starts and stops."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from landscape.data import load_dataset
from landscape.models import build_model
from landscape.results import read_result
from landscape.store import Store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two runs with three checkpoints each on digits (no training: seeded perturbations)."""
    root = tmp_path_factory.mktemp("store")
    data = load_dataset("digits", seed=0, subset=120)
    store = Store(root)
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        model = build_model("lenet", input_shape=data.input_shape, num_classes=10,
                            channels=[2, 4], hidden=[8])
        run = store.create_run(name, config={"optimizer": "sgd"}, seeds={"seed": seed},
                               model_spec=model.landscape_spec, data_spec=data.spec)
        gen = torch.Generator().manual_seed(seed)
        for step in range(3):
            state = {k: v + 0.05 * step * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
            run.save_checkpoint(state, step=step, epoch=float(step))
    return root


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    c = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                 dashboard_address="127.0.0.1:0", worker_dashboard_address=None,
                                 silence_logs=logging.CRITICAL)
    try:
        yield c
    finally:
        c.close()


def _arrays(path):
    return dict(read_result(path).arrays)


def _same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


CASES = {
    "norms": (["a", "b"], dict(bins=8, subset=16)),
    "clipping": (["a"], dict(batch_size=32)),
    # with a user metric by reference: the workers (local or Dask) load it themselves (landscape.metrics)
    "surface": (["a@last"], dict(grid="3x3", range="-0.5:0.5", subset=60,
                                 metrics=['landscape.analyze.calibration:ECE{"bins": 5}'])),
    "directions": (["a@last"], dict(directions=4, points=3, distance=0.5, subset=60,
                                    metrics=["landscape.analyze.calibration:ECE"])),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_workers_and_dask_scheduler_give_identical_arrays(store, cluster, tmp_path, name):
    from landscape.api.runner import run

    refs, options = CASES[name]
    one = run(name, refs, root=store, output=tmp_path / "one.h5", figure=False, workers=1, **options)
    two = run(name, refs, root=store, output=tmp_path / "two.h5", figure=False, workers=2, **options)
    from distributed import Client, get_task_stream

    with Client(cluster, set_as_default=False) as client, get_task_stream(client) as tasks:
        dask = run(name, refs, root=store, output=tmp_path / "dask.h5", figure=False, scheduler=client, **options)
    ran = [t for t in tasks.data if str(t["key"]).startswith("('_dask_task") or "_dask_task" in str(t["key"])]
    assert ran, "no job ran on the cluster"
    base = _arrays(one.path)
    for other in (two, dask):
        arrays = _arrays(other.path)
        for timing in [k for k in base if "seconds" in k or "throughput" in k]:
            base.pop(timing), arrays.pop(timing, None)
        _same(base, arrays)


def test_instability_pairs_on_dask(store, cluster, tmp_path):
    from landscape.api import instability

    local = instability(pairs="a:b,a@init:b@init", root=store, output=tmp_path / "l.h5", figure=False, points=4)
    remote = instability(pairs="a:b,a@init:b@init", root=store, output=tmp_path / "d.h5", figure=False, points=4,
                         scheduler=cluster.scheduler_address)
    assert [r.instability_loss for r in local.rows] == [r.instability_loss for r in remote.rows]


def test_scheduler_and_workers_are_exclusive_and_a_dead_scheduler_is_one_line(store, tmp_path, capsys, monkeypatch):
    from cli.main import main
    from landscape import bounds

    monkeypatch.setattr(bounds, "SCHEDULER_TIMEOUT_S", 1)  # the wait the command states (10 s), shortened

    for args, code, text in (
        (["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], 2, "not both"),
        # unreachable: a failure (exit 1), after a line saying how long it waits
        (["--scheduler", "tcp://127.0.0.1:1"], 1, "cannot reach the Dask scheduler at tcp://127.0.0.1:1 within 1 s"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(["--root", str(store), "norms", "a", "--subset", "0", "--no-figure",
                  "-o", str(tmp_path / "n.h5"), *args])
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if not line.startswith("dask: connecting")]
        assert exc.value.code == code and len(lines) == 1 and text in err, err


def test_a_figure_recipe_runs_its_analyses_on_the_scheduler(cluster, tmp_path):
    """`figures --scheduler`: the recipe's analyses go to the cluster (the same numbers as in-process)."""
    from landscape.figures import figures
    from landscape.figures.recipe import read_summary

    local = figures(["watson-fig11"], scale="test", out=tmp_path / "local", root=tmp_path / "st")
    remote = figures(["watson-fig11"], scale="test", out=tmp_path / "dask", root=tmp_path / "st",
                     scheduler=cluster.scheduler_address)
    assert not remote[0].skipped
    a, _, _ = read_summary(local[0].path)
    b, _, _ = read_summary(remote[0].path)
    np.testing.assert_array_equal(a["R"], b["R"])
    with pytest.raises(Exception, match="not both"):
        figures(["watson-fig11"], scale="test", out=tmp_path / "x", root=tmp_path / "st", workers=2,
                scheduler=cluster.scheduler_address)
