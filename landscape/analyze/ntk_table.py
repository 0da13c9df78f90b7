"""Bu et al. (2023) Table 1 measured (``landscape ntk-table``): for every clipping norm and style, is the
clipped NTK symmetric and positive, with the numbers behind each answer (one Gram computation a
checkpoint)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
from torch import nn

from landscape.analyze.ntk_kernels import (
    clip_layer_kernels,
    kernel_properties,
    layer_kernels,
    model_and_examples,
    yes_no,
)
from landscape.analyze.specs import NTKTableConfig
from landscape.results import StoredResult, stored, write_csv


@dataclass
class NTKTableRow:
    """One cell row of the measured Table 1: a clipping norm and style (style "none": no clipping)."""

    step: int
    epoch: float
    max_grad_norm: float  # NaN for the unclipped row
    style: str
    fraction_clipped: float
    symmetric: bool
    asymmetry: float
    positive_quadratic: bool
    min_sym_eig: float
    n_negative_sym_eigs: int
    positive_eigenvalues: bool
    min_real_eig: float
    max_abs_imag_eig: float
    n_negative_real_eigs: int
    norm: float


TABLE_COLUMNS = tuple(f.name for f in fields(NTKTableRow))


@dataclass
class NTKTable(StoredResult):
    """Bu et al. Table 1 measured: per checkpoint, clipping norm and style, the properties of the kernel."""

    KIND = "ntk-table"
    CONFIG = NTKTableConfig

    config: NTKTableConfig
    rows: list[NTKTableRow] = stored("table", count="n_rows")
    csv_path: Path | None = stored("skip", default=None)  # the companion CSV, not in the file

    def to_csv(self, path: str | Path) -> Path:
        records = [{c: getattr(r, c) for c in TABLE_COLUMNS} for r in self.rows]
        self.csv_path = write_csv(path, records, TABLE_COLUMNS, nan="nan")
        return self.csv_path


def ntk_table(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: NTKTableConfig, *, step: int = 0,
              epoch: float = float("nan")) -> NTKTable:
    """Bu et al. Table 1 on one model: one Gram computation, then no clipping and every (norm, style)."""
    lk = layer_kernels(model, x, y, kind=config.kernel, layers=config.layers, strategy=config.strategy,
                       max_memory=config.max_memory, precision=config.precision)

    def row(norm: float, style: str, A: np.ndarray, frac: float) -> NTKTableRow:
        p = kernel_properties(A)
        return NTKTableRow(step=step, epoch=epoch, max_grad_norm=norm, style=style, fraction_clipped=frac,
                           **{k: getattr(p, k) for k in TABLE_COLUMNS[5:]})

    rows = [row(float("nan"), "none", lk.K, 0.0)]
    for c in config.max_grad_norms:
        for style in config.clip_styles:
            ck = clip_layer_kernels(lk, style=style, max_grad_norm=c, clip_fn=config.clip_fn)
            rows.append(row(c, style, ck.A, ck.fraction_clipped))
    return NTKTable(config=config, rows=rows)


def table_point(point, config: NTKTableConfig) -> list[NTKTableRow]:
    """One checkpoint's rows of the measured Table 1."""
    model, x, y, _ = model_and_examples(point, config)
    return ntk_table(model, x, y, config, step=point.step, epoch=float(point.epoch)).rows


def _table_rows(t: NTKTable) -> list[dict]:
    return [{"step": r.step, "epoch": r.epoch, "C": None if r.style == "none" else r.max_grad_norm, "style": r.style,
             "clipped": r.fraction_clipped, "symmetric": yes_no(r.symmetric), "asymmetry": r.asymmetry,
             "pos_quad": yes_no(r.positive_quadratic), "min_sym_eig": r.min_sym_eig,
             "pos_eig": yes_no(r.positive_eigenvalues), "min_re_eig": r.min_real_eig, "max_|im|": r.max_abs_imag_eig}
            for r in t.rows]


def collect_table(rows: list, config: NTKTableConfig, _) -> NTKTable:
    return NTKTable(config=config, rows=[r for rs in rows for r in rs])


def _table_details(t: NTKTable) -> dict:
    return {"csv": str(t.csv_path), "rows": [vars(r) for r in t.rows]}
