"""Parameter and gradient norm statistics (Watson et al. 2023 App. Figs. 16-17; landscape norms)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from landscape.analyze.norms import (
    NormsResult,
    histogram_edges,
    parameter_norms,
    per_sample_grad_norms,
    value_histogram,
)
from landscape.models import build_model


def test_histogram_counts_every_value_even_beyond_the_edges():
    values = torch.randn(1003)
    edges = histogram_edges(-1.0, 1.0, 17)
    counts = value_histogram(values, edges)
    assert counts.sum() == 1003
    assert counts[0] == int((values <= edges[1]).sum())


def test_distances_equal_torch_norms():
    torch.manual_seed(0)
    a = build_model("mlp", input_shape=(4,), num_classes=3, widths=[5])
    b = build_model("mlp", input_shape=(4,), num_classes=3, widths=[5])
    names = [n for n, _ in a.named_parameters()]
    got = parameter_norms(dict(a.named_parameters()), names, dict(b.named_parameters()))
    va = parameters_to_vector(a.parameters()).detach().double()
    vb = parameters_to_vector(b.parameters()).detach().double()
    assert got.dist_origin == pytest.approx(float(torch.linalg.norm(va)), rel=1e-12)
    assert got.dist_init == pytest.approx(float(torch.linalg.norm(va - vb)), rel=1e-12)
    for k, (_, p) in enumerate(a.named_parameters()):
        assert got.layer_norms[k] == pytest.approx(float(torch.linalg.norm(p.detach().double())), rel=1e-12)
    assert got.num_params == va.numel()


def test_per_sample_gradient_norms_equal_a_naive_loop():
    torch.manual_seed(1)
    model = build_model("mlp", input_shape=(4,), num_classes=3, widths=[5]).double()
    x, y = torch.randn(13, 4, dtype=torch.float64), torch.randint(0, 3, (13,))
    got = per_sample_grad_norms(model, x, y, chunk=4)
    ref = []
    for i in range(13):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        ref.append(float(torch.linalg.norm(torch.cat([p.grad.ravel() for p in model.parameters()]))))
    np.testing.assert_allclose(got, ref, rtol=1e-10)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two runs of the same MLP on gaussian-signal: 'small' drifts little from init, 'large' a lot."""
    from landscape.data import load_dataset
    from landscape.store import Store

    root = tmp_path_factory.mktemp("store")
    data = load_dataset("gaussian-signal", seed=0, ds=3, dn=5, n=100, n_test=20)
    store = Store(root)
    for name, scale in (("small", 0.1), ("large", 1.0)):
        torch.manual_seed(0)
        model = build_model("mlp", input_shape=data.input_shape, num_classes=2, widths=[6])
        run = store.create_run(name, config={"optimizer": "sgd" if name == "small" else "dpsgd"},
                               seeds={"seed": 0}, model_spec=model.landscape_spec, data_spec=data.spec)
        init = model.state_dict()
        gen = torch.Generator().manual_seed(1)
        for step in range(3):
            state = {k: v + scale * step * torch.randn(v.shape, generator=gen) for k, v in init.items()}
            run.save_checkpoint(state, step=5 * step, epoch=float(step))
    return root


def test_norms_over_runs_against_torch(two_runs, tmp_path):
    from landscape.api import norms
    from landscape.store import Store

    out = tmp_path / "norms.h5"
    res = norms(["small", "large"], root=two_runs, bins=30, subset=20, output=out)
    back = NormsResult.from_hdf5(out)
    store = Store(two_runs)
    for run in back.runs:
        init = store.load(f"{run.label}@init").build_model()
        v0 = parameters_to_vector(init.parameters()).detach().double()
        for row in run.rows:
            model = store.load(row.ref).build_model()
            v = parameters_to_vector(model.parameters()).detach().double()
            assert row.histogram.sum() == v.numel()  # every parameter counted once
            assert row.params.dist_origin == pytest.approx(float(torch.linalg.norm(v)), rel=1e-10)
            assert row.params.dist_init == pytest.approx(float(torch.linalg.norm(v - v0)), rel=1e-10)
            assert row.grad_norms.shape == (20,)
    table = res.ratio_rows()
    assert table[0]["ratio_to_first"] == 1.0
    assert table[1]["ratio_to_first"] == pytest.approx(table[1]["dist_origin"] / table[0]["dist_origin"])
    assert table[1]["ratio_to_first"] > 1.0
    assert [r.optimizer for r in back.runs] == ["sgd", "dpsgd"]
    stem = out.with_suffix("")
    for suffix in ("-params.png", "-params.pdf", "-grads.png", "-grads.pdf"):
        assert stem.with_name(stem.name + suffix).is_file()


def test_norms_cli_table_and_errors(two_runs, tmp_path, monkeypatch, capsys):
    from cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["--root", str(two_runs), "norms", "small", "large@last", "--subset", "0",
                       "--no-figure", "-o", "n.h5"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert "ratio_to_first" in out and "large@last" in out
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["--root", str(two_runs), "norms", "missing"])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and err.startswith("error: ") and err.count("\n") == 1
