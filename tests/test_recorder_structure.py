"""A Recorder never writes a run that no analysis can read: the model it is given must have the tensors of the model
its spec builds (what every analysis rebuilds), through any wrapper that only prefixes the names; anything else
is refused when it opens, in one line, with nothing written. `landscape import` looks through the same wrappers.

The reference for "can be read" is the analyses themselves (interpolate, hessian, calibration, ntk through
`landscape.api`) and the store's own strict load into the model the spec builds (`Checkpoint.build_model`)."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import landscape
from landscape import api
from landscape.data import load_dataset
from landscape.errors import UsageError
from landscape.models import build_model
from landscape.plugins import trusting
from landscape.recorder import unwrap
from landscape.store import Store

pytestmark = pytest.mark.filterwarnings("ignore:Secure RNG turned off", "ignore:Full backward hook is firing",
                                        "ignore:Using a non-full backward hook")

FACTORIES = '''
from torch import nn


def make(input_shape, num_classes, width=4):
    c, h, w = input_shape
    return nn.Sequential(nn.Conv2d(c, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.Flatten(),
                         nn.Linear(width * h * w, num_classes))


def fixed(input_shape, num_classes, width=4):
    from opacus.validators import ModuleValidator

    return ModuleValidator.fix(make(input_shape, num_classes, width))
'''


@pytest.fixture
def code(tmp_path):
    """A model file with a BatchNorm CNN (``make``) and the same CNN as Opacus' ModuleValidator fixes it
    (``fixed``): the references that name them."""
    path = tmp_path / "bn_cnn.py"
    path.write_text(FACTORIES)
    return f"{path}:make", f"{path}:fixed"


@pytest.fixture(scope="module")
def data():
    return load_dataset("digits", subset=100)


def _build(name, data):
    return build_model(name, input_shape=data.input_shape, num_classes=data.num_classes)


def _eager(model):
    """torch.compile's wrapper (OptimizedModule) without compiling: the eager backend runs the same module."""
    return torch.compile(model, backend="eager")


def _grad_sample(model):
    from opacus import GradSampleModule

    return GradSampleModule(model)


WRAPPERS = {
    "compiled": _eager,
    "GradSampleModule(compiled)": lambda m: _grad_sample(_eager(m)),
    "compiled(GradSampleModule)": lambda m: _eager(_grad_sample(m)),
    "DataParallel": nn.DataParallel,
    "DataParallel(GradSampleModule(compiled))": lambda m: nn.DataParallel(_grad_sample(_eager(m))),
}


@pytest.mark.parametrize("wrap", WRAPPERS, ids=list(WRAPPERS))
def test_every_wrapper_is_looked_through_and_the_run_loads_into_the_model_its_spec_builds(tmp_path, data, wrap):
    model = _build("lenet", data)
    wrapped = WRAPPERS[wrap](model)
    assert any(k.startswith(("_orig_mod.", "_module.", "module.")) for k in wrapped.state_dict())
    assert unwrap(wrapped) is model
    with landscape.Recorder(tmp_path, "w", wrapped, data=data, steps_per_epoch=1) as rec:
        rec.save(0)
    ckpt = Store(tmp_path).load("w@init")
    assert list(ckpt.state_dict) == list(model.state_dict())
    rebuilt = ckpt.build_model()  # what every analysis does: strict load into the model the spec builds
    for key, value in model.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[key], value), key


def test_distributed_data_parallel_is_looked_through(tmp_path, data):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        model = _build("lenet", data)
        with landscape.Recorder(tmp_path, "ddp", nn.parallel.DistributedDataParallel(model), data=data) as rec:
            rec.save(0, epoch=0)
    finally:
        dist.destroy_process_group()
    assert list(Store(tmp_path).load("ddp@init").state_dict) == list(model.state_dict())


def test_a_model_changed_after_build_model_is_refused_at_open_saying_what_differs(tmp_path, data, code):
    """ModuleValidator.fix in the loop (BatchNorm -> GroupNorm), a replaced head, a swapped layer: one line naming
    the first tensor that differs and how to fix it; nothing written. The same fix inside the factory is accepted,
    and its run loads into the model its spec builds."""
    from opacus.validators import ModuleValidator

    make, fixed = code
    how = ("analyses rebuild the model from its spec: make the change inside the factory (e.g. apply Opacus' "
           "ModuleValidator.fix there), or build the model with build_model from a factory that returns the "
           "changed model")
    head = _build("lenet", data)
    head[-1] = nn.Linear(84, 5)
    swapped = _build(make, data)
    swapped[0] = nn.Conv2d(1, 6, 3, padding=1)
    cases = {
        "fixed in the loop": (_eager(ModuleValidator.fix(_build(make, data))),
                              f"the model is not the one its spec ('{make}') builds: tensor '1.running_mean' of the "
                              "model its spec builds is missing from yours"),
        "replaced head": (head, "the model is not the one its spec ('lenet') builds: tensor '11.weight' has shape "
                                "(5, 84) in your model but (10, 84) in the model its spec builds"),
        "swapped layer": (swapped, "tensor '0.weight' has shape (6, 1, 3, 3) in your model but (4, 1, 3, 3)"),
    }
    for name, (model, message) in cases.items():
        with pytest.raises(UsageError) as refused:
            landscape.Recorder(tmp_path, "r", model, data=data, steps_per_epoch=1)
        text = str(refused.value)
        assert message in text and text.endswith(how) and "\n" not in text, name
    assert not (tmp_path / "r").exists()

    model = _build(fixed, data)
    with landscape.Recorder(tmp_path, "r", _eager(ModuleValidator.fix(model)), data=data, steps_per_epoch=1) as rec:
        rec.save(0)
    with trusting([fixed]):
        rebuilt = Store(tmp_path).load("r@init").build_model()
    assert any(isinstance(m, nn.GroupNorm) for m in rebuilt.modules())


def test_an_unknown_wrapper_and_a_model_changed_while_recording_are_refused(tmp_path, data):
    class Wrapper(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.net = inner

    model = _build("lenet", data)
    with pytest.raises(UsageError, match=r"^the model is a Wrapper around the model build_model made \(at 'net'\), a "
                                         r"wrapper the Recorder does not know: .* pass the inner model \(model.net\)$"):
        landscape.Recorder(tmp_path, "u", Wrapper(model), data=data)
    with landscape.Recorder(tmp_path, "u", model, data=data, steps_per_epoch=1) as rec:
        rec.save(0)
        model[-1] = nn.Linear(84, 3)
        with pytest.raises(UsageError, match="^the model has changed since the Recorder opened: tensor '11.weight' "
                                             r"has shape \(3, 84\)"):
            rec.save(1)
    assert [i.step for i in Store(tmp_path).run("u").checkpoints()] == [0]


def test_opening_a_recorder_leaves_the_random_number_generators_as_they_were(tmp_path, data):
    """The model the spec builds (to compare with) draws no number the training loop would have drawn."""
    model = _build("lenet", data)
    draws = []
    for record in (False, True):
        torch.manual_seed(3)
        random.seed(3)
        np.random.seed(3)  # noqa: NPY002 (a user's loop seeds the global generators)
        if record:
            landscape.Recorder(tmp_path, "g", model, data=data).close()
        draws.append((torch.rand(3).tolist(), random.random(), np.random.rand()))  # noqa: NPY002
    assert draws[0] == draws[1]


def test_import_looks_through_the_same_wrappers_and_refuses_another_structure(tmp_path, data, code, capsys):
    """landscape import: a compiled model's state dict (``_orig_mod.`` names, under DataParallel's ``module.``) is imported
    under the model's names; weights of the fixed model named with the BatchNorm factory: one line, exit 1."""
    from opacus.validators import ModuleValidator

    from cli.main import main

    make, _ = code
    model = _build(make, data)
    torch.save(nn.DataParallel(_eager(model)).state_dict(), tmp_path / "compiled.pt")
    torch.save(ModuleValidator.fix(model).state_dict(), tmp_path / "fixed.pt")
    root = str(tmp_path / "store")
    for file, run, exit_code in (("compiled.pt", "c", 0), ("fixed.pt", "f", 1)):
        with pytest.raises(SystemExit) as done:
            main(["--root", root, "import", str(tmp_path / file), "--model", make, "--data", "digits",
                  "--run", run])
        assert done.value.code == exit_code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"fixed.pt: missing tensor '1.running_mean' that model '{make}' expects" in err
    assert Store(root).run_names() == ["c"]
    with trusting([make]):
        rebuilt = Store(root).load("c@init").build_model()
    assert all(torch.equal(rebuilt.state_dict()[k], v) for k, v in model.state_dict().items())


def test_a_run_whose_code_now_builds_another_structure_is_refused_in_one_line(tmp_path, data, code, capsys):
    from cli.main import main

    make, _ = code
    with landscape.Recorder(tmp_path / "store", "r", _build(make, data), data=data, steps_per_epoch=1) as rec:
        rec.save(0)
    file = Path(make.rpartition(":")[0])
    file.write_text(file.read_text().replace("nn.Conv2d(c, width, 3, padding=1)", "nn.Conv2d(c, width, 5, padding=2)"))
    for accept, needle in (([], "changed since it was recorded"),
                           (["--accept-changed-code"], "tensor '0.weight' has shape (4, 1, 3, 3) but model")):
        with pytest.raises(SystemExit) as done:
            main(["--root", str(tmp_path / "store"), "--code", make, *accept, "calibration", "r@init", "--no-figure",
                  "-o", str(tmp_path / "c.h5")])
        err = capsys.readouterr().err
        assert done.value.code == 1 and err.startswith("error: ") and needle in err and err.count("\n") == 1
    assert not (tmp_path / "c.h5").exists()


def test_a_compiled_opacus_fixed_loop_recorded_from_a_worker_thread_is_read_by_every_analysis(tmp_path, data, code):
    """The researcher's loop: the model compiled, fixed by Opacus' ModuleValidator, wrapped in GradSampleModule by
    make_private, DP-SGD steps recorded from a worker thread (inline and by the writer thread). Fixed in the loop
    it is refused at open; fixed in its factory the run is read by interpolate, hessian, calibration and ntk."""
    from opacus import PrivacyEngine
    from opacus.validators import ModuleValidator

    from landscape.integrations.opacus import OpacusPrivacy

    make, fixed = code
    failures: list[BaseException] = []

    def loop(factory, run, writer):
        torch.manual_seed(0)
        model = _eager(ModuleValidator.fix(_build(factory, data)))
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.x_train, data.y_train),
                                             batch_size=25)
        engine = PrivacyEngine(accountant="rdp")
        gsm, opt, loader = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                               data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0)
        try:
            with landscape.Recorder(tmp_path, run, gsm, data=data, optimizer=opt, writer=writer,
                                    privacy=OpacusPrivacy(engine, opt, loader), steps_per_epoch=len(loader)) as rec:
                rec.save()
                for x, y in loader:
                    opt.zero_grad()
                    nn.functional.cross_entropy(gsm(x), y).backward()
                    opt.step()
                rec.save()
        except BaseException as exc:  # noqa: BLE001 (raised in the test's thread below)
            failures.append(exc)

    for factory, run, writer in ((make, "in-loop", "inline"), (fixed, "dp", "inline"), (fixed, "dp-thread", "thread")):
        worker = threading.Thread(target=loop, args=(factory, run, writer))
        worker.start()
        worker.join()
    refused, *others = failures
    assert others == [] and isinstance(refused, UsageError) and "'1.running_mean'" in str(refused)
    assert not (tmp_path / "in-loop").exists()
    store = Store(tmp_path)
    for run in ("dp", "dp-thread"):
        assert store.load(f"{run}@last").step == len(data.y_train) // 25 and store.load(f"{run}@last").epsilon > 0
    options = dict(root=tmp_path, figure=False, code=[fixed])
    api.interpolate("dp@init", "dp-thread@last", points=3, output=tmp_path / "i.h5", **options)
    api.hessian(["dp@last"], top_k=1, subset=32, lanczos_steps=5, output=tmp_path / "h.h5", **options)
    api.calibration("dp-thread@last", bins=5, output=tmp_path / "c.h5", **options)
    api.ntk("dp@last", subset=8, output=tmp_path / "n.h5", **options)
    assert all((tmp_path / f"{name}.h5").is_file() for name in "ihcn")
