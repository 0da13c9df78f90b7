"""What portable mode (``landscape --portable``) costs, and whether it gives the same bits under other CPUs' kernels.

One job, run in a fresh process per case (the kernels are chosen when torch loads): train LeNet on digits
(``--epochs 2``, batch 32), interpolate between its init and end (21 points), the Hessian's top eigenvalue at the
end (``--top-k 1``, 500 examples). The process times each of the three commands and hashes the trained weights and
the two results' arrays (all but their timings).

- Cost: the job in normal mode and in portable mode, alternately (the order flips every round), ``--repeats``
  rounds; printed per command: the median seconds of each and the median of the per-round ratios portable / normal
  with their min-max.
- Bits: the job's hash in portable mode under this machine's kernels and under the code paths other x86-64 CPUs
  take (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``, ``MKL_CBWR``, ``NPY_DISABLE_CPU_FEATURES``, and glibc's
  math functions without FMA / AVX2 via ``GLIBC_TUNABLES``), and in normal mode under the same settings (the
  control: there they differ, so the settings reach the kernels).

    OMP_NUM_THREADS=1 python benchmarks/portable.py [--repeats 5]

Run it on an idle machine for the times; the hashes do not depend on load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOB = r"""
import hashlib, json, sys, time
from cli.main import main  # loads neither torch nor numpy: --portable pins their kernels first

def timed(args):
    t0 = time.perf_counter()
    try:
        main(sys.argv[1:] + ["-q", "--root", "ck", *args])
    except SystemExit as exit_:
        assert exit_.code == 0, args
    return time.perf_counter() - t0

seconds = {
    "train": timed(["train", "--model", "lenet", "--data", "digits", "--epochs", "2", "--batch-size", "32",
                    "--run", "r"]),
    "interpolate": timed(["interpolate", "r@init", "r@last", "--points", "21", "--no-figure", "-o", "i.h5"]),
    "hessian": timed(["hessian", "r@last", "--top-k", "1", "--subset", "500", "--no-figure", "-o", "h.h5"]),
}
import numpy as np
from landscape.results import read_result
from landscape.store import Store
digest = hashlib.sha256()
weights = Store("ck").load("r@last").state_dict
for name in sorted(weights):
    digest.update(weights[name].numpy().tobytes())
for path in ("i.h5", "h.h5"):
    arrays = read_result(path).arrays
    for name in sorted(set(arrays) - {"seconds"}):  # what each part took: not a result
        digest.update(np.ascontiguousarray(arrays[name]).tobytes())
print(json.dumps({"seconds": seconds, "digest": digest.hexdigest()[:16]}))
"""

OTHER_CPUS = {
    "this CPU": {},
    "torch baseline, oneDNN SSE4.1, MKL AVX2": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                                               "MKL_CBWR": "AVX2"},
    "numpy baseline, glibc without FMA/AVX2": {"NPY_DISABLE_CPU_FEATURES": "X86_V3 AVX2 FMA3",
                                               "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F"},
}
PINNED = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "NPY_DISABLE_CPU_FEATURES", "GLIBC_TUNABLES",
          "OPENBLAS_CORETYPE", "LANDSCAPE_PORTABLE")


def job(portable: bool, env: dict[str, str]) -> dict:
    """The job in a fresh process in a scratch directory: its seconds per command and its hash."""
    clean = {k: v for k, v in os.environ.items() if k not in PINNED}
    with tempfile.TemporaryDirectory(prefix="landscape-portable-") as scratch:
        flags = ["--threads", "1"] + (["--portable"] if portable else [])
        proc = subprocess.run([sys.executable, "-c", JOB, *flags], cwd=scratch, capture_output=True, text=True,
                              env={**clean, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                                   **env}, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"the job failed ({'portable' if portable else 'normal'}, {env}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds of the cost comparison")
    args = parser.parse_args(argv)

    print("bits: the job's hash under other CPUs' code paths")
    print(f"  {'kernels':42s} {'normal':>18s} {'portable':>18s}")
    hashes = {True: set(), False: set()}
    for label, env in OTHER_CPUS.items():
        row = {mode: job(mode, env)["digest"] for mode in (False, True)}
        for mode, digest in row.items():
            hashes[mode].add(digest)
        print(f"  {label:42s} {row[False]:>18s} {row[True]:>18s}", flush=True)
    print(f"  portable: {'the same bits under every setting' if len(hashes[True]) == 1 else 'DIFFERENT bits'}; "
          f"normal: {len(hashes[False])} different results over {len(OTHER_CPUS)} settings")

    times: dict[bool, list[dict]] = {False: [], True: []}
    for r in range(args.repeats):
        for mode in ((False, True) if r % 2 == 0 else (True, False)):
            times[mode].append(job(mode, {})["seconds"])
    print(f"cost: seconds per command, median of {args.repeats} rounds (one thread), and the per-round ratio "
          "portable / normal (median, min-max)")
    for command in times[False][0]:
        normal = [t[command] for t in times[False]]
        portable = [t[command] for t in times[True]]
        ratio = [p / n for p, n in zip(portable, normal, strict=True)]
        print(f"  {command:12s} normal {statistics.median(normal):7.2f} s   portable {statistics.median(portable):7.2f} s"
              f"   ratio {statistics.median(ratio):5.2f} ({min(ratio):.2f}-{max(ratio):.2f})", flush=True)
    return 0 if len(hashes[True]) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
