"""Issue 23 item 1: imported weights keep their privacy history (unknown unless declared) through descendants.

A DP run trained `--from` an imported checkpoint of unknown history says so in its manifest, `store ls`,
`store show`, `show` and every analysis' result; a declared (epsilon, delta) is added by basic composition,
declared DP-SGD steps (an accountant's record) are composed exactly like a landscape parent's.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_cli

from landscape import api
from landscape.data import load_dataset
from landscape.errors import CheckpointError, UsageError
from landscape.models import build_model
from landscape.privacy import UNKNOWN_ANCESTRY, PrivacyEvent
from landscape.results import read_result
from landscape.store import MANIFEST, Store
from landscape.train.accounting import composed_epsilon, epsilon
from landscape.train.pruning import inherited_privacy

# Opacus' own notices (secure RNG off; its hooks on inputs without grad): not ours to report
pytestmark = pytest.mark.filterwarnings("ignore:Secure RNG turned off", "ignore:Full backward hook is firing")
SUBSET = 100
BATCH = 20
SIGMA = 1.0


@pytest.fixture(scope="module")
def opacus_file(tmp_path_factory):
    """Weights trained privately with Opacus (lenet on digits), saved by `engine.save_checkpoint`: keys under
    `module_state_dict`, prefixed `_module.`; and the accountant's (sigma, q, steps)."""
    from opacus import PrivacyEngine

    data = load_dataset("digits", subset=SUBSET)
    torch.manual_seed(0)
    model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.x_train, data.y_train), batch_size=BATCH)
    engine = PrivacyEngine(accountant="rdp")
    gsm, opt, loader = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                                           data_loader=loader, noise_multiplier=1.1, max_grad_norm=1.0)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(gsm(x), y).backward()
        opt.step()
    path = tmp_path_factory.mktemp("opacus") / "opacus.pt"
    engine.save_checkpoint(path=path, module=gsm, optimizer=opt)
    (sigma, q, steps), = engine.accountant.history
    return path, (sigma, q, steps), engine.accountant.get_epsilon(1e-5)


def _import(root, path, capsys, *declare):
    return run_cli("--root", root, "import", path, "--model", "lenet", "--data", "digits", "--subset", SUBSET, "--run", "imp",
                   *declare, capsys=capsys)


def _child(root, capsys, name="child"):
    code, out, err = run_cli("--root", root, "train", "--from", "imp@init", "--optimizer", "dpsgd", "--noise-multiplier",
                             SIGMA, "--batch-size", BATCH, "--epochs", 1, "--run", name, capsys=capsys)
    assert code == 0, err
    return Store(root).run(name)


def test_undeclared_import_makes_every_descendant_report_unknown_ancestry(tmp_path, opacus_file, capsys):
    root = tmp_path / "ck"
    code, out, err = _import(root, opacus_file[0], capsys)
    assert code == 0, err
    assert f"privacy: {UNKNOWN_ANCESTRY}" in out
    imported = Store(root).run("imp")
    assert imported.manifest["privacy"]["unknown_ancestors"] is True
    assert Store(root).load("imp@init").epsilon is None
    child = _child(root, capsys)
    privacy = child.manifest["privacy"]
    assert privacy["unknown_ancestors"] is True and privacy["note"] == UNKNOWN_ANCESTRY
    assert privacy["ancestor_events"] == [] and privacy["non_private_ancestors"] is False
    q = BATCH / SUBSET
    assert Store(root).load("child@last").epsilon == pytest.approx(epsilon(SIGMA, q, 5, 1e-5), rel=1e-9)
    grandchild_history = inherited_privacy(Store(root), Store(root).load("child@last"))  # it propagates
    assert grandchild_history.unknown and [vars(e) for e in grandchild_history.events] == [
        {"noise_multiplier": SIGMA, "sample_rate": q, "steps": 5}]
    # store ls, store show (and their --json), show, an analysis' provenance
    code, out, _ = run_cli("--root", root, "store", "ls", capsys=capsys)
    assert f"note: run child: {UNKNOWN_ANCESTRY}" in out and f"note: run imp: {UNKNOWN_ANCESTRY}" in out
    code, out, _ = run_cli("--root", root, "store", "ls", "--json", capsys=capsys)
    assert {r["name"]: r["privacy_note"] for r in json.loads(out)["runs"]} == {"imp": UNKNOWN_ANCESTRY,
                                                                              "child": UNKNOWN_ANCESTRY}
    code, out, _ = run_cli("--root", root, "store", "show", "child@last", capsys=capsys)
    assert f"privacy      {UNKNOWN_ANCESTRY}" in out
    code, out, err = run_cli("--root", root, "calibration", "child@last", "--bins", 5, "-o", tmp_path / "cal.h5", "--no-figure",
                             capsys=capsys)
    assert code == 0, err
    assert read_result(tmp_path / "cal.h5").attrs["privacy_note"] == f"run child: {UNKNOWN_ANCESTRY}"
    code, out, _ = run_cli("--root", root, "show", tmp_path / "cal.h5", capsys=capsys)
    assert f"attr   privacy_note = run child: {UNKNOWN_ANCESTRY}" in out
    for made in (api.prune(api.PruneConfig("child@last", 0.5, rewind="none", run="pruned"), root=root).run,
                 api.align("imp@init", "child@last", run="aligned", root=root).run):  # more descendants
        privacy = Store(root).run(made).manifest["privacy"]
        assert privacy["unknown_ancestors"] is True and privacy["note"] == UNKNOWN_ANCESTRY
    code, out, err = run_cli("--root", root, "interpolate", "imp@init", "child@last", "--points", 3, "-o", tmp_path / "i.h5",
                             "--no-figure", capsys=capsys)
    assert code == 0, err
    assert read_result(tmp_path / "i.h5").attrs["privacy_note"] == f"runs imp, child: {UNKNOWN_ANCESTRY}"


def test_a_declared_epsilon_is_reported_and_composed(tmp_path, opacus_file, capsys):
    root = tmp_path / "ck"
    path, _, eps_opacus = opacus_file
    code, out, err = _import(root, path, capsys, "--epsilon", eps_opacus, "--delta", 1e-5)
    assert code == 0, err
    assert "declared epsilon" in out and "unknown" not in out
    assert Store(root).load("imp@init").epsilon == pytest.approx(eps_opacus)
    child = _child(root, capsys)
    privacy = child.manifest["privacy"]
    assert "unknown_ancestors" not in privacy and privacy["declared_ancestors"] == [{"epsilon": eps_opacus,
                                                                                     "delta": 1e-5}]
    assert privacy["total_delta"] == pytest.approx(2e-5)
    own = epsilon(SIGMA, BATCH / SUBSET, 5, 1e-5)  # basic composition: epsilons add, deltas add
    assert Store(root).load("child@last").epsilon == pytest.approx(eps_opacus + own, rel=1e-9)
    assert Store(root).load("child@init").epsilon == pytest.approx(eps_opacus, rel=1e-9)
    code, out, _ = run_cli("--root", root, "store", "ls", capsys=capsys)
    assert ("note: run child: epsilon includes the declared epsilon of imported ancestors and holds at delta 2e-05"
            in out)


def test_declared_accountant_events_compose_exactly_like_a_parent_run(tmp_path, opacus_file, capsys):
    root = tmp_path / "ck"
    path, (sigma, q, steps), eps_opacus = opacus_file
    code, out, err = _import(root, path, capsys, "--noise-multiplier", sigma, "--sample-rate", q, "--steps", steps)
    assert code == 0, err
    assert Store(root).load("imp@init").epsilon == pytest.approx(eps_opacus, rel=1e-6)  # Opacus' own number
    child = _child(root, capsys)
    assert child.manifest["privacy"]["ancestor_events"] == [{"noise_multiplier": sigma, "sample_rate": q,
                                                             "steps": steps}]
    expected = composed_epsilon([PrivacyEvent(sigma, q, steps), PrivacyEvent(SIGMA, BATCH / SUBSET, 5)], 1e-5)
    assert Store(root).load("child@last").epsilon == pytest.approx(expected, rel=1e-9)


def test_old_imports_without_a_privacy_record_are_unknown_too(tmp_path, opacus_file, capsys):
    """A store written before imports recorded privacy: the run has lineage `imported_from` and no privacy."""
    root = tmp_path / "ck"
    assert _import(root, opacus_file[0], capsys)[0] == 0
    manifest_path = root / "imp" / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    del manifest["privacy"]
    manifest_path.write_text(json.dumps(manifest))
    assert inherited_privacy(Store(root), Store(root).load("imp@init")).unknown
    child = _child(root, capsys)
    assert child.manifest["privacy"]["unknown_ancestors"] is True
    assert api.runs(root)["runs"][0]["privacy_note"] == UNKNOWN_ANCESTRY


def test_bad_declarations_are_one_line_errors_and_import_nothing(tmp_path, opacus_file, capsys):
    root = tmp_path / "ck"
    path = opacus_file[0]
    for declare, message in ((["--epsilon", "-1", "--delta", "1e-5"], "--epsilon"),
                             (["--epsilon", "nan", "--delta", "1e-5"], "finite number"),
                             (["--epsilon", "1"], "--epsilon and --delta declare one guarantee"),
                             (["--epsilon", "1", "--delta", "1e-5", "--steps", "3"], "not both"),
                             (["--noise-multiplier", "1", "--steps", "3"], "give all three"),
                             (["--delta", "1.5", "--epsilon", "1"], "--delta")):
        code, out, err = _import(root, path, capsys, *declare)
        assert code == 2 and message in err, (declare, err)
        assert len(err.strip().splitlines()) <= 2, err  # click's usage line + the error
    assert not (root / "imp").exists()
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(UsageError, match="declared epsilon must be a finite number >= 0"):
            api.import_checkpoint(path, run="imp", model="lenet", data="digits", subset=SUBSET, root=root,
                                  epsilon=bad, delta=1e-5)
    assert not (root / "imp").exists()


def test_the_manifest_schema_checks_the_new_privacy_fields(tmp_path, opacus_file, capsys):
    root = tmp_path / "ck"
    assert _import(root, opacus_file[0], capsys, "--epsilon", "1", "--delta", "1e-6")[0] == 0
    manifest_path = root / "imp" / MANIFEST
    good = json.loads(manifest_path.read_text())
    for field, value in (("declared_ancestors", [{"epsilon": -1, "delta": 1e-5}]),
                         ("declared_ancestors", [{"epsilon": 1}]), ("unknown_ancestors", "yes"),
                         ("total_delta", "x"), ("note", 3)):
        manifest_path.write_text(json.dumps({**good, "privacy": {**good["privacy"], field: value}}))
        with pytest.raises(CheckpointError, match=f"field 'privacy.{field}"):
            Store(root).run("imp")
