"""The state of one lowering: the instruction stream being built and the resources it hands out.

:class:`Lowering` owns the stream builder, the fallback kernels, and four allocators: semaphores and
scalar registers (taken and given back per HLO instruction), VMEM (a bump allocator over one half of VMEM
per HLO instruction, alternating halves so consecutive instructions can overlap), and an HBM scratch
arena above the buffer assignment's peak for temporaries an instruction needs only while it runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from tpusim.compiler.buffer_assignment import ALIGNMENT, BufferAssignment, leaf_paths
from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo.ir import Computation, Instruction, Module
from tpusim.compiler.hlo.xla_forms import wrapped_collective
from tpusim.compiler.lowering.epilogue import find_epilogues
from tpusim.compiler.lowering.prologue import find_prologues
from tpusim.compiler.options import CompileOptions
from tpusim.compiler.tiling_rules import TilingRules
from tpusim.config import ChipConfig
from tpusim.isa import (
    ASYNC_SEQUENCER,
    Barrier,
    Branch,
    DmaStart,
    Fallback,
    FallbackKernel,
    Halt,
    Jump,
    MemRef,
    Reg,
    ScalarAlu,
    ScalarLoad,
    ScalarStore,
    SemSignal,
    SemWait,
    Space,
    StreamBuilder,
    Window,
)
from tpusim.memory import Layout, Shape, element_type
from tpusim.memory.windows import window_extent

__all__ = ["ControlSlice", "Lowering", "Mark", "OpScope", "RuleState", "StateKey", "control_slice"]

Ranges = list[list[tuple[int, int]]]
"""Per core, HBM byte ranges ``(start, end)`` (megacore synchronisation)."""
Accesses = tuple[Ranges, Ranges]
"""Per core, the HBM ranges read and the ranges written."""


T = TypeVar("T")


@dataclass(frozen=True)
class StateKey(Generic[T]):
    """A typed key of :class:`RuleState`: each family of rules declares its own (``StateKey[CollectiveState]
    ("collectives")``), so what it keeps between instructions has a type where it is declared."""

    name: str


class RuleState:
    """State a family of rules keeps from one instruction to the next (the collectives' reserved semaphores,
    the async copies' held semaphores, a split reduction's partial homes), one typed entry per key."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}

    def get(self, key: StateKey[T]) -> T | None:
        value: T | None = self._values.get(key.name)
        return value

    def set(self, key: StateKey[T], value: T) -> None:
        self._values[key.name] = value


@dataclass(frozen=True)
class Mark:
    """What :meth:`Lowering.checkpoint` remembers."""

    instructions: int
    labels: int
    kernels: int
    vmem_next: int
    smem_next: int
    semaphores: int
    registers: int
    streams: tuple[tuple[int, int], ...] = ()  # (instructions, labels) of every core's stream
    claimed: bool = False
    epilogued: frozenset[tuple[str, str]] = frozenset()
    prologued: frozenset[tuple[str, str]] = frozenset()
    split_log: int = 0


@dataclass
class OpScope:
    """Resources held while one HLO instruction is lowered; released when it ends."""

    vmem_base: int
    vmem_end: int
    vmem_next: int
    semaphores: list[int] = field(default_factory=list)
    registers: list[int] = field(default_factory=list)
    scratch_next: int = 0
    smem_next: int = 0


class Lowering:
    """Everything one compilation's lowering reads and builds.

    Attributes:
        module: the layout-assigned module.
        buffers: its buffer assignment.
        config: the chip.
        options: compile options.
        rules: the tiling rules (for VMEM blocks a lowering creates).
        epilogues: ``(computation, dot) -> fusion`` pairs of :func:`find_epilogues` when the caller already
            found them (buffer assignment needs them first).
        cores: how many TensorCores of the chip the program uses (one stream each; 1 without megacore).
        streams: the instruction stream of each core; ``stream`` is core 0's.
        targets: the cores that receive what :meth:`emit` emits now.
        share: ``(core, cores)`` while a rule that can split its work emits one core's share
            (:meth:`split`), else None.
        kernels: fallback kernels, in creation order.
        fallen_back: ``(computation, instruction, opcode, reason)`` of every HLO instruction lowered as a
            fallback.
    """

    def __init__(
        self,
        module: Module,
        buffers: BufferAssignment,
        config: ChipConfig,
        options: CompileOptions,
        rules: TilingRules,
        cores: int = 1,
        epilogues: Mapping[tuple[str, str], str] | None = None,
    ) -> None:
        self.module = module
        self.rules = rules
        self.buffers = buffers
        self.config = config
        self.options = options
        self.cores = cores
        self.streams = [StreamBuilder(core=c) for c in range(cores)]
        self._async_stream: int | None = None  # index in streams of core 0's async sequencer, once used
        self._on_async = False  # emitting to it (on_async_site)
        self._async_sites = 0  # sites of code the async sequencer runs on request (numbered from 1)
        self.async_doorbell: int | None = None  # the semaphore a request signals (set by the first site)
        self.targets: tuple[int, ...] = (0,)
        self.share: tuple[int, int] | None = None
        self.claimed = False  # a rule took its share with split() during the current core's pass
        self.split_items = 0  # what the last split() divided
        self.split_log: list[int] = []  # what every split() of the current core's pass divided, in order
        self.spare_turn = 0  # rotates the cores' turns, so spare blocks go to each core in turn
        self.lone_turn = 0  # the core that runs the next instruction that does not split
        # HBM byte ranges each core read and wrote since the last chip barrier (megacore only).
        self._reads: Ranges = [[] for _ in range(cores)]
        self._writes: Ranges = [[] for _ in range(cores)]
        self.barriers = 0
        self._loops: list[Accesses] = []
        # True while an instruction is lowered as one synchronised segment; False inside a control-flow
        # rule, whose own transfers (loop-state copies, predicate reads) synchronise one by one.
        self.in_segment = False
        self.kernels: list[FallbackKernel] = []
        self.fallen_back: list[tuple[str, str, str, str]] = []
        self.constants: list[tuple[MemRef, np.ndarray]] = []  # arrays of fused constants, above the buffers
        self._constant_refs: dict[tuple[str, str], MemRef] = {}
        self.scratch_base = self._place_fused_constants(buffers.hbm_bytes)
        self.hbm_peak = self.scratch_base
        # What the async sequencer's collectives use while the main sequencer goes on: the top of VMEM (the
        # instructions' own VMEM ends below it) and an HBM region at the top of HBM (their scratch ends below).
        self.async_vmem, self.async_hbm = _async_reservation(module, config, cores)
        self.vmem_top = config.vmem.bytes - self.async_vmem
        self.scratch_top = config.hbm.bytes - self.async_hbm
        self.async_hbm_used = 0
        # Requests to the async sequencer: a ring of site numbers at the top of SMEM and the main sequencer's
        # write position after it; two scalar registers taken out of every stream's pool (the async
        # sequencer's read position and the site it reads; the main sequencer's write position and a scratch).
        self.async_requests = _uses_async_sequencer(module, cores)
        self.smem_top = config.smem.bytes - (4 * (ASYNC_REQUESTS + 1) if self.async_requests else 0)
        self.async_registers: tuple[Reg, ...] = (Reg(0), Reg(1)) if self.async_requests else ()
        self.vreg_bytes = config.vpu.sublanes * config.vpu.lanes * 4
        self._half = 0
        self._labels = 0
        self._scope: OpScope | None = None
        self.hlo: str | None = None  # the HLO instruction being lowered, stamped on emitted instructions
        self.computation: Computation | None = None
        # HLO values control flow depends on: their instructions compute even in timing-only runs.
        self.control_slice = control_slice(module)
        self.control = False
        # State a family of rules keeps from one instruction to the next, under the family's typed keys.
        self.rule_state = RuleState()
        # (computation, dot) -> the elementwise fusion its rule applies to each result block (see
        # epilogue.py); the fusions whose code a dot emitted, which then emit nothing themselves (rolled back
        # with the dot's code).
        # Not for values control flow reads: an epilogue's code carries the dot's control flag.
        self.epilogues: dict[tuple[str, str], str] = {
            dot: user
            for dot, user in (find_epilogues(module) if epilogues is None else epilogues).items()
            if dot not in self.control_slice.values and (dot[0], user) not in self.control_slice.values
        }
        self.epilogued: set[tuple[str, str]] = set()
        # (computation, fusion) -> the dot whose weight windows it may transform on their way in (see
        # prologue.py); the fusions a dot took, which emit nothing (their dot emits their code).
        self.prologues: dict[tuple[str, str], str] = {
            fusion: dot
            for fusion, dot in find_prologues(module).items()
            if fusion not in self.control_slice.values and (fusion[0], dot) not in self.control_slice.values
        }
        self.prologued: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ emission
    @property
    def stream(self) -> StreamBuilder:
        """Core 0's stream (the only one without megacore)."""
        return self.streams[0]

    def emit(self, cls: type, **fields: Any) -> Any:
        """Construct an instruction of ``cls`` stamped with the current HLO name, append it to the stream of
        every core in :attr:`targets`, return it."""
        instr = self.build(cls, **fields)
        self.append((instr,))
        return instr

    def build(self, cls: type, **fields: Any) -> Any:
        """An instruction of ``cls`` as :meth:`emit` makes it, not appended (see :meth:`append`)."""
        asked = fields.pop("control", False)  # (taken out whatever self.control says: passed once below)
        return cls(**fields, control=self.control or asked, hlo=self.hlo)

    def append(self, instructions: Sequence[Any]) -> None:
        """Append instructions made by :meth:`build` (under the current HLO name and control flag) to the
        stream of every core in :attr:`targets`: a rule that repeats an instruction appends one object."""
        for c in self.targets:
            self.streams[c].emit(*instructions)

    @property
    def on_async(self) -> bool:
        """Whether code goes to the async sequencer now (:meth:`on_async_site`)."""
        return self._on_async

    @contextmanager
    def on_async_site(self, doorbell: int) -> Iterator[None]:
        """Emit a *site* of core 0's async sequencer (``tpusim.isa.ASYNC_SEQUENCER``) inside the block, and
        after it, on the main sequencer, the request that runs it once (:meth:`_request_async`): its code
        runs each time the main sequencer reaches this point, in a loop body too, one request after the other.
        The site has the resources the async sequencer holds while the main sequencer goes on: the VMEM above
        :attr:`vmem_top` and the HBM above :attr:`scratch_top` (the same for every site, which run one after
        the other), scalar registers of its own file, and no scoped semaphore (the main sequencer's next
        instruction may take it): a semaphore there must be a reserved one. ``doorbell`` is the reserved
        semaphore a request signals."""
        assert self.async_requests, "the async sequencer serves programs _uses_async_sequencer says use it"
        read, _ = self.async_registers
        if self._async_stream is None:  # the stream: its read position, then the dispatcher (at its end)
            self._async_stream = len(self.streams)
            self.streams.append(StreamBuilder(core=0, sequencer=ASYNC_SEQUENCER))
            self.async_doorbell = doorbell
            self.streams[self._async_stream].emit(
                ScalarAlu("mov", read, 0, control=True), Jump("async_dispatch", control=True)
            )
        self._async_sites += 1
        site = self._async_sites
        self.streams[self._async_stream].label(f"async_site{site}")
        scope = self.scope
        saved = (scope.vmem_base, scope.vmem_end, scope.vmem_next, scope.scratch_next)
        scope.vmem_base = scope.vmem_next = self.vmem_top
        scope.vmem_end = self.config.vmem.bytes
        scope.scratch_next = self.scratch_top
        self._on_async = True
        try:
            with self.on((self._async_stream,)):
                yield
                self.emit(Jump, target="async_dispatch")
        finally:
            self._on_async = False
            scope.vmem_base, scope.vmem_end, scope.vmem_next, scope.scratch_next = saved
        self._request_async(site)

    def _request_async(self, site: int) -> None:
        """On the main sequencer: put ``site`` (0: stop) in the next slot of the request ring and ring the
        async sequencer's doorbell."""
        assert self.async_doorbell is not None
        at, scratch = self.async_registers
        ring, position = self._async_ring()
        for ins in (
            ScalarLoad(at, position, control=True, hlo=self.hlo),
            ScalarStore(_slot(ring, at), site, control=True, hlo=self.hlo),
            ScalarAlu("add", scratch, at, 1, control=True, hlo=self.hlo),
            ScalarAlu("rem", scratch, scratch, ASYNC_REQUESTS, control=True, hlo=self.hlo),
            ScalarStore(position, scratch, control=True, hlo=self.hlo),
            SemSignal(self.async_doorbell, control=True, hlo=self.hlo),
        ):
            self.streams[0].emit(ins)

    def _async_ring(self) -> tuple[MemRef, MemRef]:
        """The request ring (``ASYNC_REQUESTS`` words) and the main sequencer's write position."""
        s32 = Shape(element_type("s32"), (ASYNC_REQUESTS,), layout=Layout((0,)))
        word = Shape(element_type("s32"), (), layout=Layout(()))
        return MemRef(Space.SMEM, self.smem_top, s32), MemRef(Space.SMEM, self.smem_top + 4 * ASYNC_REQUESTS, word)

    def start_async(self) -> None:
        """At the start of the main stream: the request ring's write position is 0."""
        if self.async_requests:
            self.streams[0].emit(ScalarStore(self._async_ring()[1], 0, control=True))

    def finish_async(self) -> None:
        """After the entry computation: ask the async sequencer to stop, and write its dispatcher (wait for the
        doorbell, read the next request, run its site; stop at site 0)."""
        if self._async_stream is None:
            return
        assert self.async_doorbell is not None
        self._request_async(0)
        read, site = self.async_registers
        ring, _ = self._async_ring()
        b = self.streams[self._async_stream]
        b.label("async_dispatch")
        b.emit(
            SemWait(self.async_doorbell, control=True),
            ScalarLoad(site, _slot(ring, read), control=True),
            ScalarAlu("add", read, read, 1, control=True),
            ScalarAlu("rem", read, read, ASYNC_REQUESTS, control=True),
        )
        for k in range(1, self._async_sites + 1):
            b.emit(Branch("eq", site, k, f"async_site{k}", control=True))
        b.emit(Halt())

    @contextmanager
    def on(self, cores: Sequence[int]) -> Iterator[None]:
        """Emit to the streams of ``cores`` (labels too) inside the block."""
        outer, self.targets = self.targets, tuple(cores)
        try:
            yield
        finally:
            self.targets = outer

    @property
    def all_cores(self) -> tuple[int, ...]:
        return tuple(range(self.cores))

    def split(self, items: int) -> range:
        """The part of ``items`` independent pieces of work (blocks) the core being emitted takes: all of
        them without megacore, a contiguous share of them while :attr:`share` is set. A rule that calls it
        splits its work; the other cores then emit their shares with the same rule, so every decision a
        rule makes before or after must be the same whatever the share (VMEM plans, blockings)."""
        if self.share is None or items < self.share[1]:
            # Fewer pieces than cores: no share would be empty, the whole on one core. (An empty share would
            # let its core's pass fit VMEM trivially, and the cores could then plan different blockings.)
            return range(items)
        self.claimed = True
        core, cores = self.share
        # Spare blocks (items not a multiple of the cores) go to the cores in turn from one split
        # instruction to the next, so that one-block operations spread over the cores.
        self.split_items = items
        self.split_log.append(items)
        turn = (core + self.spare_turn) % cores  # the last turn takes the spare blocks
        return range(turn * items // cores, (turn + 1) * items // cores)

    def checkpoint(self) -> Mark:
        """A mark :meth:`rollback` returns to when a lowering rule declines halfway: the streams, the
        kernels, and the current instruction's VMEM, SMEM, semaphores and registers."""
        scope = self.scope
        return Mark(
            len(self.stream.instructions),
            len(self.stream.labels),
            len(self.kernels),
            scope.vmem_next,
            scope.smem_next,
            len(scope.semaphores),
            len(scope.registers),
            tuple((len(b.instructions), len(b.labels)) for b in self.streams),
            self.claimed,
            frozenset(self.epilogued),
            frozenset(self.prologued),
            len(self.split_log),
        )

    def rollback(self, mark: Mark) -> None:
        """Take back everything emitted and allocated since ``mark``."""
        for k, b in enumerate(self.streams):  # (a stream begun after the mark loses everything)
            n, labels = mark.streams[k] if k < len(mark.streams) else (0, 0)
            del b.instructions[n:]
            del b.labels[labels:]
        del self.kernels[mark.kernels :]
        self.claimed = mark.claimed
        self.epilogued = set(mark.epilogued)
        self.prologued = set(mark.prologued)
        # A blocking tried and taken back is no part of the plan the cores must agree on (a retry with
        # smaller blocks happens on one core and not on another when their VMEM differs).
        del self.split_log[mark.split_log :]
        self.release_since(mark)

    def release_since(self, mark: Mark) -> None:
        """Give back the VMEM, SMEM, semaphores and registers taken since ``mark`` (not the instructions):
        the next core's share of a split rule allocates the same ones in its own memories."""
        scope = self.scope
        scope.vmem_next, scope.smem_next = mark.vmem_next, mark.smem_next
        self._free_sems.extend(reversed(scope.semaphores[mark.semaphores :]))
        del scope.semaphores[mark.semaphores :]
        self._free_regs.extend(reversed(scope.registers[mark.registers :]))
        del scope.registers[mark.registers :]

    # ------------------------------------------------------------------ megacore synchronisation
    def positions(self) -> tuple[int, ...]:
        """Where each core's stream ends now (the start of a segment for :meth:`synchronise`)."""
        return tuple(len(b.instructions) for b in self.streams)

    def synchronise(self, start: Sequence[int]) -> None:
        """Make the instructions every core emitted since ``start`` safe against the other cores: when they
        read HBM bytes another core wrote since the last barrier, or write bytes another core read or wrote,
        a chip barrier goes in front of them in every core's stream. Without megacore, nothing."""
        if self.cores == 1:
            return
        reads, writes = [], []
        for b, at in zip(self.streams, start):
            r, w = _hbm_accesses(b.instructions[at:])
            reads.append(_merge(r))
            writes.append(_merge(w))
        for loop_reads, loop_writes in self._loops:  # what every enclosing loop touches, for its back edge
            for c in range(self.cores):
                loop_reads[c][:] = _merge(loop_reads[c] + reads[c])
                loop_writes[c][:] = _merge(loop_writes[c] + writes[c])
        if _conflict(reads, writes, self._reads, self._writes):
            for b, at in zip(self.streams, start):
                b.instructions.insert(at, Barrier(control=True, hlo=self.hlo))
                b.labels[:] = [(name, i + 1 if i > at else i) for name, i in b.labels]
            self.barriers += 1
            self._reads, self._writes = reads, writes
        else:
            for c in range(self.cores):
                self._reads[c] = _merge(self._reads[c] + reads[c])
                self._writes[c] = _merge(self._writes[c] + writes[c])

    @contextmanager
    def segment(self) -> Iterator[None]:
        """Synchronise what the block emits as one segment, unless it is part of an enclosing one."""
        if self.in_segment or self.cores == 1:
            yield
            return
        start = self.positions()
        yield
        self.synchronise(start)

    @contextmanager
    def loop_body(self) -> Iterator[list[Accesses]]:
        """Collect the HBM accesses of every segment synchronised inside the block (a loop's condition and
        body) into the one-element list it yields."""
        acc: Accesses = (
            [[] for _ in range(self.cores)],
            [[] for _ in range(self.cores)],
        )
        self._loops.append(acc)
        try:
            yield [acc]
        finally:
            self._loops.remove(acc)

    def back_edge(self, loop: Accesses) -> bool:
        """At a loop's back edge: a barrier (True) when what the cores touched since the last one conflicts
        with anything the loop touches (the next iteration's segments were synchronised without it).
        Without one, the loop's exit carries what is outstanding here too."""
        if self.cores == 1:
            return False
        if _conflict(loop[0], loop[1], self._reads, self._writes):
            self.flush()
            return True
        return False

    def flush(self) -> None:
        """A chip barrier in every core's stream if any core touched HBM since the last one (before a loop,
        at a back edge that needs one)."""
        if self.cores == 1 or not any(self._reads + self._writes):
            return
        with self.on(self.all_cores):
            self.emit(Barrier, control=True)
        self.barriers += 1
        self.clean()

    def clean(self) -> None:
        self._reads = [[] for _ in range(self.cores)]
        self._writes = [[] for _ in range(self.cores)]

    def accesses(self) -> Accesses:
        """What :meth:`synchronise` knows now (to restore where control flow joins)."""
        return [list(r) for r in self._reads], [list(w) for w in self._writes]

    def restore(self, *states: Accesses) -> None:
        """Make the outstanding accesses those of ``states`` (several: where control flow joins, any of them)."""
        self._reads = [_merge([r for s in states for r in s[0][c]]) for c in range(self.cores)]
        self._writes = [_merge([w for s in states for w in s[1][c]]) for c in range(self.cores)]

    def release_semaphore(self, sem: int) -> None:
        """Give back a semaphore before the instruction ends (its waits have all been emitted)."""
        self.scope.semaphores.remove(sem)
        self._free_sems.append(sem)

    def label(self, hint: str) -> str:
        self._labels += 1
        return f"L{self._labels}_{hint}".replace("/", "_")

    def place_label(self, name: str) -> None:
        for c in self.targets:
            self.streams[c].label(name)

    # ------------------------------------------------------------------ buffers
    def home(self, comp: str, value: str, index: tuple[int, ...] = ()) -> MemRef:
        """The home of leaf ``index`` of ``value`` in computation ``comp``: its HBM array; its VMEM array when
        buffer assignment keeps it resident (``S(1)``); or, for an integer scalar buffer assignment put in SMEM,
        its SMEM word."""
        buf = self.buffers.buffer(comp, value, index)
        shape = self.leaf_shape(comp, value, index)
        if buf.space == "smem":  # a plain word, whatever the tiled layout the value was given
            return MemRef(Space.SMEM, buf.offset, shape.with_layout(Layout.default(shape.rank)))
        return MemRef(Space.VMEM if buf.space == "vmem" else Space.HBM, buf.offset, shape)

    def leaf_shape(self, comp: str, value: str, index: tuple[int, ...] = ()) -> Shape:
        shape = self.module[comp][value].shape
        for i in index:
            shape = shape.elements[i]  # type: ignore[union-attr]
        assert isinstance(shape, Shape)
        return shape

    def home_leaves(self, comp: str, value: str) -> list[MemRef]:
        """The homes of every array leaf of a value, in leaf order."""
        shape = self.module[comp][value].shape
        return [self.home(comp, value, path) for path, _ in leaf_paths(shape)]

    # ------------------------------------------------------------------ per-instruction resources
    @contextmanager
    def op(self, comp: Computation, instr: Instruction) -> Iterator[OpScope]:
        """Hold VMEM, semaphores, registers and HBM scratch while ``instr`` is lowered."""
        unit = self.vreg_bytes
        resident = self._resident_top(comp.name, instr.name)
        free = self.vmem_top - resident
        share = int(free * self.options.vmem_fraction) // unit * unit
        base = resident + (0 if self._half == 0 or share * 2 > free else share)
        self._half ^= 1
        outer, outer_hlo, outer_comp = self._scope, self.hlo, self.computation
        scope = OpScope(
            base,
            base + share,
            base,
            scratch_next=outer.scratch_next if outer is not None else self.scratch_base,
            smem_next=outer.smem_next if outer is not None else self.buffers.smem_bytes,
        )
        self._scope, self.hlo, self.computation = scope, instr.name, comp
        outer_control, self.control = self.control, (comp.name, instr.name) in self.control_slice.values
        try:
            yield scope
        finally:
            if outer is not None:  # nested (a called computation lowered inline): hand back to the caller
                outer.scratch_next = max(outer.scratch_next, scope.scratch_next)
            self._scope, self.hlo, self.computation, self.control = outer, outer_hlo, outer_comp, outer_control
            self._free_sems.extend(scope.semaphores)
            self._free_regs.extend(scope.registers)

    def widen_scope(self) -> bool:
        """Give the current instruction all of the VMEM resident buffers leave (instead of its alternating
        share), when that is more: for a rule whose blocks did not fit its share. True when the scope grew."""
        wide = self._wide_scope()
        if wide is None:
            return False
        scope = self.scope
        scope.vmem_base, scope.vmem_end, scope.vmem_next = wide[0], wide[1], wide[0]
        return True

    def can_widen(self) -> bool:
        """Whether :meth:`widen_scope` would give the current instruction more VMEM."""
        return self._wide_scope() is not None

    def _resident_top(self, comp: str, instr: str) -> int:
        """Where an instruction's own VMEM may start: above the residents live while it runs (those that are
        not may be overwritten, the scoreboard orders the reuse of their bytes), on a vector register."""
        unit = self.vreg_bytes
        return -(-self.buffers.vmem_top(comp, instr) // unit) * unit

    def _wide_scope(self) -> tuple[int, int] | None:
        scope = self.scope
        assert self.computation is not None and self.hlo is not None, "scopes are opened by op()"
        base = self._resident_top(self.computation.name, self.hlo)
        if (scope.vmem_base, scope.vmem_end) == (base, self.vmem_top):
            return None
        return base, self.vmem_top

    @property
    def scope(self) -> OpScope:
        if self._scope is None:
            raise CompileError("internal: resources requested outside an instruction's lowering")
        return self._scope

    def vmem(self, shape: Shape) -> MemRef:
        """A VMEM array of ``shape`` (its layout decides the bytes) for the current instruction."""
        scope = self.scope
        size = -(-shape.byte_size // self.vreg_bytes) * self.vreg_bytes
        if scope.vmem_next + size > scope.vmem_end:
            raise VmemExhausted(size, scope.vmem_end - scope.vmem_base, self.hlo)
        ref = MemRef(Space.VMEM, scope.vmem_next, shape)
        scope.vmem_next += size
        return ref

    def vmem_free_bytes(self) -> int:
        scope = self.scope
        return scope.vmem_end - scope.vmem_next

    def _place_fused_constants(self, base: int) -> int:
        """Give every array constant of a fused computation an HBM home (buffer assignment only covers
        sequential computations); returns the first free byte above them."""
        at = base
        for comp in self.module.computations:
            for instr in comp.instructions:
                key = (comp.name, instr.name)
                if instr.opcode != "constant" or not isinstance(instr.shape, Shape) or instr.shape.rank == 0:
                    continue
                if (comp.name, instr.name, ()) in self.buffers.leaves:
                    continue
                ref = MemRef(Space.HBM, at, instr.shape)
                value = np.asarray(instr.attr("literal").value, dtype=instr.shape.element_type.dtype)
                self.constants.append((ref, value.reshape(instr.shape.dimensions)))
                self._constant_refs[key] = ref
                at = -(-(at + instr.shape.byte_size) // ALIGNMENT) * ALIGNMENT
        if at > self.config.hbm.bytes:
            raise CompileError(
                f"HBM is full: the program's constants end at byte {at}, HBM holds {self.config.hbm.bytes}"
            )
        return at

    def constant_array(self, instr: Instruction) -> MemRef:
        """The HBM array holding a constant of a fused computation (or of a sequential one)."""
        comp = self.computation
        for c in self.module.computations:
            ref = self._constant_refs.get((c.name, instr.name))
            if ref is not None and c[instr.name].attr("literal") == instr.attr("literal"):
                return ref
        if comp is not None and (comp.name, instr.name, ()) in self.buffers.leaves:
            return self.home(comp.name, instr.name)
        raise CompileError(f"internal: constant {instr.name} has no HBM home")

    def smem(self, shape: Shape) -> MemRef:
        """An SMEM array for the current instruction (scalars control flow reads)."""
        scope = self.scope
        at = -(-scope.smem_next // 4) * 4
        scope.smem_next = at + shape.byte_size
        if scope.smem_next > self.smem_top:
            raise CompileError(f"{self.hlo}: SMEM is full ({self.smem_top} bytes)")
        return MemRef(Space.SMEM, at, shape)

    def scratch(self, shape: Shape) -> MemRef:
        """An HBM temporary that lives while the current instruction is lowered (above all buffers)."""
        scope = self.scope
        at = scope.scratch_next
        scope.scratch_next = -(-(at + shape.byte_size) // ALIGNMENT) * ALIGNMENT
        top = self.config.hbm.bytes if self._on_async else self.scratch_top
        if scope.scratch_next > top:
            held = f" ({self.async_hbm} at the top are the async sequencer's)" if self.async_hbm else ""
            raise CompileError(
                f"HBM is full: a {shape.byte_size}-byte temporary of {self.hlo} ({shape}) would end at byte "
                f"{scope.scratch_next}, but HBM holds {self.config.hbm.bytes} bytes{held}"
            )
        if self._on_async:
            self.async_hbm_used = max(self.async_hbm_used, scope.scratch_next - self.scratch_top)
        else:
            self.hbm_peak = max(self.hbm_peak, scope.scratch_next)
        return MemRef(Space.HBM, at, shape)

    _free_sems: list[int]
    _free_regs: list[int]

    def init_pools(self, reserved_registers: int = 0) -> None:
        self._free_sems = list(range(self.config.core.semaphores - 1, -1, -1))
        self._free_regs = list(range(self.config.core.scalar_registers - 1, reserved_registers - 1, -1))

    def semaphore(self) -> int:
        if self._on_async:
            raise CompileError(f"internal: {self.hlo} takes a scoped semaphore for the async sequencer")
        if not self._free_sems:
            raise CompileError(f"{self.hlo}: all {self.config.core.semaphores} semaphores are in use")
        sem = self._free_sems.pop()
        self.scope.semaphores.append(sem)
        return sem

    def free_semaphores(self) -> int:
        """How many semaphores are free."""
        return len(self._free_sems)

    def reserve_semaphores(self, numbers: Sequence[int], why: str) -> None:
        """Take ``numbers`` out of the semaphore pool for the rest of the program (e.g. semaphores other chips
        signal by number).

        Raises:
            CompileError: one of them is held by the instruction being lowered.
        """
        held = [s for s in numbers if s not in self._free_sems]
        if held:
            raise CompileError(f"{self.hlo}: semaphores {held} are in use, but {why} needs them reserved")
        for s in numbers:
            self._free_sems.remove(s)

    def register(self) -> Reg:
        if not self._free_regs:
            raise CompileError(f"{self.hlo}: all {self.config.core.scalar_registers} scalar registers are in use")
        reg = self._free_regs.pop()
        self.scope.registers.append(reg)
        return Reg(reg)

    def release_register(self, reg: Reg) -> None:
        self.scope.registers.remove(reg.index)
        self._free_regs.append(reg.index)


@dataclass(frozen=True)
class ControlSlice:
    """The HLO values control flow and addresses depend on: loop conditions, branch predicates and indices,
    dynamic-slice offsets, gather and scatter indices, and everything they depend on, through tuple
    elements, loop state and the parameters of called computations (leaf by leaf, so a loop counter does not
    drag in the loop's data). In a timing-only run, the instructions that compute them still compute, so
    that the run takes the same path through the program, and touches the same rows, as a numeric one.

    Attributes:
        values: ``(computation, instruction)`` pairs whose code computes a control value.
        leaves: ``(computation, value, leaf path)`` of the tuple leaves that carry one: the loop state
            leaves a ``while`` copies in before the loop and back at the end of an iteration.
    """

    values: frozenset[tuple[str, str]]
    leaves: frozenset[tuple[str, str, tuple[int, ...]]]

    def carries(self, comp: str, value: str, path: tuple[int, ...]) -> bool:
        """True when leaf ``path`` of ``value`` holds a value control flow depends on."""
        return (comp, value, path) in self.leaves


ASYNC_VMEM_BYTES = 4 * 2**20
"""VMEM the async sequencer's all-reduces hold for their reduction blocks, at most a quarter of VMEM. tpusim's
choice (XLA:TPU gives its collectives scoped VMEM too, of a size it does not publish): the least with which a
reduce-scatter's blocks keep the links as busy as with all of VMEM (a v4 4x4 all-reduce of 64 MiB as a
start/done pair: 781.6 us as the plain op, 777.6 with 4 MiB, 816.5 with 1 MiB)."""


ASYNC_REQUESTS = 8
"""Slots of the ring of requests to the async sequencer: at most one per async collective in flight (each
holds a bank of semaphores until its done)."""


def _uses_async_sequencer(module: Module, cores: int) -> bool:
    """Whether the lowering may give async collectives to the async sequencer: a program of several devices
    on one core with an ``all-reduce-start``, an ``all-gather-start`` or an async reduce-scatter or
    all-to-all."""
    if cores != 1 or module.replica_count * module.num_partitions == 1:
        return False
    return any(
        i.opcode in ("all-reduce-start", "all-gather-start") or _wrapped_start(module, i)
        for c in module.computations
        for i in c.instructions
    )


def _wrapped_start(module: Module, instr: Instruction) -> bool:
    """Whether ``instr`` is an ``async-start`` of a reduce-scatter or an all-to-all (which the async sequencer
    runs whole)."""
    wrapped = wrapped_collective(module, instr)
    return wrapped is not None and wrapped.opcode in ("reduce-scatter", "all-to-all")


def _slot(ring: MemRef, at: Reg) -> MemRef:
    """Word ``at`` of the request ring."""
    return MemRef(ring.space, ring.address, ring.shape, Window((at,), (1,)))


def _async_reservation(module: Module, config: ChipConfig, cores: int) -> tuple[int, int]:
    """(VMEM bytes, HBM bytes) the async sequencer holds for the all-reduces and reduce-scatters it runs: none
    unless a program on several devices has such an async collective and one core runs it. A reduce-scatter's
    receive slots take less than its operand (the ``L - 1`` chunks of one ring, fewer on later rings); the HBM
    held is twice the largest operand, at the top of HBM."""
    if not _uses_async_sequencer(module, cores):
        return 0, 0
    largest = 0
    for comp in module.computations:
        for instr in comp.instructions:
            # (a variadic one reduces its arrays one after the other; a reduce-scatter's partial sums between
            # its rings take one operand's bytes)
            if instr.opcode == "all-reduce-start" or _wrapped_start(module, instr):
                for operand in instr.operands:
                    shape = comp[operand].shape
                    if isinstance(shape, Shape):
                        largest = max(largest, shape.byte_size)
    if not largest:
        return 0, 0
    unit = config.vpu.sublanes * config.vpu.lanes * 4
    vmem = min(ASYNC_VMEM_BYTES, config.vmem.bytes // 4) // unit * unit
    return vmem, -(-2 * largest // ALIGNMENT) * ALIGNMENT + ASYNC_TEMPORARIES * ALIGNMENT


ASYNC_TEMPORARIES = 2 + 2 * 3 * 4
"""HBM temporaries one collective on the async sequencer may hold at once, each rounded up to
:data:`ALIGNMENT` (what a small operand's reservation must cover beyond its bytes): its partial sums and a
padded copy, and a receive slot per direction of each part's ring (up to three parts, ``collective_sync.PARTS``,
over up to four axes: a 3-D torus and the slice axis)."""


def control_slice(module: Module) -> ControlSlice:
    """The :class:`ControlSlice` of a module."""
    # A computation's parameter number -> the values its callers pass for it: for a while's condition and
    # body, the loop operand and the body's result (and the loop's own state leaf, recorded in `leaves`).
    passed: dict[tuple[str, int], list[tuple[str, str]]] = {}
    loops: dict[str, list[tuple[str, str]]] = {}  # condition/body -> (computation, while) running it
    work: list[tuple[str, str, tuple[int, ...] | None]] = []  # (computation, value, leaf path or None = all)
    for comp in module.computations:
        for instr in comp.instructions:
            op = instr.opcode
            if op == "while":
                cond, body = instr.attr("condition"), instr.attr("body")
                work.append((cond, module[cond].root, None))
                for sub in (cond, body):
                    passed.setdefault((sub, 0), []).extend([(comp.name, instr.operands[0]), (body, module[body].root)])
                    loops.setdefault(sub, []).append((comp.name, instr.name))
            elif op == "conditional":
                work.append((comp.name, instr.operands[0], None))
                branches = instr.attr("branch_computations") or (
                    instr.attr("true_computation"),
                    instr.attr("false_computation"),
                )
                for n, branch in enumerate(branches):
                    passed.setdefault((branch, 0), []).append((comp.name, instr.operands[n + 1]))
            elif op == "call":
                for n, operand in enumerate(instr.operands):
                    passed.setdefault((instr.attr("to_apply"), n), []).append((comp.name, operand))
            elif op in ("dynamic-slice", "dynamic-update-slice"):
                first = 1 if op == "dynamic-slice" else 2
                work += [(comp.name, o, None) for o in instr.operands[first:]]
            elif op in ("gather", "scatter"):  # the indices are the rows' offsets (operands, indices, updates)
                work.append((comp.name, instr.operands[1 if op == "gather" else len(instr.operands) // 2], None))
    seen: set[tuple[str, str, tuple[int, ...] | None]] = set()
    wanted: set[tuple[str, str]] = set()
    leaves: set[tuple[str, str, tuple[int, ...]]] = set()
    while work:
        item = work.pop()
        if item in seen:
            continue
        seen.add(item)
        comp_name, name, path = item
        comp = module[comp_name]
        instr = comp[name]
        wanted.add((comp_name, name))
        op = instr.opcode
        if op == "get-tuple-element":
            work.append((comp_name, instr.operands[0], (instr.attr("index"), *(path or ()))))
        elif op == "tuple" and path:
            work.append((comp_name, instr.operands[path[0]], path[1:] or None))
        elif op == "parameter":
            number = instr.attr("parameter_number")
            work += [(c, v, path) for c, v in passed.get((comp_name, number), [])]
            for c, loop in loops.get(comp_name, []):
                shape = module[c][loop].shape
                leaves.update(
                    (c, loop, p) for p, _ in leaf_paths(shape) if path is None or p[: len(path)] == tuple(path)
                )
        else:
            work += [(comp_name, o, None) for o in instr.operands]
            work += [(callee, module[callee].root, None) for callee in instr.called_computations()]
    return ControlSlice(frozenset(wanted), frozenset(leaves))


_ANYWHERE = (0, 1 << 62)


def _extent(ref: MemRef) -> tuple[int, int]:
    """The HBM bytes an operand touches: its window's byte extent (the scoreboard's rule, so two cores
    writing row bands of one array do not conflict), the whole array for windows at register offsets."""
    if ref.base is not None:
        return _ANYWHERE
    window = ref.window
    if window is None or window.clamp or not all(isinstance(o, int) for o in window.offsets):
        return ref.address, ref.address + max(1, ref.shape.byte_size)
    lo, hi = window_extent(ref.shape, tuple(window.offsets), tuple(window.sizes))
    return ref.address + lo, ref.address + max(lo + 1, hi)


def _hbm_accesses(instructions: Sequence[Any]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """HBM byte ranges (see :func:`_extent`) the instructions read and write."""
    reads: list[tuple[int, int]] = []
    writes: list[tuple[int, int]] = []
    for ins in instructions:
        if isinstance(ins, DmaStart):
            if ins.src.space is Space.HBM:
                reads.append(_extent(ins.src))
            if ins.dst.space is Space.HBM:
                writes.append(_ANYWHERE if ins.chip is not None else _extent(ins.dst))
        elif isinstance(ins, Fallback):
            reads.extend(_extent(r) for r in ins.inputs if r.space is Space.HBM)
            writes.extend(_extent(r) for r in ins.outputs if r.space is Space.HBM)
    return list(dict.fromkeys(reads)), list(dict.fromkeys(writes))


def _conflict(
    reads: Ranges,
    writes: Ranges,
    done_reads: Ranges,
    done_writes: Ranges,
) -> bool:
    """Core c's new accesses meet what another core d did: c reads or writes what d wrote, or writes what d
    read."""
    cores = len(reads)
    return any(
        _overlaps(reads[c] + writes[c], done_writes[d]) or _overlaps(writes[c], done_reads[d])
        for c in range(cores)
        for d in range(cores)
        if c != d
    )


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The same bytes as sorted, disjoint, non-adjacent ranges."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _overlaps(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    """Two lists of ranges share a byte (each sorted and disjoint, or merged here)."""
    if not a or not b:
        return False
    a, b = _merge(a), _merge(b)
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][0] < b[j][1] and b[j][0] < a[i][1]:
            return True
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return False


class VmemExhausted(CompileError):
    """A block plan that does not fit the VMEM share of one instruction (lowerings catch it and re-plan)."""

    def __init__(self, need: int, share: int, hlo: str | None) -> None:
        self.need = need
        self.share = share
        super().__init__(f"{hlo}: a {need}-byte VMEM block does not fit the {share}-byte VMEM share of one instruction")
