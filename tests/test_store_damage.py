"""Store robustness: damaged manifests, missing files, the one-writer lock, bad refs."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import stat
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli

from landscape.atomic import atomic_write, stale_temp_files
from landscape.errors import CheckpointError, IncompatibleError, UsageError
from landscape.models import build_model
from landscape.store import MAX_JSON_DEPTH, Store, check_manifest, import_checkpoint
from landscape.train.config import parse_every

DATA_SPEC = {"name": "digits", "seed": 0, "subset": None, "options": {}}
MODEL_SPEC = {"name": "mlp", "kwargs": {"widths": [8]}}


def make_run(store: Store, name: str, steps=(0, 5)):
    with store.create_run(name, config={"lr": 0.1}, seeds={"seed": 0}, model_spec=MODEL_SPEC,
                          data_spec=DATA_SPEC) as run:
        for s in steps:
            run.save_checkpoint({"w": torch.full((2, 3), float(s))}, step=s, epoch=s / 5, metrics={"acc": s / 10})
    return run


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------------------------ manifest damage


def edit_manifest(run_dir: Path, fn) -> Path:
    path = run_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    fn(manifest)
    path.write_text(json.dumps(manifest))
    return path


def _drop_file(m):
    del m["checkpoints"][1]["file"]


def _string_checkpoints(m):
    m["checkpoints"] = "step-000000.h5"


def _text_step(m):
    m["checkpoints"][1]["step"] = "five"


def _escaping_file(m):
    m["checkpoints"][0]["file"] = "../../outside.h5"


def _bad_sha(m):
    m["checkpoints"][0]["sha256"] = 12


def _seeds_list(m):
    m["seeds"] = [1, 2]


def _ancestor_events(m):
    m["privacy"] = {"ancestor_events": [{"noise_multiplier": "x", "sample_rate": 0.1, "steps": 3}]}


DAMAGE = [
    (_drop_file, "checkpoints[1].file", "is missing"),
    (_string_checkpoints, "checkpoints", "must be a list"),
    (_text_step, "checkpoints[1].step", "non-negative integer"),
    (_escaping_file, "checkpoints[0].file", "step-000000.h5"),
    (_bad_sha, "checkpoints[0].sha256", "hex"),
    (_seeds_list, "seeds", "object"),
    (_ancestor_events, "privacy.ancestor_events[0]", "noise_multiplier"),
]


@pytest.mark.parametrize("damage, field, needle", DAMAGE, ids=[d[1] for d in DAMAGE])
def test_wrong_manifest_contents_are_one_line_naming_file_and_field(tmp_path, capsys, damage, field, needle):
    store = Store(tmp_path)
    make_run(store, "good")
    bad = make_run(store, "bad")
    manifest = edit_manifest(bad.path, damage)
    with pytest.raises(CheckpointError) as err:
        store.run("bad")
    message = str(err.value)
    assert str(manifest) in message and f"'{field}'" in message and needle in message and "\n" not in message
    for args in (["store", "show", "bad"], ["store", "show", "bad@init"], ["train", "--resume", "bad"]):
        code, _, err_text = run_cli("--root", str(tmp_path), *args, capsys=capsys)
        line = one_error_line(err_text)
        assert code == 1 and str(manifest) in line and f"'{field}'" in line, (args, line)
    # the rest of the root is still listed; the damaged run is reported in one line
    code, out, err_text = run_cli("--root", str(tmp_path), "store", "ls", "--json", capsys=capsys)
    assert code == 0
    listing = json.loads(out)
    assert [r["name"] for r in listing["runs"]] == ["good"]
    assert [d["name"] for d in listing["damaged"]] == ["bad"] and f"'{field}'" in listing["damaged"][0]["error"]
    assert len(err_text.strip().splitlines()) == 1 and "bad" in err_text and "Traceback" not in err_text


def test_invalid_json_in_one_manifest_hides_no_other_run(tmp_path, capsys):
    store = Store(tmp_path)
    for name in ("a", "b", "c"):
        make_run(store, name)
    (tmp_path / "b" / "manifest.json").write_text('{"checkpoints": [')  # a truncated manifest
    code, out, err = run_cli("--root", str(tmp_path), "store", "ls", capsys=capsys)
    assert code == 0
    listed = [line.split()[0] for line in out.strip().splitlines()[1:]]
    assert listed == ["a", "c"]
    assert len(err.strip().splitlines()) == 1 and str(tmp_path / "b" / "manifest.json") in err
    # what `instability '*'` and every glob over runs use: the others, and one warning for the damaged one
    with pytest.warns(UserWarning, match="damaged run") as caught:
        runs = store.runs_matching("*")
    assert [r.name for r in runs] == ["a", "c"] and len(caught) == 1


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


NESTED = {
    "nested 100000 deep": lambda m: '{"format": "landscape-run/1", "config": ' + _deep(100_000) + "}",
    "objects 5000 deep": lambda m: '{"config": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}",
    "config 65 deep": lambda m: json.dumps({**m, "config": json.loads(_deep(64))}),  # the manifest is level 1
    "truncated": lambda m: json.dumps(m)[:40],
    "created a number": lambda m: json.dumps({**m, "created": 5}),
    "model name a list": lambda m: json.dumps({**m, "model_spec": {"name": ["mlp"]}}),
    "config a list": lambda m: json.dumps({**m, "config": [1]}),
    "a metric a list": lambda m: json.dumps({**m, "checkpoints": [{**m["checkpoints"][0], "metrics": {"a": [[]]}}]}),
    "not UTF-8": lambda m: "\udcff",
}


@pytest.mark.parametrize("damage", sorted(NESTED))
def test_a_manifest_too_deep_truncated_or_of_wrong_types_is_reported_for_its_run_alone(tmp_path, capsys, damage):
    """Deep JSON is refused before it is parsed (it raised RecursionError, and `store ls` listed nothing)."""
    store = Store(tmp_path)
    for name in ("a", "b", "c"):
        make_run(store, name)
    path = tmp_path / "b" / "manifest.json"
    text = NESTED[damage](json.loads(path.read_text()))
    path.write_bytes(text.encode(errors="surrogateescape"))
    code, out, err = run_cli("--root", tmp_path, "store", "ls", capsys=capsys)
    assert code == 0 and [line.split()[0] for line in out.strip().splitlines()[1:]] == ["a", "c"]
    assert len(err.strip().splitlines()) == 1 and "run 'b': " in err and str(path) in err, err
    from landscape.api import runs

    listing = runs(tmp_path)
    assert [r["name"] for r in listing["runs"]] == ["a", "c"] and [d["name"] for d in listing["damaged"]] == ["b"]
    with pytest.raises(CheckpointError) as exc:
        store.run("b")
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 300
    if "deep" in damage:
        assert f"nests deeper than {MAX_JSON_DEPTH} levels" in str(exc.value)
    code, _, err = run_cli("--root", tmp_path, "store", "show", "b", capsys=capsys)
    assert code == 1 and one_error_line(err)


def test_a_metric_that_is_not_a_number_is_refused_before_anything_is_written(tmp_path):
    run = make_run(Store(tmp_path), "r")
    before = (run.path / "manifest.json").read_bytes()
    with Store(tmp_path).open_run("r") as again:
        with pytest.raises(UsageError, match="metric 'curve' must be a number, got list"):
            again.save_checkpoint({"w": torch.zeros(2, 3)}, step=9, epoch=1.0, metrics={"curve": [0.5, 0.4]})
    assert (run.path / "manifest.json").read_bytes() == before and not (run.path / "step-000009.h5").exists()


def test_a_run_whose_fields_nest_too_deep_is_refused_before_anything_is_written(tmp_path):
    def nest(levels: int) -> dict:  # ``levels`` objects one inside the other
        return {} if levels == 1 else {"a": nest(levels - 1)}

    deepest = MAX_JSON_DEPTH - 1  # a field is level 2 of its manifest
    with pytest.raises(UsageError, match=f"manifest field 'config' nests deeper than {MAX_JSON_DEPTH} levels"):
        Store(tmp_path).create_run("deep", config=nest(deepest + 1), seeds={}, model_spec={}, data_spec={})
    assert not (tmp_path / "deep").exists()
    with Store(tmp_path).create_run("ok", config=nest(deepest), seeds={}, model_spec={}, data_spec={}) as run:
        with pytest.raises(UsageError, match="manifest field 'notes' nests deeper"):
            run.update_manifest(notes=[nest(deepest)])
    assert Store(tmp_path).run("ok").manifest["config"] == nest(deepest)  # the deepest a manifest may be


def test_instability_over_a_glob_skips_a_damaged_run(tmp_path, capsys):
    """`instability '*'` computes the pairs of the readable runs and says which run it skipped."""
    store = Store(tmp_path)
    data_spec = {"name": "digits", "seed": 0, "subset": 60, "options": {}}
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, widths=[4])
    for i, name in enumerate(("a", "b", "c")):
        with store.create_run(name, config={}, seeds={}, model_spec=model.landscape_spec, data_spec=data_spec) as run:
            run.save_checkpoint({k: v + i for k, v in model.state_dict().items()}, step=0, epoch=0.0)
    (tmp_path / "c" / "manifest.json").write_text("not json")
    out_file = tmp_path / "inst.h5"
    code, _, err = run_cli("--root", str(tmp_path), "instability", "*", "--pairs", "all", "--points", "3",
                           "-o", str(out_file), "--json", capsys=capsys)
    assert code == 0, err
    assert "Traceback" not in err and sum("damaged run" in line for line in err.splitlines()) == 1
    assert out_file.is_file()


def test_a_deleted_checkpoint_is_reported_not_skipped(tmp_path, capsys):
    store = Store(tmp_path)
    run = make_run(store, "r", steps=(0, 5, 10))
    (run.path / "step-000010.h5").unlink()
    for ref in ("r", "r@last", "r@step=10"):
        with pytest.raises(CheckpointError, match=r"lists step 10 but its file step-000010.h5 is missing"):
            store.load(ref)
    code, _, err = run_cli("--root", str(tmp_path), "store", "show", "r@last", capsys=capsys)
    assert code == 1 and "step-000010.h5 is missing" in one_error_line(err)


def test_check_manifest_accepts_what_the_store_writes(tmp_path):
    run = make_run(Store(tmp_path), "r")
    manifest = json.loads((run.path / "manifest.json").read_text())
    assert check_manifest(manifest, run.path / "manifest.json") is manifest
    with pytest.raises(CheckpointError, match="twice"):
        check_manifest({**manifest, "checkpoints": manifest["checkpoints"] * 2}, "m.json")
    with pytest.raises(CheckpointError, match="not a JSON object"):
        check_manifest([1], "m.json")


# ------------------------------------------------------------------------------------ one writer per run


def _hold_run(root: str, name: str, flag: str) -> None:
    run = Store(root).open_run(name)  # noqa: F841 (keeps the lock until the process dies)
    Path(flag).write_text(str(os.getpid()))
    time.sleep(120)


def test_a_second_writer_is_refused_while_a_process_holds_the_run(tmp_path, capsys):
    store = Store(tmp_path / "root")
    run = make_run(store, "r")
    flag = tmp_path / "flag"
    holder = multiprocessing.get_context("fork").Process(target=_hold_run, args=(str(store.root), "r", str(flag)),
                                                         daemon=True)
    holder.start()
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert holder.is_alive() and time.monotonic() < deadline, "the lock holder did not start"
            time.sleep(0.01)
        before = (run.path / "manifest.json").read_bytes()
        pid = f"pid {holder.pid}"
        writes = [
            lambda: store.open_run("r"),
            lambda: store.run("r").save_checkpoint({"w": torch.zeros(2, 3)}, step=7, epoch=1.0),
            lambda: store.run("r").save_array("mask", np.ones(3)),
            lambda: store.run("r").update_manifest(note="x"),
        ]
        for write in writes:
            with pytest.raises(CheckpointError, match=f"being written by another process \\({pid}\\)"):
                write()
        code, _, err = run_cli("--root", str(store.root), "train", "--resume", "r", capsys=capsys)
        assert code == 1 and "being written by another process" in one_error_line(err)
        assert (run.path / "manifest.json").read_bytes() == before  # nothing was written
        assert not (run.path / "step-000007.h5").exists()
        assert store.load("r@last").step == 5  # readers are never blocked
    finally:
        holder.kill()
        holder.join(timeout=30)
    assert holder.exitcode == -signal.SIGKILL
    # the kernel drops the lock with its holder: the run is writable again
    with store.open_run("r") as again:
        again.save_checkpoint({"w": torch.zeros(2, 3)}, step=7, epoch=1.0)
    assert [i.step for i in store.run("r").checkpoints()] == [0, 5, 7]


def _hold_new_run(root: str, name: str, flag: str, manifest: bool) -> None:
    """A creator mid-way: the run directory made and locked, its manifest written (or not yet)."""
    store = Store(root)
    if manifest:
        run = store.create_run(name, config={}, seeds={}, model_spec=MODEL_SPEC, data_spec=DATA_SPEC)  # noqa: F841
    else:
        from landscape.store._locks import _lock

        (Path(root) / name).mkdir(parents=True)
        lock = _lock(Path(root) / name, name)  # noqa: F841
    Path(flag).write_text(str(os.getpid()))
    time.sleep(120)


@pytest.mark.parametrize("manifest", [False, True], ids=["before its manifest", "after its manifest"])
def test_the_loser_of_two_writers_creating_one_run_hears_that_another_process_writes_it(tmp_path, capsys, manifest):
    """Not 'continue it: train --resume' (which the winner is doing): the run is being written, by that pid."""
    root, flag = tmp_path / "root", tmp_path / "flag"
    holder = multiprocessing.get_context("fork").Process(target=_hold_new_run, args=(str(root), "r", str(flag),
                                                                                      manifest), daemon=True)
    holder.start()
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert holder.is_alive() and time.monotonic() < deadline, "the creator did not start"
            time.sleep(0.01)
        before = sorted(p.name for p in (root / "r").iterdir())
        with pytest.raises(CheckpointError) as err:
            make_run(Store(root), "r")
        assert str(err.value) == (f"run 'r' is being written by another process (pid {holder.pid}); one writer per "
                                  "run: wait for it to end")
        code, _, text = run_cli("--root", root, "train", "--run", "r", "--epochs", "1", "--subset", "50",
                                "--batch-size", "25", capsys=capsys)
        assert code == 1 and one_error_line(text) == f"error: {err.value}"
        assert sorted(p.name for p in (root / "r").iterdir()) == before  # nothing written, nothing swept
    finally:
        holder.kill()
        holder.join(timeout=30)
    if manifest:  # once its writer is gone, a run is a run: continue it, or choose another name
        with pytest.raises(CheckpointError, match="run 'r' already exists .* continue it: resume='r'"):
            make_run(Store(root), "r")
    else:  # a creator killed before its manifest: the name is free again
        make_run(Store(root), "r")


def test_lock_is_reentrant_within_a_process_and_released_by_close(tmp_path):
    store = Store(tmp_path)
    run = make_run(store, "r")
    with store.open_run("r") as a, store.open_run("r") as b:  # one process, one lock
        a.save_checkpoint({"w": torch.ones(2, 3)}, step=9, epoch=1.8)
        b.update_manifest(note="b")  # b re-reads the manifest under the lock: a's checkpoint survives
        a.save_checkpoint({"w": torch.ones(2, 3)}, step=10, epoch=2.0)  # and a sees b's note
    manifest = store.run("r").manifest
    assert manifest["note"] == "b" and [c["step"] for c in manifest["checkpoints"]] == [0, 5, 9, 10]
    assert (run.path / ".lock").is_file()


def test_create_run_reclaims_a_directory_its_killed_creator_left_without_manifest(tmp_path):
    store = Store(tmp_path)
    debris = tmp_path / "r"
    debris.mkdir()
    (debris / ".lock").write_text("123\n")
    (debris / ".manifest.json.abc123.tmp").write_text("{")
    make_run(store, "r")
    assert store.run("r").manifest["config"] == {"lr": 0.1}
    assert sorted(p.name for p in debris.iterdir()) == [".lock", "manifest.json", "step-000000.h5", "step-000005.h5"]
    other = tmp_path / "user-dir"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="already exists"):
        make_run(store, "user-dir")
    assert (other / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------------------------ smaller items


def test_epoch_selector_must_be_finite(tmp_path, capsys):
    store = Store(tmp_path)
    make_run(store, "a")
    for value in ("inf", "-inf", "nan"):
        with pytest.raises(UsageError, match="finite"):
            store.load(f"a@epoch={value}")
    code, _, err = run_cli("--root", str(tmp_path), "store", "show", "a@epoch=inf", capsys=capsys)
    assert code == 2 and "finite" in one_error_line(err) and "several" not in err


def test_import_refuses_integer_weights_for_a_float_model(tmp_path):
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, widths=[8])
    spec = model.landscape_spec
    state = {k: (v * 100).to(torch.int64) if k.endswith("weight") else v for k, v in model.state_dict().items()}
    source = tmp_path / "ints.pt"
    torch.save(state, source)
    with pytest.raises(IncompatibleError, match=r"is int64 \(integer\) but model 'mlp' expects float32"):
        import_checkpoint(Store(tmp_path / "root"), source, model_spec=spec, data_spec=DATA_SPEC, run="ints")
    assert not (tmp_path / "root" / "ints").exists()
    # float64 weights are still accepted (same kind; converted when loaded into the model)
    torch.save({k: v.double() for k, v in model.state_dict().items()}, tmp_path / "f64.pt")
    import_checkpoint(Store(tmp_path / "root"), tmp_path / "f64.pt", model_spec=spec, data_spec=DATA_SPEC, run="f64")


@pytest.mark.parametrize("spec", ["0s", "0e", "0.0e", "0"])
def test_a_zero_checkpoint_interval_is_an_error(tmp_path, capsys, spec):
    with pytest.raises(UsageError):
        parse_every(spec)
    code, _, err = run_cli("--root", str(tmp_path), "train", "--epochs", "1", "--checkpoint-every", spec,
                           capsys=capsys)
    assert code == 2 and "--checkpoint-every" in one_error_line(err)
    assert parse_every("none") is None and parse_every("2s") == ("steps", 2)


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "f.txt"
    atomic_write(target, lambda tmp: tmp.write_text("one"))
    assert target.read_text() == "one"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, fail)
    assert target.read_text() == "one" and stale_temp_files(tmp_path) == []
    (tmp_path / ".f.txt.k9x_2.tmp").write_text("left by a killed writer")
    assert [p.name for p in stale_temp_files(tmp_path)] == [".f.txt.k9x_2.tmp"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ------------------------------------------------------------------------------- damage `--resume` must survive


@pytest.fixture(scope="module")
def trained_root(tmp_path_factory):
    """A finished tiny run whose copies, cut back to step 2 (files too), give `--resume` real work."""
    from landscape.train.config import TrainConfig
    from landscape.train.loop import train

    root = tmp_path_factory.mktemp("trained")
    train(TrainConfig(model="mlp", model_kwargs={"widths": [8]}, data="digits", subset=80, batch_size=40, epochs=2,
                      checkpoint_every="1s", run="base"), root=root)
    return root


def _cfg_epochs(m):
    m["config"]["epochs"] = "two"


def _model_kwargs(m):
    m["model_spec"]["kwargs"] = "x"


def _seed_missing(m):
    del m["seeds"]["sampling"]


def _schedule_total(m):
    del m["schedule"]["total_steps"]


def _noise_missing(m):
    del m["privacy"]["noise_multiplier"]


RESUME_DAMAGE = [(_cfg_epochs, "config"), (_model_kwargs, "model_spec"), (_seed_missing, "seeds.sampling"),
                 (_schedule_total, "schedule.total_steps"), (_noise_missing, "privacy.noise_multiplier")]


@pytest.mark.parametrize("damage, field", RESUME_DAMAGE, ids=[f for _, f in RESUME_DAMAGE])
def test_resume_of_a_damaged_manifest_is_one_line(tmp_path, capsys, trained_root, damage, field):
    import shutil

    run_dir = tmp_path / "r"
    shutil.copytree(trained_root / "base", run_dir)
    for later in (3, 4):
        (run_dir / f"step-{later:06d}.h5").unlink()

    def cut(m):
        m["checkpoints"] = m["checkpoints"][:3]
        damage(m)

    manifest = edit_manifest(run_dir, cut)
    code, _, err = run_cli("--root", str(tmp_path), "train", "--resume", "r", capsys=capsys)
    line = one_error_line(err)
    assert code == 1 and str(manifest) in line and f"'{field}'" in line, line
