"""``dot`` on the MXUs: blocked to fit VMEM, weight tiles latched while the previous tile streams.

The dot is seen as a set of 2-D products ``A[M,K] @ B[K,N]``: M is the last free dimension of the left
operand, N the last free dimension of the right one, K the last contracting dimension; every other
dimension (batch, further free or contracting dimensions) is a loop around them, unrolled, and further
contracting dimensions accumulate. Each product is cut into blocks: ``tm`` rows of A (at most half an
MXU result buffer, so one half can be popped while the other fills), ``tn`` columns of B (one
MXU-width tile per MXU, spread over the MXUs), and the whole of K when it fits VMEM (else K blocks of
whole weight tiles). For each block: the A and B windows are DMA'd into VMEM (double-buffered, and not
reloaded when the next block needs the same window), each ``R x C`` weight tile is latched with
``mxu.load_weights`` and the A rows stream through with ``mxu.matmul`` into the MXU result buffer
(accumulating over K), then ``mxu.pop`` writes the block to VMEM and a DMA writes it to HBM.

Precision follows XLA on TPU: bf16 operands take one pass; f32 operands take one bf16 pass for DEFAULT
(or what ``--matmul-precision`` says DEFAULT means), three for HIGH and six for HIGHEST.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.lowering.context import Lowering, VmemExhausted
from tpusim.compiler.lowering.registry import NotLowerable, lowering
from tpusim.isa import DmaStart, MemRef, MxuLoadWeights, MxuMatmul, MxuPop, SemWait, VpuMap, Window, XluTranspose
from tpusim.memory import Shape

__all__ = ["lower_dot", "matmul_precision"]

_MXU_INPUTS = {"bf16": "bf16", "f32": "f32", "s8": "int8", "u8": "int8"}
_PASSES = {"default": "bf16", "high": "bf16_3x", "highest": "bf16_6x"}


def matmul_precision(instr: Instruction, default: str, operand_type: str) -> str:
    """The MXU precision mode of a dot or convolution with ``operand_type`` operands."""
    if operand_type != "f32":
        return "bf16"
    configs = instr.attr("precision_config") or ("default",)
    level = max(("default", "high", "highest").index(p) if p in ("default", "high", "highest") else 0 for p in configs)
    name = ("default", "high", "highest")[level]
    return _PASSES[default if name == "default" else name]


@dataclass(frozen=True)
class _Dims:
    """The dot's dimensions, split into the 2-D product and the loops around it."""

    m: int | None  # lhs dimension of M
    k_lhs: int
    k_rhs: int
    n: int | None  # rhs dimension of N
    batch: tuple[tuple[int, int], ...]  # (lhs dim, rhs dim)
    lhs_loops: tuple[int, ...]  # further lhs free dims
    rhs_loops: tuple[int, ...]  # further rhs free dims
    contract_loops: tuple[tuple[int, int], ...]  # further (lhs, rhs) contracting dims


def _dims(instr: Instruction, lhs: Shape, rhs: Shape) -> _Dims:
    lb, rb = instr.attr("lhs_batch_dims", ()), instr.attr("rhs_batch_dims", ())
    lc, rc = instr.attr("lhs_contracting_dims", ()), instr.attr("rhs_contracting_dims", ())
    if not lc:
        raise NotLowerable("a dot without contracting dimensions (an outer product)")
    lf = [d for d in range(lhs.rank) if d not in lb and d not in lc]
    rf = [d for d in range(rhs.rank) if d not in rb and d not in rc]
    if len(rf) > 1:
        raise NotLowerable("a right operand with several free dimensions")
    return _Dims(
        m=lf[-1] if lf else None,
        k_lhs=lc[-1],
        k_rhs=rc[-1],
        n=rf[-1] if rf else None,
        batch=tuple(zip(lb, rb)),
        lhs_loops=tuple(lf[:-1]),
        rhs_loops=tuple(rf[:-1]),
        contract_loops=tuple(zip(lc[:-1], rc[:-1])),
    )


@dataclass(frozen=True)
class _Block:
    """One output block and the contraction steps that produce it."""

    out_offsets: tuple[int, ...]
    out_sizes: tuple[int, ...]
    steps: tuple[tuple[Window, Window], ...]  # (lhs window, rhs window) per contraction step
    ms: int  # rows of this block
    ns: int  # columns of this block


def _window(rank: int, fixed: dict[int, int], ranges: dict[int, tuple[int, int]]) -> Window:
    offsets, sizes = [], []
    for d in range(rank):
        if d in ranges:
            offsets.append(ranges[d][0])
            sizes.append(ranges[d][1])
        else:
            offsets.append(fixed.get(d, 0))
            sizes.append(1)
    return Window(tuple(offsets), tuple(sizes))


def _blocks(d: _Dims, lhs: Shape, rhs: Shape, out_rank: int, tm: int, tn: int, tk: int) -> list[_Block]:
    M = lhs.dimensions[d.m] if d.m is not None else 1
    N = rhs.dimensions[d.n] if d.n is not None else 1
    K = lhs.dimensions[d.k_lhs]
    outer_ranges = [range(lhs.dimensions[a]) for a, _ in d.batch]
    outer_ranges += [range(lhs.dimensions[a]) for a in d.lhs_loops]
    outer_ranges += [range(rhs.dimensions[a]) for a in d.rhs_loops]
    contract_ranges = [range(lhs.dimensions[a]) for a, _ in d.contract_loops]
    blocks = []
    nb = len(d.batch)
    for outer in itertools.product(*outer_ranges):
        bidx, lidx, ridx = outer[:nb], outer[nb : nb + len(d.lhs_loops)], outer[nb + len(d.lhs_loops) :]
        for m0 in range(0, M, tm):
            ms = min(tm, M - m0)
            for n0 in range(0, N, tn):
                ns = min(tn, N - n0)
                steps = []
                for cidx in itertools.product(*contract_ranges):
                    for k0 in range(0, K, tk):
                        ks = min(tk, K - k0)
                        lfix = {a: i for (a, _), i in zip(d.batch, bidx)}
                        lfix |= dict(zip(d.lhs_loops, lidx)) | {a: i for (a, _), i in zip(d.contract_loops, cidx)}
                        rfix = {b: i for (_, b), i in zip(d.batch, bidx)}
                        rfix |= dict(zip(d.rhs_loops, ridx)) | {b: i for (_, b), i in zip(d.contract_loops, cidx)}
                        lr = {d.k_lhs: (k0, ks)} | ({d.m: (m0, ms)} if d.m is not None else {})
                        rr = {d.k_rhs: (k0, ks)} | ({d.n: (n0, ns)} if d.n is not None else {})
                        steps.append((_window(lhs.rank, lfix, lr), _window(rhs.rank, rfix, rr)))
                offsets = (
                    [*bidx, *lidx] + ([m0] if d.m is not None else []) + [*ridx] + ([n0] if d.n is not None else [])
                )
                sizes = [1] * (nb + len(d.lhs_loops)) + ([ms] if d.m is not None else []) + [1] * len(d.rhs_loops)
                sizes += [ns] if d.n is not None else []
                blocks.append(_Block(tuple(offsets), tuple(sizes), tuple(steps), ms, ns))
    assert all(len(b.out_offsets) == out_rank for b in blocks)
    return blocks


def _as_matrix(ctx: Lowering, ref: MemRef, rows: int | None, cols: int, rank: int) -> tuple[MemRef, bool]:
    """``ref`` as a block whose last two dimensions are (rows, cols) and all others 1, through a cross-lane
    transpose when the operand's dimensions come in another order. The bool says the block is transposed
    (always False here; see :func:`_as_weights_t`)."""
    if rows is None:
        raise NotLowerable("a dot whose left operand has no free dimension (a vector-matrix product)")
    order = [d for d in range(rank) if d not in (rows, cols)]
    if all(ref.dims[d] == 1 for d in order) and (rows, cols) == (rank - 2, rank - 1):
        return ref, False
    perm = (*order, rows, cols)
    plain = Shape(ref.element_type, tuple(ref.dims[p] for p in perm))
    dst = ctx.vmem(plain.with_layout(ctx.rules.layout_for(plain)))
    ctx.emit(XluTranspose, dst=dst, src=ref, permutation=perm)
    return dst, False


@lowering("dot")
def lower_dot(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    lhs_ref, rhs_ref = ctx.hbm(comp.name, instr.operands[0]), ctx.hbm(comp.name, instr.operands[1])
    out_ref = ctx.hbm(comp.name, instr.name)
    lhs, rhs, out = lhs_ref.shape, rhs_ref.shape, out_ref.shape
    lt, rt = lhs.element_type.name, rhs.element_type.name
    if lt != rt or lt not in _MXU_INPUTS:
        raise NotLowerable(f"a {lt} x {rt} dot (the MXU multiplies bf16, f32 through bf16 passes, and int8)")
    if _MXU_INPUTS[lt] == "int8" and out.element_type.name != "s32":
        raise NotLowerable(f"an 8-bit dot with a {out.element_type} result")
    if _MXU_INPUTS[lt] != "int8" and not out.element_type.is_float:
        raise NotLowerable(f"a float dot with a {out.element_type} result")
    d = _dims(instr, lhs, rhs)
    if d.n is None:
        raise NotLowerable("a dot whose right operand has no free dimension (a matrix-vector product)")
    precision = matmul_precision(instr, ctx.options.matmul_precision, lt)
    cfg = ctx.config.mxu
    M = lhs.dimensions[d.m] if d.m is not None else 1
    N = rhs.dimensions[d.n]
    K = lhs.dimensions[d.k_lhs]
    tn = min(N, cfg.cols * cfg.count)
    tm = min(M, max(8, cfg.result_buffer_rows // 2 // 8 * 8))
    tk = K
    while True:
        mark, vmem_mark = ctx.checkpoint(), ctx.scope.vmem_next
        try:
            _emit(ctx, d, lhs_ref, rhs_ref, out_ref, tm, tn, tk, precision)
            return
        except VmemExhausted:
            ctx.rollback(mark)
            ctx.scope.vmem_next = vmem_mark
            if tk > cfg.rows:
                tk = max(cfg.rows, tk // 2 // cfg.rows * cfg.rows)
            elif tm > 8:
                tm = max(8, tm // 2 // 8 * 8)
            else:
                raise NotLowerable("its blocks do not fit in VMEM") from None


def _emit(
    ctx: Lowering,
    d: _Dims,
    lhs_ref: MemRef,
    rhs_ref: MemRef,
    out_ref: MemRef,
    tm: int,
    tn: int,
    tk: int,
    precision: str,
) -> None:
    cfg = ctx.config.mxu
    lhs, rhs, out = lhs_ref.shape, rhs_ref.shape, out_ref.shape
    blocks = _blocks(d, lhs, rhs, out.rank, tm, tn, tk)
    acc_type = "s32" if lhs.element_type.name in ("s8", "u8") else "f32"

    def vmem_block(shape: Shape, window: Window) -> MemRef:
        return ctx.vmem(Shape(shape.element_type, window.sizes, layout=shape.layout))

    first = blocks[0]
    a_slots = [vmem_block(lhs, first.steps[0][0]), vmem_block(lhs, first.steps[0][0])]
    b_slots = [vmem_block(rhs, first.steps[0][1]), vmem_block(rhs, first.steps[0][1])]
    pop_type = out.element_type.name if out.element_type.name in ("f32", "bf16", "s32") else acc_type
    out_block = Shape(out.element_type, first.out_sizes, layout=out.layout)
    c_slots = [ctx.vmem(out_block.with_element_type(pop_type)), ctx.vmem(out_block.with_element_type(pop_type))]
    convert_slot = ctx.vmem(out_block) if pop_type != out.element_type.name else None
    sem_in, sem_out = [ctx.semaphore(), ctx.semaphore()], [ctx.semaphore(), ctx.semaphore()]

    steps = [(bi, si, step) for bi, b in enumerate(blocks) for si, step in enumerate(b.steps)]
    resident: list[list[Window | None]] = [[None, None], [None, None]]  # [operand][slot] -> window held
    slot_of: list[list[int]] = [[0] * len(steps), [0] * len(steps)]
    loads: list[int] = [0] * len(steps)

    def issue_loads(i: int) -> None:
        _, _, windows = steps[i]
        for op, (ref, slots) in enumerate(((lhs_ref, a_slots), (rhs_ref, b_slots))):
            window = windows[op]
            prev = slot_of[op][i - 1] if i else 1
            if i and resident[op][prev] == window:
                slot_of[op][i] = prev
                continue
            slot = 1 - prev if i else 0
            slot_of[op][i] = slot
            resident[op][slot] = window
            src = MemRef(ref.space, ref.address, ref.shape, window) if window.sizes != ref.shape.dimensions else ref
            dst = _matrix_view(slots[slot], window)
            ctx.emit(DmaStart, src=src, dst=dst, sem=sem_in[i % 2])
            loads[i] += 1

    issue_loads(0)
    pending_out = [0, 0]
    mxus = cfg.count
    acc_half = [0] * mxus
    for i, (bi, si, windows) in enumerate(steps):
        block = blocks[bi]
        if loads[i]:
            ctx.emit(SemWait, sem=sem_in[i % 2], count=loads[i])
        a = _matrix_view(a_slots[slot_of[0][i]], windows[0])
        b = _matrix_view(b_slots[slot_of[1][i]], windows[1])
        a_mat, a_t = _as_matrix(ctx, a, d.m, d.k_lhs, lhs.rank)
        if a_t:
            raise NotLowerable("internal: left operand came out transposed")
        assert d.n is not None
        if d.k_rhs < d.n:
            b_mat, b_t = _as_matrix(ctx, b, d.k_rhs, d.n, rhs.rank)
        else:
            b_mat, b_t = _as_weights_t(ctx, b, d.k_rhs, d.n, rhs.rank)
        kk = a_mat.dims[-1]
        nn = b_mat.dims[-2] if b_t else b_mat.dims[-1]
        # K outer, N tiles inner: consecutive weight tiles go to different MXUs, which stream in parallel.
        for k0 in range(0, kk, cfg.rows):
            for t, n0 in enumerate(range(0, nn, cfg.cols)):
                mxu = t % mxus
                acc = acc_half[mxu] * (cfg.result_buffer_rows // 2)
                kt, nt = min(cfg.rows, kk - k0), min(cfg.cols, nn - n0)
                w_window = (k0, n0) if not b_t else (n0, k0)
                w_sizes = (kt, nt) if not b_t else (nt, kt)
                w = _sub2(b_mat, w_window, w_sizes)
                ctx.emit(MxuLoadWeights, mxu=mxu, src=w, transpose=b_t, precision=precision)
                lhs_tile = _sub2(a_mat, (0, k0), (a_mat.dims[-2], kt))
                ctx.emit(MxuMatmul, mxu=mxu, lhs=lhs_tile, acc=acc, accumulate=si > 0 or k0 > 0, precision=precision)
        if i + 1 < len(steps):
            issue_loads(i + 1)
        if si != len(block.steps) - 1:
            continue
        # The block is complete: pop every tile, then write the block out.
        slot = bi % 2
        if pending_out[slot]:
            ctx.emit(SemWait, sem=sem_out[slot], count=pending_out[slot])
            pending_out[slot] = 0
        c = _resized(c_slots[slot], block.out_sizes)
        for t, n0 in enumerate(range(0, block.ns, cfg.cols)):
            mxu = t % mxus
            acc = acc_half[mxu] * (cfg.result_buffer_rows // 2)
            ctx.emit(MxuPop, mxu=mxu, dst=_sub2(c, (0, n0), (block.ms, min(cfg.cols, block.ns - n0))), acc=acc)
        for m in range(min(mxus, -(-block.ns // cfg.cols))):
            acc_half[m] ^= 1
        src = c
        if convert_slot is not None:
            conv = _resized(convert_slot, block.out_sizes)
            ctx.emit(VpuMap, fn="convert", dst=conv, srcs=(c,))
            src = conv
        dst = MemRef(out_ref.space, out_ref.address, out, Window(block.out_offsets, block.out_sizes))
        if block.out_sizes == out.dimensions:
            dst = out_ref
        ctx.emit(DmaStart, src=src, dst=dst, sem=sem_out[slot])
        pending_out[slot] += 1
    for slot in (0, 1):
        if pending_out[slot]:
            ctx.emit(SemWait, sem=sem_out[slot], count=pending_out[slot])


def _resized(slot: MemRef, dims: tuple[int, ...]) -> MemRef:
    """The VMEM slot as an array of ``dims`` (a smaller block at the same address, same layout)."""
    if slot.dims == dims:
        return slot
    return MemRef(slot.space, slot.address, Shape(slot.element_type, dims, layout=slot.shape.layout))


def _matrix_view(slot: MemRef, window: Window) -> MemRef:
    """The VMEM slot holding ``window``'s data, shaped like the window."""
    return _resized(slot, window.sizes)


def _as_weights_t(ctx: Lowering, ref: MemRef, rows: int, cols: int, rank: int) -> tuple[MemRef, bool]:
    """Weights stored (N, K): latch them transposed when N and K are the last two dimensions."""
    dims = ref.dims
    if all(dims[d] == 1 for d in range(rank) if d not in (rows, cols)) and cols == rank - 2 and rows == rank - 1:
        return ref, True
    return _as_matrix(ctx, ref, rows, cols, rank)


def _sub2(ref: MemRef, offsets: tuple[int, int], sizes: tuple[int, int]) -> MemRef:
    """A window over the last two dimensions of a block whose other dimensions are 1."""
    lead = len(ref.dims) - 2
    if sizes == tuple(ref.dims[-2:]) and offsets == (0, 0):
        return ref
    base = ref.window.offsets if ref.window is not None else (0,) * len(ref.dims)
    if ref.window is not None:
        offsets = (base[-2] + offsets[0], base[-1] + offsets[1])  # type: ignore[operator]
    return MemRef(ref.space, ref.address, ref.shape, Window((*base[:lead], *offsets), (*(1,) * lead, *sizes)))
