"""Out-of-core Gram blocks: gram_tiles and gram_blocks_to_hdf5 against gram_blocks (the in-memory reference),
for every kernel kind, chunk sizes that do and do not divide n, and the file's layout and safety."""

import json

import h5py
import numpy as np
import pytest
import torch

from landscape.errors import OutputPathError, UsageError
from landscape.gram import gram_blocks, gram_tiles
from landscape.gram_hdf5 import gram_blocks_to_hdf5
from landscape.models import build_model
from landscape.results import is_result_file


@pytest.fixture(scope="module")
def case():
    torch.manual_seed(0)
    model = build_model("lenet", input_shape=(1, 8, 8), num_classes=10).double()
    g = torch.Generator().manual_seed(1)
    return model, torch.randn(11, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 10, (11,), generator=g)


def assemble(tiles, rows):
    out = {}
    for r, c, name, tile in tiles:
        k = out.setdefault(name, torch.full((rows, rows), float("nan"), dtype=torch.float64))
        k[r, c] = tile
        k[c, r] = tile.T
    return out


@pytest.mark.parametrize("kind", ["loss-grad", "output", "output-trace"])
@pytest.mark.parametrize("chunk", [4, 11])
def test_tiles_assemble_to_gram_blocks(case, kind, chunk):
    model, x, y = case
    n = 5 if kind == "output" else 11  # the output kernel is (n M) x (n M)
    ref = gram_blocks(model, x[:n], y[:n], kind=kind)
    rows = next(iter(ref.values())).shape[0]
    model.train()
    tiles = list(gram_tiles(model, x[:n], y[:n], kind=kind, chunk=chunk))
    assert model.training  # eval only while the tiles are made
    assert all(r.start <= c.start for r, c, _, _ in tiles)
    got = assemble(tiles, rows)
    assert list(got) == list(ref)
    for k in ref:
        assert not got[k].isnan().any(), k
        torch.testing.assert_close(got[k], ref[k], rtol=1e-10, atol=1e-12, msg=k)


def test_hdf5_file_holds_every_block_and_their_sum(case, tmp_path):
    model, x, y = case
    ref = gram_blocks(model, x, y)
    path = gram_blocks_to_hdf5(model, x, y, tmp_path / "k" / "gram.h5", chunk=3)
    with h5py.File(path) as f:
        assert json.loads(f.attrs["layers"]) == list(ref)
        assert f.attrs["kind"] == "loss-grad" and f.attrs["n"] == 11 and f.attrs["rows"] == 11
        for k, v in ref.items():
            np.testing.assert_allclose(f["blocks"][k][()], v.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(f["K"][()], sum(ref.values()).numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(f["K"][()], f["K"][()].T)
    assert is_result_file(path)
    gram_blocks_to_hdf5(model, x, y, path, chunk=5, total=False)  # a gram file may be replaced
    with h5py.File(path) as f:
        assert "K" not in f and f.attrs["chunk"] == 5


def test_output_kernel_rows_are_sample_major(case, tmp_path):
    model, x, _ = case
    ref = gram_blocks(model, x[:3], kind="output")
    path = gram_blocks_to_hdf5(model, x[:3], None, tmp_path / "out.h5", kind="output", chunk=2)
    with h5py.File(path) as f:
        assert f.attrs["rows"] == 30 and f["K"].shape == (30, 30)
        np.testing.assert_allclose(f["K"][()], sum(ref.values()).numpy(), rtol=1e-10, atol=1e-12)


def test_bad_options_are_one_line_errors_and_leave_no_file(case, tmp_path):
    model, x, y = case
    with pytest.raises(UsageError, match="chunk must be a positive integer"):
        next(gram_tiles(model, x, y, chunk=0))
    with pytest.raises(UsageError, match="must end in .h5"):
        gram_blocks_to_hdf5(model, x, y, tmp_path / "gram.npy")
    with pytest.raises(UsageError, match="needs labels"):
        gram_blocks_to_hdf5(model, x, None, tmp_path / "nolabels.h5")
    assert not (tmp_path / "nolabels.h5").exists() and not list(tmp_path.glob(".*tmp"))
    other = tmp_path / "data.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(OutputPathError, match="refusing to overwrite"):
        gram_blocks_to_hdf5(model, x, y, other)


def test_interrupted_write_leaves_no_partial_file(case, tmp_path, monkeypatch):
    model, x, y = case
    import landscape.gram_hdf5 as gh

    def broken(*a, **k):
        yield from gram_tiles(model, x[:4], y[:4], chunk=2)
        raise KeyboardInterrupt

    monkeypatch.setattr(gh, "gram_tiles", broken)
    with pytest.raises(KeyboardInterrupt):
        gh.gram_blocks_to_hdf5(model, x, y, tmp_path / "g.h5")
    assert list(tmp_path.iterdir()) == []
