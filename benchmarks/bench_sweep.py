"""Sweep speed (issue 17): points per second of the shipped MXU-size x HBM-bandwidth sweep, run cold.

    python benchmarks/bench_sweep.py

Runs ``tpusim sweep configs/sweeps/mxu_vs_hbm.yaml`` (18 points: two programs, three MXU sizes, three HBM
bandwidths, timing-only) into a fresh folder in a fresh process, with the default local workers, and prints
the wall and CPU seconds (the child's and its workers') and the points per wall second beside issue 17's
target of 20. Every point compiles its program anew: a sweep over HBM bandwidth or MXU size must, since
layout choice and the matmul planner read both. The exit status is 0: a report, not a test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "configs" / "sweeps" / "mxu_vs_hbm.yaml"
TARGET_POINTS_PER_SECOND = 20.0


def main() -> int:
    with tempfile.TemporaryDirectory() as out:
        before = os.times()
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "tpusim", "sweep", str(SPEC), "--out", out, "--no-progress"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    found = re.search(r"(\d+) points \((\d+) failed", done.stdout)
    points = int(found.group(1)) if found else 0
    rate = points / wall if wall else 0.0
    print(f"{SPEC.relative_to(ROOT)}: {points} points in {wall:.1f} s wall, {cpu:.1f} CPU s: {rate:.1f} points/s")
    print(
        f"target: {TARGET_POINTS_PER_SECOND:.0f} points/s -> {'met' if rate >= TARGET_POINTS_PER_SECOND else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
