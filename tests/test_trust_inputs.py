"""Bad input that used to hang, print a traceback or pass silently is one line now.

Seeds follow one rule everywhere (integers in [0, 2**63 - 1]), counts whose size is allocated up front have
stated maxima, derived file names are checked before anything is written, non-finite results fail, a
manifest without the store's fields is damage, a malformed ``--scheduler`` is a usage error before anything
runs and an unreachable one a failure. Every case runs the entry point in-process (``cli.main.main``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time

import click
import numpy as np
import pytest
import torch
from conftest import run_cli
from test_cli_errors import assert_one_error  # noqa: I001
from test_cli_fuzz import walk

from cli.main import cli
from landscape.api.training import train as api_train
from landscape.bounds import (
    BINS_MAX,
    DIRECTIONS_MAX,
    LANCZOS_STEPS_MAX,
    POINTS_MAX,
    SEED_MAX,
    is_seed,
    subset_value,
)
from landscape.errors import UsageError
from landscape.train.config import TrainConfig

TINY = dict(data="digits", subset=120, epochs=1, batch_size=40, checkpoint_every="none", device="cpu")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("trust") / "ck"
    api_train(TrainConfig(model="lenet", seed=0, run="a", **TINY), root=root)
    return root


def one_error(code: int, err: str, expected: int, *fragments: str) -> str:
    """``assert_one_error`` after dropping the line a ``--scheduler`` command prints while it connects."""
    kept = "\n".join(line for line in err.splitlines() if not line.startswith("dask: connecting"))
    return assert_one_error(code, kept, expected, *fragments)


SEED_OPTIONS = [(path, command, p) for path, command in walk(cli) for p in command.params
                if isinstance(p, click.Option) and is_seed(p.name)]


# ------------------------------------------------------------------------------------------------ seeds (7)


def test_every_command_has_the_same_seed_rule():
    found = {(" ".join(path), p.opts[0]) for path, _, p in SEED_OPTIONS}
    # the commands that used to accept -1 and those that printed a traceback for it
    assert {("train", "--seed"), ("phases", "--data-seed"), ("interpolate", "--subset-seed"), ("symmetry", "--seed"),
            ("ntk", "--subset-seed"), ("ntk-table", "--subset-seed"), ("directions", "--subset-seed"),
            ("surface", "--subset-seed"), ("instability", "--subset-seed"), ("align", "--seed")} <= found
    for _, _, p in SEED_OPTIONS:
        assert (p.type.min, p.type.max) == (0, SEED_MAX), p.opts


@pytest.mark.parametrize("path, command, param", SEED_OPTIONS,
                         ids=[f"{' '.join(p)} {q.opts[0]}" for p, _, q in SEED_OPTIONS])
def test_a_negative_seed_is_one_usage_line_everywhere(tmp_path, capsys, path, command, param):
    arguments = ["x" for p in command.params if isinstance(p, click.Argument)]
    code, _, err = run_cli("--root", tmp_path, *path, f"{param.opts[0]}=-1", *arguments, capsys=capsys)
    one_error(code, err, 2, param.opts[0], "[0, 2**63 - 1]")


def test_the_seed_rule_holds_in_the_api_and_batch_configs():
    from landscape.analyze.specs import InterpolateConfig
    from landscape.options import build

    with pytest.raises(UsageError, match=r"^subset_seed must be an integer seed in \[0, 2\*\*63 - 1\]"):
        build(InterpolateConfig, {"subset_seed": -1})
    with pytest.raises(UsageError, match="^seed must be an integer seed"):
        TrainConfig(seed=-1).validate()
    with pytest.raises(UsageError, match="^data_seed"):
        TrainConfig(data_seed=2**63).validate()
    assert TrainConfig(seed=2**63 - 1).validate().seed == SEED_MAX and TrainConfig(seed=3.0).validate().seed == 3
    with pytest.raises(UsageError):
        TrainConfig(seed=1.5).validate()


# ------------------------------------------------------------------------------------------------ bounds (6)


@pytest.mark.parametrize("args, flag, limit", [
    (("calibration", "a", "--bins", "1000000000"), "--bins", BINS_MAX),
    (("norms", "a", "--bins", "1000000000"), "--bins", BINS_MAX),
    (("interpolate", "a", "a", "--points", "1000000000"), "--points", POINTS_MAX),
    (("directions", "a", "--points", "1000000000"), "--points", POINTS_MAX),
    (("instability", "a", "--points", "1000000000"), "--points", POINTS_MAX),
    (("demo", "--points", "1000000000"), "--points", POINTS_MAX),
    (("directions", "a", "--directions", "1000000"), "--directions", DIRECTIONS_MAX),
    (("demo", "--directions", "1000000"), "--directions", DIRECTIONS_MAX),
    (("hessian", "a@last", "--lanczos-steps", "1000000000"), "--lanczos-steps", LANCZOS_STEPS_MAX),
    (("train", "--epochs", str(2**63)), "--epochs", 2**31 - 1),
    (("train", "--subset", str(2**63)), "--subset", 2**31 - 1),
])
def test_huge_counts_are_refused_at_once(root, capsys, args, flag, limit):
    start = time.perf_counter()
    code, _, err = run_cli("--root", root, *args, capsys=capsys)
    one_error(code, err, 2, flag, str(limit))
    assert time.perf_counter() - start < 5


def test_huge_surface_grid_and_api_counts_are_refused(root, capsys):
    code, _, err = run_cli("--root", root, "surface", "a", "--grid", "100000x100000", capsys=capsys)
    one_error(code, err, 2, "--grid", "1000000 cells")
    from landscape.api import calibration

    with pytest.raises(UsageError, match=f"^bins must be <= {BINS_MAX}"):
        calibration("a", root=str(root), bins=10**9)
    from landscape.analyze.specs import HessianConfig
    from landscape.api import hessian

    for refuse in (lambda: hessian("a@last", root=str(root), lanczos_steps=10**9),
                   lambda: HessianConfig(lanczos_steps=LANCZOS_STEPS_MAX + 1)):
        with pytest.raises(UsageError, match=f"^lanczos_steps must be <= {LANCZOS_STEPS_MAX}, got "):
            refuse()
    assert HessianConfig(lanczos_steps=LANCZOS_STEPS_MAX).lanczos_steps == LANCZOS_STEPS_MAX
    assert subset_value(300) == 300 and subset_value("0.3") == 0.3
    for bad in (0, -1, 1.5, float("nan"), "abc", True):
        with pytest.raises(UsageError):
            subset_value(bad)


# ------------------------------------------------------------------------ memory, distance, names (7)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400GB", "0"])
def test_ntk_max_memory_must_be_a_finite_positive_size(root, capsys, value):
    code, _, err = run_cli("--root", root, "ntk", "a", "--max-memory", value, capsys=capsys)
    one_error(code, err, 2, "memory budget")


def test_directions_distance_beyond_float32_and_non_finite_profiles(root, tmp_path, capsys):
    code, _, err = run_cli("--root", root, "directions", "a", "--distance", "1e39", capsys=capsys)
    one_error(code, err, 2, "--distance", "float32")
    # finite in float32, but every step away from A overflows the weights: a failure, not all-NaN results
    code, _, err = run_cli("--root", root, "directions", "a", "--distance", "3e38", "--directions", "2", "--points", "2",
                           "--no-figure", "-o", tmp_path / "d.h5", capsys=capsys)
    one_error(code, err, 1, "non-finite", "--distance")
    assert not (tmp_path / "d.h5").exists()


def test_output_names_are_checked_with_their_derived_files(root, tmp_path, capsys):
    name = "o" * 249 + ".h5"  # 252 bytes: legal itself, but o...o.png / -reliability.pdf / its temp file are not
    code, _, err = run_cli("--root", root, "interpolate", "a", "a", "--points", "2", "-o", tmp_path / name, capsys=capsys)
    one_error(code, err, 2, "no room for the figures")
    deep = tmp_path / "/".join(["d" * 200] * 21) / "r.h5"  # past PATH_MAX (4096 bytes)
    code, _, err = run_cli("--root", root, "interpolate", "a", "a", "--points", "2", "-o", deep, capsys=capsys)
    one_error(code, err, 2, "4096")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    ok = tmp_path / ("o" * 200 + ".h5")
    code, _, err = run_cli("--root", root, "interpolate", "a", "a", "--points", "2", "-o", ok, capsys=capsys)
    assert code == 0, err
    assert ok.exists() and ok.with_suffix(".png").exists()


def test_paths_past_the_system_limits_are_one_usage_line(root, tmp_path, capsys):
    deep = "/".join(["d" * 200] * 22)  # 4,421 bytes: past PATH_MAX wherever the command meets it
    for args in (("--root", deep, "store", "ls"), ("interpolate", f"{deep}/x.h5", "a"), ("show", f"{deep}/x.h5"),
                 ("import", f"{deep}/x.pt", "--model", "mlp", "--data", "digits", "--run", "q"),
                 ("store", "show", "n" * 300 + ".h5")):
        code, _, err = run_cli("--root", root, *args, capsys=capsys)
        line = one_error(code, err, 2, "file name too long", "255 a name and 4096 a path")
        assert len(line) < 300


def test_import_of_a_link_to_a_non_checkpoint_is_one_line(root, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "abc.pt").write_bytes(b"abc")  # torch's unpickler raised IndexError on this
    os.symlink(tmp_path / "notes.txt", tmp_path / "link.pt")
    os.symlink(tmp_path / "abc.pt", tmp_path / "link2.pt")
    for name in ("link.pt", "link2.pt", "abc.pt"):
        code, _, err = run_cli("--root", tmp_path / "ck", "import", tmp_path / name, "--run", "imp", "--model", "mlp", "--data", "digits",
                               capsys=capsys)
        line = one_error(code, err, 1, "not a torch.save() file")
        assert ("a link to" in line) == name.startswith("link")
    (tmp_path / "pickle.pt").write_bytes(b"\x80\x02abc")  # a pickle header, then garbage: IndexError in torch
    os.symlink(tmp_path / "pickle.pt", tmp_path / "link3.pt")
    code, _, err = run_cli("--root", tmp_path / "ck", "import", tmp_path / "link3.pt", "--run", "imp", "--model", "mlp",
                           "--data", "digits", capsys=capsys)
    one_error(code, err, 1, "cannot read", "link3.pt as a PyTorch file")
    assert not (tmp_path / "ck" / "imp").exists()


# ------------------------------------------------------------------------------------------- manifest (8)


@pytest.mark.parametrize("manifest, field", [({}, "format"), ({"checkpoints": []}, "format")])
def test_an_empty_manifest_is_damage(root, tmp_path, capsys, manifest, field):
    import shutil

    store = tmp_path / "ck"
    shutil.copytree(root / "a", store / "a")
    (store / "a" / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_cli("--root", store, "store", "show", "a", capsys=capsys)
    one_error(code, err, 1, "damaged run manifest", f"'{field}' is missing")


def test_an_unhashed_checkpoint_entry_is_damage(root, tmp_path, capsys):
    import shutil

    store = tmp_path / "ck"
    shutil.copytree(root / "a", store / "a")
    path = store / "a" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["checkpoints"][0]["sha256"] = None
    path.write_text(json.dumps(manifest))
    code, _, err = run_cli("--root", store, "store", "show", "a", capsys=capsys)
    one_error(code, err, 1, "checkpoints[0].sha256", "64 hex digits")


# ------------------------------------------------------------------------------------------ scheduler (5)

BAD_ADDRESSES = ["tcp://", "tcp://[::1", "tcp://127.0.0.1:abc", "inproc://x", "127.0.0.1:8786", "tcp://:8786",
                 "tcp://127.0.0.1:0", "tcp://127.0.0.1:99999", "tcp://a b:1"]
SCHEDULER_COMMANDS = [path for path, command in walk(cli)
                      if any(isinstance(p, click.Option) and p.name == "scheduler" for p in command.params)]


def test_every_parallel_command_takes_a_checked_scheduler():
    names = {" ".join(p) for p in SCHEDULER_COMMANDS}
    assert {"batch", "figures", "surface", "instability", "directions", "norms", "hessian"} <= names


@pytest.mark.parametrize("address", BAD_ADDRESSES)
@pytest.mark.parametrize("path", SCHEDULER_COMMANDS, ids=[" ".join(p) for p in SCHEDULER_COMMANDS])
def test_a_malformed_scheduler_is_one_usage_line(tmp_path, capsys, path, address):
    command = dict(walk(cli))[path]
    arguments = ["x" for p in command.params if isinstance(p, click.Argument)]
    start = time.perf_counter()
    code, _, err = run_cli("--root", tmp_path, *path, "--scheduler", address, *arguments, capsys=capsys)
    one_error(code, err, 2, "--scheduler", "tcp://HOST:PORT")
    assert time.perf_counter() - start < 5


def test_an_unreachable_scheduler_is_one_failure_line_saying_how_long(root, tmp_path, capsys, monkeypatch):
    from landscape import bounds

    monkeypatch.setattr(bounds, "SCHEDULER_TIMEOUT_S", 1)
    (tmp_path / "spec.yaml").write_text("jobs:\n  i: {kind: interpolate, refs: [a, a], points: 2}\n")
    monkeypatch.chdir(tmp_path)
    for args in (("batch", "spec.yaml"), ("surface", "a", "--grid", "2x2")):
        code, _, err = run_cli("--root", root, *args, "--scheduler", "tcp://127.0.0.1:1", capsys=capsys)
        one_error(code, err, 1, "cannot reach the Dask scheduler at tcp://127.0.0.1:1 within 1 s")
        assert "dask: connecting to the scheduler at tcp://127.0.0.1:1 (waiting up to 1 s)" in err


# ------------------------------------------------------------------------- scheduler handshake (round four)


class Service:
    """A TCP service on 127.0.0.1 that is not a Dask scheduler: ``http`` answers whatever it reads with an HTTP 400
    (as a web server or the dashboard does), ``silent`` accepts and never answers, ``close`` closes at once."""

    def __init__(self, mode: str):
        import socket
        import threading

        self.mode, self.conns = mode, []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by stop()
                return
            self.conns.append(conn)
            if self.mode == "http":
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()
            elif self.mode == "close":
                conn.close()

    def stop(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture(params=["http", "silent", "close", "nothing"])
def not_dask(request, monkeypatch):
    """``(address, what the one line says)`` of a service that is not a Dask scheduler, with a 1 s deadline."""
    from landscape import bounds

    monkeypatch.setattr(bounds, "SCHEDULER_TIMEOUT_S", 1)
    if request.param == "nothing":  # a port with nothing listening
        yield "tcp://127.0.0.1:1", "cannot reach the Dask scheduler at tcp://127.0.0.1:1 within 1 s"
        return
    service = Service(request.param)
    expected = {"http": "is not a Dask scheduler", "silent": "did not answer within 1 s",
                "close": "closed the connection during Dask's handshake"}[request.param]
    yield service.address, f"{service.address} {expected}" if request.param != "silent" else expected
    service.stop()


def test_a_service_that_is_not_dask_is_one_line_from_every_command(root, tmp_path, capsys, monkeypatch, not_dask):
    """The whole handshake (connect, Dask's greeting, the identity reply) has the deadline, not the connect alone:
    against an HTTP server `batch` waited for ever and an HTTP 400 was a 3.07 EiB allocation traceback."""
    address, expected = not_dask
    (tmp_path / "spec.yaml").write_text("jobs:\n  i: {kind: interpolate, refs: [a, a], points: 2}\n")
    monkeypatch.chdir(tmp_path)
    for args in (("batch", "spec.yaml"), ("surface", "a", "--grid", "2x2", "--no-figure"),
                 ("figures", "watson-fig11", "--scale", "test", "--out", tmp_path / "f")):
        start = time.perf_counter()
        code, _, err = run_cli("--root", root, *args, "--scheduler", address, capsys=capsys)
        one_error(code, err, 1, expected)
        assert time.perf_counter() - start < 5, args
    assert not (tmp_path / "f").exists() and not (tmp_path / "results").exists()


def test_the_handshake_deadline_holds_in_the_api(root, not_dask):
    from landscape.api import surface
    from landscape.api.execution import ProcessPool, probe_scheduler
    from landscape.errors import LandscapeError

    address, expected = not_dask
    start = time.perf_counter()
    for call in (lambda: probe_scheduler(address), lambda: surface("a", root=str(root), grid="2x2", figure=False,
                                                                   scheduler=address),
                 lambda: ProcessPool(scheduler=address).map(abs, [(-1,)])):
        with pytest.raises(LandscapeError, match=re.escape(expected)):
            call()
    assert time.perf_counter() - start < 10


def test_tls_without_dask_tls_settings_is_one_usage_line(root, tmp_path, capsys):
    (tmp_path / "spec.yaml").write_text("jobs:\n  i: {kind: interpolate, refs: [a, a], points: 2}\n")
    for args in (("surface", "a", "--grid", "2x2"), ("batch", "spec.yaml")):
        start = time.perf_counter()
        code, _, err = run_cli("--root", root, *args, "--scheduler", "tls://127.0.0.1:1", capsys=capsys)
        one_error(code, err, 2, "tls:// needs Dask's TLS settings")
        assert time.perf_counter() - start < 5


def test_a_dask_worker_is_not_the_scheduler_and_a_scheduler_passes():
    distributed = pytest.importorskip("distributed")
    from landscape.api.execution import connect_client, probe_scheduler
    from landscape.errors import LandscapeError

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                                  host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                  silence_logs=logging.CRITICAL) as cluster:
        assert probe_scheduler(cluster.scheduler_address)["type"] == "Scheduler"
        client = connect_client(cluster.scheduler_address, set_as_default=False)
        try:
            assert client.submit(abs, -3).result() == 3
        finally:
            client.close()
        worker = next(iter(cluster.workers.values())).address
        with pytest.raises(LandscapeError, match=f"^{re.escape(worker)} is a Dask worker, not the scheduler"):
            probe_scheduler(worker)


# ------------------------------------------------------------------------------- data files (round four)


def _tensors(tmp_path, name="data.npz", x=None, y=None, **arrays):
    """An .npz of 60 train and 20 test examples, 10 classes, 1x8x8 inputs; ``x`` / ``y`` replace both splits'."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 1, 8, 8)).astype(np.float32) if x is None else x
    y = np.arange(60) % 10 if y is None else y
    a = {"x_train": x, "y_train": y, "x_test": x[:20], "y_test": y[:20], **arrays}
    np.savez(tmp_path / name, **a)
    return tmp_path / name


def test_uint8_images_become_floats_in_0_1_recorded_in_the_spec(tmp_path, capsys):
    """Images stored as bytes (the usual way) train; they used to be int64 token ids and a conv traceback."""
    from landscape.data import dataset_from_spec, load_dataset
    from landscape.errors import DataError

    x = np.random.default_rng(1).integers(0, 256, (60, 1, 8, 8), dtype=np.uint8)
    path = _tensors(tmp_path, x=x)
    data = load_dataset(str(path))
    assert data.x_train.dtype == torch.float32 and data.spec["inputs"] == "uint8/255"
    torch.testing.assert_close(data.x_train, torch.from_numpy(x).float() / 255, rtol=0, atol=0)
    assert 0 <= float(data.x_train.min()) and float(data.x_train.max()) <= 1
    assert torch.equal(dataset_from_spec(data.spec).x_train, data.x_train)
    with pytest.raises(DataError, match="records the inputs converted as stored, but this version reads them as "
                                        "uint8/255"):
        dataset_from_spec({k: v for k, v in data.spec.items() if k != "inputs"})
    code, out, err = run_cli("--root", tmp_path / "st", "train", "--data", path, "--model", "lenet", "--epochs", "1",
                             "--batch-size", "20", "--checkpoint-every", "none", "--run", "u8", capsys=capsys)
    assert code == 0, err
    # integer inputs of other widths stay token ids (int64), as before
    tokens = _tensors(tmp_path, "tokens.npz", x=np.arange(60 * 5).reshape(60, 5).astype(np.int32) % 7)
    assert load_dataset(str(tokens)).x_train.dtype == torch.int64 and "inputs" not in load_dataset(str(tokens)).spec


@pytest.mark.parametrize("labels, fragments", [
    ("stray", ("leave 245 of 256 classes without any example", "10, 11, 12, 13, 14, ...", "largest label 255",
               "'{\"num_classes\": 256}'")),
    ("one-based", ("leave 1 of 11 classes without any example (0;", "1-based labels? subtract 1")),
    ("huge", ("the largest label is 1,000,000,000, more than 100,000 classes",)),
    ("negative", ("labels must be class indices >= 0, got -1",)),
])
def test_labels_are_bounded_and_every_class_has_an_example(tmp_path, capsys, labels, fragments):
    y = np.arange(60) % 10
    y = {"stray": np.where(np.arange(60) == 7, 255, y), "one-based": y + 1, "huge": np.where(y == 3, 10**9, y),
         "negative": y - (np.arange(60) == 0)}[labels]
    path = _tensors(tmp_path, y=y)
    start = time.perf_counter()
    code, _, err = run_cli("--root", tmp_path / "st", "train", "--data", path, "--run", "r", capsys=capsys)
    one_error(code, err, 1, str(path), *fragments)
    assert time.perf_counter() - start < 10 and not (tmp_path / "st" / "r").exists()


def test_a_stated_class_count_allows_empty_classes(tmp_path):
    from landscape.data import dataset_from_spec, load_dataset
    from landscape.errors import DataError

    path = _tensors(tmp_path, y=np.where(np.arange(60) == 7, 12, np.arange(60) % 10))
    data = load_dataset(str(path), num_classes=13)
    assert data.num_classes == 13 and data.spec["options"] == {"num_classes": 13}
    assert dataset_from_spec(data.spec).num_classes == 13
    for bad, needle in ((12, "num_classes must be an integer >= 13"), (10**6, "more than 100,000 classes")):
        with pytest.raises(DataError, match=re.escape(needle)):
            load_dataset(str(path), num_classes=bad)
    with pytest.raises(DataError, match="has no option 'classes'; its option: num_classes"):
        load_dataset(str(path), classes=13)


def _npy(array) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_empty_and_non_zip_npz_files_are_one_line(tmp_path, capsys):
    """An empty .npz used to say "interrupted" (exit 130): numpy's EOFError reached click as an abort."""
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "text.npz").write_text("x_train,y_train\n1,2\n")
    (tmp_path / "array.npz").write_bytes(_npy(np.zeros(3)))  # np.save's .npy under an .npz name
    for name, what in (("empty.npz", "an empty file"), ("text.npz", "not a zip archive"),
                       ("array.npz", "not a zip archive")):
        code, _, err = run_cli("--root", tmp_path / "st", "train", "--data", tmp_path / name, "--run", "r",
                               capsys=capsys)
        one_error(code, err, 1, f"{tmp_path / name} is not an .npz file ({what})", "numpy.savez")


def test_impossible_headers_are_refused_before_anything_is_allocated(tmp_path, capsys):
    import zipfile

    import h5py

    y = np.arange(60) % 10
    header = __import__("io").BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (128_000_000_000,)})
    with zipfile.ZipFile(tmp_path / "claims.npz", "w") as z:  # 477 GiB claimed, 64 bytes held
        z.writestr("x_train.npy", header.getvalue() + b"\0" * 64)
        for key, value in (("y_train", y), ("x_test", np.zeros((20, 3), np.float32)), ("y_test", y[:20])):
            z.writestr(f"{key}.npy", _npy(value))
    with h5py.File(tmp_path / "sparse.h5", "w") as f:  # HDF5 may declare 3.6 TiB it never wrote
        f.create_dataset("x_train", shape=(10**12,), dtype="f4")
        f["y_train"], f["x_test"], f["y_test"] = y, np.zeros((20, 3), np.float32), y[:20]
    for name, fragments in (("claims.npz", ("the header of x_train claims shape [128000000000] of float32 (477 GiB) "
                                            "but the file holds 64 bytes of it",)),
                            ("sparse.h5", ("loading it needs about 7.28 TiB of memory", "are available"))):
        start = time.perf_counter()
        code, _, err = run_cli("--root", tmp_path / "st", "train", "--data", tmp_path / name, "--run", "r",
                               capsys=capsys)
        one_error(code, err, 1, str(tmp_path / name), *fragments)
        assert time.perf_counter() - start < 10


def test_non_finite_inputs_name_the_file_not_the_learning_rate(tmp_path, capsys):
    from landscape.data import load_dataset
    from landscape.errors import DataError

    x = np.random.default_rng(0).standard_normal((60, 1, 8, 8)).astype(np.float32)
    x[[5, 9], 0, 0, 0] = [np.nan, np.inf]
    path = _tensors(tmp_path, x=x)
    code, _, err = run_cli("--root", tmp_path / "st", "train", "--data", path, "--run", "r", capsys=capsys)
    one_error(code, err, 1, f"{path}: x_train holds 2 NaN or infinite value(s) in 2 example(s) (the first is "
                            f"example 5)", "numpy.nan_to_num")
    assert "--lr" not in err
    code_file = tmp_path / "nan_data.py"
    code_file.write_text("import torch\n\ndef make():\n    x = torch.zeros(8, 3)\n    x[2, 1] = float('nan')\n"
                         "    y = torch.arange(8) % 2\n    return x, y, x, y\n")
    with pytest.raises(DataError, match=r"^data set '.*nan_data.py:make': x_train holds 1 NaN"):
        load_dataset(f"{code_file}:make")


def _image_tree(root, bad: str):
    """``root/{train,test}/{a,b}/`` with three 6x6 PNGs each, and one bad file ``train/a/bad.png``."""
    import struct
    import zlib

    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(root / split / label / f"{i}.png")
    path = root / "train" / "a" / "bad.png"
    if bad == "zero-byte":
        path.write_bytes(b"")
    elif bad == "not-an-image":
        path.write_text("hello\n")
    elif bad in ("truncated", "corrupt"):
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
        data = bytearray(path.read_bytes())
        if bad == "corrupt":
            data[30:60] = b"\xff" * 30
        path.write_bytes(bytes(data if bad == "corrupt" else data[:300]))
    else:  # a 60000 x 60000 PNG in 100 bytes: PIL's DecompressionBombError
        def chunk(kind: bytes, body: bytes) -> bytes:
            return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8, 0, 0, 0, 0))
                         + chunk(b"IDAT", zlib.compress(b"\0" * 100)) + chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize("bad, reason", [
    ("zero-byte", "an empty file"), ("not-an-image", "not an image PIL can read"),
    ("truncated", "image file is truncated"), ("corrupt", "not an image PIL can read"),
    ("bomb", "more pixels than PIL's limit of 89,478,485 (a decompression bomb?)"),
])
def test_a_bad_image_in_an_image_folder_is_one_line_naming_it(tmp_path, capsys, bad, reason):
    from landscape.data import load_dataset
    from landscape.errors import DataError

    path = _image_tree(tmp_path / "images", bad)
    start = time.perf_counter()
    code, _, err = run_cli("--root", tmp_path / "st", "train", "--data", "imagefolder", "--data-root",
                           tmp_path / "images", "--model", "mlp", "--run", "r", capsys=capsys)
    one_error(code, err, 1, f"image {path}", reason, "replace or remove it" if bad != "bomb" else "shrink it")
    assert time.perf_counter() - start < 10
    with pytest.raises(DataError, match=re.escape(str(path))):
        load_dataset("imagefolder", data_root=tmp_path / "images")


# ---------------------------------------------------------------------------- user models' forward (round four)

BAD_MODELS = '''\
import math

import torch
from torch import nn


def wrong_classes(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 8), nn.ReLU(), nn.Linear(8, 3))


def wrong_input(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(100, 8), nn.ReLU(), nn.Linear(8, num_classes))


class Raising(nn.Module):
    def __init__(self, n, k):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(n, k))

    def forward(self, x):
        h = self.body(x)
        raise ValueError("forward is not written yet")


def raising(input_shape, num_classes):
    return Raising(math.prod(input_shape), num_classes)


def lazy(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(16), nn.ReLU(), nn.Linear(16, num_classes))


def lazy_materialised(input_shape, num_classes):
    model = lazy(input_shape, num_classes)
    model(torch.zeros(1, *input_shape))
    return model


class Pair(nn.Module):
    def __init__(self, n, k):
        super().__init__()
        self.fc = nn.Linear(n, k)

    def forward(self, x):
        return self.fc(x.flatten(1)), x


def returns_pair(input_shape, num_classes):
    return Pair(math.prod(input_shape), num_classes)


def exits(input_shape, num_classes):
    raise SystemExit(0)
'''


@pytest.fixture
def bad_models(tmp_path):
    path = tmp_path / "bad_models.py"
    path.write_text(BAD_MODELS)
    return path


@pytest.mark.parametrize("factory, fragments", [
    ("wrong_classes", ("returns float32 logits of shape [2, 3] (its last layer '3': Linear(in_features=8, "
                       "out_features=3, bias=True)) for a batch of [2, 1, 8, 8]", "has 10 classes",
                       "must return floats of shape [2, 10]", "num_classes argument")),
    ("wrong_input", ("fails on a batch of shape [2, 1, 8, 8] (float32) in layer '1' (Linear(in_features=100, "
                     "out_features=8, bias=True)) given input [2, 64]",
                     "mat1 and mat2 shapes cannot be multiplied (2x64 and 100x8)")),
    ("raising", ("in its own forward code, after layer 'body' (Sequential) returned [2, 10]: ValueError: forward is "
                 "not written yet",)),
    ("lazy", ("layer '1' (LazyLinear) has uninitialised weight, bias", "run the model once on a dummy batch")),
    ("returns_pair", ("returns a tuple, not a tensor of logits (N, 10)",)),
    ("exits", ("the factory called sys.exit(0); it must return a model",)),
])
def test_a_model_that_fails_on_its_data_is_one_line_naming_the_layer(tmp_path, capsys, bad_models, factory, fragments):
    from landscape.errors import ModelError

    ref = f"{bad_models}:{factory}"
    start = time.perf_counter()
    code, _, err = run_cli("--root", tmp_path / "st", "train", "--model", ref, "--subset", "100", "--run", "r",
                           capsys=capsys)
    one_error(code, err, 1, f"model '{ref}'", *fragments)
    assert time.perf_counter() - start < 10 and not (tmp_path / "st" / "r").exists()
    with pytest.raises(ModelError, match=re.escape(fragments[0])):
        api_train(TrainConfig(model=ref, seed=0, run="r", **TINY), root=tmp_path / "st")
    torch.save({}, tmp_path / "w.pt")  # import meets the data too, before it reads any weights
    code, _, err = run_cli("--root", tmp_path / "st", "import", tmp_path / "w.pt", "--model", ref, "--data", "digits",
                           "--run", "imp", capsys=capsys)
    one_error(code, err, 1, *fragments)
    assert not (tmp_path / "st" / "imp").exists()


def test_the_check_forward_changes_no_weights_mode_or_random_stream(tmp_path, bad_models):
    """The check runs in eval mode, without gradients, in a fork of the random generators: training numbers are
    those of a run without it (the goldens hold), and a factory that materialises its Lazy layers trains."""
    from landscape.models import check_forward

    class Noisy(torch.nn.Module):  # draws random numbers in every forward, BatchNorm statistics in training
        def __init__(self):
            super().__init__()
            self.norm, self.fc = torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 10)

        def forward(self, x):
            return self.fc(self.norm(x.flatten(1)) + torch.randn(len(x), 64))

    torch.manual_seed(0)
    model = Noisy()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 1, 8, 8)
    state = torch.random.get_rng_state()
    check_forward(model, x, 10)
    assert model.training and torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    model.eval()
    check_forward(model, x, 10)
    assert not model.training
    run = api_train(TrainConfig(model=f"{bad_models}:lazy_materialised", seed=0, run="lz", **TINY),
                    root=tmp_path / "st")
    assert run.checkpoints()


# ------------------------------------------------------------------------------ sys.exit at import (round four)


@pytest.mark.parametrize("body, fragment", [
    ("import sys\nsys.exit(0)\n", "called sys.exit(0) while being imported"),
    ("raise SystemExit('bye')\n", "called sys.exit('bye') while being imported"),
    ("raise GeneratorExit\n", "failed: GeneratorExit"),
])
def test_sys_exit_at_import_is_an_error_never_a_success(tmp_path, capsys, monkeypatch, body, fragment):
    """``sys.exit(0)`` in a model file's top level made ``train`` exit 0 having written nothing."""
    from landscape import plugins

    (tmp_path / "quits.py").write_text(body + "def make(input_shape, num_classes):\n    return None\n")
    for option in ("--model", "--data"):
        code, _, err = run_cli("--root", tmp_path / "st", "train", option, tmp_path / "quits.py:make", "--run", "r",
                               capsys=capsys)
        one_error(code, err, 2, "quits.py", fragment)
    monkeypatch.syspath_prepend(str(tmp_path))  # the module form too
    with pytest.raises(plugins.PluginError, match=re.escape(fragment)):
        plugins.load("quits:make")
    assert not (tmp_path / "st" / "r").exists()
