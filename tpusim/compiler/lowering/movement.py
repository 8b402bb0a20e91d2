"""Data movement outside fusions as DMAs: dynamic-slice, dynamic-update-slice, copy, bitcast, reverse, and
slice / concatenate / pad where a DMA beats a VMEM round trip.

Every rule here moves bytes HBM to HBM with ``dma.start`` (the DMA engine relayouts between the two
layouts); only ``pad`` touches VMEM, to build a block of the padding value once. The rules and the choice
between a DMA and the vector path (:func:`tpusim.compiler.lowering.vector.lower_vector`, which loads
blocks into VMEM, moves them with the VPU/XLU and writes them back) are documented in docs/compiler.md,
"Data movement, dot and reduce". In short: a DMA moves every byte once per HBM side and is as fast as HBM
unless its *runs* (elements contiguous in both layouts, at ``dma.runs_per_cycle``) are short; the vector
path reads and writes each byte once too, but moves whole tiles between HBM and VMEM and shuffles them
on chip. So the DMA path is taken unless its estimated run-bound time exceeds the vector path's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from math import prod

import numpy as np

from tpusim.compiler.blocks import tile_granule
from tpusim.compiler.buffer_assignment import leaf_paths
from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.lowering.context import Lowering, VmemExhausted
from tpusim.compiler.lowering.registry import NotLowerable, lowering
from tpusim.compiler.lowering.relayout import store
from tpusim.compiler.lowering.vector import lower_vector
from tpusim.compiler.lowering.views import ref_dma_cycles, static_offsets, view_shape
from tpusim.isa import (
    Const,
    DmaStart,
    MemRef,
    Operand,
    Reg,
    ScalarAlu,
    ScalarLoad,
    SemWait,
    Space,
    VpuBroadcast,
    VpuCopy,
    Window,
)
from tpusim.memory import Shape, geometry
from tpusim.memory.reinterpret import bytes_agree, untiled
from tpusim.memory.windows import window_extent

__all__ = ["MAX_DMAS", "dma_pieces", "read_indices", "scalar_operand"]

MAX_DMAS = 4096
"""Most DMAs one data-movement instruction may issue (a reverse of every lane, a stride-2 slice of a
long dimension ...); beyond that the instruction falls back rather than flood the DMA queue."""


# --------------------------------------------------------------------------------------------- helpers
def _window(ref: MemRef, offsets: tuple[int | Reg, ...], sizes: tuple[int, ...], clamp: bool = False) -> MemRef:
    if tuple(sizes) == ref.shape.dimensions and all(o == 0 for o in offsets):
        return ref
    return MemRef(ref.space, ref.address, ref.shape, Window(tuple(offsets), tuple(sizes), clamp), ref.base)


def _issue(ctx: Lowering, pairs: list[tuple[MemRef, MemRef]]) -> None:
    """DMA every ``(src, dst)`` pair on one semaphore and wait for all of them."""
    pairs = [(s, d) for s, d in pairs if prod(s.dims)]
    if not pairs:
        return
    sem = ctx.semaphore()
    for src, dst in pairs:
        ctx.emit(DmaStart, src=src, dst=dst, sem=sem)
    ctx.emit(SemWait, sem=sem, count=len(pairs))


def _same_buffer(ctx: Lowering, comp: str, a: str, b: str, path: tuple[int, ...] = ()) -> bool:
    return ctx.buffers.buffer(comp, a, path).id == ctx.buffers.buffer(comp, b, path).id


def dma_pieces(ctx: Lowering, pairs: list[tuple[MemRef, MemRef]]) -> float:
    """Estimated cycles of issuing ``pairs`` as DMAs: their HBM and run-bound data time spread over the
    engines, plus set-up per engine round and one latency."""
    cfg = ctx.config
    data = 0.0
    for src, dst in pairs:
        data += ref_dma_cycles(cfg, src, dst)
    rounds = -(-len(pairs) // cfg.dma.engines)
    return data + rounds * cfg.dma.setup_cycles + cfg.cycles(cfg.hbm.latency_ns)


def _vector_estimate(ctx: Lowering, operands: list[MemRef], result: MemRef) -> float:
    """What the vector path costs at best: every operand and the result cross HBM once in whole tiles,
    in blocks of about half a megabyte whose transfers overlap."""
    total = sum(r.shape.byte_size for r in operands) + result.shape.byte_size
    return _streamed(ctx, total, -(-result.shape.byte_size // (1 << 19)))


def _streamed(ctx: Lowering, moved: int, blocks: int) -> float:
    """Cycles of ``moved`` bytes crossing HBM once through VMEM in ``blocks`` blocks whose transfers overlap:
    the bytes at HBM's rate, a DMA set-up per block and one more, an HBM latency in and one out."""
    cfg = ctx.config
    return (
        moved / cfg.hbm_bytes_per_cycle
        + (max(1, blocks) + 1) * cfg.dma.setup_cycles
        + 2 * cfg.cycles(cfg.hbm.latency_ns)
    )


def _try(ctx: Lowering, rule: Callable[[], None]) -> bool:
    """Run ``rule``; when it declines, take back what it emitted and allocated and return False."""
    mark = ctx.checkpoint()
    try:
        rule()
        return True
    except (NotLowerable, VmemExhausted):
        ctx.rollback(mark)
        return False


def _dma_or_vector(ctx: Lowering, comp: Computation, instr: Instruction, pairs: list[tuple[MemRef, MemRef]],
                   emit_dma: Callable[[], None]) -> None:  # fmt: skip
    """Take the DMA path unless the vector path is estimated cheaper and lowers."""
    operands = [ctx.home(comp.name, o) for o in instr.operands if isinstance(comp[o].shape, Shape)]
    vector = _vector_estimate(ctx, operands, ctx.home(comp.name, instr.name))
    if dma_pieces(ctx, pairs) > vector and _try(ctx, lambda: lower_vector(ctx, comp, instr)):
        return
    emit_dma()


# --------------------------------------------------------------------------------------------- scalars
def read_indices(ctx: Lowering, comp: Computation, names: tuple[str, ...]) -> list[int | Reg]:
    """Start indices of a dynamic-slice or dynamic-update-slice: constants as immediates, the others loaded
    into scalar registers with ``s.load`` (from their SMEM word, or after one DMA each from HBM to SMEM on
    one semaphore).

    Unsigned 32-bit indices at or above 2^31 load as negative numbers; they are raised to 2^31-1 so the
    window clamp puts them at the end of the dimension, as XLA reads unsigned indices.
    """
    out: list[int | Reg] = [0] * len(names)
    loads: list[tuple[int, MemRef]] = []
    for i, name in enumerate(names):
        instr = comp[name]
        et = instr.array_shape.element_type
        if et.bits > 32 or et.is_float:
            raise NotLowerable(f"a {et} start index (scalar registers hold 32-bit integers)")
        if instr.opcode == "constant":
            value = int(np.asarray(instr.attr("literal").value).reshape(()))
            out[i] = max(0, min(value, (1 << 31) - 1))
        else:
            loads.append((i, ctx.home(comp.name, name)))
    if not loads:
        return out
    far = [src for _, src in loads if src.space is not Space.SMEM]  # indices not already in SMEM words
    sem = ctx.semaphore() if far else None
    slots = []
    for _, src in loads:
        if src.space is Space.SMEM:
            slots.append(src)
            continue
        slots.append(ctx.smem(Shape(src.element_type, ())))
        ctx.emit(DmaStart, src=src, dst=slots[-1], sem=sem, control=True)
    if sem is not None:
        ctx.emit(SemWait, sem=sem, count=len(far), control=True)
    for (i, src), slot in zip(loads, slots):
        reg = ctx.register()
        ctx.emit(ScalarLoad, dst=reg, src=slot, control=True)
        if src.element_type.name == "u32":
            high = ctx.register()
            ctx.emit(ScalarAlu, fn="sra", dst=high, a=reg, b=31, control=True)
            ctx.emit(ScalarAlu, fn="shr", dst=high, a=high, b=1, control=True)
            ctx.emit(ScalarAlu, fn="max", dst=reg, a=reg, b=high, control=True)
            ctx.release_register(high)
        out[i] = reg
    return out


def _static_clamp(offsets: list[int | Reg], sizes: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int | Reg, ...]:
    return tuple(o if isinstance(o, Reg) else min(o, d - s) for o, s, d in zip(offsets, sizes, dims))


def scalar_operand(ctx: Lowering, comp: Computation, name: str) -> Operand:
    """A scalar HLO value as a VPU operand: a constant as :class:`Const`, anything else loaded into a VMEM
    scalar (one DMA)."""
    instr = comp[name]
    et = instr.array_shape.element_type
    if instr.opcode == "constant" and not et.is_complex and et.dtype is not None:
        value = np.asarray(instr.attr("literal").value).reshape(())
        return Const(float(value) if et.is_float else bool(value) if et.name == "pred" else int(value), et)
    ref = ctx.vmem(Shape(et, (), layout=ctx.rules.layout_for(Shape(et, ()))))
    _issue(ctx, [(ctx.home(comp.name, name), ref)])
    return ref


# --------------------------------------------------------------------------------------------- dynamic slices
@lowering("dynamic-slice")
def lower_dynamic_slice(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    src, dst = ctx.home(comp.name, instr.operands[0]), ctx.home(comp.name, instr.name)
    sizes = dst.shape.dimensions
    offsets = _static_clamp(read_indices(ctx, comp, instr.operands[1:]), sizes, src.shape.dimensions)
    clamp = any(isinstance(o, Reg) for o in offsets)
    _issue(ctx, [(_window(src, offsets, sizes, clamp), dst)])


@lowering("dynamic-update-slice")
def lower_dynamic_update_slice(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    operand, update = instr.operands[:2]
    dst, upd = ctx.home(comp.name, instr.name), ctx.home(comp.name, update)
    sizes = upd.shape.dimensions
    offsets = _static_clamp(read_indices(ctx, comp, instr.operands[2:]), sizes, dst.shape.dimensions)
    clamp = any(isinstance(o, Reg) for o in offsets)
    sem, started = ctx.semaphore(), 0
    if not _same_buffer(ctx, comp.name, operand, instr.name):
        # Not updated in place: the result starts as a copy of the operand (the update below writes into the
        # same buffer, so the scoreboard makes it wait for this copy).
        ctx.emit(DmaStart, src=ctx.home(comp.name, operand), dst=dst, sem=sem)
        started += 1
    if prod(sizes):  # (a KV cache with the sequence in lanes takes its new position through the vector unit)
        started += store(ctx, upd, _window(dst, offsets, sizes, clamp), sem)
    if started:
        ctx.emit(SemWait, sem=sem, count=started)


# --------------------------------------------------------------------------------------------- copy, bitcast
@lowering("copy")
def lower_copy(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    pairs = [
        (ctx.home(comp.name, instr.operands[0], path), ctx.home(comp.name, instr.name, path))
        for path, _ in leaf_paths(instr.shape)
        if not _same_buffer(ctx, comp.name, instr.operands[0], instr.name, path)
    ]
    if isinstance(instr.shape, Shape) and pairs and pairs[0][0].shape != pairs[0][1].shape:
        _dma_or_vector(ctx, comp, instr, pairs, lambda: _issue(ctx, pairs))
        return
    _issue(ctx, pairs)


@lowering("bitcast")
def lower_bitcast(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """A bitcast reinterprets bytes (XLA; tpusim.compiler.hlo.reference.movement). Its meaning is fixed by
    the layouts of the HLO text: the bytes, when the text tiled both layouts (XLA's compiled modules,
    :attr:`BufferAssignment.byte_bitcasts`); the elements in each layout's dimension order, when the tiles
    came from the tiling rules. When the assigned tiled layouts read the bytes the same way, the result is a
    byte copy (usually none: buffer assignment gives both one buffer); otherwise the data moves as the
    untiled layouts say: one relayout DMA when the two arrays have the same physical dimensions (a
    transposing bitcast), else two DMAs through an untiled HBM scratch buffer (write the source in its
    physical order, read it back as the result)."""
    src, dst = ctx.home(comp.name, instr.operands[0]), ctx.home(comp.name, instr.name)
    from_text = (comp.name, instr.name) in ctx.buffers.byte_bitcasts
    if _same_buffer(ctx, comp.name, instr.operands[0], instr.name) or _element_taken(ctx, src, dst, from_text):
        return
    agree = bytes_agree(src.shape, dst.shape)
    if agree or (from_text and src.shape.byte_size == dst.shape.byte_size):
        _issue(ctx, [(src, MemRef(dst.space, dst.address, src.shape))])  # the same bytes, byte for byte
        return
    us, ud = untiled(src.shape), untiled(dst.shape)
    if us.byte_size != ud.byte_size or geometry(us).element_bits % 8:
        raise NotLowerable(f"a bitcast from {src.shape} to {dst.shape} changes the byte size")
    gs, gd = geometry(us), geometry(ud)
    if src.element_type == dst.element_type and gs.physical_dims == gd.physical_dims:
        order = tuple(gs.physical_permutation[gd.physical_permutation.index(d)] for d in range(dst.shape.rank))
        _issue(ctx, [(MemRef(src.space, src.address, view_shape(src.shape, order)), dst)])
        return
    scratch = ctx.scratch(us)
    _issue(ctx, [(src, scratch)])
    _issue(ctx, [(MemRef(Space.HBM, scratch.address, ud), dst)])


def _element_taken(ctx: Lowering, src: MemRef, dst: MemRef, first_bytes: bool = False) -> bool:
    """The one element of ``src`` taken as the scalar ``dst`` (an SMEM word: buffer assignment's ``_to_word``):
    element 0 of any layout is its first bytes, so one DMA of them (True), not a relayout through a scratch
    buffer. With ``first_bytes`` (a bitcast whose text tiles both layouts: XLA's, meaning the bytes) ``src``
    may hold more elements: the scalar is its first bytes, element 0 (XLA:TPU's loop over a gather takes
    ``s32[1,2]{1,0:T(1,128)}`` as the ``s32[]{:T(128)}`` index of its first column)."""
    if dst.shape.rank or src.element_type != dst.element_type:
        return False
    first = first_bytes and src.shape.element_count and geometry(src.shape).prefix_bytes == 0
    if src.shape.element_count != 1 and not first:
        return False
    _issue(ctx, [(MemRef(src.space, src.address, dst.shape), dst)])
    return True


@lowering("reshape")
def lower_reshape(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """A reshape whose two tiled layouts hold the elements at the same bytes (``f32[8,128] -> f32[1,8,128]``,
    merging dimensions above the tiles) is a byte copy; otherwise the vector path (VMEM, ``vpu.reshape``),
    or when it declines, two DMAs through a row-major HBM scratch buffer."""
    src, dst = ctx.home(comp.name, instr.operands[0]), ctx.home(comp.name, instr.name)
    if _same_buffer(ctx, comp.name, instr.operands[0], instr.name) or _element_taken(ctx, src, dst):
        return
    if bytes_agree(src.shape, dst.shape, row_major=True):
        _issue(ctx, [(src, MemRef(dst.space, dst.address, src.shape))])
        return
    if _try(ctx, lambda: lower_vector(ctx, comp, instr)):
        return
    scratch = ctx.scratch(untiled(src.shape, row_major=True))
    _issue(ctx, [(src, scratch)])
    _issue(ctx, [(MemRef(Space.HBM, scratch.address, untiled(dst.shape, row_major=True)), dst)])


# --------------------------------------------------------------------------------------------- reverse
def _tiled_dims(shape: Shape) -> set[int]:
    """Logical dimensions the first tiling level cuts (tile size above 1): their elements share tiles."""
    layout = shape.effective_layout
    if not layout.tiles:
        return {layout.minor_to_major[0]} if shape.rank else set()
    tile = layout.tiles[0].dimensions
    physical = list(reversed(layout.minor_to_major))
    out = set()
    for k, size in enumerate(tile[-len(physical) :] if len(tile) > len(physical) else tile):
        at = len(physical) - min(len(tile), len(physical)) + k
        if size != 1:
            out.add(physical[at])
    return out


@lowering("reverse")
def lower_reverse(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """Reversing dimensions that no tile cuts: one HBM-to-HBM DMA per slab (slab ``i`` goes to slab
    ``n-1-i``). Reversing a tiled dimension (rows inside (8,128) tiles, lanes): slabs would share tiles, so
    blocks go through VMEM and the VPU copies each slab to its mirrored place (:func:`_reverse_in_vmem`)."""
    src, dst = ctx.home(comp.name, instr.operands[0]), ctx.home(comp.name, instr.name)
    dims = src.shape.dimensions
    rev = [d for d in instr.attr("dimensions") if dims[d] > 1]
    if not rev:
        _issue(ctx, [(src, dst)])
        return
    if not set(rev) & (_tiled_dims(src.shape) | _tiled_dims(dst.shape)):
        count = prod(dims[d] for d in rev)
        if count <= MAX_DMAS:
            _issue(ctx, _slab_pairs(src, dst, rev, (0,) * len(dims), (0,) * len(dims), dims))
            return
    _reverse_in_vmem(ctx, src, dst, rev)


def _slab_pairs(
    src: MemRef, dst: MemRef, rev: list[int], s_base: tuple[int, ...], d_base: tuple[int, ...], ext: tuple[int, ...]
) -> list[tuple[MemRef, MemRef]]:
    """Pairs moving each slab (one index of every reversed dimension) of the ``ext`` box at ``s_base`` of
    ``src`` to its mirrored place in the box at ``d_base`` of ``dst``."""
    sizes = tuple(1 if d in rev else n for d, n in enumerate(ext))
    pairs = []
    for index in itertools.product(*(range(ext[d]) for d in rev)):
        at = dict(zip(rev, index))
        s_off = tuple(b + at.get(d, 0) for d, b in enumerate(s_base))
        d_off = tuple(b + (ext[d] - 1 - at[d] if d in at else 0) for d, b in enumerate(d_base))
        pairs.append((_window(src, s_off, sizes), _window(dst, d_off, sizes)))
    return pairs


def _reverse_in_vmem(ctx: Lowering, src: MemRef, dst: MemRef, rev: list[int]) -> None:
    """The array in blocks through VMEM, each mirrored by one ``vpu.copy`` at stride -1 along the reversed
    dimensions (on the XLU when the lanes reverse) and stored at its mirrored place: a strided window of
    stride -1 (:func:`_strided_in_vmem`)."""
    spec = [(n - 1, n, -1) if d in rev else (0, n, 1) for d, n in enumerate(src.shape.dimensions)]
    _strided_in_vmem(ctx, src, dst, spec)


# --------------------------------------------------------------------------------------------- slice, concatenate
def _strided(start: int, size: int, stride: int) -> Iterator[tuple[int, int, int]]:
    """``(source offset, result offset, size)`` pieces of one dimension of a strided window."""
    if stride == 1:
        yield start, 0, size
        return
    for j in range(size):
        yield start + j * stride, j, 1


def _box_pairs(src: MemRef, dst: MemRef, spec: list[tuple[int, int, int]], dst_base: tuple[int, ...]) -> list:
    """DMA pairs moving, per dimension, ``spec[d] = (src start, size, stride)`` of ``src`` to ``dst`` at
    ``dst_base``; one DMA per index of every strided dimension."""
    per_dim = [list(_strided(start, size, stride)) for start, size, stride in spec]
    count = prod(len(p) for p in per_dim)
    if count > MAX_DMAS:
        raise NotLowerable(f"a strided window of {count} pieces (at most {MAX_DMAS} DMAs)")
    pairs = []
    for pieces in itertools.product(*per_dim):
        s_off = tuple(p[0] for p in pieces)
        d_off = tuple(b + p[1] for b, p in zip(dst_base, pieces))
        sizes = tuple(p[2] for p in pieces)
        if prod(sizes):
            pairs.append((_window(src, s_off, sizes), _window(dst, d_off, sizes)))
    return pairs


@lowering("slice")
def lower_slice(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """A window: DMAs. A stride along dimensions no tile cuts: one DMA per index (each moves whole tiles). A
    stride along a tiled dimension (rows inside (8,128) tiles, lanes): pieces would share tiles, so the
    slice gathers in VMEM (:func:`_strided_in_vmem`)."""
    src, dst = ctx.home(comp.name, instr.operands[0]), ctx.home(comp.name, instr.name)
    spec = [(s.start, n, s.stride) for s, n in zip(instr.attr("slice"), dst.shape.dimensions)]
    if all(stride == 1 for _, _, stride in spec):
        pairs = _box_pairs(src, dst, spec, (0,) * dst.shape.rank)
        _dma_or_vector(ctx, comp, instr, pairs, lambda: _issue(ctx, pairs))
        return
    strided = {d for d, (_, n, stride) in enumerate(spec) if stride != 1 and n > 1}
    try:
        pairs = _box_pairs(src, dst, spec, (0,) * dst.shape.rank)
    except NotLowerable:
        pairs = []  # (too many pieces: gather them)
    if pairs and (
        not strided & (_tiled_dims(src.shape) | _tiled_dims(dst.shape))
        or _serial_pieces(ctx, pairs) <= _gather_estimate(ctx, src, dst, spec)
    ):
        _issue(ctx, pairs)
        return
    if not _try(ctx, lambda: _strided_in_vmem(ctx, src, dst, spec)):
        if not pairs:
            raise NotLowerable(f"a strided slice of {src.shape} that fits neither VMEM nor {MAX_DMAS} DMAs")
        _issue(ctx, pairs)


def _serial_pieces(ctx: Lowering, pairs: list[tuple[MemRef, MemRef]]) -> float:
    """:func:`dma_pieces`, or, when the destination windows' byte extents overlap (rows that share tiles: the
    scoreboard orders such writes one after the other), every piece's latency and set-up in turn."""
    extents = sorted(window_extent(d.shape, static_offsets(d), tuple(d.dims)) for _, d in pairs)
    if all(a[1] <= b[0] for a, b in itertools.pairwise(extents)):
        return dma_pieces(ctx, pairs)
    cfg = ctx.config
    return dma_pieces(ctx, pairs) + len(pairs) * (cfg.dma.setup_cycles + cfg.cycles(cfg.hbm.latency_ns))


def _gather_estimate(ctx: Lowering, src: MemRef, dst: MemRef, spec: list[tuple[int, int, int]]) -> float:
    """What :func:`_strided_in_vmem` costs at best: the window the slice spans and the result cross HBM
    once, in blocks of about a megabyte whose transfers overlap."""
    spanned = Shape(src.element_type, tuple(_span(n, k) for _, n, k in spec), layout=src.shape.layout)
    moved = spanned.byte_size + dst.shape.byte_size
    return _streamed(ctx, moved, -(-spanned.byte_size // _GATHER_WINDOW_BYTES))


_GATHER_WINDOW_BYTES = 1 << 20
"""Largest input window :func:`_strided_in_vmem` reads per block: small enough that reading the next
block overlaps gathering this one, large enough to amortise DMA set-up."""


def _span(size: int, stride: int) -> int:
    """Elements a strided window of ``size`` elements covers."""
    return (size - 1) * abs(stride) + 1 if size else 0


def _strided_in_vmem(ctx: Lowering, src: MemRef, dst: MemRef, spec: list[tuple[int, int, int]]) -> None:
    """``dst`` gets every ``stride``-th element of ``src`` from ``start`` per dimension (``spec``: ``(start,
    size, stride)``; a negative stride walks back). The result in blocks (see :func:`_chunks`): the window
    of ``src`` a block spans is DMA'd into VMEM in whole runs, one strided ``vpu.copy`` gathers the block's
    elements (strided loads across rows, the XLU across lanes; as XLA:TPU's slice kernels read the window
    into VMEM), and the block is DMA'd out. Loads of block k+1 overlap the gather of block k."""
    dims, strides = dst.shape.dimensions, tuple(k for _, _, k in spec)
    # A window's load starts on a tile boundary (one that starts inside packed bf16 or int8 rows moved its
    # elements one by one): each window holds up to a tile less one more, the copy reads from inside it.
    granules = tuple(tile_granule(src.shape, d) for d in range(src.shape.rank))
    free = ctx.vmem_free_bytes()
    budget = min(free // 4, _GATHER_WINDOW_BYTES)
    while True:  # two blocks in flight, each an input window and an output block
        chunk = _chunks(dims, [src.shape], budget)  # (cut along the source's major dimensions)
        room = tuple(min(_span(c, k) + g - 1, n) for c, k, g, n in zip(chunk, strides, granules, src.shape.dimensions))
        window = Shape(src.element_type, room, layout=src.shape.layout)
        block = Shape(dst.element_type, chunk, layout=dst.shape.layout)
        if window.byte_size <= _GATHER_WINDOW_BYTES and 2 * (window.byte_size + block.byte_size) <= free:
            break
        budget //= 2  # (_chunks refuses once not even one element fits)
    corners = list(itertools.product(*(range(0, n, c) for n, c in zip(dims, chunk))))
    if len(corners) > MAX_DMAS:
        raise NotLowerable(f"a strided slice of {src.shape} in {len(corners)} blocks (at most {MAX_DMAS})")
    ins = [ctx.vmem(window) for _ in range(2)]
    outs = [ctx.vmem(block) for _ in range(2)]
    sem_in, sem_out = [ctx.semaphore(), ctx.semaphore()], [ctx.semaphore(), ctx.semaphore()]
    zero = (0,) * len(dims)

    def extent(k: int) -> tuple[int, ...]:
        return tuple(min(c, n - o) for c, n, o in zip(chunk, dims, corners[k]))

    def spans(k: int) -> tuple[int, ...]:
        return tuple(_span(e, s) for e, s in zip(extent(k), strides))

    def first(k: int) -> tuple[int, ...]:
        """Where the window block ``k`` reads starts (a negative stride walks back from ``start``: the window
        ends where its first element is)."""
        return tuple(
            start + o * stride - (w - 1 if stride < 0 else 0)
            for (start, _, stride), o, w in zip(spec, corners[k], spans(k))
        )

    def slack(k: int) -> tuple[int, ...]:
        return tuple(a % g for a, g in zip(first(k), granules))

    def load(k: int) -> None:
        at = tuple(a - x for a, x in zip(first(k), slack(k)))
        size = tuple(w + x for w, x in zip(spans(k), slack(k)))
        ctx.emit(DmaStart, src=_window(src, at, size), dst=_window(ins[k % 2], zero, size), sem=sem_in[k % 2])

    load(0)
    pending = [False, False]
    for k in range(len(corners)):
        if k + 1 < len(corners):
            load(k + 1)
        ctx.emit(SemWait, sem=sem_in[k % 2], count=1)
        if pending[k % 2]:
            ctx.emit(SemWait, sem=sem_out[k % 2], count=1)
        ext = extent(k)
        out = _window(outs[k % 2], zero, ext)
        ctx.emit(VpuCopy, dst=out, src=_window(ins[k % 2], slack(k), spans(k)), strides=strides)
        ctx.emit(DmaStart, src=out, dst=_window(dst, corners[k], ext), sem=sem_out[k % 2])
        pending[k % 2] = True
    for i in (0, 1):
        if pending[i]:
            ctx.emit(SemWait, sem=sem_out[i], count=1)


@lowering("concatenate")
def lower_concatenate(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    dst = ctx.home(comp.name, instr.name)
    axis = instr.attr("dimensions")[0]
    pairs, at = [], 0
    for operand in instr.operands:
        src = ctx.home(comp.name, operand)
        offsets = tuple(at if d == axis else 0 for d in range(dst.shape.rank))
        pairs.append((src, _window(dst, offsets, src.shape.dimensions)))
        at += src.shape.dimensions[axis]
    _dma_or_vector(ctx, comp, instr, pairs, lambda: _issue(ctx, pairs))


# --------------------------------------------------------------------------------------------- pad
def _pad_geometry(instr: Instruction, src: Shape, dst: Shape) -> tuple[list[tuple[int, int, int]], tuple[int, ...]]:
    """Where the operand lands: per dimension ``(first, count, step)``: operand elements ``first ..
    first + count - 1`` survive negative padding and sit ``step`` apart in the result, the first of them at
    position ``base``."""
    spec, base = [], []
    for p, n, size in zip(instr.attr("padding"), src.dimensions, dst.dimensions):
        step = p.interior + 1
        first = 0 if p.low >= 0 else -(p.low // step)  # the first element at a position >= 0
        last = min(n - 1, (size - 1 - p.low) // step)  # the last element at a position < size
        count = max(0, last - first + 1)
        spec.append((first, count, step))
        base.append(p.low + first * step)
    return spec, tuple(base)


def _fill_boxes(dims: tuple[int, ...], spec: list[tuple[int, int, int]], base: tuple[int, ...]) -> list:
    """Boxes ``(offsets, sizes)`` of the result not covered by the operand's bounding box (interior gaps are
    covered by a fill of the whole bounding box first, see :func:`lower_pad`)."""
    boxes = []
    # (clipped to the result: where negative padding cut every element of a dimension, its base lies beyond)
    lo = [min(b, n) for b, n in zip(base, dims)]
    hi = [min(n, b + max(0, (c - 1) * s + 1) if c else b) for n, b, (_, c, s) in zip(dims, base, spec)]
    for d in range(len(dims)):
        inner = [(lo[e], hi[e] - lo[e]) if e < d else (0, dims[e]) for e in range(len(dims))]
        for start, size in ((0, lo[d]), (hi[d], dims[d] - hi[d])):
            if size > 0:
                offsets = tuple(start if e == d else inner[e][0] for e in range(len(dims)))
                sizes = tuple(size if e == d else inner[e][1] for e in range(len(dims)))
                if prod(sizes):
                    boxes.append((offsets, sizes))
    return boxes


def _chunks(sizes: tuple[int, ...], shapes: list[Shape], budget: int) -> tuple[int, ...]:
    """Per-dimension chunk sizes of a box so one chunk takes at most ``budget`` bytes in each of ``shapes``'
    layouts: the most major physical dimensions (of the first shape) are cut first, to multiples of their
    tile size where possible.

    Raises:
        NotLowerable: not even a one-element chunk fits.
    """
    chunk = list(sizes)

    def size() -> int:
        return max(Shape(s.element_type, tuple(chunk), layout=s.layout).byte_size for s in shapes)

    for d in reversed(shapes[0].effective_layout.minor_to_major):
        if size() <= budget:
            break
        per = size() / max(chunk[d], 1)
        fit = max(1, int(budget // max(per, 1)))
        granule = max(tile_granule(s, d) for s in shapes)
        chunk[d] = fit // granule * granule if fit >= granule else fit
        while chunk[d] > 1 and size() > budget:
            chunk[d] = chunk[d] - granule if chunk[d] > granule else chunk[d] // 2
    if size() > budget:
        raise NotLowerable(f"a block of {shapes[0]} does not fit the VMEM left ({budget} bytes)")
    return tuple(chunk)


@lowering("pad")
def lower_pad(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    src, dst = ctx.home(comp.name, instr.operands[0]), ctx.home(comp.name, instr.name)
    spec, base = _pad_geometry(instr, src.shape, dst.shape)
    copies = _interior_pairs(src, dst, spec, base)
    interior = any(st > 1 and c > 1 for _, c, st in spec)
    boxes = _fill_boxes(dst.shape.dimensions, spec, base)
    if interior:  # gaps between the operand's elements: fill the operand's bounding box too
        hi = [b + max(0, (c - 1) * st + 1) for b, (_, c, st) in zip(base, spec)]
        box = tuple(h - b for h, b in zip(hi, base))
        if prod(box):  # (empty when negative padding cut every element of a dimension: all is fill)
            boxes.append((base, box))
    estimate_pairs = copies + [(MemRef(Space.VMEM, 0, dst.shape), _window(dst, o, s)) for o, s in boxes]

    def emit() -> None:
        value = scalar_operand(ctx, comp, instr.operands[1])
        budget = max(ctx.vreg_bytes, ctx.vmem_free_bytes() // max(1, len(boxes)) // 2)
        fills: list[tuple[MemRef, MemRef]] = []
        for offsets, sizes in boxes:
            chunk = _chunks(sizes, [dst.shape], budget)
            block = ctx.vmem(Shape(dst.shape.element_type, chunk, layout=dst.shape.layout))
            ctx.emit(VpuBroadcast, dst=block, src=value, dims=())
            for corner in itertools.product(*(range(0, n, c) for n, c in zip(sizes, chunk))):
                piece = tuple(min(c, n - k) for c, n, k in zip(chunk, sizes, corner))
                at = tuple(o + k for o, k in zip(offsets, corner))
                fills.append((_window(block, (0,) * len(piece), piece), _window(dst, at, piece)))
        if len(fills) > MAX_DMAS:
            raise NotLowerable(f"padding would take {len(fills)} DMAs (at most {MAX_DMAS})")
        # Fills of the bounding box go first: the operand's DMAs then write into the same bytes, so the
        # scoreboard orders them after the fill.
        _issue(ctx, fills + copies)

    if not interior:
        _dma_or_vector(ctx, comp, instr, estimate_pairs, emit)
    elif not _try(
        ctx, lambda: _interior_in_vmem(ctx, src, dst, spec, base, scalar_operand(ctx, comp, instr.operands[1]))
    ):
        emit()


def _interior_in_vmem(
    ctx: Lowering, src: MemRef, dst: MemRef, spec: list[tuple[int, int, int]], base: tuple[int, ...], value: Operand
) -> None:
    """Interior padding in VMEM, the whole result at once: the result filled with the padding value, the
    operand's surviving elements loaded in one DMA and scattered into it by one ``vpu.copy`` with
    ``dst_strides`` (strided stores; across lanes on the XLU), then one DMA out. Declined when the operand and
    the result do not fit half of the VMEM left (the per-element DMAs then place it)."""
    counts = tuple(c for _, c, _ in spec)
    moved = Shape(src.element_type, counts, layout=src.shape.layout)
    whole = Shape(dst.element_type, dst.shape.dimensions, layout=dst.shape.layout)
    if not prod(counts) or 2 * (moved.byte_size + whole.byte_size) > ctx.vmem_free_bytes():
        raise NotLowerable("interior padding whose operand and result do not fit VMEM")
    into, out = ctx.vmem(moved), ctx.vmem(whole)
    sem = ctx.semaphore()
    ctx.emit(DmaStart, src=_window(src, tuple(f for f, _, _ in spec), counts), dst=into, sem=sem)
    ctx.emit(VpuBroadcast, dst=out, src=value, dims=())
    ctx.emit(SemWait, sem=sem, count=1)
    spans = tuple((c - 1) * st + 1 for _, c, st in spec)
    ctx.emit(VpuCopy, dst=_window(out, base, spans), src=into, dst_strides=tuple(st for _, _, st in spec))
    ctx.emit(DmaStart, src=out, dst=dst, sem=sem)
    ctx.emit(SemWait, sem=sem, count=1)


def _interior_pairs(src: MemRef, dst: MemRef, spec: list[tuple[int, int, int]], base: tuple[int, ...]) -> list:
    """DMA pairs placing the operand with interior padding: one DMA per element index of every dimension
    with interior padding (consecutive operand elements there are ``step`` apart in the result)."""
    per_dim = []
    for (first, count, step), b in zip(spec, base):
        if step == 1:
            per_dim.append([(first, b, count)])
        else:
            per_dim.append([(first + j, b + j * step, 1) for j in range(count)])
    total = prod(len(p) for p in per_dim)
    if total > MAX_DMAS:
        raise NotLowerable(f"interior padding would take {total} DMAs (at most {MAX_DMAS})")
    pairs = []
    for pieces in itertools.product(*per_dim):
        sizes = tuple(p[2] for p in pieces)
        if prod(sizes):
            pairs.append(
                (_window(src, tuple(p[0] for p in pieces), sizes), _window(dst, tuple(p[1] for p in pieces), sizes))
            )
    return pairs
