"""A toy analysis written exactly as docs/ARCHITECTURE.md says ("How to add an analysis"; test_registry registers
it, test_kinds checks that it is the recipe line for line): the L2 norm of the parameters, and the loss on a
subset, at every checkpoint of a run."""

from dataclasses import dataclass, field

import torch

from landscape.analyze.registry import Analysis
from landscape.options import Options, option
from landscape.results import StoredResult, stored

KIND = "toy-norm"


@dataclass(frozen=True)
class ToyConfig(Options):                # coerced, then validate(), once, when made
    scale: float = option(1.0, "Multiply the norm by this.", min=0, min_open=True)  # -> --scale (FLOAT RANGE x>0)
    layers: tuple[str, ...] | None = option(None, "Parameter names to include (default: all).")  # -> --layers A,B,...
    split: str = option("train", "Data split of the loss.", choices=("train", "test"))  # -> --split [train|test]
    subset: int = option(64, "Examples of the loss.", min=1)                          # -> --subset (x>=1)
    subset_seed: int = option(0, "Seed of the examples.")                            # -> --subset-seed SEED


@dataclass
class ToyRow:                             # one checkpoint; scalars become table columns
    ref: str
    epoch: float
    norm: float
    loss: float


@dataclass
class ToyResult(StoredResult):           # to_hdf5/from_hdf5, inputs, path, figures come with the base
    KIND = KIND
    CONFIG = ToyConfig
    rows: list[ToyRow] = stored("table", count="checkpoints")   # one dataset per column
    config: ToyConfig = field(default_factory=ToyConfig)  # -> the file's params


def compute(point, config: ToyConfig) -> ToyRow:
    """The parameters' L2 norm times ``scale``, and the mean loss on a subset. Pure: point.model(), point.split()."""
    model = point.model()
    tensors = [p.detach().double().ravel() for n, p in model.named_parameters()
               if config.layers is None or n in config.layers]
    x, y = point.split(config.split, config.subset, config.subset_seed)  # the one sampler, recorded in the result
    with torch.no_grad():
        loss = float(torch.nn.functional.cross_entropy(model(x), y))
    norm = config.scale * float(torch.linalg.vector_norm(torch.cat(tensors)))
    return ToyRow(point.ref, point.epoch, norm, loss)


def collect(rows, config, run_options) -> ToyResult:
    return ToyResult(rows=rows, config=config)


SPEC = Analysis(
    name=KIND, config=ToyConfig, compute=compute, collect=collect, result=ToyResult, inputs="target",
    rows=lambda r: [vars(row) for row in r.rows], output=KIND,
    doc="Parameter norm at a checkpoint or along a run.",
)
