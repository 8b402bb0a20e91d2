"""Cycle-level SimPy models of a TPU-like chip: sequencer, MXU, VPU/XLU, memories, DMA, ICI.

Public surface (``docs/model.md`` documents every timing rule)::

    Chip(config).run(program, inputs, timing_only=False) -> RunResult
    System(config, n_chips, shape).run(...)              -> RunResult
    RunMonitor(): pass as run(..., monitor=) to read progress from another thread
"""

from tpusim.devices.core import DeadlockError
from tpusim.devices.engine import events_scheduled
from tpusim.devices.fallback import FallbackEvaluator
from tpusim.devices.monitor import RunMonitor
from tpusim.devices.stores import ByteStore, MemoryAccessError
from tpusim.devices.system import Chip, RunResult, System
from tpusim.devices.trace import Trace, TraceStream
from tpusim.devices.units import ExecutionError

__all__ = [
    "ByteStore",
    "Chip",
    "DeadlockError",
    "ExecutionError",
    "FallbackEvaluator",
    "MemoryAccessError",
    "RunMonitor",
    "RunResult",
    "System",
    "Trace",
    "TraceStream",
    "events_scheduled",
]
