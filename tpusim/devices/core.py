"""A TensorCore's sequencer: in-order issue into decoupled unit queues.

Cycle-level contract:

* The sequencer issues one instruction per cycle, in program order. It keeps its own clock ``t`` and runs
  ahead of the event queue as long as nothing forces it to wait, so compute instructions cost no SimPy
  events at all: their start and end cycles are computed in closed form from next-free-time counters of
  their unit (docs/model.md, "How time advances").
* Each unit has a FIFO of ``core.instruction_queue_depth`` instructions; when it is full, issue waits
  until the oldest one starts.
* A compute instruction starts when its unit is free and the scoreboard allows (RAW, WAR, WAW on byte
  ranges against in-flight instructions: :mod:`tpusim.devices.hazards`); it does not hold up later issue.
* The sequencer itself stalls (one SimPy event) on: a semaphore that is not yet high enough, a hazard on
  an in-flight DMA, a full DMA queue, a barrier, and a scalar load (``smem.latency_cycles``).
* Numeric effects of compute and scalar instructions are applied at issue, in program order (the
  scoreboard guarantees that this equals the timed order); a DMA's bytes land at its completion.

Handlers are registered per instruction class in one registry, :data:`HANDLERS`. A handler takes
``(core, decoded, t)`` and returns the sequencer's next cycle, or an event to wait for before trying the
same instruction again.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, cast

from tpusim.devices import fallback as _fallback  # noqa: F401  (registers the fallback spec)
from tpusim.devices import mxu as _mxu  # noqa: F401  (registers the MXU specs)
from tpusim.devices import scalar as _scalar  # noqa: F401  (registers scalar and control handlers)
from tpusim.devices import sync as _sync  # noqa: F401  (registers semaphore and barrier handlers)
from tpusim.devices import vpu as _vpu  # noqa: F401  (registers the VPU and XLU specs)
from tpusim.devices.compute import issue_compute
from tpusim.devices.core_units import CoreUnits
from tpusim.devices.decode import Decoded, DecodedStream, OperandPlan, decoded_stream
from tpusim.devices.dma import issue_dma
from tpusim.devices.engine import Event
from tpusim.devices.hazards import Scoreboard
from tpusim.devices.units import COMPUTE, Access, ExecutionError, handles
from tpusim.isa import DmaStart, MemRef, Space, format_instruction
from tpusim.memory.windows import window_extent

if TYPE_CHECKING:
    from tpusim.config import ChipConfig
    from tpusim.devices.chip import ChipState
    from tpusim.devices.flows import FlowNetwork
    from tpusim.isa import Stream

__all__ = ["Core", "DeadlockError", "Decoded"]


class DeadlockError(ExecutionError):
    """The event queue ran dry while a core still had instructions to run."""


class Core:
    """A sequencer of TensorCore ``index`` of a chip, running one stream: its program counter, scalar
    registers, scoreboard and trace lanes, issuing into the core's units (:class:`CoreUnits`).

    Args:
        chip: the chip it belongs to (memories, semaphores, the machine).
        index: core number within the chip.
        stream: its instruction stream.
        stream_id: its number in the trace.
        main: for the core's async sequencer (a stream of ``sequencer=1``), the core's main sequencer, whose
            units (DMA engines, vector unit, ...) it issues into (its memories and semaphores are the core's
            anyway).
    """

    __slots__ = (
        "barrier_event",
        "blocked",
        "bound",
        "cache",
        "cfg",
        "chip",
        "decoded",
        "decoding",
        "env",
        "final_cycle",
        "finished",
        "first_try",
        "index",
        "machine",
        "max_end",
        "network",
        "numeric",
        "pc",
        "place",
        "records",
        "regs",
        "scalar_unit",
        "scoreboard",
        "sems",
        "smem",
        "stores",
        "stream",
        "stream_id",
        "sync_unit",
        "trips",
        "units",
        "vmem",
    )

    def __init__(self, chip: ChipState, index: int, stream: Stream, stream_id: int, main: Core | None = None) -> None:
        machine = chip.machine
        cfg = machine.cfg
        self.machine = machine
        self.chip = chip
        self.index = index
        self.stream = stream
        self.stream_id = stream_id
        self.place = (chip.index, index)  # (chip, core): keys per-core facts kept on decoded instructions
        self.cfg: ChipConfig = cfg
        self.env = machine.env
        self.network: FlowNetwork = machine.network
        self.records = machine.records
        self.numeric = machine.numeric
        self.regs = [0] * cfg.core.scalar_registers
        self.sems = chip.sems[index]
        self.vmem = chip.vmem[index]
        self.smem = chip.smem[index]
        self.stores = {Space.HBM: chip.hbm, Space.VMEM: self.vmem, Space.SMEM: self.smem}
        self.scoreboard = Scoreboard()
        self.max_end = 0  # latest end cycle of any compute instruction this sequencer issued
        # this sequencer's own trace lanes; the async sequencer's are named chipN.coreK.async.*
        lanes = f"chip{chip.index}.core{index}" + (".async" if main is not None else "")
        self.scalar_unit = machine.unit_id(f"{lanes}.scalar")
        self.sync_unit = machine.unit_id(f"{lanes}.sync")
        # the units it issues into: its own (the main sequencer) or the main sequencer's (the async one)
        self.units: CoreUnits = CoreUnits(machine, f"chip{chip.index}.core{index}") if main is None else main.units
        self.pc = 0
        self.first_try = 0  # cycle the current instruction was first tried (for stalls in the trace)
        self.blocked: tuple[int, str, tuple[Any, ...]] | None = None  # see block
        self.finished = False
        self.final_cycle = 0
        self.trips: dict[int, int] = {}  # back edge -> iterations of its loop's current execution (devices.limits)
        self.barrier_event: Any = None
        self.cache: dict[Any, Any] = {}  # handlers' per-run facts (e.g. a DMA's destination memory)
        self.bound: dict[int, tuple[tuple[Access, ...], tuple[Access, ...]]] = {}  # see bind
        self.decoding: DecodedStream | None = None
        self.decoding = decoded_stream(self)
        self.decoded = self.decoding.decoded

    # ------------------------------------------------------------------ naming and errors
    @property
    def name(self) -> str:
        seq = "'s async sequencer" if self.stream.sequencer else ""
        return f"chip {self.chip.index} core {self.index}{seq}"

    def text(self, index: int) -> str:
        ds = self.decoding
        return ds.texts[index] if ds is not None else format_instruction(self.stream.instructions[index])

    def error(self, where: Any, message: str, cls: type[ExecutionError] = ExecutionError) -> ExecutionError:
        """An error naming this core, the instruction (an index; anything else means the one issuing now)
        and its HLO origin."""
        index = where if isinstance(where, int) else self.pc
        hlo = self.stream.instructions[index].hlo
        origin = f" (from HLO {hlo})" if hlo else ""
        return cls(f"{self.name}, instruction {index} `{self.text(index)}`{origin}: {message}")

    # ------------------------------------------------------------------ operands
    def plan(self, ref: MemRef) -> OperandPlan:
        assert self.decoding is not None  # (set in __init__, before any operand is planned)
        return self.decoding.plan(ref)

    def resolve(self, p: OperandPlan, index: int, store: Any = None) -> tuple[Any, int, Any, int, int, Any, int]:
        """Read the registers of an operand, clamp or check its window, check its bounds.

        Returns:
            ``(store, address, offsets, lo, hi, normalized offsets, byte shift)``: the window's offsets reduced
            by the layout's periods and the shift that undoes it (:class:`~tpusim.devices.stores.Affine`;
            the offsets themselves and 0 when the layout has no such structure).
        """
        regs = self.regs
        if store is None:
            store = self.stores[p.space]
        address = p.address if p.base < 0 else p.address + regs[p.base]
        if p.sizes is None:
            offsets = norm = None
            lo, hi = 0, p.nbytes
            shift = 0
        elif p.offsets is not None:
            offsets, norm, shift = p.offsets, p.norm, p.shift
            lo, hi = p.extent
        else:
            offs: list[int] = []
            parts: list[int] = []
            steps = 0
            for o, top, period, stride in p.wspec:
                v = regs[o] if o >= 0 else -o - 1
                if v < 0 or v > top:
                    if not p.clamp:
                        raise self._window_error(p, index, len(offs), v)
                    v = 0 if v < 0 else top
                offs.append(v)
                if period == 1:
                    parts.append(0)
                    steps += v * stride
                else:
                    q, r = divmod(v, period)
                    parts.append(r)
                    steps += q * stride
            offsets = tuple(offs)
            if p.affine is None:
                norm, shift = offsets, 0
            else:
                norm, shift = tuple(parts), steps * p.affine.element_bytes
            ext = p.extents.get(norm)
            if ext is None:
                ext = p.extents[norm] = window_extent(p.shape, norm, p.sizes)
            lo, hi = ext[0] + shift, ext[1] + shift
        if address < 0 or address + p.nbytes > store.capacity:
            problem = store.check(address, address + p.nbytes)
            raise self.error(index, f"operand {p.ref} at {address:#x}: {problem}")
        return store, address, offsets, address + lo, address + hi, norm, shift

    def _window_error(self, p: OperandPlan, index: int, dim: int, v: int) -> ExecutionError:
        s = p.sizes[dim]  # type: ignore[index]
        src = p.ref.window.offsets[dim]  # type: ignore[union-attr]
        return self.error(
            index,
            f"window start {v} (from {src}) puts dimension {dim} at [{v}, {v + s}), outside 0..{p.dims[dim]} "
            f"of {p.ref.shape}",
        )

    def resolve_all(self, d: Decoded) -> None:
        """Resolve every operand of ``d`` (raises the first addressing error)."""
        for p in d.plans_r + d.plans_w:
            self.resolve(p, self.pc)

    def access(self, ref: MemRef, index: int, store: Any = None) -> Access:
        """Resolve a memory operand into an :class:`Access` (see :meth:`resolve`)."""
        p = self.plan(ref)
        store, address, offsets, lo, hi, _, _ = self.resolve(p, index, store)
        return Access(store, p.space, address, p.shape, offsets, p.sizes, lo, hi)

    def bind(self, d: Decoded) -> tuple[tuple[Access, ...], tuple[Access, ...]]:
        """The static operands of ``d`` as Accesses into this core's memories (for numeric effects)."""
        b = self.bound.get(self.pc)
        if b is None:
            stores = self.stores
            r = [a.at(stores[a.space]) for a in d.reads] if d.reads else ()
            w = [a.at(stores[a.space]) for a in d.writes] if d.writes else ()
            b = self.bound[self.pc] = (tuple(r), tuple(w))
        return b

    # ------------------------------------------------------------------ the sequencer process
    def run(self) -> Generator[Event, Any, None]:
        """The SimPy process: issue until the end of the stream (or ``halt``)."""
        env = self.env
        decoded = self.decoded
        n = len(decoded)
        t = int(env.now)
        retry = False
        while self.pc < n:
            d = decoded[self.pc]
            if not retry:
                self.first_try = t
            r = d.handler(self, d, t)
            if r.__class__ is int:
                t = r
                retry = False
                continue
            yield cast(Event, r)
            self.blocked = None
            retry = True
            now = env.now
            if now > t:
                t = int(now)
        self.finished = True
        self.final_cycle = max(t, self.max_end)

    def block(self, d: Decoded, reason: str, event: Event, *args: Any) -> Event:
        """Record why the sequencer waits (for deadlock reports) and return the event to wait for.

        ``reason`` is a ``str.format`` template of ``args`` (formatted only for a report: most waits end)."""
        self.blocked = (self.pc, reason, args)
        return event

    def blocked_reason(self) -> tuple[int, str]:
        """The instruction the sequencer waits at and why (see :meth:`block`)."""
        if self.blocked is None:
            return self.pc, "is stuck"
        index, reason, args = self.blocked
        return index, reason.format(*args)


handles(*COMPUTE)(issue_compute)
handles(DmaStart)(issue_dma)
