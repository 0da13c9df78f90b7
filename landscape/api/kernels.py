"""Empirical NTK under clipping from checkpoint references: ``ntk`` and ``ntk_table`` (Bu et al. Table 1).

A reference is ``PATH.h5`` or ``RUN@init|@last|@step=N|@epoch=E``; for :func:`ntk_table` a bare run name
means every checkpoint of the run (rows against epoch). The n examples are a seeded, stratified subset
of the checkpoint's data set (``data_spec``), split ``config.split``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from landscape.analyze.ntk import (
    NTKConfig,
    NTKResult,
    NTKTable,
    NTKTableConfig,
    compute_ntk,
    layer_kernels,
    table_rows,
)
from landscape.api._common import checkpoint_dataset, config_with, default_output, run_label
from landscape.api.geometry import Target, expand_target
from landscape.errors import UsageError
from landscape.results import InputRef
from landscape.store import Checkpoint, Store, load_checkpoint


@dataclass
class NTKOutput:
    """What :func:`ntk` returns: the result, where it was written, and the figure files."""

    result: NTKResult
    output: Path
    figures: list[Path] = field(default_factory=list)


@dataclass
class NTKTableOutput:
    """What :func:`ntk_table` returns: the table, its HDF5 and CSV files, and the figure files."""

    table: NTKTable
    output: Path
    csv: Path
    figures: list[Path] = field(default_factory=list)


def examples(ckpt: Checkpoint, n: int, seed: int, split: str, *, data_root: str | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """A seeded stratified subset of ``n`` examples of the checkpoint's data split: x, y, indices."""
    from landscape.data import subset_indices

    x, y = checkpoint_dataset(ckpt.data_spec, data_root, purpose="compute the NTK", source=str(ckpt.path)).split(split)
    if n > len(y):
        raise UsageError(f"--n {n} is more than the {len(y)} {split} examples of data set '{ckpt.data_spec.get('name')}'")
    idx = subset_indices(y, n, seed)
    return x[idx], y[idx], idx.numpy()


def _model(ckpt: Checkpoint, precision: str) -> torch.nn.Module:
    model = ckpt.build_model()
    return model.double() if precision == "double" else model


def ntk(ref: str, config: NTKConfig | None = None, *, root: str | os.PathLike = "checkpoints",
        output: str | os.PathLike | None = None, figure: bool = True, data_root: str | None = None,
        **options) -> NTKOutput:
    """The (clipped) empirical NTK at checkpoint ``ref``; writes ``output`` (default ``results/ntk-<run>.h5``).

    ``options`` override fields of ``config`` (:class:`NTKConfig`), e.g. ``ntk("run@last", clip="flat",
    max_grad_norm=0.1)``. With ``precision="double"`` the model itself runs in float64.
    """
    config = config_with(NTKConfig, config, options)
    store = Store(root)
    ckpt = store.load(ref)
    model = _model(ckpt, config.precision)
    x, y, idx = examples(ckpt, config.n, config.seed, config.split, data_root=data_root)
    x = x.to(next(model.parameters()).dtype)
    result = compute_ntk(model, x, y, config, indices=idx)
    path = Path(output) if output is not None else default_output(f"ntk-{run_label(ref)}")
    result.to_hdf5(path, inputs=[ckpt.input_ref()])
    figures = []
    if figure:
        from landscape.plots.ntk import plot_ntk

        figures = plot_ntk(result, path)
    return NTKOutput(result, path, figures)


def ntk_table(target: str, config: NTKTableConfig | None = None, *, root: str | os.PathLike = "checkpoints",
              output: str | os.PathLike | None = None, figure: bool = True, data_root: str | None = None,
              **options) -> NTKTableOutput:
    """Bu et al. Table 1 measured at a checkpoint, or along a run (a bare run name: every checkpoint).

    Writes ``output`` (HDF5, default ``results/ntk-table-<run>.h5``), the same rows as CSV beside it, and a
    figure. One Gram computation per checkpoint serves every clipping norm and style.
    """
    config = config_with(NTKTableConfig, config, options)
    store = Store(root)
    targets: list[Target] = expand_target(store, target)
    rows, inputs = [], []
    for t in targets:
        ckpt = load_checkpoint(t.path, ref=t.ref)
        model = _model(ckpt, config.precision)
        x, y, _ = examples(ckpt, config.n, config.seed, config.split, data_root=data_root)
        x = x.to(next(model.parameters()).dtype)
        lk = layer_kernels(model, x, y, kind=config.kind, layers=config.layers, strategy=config.strategy,
                           max_memory=config.max_memory, precision=config.precision)
        rows.extend(table_rows(lk, config, step=ckpt.step, epoch=float(ckpt.epoch)))
        inputs.append(InputRef(ref=t.ref, path=str(ckpt.path), sha256=ckpt.sha256))
    table = NTKTable(config=config, rows=rows)
    path = Path(output) if output is not None else default_output(f"ntk-table-{run_label(target)}")
    table.to_hdf5(path, inputs=inputs)
    csv_path = table.to_csv(path.with_suffix(".csv"))
    figures = []
    if figure:
        from landscape.plots.ntk import plot_ntk_table

        figures = plot_ntk_table(table, path)
    return NTKTableOutput(table, path, csv_path, figures)
