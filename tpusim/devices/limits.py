"""Run limits on the device model: where a core stands, which loop it is in, and the errors that say so.

Each core counts the iterations of the loops it is in (``Core.trips``: back-edge instruction index ->
iterations of the loop's current execution). A taken jump or branch back to an earlier instruction adds
one to its loop; a taken forward jump resets every loop whose back edge it skips (it left them, or they
were not running), and so does a backward branch that falls through (a do-while loop ending). The loop a
message names is, among the loops around the stopped instruction, the one with the most iterations in its
current execution: an endless outer loop around a short inner one is named, not the inner one.

The hot path (:func:`tpusim.devices.scalar.issue_branch` and ``_jump``) pays one comparison per taken
jump for the limits and a dictionary update for the counts; everything else here runs only when a limit is
hit or the user presses Ctrl-C.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpusim.limits import LimitHit, RunLimitError

if TYPE_CHECKING:
    from tpusim.devices.chip import Machine
    from tpusim.devices.core import Core

__all__ = ["count_jump", "current_loop", "ended_past_limit", "limit_error", "machine_position"]

_RECORD_INTS = 8  # a trace record is 8 ints (see trace.Trace.build)


def count_jump(core: Core, index: int, target: int) -> None:
    """Account a taken jump or branch from instruction ``index`` to ``target`` in the core's loop counts."""
    trips = core.trips
    if target <= index:
        trips[index] = trips.get(index, 0) + 1
    elif trips:
        for j in [j for j in trips if index < j < target]:
            del trips[j]


def current_loop(core: Core, index: int, pending: int = -1) -> tuple[int, int] | None:
    """``(back-edge index, iterations)`` of the loop to name for a core stopped at instruction ``index``
    (``pending``: a back edge being taken now, counted with the iterations it has completed), or None."""
    stream = core.stream
    best: tuple[int, int, int] | None = None  # (iterations, start, back edge)
    counts = dict(core.trips)
    if pending >= 0:
        counts.setdefault(pending, 0)
    for j, n in counts.items():
        ins: Any = stream.instructions[j]  # a Branch or Jump (only they are counted)
        start = stream.target(ins.target)
        if start <= index <= j and (best is None or (n, start) > best[:2]):
            best = (n, start, j)
    return (best[2], best[0]) if best is not None else None


def _hlo(core: Core, index: int) -> str | None:
    instructions = core.stream.instructions
    return instructions[index].hlo if 0 <= index < len(instructions) else None


def _instructions(m: Machine) -> int:
    return len(m.records) // _RECORD_INTS


def limit_error(core: Core, index: int, t: int, limit: str, pending: int = -1) -> RunLimitError:
    """The error of ``core`` stopped at instruction ``index`` and cycle ``t`` by ``limit``."""
    m = core.machine
    loop = current_loop(core, index, pending)
    where = f"at cycle {t:,} with {_instructions(m):,} instructions executed ({core.name})"
    value = m.max_steps if limit == "max_steps" else m.max_cycles
    if loop is None:
        return RunLimitError.of(LimitHit(limit, value, None, 0, where, current=_hlo(core, index)))
    j, n = loop
    return RunLimitError.of(LimitHit(limit, value, _hlo(core, j), n, where, back_edge=j))


def ended_past_limit(m: Machine, cycles: int) -> RunLimitError | None:
    """The error of a run that ended past a limit without passing a check on the way (straight-line code
    after the last loop), or None."""
    steps = _instructions(m)
    limit = "max_steps" if steps > m.max_steps else "max_cycles" if cycles > m.max_cycles else None
    if limit is None:
        return None
    value = m.max_steps if limit == "max_steps" else m.max_cycles
    where = f"the run ended at cycle {cycles:,} after {steps:,} instructions"
    return RunLimitError.of(LimitHit(limit, value, None, 0, where, ended=True))


def machine_position(m: Machine) -> str:
    """Where a run stands, for Ctrl-C: the cycle, the instructions executed, and per unfinished core the
    instruction it is at, its HLO instruction and the loop it is in."""
    cores = [c for c in m.cores if not c.finished]
    cycle = max([int(m.env.now)] + [c.first_try for c in cores])
    parts = [f"at cycle {cycle:,} after {_instructions(m):,} instructions"]
    for core in cores[:2]:
        pc = core.pc
        hlo = _hlo(core, pc)
        text = f"{core.name} at instruction {pc}" + (f" (HLO %{hlo})" if hlo else "")
        loop = current_loop(core, pc)
        if loop is not None:
            j, n = loop
            text += f", in the loop of %{_hlo(core, j) or j} after {n:,} iterations"
        parts.append(text)
    if len(cores) > 2:
        parts.append(f"and {len(cores) - 2} more cores")
    return "; ".join(parts)


def position_of(m: Any) -> str:
    """:func:`machine_position`, or a plain note when it fails (it runs while an interrupt is handled)."""
    try:
        return machine_position(m)
    except Exception:  # never let the report of an interrupt hide the interrupt itself
        return f"after {_instructions(m):,} instructions"
