"""The interval arithmetic behind reports, on hand-checked timelines, and the progress line."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tpusim.report.occupancy import occupancy
from tpusim.report.progress import Progress, format_duration
from tpusim.report.timeline import assign_lanes, binned_busy, critical_path, merged_runs


def a(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def test_merged_runs_and_binned_busy() -> None:
    rs, re_ = merged_runs(a(0, 2, 10, 12, 5), a(4, 6, 12, 15, 5))  # [0,6) [10,15); the empty one is dropped
    assert rs.tolist() == [0, 10] and re_.tolist() == [6, 15]
    busy = binned_busy(a(0, 2, 10, 12), a(4, 6, 12, 15), a(0, 5, 10, 20))
    assert busy.tolist() == [5.0, 1.0, 5.0]


def test_assign_lanes() -> None:
    lanes = assign_lanes(a(0, 1, 3, 4, 4), a(3, 5, 6, 4, 9))
    # [0,3)->0, [1,5)->1, [3,6)->0 (free at 3), [4,4)->2? no: lane 0 busy to 6, lane 1 to 5 -> lane 2; [4,9)->2 after it
    assert lanes.tolist() == [0, 1, 0, 2, 2]


def test_critical_path_charges_every_cycle_once() -> None:
    # A DMA [0,10), a matmul waiting for it [12,20) (2 cycles of issue gap), a wait [0,30) that never counts,
    # a VPU op [20,25) after the matmul, and the run ending at 27 (2 cycles after the last op).
    start, end = a(0, 12, 0, 20, 5), a(10, 20, 30, 25, 8)
    priority = a(1, 1, -1, 1, 1)
    cycles, on_path = critical_path(start, end, priority, 27)
    # walk back: [20,25) + tail 2 -> vpu 7; [12,20) matmul 8, gap [10,12) charged to it -> 10; DMA [0,10) -> 10.
    # The short op [5,8) overlaps the DMA and is not on the path.
    assert cycles.tolist() == [10, 10, 0, 7, 0]
    assert on_path.tolist() == [True, True, False, True, False]
    assert cycles.sum() == 27


def test_occupancy_counts_shared_bytes_once() -> None:
    # Two regions over the same bytes at overlapping times, and one elsewhere later.
    o = occupancy([(0, 100, 0, 10), (50, 150, 5, 20), (1000, 1010, 15, 30)], 40)
    assert o.cycles.tolist() == [0, 5, 10, 15, 20, 30]
    assert o.bytes.tolist() == [100, 150, 100, 110, 10, 0]
    assert o.peak_bytes == 150
    assert o.mean_bytes == pytest.approx((100 * 5 + 150 * 5 + 100 * 5 + 110 * 5 + 10 * 10) / 40)


def test_progress_line() -> None:
    out = io.StringIO()
    p = Progress(4, "points", stream=out, enabled=True, hz=1e9)
    p.advance()
    p.advance(failed=True)
    line = p.line()
    assert "[" in line and "2/4 points  50%" in line and "ETA" in line and "1 failed" in line
    p.close()
    assert out.getvalue().endswith("\n") and out.getvalue().count("\r") >= 2
    quiet = io.StringIO()
    q = Progress(2, "points", stream=quiet)  # a StringIO is not a terminal
    q.advance()
    q.close()
    assert quiet.getvalue() == ""
    assert format_duration(75.3) == "1:15" and format_duration(3700) == "1:01:40"


def test_a_long_run_shows_cycles_rate_and_eta() -> None:
    """``tpusim run`` draws the monitor's state while SimPy runs: simulated cycles, instructions of the known
    total (a program without branches), their rate and an ETA; a loop has no known total."""
    from pathlib import Path

    import tpusim
    from tpusim.devices import RunMonitor
    from tpusim.report.progress import Activity, run_status

    monitor = RunMonitor()
    assert run_status(monitor) == "compiling"
    out = io.StringIO()
    program = Path(__file__).resolve().parents[1] / "examples" / "transformer_block_bf16.hlo"
    with Activity("block", stream=out, enabled=True, interval=0.005, probe=lambda: run_status(monitor)):
        result = tpusim.simulate(program, monitor=monitor)
    assert monitor.instructions == result.instructions == monitor.total
    drawn = out.getvalue()
    assert "cycles simulated" in drawn and f"of {result.instructions:,}" in drawn and "/s)" in drawn
    loop = tpusim.simulate(
        "HloModule l\nc {\n  p = s32[] parameter(0)\n  n = s32[] constant(3)\n  ROOT lt = pred[] compare(p, n), "
        "direction=LT\n}\nb {\n  p = s32[] parameter(0)\n  one = s32[] constant(1)\n  ROOT q = s32[] add(p, one)\n}\n"
        "ENTRY e {\n  z = s32[] parameter(0)\n  ROOT w = s32[] while(z), condition=c, body=b\n}\n",
        monitor=(looped := RunMonitor()),
    )
    assert looped.total is None and looped.instructions == loop.instructions
