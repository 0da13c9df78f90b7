"""Models from user code (``--model file.py:factory`` / ``module:factory``), the rule that a store never makes
landscape import code by itself, and analyses of outside models checked against plain PyTorch.

The outside models live in ``tests/user_models.py`` (a file as a researcher brings it): a CNN defined there,
torchvision's MobileNetV3-Small with BatchNorm converted to GroupNorm, and a TransformerEncoder classifier on
integer token sequences.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli
from torch import nn

from landscape import plugins
from landscape.api import calibration, hessian, interpolate, norms
from landscape.api.training import train as api_train
from landscape.data import load_dataset
from landscape.models import build_model, model_from_spec, model_source
from landscape.plugins import sha256_file
from landscape.store import Store
from landscape.train.config import TrainConfig

USER = Path(__file__).with_name("user_models.py").resolve()
TINY = dict(epochs=1, batch_size=32, checkpoint_every="none", device="cpu", lr=0.1)


def ref(attr: str, file: Path = USER) -> str:
    return f"{file}:{attr}"


def one_error(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def blended_losses(model: nn.Module, a: dict, b: dict, alphas, x, y) -> np.ndarray:
    """The reference: load ``(1 - t) A + t B`` into the model and take the mean cross-entropy."""
    out = []
    for t in alphas:
        model.load_state_dict({k: (1 - t) * a[k] + t * b[k] if a[k].is_floating_point() else a[k] for k in a})
        model.eval()
        with torch.no_grad():
            out.append(F.cross_entropy(model(x), y).item())
    return np.array(out)


# ------------------------------------------------------------------------------------------ the registry


def test_builtins_entry_points_and_code_are_one_registry():
    assert model_source("lenet").kind == "builtin"
    source = model_source(ref("tiny_cnn"))
    assert source.kind == "code" and source.provenance["code"]["sha256"] == sha256_file(USER)
    model = build_model(ref("tiny_cnn"), input_shape=(1, 8, 8), num_classes=10, width=3)
    spec = model.landscape_spec
    assert spec["name"] == ref("tiny_cnn") and spec["kwargs"] == {"input_shape": [1, 8, 8], "num_classes": 10,
                                                                  "width": 3}
    assert spec["code"]["file"] == str(USER) and spec["code"]["attr"] == "tiny_cnn"
    module_model = build_model("torch.nn:Identity", input_shape=(3,), num_classes=2)  # takes neither shape argument
    assert isinstance(module_model, nn.Identity) and module_model.landscape_spec["code"]["kind"] == "module"


def test_a_stored_spec_rebuilds_only_code_named_in_this_context():
    spec = build_model(ref("tiny_cnn"), input_shape=(1, 8, 8), num_classes=10).landscape_spec
    with pytest.raises(plugins.PluginError, match=r"pass code=\['.*user_models.py:tiny_cnn'\]"):
        model_from_spec(spec)
    with plugins.trusting([ref("tiny_mlp")]), pytest.raises(plugins.PluginError):  # other code: still refused
        model_from_spec(spec)
    with plugins.trusting([ref("tiny_cnn")]):
        assert model_from_spec(spec).landscape_spec == spec
    assert plugins.trust_state().refs == ()  # the block left nothing behind


def test_a_moved_file_with_the_same_bytes_is_the_same_code(tmp_path):
    spec = build_model(ref("tiny_cnn"), input_shape=(1, 8, 8), num_classes=10).landscape_spec
    moved = tmp_path / "elsewhere.py"
    shutil.copy(USER, moved)
    with pytest.raises(plugins.PluginError, match="pass code="):  # another name is not taken for the same code
        with plugins.trusting([ref("tiny_cnn", moved)]):
            model_from_spec(spec)
    moved = tmp_path / "copy" / USER.name
    moved.parent.mkdir()
    shutil.copy(USER, moved)
    with plugins.trusting([ref("tiny_cnn", moved)]):
        rebuilt = model_from_spec(spec)
    assert rebuilt.landscape_spec["code"]["file"] == str(moved.resolve())
    moved.write_text(moved.read_text() + "\n# changed\n")
    with plugins.trusting([ref("tiny_cnn", moved)]), pytest.raises(plugins.PluginError, match="pass code="):
        model_from_spec(spec)
    with plugins.trusting([ref("tiny_cnn", moved)], accept_changed=True):  # moved and changed, accepted
        assert model_from_spec(spec).landscape_spec["code"]["accepted_change_from"] == sha256_file(USER)


# ------------------------------------------------------------------------------------------------ safety


def _hostile_store(root: Path, evil: Path) -> None:
    store = Store(root)
    sha = sha256_file(evil)
    digits = {"name": "digits", "seed": 0, "subset": None, "options": {"test_fraction": 0.25, "split_seed": 0,
                                                                       "standardize": True}}
    kwargs = {"input_shape": [1, 8, 8], "num_classes": 10}
    state = {"weight": torch.zeros(10, 64), "bias": torch.zeros(10)}
    specs = {
        "sys": {"name": "os:system", "kwargs": {**kwargs, "command": f"touch {root / 'SYSTEM_RAN'}"},
                "code": {"ref": "os:system", "kind": "module", "module": "os", "attr": "system", "sha256": None}},
        "bare": {"name": "os:system", "kwargs": {**kwargs, "command": f"touch {root / 'SYSTEM_RAN'}"}},
        "file": {"name": f"{evil}:make", "kwargs": kwargs,
                 "code": {"ref": f"{evil}:make", "kind": "file", "file": str(evil), "attr": "make", "sha256": sha}},
    }
    for name, spec in specs.items():
        run = store.create_run(name, config={}, seeds={}, model_spec=spec, data_spec=digits)
        with run:
            run.save_checkpoint(state, step=0, epoch=0.0)
            run.save_checkpoint(state, step=1, epoch=1.0)
    data_code = {**digits, "name": f"{evil}:make",
                 "code": {"ref": f"{evil}:make", "kind": "file", "file": str(evil), "attr": "make", "sha256": sha}}
    lenet = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, widths=[])
    run = store.create_run("data", config={}, seeds={}, model_spec=lenet.landscape_spec, data_spec=data_code)
    with run:
        run.save_checkpoint(lenet.state_dict(), step=0, epoch=0.0)


def test_a_store_that_names_code_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "EVIL_RAN"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('ran')\ndef make(**kw):\n    open({str(marker)!r}, 'w')\n")
    root = tmp_path / "ck"
    _hostile_store(root, evil)
    code, out, _ = run_cli("--root", root, "store", "ls", capsys=capsys)
    assert code == 0 and "sys" in out
    assert run_cli("--root", root, "store", "show", "file@last", capsys=capsys)[0] == 0
    commands = [("interpolate", "file@init", "file@last"), ("interpolate", "sys@init", "sys@last"),
                ("hessian", "file@last", "--subset", "10"), ("calibration", "sys@last"), ("norms", "file"),
                ("calibration", "data@init"), ("interpolate", "bare@init", "bare@last")]
    for command in commands:
        code, _, err = run_cli("--root", root, *command, "--no-figure", capsys=capsys)
        line = one_error(err)
        assert code in (1, 2), (command, err)
        if "bare" not in command[1]:
            assert "pass --code" in line and ("os:system" in line or str(evil) in line), line
        else:
            assert "unknown model 'os:system'" in line
    with pytest.raises(plugins.PluginError, match="pass code="):
        interpolate("file@init", "file@last", root=root, figure=False)
    other = tmp_path / "other.py"  # another file with the same function name is not the recorded code
    other.write_text("def make(**kw):\n    raise SystemExit('must not run')\n")
    code, _, err = run_cli("--root", root, "--code", f"{other}:make", "calibration", "file@last", "--no-figure",
                           capsys=capsys)
    assert code == 2 and "pass --code" in one_error(err)
    assert not marker.exists() and not (root / "SYSTEM_RAN").exists()
    assert not Path("results").exists()  # nothing was written


# --------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("model, words, exit_code", [
    ("no_such_module_xyz:make", "not importable", 2),
    ("{user}:no_such_factory", "has no 'no_such_factory'", 2),
    ("{user}:TINY", "not a callable", 2),
    ("{user}:not_a_module", "not a torch.nn.Module", 1),
    ("{user}:raises", "ValueError: no model today", 1),
])
def test_bad_model_code_is_one_line_and_writes_nothing(tmp_path, capsys, model, words, exit_code):
    user = tmp_path / "net.py"
    user.write_text("TINY = 3\ndef not_a_module(input_shape, num_classes):\n    return 42\n"
                    "def raises(**kw):\n    raise ValueError('no model today')\n")
    code, _, err = run_cli("--root", tmp_path / "ck", "train", "--model", model.format(user=user), "--subset", 50,
                           "--epochs", 1, "--run", "x", capsys=capsys)
    assert code == exit_code and words in one_error(err)
    assert not (tmp_path / "ck" / "x").exists()


def test_unknown_model_option_of_a_factory(capsys, tmp_path):
    code, _, err = run_cli("--root", tmp_path, "train", "--model", ref("tiny_cnn"), "--model-kwargs",
                           '{"depth": 3}', "--subset", 50, capsys=capsys)
    assert code == 1 and "has no option 'depth'" in one_error(err)


def test_malformed_code_option(capsys):
    code, _, err = run_cli("--code", "not a ref", "store", "ls", capsys=capsys)
    assert code == 2 and "not a code reference" in one_error(err)


# ------------------------------------------------------------------------------ a user CNN, end to end


@pytest.fixture(scope="module")
def cnn_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("user-cnn")
    user = d / "net.py"
    shutil.copy(USER, user)
    for run, seed in (("a", 0), ("b", 1)):
        api_train(TrainConfig(model=ref("tiny_cnn", user), data="digits", subset=120, seed=seed, run=run, **TINY),
                  root=d / "ck")
    return d / "ck", user


def test_user_cnn_interpolation_equals_a_blended_state_dict_loop(cnn_store, capsys):
    root, user = cnn_store
    code, _, err = run_cli("--root", root, "interpolate", "a", "b", "--points", 5, "--no-figure", capsys=capsys)
    assert code == 2 and f"pass --code {user}:tiny_cnn" in one_error(err)
    code, _, err = run_cli("--root", root, "--code", ref("tiny_cnn", user), "interpolate", "a", "b", "--points", 5,
                           "--no-figure", "-o", "r.h5", capsys=capsys)
    assert code == 0, err
    with h5py.File("r.h5") as f:
        recorded = json.loads(f.attrs["code"])
    assert recorded["refs"][0]["sha256"] == sha256_file(user) and recorded["accept_changed"] is False
    result = interpolate("a", "b", root=root, points=5, figure=False, code=[ref("tiny_cnn", user)], output="p.h5")
    store = Store(root)
    a, b = store.load("a@last"), store.load("b@last")
    data = load_dataset("digits", subset=120, seed=0)
    with plugins.trusting([ref("tiny_cnn", user)]):
        model = a.build_model()
    expected = blended_losses(model, a.state_dict, b.state_dict, result.alpha, data.x_train, data.y_train)
    np.testing.assert_allclose(result.loss["train"], expected, rtol=1e-5, atol=1e-6)


def test_workers_receive_the_trusted_code(cnn_store, capsys):
    root, user = cnn_store
    code, _, err = run_cli("--root", root, "--code", ref("tiny_cnn", user), "norms", "a", "--workers", 2,
                           "--subset", 16, "--no-figure", "-o", "n.h5", capsys=capsys)
    assert code == 0, err


def test_dask_tasks_run_under_the_parents_trust():
    from landscape import runtime
    from landscape.api import execution

    seen = execution._dask_task(None, None, ((ref("tiny_cnn"),), True, "cpu"),
                                lambda: (plugins.trust_state(), runtime.default_device()))
    assert seen[0].refs == (ref("tiny_cnn"),) and seen[0].accept_changed and seen[1] == "cpu"
    assert plugins.trust_state().refs == () and runtime.default_device() == "auto"


def test_changed_code_is_refused_unless_accepted(cnn_store, tmp_path, capsys):
    root, user = cnn_store
    changed = tmp_path / "root"
    shutil.copytree(root, changed)
    old = sha256_file(user)
    text = user.read_text()
    try:
        user.write_text(text + "\n# a comment changes the file's sha256\n")
        code, _, err = run_cli("--root", changed, "--code", ref("tiny_cnn", user), "calibration", "a@last",
                               "--no-figure", capsys=capsys)
        assert code == 1 and "changed since it was recorded" in one_error(err)
        assert "--accept-changed-code" in err and not Path("results").exists()
        code, _, err = run_cli("--root", changed, "--code", ref("tiny_cnn", user), "--accept-changed-code",
                               "calibration", "a@last", "--no-figure", "-o", "c.h5", capsys=capsys)
        assert code == 0, err
        with h5py.File("c.h5") as f:
            assert json.loads(f.attrs["code"])["accept_changed"] is True
        spec = Store(changed).load("a@last").model_spec
        with plugins.trusting([ref("tiny_cnn", user)], accept_changed=True):
            assert model_from_spec(spec).landscape_spec["code"]["accepted_change_from"] == old
    finally:
        user.write_text(text)


def test_dp_sgd_trains_a_user_cnn(tmp_path):
    run = api_train(TrainConfig(model=ref("tiny_cnn"), data="digits", subset=100, optimizer="dpsgd",
                                noise_multiplier=1.0, run="dp", **TINY), root=tmp_path / "ck")
    assert run.checkpoints()[-1].epsilon > 0


# ------------------------------------------------------------------------------- outside architectures


def test_mobilenet_from_torchvision_with_groupnorm(tmp_path):
    root = tmp_path / "ck"
    cfg = dict(model=ref("mobilenet"), data=ref("images"), **{**TINY, "batch_size": 16})
    for run, seed in (("a", 0), ("b", 1)):
        api_train(TrainConfig(seed=seed, run=run, **cfg), root=root)
    store = Store(root)
    a, b = store.load("a@last"), store.load("b@last")
    assert a.data_spec["code"]["attr"] == "images" and a.data_spec["name"] == ref("images")
    code = [ref("mobilenet"), ref("images")]
    result = interpolate("a", "b", root=root, points=3, figure=False, code=code, split=("test",))
    with plugins.trusting(code):
        model = a.build_model()
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())
    data = plugins.load(ref("images"))(seed=0)
    expected = blended_losses(model, a.state_dict, b.state_dict, result.alpha, data["x_test"], data["y_test"])
    np.testing.assert_allclose(result.loss["test"], expected, rtol=1e-4, atol=1e-5)


def test_squeezenet_has_no_batchnorm_to_convert():
    model = build_model(ref("squeezenet"), input_shape=(3, 32, 32), num_classes=3)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 3)


# ---------------------------------------------------------------------- a transformer on token sequences


@pytest.fixture(scope="module")
def transformer_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("user-transformer") / "ck"
    cfg = dict(model=ref("transformer"), model_kwargs={"dim": 8}, data=ref("sequences"), **{**TINY, "batch_size": 16})
    for run, seed in (("a", 0), ("b", 1)):
        api_train(TrainConfig(seed=seed, run=run, **cfg), root=root)
    api_train(TrainConfig(seed=2, run="dp", optimizer="dpsgd", noise_multiplier=1.0, **cfg), root=root)
    return root


CODE_T = [ref("transformer"), ref("sequences")]


def _transformer(root, name="a@last"):
    ckpt = Store(root).load(name)
    with plugins.trusting(CODE_T):
        return ckpt, ckpt.build_model()


def test_token_inputs_stay_integers(transformer_store):
    ckpt, _ = _transformer(transformer_store)
    with plugins.trusting(CODE_T):
        from landscape.data import dataset_from_spec

        data = dataset_from_spec(ckpt.data_spec)
    assert data.x_train.dtype == torch.int64 and data.input_shape == (8,) and data.num_classes == 2


def test_transformer_interpolation_calibration_norms_against_plain_torch(transformer_store, capsys):
    root = transformer_store
    x_tr, y_tr, x_te, y_te = plugins.load(ref("sequences"))(seed=0)
    result = interpolate("a", "b", root=root, points=4, figure=False, code=CODE_T)
    a, model = _transformer(root)
    b = Store(root).load("b@last")
    expected = blended_losses(model, a.state_dict, b.state_dict, result.alpha, x_tr, y_tr)
    np.testing.assert_allclose(result.loss["train"], expected, rtol=1e-4, atol=1e-5)

    cal = calibration("dp@last", root=root, figure=False, code=CODE_T)
    _, dp_model = _transformer(root, "dp@last")
    with torch.no_grad():
        logp = F.log_softmax(dp_model.eval()(x_te), dim=1)
    row = cal.rows[0]
    assert row.nll == pytest.approx(-logp.gather(1, y_te[:, None]).mean().item(), rel=1e-5)
    assert row.accuracy == pytest.approx((logp.argmax(1) == y_te).float().mean().item())

    res = norms(["a"], root=root, figure=False, code=CODE_T, subset=len(y_tr), output="n.h5")
    last = res.runs[0].rows[-1]
    from landscape.data import subset_indices

    idx = subset_indices(y_tr, len(y_tr), 0)  # the examples the one sampler draws
    model.load_state_dict(a.state_dict)  # the blended loop above left B's weights in it
    naive = []
    for i in idx.tolist():
        model.zero_grad()
        F.cross_entropy(model(x_tr[i:i + 1]), y_tr[i:i + 1]).backward()
        naive.append(math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters())))
    np.testing.assert_allclose(last.grad_norms, naive, rtol=1e-4, atol=1e-6)

    code, out, err = run_cli("--root", root, "--code", CODE_T[0], "--code", CODE_T[1], "calibration", "a@last",
                             "--no-figure", "--json", capsys=capsys)
    assert code == 0, err


def test_transformer_hessian_equals_the_exact_hessian(transformer_store):
    root = transformer_store
    ckpt, model = _transformer(root)
    x, y = plugins.load(ref("sequences"))(seed=0)[:2]
    res = hessian("a@last", root=root, figure=False, code=CODE_T, top_k=2, subset=len(y), precision="float64",
                  tol=1e-10, lanczos_steps=300)
    names = [k for k, _ in model.named_parameters()]
    params = {k: v.detach().double() for k, v in model.named_parameters()}
    shapes = [params[k].shape for k in names]
    sizes = [params[k].numel() for k in names]
    model = model.double().eval()

    def loss(flat):
        parts = dict(zip(names, (t.view(s) for t, s in zip(flat.split(sizes), shapes, strict=True)), strict=True))
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            return F.cross_entropy(torch.func.functional_call(model, parts, (x,)), y)

    flat = torch.cat([params[k].reshape(-1) for k in names])
    # reverse over reverse: torch.func.hessian's forward-over-reverse is off by ~5e-4 here (torch 2.14, CPU),
    # which central differences of the gradient along the top eigenvector confirm
    values, vectors = torch.linalg.eigh(torch.autograd.functional.hessian(loss, flat))
    exact = values.flip(0)[:2].numpy()
    np.testing.assert_allclose(res.rows[0].eigenvalues, exact, rtol=1e-6, atol=1e-8)
    v, g, eps = vectors[:, -1], torch.func.grad(loss), 1e-5
    assert float(v @ (g(flat + eps * v) - g(flat - eps * v))) / (2 * eps) == pytest.approx(exact[0], rel=1e-6)


# ------------------------------------------------------------------------------------ the docs page example (docs/own-code.md)


def test_the_own_code_page_example_runs(tmp_path, capsys):
    """Every command of the docs page "Your own model, data and training loop" (docs/own-code.md), as written."""
    import re
    import shlex

    section = (Path(__file__).parents[1] / "docs" / "own-code.md").read_text()
    python, bash = re.findall(r"```(?:python|bash)\n(.*?)```", section, re.S)[:2]
    assert python.startswith("# my_model.py")
    Path("my_model.py").write_text(python)
    commands = [shlex.split(line) for line in bash.strip().splitlines()]
    assert [c[0] for c in commands] == ["landscape"] * 4
    for command in commands:
        code, _, err = run_cli("--root", tmp_path / "checkpoints", *command[1:], "--no-figure"
                               if any(a in command for a in ("interpolate", "hessian")) else "--json", capsys=capsys)
        assert code == 0, (command, err)
    result = interpolate("mine-a", "mine-b", root=tmp_path / "checkpoints", code=["my_model.py:make"], figure=False,
                         output="api.h5")
    assert np.isfinite(result.loss["train"]).all() and result.alpha[0] == 0 and result.alpha[-1] == 1


# ------------------------------------------------------------------------------- import and phases


def test_import_a_foreign_checkpoint_of_a_user_model(tmp_path, capsys):
    torch.manual_seed(0)
    net = build_model(ref("tiny_cnn"), input_shape=(1, 8, 8), num_classes=10)
    torch.save(net.state_dict(), tmp_path / "weights.pt")
    root = tmp_path / "ck"
    code, _, err = run_cli("--root", root, "import", tmp_path / "weights.pt", "--model", ref("tiny_cnn"), "--data",
                           "digits", "--run", "imported", capsys=capsys)
    assert code == 0, err
    ckpt = Store(root).load("imported@init")
    assert ckpt.model_spec["code"]["sha256"] == sha256_file(USER)
    with plugins.trusting([ref("tiny_cnn")]):
        assert all(torch.equal(v, net.state_dict()[k]) for k, v in ckpt.build_model().state_dict().items())
    code, _, err = run_cli("--root", root, "calibration", "imported@init", "--no-figure", capsys=capsys)
    assert code == 2 and "--code" in one_error(err)


def test_phases_with_a_user_model(tmp_path):
    from landscape.api import PhasesConfig, phases

    base = TrainConfig(model=ref("tiny_mlp"), data="digits", subset=80, batch_size=40, epochs=2, lr=0.1,
                       checkpoint_every="none", device="cpu")
    summaries = phases(PhasesConfig(base=base, k=1, copies=1, phase1=("sgd",), phase2=("sgd",), group="g"),
                       root=tmp_path / "ck")
    assert [s.run for s in summaries] == ["g-sgd", "g-sgd-sgd-0"]
    assert Store(tmp_path / "ck").load("g-sgd-sgd-0@last").model_spec["name"] == ref("tiny_mlp")


def test_transformer_ntk_is_the_gram_matrix_of_naive_per_sample_gradients(transformer_store):
    from landscape.api import ntk

    root = transformer_store
    _, model = _transformer(root)
    x, y = plugins.load(ref("sequences"))(seed=0)[:2]
    res = ntk("a@last", root=root, subset=12, figure=False, code=CODE_T)
    rows = []
    for i in np.asarray(res.indices).tolist():  # token inputs reach the model as integers
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double())
    g = torch.stack(rows)
    np.testing.assert_allclose(np.asarray(res.K), (g @ g.T).numpy(), rtol=1e-4, atol=1e-6)


def test_a_child_run_of_a_user_model_needs_its_code_named(cnn_store, tmp_path, capsys):
    root, user = cnn_store
    child = tmp_path / "ck"
    shutil.copytree(root, child)
    args = ("train", "--from", "a@last", "--epochs", 1, "--batch-size", 40, "--checkpoint-every", "none")
    code, _, err = run_cli("--root", child, *args, "--run", "c1", capsys=capsys)
    assert code == 2 and "pass --code" in one_error(err) and not (child / "c1").exists()
    code, _, err = run_cli("--root", child, *args, "--model", ref("tiny_cnn", user), "--run", "c2", capsys=capsys)
    assert code == 0, err
    code, _, err = run_cli("--root", child, "--code", ref("tiny_cnn", user), *args, "--run", "c3", capsys=capsys)
    assert code == 0, err
    assert Store(child).load("c3@last").model_spec["name"] == ref("tiny_cnn", user)


def test_transformer_symmetry(transformer_store):
    """symmetry's directional derivatives (forward mode) through attention equal a naive per-example backward
    loop: the fused inference layer and CPU attention kernels lack forward AD, the math form has it."""
    from landscape.analyze.symmetry import direction, parameter_shapes, sample_indices, skewness
    from landscape.api import symmetry
    from landscape.persample import PerSampleEngine

    root = transformer_store
    res = symmetry("a", root=root, figure=False, code=CODE_T, subset=16, projections=3, seed=5, subset_seed=5,
                   permutations=20)
    assert len(res.rows) == 2
    ckpt, model = _transformer(root)
    model.load_state_dict(ckpt.state_dict)
    model.eval()
    x, y = plugins.load(ref("sequences"))(seed=0)[:2]
    idx = sample_indices(y, 16, 5)
    shapes = parameter_shapes(model)
    V = torch.stack([torch.cat([t.ravel() for t in direction(5, shapes, j)]) for j in range(5)])
    G = []
    for i in idx.tolist():
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        G.append(torch.cat([p.grad.ravel() for p in model.parameters()]))
    G = torch.stack(G)
    naive = ((G - G.mean(0)) @ V.T).double().numpy()
    stats = res.rows[-1].stats
    np.testing.assert_allclose(stats.plane, naive[:, :2], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stats.skew, skewness(naive[:, 2:]), rtol=1e-3, atol=1e-4)

    engine = PerSampleEngine(model)  # the projections took the forward-mode route, not the gradient fallback
    engine.projections(x[idx], y[idx], [{k: torch.ones_like(p) for k, p in model.named_parameters()}])
    assert engine._forward_ad


def test_transformer_directions_surface_clipping(transformer_store):
    from landscape.api import clipping, directions, surface

    root = transformer_store
    path = interpolate("a", "b", root=root, points=3, figure=False, code=CODE_T, output="i.h5")
    toward = directions("a@last", toward="b@last", directions=2, points=3, root=root, figure=False, code=CODE_T)
    np.testing.assert_allclose(toward.toward_loss, path.loss["train"], rtol=1e-5)
    plane = surface("a@last", plane="b@last,dp@last", grid="3", root=root, figure=False, code=CODE_T)
    assert np.isfinite(plane.values["train_loss"]).all() and plane.markers["b@last"][1] == 0.0
    rows = clipping("a", batch_size=16, root=root, figure=False, code=CODE_T).rows
    assert [r.step for r in rows] == [0, 6]


def test_store_ls_shows_user_code_by_file_name_and_show_keeps_the_reference(transformer_store, capsys):
    root, full = transformer_store, ref("transformer")
    assert full.startswith(str(USER.resolve().parent)) and full.endswith("user_models.py:transformer")
    code, out, _ = run_cli("--root", root, "store", "ls", capsys=capsys)
    assert code == 0
    rows = [line for line in out.splitlines() if line.split()[:1] in (["a"], ["b"], ["dp"])]
    assert len(rows) == 3
    for line in rows:
        assert "user_models.py:transformer" in line and "user_models.py:sequences" in line
        assert str(USER.resolve().parent) not in line
    code, out, _ = run_cli("--root", root, "store", "ls", "--json", capsys=capsys)
    assert {r["model"] for r in json.loads(out)["runs"]} == {full}  # --json keeps the stored reference
    code, out, _ = run_cli("--root", root, "store", "show", "a@last", capsys=capsys)
    assert code == 0 and full in out
    assert plugins.short_name(full) == "user_models.py:transformer"
    for unchanged in ("lenet", "torchvision.models:resnet18", None, "digits"):
        assert plugins.short_name(unchanged) == unchanged


def test_a_batch_spec_trusts_the_code_its_own_jobs_name(tmp_path, capsys):
    """A spec whose train jobs name a model file runs that file (as `train --model` does), so its other jobs may
    rebuild those runs without `--code`; a spec that only analyses a code-named store still needs `--code`."""
    model_file = tmp_path / "spec_model.py"
    model_file.write_text("from torch import nn\n\ndef make(input_shape, num_classes):\n"
                          "    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))\n")
    train = "kind: train\n    model: spec_model.py:make\n    data: digits\n    subset: 60\n    epochs: 1\n"
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"root: st\nresults: res\njobs:\n  a:\n    {train}    run: ua\n  b:\n    {train}"
                    "    seed: 1\n    run: ub\n  i:\n    kind: interpolate\n    refs: [ua, ub]\n    points: 3\n")
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, _, err = run_cli("batch", "spec.yaml", capsys=capsys)
        assert code == 0, err
        assert (tmp_path / "res").is_dir() and list((tmp_path / "res").rglob("*.h5"))
        only = tmp_path / "only.yaml"
        only.write_text("root: st\nresults: res2\njobs:\n  i:\n    kind: interpolate\n    refs: [ua, ub]\n"
                        "    points: 3\n")
        code, _, err = run_cli("batch", "only.yaml", capsys=capsys)
        assert code == 1 and "code=" in err and "spec_model.py:make" in err, err  # a job's error: the Python name
    finally:
        os.chdir(old)
