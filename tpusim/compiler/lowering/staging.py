"""Window geometry and VMEM staging shared by the windowed lowerings: convolution (:mod:`.conv`), reduce-window
and select-and-scatter (:mod:`.windowed`).

Geometry (Operation Semantics, "ConvWithGeneralPadding" and "ReduceWindow"). Along one axis, output position
``o`` and tap ``k`` read position ``p = o*stride + k*rhs_dilate - pad_low`` of the base-dilated, padded
operand: input element ``p / lhs_dilate`` when that divides, else a hole. With ``g = gcd(stride,
lhs_dilate)`` the outputs fall into ``L = lhs_dilate / g`` *phases*: for ``o = q + L*a`` a tap is a hole for
every ``a`` or for none, and the input positions it reads are ``start(q, k) + a*(stride / g)``, an
arithmetic progression. Without base dilation there is one phase and every tap is valid.

Staging: an output block's input region (padding included) is DMA'd into a VMEM *staging block* whose axes
are all major: only the last (lane) axis is tiled, ``T(lanes)``, the others are laid out row-major above
it. Viewing a major axis of extent ``E`` as ``[E/step, step]`` therefore moves no byte, and the positions a
tap reads for every output of a phase form one rectangular window of that view (offset ``rel // step``,
phase ``rel % step``, size ``(n, 1)``). Strides, dilations, padding and phases cost no data movement beyond
the DMA; padding that a window reads is a pre-filled region of the staging block (zero for convolution,
the init value for reduce-window).

Transfers (:class:`Inbound`, :class:`Outbound`): a block moves between HBM and its staging array by one DMA
when the DMA can copy whole rows (the lane axis is the operand's minor dimension and its tiles do not
interleave rows, as bf16 ``(8,128)(2,1)`` does); otherwise it lands in a VMEM block in the operand's own
layout and changes layout on chip (``vpu.copy``, on the cross-lane unit when the lane dimension moves),
which costs far less than a DMA moving one element per run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import gcd

from tpusim.compiler.hlo.ir import WindowDim
from tpusim.compiler.lowering.context import Lowering
from tpusim.isa import Const, DmaStart, MemRef, SemWait, VpuBroadcast, VpuCopy, VpuMap, Window
from tpusim.memory import ElementType, Layout, Shape, Tile

__all__ = [
    "Axis",
    "Inbound",
    "Outbound",
    "Rows",
    "Span",
    "Stage",
    "block_sizes",
    "hbm_window",
    "is_direct",
    "landing",
    "out_extent",
    "phase_window",
    "run_blocks",
    "spans",
    "stage",
    "tap_window",
    "to_logical",
]


@dataclass(frozen=True, slots=True)
class Axis:
    """One windowed axis of an operand.

    Attributes:
        out: output positions.
        size: input positions.
        taps: window size (kernel taps).
        stride, dilate, base: window stride, window (rhs) dilation and base (lhs) dilation.
        pad: low padding (negative crops).
        reverse: the kernel is read backwards along this axis (convolution's window reversal).
    """

    out: int
    size: int
    taps: int = 1
    stride: int = 1
    dilate: int = 1
    base: int = 1
    pad: int = 0
    reverse: bool = False

    @staticmethod
    def of(dim: WindowDim, size: int, out: int) -> Axis:
        return Axis(out, size, dim.size, dim.stride, dim.rhs_dilate, dim.lhs_dilate, dim.pad_low, dim.reversal)

    @property
    def phases(self) -> int:
        """``L``: output positions ``q, q+L, q+2L, ...`` see the same taps."""
        return self.base // gcd(self.stride, self.base)

    @property
    def step(self) -> int:
        """Input positions between consecutive outputs of one phase."""
        return self.stride // gcd(self.stride, self.base)

    @property
    def split(self) -> bool:
        """Windows along this axis need the ``[n/step, step]`` view (a stride or phases)."""
        return self.phases > 1 or self.step > 1

    def start(self, q: int, kappa: int) -> int | None:
        """Input position read by output ``q`` (phase ``q``, ``a = 0``) at kernel tap ``kappa`` (storage order;
        reversed axes read tap ``taps-1-kappa``), or None when the tap falls in a hole of phase ``q``."""
        k = self.taps - 1 - kappa if self.reverse else kappa
        p = q * self.stride + k * self.dilate - self.pad
        return p // self.base if p % self.base == 0 else None

    def valid(self, q: int) -> tuple[int, ...]:
        """Taps that read input (not holes) in phase ``q``."""
        return tuple(k for k in range(self.taps) if self.start(q, k) is not None)

    def count(self, span: int, q: int) -> int:
        """Outputs of phase ``q`` in a block of ``span`` positions starting at a multiple of ``phases``."""
        return max(0, -(-(span - q) // self.phases))


@dataclass(frozen=True, slots=True)
class Span:
    """A range of output positions along one axis (``start`` is a multiple of the axis' phase count)."""

    start: int
    size: int


def spans(axis: Axis, block: int) -> list[Span]:
    """The blocks of ``block`` positions covering ``axis.out``."""
    return [Span(s, min(block, axis.out - s)) for s in range(0, axis.out, block)]


def block_sizes(axes: Sequence[Axis], cap: int) -> list[int]:
    """Block sizes (in output positions) per axis: the innermost axes whole while at most ``cap`` outputs of one
    phase fit, the next one cut, the outer ones one phase period each."""
    sizes = [min(a.out, a.phases) for a in axes]
    rows = 1
    for j in reversed(range(len(axes))):
        a = axes[j]
        positions = -(-a.out // a.phases)
        take = min(positions, max(1, cap // rows))
        sizes[j] = a.out if take == positions else take * a.phases
        rows *= take
        if take < positions:
            break
    return sizes


@dataclass(frozen=True, slots=True)
class Stage:
    """Where one output block's input sits in its staging block.

    Attributes:
        lo: per axis, the input position of the staging block's first element (negative in the padding).
        extent: per axis, the staging extent (a multiple of the step on split axes).
        data: per axis, ``[first, end)`` of the real input inside it (empty when the block reads only padding).
        fill: part of what the windows read is padding (the staging block must be pre-filled).
    """

    lo: tuple[int, ...]
    extent: tuple[int, ...]
    data: tuple[tuple[int, int], ...]
    fill: bool

    @property
    def empty(self) -> bool:
        return any(b <= a for a, b in self.data)


def stage(axes: Sequence[Axis], block: Sequence[Span]) -> Stage:
    """The input region every tap of every phase of ``block`` reads."""
    lo_, ext, data = [], [], []
    fill = False
    for axis, span in zip(axes, block):
        a0 = span.start // axis.phases
        lo = hi = None
        for q in range(axis.phases):
            n = axis.count(span.size, q)
            for s in (axis.start(q, k) for k in range(axis.taps)) if n else ():
                if s is None:
                    continue
                first, end = a0 * axis.step + s, a0 * axis.step + s + (n - 1) * axis.step + 1
                lo, hi = (first, end) if lo is None or hi is None else (min(lo, first), max(hi, end))
        if lo is None or hi is None:  # no tap reads this axis (every phase is a hole): nothing to stage
            lo, hi = 0, 1
        extent = hi - lo
        if axis.split:
            extent = -(-extent // axis.step) * axis.step
        fill = fill or lo < 0 or hi > axis.size
        lo_.append(lo)
        ext.append(extent)
        data.append((max(lo, 0), min(hi, axis.size)))
    return Stage(tuple(lo_), tuple(ext), tuple(data), fill)


@dataclass(frozen=True, slots=True)
class Rows:
    """The VMEM arrays a windowed lowering makes: row-major above a lane axis tiled ``T(lanes)`` (or untiled),
    so every axis but the lane axis can be split or merged without moving bytes."""

    etype: ElementType
    lanes: int
    element_size_bits: int = 0
    tiled: bool = True

    def shape(self, dims: Sequence[int], order: Sequence[int] | None = None) -> Shape:
        """An array of ``dims`` whose physical order (major to minor) is ``order`` (default: ``dims``' own)."""
        order = tuple(order) if order is not None else tuple(range(len(dims)))
        tiles = (Tile((self.lanes,)),) if self.tiled else ()
        layout = Layout(tuple(reversed(order)), tiles=tiles, element_size_bits=self.element_size_bits)
        return Shape(self.etype, tuple(dims), layout=layout)

    def ref(self, at: MemRef, dims: Sequence[int], window: Window | None = None) -> MemRef:
        """The array ``dims`` (canonical order) at ``at``'s address."""
        return MemRef(at.space, at.address, self.shape(dims), window)

    def permuted(self, at: MemRef, dims: Sequence[int], canon_to_logical: Sequence[int]) -> MemRef:
        """The canonical array ``dims`` at ``at`` seen in another array's logical dimension order:
        canonical axis ``i`` is that array's dimension ``canon_to_logical[i]`` (same bytes, for a DMA)."""
        logical = [0] * len(dims)
        for i, d in enumerate(canon_to_logical):
            logical[d] = dims[i]
        return MemRef(at.space, at.address, self.shape(logical, canon_to_logical))

    def split_dims(self, axes: Sequence[Axis], extents: Sequence[int], per_phase: bool) -> list[int]:
        """Canonical dims with every split axis shown as ``[E/step, step]`` (``per_phase``: ``[E/L, L]``)."""
        dims: list[int] = []
        for axis, e in zip(axes, extents):
            if axis.split:
                k = axis.phases if per_phase else axis.step
                dims += [e // k, k]
            else:
                dims.append(e)
        return dims


def tap_window(axes: Sequence[Axis], st: Stage, block: Sequence[Span], q: Sequence[int], taps: Sequence[int]) -> Window:
    """The window of the staging block's split view (:meth:`Rows.split_dims` with ``per_phase=False``) that tap
    ``taps`` reads for every output of phase ``q`` of ``block``."""
    offsets: list[int] = []
    sizes: list[int] = []
    for axis, span, lo, qj, kappa in zip(axes, block, st.lo, q, taps):
        start = axis.start(qj, kappa)
        assert start is not None
        rel = (span.start // axis.phases) * axis.step + start - lo
        n = axis.count(span.size, qj)
        if axis.split:
            offsets += [rel // axis.step, rel % axis.step]
            sizes += [n, 1]
        else:
            offsets.append(rel)
            sizes.append(n)
    return Window(tuple(offsets), tuple(sizes))


def phase_window(axes: Sequence[Axis], q: Sequence[int], block: Sequence[Span]) -> Window:
    """The outputs of phase ``q`` of ``block`` in the output block's split view (``per_phase=True``)."""
    offsets: list[int] = []
    sizes: list[int] = []
    for axis, qj, span in zip(axes, q, block):
        n = axis.count(span.size, qj)
        if axis.split:
            offsets += [0, qj]
            sizes += [n, 1]
        else:
            offsets.append(0)
            sizes.append(n)
    return Window(tuple(offsets), tuple(sizes))


def out_extent(axis: Axis, size: int) -> int:
    """An output block's extent along ``axis``: ``size`` rounded up to whole phase periods."""
    return -(-size // axis.phases) * axis.phases


def run_blocks(
    ctx: Lowering,
    count: int,
    load: Callable[[int, int, int], int],
    compute: Callable[[int, int], None],
    store: Callable[[int, int, int], int],
) -> None:
    """A software pipeline over ``count`` blocks with two buffer slots: block i+1's inputs load while block i
    computes, and block i's results leave while block i+1 computes.

    Args:
        ctx: the lowering.
        count: number of blocks.
        load: ``load(i, slot, sem)`` issues block i's input DMAs into ``slot`` and returns how many.
        compute: ``compute(i, slot)`` emits block i's work (its output goes to ``slot``).
        store: ``store(i, slot, sem)`` issues block i's output DMAs and returns how many.
    """
    sem_in = [ctx.semaphore(), ctx.semaphore()]
    sem_out = [ctx.semaphore(), ctx.semaphore()]
    loaded = [0] * count
    pending = [0, 0]
    if count:
        loaded[0] = load(0, 0, sem_in[0])
    for i in range(count):
        slot = i % 2
        if i + 1 < count:
            loaded[i + 1] = load(i + 1, 1 - slot, sem_in[1 - slot])
        if loaded[i]:
            ctx.emit(SemWait, sem=sem_in[slot], count=loaded[i])
        if pending[slot]:
            ctx.emit(SemWait, sem=sem_out[slot], count=pending[slot])
            pending[slot] = 0
        compute(i, slot)
        pending[slot] += store(i, slot, sem_out[slot])
    for slot in (0, 1):
        if pending[slot]:
            ctx.emit(SemWait, sem=sem_out[slot], count=pending[slot])


def hbm_window(ref: MemRef, offsets: Sequence[int], sizes: Sequence[int]) -> MemRef:
    """``ref`` restricted to a window (the whole array when the window is the whole array)."""
    if tuple(sizes) == ref.shape.dimensions:
        return ref
    return MemRef(ref.space, ref.address, ref.shape, Window(tuple(offsets), tuple(sizes)))


def to_logical(values: Sequence[int], order: Sequence[int]) -> list[int]:
    """Per-canonical-axis ``values`` reordered into the logical order of an array whose dimension
    ``order[i]`` is canonical axis ``i``."""
    out = [0] * len(values)
    for i, d in enumerate(order):
        out[d] = values[i]
    return out


def is_direct(hbm: Shape, lane_dim: int) -> bool:
    """A DMA between ``hbm`` and a :class:`Rows` array whose lanes are ``lane_dim`` moves whole rows: the lanes
    are the operand's minor dimension and no second tiling level interleaves rows (bf16 and 8-bit tiles
    pack 2 or 4 rows per word). Otherwise blocks travel in the operand's own layout and change layout in
    VMEM (``vpu.copy``, or a cross-lane copy when the lane dimension moves)."""
    layout = hbm.effective_layout
    return bool(layout.minor_to_major) and layout.minor_to_major[0] == lane_dim and len(layout.tiles) <= 1


def landing(hbm: Shape, dims: Sequence[int]) -> Shape:
    """A VMEM block of ``dims`` (the operand's logical order) in the operand's own layout."""
    return Shape(hbm.element_type, tuple(dims), layout=hbm.layout)


class Inbound:
    """Brings blocks of an HBM operand into VMEM *staging* arrays (:class:`Rows`, canonical axis order).

    Directly by DMA when :func:`is_direct`, else through a *landing* block in the operand's own layout and an
    on-chip relayout copy. Two buffers alternate (staging when direct, landing otherwise) so the next
    block's DMA overlaps this block's work.

    Args:
        ctx: the lowering.
        hbm: the operand.
        rows: the staging arrays' element type and lane tiling.
        order: ``order[i]`` is the operand dimension of canonical axis ``i`` (the last is the lane axis).
        extent: largest staging dims (canonical order).
        data: largest data region (canonical order).
    """

    def __init__(
        self, ctx: Lowering, hbm: MemRef, rows: Rows, order: Sequence[int], extent: Sequence[int], data: Sequence[int]
    ) -> None:
        self.ctx, self.hbm, self.rows, self.order = ctx, hbm, rows, tuple(order)
        self.direct = is_direct(hbm.shape, order[-1])
        self.staging = [ctx.vmem(rows.shape(extent)) for _ in range(2 if self.direct else 1)]
        self.landing = [] if self.direct else [ctx.vmem(landing(hbm.shape, to_logical(data, order))) for _ in range(2)]
        self.pending: list[tuple[Sequence[int], Sequence[int], Sequence[int], Const | None] | None] = [None, None]

    def load(
        self,
        slot: int,
        sem: int,
        first: Sequence[int],
        size: Sequence[int],
        local: Sequence[int],
        extent: Sequence[int],
        fill: Const | None,
    ) -> int:
        """Start moving the operand window ``first``/``size`` (canonical order) towards position ``local`` of a
        staging array of ``extent``; ``fill`` pre-fills the staging array (padding). Returns DMAs issued."""
        ctx = self.ctx
        self.pending[slot] = (size, local, extent, fill)
        empty = any(n <= 0 for n in size)
        src = None if empty else hbm_window(self.hbm, to_logical(first, self.order), to_logical(size, self.order))
        if self.direct:
            if fill is not None:
                ctx.emit(VpuBroadcast, dst=self.rows.ref(self.staging[slot], extent), src=fill, dims=())
            if src is None:
                return 0
            ctx.emit(DmaStart, src=src, dst=self._window(self.staging[slot], size, local, extent), sem=sem)
            return 1
        if src is None:
            return 0
        dst = MemRef(self.landing[slot].space, self.landing[slot].address, landing(self.hbm.shape, src.dims))
        ctx.emit(DmaStart, src=src, dst=dst, sem=sem)
        return 1

    def stage(self, slot: int) -> MemRef:
        """After the DMAs of ``slot`` were waited for: the staging array holding the block (its address)."""
        if self.direct:
            return self.staging[slot]
        pending = self.pending[slot]
        assert pending is not None
        size, local, extent, fill = pending
        ctx, staging = self.ctx, self.staging[0]
        if fill is not None:
            ctx.emit(VpuBroadcast, dst=self.rows.ref(staging, extent), src=fill, dims=())
        if all(n > 0 for n in size):
            land = self.landing[slot]
            src = MemRef(land.space, land.address, landing(self.hbm.shape, to_logical(size, self.order)))
            ctx.emit(VpuCopy, dst=self._window(staging, size, local, extent), src=src)
        return staging

    def _window(self, at: MemRef, size: Sequence[int], local: Sequence[int], extent: Sequence[int]) -> MemRef:
        view = self.rows.permuted(at, extent, self.order)
        return MemRef(
            view.space,
            view.address,
            view.shape,
            Window(tuple(to_logical(local, self.order)), tuple(to_logical(size, self.order))),
        )


class Outbound:
    """Takes result blocks (:class:`Rows` arrays in canonical order, in the accumulator type) to an HBM output.

    Directly by DMA when :func:`is_direct` and the types agree; otherwise each block is first copied (and
    converted) into a block in the output's own layout and type, which the DMA then moves as is.
    """

    def __init__(self, ctx: Lowering, hbm: MemRef, rows: Rows, order: Sequence[int], extent: Sequence[int]) -> None:
        self.ctx, self.hbm, self.rows, self.order = ctx, hbm, rows, tuple(order)
        self.convert = rows.etype != hbm.element_type
        self.direct = is_direct(hbm.shape, order[-1]) and not self.convert
        self.blocks = [ctx.vmem(rows.shape(extent)) for _ in range(2)]
        self.landing = (
            [] if self.direct else [ctx.vmem(landing(hbm.shape, to_logical(extent, order))) for _ in range(2)]
        )

    def _source(
        self, slot: int, extent: Sequence[int], size: Sequence[int], local: Sequence[int] | None = None
    ) -> MemRef:
        view = self.rows.permuted(self.blocks[slot], extent, self.order)
        logical = tuple(to_logical(size, self.order))
        at = tuple(to_logical(local, self.order)) if local is not None else (0,) * len(logical)
        if logical == view.shape.dimensions:
            return view
        return MemRef(view.space, view.address, view.shape, Window(at, logical))

    def finish(self, slot: int, extent: Sequence[int], size: Sequence[int], local: Sequence[int] | None = None) -> None:
        """After a block's results are in ``blocks[slot]`` (canonical ``extent``; the part to store is ``size``
        at ``local``, default the start): relayout or convert them for the DMA."""
        if self.direct:
            return
        src = self._source(slot, extent, size, local)
        land = self.landing[slot]
        dst = MemRef(land.space, land.address, landing(self.hbm.shape, src.dims))
        if self.convert:
            self.ctx.emit(VpuMap, fn="convert", dst=dst, srcs=(src,))
        else:
            self.ctx.emit(VpuCopy, dst=dst, src=src)

    def store(
        self,
        slot: int,
        sem: int,
        extent: Sequence[int],
        first: Sequence[int],
        size: Sequence[int],
        local: Sequence[int] | None = None,
    ) -> int:
        """DMA the part ``size`` at ``local`` of block ``slot`` to the output window ``first``/``size``
        (canonical order)."""
        dst = hbm_window(self.hbm, to_logical(first, self.order), to_logical(size, self.order))
        if self.direct:
            src = self._source(slot, extent, size, local)
        else:
            land = self.landing[slot]
            src = MemRef(land.space, land.address, landing(self.hbm.shape, dst.dims))
        self.ctx.emit(DmaStart, src=src, dst=dst, sem=sem)
        return 1
