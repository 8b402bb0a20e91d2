"""The sequencer: exact timelines, hazards, queues, semaphores, barriers, loops, fallbacks and deadlocks."""

from __future__ import annotations

import numpy as np
import pytest

from tpusim.api import reference_evaluator
from tpusim.config import load_config, with_overrides
from tpusim.devices import Chip, DeadlockError, ExecutionError, System
from tpusim.isa import (
    ASYNC_SEQUENCER,
    Barrier,
    Branch,
    Const,
    DmaStart,
    Fallback,
    FallbackKernel,
    Halt,
    IsaError,
    Jump,
    MemRef,
    MxuPop,
    Program,
    Reg,
    ScalarAlu,
    ScalarLoad,
    ScalarStore,
    SemSignal,
    SemWait,
    Space,
    Stream,
    StreamBuilder,
    Symbol,
    VpuMap,
    Window,
    parse_program,
)
from tpusim.memory import parse_shape

TEACH = load_config("teaching")
TWO_CORES = with_overrides(TEACH, {"core.count": 2})


def ref(space: str, address: int, shape: str) -> MemRef:
    return MemRef(Space(space), address, parse_shape(shape))


X_HBM = ref("hbm", 0x0, "f32[16,8]{1,0:T(8,8)}")  # 512 bytes, 2 registers
X = ref("vmem", 0x0, "f32[16,8]{1,0:T(8,8)}")
Y = ref("vmem", 0x400, "f32[16,8]{1,0:T(8,8)}")
Y_HBM = ref("hbm", 0x400, "f32[16,8]{1,0:T(8,8)}")
LONG = ref("vmem", 0x1000, "f32[64,8]{1,0:T(8,8)}")  # 16 registers


def test_exact_timeline_of_a_small_program():
    text = """program "axpy"
symbol x hbm[0x0] f32[16,8]{1,0:T(8,8)}
symbol y hbm[0x400] f32[16,8]{1,0:T(8,8)}
stream core=0 chip=*
  dma.start hbm[0x0] f32[16,8]{1,0:T(8,8)} -> vmem[0x0] f32[16,8]{1,0:T(8,8)} sem=0 @x.copy
  sem.wait sem=0 count=1
  vpu.multiply vmem[0x400] f32[16,8]{1,0:T(8,8)} <- vmem[0x0] f32[16,8]{1,0:T(8,8)}, f32(2.0) @mul
  vpu.add vmem[0x400] f32[16,8]{1,0:T(8,8)} <- vmem[0x400] f32[16,8]{1,0:T(8,8)}, vmem[0x0] f32[16,8]{1,0:T(8,8)} @add
  dma.start vmem[0x400] f32[16,8]{1,0:T(8,8)} -> hbm[0x400] f32[16,8]{1,0:T(8,8)} sem=1 @y.copy
  sem.wait sem=1 count=1
"""
    prog = parse_program(text)
    x = np.arange(128, dtype=np.float32).reshape(16, 8)
    res = Chip(TEACH).run(prog, {"x": x})
    np.testing.assert_array_equal(res.read("y"), 3 * x)
    lines = text.strip().split("\n")[4:]
    u = "chip0.core0."
    # DMA: 4 setup + 512 bytes at 16 bytes/cycle (one run, both channels) + 20 latency = 56.
    # multiply: 2 registers, 1 per cycle, +2 latency: 57..61. add (issued at 58) waits for the multiply's
    # result (RAW): 61..65. The outgoing DMA (issued at 59) waits for the add: engine at 65, done 65 + 56.
    assert res.trace.rows() == [
        (0, u + "dma", lines[0].strip(), 56, 512, 0),
        (1, u + "sync", lines[1].strip(), 57, 0, 0),
        (57, u + "vpu", lines[2].strip(), 61, 1024, 128),
        (60, u + "sync", lines[5].strip(), 122, 0, 0),  # reached at 60, waits for the outgoing DMA
        (61, u + "vpu", lines[3].strip(), 65, 1536, 128),
        (65, u + "dma", lines[4].strip(), 121, 512, 0),
    ]
    assert res.cycles == 122
    assert list(res.trace.hlo) == ["x.copy", "", "mul", "", "add", "y.copy"]


def test_compute_reading_an_in_flight_dma_stalls_the_sequencer():
    # no semaphore wait: the scoreboard holds the VPU op until the DMA has landed
    prog = Program.single([DmaStart(X_HBM, X), VpuMap("negate", Y, (X,)), ScalarAlu("mov", Reg(1), 1)])
    res = Chip(TEACH).run(prog)
    rows = res.trace.rows()
    assert rows[0][3] == 56 and rows[1][0] == 56  # the negate starts when the DMA completes
    assert rows[2][0] == 57  # and the sequencer was held there (in-order issue)


def test_writing_what_a_dma_still_reads_waits_for_it():
    prog = Program.single([DmaStart(X, X_HBM), VpuMap("negate", X, (Y,))])
    rows = Chip(TEACH).run(prog, timing_only=True).trace.rows()
    assert rows[1][0] == rows[0][3]  # WAR: the overwrite starts when the DMA is done


def test_compute_hazards_delay_the_unit_not_the_sequencer():
    slow = ref("vmem", 0x1000, "f32[64,8]{1,0:T(8,8)}")  # 8 registers on the transcendental path: 16 + 6 cycles
    small = ref("vmem", 0x2000, "f32[8,8]{1,0:T(8,8)}")
    prog = Program.single(
        [
            VpuMap("exponential", slow, (slow,)),
            VpuMap("negate", ref("vmem", 0x3000, "f32[64,8]{1,0:T(8,8)}"), (slow,)),  # RAW on the result
            ScalarAlu("mov", Reg(1), 2),
            VpuMap("negate", small, (small,)),
        ]
    )
    res = Chip(TEACH).run(prog, timing_only=True)
    rows = {
        res.trace.index[i]: (res.trace.issue[i], res.trace.start[i], res.trace.end[i]) for i in range(len(res.trace))
    }
    assert rows[0] == (0, 0, 22)
    assert rows[1] == (1, 22, 22 + 8 + 2)  # issued at 1, started when the exponential's last result was ready
    assert rows[2] == (2, 2, 3)  # the sequencer did not wait
    assert rows[3] == (3, 30, 33)  # the independent op still queues behind the VPU's FIFO


def test_full_unit_queue_stalls_issue():
    cfg = TEACH  # queue depth 4
    big = ref("vmem", 0x0, "f32[80,8]{1,0:T(8,8)}")  # 10 registers: 10 cycles each
    prog = Program.single(
        [VpuMap("negate", ref("vmem", 0x4000 + 0x1000 * i, "f32[80,8]{1,0:T(8,8)}"), (big,)) for i in range(7)]
    )
    res = Chip(cfg).run(prog, timing_only=True)
    starts = [10 * i for i in range(7)]
    assert res.trace.start.tolist() == starts
    # Four may wait while one runs. The sequencer reaches the 6th at cycle 5 but can only queue it when the
    # 2nd starts (10), so it reaches the 7th at 11 and queues it when the 3rd starts (20).
    assert res.trace.issue.tolist() == [0, 1, 2, 3, 4, 5, 11]
    assert res.cycles == 7 * 10 + 2


def test_loops_are_executed_not_unrolled():
    b = StreamBuilder()
    b.emit(ScalarAlu("mov", Reg(1), 0))
    b.label("loop")
    b.emit(VpuMap("add", X, (X, Const(1.0, "f32"))))
    b.emit(ScalarAlu("add", Reg(1), Reg(1), 1), Branch("lt", Reg(1), 5, "loop"))
    b.emit(DmaStart(X, X_HBM, sem=0), SemWait(0))
    prog = Program((b.build(),), (Symbol("x", X_HBM),))
    res = Chip(TEACH).run(prog)
    assert len(prog.streams[0].instructions) == 6
    assert np.bincount(res.trace.index).tolist() == [1, 5, 5, 5, 1, 1]
    np.testing.assert_array_equal(res.read("x"), np.full((16, 8), 5.0, np.float32))


def test_while_loop_on_a_value_computed_by_the_vpu():
    count = ref("vmem", 0x800, "s32[1]{0}")
    flag = ref("vmem", 0x900, "pred[1]{0}")

    def program(control: bool) -> Program:
        b = StreamBuilder()
        b.label("body")
        b.emit(VpuMap("add", count, (count, Const(1, "s32")), control=control))
        b.emit(VpuMap("compare", flag, (count, Const(7, "s32")), direction="LT", control=control))
        b.emit(ScalarLoad(Reg(1), flag), Branch("ne", Reg(1), 0, "body"))
        b.emit(ScalarStore(ref("smem", 0, "s32[]"), Reg(1)))
        return Program((b.build(),))

    for timing_only in (False, True):
        res = Chip(TEACH).run(program(True), timing_only=timing_only)
        assert np.bincount(res.trace.index)[0] == 7  # the condition was evaluated on real values
    # without the control flag a timing-only run skips the VPU's numbers: the loop exits at once
    assert np.bincount(Chip(TEACH).run(program(False), timing_only=True).trace.index)[0] == 1


def test_scalar_unit_arithmetic():
    regs = [
        ScalarAlu("mov", Reg(1), -7),
        ScalarAlu("div", Reg(2), Reg(1), 2),  # truncates toward zero
        ScalarAlu("rem", Reg(3), Reg(1), 2),
        ScalarAlu("mov", Reg(4), 0x7FFFFFFF),
        ScalarAlu("add", Reg(4), Reg(4), 1),  # wraps
        ScalarAlu("shr", Reg(5), Reg(1), 28),  # logical
        ScalarAlu("sra", Reg(6), Reg(1), 1),  # arithmetic
        ScalarAlu("lt", Reg(7), Reg(1), 0),
        ScalarAlu("chip_id", Reg(8)),
    ]
    table = ref("smem", 0, "s32[8]{0}")
    stores = [ScalarStore(MemRef(Space.SMEM, 0, table.shape, Window((i,), (1,))), Reg(i + 1)) for i in range(8)]
    res = Chip(TEACH).run(Program.single(regs + stores, symbols=[Symbol("t", table)]))
    assert res.read("t").tolist() == [-7, -3, -1, -(2**31), 15, -4, 1, 0]
    with pytest.raises(ExecutionError, match=r"instruction 1 `s.div s2 <- s1, 0`: s.div by zero"):
        Chip(TEACH).run(Program.single([ScalarAlu("mov", Reg(1), 1), ScalarAlu("div", Reg(2), Reg(1), 0)]))


def test_scalar_load_latency_and_halt():
    prog = Program.single(
        [
            ScalarLoad(Reg(1), ref("smem", 0, "s32[]")),
            ScalarLoad(Reg(2), ref("vmem", 0, "s8[]")),
            Halt(),
            ScalarAlu("mov", Reg(3), 1),
        ]
    )
    rows = Chip(TEACH).run(prog).trace.rows()
    assert [(r[0], r[3]) for r in rows] == [(0, 1), (1, 5), (5, 6)]  # smem 1 cycle, vmem 4; nothing after halt


def test_semaphores_between_cores():
    prog = Program(
        (
            Stream(0, (VpuMap("exponential", X, (X,)), SemSignal(2, core=1), SemWait(3))),
            Stream(1, (SemWait(2), SemSignal(3, core=0, count=1))),
        )
    )
    res = System(TWO_CORES).run(prog, timing_only=True)
    rows = {(u, text.split()[0]): (s, e) for s, u, text, e, _, _ in res.trace.rows()}
    # core 0 signals at its issue cycle 1 (the signal does not wait for the exponential)
    assert rows[("chip0.core1.sync", "sem.wait")] == (0, 2)
    assert rows[("chip0.core0.sync", "sem.wait")] == (2, 3)


def test_a_fenced_signal_leaves_when_the_compute_before_it_has_completed():
    """``sem.signal fence`` (a ring's credit: the vector unit has read the buffer) leaves when the
    exponential issued before it ends; the sequencer itself goes on at once (its scalar op issues next)."""
    for fence in (False, True):
        prog = Program(
            (
                Stream(
                    0,
                    (
                        VpuMap("exponential", LONG, (LONG,)),
                        SemSignal(2, core=1, fence=fence),
                        ScalarAlu("mov", Reg(1), 1),
                    ),
                ),
                Stream(1, (SemWait(2),)),
            )
        )
        res = System(TWO_CORES).run(prog, timing_only=True)
        rows = {(u, text.split()[0]): (s, e) for s, u, text, e, _, _ in res.trace.rows()}
        leaves = rows[("chip0.core0.vpu", "vpu.exponential")][1] if fence else 1  # (issued at cycle 1)
        assert leaves > 20 or not fence
        assert rows[("chip0.core1.sync", "sem.wait")] == (0, leaves + 1)
        assert rows[("chip0.core0.scalar", "s.mov")][0] == 2


def test_the_async_sequencer_moves_data_while_the_main_one_computes():
    """A core's async sequencer (``sequencer=1``) waits for the main sequencer's signal, copies through the
    core's DMA engines and signals back; the main sequencer computes meanwhile and its wait ends when the
    copy lands. Both wait on the core's one semaphore bank at once."""
    long = ref("vmem", 0x1000, "f32[64,8]{1,0:T(8,8)}")
    prog = Program(
        (
            Stream(0, (SemSignal(0), VpuMap("exponential", long, (long,)), SemWait(1), VpuMap("negate", Y, (X,)))),
            Stream(0, (SemWait(0), DmaStart(X_HBM, X, sem=2), SemWait(2), SemSignal(1)), sequencer=ASYNC_SEQUENCER),
        )
    )
    res = Chip(TEACH).run(prog, timing_only=True)
    u = "chip0.core0."
    assert [(r[0], r[1], r[2].split()[0], r[3]) for r in res.trace.rows()] == [
        (0, u + "sync", "sem.signal", 1),
        (0, u + "async.sync", "sem.wait", 1),
        (1, u + "vpu", "vpu.exponential", 23),  # at once: the copy does not hold the main sequencer
        (1, u + "dma", "dma.start", 57),  # the core's DMA unit, issued by the async sequencer
        (2, u + "sync", "sem.wait", 58),  # both sequencers wait at once
        (2, u + "async.sync", "sem.wait", 58),
        (58, u + "async.sync", "sem.signal", 59),
        (58, u + "vpu", "vpu.negate", 62),  # after the async sequencer's signal
    ]


def test_the_async_sequencer_issues_into_the_cores_vector_unit():
    """Its vector instructions take the core's one vector unit in issue order: the negate (8 registers)
    starts when the exponential (16 registers, issued first) leaves the unit free."""
    long = ref("vmem", 0x1000, "f32[64,8]{1,0:T(8,8)}")
    other = ref("vmem", 0x2000, "f32[64,8]{1,0:T(8,8)}")
    prog = Program(
        (
            Stream(0, (VpuMap("exponential", long, (long,)),)),
            Stream(0, (VpuMap("negate", other, (other,)),), sequencer=ASYNC_SEQUENCER),
        )
    )
    rows = [(r[0], r[1], r[2].split()[0], r[3]) for r in Chip(TEACH).run(prog, timing_only=True).trace.rows()]
    assert rows == [(0, "chip0.core0.vpu", "vpu.exponential", 22), (16, "chip0.core0.vpu", "vpu.negate", 26)]


def test_an_async_sequencer_needs_a_main_stream_and_issues_no_matrix_work():
    with pytest.raises(ExecutionError, match="core 0 of chip 0 has no main stream"):
        Chip(TEACH).run(Program((Stream(0, (Halt(),), sequencer=ASYNC_SEQUENCER),)))
    with pytest.raises(IsaError, match="instruction 0 is a MxuPop; the async sequencer issues only DmaStart"):
        Stream(0, (MxuPop(0, X),), sequencer=ASYNC_SEQUENCER)


def test_remote_signal_arrives_after_the_hops():
    system = System(TEACH, 3)
    prog = Program(
        (
            Stream(0, (SemSignal(0, chip=2),), chip=0),
            Stream(0, (SemWait(0),), chip=2),
        )
    )
    res = system.run(prog)
    wait = next(r for r in res.trace.rows() if r[1] == "chip2.core0.sync")
    assert wait[3] == 10 + 1  # one hop backwards around the 3-chip ring: 10 cycles, then the wait's cycle


def test_barrier_drains_and_meets():
    long = ref("vmem", 0x1000, "f32[64,8]{1,0:T(8,8)}")
    prog = Program(
        (
            Stream(
                0, (VpuMap("exponential", long, (long,)), DmaStart(X, X_HBM), Barrier(), ScalarAlu("mov", Reg(1), 1))
            ),
            Stream(1, (Barrier(), ScalarAlu("mov", Reg(1), 1))),
        )
    )
    res = System(TWO_CORES).run(prog, timing_only=True)
    rows = [(u, t.split()[0], s, e) for s, u, t, e, _, _ in res.trace.rows()]
    dma_end = next(e for u, m, s, e in rows if m == "dma.start")
    barrier_ends = {e for u, m, s, e in rows if m == "barrier"}
    assert barrier_ends == {max(22, dma_end)}  # both leave when core 0 drained its exponential and its DMA
    assert all(s == max(22, dma_end) for u, m, s, e in rows if m == "s.mov")


def test_deadlock_is_reported_not_hung():
    prog = Program.single([DmaStart(X_HBM, X, sem=1), SemWait(0, hlo="while.3")])
    with pytest.raises(DeadlockError) as e:
        Chip(TEACH).run(prog)
    msg = str(e.value)
    assert msg.startswith("deadlock: no event is left to run but a core has instructions left:")
    assert "chip 0 core 0, instruction 1 `sem.wait sem=0 count=1 @while.3` (from HLO while.3)" in msg
    assert "waits for semaphore 0 to reach 1 (it holds 0)" in msg
    two = Program((Stream(0, (SemWait(1),)), Stream(1, (Barrier(),))))
    with pytest.raises(DeadlockError, match=r"2 cores have.*\n.*semaphore 1.*\n.*core 1, instruction 0 `barrier"):
        System(TWO_CORES).run(two)


def test_endless_loop_is_stopped():
    from tpusim.limits import RunLimitError

    prog = Program.single([Jump("top")], labels=[("top", 0)])
    with pytest.raises(RunLimitError, match=r"max_steps=1,000 reached: the loop jumping back at instruction 0"):
        Chip(TEACH).run(prog, max_steps=1000)


def test_load_time_checks_name_the_instruction():
    with pytest.raises(ExecutionError, match=r"instruction 0 `s.mov s99 <- 1`: register s99 does not exist"):
        Chip(TEACH).run(Program.single([ScalarAlu("mov", Reg(99), 1)]))
    with pytest.raises(ExecutionError, match=r"semaphore 12 does not exist \(the core has 8\)"):
        Chip(TEACH).run(Program.single([SemWait(12)]))
    with pytest.raises(ExecutionError, match=r"vpu.add .* fall outside vmem of chip 0 core 0"):
        Chip(TEACH).run(Program.single([VpuMap("add", ref("vmem", 0xFF00, "f32[16,8]"), (X, X))]))
    with pytest.raises(ExecutionError, match="the chip has only 1 cores"):
        Chip(TEACH).run(Program((Stream(1, ()),)))


SORT_HLO = """HloModule sort

compare {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT
}

ENTRY e {
  p = f32[16] parameter(0)
  ROOT s = f32[16] sort(p), dimensions={0}, to_apply=compare
}"""


def test_fallback_runs_the_reference_interpreter_with_its_declared_cost():
    a = ref("vmem", 0, "f32[16]{0}")
    b = ref("vmem", 0x100, "f32[16]{0}")
    kernel = FallbackKernel("sort.1", SORT_HLO, fixed_cycles=100, cycles_per_byte=0.5)
    prog = Program.single(
        [Fallback("sort.1", (a,), (b,), hlo="sort.1")], symbols=[Symbol("a", a), Symbol("b", b)], fallbacks=[kernel]
    )
    x = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    res = Chip(TEACH).run(prog, {"a": x}, fallback_evaluator=reference_evaluator())
    np.testing.assert_array_equal(res.read("b"), np.sort(x))
    with pytest.raises(ExecutionError, match=r"fallback kernel 'sort.1' needs an evaluator"):
        Chip(TEACH).run(prog, {"a": x})  # the device model knows no HLO: the caller passes the interpreter
    assert res.trace.rows()[0][::3] == (0, 100 + 128 // 2)  # 100 + 0.5 per operand byte
    assert res.trace.rows()[0][1] == "chip0.core0.fallback"


def test_fallback_evaluator_is_replaceable_and_checked():
    a = ref("vmem", 0, "f32[4]{0}")
    prog = Program.single([Fallback("k", (a,), (a,))], fallbacks=[FallbackKernel("k", "HloModule ignored")])
    res = Chip(TEACH).run(prog, fallback_evaluator=lambda hlo, xs: [xs[0] + 1])
    np.testing.assert_array_equal(res.memory("vmem").read(0, 16).view(np.float32), np.ones(4, np.float32))
    with pytest.raises(
        ExecutionError, match=r"fallback kernel 'k' output 0 is float64\[4\], but the operand is f32\[4\]"
    ):
        Chip(TEACH).run(prog, fallback_evaluator=lambda hlo, xs: [np.zeros(4)])
