"""Device-model speed: simulated instructions per CPU-second in timing-only mode.

The workload is what the compiler emits for ``relu(A @ B + bias)`` on a TPU v5e: a loop nest (not unrolled)
over 512 x 512 output tiles and 128-deep K steps, with double-buffered DMAs of dynamic-slice windows of A
and B, four MXUs (load weights + matmul each per step), pops, a VPU epilogue and a DMA of the result tile.

    /work/venv/bin/python benchmarks/bench_devices.py [--size 4096] [--repeat 3]

Target (issue 4): at least 200,000 simulated instructions per second.
"""

from __future__ import annotations

import argparse
import time

from tpusim.config import load_config
from tpusim.devices import Chip
from tpusim.isa import (
    Branch,
    Const,
    DmaStart,
    MemRef,
    MxuLoadWeights,
    MxuMatmul,
    MxuPop,
    Program,
    Reg,
    ScalarAlu,
    SemWait,
    Space,
    StreamBuilder,
    VpuMap,
    Window,
)
from tpusim.memory import parse_shape

TARGET = 200_000
TILE, KSTEP = 512, 128


def program(size: int) -> Program:
    """``relu(A @ B + bias)`` for square ``size`` matrices, as a loop nest."""
    tm = size // TILE
    ks = size // KSTEP
    a = parse_shape(f"bf16[{size},{size}]{{1,0:T(8,128)(2,1)}}")
    b = parse_shape(f"bf16[{size},{size}]{{1,0:T(8,128)(2,1)}}")
    c = parse_shape(f"f32[{size},{size}]{{1,0:T(8,128)}}")
    a_buf = parse_shape(f"bf16[{TILE},{KSTEP}]{{1,0:T(8,128)(2,1)}}")
    b_buf = parse_shape(f"bf16[{KSTEP},{TILE}]{{1,0:T(8,128)(2,1)}}")
    out = parse_shape(f"f32[{TILE},{TILE}]{{1,0:T(8,128)}}")
    a_hbm, b_hbm, c_hbm = 0, a.byte_size, a.byte_size + b.byte_size
    a_vm, b_vm, out_vm, bias_vm = 0x0, 0x40000, 0x100000, 0x200000
    R = Reg
    # s1 tile row, s2 tile col, s3 k step, s4 A row offset, s5 B col offset, s6 k offset, s7 next k offset,
    # s8 buffer offset of this step, s9 of the next step
    s = StreamBuilder()
    s.emit(ScalarAlu("mov", R(1), 0))
    s.label("rows")
    s.emit(ScalarAlu("mov", R(2), 0), ScalarAlu("mul", R(4), R(1), TILE))
    s.label("cols")
    s.emit(ScalarAlu("mul", R(5), R(2), TILE), ScalarAlu("mov", R(3), 0), ScalarAlu("mov", R(6), 0))
    s.emit(ScalarAlu("mov", R(8), 0))
    s.emit(
        DmaStart(
            MemRef(Space.HBM, a_hbm, a, Window((R(4), R(6)), (TILE, KSTEP))), MemRef(Space.VMEM, a_vm, a_buf), sem=0
        ),
        DmaStart(
            MemRef(Space.HBM, b_hbm, b, Window((R(6), R(5)), (KSTEP, TILE))), MemRef(Space.VMEM, b_vm, b_buf), sem=0
        ),
    )
    s.label("k")
    s.emit(ScalarAlu("add", R(7), R(6), KSTEP), ScalarAlu("xor", R(9), R(8), 0x20000))
    s.emit(Branch("ge", R(3), ks - 1, "compute"))
    s.emit(
        DmaStart(
            MemRef(Space.HBM, a_hbm, a, Window((R(4), R(7)), (TILE, KSTEP))),
            MemRef(Space.VMEM, a_vm, a_buf, base=R(9)),
            sem=0,
        ),
        DmaStart(
            MemRef(Space.HBM, b_hbm, b, Window((R(7), R(5)), (KSTEP, TILE))),
            MemRef(Space.VMEM, b_vm, b_buf, base=R(9)),
            sem=0,
        ),
    )
    s.label("compute")
    s.emit(SemWait(0, 2))
    for j in range(4):
        weights = MemRef(Space.VMEM, b_vm, b_buf, Window((0, 128 * j), (KSTEP, 128)), base=R(8))
        s.emit(MxuLoadWeights(j, weights))
        s.emit(MxuMatmul(j, MemRef(Space.VMEM, a_vm, a_buf, base=R(8)), acc=0, accumulate=True))
    s.emit(ScalarAlu("add", R(3), R(3), 1), ScalarAlu("mov", R(6), R(7)), ScalarAlu("mov", R(8), R(9)))
    s.emit(Branch("lt", R(3), ks, "k"))
    for j in range(4):
        s.emit(MxuPop(j, MemRef(Space.VMEM, out_vm, out, Window((0, 128 * j), (TILE, 128)))))
    s.emit(
        VpuMap(
            "add", MemRef(Space.VMEM, out_vm, out), (MemRef(Space.VMEM, out_vm, out), MemRef(Space.VMEM, bias_vm, out))
        ),
        VpuMap("maximum", MemRef(Space.VMEM, out_vm, out), (MemRef(Space.VMEM, out_vm, out), Const(0.0, "f32"))),
        DmaStart(
            MemRef(Space.VMEM, out_vm, out), MemRef(Space.HBM, c_hbm, c, Window((R(4), R(5)), (TILE, TILE))), sem=1
        ),
    )
    s.emit(ScalarAlu("add", R(2), R(2), 1), Branch("lt", R(2), tm, "cols"))
    s.emit(ScalarAlu("add", R(1), R(1), 1), Branch("lt", R(1), tm, "rows"))
    s.emit(SemWait(1, tm * tm))
    return Program((s.build(),), name=f"relu(A@B+bias) {size}^3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4096, help="matrix size (a multiple of 512)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the fastest is reported")
    args = parser.parse_args()
    cfg = load_config("tpu_v5e")
    prog = program(args.size)
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
