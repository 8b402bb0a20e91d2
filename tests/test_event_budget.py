"""Event budget: the simulation's cost must grow with DMAs and waits, never with instructions or cycles.

Counts come from ``RunResult.events`` (SimPy's scheduled-event counter, read in one place:
``tpusim.devices.engine.events_scheduled``). A change that starts ticking per cycle or spawning a process
per instruction fails here loudly.
"""

from __future__ import annotations

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
    MxuPop,
    Program,
    Reg,
    ScalarAlu,
    SemWait,
    Space,
    StreamBuilder,
    VpuMap,
)
from tpusim.memory import parse_shape

V5E = load_config("tpu_v5e")
T = parse_shape("bf16[128,128]{1,0:T(8,128)(2,1)}")
F = parse_shape("f32[128,128]{1,0:T(8,128)}")


def loop(n: int, body: list) -> Program:
    b = StreamBuilder()
    b.emit(ScalarAlu("mov", Reg(1), 0))
    b.label("loop")
    b.emit(*body)
    b.emit(ScalarAlu("add", Reg(1), Reg(1), 1), Branch("lt", Reg(1), n, "loop"))
    return Program((b.build(),))


COMPUTE = [
    MxuLoadWeights(0, MemRef(Space.VMEM, 0x8000, T)),
    MxuMatmul(0, MemRef(Space.VMEM, 0x0, T)),
    MxuPop(0, MemRef(Space.VMEM, 0x10000, F)),
    VpuMap("exponential", MemRef(Space.VMEM, 0x20000, F), (MemRef(Space.VMEM, 0x10000, F),)),
    VpuMap("add", MemRef(Space.VMEM, 0x30000, F), (MemRef(Space.VMEM, 0x20000, F), Const(1.0, "f32"))),
]
DMA = [DmaStart(MemRef(Space.HBM, 0, T), MemRef(Space.VMEM, 0x0, T), sem=0), SemWait(0)]


@pytest.mark.parametrize("n", [10, 200])
def test_compute_costs_no_events(n):
    res = Chip(V5E).run(loop(n, COMPUTE), timing_only=True)
    assert res.instructions == 1 + n * 7
    # one event to start the core's process, one for its end: nothing per instruction, nothing per cycle
    assert res.events == 2
    assert res.cycles > 300 * n  # many simulated cycles, still two events


@pytest.mark.parametrize("n", [10, 200])
def test_a_dma_and_its_wait_cost_three_events(n):
    res = Chip(V5E).run(loop(n, DMA + COMPUTE), timing_only=True)
    # per iteration: the flow's completion timer, the HBM-latency timer, and waking the waiting sequencer
    assert res.events == 2 + 3 * n


def test_concurrent_transfers_share_timers():
    two = [
        DmaStart(MemRef(Space.HBM, 0, T), MemRef(Space.VMEM, 0x0, T), sem=0),
        DmaStart(MemRef(Space.HBM, 0x100000, T), MemRef(Space.VMEM, 0x8000, T), sem=0),
        SemWait(0, 2),
    ]
    n = 50
    res = Chip(V5E).run(loop(n, two), timing_only=True)
    # two completions, two latency timers, one wake, and one re-rate when the second flow joins the first
    assert res.events == 2 + 6 * n
