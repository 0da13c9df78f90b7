"""landscape.analyze.calibration against independent references: torchmetrics' MulticlassCalibrationError
(ECE: norm "l1", MCE: norm "max"), direct numpy (NLL, Brier, adaptive ECE), closed forms and a derived bound."""

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
from torchmetrics.classification import MulticlassCalibrationError

from landscape.analyze.calibration import (
    ECE,
    ExampleStats,
    bin_index,
    calibration_from_stats,
    calibration_metrics,
    calibration_row,
    example_stats,
)
from landscape.analyze.specs import CalibrationConfig
from landscape.errors import UsageError
from landscape.evaluate import Segment, evaluate
from landscape.models import build_model
from landscape.params import ParamSpace, flatten


def torchmetrics_ce(logits: torch.Tensor, y: torch.Tensor, bins: int, norm: str) -> float:
    return float(MulticlassCalibrationError(num_classes=logits.shape[1], n_bins=bins, norm=norm)(logits, y))


def assert_same_bins_as_torchmetrics(logits: torch.Tensor, y: torch.Tensor, bins: int) -> None:
    """torchmetrics bins float32 confidences into [k/M, (k+1)/M) plus an extra bin {1.0}; ours are float64
    ((m-1)/M, m/M]. Check that every example lands in the same bin under both, apart from float32 confidences of
    exactly 1.0 (which are in our last bin): so an agreement below is not luck, and a disagreement would point at
    the binning. Those saturated examples must all be right or all be wrong: then moving them between the last
    bin and torchmetrics' extra one changes the ECE by at most 2^-24 each, and MCE not at all unless the last
    bin is the worst."""
    p = torch.softmax(logits.double(), 1)
    conf, pred = p.max(1)
    c32 = conf.float()
    theirs = torch.bucketize(c32, torch.linspace(0, 1, bins + 1, dtype=torch.float32), right=True) - 1
    assert torch.equal(theirs.clamp_max(bins - 1), bin_index(conf, bins)), "a confidence sits on a bin edge"
    saturated = (pred == y)[c32 == 1.0]
    assert saturated.all() or not saturated.any()


@pytest.mark.parametrize(("bins", "scale"), [(15, 1.0), (15, 4.0), (7, 2.0)])
def test_ece_mce_equal_torchmetrics_on_random_logits(bins, scale):
    g = torch.Generator().manual_seed(bins + int(scale))
    logits = scale * torch.randn(4000, 10, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (4000,), generator=g)
    # make the model partly right, so accuracy and confidence vary across bins
    y[:2000] = logits[:2000].argmax(1)
    assert_same_bins_as_torchmetrics(logits, y, bins)
    c = calibration_metrics(logits, y, bins)
    assert c.ece == pytest.approx(torchmetrics_ce(logits, y, bins, "l1"), abs=1e-6)
    assert c.mce == pytest.approx(torchmetrics_ce(logits, y, bins, "max"), abs=1e-6)
    assert (c.bin_count == 0).any() or scale > 1  # empty bins exist at scale 1: MCE must skip them
    assert 0 < c.ece <= c.mce


@pytest.fixture(scope="module")
def trained_digits(tmp_path_factory):
    """A small MLP trained for 3 epochs on sklearn digits through the real training loop and store."""
    from landscape.store import Store
    from landscape.train.config import TrainConfig
    from landscape.train.loop import train

    root = tmp_path_factory.mktemp("store")
    cfg = TrainConfig(model="mlp", data="digits", epochs=3, lr=0.1, batch_size=64, seed=0, run="mlp",
                      optimizer="sgd", checkpoint_every="1e", device="cpu")
    train(cfg, root=root, progress=False)
    ckpt = Store(root).load("mlp@last")
    from landscape.data import dataset_from_spec

    data = dataset_from_spec(ckpt.data_spec)
    return ckpt, ckpt.build_model().eval(), {"train": (data.x_train, data.y_train), "test": (data.x_test, data.y_test)}


@pytest.fixture(scope="module")
def store_root(trained_digits):
    return trained_digits[0].path.parents[1]


def test_trained_checkpoint_equals_torchmetrics_and_the_evaluator(trained_digits):
    ckpt, model, data = trained_digits
    row = calibration_row(model, data, CalibrationConfig(bins=15, split=("train", "test")), ref="mlp@last",
                          step=ckpt.step, epoch=ckpt.epoch)
    assert row.ref == "mlp@last" and row.run == "mlp" and row.epoch == pytest.approx(3.0)
    for split, (x, y) in data.items():
        with torch.no_grad():
            logits = model(x).double()
        assert_same_bins_as_torchmetrics(logits, y, 15)
        c = row.splits[split]
        assert c.examples == len(y)
        assert c.ece == pytest.approx(torchmetrics_ce(logits, y, 15, "l1"), abs=1e-6)
        assert c.mce == pytest.approx(torchmetrics_ce(logits, y, 15, "max"), abs=1e-6)
        r = evaluate(model, x, y, flatten(model).unsqueeze(0))
        assert c.accuracy == float(r.acc[0])
        assert c.nll == pytest.approx(float(r.loss[0]), rel=1e-5)  # float64 vs the evaluator's float32
        assert 0.5 < c.accuracy < 1.0 and c.ece > 0
    assert list(row.splits) == ["train", "test"]


def numpy_reference(logits: np.ndarray, y: np.ndarray, bins: int) -> dict:
    """NLL, Brier and adaptive ECE directly in numpy (a naive loop over the equal-mass groups)."""
    z = logits - logits.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    p = np.exp(logp)
    onehot = np.eye(logits.shape[1])[y]
    conf, correct = p.max(1), (p.argmax(1) == y).astype(float)
    order = np.argsort(conf, kind="stable")
    ada = sum(len(g) * abs(correct[g].mean() - conf[g].mean()) for g in np.array_split(order, bins) if len(g))
    return {"nll": -logp[np.arange(len(y)), y].mean(), "brier": ((p - onehot) ** 2).sum(1).mean(),
            "adaptive_ece": ada / len(y), "accuracy": correct.mean(), "p_true": p[np.arange(len(y)), y]}


@pytest.mark.parametrize(("n", "bins"), [(1000, 15), (37, 10), (5, 15)])
def test_nll_brier_adaptive_ece_and_true_class_histogram_against_numpy(n, bins):
    rng = np.random.default_rng(n)
    logits = rng.normal(size=(n, 6)) * 3
    y = rng.integers(0, 6, n)
    c = calibration_metrics(torch.from_numpy(logits), torch.from_numpy(y), bins)
    ref = numpy_reference(logits, y, bins)
    assert c.nll == pytest.approx(ref["nll"], rel=1e-12)
    assert c.brier == pytest.approx(ref["brier"], rel=1e-12)
    assert c.accuracy == ref["accuracy"]
    assert c.adaptive_ece == pytest.approx(ref["adaptive_ece"], abs=1e-12)
    # true-class probability histogram on [0, 1/M], (1/M, 2/M], ... (np.histogram is [a, b) except the last)
    counts, _ = np.histogram(ref["p_true"], bins=np.linspace(0, 1, bins + 1))
    assert np.array_equal(c.true_class_count, counts)
    assert c.bin_count.sum() == n == c.true_class_count.sum()


def calibrated_sample(n: int, classes: int, seed: int, *, shift: float = 0.0):
    """Logits whose top-label confidence c_i ~ U(1/K, 1) and whose prediction is right with probability
    c_i - shift: perfectly calibrated for shift = 0 (P(correct | confidence = c) = c)."""
    g = torch.Generator().manual_seed(seed)
    c = 1 / classes + (1 - 1 / classes) * torch.rand(n, generator=g, dtype=torch.float64)
    pred = torch.randint(0, classes, (n,), generator=g)
    probs = ((1 - c) / (classes - 1)).unsqueeze(1).repeat(1, classes)
    probs[torch.arange(n), pred] = c
    right = torch.rand(n, generator=g, dtype=torch.float64) < c - shift
    other = (pred + torch.randint(1, classes, (n,), generator=g)) % classes
    return probs.log(), torch.where(right, pred, other)


def test_perfectly_calibrated_sample_has_ece_within_its_sampling_error():
    """Given the confidences, bin m's gap acc - conf is a mean of n_m independent zero-mean terms in [-1, 1]
    (correct_i - c_i, range 1), so by Hoeffding and a union bound over the M bins, with probability >= 1 - delta
    |gap_m| <= sqrt(log(2M/delta) / (2 n_m)) for every m, hence

        ECE = sum_m (n_m/n) |gap_m| <= sum_m sqrt(n_m log(2M/delta) / 2) / n   (<= sqrt(M log(2M/delta) / (2n))).

    At delta = 1e-6 a correct ECE fails this seeded test with probability < 1e-6."""
    bins, n, delta = 15, 20000, 1e-6
    logits, y = calibrated_sample(n, 10, seed=0)
    c = calibration_metrics(logits, y, bins)
    bound = np.sum(np.sqrt(c.bin_count * math.log(2 * bins / delta) / 2)) / n
    assert bound < 0.08  # the bound is informative at this n
    assert c.ece <= bound
    assert c.adaptive_ece <= math.sqrt(bins * math.log(2 * bins / delta) / (2 * n))  # same argument, equal-mass bins
    # the same test has power: a model 0.1 less accurate than it is confident is outside the bound
    logits, y = calibrated_sample(n, 10, seed=0, shift=0.1)
    assert calibration_metrics(logits, y, bins).ece > bound + 0.015


def test_constant_over_confident_model_gives_the_closed_form():
    """Every example predicted with confidence c, a fraction a of them right: one occupied bin,
    ECE = MCE = adaptive ECE = c - a, NLL = -(a log c + (1-a) log q), Brier from the two per-example values."""
    n, k, c, a, bins = 1500, 10, 0.9, 0.6, 15
    q = (1 - c) / (k - 1)
    probs = torch.full((n, k), q, dtype=torch.float64)
    probs[:, 3] = c
    right = torch.arange(n) % 5 < 3  # exactly 60%, spread evenly so every equal-mass group is 60% right
    y = torch.where(right, 3, 7)
    r = calibration_metrics(probs.log(), y, bins)
    assert r.accuracy == pytest.approx(a, abs=1e-15)
    assert r.ece == pytest.approx(c - a, abs=1e-12) and r.mce == pytest.approx(c - a, abs=1e-12)
    assert r.adaptive_ece == pytest.approx(c - a, abs=1e-12)
    assert r.nll == pytest.approx(-(a * math.log(c) + (1 - a) * math.log(q)), rel=1e-12)
    brier_right = (1 - c) ** 2 + (k - 1) * q**2
    brier_wrong = c**2 + (1 - q) ** 2 + (k - 2) * q**2
    assert r.brier == pytest.approx(a * brier_right + (1 - a) * brier_wrong, rel=1e-12)
    m = math.ceil(c * bins) - 1  # 0.9 in (13/15, 14/15]
    assert r.bin_count.tolist() == [n if i == m else 0 for i in range(bins)]
    assert r.bin_confidence[m] == pytest.approx(c) and r.bin_accuracy[m] == pytest.approx(a)
    assert np.isnan(np.delete(r.bin_accuracy, m)).all()
    # true class gets c when right (bin m) and q = 1/90 when wrong (first bin)
    assert r.true_class_count[m] == 900 and r.true_class_count[0] == 600


def test_bins_are_right_closed_as_guo_et_al():
    """A confidence on an edge m/M joins bin ((m-1)/M, m/M]; 1.0 is in the last bin (torchmetrics would
    give it a bin of its own)."""
    edges = torch.linspace(0, 1, 4, dtype=torch.float64)
    conf = torch.cat([edges[1:3], torch.tensor([1.0, 0.5], dtype=torch.float64)])
    assert bin_index(conf, 3).tolist() == [0, 1, 2, 1]
    correct = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    stats = ExampleStats(conf, correct, conf, -conf.log(), (1 - conf) ** 2)
    r = calibration_from_stats(stats, 3)
    assert r.bin_count.tolist() == [1, 2, 1]
    gaps = [abs(1 - 1 / 3), abs(0.5 - (2 / 3 + 0.5) / 2), 0.0]
    assert r.ece == pytest.approx((gaps[0] + 2 * gaps[1] + gaps[2]) / 4, abs=1e-15)
    assert r.mce == pytest.approx(max(gaps), abs=1e-15)


@pytest.fixture(scope="module")
def lenet_path():
    torch.manual_seed(0)
    model = build_model("lenet", input_shape=(1, 12, 12), num_classes=10).eval()
    other = build_model("lenet", input_shape=(1, 12, 12), num_classes=10)
    x, y = torch.randn(130, 1, 12, 12), torch.randint(0, 10, (130,))
    seg = Segment(flatten(model), flatten(other), torch.linspace(0, 1, 4, dtype=torch.float64))
    return model, x, y, seg


@pytest.mark.parametrize("method", ["auto", "plain", "vmap"])
def test_hook_equals_a_separate_pass_and_leaves_loss_and_accuracy_unchanged(lenet_path, method):
    model, x, y, seg = lenet_path
    plain = evaluate(model, x, y, seg, batch_size=50, method=method)
    hooked = evaluate(model, x, y, seg, batch_size=50, method=method, metrics=[ECE(15), ECE(6, name="ece6")])
    assert torch.equal(plain.loss, hooked.loss) and torch.equal(plain.acc, hooked.acc)
    assert plain.metrics == {} and set(hooked.metrics) == {"ece", "ece6"}
    space = ParamSpace.from_model(model)
    for i in range(len(seg)):
        m = copy.deepcopy(model)
        space.assign_(m, seg.point(i))
        with torch.no_grad():
            logits = m(x)
        for name, bins in (("ece", 15), ("ece6", 6)):
            assert hooked.metrics[name][i] == pytest.approx(calibration_metrics(logits, y, bins).ece, abs=1e-6)


def test_hook_state_also_gives_mce():
    logits, y = calibrated_sample(500, 4, seed=3, shift=0.2)
    metric = ECE(15)
    state = metric.start(2, torch.device("cpu"))
    for part in range(0, 500, 128):  # batches
        metric.update(state, 1, logits[part:part + 128], y[part:part + 128])
    ece, mce = ECE.errors(state)
    ref = calibration_metrics(logits, y, 15)
    assert np.isnan(ece[0]) and np.isnan(mce[0])  # a point that saw no data
    assert ece[1] == pytest.approx(ref.ece, abs=1e-12) and mce[1] == pytest.approx(ref.mce, abs=1e-12)


def test_config_and_input_errors(trained_digits):
    _, model, data = trained_digits
    with pytest.raises(UsageError, match="^bins must be >= 1, got 0"):
        CalibrationConfig(bins=0)
    with pytest.raises(UsageError, match="^split must be one of train, test, got 'val'"):
        CalibrationConfig(split="test,val")
    with pytest.raises(UsageError, match="^bins "):
        ECE(bins=-1)
    with pytest.raises(UsageError, match="split 'train' is not in the data"):
        calibration_row(model, {"test": data["test"]}, CalibrationConfig(split=("train",)))
    with pytest.raises(UsageError, match="logits"):
        example_stats(torch.zeros(3), torch.zeros(3, dtype=torch.long))


def test_subset_and_non_finite_weights(trained_digits):
    _, model, data = trained_digits
    row = calibration_row(model, data, CalibrationConfig(subset=100, subset_seed=1, bins=10))
    assert row.splits["test"].examples == 100 and list(row.splits) == ["test"]
    broken = copy.deepcopy(model)
    with torch.no_grad():
        next(broken.parameters()).fill_(math.nan)
    with pytest.warns(RuntimeWarning, match="non-finite loss"):
        bad = calibration_row(broken, data, CalibrationConfig(bins=10)).splits["test"]
    assert math.isnan(bad.ece) and math.isnan(bad.nll) and bad.examples == len(data["test"][1])


def test_collect_and_figures_for_a_run_and_single_checkpoints(trained_digits, tmp_path):
    from landscape.analyze.calibration import collect
    from landscape.plots.calibration import figure, panel_rows

    _, model, data = trained_digits
    cfg = CalibrationConfig(bins=10, split=("train", "test"))
    rows = [calibration_row(model, data, cfg, ref=f"mlp@step={s}", step=s, epoch=s / 10) for s in (10, 20)]
    rows.append(calibration_row(model, data, cfg, ref="other.h5", step=5, epoch=1.0))
    result = collect(rows, cfg)
    assert [(r.ref, r.split) for r in result.rows][:3] == [("mlp@step=10", "train"), ("mlp@step=10", "test"),
                                                            ("mlp@step=20", "train")]
    assert result.bin_count.shape == (6, 10) and result.true_class_count.shape == (6, 10)
    again = result.calibration(5)
    assert again.ece == rows[2].splits["test"].ece
    assert np.array_equal(again.bin_count, rows[2].splits["test"].bin_count)
    assert result.table()[5]["run"] == "other" and result.table()[0]["run"] == "mlp"
    assert [result.rows[i].ref for i in panel_rows(result.rows, "test")] == ["mlp@step=20", "other.h5"]
    from landscape.analyze.calibration import CalibrationRow

    one = rows[0].splits["train"]
    run = collect([CalibrationRow(f"r@step={s}", s, float(s), {"train": one}) for s in range(7)], cfg)
    assert [run.rows[i].step for i in panel_rows(run.rows, "train")] == [1, 3, 4, 6]  # 4 of steps 1..6, spread
    paths = figure(dataclasses.replace(result, config=CalibrationConfig(bins=10)), tmp_path / "cal.h5")  # test only
    names = {p.name for p in paths}
    for kind in ("reliability", "confidence", "true-class", "epochs"):
        assert {f"cal-test-{kind}.png", f"cal-test-{kind}.pdf"} <= names
    assert not any("-train-" in n for n in names) and len(paths) == 8
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    single = figure(collect(rows[2:], CalibrationConfig(bins=10)), tmp_path / "one")
    assert not any("epochs" in p.name for p in single) and len(single) == 6


# ------------------------------------------------------------------------------------- api, file, CLI


def test_api_writes_a_result_that_reads_back_as_frame_and_labelled_arrays(trained_digits, store_root, tmp_path):
    import xarray as xr

    from landscape.analyze.calibration import CalibrationResult
    from landscape.api import calibration
    from landscape.results import read_result

    ckpt, model, data = trained_digits
    out = tmp_path / "cal.h5"
    r = calibration(["mlp", "mlp@last"], root=store_root, bins=10, output=out)
    assert r.path == out and out.is_file() and {p.suffix for p in r.figures} == {".png", ".pdf"}
    assert any("-test-epochs" in p.name for p in r.figures)
    from landscape.store import Store

    steps = [i.step for i in Store(store_root).run("mlp").checkpoints()]
    assert [row.ref for row in r.rows] == [f"mlp@step={s}" for s in steps] + ["mlp@last"]
    assert [row.epoch for row in r.rows] == [0.0, 1.0, 2.0, 3.0, 3.0] and {row.split for row in r.rows} == {"test"}
    direct = calibration_row(model, data, CalibrationConfig(bins=10)).splits["test"]
    assert r.rows[-1].ece == direct.ece and r.rows[-1].nll == direct.nll and r.rows[-1].run == "mlp"
    back = CalibrationResult.from_hdf5(out)
    assert back.rows == r.rows and back.config == r.config
    assert np.array_equal(back.bin_count, r.bin_count) and np.array_equal(back.bin_accuracy, r.bin_accuracy,
                                                                          equal_nan=True)
    frame = read_result(out).to_frame()
    assert list(frame["ref"]) == [row.ref for row in r.rows] and frame["ece"].iloc[-1] == pytest.approx(r.rows[-1].ece)
    with xr.open_dataset(out, engine="h5netcdf") as ds:
        assert ds["bin_count"].dims == ("row", "bin") and ds["bin_count"].shape == (5, 10)
    assert len(read_result(out).inputs) == 5 and all(i.sha256 for i in read_result(out).inputs)


def test_cli_prints_the_table_and_refuses_bad_input(store_root, tmp_path, monkeypatch, capsys):
    from cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["--root", str(store_root), "calibration", "mlp@last", "mlp@init", "--bins", "5",
                       "--split", "train,test", "--no-figure", "-o", "c.h5"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "adaptive_ece" in out and "mlp@init" in out and (tmp_path / "c.h5").is_file()
    bad = ((["mlp@last", "--bins", "0"], 2, "--bins"), (["mlp@last", "--split", "val"], 2, "val"),
           (["nope"], 1, "nope"), (["mlp@last", "--subset", "0"], 2, "subset"))
    for args, code, fragment in bad:
        with pytest.raises(SystemExit) as exc:
            cli_main.main(["--root", str(store_root), "calibration", *args, "--no-figure", "-o", "d.h5"])
        err = capsys.readouterr().err
        # one "error: ..." line, or click's usage message whose last line is its one "Error: ..." line
        last = err.strip().splitlines()[-1]
        assert exc.value.code == code and "Traceback" not in err, err
        assert (err.startswith("error: ") and err.count("\n") == 1) or (code == 2 and last.startswith("Error:")), err
        assert fragment in last, err


def test_interpolate_metrics_ece_records_the_calibration_along_the_path(trained_digits, store_root, tmp_path,
                                                                        monkeypatch, capsys):
    """``interpolate --metrics ece``: the hook's ECE at alpha = 0 and 1 equals calibration of the end points;
    loss and accuracy are those of a run without the metric (exactly)."""
    from cli import main as cli_main
    from landscape.analyze.interpolate import InterpolationResult
    from landscape.api import interpolate

    ckpt, model, data = trained_digits
    with_ece = interpolate("mlp@init", "mlp@last", root=store_root, points=5, split=("test",), metrics=("ece",),
                           output=tmp_path / "i.h5", figure=False)
    plain = interpolate("mlp@init", "mlp@last", root=store_root, points=5, split=("test",),
                        output=tmp_path / "p.h5", figure=False)
    assert np.array_equal(with_ece.loss["test"], plain.loss["test"]) and plain.ece == {}
    end = calibration_row(model, data, CalibrationConfig()).splits["test"].ece
    assert with_ece.ece["test"].shape == (5,) and with_ece.ece["test"][-1] == pytest.approx(end, abs=1e-12)
    assert with_ece.summary()[0]["ece_B"] == with_ece.ece["test"][-1]
    back = InterpolationResult.from_hdf5(tmp_path / "i.h5")
    assert np.array_equal(back.ece["test"], with_ece.ece["test"]) and back.config.metrics == ("ece",)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["--root", str(store_root), "interpolate", "mlp@last", "mlp@last", "--points", "3",
                       "--split", "test", "--metric", "ece", "--no-figure", "-o", "same.h5"])
    assert exc.value.code == 0 and "max_ece" in capsys.readouterr().out
    same = InterpolationResult.from_hdf5(tmp_path / "same.h5")
    assert same.ece["test"].tolist() == [pytest.approx(end, abs=1e-12)] * 3
