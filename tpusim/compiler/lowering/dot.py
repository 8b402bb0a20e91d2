"""``dot`` on the MXUs: blocked to fit VMEM, weight tiles latched while the previous tile streams.

Every dot is seen as a set of 2-D products ``A[M,K] @ B[K,N]`` through byte-identical *views* of its
operands (:mod:`.views`): the left operand as ``[lead..., M, K]``, the right one as ``[lead..., K, N]`` and
the result as ``[lead..., M, N]``, where the lead dimensions are the batch dimensions, the further free
dimensions (each index is its own product) and the further contracting dimensions (their products
accumulate). A left operand without a free dimension (vector-matrix) gets a size-1 M, a right one without
(matrix-vector) a size-1 N; the views only rename dimensions, so nothing moves.

:mod:`.dot_plan` chooses the blocking. For each contraction step the A and B windows are DMA'd into VMEM
slots (loads of the next step are issued before this step's MXU work, and windows still held in a slot
are not loaded again: a row panel of A stays resident across the N blocks, all of B across the rows when
it fits). Each ``R x C`` weight tile is latched with ``mxu.load_weights`` on the MXU that owns it and the
block's rows (or that MXU's row group) stream through with ``mxu.matmul`` into one half of its result
buffer, accumulating over K; when a block is complete, ``mxu.pop`` writes it to VMEM and a DMA to HBM
while the next block accumulates in the other half (or, for blocks taller than half the buffer, once the
pop has read the rows the next block overwrites).

Orientation follows the physical layouts: A must have K in lanes (its most minor dimension) to stream,
otherwise each loaded window is transposed on an XLU (``vpu.copy`` into a K-minor block); B is latched
as stored when N is its minor dimension and with ``transpose`` when K is; a result whose minor dimension
is not N is popped into an N-minor block and transposed on the way out.

Precision follows XLA on TPU: bf16 operands take one pass; f32 operands take one bf16 pass for DEFAULT
(or what ``--matmul-precision`` says DEFAULT means), three for HIGH and six for HIGHEST; s8/u8 operands
multiply exactly into s32.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from tpusim.compiler.dot_dims import DotDims, convolution_dims, dims_without, dot_dims, folded_contraction, oriented
from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.lowering.context import Lowering
from tpusim.compiler.lowering.dot_plan import DotPlan, Problem, plan_dot, row_groups, vmem_size
from tpusim.compiler.lowering.epilogue import Chain, Side, epilogue_chain
from tpusim.compiler.lowering.prologue import Prologue, producer_computation, prologue_chain
from tpusim.compiler.lowering.registry import NotLowerable, lowering, rule_for
from tpusim.compiler.lowering.views import view_ref, view_shape
from tpusim.isa import (
    PRECISION_PASSES,
    DmaStart,
    MemRef,
    MxuLoadWeights,
    MxuMatmul,
    MxuPop,
    SemWait,
    Space,
    VpuCopy,
    VpuFused,
    VpuMap,
    Window,
)
from tpusim.memory import Shape, element_type
from tpusim.memory.reinterpret import merged_shape

__all__ = ["absorbs", "emit_product", "emit_taking_prologue", "lower_dot", "matmul_precision"]

_MXU_INPUTS = {"bf16": "bf16", "f32": "f32", "s8": "int8", "u8": "int8"}
WHOLE_SIDE_BYTES = 1 << 20
"""An epilogue's side operand in HBM of at most this many bytes (a bias) is loaded into VMEM whole before the
first block; a bigger one (a residual) streams each block's window, one block ahead. One resident in VMEM is
read where it is."""
_PASSES = {"default": "bf16", "high": "bf16_3x", "highest": "bf16_6x"}


def matmul_precision(instr: Instruction, default: str, operand_type: str) -> str:
    """The MXU precision mode of a dot or convolution with ``operand_type`` operands."""
    if operand_type != "f32":
        return "bf16"
    configs = instr.attr("precision_config") or ("default",)
    level = max(("default", "high", "highest").index(p) if p in ("default", "high", "highest") else 0 for p in configs)
    name = ("default", "high", "highest")[level]
    return _PASSES[default if name == "default" else name]


# --------------------------------------------------------------------------------------------- views
@dataclass(frozen=True)
class _Views:
    """The dot's operands and result as ``[lead..., rows, cols]`` views, and the products over the leads.

    Attributes:
        products: per output lead index, the ``(lhs lead, rhs lead)`` index pairs summed into it.
    """

    lhs: MemRef
    rhs: MemRef
    out: MemRef
    products: tuple[tuple[tuple[int, ...], tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]], ...]
    rows: tuple[int, int] | None = None  # the band of M this lowering computes (megacore), None: all
    cols: tuple[int, int] | None = None  # the band of N
    # An epilogue's result and its side operands (see epilogue.py), viewed as ``out`` (sides with size 1
    # along the dimensions they are broadcast along); empty: no epilogue.
    riders: tuple[MemRef, ...] = ()
    # A prologue's source and its side operands (see prologue.py), viewed as ``rhs``; empty: no prologue.
    b_riders: tuple[MemRef, ...] = ()

    @property
    def m_range(self) -> tuple[int, int]:
        return self.rows or (0, self.lhs.shape.dimensions[-2])

    @property
    def n_range(self) -> tuple[int, int]:
        return self.cols or (0, self.rhs.shape.dimensions[-1])

    @property
    def m(self) -> int:
        lo, hi = self.m_range
        return hi - lo

    @property
    def k(self) -> int:
        return self.lhs.shape.dimensions[-1]

    @property
    def n(self) -> int:
        lo, hi = self.n_range
        return hi - lo


def _views(
    d: DotDims,
    lhs: MemRef,
    rhs: MemRef,
    out: MemRef,
    riders: tuple[MemRef, ...] = (),
    b_riders: tuple[MemRef, ...] = (),
) -> _Views:
    """The ``[lead..., M, K]``, ``[lead..., K, N]`` and ``[lead..., M, N]`` views of a product with dimension
    roles ``d``: M is the last lhs free dimension, N the last rhs free one, K the last contracting pair; the
    other free and contracting dimensions, the batch pairs and the unit dimensions lead (units at index 0)."""
    if not d.lhs_contracting:
        raise NotLowerable("a dot without contracting dimensions (an outer product)")
    lf, rf, lc, rc = d.lhs_free, d.rhs_free, d.lhs_contracting, d.rhs_contracting
    lhs_order = (*d.lhs_batch, *lf[:-1], *lc[:-1], *d.lhs_units, lf[-1] if lf else None, lc[-1])
    rhs_order = (*d.rhs_batch, *rf[:-1], *rc[:-1], *d.rhs_units, rc[-1], rf[-1] if rf else None)
    out_order = (
        *d.out_batch,
        *d.out_lhs_free[:-1],
        *d.out_rhs_free[:-1],
        *d.out_units,
        d.out_lhs_free[-1] if lf else None,
        d.out_rhs_free[-1] if rf else None,
    )
    ld, rd = lhs.shape.dimensions, rhs.shape.dimensions
    batch = [range(ld[i]) for i in d.lhs_batch]
    lloops, rloops = [range(ld[i]) for i in lf[:-1]], [range(rd[i]) for i in rf[:-1]]
    cloops = [range(ld[i]) for i in lc[:-1]]
    lu, ru, ou = (0,) * len(d.lhs_units), (0,) * len(d.rhs_units), (0,) * len(d.out_units)
    products = []
    for b in itertools.product(*batch):
        for li in itertools.product(*lloops):
            for ri in itertools.product(*rloops):
                pairs = tuple(((*b, *li, *c, *lu), (*b, *ri, *c, *ru)) for c in itertools.product(*cloops))
                products.append(((*b, *li, *ri, *ou), pairs))
    return _Views(
        view_ref(lhs, lhs_order),
        view_ref(rhs, rhs_order),
        view_ref(out, out_order),
        tuple(products),
        riders=tuple(view_ref(r, out_order) for r in riders),
        b_riders=tuple(view_ref(r, rhs_order) for r in b_riders),
    )


def _folded(
    d: DotDims, lhs: MemRef, rhs: MemRef, out: MemRef, riders: tuple[MemRef, ...] = ()
) -> tuple[DotDims, MemRef, MemRef, MemRef, tuple[MemRef, ...] | None]:
    """The product with further free dimensions of an operand folded into its M (or N) wherever the operand
    and the result both hold the pair as one dimension (:func:`~tpusim.memory.reinterpret.merged_shape`):
    the heads of a projection ``[4,256,512] x [512,8,64]`` are 8 leading products of 64 rows each, which
    stream 64 rows through every weight tile the MXU loads in 128 cycles; folded, one product of 512 rows
    streams them all. The arrays are the same bytes, seen with fewer dimensions.

    ``riders`` (an epilogue's arrays at the result's shape) fold with the result; they come back None when
    one of them cannot where the operands can: the fold is worth more than the epilogue."""
    kept: list[MemRef] | None = list(riders)
    side = 0
    while side < 2:
        free, out_free, ref = (d.lhs_free, d.out_lhs_free, lhs) if side == 0 else (d.rhs_free, d.out_rhs_free, rhs)
        folded = None
        if len(free) >= 2 and ref.window is None and out.window is None:
            for j in range(len(free) - 1):
                shape = merged_shape(ref.shape, free[j], free[-1])
                result = merged_shape(out.shape, out_free[j], out_free[-1])
                if shape is not None and result is not None:
                    folded = j, shape, result
                    break
        if folded is None:
            side += 1
            continue
        j, shape, result = folded
        gone, out_gone = free[j], out_free[j]
        ref = MemRef(ref.space, ref.address, shape, base=ref.base)
        out = MemRef(out.space, out.address, result, base=out.base)
        if kept is not None:
            merged = [merged_shape(r.shape, out_free[j], out_free[-1]) for r in kept]
            kept = [MemRef(r.space, r.address, m, base=r.base) for r, m in zip(kept, merged) if m is not None]
            if len(kept) != len(merged):
                kept = None
        if side == 0:
            lhs = ref
            d = dims_without(d, lhs=gone, out=out_gone)
        else:
            rhs = ref
            d = dims_without(d, rhs=gone, out=out_gone)
    d, lhs, rhs = _contraction_folded(d, lhs, rhs)
    return d, lhs, rhs, out, None if kept is None else tuple(kept)


def _contraction_folded(d: DotDims, lhs: MemRef, rhs: MemRef) -> tuple[DotDims, MemRef, MemRef]:
    """The product with the contracting dimensions both operands hold as one folded into one contraction
    (:func:`~tpusim.compiler.dot_dims.folded_contraction`): the arrays seen with fewer dimensions."""
    if lhs.window is not None or rhs.window is not None:
        return d, lhs, rhs
    d, ls, rs = folded_contraction(d, lhs.shape, rhs.shape)
    if ls is not lhs.shape:
        lhs = MemRef(lhs.space, lhs.address, ls, base=lhs.base)
        rhs = MemRef(rhs.space, rhs.address, rs, base=rhs.base)
    return d, lhs, rhs


# --------------------------------------------------------------------------------------------- helpers
def _window(ref: MemRef, lead: tuple[int, ...], offsets: tuple[int, int], sizes: tuple[int, int]) -> MemRef:
    full = (*lead, *offsets), (*(1,) * len(lead), *sizes)
    if full[1] == ref.shape.dimensions:
        return ref
    return MemRef(ref.space, ref.address, ref.shape, Window(*full))


@lru_cache(maxsize=4096)  # (a product resizes its few slots to the same few block shapes at every step)
def _resized(slot: MemRef, dims: tuple[int, ...]) -> MemRef:
    """The VMEM slot as an array of ``dims`` (a smaller block at the same address, same layout)."""
    if slot.dims == dims:
        return slot
    return MemRef(slot.space, slot.address, Shape(slot.element_type, dims, layout=slot.shape.layout))


@lru_cache(maxsize=4096)  # (a kernel's MXU instructions take the same few windows of its rotating slots)
def _sub2(ref: MemRef, offsets: tuple[int, int], sizes: tuple[int, int], lead: tuple[int, ...] | None = None) -> MemRef:
    """A window over the last two dimensions of ``ref`` at index ``lead`` of the others (default: a block whose
    other dimensions are 1)."""
    n = len(ref.dims) - 2
    if lead is None:
        lead = (0,) * n
        if sizes == tuple(ref.dims[-2:]) and offsets == (0, 0):
            return ref
    return MemRef(ref.space, ref.address, ref.shape, Window((*lead, *offsets), (*(1,) * n, *sizes)))


def _minor(shape: Shape) -> int:
    return shape.effective_layout.minor_to_major[0] if shape.rank else 0


@lru_cache(maxsize=1024)
def _swap_last(shape: Shape) -> Shape:
    """The same bytes with the last two dimensions' names exchanged."""
    r = shape.rank
    return view_shape(shape, (*range(r - 2), r - 1, r - 2))


class _Slots:
    """VMEM slots holding operand windows, reused least-recently-used first."""

    def __init__(self, slots: list[MemRef]) -> None:
        self.slots = slots
        self.held: list[object] = [None] * len(slots)
        self.used = [-1] * len(slots)

    def find(self, key: object) -> int | None:
        return self.held.index(key) if key in self.held else None

    def claim(self, key: object, step: int, pinned: set[int]) -> int:
        free = [i for i in range(len(self.slots)) if i not in pinned]
        slot = min(free, key=lambda i: self.used[i])
        self.held[slot], self.used[slot] = key, step
        return slot

    def touch(self, slot: int, step: int) -> None:
        self.used[slot] = step


_Place = tuple[str, MemRef, tuple[Any, ...]]
"""Where a step reads an operand: ``("slot", slot, key)`` or ``("ref", operand, key)`` (read in place); ``key``
is the step's ``(lead, offset, offset, size, size)`` of it."""


def _place_id(at: _Place) -> tuple[Any, ...]:
    """What the instructions reading ``at`` depend on: the slot, or the operand and the window's origin."""
    kind, ref, (lead, o0, o1, _, _) = at
    return (id(ref),) if kind == "slot" else (id(ref), lead, o0, o1)


@dataclass(frozen=True)
class _Step:
    block: int  # index into blocks
    first: bool  # first contraction step of its block
    last: bool
    a_key: tuple[tuple[int, ...], int, int, int, int]  # (lead, m0, k0, ms, ks)
    b_key: tuple[tuple[int, ...], int, int, int, int]  # (lead, k0, n0, ks, ns)


@dataclass(frozen=True)
class _Block:
    lead: tuple[int, ...]
    m0: int
    n0: int
    ms: int
    ns: int
    first_mxu: int = 0  # the block's MXUs are first_mxu, first_mxu + 1, ... (see _steps)


# --------------------------------------------------------------------------------------------- the rule
@lowering("dot")
def lower_dot(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    lhs, rhs = ctx.home(comp.name, instr.operands[0]), ctx.home(comp.name, instr.operands[1])
    dims = dot_dims(instr, lhs.shape.rank, rhs.shape.rank)
    user = ctx.epilogues.get((comp.name, instr.name))
    epilogue = _epilogue(ctx, comp, instr.name, user) if user is not None else None
    took = emit_taking_prologue(ctx, comp, instr, dims, lhs, rhs, ctx.home(comp.name, instr.name), epilogue)
    if took and user is not None:
        ctx.epilogued.add((comp.name, user))


def emit_taking_prologue(
    ctx: Lowering,
    comp: Computation,
    instr: Instruction,
    dims: DotDims,
    lhs: MemRef,
    rhs: MemRef,
    out: MemRef,
    epilogue: Epilogue | None = None,
) -> bool:
    """:func:`emit_product`, with the producer of the weights as its prologue when that fusion emitted
    nothing (:func:`absorbs` said the product would apply it). When the product cannot apply it after all
    (its VMEM here is not what it was at the producer's turn), the producer's own code runs first, then the
    plain product: the producer came right before the product and shares no byte with what it writes, so
    its operands are still there.
    """
    key = (comp.name, instr.operands[1])
    prologue = None
    if key in ctx.prologued:
        prologue = _prologue(ctx, comp, instr.operands[1])
        assert prologue is not None, "absorbs() built it when the producer was lowered"
    mark = ctx.checkpoint()
    try:
        return emit_product(ctx, instr, dims, lhs, rhs, out, epilogue, prologue)
    except NotLowerable:
        if prologue is None:
            raise
        ctx.rollback(mark)
    ctx.prologued.discard(key)
    producer = comp[prologue.name]
    ctx.prologues.pop(key, None)  # (so the fusion's rule emits its code now)
    rule = rule_for(ctx, comp, producer)
    assert rule is not None, "a producer of the weights is a fusion or an elementwise instruction"
    with ctx.op(comp, producer):  # (its own resources, its code stamped with its name)
        rule(ctx, comp, producer)
    return emit_product(ctx, instr, dims, lhs, rhs, out, epilogue)


def _product_dims(instr: Instruction, lhs: MemRef, rhs: MemRef, out: MemRef) -> DotDims | None:
    """The dimension roles of a dot, or of a convolution that is a matrix product (None: it is not)."""
    if instr.opcode == "dot":
        return dot_dims(instr, lhs.shape.rank, rhs.shape.rank)
    return convolution_dims(instr, lhs.dims, rhs.dims, out.dims)


def absorbs(ctx: Lowering, comp: Computation, fusion: str, dot: str) -> bool:
    """Whether ``dot`` will apply the producer ``fusion`` of its right operand to its weight windows (see
    prologue.py): it can, nothing it writes (its result, its epilogue's) shares a byte with what the fusion
    reads, and the planned product takes no longer than the plain one plus the fusion as a kernel."""
    prologue = _prologue(ctx, comp, fusion)
    if prologue is None:
        return False
    instr = comp[dot]
    lhs, rhs, out = (ctx.home(comp.name, n) for n in (*instr.operands, instr.name))
    writes = [out]
    user = ctx.epilogues.get((comp.name, dot))
    if user is not None:
        writes.append(ctx.home(comp.name, user))
    if any(w.shares_bytes(r) for w in writes for r in (prologue.source, *prologue.sides)):
        return False
    dims = _product_dims(instr, lhs, rhs, out)
    if dims is None:
        return False
    try:
        return emit_product(ctx, instr, dims, lhs, rhs, out, None, prologue, plan_only=True)
    except NotLowerable:
        return False


def _prologue(ctx: Lowering, comp: Computation, fusion: str) -> Prologue | None:
    """The producer fusion ``fusion`` as the dot applies it; None when a side operand has no view at the
    weights' rank."""
    instr = comp[fusion]
    body = producer_computation(ctx.module, comp, instr)
    assert body is not None, "find_prologues took only producers with a body"
    chain = prologue_chain(body, ctx.module)
    sides = []
    for s in chain.sources:
        if isinstance(s, Side):
            try:
                sides.append(view_ref(ctx.home(comp.name, instr.operands[s.parameter]), s.order))
            except (NotLowerable, ValueError):
                return None
    return Prologue(fusion, ctx.home(comp.name, instr.operands[chain.block]), chain, tuple(sides))


@dataclass(frozen=True)
class Epilogue:
    """An elementwise kernel applied to every result block (see epilogue.py): its HLO instruction (the code is
    stamped with its name, so reports count its work as its own), where its result lives, the ``vpu.fused``
    sources and steps that compute it, and its side operands seen at the result's rank (in the order of
    the chain's :class:`~tpusim.compiler.lowering.epilogue.Side` sources)."""

    name: str
    home: MemRef
    chain: Chain
    sides: tuple[MemRef, ...]


def _epilogue(ctx: Lowering, comp: Computation, dot: str, user: str) -> Epilogue | None:
    """The epilogue fusion ``user`` as the dot's rule applies it; None when a side operand has no view at
    the result's rank, or when the fusion's result shares bytes with what the dot still reads (buffer
    assignment may give it the home of an operand that dies at the dot, which the epilogue's stores would
    overwrite before the dot has read it; a residual updated in place is fine: each block's window of it
    is loaded before the block is stored). The fusion then runs as its own kernel."""
    fusion = comp[user]
    chain = epilogue_chain(ctx.module[fusion.attr("calls")], fusion.operands.index(dot), ctx.module)
    home = ctx.home(comp.name, user)
    read = [ctx.home(comp.name, o) for o in comp[dot].operands]
    sides = []
    for s in chain.sources:
        if isinstance(s, Side):
            ref = ctx.home(comp.name, fusion.operands[s.parameter])
            if ref.shape != home.shape or ref.address != home.address:
                read.append(ref)
            try:
                sides.append(view_ref(ref, s.order))
            except (NotLowerable, ValueError):
                return None
    if any(home.shares_bytes(r) for r in read):
        return None
    return Epilogue(user, home, chain, tuple(sides))


def emit_product(
    ctx: Lowering,
    instr: Instruction,
    dims: DotDims,
    lhs_ref: MemRef,
    rhs_ref: MemRef,
    out_ref: MemRef,
    epilogue: Epilogue | None = None,
    prologue: Prologue | None = None,
    plan_only: bool = False,
) -> bool:
    """Emit the matrix product ``instr`` (a dot, or a convolution that is one) of ``lhs_ref`` and ``rhs_ref``
    into ``out_ref``, its dimensions playing the roles ``dims``, and ``epilogue`` on its result blocks when
    the blocking allows (whether it did: otherwise the epilogue's fusion runs as its own kernel).
    ``prologue`` computes ``rhs_ref`` window by window from its source (see prologue.py); with
    ``plan_only`` nothing is emitted and the answer is whether the prologue pays (see :func:`absorbs`).

    Raises:
        NotLowerable: operand or result types the MXU does not multiply, blocks that do not fit VMEM, or a
            prologue the product cannot apply (its operand would stream, or fold).
    """
    lt, rt, ot = lhs_ref.element_type, rhs_ref.element_type, out_ref.element_type
    floats = {lt.name, rt.name} <= {"bf16", "f32"}  # a bf16 operand times an f32 one: the f32 side sets the passes
    if (lt != rt and not floats) or lt.name not in _MXU_INPUTS:
        raise NotLowerable(f"a {lt} x {rt} dot (the MXU multiplies bf16, f32 through bf16 passes, and s8/u8)")
    integer = _MXU_INPUTS[lt.name] == "int8"
    if integer and ot.name != "s32":
        raise NotLowerable(f"an 8-bit dot with a {ot} result (the MXU accumulates 8-bit products in s32)")
    if not integer and not ot.is_float:
        raise NotLowerable(f"a float dot with a {ot} result")
    if 0 in lhs_ref.shape.dimensions or 0 in rhs_ref.shape.dimensions:
        raise NotLowerable("an empty dot (a zero-sized dimension)")
    operand_type = "f32" if "f32" in (lt.name, rt.name) else lt.name
    precision = matmul_precision(instr, ctx.options.matmul_precision, operand_type)
    dims, swap = oriented(dims, lhs_ref.shape, rhs_ref.shape, out_ref.shape)
    if swap:
        if prologue is not None:
            raise NotLowerable("the prologue's operand streams through the MXUs (only weights take one)")
        lhs_ref, rhs_ref = rhs_ref, lhs_ref
    riders = (epilogue.home, *epilogue.sides) if epilogue is not None else ()
    weights = rhs_ref
    dims, lhs_ref, rhs_ref, out_ref, folded = _folded(dims, lhs_ref, rhs_ref, out_ref, riders)
    if prologue is not None and rhs_ref is not weights:
        raise NotLowerable("the prologue's operand folds (its source may not)")
    if folded is None:
        epilogue, folded = None, ()
    b_riders = (prologue.source, *prologue.sides) if prologue is not None else ()
    whole = _views(dims, lhs_ref, rhs_ref, out_ref, folded, b_riders)
    if plan_only:
        assert prologue is not None
        return _prologue_pays(ctx, whole, precision, prologue)
    if epilogue is not None and not _pays(ctx, whole, precision, epilogue, prologue):
        epilogue, whole = None, replace(whole, riders=())
    views = _core_share(ctx, whole)
    if views is not None:
        _DotEmitter(ctx, views, precision, epilogue, prologue).run()
    return epilogue is not None


def _moved(ctx: Lowering, ref: MemRef, vregs_per_cycle: int) -> float:
    """Cycles to read or write ``ref`` once: at HBM bandwidth, or at VMEM's load or store rate."""
    if ref.space == Space.HBM:
        return ref.shape.byte_size / ctx.config.hbm_bytes_per_cycle
    return ref.shape.byte_size / (vregs_per_cycle * ctx.vreg_bytes)


def _prologue_pays(ctx: Lowering, v: _Views, precision: str, prologue: Prologue) -> bool:
    """Whether the product applying ``prologue`` to its weight windows is planned to take no longer than the
    plain product plus the prologue's fusion as a kernel of its own (reading its source and side operands,
    writing the weights)."""
    fused = _DotEmitter(ctx, v, precision, prologue=prologue).plan().cycles
    plain = _DotEmitter(ctx, replace(v, b_riders=()), precision).plan().cycles
    vmem = ctx.config.vmem
    reads = sum(_moved(ctx, r, vmem.load_vregs_per_cycle) for r in v.b_riders)
    return fused <= plain + max(reads, _moved(ctx, v.rhs, vmem.store_vregs_per_cycle))


def _pays(ctx: Lowering, v: _Views, precision: str, epilogue: Epilogue, prologue: Prologue | None = None) -> bool:
    """Whether the product with ``epilogue`` on its blocks is planned to take less time than without it plus
    the epilogue as a kernel of its own (reading the product and the side operands, writing its result:
    at HBM bandwidth, or VMEM's load and store rates for arrays resident there): its buffers and side
    windows take VMEM, and smaller blocks can cost more than the pass they save. Decided on the whole
    product, so that every TensorCore of a megacore chip decides alike."""
    try:
        fused = _DotEmitter(ctx, v, precision, epilogue, prologue).plan().cycles
    except NotLowerable:
        return False
    plain = _DotEmitter(ctx, replace(v, riders=()), precision, prologue=prologue).plan().cycles
    load = ctx.config.vmem.load_vregs_per_cycle
    reads = _moved(ctx, v.out, load) + sum(_moved(ctx, r, load) for r in v.riders[1:])
    alone = max(reads, _moved(ctx, v.riders[0], ctx.config.vmem.store_vregs_per_cycle))
    return fused <= plain + alone


def _core_share(ctx: Lowering, v: _Views) -> _Views | None:
    """With megacore, the part of the dot the core being emitted computes (None: nothing): whole products
    when there are enough of them (batch and further free dimensions), else a band of M rows (whole
    128-row MXU passes when each core gets some), else of N columns; a dot too small to split runs on
    core 0."""
    if ctx.share is None:
        return v
    cores = ctx.share[1]
    products = len(v.products)
    m_unit = 128 if v.m >= 128 * cores else 32
    if products >= cores and (products % cores == 0 or products >= 4 * cores or v.m < m_unit * cores):
        part = ctx.split(products)
        return replace(v, products=v.products[part.start : part.stop]) if part else None
    if v.m >= m_unit * cores:
        part = ctx.split(-(-v.m // m_unit))
        rows = (part.start * m_unit, min(v.m, part.stop * m_unit))
        return replace(v, rows=rows) if part else None
    n_unit = ctx.config.vpu.lanes
    if v.n >= n_unit * cores:
        part = ctx.split(-(-v.n // n_unit))
        cols = (part.start * n_unit, min(v.n, part.stop * n_unit))
        return replace(v, cols=cols) if part else None
    return v


class _DotEmitter:
    def __init__(
        self,
        ctx: Lowering,
        views: _Views,
        precision: str,
        epilogue: Epilogue | None = None,
        prologue: Prologue | None = None,
    ) -> None:
        self.ctx, self.v, self.precision, self.epilogue = ctx, views, precision, epilogue
        self.prologue = prologue if views.b_riders else None
        self.cfg = ctx.config.mxu
        self._built: dict[tuple[Any, ...], Any] = {}  # MXU instructions by what makes them (see _multiply)
        lhs, rhs, out = views.lhs.shape, views.rhs.shape, views.out.shape
        self.a_stream = _minor(lhs) == lhs.rank - 1  # K in lanes: windows stream as loaded
        self.b_mode = "plain" if _minor(rhs) == rhs.rank - 1 else "transposed" if _minor(rhs) == rhs.rank - 2 else ""
        et = out.element_type.name
        integer = lhs.element_type.name in ("s8", "u8")
        self.pop_type = et if et in ("f32", "bf16", "s32") else ("s32" if integer else "f32")
        # how each side operand of an epilogue reaches its blocks: "vmem" (read in place), "whole", "streamed"
        self.side_kind = tuple(
            "vmem" if side.space == Space.VMEM else "whole" if side.shape.byte_size <= WHOLE_SIDE_BYTES else "streamed"
            for side in views.riders[1:]
        )

    # ---------------------------------------------------------------- shapes of the VMEM blocks
    def _natural(self, like: Shape, dims: tuple[int, ...]) -> Shape:
        plain = Shape(like.element_type, dims)
        return plain.with_layout(self.ctx.rules.layout_for(plain))

    def _block_shapes(self, tm: int, tn: int, tk: int) -> dict[str, Shape]:
        lhs, rhs, out = self.v.lhs.shape, self.v.rhs.shape, self.v.out.shape
        la, lb, lo = lhs.rank - 2, rhs.rank - 2, out.rank - 2
        a_dims, b_dims, c_dims = (*(1,) * la, tm, tk), (*(1,) * lb, tk, tn), (*(1,) * lo, tm, tn)
        shapes = {"a_raw": Shape(lhs.element_type, a_dims, layout=lhs.layout)}
        shapes["a"] = shapes["a_raw"] if self.a_stream else self._natural(lhs, a_dims)
        shapes["b_raw"] = Shape(rhs.element_type, b_dims, layout=rhs.layout)
        shapes["b"] = shapes["b_raw"] if self.b_mode else self._natural(rhs, b_dims)
        if self.prologue is not None:  # windows of its source, then its sides whole (read in place in VMEM)
            source, *sides = self.v.b_riders
            shapes["b_raw"] = Shape(source.element_type, b_dims, layout=source.shape.layout)
            for k, side in enumerate(sides):
                if side.space != Space.VMEM:
                    shapes[f"pside{k}"] = Shape(side.element_type, side.dims, layout=side.shape.layout)
        c_natural = _minor(out) == out.rank - 1
        c_layout = out.layout if c_natural else self.ctx.rules.layout_for(Shape(out.element_type, c_dims))
        shapes["pop"] = Shape(element_type(self.pop_type), c_dims, layout=c_layout)
        if self.pop_type != out.element_type.name:
            shapes["convert"] = Shape(out.element_type, c_dims, layout=c_layout)
        if not c_natural:
            shapes["store"] = Shape(out.element_type, c_dims, layout=out.layout)
        if self.epilogue is not None:
            epi, *sides = self.v.riders
            last = shapes.get("store") or shapes.get("convert") or shapes["pop"]
            if not last.lays_out_like(epi.shape):
                shapes["epilogue"] = Shape(epi.element_type, c_dims, layout=epi.shape.layout)
            # (else the epilogue overwrites the block it reads: no buffers of its own)
            for k, side in enumerate(sides):  # whole, or the block's window (size 1 where broadcast), as stored
                if self.side_kind[k] == "whole":
                    shapes[f"side{k}"] = Shape(side.element_type, side.dims, layout=side.shape.layout)
                elif self.side_kind[k] == "streamed":
                    dims = tuple(1 if n == 1 else c for n, c in zip(side.dims, c_dims))
                    shapes[f"side{k}"] = Shape(side.element_type, dims, layout=side.shape.layout)
        return shapes

    def _footprint(self, tm: int, tn: int, tk: int) -> tuple[int, int, int, int, int]:
        vb = self.ctx.vreg_bytes
        s = self._block_shapes(tm, tn, tk)
        size = {k: vmem_size(v, vb) for k, v in s.items()}
        a_stage = 0 if self.a_stream else 2 * size["a_raw"]
        b_stage = 0 if self.b_mode and self.prologue is None else 2 * size["b_raw"]
        c = 2 * size["pop"] + size.get("convert", 0) + size.get("store", 0) + 2 * size.get("epilogue", 0)
        c += sum(n for key, n in size.items() if key.startswith("pside"))
        c += sum(size.get(f"side{k}", 0) * (2 if kind == "streamed" else 1) for k, kind in enumerate(self.side_kind))
        return size["a"], size["b"], a_stage, b_stage, c

    # ---------------------------------------------------------------- planning
    def plan(self) -> DotPlan:
        """The cheapest blocking that fits the instruction's VMEM share.

        Raises:
            NotLowerable: none fits, or a prologue's side operand is too big to load whole."""
        v, cfg = self.v, self.ctx.config
        lt = v.lhs.element_type.name
        if any(s.space != Space.VMEM and s.shape.byte_size > WHOLE_SIDE_BYTES for s in v.b_riders[1:]):
            raise NotLowerable("a side operand of the weights' producer is too big to load whole")
        weights = v.b_riders[0] if v.b_riders else v.rhs
        # As the MXU times them: passes by the streamed operand's type, weight parts by the weights'.
        passes = PRECISION_PASSES[self.precision]
        passes = (passes[0] if v.rhs.element_type.name == "f32" else 1, passes[1] if lt == "f32" else 1)
        problem = Problem(
            m=v.m,
            n=v.n,
            k=v.k,
            products=len(v.products),
            contracts=len(v.products[0][1]),
            a_bytes=max(1, v.lhs.element_type.bits // 8),
            b_bytes=max(1, weights.element_type.bits // 8),
            c_bytes=max(1, v.out.element_type.bits // 8),
            passes=passes[1],
            weight_parts=passes[0],
            speedup=cfg.mxu.int8_speedup if lt in ("s8", "u8") else 1,
            block_bytes=self._footprint,
            rows_major=v.out.shape.effective_layout.minor_to_major.index(v.out.shape.rank - 2)
            > v.out.shape.effective_layout.minor_to_major.index(v.out.shape.rank - 1),
            side_bytes=sum(s.shape.byte_size / v.out.shape.element_count for s in v.riders[1:]),
            out_in_vmem=v.out.space is Space.VMEM,
            a_shared=len({tuple(ll for ll, _ in pairs) for _, pairs in v.products}) == 1,
            b_shared=len({tuple(rl for _, rl in pairs) for _, pairs in v.products}) == 1,
        )
        plans = plan_dot(problem, cfg, self.ctx.vmem_free_bytes())
        if not plans:
            raise NotLowerable("its blocks do not fit in VMEM")
        return plans[0]

    # ---------------------------------------------------------------- emission
    def run(self) -> None:
        ctx, v = self.ctx, self.v
        plan = self.plan()
        tm, tn, tk = plan.tm, plan.tn, plan.tk
        shapes = self._block_shapes(tm, tn, tk)
        depth = plan.depth
        a_cache = _Slots([ctx.vmem(shapes["a"]) for _ in range(plan.a_slots)])
        b_cache = _Slots([ctx.vmem(shapes["b"]) for _ in range(plan.b_slots)])
        a_stage = [ctx.vmem(shapes["a_raw"]) for _ in range(depth + 1)] if not self.a_stream else []
        pro = self.prologue
        b_stage = [ctx.vmem(shapes["b_raw"]) for _ in range(depth + 1)] if not self.b_mode or pro else []
        pops = [ctx.vmem(shapes["pop"]) for _ in range(2)]
        convert = ctx.vmem(shapes["convert"]) if "convert" in shapes else None
        store = ctx.vmem(shapes["store"]) if "store" in shapes else None
        finish = [ctx.vmem(shapes["epilogue"]) for _ in range(2)] if "epilogue" in shapes else []
        # The epilogue's side operands: those in VMEM where they are, small ones whole (loaded now), the others
        # a block's window in one of two slots each.
        side_slots = [
            [side] if kind == "vmem" else [ctx.vmem(shapes[f"side{k}"]) for _ in range(1 if kind == "whole" else 2)]
            for k, (side, kind) in enumerate(zip(v.riders[1:], self.side_kind))
        ]
        streamed = self.side_kind.count("streamed")
        sem_side = [ctx.semaphore(), ctx.semaphore()] if streamed else []
        whole_pending = self._load_whole(side_slots)
        pro_sides, pro_pending = self._load_prologue_sides(shapes)
        # One semaphore counts every operand load: a wait may be satisfied by a later step's load, but the
        # scoreboard still holds back any instruction reading a window whose DMA is in flight.
        sem_in, sem_out = ctx.semaphore(), [ctx.semaphore(), ctx.semaphore()]

        blocks, steps = self._steps(plan)
        # An operand already in VMEM in the layout a slot would give it is read where it is (the MXUs take its
        # windows), as a kernel reads a VMEM-resident input: no slot copy before each step.
        in_place = (
            v.lhs.space is Space.VMEM and self.a_stream,
            v.rhs.space is Space.VMEM and self.b_mode != "" and pro is None,
        )
        # Likewise a result kept in VMEM in the layout and type the MXUs pop: popped into its home, no DMA.
        pop_home = v.out.space is Space.VMEM and convert is None and store is None and self.epilogue is None
        # Per step: the slots its windows are in, the DMAs that bring them, relayouts to do on arrival.
        where: list[tuple[int, int]] = [(0, 0)] * len(steps)
        loads = [0] * len(steps)
        relayouts: list[list[tuple[MemRef, MemRef, int, Any]]] = [[] for _ in steps]
        issued = -1

        def issue(j: int, current: int) -> None:
            st = steps[j]
            found = []
            for op, (cache, stage, key, ref) in enumerate(
                ((a_cache, a_stage, st.a_key, v.lhs), (b_cache, b_stage, st.b_key, v.b_riders[0] if pro else v.rhs))
            ):
                if in_place[op]:
                    found.append(-1)  # (read where it is: no slot, no DMA)
                    continue
                slot = cache.find(key)
                if slot is not None:
                    cache.touch(slot, j)
                    found.append(slot)
                    continue
                # Slots of steps not yet done, and of the last few done (the MXUs may still read them),
                # are not overwritten.
                slot = cache.claim(key, j, {where[s][op] for s in range(max(0, current - plan.lag), j)})
                found.append(slot)
                lead, o0, o1, s0, s1 = key
                src = _window(ref, lead, (o0, o1), (s0, s1))
                ready = _resized(cache.slots[slot], src.dims)
                dst = _resized(stage[j % len(stage)], src.dims) if stage else ready
                ctx.emit(DmaStart, src=src, dst=dst, sem=sem_in)
                loads[j] += 1
                if stage:
                    relayouts[j].append((dst, ready, op, key))
            where[j] = (found[0], found[1])

        def issue_upto(j: int, current: int) -> None:
            nonlocal issued
            while issued < min(j, len(steps) - 1):
                issued += 1
                issue(issued, current)

        issue_upto(depth - 1, 0)
        pending_out = [0, 0]
        # Blocks alternate between the result buffer's halves (one pops while the next accumulates), or
        # each uses the whole buffer from row 0 (plan.halves == 1, blocks taller than a half).
        half = self.cfg.result_buffer_rows // 2 if plan.halves == 2 else 0
        acc_half = [0] * self.cfg.count
        done_blocks = 0
        for i, st in enumerate(steps):
            if loads[i]:
                ctx.emit(SemWait, sem=sem_in, count=loads[i])
            issue_upto(i + depth, i)
            for src, dst, op, key in relayouts[i]:
                if op == 0 or pro is None:
                    ctx.emit(VpuCopy, dst=dst, src=src)
                    continue
                # the weights' producer, on the window of its source (code of its fusion)
                if pro_pending is not None:
                    ctx.emit(SemWait, sem=pro_pending[0], count=pro_pending[1])
                    pro_pending = None
                own, ctx.hlo = ctx.hlo, pro.name
                srcs = self._prologue_sources(key, pro_sides)
                ctx.emit(VpuFused, dst=dst, srcs=(src, *srcs), ops=pro.chain.steps)
                ctx.hlo = own
            block = blocks[st.block]
            if st.first and streamed:  # the streamed side windows: the next block's while this one accumulates
                # (its slots held the block before this one, whose epilogue has been issued)
                for j in range(0 if st.block == 0 else st.block + 1, min(st.block + 2, len(blocks))):
                    self._load_sides(blocks[j], side_slots, j % 2, sem_side[j % 2])
            a_at = ("ref", v.lhs, st.a_key) if in_place[0] else ("slot", a_cache.slots[where[i][0]], st.a_key)
            b_at = ("ref", v.rhs, st.b_key) if in_place[1] else ("slot", b_cache.slots[where[i][1]], st.b_key)
            self._multiply(st, block, a_at, b_at, plan, acc_half, half)
            if not st.last:
                continue
            slot = done_blocks % 2
            done_blocks += 1
            if pending_out[slot]:
                ctx.emit(SemWait, sem=sem_out[slot], count=pending_out[slot])
                pending_out[slot] = 0
            if pop_home:  # (the result is in VMEM as popped: the MXUs write its block where it lives)
                self._pop(block, pops[slot], plan, acc_half, half, home=v.out)
                continue
            src = self._pop(block, pops[slot], plan, acc_half, half)
            if convert is not None:
                conv = _resized(convert, src.dims)
                ctx.emit(VpuMap, fn="convert", dst=conv, srcs=(src,))
                src = conv
            if store is not None:
                out_block = _resized(store, src.dims)
                ctx.emit(VpuCopy, dst=out_block, src=src)
                src = out_block
            target = v.out
            if self.epilogue is not None:  # the user's kernel, in registers, on the way out
                done = _resized(finish[slot], src.dims) if finish else src
                own, ctx.hlo = ctx.hlo, self.epilogue.name
                windows = iter(self._side_windows(block, side_slots, slot))
                if whole_pending:
                    ctx.emit(SemWait, sem=whole_pending[0], count=whole_pending[1])
                    whole_pending = None
                if streamed:
                    ctx.emit(SemWait, sem=sem_side[slot], count=streamed)
                chain = self.epilogue.chain
                srcs = tuple(next(windows) if isinstance(s, Side) else s for s in chain.sources)
                ctx.emit(VpuFused, dst=done, srcs=(src, *srcs), ops=chain.steps)
                ctx.hlo = own
                src, target = done, v.riders[0]
            dst = _window(target, block.lead, (block.m0, block.n0), (block.ms, block.ns))
            ctx.emit(DmaStart, src=src, dst=dst, sem=sem_out[slot])
            pending_out[slot] += 1
        for slot in (0, 1):
            if pending_out[slot]:
                ctx.emit(SemWait, sem=sem_out[slot], count=pending_out[slot])

    def _side_windows(self, block: _Block, slots: list[list[MemRef]], parity: int) -> list[MemRef]:
        """Where ``block``'s windows of the epilogue's side operands are in VMEM: in the slots of the
        streamed ones (of ``parity``), windows of the whole ones and of those resident in VMEM."""
        dims = (*(1,) * len(block.lead), block.ms, block.ns)
        offsets = (*block.lead, block.m0, block.n0)
        found = []
        for side, kind, held in zip(self.v.riders[1:], self.side_kind, slots):
            want = tuple(1 if n == 1 else c for n, c in zip(side.dims, dims))
            if kind == "streamed":
                found.append(_resized(held[parity], want))
                continue
            at = tuple(0 if n == 1 else o for n, o in zip(side.dims, offsets))
            slot = held[0]
            found.append(slot if want == slot.dims else MemRef(slot.space, slot.address, slot.shape, Window(at, want)))
        return found

    def _load_prologue_sides(self, shapes: dict[str, Shape]) -> tuple[list[MemRef], tuple[int, int] | None]:
        """Where the prologue's side operands are in VMEM (those in HBM loaded whole now, code of its fusion),
        and the semaphore and count to wait for before the first window's chain (None: nothing to wait)."""
        ctx, pro = self.ctx, self.prologue
        if pro is None:
            return [], None
        where: list[MemRef] = []
        loads = []
        for k, side in enumerate(self.v.b_riders[1:]):
            if side.space == Space.VMEM:
                where.append(side)
                continue
            where.append(ctx.vmem(shapes[f"pside{k}"]))
            loads.append((side, where[-1]))
        if not loads:
            return where, None
        sem = ctx.semaphore()
        own, ctx.hlo = ctx.hlo, pro.name
        for side, slot in loads:
            ctx.emit(DmaStart, src=side, dst=slot, sem=sem)
        ctx.hlo = own
        return where, (sem, len(loads))

    def _prologue_sources(self, key: tuple[Any, ...], sides: list[MemRef]) -> tuple[Any, ...]:
        """The prologue chain's sources for the weight window ``key``: its immediates, and each side
        operand's window (size 1 where it is broadcast)."""
        assert self.prologue is not None
        lead, k0, n0, ks, ns = key
        dims, offsets = (*(1,) * len(lead), ks, ns), (*lead, k0, n0)
        held = iter(sides)
        out: list[Any] = []
        for s in self.prologue.chain.sources:
            if not isinstance(s, Side):
                out.append(s)
                continue
            slot = next(held)
            want = tuple(1 if n == 1 else c for n, c in zip(slot.dims, dims))
            at = tuple(0 if n == 1 else o for n, o in zip(slot.dims, offsets))
            out.append(slot if want == slot.dims else MemRef(slot.space, slot.address, slot.shape, Window(at, want)))
        return tuple(out)

    def _load_whole(self, slots: list[list[MemRef]]) -> tuple[int, int] | None:
        """DMAs of the whole side operands into their slots (code of the epilogue's fusion): the semaphore
        and count to wait for before the first epilogue, or None."""
        ctx = self.ctx
        whole = [(side, held[0]) for side, k, held in zip(self.v.riders[1:], self.side_kind, slots) if k == "whole"]
        if not whole:
            return None
        assert self.epilogue is not None
        sem = ctx.semaphore()
        own, ctx.hlo = ctx.hlo, self.epilogue.name
        for side, slot in whole:
            ctx.emit(DmaStart, src=side, dst=slot, sem=sem)
        ctx.hlo = own
        return sem, len(whole)

    def _load_sides(self, block: _Block, slots: list[list[MemRef]], parity: int, sem: int) -> None:
        """DMAs of ``block``'s windows of the streamed side operands into their slots of ``parity`` (code of the
        epilogue's fusion)."""
        ctx = self.ctx
        assert self.epilogue is not None
        own, ctx.hlo = ctx.hlo, self.epilogue.name
        offsets = (*block.lead, block.m0, block.n0)
        for side, kind, dst in zip(self.v.riders[1:], self.side_kind, self._side_windows(block, slots, parity)):
            if kind != "streamed":
                continue
            at = tuple(0 if n == 1 else o for n, o in zip(side.dims, offsets))
            src = side if dst.dims == side.dims else MemRef(side.space, side.address, side.shape, Window(at, dst.dims))
            ctx.emit(DmaStart, src=src, dst=dst, sem=sem)
        ctx.hlo = own

    def _steps(self, plan: DotPlan) -> tuple[list[_Block], list[_Step]]:
        """The output blocks and the contraction steps in the order they are emitted.

        A block that needs fewer MXUs than the core has leaves the others to the blocks after it: ``turns``
        consecutive blocks take disjoint MXUs and their steps interleave (step ``j`` of each, then step
        ``j + 1``), so their independent accumulations run on all the MXUs at once, as a kernel scheduler
        packs independent products into the MXUs' slots."""
        v = self.v
        blocks: list[_Block] = []
        per_block: list[list[_Step]] = []
        turns = plan.turns
        (m_lo, m_hi), (n_lo, n_hi) = v.m_range, v.n_range
        for out_lead, pairs in v.products:
            ms_ = range(m_lo, m_hi, plan.tm)
            ns_ = range(n_lo, n_hi, plan.tn)
            corners = (
                [(m0, n0) for m0 in ms_ for n0 in ns_] if plan.order == "mn" else [(m0, n0) for n0 in ns_ for m0 in ms_]
            )
            for m0, n0 in corners:
                ms, ns = min(plan.tm, m_hi - m0), min(plan.tn, n_hi - n0)
                block = _Block(out_lead, m0, n0, ms, ns)
                used = self.cfg.count // turns
                block = replace(block, first_mxu=len(blocks) % turns * used)
                blocks.append(block)
                contraction = [(ll, rl, k0) for ll, rl in pairs for k0 in range(0, v.k, plan.tk)]
                mine: list[_Step] = []
                for j, (ll, rl, k0) in enumerate(contraction):
                    ks = min(plan.tk, v.k - k0)
                    a_key, b_key = (ll, m0, k0, ms, ks), (rl, k0, n0, ks, ns)
                    mine.append(_Step(len(blocks) - 1, j == 0, j == len(contraction) - 1, a_key, b_key))
                per_block.append(mine)
        steps: list[_Step] = []
        for g in range(0, len(per_block), turns):
            group = per_block[g : g + turns]
            steps += [st for row in itertools.zip_longest(*group) for st in row if st is not None]
        return blocks, steps

    def _mxu_map(self, block: _Block, plan: DotPlan) -> list[tuple[int, int, int, int, int]]:
        """``(mxu, n0, cols, r0, rows)`` for every weight tile and row group of a block."""
        cfg = self.cfg
        tiles = list(range(0, block.ns, cfg.cols))
        rows = row_groups(block.ms, max(1, cfg.count // len(tiles)), self.ctx.config.vpu.sublanes)
        return [
            (block.first_mxu + t * len(rows) + j, n0, min(cfg.cols, block.ns - n0), r0, rs)
            for t, n0 in enumerate(tiles)
            for j, (r0, rs) in enumerate(rows)
        ]

    def _multiply(
        self, st: _Step, block: _Block, a_at: _Place, b_at: _Place, plan: DotPlan, acc_half: list[int], half: int
    ) -> None:
        ctx, cfg = self.ctx, self.cfg
        _, _, _, ms, ks = st.a_key
        transpose = self.b_mode == "transposed"
        # An unrolled product repeats its MXU instructions (its slots rotate: the d1024 decoder block's 38,912
        # weight loads are 536 distinct ones): each is built once, from a key of plain numbers, and appended
        # again (one object, which decoding then finds by identity). Whole steps repeat too: a step's
        # instructions are kept by what they depend on, so a repeated step is one lookup.
        built = self._built
        flags = (ctx.hlo, ctx.control)
        a_id, b_id = _place_id(a_at), _place_id(b_at)
        step_key = ("step", a_id, b_id, ms, ks, block.ns, st.first, tuple(acc_half), half, flags)  # (ms: block's)
        known = built.get(step_key)
        if known is not None:
            ctx.append(known)
            return
        step: list[Any] = []
        for k0 in range(0, ks, cfg.rows):
            kt = min(cfg.rows, ks - k0)
            for mxu, n0, nt, r0, rs in self._mxu_map(block, plan):
                w_key = ("w", b_id, ks, block.ns, k0, kt, n0, nt, mxu, flags)
                load = built.get(w_key)
                if load is None:
                    b, lead, (o0, o1) = self._block(b_at, (ks, block.ns), transpose)
                    at, size = ((o0 + n0, o1 + k0), (nt, kt)) if transpose else ((o0 + k0, o1 + n0), (kt, nt))
                    w = _sub2(b, at, size, lead)
                    load = built[w_key] = ctx.build(
                        MxuLoadWeights, mxu=mxu, src=w, transpose=transpose, precision=self.precision
                    )
                acc, accumulate = acc_half[mxu] * half, not (st.first and k0 == 0)
                m_key = ("m", a_id, ms, ks, k0, kt, r0, rs, mxu, acc, accumulate, flags)
                matmul = built.get(m_key)
                if matmul is None:
                    a, lead, (o0, o1) = self._block(a_at, (ms, ks), False)
                    matmul = built[m_key] = ctx.build(
                        MxuMatmul,
                        mxu=mxu,
                        lhs=_sub2(a, (o0 + r0, o1 + k0), (rs, kt), lead),
                        acc=acc,
                        accumulate=accumulate,
                        precision=self.precision,
                    )
                step += (load, matmul)
        built[step_key] = step
        ctx.append(step)

    def _block(
        self, at: _Place, sizes: tuple[int, int], transpose: bool
    ) -> tuple[MemRef, tuple[int, ...] | None, tuple[int, int]]:
        """A step's operand block as ``(array, index of its leading dimensions, offsets of its last two)``: a
        slot seen as a ``sizes`` block at its origin, or the window of an operand read in place; the last two
        dimensions exchanged when ``transpose``."""
        kind, ref, (lead, o0, o1, _, _) = at
        index: tuple[int, ...] | None
        if kind == "slot":
            ref, index, offsets = _resized(ref, (*(1,) * (ref.shape.rank - 2), *sizes)), None, (0, 0)
        else:
            index, offsets = lead, (o0, o1)
        if transpose:
            ref, offsets = MemRef(ref.space, ref.address, _swap_last(ref.shape)), (offsets[1], offsets[0])
        return ref, index, offsets

    def _pop(
        self, block: _Block, slot: MemRef, plan: DotPlan, acc_half: list[int], half: int, home: MemRef | None = None
    ) -> MemRef:
        """Pop ``block`` into ``slot`` (seen as a block at its origin), or into its window of the result
        ``home``; returns the slot's block."""
        c = _resized(slot, (*(1,) * (slot.shape.rank - 2), block.ms, block.ns))
        used = set()
        for mxu, n0, nt, r0, rs in self._mxu_map(block, plan):
            if home is None:
                dst = _sub2(c, (r0, n0), (rs, nt))
            else:
                dst = _sub2(home, (block.m0 + r0, block.n0 + n0), (rs, nt), block.lead)
            self.ctx.emit(MxuPop, mxu=mxu, dst=dst, acc=acc_half[mxu] * half)
            used.add(mxu)
        for mxu in used:
            acc_half[mxu] ^= 1
        return c
