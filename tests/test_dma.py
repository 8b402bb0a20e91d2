"""HBM, DMA and VMEM: bandwidth, latency, fair sharing, the contiguous-run rule, real bytes, remote writes."""

from __future__ import annotations

from math import ceil

import numpy as np
import pytest

from tpusim.config import load_config, with_overrides
from tpusim.devices import Chip, ExecutionError, System
from tpusim.devices.dma import transfer_plan
from tpusim.isa import DmaStart, MemRef, Program, Reg, ScalarAlu, SemWait, Space, Stream, Symbol, Window
from tpusim.memory import parse_shape

V5E = load_config("tpu_v5e")
TEACH = load_config("teaching")


def ref(space: str, address: int, shape: str, window: Window | None = None, base: Reg | None = None) -> MemRef:
    return MemRef(Space(space), address, parse_shape(shape), window, base)


def dma_rows(result):
    return [(s, e) for s, u, _, e, _, _ in result.trace.rows() if u.endswith(".dma")]


def test_long_stream_reaches_hbm_bandwidth():
    n = 64 << 20
    shape = f"u8[{n}]{{0}}"
    res = Chip(V5E).run(
        Program.single([DmaStart(ref("hbm", 0, shape), ref("vmem", 0, shape), sem=0), SemWait(0)]), timing_only=True
    )
    achieved = n / res.seconds
    assert achieved == pytest.approx(V5E.hbm.bandwidth_bytes_per_s, rel=0.01)
    assert achieved <= V5E.hbm.bandwidth_bytes_per_s


def test_back_to_back_transfers_overlap_their_latency():
    tile = "f32[512,512]{1,0:T(8,128)}"  # 1 MiB
    n = 48
    ins = [DmaStart(ref("hbm", i << 20, tile), ref("vmem", (i % 8) << 20, tile), sem=0) for i in range(n)]
    res = Chip(V5E).run(Program.single([*ins, SemWait(0, n)]), timing_only=True)
    achieved = n * (1 << 20) / res.seconds
    assert achieved == pytest.approx(V5E.hbm.bandwidth_bytes_per_s, rel=0.01)


def test_small_transfer_shows_setup_and_latency():
    # teaching chip: 4 setup cycles, 64 bytes on one of 2 channels (8 bytes/cycle), 20 cycles of latency
    res = Chip(TEACH).run(
        Program.single([DmaStart(ref("hbm", 0, "f32[16]{0}"), ref("vmem", 0, "f32[16]{0}"))]), timing_only=True
    )
    assert dma_rows(res) == [(0, 4 + 64 // 8 + 20)]
    v5e = Chip(V5E).run(
        Program.single([DmaStart(ref("hbm", 0, "f32[128]{0}"), ref("vmem", 0, "f32[128]{0}"))]), timing_only=True
    )
    per_channel = V5E.hbm_bytes_per_cycle / V5E.hbm.channels
    assert dma_rows(v5e) == [(0, 64 + ceil(512 / (2 * per_channel)) + V5E.cycles(V5E.hbm.latency_ns))]


def test_two_concurrent_streams_each_get_half():
    n = 16 << 20
    shape = f"u8[{n}]{{0}}"
    ins = [
        DmaStart(ref("hbm", 0, shape), ref("vmem", 0, shape), sem=0),
        DmaStart(ref("hbm", n, shape), ref("vmem", n, shape), sem=0),
        SemWait(0, 2),
    ]
    res = Chip(V5E).run(Program.single(ins), timing_only=True)
    latency = V5E.cycles(V5E.hbm.latency_ns)
    for start, end in dma_rows(res):
        rate = n / (end - start - V5E.dma.setup_cycles - latency)
        assert rate == pytest.approx(V5E.hbm_bytes_per_cycle / 2, rel=0.01)


def test_short_contiguous_runs_cost_by_the_documented_rule():
    src = "f32[256,256]{1,0}"
    columns = Window((0, 0), (256, 4))  # 256 runs of 16 bytes, 1 KiB apart
    rows = Window((0, 0), (4, 256))  # 4 runs of 1 KiB
    cfg = V5E
    setup, latency = cfg.dma.setup_cycles, cfg.cycles(cfg.hbm.latency_ns)

    def cycles(window, dst):
        res = Chip(cfg).run(
            Program.single([DmaStart(ref("hbm", 0, src, window), ref("vmem", 0, dst))]), timing_only=True
        )
        ((start, end),) = dma_rows(res)
        return end - start

    short = cycles(columns, "f32[256,4]{1,0}")
    long = cycles(rows, "f32[4,256]{1,0}")
    # Rule: rate = min(runs_per_cycle * payload / runs, HBM bytes/cycle / (burst-rounded bytes / payload), ...)
    payload = 4096
    burst = cfg.dma.burst_bytes
    short_rate = min(cfg.dma.runs_per_cycle * payload / 256, cfg.hbm_bytes_per_cycle / (256 * burst / payload))
    long_rate = min(cfg.dma.runs_per_cycle * payload / 4, cfg.hbm_bytes_per_cycle)
    assert short == setup + ceil(payload / short_rate) + latency
    assert long == setup + ceil(payload / long_rate) + latency
    assert short > 10 * (long - setup - latency)


def test_transfer_plan_counts_runs_on_both_sides():
    row_major = parse_shape("f32[16,16]{1,0}")
    tiled = parse_shape("f32[16,16]{1,0:T(8,8)}")
    same = transfer_plan(row_major, None, row_major, None, (16, 16))
    assert (same.payload, same.runs) == (1024, 1)
    relayout = transfer_plan(row_major, None, tiled, None, (16, 16))
    # every 8-element piece of a row starts a new run in the tiled destination, except where the end of
    # tile row (7, 8:16) meets the start of (8, 0:8): both sides continue there
    assert relayout.runs == 31
    assert len(relayout.src_runs[0]) == 1 and len(relayout.dst_runs[0]) == 1  # each side alone is contiguous


def test_runs_step_over_padding_both_sides_share_when_the_destination_is_whole():
    # bf16 (4,128)(2,1) tiles of 3 rows: the third row shares each 32-bit word with a padding half, so
    # element by element every value of that row is a run of its own.
    src = parse_shape("bf16[16,3,512]{2,1,0:T(4,128)(2,1)}")
    dst = parse_shape("bf16[16,3,256]{2,1,0:T(4,128)(2,1)}")
    strict = transfer_plan(src, (0, 0, 0), dst, None, (16, 3, 256))
    assert strict.runs >= 16 * 256
    # A burst-moving engine copies the padding halves with the run: one run per [3,256] slab (two whole
    # tiles, contiguous on both sides), sixteen in all.
    burst = transfer_plan(src, (0, 0, 0), dst, None, (16, 3, 256), 32)
    assert burst.runs == 16
    assert burst.payload == strict.payload  # the payload is the window's elements either way
    # Into a window of a bigger destination the gaps may hold other values: no stepping over them.
    bigger = parse_shape("bf16[16,3,512]{2,1,0:T(4,128)(2,1)}")
    assert transfer_plan(src, (0, 0, 0), bigger, (0, 0, 0), (16, 3, 256), 32).runs == strict.runs


def test_engine_count_limits_concurrency():
    cfg = with_overrides(TEACH, {"dma.engines": 2})
    shape = "f32[64]{0}"  # 256 bytes: 4 + 256 / 16 = 20 cycles of engine time, then 20 of latency
    ins = [DmaStart(ref("hbm", 0x400 * i, shape), ref("vmem", 0x400 * i, shape), sem=0) for i in range(3)]
    res = Chip(cfg).run(Program.single([*ins, SemWait(0, 3)]), timing_only=True)
    # Flows start after 4 setup cycles and share HBM's 16 bytes/cycle: the first runs alone for one cycle
    # (16 bytes), then both run at 8 bytes/cycle; the first finishes its last 240 bytes at 5 + 30 = 35, which
    # frees an engine for the third. The second finishes alone at 36; ends add 20 cycles of latency.
    assert sorted(dma_rows(res)) == [(0, 55), (1, 56), (35, 35 + 4 + 16 + 20)]


def test_dma_moves_real_bytes_between_layouts_and_windows():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 24)).astype(np.float32)
    syms = [
        Symbol("x", ref("hbm", 0, "f32[32,24]{1,0}")),
        Symbol("tile", ref("vmem", 0, "f32[16,16]{0,1:T(8,8)}")),
        Symbol("back", ref("hbm", 0x2000, "f32[32,24]{1,0:T(8,8)}")),
        Symbol("clamped", ref("hbm", 0x6000, "f32[8,8]{1,0}")),
    ]
    s = {x.name: x.ref for x in syms}
    prog = Program.single(
        [
            ScalarAlu("mov", Reg(1), 8),
            ScalarAlu("mov", Reg(2), 20),
            DmaStart(ref("hbm", 0, "f32[32,24]{1,0}", Window((Reg(1), 4), (16, 16))), s["tile"], sem=0),
            SemWait(0),
            DmaStart(s["tile"], ref("hbm", 0x2000, "f32[32,24]{1,0:T(8,8)}", Window((0, 8), (16, 16))), sem=0),
            DmaStart(
                ref("hbm", 0, "f32[32,24]{1,0}", Window((Reg(2), Reg(2)), (8, 8), clamp=True)), s["clamped"], sem=0
            ),
            SemWait(0, 2),
        ],
        symbols=syms,
    )
    res = Chip(TEACH).run(prog, {"x": x})
    np.testing.assert_array_equal(res.read("tile"), x[8:24, 4:20])
    np.testing.assert_array_equal(res.read("back")[0:16, 8:24], x[8:24, 4:20])
    assert not res.read("back")[16:].any()
    np.testing.assert_array_equal(res.read("clamped"), x[20:28, 16:24])  # column start 20 clamped to 24 - 8


def test_scalars_move_between_tiled_and_plain_layouts():
    # A loop condition or a dynamic-slice index is a rank-0 array: its window has no dimensions.
    syms = [Symbol("a", ref("hbm", 0, "s32[]{:T(128)}")), Symbol("b", ref("smem", 0, "s32[]"))]
    prog = Program.single([DmaStart(syms[0].ref, syms[1].ref, sem=0), SemWait(0)], symbols=syms)
    res = Chip(TEACH).run(prog, {"a": np.array(-7, np.int32)})
    assert res.read("b").shape == () and int(res.read("b")) == -7


def test_sub_byte_elements_move_exactly():
    vals = np.arange(-8, 8, dtype=np.int8).reshape(4, 4).astype("int4")
    syms = [Symbol("a", ref("hbm", 0, "s4[4,4]{1,0:E(4)}")), Symbol("b", ref("vmem", 0, "s4[4,4]{0,1:E(4)}"))]
    prog = Program.single([DmaStart(syms[0].ref, syms[1].ref, sem=0), SemWait(0)], symbols=syms)
    res = Chip(TEACH).run(prog, {"a": vals})
    np.testing.assert_array_equal(res.read("b"), vals)


def test_remote_dma_crosses_the_link():
    system = System(TEACH, 2)
    shape = "f32[64]{0}"
    data = np.arange(64, dtype=np.float32)
    prog = Program(
        (
            Stream(
                0,
                (DmaStart(ref("hbm", 0, shape), ref("hbm", 0x1000, shape), sem=0, chip=1, dst_sem=1), SemWait(0)),
                chip=0,
            ),
            Stream(0, (SemWait(1),), chip=1),
        ),
        (Symbol("src", ref("hbm", 0, shape), chip=0), Symbol("dst", ref("hbm", 0x1000, shape), chip=1)),
    )
    res = system.run(prog, {"src": data})
    np.testing.assert_array_equal(res.read("dst"), data)
    # one hop: 256 bytes at 8 bytes/cycle on the link (HBM sides are faster), HBM latency + one hop latency
    ((start, end),) = dma_rows(res)
    assert end - start == 4 + 256 // 8 + 20 + 10
    assert res.cycles == end + 1  # the remote core's wait ends the cycle after the data landed


def test_pushes_to_one_semaphore_land_in_the_order_they_were_issued():
    """A large push then a small one to the same semaphore of another chip: the small one finishes moving
    first (the two share the link), but lands only after the large one, so a receiver that waits for one
    arrival and copies the first buffer reads its data, not zeros (a ring's block-by-block waits)."""
    system = System(TEACH, 2)
    big, small = "f32[256]{0}", "f32[4]{0}"
    data = np.arange(256, dtype=np.float32)
    prog = Program(
        (
            Stream(
                0,
                (
                    DmaStart(ref("hbm", 0, big), ref("hbm", 0x1000, big), sem=0, chip=1, dst_sem=1),
                    DmaStart(ref("hbm", 0x400, small), ref("hbm", 0x1400, small), sem=0, chip=1, dst_sem=1),
                    SemWait(0, 2),
                ),
                chip=0,
            ),
            Stream(
                0,
                (SemWait(1), DmaStart(ref("hbm", 0x1000, big), ref("hbm", 0x2000, big), sem=2), SemWait(2), SemWait(1)),
                chip=1,
            ),
        ),
        (Symbol("src", ref("hbm", 0, big), chip=0), Symbol("copy", ref("hbm", 0x2000, big), chip=1)),
    )
    res = system.run(prog, {"src": data})
    np.testing.assert_array_equal(res.read("copy"), data)
    pushes = sorted((s, e) for s, u, _, e, _, _ in res.trace.rows() if u == "chip0.core0.dma")
    assert len(pushes) == 2 and pushes[1][1] >= pushes[0][1]  # the small push completes with the large one


def test_out_of_range_and_oversized_operands_are_named():
    big = "f32[128,128]{1,0}"  # 64 KiB: fills the teaching chip's VMEM exactly from 0
    with pytest.raises(
        ExecutionError,
        match=r"instruction 0 `dma.start .*\(from HLO copy.2\): operand vmem\[0x10\].*"
        r"fall outside vmem of chip 0 core 0 \(capacity 0x10000 bytes\)",
    ):
        Chip(TEACH).run(Program.single([DmaStart(ref("hbm", 0, big), ref("vmem", 0x10, big), hlo="copy.2")]))
    prog = Program.single(
        [
            ScalarAlu("mov", Reg(1), 9),
            DmaStart(ref("hbm", 0, "f32[16]{0}", Window((Reg(1),), (8,))), ref("vmem", 0, "f32[8]{0}")),
        ]
    )
    with pytest.raises(
        ExecutionError, match=r"instruction 1 .*window start 9 \(from s1\) puts dimension 0 at \[9, 17\)"
    ):
        Chip(TEACH).run(prog)
    with pytest.raises(ExecutionError, match=r"destination chip 3 does not exist \(the system has 1\)"):
        Chip(TEACH).run(Program.single([DmaStart(ref("hbm", 0, "f32[4]"), ref("hbm", 64, "f32[4]"), chip=3)]))


def test_memories_cost_only_what_is_touched():
    cfg = load_config("tpu_v5p")  # 95 GiB of HBM
    top = cfg.hbm.bytes - (1 << 20)
    shape = "f32[256,256]{1,0}"
    data = np.arange(65536, dtype=np.float32).reshape(256, 256)
    syms = [Symbol("lo", ref("hbm", 0, shape)), Symbol("hi", ref("hbm", top, shape))]
    prog = Program.single([DmaStart(syms[0].ref, syms[1].ref, sem=0), SemWait(0)], symbols=syms)
    res = Chip(cfg).run(prog, {"lo": data})
    np.testing.assert_array_equal(res.read("hi"), data)
    assert res.memory("hbm").touched < (4 << 20)
