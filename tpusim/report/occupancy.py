"""Memory occupancy over time: how many bytes of HBM and VMEM hold live data at each cycle.

The device model does not count allocations (memory is an address space the compiler fills), so occupancy
is derived after the run from who touched what and when:

* HBM, per chip: every buffer of the compiler's buffer assignment is live from the first instruction of any
  HLO instruction that defines or reads one of the values sharing it, to the last one; entry parameters
  and constants are live for the whole run, outputs from their first write to the end. HBM the program
  touches outside every buffer (per-instruction scratch) is live from its first to its last access.
* VMEM, per core: the blocks an HLO instruction's instructions touch are live from its first instruction
  to its last (the compiler allocates VMEM per HLO instruction).

Occupancy at a cycle is the size of the union of the live byte ranges, so a range never counts twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

__all__ = ["Occupancy", "Region", "merge_ranges", "occupancy"]

Region = tuple[int, int, int, int]
"""``(lo, hi, live_from, live_until)``: bytes ``[lo, hi)`` live during cycles ``[live_from, live_until)``."""


@dataclass(frozen=True, slots=True)
class Occupancy:
    """A memory's occupancy as a step function.

    Attributes:
        cycles: change points (ascending; the first is 0).
        bytes: bytes live from ``cycles[i]`` until the next change point.
        peak_bytes: the largest value.
        mean_bytes: the time-weighted mean over ``[0, total)``.
    """

    cycles: np.ndarray
    bytes: np.ndarray
    peak_bytes: int
    mean_bytes: float


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Disjoint, sorted ``(lo, hi)`` ranges covering ``ranges``."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def occupancy(regions: Iterable[Region], total: int) -> Occupancy:
    """Bytes covered by the live regions at every cycle of ``[0, total)``."""
    regs = [r for r in regions if r[1] > r[0] and r[3] > r[2]]
    if not regs or total <= 0:
        return Occupancy(np.zeros(1, np.int64), np.zeros(1, np.int64), 0, 0.0)
    # Elementary address segments between all range boundaries; a coverage count per segment.
    bounds = np.unique(np.array([b for r in regs for b in (r[0], r[1])], np.int64))
    seg_len = np.diff(bounds)
    count = np.zeros(len(seg_len), np.int64)
    events: dict[int, list[tuple[int, int, int]]] = {}
    for lo, hi, t0, t1 in regs:
        a, b = int(np.searchsorted(bounds, lo)), int(np.searchsorted(bounds, hi))
        events.setdefault(max(t0, 0), []).append((a, b, 1))
        events.setdefault(min(t1, total), []).append((a, b, -1))
    times, values = [], []
    occupied = 0
    for t in sorted(events):
        if t >= total:
            break  # the run is over: what is live at its end is in the last step
        for a, b, d in events[t]:
            c = count[a:b]  # a view: updated in place
            if d > 0:
                occupied += int(seg_len[a:b][c == 0].sum())
                c += 1
            else:
                c -= 1
                occupied -= int(seg_len[a:b][c == 0].sum())
        times.append(t)
        values.append(occupied)
    if not times or times[0] != 0:
        times.insert(0, 0)
        values.insert(0, 0)
    cyc = np.asarray(times, np.int64)
    val = np.asarray(values, np.int64)
    widths = np.diff(np.append(cyc, total)).clip(min=0)
    mean = float((val * widths).sum()) / total
    return Occupancy(cyc, val, int(val.max()), mean)
