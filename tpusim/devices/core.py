"""A TensorCore's sequencer: in-order issue into decoupled unit queues.

Cycle-level contract:

* The sequencer issues one instruction per cycle, in program order. It keeps its own clock ``t`` and runs
  ahead of the event queue as long as nothing forces it to wait, so compute instructions cost no SimPy
  events at all: their start and end cycles are computed in closed form from next-free-time counters of
  their unit (STYLE 2.1 idioms 2 and 4).
* Each unit has a FIFO of ``core.instruction_queue_depth`` instructions; when it is full, issue waits
  until the oldest one starts.
* A compute instruction starts when its unit is free and the scoreboard allows (RAW, WAR, WAW on byte
  ranges against in-flight instructions: :mod:`tpusim.devices.hazards`); it does not hold up later issue.
* The sequencer itself stalls (one SimPy event) on: a semaphore that is not yet high enough, a hazard on
  an in-flight DMA, a full DMA queue, a barrier, and a scalar load (``smem.latency_cycles``).
* Numeric effects of compute and scalar instructions are applied at issue, in program order (the
  scoreboard guarantees that this equals the timed order); a DMA's bytes land at its completion.

Handlers are registered per instruction class in :data:`HANDLERS` (STYLE 3.4). A handler takes
``(core, decoded, t)`` and returns the sequencer's next cycle, or an event to wait for before trying the
same instruction again.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from tpusim.devices import fallback as _fallback  # noqa: F401  (registers the fallback spec)
from tpusim.devices import mxu as _mxu  # noqa: F401  (registers the MXU specs)
from tpusim.devices import scalar as _scalar  # noqa: F401  (registers scalar and control handlers)
from tpusim.devices import sync as _sync  # noqa: F401  (registers semaphore and barrier handlers)
from tpusim.devices import vpu as _vpu  # noqa: F401  (registers the VPU and XLU specs)
from tpusim.devices.compute import issue_compute, issue_mxu_fast, issue_vpu_static
from tpusim.devices.dma import DmaEngines, issue_dma
from tpusim.devices.fallback import fallback_cost
from tpusim.devices.hazards import Scoreboard
from tpusim.devices.memory import affine, window_extent
from tpusim.devices.mxu import MxuState
from tpusim.devices.units import COMPUTE, HANDLERS, Access, Cost, ExecutionError, Handler, handles
from tpusim.isa import DmaStart, Fallback, MemRef, Reg, Space, format_instruction

if TYPE_CHECKING:
    from tpusim.devices.chip import ChipState
    from tpusim.isa import Instruction, Stream

__all__ = ["Core", "DeadlockError", "Decoded"]


class DeadlockError(ExecutionError):
    """The event queue ran dry while a core still had instructions to run."""


class Decoded:
    """One instruction prepared for issue: its handler and whatever can be computed before the run."""

    __slots__ = (
        "cost",
        "cost_fn",
        "extra",
        "handler",
        "index",
        "ins",
        "plans_r",
        "plans_w",
        "queue",
        "read_refs",
        "reads",
        "rr",
        "rw",
        "sched",
        "spec",
        "static",
        "unit_id",
        "write_refs",
        "writes",
    )

    def __init__(self, ins: Instruction, index: int) -> None:
        self.ins: Any = ins  # (Any: each handler knows its instruction class)
        self.index = index
        self.handler: Handler = HANDLERS[type(ins)]
        self.spec = COMPUTE.get(type(ins))
        self.static = False
        self.reads: tuple[Access, ...] = ()
        self.writes: tuple[Access, ...] = ()
        self.rr: tuple[Any, ...] = ()
        self.rw: tuple[Any, ...] = ()
        self.read_refs: tuple[MemRef, ...] = ()
        self.write_refs: tuple[MemRef, ...] = ()
        self.plans_r: tuple[_OperandPlan, ...] = ()
        self.plans_w: tuple[_OperandPlan, ...] = ()
        self.cost: Cost | None = None
        self.cost_fn: Any = None
        self.extra: Any = None  # a handler's per-instruction cache
        self.sched: Any = None  # MXU instructions: the bound timing method of their MXU
        self.queue: Any = None  # MXU instructions: their MXU's FIFO of start cycles
        self.unit_id = -1


class Core:
    """The sequencer and units of TensorCore ``index`` of a chip, running one stream.

    Args:
        chip: the chip it belongs to (memories, semaphores, the system).
        index: core number within the chip.
        stream: its instruction stream.
        stream_id: its number in the trace.
    """

    __slots__ = (
        "_operands",
        "barrier_event",
        "blocked",
        "cfg",
        "chip",
        "decoded",
        "dma",
        "env",
        "fallback_free",
        "final_cycle",
        "finished",
        "first_try",
        "index",
        "jumps",
        "max_end",
        "mxu_queues",
        "mxu_units",
        "mxus",
        "network",
        "numeric",
        "pc",
        "queues",
        "records",
        "regs",
        "scalar_unit",
        "scoreboard",
        "sems",
        "smem",
        "stores",
        "stream",
        "stream_id",
        "system",
        "texts",
        "unit",
        "vmem",
        "vpu_free",
        "vpu_queue",
        "vpu_unit",
        "xlu_free",
        "xlu_units",
    )

    def __init__(self, chip: ChipState, index: int, stream: Stream, stream_id: int) -> None:
        system = chip.system
        cfg = system.cfg
        self.system = system
        self.chip = chip
        self.index = index
        self.stream = stream
        self.stream_id = stream_id
        self.cfg = cfg
        self.env = system.env
        self.network = system.network
        self.records = system.records
        self.numeric = system.numeric
        self.regs = [0] * cfg.core.scalar_registers
        self.sems = chip.sems[index]
        self.vmem = chip.vmem[index]
        self.smem = chip.smem[index]
        self.stores = {Space.HBM: chip.hbm, Space.VMEM: self.vmem, Space.SMEM: self.smem}
        self.scoreboard = Scoreboard()
        self.mxus = [MxuState(cfg) for _ in range(cfg.mxu.count)]
        depth = cfg.core.instruction_queue_depth
        self.queues: dict[str, deque[int]] = {k: deque(maxlen=depth) for k in ("vpu", "xlu", "fallback", "dma")}
        self.vpu_queue = self.queues["vpu"]
        self.mxu_queues: list[deque[int]] = [deque(maxlen=depth) for _ in range(cfg.mxu.count)]
        self.vpu_free = 0
        self.xlu_free = [0] * cfg.xlu.count
        self.fallback_free = 0
        self.max_end = 0  # latest end cycle of any compute instruction issued so far
        name = f"chip{chip.index}.core{index}"
        self.unit = {u: system.unit_id(f"{name}.{u}") for u in ("scalar", "sync", "dma", "vpu", "fallback")}
        self.vpu_unit = self.unit["vpu"]
        self.scalar_unit = self.unit["scalar"]
        self.xlu_units = [system.unit_id(f"{name}.xlu{i}") for i in range(cfg.xlu.count)]
        self.mxu_units = [system.unit_id(f"{name}.mxu{i}") for i in range(cfg.mxu.count)]
        self.dma = DmaEngines(self)
        self.pc = 0
        self.first_try = 0  # cycle the current instruction was first tried (for stalls in the trace)
        self.blocked: tuple[int, str] | None = None
        self.finished = False
        self.final_cycle = 0
        self.jumps = 0
        self.barrier_event: Any = None
        self.texts: dict[int, str] = {}
        self._operands: dict[int, _OperandPlan] = {}
        self.decoded = [self.decode(ins, i) for i, ins in enumerate(stream.instructions)]

    # ------------------------------------------------------------------ naming and errors
    @property
    def name(self) -> str:
        return f"chip {self.chip.index} core {self.index}"

    def text(self, index: int) -> str:
        t = self.texts.get(index)
        if t is None:
            t = self.texts[index] = format_instruction(self.stream.instructions[index])
        return t

    def error(self, where: Any, message: str, cls: type[ExecutionError] = ExecutionError) -> ExecutionError:
        """An error naming this core, the instruction (an index; anything else means the one issuing now)
        and its HLO origin."""
        index = where if isinstance(where, int) else self.pc
        hlo = self.stream.instructions[index].hlo
        origin = f" (from HLO {hlo})" if hlo else ""
        return cls(f"{self.name}, instruction {index} `{self.text(index)}`{origin}: {message}")

    # ------------------------------------------------------------------ operands
    def plan(self, ref: MemRef) -> _OperandPlan:
        p = self._operands.get(id(ref))
        if p is None:
            p = self._operands[id(ref)] = _OperandPlan(ref)
        return p

    def resolve(self, p: _OperandPlan, index: int, store: Any = None) -> tuple[Any, int, Any, int, int, Any, int]:
        """Read the registers of an operand, clamp or check its window, check its bounds.

        Returns:
            ``(store, address, offsets, lo, hi, normalized offsets, byte shift)``: the window's offsets reduced
            by the layout's periods and the shift that undoes it (:class:`~tpusim.devices.memory.Affine`;
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
            offsets = norm = p.offsets
            lo, hi = p.extent
            shift = 0
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

    def _window_error(self, p: _OperandPlan, index: int, dim: int, v: int) -> ExecutionError:
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
            self.resolve(p, d.index)

    def access(self, ref: MemRef, index: int, store: Any = None) -> Access:
        """Resolve a memory operand into an :class:`Access` (see :meth:`resolve`)."""
        p = self.plan(ref)
        store, address, offsets, lo, hi, _, _ = self.resolve(p, index, store)
        return Access(store, p.space, address, p.shape, offsets, p.sizes, lo, hi)

    def decode(self, ins: Instruction, index: int) -> Decoded:
        """Check ``ins`` against the config and precompute what does not depend on registers."""
        cfg = self.cfg
        d = Decoded(ins, index)
        for reg in _registers(ins):
            if reg.index >= cfg.core.scalar_registers:
                raise self.error(index, f"register {reg} does not exist (the core has {cfg.core.scalar_registers})")
        for sem in (getattr(ins, "sem", None), getattr(ins, "dst_sem", None)):
            if isinstance(sem, int) and sem >= cfg.core.semaphores:
                raise self.error(index, f"semaphore {sem} does not exist (the core has {cfg.core.semaphores})")
        spec = d.spec
        if spec is None:
            return d
        problem = spec.check(cfg, ins)
        if problem:
            raise self.error(index, problem)
        d.read_refs, d.write_refs = spec.refs(ins)
        d.plans_r = tuple(self.plan(r) for r in d.read_refs)
        d.plans_w = tuple(self.plan(r) for r in d.write_refs)
        d.cost_fn = spec.cost
        if isinstance(ins, Fallback):
            kernel = self.system.program.fallback(ins.kernel)
            d.cost_fn = lambda cfg, i, r, w: fallback_cost(kernel, r, w)
        if all(r.is_static for r in d.read_refs + d.write_refs):
            d.static = True
            d.reads = tuple(self.access(r, index) for r in d.read_refs)
            d.writes = tuple(self.access(r, index) for r in d.write_refs)
            d.rr = tuple((a.key, a.lo, a.hi) for a in d.reads)
            d.rw = tuple((a.key, a.lo, a.hi) for a in d.writes)
            d.cost = d.cost_fn(cfg, ins, d.reads, d.writes)
            if d.cost.unit == "vpu":
                d.handler = issue_vpu_static
        elif all(p.dynamic == () for p in d.plans_r + d.plans_w):
            # only base registers vary: the cost (a function of layouts and windows) is the same every time
            d.cost = d.cost_fn(cfg, ins, tuple(_template(p) for p in d.plans_r), tuple(_template(p) for p in d.plans_w))
            d.extra = tuple(
                (
                    self.stores[p.space],
                    p.address,
                    p.base,
                    p.extent[0],
                    p.extent[1],
                    self.stores[p.space].capacity - p.nbytes,
                    w,
                )
                for w, plans in ((False, d.plans_r), (True, d.plans_w))
                for p in plans
            )
        fast = not (self.numeric or ins.control)
        if fast and d.cost is not None and d.cost.unit == "mxu" and (d.static or len(d.extra or ()) == 1):
            d.handler = issue_mxu_fast
            d.sched = self.mxus[ins.mxu].scheduler(ins)  # type: ignore[union-attr]
            d.queue = self.mxu_queues[ins.mxu]  # type: ignore[union-attr]
            d.unit_id = self.mxu_units[ins.mxu]  # type: ignore[union-attr]
        return d

    # ------------------------------------------------------------------ the sequencer process
    def run(self) -> Any:
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
            yield r
            self.blocked = None
            retry = True
            if env.now > t:
                t = int(env.now)
        self.finished = True
        self.final_cycle = max(t, self.max_end)

    def block(self, d: Decoded, reason: str, event: Any) -> Any:
        """Record why the sequencer waits (for deadlock reports) and return the event to wait for."""
        self.blocked = (d.index, reason)
        return event


def _template(p: _OperandPlan) -> Access:
    """An Access with the operand's static facts (for costs that do not depend on the address)."""
    lo, hi = p.extent
    return Access(None, p.space, p.address, p.shape, p.offsets, p.sizes, p.address + lo, p.address + hi)  # type: ignore[arg-type]


class _OperandPlan:
    """What access() needs of one MemRef, computed once per program."""

    __slots__ = (
        "address",
        "affine",
        "base",
        "clamp",
        "dims",
        "dynamic",
        "extent",
        "extents",
        "nbytes",
        "offsets",
        "ref",
        "shape",
        "sizes",
        "space",
        "wspec",
    )

    def __init__(self, ref: MemRef) -> None:
        self.ref = ref
        self.shape = ref.shape
        self.space = ref.space
        self.address = ref.address
        self.base = ref.base.index if ref.base is not None else -1
        self.nbytes = ref.shape.byte_size
        self.dims = ref.shape.dimensions
        w = ref.window
        self.sizes = w.sizes if w is not None else None
        self.clamp = w.clamp if w is not None else False
        self.offsets: tuple[int, ...] | None = None
        self.dynamic: tuple[int, ...] = ()
        self.extents: dict[tuple[int, ...], tuple[int, int]] = {}  # by offsets modulo the layout's periods
        self.affine = affine(ref.shape) if w is not None and not w.is_static else None
        self.extent = (0, self.nbytes)
        if w is not None:
            if w.is_static:
                self.offsets = w.offsets  # type: ignore[assignment]
                self.extent = window_extent(ref.shape, self.offsets, w.sizes)
            else:
                # register index, or -(immediate + 1) for an immediate offset
                self.dynamic = tuple(o.index if isinstance(o, Reg) else -o - 1 for o in w.offsets)
                aff = self.affine
                periods = aff.periods if aff is not None else (1,) * len(w.sizes)
                strides = aff.strides if aff is not None else (0,) * len(w.sizes)
                # per dimension: offset source, largest valid start, period and slot stride (see resolve)
                self.wspec = tuple(
                    (o, d - s, per, g) for o, d, s, per, g in zip(self.dynamic, self.dims, w.sizes, periods, strides)
                )


def _registers(ins: Any) -> list[Reg]:
    out: list[Reg] = []
    for name in getattr(ins, "__dataclass_fields__", {}):
        v = getattr(ins, name)
        for x in v if isinstance(v, tuple) else (v,):
            if isinstance(x, Reg):
                out.append(x)
            elif isinstance(x, MemRef):
                out.extend(x.registers)
    return out


handles(*COMPUTE)(issue_compute)
handles(DmaStart)(issue_dma)
