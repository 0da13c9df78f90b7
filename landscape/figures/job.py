"""The job kind ``figures`` (:mod:`landscape.kinds`): paper-figure recipes by name. A batch job makes one
``recipe`` at one scale into the job's directory, its runs in the batch's store; the command (generated from
:class:`FigureJob`) also takes names / ``all``, ``--out``, ``--workers``, ``--scheduler``, ``--list``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from landscape import progress as display
from landscape.api.jobkind import JobKind, files_under
from landscape.bounds import scheduler_note
from landscape.errors import RecipeError, UsageError
from landscape.figures import figures
from landscape.figures.registry import SCALES
from landscape.options import DEVICE_HELP, SOURCE_HELP, option

_COMMAND_ONLY = ("names", "listing", "out", "workers", "scheduler", "compare")


@dataclass(frozen=True)
class FigureJob:
    """Recipes at one scale: ``recipe`` (a batch job's one recipe) or ``names`` (the command's)."""

    names: tuple[str, ...] | None = option(None, "Recipe names, or `all`.")
    listing: bool = option(False, "List every recipe with its paper figure and claim.", flag="--list")
    scale: str = option("cpu", "test: seconds; cpu: minutes on a laptop; paper: the paper's data set and model (GPU).",
                        choices=SCALES)
    out: str = option("figures-out", "Output folder (one subfolder per recipe: figure PNG + PDF, HDF5 summary).",
                      kind="directory")
    workers: int = option(1, "Worker processes.", min=1)
    data_root: str | None = option(None, SOURCE_HELP["data_root"], kind="directory")
    device: str = option("auto", DEVICE_HELP, kind="device")
    rerun: bool = option(False, "Make finished recipes again (their trained runs are still reused).")
    scheduler: str | None = option(None, "Run the analyses' parallel parts on this Dask scheduler instead of "
                                         "--workers.", kind="scheduler")
    compare: str | None = option(None, "Compare each recipe's verdict with its summary in this folder (e.g. the "
                                       "gallery made on another machine or kernels): per part both outcomes and "
                                       "p-values, and which moved.", kind="directory")
    recipe: str | None = option(None, "The recipe of a batch job.", cli=False)

    def validate(self) -> FigureJob:
        from landscape.figures import registry

        if self.recipe is not None and self.recipe not in registry.names():
            raise UsageError(f"'recipe': unknown recipe {self.recipe!r}; see `landscape figures --list`")
        if self.scale not in SCALES:
            raise UsageError(f"'scale' must be one of {', '.join(SCALES)}, got {self.scale!r}")
        return self


@dataclass
class Figures:
    """What the command did: the recipes made (or skipped) and the gallery page, or the list of recipes."""

    made: list[Any] = dataclasses.field(default_factory=list)
    gallery: Path | None = None
    listing: list[str] = dataclasses.field(default_factory=list)


def _run(job: FigureJob, *, root: Path, out: Path | None = None) -> Any:
    from landscape.figures import registry
    from landscape.figures.recipe import make
    from landscape.runtime import using_device

    with using_device(job.device):
        return make(registry.get(job.recipe), scale=job.scale, out=out if out is not None else "figures-out",
                    root=root, data_root=job.data_root, rerun=job.rerun)


def _command(job: FigureJob, *, root: Path, progress: bool | None, report: Callable[[str], None] | None) -> Figures:
    """``--list``, or the named recipes (``all``: every one); the recipes that finished before a failure are
    the error's ``partial`` result (the command prints them before the error line)."""
    from landscape.figures import registry

    if job.listing:
        return Figures(listing=[f"{name:14s} {r.paper.split(' (')[0]}, {r.figure}: {r.claim}"
                                for name, r in ((n, registry.get(n)) for n in registry.names())])
    if not job.names:
        raise UsageError("name a recipe (or `all`); `landscape figures --list` shows them")
    if job.scheduler is not None and report is not None:
        report(scheduler_note(job.scheduler))
    try:
        made = figures(list(job.names), scale=job.scale, out=job.out, root=root, workers=job.workers,
                       data_root=job.data_root, rerun=job.rerun, scheduler=job.scheduler, report=display.note,
                       compare=job.compare, device=job.device)
    except RecipeError as exc:
        exc.partial = Figures(made=exc.made)
        raise
    return Figures(made=made, gallery=Path(job.out) / "README.md")


def _notes(done: Figures) -> list[str]:
    """The recipe list, or per recipe whether it was made and its verdict, then the gallery page."""
    lines = list(done.listing)
    for m in done.made:
        lines.append(f"{m.name} [{m.scale}] {'skipped (finished)' if m.skipped else 'made'}: {m.path}")
        lines.append(f"  {dataclasses.replace(m.verdict, note='').line()}")
    for m in done.made:
        lines += m.comparison.lines() if m.comparison is not None else []
    return lines + ([f"gallery: {done.gallery}"] if done.gallery is not None else [])


def _details(done: Figures) -> dict[str, Any]:
    """``--json``: the recipe list, or each recipe made (or skipped) with its verdict, and the gallery page."""
    made = [{"name": m.name, "scale": m.scale, "skipped": m.skipped, "path": str(m.path), "held": m.verdict.held,
             "verdict": dataclasses.replace(m.verdict, note="").line(),
             **({"comparison": m.comparison.to_dict()} if m.comparison is not None else {})} for m in done.made]
    return {"recipes": made, "gallery": None if done.gallery is None else str(done.gallery), "listing": done.listing}


def _outcome(made: Any, root: Path, out: Path | None) -> tuple[dict[str, Any], list[Path]]:
    """The verdict (1 held, 0 did not hold, NaN inconclusive) and its part counts; the files under ``out``."""
    numbers = {"verdict": {True: 1.0, False: 0.0, None: math.nan}[made.verdict.held]}
    numbers.update({f"parts_{k.replace(' ', '_')}": v for k, v in made.verdict.numbers.items()
                    if k in ("held", "did not hold", "inconclusive")})
    return numbers, files_under(out if out is not None else Path(made.path).parent)


def _build(options: dict[str, Any]) -> FigureJob:
    """A batch job's options (checked by the batch against their annotations) or the command's (by click) as the
    job, checked by :meth:`FigureJob.validate` (a batch spec's message names ``'recipe'``/``'scale'``)."""
    return FigureJob(**options).validate()


JOB = JobKind(name="figures", config=FigureJob, run=_run, arguments=("names",), required=("recipe",),
              skip=_COMMAND_ONLY, build=_build, outcome=_outcome, api=figures, command=_command, notes=_notes, details=_details,
              doc="""Make paper figures by recipe NAME (or `all`); finished recipes (same settings) are skipped on rerun.

              Example: landscape figures watson-fig5 --scale cpu --out figures/
              """)
