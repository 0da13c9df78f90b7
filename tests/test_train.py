"""Training loop: accuracy on digits (SGD and DP-SGD), seeds, sampling, metrics, epsilon, --from, CLI errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import run_cli

from landscape.errors import CheckpointError, ModelError, UsageError
from landscape.store import Store
from landscape.train import accounting
from landscape.train.accounting import steps_per_epoch
from landscape.train.config import SamplingWarning, TrainConfig, checkpoint_steps, config_hash, parse_every
from landscape.train.loop import train
from landscape.train.pruning import MASK_ARRAY
from landscape.train.sampling import PoissonSampler, ShuffleSampler

# a small, fast setting: 200 digits, 4 steps per epoch
SMALL = dict(model="lenet", data="digits", subset=200, batch_size=50, lr=0.05, checkpoint_every="1e")


def weights(store: Store, ref: str) -> dict[str, torch.Tensor]:
    return store.load(ref).state_dict


# ------------------------------------------------------------------------------------------- accuracy


@pytest.mark.slow
def test_sgd_lenet_digits_reaches_95_percent(tmp_path):
    # seeds 0-3 end at 97.3-99.1% test accuracy with these settings
    run = train(TrainConfig(model="lenet", data="digits", epochs=15, lr=0.02, batch_size=32, momentum=0.9,
                            checkpoint_every="none", run="sgd"), root=tmp_path)
    last = run.checkpoints()[-1]
    assert last.metrics["test_acc"] >= 0.95
    assert last.epsilon is None


@pytest.mark.slow
def test_dpsgd_lenet_digits_at_epsilon_8_is_well_above_chance(tmp_path):
    # seeds 0-2 end at 82-88% test accuracy (chance: 10%)
    run = train(TrainConfig(model="lenet", data="digits", epochs=10, lr=1.0, batch_size=64, momentum=0.0,
                            optimizer="dpsgd", max_grad_norm=1.0, target_epsilon=8.0, checkpoint_every="5e",
                            run="dp"), root=tmp_path)
    infos = run.checkpoints()
    last = infos[-1]
    assert last.metrics["test_acc"] > 0.6
    assert 8.0 * 0.99 <= last.epsilon <= 8.0
    # epsilon at every checkpoint (attrs and manifest) equals the accountant's for the steps taken
    privacy = run.manifest["privacy"]
    for info in infos:
        expected = accounting.epsilon(privacy["noise_multiplier"], privacy["sample_rate"], info.step, 1e-5)
        assert info.epsilon == pytest.approx(expected, rel=1e-12)
        assert Store(tmp_path).load(f"dp@step={info.step}").epsilon == pytest.approx(expected, rel=1e-12)


# ------------------------------------------------------------------------------------------- seeds


def test_same_seed_same_weights_and_different_seed_differs(tmp_path):
    a = train(TrainConfig(**SMALL, epochs=1, seed=3, run="a"), root=tmp_path)
    b = train(TrainConfig(**SMALL, epochs=1, seed=3, run="b"), root=tmp_path)
    c = train(TrainConfig(**SMALL, epochs=1, seed=4, run="c"), root=tmp_path)
    store = Store(tmp_path)
    for sel in ("init", "last"):
        wa, wb, wc = (weights(store, f"{r.name}@{sel}") for r in (a, b, c))
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
        assert not all(torch.equal(wa[k], wc[k]) for k in wa)
    assert a.manifest["config_hash"] == b.manifest["config_hash"] != c.manifest["config_hash"]


# ------------------------------------------------------------------------------------------- sampling


def test_poisson_sampling_rate_is_b_over_n():
    n, b = 400, 20
    sampler = PoissonSampler(n, b, torch.Generator().manual_seed(0))
    counts = torch.zeros(n)
    sizes = []
    draws = 3000
    for t in range(draws):
        idx = sampler.indices(t % sampler.steps_per_epoch)
        assert len(torch.unique(idx)) == len(idx)
        counts[idx] += 1
        sizes.append(len(idx))
    q = b / n
    assert np.mean(sizes) == pytest.approx(b, rel=0.02)
    # binomial variance of the batch size: N q (1 - q)
    assert np.var(sizes) == pytest.approx(n * q * (1 - q), rel=0.1)
    per_example = counts / draws
    assert per_example.mean().item() == pytest.approx(q, rel=0.02)
    assert (per_example - q).abs().max().item() < 6 * math.sqrt(q * (1 - q) / draws)
    assert sampler.steps_per_epoch == n // b


def test_poisson_sampler_state_round_trip():
    s1 = PoissonSampler(100, 10, torch.Generator().manual_seed(1))
    s1.indices(0)
    state = s1.state_dict()
    a = [s1.indices(i) for i in range(5)]
    s2 = PoissonSampler(100, 10, torch.Generator().manual_seed(99))
    s2.load_state_dict(state)
    assert all(torch.equal(x, y) for x, y in zip(a, [s2.indices(i) for i in range(5)], strict=True))


def test_shuffle_sampler_covers_every_example_once_per_epoch():
    sampler = ShuffleSampler(23, 5, torch.Generator().manual_seed(0))
    assert sampler.steps_per_epoch == steps_per_epoch(23, 5) == 5
    for _ in range(2):
        seen = torch.cat([sampler.indices(p) for p in range(sampler.steps_per_epoch)])
        assert sorted(seen.tolist()) == list(range(23))


def test_empty_poisson_batches_are_handled(tmp_path):
    # 20 examples, expected batch 1: about a third of the steps see no example at all
    run = train(TrainConfig(model="lenet", data="digits", subset=20, batch_size=1, epochs=1, optimizer="dpsgd",
                            noise_multiplier=1.0, lr=0.1, checkpoint_every="none", run="tiny"), root=tmp_path)
    table = run.load_array("metrics")
    assert (table["batch_size"] == 0).any()
    assert np.isfinite(table["noise_norm"]).all()
    assert all(torch.isfinite(t).all() for t in weights(Store(tmp_path), "tiny").values())


def test_batch_larger_than_the_data_divides_by_the_data_size(tmp_path):
    """q = min(1, B/N): with B > N every step holds all N examples, so the mean divides by N, not B."""
    config = TrainConfig(model="mlp", model_kwargs={"widths": [8]}, data="digits", subset=40, batch_size=64,
                         epochs=1, optimizer="clip-only", max_grad_norm=1e9, lr=1.0, momentum=0.0,
                         checkpoint_every="none", run="big")
    train(config, root=tmp_path)
    store = Store(tmp_path)
    ckpt = store.load("big@init")
    model = ckpt.build_model().double()
    from landscape.data import dataset_from_spec

    data = dataset_from_spec(ckpt.data_spec)
    x, y = data.x_train.double(), data.y_train
    assert len(y) == 40
    loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum") / len(y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    expected = {name: p.detach() - g for (name, p), g in zip(model.named_parameters(), grads, strict=True)}
    last = weights(store, "big@last")
    for name, value in expected.items():
        torch.testing.assert_close(last[name].double(), value, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------- config


def test_checkpoint_every_parsing_and_schedule():
    assert parse_every("50s") == ("steps", 50)
    assert parse_every("1e") == ("epochs", 1.0)
    assert parse_every("0.5E") == ("epochs", 0.5)
    assert parse_every("none") is None
    for bad in ("5", "e", "1.5s", "-1e", "3x"):
        with pytest.raises(UsageError):
            parse_every(bad)
    assert checkpoint_steps("1e", 4, 12) == [0, 4, 8, 12]
    assert checkpoint_steps("5s", 4, 12) == [0, 5, 10, 12]
    assert checkpoint_steps("0.5e", 4, 8) == [0, 2, 4, 6, 8]
    assert checkpoint_steps("none", 4, 8) == [0, 8]


def test_config_hash_counts_only_non_default_fields():
    assert config_hash(TrainConfig()) == config_hash(TrainConfig(run="x", device="cpu"))
    assert config_hash(TrainConfig()) != config_hash(TrainConfig(lr=0.2))
    assert config_hash(TrainConfig(lr=0.2)) == config_hash(TrainConfig(lr=0.2).to_dict())


def test_config_validation():
    with pytest.raises(UsageError, match="not both"):
        TrainConfig(optimizer="dpsgd", noise_multiplier=1.0, target_epsilon=3.0).validate()
    # each option by its declaration, named as Python names it (one rule: landscape.options.coerce)
    for options, message in [({"optimizer": "adam"}, "optimizer must be one of sgd, dpsgd, clip-only, noise-only, "
                                                     "got 'adam'"),
                             ({"momentum": 1.0}, "momentum must be < 1, got 1.0"),
                             ({"lr": float("nan")}, "lr must be a finite number"),
                             ({"delta": 1.0}, "delta must be < 1, got 1.0"),
                             ({"seed": -1}, "seed must be an integer seed in [0, 2**63 - 1]"),
                             ({"device": "tpu"}, "device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
                             ({"epochs": 0}, "epochs must be >= 1, got 0")]:
        with pytest.raises(UsageError) as info:
            TrainConfig(**options).validate()
        assert str(info.value).startswith(message), (options, str(info.value))
    config = TrainConfig(epochs="3", lr="0.1", device=" CPU ").validate()  # held as the command line holds them
    assert (config.epochs, config.lr, config.device) == (3, 0.1, "cpu")
    with pytest.raises(UsageError, match="needs noise_multiplier or target_epsilon"):
        TrainConfig(optimizer="dpsgd").validate()
    with pytest.raises(UsageError, match="needs a DP optimizer"):
        TrainConfig(noise_multiplier=1.0).validate()
    with pytest.warns(SamplingWarning, match="Poisson"):
        TrainConfig(optimizer="dpsgd", noise_multiplier=1.0, sampling="shuffle").warn_sampling()
    assert TrainConfig(optimizer="dpsgd", noise_multiplier=1.0).sampling_method == "poisson"
    assert TrainConfig().sampling_method == "shuffle"


# ------------------------------------------------------------------------------------------- metrics


def test_metrics_table_and_checkpoint_metrics(tmp_path):
    run = train(TrainConfig(**{**SMALL, "checkpoint_every": "3s"}, epochs=2, optimizer="dpsgd",
                            noise_multiplier=1.0, run="m"), root=tmp_path)
    total = run.manifest["schedule"]["total_steps"]
    assert total == 8
    assert [c.step for c in run.checkpoints()] == [0, 3, 6, 8]
    table = run.load_array("metrics")
    for name in ("loss", "accuracy", "batch_size", "mean_grad_norm", "max_grad_norm", "fraction_clipped",
                 "noise_norm", "epsilon"):
        assert table[name].shape == (total,)
        assert np.isfinite(table[name]).all(), name
    assert (table["max_grad_norm"] >= table["mean_grad_norm"]).all()
    assert np.all(np.diff(table["epsilon"]) > 0)
    privacy = run.manifest["privacy"]
    assert table["epsilon"][-1] == pytest.approx(
        accounting.epsilon(1.0, privacy["sample_rate"], total, 1e-5), rel=1e-12)
    ckpt = Store(tmp_path).load("m@step=6")
    for key in ("train_loss", "train_acc", "test_loss", "test_acc"):
        assert key in ckpt.metrics
    assert ckpt.epsilon == pytest.approx(table["epsilon"][5], rel=1e-12)
    assert run.manifest["config"]["optimizer"] == "dpsgd"


def test_sgd_metrics_have_no_privacy(tmp_path):
    run = train(TrainConfig(**SMALL, epochs=1, run="s"), root=tmp_path)
    table = run.load_array("metrics")
    assert np.isfinite(table["loss"]).all()
    assert np.isnan(table["epsilon"]).all()
    assert all(c.epsilon is None for c in run.checkpoints())


# ------------------------------------------------------------------------------------------- --from


def test_child_run_from_checkpoint_records_lineage(tmp_path):
    train(TrainConfig(**SMALL, epochs=2, optimizer="dpsgd", noise_multiplier=1.0, run="parent"), root=tmp_path)
    child = train(TrainConfig(from_ref="parent@epoch=1", epochs=1, optimizer="dpsgd", noise_multiplier=1.0,
                              lr=0.05, batch_size=50, run="child"), root=tmp_path)
    store = Store(tmp_path)
    parent_ckpt = store.load("parent@epoch=1")
    lineage = child.manifest["lineage"]
    assert lineage == {"parent_run": "parent", "parent_step": 4, "parent_epoch": 1.0,
                       "parent_ref": "parent@epoch=1", "parent_sha256": parent_ckpt.sha256}
    init = weights(store, "child@init")
    assert all(torch.equal(init[k], parent_ckpt.state_dict[k]) for k in init)
    assert child.manifest["data_spec"] == store.run("parent").manifest["data_spec"]
    # the DP parent's 4 steps are composed into the child's epsilon
    q = child.manifest["privacy"]["sample_rate"]
    assert child.checkpoints()[-1].epsilon == pytest.approx(
        accounting.composed_epsilon([accounting_event(1.0, q, 4), accounting_event(1.0, q, 4)], 1e-5), rel=1e-9)
    assert child.checkpoints()[-1].epsilon > accounting.epsilon(1.0, q, 4, 1e-5)
    assert child.checkpoints()[0].epsilon == pytest.approx(accounting.epsilon(1.0, q, 4, 1e-5), rel=1e-6)


def accounting_event(sigma, q, steps):
    from landscape.train.loop import PrivacyEvent

    return PrivacyEvent(sigma, q, steps)


def test_pruned_parent_mask_keeps_weights_exactly_zero_under_dpsgd(tmp_path):
    parent = train(TrainConfig(**SMALL, epochs=1, run="p"), root=tmp_path)
    store = Store(tmp_path)
    state = weights(store, "p@last")
    gen = torch.Generator().manual_seed(0)
    masks = {k: torch.rand(v.shape, generator=gen) > 0.5 for k, v in state.items()}
    parent.save_array(MASK_ARRAY, {k: m.numpy() for k, m in masks.items()})
    child = train(TrainConfig(from_ref="p", epochs=2, optimizer="dpsgd", noise_multiplier=1.0, lr=0.5,
                              momentum=0.9, batch_size=50, sparsify=0.3, run="pc"), root=tmp_path)
    last, first = weights(store, "pc@last"), weights(store, "pc@init")
    for k, m in masks.items():
        assert (first[k][~m] == 0).all(), k  # the parent stored unmasked weights: zero from step 0 on
        assert (last[k][~m] == 0).all(), k
        assert (last[k][m] != 0).any(), k
    assert MASK_ARRAY in child.array_names()


def test_from_ref_cannot_change_the_model(tmp_path):
    train(TrainConfig(**SMALL, epochs=1, run="p"), root=tmp_path)
    with pytest.raises(UsageError, match="keeps its parent's model"):
        train(TrainConfig(from_ref="p", model="mlp", epochs=1), root=tmp_path)


def test_dp_with_batchnorm_is_refused_with_a_pointer_to_groupnorm(tmp_path):
    with pytest.raises(ModelError, match="norm"):
        train(TrainConfig(model="resnet18", model_kwargs={"norm": "batch"}, data="digits", subset=50,
                          optimizer="dpsgd", noise_multiplier=1.0, epochs=1), root=tmp_path)
    assert not list(tmp_path.glob("*/manifest.json"))


# ------------------------------------------------------------------------------------------- CLI


def test_cli_train_prints_a_table_and_json(tmp_path, capsys):
    code, out, err = run_cli("--root", str(tmp_path), "train", "--subset", "200", "--batch-size", "50",
                              "--epochs", "1", "--run", "c1", capsys=capsys)
    assert code == 0, err
    assert "c1" in out and "test_acc" in out
    code, out, err = run_cli("--root", str(tmp_path), "train", "--from", "c1", "--epochs", "1",
                              "--optimizer", "dpsgd", "--noise-multiplier", "1", "--sampling", "shuffle",
                              "--batch-size", "50", "--run", "c2", "--json", capsys=capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["run"] == "c2" and summary["parent"] == "c1@step=4"
    assert err.count("warning:") == 1 and "Poisson" in err


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--noise-multiplier", "1", "--target-epsilon", "3", "--optimizer", "dpsgd"], 2, "not both"),
        (["--optimizer", "adam"], 2, "adam"),
        (["--from", "nope@last"], 1, "no run 'nope'"),
        (["--model", "resnet18", "--model-kwargs", '{"norm": "batch"}', "--optimizer", "dpsgd",
          "--noise-multiplier", "1"], 1, "norm"),
        (["--resume", "x", "--epochs", "3"], 2, "drop --epochs"),
        (["--checkpoint-every", "7"], 2, "steps"),
    ],
)
def test_cli_train_errors_are_one_line(tmp_path, capsys, args, code, message):
    got, out, err = run_cli("--root", str(tmp_path), "train", "--epochs", "1", *args, capsys=capsys)
    assert got == code
    assert message in err
    assert "Traceback" not in err
    if code == 1:
        assert len(err.strip().splitlines()) == 1


def test_cli_options_mirror_train_config():
    import dataclasses

    from cli.kinds import command as generated

    command = generated("train")
    params = {p.name for p in command.params} - {"as_json"}
    assert params == {f.name for f in dataclasses.fields(TrainConfig)}


def test_unknown_run_to_resume_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError):
        train(TrainConfig(resume="missing"), root=tmp_path)


def test_progress_bar_on_stderr_shows_epoch_loss_and_epsilon(tmp_path, capsys, monkeypatch):
    from landscape import progress

    monkeypatch.setattr(progress, "BAR_DELAY", 0)
    with progress.enabled(bar=True):  # a bar, as on a terminal
        train(TrainConfig(**SMALL, epochs=1, optimizer="dpsgd", noise_multiplier=1.0, run="bar"), root=tmp_path)
    out = capsys.readouterr()
    assert out.out == ""
    assert "train bar" in out.err and "epoch 1.00" in out.err and "loss " in out.err and "eps " in out.err
    monkeypatch.setenv(progress.INTERVAL_ENV, "0.001")
    train(TrainConfig(**SMALL, epochs=1, run="lines"), root=tmp_path, progress=True)  # stderr is no terminal here
    assert "train lines: " in capsys.readouterr().err  # lines instead of a bar
    train(TrainConfig(**SMALL, epochs=1, run="quiet"), root=tmp_path)  # off unless turned on
    assert capsys.readouterr().err == ""
