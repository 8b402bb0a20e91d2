"""The deferred waits of synchronous DMAs (tpusim/compiler/lowering/wait_sinking.py), on hand-written streams:
a wait that drains its semaphore moves down to the first instruction that touches its DMAs' data, DMAs
started on the semaphore meanwhile join it (a semaphore only counts completions), and a wait that leaves
DMAs outstanding stays where it is."""

from __future__ import annotations

from tpusim.compiler.lowering.wait_sinking import sink_waits
from tpusim.isa import DmaStart, Halt, MemRef, SemWait, Space, Stream, VpuCopy
from tpusim.memory import Layout, Shape, Tile, element_type

F32 = element_type("f32")
BLOCK = Shape(F32, (8, 128), layout=Layout((1, 0), (Tile((8, 128)),)))


def hbm(i: int) -> MemRef:
    return MemRef(Space.HBM, i * 4096, BLOCK)


def vmem(i: int) -> MemRef:
    return MemRef(Space.VMEM, i * 4096, BLOCK)


def test_two_slices_are_in_flight_together_and_one_wait_drains_both() -> None:
    stream = Stream(0, (
        DmaStart(src=hbm(0), dst=vmem(0), sem=0), SemWait(sem=0, count=1),
        DmaStart(src=hbm(1), dst=vmem(1), sem=0), SemWait(sem=0, count=1),
        VpuCopy(dst=vmem(2), src=vmem(0)), VpuCopy(dst=vmem(3), src=vmem(1)), Halt(),
    ))  # fmt: skip
    got = sink_waits(stream).instructions
    assert [type(i).__name__ for i in got] == ["DmaStart", "DmaStart", "SemWait", "VpuCopy", "VpuCopy", "Halt"]
    assert got[2].count == 2


def test_a_wait_that_leaves_dmas_outstanding_stays() -> None:
    """Four loads on one semaphore and a wait for two (a pipelined kernel's first step): which two complete
    is not known, so the wait keeps its place."""
    body = (
        DmaStart(src=hbm(0), dst=vmem(0), sem=0), DmaStart(src=hbm(1), dst=vmem(1), sem=0),
        DmaStart(src=hbm(2), dst=vmem(2), sem=0), DmaStart(src=hbm(3), dst=vmem(3), sem=0),
        SemWait(sem=0, count=2), VpuCopy(dst=vmem(4), src=vmem(5)), SemWait(sem=0, count=2), Halt(),
    )  # fmt: skip
    assert sink_waits(Stream(0, body)).instructions == body


def test_a_wait_stops_before_the_first_use_and_at_a_label() -> None:
    body = (
        DmaStart(src=hbm(0), dst=vmem(0), sem=1), SemWait(sem=1, count=1),
        VpuCopy(dst=vmem(2), src=vmem(3)), VpuCopy(dst=vmem(4), src=vmem(0)),
        DmaStart(src=hbm(1), dst=vmem(1), sem=1), SemWait(sem=1, count=1),
        VpuCopy(dst=vmem(5), src=vmem(3)), Halt(),
    )  # fmt: skip
    got = sink_waits(Stream(0, body, labels=(("next", 6),)))
    names = [type(i).__name__ for i in got.instructions]
    assert names == ["DmaStart", "VpuCopy", "SemWait", "VpuCopy", "DmaStart", "SemWait", "VpuCopy", "Halt"]
    assert got.labels == (("next", 6),)
