"""Interval arithmetic on a run's timeline: busy runs, the critical path, DMA engines, binned utilisation.

All times are integer cycles; intervals are half-open ``[start, end)``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["assign_lanes", "binned_busy", "critical_path", "merged_runs"]


def merged_runs(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals ``[start, end)`` as sorted, disjoint runs ``(run_start, run_end)``.

    Empty intervals are dropped; intervals that touch merge.
    """
    keep = end > start
    s, e = np.asarray(start)[keep], np.asarray(end)[keep]
    if len(s) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new_run = np.empty(len(s), bool)
    new_run[0] = True
    new_run[1:] = s[1:] > reach[:-1]
    run_id = np.cumsum(new_run) - 1
    run_start = s[new_run]
    run_end = np.zeros(len(run_start), np.int64)
    np.maximum.at(run_end, run_id, e)
    return run_start.astype(np.int64), run_end


def binned_busy(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Busy cycles (union of the intervals) inside each bin ``[edges[i], edges[i+1])``."""
    rs, re_ = merged_runs(start, end)
    if len(rs) == 0:
        return np.zeros(len(edges) - 1)
    # Cumulative busy time is piecewise linear: 0 before the first run, slope 1 inside runs, flat between.
    xs = np.empty(2 * len(rs))
    xs[0::2], xs[1::2] = rs, re_
    cum = np.empty(2 * len(rs))
    lengths = (re_ - rs).astype(float)
    cum[1::2] = np.cumsum(lengths)
    cum[0::2] = cum[1::2] - lengths
    at = np.interp(edges.astype(float), xs, cum, left=0.0, right=float(cum[-1]))
    return np.diff(at).clip(min=0.0)


def assign_lanes(start: np.ndarray, end: np.ndarray, order_key: np.ndarray | None = None) -> np.ndarray:
    """Greedy interval partitioning: the lowest lane free at each interval's start (a lane is free from the
    end of its last interval). Intervals are taken by ``(start, order_key)``; returns the lane of each."""
    n = len(start)
    lanes = np.zeros(n, np.int64)
    if n == 0:
        return lanes
    key = order_key if order_key is not None else np.arange(n)
    free_at: list[int] = []
    for i in np.lexsort((key, start)).tolist():
        s = int(start[i])
        lane = next((k for k, f in enumerate(free_at) if f <= s), len(free_at))
        if lane == len(free_at):
            free_at.append(0)
        free_at[lane] = max(int(end[i]), s)
        lanes[i] = lane
    return lanes


def critical_path(
    start: np.ndarray, end: np.ndarray, priority: np.ndarray, total: int
) -> tuple[np.ndarray, np.ndarray]:
    """Cycles of ``[0, total)`` charged to each entry along the critical path.

    The path is walked back from the end of the run: at time ``t`` the entry that completed last at or before
    ``t`` is taken to be what ``t`` waited for (ties: higher ``priority``, then the earlier start); its
    ``[start, end)`` is on the path and the walk continues from its start. Cycles where nothing on the path
    runs (issue gaps, waits on semaphores) are charged to the entry that waited, i.e. the next entry on the
    path; cycles before the first entry go to the first one. Entries with ``priority < 0`` (waits) and empty
    entries are never on the path. Every cycle of the run is charged exactly once, so the result sums to
    ``total`` (when there is at least one candidate entry).

    Returns:
        ``(cycles, on_path)``: cycles charged per entry, and whether each entry is on the path.
    """
    n = len(start)
    cycles = np.zeros(n, np.int64)
    on_path = np.zeros(n, bool)
    cand = np.flatnonzero((end > start) & (priority >= 0))
    if len(cand) == 0 or total <= 0:
        return cycles, on_path
    # Sorted so that, for each end value, the best candidate comes last.
    order = cand[np.lexsort((-start[cand], priority[cand], end[cand]))]
    ends = end[order]
    t = int(total)
    waiting = -1  # the entry on the path after the gap being walked
    while t > 0:
        k = int(np.searchsorted(ends, t, side="right")) - 1
        if k < 0:
            cycles[waiting] += t  # before the first entry on the path
            break
        e = int(order[k])
        e_end, e_start = int(end[e]), int(start[e])
        cycles[waiting if waiting >= 0 else e] += t - e_end
        cycles[e] += e_end - e_start
        on_path[e] = True
        waiting, t = e, e_start
        # Everything that ended after the new t can no longer be a predecessor: trim the search range.
        ends = ends[: k + 1]
        order = order[: k + 1]
    return cycles, on_path
