"""The gallery page: ``OUT/README.md`` with every recipe's figure, claim and computed verdict at one scale.

:func:`write_gallery` reads the summaries ``OUT/NAME/NAME-SCALE.h5`` of the registered recipes (a recipe not
made yet is listed as such) and writes, between the markers :data:`BEGIN` and :data:`END`, a verdict table and
one section per recipe (figure, claim, what was scaled down, the verdict with its numbers and rule, wall time and
code version of the run, how to run it at paper scale). Text outside the markers is kept, so a hand-written
discussion of what the numbers say survives regeneration. The output depends only on the summaries.
"""

from __future__ import annotations

import json
from pathlib import Path

from landscape.atomic import atomic_write
from landscape.figures import registry
from landscape.figures.recipe import paper_line, read_summary, summary_attrs, summary_path
from landscape.verdict import INVALID, POWER, underpowered

BEGIN = "<!-- gallery:begin (written by `landscape figures`; edit outside the markers) -->"
END = "<!-- gallery:end -->"
STATUS = {"held": "held", "did not hold": "**did not hold**", "inconclusive": "*inconclusive*"}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _parts(verdict, needs: int | None = None) -> list[str]:
    """The parts of a combined verdict (:func:`landscape.verdict.all_of`), each as ``status: claim (numbers)``,
    marked *underpowered* (:func:`landscape.verdict.underpowered`) where so."""
    out = []
    for p in verdict.parts:
        weak = underpowered(p, needs)
        out.append(f"{p.status}{f' (*underpowered*: {weak})' if weak else ''}: {p.claim} ({p.numbers_text()})")
    return out


def _needs(path: Path) -> int | None:
    import h5py

    with h5py.File(path, "r") as f:
        raw = f.attrs.get("needs")
    return json.loads(raw) if raw is not None else None


def _section(name: str, recipe, out: Path, scale: str) -> tuple[str, str]:
    """``(table row, section)`` of one recipe."""
    path = summary_path(out, name, scale)
    title = f"{recipe.paper.split(' (')[0]}, {recipe.figure}"
    paper = f"`landscape figures {name} --scale paper --data-root DIR`: {paper_line(recipe)}."
    if not path.is_file():
        row = f"| [`{name}`](#{name}) | {_cell(title)} | {_cell(recipe.claim)} | not made | |"
        return row, f"### {name}\n\n{title}. Not made at `--scale {scale}` yet.\n\n**Paper scale.** {paper}\n"
    _, verdict, figures = read_summary(path)
    attrs = summary_attrs(path)
    png = [f for f in figures if f.suffix == ".png"]
    image = f"![{name}]({name}/{png[0].name})\n\n" if png and (out / name / png[0].name).is_file() else ""
    needs = _needs(path)
    parts = _parts(verdict, needs)
    judged = "<br>".join(parts) if parts else f"{verdict.numbers_text()}. Rule: {verdict.test}"
    status = STATUS[verdict.status]
    weak = sum(bool(underpowered(p, needs)) for p in (verdict.parts or (verdict,)))
    if verdict.note.startswith(INVALID):
        status = f"*{INVALID}*"
    elif any(p.note.startswith(INVALID) for p in verdict.parts):
        status += f" ({sum(p.note.startswith(INVALID) for p in verdict.parts)} parts: invalid regime)"
    if weak:
        status += f" ({weak} {'part' if weak == 1 else 'parts'} underpowered)"
    row = f"| [`{name}`](#{name}) | {_cell(title)} | {_cell(recipe.claim)} | {status} | {_cell(judged)} |"
    made = []
    if "seconds" in attrs:
        made.append(f"{float(attrs['seconds']):.0f} s")
    if "landscape_version" in attrs:
        made.append(f"landscape {attrs['landscape_version']}")
    if "created" in attrs:
        made.append(str(attrs["created"]))
    body = (f"### {name}\n\n{title}: {recipe.claim}.\n\n{image}"
            f"**Verdict: {verdict.status}.** {verdict.line()}\n\n"
            f"**Scaled down.** {recipe.scaled_down}. Settings: `{json.dumps(attrs['settings'], sort_keys=True)}`.\n\n"
            + (f"**Needs** {needs} seeds per tested part (the recipe's statement; fewer are marked underpowered).\n\n"
               if needs else "")
            + (f"**Last made** in {', '.join(made)} (runs already in the store are reused, so a remake times "
               "the analyses only).\n\n" if made else "")
            + f"**Paper scale.** {paper}\n")
    return row, body


def gallery_text(out: str | Path, scale: str = "cpu") -> str:
    """The generated part (between the markers) for the summaries under ``out``."""
    out = Path(out)
    rows, sections = [], []
    for name in registry.names():
        row, section = _section(name, registry.get(name), out, scale)
        rows.append(row)
        sections.append(section)
    made = sum("not made" not in r for r in rows)
    head = (f"## Verdicts at `--scale {scale}` ({made} of {len(rows)} recipes made)\n\n"
            "Each verdict is computed by the recipe from its own numbers (`landscape.verdict`, every test at alpha "
            "0.05): held, did not hold, or inconclusive (the test does not reject either way, the spread could not "
            "be measured, or -- *inconclusive (invalid regime)* -- a model it rests on failed the recipe's "
            f"validity gate). A part is marked *underpowered* when its test's power at the observed effect is below "
            f"{POWER:g} (a rerun with the same n would often not reject) or it has fewer seeds than the recipe says it "
            "needs; where a recipe states a minimum effect (`min effect`), the test is of a difference beyond it.\n\n"
            "| Recipe | Paper, figure | Claim | Verdict | Numbers and rule |\n|---|---|---|---|---|\n")
    return "\n".join([BEGIN, head + "\n".join(rows) + "\n", *sections, END]) + "\n"


def write_gallery(out: str | Path, scale: str = "cpu") -> Path:
    """Write (or update between the markers) ``out/README.md``; returns its path."""
    out = Path(out)
    path = out / "README.md"
    text = gallery_text(out, scale)
    old = path.read_text() if path.is_file() else ""
    if BEGIN in old and END in old:
        before, rest = old.split(BEGIN, 1)
        after = rest.split(END, 1)[1].lstrip("\n")
        new = before + text + ("\n" + after if after else "")
    else:
        intro = (f"# Paper figures at `--scale {scale}`\n\nRegenerate with `make figures` (= `landscape figures all "
                 f"--scale {scale} --out {out}/`); finished recipes with unchanged settings are skipped.\n\n")
        new = (old + "\n" if old else intro) + text
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: tmp.write_text(new))
    return path
