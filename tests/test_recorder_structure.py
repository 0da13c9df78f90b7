"""landscape.Recorder never writes a run that analyses cannot read: the model it is given is checked against the
model its landscape_spec builds (names, shapes, kinds of dtype), through every wrapper a training loop puts around
it (torch.compile, DataParallel, DistributedDataParallel, Opacus' GradSampleModule, nested in any order); a model
changed after its factory built it is refused in one line, with nothing written. `landscape import` looks through
the same wrappers' key prefixes and refuses the same changes.

The reference is a plain model built from the spec: the recorded weights must load into it and give the same
losses as the trained, wrapped model.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli
from torch import nn

import landscape
from landscape import api
from landscape.data import load_dataset
from landscape.errors import IncompatibleError, UsageError
from landscape.models import build_model, model_from_spec
from landscape.params import plain_names
from landscape.plugins import trusting
from landscape.store import Store

pytestmark = pytest.mark.filterwarnings("ignore:Secure RNG turned off", "ignore:Full backward hook is firing",
                                        "ignore:Using a non-full backward hook", "ignore:Optimal order")
opacus = pytest.importorskip("opacus")

NET = '''
from torch import nn


def make(input_shape, num_classes, fix=False):
    c, h, w = input_shape
    net = nn.Sequential(nn.Conv2d(c, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Tanh(), nn.Flatten(),
                        nn.Linear(4 * h * w, num_classes))
    if fix:  # what Opacus' tutorials do to a model, done inside the factory: analyses rebuild the fixed model
        from opacus.validators import ModuleValidator
        net = ModuleValidator.fix(net)
    return net
'''


@pytest.fixture
def net(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(NET)
    return f"{path}:make"


def _data():
    return load_dataset("digits", subset=100)


def _lenet(data, seed=0):
    torch.manual_seed(seed)
    return build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)


def _train(model, data, steps, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for i in range(steps):
        idx = torch.arange(i * 20, i * 20 + 20) % len(data.y_train)
        opt.zero_grad()
        nn.functional.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
        opt.step()


def _same_weights(ckpt, model, code=()):
    """The checkpoint holds ``model``'s weights under the plain model's names, loadable into a plain model."""
    with trusting(code):
        reference = model_from_spec(ckpt.model_spec)
    reference.load_state_dict(ckpt.state_dict, strict=True)
    for key, value in reference.state_dict().items():
        assert torch.equal(value, _named(model, key)), key
    assert set(ckpt.state_dict) == set(reference.state_dict())


def _named(model, key):
    """Tensor ``key`` (a plain name) of a possibly wrapped model."""
    own = {plain: own for own, plain in plain_names(model).items()}
    return model.state_dict()[own[key]]


# ------------------------------------------------------------------------------------------ wrappers


@pytest.mark.parametrize("wrap", ["compile", "compile-eager-trained", "compiled-submodule", "dataparallel",
                                  "gsm-of-compiled", "compiled-gsm-of-dataparallel"])
def test_wrappers_are_looked_through_in_any_order(tmp_path, wrap):
    """The run holds the plain model's names and the trained weights; restore and parent= load through them."""
    from opacus import GradSampleModule

    data = _data()
    model = _lenet(data)
    wrapped = {
        "compile": lambda: torch.compile(model),  # the default backend: compiled at the first call, never made here
        "compile-eager-trained": lambda: torch.compile(model, backend="eager"),
        "compiled-submodule": lambda: (model.__setitem__(0, torch.compile(model[0], backend="eager")), model)[1],
        "dataparallel": lambda: nn.DataParallel(model),  # on the CPU it calls the module
        "gsm-of-compiled": lambda: GradSampleModule(torch.compile(model, backend="eager")),
        "compiled-gsm-of-dataparallel": lambda: torch.compile(GradSampleModule(nn.DataParallel(model)),
                                                              backend="eager"),
    }[wrap]()
    if wrap != "compile":
        _train(wrapped, data, 2)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
    with landscape.Recorder(tmp_path, "w", wrapped, data=data, optimizer=opt, steps_per_epoch=1) as rec:
        rec.save(0)
        if wrap != "compile":
            _train(wrapped, data, 1)
        rec.save(1)
    ckpt = Store(tmp_path).load("w@last")
    _same_weights(ckpt, wrapped)
    saved = {k: v.clone() for k, v in wrapped.state_dict().items()}
    with torch.no_grad():
        for p in wrapped.parameters():
            p.zero_()
    with landscape.Recorder(tmp_path, "w", wrapped, data=data, optimizer=opt, steps_per_epoch=1) as rec:
        assert rec.restore() == 1  # loaded back through the wrappers
    assert all(torch.equal(v, saved[k]) for k, v in wrapped.state_dict().items())
    with landscape.Recorder(tmp_path, "child", wrapped, data=data, parent="w@last", steps_per_epoch=1) as rec:
        rec.save(0)
    assert all(torch.equal(v, ckpt.state_dict[k]) for k, v in Store(tmp_path).load("child@init").state_dict.items())


def test_distributed_data_parallel_is_looked_through(tmp_path):
    """DDP (one gloo process on this machine), compiled around it as torch's DDP tutorials do."""
    import torch.distributed as dist

    data = _data()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ddp = torch.compile(nn.parallel.DistributedDataParallel(_lenet(data)), backend="eager")
        _train(ddp, data, 2)
        with landscape.Recorder(tmp_path, "ddp", ddp, data=data, steps_per_epoch=1) as rec:
            rec.save(2)
    finally:
        dist.destroy_process_group()
    _same_weights(Store(tmp_path).load("ddp@last"), ddp)


def test_a_wrapper_the_recorder_does_not_know_is_named_in_one_line(tmp_path):
    class Wrapper(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

    data = _data()
    model = _lenet(data)
    with pytest.raises(UsageError, match=r"^the model is a Wrapper holding the landscape model at 'inner' \(its state "
                                         r"dict names start 'inner.'\), a wrapper the Recorder does not look through"):
        landscape.Recorder(tmp_path, "x", Wrapper(model), data=data)
    disguised = Wrapper(model)
    disguised.landscape_spec = model.landscape_spec  # the spec copied onto the wrapper: its names still tell
    with pytest.raises(UsageError, match="^the model's state dict names start 'inner.': a Wrapper around the model, "
                                         "a wrapper the Recorder does not look through"):
        landscape.Recorder(tmp_path, "x", disguised, data=data)
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------------ changed models


def test_a_model_changed_after_its_factory_is_refused_at_open_and_nothing_is_written(tmp_path, net):
    """ModuleValidator.fix outside the factory, a replaced head, a swapped layer, a converted dtype kind: one line
    naming the first difference and the fix; no run directory. The factory that applies the fix is accepted."""
    from opacus.validators import ModuleValidator

    data = _data()
    built = build_model(net, input_shape=data.input_shape, num_classes=data.num_classes)
    head = build_model(net, input_shape=data.input_shape, num_classes=data.num_classes)
    head[4] = nn.Linear(4 * 64, 3)
    swapped = build_model(net, input_shape=data.input_shape, num_classes=data.num_classes)
    swapped[0] = nn.Conv2d(1, 8, 3, padding=1)
    integer = build_model(net, input_shape=data.input_shape, num_classes=data.num_classes)
    integer[1].running_mean = integer[1].running_mean.long()
    cases = [
        (ModuleValidator.fix(built), "tensor '1.running_mean' is missing .the spec's model has it."),
        (torch.compile(ModuleValidator.fix(built), backend="eager"), "tensor '1.running_mean' is missing .*"),
        (head, r"tensor '4.weight' is \(3, 256\) here, \(10, 256\) in the spec's model"),
        (swapped, r"tensor '0.weight' is \(8, 1, 3, 3\) here, \(4, 1, 3, 3\) in the spec's model"),
        (integer, r"tensor '1.running_mean' is int64 \(integer\) here, float32 \(floating point\) in the spec's model"),
    ]
    for model, what in cases:
        with pytest.raises(IncompatibleError, match=f"^the model is not the one its landscape_spec builds: {what}; ") as e:
            landscape.Recorder(tmp_path, "x", model, data=data)
        assert "\n" not in str(e.value) and "ModuleValidator.fix there" in str(e.value)
        assert "a factory that returns the changed model" in str(e.value)
    assert not (tmp_path / "x").exists()
    fixed = build_model(net, input_shape=data.input_shape, num_classes=data.num_classes, fix=True)
    with landscape.Recorder(tmp_path, "x", ModuleValidator.fix(fixed), data=data) as rec:  # fix: a no-op now
        rec.save(0, epoch=0)
    assert "1.running_mean" not in Store(tmp_path).load("x@init").state_dict


def test_a_model_changed_between_saves_is_refused_at_that_save(tmp_path):
    data = _data()
    model = _lenet(data)
    with landscape.Recorder(tmp_path, "r", model, data=data, steps_per_epoch=1, writer="thread") as rec:
        rec.save(0)
        model[-1] = nn.Linear(84, 4)  # a new head, mid-training
        with pytest.raises(IncompatibleError, match=r"^step 1: the model is not the one its landscape_spec builds: "
                                                    r"tensor '11.weight' is \(4, 84\) here"):
            rec.save(1)
    assert [i.step for i in Store(tmp_path).run("r").checkpoints()] == [0]


def test_a_factory_that_reads_tensor_values_is_checked_too(tmp_path):
    """The spec's model is built on the meta device unless its factory reads values (here a width from a tensor):
    then on the CPU, as analyses build it, and the check is the same."""
    path = tmp_path / "valued.py"
    path.write_text("import torch\nfrom torch import nn\n\n\ndef make(input_shape, num_classes):\n"
                    "    width = int(torch.tensor([3, 4]).sum().item())\n"
                    "    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.Linear(width, num_classes))\n")
    data = _data()
    model = build_model(f"{path}:make", input_shape=data.input_shape, num_classes=data.num_classes)
    with landscape.Recorder(tmp_path, "v", model, data=data) as rec:
        rec.save(0, epoch=0)
    model[2] = nn.Linear(7, 5)
    with pytest.raises(IncompatibleError, match=r"tensor '2.weight' is \(5, 7\) here, \(10, 7\) in the spec's model"):
        landscape.Recorder(tmp_path, "w", model, data=data)


def test_opening_a_recorder_leaves_torch_random_state_alone(tmp_path):
    """Building the spec's model to compare with draws its initial weights: under a forked generator."""
    data = _data()
    model = _lenet(data)
    before = torch.get_rng_state()
    with landscape.Recorder(tmp_path, "r", model, data=data):
        pass
    assert torch.equal(torch.get_rng_state(), before)


# ------------------------------------------------------------------------------------------ import and analyses


def test_import_looks_through_the_same_wrappers_and_refuses_a_changed_model(tmp_path, capsys, net):
    from opacus import GradSampleModule
    from opacus.validators import ModuleValidator

    data = _data()
    fixed = build_model(net, input_shape=data.input_shape, num_classes=data.num_classes, fix=True)
    torch.save(GradSampleModule(torch.compile(fixed, backend="eager")).state_dict(), "gsm.pt")
    code, _, err = run_cli("--root", tmp_path / "ck", "import", "gsm.pt", "--model", net, "--model-kwargs",
                           '{"fix": true}', "--data", "digits", "--run", "imported", capsys=capsys)
    assert code == 0, err
    for key, value in Store(tmp_path / "ck").load("imported@init").state_dict.items():
        assert torch.equal(value, fixed.state_dict()[key]), key
    model = build_model(net, input_shape=data.input_shape, num_classes=data.num_classes)
    torch.save(ModuleValidator.fix(model).state_dict(), "fixed.pt")
    code, _, err = run_cli("--root", tmp_path / "ck", "import", "fixed.pt", "--model", net, "--data", "digits",
                           "--run", "fixed", capsys=capsys)
    assert code == 1 and err.count("\n") == 1 and "missing tensor '1.running_mean'" in err
    assert not (tmp_path / "ck" / "fixed").exists()


def test_a_run_whose_code_now_builds_another_structure_is_one_line_at_analysis(tmp_path, capsys, net):
    """The factory's file changed after recording (a wider layer), used anyway: each analysis refuses in one line."""
    data = _data()
    model = build_model(net, input_shape=data.input_shape, num_classes=data.num_classes)
    with landscape.Recorder(tmp_path / "ck", "r", model, data=data, steps_per_epoch=1) as rec:
        rec.save(0)
        rec.save(1)
    path = Path(net.rsplit(":", 1)[0])
    path.write_text(NET.replace("nn.Conv2d(c, 4, 3", "nn.Conv2d(c, 5, 3"))
    for command in (["calibration", "r@last"], ["interpolate", "r@init", "r@last"]):
        code, _, err = run_cli("--root", tmp_path / "ck", "--code", net, *command, "--no-figure", "-o", "x.h5",
                               capsys=capsys)
        assert code == 1 and err.count("\n") == 1 and "--accept-changed-code" in err
        code, _, err = run_cli("--root", tmp_path / "ck", "--code", net, "--accept-changed-code", *command,
                               "--no-figure", "-o", "x.h5", capsys=capsys)
        assert code == 1 and err.count("\n") == 1 and "tensor '0.weight' has shape" in err, err
        assert not Path("x.h5").exists()


# ------------------------------------------------------------------------------------------ the researcher's loop


def _researcher_loop(root, net, data, *, fix_in_factory: bool):
    """Compile, fix with Opacus' ModuleValidator, make private (GradSampleModule), record from a worker thread
    (the recorder opened there, the thread gone when the analyses run). Returns the error the thread raised."""
    from opacus import PrivacyEngine
    from opacus.validators import ModuleValidator

    from landscape.integrations.opacus import OpacusPrivacy

    outcome = {}

    def work():
        try:
            torch.manual_seed(0)
            model = build_model(net, input_shape=data.input_shape, num_classes=data.num_classes, fix=fix_in_factory)
            model = ModuleValidator.fix(torch.compile(model, backend="eager"))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.x_train, data.y_train),
                                                 batch_size=25)
            engine = PrivacyEngine(accountant="rdp")
            model, optimizer, loader = engine.make_private(module=model, optimizer=optimizer, data_loader=loader,
                                                           noise_multiplier=1.0, max_grad_norm=1.0)
            privacy = OpacusPrivacy(engine, optimizer, loader)
            with landscape.Recorder(root, "dp", model, data=data, optimizer=optimizer, privacy=privacy,
                                    steps_per_epoch=len(loader), config={"optimizer": "dpsgd"},
                                    writer="thread") as rec:
                rec.save()
                for x, y in loader:
                    optimizer.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()
                    optimizer.step()
                    if privacy.steps() == 3:
                        break
                rec.save()
            outcome["model"] = model
        except Exception as exc:  # noqa: BLE001 (handed to the test)
            outcome["error"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return outcome


def test_a_compiled_fixed_private_loop_recorded_from_a_thread_is_refused_at_open_or_read_by_every_analysis(
        tmp_path, net):
    data = _data()
    naive = _researcher_loop(tmp_path / "naive", net, data, fix_in_factory=False)
    assert isinstance(naive.get("error"), IncompatibleError), naive
    assert "tensor '1.running_mean' is missing" in str(naive["error"]) and "ModuleValidator.fix there" in str(
        naive["error"])
    assert not (tmp_path / "naive" / "dp").exists()

    root = tmp_path / "fixed"
    done = _researcher_loop(root, net, data, fix_in_factory=True)
    assert "error" not in done, done.get("error")
    store = Store(root)
    assert [i.step for i in store.run("dp").checkpoints()] == [0, 3]
    last = store.load("dp@last")
    assert last.epsilon > 0 and store.run("dp").manifest["privacy"]["steps"] == 3
    _same_weights(last, done["model"], [net])
    common = dict(root=root, code=[net], figure=False)
    interp = api.interpolate("dp@init", "dp@last", points=3, output=tmp_path / "i.h5", **common)
    hessian = api.hessian(["dp@last"], top_k=1, subset=32, lanczos_steps=8, device="cpu", output=tmp_path / "h.h5",
                          **common)
    calibration = api.calibration("dp@last", bins=5, output=tmp_path / "c.h5", **common)
    ntk = api.ntk("dp@last", subset=8, output=tmp_path / "n.h5", **common)
    # the reference: the plain model the spec builds, with the recorded weights, in plain PyTorch
    with trusting([net]):
        plain = model_from_spec(last.model_spec)
    plain.load_state_dict(last.state_dict)
    plain.eval()
    with torch.no_grad():
        logits = plain(data.x_train)
        loss = nn.functional.cross_entropy(logits, data.y_train).item()
    assert interp.alpha[-1] == 1.0 and interp.loss["train"][-1] == pytest.approx(loss, rel=1e-5)
    with torch.no_grad():
        test_acc = (plain(data.x_test).argmax(1) == data.y_test).float().mean().item()
    assert calibration.rows[0].split == "test" and calibration.rows[0].accuracy == pytest.approx(test_acc, abs=1e-9)
    assert hessian.eigenvalues.shape == (1, 1) and np.isfinite(hessian.eigenvalues).all()
    assert ntk.K.shape == (8, 8) and np.allclose(ntk.K, ntk.K.T, atol=1e-5)
