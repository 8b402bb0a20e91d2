"""Multi-chip speed: an all-reduce of 64 MiB over a 16x16 torus (256 TPU v5e chips) in timing-only mode.

The program is one HLO ``all-reduce`` of ``f32[16384,1024]`` over every chip; the compiler lowers it to
a bidirectional ring reduce-scatter along each torus axis and the all-gathers back (4 phases of 15 steps).
The scaling sweep runs the same 64 MiB on N x N tori and reports events and wall time per chip and
algorithm step: the cost grows linearly with chips x steps (per step it shrinks a little on bigger tori,
whose smaller chunks need fewer blocks per step).

    python benchmarks/bench_allreduce.py [--size 16] [--mib 64] [--sweep] [--slices 4]

With ``--slices S`` the system is S such tori joined by the data-center network (``dcn.slices``); the
all-reduce then spans all S x N x N chips (hierarchical: the torus axes, then a ring over the slices).

Targets: under 30 s for the 16x16 torus (issue 7); under 60 s for four of them, 1,024 chips (issue 17).
"""

from __future__ import annotations

import argparse
import time

import tpusim
from tpusim.config import load_config

TARGET_SECONDS = {1: 30.0, 4: 60.0}
"""Wall-time targets by number of 16x16 slices."""
SUM = "sum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"


def program(chips: int, mib: int) -> str:
    rows = mib * 2**20 // 4096
    return (
        f"HloModule allreduce, replica_count={chips}\n{SUM}ENTRY main {{\n  x = f32[{rows},1024] parameter(0)\n"
        f"  ROOT r = f32[{rows},1024] all-reduce(x), replica_groups={{}}, to_apply=sum\n}}\n"
    )


def run(side: int, mib: int, slices: int = 1) -> tuple[float, float, int, int]:
    """(wall seconds, simulated seconds, SimPy events, instructions executed) of one all-reduce."""
    cfg = load_config("tpu_v5e", overrides=[f"dcn.slices={slices}"])
    chips = side * side * slices
    began = time.perf_counter()
    result = tpusim.simulate(program(chips, mib), chips=chips, topology=(side, side), config=cfg, timing_only=True)
    return time.perf_counter() - began, result.seconds, result.run.events, result.instructions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16, help="torus side (default 16: 256 chips)")
    parser.add_argument("--mib", type=int, default=64, help="all-reduce size in MiB (default 64)")
    parser.add_argument("--sweep", action="store_true", help="also run 4x4 and 8x8 tori and compare the cost")
    parser.add_argument("--slices", type=int, default=1, help="tori joined by DCN (default 1; 4: 1,024 chips)")
    args = parser.parse_args()
    sides = [4, 8, args.size] if args.sweep else [args.size]
    for side in sides:
        wall, simulated, events, instructions = run(side, args.mib, args.slices)
        chips, steps = side * side * args.slices, 4 * (side - 1) + 2 * (args.slices - 1)
        print(
            f"{args.slices} x {side}x{side} torus ({chips} chips), {args.mib} MiB all-reduce: "
            f"simulated {simulated * 1e6:,.1f} us in {wall:.1f} s wall; {events:,} events, {instructions:,} "
            "instructions; per chip and step: "
            f"{events / (chips * steps):.1f} events, {wall / (chips * steps) * 1e6:.0f} us of wall time"
        )
    target = TARGET_SECONDS.get(args.slices) if args.size == 16 else None
    if target is not None:
        verdict = "met" if wall < target else "MISSED"
        print(f"target: under {target:.0f} s for {args.slices} x 16x16 ({chips} chips): {verdict}")


if __name__ == "__main__":
    main()
