"""Decoding: every instruction of a stream prepared for issue, once per program, stream, config and mode.

Decode checks an instruction against the config and computes what does not depend on registers: its issue
handler, its operands' plans (:class:`OperandPlan`), its closed-form cost and the byte ranges of operands
that need no register. None of it refers to a run's memories, units or cores: scoreboard ranges name a
memory by its :class:`~tpusim.isa.Space` (compute operands are always the issuing core's own memories), and
handlers find per-run state through the core. So a decoded stream is shared by every core that runs the
stream, and later runs of the same program reuse it (:func:`decoded_stream` keeps the last few, keyed by
the program and stream objects themselves, checked by identity, and by the config, checked by equality).

Decode raises the load-time errors (a register or semaphore that does not exist, an operand a unit cannot
take); a stream that fails to decode is not cached, so every run reports the error.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from tpusim.devices.compute import issue_mxu_fast, issue_vpu_static
from tpusim.devices.fallback import fallback_cost
from tpusim.devices.hazards import OWN, box_of
from tpusim.devices.mxu import MxuState, timing_facts
from tpusim.devices.stores import affine
from tpusim.devices.trace import InstructionTexts
from tpusim.devices.units import COMPUTE, HANDLERS, Access, Cost, Handler
from tpusim.gcpause import paused_gc
from tpusim.isa import DmaStart, Fallback, MemRef, Reg, Space
from tpusim.memory.windows import window_extent

if TYPE_CHECKING:
    from tpusim.config import ChipConfig
    from tpusim.devices.core import Core
    from tpusim.isa import Instruction, Program, Stream
    from tpusim.memory import Shape

__all__ = ["Decoded", "DecodedStream", "OperandPlan", "capacity", "decoded_stream"]

_CACHE_SIZE = 16  # decoded streams kept for later runs (a sweep or a benchmark runs one program many times)
_CACHE: OrderedDict[tuple[int, int, bool], DecodedStream] = OrderedDict()


def capacity(cfg: ChipConfig, space: Space) -> int:
    """Bytes of a memory of ``space`` (what the chip's ByteStores are created with)."""
    if space is Space.HBM:
        return cfg.hbm.bytes
    return cfg.vmem.bytes if space is Space.VMEM else cfg.smem.bytes


class Decoded:
    """One instruction prepared for issue: its handler and whatever can be computed before the run.

    Attributes:
        ins, index: the instruction and its index in the stream (the first of them for a compute or DMA
            instruction equal instructions share: issue handlers take the index from the core's pc).
        handler: the issue handler ``(core, decoded, t) -> next cycle | event``.
        spec: the compute spec (None for scalar, sync and DMA instructions).
        static: every operand is fixed (no base register, no register offset).
        reads, writes: for static operands, :class:`Access` templates without a store (``Core.bind`` adds it).
        rr, rw, box: for static operands, their scoreboard ranges ``(memory key, lo, hi)`` and their bounding box.
        extra: for operands that only a base register moves, ``(memory key, address, base register, lo, hi,
            largest address, is write)`` per operand; DMAs: a cache of transfer facts by window alignment;
            scalar instructions: their prepared operands.
        cost: the closed-form cost when it does not depend on registers.
        mxu, sched, mx: MXU instructions: the MXU's number, the :class:`MxuState` timing method and what it
            needs of the instruction (:func:`~tpusim.devices.mxu.timing_facts`).
        fast: MXU instructions with a fixed operand: ``(key, lo, hi, is write, range)`` of it.
        numeric: apply the instruction's numeric effect (a numeric run, or an instruction flagged control).
    """

    __slots__ = (
        "box",
        "cost",
        "cost_fn",
        "extra",
        "fast",
        "handler",
        "index",
        "ins",
        "mx",
        "mxu",
        "numeric",
        "plans_r",
        "plans_w",
        "read_refs",
        "reads",
        "rr",
        "rw",
        "sched",
        "spec",
        "static",
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
        self.box: tuple[int, int] | None = None  # bounding box of rr and rw
        self.read_refs: tuple[MemRef, ...] = ()
        self.write_refs: tuple[MemRef, ...] = ()
        self.plans_r: tuple[OperandPlan, ...] = ()
        self.plans_w: tuple[OperandPlan, ...] = ()
        self.cost: Cost | None = None
        self.cost_fn: Any = None
        self.extra: Any = None
        self.mxu = -1
        self.sched: Any = None
        self.mx: Any = None
        self.fast: Any = None
        self.numeric = False  # the instruction's numeric effect is applied (a numeric run, or control)


class OperandPlan:
    """What resolving one MemRef needs, computed once per program."""

    __slots__ = (
        "address",
        "affine",
        "base",
        "clamp",
        "dims",
        "dynamic",
        "extent",
        "extents",
        "key",
        "nbytes",
        "norm",
        "offsets",
        "ref",
        "shape",
        "shift",
        "sizes",
        "space",
        "wspec",
    )
    shape: Shape
    nbytes: int
    dims: tuple[int, ...]
    sizes: tuple[int, ...] | None
    clamp: bool
    offsets: tuple[int, ...] | None
    norm: tuple[int, ...] | None
    shift: int
    dynamic: tuple[int, ...]
    extents: dict[tuple[int, ...], tuple[int, int]]
    affine: Any
    extent: tuple[int, int]
    wspec: tuple[tuple[int, int, int, int], ...]

    def __init__(self, ref: MemRef, geometry: OperandPlan | None = None) -> None:
        """``geometry``: a plan of another reference with the same shape and window (at another address),
        whose address-independent facts this one shares."""
        self.ref = ref
        self.space = ref.space
        self.key = OWN[ref.space]  # scoreboard key of the issuing core's memory
        self.address = ref.address
        self.base = ref.base.index if ref.base is not None else -1
        g = geometry
        if g is not None:
            self.shape, self.nbytes, self.dims, self.sizes, self.clamp = g.shape, g.nbytes, g.dims, g.sizes, g.clamp
            self.offsets, self.norm, self.shift, self.dynamic = g.offsets, g.norm, g.shift, g.dynamic
            self.extents, self.affine, self.extent = g.extents, g.affine, g.extent
            if self.dynamic:
                self.wspec = g.wspec
            return
        self.shape = ref.shape
        self.nbytes = ref.shape.byte_size
        self.dims = ref.shape.dimensions
        w = ref.window
        self.sizes = w.sizes if w is not None else None
        self.clamp = w.clamp if w is not None else False
        self.offsets = None
        # fixed offsets reduced by the layout's periods and the byte shift that undoes it (see Core.resolve):
        # transfers of different windows with the same reduced offsets share their costs
        self.norm = None
        self.shift = 0
        self.dynamic = ()
        # by offsets modulo the layout's periods (relative to the array: shared by plans of one geometry)
        self.extents = {}
        self.affine = affine(ref.shape) if w is not None and not w.is_static else None
        self.extent = (0, self.nbytes)
        if w is not None:
            if w.is_static:
                self.offsets = self.norm = w.offsets  # type: ignore[assignment]
                self.extent = window_extent(ref.shape, self.offsets, w.sizes)
                aff = affine(ref.shape)
                if aff is not None:
                    self.norm, self.shift = aff.split(self.offsets)  # type: ignore[arg-type]
            else:
                # register index, or -(immediate + 1) for an immediate offset
                self.dynamic = tuple(o.index if isinstance(o, Reg) else -o - 1 for o in w.offsets)
                aff = self.affine
                periods = aff.periods if aff is not None else (1,) * len(w.sizes)
                strides = aff.strides if aff is not None else (0,) * len(w.sizes)
                # per dimension: offset source, largest valid start, period and slot stride (see Core.resolve)
                self.wspec = tuple(
                    (o, d - s, per, g) for o, d, s, per, g in zip(self.dynamic, self.dims, w.sizes, periods, strides)
                )

    def template(self) -> Access:
        """An Access with the operand's static facts and no store (for costs, which never read memory)."""
        lo, hi = self.extent
        a = self.address
        return Access(None, self.space, a, self.shape, self.offsets, self.sizes, a + lo, a + hi)  # type: ignore[arg-type]


class DecodedStream:
    """A stream decoded for one config and mode.

    Attributes:
        decoded: one :class:`Decoded` per instruction.
        plans: operand plans by ``id`` of their MemRef (the stream holds the MemRefs, so ids stay valid).
        geometries: the first plan of each (shape, window), whose address-independent facts later plans of
            the same geometry share (an unrolled kernel reads the same windows of many arrays).
        texts: the instructions' text forms, formatted on demand (for traces and errors).
    """

    __slots__ = ("_hlo", "cfg", "decoded", "geometries", "numeric", "plans", "program", "stream", "texts")

    def __init__(self, program: Program, stream: Stream, cfg: ChipConfig, numeric: bool) -> None:
        self.program = program
        self.stream = stream
        self.cfg = cfg
        self.numeric = numeric
        self.plans: dict[int, OperandPlan] = {}
        self.geometries: dict[tuple[Any, ...], OperandPlan] = {}
        self.decoded: list[Decoded] = []
        self.texts = InstructionTexts(stream.instructions)
        self._hlo: tuple[str, ...] | None = None

    @property
    def hlo(self) -> tuple[str, ...]:
        """Per instruction, the HLO instruction it came from ("" when none)."""
        if self._hlo is None:
            self._hlo = tuple(i.hlo or "" for i in self.stream.instructions)
        return self._hlo

    def plan(self, ref: MemRef) -> OperandPlan:
        p = self.plans.get(id(ref))
        if p is None:
            key = (ref.shape, ref.window)
            geometry = self.geometries.get(key)
            p = self.plans[id(ref)] = OperandPlan(ref, geometry)
            if geometry is None:
                self.geometries[key] = p
        return p


def decoded_stream(core: Core) -> DecodedStream:
    """The decoded stream of ``core`` (from the cache when the same program, stream, config and mode ran
    before; the cache holds the program and stream, so their ids cannot be reused while it is there)."""
    program, stream, cfg, numeric = core.machine.program, core.stream, core.cfg, core.numeric
    key = (id(program), id(stream), numeric)
    hit = _CACHE.get(key)
    if hit is not None and hit.program is program and hit.stream is stream and (hit.cfg is cfg or hit.cfg == cfg):
        _CACHE.move_to_end(key)
        return hit
    with paused_gc():  # (one long-lived decoding per instruction: tpusim.gcpause)
        ds = _decode_stream(core, program, stream, cfg, numeric)
    _CACHE[key] = ds
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return ds


def _decode_stream(core: Core, program: Program, stream: Stream, cfg: ChipConfig, numeric: bool) -> DecodedStream:
    ds = DecodedStream(program, stream, cfg, numeric)
    # An unrolled kernel repeats the same instruction many times (its VMEM slots rotate): the d1024 decoder
    # block has 10,900 distinct instructions among 99,133. Equal compute and DMA instructions share one
    # decoding (their facts depend on the value only); control flow is decoded per index (a branch knows
    # whether it jumps back).
    # (The compiler appends the same object again where it can: looked up by identity first, then by value.)
    first: dict[Instruction, Decoded] = {}
    same_object: dict[int, Decoded] = {}
    decoded = ds.decoded
    for i, ins in enumerate(stream.instructions):
        seen = same_object.get(id(ins))
        if seen is None:
            if ins.__class__ is not DmaStart and ins.__class__ not in COMPUTE:
                decoded.append(_decode(core, ds, ins, i))
                continue
            seen = first.get(ins)
            if seen is None:
                seen = first[ins] = _decode(core, ds, ins, i)
                same_object[id(ins)] = seen
                decoded.append(seen)
                continue
            same_object[id(ins)] = seen
        decoded.append(seen)
    return ds


def _decode(core: Core, ds: DecodedStream, ins: Instruction, index: int) -> Decoded:
    """Check ``ins`` against the config and precompute what does not depend on registers."""
    cfg = ds.cfg
    d = Decoded(ins, index)
    d.numeric = ds.numeric or bool(getattr(ins, "control", False))
    n_regs = cfg.core.scalar_registers
    for reg in _registers(ins):
        if reg.index >= n_regs:
            raise core.error(index, f"register {reg} does not exist (the core has {n_regs})")
    for sem in (getattr(ins, "sem", None), getattr(ins, "dst_sem", None)):
        if isinstance(sem, int) and sem >= cfg.core.semaphores:
            raise core.error(index, f"semaphore {sem} does not exist (the core has {cfg.core.semaphores})")
    if isinstance(ins, DmaStart):
        d.plans_r, d.plans_w = (ds.plan(ins.src),), (ds.plan(ins.dst),)
        d.extra = {}  # transfer facts by window alignment (see dma.issue_dma)
        d.static = ins.chip is None and all(_fixed(p) for p in d.plans_r + d.plans_w)
        return d
    spec = d.spec
    if spec is None:
        return d
    problem = spec.check(cfg, ins)
    if problem:
        raise core.error(index, problem)
    d.read_refs, d.write_refs = spec.refs(ins)
    d.plans_r = tuple(ds.plan(r) for r in d.read_refs)
    d.plans_w = tuple(ds.plan(r) for r in d.write_refs)
    d.cost_fn = spec.cost
    if isinstance(ins, Fallback):
        kernel = ds.program.fallback(ins.kernel)
        d.cost_fn = lambda cfg, i, r, w: fallback_cost(kernel, r, w)
    plans = d.plans_r + d.plans_w
    if all(_fixed(p) for p in plans):
        d.static = True
        for p in plans:
            if p.address + p.nbytes > capacity(cfg, p.space):
                problem = core.stores[p.space].check(p.address, p.address + p.nbytes)
                raise core.error(index, f"operand {p.ref} at {p.address:#x}: {problem}")
        d.reads = tuple(p.template() for p in d.plans_r)
        d.writes = tuple(p.template() for p in d.plans_w)
        d.rr = tuple((p.key, a.lo, a.hi) for p, a in zip(d.plans_r, d.reads))
        d.rw = tuple((p.key, a.lo, a.hi) for p, a in zip(d.plans_w, d.writes))
        d.box = box_of(d.rr + d.rw)
        d.cost = d.cost_fn(cfg, ins, d.reads, d.writes)
        if d.cost.unit == "vpu":
            d.handler = issue_vpu_static
    elif all(p.dynamic == () for p in plans):
        # only base registers vary: the cost (a function of layouts and windows) is the same every time
        d.cost = d.cost_fn(cfg, ins, tuple(p.template() for p in d.plans_r), tuple(p.template() for p in d.plans_w))
        d.extra = tuple(
            (p.key, p.address, p.base, p.extent[0], p.extent[1], capacity(cfg, p.space) - p.nbytes, w)
            for w, plans_ in ((False, d.plans_r), (True, d.plans_w))
            for p in plans_
        )
    if d.cost is not None and d.cost.unit == "mxu":
        d.mxu = ins.mxu  # type: ignore[union-attr]
        d.sched = MxuState.scheduler_of(ins)
        d.mx = timing_facts(ins)
        if d.static:
            key, lo, hi = (d.rw or d.rr)[0]
            d.fast = (key, lo, hi, not d.rr, (key, lo, hi))
        if d.static or len(d.extra or ()) == 1:
            d.handler = issue_mxu_fast
    return d


def _fixed(p: OperandPlan) -> bool:
    """The operand needs no register (no base, no register offset)."""
    return p.base < 0 and (p.sizes is None or p.offsets is not None)


_REG_FIELDS: dict[type, tuple[str, ...]] = {}
_REGISTER_TYPES = ("Reg", "MemRef", "Scalar", "Operand")
"""Instruction field types that can hold a register (``Scalar`` and ``Operand`` are unions with ``Reg``)."""


def _registers(ins: Any) -> list[Reg]:
    cls = type(ins)
    names = _REG_FIELDS.get(cls)
    if names is None:
        # only fields whose type can hold a register or a memory reference (not flags, names, sizes)
        names = _REG_FIELDS[cls] = tuple(
            name
            for name, f in getattr(cls, "__dataclass_fields__", {}).items()
            if any(t in str(f.type) for t in _REGISTER_TYPES)
        )
    out: list[Reg] = []
    for name in names:
        v = getattr(ins, name)
        for x in v if v.__class__ is tuple else (v,):
            if x.__class__ is Reg:
                out.append(x)
            elif x.__class__ is MemRef and (x.base is not None or x.window is not None):
                out.extend(x.registers)
    return out
