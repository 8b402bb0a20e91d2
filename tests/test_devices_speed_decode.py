"""Decoded streams are shared by the cores that run them and reused by later runs (tpusim/devices/decode.py):
nothing of one run, core or chip may leak into another through them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tpusim.config import load_config, with_overrides
from tpusim.devices import Chip, ExecutionError, System
from tpusim.devices.decode import decoded_stream
from tpusim.isa import (
    Const,
    DmaStart,
    MemRef,
    MxuLoadWeights,
    MxuMatmul,
    MxuPop,
    Program,
    Reg,
    ScalarAlu,
    ScalarStore,
    SemWait,
    Space,
    Stream,
    Symbol,
    VpuMap,
)
from tpusim.memory import parse_shape

TEACH = load_config("teaching")


def ref(space: str, address: int, shape: str) -> MemRef:
    return MemRef(Space(space), address, parse_shape(shape))


def axpy() -> Program:
    x_hbm, y_hbm = ref("hbm", 0, "f32[16,8]{1,0:T(8,8)}"), ref("hbm", 0x400, "f32[16,8]{1,0:T(8,8)}")
    x, y = ref("vmem", 0, "f32[16,8]{1,0:T(8,8)}"), ref("vmem", 0x400, "f32[16,8]{1,0:T(8,8)}")
    ins = [
        DmaStart(x_hbm, x, sem=0),
        SemWait(0),
        VpuMap("multiply", y, (x, Const(2.0, "f32"))),
        VpuMap("add", y, (y, x)),
        DmaStart(y, y_hbm, sem=1),
        SemWait(1),
    ]
    return Program.single(ins, symbols=[Symbol("x", x_hbm), Symbol("y", y_hbm)])


def test_repeated_runs_reuse_the_decode_and_agree():
    prog = axpy()
    x = np.arange(128, dtype=np.float32).reshape(16, 8)
    first = Chip(TEACH).run(prog, {"x": x})
    again = Chip(TEACH).run(prog, {"x": 2 * x})
    # the second run decoded nothing: it found the first run's decoded stream
    assert again._machine.cores[0].decoding is first._machine.cores[0].decoding
    np.testing.assert_array_equal(first.read("y"), 3 * x)
    np.testing.assert_array_equal(again.read("y"), 6 * x)  # fresh memories: no value of the first run remains
    assert first.trace.rows() == again.trace.rows() and first.cycles == again.cycles == 122


def test_mode_and_config_are_part_of_the_key():
    prog = axpy()
    x = np.ones((16, 8), np.float32)
    timed = Chip(TEACH).run(prog, {"x": x}, timing_only=True)
    full = Chip(TEACH).run(prog, {"x": x})
    assert timed._machine.cores[0].decoding is not full._machine.cores[0].decoding
    assert not timed.read("y").any()  # timing-only moved no bytes
    np.testing.assert_array_equal(full.read("y"), 3 * x)
    # a config with fewer registers must decode again (and refuse s9), an equal one may share
    uses_s9 = Program.single([ScalarAlu("mov", Reg(9), 1)])
    Chip(TEACH).run(uses_s9)
    with pytest.raises(ExecutionError, match="register s9 does not exist"):
        Chip(with_overrides(TEACH, {"core.scalar_registers": 8})).run(uses_s9)
    one = Chip(TEACH).run(uses_s9)._machine.cores[0].decoding
    assert Chip(load_config("teaching")).run(uses_s9)._machine.cores[0].decoding is one


def test_a_failed_decode_is_not_kept():
    prog = Program.single([ScalarAlu("mov", Reg(99), 1)])
    for _ in range(2):
        with pytest.raises(ExecutionError, match="register s99 does not exist"):
            Chip(TEACH).run(prog)


def test_cores_on_different_chips_share_the_stream_not_their_facts():
    """One SPMD stream on four chips: chip_id, each chip's memories and semaphores stay per core."""
    shape = "s32[]"
    out = ref("smem", 0, shape)
    x_hbm, x = ref("hbm", 0, "f32[8,8]{1,0:T(8,8)}"), ref("vmem", 0, "f32[8,8]{1,0:T(8,8)}")
    ins = (
        ScalarAlu("chip_id", Reg(1)),
        ScalarAlu("mul", Reg(2), Reg(1), 10),
        ScalarStore(out, Reg(2)),
        DmaStart(x_hbm, x, sem=0),
        SemWait(0),
    )
    prog = Program((Stream(0, ins),), (Symbol("out", out), Symbol("x", x_hbm), Symbol("xv", x)))
    data = [np.full((8, 8), c, np.float32) for c in range(4)]
    res = System(TEACH, 4).run(prog, {"x": data})
    decodings = {id(c.decoding) for c in res._machine.cores}
    assert len(decodings) == 1  # one decode for the four cores
    for c in range(4):
        assert int(res.read("out", chip=c)) == 10 * c
        np.testing.assert_array_equal(res.read("xv", chip=c), data[c])


def test_mxu_state_and_dma_facts_are_per_run():
    t8 = "bf16[8,8]{1,0:T(8,8)(2,1)}"
    w, a, p = ref("vmem", 0, t8), ref("vmem", 0x100, t8), ref("vmem", 0x200, "f32[8,8]{1,0:T(8,8)}")
    prog = Program.single(
        [MxuLoadWeights(0, w), MxuMatmul(0, a), MxuPop(0, p)],
        symbols=[Symbol("w", w), Symbol("a", a), Symbol("p", p)],
    )
    rng = np.random.default_rng(0)
    for _ in range(3):
        wv, av = (rng.standard_normal((8, 8)).astype("bfloat16") for _ in range(2))
        got = Chip(TEACH).run(prog, {"w": wv, "a": av}).read("p")
        np.testing.assert_array_equal(got, av.astype(np.float32) @ wv.astype(np.float32))


def test_the_cache_is_bounded_and_keeps_what_it_holds_alive():
    from tpusim.devices import decode

    first = axpy()
    Chip(TEACH).run(first)
    for _ in range(2 * decode._CACHE_SIZE):
        Chip(TEACH).run(axpy())  # new program objects push the first out
    assert len(decode._CACHE) <= decode._CACHE_SIZE
    assert all(d.program is not first for d in decode._CACHE.values())
    core = Chip(TEACH).run(first)._machine.cores[0]
    assert decoded_stream(core) is core.decoding  # and it is decoded again, then found


def test_the_register_scan_reads_every_field_that_can_hold_a_register():
    """Decoding checks register numbers only in fields whose type can hold a register or a memory reference
    (a speed-up); on real programs that finds exactly the registers a scan of every field finds."""
    from tpusim.api import compile_program
    from tpusim.devices.decode import _registers
    from tpusim.isa import MemRef, Reg
    from tpusim.isa.kernels import matmul_relu_loop_nest

    def every_field(ins):
        out = []
        for name in ins.__dataclass_fields__:
            v = getattr(ins, name)
            for x in v if isinstance(v, tuple) else (v,):
                if isinstance(x, Reg):
                    out.append(x)
                elif isinstance(x, MemRef) and (x.base is not None or x.window is not None):
                    out.extend(x.registers)
        return out

    examples = Path(__file__).resolve().parents[1] / "examples"
    programs = [compile_program(examples / name, config="tpu_v5e").program for name in ("attention_bf16.hlo",)]
    # loops with register-relative windows, and collectives (chip ids, ring positions, dynamic windows)
    programs.append(matmul_relu_loop_nest(1024))
    spmd = with_overrides(load_config("tpu_v5e"), {"ici.shape": [8]})
    programs.append(compile_program(examples / "spmd" / "dp_train_step_f32_8chips.hlo", config=spmd).program)
    seen = 0
    for program in programs:
        for stream in program.streams:
            for ins in stream.instructions:
                assert _registers(ins) == every_field(ins), ins
                seen += bool(every_field(ins))
    assert seen > 100


def test_equal_instructions_share_one_decoding_at_their_own_index():
    """An unrolled kernel repeats equal instructions (its slots rotate); they share one decoding (one object
    in the decoded stream: decoding is paid per distinct instruction, not per executed one), and each entry
    still runs at its own index (a trace row and the next pc name it)."""
    x, y = ref("vmem", 0, "f32[16,8]{1,0:T(8,8)}"), ref("vmem", 0x400, "f32[16,8]{1,0:T(8,8)}")

    def double() -> VpuMap:  # a new instruction object each time, equal in value
        return VpuMap("multiply", y, (x, Const(2.0, "f32")))

    prog = Program.single([double(), VpuMap("add", y, (y, x)), double()], symbols=[Symbol("y", y)])
    res = Chip(TEACH).run(prog, {})
    decoded = res._machine.cores[0].decoding.decoded
    assert decoded[0] is decoded[2] and decoded[1] is not decoded[0]
    assert sorted(res.trace.index.tolist()) == [0, 1, 2]


def test_fixed_windows_share_costs_across_tile_periods_and_move_the_right_bytes():
    """A transfer's costs are computed at its window's offsets reduced by the layout's tiles (and shifted
    back): four DMAs of 8-row windows of a [32,8] array in (8,8) tiles share one cost, and each moves its
    own rows (the numeric copy applies the shift)."""
    from tpusim.devices.dma import strided_plan
    from tpusim.isa import Window

    big, part = "f32[32,8]{1,0:T(8,8)}", "f32[8,8]{1,0:T(8,8)}"
    src = ref("hbm", 0, big)
    dst = ref("vmem", 0, big)
    moves = [
        DmaStart(
            MemRef(Space.HBM, 0, src.shape, Window((8 * k, 0), (8, 8))), ref("vmem", 0x1000 * (k + 1), part), sem=0
        )
        for k in range(4)
    ]
    back = [
        DmaStart(
            ref("vmem", 0x1000 * (k + 1), part),
            MemRef(Space.VMEM, 0, dst.shape, Window((8 * (3 - k), 0), (8, 8))),
            sem=0,
        )
        for k in range(4)
    ]
    prog = Program.single([*moves, SemWait(0, 4), *back, SemWait(0, 4)], symbols=[Symbol("x", src), Symbol("y", dst)])
    x = np.arange(256, dtype=np.float32).reshape(32, 8)
    strided_plan.cache_clear()
    for _ in range(2):  # (the second run takes the fixed-window path with the facts the first one kept)
        got = Chip(TEACH).run(prog, {"x": x}).read("y")
        np.testing.assert_array_equal(got, x.reshape(4, 8, 8)[::-1].reshape(32, 8))  # the blocks in reverse order
    Chip(TEACH).run(prog, {"x": x}, timing_only=True)
    info = strided_plan.cache_info()
    assert info.misses <= 2 < info.hits  # (one cost per direction; the other six transfers find it)


def test_the_matmul_emitter_appends_repeated_instructions_as_one_object() -> None:
    """An unrolled product's weight loads and matmuls repeat (its slots rotate); the compiler builds each once
    and appends the same object again, so decoding finds the repeats by identity (and the program holds one
    object per distinct instruction)."""
    from tpusim.api import compile_program

    text = (
        "HloModule mm\nENTRY e {\n  a = bf16[512,1024] parameter(0)\n  b = bf16[1024,1024] parameter(1)\n"
        "  ROOT d = f32[512,1024] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n"
    )
    program = compile_program(text, config="tpu_v5e").program
    loads = [i for i in program.streams[0].instructions if isinstance(i, MxuLoadWeights)]
    assert len({id(i) for i in loads}) < len(loads)
    assert len({id(i) for i in loads}) == len(set(loads))  # (equal loads are one object)
