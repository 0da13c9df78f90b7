"""A toy analysis written exactly as docs/ARCHITECTURE.md says (test_registry registers it): the L2 norm of
the parameters at every checkpoint of a run."""

from dataclasses import dataclass, field

import torch

from landscape.analyze.registry import Analysis, option
from landscape.options import Options
from landscape.results import StoredResult, stored

KIND = "toy-norm"


@dataclass(frozen=True)
class ToyConfig(Options):
    scale: float = option(1.0, "Multiply the norm by this.", min=0, min_open=True)
    layers: tuple[str, ...] | None = option(None, "Parameter names to include (default: all).")


@dataclass
class ToyRow:
    ref: str
    epoch: float
    norm: float


@dataclass
class ToyResult(StoredResult):
    KIND = KIND
    CONFIG = ToyConfig

    rows: list[ToyRow] = stored("table", count="checkpoints")
    config: ToyConfig = field(default_factory=ToyConfig)


def compute(point, config: ToyConfig) -> ToyRow:
    """The parameters' L2 norm times ``scale``."""
    tensors = [p.detach().double().ravel() for n, p in point.model().named_parameters()
               if config.layers is None or n in config.layers]
    return ToyRow(point.ref, point.epoch, config.scale * float(torch.linalg.vector_norm(torch.cat(tensors))))


SPEC = Analysis(
    name="toy-norm", config=ToyConfig, compute=compute, collect=lambda rows, config, _: ToyResult(rows=rows,
                                                                                                  config=config),
    result=ToyResult, inputs="target", rows=lambda r: [vars(row) for row in r.rows], output="toy-norm",
    doc="Parameter norm at a checkpoint or along a run.",
)
