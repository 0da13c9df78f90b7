"""Checkpoint store: bit-exact round trips, manifests, references, safety under SIGKILL and concurrency, import."""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from cli.main import cli
from landscape.errors import CheckpointError, IncompatibleError, UnsafeFileError, UsageError
from landscape.models import build_model
from landscape.results import sha256_file
from landscape.runtime import code_version
from landscape.store import MANIFEST_FORMAT, Run, Store, import_checkpoint, load_checkpoint

REPO = Path(__file__).resolve().parent.parent
WRITER = Path(__file__).resolve().parent / "store_writer.py"
DATA_SPEC = {"name": "digits", "seed": 0, "subset": None, "options": {}}


def child_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=10, widths=[8])


def make_run(store: Store, name: str | None = "r", **kw):
    args = {"config": {"lr": 0.1, "optimizer": "sgd"}, "seeds": {"seed": 3, "data": 0}, "lineage": None,
            "model_spec": {"name": "mlp", "kwargs": {"widths": [8]}}, "data_spec": DATA_SPEC, **kw}
    return store.create_run(name, **args)


def bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def tiny_state() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(2)}


# ------------------------------------------------------------------------------------------ round trips


def test_state_dict_round_trip_is_bit_exact_for_many_dtypes(tmp_path):
    g = torch.Generator().manual_seed(0)
    weird = torch.randn(4, 5, generator=g, dtype=torch.float64)
    weird[0, 0], weird[1, 1], weird[2, 2] = math.nan, math.inf, -0.0
    state = {
        "conv.weight": torch.randn(3, 2, 3, 3, generator=g),
        "f64": weird,
        "half": torch.randn(7, generator=g).half(),
        "bf16": torch.randn(5, 3, generator=g).bfloat16(),
        "bn.num_batches_tracked": torch.tensor(17, dtype=torch.int64),
        "int8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "uint8": torch.tensor([0, 255], dtype=torch.uint8),
        "mask": torch.tensor([[True, False], [False, True]]),
        "complex": torch.randn(3, generator=g, dtype=torch.complex64),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "transposed": torch.randn(3, 4, generator=g).t(),  # non-contiguous
        "odd/key%2F.name": torch.randn(2, generator=g),  # '/' and '%' must survive
        ".": torch.ones(1),
    }
    run = make_run(Store(tmp_path))
    path = run.save_checkpoint(state, step=5, epoch=0.5)
    ckpt = load_checkpoint(path)
    assert list(ckpt.state_dict) == list(state)  # same keys, same order
    for key, tensor in state.items():
        got = ckpt.state_dict[key]
        assert isinstance(got, torch.Tensor), key
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, key
        assert bits(got) == bits(tensor), key
    with h5py.File(path, "r") as f:  # the layout: tensors tagged with their dtype, bfloat16 as its int16 bits
        assert isinstance(f.attrs["format"], str) and f.attrs["step"].dtype == np.int64
        assert f["state_dict/bf16"].dtype == np.int16 and f["state_dict/bf16"].attrs["torch_dtype"] == "bfloat16"
        assert f["state_dict/mask"].attrs["torch_dtype"] == "bool"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.text(max_size=12), min_size=1, max_size=6, unique=True))
def test_any_key_names_survive_in_order(tmp_path, keys):
    state = {k: torch.full((2,), float(i)) for i, k in enumerate(keys)}
    manifest = {"format": MANIFEST_FORMAT, "config": {}, "seeds": {}, "model_spec": {}, "data_spec": {},
                "checkpoints": []}
    path = Run(tmp_path, manifest).save_checkpoint(state, step=0, epoch=0.0)
    got = load_checkpoint(path).state_dict
    assert list(got) == keys
    assert all(torch.equal(got[k], v) for k, v in state.items())


def test_model_round_trip_through_checkpoint(tmp_path):
    model = small_model()
    store = Store(tmp_path)
    run = make_run(store, model_spec=model.landscape_spec)
    run.save_checkpoint(model.state_dict(), step=0, epoch=0.0)
    rebuilt = store.load("r").build_model()
    assert rebuilt.landscape_spec == model.landscape_spec
    for (k1, v1), (k2, v2) in zip(model.state_dict().items(), rebuilt.state_dict().items(), strict=True):
        assert k1 == k2 and torch.equal(v1, v2)
    x = torch.randn(3, 1, 8, 8)
    assert torch.equal(model(x), rebuilt(x))


def test_build_model_with_wrong_weights_names_the_key(tmp_path):
    model = small_model()
    run = make_run(Store(tmp_path), model_spec=model.landscape_spec)
    state = dict(model.state_dict())
    key = next(iter(state))
    state[key] = torch.zeros(3, 3)
    path = run.save_checkpoint(state, step=0, epoch=0.0)
    with pytest.raises(IncompatibleError, match=key.replace(".", r"\.")) as err:
        load_checkpoint(path).build_model()
    assert "\n" not in str(err.value)


def test_extra_arrays_metrics_and_attrs_round_trip(tmp_path):
    rng_state = torch.get_rng_state()
    extra = {
        "rng/torch": rng_state,
        "rng/numpy_keys": np.arange(624, dtype=np.uint32),
        "sampler/position": np.int64(1234),
        "optimizer": {"momentum": {"fc.weight": torch.full((2, 2), 0.5)}},
    }
    run = make_run(Store(tmp_path))
    path = run.save_checkpoint(tiny_state(), step=7, epoch=1.75, epsilon=2.5,
                               metrics={"test_acc": 0.9, "train_loss": math.nan, "n": np.int64(3)},
                               extra=extra, attrs={"note": "x", "lr": 0.01})
    ckpt = load_checkpoint(path)
    assert ckpt.step == 7 and ckpt.epoch == 1.75 and ckpt.epsilon == 2.5 and ckpt.run == "r"
    assert ckpt.metrics["test_acc"] == 0.9 and math.isnan(ckpt.metrics["train_loss"]) and ckpt.metrics["n"] == 3
    assert ckpt.attrs == {"note": "x", "lr": 0.01}
    assert ckpt.model_spec == {"name": "mlp", "kwargs": {"widths": [8]}} and ckpt.data_spec == DATA_SPEC
    assert ckpt.code_version == code_version()
    assert set(ckpt.extra) == {"rng/torch", "rng/numpy_keys", "sampler/position", "optimizer/momentum/fc.weight"}
    assert ckpt.extra["rng/torch"].dtype == np.uint8
    assert torch.equal(torch.from_numpy(ckpt.extra["rng/torch"]), rng_state)
    assert ckpt.extra["rng/numpy_keys"].dtype == np.uint32
    assert int(ckpt.extra["sampler/position"]) == 1234
    assert np.array_equal(ckpt.extra["optimizer/momentum/fc.weight"], np.full((2, 2), 0.5, np.float32))
    assert ckpt.sha256 == sha256_file(path)
    assert ckpt.input_ref().sha256 == ckpt.sha256 and ckpt.input_ref().path == str(path)
    no_eps = load_checkpoint(run.save_checkpoint(tiny_state(), step=8, epoch=2.0))
    assert no_eps.epsilon is None and no_eps.extra == {} and no_eps.metrics == {}


def test_manifest_records_config_seeds_lineage_and_checkpoints(tmp_path):
    lineage = {"parent_run": "p", "parent_step": 40, "parent_epoch": 2.0, "parent_ref": "p@step=40",
               "parent_sha256": "ab" * 32}
    run = make_run(Store(tmp_path), "child", lineage=lineage, extra={"phases": {"group": "g", "k": 2}})
    p0 = run.save_checkpoint(tiny_state(), step=0, epoch=0.0, metrics={"loss": math.inf})
    p1 = run.save_checkpoint(tiny_state(), step=12, epoch=1.0, epsilon=0.8, metrics={"test_acc": 0.5})
    run.update_manifest(note="done")

    def no_constants(name):  # the manifest must be strict JSON (no NaN/Infinity literals)
        raise AssertionError(f"non-standard JSON constant {name}")

    manifest = json.loads((tmp_path / "child" / "manifest.json").read_text(), parse_constant=no_constants)
    assert manifest["name"] == "child"
    assert manifest["config"] == {"lr": 0.1, "optimizer": "sgd"}
    assert manifest["seeds"] == {"seed": 3, "data": 0}
    assert manifest["lineage"] == lineage
    assert manifest["code_version"] == code_version()
    assert manifest["model_spec"] == {"name": "mlp", "kwargs": {"widths": [8]}}
    assert manifest["data_spec"] == DATA_SPEC
    assert manifest["phases"] == {"group": "g", "k": 2} and manifest["note"] == "done"
    assert manifest["created"].startswith("20")
    assert [c["step"] for c in manifest["checkpoints"]] == [0, 12]
    assert manifest["checkpoints"][1] == {"step": 12, "epoch": 1.0, "epsilon": 0.8, "metrics": {"test_acc": 0.5},
                                          "file": "step-000012.h5", "sha256": sha256_file(p1)}
    assert manifest["checkpoints"][0]["sha256"] == sha256_file(p0)
    infos = Store(tmp_path).run("child").checkpoints()
    assert [i.step for i in infos] == [0, 12] and infos[0].metrics["loss"] == math.inf
    with pytest.raises(UsageError):
        run.update_manifest(checkpoints=[])
    with pytest.raises(UsageError):
        make_run(Store(tmp_path), "other", extra={"seeds": {}})


def test_saving_a_step_again_replaces_it(tmp_path):
    run = make_run(Store(tmp_path))
    run.save_checkpoint(tiny_state(), step=3, epoch=1.0)
    run.save_checkpoint({"w": torch.zeros(1)}, step=3, epoch=1.0)
    assert [i.step for i in run.checkpoints()] == [3]
    assert list(Store(tmp_path).load("r").state_dict) == ["w"]


# ------------------------------------------------------------------------------------------- references


@pytest.fixture
def store3(tmp_path):
    store = Store(tmp_path / "root")
    run = make_run(store, "sgd")
    for step, epoch in [(0, 0.0), (10, 1 / 3), (20, 2 / 3), (30, 1.0)]:
        run.save_checkpoint({"step": torch.tensor(step)}, step=step, epoch=epoch)
    make_run(store, "empty")
    return store


def test_refs_resolve(store3, tmp_path, monkeypatch):
    def step_of(ref):
        return int(store3.load(ref).state_dict["step"])

    assert step_of("sgd") == 30 and step_of("sgd@last") == 30
    assert step_of("sgd@init") == 0
    assert step_of("sgd@step=20") == 20
    assert step_of("sgd@epoch=1") == 30
    assert step_of("sgd@epoch=0.333333") == 10  # as printed with 6 significant digits
    assert step_of(str(store3.resolve("sgd@step=10"))) == 10  # PATH.h5
    assert store3.resolve("sgd/step-000020.h5") == store3.root / "sgd" / "step-000020.h5"  # relative to the root
    monkeypatch.chdir(tmp_path)
    assert step_of("root/sgd/step-000010.h5") == 10  # relative to the working directory
    ckpt = store3.load("sgd@step=20")
    assert ckpt.ref == "sgd@step=20" and ckpt.run == "sgd"


def test_init_is_the_smallest_step(tmp_path):
    run = make_run(Store(tmp_path), "branch")
    for step in (50, 40, 60):
        run.save_checkpoint({"s": torch.tensor(step)}, step=step, epoch=step / 10)
    assert Store(tmp_path).resolve("branch@init").name == "step-000040.h5"
    assert Store(tmp_path).resolve("branch").name == "step-000060.h5"


@pytest.mark.parametrize(
    ("ref", "error", "needle"),
    [
        ("nope", CheckpointError, "available runs: empty, sgd"),
        ("sgd@step=15", CheckpointError, "available steps: 0, 10, 20, 30"),
        ("sgd@epoch=2", CheckpointError, "available epochs: 0, 0.333333, 0.666667, 1"),
        ("empty", CheckpointError, "no checkpoints"),
        ("sgd@first", UsageError, "expected @init, @last, @step=N or @epoch=E"),
        ("sgd@step=x", UsageError, "integer"),
        ("missing.h5", CheckpointError, "not found"),
        ("a/b", UsageError, "PATH.h5 or RUN"),
        ("../sgd", UsageError, "bad"),
        ("", UsageError, "empty"),
    ],
)
def test_bad_refs_give_one_line_errors(store3, ref, error, needle):
    with pytest.raises(error) as err:
        store3.load(ref)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_run_names_are_safe_and_unique(tmp_path):
    store = Store(tmp_path)
    for bad in ["", ".", "..", "a/b", "../x", ".hidden", "-x", "a@b", "x.h5", "a b", "a\\b"]:
        with pytest.raises(UsageError):
            make_run(store, bad)
    make_run(store, "taken")
    with pytest.raises(CheckpointError, match="already exists"):
        make_run(store, "taken")
    generated = {make_run(store, None).name for _ in range(20)}
    assert len(generated) == 20
    assert set(store.run_names()) == generated | {"taken"}
    assert [r.name for r in store.runs_matching("tak*")] == ["taken"]
    assert Store(tmp_path / "absent").runs_matching() == []


def test_run_level_arrays(tmp_path):
    run = make_run(Store(tmp_path))
    mask = {"0.weight": torch.tensor([[1, 0], [0, 1]], dtype=torch.bool), "0/odd": torch.ones(3)}
    run.save_array("mask", mask)
    run.save_array("metrics", np.arange(12.0).reshape(4, 3))
    run.save_array("metrics", np.arange(3))  # replaces
    run.save_array("lr", torch.tensor([0.1, 0.05], dtype=torch.float64))
    again = Store(tmp_path).run("r")
    assert again.array_names() == ["mask", "metrics", "lr"]
    got = again.load_array("mask")
    assert set(got) == {"0.weight", "0/odd"} and got["0.weight"].dtype == np.bool_
    assert np.array_equal(got["0.weight"], mask["0.weight"].numpy())
    assert np.array_equal(again.load_array("metrics"), np.arange(3))
    assert again.load_array("lr").dtype == np.float64
    with pytest.raises(CheckpointError, match="available arrays: mask, metrics, lr"):
        again.load_array("nope")
    with pytest.raises(UsageError):
        run.save_array("a/b", np.zeros(1))


# --------------------------------------------------------------------------------------- damaged files


def test_truncated_checkpoint_gives_one_line_error_naming_the_file(tmp_path):
    store = Store(tmp_path)
    run = make_run(store)
    path = run.save_checkpoint({"w": torch.randn(64, 64)}, step=0, epoch=0.0)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    for load in (lambda: load_checkpoint(path), lambda: store.load("r")):
        with pytest.raises(CheckpointError) as err:
            load()
        assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("content", [b"", b"not an hdf5 file at all\n" * 10])
def test_non_hdf5_file_gives_one_line_error(tmp_path, content):
    path = tmp_path / "junk.h5"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_foreign_hdf5_and_missing_files(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(CheckpointError, match="not a landscape checkpoint"):
        load_checkpoint(other)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "gone.h5")


def test_changed_file_is_caught_by_its_manifest_hash(tmp_path):
    store = Store(tmp_path)
    path = make_run(store).save_checkpoint(tiny_state(), step=0, epoch=0.0)
    with h5py.File(path, "a") as f:
        f.attrs["epoch"] = 99.0
    with pytest.raises(CheckpointError, match="changed after it was written"):
        store.load("r")
    assert load_checkpoint(path).epoch == 99.0  # the file itself is still readable by path


def test_temp_files_are_ignored_and_orphans_recovered(tmp_path):
    store = Store(tmp_path)
    run = make_run(store)
    run.save_checkpoint(tiny_state(), step=0, epoch=0.0)
    run.save_checkpoint(tiny_state(), step=5, epoch=0.5)
    (run.path / ".step-000009.h5.abc.tmp").write_bytes(b"half")
    (run.path / "step-000007.h5").write_bytes(b"junk with a final name")  # not ours: unreadable, skipped
    manifest = json.loads((run.path / "manifest.json").read_text())
    manifest["checkpoints"] = manifest["checkpoints"][:1]  # as if killed between file rename and manifest update
    (run.path / "manifest.json").write_text(json.dumps(manifest))
    infos = store.run("r").checkpoints()
    assert [i.step for i in infos] == [0, 5]
    assert int(store.load("r").step) == 5


# ---------------------------------------------------------------------------------------------- SIGKILL


def assert_store_consistent(root: Path, run_name: str, expected_steps: list[int] | None = None) -> list[int]:
    manifest = json.loads((root / run_name / "manifest.json").read_text())  # valid JSON
    store = Store(root)
    infos = store.run(run_name).checkpoints()
    steps = [i.step for i in infos]
    if expected_steps is not None:
        assert steps == expected_steps
    for info in infos:
        ckpt = store.load(f"{run_name}@step={info.step}")  # every listed checkpoint loads, hash matches
        assert ckpt.step == info.step
    finals = sorted(p.name for p in (root / run_name).glob("*.h5"))
    assert finals == sorted(i.path.name for i in infos)  # no half file under a final name
    assert {c["file"] for c in manifest["checkpoints"]} <= set(finals)
    return steps


def test_sigkill_mid_write_leaves_earlier_checkpoints_and_no_half_file(tmp_path):
    root, flag = tmp_path / "root", tmp_path / "flag"
    proc = subprocess.Popen([sys.executable, str(WRITER), "kill", str(root), str(flag)], env=child_env(),
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "writer never reached the stalled checkpoint"
            time.sleep(0.02)
        temps = list((root / "victim").glob(".step-000030.h5.*.tmp"))
        assert len(temps) == 1 and temps[0].stat().st_size > 0  # it really is mid-write
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert_store_consistent(root, "victim", [0, 10, 20])
    assert not (root / "victim" / "step-000030.h5").exists()
    result = CliRunner().invoke(cli, ["--root", str(root), "store", "ls", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["runs"][0]["steps"] == [0, 10, 20]


def test_sigkill_at_an_arbitrary_moment_of_a_write_loop(tmp_path):
    root = tmp_path / "root"
    proc = subprocess.Popen([sys.executable, str(WRITER), "loop", str(root)], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(3):  # let a few 4 MB checkpoints complete, then kill at whatever point it is
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
        time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    steps = assert_store_consistent(root, "looper")
    assert steps[:3] == [0, 1, 2] and steps == list(range(len(steps)))


# ------------------------------------------------------------------------------------------ concurrency


def test_two_processes_write_different_runs_into_one_root_at_once(tmp_path):
    root, go = tmp_path / "fresh" / "root", tmp_path / "go"  # the root does not exist yet: both create it
    runs = [["alpha", "-"], ["beta", "-"]]  # a named and a generated run from each process
    procs = [
        subprocess.Popen([sys.executable, str(WRITER), "write", str(root), str(go), "6", *names], env=child_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for names in runs
    ]
    time.sleep(0.3)
    go.touch()  # both start together, after their (slow) imports
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    made = [out.split() for out, _ in outputs]
    assert [m[0] for m in made] == ["alpha", "beta"]
    names = [n for m in made for n in m]
    assert len(set(names)) == 4
    store = Store(root)
    assert sorted(store.run_names()) == sorted(names)
    for name in names:
        assert store.run(name).manifest["config"]["who"] in (name, "-")
        assert_store_consistent(root, name, list(range(6)))


# ------------------------------------------------------------------------------------------------ import


def opacus_style(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {f"_module.{k}": v.clone() for k, v in model.state_dict().items()}


def assert_imported(store: Store, path: Path, model: torch.nn.Module, source: Path, run: str) -> None:
    ckpt = store.load(run)
    assert ckpt.path == path and ckpt.step == 0 and ckpt.epoch == 0.0 and ckpt.run == run
    assert list(ckpt.state_dict) == list(model.state_dict())
    for key, tensor in model.state_dict().items():
        assert torch.equal(ckpt.state_dict[key], tensor)
    assert ckpt.model_spec == model.landscape_spec and ckpt.data_spec == DATA_SPEC
    lineage = store.run(run).manifest["lineage"]
    assert lineage == {"imported_from": str(source.resolve()), "sha256": sha256_file(source)}
    assert store.load(f"{run}@init").build_model().landscape_spec == model.landscape_spec


@pytest.mark.parametrize("wrap", [None, "state_dict", "model", "model_state_dict"])
def test_import_pt_with_opacus_prefix_and_wrappers(tmp_path, wrap):
    model = small_model()
    state = opacus_style(model)
    source = tmp_path / "opacus.pt"
    torch.save(state if wrap is None else {wrap: state, "epoch": 3, "optimizer": {"lr": 0.1}}, source)
    store = Store(tmp_path / "root")
    path = import_checkpoint(store, source, model_spec=model.landscape_spec, data_spec=DATA_SPEC, run="imp")
    assert_imported(store, path, model, source, "imp")


def test_import_safetensors(tmp_path):
    model = small_model()
    source = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(source))
    store = Store(tmp_path / "root")
    path = import_checkpoint(store, source, model_spec={"name": "mlp", "kwargs": model.landscape_spec["kwargs"]},
                             data_spec=DATA_SPEC, run="st")
    assert_imported(store, path, model, source, "st")


class Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("where", ["inside-state-dict", "whole-file-protocol-2", "whole-file-protocol-4"])
def test_import_refuses_pickled_code_and_does_not_run_it(tmp_path, where):
    marker = tmp_path / "PWNED"
    source = tmp_path / "evil.pt"
    if where.startswith("whole-file"):
        source.write_bytes(pickle.dumps(Exploit(marker), protocol=int(where[-1])))
    else:
        torch.save({"0.weight": torch.zeros(2), "payload": Exploit(marker)}, source)
    store = Store(tmp_path / "root")
    with pytest.raises(UnsafeFileError) as err:
        import_checkpoint(store, source, model_spec=small_model().landscape_spec, data_spec=DATA_SPEC, run="evil")
    message = str(err.value)
    assert str(source) in message and "\n" not in message
    assert where.endswith("4") or "posix.system" in message  # names the culprit when torch does
    assert not marker.exists()
    assert store.run_names() == []  # nothing was created


def test_import_rejects_mismatches_in_one_line(tmp_path):
    model = small_model()
    spec = model.landscape_spec
    store = Store(tmp_path / "root")
    bad_shape = dict(model.state_dict())
    key = list(bad_shape)[2]
    bad_shape[key] = torch.zeros(5, 5)
    cases = {
        "shape.pt": (bad_shape, IncompatibleError, f"'{key}' has shape (5, 5)"),
        "missing.pt": (dict(list(model.state_dict().items())[:-1]), IncompatibleError, "missing tensor"),
        "unexpected.pt": ({**model.state_dict(), "extra.weight": torch.ones(1)}, IncompatibleError, "unexpected"),
        "list.pt": ([torch.ones(1)], CheckpointError, "no state dict"),
    }
    for name, (content, error, needle) in cases.items():
        torch.save(content, tmp_path / name)
        with pytest.raises(error) as err:
            import_checkpoint(store, tmp_path / name, model_spec=spec, data_spec=DATA_SPEC, run="x")
        assert needle in str(err.value) and "\n" not in str(err.value), name
    (tmp_path / "corrupt.pt").write_bytes(b"\x00garbage")
    (tmp_path / "corrupt.safetensors").write_bytes(b"\x00garbage")
    for name in ("corrupt.pt", "corrupt.safetensors"):
        with pytest.raises(CheckpointError) as err:
            import_checkpoint(store, tmp_path / name, model_spec=spec, data_spec=DATA_SPEC, run="x")
        assert "corrupt" in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(UsageError, match=r"\.safetensors"):
        import_checkpoint(store, tmp_path / "w.bin", model_spec=spec, data_spec=DATA_SPEC, run="x")
    assert store.run_names() == []


def test_the_manifest_lists_one_checkpoint_per_line_and_reads_back_as_written(tmp_path):
    """The manifest is rewritten at every save; its checkpoint entries are one compact line each (json's C
    encoder), every other field indented: the file parses to exactly what an indented dump of the same
    manifest gives (non-finite metrics as strings, numpy scalars as numbers)."""
    from landscape.jsonable import to_jsonable
    from landscape.store.manifest import _write_json_atomic

    manifest = {"format": "x", "config": {"a": [1, {"b": float("nan")}], "c": '"checkpoints": []'},
                "checkpoints": [{"step": i, "epoch": np.float32(i / 2), "metrics": {"loss": float("inf") if i == 1
                                                                                  else 0.5}, "file": f"s{i}"}
                                for i in range(3)], "seeds": {}}
    _write_json_atomic(tmp_path / "m.json", manifest)
    text = (tmp_path / "m.json").read_text()
    assert json.loads(text) == json.loads(json.dumps(to_jsonable(manifest)))
    assert json.loads(text)["checkpoints"][1]["metrics"]["loss"] == "inf"
    lines = text.splitlines()
    start = lines.index('  "checkpoints": [')
    assert [json.loads(line.strip().rstrip(","))["step"] for line in lines[start + 1:start + 4]] == [0, 1, 2]
    empty = {**manifest, "checkpoints": []}
    _write_json_atomic(tmp_path / "e.json", empty)
    assert (tmp_path / "e.json").read_text() == json.dumps(to_jsonable(empty), indent=2) + "\n"
    store = Store(tmp_path / "store")
    run = store.create_run("r", config={"lr": 0.1}, seeds={"seed": 0}, model_spec={}, data_spec={})
    for step in range(3):
        run.save_checkpoint({"w": torch.full((2,), float(step))}, step=step, epoch=step, metrics={"loss": 1.0 / (step + 1)})
    run.close()
    reopened = store.run("r")
    assert [c.step for c in reopened.checkpoints()] == [0, 1, 2]
    assert [c.metrics["loss"] for c in reopened.checkpoints()] == [1.0, 0.5, 1.0 / 3]
