"""A live view of a run in progress, read from another thread (a progress display) while SimPy runs.

The run loop does no extra work for it: the monitor reads the environment's clock and the length of the
trace records, which the run updates anyway (both reads are atomic under the GIL).

    >>> from tpusim.devices import Chip, RunMonitor
    >>> from tpusim.isa import Program, ScalarAlu, Reg
    >>> monitor = RunMonitor()
    >>> _ = Chip("teaching").run(Program.single([ScalarAlu("mov", Reg(1), 7)]), monitor=monitor)
    >>> monitor.instructions, monitor.total
    (1, 1)
"""

from __future__ import annotations

import time
from typing import Any

from tpusim.isa import Branch, Jump

__all__ = ["RunMonitor"]

_RECORD_INTS = 8  # a trace record is 8 ints (see trace.Trace.build)


class RunMonitor:
    """What a run has done so far: simulated cycles, instructions executed, host seconds.

    Attributes:
        total: instructions the run will execute when that is known before it starts (no stream branches),
            else None.
    """

    def __init__(self) -> None:
        self._machine: Any = None
        self._began = 0.0
        self.total: int | None = None

    def attach(self, machine: Any) -> None:
        """Called by the run when its cores exist, before the simulation starts."""
        self._began = time.perf_counter()
        streams = [core.stream for core in machine.cores]
        loops = any(isinstance(i, (Branch, Jump)) for s in streams for i in s.instructions)
        self.total = None if loops else sum(len(s.instructions) for s in streams)
        self._machine = machine

    @property
    def running(self) -> bool:
        return self._machine is not None

    @property
    def cycles(self) -> int:
        m = self._machine
        return int(m.env.now) if m is not None else 0

    @property
    def instructions(self) -> int:
        m = self._machine
        return len(m.records) // _RECORD_INTS if m is not None else 0

    @property
    def seconds(self) -> float:
        """Host seconds since the simulation started."""
        return time.perf_counter() - self._began if self._machine is not None else 0.0
