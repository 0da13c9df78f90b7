"""The analysis registry, the generated CLI, the dataclass codec, the resolver's data check and the pool."""

import copy
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import typing
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from cli.generate import command
from landscape.analyze import registry
from landscape.analyze.interpolate import InterpolationResult
from landscape.analyze.specs import InterpolateConfig
from landscape.data import load_dataset
from landscape.models import build_model
from landscape.options import cli_fields
from landscape.results import read_dataclass, read_result, stored, write_dataclass
from landscape.store import Store

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------ registry + CLI


@pytest.mark.parametrize("name", registry.names())
def test_every_config_field_has_its_option_and_every_option_its_field(name):
    spec = registry.get(name)
    cmd = command(name)
    options = {p.name for p in cmd.params if isinstance(p, __import__("click").Option) and not p.hidden}
    runner = {"data_from", "workers", "scheduler", "data_root", "no_figure", "output", "overwrite", "as_json"}
    assert not any(getattr(p, "hidden", False) for p in cmd.params)
    fields = {f.name for f in cli_fields(spec.config)}
    fields |= {f.name for f in cli_fields(spec.run_options)} if spec.run_options else set()
    assert fields - options == set()
    assert options - fields <= runner
    hidden = {f.name for f in dataclasses.fields(spec.config)} - fields
    assert not hidden & options  # api-only fields stay off the command line
    for f in cli_fields(spec.config):  # every option has help text and its default
        opt = next(p for p in cmd.params if p.name == f.name)
        assert f.metadata["help"] and opt.help == f.metadata["help"]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if not opt.is_flag:
            assert opt.default == (",".join(map(str, default)) if isinstance(default, tuple) else default)


def test_spec_names_and_inputs_are_consistent():
    for name in registry.names():
        spec = registry.get(name)
        assert spec.name == name and spec.inputs in registry.INPUT_MODES and spec.doc
        hints = typing.get_type_hints(spec.config)
        assert all(f.name in hints for f in dataclasses.fields(spec.config))
    with pytest.raises(KeyError, match="no analysis named"):
        registry.get("nope")


def test_help_imports_neither_torch_nor_matplotlib():
    code = ("import sys\nfrom cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules, 'heavy import'\n"
            "print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("ok"), proc.stderr
    text = " ".join(proc.stdout.split())  # --help wraps long lines
    for name in registry.names():
        assert f"{name} {registry.summary(name)}" in text


def test_plots_change_no_global_state(tmp_path):
    code = textwrap.dedent("""
        import sys, matplotlib, numpy as np
        before = matplotlib.rcParams.copy()  # copy() does not resolve (and import) the backend
        from landscape.plots.interpolate import plot_interpolation
        from landscape.plots.style import save_figure
        from landscape.analyze.interpolate import InterpolationResult
        r = InterpolationResult(alpha=np.linspace(0, 1, 3), loss={"test": np.ones(3)}, acc={"test": np.ones(3)},
                                instability_loss={"test": 0.0}, instability_error={"test": 0.0})
        files = save_figure(plot_interpolation(r, title="t"), sys.argv[1])
        assert all(f.stat().st_size > 0 for f in files)
        assert "matplotlib.pyplot" not in sys.modules, "pyplot imported"
        after = matplotlib.rcParams.copy()
        assert {k for k in before if str(before[k]) != str(after[k])} == set(), "rcParams changed"
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "fig")], capture_output=True, text=True,
                          cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


# ------------------------------------------------------------------------------------------- codec


@dataclasses.dataclass
class _Row:
    name: str
    note: str | None
    value: float
    per: dict[str, float] = stored("column", name="v_{}")


@dataclasses.dataclass
class _Table:
    rows: list[_Row] = stored("table", order="keys", count="n_rows")
    keys: tuple[str, ...] = stored("attr", default=())
    grid: np.ndarray = stored("array", default=None, dims=("x", "y"))
    x: np.ndarray = stored("array", default=None, dims=("x",))
    per_key: dict[str, np.ndarray] = stored("array", name="{}_curve", dims=("x",), order="keys",
                                            default_factory=dict)
    seconds: float = math.nan
    count: int = 0
    path: Path | None = None


def test_codec_round_trip_frame_and_xarray(tmp_path):
    t = _Table(rows=[_Row("a", None, 1.5, {"z": 1.0, "b": 2.0}), _Row("b", "n", math.nan, {"z": 3.0, "b": 4.0})],
               keys=("z", "b"), grid=np.arange(6.0).reshape(3, 2), x=np.array([0.1, 0.2, 0.3]),
               per_key={"z": np.ones(3), "b": np.zeros(3)}, seconds=2.5, count=3)
    path = write_dataclass(t, tmp_path / "t.h5", "test-table")
    back = read_dataclass(_Table, path, "test-table")
    assert [r.name for r in back.rows] == ["a", "b"] and back.rows[0].note is None and back.rows[1].note == "n"
    assert list(back.rows[0].per) == ["z", "b"] and back.rows[1].per == {"z": 3.0, "b": 4.0}
    assert math.isnan(back.rows[1].value) and back.keys == ("z", "b") and back.count == 3 and back.seconds == 2.5
    np.testing.assert_array_equal(back.grid, t.grid)
    assert list(back.per_key) == ["z", "b"]
    with h5py.File(path) as f:
        assert f.attrs["n_rows"] == 2 and f.attrs["keys"] == "z,b"
        assert json.loads(f.attrs["table"]) == ["name", "note", "value", "v_z", "v_b"]
    frame = read_result(path).to_frame()
    assert list(frame.columns) == ["name", "note", "value", "v_z", "v_b"]
    assert frame["name"].tolist() == ["a", "b"] and frame["v_b"].tolist() == [2.0, 4.0]
    ds = read_result(path).to_xarray()
    try:
        assert ds["grid"].dims == ("x", "y") and ds["z_curve"].dims == ("x",)
        np.testing.assert_array_equal(ds["x"].values, t.x)
        np.testing.assert_array_equal(ds["y"].values, [0, 1])  # an index for a dimension without coordinates
    finally:
        ds.close()


@dataclasses.dataclass
class _Spectrum:
    n: int
    symmetric: bool
    eigvals: np.ndarray  # complex: stored as eigvals_real / eigvals_imag


@dataclasses.dataclass
class _Point:
    step: int
    stats: _Spectrum = stored("nested", name="s_")
    hist: np.ndarray = stored("array")


@dataclasses.dataclass
class _Group:
    label: str = stored("array", name="labels")
    names: list[str] = stored("group", name="g/{}/names")
    points: list[_Point] = stored("group", name="g/{}/", default_factory=list)


@dataclasses.dataclass
class _Nested:
    top: _Spectrum = stored("nested")
    other: _Spectrum = stored("nested", name="K_")
    groups: list[_Group] = stored("table", count="n_groups")

    def derived(self):
        return {"extra": np.arange(len(self.groups))}, {"table": json.dumps(["labels", "extra"])}, {}


def _spectrum(n, seed):
    rng = np.random.default_rng(seed)
    return _Spectrum(n=n, symmetric=bool(seed % 2), eigvals=rng.normal(size=n) + 1j * rng.normal(size=n))


def test_codec_nested_prefixes_complex_arrays_and_per_row_groups(tmp_path):
    groups = [_Group("a", ["w", "b"], [_Point(0, _spectrum(2, 1), np.arange(3.0)), _Point(5, _spectrum(2, 2), np.ones(3))]),
              _Group("b", ["only"], [_Point(1, _spectrum(2, 3), np.zeros(3))])]
    t = _Nested(top=_spectrum(3, 4), other=_spectrum(4, 5), groups=groups)
    path = write_dataclass(t, tmp_path / "n.h5", "nested")
    with h5py.File(path) as f:
        names = set()
        f.visit(names.add)
        assert {"eigvals_real", "eigvals_imag", "K_eigvals_real", "K_eigvals_imag", "labels", "extra",
                "g/0/names", "g/0/step", "g/0/s_eigvals_real", "g/0/hist", "g/1/step"} <= names
        assert "eigvals" not in names and "top" not in f.attrs
        assert f.attrs["n"] == 3 and f.attrs["K_n"] == 4 and f.attrs["K_symmetric"] == 1 and f.attrs["n_groups"] == 2
        np.testing.assert_array_equal(f["g/0/s_n"][()], [2, 2])
        np.testing.assert_array_equal(f["g/0/hist"][()], [np.arange(3.0), np.ones(3)])
    back = read_dataclass(_Nested, path, "nested")
    assert back.top.n == 3 and back.other.n == 4 and back.other.symmetric is True and back.top.symmetric is False
    np.testing.assert_array_equal(back.top.eigvals, t.top.eigvals)
    np.testing.assert_array_equal(back.other.eigvals, t.other.eigvals)
    assert [g.label for g in back.groups] == ["a", "b"] and [g.names for g in back.groups] == [["w", "b"], ["only"]]
    assert [[p.step for p in g.points] for g in back.groups] == [[0, 5], [1]]
    for got, want in zip(back.groups[0].points + back.groups[1].points, groups[0].points + groups[1].points,
                         strict=True):
        np.testing.assert_array_equal(got.stats.eigvals, want.stats.eigvals)
        np.testing.assert_array_equal(got.hist, want.hist)
        assert got.stats.n == want.stats.n and got.stats.symmetric == want.stats.symmetric
    assert read_result(path).to_frame().columns.tolist() == ["labels", "extra"]  # derived() named the frame


# ------------------------------------------------------------------------------------ interpolation


def _lenet(seed):
    torch.manual_seed(seed)
    return build_model("lenet", input_shape=(1, 8, 8), num_classes=10)


def _save(store, name, model, spec):
    run = store.create_run(name, config={"model": "lenet"}, seeds={"seed": 0}, model_spec=model.landscape_spec,
                           data_spec=spec)
    run.save_checkpoint(model.state_dict(), step=1, epoch=1.0)


@pytest.fixture(scope="module")
def two_data():
    return load_dataset("digits", seed=0, subset=300), load_dataset("digits", seed=1, subset=300)


@pytest.fixture
def mixed_store(tmp_path, two_data):
    store = Store(tmp_path / "ck")
    _save(store, "a", _lenet(0), two_data[0].spec)
    _save(store, "b", _lenet(1), two_data[1].spec)
    return store


def _plain_loss(model, x, y):
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        return float(F.cross_entropy(model(x).double(), y))


def test_interpolation_file_reads_as_frame_and_labelled_xarray(mixed_store, tmp_path):
    from landscape.api import interpolate

    with pytest.warns(UserWarning):
        res = interpolate("a", "b", root=mixed_store.root, points=4, output=tmp_path / "i.h5", figure=False)
    frame = read_result(res.path).to_frame()
    assert list(frame.columns) == ["alpha", "train_loss", "test_loss", "train_acc", "test_acc"]
    np.testing.assert_array_equal(frame["test_loss"].to_numpy(), res.loss["test"])
    ds = read_result(res.path).to_xarray()
    try:
        assert ds["test_loss"].dims == ("alpha",)
        np.testing.assert_array_equal(ds["alpha"].values, np.linspace(0, 1, 4))
        np.testing.assert_array_equal(ds["train_acc"].values, res.acc["train"])
    finally:
        ds.close()
    back = InterpolationResult.from_hdf5(res.path)
    assert back.splits == ["train", "test"] and back.instability_loss == res.instability_loss


def test_pair_on_different_data_warns_records_both_specs_and_data_from_b(mixed_store, two_data, tmp_path):
    from landscape.api import interpolate

    cfg = InterpolateConfig(points=2, split=("train",))
    with pytest.warns(UserWarning, match=r"trained on different data \(seed: 0 vs 1\); evaluating on A's "
                                         r"\(data_from='b' for the other\)"):
        on_a = interpolate("a", "b", cfg, root=mixed_store.root, output=tmp_path / "a.h5", figure=False)
    with pytest.warns(UserWarning, match="evaluating on B's"):
        on_b = interpolate("a", "b", cfg, root=mixed_store.root, data_from="b", output=tmp_path / "b.h5",
                           figure=False)
    model_a, model_b = (mixed_store.load(r).build_model() for r in ("a", "b"))
    for res, data in ((on_a, two_data[0]), (on_b, two_data[1])):  # endpoints against a plain forward pass
        x, y = data.split("train")  # --subset draws differ in train only
        assert res.loss["train"][0] == pytest.approx(_plain_loss(model_a, x, y), rel=1e-5)
        assert res.loss["train"][-1] == pytest.approx(_plain_loss(model_b, x, y), rel=1e-5)
        attrs = read_result(res.path).attrs
        assert json.loads(attrs["data_spec_a"])["seed"] == 0 and json.loads(attrs["data_spec_b"])["seed"] == 1
    assert read_result(on_b.path).attrs["data_from"] == "b"
    assert on_a.loss["train"][0] != on_b.loss["train"][0]


def test_cli_data_from_and_one_warning_line(mixed_store, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "landscape", "--root", str(mixed_store.root), "interpolate", "a",
                           "b", "--points", "2", "--split", "test", "--data-from", "b", "--no-figure", "-o",
                           str(tmp_path / "c.h5")], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    warning = [line for line in proc.stderr.splitlines() if line]
    assert len(warning) == 1 and warning[0].startswith("warning: A and B (a, b) were trained on different data")
    assert read_result(tmp_path / "c.h5").attrs["data_from"] == "b"
    res = CliRunner().invoke(command("interpolate"), ["a", "b", "--data-from", "c"], obj={"root": "x"})
    assert res.exit_code == 2


# ----------------------------------------------------------------------------------------------- pool


def test_pool_workers_die_with_their_parent(tmp_path):
    """Kill the parent (SIGKILL) while its workers are busy: workers and resource tracker must exit."""
    script = textwrap.dedent("""
        import os, sys, time
        from landscape.api.execution import spawn_pool
        if __name__ == "__main__":
            pool = spawn_pool(2)
            pids = [pool.submit(os.getpid).result() for _ in range(4)]
            futures = [pool.submit(time.sleep, 600) for _ in range(2)]
            print(" ".join(str(p) for p in sorted(set(pids) | {p.pid for p in pool._processes.values()})),
                  flush=True)
            time.sleep(600)
    """)
    path = tmp_path / "parent.py"
    path.write_text(script)
    parent = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    workers: list[int] = []
    tracker: set[int] = set()
    try:
        workers = [int(p) for p in parent.stdout.readline().split()]
        assert len(workers) == 2
        tracker = _children_of(parent.pid) - set(workers)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in workers + sorted(tracker)):
            time.sleep(0.2)
        assert not [p for p in workers + sorted(tracker) if _alive(p)]
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in workers + sorted(tracker):  # leave no orphan behind when the test fails
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _children_of(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.add(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_directions_and_surface_files_have_labelled_dims(mixed_store, tmp_path):
    from landscape.api import directions, surface

    d = directions("a", root=mixed_store.root, directions=2, points=3, distance=0.5, subset=50, output=tmp_path / "d.h5",
                   figure=False)
    s = surface("a", root=mixed_store.root, grid="3x2", split=("test",), subset=50, output=tmp_path / "s.h5",
                figure=False)
    with read_result(d.path).to_xarray() as ds:
        assert ds["direction_loss"].dims == ("direction", "t") and ds["rise"].dims == ("direction",)
        np.testing.assert_array_equal(ds["direction_loss"].values, d.direction_loss)
        np.testing.assert_array_equal(ds["t"].values, np.linspace(0, 1, 3))
    with read_result(s.path).to_xarray() as ds:
        assert ds["test_loss"].dims == ("x", "y")
        np.testing.assert_array_equal(ds["x"].values, s.xcoordinates)
        np.testing.assert_array_equal(ds["test_loss"].sel(x=s.xcoordinates[1], y=s.ycoordinates[0]).values,
                                      s.values["test_loss"][1, 0])


def test_output_never_replaces_a_users_csv_or_figure(mixed_store, tmp_path):
    """-o X.h5 writes X.csv / X.png / X.pdf beside it: refuse when those exist but X.h5 is not a result."""
    from landscape.api import instability, interpolate
    from landscape.errors import ResultError

    mine = tmp_path / "X.csv"
    mine.write_text("my data\n")
    with pytest.raises(ResultError, match="X.csv"):
        instability(pairs="a:b", root=mixed_store.root, points=2, output=tmp_path / "X.h5", figure=False)
    assert mine.read_text() == "my data\n" and not (tmp_path / "X.h5").exists()
    (tmp_path / "Y.png").write_bytes(b"a picture")
    with pytest.raises(ResultError, match="Y.png"):
        interpolate("a", "b", root=mixed_store.root, points=2, output=tmp_path / "Y.h5")
    with pytest.warns(UserWarning):  # without the figure nothing beside Y.h5 is touched
        res = interpolate("a", "b", root=mixed_store.root, points=2, split=("test",), output=tmp_path / "Y.h5",
                          figure=False)
    assert res.path.is_file() and (tmp_path / "Y.png").read_bytes() == b"a picture"


def test_long_names_are_one_error_line_or_a_shortened_default(mixed_store, tmp_path):
    from landscape.api._common import default_output
    from landscape.errors import ResultError
    from landscape.results import check_output_path

    with pytest.raises(ResultError, match="longer than 255 bytes"):
        check_output_path(tmp_path / ("x" * 300 + ".h5"))
    long = "interpolate-" + "r" * 200 + "@last--" + "r" * 200 + "@last"
    out = default_output(long)
    assert len(out.name) < 200 and out.name.startswith(long[:150]) and out != default_output(long + "x")
    assert default_output("short") == Path("results/short.h5")


def test_directions_and_surface_through_checkpoints_on_other_data_warn_and_record(mixed_store, two_data, tmp_path):
    from landscape.api import directions, surface

    _save(mixed_store, "c", _lenet(2), two_data[0].spec)
    with pytest.warns(UserWarning, match=r"B b was trained on different data than A \(a\)"):
        d = directions("a", root=mixed_store.root, toward="b", directions=2, points=3, subset=50, output=tmp_path / "d.h5",
                       figure=False)
    attrs = read_result(d.path).attrs
    assert json.loads(attrs["data_spec_a"])["seed"] == 0 and json.loads(attrs["data_specs_other"])["b"]["seed"] == 1
    with pytest.warns(UserWarning, match="the plane's checkpoints b was trained on different data"):
        s = surface("a", root=mixed_store.root, plane="b,c", grid="2x2", split=("test",), subset=50,
                    output=tmp_path / "s.h5", figure=False)
    assert list(json.loads(read_result(s.path).attrs["data_specs_other"])) == ["b"]
    import warnings as _w

    with _w.catch_warnings():
        _w.simplefilter("error")  # same data: no warning
        same = directions("a", root=mixed_store.root, toward="c", directions=2, points=3, subset=50,
                          output=tmp_path / "same.h5", figure=False)
    assert "data_specs_other" not in read_result(same.path).attrs


def test_a_new_analysis_is_one_module_and_one_registry_line(mixed_store, tmp_path, monkeypatch):
    """docs/ARCHITECTURE.md's recipe end to end: the module, one register() line -> api function, command, file."""
    monkeypatch.setattr(registry, "_LINES", dict(registry._LINES))
    registry.register("toy-norm", "toy_analysis:SPEC", "Parameter norm along a run.")
    from landscape import api

    run = Store(mixed_store.root).run("a")
    model = mixed_store.load("a@last").build_model()
    run.save_checkpoint({k: 2 * v for k, v in model.state_dict().items()}, step=2, epoch=2.0)
    res = api.toy_norm("a", root=mixed_store.root, scale=0.5, output=tmp_path / "t.h5")
    naive = [0.5 * float(torch.cat([p.detach().double().ravel() for p in m.parameters()]).norm())
             for m in (model, mixed_store.load("a@step=2").build_model())]
    assert [r.norm for r in res.rows] == pytest.approx(naive, rel=1e-12) and res.path == tmp_path / "t.h5"
    assert res.figures == [] and read_result(res.path).to_frame()["norm"].tolist() == pytest.approx(naive)
    out = CliRunner().invoke(command("toy-norm"), ["a", "--scale", "2", "--json", "-o", str(tmp_path / "c.h5")],
                             obj={"root": str(mixed_store.root)})
    assert out.exit_code == 0, out.output
    assert [r["norm"] for r in json.loads(out.output)["rows"]] == pytest.approx([4 * v for v in naive])
    bad = CliRunner().invoke(command("toy-norm"), ["a", "--scale", "0"], obj={"root": str(mixed_store.root)})
    assert bad.exit_code == 2


def test_clipping_and_norms_files_read_as_frames(mixed_store, tmp_path):
    from landscape.api import clipping, norms

    c = clipping("a", root=mixed_store.root, batch_size=32, output=tmp_path / "c.h5", figure=False)
    frame = read_result(c.path).to_frame()
    assert frame["ref"].tolist() == ["a@step=1"] and frame["R"].tolist() == [c.rows[0].total.R]
    from landscape.analyze.clipping import ClippingResult

    back = ClippingResult.from_hdf5(c.path)  # the codec's nested rows: total and the per-batch list
    assert back.layer_names == c.layer_names and back.rows[0].step == 1
    assert dataclasses.asdict(back.rows[0].total).keys() == dataclasses.asdict(c.rows[0].total).keys()
    for got, want in [(back.rows[0].total, c.rows[0].total), *zip(back.rows[0].batches, c.rows[0].batches,
                                                                   strict=True)]:
        for key, value in dataclasses.asdict(want).items():
            np.testing.assert_array_equal(getattr(got, key), value)
    n = norms(["a", "b"], root=mixed_store.root, subset=7, bins=5, output=tmp_path / "n.h5", figure=False)
    frame = read_result(n.path).to_frame()
    assert frame["run_labels"].tolist() == ["a", "b"]
    assert frame["ratio_to_first"].tolist() == [r["ratio_to_first"] for r in n.ratio_rows()]
    from landscape.analyze.norms import NormsResult

    back = NormsResult.from_hdf5(n.path)  # the codec's run table with per-run groups runs/<i>/
    assert back.config == n.config and back.path == n.path
    np.testing.assert_array_equal(back.edges, n.edges)
    assert [(r.label, r.optimizer, r.layer_names) for r in back.runs] == [
        (r.label, r.optimizer, r.layer_names) for r in n.runs]
    for got_run, want_run in zip(back.runs, n.runs, strict=True):
        assert len(got_run.rows) == len(want_run.rows) == 1
        for got, want in zip(got_run.rows, want_run.rows, strict=True):
            assert (got.ref, got.step, got.epoch) == (want.ref, want.step, want.epoch)
            assert got.grad_norms.shape == (7,) and got.mean_grad_norm == want.mean_grad_norm
            np.testing.assert_array_equal(got.histogram, want.histogram)
            for key, value in dataclasses.asdict(want.params).items():
                np.testing.assert_array_equal(getattr(got.params, key), value)
    with h5py.File(n.path) as f:  # the dataset and attr names files had before the codec
        assert {"edges", "run_labels", "optimizers", "dist_origin", "ratio_to_first"} <= set(f)
        assert {"layer_names", "ref", "step", "epoch", "dist_origin", "dist_init", "num_params", "layer_norms",
                "layer_dist_init", "histogram", "grad_norms", "mean_grad_norm"} == set(f["runs/1"])
        assert f.attrs["runs"] == 2 and f.attrs["dist_origin"] == n.ratio_rows()[0]["dist_origin"]


def test_ntk_file_has_labelled_sample_dims(mixed_store, tmp_path):
    from landscape.api import ntk

    r = ntk("a", root=mixed_store.root, subset=12, clip_style="layerwise", output=tmp_path / "k.h5", figure=False)
    with read_result(r.path).to_xarray() as ds:
        assert ds["K"].dims == ("sample", "sample_j") and ds["K_layers"].dims[0] == "layer"
        np.testing.assert_array_equal(ds["K"].values, r.K)
        np.testing.assert_array_equal(ds["labels"].values, r.labels)
    assert read_result(r.path).to_frame()["labels"].tolist() == r.labels.tolist()
    from landscape.analyze.ntk import NTKResult

    back = NTKResult.from_hdf5(r.path)  # both kernels' properties: root attrs, the unclipped one prefixed K_
    assert back.properties == r.properties and back.K_properties == r.K_properties and back.config == r.config
    for p, q in ((back.properties, r.properties), (back.K_properties, r.K_properties)):
        np.testing.assert_array_equal(p.eigvals, q.eigvals)
        np.testing.assert_array_equal(p.sym_eigvals, q.sym_eigvals)
    with h5py.File(r.path) as f:
        assert f.attrs["symmetric"] == r.properties.symmetric and f.attrs["K_min_sym_eig"] == r.K_properties.min_sym_eig
        np.testing.assert_array_equal(f["K_eigvals"][()], r.K_properties.sym_eigvals)  # the earlier name, kept
        assert f.attrs["layer_max_norms"] == r.layer_max_norms == back.layer_max_norms > 0  # layerwise: C / sqrt(L)


def test_surface_frame_is_one_row_per_grid_cell(mixed_store, tmp_path):
    from landscape.api import surface

    s = surface("a", root=mixed_store.root, grid="3x2", split=("test",), subset=50, output=tmp_path / "s.h5",
                figure=False)
    frame = read_result(s.path).to_frame()
    assert len(frame) == 6 and {"x", "y", "test_loss", "test_acc"} <= set(frame.columns)
    row = frame[(frame.x == s.xcoordinates[2]) & (frame.y == s.ycoordinates[1])]
    assert row["test_loss"].item() == s.values["test_loss"][2, 1]
