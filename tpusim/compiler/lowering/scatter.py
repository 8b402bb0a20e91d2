"""scatter on the modelled hardware: the operand in VMEM, each update window combined into it by one vector
instruction at register offsets, in update order.

Plan (docs/compiler.md, "Gather, scatter, async copies and bit-level ops"):

1. the operand (or a block of it, cut along an indexed dimension whose update windows are one element
   wide) is DMA'd into VMEM;
2. per chunk of update slices (rows of the first batch axis), the index vectors are DMA'd into SMEM and the
   updates into VMEM, and ``vpu.copy`` lays the updates out as a row-major staging array, one slice after
   the other (:mod:`.indexed`);
3. straight-line code (:func:`.indexed.each_slice`) loads each index vector into registers and combines
   the update window with one vector instruction at those offsets: ``vpu.FN dst <- dst, update`` (``FN``
   the combiner: add, multiply, maximum, minimum, and, or, xor), or ``vpu.copy`` for a combiner that
   returns the update (``.at[].set``). The vector instructions run in program order and the scoreboard
   orders overlapping windows, so duplicate indices combine in update order, as the reference does. XLA
   drops a window that leaves the operand (it does not clamp: Operation Semantics "Scatter" and
   ``tpusim.compiler.hlo.reference.gather_scatter``); branches would force every DMA in flight to be waited
   for first (the program verifier's rule), so the code is branch-free: a register ``bad``, negative
   exactly when a start is out of range (or outside the block), and one ``vpu.fused`` that keeps the
   clamped window's own value there, ``select(bad >= 0, fn(window, update), window)``;
4. the block is DMA'd to the result.

Chunks are prefetched one ahead. Declined (the op falls back): variadic scatters, combiners other than one
binary op of the list above or a projection, the type limits of :func:`.gather.check_types`, operands whose
blocks cannot be cut, and more than 4 x :data:`.indexed.MAX_SLICES` slice visits (slices x blocks).
"""

from __future__ import annotations

from math import prod

from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.lowering.context import Lowering, VmemExhausted
from tpusim.compiler.lowering.gather import check_types, chunk_rows, granule
from tpusim.compiler.lowering.indexed import (
    MAX_SLICES,
    Slices,
    each_slice,
    index_chunk,
    row_major,
    scatter_slices,
    staging_view,
    take_registers,
    take_semaphores,
    windowed,
)
from tpusim.compiler.lowering.registry import NotLowerable, lowering
from tpusim.compiler.lowering.relayout import store
from tpusim.compiler.lowering.vector import combiner
from tpusim.compiler.lowering.views import view_shape
from tpusim.isa import Const, DmaStart, FusedOp, MemRef, Reg, ScalarAlu, SemWait, Space, VpuCopy, VpuFused, VpuMap
from tpusim.memory import ElementType, Shape, element_type

__all__ = ["lower_scatter"]

S32 = element_type("s32")


def _combine_kind(ctx: Lowering, instr: Instruction, sl: Slices) -> str:
    """``add`` ... (a VPU function), ``set`` (the update replaces), or ``keep`` (the operand stays)."""
    comp = ctx.module[instr.attr("to_apply")]
    params = comp.parameters
    et = sl.operand.element_type
    if len(params) != 2 or any(getattr(p.shape, "element_type", None) != et for p in params):
        raise NotLowerable(f"a combiner {comp.name} that is not a binary function of two {et} scalars")
    root = comp.root_instruction
    if root.opcode == "parameter":
        return "set" if root.attr("parameter_number") == 1 else "keep"
    fn = combiner(ctx, comp.name)
    if fn is None or getattr(root.shape, "element_type", None) != et:
        raise NotLowerable(f"combiner {comp.name} is not one add/multiply/maximum/minimum/and/or/xor of its parameters")
    return fn


def _guarded(kind: str, et: ElementType) -> tuple[tuple[Const, ...], tuple[FusedOp, ...]]:
    """The ``vpu.fused`` chain of one guarded combine: sources ``(window, update, bad, 0)``; where ``bad < 0``
    the window keeps its own value (a select moves bits, so even denormals the VPU's arithmetic would flush
    stay as they were, as in a window XLA drops)."""
    ok = FusedOp("compare", element_type("pred"), (2, 3), "GE")  # value 4: bad >= 0
    if kind == "set":
        return (Const(0, S32),), (ok, FusedOp("select", et, (4, 1, 0)))
    return (Const(0, S32),), (ok, FusedOp(kind, et, (0, 1)), FusedOp("select", et, (4, 5, 0)))


def _block_dim(sl: Slices) -> int | None:
    """The operand dimension blocks may cut: the most major physical one that is indexed or batched and
    whose windows are one element wide (a window then never straddles two blocks)."""
    moving = set(sl.index_dims) | {d for d, _ in sl.batching}
    for d in reversed(sl.operand.effective_layout.minor_to_major):
        if d in moving and sl.sizes[d] == 1 and sl.operand.dimensions[d] > 1:
            return d
    return None


@lowering("scatter")
def lower_scatter(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    if len(instr.operands) != 3:
        raise NotLowerable(f"a variadic scatter of {(len(instr.operands) - 1) // 2} operands")
    operand = ctx.home(comp.name, instr.operands[0])
    indices = ctx.home(comp.name, instr.operands[1])
    updates = ctx.home(comp.name, instr.operands[2])
    out = ctx.home(comp.name, instr.name)
    sl = scatter_slices(instr, operand.shape, indices.shape, updates.shape)
    if out.shape.element_count == 0:
        return
    if updates.element_type != operand.element_type:
        raise NotLowerable(f"{updates.element_type} updates of a {operand.element_type} operand")
    check_types(sl, "scatter")
    kind = _combine_kind(ctx, instr, sl)
    same = ctx.buffers.buffer(comp.name, instr.operands[0]).id == ctx.buffers.buffer(comp.name, instr.name).id
    if kind == "keep" or updates.shape.element_count == 0:
        if not same:
            (sem,) = take_semaphores(ctx, 1)
            ctx.emit(DmaStart, src=operand, dst=out, sem=sem)
            ctx.emit(SemWait, sem=sem, count=1)
        return
    try:
        _emit(ctx, sl, kind, operand, indices, updates, out)
    except VmemExhausted as exc:
        raise NotLowerable(str(exc)) from None


def _blocks(ctx: Lowering, sl: Slices) -> tuple[int | None, list[tuple[int, int]]]:
    """``(cut dimension, [(first, size), ...])``: the whole operand when half the free VMEM holds it."""
    shape = sl.operand
    budget = ctx.vmem_free_bytes() // 2
    if shape.byte_size <= budget:
        return None, [(0, shape.dimensions[0] if shape.rank else 1)]
    d = _block_dim(sl)
    if d is None:
        raise NotLowerable(f"the {shape.byte_size}-byte operand does not fit VMEM and no indexed dimension cuts it")
    g = granule(shape, d)
    n = shape.dimensions[d]
    per = max(1, shape.byte_size // n)
    size = max(1, budget // per)
    size = size // g * g if size >= g else size
    while size > 1 and _cut(shape, d, size).byte_size > budget:
        size = size - g if size > g and size % g == 0 else size // 2
    if _cut(shape, d, size).byte_size > budget:
        raise NotLowerable(f"no block of {shape} along dimension {d} fits VMEM")
    blocks = [(lo, min(size, n - lo)) for lo in range(0, n, size)]
    if len(blocks) * sl.count > 4 * MAX_SLICES:
        raise NotLowerable(f"{len(blocks)} operand blocks x {sl.count} slices (at most {4 * MAX_SLICES} visits)")
    return d, blocks


def _cut(shape: Shape, d: int, size: int) -> Shape:
    dims = list(shape.dimensions)
    dims[d] = size
    return Shape(shape.element_type, tuple(dims), layout=shape.layout)


def _emit(ctx: Lowering, sl: Slices, kind: str, operand: MemRef, indices: MemRef, updates: MemRef, out: MemRef) -> None:
    et = operand.element_type
    sem_w, *sems = take_semaphores(ctx, 5)
    sem_idx, sem_upd = sems[0:2], sems[2:4]
    cut, blocks = _blocks(ctx, sl)
    work = ctx.vmem(_cut(sl.operand, cut, blocks[0][1]) if cut is not None else sl.operand)
    smem_free = ctx.config.smem.bytes - ctx.scope.smem_next
    c = chunk_rows(ctx, sl, [(updates.shape, True)], ctx.vmem_free_bytes(), smem_free)
    chunks = [(a, min(c, sl.rows - a)) for a in range(0, sl.rows, c)]
    full = c * sl.per_row
    it = sl.indices.element_type
    slots = [ctx.smem(row_major(Shape(it, (max(1, full * sl.components),)))) for _ in range(2)]
    upd_blocks = [ctx.vmem(Shape(et, sl.other_dims(c), layout=updates.shape.layout)) for _ in range(2)]
    stages = [ctx.vmem(row_major(Shape(et, (full * prod(sl.sizes),)))) for _ in range(2)]
    steps = [(b, k) for b in range(len(blocks)) for k in range(len(chunks))]
    bad, tmp = take_registers(ctx, 2)
    guard_consts, guard_ops = _guarded(kind, et)
    zeros = (0,) * sl.operand.rank
    loaded: list[MemRef | None] = [None, None]

    def prefetch(s: int) -> None:
        _, k = steps[s]
        a, rows = chunks[k]
        if sl.components:
            loaded[s % 2] = index_chunk(ctx, sl, indices, slots[s % 2], a, rows, sem_idx[s % 2])
        src = updates
        if len(chunks) > 1:
            offsets = [0] * updates.shape.rank
            assert sl.row_dim is not None
            offsets[sl.row_dim] = a
            src = windowed(updates, offsets, sl.other_dims(rows))
        dst = MemRef(Space.VMEM, upd_blocks[s % 2].address, Shape(et, sl.other_dims(rows), layout=updates.shape.layout))
        ctx.emit(DmaStart, src=src, dst=dst, sem=sem_upd[s % 2])

    def block_ref(b: int) -> tuple[MemRef, MemRef]:
        lo, size = blocks[b]
        if cut is None:
            return operand, out
        offsets = [0] * sl.operand.rank
        offsets[cut] = lo
        dims = _cut(sl.operand, cut, size).dimensions
        return windowed(operand, offsets, dims), windowed(out, offsets, dims)

    def combine(s: int, w: MemRef) -> None:
        b, k = steps[s]
        a, rows = chunks[k]
        n = rows * sl.per_row
        if sl.components:
            ctx.emit(SemWait, sem=sem_idx[s % 2], count=1, control=True)
        ctx.emit(SemWait, sem=sem_upd[s % 2], count=1)
        canon = view_shape(row_major(Shape(et, sl.canonical(rows))), sl.other_perm)
        upd = MemRef(Space.VMEM, upd_blocks[s % 2].address, Shape(et, sl.other_dims(rows), layout=updates.shape.layout))
        ctx.emit(VpuCopy, dst=MemRef(Space.VMEM, stages[s % 2].address, canon), src=upd)
        stage = MemRef(Space.VMEM, stages[s % 2].address, staging_view(sl, stages[s % 2], n))
        lo, size = blocks[b]

        def body(g: int, starts: tuple[int | Reg, ...], row: int) -> None:
            local = list(starts)
            checks = [
                (start, sl.operand.dimensions[d] - sl.sizes[d])
                for d, start in enumerate(starts)
                if isinstance(start, Reg) and d != cut
            ]
            if cut is not None:
                at = starts[cut]
                if isinstance(at, Reg):
                    if lo:
                        ctx.emit(ScalarAlu, fn="sub", dst=at, a=at, b=lo)
                    checks.append((at, size - 1))
                elif lo <= at < lo + size:
                    local[cut] = at - lo
                else:
                    return  # a batching position of another block
            dst = windowed(w, local, sl.sizes, clamp=bool(checks))
            update = windowed(stage, (row, *zeros[1:]), sl.sizes)
            if not checks:
                if kind == "set":
                    ctx.emit(VpuCopy, dst=dst, src=update)
                else:
                    ctx.emit(VpuMap, fn=kind, dst=dst, srcs=(dst, update))
                return
            # ``bad`` ends negative exactly when some start is below 0 or above its limit: it ORs in each start
            # and each ``limit - start``. The clamped window then keeps its value: dropped, as XLA drops it.
            for i, (reg, high) in enumerate(checks):
                ctx.emit(ScalarAlu, fn="sub", dst=tmp, a=high, b=reg)
                ctx.emit(ScalarAlu, fn="or", dst=bad, a=reg if i == 0 else bad, b=tmp)
                if i:
                    ctx.emit(ScalarAlu, fn="or", dst=bad, a=bad, b=reg)
            ctx.emit(VpuFused, dst=dst, srcs=(dst, update, bad, *guard_consts), ops=guard_ops)

        smem = loaded[s % 2] or MemRef(Space.SMEM, slots[s % 2].address, slots[s % 2].shape)
        each_slice(ctx, sl, smem, n, a * sl.per_row, body, saturate_unsigned=False)

    prefetch(0)
    stores = 0
    for s, (b, k) in enumerate(steps):
        if k == 0:
            src, _ = block_ref(b)
            w = MemRef(Space.VMEM, work.address, _cut(sl.operand, cut, blocks[b][1]) if cut is not None else sl.operand)
            ctx.emit(DmaStart, src=src, dst=w, sem=sem_w)
            ctx.emit(SemWait, sem=sem_w, count=1 + stores)
            stores = 0
        if s + 1 < len(steps):
            prefetch(s + 1)
        combine(s, w)
        if k == len(chunks) - 1:
            _, dst = block_ref(b)
            stores += store(ctx, w, dst, sem_w)
    if stores:
        ctx.emit(SemWait, sem=sem_w, count=stores)
