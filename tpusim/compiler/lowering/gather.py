"""gather on the modelled hardware: one DMA (or one vector copy) per gathered slice, addressed by registers
loaded from the index array.

Plan (docs/compiler.md, "Gather, scatter, async copies and bit-level ops"). The slices are visited in chunks
of rows of the first batch axis; per chunk:

1. the chunk's index vectors are DMA'd into SMEM (:func:`.indexed.index_chunk`);
2. straight-line code (:func:`.indexed.each_slice`) loads each index vector into registers and moves the slice
   whose start they give into a row-major VMEM staging array, each slice to its own bytes: either
   * **dma**: ``dma.start`` from the operand in HBM (a window at the register offsets, ``clamp`` as XLA
     clamps gather starts so the slice stays inside the operand), all the chunk's DMAs on one semaphore and
     waited for once, so up to ``dma.engines`` transfers overlap; or
   * **vmem**: the operand is DMA'd into VMEM once and each slice is a ``vpu.copy`` out of it (same
     clamping window), which beats a DMA per slice when the operand is small and the slices many; or
   * **packed**: for a row of a table whose tiles pack ``p`` rows into each 32-bit word (bf16
     ``(8,128)(2,1)``, int8 ``(4,1)``), one row alone is a DMA run per element, so the DMA fetches the
     ``p`` rows sharing its words (whole runs), the row's position among them is stored to VMEM (``s.store``), and
     per chunk one ``vpu.fused`` compare-select picks each slice's row;
3. ``vpu.copy`` turns the staging array (seen in the result's dimension order) into a block in the result's
   tiled layout, and one DMA writes the block out.

Index DMAs run one chunk ahead and the chunk's finishing copy and write overlap the next chunk's slices.
The plan with the lower estimated time (:func:`_estimate`) is tried first. Declined (the op falls back):
sub-byte or complex element types, index types other than integers of at most 32 bits, more than
:data:`.indexed.MAX_SLICES` slices or :data:`.indexed.MAX_COMPONENTS` index entries, a rank-0 operand,
and chunks that do not fit VMEM or SMEM.
"""

from __future__ import annotations

from math import ceil, prod

import numpy as np

from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.lowering.context import Lowering, VmemExhausted
from tpusim.compiler.lowering.indexed import (
    MAX_COMPONENTS,
    MAX_SLICES,
    Slices,
    each_slice,
    gather_slices,
    index_chunk,
    row_major,
    scalar_cycles,
    staging_view,
    take_registers,
    take_semaphores,
    windowed,
)
from tpusim.compiler.lowering.registry import NotLowerable, lowering
from tpusim.compiler.lowering.views import joint_runs, view_shape
from tpusim.isa import (
    Const,
    DmaStart,
    FusedOp,
    MemRef,
    Reg,
    ScalarAlu,
    ScalarStore,
    SemWait,
    Space,
    VpuBroadcast,
    VpuCopy,
    VpuFused,
)
from tpusim.memory import ElementType, Layout, Shape, Tile, element_type, geometry

__all__ = ["chunk_rows", "gather_cycles", "lower_gather", "vreg_pieces"]

S32, PRED = element_type("s32"), element_type("pred")

STAGE_TARGET_BYTES = 1 << 19
"""Staging bytes per chunk aimed for: enough slices to keep the DMA engines busy, small enough that the
finishing copy of one chunk overlaps the next chunk's transfers."""


def check_types(sl: Slices, what: str) -> None:
    """Decline element and index types the plans do not handle."""
    et, it = sl.operand.element_type, sl.indices.element_type
    if et.dtype is None or et.is_complex or et.bits < 8:
        raise NotLowerable(f"a {what} of {et} elements (sub-byte and complex types are not staged)")
    if not it.is_integer or it.bits > 32:
        raise NotLowerable(f"{it} indices (scalar registers hold integers of at most 32 bits)")
    if sl.components > MAX_COMPONENTS:
        raise NotLowerable(f"index vectors of {sl.components} entries (at most {MAX_COMPONENTS} registers)")
    if sl.count > MAX_SLICES:
        raise NotLowerable(f"{sl.count} slices, each moved on its own (at most {MAX_SLICES})")
    if sl.operand.rank == 0:
        raise NotLowerable(f"a {what} of a scalar operand")


def granule(shape: Shape, dim: int | None) -> int:
    """The first-level tile size of ``shape`` along ``dim`` (1 when untiled there, or for None)."""
    layout = shape.effective_layout
    if dim is None or not layout.tiles:
        return 1
    tile = layout.tiles[0].dimensions
    physical = list(reversed(layout.minor_to_major))
    position = physical.index(dim) - (len(physical) - len(tile))
    return tile[position] if position >= 0 and tile[position] > 0 else 1


def _round(ctx: Lowering, nbytes: int) -> int:
    return -(-nbytes // ctx.vreg_bytes) * ctx.vreg_bytes


def chunk_rows(
    ctx: Lowering, sl: Slices, buffers: list[tuple[Shape, bool]], budget: int, smem_budget: int, stage: float = 1.0
) -> int:
    """Rows of the first batch axis per chunk: the most (up to :data:`STAGE_TARGET_BYTES` of staging) whose
    double-buffered blocks fit ``budget`` VMEM bytes and whose index vectors fit ``smem_budget`` bytes twice.

    Args:
        buffers: per VMEM block of a chunk, ``(shape of the block for all rows, cut along the first batch
            axis of the other array?)``: a cut block scales with the chunk's rows, the others are whole.
        stage: staging bytes per slice byte (more than 1 when a plan stages more than the slices).
    """
    eb = sl.operand.element_type.bits // 8
    per_row_stage = int(sl.per_row * prod(sl.sizes) * eb * stage)
    per_row_index = sl.per_row * sl.components * sl.indices.element_type.bits // 8
    row_dim, rows = sl.row_dim, sl.rows

    def need(c: int) -> int:
        total = 0
        for shape, cut in buffers:
            if cut and row_dim is not None:
                dims = list(shape.dimensions)
                dims[row_dim] = c
                shape = Shape(shape.element_type, tuple(dims), layout=shape.layout)
            total += 2 * _round(ctx, shape.byte_size)
        return total + 2 * _round(ctx, c * per_row_stage)

    def fits(c: int) -> bool:
        return need(c) <= budget and 2 * (c * per_row_index + 4) <= smem_budget

    g = granule(buffers[0][0], row_dim) if buffers else 1
    c = min(rows, max(1, STAGE_TARGET_BYTES // max(1, per_row_stage)))
    if c < rows and c >= g:
        c = c // g * g
    while c > 1 and not fits(c):
        c = c - g if c > g and c % g == 0 else max(1, c // 2)
    if not fits(c):
        raise NotLowerable(
            f"one row of {sl.per_row} slices does not fit: {need(1)} VMEM bytes of {budget} free, "
            f"{2 * per_row_index} SMEM bytes of {smem_budget} free"
        )
    return c


def vreg_pieces(ctx: Lowering, shape: Shape, sizes: tuple[int, ...]) -> int:
    """Vector registers a window of ``sizes`` at the origin of ``shape`` touches (the VPU cost rule's V)."""
    count = prod(sizes)
    if count == 0:
        return 0
    if count > 1 << 16:
        return max(1, ceil(count * geometry(shape).element_bits / 8 / ctx.vreg_bytes))
    geo = geometry(shape)
    grid = np.indices(sizes, dtype=np.int64).reshape(len(sizes), -1).T
    slots = geo.linear_index(grid)
    return int(np.unique((geo.prefix_bytes + slots * geo.element_bits // 8) // ctx.vreg_bytes).size)


def packing(sl: Slices) -> tuple[int, int] | None:
    """``(dimension, p)`` when the operand's tiles pack ``p`` consecutive elements of its second-minor
    dimension into one 32-bit word (bf16 ``T(8,128)(2,1)``, int8 ``(4,1)``) and every slice is one element
    of that dimension (and of every other but the minor one), at an indexed start: a row gather of a packed
    table. Fetching one such row alone is a run per element; fetching the ``p`` rows sharing its words is a
    run per tile."""
    shape = sl.operand
    layout = shape.effective_layout
    if shape.rank < 2 or len(layout.tiles) < 2 or len(layout.tiles[0].dimensions) < 2:
        return None
    sub = layout.tiles[1].dimensions
    d, m = layout.minor_to_major[1], layout.minor_to_major[0]
    p = sub[0] if len(sub) == 2 and sub[1] == 1 else 1
    if p <= 1 or layout.tiles[0].dimensions[-2] % p or shape.dimensions[d] < p or d not in sl.index_dims:
        return None
    if any(size != 1 for e, size in enumerate(sl.sizes) if e != m):
        return None
    return d, p


def _packed_views(sl: Slices, d: int, p: int, count: int, et: ElementType) -> tuple[Shape, Shape]:
    """The packed staging array of ``count`` slices: as the DMAs see it (the operand's rank, ``p * count``
    along ``d``) and split as ``(count, p, minor)`` (row ``j`` of slice ``g`` at ``[g, j]``). Its tiles are
    ``(p, lanes)(p, 1)``: each slice's ``p`` rows fill whole words, and each slice owns its bytes."""
    layout = sl.operand.effective_layout
    m = layout.minor_to_major[0]
    tiles = (Tile((p, layout.tiles[0].dimensions[-1])), Tile((p, 1)))
    dims = tuple(p * count if e == d else size for e, size in enumerate(sl.sizes))
    dma = Shape(et, dims, layout=Layout(layout.minor_to_major, tiles))
    split = Shape(et, (count, p, sl.sizes[m]), layout=Layout((2, 1, 0), tiles))
    return dma, split


def _estimate(ctx: Lowering, sl: Slices, plan: str) -> float:
    """Estimated cycles of moving the slices (the common finishing copy and write left out), by the DMA rule
    of docs/model.md (set-up, burst-charged HBM bytes, runs) and the VPU cost rule."""
    cfg = ctx.config
    n = sl.count
    stage = staging_view(sl, MemRef(Space.VMEM, 0, row_major(sl.operand)), 1)
    zero = (0,) * sl.operand.rank
    scalar = scalar_cycles(ctx, sl, 1)
    latency = cfg.cycles(cfg.hbm.latency_ns) + cfg.dma.setup_cycles
    if plan in ("dma", "packed"):
        sizes = sl.sizes
        if plan == "packed":
            found = packing(sl)
            assert found is not None
            d, p = found
            stage, _ = _packed_views(sl, d, p, 1, sl.operand.element_type)
            sizes = tuple(p if e == d else size for e, size in enumerate(sl.sizes))
            scalar += 6
        runs = joint_runs(sl.operand, zero, stage, zero, sizes)
        payload = prod(sizes) * sl.operand.element_type.bits / 8
        charged = max(payload, runs * cfg.dma.burst_bytes)
        per = max(
            charged / cfg.hbm_bytes_per_cycle,
            (cfg.dma.setup_cycles + runs / cfg.dma.runs_per_cycle) / cfg.dma.engines,
            scalar,
        )
        return n * per + latency
    v_in = vreg_pieces(ctx, sl.operand, sl.sizes)
    v_out = vreg_pieces(ctx, stage, sl.sizes)
    copy = max(1, ceil(v_in / cfg.vmem.load_vregs_per_cycle), ceil(v_out / cfg.vmem.store_vregs_per_cycle))
    load = sl.operand.byte_size / cfg.hbm_bytes_per_cycle + latency
    return load + n * max(copy, scalar)


def gather_cycles(ctx: Lowering, comp: Computation, instr: Instruction) -> float | None:
    """The estimated cycles of the gather ``instr``'s cheapest plan (:func:`_estimate`), whether or not it can
    be lowered (a gather of more than :data:`.indexed.MAX_SLICES` slices falls back, and its fallback declares
    what its slices would cost moved one by one); None for element or index types no plan handles."""
    if not isinstance(instr.shape, Shape) or len(instr.operands) != 2:
        return None
    operand, indices = (ctx.home(comp.name, o).shape for o in instr.operands)
    sl = gather_slices(instr, operand, indices, ctx.home(comp.name, instr.name).shape)
    et, it = sl.operand.element_type, sl.indices.element_type
    if et.dtype is None or et.is_complex or et.bits < 8 or not it.is_integer or sl.operand.rank == 0:
        return None
    candidates = ("dma", "vmem", "packed") if packing(sl) is not None else ("dma", "vmem")
    return min(_estimate(ctx, sl, plan) for plan in candidates)


@lowering("gather")
def lower_gather(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    operand = ctx.home(comp.name, instr.operands[0])
    indices = ctx.home(comp.name, instr.operands[1])
    out = ctx.home(comp.name, instr.name)
    sl = gather_slices(instr, operand.shape, indices.shape, out.shape)
    if out.shape.element_count == 0:
        return
    check_types(sl, "gather")
    candidates = ("dma", "vmem", "packed") if packing(sl) is not None else ("dma", "vmem")
    plans = sorted(candidates, key=lambda p: _estimate(ctx, sl, p))
    reasons = []
    for plan in plans:
        mark = ctx.checkpoint()
        try:
            _emit(ctx, sl, operand, indices, out, plan)
            return
        except (NotLowerable, VmemExhausted) as why:
            ctx.rollback(mark)
            reasons.append(f"{plan} plan: {why}")
    raise NotLowerable("; ".join(reasons))


def _emit(ctx: Lowering, sl: Slices, operand: MemRef, indices: MemRef, out: MemRef, plan: str) -> None:
    et = out.element_type
    sems = take_semaphores(ctx, 6)
    sem_idx, sem_in, sem_out = sems[0:2], sems[2:4], sems[4:6]
    source = operand
    if plan == "vmem":
        source = ctx.vmem(operand.shape)
        ctx.emit(DmaStart, src=operand, dst=source, sem=sem_in[0])
        ctx.emit(SemWait, sem=sem_in[0], count=1)
    smem_free = ctx.config.smem.bytes - ctx.scope.smem_next
    packed = packing(sl) if plan == "packed" else None
    # packed: p rows per slice, the s32 parities broadcast to a mask, and the picked rows
    factor = 1.0 if packed is None else packed[1] + 1 + 4 / (et.bits // 8) * 1.01
    c = chunk_rows(ctx, sl, [(out.shape, True)], ctx.vmem_free_bytes(), smem_free, factor)
    chunks = [(a, min(c, sl.rows - a)) for a in range(0, sl.rows, c)]
    full = c * sl.per_row
    stages = [ctx.vmem(row_major(Shape(et, (full * prod(sl.sizes),)))) for _ in range(2)]
    if packed is not None:
        d, p = packed
        pairs = [ctx.vmem(_packed_views(sl, d, p, full, et)[0]) for _ in range(2)]
        parities = [ctx.vmem(row_major(Shape(S32, (full,)))) for _ in range(2)]
        masks = [ctx.vmem(row_major(Shape(S32, (full, 1, prod(sl.sizes))))) for _ in range(2)]
        (aligned,) = take_registers(ctx, 1)
    blocks = [ctx.vmem(Shape(et, sl.other_dims(c), layout=out.shape.layout)) for _ in range(2)]
    it = sl.indices.element_type
    slots = [ctx.smem(row_major(Shape(it, (max(1, full * sl.components),)))) for _ in range(2)]
    zeros = (0,) * sl.operand.rank
    pending = [False, False]
    loaded: list[MemRef | None] = [None, None]

    def load_indices(k: int) -> None:
        if sl.components:
            a, rows = chunks[k]
            loaded[k % 2] = index_chunk(ctx, sl, indices, slots[k % 2], a, rows, sem_idx[k % 2])

    def gather(k: int) -> None:
        a, rows = chunks[k]
        n = rows * sl.per_row
        stage = MemRef(Space.VMEM, stages[k % 2].address, staging_view(sl, stages[k % 2], n))
        if sl.components:
            ctx.emit(SemWait, sem=sem_idx[k % 2], count=1, control=True)

        def body(g: int, starts: tuple[int | Reg, ...], row: int) -> None:
            if packed is not None:
                fetch_pair(k, g, starts)
                return
            src = windowed(source, starts, sl.sizes, clamp=True)
            dst = windowed(stage, (row, *zeros[1:]), sl.sizes)
            if plan == "vmem":
                ctx.emit(VpuCopy, dst=dst, src=src)
            else:
                ctx.emit(DmaStart, src=src, dst=dst, sem=sem_in[k % 2])

        smem = loaded[k % 2] or MemRef(Space.SMEM, slots[k % 2].address, slots[k % 2].shape)
        each_slice(ctx, sl, smem, n, a * sl.per_row, body, saturate_unsigned=True)

    def fetch_pair(k: int, g: int, starts: tuple[int | Reg, ...]) -> None:
        """One slice of the packed plan: clamp the start, DMA the p rows of its words, record its parity."""
        d, p = packed  # type: ignore[misc]
        start, dim = starts[d], sl.operand.dimensions[d]
        assert isinstance(start, Reg)
        ctx.emit(ScalarAlu, fn="max", dst=start, a=start, b=0)  # XLA's clamp (the slice is one row)
        ctx.emit(ScalarAlu, fn="min", dst=start, a=start, b=dim - 1)
        ctx.emit(ScalarAlu, fn="and", dst=aligned, a=start, b=-p)  # the first row of its words
        ctx.emit(ScalarAlu, fn="min", dst=aligned, a=aligned, b=dim - p)  # (a last, partial group: the end)
        sizes = tuple(p if e == d else size for e, size in enumerate(sl.sizes))
        src = windowed(source, tuple(aligned if e == d else o for e, o in enumerate(starts)), sizes, clamp=True)
        view, _ = _packed_views(sl, d, p, full, et)
        at = tuple(p * g if e == d else 0 for e in range(sl.operand.rank))
        ctx.emit(DmaStart, src=src, dst=windowed(MemRef(Space.VMEM, pairs[k % 2].address, view), at, sizes),
                 sem=sem_in[k % 2])  # fmt: skip
        ctx.emit(ScalarAlu, fn="sub", dst=start, a=start, b=aligned)
        ctx.emit(ScalarStore, dst=windowed(parities[k % 2], (g,), (1,)), src=start)

    def pick_rows(k: int, n: int) -> None:
        """The packed plan's rows: row ``parity`` of each slice's ``p`` rows (a chain of compare-selects)."""
        d, p = packed  # type: ignore[misc]
        _, split = _packed_views(sl, d, p, n, et)
        width = prod(sl.sizes)
        rows = MemRef(Space.VMEM, pairs[k % 2].address, split)
        mask = MemRef(Space.VMEM, masks[k % 2].address, row_major(Shape(S32, (n, 1, width))))
        parity = MemRef(Space.VMEM, parities[k % 2].address, row_major(Shape(S32, (n,))))
        ctx.emit(VpuBroadcast, dst=mask, src=parity, dims=(0,))
        picked = MemRef(Space.VMEM, stages[k % 2].address, row_major(Shape(et, (n, 1, width))))
        candidates = tuple(windowed(rows, (0, j, 0), (n, 1, width)) for j in range(p))
        # values: 0 the mask, 1..p the rows, p+1.. the constants 1..p-1, then the steps
        ops, value = [], 1
        for j in range(1, p):
            ops.append(FusedOp("compare", PRED, (0, p + j), "EQ"))
            ops.append(FusedOp("select", et, (2 * p - 1 + len(ops), 1 + j, value)))
            value = 2 * p - 1 + len(ops)
        consts = tuple(Const(j, S32) for j in range(1, p))
        ctx.emit(VpuFused, dst=picked, srcs=(mask, *candidates, *consts), ops=tuple(ops))

    def finish(k: int) -> None:
        a, rows = chunks[k]
        if plan != "vmem":
            ctx.emit(SemWait, sem=sem_in[k % 2], count=rows * sl.per_row)
        if packed is not None:
            pick_rows(k, rows * sl.per_row)
        if pending[k % 2]:
            ctx.emit(SemWait, sem=sem_out[k % 2], count=1)
        canon = view_shape(row_major(Shape(et, sl.canonical(rows))), sl.other_perm)
        block = MemRef(Space.VMEM, blocks[k % 2].address, Shape(et, sl.other_dims(rows), layout=out.shape.layout))
        ctx.emit(VpuCopy, dst=block, src=MemRef(Space.VMEM, stages[k % 2].address, canon))
        dst = out
        if len(chunks) > 1:
            offsets = [0] * out.shape.rank
            assert sl.row_dim is not None
            offsets[sl.row_dim] = a
            dst = windowed(out, offsets, sl.other_dims(rows))
        ctx.emit(DmaStart, src=block, dst=dst, sem=sem_out[k % 2])
        pending[k % 2] = True

    load_indices(0)
    for k in range(len(chunks)):
        if k + 1 < len(chunks):
            load_indices(k + 1)
        gather(k)
        if k:
            finish(k - 1)
    finish(len(chunks) - 1)
    for i in (0, 1):
        if pending[i]:
            ctx.emit(SemWait, sem=sem_out[i], count=1)
