"""Roofline from hand-written instruction streams: memory-bound code runs at HBM bandwidth, compute-bound
code at MXU peak, both as real loops with double-buffered DMAs."""

from __future__ import annotations

import numpy as np
import pytest

from tpusim.config import load_config
from tpusim.devices import Chip
from tpusim.isa import (
    Branch,
    Const,
    DmaStart,
    MemRef,
    MxuLoadWeights,
    MxuMatmul,
    Program,
    Reg,
    ScalarAlu,
    SemWait,
    Space,
    StreamBuilder,
    Symbol,
    VpuMap,
    Window,
)
from tpusim.isa.kernels import matmul_relu_loop_nest
from tpusim.memory import parse_shape

V5E = load_config("tpu_v5e")


def streaming_program(tiles: int, rows: int, depth: int = 3) -> tuple[Program, int]:
    """y = x + 1 over ``tiles`` tiles of f32[rows,128], streamed through ``depth`` VMEM buffers each way."""
    tile = parse_shape(f"f32[{rows},128]{{1,0:T(8,128)}}")
    nbytes = tile.byte_size
    x_at, y_at, out = 0, tiles * nbytes, depth * nbytes

    def hbm(base: int, reg: Reg) -> MemRef:
        return MemRef(Space.HBM, base, tile, base=reg)

    def vmem(base: int, reg: Reg) -> MemRef:
        return MemRef(Space.VMEM, base, tile, base=reg)

    b = StreamBuilder()
    # s1 tile k, s2 its hbm offset, s3 its buffer offset; s4 / s5 the same for tile k + depth - 1
    b.emit(ScalarAlu("mov", Reg(1), 0))
    for k in range(depth - 1):  # prologue: the first depth - 1 tiles
        b.emit(ScalarAlu("mov", Reg(6), k * nbytes), DmaStart(hbm(x_at, Reg(6)), vmem(0, Reg(6)), sem=0))
    b.label("loop")
    b.emit(ScalarAlu("mul", Reg(2), Reg(1), nbytes), ScalarAlu("rem", Reg(3), Reg(1), depth))
    b.emit(ScalarAlu("mul", Reg(3), Reg(3), nbytes), ScalarAlu("add", Reg(4), Reg(2), (depth - 1) * nbytes))
    b.emit(ScalarAlu("add", Reg(5), Reg(1), depth - 1), ScalarAlu("rem", Reg(5), Reg(5), depth))
    b.emit(ScalarAlu("mul", Reg(5), Reg(5), nbytes))
    b.emit(Branch("ge", Reg(1), tiles - depth + 1, "compute"))
    b.emit(DmaStart(hbm(x_at, Reg(4)), vmem(0, Reg(5)), sem=0))  # prefetch depth - 1 tiles ahead
    b.label("compute")
    b.emit(SemWait(0))
    b.emit(VpuMap("add", vmem(out, Reg(3)), (vmem(0, Reg(3)), Const(1.0, "f32"))))
    b.emit(DmaStart(vmem(out, Reg(3)), hbm(y_at, Reg(2)), sem=1))
    b.emit(ScalarAlu("add", Reg(1), Reg(1), 1), Branch("lt", Reg(1), tiles, "loop"))
    b.emit(SemWait(1, tiles))
    x_shape = parse_shape(f"f32[{tiles * rows},128]{{1,0:T(8,128)}}")
    syms = (Symbol("x", MemRef(Space.HBM, x_at, x_shape)), Symbol("y", MemRef(Space.HBM, y_at, x_shape)))
    return Program((b.build(),), syms), 2 * tiles * nbytes


def test_memory_bound_stream_runs_at_hbm_bandwidth():
    # Three buffers each way keep transfers in flight across the ~590 cycles of setup and HBM latency
    # (with two, fair sharing makes the next tile finish together with the ones behind it: ~92%).
    prog, moved = streaming_program(tiles=32, rows=1024)
    res = Chip(V5E).run(prog, timing_only=True)
    achieved = moved / res.seconds
    assert achieved == pytest.approx(V5E.hbm.bandwidth_bytes_per_s, rel=0.05)
    assert achieved <= V5E.hbm.bandwidth_bytes_per_s
    # the VPU was mostly idle: this is the memory-bound side of the roofline
    assert res.trace.busy_cycles("chip0.core0.vpu") < 0.2 * res.cycles


def test_streaming_program_computes_the_right_numbers():
    prog, _ = streaming_program(tiles=5, rows=8)
    x = np.arange(5 * 8 * 128, dtype=np.float32).reshape(40, 128)
    res = Chip(V5E).run(prog, {"x": x})
    np.testing.assert_array_equal(res.read("y"), x + 1)


def matmul_program(steps: int, m: int) -> tuple[Program, int, int]:
    """Weights resident, LHS row blocks of bf16[m,128] streamed from HBM (double-buffered), 4 MXUs."""
    cfg = V5E
    lhs = parse_shape(f"bf16[{m},128]{{1,0:T(8,128)(2,1)}}")
    w = parse_shape("bf16[128,128]{1,0:T(8,128)(2,1)}")
    nbytes = lhs.byte_size
    b = StreamBuilder()
    b.emit(ScalarAlu("mov", Reg(1), 0), ScalarAlu("mov", Reg(2), 0), ScalarAlu("mov", Reg(3), 0))
    b.emit(DmaStart(MemRef(Space.HBM, 0, lhs, base=Reg(2)), MemRef(Space.VMEM, 0, lhs, base=Reg(3)), sem=0))
    b.label("loop")
    b.emit(ScalarAlu("add", Reg(4), Reg(2), nbytes), ScalarAlu("xor", Reg(5), Reg(3), nbytes))
    b.emit(Branch("ge", Reg(1), steps - 1, "compute"))
    b.emit(DmaStart(MemRef(Space.HBM, 0, lhs, base=Reg(4)), MemRef(Space.VMEM, 0, lhs, base=Reg(5)), sem=0))
    b.label("compute")
    b.emit(SemWait(0))
    half = m // 2  # two matmuls per MXU: the result buffer holds 1024 rows
    for u in range(cfg.mxu.count):
        b.emit(MxuLoadWeights(u, MemRef(Space.VMEM, 0x200000 + 0x8000 * u, w)))
        for h in range(2):
            rows = MemRef(Space.VMEM, 0, lhs, Window((h * half, 0), (half, 128)), Reg(3))
            b.emit(MxuMatmul(u, rows, acc=0, accumulate=True))
    b.emit(ScalarAlu("add", Reg(1), Reg(1), 1), ScalarAlu("mov", Reg(2), Reg(4)), ScalarAlu("mov", Reg(3), Reg(5)))
    b.emit(Branch("lt", Reg(1), steps, "loop"))
    flops = steps * cfg.mxu.count * 2 * m * 128 * 128
    return Program((b.build(),)), flops, steps * nbytes


def test_compute_bound_stream_runs_at_mxu_peak():
    # 2048 rows per step keep each MXU busy longer than the next block's DMA (960 cycles + latency)
    prog, flops, moved = matmul_program(steps=64, m=2048)
    res = Chip(V5E).run(prog, timing_only=True)
    assert int(res.trace.flops.sum()) == flops
    peak = V5E.peak_bf16_flops_per_s
    achieved = flops / res.seconds
    assert achieved == pytest.approx(peak, rel=0.05)  # the first block's DMA is not hidden
    # arithmetic intensity far above the ridge point: HBM is mostly idle
    intensity = flops / moved
    assert intensity > 2 * peak / V5E.hbm.bandwidth_bytes_per_s


def test_tiled_matmul_loop_nest_computes_exact_numbers():
    """relu(A @ B + bias) as a compiler would emit it: dynamic-slice DMAs, double buffers, 4 MXUs, pops into
    windows, a VPU epilogue. The numbers must match the MXU's documented arithmetic bit for bit."""
    import ml_dtypes

    size, tile = 512, 256
    program = matmul_relu_loop_nest(size, tile=tile)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((size, size)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((size, size)).astype(ml_dtypes.bfloat16)
    bias = rng.standard_normal((tile, tile)).astype(np.float32)
    res = Chip(V5E).run(program, {"a": a, "b": b, "bias": bias})
    assert res.instructions > 100
    got = res.read("c")
    assert (got > 0).mean() > 0.3  # relu of random sums: a real result, not zeros
    # expected (docs/model.md, MXU numerics): each MXU's K steps accumulate into the same rows, the first one
    # overwriting them, so each 128-column block of an output tile is ONE f32 product over the whole K
    expect = np.zeros((size, size), np.float32)
    for m0 in range(0, size, tile):
        for n0 in range(0, size, 128):
            lhs = np.ascontiguousarray(a[m0 : m0 + tile, :], np.float32)
            w = np.ascontiguousarray(b[:, n0 : n0 + 128], np.float32)
            expect[m0 : m0 + tile, n0 : n0 + 128] = lhs @ w
    for m0 in range(0, size, tile):
        for n0 in range(0, size, tile):
            block = expect[m0 : m0 + tile, n0 : n0 + tile]
            expect[m0 : m0 + tile, n0 : n0 + tile] = np.maximum(block + bias, np.float32(0))
    np.testing.assert_array_equal(got, expect)
    # and that is f32 accumulation: within the f32 error bound of the exact sums
    exact = a.astype(np.float64) @ b.astype(np.float64)
    bound = size * 2.0**-24 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    ok = np.abs(got - np.maximum(exact + np.tile(bias, (size // tile, size // tile)), 0)) <= bound + 1e-6
    assert ok.all()
