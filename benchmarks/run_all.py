"""Run every benchmark in turn (what `make bench` does); each prints its own ratios against peers.

Each benchmark runs in its own process with one torch thread. Pass names to run only some:
``python benchmarks/run_all.py persample dpsgd_step``. Extra arguments after ``--`` go to every script.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["persample", "dpsgd_step", "interpolate", "directions", "ntk", "hessian", "batch"]


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[: argv.index("--")]
    names = argv or BENCHMARKS
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LANDSCAPE_THREADS": "1"}
    failed = []
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, str(HERE / f"{name}.py"), *extra], env=env)
        print(f"=== {name}: {time.perf_counter() - start:.0f} s, exit {proc.returncode} ===", flush=True)
        if proc.returncode != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
