"""``convolution`` on the MXUs: an implicit-GEMM (im2col) lowering, any dim_labels, strides, padding,
dilations, window reversal, feature and batch groups.

The convolution is a sum over kernel taps of matmuls ``[output positions, input features] @ [input
features, output features]``. Its output is cut into blocks of output positions (batch and spatial axes,
innermost whole, at most what the MXU result buffers hold); for each block:

1. The input region the block reads, padding included, is DMA'd into a VMEM *staging block* laid out
   ``[batch, spatial..., features]`` whatever the operand's layout (the DMA relayouts). Only the feature axis
   is tiled, so each axis can be viewed split ``[n/step, step]`` for free, and the positions one tap reads
   for the whole block are one window of that view (see :mod:`.staging`). Padding is a zero-filled region.
2. For each chunk of the contraction ``(tap, feature)``, one VPU instruction per tap copies the tap's window
   into a VMEM *LHS block* ``[M, Kc]`` (rows: the block's output positions; columns: consecutive taps'
   features side by side, so small feature counts fill the MXU's K). Three LHS blocks rotate, so the VPU
   builds the next chunks while the MXUs stream (and drain) this one.
3. Each ``rows x cols`` weight tile of the kernel (staged once per group in VMEM as ``[taps * features, out
   features]``, the next group's while this one runs) is latched and the LHS rows stream through,
   accumulating all chunks in the MXU result buffer. Output feature tiles go to different MXUs; when there
   are fewer tiles than MXUs, the rows are split across them.
4. The results are popped into a 2-D VMEM block, moved into the output block and DMA'd to the output in its
   layout. The next block's first LHS chunk is emitted before these pops, so the VPU builds it while the
   MXUs drain.

Base (lhs) dilation: outputs ``o = q + L*a`` of one *phase* ``q`` see a fixed subset of taps (the others
land in holes), so each phase is its own matmul with only its taps (and a packed copy of their kernel
rows); its results are scattered into the output block through a strided view. Nothing is computed for
holes. Feature groups: each group is a convolution of its own channels, or, when the groups are small,
several groups share one MXU pass through a block-diagonal kernel (depthwise convolutions: up to ``rows``
channels per pass). Batch groups (weight gradients of grouped convolutions): one convolution per group.

Precision follows dot (:func:`.dot.matmul_precision`): bf16 one pass, f32 per precision_config and the
``matmul_precision`` option; int8 operands accumulate in s32.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise, product
from math import ceil, prod

from tpusim.compiler.dot_dims import convolution_dims
from tpusim.compiler.hlo.ir import Computation, ConvDims, Instruction
from tpusim.compiler.hlo.ir import Window as HloWindow
from tpusim.compiler.lowering.context import Lowering, VmemExhausted
from tpusim.compiler.lowering.conv_vpu import lower_filter_gradient
from tpusim.compiler.lowering.dot import emit_taking_prologue, matmul_precision
from tpusim.compiler.lowering.registry import NotLowerable, lowering
from tpusim.compiler.lowering.staging import (
    Axis,
    Inbound,
    Outbound,
    Rows,
    Span,
    Stage,
    block_sizes,
    hbm_window,
    is_direct,
    landing,
    out_extent,
    phase_window,
    spans,
    stage,
    tap_window,
    to_logical,
)
from tpusim.isa import (
    Const,
    DmaStart,
    MemRef,
    MxuLoadWeights,
    MxuMatmul,
    MxuPop,
    SemWait,
    VpuBroadcast,
    VpuCopy,
    VpuReshape,
    Window,
)
from tpusim.memory import ElementType, Layout, Shape, Tile, element_type

__all__ = ["lower_convolution"]

_ACCUMULATOR = {"bf16": "f32", "f32": "f32", "s8": "s32", "u8": "s32"}
"""Operand types the MXU multiplies (f16 is not: one MXU pass would round it to bf16) -> accumulator type."""


@dataclass(frozen=True, slots=True)
class _Chunk:
    """A part of the convolution that runs as one dense convolution.

    Attributes:
        cin0, cin: the input features it reads (the contraction per tap).
        batch0: its first input batch element (batch groups).
        co0, co: the kernel output features it uses, which are also the output features it writes.
        diag: 0, or the number of feature groups packed into a block-diagonal kernel.
        ci: the kernel's input features per group (the kernel rows of one group and tap).
    """

    cin0: int
    cin: int
    batch0: int
    co0: int
    co: int
    diag: int
    ci: int


@dataclass(frozen=True)
class _Conv:
    """The convolution's geometry in canonical order: the spatial dimensions in order, with the batch first or,
    where the input's or the output's layout puts the batch below every spatial dimension (XLA:TPU's
    ``{3,0,2,1}`` for NHWC: the batch in the sublanes of each tile), last.

    Attributes:
        axes: per canonical axis, its window geometry (the batch axis has one tap).
        batch: the canonical position of the batch axis (0 or the last).
        in_dims, out_dims: per canonical axis and then the feature, the input's / output's dimension number.
        k_dims: per spatial axis, then input and output feature, the kernel's dimension number.
        chunks: the dense convolutions it is made of.
    """

    axes: tuple[Axis, ...]
    batch: int
    in_dims: tuple[int, ...]
    out_dims: tuple[int, ...]
    k_dims: tuple[int, ...]
    chunks: tuple[_Chunk, ...]

    @property
    def spatial(self) -> tuple[Axis, ...]:
        return tuple(a for i, a in enumerate(self.axes) if i != self.batch)

    @property
    def taps(self) -> tuple[int, ...]:
        return tuple(a.taps for a in self.spatial)

    def with_batch(self, spatial: Sequence[int], batch: int) -> tuple[int, ...]:
        """Per canonical axis: ``spatial`` values with ``batch`` at the batch axis."""
        out = list(spatial)
        out.insert(self.batch, batch)
        return tuple(out)


def _parse(instr: Instruction, lhs: Shape, rhs: Shape, out: Shape, rows: int, cols: int) -> _Conv:
    """The geometry of ``instr`` and its chunks (groups packed block-diagonally when that takes fewer MXU
    passes of a ``rows x cols`` array than one convolution per group)."""
    dn = instr.attr("dim_labels")
    if not isinstance(dn, ConvDims):
        raise NotLowerable("a convolution without dim_labels")
    window = instr.attr("window") or HloWindow(())
    n = len(dn.input_spatial)
    if len(window.dims) != n:
        raise NotLowerable(f"a window of {len(window.dims)} dimensions for {n} spatial dimensions")
    fg, bg = int(instr.attr("feature_group_count", 1)), int(instr.attr("batch_group_count", 1))
    c_in = lhs.dimensions[dn.input_feature]
    ci = rhs.dimensions[dn.kernel_input_feature]
    f_out = rhs.dimensions[dn.kernel_output_feature]
    batch_out = out.dimensions[dn.output_batch]
    axes = [Axis(out=batch_out, size=lhs.dimensions[dn.input_batch])]
    for j in range(n):
        w = window.dims[j]
        if w.size != rhs.dimensions[dn.kernel_spatial[j]]:
            raise NotLowerable(f"window size {w.size} differs from the kernel's spatial size")
        axes.append(Axis.of(w, lhs.dimensions[dn.input_spatial[j]], out.dimensions[dn.output_spatial[j]]))
    if min([c_in, ci, f_out, *(a.out for a in axes), *(a.taps for a in axes)]) <= 0:
        raise NotLowerable("an empty convolution (a zero-sized dimension)")
    groups = fg * bg
    og = f_out // groups
    chunks: list[_Chunk] = []
    if bg > 1:
        chunks = [_Chunk(0, c_in, g * batch_out, g * og, og, 0, ci) for g in range(bg)]
    elif fg > 1:
        taps = prod(a.taps for a in axes)
        gp = min(fg, rows // ci, cols // og) if ci <= rows and og <= cols else 1
        per_group = fg * ceil(taps * ci / rows) * ceil(og / cols)
        packed = ceil(fg / gp) * ceil(taps * gp * ci / rows) * ceil(gp * og / cols) if gp > 1 else per_group + 1
        if packed <= per_group:
            for g0 in range(0, fg, gp):
                k = min(gp, fg - g0)
                chunks.append(_Chunk(g0 * ci, k * ci, 0, g0 * og, k * og, k, ci))
        else:
            chunks = [_Chunk(g * ci, ci, 0, g * og, og, 0, ci) for g in range(fg)]
    else:
        chunks = [_Chunk(0, c_in, 0, 0, f_out, 0, ci)]

    # Blocks cut the canonical axes from the first and keep the last ones whole: a batch the input or the
    # output stores below the spatial dimensions goes last, so a block holds whole tiles of it instead of
    # one sublane of each.
    def below(shape: Shape, batch: int, spatial: tuple[int, ...]) -> bool:
        minor = shape.effective_layout.minor_to_major
        return all(minor.index(batch) < minor.index(d) for d in spatial)

    last = n > 0 and (below(lhs, dn.input_batch, dn.input_spatial) or below(out, dn.output_batch, dn.output_spatial))
    batch = n if last else 0
    in_dims, out_dims = list(dn.input_spatial), list(dn.output_spatial)
    in_dims.insert(batch, dn.input_batch)
    out_dims.insert(batch, dn.output_batch)
    axes.insert(batch, axes.pop(0))
    return _Conv(
        axes=tuple(axes),
        batch=batch,
        in_dims=(*in_dims, dn.input_feature),
        out_dims=(*out_dims, dn.output_feature),
        k_dims=(*dn.kernel_spatial, dn.kernel_input_feature, dn.kernel_output_feature),
        chunks=tuple(chunks),
    )


@lowering("convolution")
def lower_convolution(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    lhs = ctx.home(comp.name, instr.operands[0])
    rhs = ctx.home(comp.name, instr.operands[1])
    out = ctx.home(comp.name, instr.name)
    product = convolution_dims(instr, lhs.dims, rhs.dims, out.dims)
    if product is not None:  # a matrix product written as a convolution (XLA:TPU's form of most dots)
        emit_taking_prologue(ctx, comp, instr, product, lhs, rhs, out)
        return
    if lower_filter_gradient(ctx, comp, instr, lhs, rhs, out):  # a depthwise weight gradient, on the VPU
        return
    lt, rt, ot = lhs.element_type.name, rhs.element_type.name, out.element_type
    floats = {lt, rt} <= {"bf16", "f32"}  # a bf16 operand times an f32 one: the f32 side sets the passes
    if (lt != rt and not floats) or lt not in _ACCUMULATOR:
        raise NotLowerable(f"a {lt} x {rt} convolution (the MXU multiplies bf16, f32 through bf16 passes, and int8)")
    if _ACCUMULATOR[lt] == "s32" and ot.name != "s32":
        raise NotLowerable(f"an 8-bit convolution with a {ot} result")
    if _ACCUMULATOR[lt] == "f32" and not ot.is_float:
        raise NotLowerable(f"a float convolution with a {ot} result")
    mxu = ctx.config.mxu
    conv = _parse(instr, lhs.shape, rhs.shape, out.shape, mxu.rows, mxu.cols)
    precision = matmul_precision(instr, ctx.options.matmul_precision, "f32" if floats and "f32" in (lt, rt) else lt)
    _ConvEmitter(ctx, conv, lhs, rhs, out, precision).lower()


_LHS_BUFFERS = 3
"""LHS blocks in rotation: an MXU reads its LHS until its results drain (``rows + cols - 2`` cycles after the
last row entered), so the VPU may only refill a block two chunks later without waiting."""

_PIPELINE_BLOCKS = 4
"""Blocks a convolution aims to be cut into, so that its DMAs overlap the MXU work of other blocks."""


def _plans(
    half: int, count: int, rows: int, cols: int, widest: int, total: int, load: int
) -> Iterator[tuple[int, int, int]]:
    """(row cap, LHS chunk width, output-feature chunk) to try until one fits VMEM, biggest first.

    The first row cap is what the result buffers of the MXUs a block can use hold (``half`` rows each), cut
    so that ``total`` rows make about :data:`_PIPELINE_BLOCKS` blocks (their DMAs then overlap other blocks'
    MXU work), but not below one result-buffer half (smaller blocks would only add instructions) nor below
    ``load`` rows per MXU (the cycles a weight tile takes to latch: an MXU streaming fewer rows per tile
    waits for its next tile's load). Then fewer rows, narrower LHS chunks and narrower kernel slices.
    """
    fc0 = min(widest, cols * count)
    for kc in (rows * 4, rows):
        for fc in sorted({fc0, min(fc0, cols)}, reverse=True):
            mxus = max(1, count // ceil(fc / cols))
            full = half * mxus
            cap = min(full, max(half, mxus * load, ceil(total / _PIPELINE_BLOCKS / 8) * 8))
            while True:
                yield cap, kc, fc
                if cap <= 8:
                    break
                cap = max(8, cap // 2)


class _ConvEmitter:
    """Emits one convolution (see the module docstring)."""

    def __init__(self, ctx: Lowering, conv: _Conv, lhs: MemRef, rhs: MemRef, out: MemRef, precision: str) -> None:
        self.ctx, self.conv, self.lhs, self.rhs, self.out, self.precision = ctx, conv, lhs, rhs, out, precision
        lanes = ctx.config.vpu.lanes
        et = lhs.element_type
        acc = element_type(_ACCUMULATOR[et.name])
        pop = out.element_type if out.element_type.name in ("f32", "bf16", "s32") else acc
        self.rows_in = Rows(et, lanes)
        self.rows_k = Rows(rhs.element_type, lanes)  # the kernel's rows (f32 weights for bf16 activations...)
        self.rows_pop = Rows(pop, lanes)

    def lower(self) -> None:
        ctx, mxu = self.ctx, self.ctx.config.mxu
        widest = max(c.co for c in self.conv.chunks)
        total = prod(-(-a.out // a.phases) for a in self.conv.axes)
        mark = ctx.checkpoint()
        for cap, kc, fc in _plans(
            mxu.result_buffer_rows // 2, mxu.count, mxu.rows, mxu.cols, widest, total, mxu.load_cycles
        ):
            try:
                self._emit(cap, kc, fc)
                return
            except VmemExhausted:
                ctx.rollback(mark)
        raise NotLowerable("its blocks do not fit in VMEM")

    # ------------------------------------------------------------------ planning
    def _emit(self, cap: int, kc_max: int, fc: int) -> None:
        ctx, conv = self.ctx, self.conv
        axes = conv.axes
        sizes = block_sizes(axes, cap)
        blocks = list(product(*(spans(a, b) for a, b in zip(axes, sizes))))
        stages = [stage(axes, b) for b in blocks]
        phases = list(product(*(range(a.phases) for a in axes)))
        self.phase_taps = {
            q: list(product(*(a.valid(qj) for i, (a, qj) in enumerate(zip(axes, q)) if i != conv.batch)))
            for q in phases
        }
        jobs = [
            (c, f0, min(fc, chunk.co - f0), b)
            for c, chunk in enumerate(conv.chunks)
            for f0 in range(0, chunk.co, fc)
            for b in range(len(blocks))
        ]
        # Kernel slabs to rotate: from all the jobs, so every core's share plans the same VMEM.
        kernel_slices = len({(c, f0) for c, f0, _, _ in jobs})
        # Megacore: every job writes its own output window (a block of positions, a range of features), so
        # each core takes a contiguous share of them.
        jobs = [jobs[i] for i in ctx.split(len(jobs))]
        cin_max = max(c.cin for c in conv.chunks)
        ci_max = max(c.ci for c in conv.chunks)
        f_max = min(fc, max(c.co for c in conv.chunks))
        m_max = max(prod(a.count(s.size, qj) for a, s, qj in zip(axes, b, q)) for b in blocks for q in phases)
        k_max = max(len(t) for t in self.phase_taps.values()) * cin_max
        kc = max(1, min(kc_max, k_max))
        rank = len(axes)
        stage_max = [max(s.extent[j] for s in stages) for j in range(rank)] + [cin_max]
        data_max = [max(max(1, s.data[j][1] - s.data[j][0]) for s in stages) for j in range(rank)] + [cin_max]
        out_max = [out_extent(a, b) for a, b in zip(axes, sizes)] + [f_max]
        taps = list(conv.taps)
        # VMEM: staging and output blocks double-buffered, two LHS blocks, the kernel (and packed phase kernels).
        self.inbound = Inbound(ctx, self.lhs, self.rows_in, conv.in_dims, stage_max, data_max)
        self.outbound = Outbound(ctx, self.out, self.rows_pop, conv.out_dims, out_max)
        self.lhs_tiles = ctx.rules.layout_for(Shape(self.rows_in.etype, (m_max, kc))).tiles
        self.lhs_blocks = [
            ctx.vmem(self._matrix(self.rows_in.etype, self.lhs_tiles, (m_max, kc))) for _ in range(_LHS_BUFFERS)
        ]
        # Two kernel slabs: the next chunk's kernel loads while this chunk's blocks run.
        nk = min(2, kernel_slices)
        self.kernels = [ctx.vmem(self.rows_k.shape((prod(taps) * cin_max, f_max))) for _ in range(nk)]
        # One DMA per piece when the kernel's layout lets it write the slab directly; a block-diagonal kernel
        # has one piece per group, so it lands whole (one DMA) and its pieces are placed by VPU copies.
        self.kernel_direct = is_direct(self.rhs.shape, conv.k_dims[-1]) and not any(c.diag for c in conv.chunks)
        widest_load = max(c.co if c.diag else min(fc, c.co) for c in conv.chunks)
        kernel_window = to_logical([*taps, ci_max, widest_load], conv.k_dims)
        self.kernel_landings = (
            [] if self.kernel_direct else [ctx.vmem(landing(self.rhs.shape, kernel_window)) for _ in range(nk)]
        )
        self.packed: dict[tuple[int, ...], MemRef] = {}
        for q, qtaps in self.phase_taps.items():
            if qtaps and not self._contiguous(qtaps):
                self.packed[q] = ctx.vmem(self.rows_k.shape((len(qtaps) * cin_max, f_max)))
        self.result_tiles = ctx.rules.layout_for(Shape(self.rows_pop.etype, (m_max, f_max))).tiles
        self.result = ctx.vmem(self._matrix(self.rows_pop.etype, self.result_tiles, (m_max, f_max)))
        self.kernel_sems = [ctx.semaphore() for _ in range(nk)]
        self.kernel_dmas = [0] * nk
        self.kbuf = 0
        self.kc = kc
        self.lhs_turn = 0
        self.acc_half = [0] * ctx.config.mxu.count
        # Kernel slices in the order the jobs use them; the first loads before the pipeline starts, each next
        # one as soon as the previous one is in place.
        slices: list[tuple[int, int, int]] = []
        for c, f0, fsize, _ in jobs:
            if not slices or slices[-1][:2] != (c, f0):
                slices.append((c, f0, fsize))
        fetched = [self._fetch_kernel(conv.chunks[slices[0][0]], slices[0][1], slices[0][2], 0)]
        placed = -1

        def load(i: int, slot: int, sem: int) -> int:
            c, _, _, b = jobs[i]
            chunk, st = conv.chunks[c], stages[b]
            first = [a for a, _ in st.data] + [chunk.cin0]
            first[conv.batch] += chunk.batch0
            size = [e - a for a, e in st.data] + [chunk.cin]
            local = [a - lo for (a, _), lo in zip(st.data, st.lo)] + [0]
            fill = Const(0, self.rows_in.etype) if st.fill else None
            return self.inbound.load(slot, sem, first, size, local, [*st.extent, chunk.cin], fill)

        # The pipeline. Input block i+1 loads while block i computes; and block i+1's first LHS chunk is built
        # before block i's results are popped, so the VPU never waits for an MXU to drain.
        sem_in = [ctx.semaphore(), ctx.semaphore()]
        self.sem_out = [ctx.semaphore(), ctx.semaphore()]
        self.pending_out = [0, 0]
        loaded = [0] * len(jobs)
        loaded[0] = load(0, 0, sem_in[0])
        previous: Iterator[None] | None = None
        for i, (c, f0, fsize, b) in enumerate(jobs):
            slot = i % 2
            if i + 1 < len(jobs):
                loaded[i + 1] = load(i + 1, 1 - slot, sem_in[1 - slot])
            if loaded[i]:
                ctx.emit(SemWait, sem=sem_in[slot], count=loaded[i])
            if self.pending_out[slot]:
                ctx.emit(SemWait, sem=self.sem_out[slot], count=self.pending_out[slot])
                self.pending_out[slot] = 0
            if placed < 0 or slices[placed][:2] != (c, f0):
                placed += 1
                self.kbuf = placed % len(self.kernels)
                self._place_kernel(conv.chunks[c], fsize, fetched[placed], self.kbuf)
                if placed + 1 < len(slices):
                    nc, nf0, nfs = slices[placed + 1]
                    nbuf = (placed + 1) % len(self.kernels)
                    fetched.append(self._fetch_kernel(conv.chunks[nc], nf0, nfs, nbuf))
            current = self._block(conv.chunks[c], f0, fsize, blocks[b], stages[b], slot)
            next(current, None)  # stage the input, build the first LHS chunk
            if previous is not None:
                for _ in previous:  # the previous block's last pops, its relayout and its store
                    pass
            next(current, None)  # the rest of this block's matmuls
            previous = current
        if previous is not None:
            for _ in previous:
                pass
        for slot in (0, 1):
            if self.pending_out[slot]:
                ctx.emit(SemWait, sem=self.sem_out[slot], count=self.pending_out[slot])

    @staticmethod
    def _matrix(et: ElementType, tiles: tuple[Tile, ...], dims: tuple[int, int]) -> Shape:
        """A 2-D VMEM block in the tiling rules' tiles (the LHS and result blocks the MXUs read and write)."""
        return Shape(et, dims, layout=Layout((1, 0), tiles=tiles))

    def _contiguous(self, taps: list[tuple[int, ...]]) -> bool:
        rows = self._flat(taps)
        return all(b - a == 1 for a, b in pairwise(rows))

    # ------------------------------------------------------------------ the kernel
    def _fetch_kernel(self, chunk: _Chunk, f0: int, fsize: int, buf: int) -> list[tuple[MemRef, MemRef]]:
        """Start the DMAs that stage the kernel rows ``[taps, input features, output features f0..f0+fsize]``
        of ``chunk`` in VMEM (block-diagonal for packed groups); returns the VMEM copies still to make
        (the pieces of a landing block, when the DMA cannot write the slab directly)."""
        ctx, conv, rows = self.ctx, self.conv, self.rows_k
        taps = list(conv.taps)
        n = len(taps)
        dims = [*taps, chunk.cin, fsize]
        view = rows.permuted(self.kernels[buf], dims, conv.k_dims)
        # The operand window to fetch, and where its pieces go: (offset in the window, size, offset in the slab).
        if chunk.diag:
            og = chunk.co // chunk.diag
            fetch_first, fetch_size = [0] * n + [0, chunk.co0], [*taps, chunk.ci, chunk.co]
            pieces = [
                ([0] * n + [0, g * og], [*taps, chunk.ci, og], [0] * n + [g * chunk.ci, g * og])
                for g in range(chunk.diag)
            ]
            ctx.emit(VpuBroadcast, dst=rows.ref(self.kernels[buf], dims), src=Const(0, rows.etype))
        else:
            fetch_first, fetch_size = [0] * n + [0, chunk.co0 + f0], dims
            pieces = [([0] * (n + 2), dims, [0] * (n + 2))]
        order = conv.k_dims

        def window(ref: MemRef, offset: list[int], size: list[int]) -> MemRef:
            return MemRef(
                ref.space,
                ref.address,
                ref.shape,
                Window(tuple(to_logical(offset, order)), tuple(to_logical(size, order))),
            )

        if self.kernel_direct:
            for at, size, to in pieces:
                first = [a + b for a, b in zip(fetch_first, at)]
                src = hbm_window(self.rhs, to_logical(first, order), to_logical(size, order))
                ctx.emit(DmaStart, src=src, dst=window(view, to, size), sem=self.kernel_sems[buf])
            self.kernel_dmas[buf] = len(pieces)
            return []
        src = hbm_window(self.rhs, to_logical(fetch_first, order), to_logical(fetch_size, order))
        base = self.kernel_landings[buf]
        land = MemRef(base.space, base.address, landing(self.rhs.shape, src.dims))
        ctx.emit(DmaStart, src=src, dst=land, sem=self.kernel_sems[buf])
        self.kernel_dmas[buf] = 1
        return [(window(view, to, size), window(land, at, size)) for at, size, to in pieces]

    def _place_kernel(self, chunk: _Chunk, fsize: int, copies: list[tuple[MemRef, MemRef]], buf: int) -> None:
        """Wait for the kernel's DMAs, finish staging it, and pack each phase's taps where they are not
        contiguous in the kernel."""
        ctx, rows = self.ctx, self.rows_k
        taps = list(self.conv.taps)
        ctx.emit(SemWait, sem=self.kernel_sems[buf], count=self.kernel_dmas[buf])
        for dst, src in copies:
            ctx.emit(VpuCopy, dst=dst, src=src)
        flat = rows.ref(self.kernels[buf], (prod(taps) * chunk.cin, fsize))
        for q, packed in self.packed.items():
            kernel_rows = self._flat(self.phase_taps[q])
            dst_flat = rows.ref(packed, (len(kernel_rows) * chunk.cin, fsize))
            at = 0
            for first, count in _runs(kernel_rows):
                k = count * chunk.cin
                src = MemRef(flat.space, flat.address, flat.shape, Window((first * chunk.cin, 0), (k, fsize)))
                dst = MemRef(dst_flat.space, dst_flat.address, dst_flat.shape, Window((at, 0), (k, fsize)))
                ctx.emit(VpuCopy, dst=dst, src=src)
                at += k

    # ------------------------------------------------------------------ compute
    def _flat(self, taps: list[tuple[int, ...]]) -> list[int]:
        """Row-major tap numbers (kernel storage order) of spatial tap tuples."""
        shape = self.conv.taps
        out = []
        for t in taps:
            k = 0
            for kappa, n in zip(t, shape):
                k = k * n + kappa
            out.append(k)
        return out

    def _block(
        self, chunk: _Chunk, f0: int, fsize: int, block: tuple[Span, ...], st: Stage, slot: int
    ) -> Iterator[None]:
        """Emit one output block, phase by phase, into output slot ``slot``. A generator: it pauses after the
        first LHS chunk is built and after the last matmul is issued; resuming it then pops the results,
        moves them to the output block and stores it."""
        ctx, axes, rows_pop = self.ctx, self.conv.axes, self.rows_pop
        staging = self.inbound.stage(slot)
        extent = [out_extent(a, s.size) for a, s in zip(axes, block)]
        out_block = self.outbound.blocks[slot]
        out_view = rows_pop.shape([*rows_pop.split_dims(axes, extent, per_phase=True), fsize])
        stage_view = self.rows_in.ref(staging, [*self.rows_in.split_dims(axes, st.extent, per_phase=False), chunk.cin])
        pending: list[tuple[type, dict[str, object]]] = []  # pops and moves of the last phase issued
        paused = False
        for q, taps in self.phase_taps.items():
            counts = [a.count(s.size, qj) for a, s, qj in zip(axes, block, q)]
            m = prod(counts)
            if not m:
                continue
            region = phase_window(axes, q, block)
            region = Window((*region.offsets, 0), (*region.sizes, fsize))
            phase_out = MemRef(out_block.space, out_block.address, out_view, region)
            if not taps:  # every tap of this phase lands in a hole: the outputs are zero
                ctx.emit(VpuBroadcast, dst=phase_out, src=Const(0, rows_pop.etype))
                continue
            for built in self._matmuls(chunk, fsize, block, st, q, taps, counts, stage_view, phase_out, pending):
                if built and not paused:
                    paused = True
                    yield
                elif built:
                    self._flush(pending)  # the previous phase's results, now that this phase keeps the VPU busy
        if not paused:
            yield
        yield
        self._flush(pending)
        self.outbound.finish(slot, [*extent, fsize], [*(s.size for s in block), fsize])
        first = [s.start for s in block] + [chunk.co0 + f0]
        size = [s.size for s in block] + [fsize]
        self.pending_out[slot] += self.outbound.store(slot, self.sem_out[slot], [*extent, fsize], first, size)

    def _flush(self, pending: list[tuple[type, dict[str, object]]]) -> None:
        for cls, fields in pending:
            self.ctx.emit(cls, **fields)
        pending.clear()

    def _matmuls(
        self,
        chunk: _Chunk,
        fsize: int,
        block: tuple[Span, ...],
        st: Stage,
        q: tuple[int, ...],
        taps: list[tuple[int, ...]],
        counts: list[int],
        stage_view: MemRef,
        phase_out: MemRef,
        pending: list[tuple[type, dict[str, object]]],
    ) -> Iterator[bool]:
        """One phase of one block: im2col chunks into the LHS blocks and weight tiles through the MXUs; the pops
        and the move of the results to ``phase_out`` are left in ``pending``. Yields True once the first
        chunk is built (before its matmuls), then False."""
        ctx, axes, cfg, rows_pop = self.ctx, self.conv.axes, self.ctx.config.mxu, self.rows_pop
        cin, m = chunk.cin, prod(counts)
        k_total = len(taps) * cin
        if q in self.packed:
            kernel, row0 = self.rows_k.ref(self.packed[q], (k_total, fsize)), 0
        else:
            kernel = self.rows_k.ref(self.kernels[self.kbuf], (prod(self.conv.taps) * cin, fsize))
            row0 = self._flat(taps)[0] * cin
        # Work items: output-feature tiles on different MXUs; spare MXUs take slices of the rows.
        n_tiles = [(n0, min(cfg.cols, fsize - n0)) for n0 in range(0, fsize, cfg.cols)]
        half = cfg.result_buffer_rows // 2
        parts = max(1, min(cfg.count // len(n_tiles), -(-m // 8)))
        per = min(half, ceil(ceil(m / parts) / 8) * 8)
        m_tiles = [(m0, min(per, m - m0)) for m0 in range(0, m, per)]
        items = [
            (mt, nt, (i * len(n_tiles) + j) % cfg.count) for i, mt in enumerate(m_tiles) for j, nt in enumerate(n_tiles)
        ]
        if len(items) > cfg.count:
            raise NotLowerable("internal: more work items than MXUs")
        acc = {mx: self.acc_half[mx] * half for _, _, mx in items}
        for mx in acc:
            self.acc_half[mx] ^= 1
        kc = self.kc
        for k0 in range(0, k_total, kc):
            width = min(kc, k_total - k0)
            lhs = self.lhs_blocks[self.lhs_turn]
            self.lhs_turn = (self.lhs_turn + 1) % _LHS_BUFFERS
            flat = MemRef(lhs.space, lhs.address, self._matrix(self.rows_in.etype, self.lhs_tiles, (m, kc)))
            for v in range(k0 // cin, -(-(k0 + width) // cin)):
                c_lo, c_hi = max(0, k0 - v * cin), min(cin, k0 + width - v * cin)
                win = tap_window(axes, st, block, q, self.conv.with_batch(taps[v], 0))
                src = MemRef(
                    stage_view.space,
                    stage_view.address,
                    stage_view.shape,
                    Window((*win.offsets, c_lo), (*win.sizes, c_hi - c_lo)),
                )
                # The tap's window, row-major, is rows 0..m of the LHS block at this tap's lanes.
                dst = MemRef(flat.space, flat.address, flat.shape, Window((0, v * cin + c_lo - k0), (m, c_hi - c_lo)))
                ctx.emit(VpuCopy if src.dims == dst.dims else VpuReshape, dst=dst, src=src)
            yield k0 == 0
            for kt0 in range(0, width, cfg.rows):
                kt = min(cfg.rows, width - kt0)
                for (m0, ms), (n0, ns), mx in items:
                    w = MemRef(kernel.space, kernel.address, kernel.shape, Window((row0 + k0 + kt0, n0), (kt, ns)))
                    ctx.emit(MxuLoadWeights, mxu=mx, src=w, precision=self.precision)
                    a = MemRef(flat.space, flat.address, flat.shape, Window((m0, kt0), (ms, kt)))
                    ctx.emit(MxuMatmul, mxu=mx, lhs=a, acc=acc[mx], accumulate=k0 + kt0 > 0, precision=self.precision)
        result = MemRef(
            self.result.space, self.result.address, self._matrix(rows_pop.etype, self.result_tiles, (m, fsize))
        )
        for (m0, ms), (n0, ns), mx in items:
            dst = MemRef(result.space, result.address, result.shape, Window((m0, n0), (ms, ns)))
            pending.append((MxuPop, {"mxu": mx, "dst": dst, "acc": acc[mx]}))
        pending.append((VpuReshape, {"dst": phase_out, "src": result}))


def _runs(rows: list[int]) -> Iterator[tuple[int, int]]:
    """Maximal runs of consecutive numbers: (first, length)."""
    start = prev = rows[0]
    for r in rows[1:]:
        if r != prev + 1:
            yield start, prev - start + 1
            start = r
        prev = r
    yield start, prev - start + 1
