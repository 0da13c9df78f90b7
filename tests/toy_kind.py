"""A toy job kind written exactly as docs/ARCHITECTURE.md says ("How to add a job kind"; test_kinds registers it):
a checkpoint's weights times a factor, written as a new run whose parent is the checkpoint."""

from dataclasses import dataclass
from pathlib import Path

from landscape.api.jobkind import JobKind, files_under, run_option
from landscape.options import option
from landscape.store import Store


@dataclass
class ScaleConfig:
    ref: str                                                                   # positional: `toy-scale REF`
    run: str | None = option(None, "Name of the new run (default: generated).")
    factor: float = option(2.0, "Multiply every weight by this.", min=0, min_open=True)


@dataclass
class Scaled:
    run: str
    source: str
    factor: float
    checkpoint: Path


def scale(config: ScaleConfig, *, root: Path, out: Path | None = None) -> Scaled:
    store = Store(root)
    source = store.load(config.ref)
    lineage = {"parent_run": source.run, "parent_step": source.step, "parent_ref": config.ref,
               "parent_sha256": source.sha256}
    with store.create_run(config.run, config={"command": "toy-scale", "ref": config.ref, "factor": config.factor},
                          seeds={}, lineage=lineage, model_spec=source.model_spec, data_spec=source.data_spec) as new:
        path = new.save_checkpoint({k: config.factor * v for k, v in source.state_dict.items()}, step=0, epoch=0.0)
    return Scaled(new.name, config.ref, config.factor, path)


JOB = JobKind(
    name="toy-scale", config=ScaleConfig, run=scale, arguments=("ref",), required=("ref", "run"),
    produces=run_option,
    outcome=lambda made, root, out: ({"factor": made.factor}, files_under(made.checkpoint.parent)),
    rows=lambda made: [{"run": made.run, "source": made.source, "factor": made.factor}],
    notes=lambda made: [f"checkpoint: {made.checkpoint}"],
    doc="Scale a checkpoint's weights by a factor into a new run.",
)
