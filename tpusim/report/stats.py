"""Statistics from a trace: how busy each unit was, and what each HLO instruction cost.

A unit's busy time is the union of its instructions' ``[start, end)`` intervals (pipelined instructions
overlap, so summing durations would count cycles twice). An HLO instruction's span runs from the first
issue of any instruction lowered from it to the last end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpusim.devices import Trace
from tpusim.report.timeline import merged_runs

__all__ = ["OpStats", "UnitStats", "busy_cycles", "op_stats", "unit_stats"]


def busy_cycles(start: np.ndarray, end: np.ndarray) -> int:
    """Cycles covered by the union of intervals ``[start, end)``."""
    run_start, run_end = merged_runs(start, end)
    return int(np.sum(run_end - run_start))


@dataclass(frozen=True, slots=True)
class UnitStats:
    name: str
    instructions: int
    busy_cycles: int
    bytes: int
    flops: int


@dataclass(frozen=True, slots=True)
class OpStats:
    hlo: str
    instructions: int
    start: int
    end: int
    bytes: int
    flops: int

    @property
    def span(self) -> int:
        return self.end - self.start


def unit_stats(trace: Trace) -> list[UnitStats]:
    out = []
    for uid, name in enumerate(trace.units):
        sel = trace.unit == uid
        out.append(
            UnitStats(
                name, int(sel.sum()), busy_cycles(trace.start[sel], trace.end[sel]),
                int(trace.bytes[sel].sum()), int(trace.flops[sel].sum()),
            )
        )  # fmt: skip
    return out


def op_stats(trace: Trace) -> list[OpStats]:
    names: dict[str, list[int]] = {}
    for i, (s, k) in enumerate(zip(trace.stream.tolist(), trace.index.tolist())):
        hlo = trace.streams[s].hlo[k] or "(no HLO instruction)"
        names.setdefault(hlo, []).append(i)
    out = []
    for hlo, rows in names.items():
        idx = np.asarray(rows)
        out.append(
            OpStats(
                hlo, len(idx), int(trace.issue[idx].min()), int(trace.end[idx].max()),
                int(trace.bytes[idx].sum()), int(trace.flops[idx].sum()),
            )
        )  # fmt: skip
    return sorted(out, key=lambda o: (-o.span, o.hlo))
