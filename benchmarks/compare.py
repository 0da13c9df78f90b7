"""Compare two benchmark records (``benchmarks/results/*.json`` written by ``run_all.py``): per figure the old and new
value, the change, and whether its goal is met in each.

    python benchmarks/compare.py benchmarks/results/OLD.json benchmarks/results/NEW.json

A figure is a time ratio measured interleaved within one run, so records from different days can be compared even
when the machine's load differed (both loads are printed; a large change under very different loads deserves a
rerun).
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


def compare(old: dict, new: dict) -> list[str]:
    lines = [f"old: {old.get('commit')} {old.get('date')} load {old.get('load_start', {}).get('loadavg')}",
             f"new: {new.get('commit')} {new.get('date')} load {new.get('load_start', {}).get('loadavg')}"]
    before = {f["figure"]: f for f in old["figures"]}
    after = {f["figure"]: f for f in new["figures"]}
    width = max((len(k) for k in {**before, **after}), default=10)
    lines.append(f"{'figure':<{width}}  {'old':>8}  {'new':>8}  {'change':>8}  goal")
    for name in list(before) + [k for k in after if k not in before]:
        o, n = before.get(name), after.get(name)
        ov = f"{o['value']:.3g}" if o else "-"
        nv = f"{n['value']:.3g}" if n else "-"
        change = f"{n['value'] / o['value']:.2f}x" if o and n and o["value"] else "-"
        ref = n or o
        goal = "" if ref["goal"] is None else f"{'>=' if ref['better'] == 'higher' else '<='} {ref['goal']:g}"
        met = "/".join("-" if r is None or r["met"] is None else ("met" if r["met"] else "not met") for r in (o, n))
        lines.append(f"{name:<{width}}  {ov:>8}  {nv:>8}  {change:>8}  {goal} ({met})")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python benchmarks/compare.py OLD.json NEW.json", file=sys.stderr)
        return 2
    print("\n".join(compare(load(argv[0]), load(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
