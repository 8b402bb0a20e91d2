"""Device-model speed: simulated instructions per CPU-second in timing-only mode.

The workload (``tpusim.isa.kernels.matmul_relu_loop_nest``) is ``relu(A @ B + bias)`` on a TPU v5e written by
hand as a compiler would emit it: a loop nest (not unrolled)
over 512 x 512 output tiles and 128-deep K steps, with double-buffered DMAs of dynamic-slice windows of A
and B, four MXUs (load weights + matmul each per step), pops, a VPU epilogue and a DMA of the result tile.

    python benchmarks/bench_devices.py [--size 4096] [--repeat 3]

Target (issue 4): at least 200,000 simulated instructions per second.
"""

from __future__ import annotations

import argparse
import time

from tpusim.config import load_config
from tpusim.devices import Chip
from tpusim.isa.kernels import matmul_relu_loop_nest

TARGET = 200_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4096, help="matrix size (a multiple of 512)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the fastest is reported")
    args = parser.parse_args()
    cfg = load_config("tpu_v5e")
    prog = matmul_relu_loop_nest(args.size)
    best = None
    for _ in range(args.repeat):
        t0 = time.process_time()
        res = Chip(cfg).run(prog, timing_only=True)
        dt = time.process_time() - t0
        best = dt if best is None or dt < best else best
    rate = res.instructions / best
    flops = 2 * args.size**3
    print(f"workload        {prog.name}, tpu_v5e, timing-only")
    print(f"instructions    {res.instructions:,} executed ({prog.instruction_count} in the program)")
    print(
        f"simulated       {res.cycles:,} cycles = {res.seconds * 1e3:.3f} ms, "
        f"{flops / res.seconds / cfg.peak_bf16_flops_per_s:.1%} of peak bf16"
    )
    print(f"events          {res.events:,} ({res.events / res.instructions:.2f} per instruction)")
    print(f"CPU time        {best:.3f} s (best of {args.repeat})")
    print(f"speed           {rate:,.0f} instructions/s = {rate / TARGET:.2f} x the {TARGET:,}/s target")


if __name__ == "__main__":
    main()
