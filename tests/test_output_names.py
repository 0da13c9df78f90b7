"""Default output names are made of every reference and every option that changes the result, and a result under
a default name is never silently replaced (one line; `-o FILE` or `--overwrite`), while an interrupted surface
still resumes its partial file and an instability table still reuses its pair files."""

from __future__ import annotations

import itertools
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import run_cli

from landscape.api import calibration, hessian, instability, interpolate, ntk, surface
from landscape.data import load_dataset
from landscape.errors import OutputPathError
from landscape.models import build_model
from landscape.results.paths import NOT_IN_NAME, OPTIONS_IN_NAME, changed_options, output_stem
from landscape.store import Store

NO_FIG = dict(figure=False)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Three small MLP runs on digits (two checkpoints each), and a checkpoint file outside the store."""
    root = tmp_path_factory.mktemp("names") / "ck"
    data = load_dataset("digits", subset=120, seed=0)
    store = Store(root)
    for i, name in enumerate("ABC"):
        torch.manual_seed(i)
        model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes, widths=[8])
        run = store.create_run(name, config={"optimizer": "sgd"}, seeds={"seed": i}, model_spec=model.landscape_spec,
                               data_spec=data.spec)
        for step in (0, 5):
            run.save_checkpoint({k: v + 0.05 * step for k, v in model.state_dict().items()}, step=step,
                                epoch=float(step))
        run.close()
    return root


def created(path: Path) -> str:
    with h5py.File(path) as f:
        return str(f.attrs["created"])


def test_every_target_names_the_output_and_a_second_run_is_refused(root, capsys):
    code, out, err = run_cli("--root", root, "calibration", "A@last", "B@last", "--no-figure", capsys=capsys)
    assert code == 0, err
    assert "wrote results/calibration-A_last--B_last.h5" in out
    code, out, _ = run_cli("--root", root, "calibration", "A@last", "C@last", "--no-figure", capsys=capsys)
    assert code == 0 and "wrote results/calibration-A_last--C_last.h5" in out
    first = Path("results/calibration-A_last--B_last.h5")
    before = (created(first), first.stat().st_mtime_ns)
    assert calibration(["A@last", "B@last"], root=root, output="x.h5", **NO_FIG).path == Path("x.h5")

    # the same command again: one line naming the file and the two ways out, nothing written
    code, _, err = run_cli("--root", root, "calibration", "A@last", "B@last", "--no-figure", capsys=capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: refusing to replace {first}:") and "pass --output to write another file" in err and "--overwrite" in err
    assert (created(first), first.stat().st_mtime_ns) == before
    with pytest.raises(OutputPathError, match="refusing to replace results/calibration-A_last--B_last.h5"):
        calibration(["A@last", "B@last"], root=root, **NO_FIG)
    code, _, err = run_cli("--root", root, "calibration", "A@last", "B@last", "--no-figure", "--overwrite",
                           capsys=capsys)
    assert code == 0, err
    assert first.stat().st_mtime_ns != before[1]
    again = calibration(["A@last", "B@last"], root=root, overwrite=True, **NO_FIG)
    assert again.path == first

    # options that change the result are in the name; memory and device options are not
    bins = calibration(["A@last", "B@last"], root=root, bins=10, split="train", **NO_FIG)
    assert bins.path == Path("results/calibration-A_last--B_last-bins=10-split=train.h5")
    with pytest.raises(OutputPathError):
        calibration(["A@last", "B@last"], root=root, chunk=7, device="cpu", **NO_FIG)
    # an explicit -o names the file to write: a result there is replaced
    code, _, err = run_cli("--root", root, "calibration", "A@last", "-o", "x.h5", "--no-figure", capsys=capsys)
    assert code == 0, err


def test_hessian_and_ntk_names_hold_every_target_and_the_docs_cli_and_python_blocks_differ(root):
    a = hessian("A@last", root=root, top_k=2, subset=40, **NO_FIG)  # hessian.md's command, smaller
    b = hessian(["A@last", "B@last"], root=root, top_k=1, trace=True, probes=2, subset=40, **NO_FIG)
    assert a.path == Path("results/hessian-A_last-top_k=2-subset=40.h5")
    assert b.path == Path("results/hessian-A_last--B_last-top_k=1-trace-subset=40-probes=2.h5")
    whole = hessian(["A"], root=root, top_k=1, subset=40, **NO_FIG)  # a bare run: every checkpoint, its own name
    assert whole.path == Path("results/hessian-A-top_k=1-subset=40.h5") and len(whole.rows) == 2
    k = ntk("B@init", root=root, subset=6, **NO_FIG)
    assert k.path == Path("results/ntk-B_init-subset=6.h5")
    files = Path("results").glob("*.h5")
    assert len({p.name for p in files}) == 4


def test_names_from_files_pairs_data_from_and_long_options(root, tmp_path):
    store = Store(root)
    for d in ("one", "two"):  # two checkpoint files of one name in two folders: two outputs
        (tmp_path / d).mkdir()
        (tmp_path / d / "ck.h5").write_bytes(store.resolve("C@last").read_bytes())
    paths = [interpolate(f"{tmp_path}/{d}/ck.h5", "A@last", root=root, points=3, subset=30, **NO_FIG).path
             for d in ("one", "two")]
    assert paths[0] != paths[1] and all(p.name.startswith("interpolate-") and "--A_last-" in p.name for p in paths)
    b = interpolate("A@last", "B@last", root=root, points=3, subset=30, data_from="b", **NO_FIG)
    assert b.path == Path("results/interpolate-A_last--B_last-subset=30-points=3-data_from=b.h5")
    long = interpolate("A@last", "B@last", root=root, points=3, subset=30, subset_seed=12345, split="test",
                       **NO_FIG)
    stem = long.path.stem
    assert stem.startswith("interpolate-A_last--B_last-") and len(stem.rsplit("-", 1)[1]) == 8
    assert stem == output_stem("interpolate-A_last--B_last",
                               {"subset": 30, "subset_seed": 12345, "points": 3, "split": ("test",)})


def test_output_stem_and_changed_options_by_themselves():
    from landscape.analyze.specs import HessianConfig, SurfaceConfig

    assert changed_options(HessianConfig()) == {}
    assert changed_options(HessianConfig(top_k=3, chunk=7, device="cpu", precision="float64")) == {
        "top_k": 3, "precision": "float64"}  # memory and device options left out
    assert {"chunk", "device", "rows_per_call", "restart", "pair_dir"} <= NOT_IN_NAME
    assert output_stem("x", {}) == "x"
    assert output_stem("x", {"trace": True, "normalize": False, "tol": 1e-05}) == "x-trace-no_normalize-tol=1e-05"
    assert output_stem("x", {"split": ("train", "test"), "plane": "B@last,C"}) == "x-split=train_test-plane=B_last_C"
    many = {f"option_{i}": i for i in range(10)}
    hashed = output_stem("x", many)
    assert hashed == output_stem("x", dict(many)) and len(hashed) == len("x-") + 8
    assert hashed != output_stem("x", {**many, "option_0": 1}) and len("-".join(many)) > OPTIONS_IN_NAME
    assert changed_options(SurfaceConfig(plane="B,C", grid="3x3"))["plane"] == "B,C"


def test_an_interrupted_default_named_surface_resumes_and_overwrite_computes_it_again(root):
    class Stop(Exception):
        pass

    def stop(result, rows):
        raise Stop

    kw = dict(root=root, grid="3x3", range="-0.5:0.5", subset=30, split="test", **NO_FIG)
    whole = surface("A@last", output="whole.h5", **kw)
    with pytest.raises(Stop):
        surface("A@last", on_rows=stop, rows_per_call=1, **kw)
    (path,) = Path("results").glob("*.h5")  # grid, range, subset, split: too long written out, so a hash
    assert path.name.startswith("surface-A_last-") and len(path.stem) == len("surface-A_last-") + 8
    resumed = surface("A@last", **kw)  # the same default name: resumed, not refused
    assert resumed.path == path
    np.testing.assert_array_equal(resumed.values["test_loss"], whole.values["test_loss"])
    with pytest.raises(OutputPathError, match="refusing to replace"):  # starting afresh would replace it
        surface("A@last", restart=True, **kw)
    rows = []
    again = surface("A@last", overwrite=True, on_rows=lambda r, done: rows.extend(done), **kw)  # computed again
    assert sorted(rows) == [0, 1, 2] and again.path == path
    np.testing.assert_array_equal(again.values["test_loss"], whole.values["test_loss"])


def test_a_default_named_instability_table_reuses_its_pair_files(root, monkeypatch):
    import landscape.analyze.instability as inst

    kw = dict(root=root, pairs="all", points=3, subset=30, split="test", **NO_FIG)
    first = instability(["A", "B", "C"], **kw)
    assert first.path == Path("results/instability-A--B--C-subset=30-points=3-split=test-pairs=all.h5")
    pair_files = sorted(Path(str(first.path.with_suffix("")) + "-pairs").glob("*.h5"))
    assert len(pair_files) == len(list(itertools.combinations("ABC", 2)))
    first.path.unlink()  # killed before the table was written: the pairs are done
    first.csv_path.unlink()

    def no_recompute(*a, **k):
        raise AssertionError("a finished pair was recomputed")

    monkeypatch.setattr(inst, "interpolate_pair", no_recompute)
    again = instability(["A", "B", "C"], **kw)
    assert [r.instability_loss for r in again.rows] == [r.instability_loss for r in first.rows]
    with pytest.raises(OutputPathError):
        instability(["A", "B", "C"], **kw)


def test_a_default_name_taken_by_another_file_is_never_replaced(root):
    from landscape.api import norms

    target = Path("results/norms-A_last.h5")
    target.parent.mkdir()
    target.write_bytes(b"a user's file")
    for overwrite in (False, True):
        with pytest.raises(OutputPathError, match="it is not a landscape result file"):
            norms("A@last", root=root, overwrite=overwrite, **NO_FIG)
    assert target.read_bytes() == b"a user's file"
