"""2-D surfaces (Li et al. 2018): closed form on a quadratic, [x, y] orientation, planes, resume, workers, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_directions import quadratic_problem  # noqa: I001

from cli import main as cli_main
from landscape.analyze.specs import SurfaceConfig
from landscape.analyze.surface import (
    SurfaceResult,
    checkpoint_plane,
    compute_surface,
    pending_rows,
    random_plane,
)
from landscape.errors import UsageError
from landscape.params import ParamSpace
from landscape.results import read_result
from landscape.store import Store


def q_of(h, w_star, w):
    d = w - w_star
    return float(0.5 * d @ h @ d)


def test_quadratic_surface_closed_form_and_orientation():
    model, h, w_star, w_a, w_b, x, y = quadratic_problem()
    space = ParamSpace.from_model(model)
    plane = random_plane(w_a, space, seed=2, normalize="none")
    config = SurfaceConfig(grid="5x3", range="-1:1,-0.5:2", split=("train",))
    result = compute_surface(model, plane, {"train": (x, y)}, config=config)
    loss = result.values["train_loss"]
    assert loss.shape == (5, 3)  # [x, y], not Li et al.'s [y, x]
    np.testing.assert_allclose(result.xcoordinates, np.linspace(-1, 1, 5))
    np.testing.assert_allclose(result.ycoordinates, np.linspace(-0.5, 2, 3))
    for i, xv in enumerate(result.xcoordinates):
        for j, yv in enumerate(result.ycoordinates):
            expected = q_of(h, w_star, w_a + xv * plane.dx + yv * plane.dy)
            assert loss[i, j] == pytest.approx(expected, rel=1e-10, abs=1e-12)
    assert result.complete and pending_rows(result) == []


def test_plane_through_three_checkpoints():
    model, h, w_star, w_a, w_b, x, y = quadratic_problem(seed=3)
    w_c = w_star - 0.2
    plane = checkpoint_plane(w_a, w_b, w_c)
    assert float(plane.dx @ plane.dy) == pytest.approx(0.0, abs=1e-12)
    for name, w in (("A", w_a), ("B", w_b), ("C", w_c)):
        mx, my = plane.markers[name]
        np.testing.assert_allclose(w_a + mx * plane.dx + my * plane.dy, w, atol=1e-12)
    bx, _ = plane.markers["B"]
    config = SurfaceConfig(plane="B,C", grid="3x3", range=f"0:{bx},-1:1", split=("train",))
    result = compute_surface(model, plane, {"train": (x, y)}, config=config)
    assert result.values["train_loss"][-1, 1] == pytest.approx(q_of(h, w_star, w_b), rel=1e-10)
    with pytest.raises(UsageError, match="one line"):
        checkpoint_plane(w_a, w_b, 2 * w_b - w_a)
    (x0, x1), (y0, y1) = plane.auto_ranges()
    for mx, my in plane.markers.values():
        assert x0 < mx < x1 and y0 < my < y1


@pytest.mark.parametrize("grid", ["25by25", "1x5", "x", "0"])
def test_bad_grid(grid):
    with pytest.raises(UsageError, match="^grid "):
        SurfaceConfig(grid=grid)


def test_config_parsing():
    c = SurfaceConfig(grid="7", range="-2:3", plane="pca:run-1")
    assert c.shape == (7, 7) and c.ranges == ((-2.0, 3.0), (-2.0, 3.0))
    assert c.plane_kind == "pca" and c.plane_refs == ["run-1"]
    assert SurfaceConfig(plane="a@last, b.h5").plane_refs == ["a@last", "b.h5"]
    for bad in ("1:1", "a:b", "0:1,2:1,3:4"):
        with pytest.raises(UsageError, match="^range "):
            SurfaceConfig(range=bad)


# ------------------------------------------------------------------------------------- store-backed


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Run 'traj': lenet on a digits subset, 4 checkpoints of a few SGD steps (a trajectory)."""
    from landscape.data import load_dataset
    from landscape.models import build_model

    root = tmp_path_factory.mktemp("store")
    data = load_dataset("digits", subset=150)
    torch.manual_seed(0)
    model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    run = Store(root).create_run("traj", config={}, seeds={}, model_spec=model.landscape_spec, data_spec=data.spec)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data.split("train")
    for step in range(4):
        run.save_checkpoint(model.state_dict(), step=step, epoch=float(step))
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    other = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
    Store(root).create_run("other", config={}, seeds={}, model_spec=other.landscape_spec,
                           data_spec=data.spec).save_checkpoint(other.state_dict(), step=0, epoch=0.0)
    return root


class Interrupt(Exception):
    pass


def test_interrupted_surface_resumes_to_the_same_arrays(store, tmp_path):
    from landscape.api import surface

    kw = dict(root=store, grid="5x4", range="-0.5:0.5", figure=False)  # one evaluate call for the whole grid
    whole = surface("traj@last", output=tmp_path / "whole.h5", **kw)
    seen: list[int] = []

    def stop_after_two(result, rows):
        seen.extend(rows)
        if len(seen) == 2:
            raise Interrupt

    out = tmp_path / "part.h5"
    with pytest.raises(Interrupt):  # rows written one by one this time
        surface("traj@last", output=out, on_rows=stop_after_two, rows_per_call=1, **kw)
    part = SurfaceResult.from_hdf5(out)
    assert part.done.all(axis=1).tolist() == [True, True, False, False, False]
    assert np.isnan(part.values["test_loss"][2:]).all()
    assert pending_rows(part) == [2, 3, 4]
    rest: list[int] = []
    resumed = surface("traj@last", output=out, on_rows=lambda r, rows: rest.append(rows), rows_per_call=2, **kw)
    assert rest == [[2, 3], [4]]
    again = SurfaceResult.from_hdf5(out)
    for key, value in whole.values.items():
        np.testing.assert_array_equal(resumed.values[key], value)
        np.testing.assert_array_equal(again.values[key], value)
    np.testing.assert_array_equal(again.xcoordinates, whole.xcoordinates)
    # a different surface in the same file is refused rather than mixed in
    with pytest.raises(UsageError, match="different surface"):
        surface("traj@last", output=out, seed=1, **kw)


def test_workers_fill_the_same_grid(store, tmp_path):
    """Blocks computed by spawned workers, interrupted, then finished serially: the serial run's arrays."""
    from landscape.api import surface

    kw = dict(root=store, grid="3x3", split=("train",), subset=60, figure=False)
    serial = surface("traj@last", output=tmp_path / "s.h5", **kw)
    out = tmp_path / "p.h5"
    first: list[list[int]] = []

    def stop(result, rows):
        first.append(rows)
        raise Interrupt

    with pytest.raises(Interrupt):
        surface("traj@last", output=out, workers=2, on_rows=stop, **kw)  # blocks [0, 1] and [2]
    part = SurfaceResult.from_hdf5(out)
    assert first[0] in ([0, 1], [2]) and part.done.all(axis=1).tolist() == [i in first[0] for i in range(3)]
    finished = surface("traj@last", output=out, **kw)
    np.testing.assert_array_equal(serial.values["train_loss"], finished.values["train_loss"])
    np.testing.assert_array_equal(serial.values["train_acc"], finished.values["train_acc"])


def test_a_partial_file_with_workers_in_its_params_resumes(store, tmp_path):
    """``workers`` left the configs (an execution option, not stored): a partial surface written before, whose
    params hold ``workers``, is still the same surface and resumes; the finished file's params drop it."""
    import h5py

    from landscape.api import surface

    kw = dict(root=store, grid="3x3", split=("train",), subset=60, figure=False, rows_per_call=1)
    whole = surface("traj@last", output=tmp_path / "whole.h5", **kw)
    assert "workers" not in read_result(whole.path).params
    out = tmp_path / "old.h5"
    done: list[list[int]] = []

    def stop(result, rows):
        done.append(rows)
        raise Interrupt

    with pytest.raises(Interrupt):
        surface("traj@last", output=out, on_rows=stop, **kw)
    with h5py.File(out, "r+") as f:  # what a file written before looked like
        f.attrs["params"] = json.dumps({**json.loads(f.attrs["params"]), "workers": 2})
    computed: list[list[int]] = []
    finished = surface("traj@last", output=out, on_rows=lambda r, rows: computed.append(rows), **kw)
    assert computed == [[1], [2]]  # only the missing rows
    np.testing.assert_array_equal(whole.values["train_loss"], finished.values["train_loss"])
    assert "workers" not in read_result(out).params


def test_pca_surface_cli(store, tmp_path, capsys):
    out = tmp_path / "pca.h5"
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["--root", str(store), "surface", "traj@last", "--plane", "pca:traj", "--grid", "4x3",
                       "--split", "train", "--3d", "-o", str(out), "--json"])
    captured = capsys.readouterr()
    assert exc.value.code == 0, captured.err
    summary = json.loads(captured.out)
    result = SurfaceResult.from_hdf5(out)
    assert result.plane_kind == "pca" and result.trajectory.shape == (4, 2)
    assert result.explained_variance.sum() <= 1 + 1e-12 and result.explained_variance[0] > 0.5
    np.testing.assert_allclose(result.trajectory[-1], 0.0, atol=1e-5)  # A = traj@last is the origin
    assert result.trajectory_steps.tolist() == [0, 1, 2, 3]
    assert len(result.inputs) == 1 + 4 and all(len(i.sha256) == 64 for i in result.inputs)
    names = sorted(p.rsplit("/", 1)[-1] for p in summary["figures"])
    assert names == sorted(f"pca-{k}.{e}" for k in ("contour", "filled", "3d") for e in ("png", "pdf"))
    (x0, x1), (y0, y1) = (result.xcoordinates[[0, -1]], result.ycoordinates[[0, -1]])
    assert (x0 <= result.trajectory[:, 0]).all() and (result.trajectory[:, 0] <= x1).all()
    assert (y0 <= result.trajectory[:, 1]).all() and (result.trajectory[:, 1] <= y1).all()


def test_incompatible_plane_checkpoint_is_one_line(store, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["--root", str(store), "surface", "traj@last", "--plane", "other@last,traj@init"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 1 and len(err) == 1 and err[0].startswith("error: incompatible models")
