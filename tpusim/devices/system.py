"""The public face of the devices: :class:`System` (N chips on a topology) and :class:`Chip` (one chip).

    >>> from tpusim.devices import Chip
    >>> from tpusim.isa import Program, ScalarAlu, Reg
    >>> result = Chip("teaching").run(Program.single([ScalarAlu("mov", Reg(1), 7)]))
    >>> result.cycles
    1

``run`` builds a fresh simulation each time: memories start zeroed, ``inputs`` are packed into them at
their symbols, every stream runs to its end, and the result holds the cycle count, the trace and the
final memories. Same program, inputs and config give the same cycles and bytes on every run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tpusim.config import ChipConfig, load_config
from tpusim.devices.chip import ChipState, Machine
from tpusim.devices.core import DeadlockError
from tpusim.devices.engine import events_scheduled
from tpusim.devices.fallback import FallbackEvaluator
from tpusim.devices.limits import ended_past_limit, position_of
from tpusim.devices.monitor import RunMonitor
from tpusim.devices.stores import ByteStore, MemoryAccessError
from tpusim.devices.trace import Trace, TraceStream
from tpusim.devices.units import ExecutionError
from tpusim.errors import TpusimError
from tpusim.gcpause import paused_gc
from tpusim.isa import Program, Space, Symbol
from tpusim.limits import DEFAULT_MAX_CYCLES, DEFAULT_MAX_STEPS, check_limits, note_interrupt
from tpusim.memory import pack, unpack
from tpusim.topology import system_topology

if TYPE_CHECKING:
    from tpusim.devices.core import Core

__all__ = ["Chip", "RunResult", "System"]


@dataclass(frozen=True, slots=True, eq=False)
class RunResult:
    """What a run produced.

    Attributes:
        cycles: the cycle the last instruction or transfer completed.
        trace: every executed instruction with its unit, cycles, bytes and flops.
        config: the chip config.
        events: SimPy events scheduled (the cost of the simulation, for budgets).
        host_seconds: wall time of the run's phases on the host: ``place`` (packing the inputs into memory),
            ``decode`` (preparing the streams; nothing when the same program ran before), ``simulate`` (the
            SimPy run) and ``trace`` (building the trace).
    """

    cycles: int
    trace: Trace
    config: ChipConfig
    events: int
    _machine: Machine
    host_seconds: Mapping[str, float]

    @property
    def seconds(self) -> float:
        return self.cycles / self.config.clock_hz

    @property
    def instructions(self) -> int:
        """Instructions executed (loop iterations count each time)."""
        return len(self.trace)

    def memory(self, space: Space | str, chip: int = 0, core: int = 0) -> ByteStore:
        """The bytes of a memory after the run."""
        return self._machine.chips[chip].store(Space(space), core)

    def read(self, symbol: str, chip: int | None = None) -> np.ndarray:
        """The array stored at a symbol after the run (on ``chip``; default: the symbol's chip, or 0)."""
        sym = self._machine.program.symbol(symbol)
        c = chip if chip is not None else (sym.chip or 0)
        store = self.memory(sym.ref.space, c, sym.core)
        return unpack(store.view(sym.ref.address, sym.ref.byte_size), sym.ref.shape)


class System:
    """``n_chips`` chips of one config, connected as the config's ICI topology in ``shape`` (``dcn.slices``
    such slices joined by DCN when more than one).

    Args:
        config: a :class:`ChipConfig`, a preset name (``tpu_v5e``) or a YAML path.
        n_chips: number of chips (of all slices).
        shape: the grid of chips of a slice (default: a ring or line of its chips); at most ``ici.dims`` axes.
    """

    def __init__(self, config: ChipConfig | str | Path, n_chips: int = 1, shape: tuple[int, ...] | None = None) -> None:
        cfg = config if isinstance(config, ChipConfig) else load_config(config)
        slices = cfg.dcn.slices
        if shape is not None and n_chips == 1:
            n_chips = prod(shape) * slices
        if shape is None:
            # the config's slice when the slices hold these chips, else the one the chip forms for them
            own = cfg.ici.shape
            if own is not None and prod(own) * slices == n_chips:
                shape = own
            elif n_chips % slices == 0:
                shape = cfg.ici.default_shape(n_chips // slices)
        self.config = cfg
        self.topology = system_topology(cfg, n_chips, None if shape is None else tuple(shape))

    @property
    def n_chips(self) -> int:
        return self.topology.chips

    def run(
        self,
        program: Program,
        inputs: Mapping[str, np.ndarray | Sequence[np.ndarray]] | None = None,
        *,
        timing_only: bool = False,
        max_steps: int = DEFAULT_MAX_STEPS,
        max_cycles: int = DEFAULT_MAX_CYCLES,
        fallback_evaluator: FallbackEvaluator | None = None,
        monitor: RunMonitor | None = None,
    ) -> RunResult:
        """Simulate ``program``.

        Args:
            program: the instruction streams.
            inputs: arrays by symbol name, packed into memory at the symbol before the run. A symbol on every
                chip (``chip=None``) takes one array for all chips or a sequence of one per chip.
            timing_only: skip numeric work except scalar instructions and instructions flagged ``control``.
            max_steps: instructions the run may execute, summed over every core and chip (see
                :mod:`tpusim.limits`; checked at every taken jump and at the end).
            max_cycles: simulated cycles the run may take (likewise).
            fallback_evaluator: runs fallback kernels (``tpusim.api.reference_evaluator()``); a program
                that reaches a fallback instruction without one stops with an ExecutionError.
            monitor: a :class:`RunMonitor` another thread may read while the run goes on (for progress).

        Returns:
            The cycles, the trace and the final memories.

        Raises:
            ExecutionError: a bad instruction (naming it), an access outside a memory, a deadlock.
            RunLimitError: the run reached ``max_steps`` or ``max_cycles`` (naming the loop it was in).

        A KeyboardInterrupt (Ctrl-C) propagates with the run's position recorded on it
        (:func:`tpusim.limits.interrupt_position`).
        """
        check_limits(max_steps, max_cycles)
        clock = [time.perf_counter()]
        phases: dict[str, float] = {}

        def lap(phase: str) -> None:
            now = time.perf_counter()
            phases[phase] = now - clock[0]
            clock[0] = now

        m = Machine(
            self.config, self.topology, program, not timing_only, max_steps, max_cycles,
            fallback_evaluator,
        )  # fmt: skip
        for name, value in (inputs or {}).items():
            _place(m, program.symbol(name), value)
        lap("place")
        m.start()
        lap("decode")
        if monitor is not None:
            monitor.attach(m)
        try:
            with paused_gc():  # (a run keeps every trace record and transfer fact: tpusim.gcpause)
                m.env.run()
        except TpusimError as e:
            # SimPy re-raises a failed process's exception as a copy; give the caller the original.
            original = e.__cause__
            raise (original if isinstance(original, TpusimError) else e) from None
        except KeyboardInterrupt as e:  # Ctrl-C: say where the run was (the CLI prints it in one line)
            note_interrupt(e, position_of(m))
            raise
        blocked = [c for c in m.cores if not c.finished]
        if blocked:
            raise _deadlock(blocked)
        m.drop_scratch()
        lap("simulate")
        trace = Trace.build(m.records, m.units, [_trace_stream(c) for c in m.cores])
        cycles = max([int(trace.end.max()) if len(trace) else 0] + [c.final_cycle for c in m.cores])
        past = ended_past_limit(m, cycles)
        if past is not None:
            raise past
        lap("trace")
        return RunResult(cycles, trace, self.config, events_scheduled(m.env), m, phases)


class Chip(System):
    """One chip: ``Chip(config).run(program, inputs)``."""

    def __init__(self, config: ChipConfig | str | Path) -> None:
        super().__init__(config, 1)


def _place(m: Machine, sym: Symbol, value: Any) -> None:
    chips: list[ChipState] = m.chips if sym.chip is None else [m.chips[sym.chip]]
    per_chip = isinstance(value, (list, tuple))
    if per_chip and len(value) != len(chips):
        raise ExecutionError(f"input {sym.name!r}: {len(value)} arrays for {len(chips)} chips")
    for i, chip in enumerate(chips):
        array = value[i] if per_chip else value
        store = chip.store(sym.ref.space, sym.core)
        problem = store.check(sym.ref.address, sym.ref.address + sym.ref.byte_size)
        if problem:
            raise MemoryAccessError(f"input {sym.name!r}: {problem}")
        pack(np.asarray(array), sym.ref.shape, out=store.writable(sym.ref.address, sym.ref.byte_size))


def _trace_stream(core: Core) -> TraceStream:
    ds = core.decoding
    assert ds is not None  # (decoded when the core was made)
    return TraceStream(core.chip.index, core.index, ds.hlo, ds.texts, core.stream.sequencer)


def _deadlock(blocked: list[Any]) -> DeadlockError:
    lines = []
    for c in blocked:
        index, reason = c.blocked_reason()
        lines.append(str(c.error(index, reason)))
    head = "deadlock: no event is left to run but " + ("a core has" if len(lines) == 1 else f"{len(lines)} cores have")
    return DeadlockError(head + " instructions left:\n  " + "\n  ".join(lines))
