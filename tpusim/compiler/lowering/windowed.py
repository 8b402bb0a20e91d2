"""reduce-window and select-and-scatter on the VPU, over the staged windows of :mod:`.staging`.

reduce-window: per output block, per phase, one VPU instruction per tap combines the tap's window of the
staging block into an accumulator block viewed with the same per-axis splits: the first tap combines the
init value with the window (``vpu.FN(init, tap)``, or ``vpu.copy`` when init is an exact identity of FN),
later taps ``vpu.FN(acc, tap)``. As on XLA, padding and base-dilation holes take no part: padding is
pre-filled with FN's exact identity (-0.0 for a float sum), holes are not taps of their phase, so a
non-identity init counts once per window, not once per padded tap. Sums and products of bf16/f16
accumulate in f32 (``vpu.fused`` convert+add) and round once, as the reference does. Blocks are
double-buffered: block k+1's input loads while block k computes, and block k's result is written out while
k+1 computes. Windows of more than :data:`MAX_TAPS` taps decline.

select-and-scatter: each window's pick is folded tap by tap exactly as XLA defines it (the current pick is
kept while ``select(pick, candidate)`` holds; taps in the padding are masked out), keeping the pick's value
and tap number per window; then one fused compare-select-combine per tap scatters the source values into an
init-filled result block. Each block owns a region of the result and folds every window that touches it,
so overlapping windows (a 3x3 pool with stride 2) are cut into blocks too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product
from math import ceil, log2, prod

import numpy as np

from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.lowering.context import Lowering, VmemExhausted
from tpusim.compiler.lowering.immediates import scalar_constant
from tpusim.compiler.lowering.registry import NotLowerable, lowering
from tpusim.compiler.lowering.staging import (
    Axis,
    Inbound,
    Outbound,
    Rows,
    Span,
    Stage,
    block_sizes,
    out_extent,
    phase_window,
    run_blocks,
    spans,
    stage,
    tap_window,
)
from tpusim.compiler.lowering.vector import combiner, reduce_identity
from tpusim.isa import Const, FusedOp, MemRef, VpuBroadcast, VpuCopy, VpuFused, VpuMap, Window
from tpusim.memory import ElementType, Shape, element_type
from tpusim.semantics.combiners import exact_identity as reference_identity

__all__ = ["MAX_TAPS", "canonical_order", "lower_reduce_window", "lower_select_and_scatter"]

MAX_TAPS = 256
"""Most window taps reduce-window and select-and-scatter lower (one VPU instruction per tap and block);
larger windows run as fallbacks, except scans (the cumulative sums JAX writes as reduce-window over the
whole axis), which take a number of instructions logarithmic in the axis' length."""

_BLOCK_BYTES = 1 << 18
"""Largest output block aimed for (big enough to amortise DMA set-up, small enough to pipeline)."""


# ---------------------------------------------------------------------------------------------------------
# reduce-window
# ---------------------------------------------------------------------------------------------------------
_F32 = element_type("f32")


def canonical_order(shape: Shape, axes: Sequence[Axis]) -> tuple[list[int], bool]:
    """The canonical axis order of an all-windowed operand: its physical order with the lane axis last; the
    lane axis is the most minor dimension whose windows need no split view (then tiled ``T(lanes)``), or,
    when every dimension needs one, the minor dimension of an untiled layout. Returns (order, tiled)."""
    physical = list(reversed(shape.effective_layout.minor_to_major))
    choices = [d for d in reversed(physical) if not axes[d].split]
    lane = choices[0] if choices else physical[-1]
    return [d for d in physical if d != lane] + [lane], bool(choices)


@lowering("reduce-window")
def lower_reduce_window(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    if len(instr.operands) != 2 or not isinstance(instr.shape, Shape):
        raise NotLowerable("a variadic reduce-window (several operands)")
    fn = combiner(ctx, instr.attr("to_apply"))
    if fn is None:
        raise NotLowerable("a reduce-window whose computation is not one add/multiply/maximum/minimum/and/or/xor")
    init = scalar_constant(comp[instr.operands[1]])
    if init is None:
        raise NotLowerable("a reduce-window whose init value is not a constant")
    src = ctx.home(comp.name, instr.operands[0])
    out = ctx.home(comp.name, instr.name)
    et = src.element_type
    if et.is_complex or et.dtype is None or et.bits > 32:
        raise NotLowerable(f"a {et} reduce-window (the VPU computes 32-bit and narrower types)")
    if src.shape.rank == 0 or out.shape.element_count == 0:
        raise NotLowerable("a reduce-window of a scalar or with an empty result")
    window = instr.attr("window")
    dims = window.dims if window is not None else ()
    if len(dims) != src.shape.rank:
        raise NotLowerable("a reduce-window whose window does not cover every dimension")
    axes = [Axis.of(w, n, o) for w, n, o in zip(dims, src.shape.dimensions, out.shape.dimensions)]
    scan = _scan_axis(axes)
    fill = exact_identity(fn, et)
    if scan is not None and fill is not None and _scan_steps(axes[scan[0]].size) < axes[scan[0]].taps:
        _ReduceWindow(ctx, axes, src, out, fn, init, fill, *scan).lower()
        return
    taps = prod(a.taps for a in axes)
    if taps > MAX_TAPS:
        raise NotLowerable(
            f"a window of {taps} taps (more than {MAX_TAPS}): one VPU instruction per tap and block would not be "
            f"proportional to the data"
        )
    if fill is None:
        raise NotLowerable(f"a {fn} reduce-window of {et}, which has no identity to fill padding with")
    _ReduceWindow(ctx, axes, src, out, fn, init, fill).lower()


def _scan_axis(axes: Sequence[Axis]) -> tuple[int, bool] | None:
    """``(axis, reverse)`` of a scan: every output reduces all the input up to its own position along one
    axis (JAX's ``cumsum``, ``cummax``...: a window of at least the axis' length, padded low by all but one
    tap, no stride or dilation), or from its own position on (``reverse``: ``cumsum(reverse=True)``, padded
    high instead), and only its own position along the others; None for any other window."""
    plain = all(a.stride == 1 and a.dilate == 1 and a.base == 1 and not a.reverse for a in axes)
    wide = [j for j, a in enumerate(axes) if a.taps > 1]
    if not plain or len(wide) != 1 or any(a.pad != 0 or a.out != a.size for a in axes if a.taps == 1):
        return None
    a = axes[wide[0]]
    if a.out != a.size or a.taps < a.size:
        return None
    high = a.taps - 1 - a.pad  # (out = size + pad_low + pad_high - taps + 1)
    return (wide[0], False) if a.pad == a.taps - 1 else (wide[0], True) if high == a.taps - 1 else None


def _scan_steps(length: int) -> int:
    """VPU instructions per block of a scan over ``length`` positions (:class:`_Scan`):
    the copy in, the running total folded in, two per doubling step, the running total taken out."""
    return 3 + 2 * ceil(log2(length)) if length > 1 else 3


def exact_identity(fn: str, et: ElementType) -> Const | None:
    """The value ``e`` of ``et`` with ``fn(e, x) == x`` bit for bit for every ``x`` (the reference's
    :func:`~tpusim.semantics.combiners.exact_identity`: -0.0 for a float sum, the lowest finite
    value for the maximum of a float type without infinities), or None."""
    assert et.dtype is not None
    value = reference_identity(fn, et.dtype)
    if value is None:
        return None
    if et.name == "pred":
        return Const(bool(value), et)
    return Const(float(value), et) if et.is_float else Const(int(value), et)


def _same_bits(a: Const, b: Const) -> bool:
    dtype = a.etype.dtype
    bits = [np.asarray(c.value).astype(dtype).tobytes() for c in (a, b)]
    return a.etype == b.etype and bits[0] == bits[1]


def _halving(ctx: Lowering, emit: Callable[[int], None], cap: int) -> None:
    """``emit(cap)`` with block caps halved (after rolling back what the failed attempt took) until the
    blocks fit VMEM; :class:`NotLowerable` when not even a cap of one element fits."""
    mark = ctx.checkpoint()
    while True:
        try:
            emit(cap)
            return
        except VmemExhausted:
            ctx.rollback(mark)
            if cap == 1:
                raise NotLowerable("its blocks do not fit in VMEM") from None
            cap = max(1, cap // 2)


@dataclass
class _ReduceWindow:
    ctx: Lowering
    axes_hbm: list[Axis]  # per operand dimension
    src: MemRef
    out: MemRef
    fn: str
    init: Const
    fill: Const  # padding: the exact identity of fn
    scan: int | None = None  # operand dimension of a scan (:func:`_scan_axis`)
    reverse: bool = False  # the scan runs from the axis' end

    def lower(self) -> None:
        ctx, src = self.ctx, self.src
        if self.scan is not None:  # blocks of the scan axis are staged without the window's halo
            a = self.axes_hbm[self.scan]
            self.axes_hbm = [*self.axes_hbm[: self.scan], Axis(a.out, a.size), *self.axes_hbm[self.scan + 1 :]]
        self.order, tiled = canonical_order(src.shape, self.axes_hbm)
        self.axes = [self.axes_hbm[d] for d in self.order]
        et = src.element_type
        esize = ctx.rules.layout_for(Shape(et, (8, 8))).element_size_bits
        lanes = ctx.config.vpu.lanes
        self.rows = Rows(et, lanes, esize, tiled)
        # sums and products of floats narrower than f32 accumulate in f32, as the reference's do
        wide = self.fn in ("add", "multiply") and et.is_float and et.bits < 32
        self.acc_rows = Rows(_F32, lanes, 0, tiled) if wide else self.rows
        self.acc_init = Const(float(self.init.value), _F32) if wide else self.init
        # the first tap is combined with init unless init changes nothing, bit for bit (+0.0 is no identity
        # of a float sum: +0.0 + -0.0 is +0.0)
        self.init_is_identity = _same_bits(self.init, self.fill)
        _halving(ctx, self._emit, max(1, min(_BLOCK_BYTES, ctx.vmem_free_bytes() // 8) // max(1, et.bits // 8)))

    def _emit(self, cap: int) -> None:
        ctx, axes, rows, acc_rows = self.ctx, self.axes, self.rows, self.acc_rows
        sizes = block_sizes(axes, cap)
        blocks = list(product(*(spans(a, b) for a, b in zip(axes, sizes))))
        if self.reverse:  # (a reversed scan takes the blocks along its axis from the end)
            blocks.reverse()
        stages = [stage(axes, b) for b in blocks]
        rank = len(axes)
        stage_max = [max(s.extent[j] for s in stages) for j in range(rank)]
        data_max = [max(max(0, s.data[j][1] - s.data[j][0]) for s in stages) for j in range(rank)]
        out_max = [out_extent(a, b) for a, b in zip(axes, sizes)]
        inbound = Inbound(ctx, self.src, rows, self.order, stage_max, [max(1, n) for n in data_max])
        outbound = Outbound(ctx, self.out, acc_rows, self.order, out_max)
        phases = list(product(*(range(a.phases) for a in axes)))
        valid = {q: list(product(*(a.valid(qj) for a, qj in zip(axes, q)))) for q in phases}

        def load(i: int, slot: int, sem: int) -> int:
            st = stages[i]
            first = [a for a, _ in st.data]
            size = [b - a for a, b in st.data]
            local = [f - lo for f, lo in zip(first, st.lo)]
            return inbound.load(slot, sem, first, size, local, st.extent, self.fill if st.fill else None)

        def compute(i: int, slot: int) -> None:
            block, st = blocks[i], stages[i]
            staging = inbound.stage(slot)
            extent = [out_extent(a, s.size) for a, s in zip(axes, block)]
            target = outbound.blocks[slot]
            in_view = rows.ref(staging, rows.split_dims(axes, st.extent, per_phase=False))
            out_dims = acc_rows.split_dims(axes, extent, per_phase=True)
            for q in phases:
                if any(a.count(s.size, qj) == 0 for a, s, qj in zip(axes, block, q)):
                    continue
                dst = acc_rows.ref(target, out_dims, phase_window(axes, q, block))
                taps = valid[q]
                if not taps:
                    ctx.emit(VpuBroadcast, dst=dst, src=self.acc_init, dims=())
                    continue
                for t, kappa in enumerate(taps):
                    win = MemRef(in_view.space, in_view.address, in_view.shape, tap_window(axes, st, block, q, kappa))
                    self._combine(dst, win, first=t == 0)
            outbound.finish(slot, extent, [s.size for s in block])

        def store(i: int, slot: int, sem: int) -> int:
            block = blocks[i]
            extent = [out_extent(a, s.size) for a, s in zip(axes, block)]
            return outbound.store(slot, sem, extent, [s.start for s in block], [s.size for s in block])

        if self.scan is None:
            run_blocks(ctx, len(blocks), load, compute, store)
            return
        scan = _Scan(self, self.order.index(self.scan), out_max, inbound, outbound)

        def compute_scan(i: int, slot: int) -> None:
            scan.block(blocks[i], stages[i], slot)

        run_blocks(ctx, len(blocks), load, compute_scan, store)

    def _combine(self, dst: MemRef, win: MemRef, first: bool) -> None:
        """``dst = fn(dst, win)``; for the first tap ``dst = fn(init, win)`` (XLA's order: init, then the taps)."""
        ctx = self.ctx
        acc: MemRef | Const = dst
        if first:
            if self.init_is_identity:
                if self.acc_rows is not self.rows:
                    ctx.emit(VpuMap, fn="convert", dst=dst, srcs=(win,))
                else:
                    ctx.emit(VpuCopy, dst=dst, src=win)
                return
            acc = self.acc_init
        if self.acc_rows is not self.rows:  # narrow floats: accumulate in f32, round once at the end
            steps = (FusedOp("convert", _F32, (1,)), FusedOp(self.fn, _F32, (0, 2)))
            ctx.emit(VpuFused, dst=dst, srcs=(acc, win), ops=steps)
        else:
            ctx.emit(VpuMap, fn=self.fn, dst=dst, srcs=(acc, win))


class _Scan:
    """A scan's blocks (:func:`_scan_axis`), in order along the scan axis: each block's scan by doubling
    (Hillis and Steele: after the step of distance ``d``, position ``i`` holds the reduction of the ``2d``
    positions up to it), ping-ponging between a scratch block and the output block, with the running total
    of the blocks before it (per position of the other axes, starting at init) folded into its first
    position, and its last position kept as the running total of the next. A reversed scan mirrors all of
    it (blocks from the axis' end, totals folded into their last position). About ``2 log2(n)`` VPU passes
    over the data instead of one per tap; the reduction's association differs from the taps' order (float
    sums then differ by rounding, as XLA:TPU's scans do)."""

    def __init__(self, rw: _ReduceWindow, axis: int, extent: Sequence[int], inbound: Inbound, out: Outbound) -> None:
        self.rw, self.axis, self.inbound, self.outbound = rw, axis, inbound, out
        ctx, rows = rw.ctx, rw.acc_rows
        self.scratch = ctx.vmem(rows.shape(extent))
        whole = [1 if j == axis else a.out for j, a in enumerate(rw.axes)]
        self.total = rows.ref(ctx.vmem(rows.shape(whole)), whole)
        ctx.emit(VpuBroadcast, dst=self.total, src=rw.acc_init, dims=())

    def _part(self, at: MemRef, extent: Sequence[int], lo: int, hi: int) -> MemRef:
        """Positions ``[lo, hi)`` along the scan axis of the block array at ``at``."""
        offsets = tuple(lo if j == self.axis else 0 for j in range(len(extent)))
        sizes = tuple(hi - lo if j == self.axis else n for j, n in enumerate(extent))
        return self.rw.acc_rows.ref(at, extent, Window(offsets, sizes))

    def block(self, block: Sequence[Span], st: Stage, slot: int) -> None:
        rw, ctx, j = self.rw, self.rw.ctx, self.axis
        extent = [out_extent(a, s.size) for a, s in zip(rw.axes, block)]
        n = extent[j]
        target = self.outbound.blocks[slot]
        steps = ceil(log2(n)) if n > 1 else 0
        cur, other = (target, self.scratch) if steps % 2 == 0 else (self.scratch, target)
        staged = rw.rows.ref(self.inbound.stage(slot), list(st.extent))
        first = self._part(cur, extent, 0, n)
        if rw.acc_rows is not rw.rows:  # narrow floats: the scan runs in f32 and rounds once
            ctx.emit(VpuMap, fn="convert", dst=first, srcs=(staged,))
        else:
            ctx.emit(VpuCopy, dst=first, src=staged)
        offsets = tuple(0 if k == j else s.start for k, s in enumerate(block))
        sizes = tuple(1 if k == j else e for k, e in enumerate(extent))
        total = MemRef(self.total.space, self.total.address, self.total.shape, Window(offsets, sizes))
        back = rw.reverse
        head = self._part(cur, extent, n - 1, n) if back else self._part(cur, extent, 0, 1)
        ctx.emit(VpuMap, fn=rw.fn, dst=head, srcs=(head, total) if back else (total, head))
        d = 1
        while d < n:
            combined, kept = ((0, n - d), (n - d, n)) if back else ((d, n), (0, d))
            ctx.emit(
                VpuMap, fn=rw.fn, dst=self._part(other, extent, *combined),
                srcs=(self._part(cur, extent, 0, n - d), self._part(cur, extent, d, n)),
            )  # fmt: skip
            ctx.emit(VpuCopy, dst=self._part(other, extent, *kept), src=self._part(cur, extent, *kept))
            cur, other, d = other, cur, 2 * d
        last = self._part(cur, extent, 0, 1) if back else self._part(cur, extent, n - 1, n)
        ctx.emit(VpuCopy, dst=total, src=last)
        self.outbound.finish(slot, extent, [s.size for s in block])


# ---------------------------------------------------------------------------------------------------------
# select-and-scatter
# ---------------------------------------------------------------------------------------------------------
_S32 = element_type("s32")
_PRED = element_type("pred")


def _selector(ctx: Lowering, name: str) -> tuple[str, bool] | None:
    """``(direction, swapped)`` of a select computation ``ROOT compare(p0, p1)`` (``swapped``: ``compare(p1,
    p0)``), or None for any other computation."""
    comp = ctx.module[name]
    root = comp.root_instruction
    params = [p.name for p in sorted(comp.parameters, key=lambda p: p.attr("parameter_number"))]
    if root.opcode != "compare" or len(params) != 2 or root.attr("type") == "TOTALORDER":
        return None
    if tuple(root.operands) == tuple(params):
        return root.attr("direction"), False
    if tuple(root.operands) == tuple(reversed(params)):
        return root.attr("direction"), True
    return None


@lowering("select-and-scatter")
def lower_select_and_scatter(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """Each window's pick is folded tap by tap on the VPU exactly as XLA defines it (the current pick is kept
    while ``select(pick, candidate)`` holds; taps in the padding are skipped), keeping the pick's value and
    tap number per window; then one fused instruction per tap adds the source values of the windows that
    picked that tap into an init-filled result block."""
    if len(instr.operands) != 3 or not isinstance(instr.shape, Shape):
        raise NotLowerable("a select-and-scatter with tuple operands")
    selector = _selector(ctx, instr.attr("select"))
    if selector is None:
        raise NotLowerable("a select computation that is not one comparison of its two parameters")
    fn = combiner(ctx, instr.attr("scatter"))
    init = scalar_constant(comp[instr.operands[2]])
    operand, source = ctx.home(comp.name, instr.operands[0]), ctx.home(comp.name, instr.operands[1])
    out = ctx.home(comp.name, instr.name)
    et = operand.element_type
    identity = reduce_identity(fn, et) if fn is not None else None
    if fn is None or identity is None:
        raise NotLowerable("a scatter computation that is not one add/multiply/maximum/minimum/and/or/xor")
    if init is None:
        raise NotLowerable("a select-and-scatter whose init value is not a constant")
    if et.is_complex or et.dtype is None or et.bits > 32 or operand.shape.rank == 0:
        raise NotLowerable(f"a {et} select-and-scatter of rank {operand.shape.rank}")
    window = instr.attr("window")
    dims = window.dims if window is not None else ()
    if len(dims) != operand.shape.rank or any(d.lhs_dilate != 1 or d.reversal for d in dims):
        raise NotLowerable("a select-and-scatter window with base dilation or reversal")
    axes = [Axis.of(w, n, o) for w, n, o in zip(dims, operand.shape.dimensions, source.shape.dimensions)]
    taps = prod(a.taps for a in axes)
    if taps > MAX_TAPS or min(a.out for a in axes) == 0:
        raise NotLowerable(f"a select-and-scatter window of {taps} taps (at most {MAX_TAPS}) or an empty source")
    _SelectAndScatter(ctx, axes, operand, source, out, selector, fn, Const(identity, et), init).lower()


@dataclass
class _SelectAndScatter:
    ctx: Lowering
    axes_hbm: list[Axis]
    operand: MemRef
    source: MemRef
    out: MemRef
    selector: tuple[str, bool]
    fn: str
    identity: Const
    init: Const

    def lower(self) -> None:
        ctx = self.ctx
        self.order, tiled = canonical_order(self.operand.shape, self.axes_hbm)
        self.axes = [self.axes_hbm[d] for d in self.order]
        et = self.operand.element_type
        lanes = ctx.config.vpu.lanes
        esize = ctx.rules.layout_for(Shape(et, (8, 8))).element_size_bits
        self.rows = Rows(et, lanes, esize, tiled)
        self.idx_rows = Rows(_S32, lanes, 0, tiled)
        self.pred_rows = Rows(_PRED, lanes, ctx.rules.layout_for(Shape(_PRED, (8, 8))).element_size_bits, tiled)
        _halving(ctx, self._emit, max(1, min(_BLOCK_BYTES, ctx.vmem_free_bytes() // 16) // max(1, et.bits // 8)))

    def _region(self, axis: Axis, span: Span) -> tuple[Span, int, int, int, int, bool]:
        """Along ``axis``, for the block that owns windows ``span``: the windows it folds (every window that
        touches its result region, so overlapping windows are folded by both neighbours, identically), the
        staging range, its result region (the regions of consecutive blocks tile the operand), and whether
        the windows read padding."""
        a0, n = span.start, span.size
        reach = (axis.taps - 1) * axis.dilate + 1
        res_lo = 0 if a0 == 0 else a0 * axis.stride - axis.pad
        res_hi = axis.size if a0 + n == axis.out else (a0 + n) * axis.stride - axis.pad
        res_lo, res_hi = min(max(res_lo, 0), axis.size), min(max(res_hi, 0), axis.size)
        first = max(0, min(a0, (res_lo + axis.pad - reach) // axis.stride + 1))
        end = min(axis.out, max(a0 + n, -(-(res_hi + axis.pad) // axis.stride)))
        read_lo = first * axis.stride - axis.pad
        read_hi = (end - 1) * axis.stride - axis.pad + reach
        lo, hi = min(read_lo, res_lo), max(read_hi, res_hi)
        return Span(first, end - first), lo, hi, res_lo, res_hi, read_lo < 0 or read_hi > axis.size

    def _emit(self, cap: int) -> None:
        ctx, axes, rows = self.ctx, self.axes, self.rows
        sizes = block_sizes(axes, cap)
        plans = []
        for owned in product(*(spans(a, b) for a, b in zip(axes, sizes))):
            regions = [self._region(a, s) for a, s in zip(axes, owned)]
            block = tuple(r[0] for r in regions)
            lo = tuple(r[1] for r in regions)
            extent = tuple(
                -(-(r[2] - r[1]) // a.step) * a.step if a.split else r[2] - r[1] for a, r in zip(axes, regions)
            )
            data = tuple((max(r[1], 0), min(r[2], a.size)) for a, r in zip(axes, regions))
            st = Stage(lo, extent, data, any(r[5] for r in regions))
            plans.append((block, st, [(r[3], r[4]) for r in regions]))
        blocks = [p[0] for p in plans]
        rank = len(axes)
        stage_max = [max(p[1].extent[j] for p in plans) for j in range(rank)]
        data_max = [max(max(1, p[1].data[j][1] - p[1].data[j][0]) for p in plans) for j in range(rank)]
        work = [max(b[j].size for b in blocks) for j in range(rank)]  # most windows a block folds, per axis
        values = Inbound(ctx, self.operand, rows, self.order, stage_max, data_max)
        sources = Inbound(ctx, self.source, rows, self.order, work, work)
        results = Outbound(ctx, self.out, rows, self.order, stage_max)
        masked = any(p[1].fill for p in plans)
        mask = ctx.vmem(self.pred_rows.shape(stage_max)) if masked else None
        pick = ctx.vmem(rows.shape(_window_dims(axes, work)))
        pick_tap = ctx.vmem(self.idx_rows.shape(_window_dims(axes, work)))
        have, take = (ctx.vmem(self.pred_rows.shape(_window_dims(axes, work))) for _ in range(2))
        # Taps in XLA's order (row-major over the operand's own dimensions), which decides ties; each as
        # canonical-order offsets.
        logical = product(*(range(a.taps) for a in self.axes_hbm))
        kernel = [tuple(k[d] for d in self.order) for k in logical]

        def load(i: int, slot: int, sem: int) -> int:
            block, st, _ = plans[i]
            first = [a for a, _ in st.data]
            size = [b - a for a, b in st.data]
            local = [f - lo for f, lo in zip(first, st.lo)]
            n = values.load(slot, sem, first, size, local, st.extent, Const(0, rows.etype) if st.fill else None)
            counts = [s.size for s in block]
            return n + sources.load(slot, sem, [s.start for s in block], counts, [0] * rank, counts, None)

        def compute(i: int, slot: int) -> None:
            block, st, result = plans[i]
            counts = [s.size for s in block]
            wdims = _window_dims(axes, counts)
            staged = rows.ref(values.stage(slot), rows.split_dims(axes, st.extent, per_phase=False))
            src = rows.ref(sources.stage(slot), wdims)
            acc = rows.ref(results.blocks[slot], rows.split_dims(axes, st.extent, per_phase=False))
            ctx.emit(VpuBroadcast, dst=rows.ref(results.blocks[slot], st.extent), src=self.init, dims=())
            valid = None
            if st.fill:
                assert mask is not None
                local = [a - lo for (a, _), lo in zip(st.data, st.lo)]
                size = [b - a for a, b in st.data]
                ctx.emit(VpuBroadcast, dst=self.pred_rows.ref(mask, st.extent), src=Const(False, _PRED), dims=())
                inside = self.pred_rows.ref(mask, st.extent, Window(tuple(local), tuple(size)))
                ctx.emit(VpuBroadcast, dst=inside, src=Const(True, _PRED), dims=())
                valid = self.pred_rows.ref(mask, self.pred_rows.split_dims(axes, st.extent, per_phase=False))
            p_val, p_tap = rows.ref(pick, wdims), self.idx_rows.ref(pick_tap, wdims)
            p_have, p_take = self.pred_rows.ref(have, wdims), self.pred_rows.ref(take, wdims)
            windows = [tap_window(axes, st, block, [0] * rank, k) for k in kernel]
            for t, win in enumerate(windows):
                cand = MemRef(staged.space, staged.address, staged.shape, win)
                ok = MemRef(valid.space, valid.address, valid.shape, win) if valid is not None else None
                if t == 0:
                    ctx.emit(VpuCopy, dst=p_val, src=cand)
                    ctx.emit(VpuBroadcast, dst=p_tap, src=Const(0, _S32), dims=())
                    if ok is not None:
                        ctx.emit(VpuCopy, dst=p_have, src=ok)
                    continue
                direction, swapped = self.selector
                ctx.emit(
                    VpuMap,
                    fn="compare",
                    dst=p_take,
                    srcs=(cand, p_val) if swapped else (p_val, cand),
                    direction=direction,
                )
                if ok is None:  # take the candidate unless select(pick, candidate) keeps the pick
                    ctx.emit(VpuMap, fn="not", dst=p_take, srcs=(p_take,))
                else:  # ... and only in-bounds candidates, and any in-bounds one while nothing is picked
                    take_steps = (
                        FusedOp("not", _PRED, (0,)),
                        FusedOp("not", _PRED, (1,)),
                        FusedOp("or", _PRED, (3, 4)),
                        FusedOp("and", _PRED, (2, 5)),
                    )
                    ctx.emit(VpuFused, dst=p_take, srcs=(p_take, p_have, ok), ops=take_steps)
                    ctx.emit(VpuMap, fn="or", dst=p_have, srcs=(p_have, ok))
                ctx.emit(VpuMap, fn="select", dst=p_val, srcs=(p_take, cand, p_val))
                ctx.emit(VpuMap, fn="select", dst=p_tap, srcs=(p_take, Const(t, _S32), p_tap))
            if valid is not None:  # windows entirely in the padding pick nothing
                ctx.emit(VpuMap, fn="select", dst=p_tap, srcs=(p_have, p_tap, Const(-1, _S32)))
            steps = (
                FusedOp("compare", _PRED, (1, 3), direction="EQ"),
                FusedOp("select", rows.etype, (5, 2, 4)),
                FusedOp(self.fn, rows.etype, (0, 6)),
            )
            for t, win in enumerate(windows):
                dst = MemRef(acc.space, acc.address, acc.shape, win)
                ctx.emit(VpuFused, dst=dst, srcs=(dst, p_tap, src, Const(t, _S32), self.identity), ops=steps)
            size = [hi - lo for lo, hi in result]
            if min(size) > 0:  # (a block whose windows all lie in the padding owns no part of the result)
                results.finish(slot, st.extent, size, [lo - s for (lo, _), s in zip(result, st.lo)])

        def store(i: int, slot: int, sem: int) -> int:
            _, st, result = plans[i]
            size = [hi - lo for lo, hi in result]
            if min(size) == 0:
                return 0
            local = [lo - s for (lo, _), s in zip(result, st.lo)]
            return results.store(slot, sem, st.extent, [lo for lo, _ in result], size, local)

        run_blocks(ctx, len(blocks), load, compute, store)


def _window_dims(axes: Sequence[Axis], counts: Sequence[int]) -> list[int]:
    """The dims of one tap's window over ``counts`` outputs, as :func:`tap_window` makes them."""
    dims: list[int] = []
    for axis, n in zip(axes, counts):
        dims += [n, 1] if axis.split else [n]
    return dims
