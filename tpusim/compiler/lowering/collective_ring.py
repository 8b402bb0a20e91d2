"""Ring algorithms as real data movement: reduce-scatter and all-gather phases over one ring of chips.

A phase works on ``L`` equal *chunks* of an HBM array along dimension ``dim``: chunk ``c`` is the window
``[base + c*size, base + (c+1)*size)``. With two *pieces* per chunk (halves, along ``dim`` or, for
one-row chunks, the longest other dimension), the first piece travels the + direction of the ring and the
second the - direction: a bidirectional ring, which loads every link in both directions.

Reduce-scatter (``L - 1`` stages; a chip at ring position ``p`` ends with the sum of chunk ``p``):
stage 0 pushes chunk ``p - 1`` (+ direction; ``p + 1`` for -) of the chip's own data into slot 0 of its
neighbour; stage ``k`` waits for slot ``k - 1``, adds (on the VPU, block by block through VMEM) the
chip's own part of chunk ``p - k - 1`` and pushes the sum into slot ``k`` of the neighbour; the last
stage writes chunk ``p`` to the result instead. Slots are private to the phase (HBM scratch), so no slot
is reused and a sender never waits for its receiver. Stages ``1 .. L - 2`` are one loop in the stream.

All-gather (``L - 1`` stages): every chip owns chunk ``p`` of the array; stage 0 pushes it to the
neighbour's copy of the array; stage ``k`` forwards chunk ``p - k`` (the one that arrived last).

Positions count along the ring; a ring walked in zigzag along a line (:class:`Ring`) maps position ``q`` to
the chunk of the coordinate it visits, so "chunk ``p``" above is the chunk of that coordinate.

Ordering: a chip issues the pushes of stage ``k`` only after those of stage ``k - 1`` landed (it waits for
their local completion signal), so a receiver counting arrivals on one semaphore sees them stage by stage.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from math import ceil, lcm

from tpusim.compiler.errors import CompileError
from tpusim.compiler.lowering.collective_sync import Facts
from tpusim.compiler.lowering.context import Lowering
from tpusim.compiler.lowering.epilogue import Chain, Side
from tpusim.isa import Branch, DmaStart, MemRef, Reg, ScalarAlu, SemWait, Space, VpuFused, VpuMap, Window
from tpusim.memory import Layout, Shape, element_type

__all__ = [
    "Piece",
    "Reducer",
    "Ring",
    "RingWork",
    "all_gather_stages",
    "emit",
    "interleave",
    "locate",
    "piece_dims",
    "pieces",
    "quanta",
    "reduce_scatter_stages",
    "tile_rows",
    "window",
    "window_offsets",
    "window_start",
    "zigzag_coordinate",
]


@dataclass(frozen=True)
class Reducer:
    """How a collective combines two blocks: one VPU function (``add``, ``maximum`` ...), or an elementwise
    chain of its reduction computation (XLA:TPU packs four u8 values in a u32 word and reduces the words with
    a computation that unpacks, combines and repacks them: one ``vpu.fused``)."""

    fn: str | None = None
    chain: Chain | None = None

    def emit(self, ctx: Lowering, dst: MemRef, a: MemRef, b: MemRef) -> None:
        """``dst = reduce(a, b)``, ``a`` being the computation's first parameter."""
        if self.chain is None:
            ctx.emit(VpuMap, fn=self.fn, dst=dst, srcs=(a, b))
            return
        srcs = (a, *(b if isinstance(s, Side) else s for s in self.chain.sources))
        ctx.emit(VpuFused, dst=dst, srcs=srcs, ops=self.chain.steps)


MIN_BLOCK_BYTES = 64 * 1024
"""Smallest reduce-scatter block (bytes), so tiny chunks do not turn into many tiny transfers."""

FIRST_BLOCK_FRACTION = 32
"""The first block of a reduce-scatter stage is about this fraction of its piece; blocks then double."""

BUFFER_SETS = 4
"""VMEM block sets a reduce-scatter stage cycles through (block ``j`` loads into set ``j % 4`` while up to
three earlier blocks may still be pushed from theirs)."""


@dataclass(frozen=True, slots=True)
class Piece:
    """The part of every chunk one direction carries: ``length`` along ``dim`` from ``offset``."""

    dim: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Ring:
    """One ring of a collective as seen from this chip.

    Attributes:
        length: chips on the ring (``L``).
        pos: register holding this chip's position on the ring (stages count positions).
        coord: register holding the index of this chip's own chunk (its coordinate or rank).
        to: per direction (+1 / -1), the register holding the chip pushed to.
        arrive: per direction, the reserved semaphore data of that direction lands on.
        credit: per direction, the reserved semaphore (on this chip, the sender) the receiver of that direction
            signals when it frees a landing buffer; empty when the collective has none.
        zigzag: positions run ``0, 2, 4, .., 5, 3, 1`` along a line (no wraparound), so every ring step is
            at most two hops and each directed link carries one step; chunk of position ``q`` is the
            coordinate at ``q``. Otherwise position and chunk index are equal.
    """

    length: int
    pos: Reg
    coord: Reg
    to: dict[int, Reg]
    arrive: dict[int, int]
    zigzag: bool = False
    credit: dict[int, int] = field(default_factory=dict)


class RingWork:
    """Semaphores and registers of one phase sequence of a collective (allocated once per collective).

    Args:
        facts: the collective's per-chip registers.
        sent: the local semaphore pushes (and final writes) signal; default a fresh one (an async collective
            passes its bank's, which outlives the ``-start`` instruction).
        The two semaphores a reduce-scatter's block loads signal are fresh ones, or on the async sequencer
        two of those reserved for it.
        share: ``(j, m)``: this work is part ``j`` of ``m`` running at once (:func:`interleave`), and takes
            the ``j``-th of ``m`` equal slices of the instruction's VMEM arena.
        lead: another part's work whose scratch registers this one uses too. Scratch registers (``tmp``, the
            ring position ``at`` and ``spare``) hold a value only between its computation and the
            instruction that reads it, never across a stage or block boundary, so parts run at once share
            them; only each part's chunk starts ``cs`` are its own. Three parts of a 3-D torus then fit the
            core's scalar registers.
    """

    def __init__(
        self,
        facts: Facts,
        sent: int | None = None,
        share: tuple[int, int] = (0, 1),
        lead: RingWork | None = None,
    ) -> None:
        ctx = facts.ctx
        self.facts = facts
        self.share = share
        self.sent = sent if sent is not None else ctx.semaphore()
        if ctx.on_async:  # the async sequencer's loads (it runs one collective at a time), two per part
            j = share[0]
            self.load = list(facts.state.async_loads[2 * j : 2 * j + 2])
        else:
            self.load = [ctx.semaphore(), ctx.semaphore()]
        self._lead = lead
        self.tmp: list[Reg] = lead.tmp if lead is not None else [facts.reg(), facts.reg()]
        self.at: Reg = lead.at if lead is not None else facts.reg()
        self.cs = {1: facts.reg(), -1: facts.reg()}
        self._k: Reg | None = None
        self._spare: Reg | None = None
        self._arena: MemRef | None = None

    @property
    def k(self) -> Reg:
        """The stage counter of a phase whose middle stages are a loop (taken when first used)."""
        if self._k is None:
            self._k = self.facts.reg()
        return self._k

    @property
    def spare(self) -> Reg:
        """A scratch register: the start of a chunk's later windows (taken when first used)."""
        if self._lead is not None:
            return self._lead.spare
        if self._spare is None:
            self._spare = self.facts.reg()
        return self._spare

    def release(self) -> None:
        """Give the registers back (the semaphores stay with the instruction; a lead's scratch registers go
        back with the lead)."""
        own = [*self.cs.values(), self._k]
        if self._lead is None:
            own += [*self.tmp, self.at, self._spare]
        for r in own:
            if r is not None:
                self.facts.ctx.release_register(r)

    def arena(self) -> MemRef:
        """The VMEM every reduce-scatter phase of this HLO instruction carves its blocks from (taken once per
        instruction: the lowering context hands VMEM out per instruction and never takes it back)."""
        if self._arena is None:
            ctx, state = self.facts.ctx, self.facts.state
            held = state.arena
            if held is not None and held[0] is ctx.scope:
                self._arena = held[1]
            else:
                vreg = ctx.vreg_bytes
                n = ctx.vmem_free_bytes() // vreg * vreg
                self._arena = ctx.vmem(Shape(element_type("u8"), (max(n, vreg),), layout=Layout((0,))))
                state.arena = (ctx.scope, self._arena)
            j, m = self.share
            if m > 1:
                vreg = self.facts.ctx.vreg_bytes
                part = self._arena.shape.byte_size // m // vreg * vreg
                u8 = Shape(element_type("u8"), (max(part, vreg),), layout=Layout((0,)))
                self._arena = MemRef(Space.VMEM, self._arena.address + j * part, u8)
        return self._arena


def zigzag_coordinate(facts: Facts, q: Reg, out: Reg, length: int) -> Reg:
    """``out = 2q`` for ``q < ceil(L/2)``, else ``2(L-1-q) + 1`` (branch-free; ``out`` is not ``q``)."""
    t = facts.reg()
    facts.alu("ge", t, q, (length + 1) // 2)
    facts.alu("mul", out, q, -4)
    facts.alu("add", out, out, 2 * length - 1)
    facts.alu("mul", out, out, t)
    facts.alu("add", out, out, q)
    facts.alu("add", out, out, q)
    facts.ctx.release_register(t)
    return out


def _chunk_start(facts: Facts, ring: Ring, c: Reg, cs: Reg, base: Reg | int, stride: int) -> None:
    """``cs = base + chunk(c) * stride`` for ring position ``c``."""
    if ring.zigzag:
        zigzag_coordinate(facts, c, cs, ring.length)
        facts.alu("mul", cs, cs, stride)
    else:
        facts.alu("mul", cs, c, stride)
    if base != 0:
        facts.alu("add", cs, cs, base)


def tile_rows(dim: int, *shapes: Shape) -> int:
    """The rows along ``dim`` a window must step by to start on a tile boundary in every one of ``shapes``
    (the least common multiple of their first-level tiles' extents along ``dim``; 1 where it is untiled).
    Windows that start inside a tile share its bytes with their neighbours', so their transfers would be
    ordered as if they overlapped."""
    out = 1
    for shape in shapes:
        layout = shape.effective_layout
        if not layout.tiles:
            continue
        tile = layout.tiles[0].dimensions
        physical = list(reversed(layout.minor_to_major))
        at = physical.index(dim) - (shape.rank - len(tile))
        if at >= 0 and tile[at] > 0:
            out = lcm(out, tile[at])
    return out


def pieces(
    dims: Sequence[int], dim: int, size: int, split: bool = True, quanta: Sequence[int] | None = None,
    across: bool = True,
) -> list[Piece]:  # fmt: skip
    """The pieces of a chunk of ``size`` along ``dim`` of an array of ``dims``: two halves if it can be cut,
    else the whole chunk. Cuts fall on multiples of ``quanta[d]`` (:func:`tile_rows` of each dimension ``d``;
    default 1): of the dimensions that are whole units of at least two, the one whose halves are the most
    even (``dim`` first, then the longest; only ``dim`` unless ``across``); else along ``dim`` anywhere, else
    along the longest other dimension. Whether it is cut does not depend on ``quanta`` or ``across``.

    A reduce-scatter cuts along ``dim`` only (``across=False``): its blocks go one after another into
    one slot, and blocks of a cut across the rows would interleave their byte ranges there."""
    extent = [size if d == dim else n for d, n in enumerate(dims)]
    q = list(quanta) if quanta is not None else [1] * len(dims)
    if split:
        cuts = [
            (ceil(n // q[d] / 2) * q[d] / n, d != dim, -n, d)
            for d, n in enumerate(extent)
            if n % q[d] == 0 and n // q[d] >= 2 and (across or d == dim)
        ]
        if cuts:
            d = min(cuts)[3]
            h = ceil(extent[d] // q[d] / 2) * q[d]
            return [Piece(d, 0, h), Piece(d, h, extent[d] - h)]
    if split and size >= 2:
        h = ceil(size / 2)
        return [Piece(dim, 0, h), Piece(dim, h, size - h)]
    others = [d for d in range(len(dims)) if d != dim and dims[d] >= 2]
    if split and others:
        d = max(others, key=lambda i: (dims[i], -i))
        h = ceil(dims[d] / 2)
        return [Piece(d, 0, h), Piece(d, h, dims[d] - h)]
    return [Piece(dim, 0, size)]


def quanta(shape: Shape, *others: Shape) -> list[int]:
    """:func:`tile_rows` of every dimension of ``shape`` (and ``others``, of the same rank)."""
    return [tile_rows(d, shape, *others) for d in range(shape.rank)]


def window(
    ctx: Lowering,
    ref: MemRef,
    dim: int,
    start: Reg | int,
    size: int,
    piece: Piece,
    block: tuple[int, int] | None,
    tmp: Reg,
) -> MemRef:
    """The window of ``ref``: chunk ``[start, start + size)`` along ``dim``, then ``piece``, then ``block``
    ``(offset, length)`` within the piece. A register start plus a static offset is added into ``tmp``."""
    dims = list(ref.shape.dimensions)
    b_off, b_len = block if block is not None else (0, piece.length)
    offsets: list[Reg | int] = [0] * len(dims)
    sizes = list(dims)
    sizes[dim] = size
    extra = piece.offset + b_off if piece.dim == dim else 0
    if piece.dim == dim:
        sizes[dim] = b_len
    else:
        offsets[piece.dim] = piece.offset + b_off
        sizes[piece.dim] = b_len
    if isinstance(start, Reg):
        if extra:
            ctx.emit(ScalarAlu, fn="add", dst=tmp, a=start, b=extra)
            offsets[dim] = tmp
        else:
            offsets[dim] = start
    else:
        offsets[dim] = start + extra
    if all(isinstance(o, int) and o == 0 for o in offsets) and tuple(sizes) == ref.shape.dimensions:
        return MemRef(ref.space, ref.address, ref.shape, None, ref.base)
    return MemRef(ref.space, ref.address, ref.shape, Window(tuple(offsets), tuple(sizes)), ref.base)


def piece_dims(dims: Sequence[int], dim: int, size: int, piece: Piece, length: int) -> tuple[int, ...]:
    out = list(dims)
    out[dim] = size
    out[piece.dim] = length
    return tuple(out)


def _blocks(
    vmem_bytes: int, shape: Shape, dim: int, size: int, piece: Piece, sets: int, align: int = 1, quantum: int = 1
) -> list[int]:
    """Block lengths of a piece: growing geometrically from about 1/32 of it (so the first push of a stage
    starts early and every later block loads while the previous ones are being pushed), each at most what
    ``vmem_bytes`` holds when ``sets`` blocks (a partial sum and an own part per direction, in several sets)
    live at once; whole ``quantum``-row units (tiles along the piece's dimension, :func:`tile_rows`) when the
    piece is whole units and one unit fits.

    Raises:
        CompileError: VMEM cannot hold even one-row blocks."""

    def nbytes(length: int) -> int:
        dims = piece_dims(shape.dimensions, dim, size, piece, length)
        return Shape(shape.element_type, dims, layout=shape.layout).byte_size

    budget = max(vmem_bytes // sets // align * align, 1)
    if nbytes(1) > budget:
        raise CompileError(
            f"a reduce-scatter block of {shape} needs {nbytes(1) * sets} bytes of VMEM for {sets} buffers; "
            f"{vmem_bytes} are free"
        )
    per_unit = max(nbytes(piece.length) / piece.length, 1e-9)
    cap = max(1, min(piece.length, int(budget // per_unit)))
    while cap > 1 and nbytes(cap) > budget:
        cap -= max(1, cap // 8)
    first = max(1, min(cap, piece.length, max(piece.length // FIRST_BLOCK_FRACTION, ceil(MIN_BLOCK_BYTES / per_unit))))
    q = quantum if piece.length % quantum == 0 and nbytes(quantum) <= budget else 1
    if q > 1:
        cap = max(q, cap // q * q)
        first = min(cap, -(-first // q) * q)
    out: list[int] = []
    left, length = piece.length, first
    while left > 0:
        out.append(min(length, left, cap))
        left -= out[-1]
        length = min(cap, 2 * out[-1]) if len(out) > 1 else length
    return out


def locate(
    work: RingWork, ring: Ring, step: int, stage: Reg | int, base: Reg | int, stride: int, plus: int = 0
) -> None:
    """``cs[step]`` = the start of the chunk at ring position ``pos - step * (stage + plus)`` (modulo ``L``);
    the position goes through the shared scratch register ``at``. A register ``stage`` is at most
    ``L - plus``."""
    facts, at, L = work.facts, work.at, ring.length
    if isinstance(stage, int):
        facts.alu("add", at, ring.pos, (-step * (stage + plus)) % L)
    else:
        facts.alu("mul", at, stage, -step)
        facts.alu("add", at, at, ring.pos)
        facts.alu("add", at, at, L - step * plus)
    facts.alu("rem", at, at, L)
    _chunk_start(facts, ring, at, work.cs[step], base, stride)


def window_start(work: RingWork, start: Reg | int, offset: int) -> Reg | int:
    """Where a chunk's window ``offset`` past ``start`` begins: ``start`` itself for the first window, a number,
    or a register sum in the shared scratch register ``work.spare`` (valid until the next use of it)."""
    if offset == 0:
        return start
    if isinstance(start, int):
        return start + offset
    return work.facts.alu("add", work.spare, start, offset)


def window_offsets(repeat: Sequence[tuple[int, int]]) -> list[int]:
    """The offsets of a chunk's windows from its start: every combination of ``(count, gap)`` levels
    (window ``i`` of a level is ``i * gap`` further), the first level outermost; ``[0]`` for no levels."""
    out = [0]
    for count, gap in repeat:
        out = [o + i * gap for o in out for i in range(count)]
    return out


def emit(phase: Iterator[None]) -> None:
    """Emit one phase on its own (a stage generator run to its end)."""
    for _ in phase:
        pass


def interleave(parts: Sequence[Iterator[None]]) -> None:
    """Emit several phases at once, stage by stage in turn (each generator yields after a stage), so their
    transfers are in flight together: the rings of different torus axes run concurrently on their own
    links."""
    live = list(parts)
    while live:
        live = [g for g in live if next(g, StopIteration) is not StopIteration]


def reduce_scatter_stages(
    work: RingWork,
    ring: Ring,
    src: MemRef,
    fin: MemRef,
    fin_start: Reg | int,
    dim: int,
    base: Reg | int,
    size: int,
    fn: Reducer,
    split: bool = True,
    unrolled: bool = True,
    stride: int | None = None,
    repeat: Sequence[tuple[int, int]] = (),
) -> Iterator[None]:
    """One reduce-scatter phase (see the module docstring), yielding after each block's code; ``unrolled``
    emits every stage as code of its own (phases run at once by :func:`interleave`), else stages
    ``1 .. L-2`` are one loop. Chunk ``c`` may be several windows (:func:`window_offsets` of ``repeat``),
    chunks ``stride`` apart (as :func:`all_gather_stages`); ``fin`` then receives the same windows from
    ``fin_start``.

    A stage waits for its arrivals and for its own previous pushes; then, block by block (blocks grow
    geometrically), it loads the received partial sum and its own part into VMEM, adds in place on the
    VPU and pushes the sum (the last stage writes it to ``fin``); the next block's loads are issued right
    after this block's push, so they run while it crosses the link.

    Args:
        work: the collective's semaphores and registers.
        ring: the ring (``length >= 2``).
        src: the chip's own contributions (HBM); chunk ``c`` is ``[base + c*size, +size)`` along ``dim``.
        fin: where this chip's reduced chunk goes (HBM), at ``fin_start`` along ``dim``.
        fn: how two values combine.
        split: use both directions (two pieces per chunk) when the chunk can be cut.
    """
    facts = work.facts
    ctx = facts.ctx
    L = ring.length
    shape = src.shape
    et = shape.element_type
    qs = quanta(src.shape, fin.shape)
    parts = pieces(shape.dimensions, dim, size, split, qs, across=False)
    steps = [1, -1][: len(parts)]
    part = dict(zip(steps, parts))
    quantum = qs[parts[0].dim]
    stride = size if stride is None else stride
    offsets = window_offsets(repeat)
    windows = len(offsets)
    arena = work.arena()
    room = arena.shape.byte_size
    vreg = ctx.vreg_bytes
    sets = min(BUFFER_SETS, windows * len(_blocks(room, shape, dim, size, parts[0], 2 * len(parts), vreg, quantum)))
    lens = {s: _blocks(room, shape, dim, size, part[s], 2 * len(parts) * sets, vreg, quantum) for s in steps}
    # (window, offset in the piece, length): the blocks of every window of a chunk in turn
    blocks = {
        s: [(r, o, n) for r in range(windows) for o, n in zip(accumulate(v, initial=0), v)] for s, v in lens.items()
    }
    count = max(len(v) for v in blocks.values())
    slot: dict[int, MemRef] = {}
    vm: dict[tuple[int, str, int], MemRef] = {}
    at = arena.address
    for s in steps:
        p = part[s]
        slot_dims = list(piece_dims(shape.dimensions, dim, size, p, p.length))
        slot_dims[p.dim] = p.length * (L - 1) * windows
        slot[s] = ctx.scratch(Shape(et, tuple(slot_dims), layout=shape.layout))
        longest = max(lens[s])
        block_shape = Shape(et, piece_dims(shape.dimensions, dim, size, p, longest), layout=shape.layout)
        step = -(-block_shape.byte_size // ctx.vreg_bytes) * ctx.vreg_bytes
        for j in range(min(sets, len(blocks[s]))):
            for role in ("sum", "own"):
                vm[(s, role, j)] = MemRef(Space.VMEM, at, block_shape)
                at += step
    assert at <= arena.address + room, "reduce-scatter blocks overflow their VMEM arena"

    def vblock(s: int, role: str, j: int) -> MemRef:
        ref = vm[(s, role, j % sets)]
        dims = piece_dims(shape.dimensions, dim, size, part[s], blocks[s][j][2])
        if dims == ref.shape.dimensions:
            return ref
        return MemRef(Space.VMEM, ref.address, Shape(et, dims, layout=shape.layout))

    sent, load, tmp, cs = work.sent, work.load, work.tmp, work.cs
    pushes = sum(len(b) for b in blocks.values())

    def slot_window(s: int, stage: Reg | int, delta: int, j: int) -> MemRef:
        """Block ``j`` of slot ``stage + delta`` (a register ``stage`` is evaluated into ``tmp[1]``)."""
        p = part[s]
        r, off, length = blocks[s][j]
        sizes = list(slot[s].shape.dimensions)
        sizes[p.dim] = length
        offsets: list[Reg | int] = [0] * len(sizes)
        per = p.length * windows  # a stage's slot holds every window of the chunk
        if isinstance(stage, Reg):
            facts.alu("mul", tmp[1], stage, per)
            facts.alu("add", tmp[1], tmp[1], delta * per + r * p.length + off)
            offsets[p.dim] = tmp[1]
        else:
            offsets[p.dim] = (stage + delta) * per + r * p.length + off
        return MemRef(Space.HBM, slot[s].address, slot[s].shape, Window(tuple(offsets), tuple(sizes)))

    def own(s: int, j: int) -> MemRef:
        r, o, n = blocks[s][j]
        return window(ctx, src, dim, window_start(work, cs[s], offsets[r]), size, part[s], (o, n), tmp[0])

    # stage 0: push this chip's part of the chunk at position pos - step into slot 0 of the next chip
    for s in steps:
        locate(work, ring, s, 0, base, stride, plus=1)
    for j in range(count):
        for s in steps:
            if j < len(blocks[s]):
                ctx.emit(
                    DmaStart, src=own(s, j), dst=slot_window(s, 0, 0, j), chip=ring.to[s], dst_sem=ring.arrive[s],
                    sem=sent,
                )  # fmt: skip
        yield

    def stage(stage_reg: Reg | int, last: bool) -> Iterator[None]:
        for s in steps:
            ctx.emit(SemWait, sem=ring.arrive[s], count=len(blocks[s]))
        ctx.emit(SemWait, sem=sent, count=pushes)
        for s in steps:
            locate(work, ring, s, stage_reg, base, stride, plus=1)

        def loads(j: int) -> int:
            n = 0
            for s in steps:
                if j < len(blocks[s]):
                    ctx.emit(DmaStart, src=slot_window(s, stage_reg, -1, j), dst=vblock(s, "sum", j), sem=load[j % 2])
                    ctx.emit(DmaStart, src=own(s, j), dst=vblock(s, "own", j), sem=load[j % 2])
                    n += 2
            return n

        pending = loads(0)
        for j in range(count):
            ctx.emit(SemWait, sem=load[j % 2], count=pending)
            for s in steps:
                if j >= len(blocks[s]):
                    continue
                acc = vblock(s, "sum", j)
                fn.emit(ctx, acc, acc, vblock(s, "own", j))
                if last:
                    r, o, n = blocks[s][j]
                    at = window_start(work, fin_start, offsets[r])
                    dst = window(ctx, fin, dim, at, size, part[s], (o, n), tmp[0])
                    ctx.emit(DmaStart, src=acc, dst=dst, sem=sent)
                else:
                    ctx.emit(
                        DmaStart, src=acc, dst=slot_window(s, stage_reg, 0, j), chip=ring.to[s],
                        dst_sem=ring.arrive[s], sem=sent,
                    )  # fmt: skip
            # the next block loads while this one is pushed (pushes first: DMA engines serve in order)
            pending = loads(j + 1) if j + 1 < count else 0
            yield  # (block by block: phases run at once share the DMA queue fairly)

    if unrolled:
        for kk in range(1, L - 1):
            yield from stage(kk, last=False)
    elif L > 2:
        k = work.k
        top = ctx.label("rs_stage")
        facts.alu("mov", k, 1)
        ctx.place_label(top)
        yield from stage(k, last=False)
        facts.alu("add", k, k, 1)
        ctx.emit(Branch, cond="lt", a=k, b=L - 1, target=top)
    yield from stage(L - 1, last=True)
    ctx.emit(SemWait, sem=sent, count=pushes)


def all_gather_stages(
    work: RingWork,
    ring: Ring,
    arr: MemRef,
    dim: int,
    base: Reg | int,
    size: int,
    first: MemRef | None = None,
    split: bool = True,
    stages: tuple[int, int] | None = None,
    unrolled: bool = True,
    stride: int | None = None,
    repeat: Sequence[tuple[int, int]] = (),
) -> Iterator[None]:
    """One all-gather phase over ``arr`` (HBM): this chip's chunk is there, the others arrive. Yields after
    each stage's code; ``unrolled`` emits every stage as code of its own (:func:`interleave`).

    Chunk ``c`` is windows of ``size`` along ``dim`` at ``base + c * stride + o`` for each offset ``o`` of
    :func:`window_offsets` of ``repeat`` (``stride`` defaults to ``size``): an axis gathered after others
    whose chunks are not contiguous (a torus whose axes run in another order than the ranks') pushes each
    window of a chunk.

    Args:
        first: where stage 0 reads this chip's chunk (default: its window of ``arr``); a whole array of the
            chunk's dimensions.
        stages: the range ``[from, to)`` of stages to emit (default all, ``0 .. L - 1``); stage ``L - 1``
            only waits for the last arrivals. An async all-gather emits stage 0 at its start and the rest at
            its done.
    """
    facts = work.facts
    ctx = facts.ctx
    L = ring.length
    parts = pieces(arr.shape.dimensions, dim, size, split, quanta(arr.shape))
    steps = [1, -1][: len(parts)]
    sent, tmp, cs = work.sent, work.tmp, work.cs
    lo, hi = stages if stages is not None else (0, L)
    stride = size if stride is None else stride
    offsets = window_offsets(repeat)
    count = len(offsets)
    assert first is None or count == 1, "a chunk read from elsewhere is one window"
    for s in steps:  # the position whose chunk is pushed at stage lo: pos - lo (+ direction), pos + lo (-)
        locate(work, ring, s, lo, base, stride)

    def push(first_stage: bool) -> Iterator[None]:
        """A stage's pushes, window by window, both directions in turn (yielding after each window: the DMA
        queue serves in order, so the windows of phases run at once alternate on their links)."""
        for offset in offsets:
            for s, p in zip(steps, parts):
                at = window_start(work, cs[s], offset)
                dst = window(ctx, arr, dim, at, size, p, None, tmp[0])
                if first_stage and first is not None:
                    src = window(ctx, first, dim, 0, size, p, None, tmp[1])
                else:
                    src = window(ctx, arr, dim, at, size, p, None, tmp[1])
                ctx.emit(DmaStart, src=src, dst=dst, chip=ring.to[s], dst_sem=ring.arrive[s], sem=sent)
            yield

    def wait_previous() -> None:
        for s in steps:
            ctx.emit(SemWait, sem=ring.arrive[s], count=count)
        ctx.emit(SemWait, sem=sent, count=count * len(steps))

    if lo == 0 and hi > 0:
        yield from push(first_stage=True)
        for s in steps:
            locate(work, ring, s, 1, base, stride)
        lo = 1
    loop_hi = min(hi, L - 1)
    if unrolled:
        for t in range(lo, loop_hi):
            wait_previous()
            yield from push(first_stage=False)
            for s in steps:
                locate(work, ring, s, t + 1, base, stride)
    elif loop_hi > lo:
        k = work.k
        top = ctx.label("ag_stage")
        facts.alu("mov", k, lo)
        ctx.place_label(top)
        wait_previous()
        yield from push(first_stage=False)
        for s in steps:
            locate(work, ring, s, k, base, stride, plus=1)
        facts.alu("add", k, k, 1)
        ctx.emit(Branch, cond="lt", a=k, b=loop_hi, target=top)
    if hi >= L:
        wait_previous()
