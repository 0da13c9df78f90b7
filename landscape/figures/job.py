"""The job kind ``figures`` (:mod:`landscape.kinds`): one paper-figure recipe at one scale as a batch job, its
outputs in the job's directory and its runs in the batch's store (reused by any later job or rerun with the same
configuration)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from landscape.api.jobkind import JobKind, files_under
from landscape.errors import UsageError
from landscape.figures import figures


@dataclass(frozen=True)
class FigureJob:
    """One recipe at one scale (``landscape figures RECIPE --scale S``)."""

    recipe: str
    scale: str = "cpu"
    rerun: bool = False
    data_root: str | None = None

    def validate(self) -> FigureJob:
        from landscape.figures import registry
        from landscape.figures.recipe import SCALES

        if self.recipe not in registry.names():
            raise UsageError(f"'recipe': unknown recipe {self.recipe!r}; see `landscape figures --list`")
        if self.scale not in SCALES:
            raise UsageError(f"'scale' must be one of {', '.join(SCALES)}, got {self.scale!r}")
        return self


def _run(job: FigureJob, *, root: Path, out: Path | None = None) -> Any:
    from landscape.figures import registry
    from landscape.figures.recipe import make

    return make(registry.get(job.recipe), scale=job.scale, out=out if out is not None else "figures-out", root=root,
                data_root=job.data_root, rerun=job.rerun)


def _outcome(made: Any, root: Path, out: Path | None) -> tuple[dict[str, Any], list[Path]]:
    """The verdict (1 held, 0 did not hold, NaN inconclusive) and its part counts; the files under ``out``."""
    numbers = {"verdict": {True: 1.0, False: 0.0, None: math.nan}[made.verdict.held]}
    numbers.update({f"parts_{k.replace(' ', '_')}": v for k, v in made.verdict.numbers.items()
                    if k in ("held", "did not hold", "inconclusive")})
    return numbers, files_under(out if out is not None else Path(made.path).parent)


JOB = JobKind(name="figures", config=FigureJob, run=_run, required=("recipe",), outcome=_outcome, api=figures,
              doc="Make a paper figure by recipe: train, analyse, plot, judge the claim.")
