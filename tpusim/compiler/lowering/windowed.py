"""reduce-window on the VPU, and the window geometry it shares with convolution (:mod:`.conv`).

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

reduce-window: per output block, per phase, one VPU instruction per tap combines the tap's window of the
staging block into an accumulator block viewed with the same per-axis splits (``vpu.copy`` for the first
tap, ``vpu.FN`` after). Sums and products of bf16/f16 accumulate in f32 (``vpu.fused`` convert+add) and
round once, as the reference does. Blocks are double-buffered: block k+1's input loads while block k
computes, and block k's result is written out while k+1 computes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product
from math import gcd, prod

import numpy as np

from tpusim.compiler.hlo.ir import Computation, Instruction, WindowDim
from tpusim.compiler.lowering.context import Lowering, VmemExhausted
from tpusim.compiler.lowering.elementwise import combiner
from tpusim.compiler.lowering.registry import NotLowerable, lowering
from tpusim.isa import Const, DmaStart, FusedOp, MemRef, SemWait, VpuBroadcast, VpuCopy, VpuFused, VpuMap, Window
from tpusim.memory import ElementType, Layout, Shape, Tile, element_type

__all__ = [
    "MAX_TAPS",
    "Axis",
    "Rows",
    "Span",
    "Stage",
    "block_sizes",
    "lower_reduce_window",
    "run_blocks",
    "spans",
    "stage",
]

MAX_TAPS = 256
"""Most window taps reduce-window lowers (one VPU instruction per tap and block): larger windows, such as the
cumulative sums JAX writes as reduce-window over the whole axis, run as fallbacks."""

_BLOCK_BYTES = 1 << 18
"""Largest output block reduce-window aims for (big enough to amortise DMA set-up, small enough to pipeline)."""


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


# ---------------------------------------------------------------------------------------------------------
# reduce-window
# ---------------------------------------------------------------------------------------------------------
_NARROW = ("bf16", "f16")
_F32 = element_type("f32")


def _identity(fn: str, et: ElementType) -> float | int | bool | None:
    """The value that combining with changes nothing, or None."""
    if et.name == "pred":
        return {"and": True, "or": False, "xor": False, "maximum": False, "minimum": True}.get(fn)
    if et.is_float:
        return {"add": 0.0, "multiply": 1.0, "maximum": float("-inf"), "minimum": float("inf")}.get(fn)
    info = np.iinfo(et.dtype)
    table: dict[str, int] = {"add": 0, "multiply": 1, "maximum": int(info.min), "minimum": int(info.max)}
    table |= {"or": 0, "xor": 0, "and": -1 if et.kind == "signed" else int(info.max)}
    return table.get(fn)


def _constant(comp: Computation, name: str) -> Const | None:
    instr = comp[name]
    if instr.opcode != "constant" or not isinstance(instr.shape, Shape) or instr.shape.rank != 0:
        return None
    et = instr.shape.element_type
    value = np.asarray(instr.attr("literal").value).reshape(())
    if et.is_float:
        return Const(float(value), et)
    return Const(bool(value) if et.name == "pred" else int(value), et)


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
    init = _constant(comp, instr.operands[1])
    if init is None:
        raise NotLowerable("a reduce-window whose init value is not a constant")
    src = ctx.hbm(comp.name, instr.operands[0])
    out = ctx.hbm(comp.name, instr.name)
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
    taps = prod(a.taps for a in axes)
    if taps > MAX_TAPS:
        raise NotLowerable(
            f"a window of {taps} taps (more than {MAX_TAPS}, e.g. a cumulative sum): one VPU instruction per tap "
            f"and block would not be proportional to the data"
        )
    identity = _identity(fn, et)
    is_identity = identity is not None and Const(identity, et) == init
    if any(a.phases > 1 for a in axes) and not is_identity:
        raise NotLowerable("base dilation with an init value that is not the identity of the reduction")
    _ReduceWindow(ctx, axes, src, out, fn, init, is_identity).lower()


@dataclass
class _ReduceWindow:
    ctx: Lowering
    axes_hbm: list[Axis]  # per operand dimension
    src: MemRef
    out: MemRef
    fn: str
    init: Const
    init_is_identity: bool

    def lower(self) -> None:
        ctx, src = self.ctx, self.src
        self.order, tiled = canonical_order(src.shape, self.axes_hbm)
        self.axes = [self.axes_hbm[d] for d in self.order]
        et = src.element_type
        esize = ctx.rules.layout_for(Shape(et, (8, 8))).element_size_bits
        lanes = ctx.config.vpu.lanes
        self.rows = Rows(et, lanes, esize, tiled)
        wide = self.fn in ("add", "multiply") and et.name in _NARROW
        self.acc_rows = Rows(_F32, lanes, 0, tiled) if wide else self.rows
        self.acc_init = Const(float(self.init.value), _F32) if wide else self.init
        cap = max(1, min(_BLOCK_BYTES, ctx.vmem_free_bytes() // 8) // max(1, et.bits // 8))
        mark, vmem_mark = ctx.checkpoint(), ctx.scope.vmem_next
        while True:
            try:
                self._emit(cap)
                return
            except VmemExhausted:
                ctx.rollback(mark)
                ctx.scope.vmem_next = vmem_mark
                if cap == 1:
                    raise NotLowerable("its blocks do not fit in VMEM") from None
                cap = max(1, cap // 2)

    def _emit(self, cap: int) -> None:
        ctx, axes, rows, acc_rows = self.ctx, self.axes, self.rows, self.acc_rows
        sizes = block_sizes(axes, cap)
        blocks = list(product(*(spans(a, b) for a, b in zip(axes, sizes))))
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
            return inbound.load(slot, sem, first, size, local, st.extent, self.init if st.fill else None)

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
            if not self.init_is_identity:
                whole = acc_rows.ref(target, extent)
                ctx.emit(VpuMap, fn=self.fn, dst=whole, srcs=(whole, self.acc_init))
            outbound.finish(slot, extent, [s.size for s in block])

        def store(i: int, slot: int, sem: int) -> int:
            block = blocks[i]
            extent = [out_extent(a, s.size) for a, s in zip(axes, block)]
            return outbound.store(slot, sem, extent, [s.start for s in block], [s.size for s in block])

        run_blocks(ctx, len(blocks), load, compute, store)

    def _combine(self, dst: MemRef, win: MemRef, first: bool) -> None:
        ctx = self.ctx
        if self.acc_rows is not self.rows:  # narrow floats: accumulate in f32, round once at the end
            if first:
                ctx.emit(VpuMap, fn="convert", dst=dst, srcs=(win,))
            else:
                steps = (FusedOp("convert", _F32, (1,)), FusedOp(self.fn, _F32, (0, 2)))
                ctx.emit(VpuFused, dst=dst, srcs=(dst, win), ops=steps)
        elif first:
            ctx.emit(VpuCopy, dst=dst, src=win)
        else:
            ctx.emit(VpuMap, fn=self.fn, dst=dst, srcs=(dst, win))


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
    init = _constant(comp, instr.operands[2])
    operand, source = ctx.hbm(comp.name, instr.operands[0]), ctx.hbm(comp.name, instr.operands[1])
    out = ctx.hbm(comp.name, instr.name)
    et = operand.element_type
    identity = _identity(fn, et) if fn is not None else None
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
        cap = max(1, min(_BLOCK_BYTES, ctx.vmem_free_bytes() // 16) // max(1, et.bits // 8))
        mark, vmem_mark = ctx.checkpoint(), ctx.scope.vmem_next
        while True:
            try:
                self._emit(cap)
                return
            except VmemExhausted:
                ctx.rollback(mark)
                ctx.scope.vmem_next = vmem_mark
                if cap == 1:
                    raise NotLowerable("its blocks do not fit in VMEM") from None
                cap = max(1, cap // 2)

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
        kernel = list(product(*(range(a.taps) for a in axes)))

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
                    steps = (
                        FusedOp("not", _PRED, (0,)),
                        FusedOp("not", _PRED, (1,)),
                        FusedOp("or", _PRED, (3, 4)),
                        FusedOp("and", _PRED, (2, 5)),
                    )
                    ctx.emit(VpuFused, dst=p_take, srcs=(p_take, p_have, ok), ops=steps)
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
            results.finish(slot, st.extent, size, [lo - s for (lo, _), s in zip(result, st.lo)])

        def store(i: int, slot: int, sem: int) -> int:
            _, st, result = plans[i]
            size = [hi - lo for lo, hi in result]
            local = [lo - s for (lo, _), s in zip(result, st.lo)]
            return results.store(slot, sem, st.extent, [lo for lo, _ in result], size, local)

        run_blocks(ctx, len(blocks), load, compute, store)


def _window_dims(axes: Sequence[Axis], counts: Sequence[int]) -> list[int]:
    """The dims of one tap's window over ``counts`` outputs, as :func:`tap_window` makes them."""
    dims: list[int] = []
    for axis, n in zip(axes, counts):
        dims += [n, 1] if axis.split else [n]
    return dims
