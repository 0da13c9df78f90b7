"""A write the system refuses (a full disk: ENOSPC; a file size limit: EFBIG; a failing device: EIO) is one
error line naming the file, never a crash (h5py segfaulted closing an HDF5 file after a failed write), the
temporary file removed, nothing committed changed, and a run continued once there is room is bit-identical.

Refusals are made three ways: a failing ``os.pwrite`` / ``os.ftruncate`` at every point of an HDF5 write (the
writer's own calls), ``RLIMIT_FSIZE`` in a subprocess (``ulimit -f``: EFBIG from the kernel), and a small tmpfs
mounted for the test (ENOSPC; skipped where mounting is not permitted).
"""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import run_cli

from landscape.atomic import atomic_write, atomic_write_hdf5
from landscape.errors import LandscapeError, WriteError
from landscape.store import MANIFEST, Store, load_checkpoint
from landscape.store.codec import _write_nested, _write_state_dict

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TRAIN = ("train", "--subset", "200", "--epochs", "3")  # checkpoints at steps 0, 4, 8, 12: 127 kB, then 217 kB


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "MPLBACKEND": "Agg", "LANDSCAPE_THREADS": "1"}


def _landscape(cwd: Path, *args: str, limit: int | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``landscape ARGS`` in a subprocess whose files may not grow past ``limit`` bytes (``ulimit -f``)."""
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return subprocess.run([PY, "-m", "cli.main", *args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limited if limit is not None else None)


def _one_line_failure(proc: subprocess.CompletedProcess, path: str, words: str) -> str:
    """Exit 1, one ``error:`` line on stderr naming ``path`` and ``words``, no traceback; returns the line."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and "HDF5-DIAG" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    assert path in lines[0] and words in lines[0], lines[0]
    return lines[0]


def _no_temp_files(*roots: Path) -> None:
    left = [p for root in roots for p in root.rglob("*.tmp")]
    assert not left, left


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and p.name != ".lock"}


# -- the writer itself: a refusal at every point of an HDF5 write -------------------------------------------------

def _checkpoint_like(f: h5py.File, check) -> None:
    for i in range(4):
        f.attrs[f"attr{i}"] = "x" * 40
    _write_state_dict(f.create_group("state_dict", track_order=True),
                      {"w": torch.arange(3000.0).reshape(60, 50), "b": torch.ones(7, dtype=torch.bfloat16)})
    _write_nested(f.create_group("extra", track_order=True),
                  {"rng": {"state": np.arange(2000)}, "names": np.array([b"a", b"b"])}, escape=False)


def _streamed(f: h5py.File, check) -> None:  # chunked datasets written piece by piece, like the Gram writer
    for name in ("a", "b"):
        d = f.create_dataset(name, (300, 300), dtype="f8", chunks=(128, 128))
        for r in range(0, 300, 100):
            d[r:r + 100, :] = np.full((100, 300), r + 1.0)
            check()
    f.attrs["kind"] = "streamed"


def _result_like(f: h5py.File, check) -> None:
    f.attrs["kind"] = "result"
    f.create_dataset("x", data=np.linspace(0, 1, 40))
    f["x"].make_scale("x")
    f.create_dataset("loss", data=np.arange(280.0).reshape(40, 7))
    f["loss"].dims[0].attach_scale(f["x"])
    f.create_dataset("labels", data=np.array(["ab", "c"], dtype=h5py.string_dtype()))


FILLS = {"checkpoint": _checkpoint_like, "streamed": _streamed, "result": _result_like}


def _count_writes(monkeypatch, fill, path: Path) -> int:
    calls = [0]
    real = os.pwrite

    def counting(fd, data, offset):
        calls[0] += 1
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", counting)
    atomic_write_hdf5(path, fill)
    monkeypatch.setattr(os, "pwrite", real)
    return calls[0]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG, errno.EIO])
@pytest.mark.parametrize("kind", sorted(FILLS))
def test_a_refused_write_at_any_point_is_one_write_error_and_the_file_as_it_was(tmp_path, monkeypatch, kind, code):
    fill = FILLS[kind]
    target = tmp_path / "file.h5"
    writes = _count_writes(monkeypatch, fill, target)
    before = target.read_bytes()
    real = os.pwrite
    for k in range(1, writes + 1):
        calls = [0]

        def refusing(fd, data, offset, k=k, calls=calls):
            calls[0] += 1
            if calls[0] >= k:  # this write and every one after it (a full disk stays full)
                if calls[0] == k and len(data) > 1:  # the first refused write went half-way
                    return real(fd, memoryview(data)[: len(data) // 2], offset)
                raise OSError(code, os.strerror(code))
            return real(fd, data, offset)

        monkeypatch.setattr(os, "pwrite", refusing)
        with pytest.raises(WriteError) as err:
            atomic_write_hdf5(target, fill)
        monkeypatch.setattr(os, "pwrite", real)
        assert err.value.errno == code and err.value.filename == str(target)
        assert str(err.value).startswith(f"cannot write {target}: ") and "\n" not in str(err.value)
        assert ("disk full" in str(err.value)) == (code == errno.ENOSPC)
        assert str(err.value).endswith("the file is unchanged")
        assert target.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["file.h5"]  # the temporary file removed
    with h5py.File(target) as f:  # the file a later write makes is whole
        assert f.attrs["attr0" if kind == "checkpoint" else "kind"] is not None


def test_a_refused_truncation_is_a_write_error_too(tmp_path, monkeypatch):
    def refusing(fd, length):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "ftruncate", refusing)
    with pytest.raises(WriteError, match="Input/output error; nothing was written"):
        atomic_write_hdf5(tmp_path / "new.h5", _result_like)
    assert list(tmp_path.iterdir()) == []


def test_a_streaming_writer_stops_at_the_first_refused_piece(tmp_path, monkeypatch):
    pieces = []

    def stream(f: h5py.File, check) -> None:
        d = f.create_dataset("K", (64, 64 * 200), dtype="f8", chunks=(64, 64))
        for i in range(200):
            d[:, 64 * i:64 * (i + 1)] = i
            f.flush()  # the piece reaches the file now, as a chunk cache does once full
            pieces.append(i)
            check()

    def refusing(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", refusing)
    with pytest.raises(WriteError, match="disk full"):
        atomic_write_hdf5(tmp_path / "k.h5", stream)
    assert pieces == [0] and list(tmp_path.iterdir()) == []


def test_a_refused_text_write_is_the_same_error():
    def refusing(tmp: Path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))

    Path("kept.json").write_text("old")
    with pytest.raises(WriteError) as err:
        atomic_write("kept.json", refusing)
    assert str(err.value) == "cannot write kept.json: disk full (No space left on device); the file is unchanged"
    assert Path("kept.json").read_text() == "old" and os.listdir(".") == ["kept.json"]


def test_write_error_is_an_oserror_and_a_failure_and_crosses_processes():
    err = WriteError("out/x.h5", errno.EFBIG, "File too large", "; nothing was written").noted("; run kept")
    assert isinstance(err, OSError) and isinstance(err, LandscapeError) and err.exit_code == 1
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is WriteError and str(again) == str(err) and again.errno == errno.EFBIG
    assert str(err) == ("cannot write out/x.h5: File too large (over a file size limit: the file system's, or the "
                        "shell's ulimit -f); nothing was written; run kept")


# -- the sha256 of a write: the final file's bytes, though HDF5 does not write them in order ----------------------

@pytest.mark.parametrize("kind", sorted(FILLS))
def test_the_hash_of_a_write_is_the_hash_of_the_file_it_leaves(tmp_path, monkeypatch, kind):
    offsets = []
    real = os.pwrite

    def recording(fd, data, offset):
        offsets.append((offset, len(memoryview(data).cast("B"))))
        return real(fd, data, offset)

    target = tmp_path / "file.h5"
    target.write_bytes(b"an older file")  # replaced: the hash is the new file's
    monkeypatch.setattr(os, "pwrite", recording)
    hasher = hashlib.sha256()
    atomic_write_hdf5(target, FILLS[kind], hasher=hasher)
    monkeypatch.undo()
    assert hasher.hexdigest() == hashlib.sha256(target.read_bytes()).hexdigest()
    ends = np.maximum.accumulate([o + n for o, n in offsets])
    assert any(o < end for (o, _), end in zip(offsets[1:], ends[:-1], strict=True)), "written in order"


def test_the_hash_of_a_text_write_and_of_checkpoints_of_every_layout(tmp_path):
    hasher = hashlib.sha256()
    atomic_write(tmp_path / "a.json", lambda tmp: tmp.write_text("x" * 3_000_000), hasher=hasher)
    assert hasher.hexdigest() == hashlib.sha256(b"x" * 3_000_000).hexdigest()
    run = _run(tmp_path)
    layouts = [{"w": torch.zeros(3)},
               {"big": torch.randn(700, 1000), "b": torch.ones(7, dtype=torch.bfloat16)},  # 2.7 MB: several reads
               {"conv.weight": torch.randn(4, 3, 3, 3), "n": torch.tensor(3)}]
    extras = [None, {"rng": {"state": np.arange(2000)}, "names": np.array([b"a", b"b"])}, {"opt/0/m": torch.ones(5)}]
    for step, (state, extra) in enumerate(zip(layouts, extras, strict=True)):
        path = run.save_checkpoint(state, step=step, epoch=0.0, extra=extra)
        listed = next(e for e in run.manifest["checkpoints"] if e["step"] == step)
        assert listed["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_failed_hash_leaves_the_file_as_it_was(tmp_path):
    class Broken:
        def update(self, block):
            raise ValueError("broken hasher")

    target = tmp_path / "file.h5"
    target.write_bytes(b"old")
    with pytest.raises(ValueError, match="broken hasher"):
        atomic_write_hdf5(target, _result_like, hasher=Broken())
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["file.h5"]


# -- the store: a refused save keeps the run, and a continued run adopts what was written -------------------------

def _run(tmp_path: Path):
    return Store(tmp_path / "st").create_run("r", config={}, seeds={}, model_spec={}, data_spec={})


def test_a_refused_checkpoint_keeps_the_run_as_it_was(tmp_path, monkeypatch):
    run = _run(tmp_path)
    run.save_checkpoint({"w": torch.zeros(50, 50)}, step=0, epoch=0.0)
    before = _snapshot(run.path)

    def refusing(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", refusing)
    with pytest.raises(WriteError) as err:
        run.save_checkpoint({"w": torch.ones(50, 50)}, step=5, epoch=1.0)
    monkeypatch.undo()
    assert str(err.value) == (f"cannot write {run.path / 'step-000005.h5'}: disk full (No space left on device); "
                              "nothing was written; run 'r' keeps its 1 checkpoint (the last at step 0), where "
                              "continuing it starts")
    assert _snapshot(run.path) == before
    run.save_checkpoint({"w": torch.ones(50, 50)}, step=5, epoch=1.0)  # once there is room
    assert [c.step for c in Store(tmp_path / "st").run("r").checkpoints()] == [0, 5]


def test_a_refused_manifest_after_its_checkpoint_says_the_file_is_adopted_and_it_is(tmp_path, monkeypatch):
    import landscape.store.core as core

    run = _run(tmp_path)
    run.save_checkpoint({"w": torch.zeros(3)}, step=0, epoch=0.0)
    manifest = (run.path / MANIFEST).read_bytes()
    real = core._write_json_atomic

    def refusing(path, obj):
        def fail(tmp):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        atomic_write(path, fail)

    monkeypatch.setattr(core, "_write_json_atomic", refusing)
    with pytest.raises(WriteError, match="step-000004.h5 is complete but not listed: continuing the run adopts it"):
        run.save_checkpoint({"w": torch.ones(3)}, step=4, epoch=1.0)
    monkeypatch.setattr(core, "_write_json_atomic", real)
    run.close()
    assert (run.path / MANIFEST).read_bytes() == manifest
    with Store(tmp_path / "st").open_run("r") as again:
        listed = [c for c in again.checkpoints() if c.sha256]
    assert [c.step for c in listed] == [0, 4]
    assert torch.equal(load_checkpoint(listed[1].path).state_dict["w"], torch.ones(3))


# -- the commands under ulimit -f (EFBIG from the kernel) ----------------------------------------------------------

def _final_state(root: Path, run: str) -> dict[str, torch.Tensor]:
    return Store(root).load(f"{run}@last").state_dict


def test_train_past_a_file_size_limit_is_one_line_and_continues_bit_identically(tmp_path, capsys):
    proc = _landscape(tmp_path, "--root", "st", *TRAIN, "--run", "a", limit=200_000)
    line = _one_line_failure(proc, "st/a/step-000004.h5", "File too large")
    assert "run 'a' keeps its 1 checkpoint (the last at step 0)" in line
    _no_temp_files(tmp_path)
    runs, broken = Store(tmp_path / "st").scan()
    assert [r.name for r in runs] == ["a"] and not broken
    assert [c.step for c in runs[0].checkpoints()] == [0] and runs[0].checkpoints()[0].sha256
    assert run_cli("--root", tmp_path / "st", "train", "--resume", "a", capsys=capsys)[0] == 0
    assert run_cli("--root", tmp_path / "st", *TRAIN, "--run", "b", capsys=capsys)[0] == 0
    a, b = _final_state(tmp_path / "st", "a"), _final_state(tmp_path / "st", "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [c.step for c in Store(tmp_path / "st").run("a").checkpoints()]
    assert steps == [c.step for c in Store(tmp_path / "st").run("b").checkpoints()] == [0, 4, 8, 12]


def test_phases_past_a_file_size_limit_is_one_line_and_the_runs_stay_readable(tmp_path):
    proc = _landscape(tmp_path, "--root", "st", "phases", "--k", "1", "--epochs", "2", "--copies", "1", "--subset",
                      "100", "--batch-size", "50", "--phase1", "sgd", "--phase2", "sgd", "--group", "g", limit=150_000)
    _one_line_failure(proc, "st/g-", "File too large")
    _no_temp_files(tmp_path)
    runs, broken = Store(tmp_path / "st").scan()
    assert runs and not broken
    for run in runs:
        for info in run.checkpoints():
            assert info.sha256 and load_checkpoint(info.path).sha256 == info.sha256


def test_batch_past_a_file_size_limit_fails_its_job_in_one_line_and_the_rerun_completes(tmp_path, capsys):
    (tmp_path / "spec.yaml").write_text(textwrap.dedent("""\
        jobs:
          t:
            kind: train
            data: digits
            subset: 200
            epochs: 3
            run: t0
        """))
    proc = _landscape(tmp_path, "batch", "spec.yaml", limit=200_000)
    _one_line_failure(proc, "checkpoints/t0/step-000004.h5", "File too large")
    _no_temp_files(tmp_path)
    assert run_cli("batch", "spec.yaml", capsys=capsys)[0] == 0
    assert [c.step for c in Store(tmp_path / "checkpoints").run("t0").checkpoints()] == [0, 4, 8, 12]


RECORDER = """\
import resource, sys, torch
from landscape import Recorder
from landscape.data import load_dataset
from landscape.errors import WriteError
from landscape.models import build_model

data = load_dataset("digits")
torch.manual_seed(0)
model = build_model("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
with Recorder("st", "r", model, data=data, optimizer=opt, writer="inline") as rec:
    rec.save(0, epoch=0)
    model[0].weight.data.add_(1.0)
    resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, resource.RLIM_INFINITY))
    try:
        rec.save(1, epoch=1)
    except WriteError as exc:
        print("refused:", exc)
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    rec.save(1, epoch=1)  # once there is room
print("closed")
"""


def test_the_inline_recorder_save_raises_the_refusal_and_the_run_goes_on(tmp_path):
    (tmp_path / "loop.py").write_text(RECORDER)
    proc = subprocess.run([PY, "loop.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "refused: cannot write st/r/step-000001.h5: File too large" in proc.stdout
    assert "run 'r' keeps its 1 checkpoint (the last at step 0)" in proc.stdout and "closed" in proc.stdout
    _no_temp_files(tmp_path)
    infos = Store(tmp_path / "st").run("r").checkpoints()
    assert [i.step for i in infos] == [0, 1] and all(load_checkpoint(i.path).sha256 == i.sha256 for i in infos)


def test_an_analysis_whose_figure_is_refused_says_which_file_in_one_line(tmp_path, capsys):
    assert run_cli("--root", "st", "train", "--subset", "100", "--epochs", "1", "--run", "a", "--checkpoint-every",
                   "none", capsys=capsys)[0] == 0
    args = ("--root", "st", "interpolate", "a@init", "a@last", "--points", "3", "-o", "out/x.h5")
    proc = _landscape(tmp_path, *args, limit=40_000)  # the result (9 kB) fits, the PNG (80 kB) does not
    _one_line_failure(proc, "out/x.png", "File too large")
    _no_temp_files(tmp_path)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["x.h5"]
    from landscape.results import read_result

    assert read_result(tmp_path / "out/x.h5").kind == "interpolation"
    proc = _landscape(tmp_path, *args, limit=4_000)  # now the result itself
    _one_line_failure(proc, "out/x.h5", "File too large")
    assert read_result(tmp_path / "out/x.h5").kind == "interpolation"  # the earlier file, unchanged


def test_figures_whose_image_is_refused_say_which_file_in_one_line(tmp_path):
    proc = _landscape(tmp_path, "--root", "st", "figures", "wang-lssgd", "--scale", "test", "--out", "fig",
                      limit=50_000)  # its checkpoints (38 kB) and summary (15 kB) fit, the PNG (53 kB) does not
    _one_line_failure(proc, "fig/wang-lssgd/wang-lssgd-figure-test.png", "File too large")
    _no_temp_files(tmp_path)
    assert not list((tmp_path / "fig").rglob("*.png"))
    assert not Store(tmp_path / "st").scan()[1]


# -- a full disk (ENOSPC) on a small tmpfs, then room again -------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 400 kB tmpfs at ``tmp_path/disk`` (root only; skipped where mounting is not permitted)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_train_on_a_full_disk_says_disk_full_and_continues_bit_identically_once_there_is_room(small_disk, tmp_path,
                                                                                             capsys):
    proc = _landscape(small_disk, "--root", "st", *TRAIN, "--run", "a")
    _one_line_failure(proc, "st/a/step-000008.h5", "disk full (No space left on device)")
    _no_temp_files(small_disk)
    kept = _snapshot(small_disk / "st")
    code, out, _ = run_cli("--root", small_disk / "st", "store", "ls", capsys=capsys)
    assert code == 0 and "a " in out
    assert _snapshot(small_disk / "st") == kept
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)  # room again
    assert run_cli("--root", small_disk / "st", "train", "--resume", "a", capsys=capsys)[0] == 0
    assert run_cli("--root", tmp_path / "st", *TRAIN, "--run", "a", capsys=capsys)[0] == 0
    a, b = _final_state(small_disk / "st", "a"), _final_state(tmp_path / "st", "a")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_gram_writer_stops_at_the_tile_that_did_not_fit_and_leaves_no_file(tmp_path, monkeypatch):
    import landscape.gram_hdf5 as gram_hdf5
    from landscape.models import build_model

    torch.manual_seed(0)
    model = build_model("lenet", input_shape=(1, 8, 8), num_classes=10)
    x, y = torch.randn(600, 1, 8, 8), torch.randint(0, 10, (600,))
    made = []

    def counted(*args, **kwargs):
        for tile in gram_tiles(*args, **kwargs):
            made.append(tile[:2])
            yield tile

    gram_tiles = gram_hdf5.gram_tiles
    monkeypatch.setattr(gram_hdf5, "gram_tiles", counted)
    total = len(list(gram_tiles(model, x, y, chunk=100)))

    def refusing(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", refusing)
    with pytest.raises(WriteError, match=r"cannot write .*gram\.h5: disk full"):
        gram_hdf5.gram_blocks_to_hdf5(model, x, y, tmp_path / "gram.h5", chunk=100)
    assert 0 < len(made) < total / 2  # stopped at the first tile after the refusal, not at the end
    assert list(tmp_path.iterdir()) == []
