"""User metrics (landscape.metrics, the landscape.evaluate.Metric protocol) in interpolate, directions and surface.

References: a plain blended-state-dict loop in PyTorch (``(1 - a) A + a B`` loaded into the model, one forward,
the metric computed from the logits by hand), torchmetrics (accuracy, calibration error), the loss itself (the
same forward passes), and workers=2 against one process. Metrics come from a file written by the test
(``file.py:Class``) and from a module (``landscape.analyze.calibration:ECE``), only through landscape.plugins.
"""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_calibration_error

from landscape.errors import UsageError
from landscape.metrics import MetricError, MetricObject, load, normalize, parse
from landscape.plugins import sha256_file
from landscape.results import read_result
from landscape.store import Store

METRICS_FILE = '''
import torch
from landscape.evaluate import MeanMetric, Metric


class Brier(MeanMetric):
    """Brier score: sum over classes of (p - onehot)^2, averaged over examples."""
    name = "brier"

    def per_example(self, logits, y):
        p = torch.softmax(logits.double(), dim=1)
        return (p - torch.nn.functional.one_hot(y, p.shape[1]).double()).pow(2).sum(1)


class MaxSoftmax(MeanMetric):
    name = "confidence"

    def per_example(self, logits, y):
        return torch.softmax(logits.double(), dim=1).max(dim=1).values


class TopK(Metric):
    """Top-k accuracy, written against the bare protocol (duck-typed state: sums and counts per point)."""

    def __init__(self, k=1):
        self.k, self.name = int(k), f"top{k}"

    def start(self, points, device):
        return torch.zeros(points, 2, dtype=torch.float64, device=device)

    def update(self, state, point, logits, y):
        top = logits.topk(self.k, dim=1).indices
        state[point, 0] += (top == y[:, None]).any(dim=1).sum()
        state[point, 1] += y.numel()

    def finish(self, state):
        return state[:, 0] / state[:, 1]


class Margin:
    """Two columns from one metric (names): the mean top-1 logit and the mean target logit."""
    name = "margin"
    names = ("top_logit", "target_logit")

    def start(self, points, device):
        return torch.zeros(points, 3, dtype=torch.float64, device=device)

    def update(self, state, point, logits, y):
        state[point, 0] += logits.max(dim=1).values.double().sum()
        state[point, 1] += logits.gather(1, y[:, None]).double().sum()
        state[point, 2] += y.numel()

    def finish(self, state):
        return {"top_logit": state[:, 0] / state[:, 2], "target_logit": state[:, 1] / state[:, 2]}


class NotAMetric:
    name = "nope"

    def start(self, points, device):
        return None


class Raising(TopK):
    def update(self, state, point, logits, y):
        raise ValueError("boom")


class NaNs(TopK):
    def finish(self, state):
        return state[:, 0] * float("nan")


class Matrix(TopK):
    def finish(self, state):
        return state


class LossNamed(TopK):
    def __init__(self):
        super().__init__(1)
        self.name = "loss"


class NeedsArgument(TopK):
    def __init__(self, k):
        super().__init__(k)
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A metrics file and a store with run 'r' (lenet on 200 digits: @init and a few SGD steps later, @last)."""
    from landscape.data import load_dataset
    from landscape.models import build_model

    root = tmp_path_factory.mktemp("metrics")
    path = root / "user_metrics.py"
    path.write_text(METRICS_FILE)
    data = load_dataset("digits", subset=200)
    torch.manual_seed(0)
    model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    run = Store(root / "ck").create_run("r", config={}, seeds={}, model_spec=model.landscape_spec, data_spec=data.spec)
    run.save_checkpoint(model.state_dict(), step=0, epoch=0.0)
    x, y = data.split("train")
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    for _ in range(15):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    run.save_checkpoint(model.state_dict(), step=15, epoch=1.0)
    return root, path, data


def _blended_logits(setup, alphas, split="test"):
    """The plain reference: (1 - a) A + a B as a state dict, loaded into a fresh model, one forward pass."""
    root, _, data = setup
    store = Store(root / "ck")
    a, b = store.load("r@init"), store.load("r@last")
    model = a.build_model().eval()
    x, _ = data.split(split)
    out = []
    for alpha in alphas:
        model.load_state_dict({k: (1 - alpha) * a.state_dict[k] + alpha * b.state_dict[k] for k in a.state_dict})
        with torch.no_grad():
            out.append(model(x).double())
    return out


def _refs(path):
    return [f"{path}:Brier", f'{path}:TopK{{"k": 3}}', "landscape.analyze.calibration:ECE{\"bins\": 10}"]


# ------------------------------------------------------------------------------------ against references


def test_interpolate_metrics_equal_a_blended_state_dict_loop_and_torchmetrics(setup, tmp_path):
    from landscape.api import interpolate

    root, path, data = setup
    r = interpolate("r@init", "r@last", root=root / "ck", points=5, metrics=_refs(path), output=tmp_path / "i.h5")
    _, y = data.split("test")
    for i, logits in enumerate(_blended_logits(setup, r.alpha)):
        p = logits.softmax(1)
        brier = float((p - F.one_hot(y, 10).double()).pow(2).sum(1).mean())
        assert r.point_metrics["brier"]["test"][i] == pytest.approx(brier, abs=1e-6)
        top3 = float(multiclass_accuracy(logits, y, num_classes=10, top_k=3, average="micro"))
        assert r.point_metrics["top3"]["test"][i] == pytest.approx(top3, abs=1e-6)  # torchmetrics: float32
        ece = float(multiclass_calibration_error(p, y, num_classes=10, n_bins=10, norm="l1"))
        assert r.point_metrics["ece"]["test"][i] == pytest.approx(ece, abs=1e-5)
        assert r.loss["test"][i] == pytest.approx(float(F.cross_entropy(logits, y)), abs=1e-5)
    assert r.summary()[1]["brier_B"] == r.point_metrics["brier"]["test"][-1]
    # stored beside the loss, with dims, references and the file's sha256
    back = read_result(tmp_path / "i.h5")
    frame = back.to_frame()
    assert {"alpha", "test_loss", "test_brier", "train_top3", "test_ece"} <= set(frame.columns)
    np.testing.assert_array_equal(frame["test_brier"], r.point_metrics["brier"]["test"])
    with back.to_xarray() as ds:
        assert ds["test_top3"].dims == ("alpha",)
    assert back.params["metrics"] == _refs(path)
    sources = json.loads(back.attrs["metric_sources"])
    assert sources[0]["sha256"] == sha256_file(path) and sources[0]["file"] == str(path)
    assert sources[1]["kwargs"] == {"k": 3} and sources[2]["module"] == "landscape.analyze.calibration"
    from landscape.analyze.interpolate import InterpolationResult

    again = InterpolationResult.from_hdf5(tmp_path / "i.h5")
    assert list(again.point_metrics) == ["brier", "top3", "ece"]
    np.testing.assert_array_equal(again.point_metrics["top3"]["train"], r.point_metrics["top3"]["train"])


def test_metrics_ride_the_same_forward_passes(setup):
    """The model runs as many times with three metrics as without (counted by a forward hook)."""
    from landscape.analyze.interpolate import interpolate as interpolate_states

    root, path, data = setup
    store = Store(root / "ck")
    a, b = store.load("r@init"), store.load("r@last")
    calls = []
    model = a.build_model()
    model.register_forward_hook(lambda *args: calls.append(1))
    splits = {s: data.split(s) for s in ("train", "test")}
    plain = interpolate_states(model, a.state_dict, b.state_dict, splits, points=4)
    without = len(calls)
    hooked = interpolate_states(model, a.state_dict, b.state_dict, splits, points=4, metrics=_refs(path))
    assert len(calls) - without == without > 0
    np.testing.assert_array_equal(hooked.loss["test"], plain.loss["test"])  # metrics change nothing else


def test_objects_in_python_and_several_columns_from_one_metric(setup):
    from landscape.analyze.interpolate import interpolate as interpolate_states
    from landscape.plugins import load as load_code

    root, path, data = setup
    store = Store(root / "ck")
    a, b = store.load("r@init"), store.load("r@last")
    margin = load_code(f"{path}:Margin")()
    r = interpolate_states(a.build_model(), a.state_dict, b.state_dict, {"test": data.split("test")}, points=3,
                           split=("test",), metrics=[margin, f"{path}:MaxSoftmax"])
    assert r.config.metrics[0].startswith("<object ") and isinstance(r.config.metrics[0], MetricObject)
    _, y = data.split("test")
    for i, logits in enumerate(_blended_logits(setup, r.alpha)):
        assert r.point_metrics["top_logit"]["test"][i] == pytest.approx(float(logits.max(1).values.mean()), abs=1e-5)
        assert r.point_metrics["target_logit"]["test"][i] == pytest.approx(
            float(logits.gather(1, y[:, None]).mean()), abs=1e-5)
        assert r.point_metrics["confidence"]["test"][i] == pytest.approx(float(logits.softmax(1).max(1).values.mean()),
                                                                         abs=1e-6)
    assert r.metric_sources[0]["kind"] == "object" and r.metric_sources[0]["sha256"] == sha256_file(path)


def test_directions_and_surface_metrics_and_two_workers(setup, tmp_path):
    """The path toward B against the blended loop; the surface's centre is A; workers=2 gives the same arrays."""
    from landscape.analyze.directions import DirectionsResult
    from landscape.analyze.surface import SurfaceResult
    from landscape.api import directions, surface

    root, path, data = setup
    refs = [f"{path}:Brier", f'{path}:TopK{{"k": 2}}']
    kw = dict(root=root / "ck", directions=4, points=3, split="test", metrics=refs, figure=True)
    one = directions("r@init", toward="r@last", output=tmp_path / "d1.h5", **kw)
    two = directions("r@init", toward="r@last", output=tmp_path / "d2.h5", workers=2, **kw)
    _, y = data.split("test")
    for i, logits in enumerate(_blended_logits(setup, one.t)):
        brier = float((logits.softmax(1) - F.one_hot(y, 10).double()).pow(2).sum(1).mean())
        assert one.toward_metrics["brier"][i] == pytest.approx(brier, abs=1e-6)
    assert one.point_metrics["top2"].shape == (4, 3) and np.all(one.point_metrics["brier"][:, 0] ==
                                                                 one.toward_metrics["brier"][0])
    for col in ("brier", "top2"):
        np.testing.assert_array_equal(one.point_metrics[col], two.point_metrics[col])
    back = DirectionsResult.from_hdf5(tmp_path / "d2.h5")
    np.testing.assert_array_equal(back.toward_metrics["top2"], one.toward_metrics["top2"])
    with read_result(tmp_path / "d1.h5").to_xarray() as ds:
        assert ds["direction_brier"].dims == ("direction", "t") and ds["toward_top2"].dims == ("t",)
    assert any(p.suffix == ".png" for p in one.figures)

    kw = dict(root=root / "ck", grid="3x3", range="-0.5:0.5", split=("test",), metrics=refs, figure=True)
    s1 = surface("r@last", output=tmp_path / "s1.h5", **kw)
    s2 = surface("r@last", output=tmp_path / "s2.h5", workers=2, rows_per_call=1, **kw)
    (logits_b,) = _blended_logits(setup, [1.0])
    assert s1.point_metrics["top2"]["test"][1, 1] == pytest.approx(
        float(multiclass_accuracy(logits_b, y, num_classes=10, top_k=2, average="micro")), abs=1e-6)
    for col in ("brier", "top2"):
        np.testing.assert_array_equal(s1.point_metrics[col]["test"], s2.point_metrics[col]["test"])
    frame = read_result(tmp_path / "s1.h5").to_frame()
    assert {"x", "y", "test_loss", "test_brier", "test_top2"} <= set(frame.columns) and len(frame) == 9
    assert SurfaceResult.from_hdf5(tmp_path / "s2.h5").point_metrics["brier"]["test"].shape == (3, 3)
    assert s1.summary()["test_brier_max"] >= s1.summary()["test_brier_min"]


# -------------------------------------------------------------------------------------------- bad input


def test_cli_metric_options_show_and_figure(setup, tmp_path, capsys):
    root, path, _ = setup
    out = tmp_path / "c.h5"
    code, text, err = run_cli("--root", root / "ck", "interpolate", "r@init", "r@last", "--points", "3",
                               "--metric", f"{path}:Brier", "--metric", f'{path}:TopK{{"k": 2}}', "--metric", "ece",
                               "-o", out, capsys=capsys)
    assert code == 0, err
    header = text.splitlines()[0]
    assert "brier_A" in header and "max_top2" in header and "ece_B" in header
    assert out.with_suffix(".png").is_file()
    code, text, _ = run_cli("show", out, capsys=capsys)
    assert code == 0 and "test_brier" in text and "metric_sources" in text and "train_top2" in text


@pytest.mark.parametrize("metric,code,fragment", [
    ("no_such_module_xyz:Brier", 2, "is not importable"),
    ("{dir}/missing.py:Brier", 2, "no such file"),
    ("{file}:Nope", 2, "has no 'Nope'"),
    ("{file}:NotAMetric", 2, "is not a metric (no update, finish"),
    ("{file}:NeedsArgument", 2, "calling NeedsArgument failed: TypeError"),
    ("{file}:TopK{{k: 2}}", 2, "are not JSON"),
    ("{file}:TopK[2]", 2, "is not a Python name"),
    ("nonsense", 2, "neither a built-in metric (ece) nor a code reference"),
    ("{file}:LossNamed", 2, "column name 'loss' clashes with a built-in column of interpolate"),
    ("{file}:Raising", 1, "failed in update: ValueError: boom"),
    ("{file}:NaNs", 1, "'top1' is nan at point 0"),
    ("{file}:Matrix", 1, "'top1' has shape (3, 2); a metric gives one number per point"),
])
def test_bad_metrics_are_one_line_and_write_nothing(setup, tmp_path, capsys, metric, code, fragment):
    root, path, _ = setup
    out = tmp_path / "bad.h5"
    ref = metric.format(file=path, dir=path.parent)
    got, _, err = run_cli("--root", root / "ck", "interpolate", "r@init", "r@last", "--points", "3", "--metric", ref,
                           "-o", out, capsys=capsys)
    lines = err.strip().splitlines()
    assert got == code and len(lines) == 1 and fragment in lines[0], err
    assert not out.exists()


def test_python_objects_stay_in_this_process(setup):
    _, path, _ = setup
    from landscape.analyze.specs import DirectionsConfig
    from landscape.api import directions
    from landscape.plugins import load as load_code

    brier = load_code(f"{path}:Brier")()
    with pytest.raises(UsageError, match="Python object and cannot be sent to 2 worker processes"):
        directions("r@last", metrics=[brier], workers=2, distance=1.0)  # refused before anything is resolved
    assert DirectionsConfig(metrics=[brier]).metrics[0].metric is brier
    with pytest.raises(UsageError, match="cannot be sent to worker processes"):
        pickle.dumps(MetricObject(brier))  # what a pool would have to do (instability's pairs, Dask)
    with pytest.raises(UsageError, match="metrics repeat"):
        normalize([f"{path}:Brier", f"{path}:Brier"])
    with pytest.raises(UsageError, match="is not a metric"):
        normalize([3])
    with pytest.raises(UsageError, match="reported by two metrics"):
        load([f"{path}:Brier", f'{path}:TopK{{"k": 1}}', f"{path}:Raising"])
    assert parse(f'{path}:TopK {{"k": 5}}') == (f"{path}:TopK", {"k": 5})
    with pytest.raises(MetricError, match="code of .* changed since"):
        load([f"{path}:Brier"], sources=[{"ref": f"{path}:Brier", "sha256": "0" * 64}])


def test_instability_pairs_carry_metric_references_to_two_workers(setup, tmp_path, capsys):
    """Each pair's interpolation file (written in a worker) holds the metric columns; an object cannot travel."""
    from landscape.analyze.interpolate import InterpolationResult
    from landscape.api import instability
    from landscape.plugins import load as load_code

    root, path, _ = setup
    kw = dict(root=root / "ck", pairs="r@init:r@last,r@last:r@init", points=3, split=("test",), figure=False)
    table = instability(output=tmp_path / "t.h5", workers=2, metrics=[f"{path}:Brier"], **kw)
    first = InterpolationResult.from_hdf5(table.rows[0].result)
    second = InterpolationResult.from_hdf5(table.rows[1].result)
    np.testing.assert_allclose(first.point_metrics["brier"]["test"], second.point_metrics["brier"]["test"][::-1],
                               rtol=1e-6)
    with pytest.raises(UsageError, match="cannot be sent to 2 worker processes"):  # refused before any job
        instability(output=tmp_path / "o.h5", workers=2, metrics=[load_code(f"{path}:Brier")()], **kw)


def test_an_interrupted_surface_resumes_its_metric_grids(setup, tmp_path):
    from landscape.api import surface

    root, path, _ = setup

    class Stop(Exception):
        pass

    def stop(result, rows):
        raise Stop

    kw = dict(root=root / "ck", grid="4x3", range="-0.3:0.3", split=("test",), metrics=[f"{path}:Brier"],
              figure=False)
    whole = surface("r@last", output=tmp_path / "whole.h5", **kw)
    with pytest.raises(Stop):
        surface("r@last", output=tmp_path / "part.h5", on_rows=stop, rows_per_call=1, **kw)
    from landscape.analyze.surface import SurfaceResult

    part = SurfaceResult.from_hdf5(tmp_path / "part.h5")
    grid = part.point_metrics["brier"]["test"]
    assert np.isfinite(grid[0]).all() and np.isnan(grid[1:]).all()  # the first row written, the rest pending
    resumed = surface("r@last", output=tmp_path / "part.h5", **kw)
    np.testing.assert_array_equal(resumed.point_metrics["brier"]["test"], whole.point_metrics["brier"]["test"])
    with pytest.raises(UsageError, match="holds a different surface"):  # other metrics: another surface
        surface("r@last", output=tmp_path / "part.h5", **{**kw, "metrics": [f'{path}:TopK{{"k": 2}}']})
    code = tmp_path / "copy.py"
    code.write_text(METRICS_FILE)
    kw["metrics"] = [f"{code}:Brier"]
    with pytest.raises(Stop):
        surface("r@last", output=tmp_path / "other.h5", on_rows=stop, rows_per_call=1, **kw)
    code.write_text(METRICS_FILE + "\n# changed\n")
    with pytest.raises(UsageError, match="computed with other metric code"):  # never mix two versions in one grid
        surface("r@last", output=tmp_path / "other.h5", **kw)


def test_values_one_number_per_point_nan_only_where_the_loss_is_not_finite(setup):
    _, path, _ = setup
    from landscape.metrics import point_values

    (b,) = load([f"{path}:Brier"])
    loss = torch.tensor([0.5, float("inf"), 0.7])
    values = point_values([b], {"brier": torch.tensor([0.1, float("nan"), 0.3])}, loss)
    assert np.isnan(values["brier"][1]) and values["brier"][2] == pytest.approx(0.3)
    with pytest.raises(MetricError, match="is inf at point 2"):
        point_values([b], {"brier": [0.1, 0.2, float("inf")]}, loss)
    with pytest.raises(MetricError, match="is not numbers"):
        point_values([b], {"brier": ["a", "b", "c"]}, loss)
    (m,) = load([f"{path}:Margin"])
    with pytest.raises(MetricError, match="finish must return a mapping with keys top_logit, target_logit"):
        point_values([m], {"margin": {"top_logit": [1.0, 2.0, 3.0]}}, loss)
    with pytest.raises(UsageError, match="column name 'bad-name' is not an identifier"):
        load([type("Odd", (), {"name": "bad-name", "start": print, "update": print, "finish": print})()])



def test_instability_reuses_a_pair_file_only_while_the_metric_code_is_unchanged(setup, tmp_path):
    from landscape.api import instability

    root, _, _ = setup
    code = tmp_path / "m.py"
    code.write_text(METRICS_FILE)
    kw = dict(root=root / "ck", pairs="r@init:r@last", points=3, split=("test",), figure=False,
              metrics=[f"{code}:Brier"], output=tmp_path / "t.h5")
    pair_file = instability(**kw).rows[0].result
    mtime = os.stat(pair_file).st_mtime_ns
    instability(**kw)  # same code: read back, not rewritten
    assert os.stat(pair_file).st_mtime_ns == mtime
    code.write_text(METRICS_FILE + "\n# changed\n")
    instability(**kw)  # the metric's file changed: the pair is recomputed, with the new code's sha256
    assert json.loads(read_result(pair_file).attrs["metric_sources"])[0]["sha256"] == sha256_file(code)
