"""A child run (`train --from`) continues with its parent's privacy accountant, or records both epsilons.

The parents are runs as a Recorder with `OpacusPrivacy` writes them (manifest `privacy` with Opacus' accountant
mechanism, checkpoints' epsilon = Opacus' `get_epsilon`), made here through the store with Opacus' own
accountants as the reference, and runs `landscape train` wrote with each of its accountants.
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from conftest import run_cli

from landscape.api.training import TRAIN_JOB, ensure, summarize, train
from landscape.data import load_dataset
from landscape.models import build_model
from landscape.store import Store
from landscape.train import accounting
from landscape.train.accounting import AccountantWarning
from landscape.train.config import TrainConfig

opacus = pytest.importorskip("opacus")

DATA = dict(data="digits", subset=100)
SIGMA, STEPS = 1.0, 6


def opacus_epsilon(mechanism: str, history: list[tuple[float, float, int]], delta: float = 1e-5) -> float:
    from opacus.accountants import create_accountant

    acc = create_accountant(mechanism)
    acc.history = list(history)
    return float(acc.get_epsilon(delta))


def opacus_parent(root, name: str, mechanism: str) -> tuple[float, float]:
    """A run as ``Recorder(..., privacy=OpacusPrivacy(engine...))`` records it from an Opacus loop whose
    ``PrivacyEngine(accountant=mechanism)`` counted ``STEPS`` steps: returns (sample rate, last epsilon)."""
    data = load_dataset("digits", subset=100, seed=0)
    torch.manual_seed(0)
    model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    q = 25 / len(data.y_train)
    privacy = {"noise_multiplier": SIGMA, "sample_rate": q, "max_grad_norm": 1.0, "delta": 1e-5,
               "accountant": mechanism, "sampling": "poisson", "source": "opacus", "steps": STEPS,
               "accounted": True, "ancestor_events": [], "non_private_ancestors": False}
    run = Store(root).create_run(name, config={"optimizer": "dpsgd"}, seeds={}, model_spec=model.landscape_spec,
                                 data_spec=data.spec, extra={"privacy": privacy})
    run.save_checkpoint(model.state_dict(), step=0, epoch=0.0, epsilon=0.0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    eps = opacus_epsilon(mechanism, [(SIGMA, q, STEPS)])
    run.save_checkpoint(model.state_dict(), step=STEPS, epoch=1.5, epsilon=eps)
    run.close()
    return q, eps


def child(root, parent: str, run: str, **kw):
    cfg = TrainConfig(**DATA, from_ref=f"{parent}@last", run=run, optimizer="dpsgd", noise_multiplier=SIGMA,
                      batch_size=25, epochs=1, checkpoint_every="none", lr=0.05, **kw)
    return train(cfg, root=root, progress=False)


def first_epsilon(run) -> float:
    return run.checkpoints()[0].epsilon


def test_a_child_of_an_opacus_rdp_run_continues_with_rdp(tmp_path):
    q, eps = opacus_parent(tmp_path, "op-rdp", "rdp")
    with warnings.catch_warnings():
        warnings.simplefilter("error", AccountantWarning)  # the same accountant: nothing to say
        c = child(tmp_path, "op-rdp", "c")
    privacy = c.manifest["privacy"]
    assert privacy["accountant"] == "rdp" and c.manifest["config"]["accountant"] == "rdp"
    assert first_epsilon(c) == pytest.approx(eps, rel=1e-6)  # Opacus' RDP accountant, to its series' truncation
    assert privacy["parent_epsilon"] == {"ref": "op-rdp@last", "epsilon": eps, "delta": 1e-5, "accountant": "rdp",
                                         "source": "opacus"}
    own = c.checkpoints()[-1]  # parent's steps then the child's, composed by Opacus' RDP accountant
    expected = opacus_epsilon("rdp", [(SIGMA, q, STEPS), (SIGMA, 25 / 100, own.step)])
    assert own.epsilon == pytest.approx(expected, rel=1e-6)


def test_a_child_of_an_opacus_prv_run_records_both_accountants(tmp_path, capsys):
    q, eps = opacus_parent(tmp_path, "op-prv", "prv")
    with pytest.warns(AccountantWarning, match=r"with pld; its parent op-prv@last reported epsilon .* by prv "
                                                r"\(opacus\), which landscape cannot compute: both are recorded"):
        c = child(tmp_path, "op-prv", "c")
    privacy = c.manifest["privacy"]
    assert privacy["accountant"] == "pld"  # the closest accountant landscape computes, named
    assert privacy["parent_epsilon"]["accountant"] == "prv" and privacy["parent_epsilon"]["epsilon"] == eps
    pld = accounting.epsilon(SIGMA, q, STEPS, 1e-5, "pld")
    assert first_epsilon(c) == pytest.approx(pld, rel=1e-12)  # the parent's steps, by pld
    assert first_epsilon(c) == pytest.approx(eps, rel=0.02)  # near Opacus' PRV number, not equal
    summary = summarize(c)
    assert summary.accountant == "pld" and summary.parent_epsilon["accountant"] == "prv"

    # the command prints the line, and an explicit --accountant is kept (and labelled the same way)
    code, out, err = run_cli("--root", tmp_path, "train", "--from", "op-prv@last", "--run", "c2", "--optimizer",
                             "dpsgd", "--noise-multiplier", SIGMA, "--batch-size", 25, "--epochs", 1,
                             "--accountant", "rdp", "--checkpoint-every", "none", capsys=capsys)
    assert code == 0, err
    line = next(ln for ln in err.splitlines() if ln.startswith("warning: "))
    assert "run 'c2' accounts every step, its parent's too, with rdp" in line and "by prv (opacus)" in line
    c2 = Store(tmp_path).run("c2")
    assert c2.manifest["privacy"]["accountant"] == "rdp"
    assert first_epsilon(c2) == pytest.approx(accounting.epsilon(SIGMA, q, STEPS, 1e-5, "rdp"), rel=1e-12)


def test_a_child_of_a_pld_run_continues_with_pld(tmp_path):
    cfg = TrainConfig(**DATA, run="p", optimizer="dpsgd", noise_multiplier=SIGMA, batch_size=25, epochs=1,
                      accountant="pld", checkpoint_every="none")
    parent = train(cfg, root=tmp_path, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AccountantWarning)
        c = child(tmp_path, "p", "c")
    assert c.manifest["privacy"]["accountant"] == c.manifest["config"]["accountant"] == "pld"
    assert first_epsilon(c) == parent.checkpoints()[-1].epsilon  # the same events, the same accountant
    assert math.isfinite(c.checkpoints()[-1].epsilon) and c.checkpoints()[-1].epsilon > first_epsilon(c)
    # the same job again (a batch rerun, phases' and the recipes' reuse): the same run, not "another configuration"
    same = TrainConfig(**DATA, from_ref="p@last", run="c", optimizer="dpsgd", noise_multiplier=SIGMA, batch_size=25,
                       epochs=1, checkpoint_every="none", lr=0.05)
    assert TRAIN_JOB.run(same, root=tmp_path).name == ensure(Store(tmp_path), same).name == "c"
    # a run from scratch and a child of an rdp run keep rdp, and their configuration hashes as before
    scratch = train(TrainConfig(**DATA, run="s", optimizer="dpsgd", noise_multiplier=SIGMA, batch_size=25,
                                epochs=1, checkpoint_every="none"), root=tmp_path, progress=False)
    assert scratch.manifest["privacy"]["accountant"] == scratch.manifest["config"]["accountant"] == "rdp"
    again = child(tmp_path, "s", "c-of-s")
    assert again.manifest["privacy"]["accountant"] == "rdp"
    assert first_epsilon(again) == scratch.checkpoints()[-1].epsilon


@pytest.mark.filterwarnings("ignore:Secure RNG turned off", "ignore:Full backward hook is firing",
                            "ignore:Optimal order is the")
def test_a_real_opacus_prv_loop_then_train_from_it(tmp_path, capsys):
    """The issue as a user meets it: an Opacus loop with PrivacyEngine(accountant="prv") recorded, then
    `landscape train --from` its last checkpoint: the child's first epsilon is labelled, never a silent jump."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    import landscape
    from landscape.integrations.opacus import OpacusPrivacy

    data = load_dataset("digits", subset=100, seed=0)
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes, widths=[8])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(data.x_train, data.y_train), batch_size=25,
                        generator=torch.Generator().manual_seed(0))
    engine = PrivacyEngine(accountant="prv")
    model, optimizer, loader = engine.make_private(module=model, optimizer=optimizer, data_loader=loader,
                                                   noise_multiplier=SIGMA, max_grad_norm=1.0)
    with landscape.Recorder(tmp_path, "opacus", model, data=data, optimizer=optimizer, steps_per_epoch=len(loader),
                            privacy=OpacusPrivacy(engine, optimizer, loader)) as rec:
        rec.save()
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        rec.save()
    parent = Store(tmp_path).run("opacus")
    reported = parent.checkpoints()[-1].epsilon
    assert parent.manifest["privacy"]["accountant"] == "prv" and reported == pytest.approx(
        engine.accountant.get_epsilon(1e-5))
    code, out, err = run_cli("--root", tmp_path, "train", "--from", "opacus@last", "--run", "child", "--optimizer",
                             "dpsgd", "--noise-multiplier", SIGMA, "--epochs", 1, "--batch-size", 25, "--json",
                             capsys=capsys)
    assert code == 0, err
    assert f"reported epsilon {reported:.4g} by prv (opacus)" in err
    child = Store(tmp_path).run("child")
    assert child.manifest["privacy"]["parent_epsilon"]["epsilon"] == reported
    steps = parent.manifest["privacy"]["steps"]
    q = parent.manifest["privacy"]["sample_rate"]
    assert first_epsilon(child) == pytest.approx(accounting.epsilon(SIGMA, q, steps, 1e-5, "pld"), rel=1e-12)
    details = json.loads(out)
    assert details["accountant"] == "pld" and details["parent_epsilon"]["accountant"] == "prv"
