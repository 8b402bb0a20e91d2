"""Sweep speed (issue 17): points per second of the shipped sweeps, each run cold in a fresh process.

    python benchmarks/bench_sweep.py

Runs ``tpusim sweep`` on two shipped specs into fresh folders, with the default local workers and
``--no-plots`` (rendering the plots costs a few seconds per sweep whatever its size; the last line times it
once), and prints the wall and CPU seconds (the child's and its workers') and the points per wall second
beside issue 17's target of 20:

* ``mxu_vs_hbm.yaml`` (18 points): every point compiles its program anew, rightly: layout choice and the
  matmul planner read the HBM bandwidth and the MXU size the sweep varies.
* ``mxu_vs_hbm_1000`` (1,000 points, written to a temporary spec): issue 17's sweep, 40 HBM bandwidths times
  25 MXU shapes on the transformer block; every point compiles anew, as above.
* ``vector_units.yaml`` (32 points) and a 256-point grid of the same kind (VPU and XLU rates, DMA burst size,
  written to a temporary spec): the compiler reads none of these keys, so each worker compiles each program
  once and the other points only simulate (``tpusim/compiler/config_reads.py``).

The exit status is 0: a report, not a test.
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
SPECS = ROOT / "configs" / "sweeps"
TARGET_POINTS_PER_SECOND = 20.0
BIG = """name: vector_units_256
programs:
  transformer_block: {programs}/transformer_block.hlo
  mlp: {programs}/mlp_bf16.hlo
config: tpu_v5e
timing_only: true
grid:
  vpu.alu.issue_vregs_per_cycle: [1, 2, 4, 8]
  xlu.transpose_cycles_per_vreg: [1, 2, 4, 8]
  vpu.transcendental.issue_vregs_per_cycle: [0.5, 1, 2, 4]
  dma.burst_bytes: [32, 64]
"""
COMPILED = """name: mxu_vs_hbm_1000
programs:
  transformer_block: {programs}/transformer_block.hlo
config: tpu_v5e
timing_only: true
grid:
  mxu.rows: [32, 64, 128, 256, 512]
  mxu.cols: [32, 64, 128, 256, 512]
  hbm.bandwidth_bytes_per_s: [{bandwidths}]
"""
"""Issue 17's sweep: 1,000 points over HBM bandwidth and MXU size on a transformer block, each compiled anew."""


def run(spec: Path, plots: bool = False) -> None:
    with tempfile.TemporaryDirectory() as out:
        before = os.times()
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "tpusim", "sweep", str(spec), "--out", out, "--no-progress",
             *([] if plots else ["--no-plots"])],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    found = re.search(r"(\d+) points \((\d+) failed", done.stdout)
    points = int(found.group(1)) if found else 0
    rate = points / wall if wall else 0.0
    verdict = "met" if rate >= TARGET_POINTS_PER_SECOND else "missed"
    label = f"{spec.name}{' with plots' if plots else ''}"
    print(f"{label}: {points} points in {wall:.1f} s wall, {cpu:.1f} CPU s: {rate:.1f} points/s "
          f"(target {TARGET_POINTS_PER_SECOND:.0f}: {verdict})", flush=True)  # fmt: skip


def main() -> int:
    run(SPECS / "mxu_vs_hbm.yaml")
    run(SPECS / "vector_units.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "vector_units_256.yaml"
        big.write_text(BIG.format(programs=SPECS / "programs"))
        run(big)
        compiled = Path(tmp) / "mxu_vs_hbm_1000.yaml"
        bandwidths = ", ".join(f"{k * 1e11:.3g}" for k in range(2, 42))  # 0.2 to 4.1 TB/s, 40 values
        compiled.write_text(COMPILED.format(programs=SPECS / "programs", bandwidths=bandwidths))
        run(compiled)
    run(SPECS / "vector_units.yaml", plots=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
