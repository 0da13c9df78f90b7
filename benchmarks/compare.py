"""Compare two benchmark records (``benchmarks/results/*.json`` written by ``run_all.py``): per figure the old and new
value with their spread, the change, whether it is noise, and whether its goal is met in each.

    python benchmarks/compare.py benchmarks/results/OLD.json benchmarks/results/NEW.json

The noise rule (``judge``): a figure recorded with its spread (the min-max of its per-round values, at least five
interleaved rounds) changed only when **each median lies outside the other record's [min, max]**; a median inside
the other run's range is ``noise``. When only one record has a spread, the other's median is tested against it
alone; records made before spreads were recorded (a bare value on both sides) give ``unjudged``. A real change is
``better`` or ``worse`` by the figure's direction (``higher`` for a speed-up, ``lower`` for a time ratio).

A figure is a time ratio measured interleaved within one run, so records from different days can be compared even
when the machine's load differed (both loads are printed). Records from different machines (CPU model or ISA
differ; both are printed when a record has them) are not comparable: the verdict column says so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"error: cannot read benchmark record {path}: {exc}") from None
    if not isinstance(data, dict) or "figures" not in data:
        raise SystemExit(f"error: {path} is not a benchmark record (no 'figures')")
    return data


def _range(fig: dict) -> tuple[float, float] | None:
    s = fig.get("spread")
    return (s["min"], s["max"]) if s else None


def judge(old: dict, new: dict) -> str:
    """``noise``, ``better``, ``worse`` or ``unjudged`` for one figure in two records (the rule in the module
    docstring)."""
    ro, rn = _range(old), _range(new)
    if ro is None and rn is None:
        return "unjudged"
    inside = (ro is not None and ro[0] <= new["value"] <= ro[1]) or (rn is not None and rn[0] <= old["value"] <= rn[1])
    if inside or new["value"] == old["value"]:
        return "noise"
    up = new["value"] > old["value"]
    return "better" if up == (new.get("better", "higher") == "higher") else "worse"


def machine(record: dict) -> str:
    """``CPU model [ISA]`` of a record, or ``?`` for records made before the machine was recorded."""
    cpu = (record.get("machine") or {}).get("cpu")
    return f"{cpu['model']} [{' '.join(cpu['isa'])}]" if cpu else "?"


def _value(fig: dict | None) -> str:
    if not fig:
        return "-"
    r = _range(fig)
    return f"{fig['value']:.3g}" + (f" [{r[0]:.3g}-{r[1]:.3g}]" if r else "")


def compare(old: dict, new: dict) -> list[str]:
    lines = [f"old: {old.get('commit')} {old.get('date')} load {old.get('load_start', {}).get('loadavg')} "
             f"on {machine(old)}",
             f"new: {new.get('commit')} {new.get('date')} load {new.get('load_start', {}).get('loadavg')} "
             f"on {machine(new)}"]
    other_machine = "?" not in (machine(old), machine(new)) and machine(old) != machine(new)
    if other_machine:
        lines.append("different machines: ratios are not comparable, every change below is 'other machine'")
    before = {f["figure"]: f for f in old["figures"]}
    after = {f["figure"]: f for f in new["figures"]}
    width = max((len(k) for k in {**before, **after}), default=10)
    lines.append(f"{'figure':<{width}}  {'old [min-max]':>20}  {'new [min-max]':>20}  {'change':>7}  {'verdict':>13}"
                 "  goal (old/new)")
    for name in list(before) + [k for k in after if k not in before]:
        o, n = before.get(name), after.get(name)
        change = f"{n['value'] / o['value']:.2f}x" if o and n and o["value"] else "-"
        verdict = "-" if not (o and n) else ("other machine" if other_machine else judge(o, n))
        ref = n or o
        goal = "" if ref["goal"] is None else f"{'>=' if ref['better'] == 'higher' else '<='} {ref['goal']:g}"
        met = "/".join("-" if r is None or r["met"] is None else ("met" if r["met"] else "not met") for r in (o, n))
        lines.append(f"{name:<{width}}  {_value(o):>20}  {_value(n):>20}  {change:>7}  {verdict:>13}  {goal} ({met})")
    lines.append("verdict: noise = a median inside the other record's min-max range; better/worse = outside both "
                 "ranges; unjudged = neither record has a spread")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python benchmarks/compare.py OLD.json NEW.json", file=sys.stderr)
        return 2
    print("\n".join(compare(load(argv[0]), load(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
