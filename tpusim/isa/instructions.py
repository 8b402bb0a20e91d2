"""The instructions: one frozen, slotted dataclass per kind, each with its exact effect and timing rule.

Every instruction has two trailing fields:

* ``control`` -- the instruction's result feeds control flow (a loop condition, a branch index, a dynamic
  offset). In timing-only runs the devices skip numeric work except for scalar instructions and
  instructions with this flag, so the compiler sets it on the producers of control values.
* ``hlo`` -- the name of the HLO instruction it was lowered from. It is carried into the trace and into
  error messages, and is not part of an instruction's meaning (not compared).

Timing rules are stated per instruction; the symbols are config keys (``docs/model.md`` derives them and
``configs/README.md`` lists them). ``V(x)`` is the number of (sublanes x lanes) 32-bit vector registers the
block ``x`` occupies in its layout, padding included (``ceil(bytes / vreg_bytes)`` for a whole array; the
distinct vreg-sized pieces a window touches otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from tpusim.isa.operands import Const, IsaError, MemRef, Operand, Reg, Scalar, Space
from tpusim.isa.ops import (
    COMPARE_DIRECTIONS,
    PRECISIONS,
    REDUCE_FUNCTIONS,
    SCALAR_FUNCTIONS,
    VPU_FUNCTIONS,
    Op,
)
from tpusim.memory import ElementType, element_type

__all__ = [
    "Barrier",
    "Branch",
    "DmaStart",
    "Fallback",
    "FusedOp",
    "Halt",
    "Instruction",
    "Jump",
    "MxuLoadWeights",
    "MxuMatmul",
    "MxuPop",
    "ScalarAlu",
    "ScalarLoad",
    "ScalarStore",
    "SemSignal",
    "SemWait",
    "VpuBroadcast",
    "VpuCopy",
    "VpuFused",
    "VpuIota",
    "VpuMap",
    "VpuReduce",
    "VpuReshape",
    "XluTranspose",
]


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise IsaError(message)


def _need_space(ref: MemRef, spaces: tuple[Space, ...], what: str) -> None:
    if ref.space not in spaces:
        names = " or ".join(s.value for s in spaces)
        raise IsaError(f"{what} must be in {names}, not {ref.space.value}")


# ---------------------------------------------------------------------------------------------------------
# DMA and synchronisation
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DmaStart:
    """Copy a window of ``src`` to a window of ``dst`` asynchronously.

    Effect: every element of the source window is copied, bit for bit, to the same position of the
    destination window (the two windows have equal sizes and element types; their layouts may differ, so
    a DMA can relayout). The copy happens when the transfer completes; ``sem`` (on the issuing core) and
    ``dst_sem`` (on the destination core) are then each incremented by 1. Remote DMAs are push-only: the
    source is this chip's memory, the destination ``chip``'s.

    Timing: the sequencer does not wait. The transfer waits for a free DMA engine of the core
    (``dma.engines``), spends ``dma.setup_cycles``, then moves its bytes as a fluid flow that shares every
    resource it crosses (this chip's HBM, the core's local DMA port, ICI links, the remote HBM) fairly with
    the other flows, limited to ``dma.runs_per_cycle`` contiguous runs per cycle; HBM sides are charged in
    ``dma.burst_bytes`` bursts. It completes ``hbm.latency_ns`` (and ``ici.hop_latency_ns`` per hop) after
    its last byte moved.

    Attributes:
        src: source block (HBM, VMEM or SMEM of this chip / core).
        dst: destination block.
        sem: semaphore of the issuing core incremented at completion, or None.
        chip: destination chip for a remote write (immediate or register), None for this chip.
        dst_core: core whose VMEM/SMEM is written (None: the core with the issuing core's index).
        dst_sem: semaphore of the destination core incremented at completion, or None.
        route: for a remote write, the order in which its route corrects the topology's axes (a permutation
            of them); None: the system's routing order (``ici.routing``). Two halves of a transfer sent in
            two orders cross disjoint links when source and destination differ along two axes.
        tie: the way a remote write's route goes round a ring whose two ways are as short (+1 forward, -1
            backward): two halves sent both ways to the chip half-way round use both directions' links.
    """

    src: MemRef
    dst: MemRef
    sem: int | None = None
    chip: Scalar | None = None
    dst_core: int | None = None
    dst_sem: int | None = None
    route: tuple[int, ...] | None = None
    tie: int = 1
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.DMA_START

    def __post_init__(self) -> None:
        s, d = self.src, self.dst
        _need(s.dims == d.dims, f"DMA source window {s.dims} and destination window {d.dims} differ in size")
        _need(
            s.element_type == d.element_type,
            f"DMA copies bytes: source type {s.element_type} and destination type {d.element_type} differ",
        )
        for v, what in ((self.sem, "sem"), (self.dst_sem, "dst_sem"), (self.dst_core, "dst_core")):
            _need(v is None or v >= 0, f"{what} {v} is negative")
        if self.route is not None:
            object.__setattr__(self, "route", tuple(self.route))
            _need(
                sorted(self.route) == list(range(len(self.route))),
                f"route {self.route} is not an order of axes (each of 0..{len(self.route) - 1} once)",
            )
            _need(self.chip is not None, "a route is for a remote write (give chip=)")
        _need(self.tie in (1, -1), f"tie {self.tie} must be 1 (forward) or -1 (backward)")


@dataclass(frozen=True, slots=True)
class SemSignal:
    """Increment semaphore ``sem`` by ``count``.

    Effect: on this core, or on ``core`` of this chip, or on ``core`` of ``chip``. Timing: one issue cycle;
    a signal to another core arrives at the issue cycle (plus ``ici.hop_latency_ns`` per hop when remote).
    With ``fence`` the signal leaves only when every compute instruction this sequencer issued before it has
    completed (the sequencer does not wait): "the vector unit has read the buffer" (a ring's credit to the
    chip that pushes into it).
    """

    sem: int
    count: int = 1
    core: int | None = None
    chip: Scalar | None = None
    fence: bool = False
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.SEM_SIGNAL

    def __post_init__(self) -> None:
        _need(self.sem >= 0, f"semaphore {self.sem} is negative")
        _need(self.count >= 1, f"signal count {self.count} must be at least 1")


@dataclass(frozen=True, slots=True)
class SemWait:
    """Wait until semaphore ``sem`` of this core holds at least ``count``, then subtract ``count``.

    Timing: the sequencer stalls until then (no later instruction issues). Waiting for a value no event
    can produce is reported as a deadlock.
    """

    sem: int
    count: int = 1
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.SEM_WAIT

    def __post_init__(self) -> None:
        _need(self.sem >= 0, f"semaphore {self.sem} is negative")
        _need(self.count >= 1, f"wait count {self.count} must be at least 1")


@dataclass(frozen=True, slots=True)
class Barrier:
    """Fence and rendezvous.

    Effect: waits until every instruction this core issued before it has completed (DMAs included), then
    until every core in ``scope`` (``chip``: the cores of this chip that run a stream; ``system``: every
    stream of the program) has reached a barrier with the same ``id``. Timing: all leave at the cycle the
    last one arrives.
    """

    id: int = 0
    scope: Literal["chip", "system"] = "chip"
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.BARRIER

    def __post_init__(self) -> None:
        _need(self.scope in ("chip", "system"), f"barrier scope must be chip or system, not {self.scope!r}")
        _need(self.id >= 0, f"barrier id {self.id} is negative")


# ---------------------------------------------------------------------------------------------------------
# MXU
# ---------------------------------------------------------------------------------------------------------
def _check_precision(p: str) -> None:
    _need(p in PRECISIONS, f"precision {p!r} is not one of {', '.join(PRECISIONS)}")


@dataclass(frozen=True, slots=True)
class MxuLoadWeights:
    """Latch a ``K x N`` weight tile (K <= mxu.rows, N <= mxu.cols) from VMEM into MXU ``mxu``.

    Effect: the tile (``src``'s value, or its transpose when ``transpose``; all dimensions but the last
    two must be 1) becomes the weights the next ``mxu.matmul`` uses. bf16, int8/uint8 and f32 tiles are
    accepted; an f32 tile is split into ``PRECISION_PASSES[precision][0]`` bf16 parts.

    Timing: ``mxu.weight_load_cycles`` per part. With ``mxu.double_buffered`` the tile loads into the
    staging buffer while the previous tile streams (it waits only for the staging buffer to be consumed);
    without, the load waits until the last matmul on the array has drained.
    """

    mxu: int
    src: MemRef
    transpose: bool = False
    precision: str = "bf16"
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.MXU_LOAD_WEIGHTS

    def __post_init__(self) -> None:
        _need(self.mxu >= 0, f"MXU index {self.mxu} is negative")
        _need_space(self.src, (Space.VMEM,), "MXU weights")
        _need(len(self.src.dims) >= 2, f"MXU weights need at least 2 dimensions, not {self.src.dims}")
        _check_precision(self.precision)


@dataclass(frozen=True, slots=True)
class MxuMatmul:
    """Stream the ``M x K`` block ``lhs`` through MXU ``mxu``'s latched weights.

    Effect: result-buffer rows ``acc .. acc+M-1``, columns ``0 .. N-1`` receive ``lhs @ W`` (f32, or s32
    for 8-bit integer operands), or have it added when ``accumulate``. Products of bf16 values are exact in
    f32 and summed in f32 (the MXU accumulates in f32) in the BLAS library's order; consecutive one-pass
    matmuls accumulating into the same rows are one f32 product over their joint contraction (see
    ``docs/model.md``, MXU numerics). Integers: exact, wrapped to s32. A multi-pass precision sums its bf16
    passes in f32, smallest terms first, before accumulating.

    Timing: ``P * ceil(M / s)`` cycles of occupancy of the input port (``P`` passes, ``s =
    mxu.int8_speedup`` for 8-bit operands, else 1), at least ``V(lhs) / vmem.load_vregs_per_cycle``; the
    result is complete ``mxu.rows - 1 + mxu.cols - 1`` cycles (input and output skew) after the last row
    entered. It starts when the input port is free and the weights are loaded.
    """

    mxu: int
    lhs: MemRef
    acc: int = 0
    accumulate: bool = False
    precision: str = "bf16"
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.MXU_MATMUL

    def __post_init__(self) -> None:
        _need(self.mxu >= 0, f"MXU index {self.mxu} is negative")
        _need(self.acc >= 0, f"result-buffer row {self.acc} is negative")
        _need_space(self.lhs, (Space.VMEM,), "MXU left operand")
        _need(len(self.lhs.dims) >= 2, f"MXU left operand needs at least 2 dimensions, not {self.lhs.dims}")
        _check_precision(self.precision)


@dataclass(frozen=True, slots=True)
class MxuPop:
    """Copy result-buffer rows ``acc ..`` of MXU ``mxu`` to the VMEM block ``dst`` (``rows x N``).

    Effect: ``dst`` receives the f32 (or s32) results, rounded to nearest even when ``dst`` is bf16.
    Timing: waits for the matmuls issued before it on this MXU to complete, then occupies the result port
    for ``ceil(rows / mxu.pop_rows_per_cycle)`` cycles, at least ``V(dst) / vmem.store_vregs_per_cycle``.
    """

    mxu: int
    dst: MemRef
    acc: int = 0
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.MXU_POP

    def __post_init__(self) -> None:
        _need(self.mxu >= 0, f"MXU index {self.mxu} is negative")
        _need(self.acc >= 0, f"result-buffer row {self.acc} is negative")
        _need_space(self.dst, (Space.VMEM,), "MXU results")
        _need(len(self.dst.dims) >= 2, f"MXU results need at least 2 dimensions, not {self.dst.dims}")


# ---------------------------------------------------------------------------------------------------------
# VPU and XLU: whole VMEM blocks per instruction
# ---------------------------------------------------------------------------------------------------------
def _vector_src(op: Operand, what: str) -> None:
    if isinstance(op, MemRef):
        _need_space(op, (Space.VMEM,), what)
    else:
        _need(isinstance(op, (Const, Reg)), f"{what} must be a VMEM block, a constant or a register, not {op!r}")


@dataclass(frozen=True, slots=True)
class VpuMap:
    """Elementwise ``dst = fn(srcs...)`` with the HLO semantics of opcode ``fn``.

    Effect: sources are VMEM blocks with ``dst``'s dimensions, or constants / scalar registers (s32)
    splatted over them, typed as HLO requires. The numbers are those of the reference interpreter for the
    opcode: floats narrower than f32 computed in f32 and rounded once, denormals flushed, integer
    arithmetic wrapping, ``convert`` saturating float to integer with NaN to 0. ``compare`` takes
    ``direction``.

    Timing: occupancy ``max(V / issue, V_in / vmem.load_vregs_per_cycle, V(dst) /
    vmem.store_vregs_per_cycle)`` where ``V`` is the largest block, ``V_in`` the sum over source blocks,
    and ``issue`` the vregs per cycle of the function's cost class (``vpu.op_classes``); the result is
    ready ``latency_cycles`` of that class after the occupancy ends.
    """

    fn: str
    dst: MemRef
    srcs: tuple[Operand, ...]
    direction: str | None = None
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.VPU_MAP

    def __post_init__(self) -> None:
        object.__setattr__(self, "srcs", tuple(self.srcs))
        spec = VPU_FUNCTIONS.get(self.fn)
        _need(spec is not None, f"unknown VPU function {self.fn!r}")
        assert spec is not None
        _need(len(self.srcs) == spec.arity, f"vpu.{self.fn} takes {spec.arity} sources, not {len(self.srcs)}")
        _need_space(self.dst, (Space.VMEM,), f"vpu.{self.fn} destination")
        for s in self.srcs:
            _vector_src(s, f"vpu.{self.fn} source")
            if isinstance(s, MemRef):
                _need(s.dims == self.dst.dims, f"vpu.{self.fn} source {s.dims} and destination {self.dst.dims} differ")
        if self.fn == "compare":
            _need(self.direction in COMPARE_DIRECTIONS, f"vpu.compare needs a direction in {COMPARE_DIRECTIONS}")
        else:
            _need(self.direction is None, f"vpu.{self.fn} takes no direction")


@dataclass(frozen=True, slots=True)
class FusedOp:
    """One step of a :class:`VpuFused` chain.

    Attributes:
        fn: an elementwise HLO opcode (a key of ``VPU_FUNCTIONS``).
        etype: the step's result element type (each step rounds to it, as the HLO computation would).
        args: value numbers: ``0 .. len(srcs) - 1`` are the instruction's sources, then one per earlier step.
        direction: for ``compare``.
    """

    fn: str
    etype: ElementType
    args: tuple[int, ...]
    direction: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.etype, ElementType):
            object.__setattr__(self, "etype", element_type(self.etype))
        object.__setattr__(self, "args", tuple(self.args))
        spec = VPU_FUNCTIONS.get(self.fn)
        _need(spec is not None, f"unknown VPU function {self.fn!r}")
        assert spec is not None
        _need(len(self.args) == spec.arity, f"{self.fn} takes {spec.arity} operands, not {len(self.args)}")
        if self.fn == "compare":
            _need(self.direction in COMPARE_DIRECTIONS, f"compare needs a direction in {COMPARE_DIRECTIONS}")
        else:
            _need(self.direction is None, f"{self.fn} takes no direction")

    def __str__(self) -> str:
        fn = self.fn if self.direction is None else f"{self.fn}/{self.direction}"
        return f"{fn}:{self.etype.name}({','.join(map(str, self.args))})"


@dataclass(frozen=True, slots=True)
class VpuFused:
    """A chain of elementwise ops on one block, intermediates kept in vector registers (an XLA loop fusion).

    Effect: value ``k`` of the chain is source ``k`` (blocks with ``dst``'s rank whose dimensions are
    ``dst``'s or 1, constants or registers), then each step of ``ops`` appends ``fn(values[args])`` rounded
    to its ``etype`` with the numbers of :class:`VpuMap`, a source of size 1 along a dimension standing for
    every index of it (a per-row maximum subtracted from every element of its row); the last value is
    written to ``dst``.

    Timing: the sources are loaded and ``dst`` stored once: occupancy ``max(ALU vreg ops / alu issue,
    transcendental vreg ops / transcendental issue, V(sources) / load ports, V(dst) / store ports)``, where a
    step costs the registers its result type needs for the block, and a source broadcast so costs one ALU
    op per register of ``dst`` (replicating it in registers); the result is ready after the latencies along
    the longest dependency path.
    """

    dst: MemRef
    srcs: tuple[Operand, ...]
    ops: tuple[FusedOp, ...]
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.VPU_FUSED

    def __post_init__(self) -> None:
        object.__setattr__(self, "srcs", tuple(self.srcs))
        object.__setattr__(self, "ops", tuple(self.ops))
        _need_space(self.dst, (Space.VMEM,), "vpu.fused destination")
        _need(len(self.ops) >= 1, "vpu.fused needs at least one step")
        for s in self.srcs:
            _vector_src(s, "vpu.fused source")
            if isinstance(s, MemRef):
                _need(
                    len(s.dims) == len(self.dst.dims) and all(a in (b, 1) for a, b in zip(s.dims, self.dst.dims)),
                    f"vpu.fused source {s.dims} does not broadcast to the destination {self.dst.dims}",
                )
        n = len(self.srcs)
        for k, step in enumerate(self.ops):
            for a in step.args:
                _need(0 <= a < n + k, f"vpu.fused step {k} ({step}) uses value {a}, not defined before it")
        last = self.ops[-1].etype
        _need(last == self.dst.element_type, f"vpu.fused ends in {last} but the destination is {self.dst.element_type}")


@dataclass(frozen=True, slots=True)
class VpuReduce:
    """``dst = fn-reduce(src, dims)`` (or ``fn(dst, ...)`` when ``accumulate``), computed in f32 for floats.

    Effect: ``dst``'s dimensions are ``src``'s without ``dims``, in order. Floating-point sums use numpy's
    pairwise reduction in f32 (f64 for f64).

    Timing, by the layout of ``src``: reducing only major dimensions costs ``V(src)`` ALU vreg ops; a
    reduced sublane dimension (second most minor) adds ``log2(vpu.sublanes)`` rotate-and-combine ops per
    output vreg; a reduced lane dimension (most minor) runs on a cross-lane unit at
    ``xlu.lane_reduce_cycles_per_vreg`` per source vreg plus ``xlu.latency_cycles``.
    """

    fn: str
    dst: MemRef
    src: MemRef
    dims: tuple[int, ...]
    accumulate: bool = False
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.VPU_REDUCE

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(self.dims))
        _need(self.fn in REDUCE_FUNCTIONS, f"reduce function {self.fn!r} is not one of {', '.join(REDUCE_FUNCTIONS)}")
        _need_space(self.dst, (Space.VMEM,), "vpu.reduce destination")
        _need_space(self.src, (Space.VMEM,), "vpu.reduce source")
        rank = len(self.src.dims)
        _need(len(set(self.dims)) == len(self.dims), f"reduce dimensions {self.dims} repeat")
        _need(all(0 <= d < rank for d in self.dims), f"reduce dimensions {self.dims} out of range for rank {rank}")
        kept = tuple(n for i, n in enumerate(self.src.dims) if i not in self.dims)
        _need(kept == self.dst.dims, f"reducing {self.src.dims} over {self.dims} gives {kept}, not {self.dst.dims}")


@dataclass(frozen=True, slots=True)
class VpuBroadcast:
    """XLA broadcast: ``dst[i] = src[i[dims[0]], i[dims[1]], ...]``.

    Timing: one store per output vreg (``V(dst) / vmem.store_vregs_per_cycle``); broadcasting into the
    sublane dimension adds one ALU op per output vreg; into the lane dimension, a cross-lane unit pass at
    ``xlu.lane_broadcast_cycles_per_vreg`` per output vreg.
    """

    dst: MemRef
    src: Operand
    dims: tuple[int, ...] = ()
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.VPU_BROADCAST

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(self.dims))
        _need_space(self.dst, (Space.VMEM,), "vpu.broadcast destination")
        _vector_src(self.src, "vpu.broadcast source")
        src_dims = self.src.dims if isinstance(self.src, MemRef) else ()
        _need(
            len(src_dims) == len(self.dims), f"broadcast dims {self.dims} must map each of {len(src_dims)} source dims"
        )
        out = self.dst.dims
        for i, d in enumerate(self.dims):
            _need(0 <= d < len(out), f"broadcast dim {d} out of range for rank {len(out)}")
            _need(src_dims[i] in (1, out[d]), f"source dim {i} of size {src_dims[i]} cannot broadcast to {out[d]}")
        _need(list(self.dims) == sorted(set(self.dims)), f"broadcast dims {self.dims} must be strictly increasing")


@dataclass(frozen=True, slots=True)
class VpuIota:
    """``dst[i] = i[dimension]`` converted to ``dst``'s element type. Timing: ``V(dst)`` ALU vreg ops."""

    dst: MemRef
    dimension: int
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.VPU_IOTA

    def __post_init__(self) -> None:
        _need_space(self.dst, (Space.VMEM,), "vpu.iota destination")
        _need(0 <= self.dimension < len(self.dst.dims), f"iota dimension {self.dimension} out of range")


@dataclass(frozen=True, slots=True)
class VpuCopy:
    """Copy a block into another layout (same dimensions and element type): the relayout instruction; with
    ``strides``, every ``strides[d]``-th element of ``src`` along each dimension ``d`` (a strided slice:
    ``dst[i] = src[i * strides]``, so ``src`` spans ``(n - 1) * |stride| + 1`` along a dimension where
    ``dst`` has ``n``); a negative stride counts from the end of ``src``'s window (``-1`` reverses it), as
    numpy's ``src[::stride]``. With ``dst_strides`` instead, ``src`` goes to every ``dst_strides[d]``-th
    element of ``dst`` (``dst[i * dst_strides] = src[i]``, a scatter: padding between elements; the other
    elements of ``dst`` keep their values).

    Timing: ``max(V(src) / vmem.load_vregs_per_cycle, V(dst) / vmem.store_vregs_per_cycle)``; when the
    two layouts disagree on which dimension is the lane dimension, the data crosses lanes and the copy
    runs on a cross-lane unit at ``xlu.transpose_cycles_per_vreg`` per source vreg instead. Strides on
    dimensions other than the lane dimension are load addressing (a strided load reads one register per
    destination register: ``V(dst)`` loads), a negative one along the sublane dimension also one VPU op per
    destination register (the rows of each register reversed); a stride along the lane dimension other than
    1 gathers across lanes, on a cross-lane unit at ``xlu.transpose_cycles_per_vreg`` per source vreg.
    A scatter is strided stores likewise (``V(src)`` loads and stores), across lanes on a cross-lane unit per
    destination vreg.
    """

    dst: MemRef
    src: MemRef
    strides: tuple[int, ...] | None = None
    dst_strides: tuple[int, ...] | None = None
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.VPU_COPY

    def __post_init__(self) -> None:
        _need_space(self.dst, (Space.VMEM,), "vpu.copy destination")
        _need_space(self.src, (Space.VMEM,), "vpu.copy source")
        _need(self.src.element_type == self.dst.element_type, "vpu.copy keeps the element type (use vpu.convert)")
        _need(self.strides is None or self.dst_strides is None, "vpu.copy takes strides or dst_strides, not both")
        if self.strides is None and self.dst_strides is None:
            _need(
                self.src.dims == self.dst.dims,
                f"vpu.copy source {self.src.dims} and destination {self.dst.dims} differ",
            )
            return
        strided, dense, key = (
            (self.src, self.dst, "strides") if self.strides is not None else (self.dst, self.src, "dst_strides")
        )
        strides = tuple(int(s) for s in getattr(self, key))
        object.__setattr__(self, key, strides)
        _need(len(strides) == len(dense.dims), f"vpu.copy has {len(strides)} {key} for a rank-{len(dense.dims)} block")
        _need(all(s != 0 for s in strides), f"vpu.copy {key} {strides} must not be 0")
        spans = tuple((n - 1) * abs(s) + 1 if n else 0 for n, s in zip(dense.dims, strides))
        side = "source" if key == "strides" else "destination"
        _need(
            strided.dims == spans,
            f"vpu.copy {side} {strided.dims} must span {spans}: {dense.dims} elements at {key} {strides}",
        )


@dataclass(frozen=True, slots=True)
class VpuReshape:
    """Row-major reshape into ``dst`` (same element count and type). Timing: as :class:`VpuCopy`."""

    dst: MemRef
    src: MemRef
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.VPU_RESHAPE

    def __post_init__(self) -> None:
        _need_space(self.dst, (Space.VMEM,), "vpu.reshape destination")
        _need_space(self.src, (Space.VMEM,), "vpu.reshape source")
        _need(self.src.element_count == self.dst.element_count, "vpu.reshape must keep the element count")
        _need(self.src.element_type == self.dst.element_type, "vpu.reshape keeps the element type")


@dataclass(frozen=True, slots=True)
class XluTranspose:
    """XLA transpose: ``dst`` dimension ``i`` is ``src`` dimension ``permutation[i]``.

    Timing: on a cross-lane unit, ``xlu.transpose_cycles_per_vreg`` per source vreg plus
    ``xlu.latency_cycles`` when the lane or sublane dimension moves; otherwise a copy (see VpuCopy).
    """

    dst: MemRef
    src: MemRef
    permutation: tuple[int, ...]
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.XLU_TRANSPOSE

    def __post_init__(self) -> None:
        object.__setattr__(self, "permutation", tuple(self.permutation))
        _need_space(self.dst, (Space.VMEM,), "xlu.transpose destination")
        _need_space(self.src, (Space.VMEM,), "xlu.transpose source")
        rank = len(self.src.dims)
        _need(sorted(self.permutation) == list(range(rank)), f"{self.permutation} is not a permutation of {rank} dims")
        want = tuple(self.src.dims[p] for p in self.permutation)
        _need(
            want == self.dst.dims,
            f"transposing {self.src.dims} by {self.permutation} gives {want}, not {self.dst.dims}",
        )
        _need(self.src.element_type == self.dst.element_type, "xlu.transpose keeps the element type")


# ---------------------------------------------------------------------------------------------------------
# Scalar unit and control flow
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ScalarAlu:
    """``dst = fn(a, b)`` on 32-bit two's-complement integers (results wrap).

    ``div``/``rem`` truncate toward zero (C semantics; dividing by zero is an error), ``shr`` is logical
    and ``sra`` arithmetic, comparisons give 0 or 1, ``chip_id``/``core_id``/``num_chips`` take no
    operands. Timing: one issue cycle.
    """

    fn: str
    dst: Reg
    a: Scalar | None = None
    b: Scalar | None = None
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.SCALAR_ALU

    def __post_init__(self) -> None:
        n = SCALAR_FUNCTIONS.get(self.fn)
        _need(n is not None, f"unknown scalar function {self.fn!r}")
        given = (self.a is not None) + (self.b is not None)
        _need(given == n and (n < 2 or self.a is not None), f"s.{self.fn} takes {n} operands, not {given}")


@dataclass(frozen=True, slots=True)
class ScalarLoad:
    """Read the one element of ``src`` (SMEM or VMEM; integer or pred type) into register ``dst``.

    Timing: the sequencer stalls ``smem.latency_cycles`` (``vmem.scalar_latency_cycles`` for VMEM); it
    waits for in-flight writers of the element first.
    """

    dst: Reg
    src: MemRef
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.SCALAR_LOAD

    def __post_init__(self) -> None:
        _need_space(self.src, (Space.SMEM, Space.VMEM), "s.load source")
        _need(self.src.element_count == 1, f"s.load reads one element, not {self.src.dims}")
        et = self.src.element_type
        _need(et.is_integer or et.name == "pred", f"s.load reads integers or pred, not {et}")
        _need(et.bits <= 32, f"s.load reads at most 32-bit values, not {et}")


@dataclass(frozen=True, slots=True)
class ScalarStore:
    """Write ``src`` (wrapped to the element type) into the one element of ``dst`` (SMEM or VMEM).

    Timing: one issue cycle; it waits for in-flight readers and writers of the element first.
    """

    dst: MemRef
    src: Scalar
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.SCALAR_STORE

    def __post_init__(self) -> None:
        _need_space(self.dst, (Space.SMEM, Space.VMEM), "s.store destination")
        _need(self.dst.element_count == 1, f"s.store writes one element, not {self.dst.dims}")
        et = self.dst.element_type
        _need(et.is_integer or et.name == "pred", f"s.store writes integers or pred, not {et}")
        _need(et.bits <= 32, f"s.store writes at most 32-bit values, not {et}")


@dataclass(frozen=True, slots=True)
class Branch:
    """Jump to ``target`` when ``a <cond> b``. Timing: one issue cycle, plus ``core.branch_cycles`` if taken."""

    cond: str
    a: Reg
    b: Scalar
    target: str
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.BRANCH

    def __post_init__(self) -> None:
        _need(
            self.cond.upper() in COMPARE_DIRECTIONS, f"branch condition {self.cond!r} is not one of eq ne lt le gt ge"
        )


@dataclass(frozen=True, slots=True)
class Jump:
    """Jump to ``target``. Timing: one issue cycle plus ``core.branch_cycles``."""

    target: str
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.JUMP


@dataclass(frozen=True, slots=True)
class Halt:
    """Stop this core's stream (the end of the stream does the same)."""

    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.HALT


@dataclass(frozen=True, slots=True)
class Fallback:
    """Run the program's fallback kernel ``kernel`` (an HLO computation) on the operands' values.

    Effect: the kernel's parameters receive the values of ``inputs`` in order; its results (a tuple root
    gives several) are written to ``outputs``. Timing: the core's fallback unit is busy for the kernel's
    declared cost (:class:`tpusim.isa.program.FallbackKernel`), after the operands' writers finish.
    """

    kernel: str
    inputs: tuple[MemRef, ...]
    outputs: tuple[MemRef, ...]
    control: bool = False
    hlo: str | None = field(default=None, compare=False)
    op: ClassVar[Op] = Op.FALLBACK

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))


Instruction = (
    DmaStart
    | SemSignal
    | SemWait
    | Barrier
    | MxuLoadWeights
    | MxuMatmul
    | MxuPop
    | VpuMap
    | VpuFused
    | VpuReduce
    | VpuBroadcast
    | VpuIota
    | VpuCopy
    | VpuReshape
    | XluTranspose
    | ScalarAlu
    | ScalarLoad
    | ScalarStore
    | Branch
    | Jump
    | Halt
    | Fallback
)
"""Any instruction."""
