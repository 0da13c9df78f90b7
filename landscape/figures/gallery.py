"""The gallery page ``OUT/README.md``: every recipe's figure, claim and computed verdict at one scale, written
from the summaries alone between the markers :data:`BEGIN` and :data:`END` (text outside them is kept).
"""

from __future__ import annotations

import json
from pathlib import Path

from landscape.atomic import atomic_write
from landscape.figures import registry
from landscape.figures.recipe import paper_line, read_sensitivity, read_summary, summary_attrs, summary_path
from landscape.verdict import ALPHA, INVALID, POWER, bound_text, underpowered

BEGIN = "<!-- gallery:begin (written by `landscape figures`; edit outside the markers) -->"
END = "<!-- gallery:end -->"
STATUS = {"held": "held", "did not hold": "**did not hold**", "inconclusive": "*inconclusive*"}
MULTIPLICITY = (f"Combined claims: held only when every part holds at alpha {ALPHA:g} (an intersection-union test: "
                "no correction needed); did not hold only when a part does so after Holm's step-down correction over "
                "the parts' p-values against the claim (deterministic parts unadjusted); else inconclusive.")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _part_line(p, needs: int | None = None) -> str:
    """One part: status, claim, the equivalence statement where it did not hold, too few units, the numbers."""
    short = underpowered(p, needs)
    bound = bound_text(p)
    extra = "; ".join(x for x in (bound, short) if x)
    holm = " (Holm)" if "p against (Holm)" in p.numbers else ""
    return f"{p.status}{holm}: {p.claim}" + (f" -- *{extra}*" if extra else "") + f" ({p.numbers_text()})"


def _sensitivity(path: Path) -> str:
    """The sensitivity as a list: each setting evaluated and the verdict there (with its parts' statuses)."""
    entries = read_sensitivity(path)
    if not entries:
        return ""
    lines = []
    for e in entries:
        v = e["verdict"]
        parts = ", ".join(p.status for p in v.parts)
        lines.append(f"- {e['role']} ({e['label']}): **{v.status}**" + (f" (parts: {parts})" if parts else ""))
    return "\n".join(lines) + "\n"


def _section(name: str, recipe, out: Path, scale: str) -> tuple[str, str]:
    """``(table row, section)`` of one recipe."""
    path = summary_path(out, name, scale)
    title = f"{recipe.paper.split(' (')[0]}, {recipe.figure}"
    paper = f"`landscape figures {name} --scale paper --data-root DIR`: {paper_line(recipe)}."
    kind = "check" if recipe.kind == "check" else "claim"
    if not path.is_file():
        row = f"| [`{name}`](#{name}) | {_cell(title)} | {kind} | {_cell(recipe.claim)} | not made | |"
        return row, f"### {name}\n\n{title}. Not made at `--scale {scale}` yet.\n\n**Paper scale.** {paper}\n"
    _, verdict, figures = read_summary(path)
    attrs = summary_attrs(path)
    png = [f for f in figures if f.suffix == ".png" and (out / name / f.name).is_file()]
    main = [f for f in png if "-figure-" in f.name]
    side = [f for f in png if f not in main]
    image = "".join(f"![{name}]({name}/{f.name})\n\n" for f in main)
    needs = json.loads(attrs["needs"]) if "needs" in attrs else None
    parts = [_part_line(p, needs) for p in verdict.parts]
    judged = "<br>".join(parts) if parts else f"{verdict.numbers_text()}. Rule: {verdict.test}"
    status = STATUS[verdict.status]
    short = sum(bool(underpowered(p, needs)) for p in (verdict.parts or (verdict,)))
    if verdict.note.startswith(INVALID):
        status = f"*{INVALID}*"
    elif any(p.note.startswith(INVALID) for p in verdict.parts):
        status += f" ({sum(p.note.startswith(INVALID) for p in verdict.parts)} parts: invalid regime)"
    if short:
        status += f" ({short} {'part' if short == 1 else 'parts'} with fewer seeds than needed)"
    sensitivity = _sensitivity(path)
    if sensitivity:
        chosen = read_sensitivity(path)
        viable = [e for e in chosen if e["role"] in ("chosen", "viable")]
        status += f"; held at {sum(e['verdict'].held is True for e in viable)} of {len(viable)} viable settings"
    row = f"| [`{name}`](#{name}) | {_cell(title)} | {kind} | {_cell(recipe.claim)} | {status} | {_cell(judged)} |"
    made = []
    if "seconds" in attrs:
        made.append(f"{float(attrs['seconds']):.0f} s")
    if "landscape_version" in attrs:
        made.append(f"landscape {attrs['landscape_version']}")
    if "created" in attrs:
        made.append(str(attrs["created"]))
    part_lines = "".join(f"{i}. {line}\n" for i, line in enumerate(parts, 1))
    body = (f"### {name}\n\n{title} ({kind}): {recipe.claim}.\n\n{image}"
            f"**Verdict: {verdict.status}.** {verdict.claim}.\n\n"
            + (f"**Scope.** {verdict.scope}.\n\n" if verdict.scope else "")
            + (f"**Parts** ({MULTIPLICITY})\n\n{part_lines}\n" if parts else
               f"**Rule.** {verdict.test}. Numbers: {verdict.numbers_text()}.\n\n")
            + (f"**Sensitivity to the selected setting** (the verdict at the chosen setting, every other viable "
               f"candidate and each arm's own best; selection on a validation split with seeds disjoint from the "
               f"evaluation seeds):\n\n{sensitivity}\n"
               + "".join(f"![{name} sensitivity]({name}/{f.name})\n\n" for f in side) if sensitivity else "")
            + (f"**Notes.** {verdict.note}\n\n" if verdict.note else "")
            + f"**Scaled down.** {recipe.scaled_down}. Settings: `{json.dumps(attrs['settings'], sort_keys=True)}`.\n\n"
            + (f"**Needs** {needs} seeds per tested part (the recipe's statement; fewer are marked).\n\n"
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
    counts = {}
    for name in registry.names():
        path = summary_path(out, name, scale)
        if path.is_file():
            kind = registry.get(name).kind
            status = read_summary(path)[1].status
            counts.setdefault(kind, {}).setdefault(status, 0)
            counts[kind][status] += 1

    def tally(kind: str) -> str:
        c = counts.get(kind, {})
        return ", ".join(f"{c.get(s, 0)} {s}" for s in ("held", "did not hold", "inconclusive"))

    head = (f"## Verdicts at `--scale {scale}` ({made} of {len(rows)} recipes made)\n\n"
            f"**Reproduced claims: {tally('claim')}. Implementation / numerical checks (not claims): "
            f"{tally('check')}.**\n\n"
            "Each verdict is computed by the recipe from its own numbers (`landscape.verdict`, every test at alpha "
            f"{ALPHA:g}): held, did not hold, or inconclusive (the test does not reject either way, the spread could "
            "not be measured, or -- *inconclusive (invalid regime)* -- a model it rests on failed the recipe's "
            f"validity gate). {MULTIPLICITY} A part that did not hold or is inconclusive is stated as an equivalence "
            f"(\"no difference beyond X\", the one-sided {1 - ALPHA:.0%} bound) with the smallest effect its test "
            f"detects with {POWER:.0%} power; with no spread at all the sign test over the independent units decides "
            "and the share of units that could show the effect is bounded. Values measured on pairs that share runs "
            "(sibling barriers) are analysed at the level of the independent runs (leave-one-unit-out jackknife). "
            "Every verdict below paper scale states its scope: it is not a test of the paper's regime. Recipes that "
            "select a setting do so on a validation split with seeds disjoint from the evaluation seeds, and report "
            "the verdict at every viable setting.\n\n"
            "| Recipe | Paper, figure | Kind | Claim | Verdict | Numbers and rule |\n|---|---|---|---|---|---|\n")
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
        intro = (f"# Paper figures at `--scale {scale}`\n\nRegenerate with `landscape --portable figures all "
                 f"--scale {scale} --out {out}/` (the same bits on any x86-64 CPU); finished recipes with unchanged settings are skipped.\n\n")
        new = (old + "\n" if old else intro) + text
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: tmp.write_text(new))
    return path
