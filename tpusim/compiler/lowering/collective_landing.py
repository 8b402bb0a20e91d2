"""A reduce-scatter phase whose partial sums land in the receiver's VMEM: a wavefront over the phase's stages,
with credits.

:func:`.collective_ring.reduce_scatter_stages` pushes each partial sum into a private HBM slot of the
receiver, which loads it back with its own part: three chunks of HBM traffic per stage against one over each
link, most of a v4's HBM while the rings of every torus axis run at once. Here the sender pushes the sum
straight into one of ``B`` *landing buffers* in the receiver's VMEM (the same addresses on every chip: the
program is SPMD); the receiver adds its own part, loaded from HBM a step ahead, and pushes the sum on, so a
stage moves one chunk through HBM (its own part), as a Pallas ring kernel does.

**Credits.** A landing buffer is reused, so the sender pushes into buffer ``t % B`` (its ``t``-th push of the
phase in that direction) only with a *credit*: the receiver signals one (``sem.signal fence``: when the add
that read the buffer has completed) for each push it has consumed, ``min(B, m)`` at the phase's start and one
per consumed push ``c`` with ``c + B < m`` (``m`` pushes in all), so the sender's credit semaphore holds
exactly the phase's ``m`` credits and nothing is left for the next phase that uses it. The first phase on a
ring's channel after the collective's entry handshake takes its first ``min(B, m)`` credits as given (the
receiver's ``ready`` said its buffers are free): signalled at the phase's start they cost a hop's latency,
8% of a latency-bound 16 KiB all-reduce. The receiver counts
arrivals one at a time, which the DMA model's in-order landing of one sender's pushes to one semaphore makes
exact (``tpusim.devices.dma``).

**Wavefront.** In step ``tau`` a chip works on block ``tau - k`` of every stage ``k`` (stage 0 pushes its own
part; stage ``k`` adds the block of stage ``k - 1`` that arrived and pushes the sum; the last stage writes the
result). Stage-major order would deadlock once a stage has more blocks than landing buffers: every chip's
stage 0 would wait for credits that only its neighbour's stage 1 gives. In the wavefront a chip consumes in
step ``tau`` exactly what its upstream pushed in step ``tau - 1``, in the same order, so credits and
arrivals follow one sequence; with ``B = 2 A`` (``A``: the stages pushing in one step, at most ``L - 1``)
every credit a push waits for comes from a step already behind the receiver. The blocks' chains of hop
latencies overlap: a step takes as long as its pushes take the link once blocks carry a few hops' latency
of bytes (``TARGET_BLOCK_BYTES``), where stage-major order paid a latency per stage.

Used on systems of two or more ICI axes (bank 0 holds credit semaphores there), for rings run at once and
for a group along one axis, when VMEM holds the buffers; otherwise
:func:`.collective_ring.reduce_scatter_stages`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from math import ceil

from tpusim.compiler.lowering.collective_ring import (
    Piece,
    Reducer,
    Ring,
    RingWork,
    locate,
    piece_dims,
    pieces,
    quanta,
    reduce_scatter_stages,
    window,
    window_offsets,
    window_start,
)
from tpusim.isa import DmaStart, MemRef, Reg, SemSignal, SemWait, Space
from tpusim.memory import Shape

__all__ = ["TARGET_BLOCK_BYTES", "reduce_scatter_phase"]

TARGET_BLOCK_BYTES = 256 * 1024
"""A block's size where VMEM allows: several times what a link carries during one hop's latency (45 GB/s x
1 us on v4), so that a step's pushes, not its chain of latencies, set its length."""

OWN_SETS = 3
"""Sets of own-part buffers: a step's loads go into one while the previous step's sums are still being
pushed from another (the scoreboard would hold a load back until the push that reads its buffer is done)."""


@dataclass(frozen=True)
class _Plan:
    parts: list[Piece]
    steps: list[int]
    spans: dict[int, list[tuple[int, int]]]  # per direction: (offset, length) of the blocks of a piece
    offsets: list[int]  # windows of a chunk (window_offsets)
    active: dict[int, int]  # per direction: most stages pushing in one step (A)
    landing: dict[int, list[int]]  # per direction: VMEM addresses of the B landing buffers
    own: dict[int, list[int]]  # per direction: VMEM addresses of the OWN_SETS * A own-part buffers


def reduce_scatter_phase(
    work: RingWork,
    ring: Ring,
    src: MemRef,
    fin: MemRef,
    fin_start: Reg | int,
    dim: int,
    base: Reg | int,
    size: int,
    fn: Reducer,
    stride: int | None = None,
    repeat: Sequence[tuple[int, int]] = (),
    unrolled: bool = True,
    used: set[int] | None = None,
) -> Iterator[None]:
    """One reduce-scatter phase, arguments as :func:`.collective_ring.reduce_scatter_stages`: its partial sums
    land in the receivers' VMEM when the ring has credit semaphores and VMEM holds the buffers (module
    docstring; always unrolled), else in HBM slots. ``used``: the arrival semaphores the collective's earlier
    phases have used since its entry handshake (updated); on a fresh one the handshake's ``ready`` already
    said the landing buffers are free, so the first credits are not signalled but taken as given."""
    plan = _plan(work, ring, src, dim, size, repeat) if ring.credit else None
    if plan is None:
        return reduce_scatter_stages(
            work, ring, src, fin, fin_start, dim, base, size, fn, unrolled=unrolled, stride=stride, repeat=repeat
        )
    fresh = {s: used is not None and ring.arrive[s] not in used for s in plan.steps}
    if used is not None:
        used.update(ring.arrive[s] for s in plan.steps)
    return _wavefront(
        plan, work, ring, src, fin, fin_start, dim, base, size, fn, size if stride is None else stride, fresh
    )


def _plan(
    work: RingWork, ring: Ring, src: MemRef, dim: int, size: int, repeat: Sequence[tuple[int, int]]
) -> _Plan | None:
    """Blocks and buffers, or None when VMEM cannot hold ``B`` landing and ``OWN_SETS * A`` own buffers of
    whole-tile blocks per direction."""
    ctx = work.facts.ctx
    shape = src.shape
    qs = quanta(shape)
    parts = pieces(shape.dimensions, dim, size, True, qs, across=False)
    steps = [1, -1][: len(parts)]
    offsets = window_offsets(repeat)
    arena = work.arena()
    room, vreg = arena.shape.byte_size, ctx.vreg_bytes

    def nbytes(p: Piece, length: int) -> int:
        shape_of = Shape(shape.element_type, piece_dims(shape.dimensions, dim, size, p, length), layout=shape.layout)
        return -(-shape_of.byte_size // vreg) * vreg

    count = {s: max(1, ceil(nbytes(p, p.length) / TARGET_BLOCK_BYTES)) for s, p in zip(steps, parts)}
    unit = {s: qs[p.dim] if p.length % qs[p.dim] == 0 else 1 for s, p in zip(steps, parts)}  # whole tiles, if any
    while True:
        spans: dict[int, list[tuple[int, int]]] = {}
        for s, p in zip(steps, parts):
            q = unit[s]
            length = -(-ceil(p.length / count[s]) // q) * q
            spans[s] = [(o, min(length, p.length - o)) for o in range(0, p.length, length)]
        active = {s: min(len(offsets) * len(spans[s]), ring.length - 1) for s in steps}
        need = sum((2 + OWN_SETS) * active[s] * nbytes(p, spans[s][0][1]) for s, p in zip(steps, parts))
        if need <= room:
            break
        grow = [s for s in steps if spans[s][0][1] > unit[s]]
        if not grow:
            return None
        for s in grow:
            count[s] *= 2
    at = arena.address
    landing: dict[int, list[int]] = {}
    own: dict[int, list[int]] = {}
    for s, p in zip(steps, parts):
        one = nbytes(p, spans[s][0][1])
        landing[s] = [at + i * one for i in range(2 * active[s])]
        at += 2 * active[s] * one
        own[s] = [at + i * one for i in range(OWN_SETS * active[s])]
        at += OWN_SETS * active[s] * one
    assert at <= arena.address + room, "landing buffers overflow the VMEM arena"
    return _Plan(parts, steps, spans, offsets, active, landing, own)


def _wavefront(
    plan: _Plan,
    work: RingWork,
    ring: Ring,
    src: MemRef,
    fin: MemRef,
    fin_start: Reg | int,
    dim: int,
    base: Reg | int,
    size: int,
    fn: Reducer,
    stride: int,
    fresh: dict[int, bool],
) -> Iterator[None]:
    """Emit the phase step by step (yielding after each, so phases run at once interleave); a ``fresh``
    direction takes its first credits as given (``reduce_scatter_phase``)."""
    facts = work.facts
    ctx = facts.ctx
    L = ring.length
    shape = src.shape
    steps, part = plan.steps, dict(zip(plan.steps, plan.parts))
    sent, load, tmp, cs = work.sent, work.load, work.tmp, work.cs
    # the blocks of every window of a chunk in turn: (window, offset in the piece, length)
    items = {s: [(r, o, n) for r in range(len(plan.offsets)) for o, n in plan.spans[s]] for s in steps}
    pushes = {s: (L - 1) * len(items[s]) for s in steps}  # stages 0 .. L-2 push every item
    bufs = {s: len(plan.landing[s]) for s in steps}
    pushed = dict.fromkeys(steps, 0)
    consumed = dict.fromkeys(steps, 0)

    def block(s: int, address: int, length: int) -> MemRef:
        dims = piece_dims(shape.dimensions, dim, size, part[s], length)
        return MemRef(Space.VMEM, address, Shape(shape.element_type, dims, layout=shape.layout))

    def own_window(s: int, stage: int, item: tuple[int, int, int]) -> MemRef:
        r, o, n = item
        locate(work, ring, s, stage, base, stride, plus=1)  # the chunk at position pos - s * (stage + 1)
        return window(ctx, src, dim, window_start(work, cs[s], plan.offsets[r]), size, part[s], (o, n), tmp[0])

    def first_consumer(s: int, tau: int) -> int:
        """The first of the stages that add and pass on (or write) in step ``tau``: they run from it to
        ``min(L - 1, tau)``, stage ``k`` on item ``tau - k``; stage ``k`` takes own buffer ``k - first``."""
        return max(1, tau - len(items[s]) + 1)

    def own_buffer(s: int, tau: int, slot: int) -> int:
        return plan.own[s][(tau % OWN_SETS) * plan.active[s] + slot]

    def push(s: int, source: MemRef, length: int) -> None:
        if not (fresh[s] and pushed[s] < bufs[s]):
            ctx.emit(SemWait, sem=ring.credit[s], count=1)
        dst = block(s, plan.landing[s][pushed[s] % bufs[s]], length)
        ctx.emit(DmaStart, src=source, dst=dst, chip=ring.to[s], dst_sem=ring.arrive[s], sem=sent)
        pushed[s] += 1

    def issue_loads(tau: int) -> int:
        n = 0
        for s in steps:
            first = first_consumer(s, tau)
            for k in range(first, min(L - 1, tau) + 1):
                item = items[s][tau - k]
                ctx.emit(
                    DmaStart,
                    src=own_window(s, k, item),
                    dst=block(s, own_buffer(s, tau, k - first), item[2]),
                    sem=load[tau % 2],
                )
                n += 1
        return n

    # the landing buffers are free: credits for the first pushes of each upstream chip
    for s in steps:
        if not fresh[s]:
            ctx.emit(SemSignal, sem=ring.credit[s], count=min(bufs[s], pushes[s]), chip=ring.to[-s])
    most = max(len(v) for v in items.values())
    pending = issue_loads(0)
    for tau in range(most + L - 1):
        if pending:
            ctx.emit(SemWait, sem=load[tau % 2], count=pending)
        pending = issue_loads(tau + 1)  # (the next step's own parts load while this one works)
        for k in range(L):
            for s in steps:
                j = tau - k
                if not 0 <= j < len(items[s]):
                    continue
                item = items[s][j]
                if k == 0:
                    push(s, own_window(s, 0, item), item[2])
                    continue
                acc = block(s, own_buffer(s, tau, k - first_consumer(s, tau)), item[2])
                ctx.emit(SemWait, sem=ring.arrive[s], count=1)
                landed = block(s, plan.landing[s][consumed[s] % bufs[s]], item[2])
                fn.emit(ctx, acc, landed, acc)
                if consumed[s] + bufs[s] < pushes[s]:
                    ctx.emit(SemSignal, sem=ring.credit[s], count=1, chip=ring.to[-s], fence=True)
                consumed[s] += 1
                if k < L - 1:
                    push(s, acc, item[2])
                else:
                    r, o, n = item
                    at = window_start(work, fin_start, plan.offsets[r])
                    dst = window(ctx, fin, dim, at, size, part[s], (o, n), tmp[0])
                    ctx.emit(DmaStart, src=acc, dst=dst, sem=sent)
        yield
    ctx.emit(SemWait, sem=sent, count=sum(pushes[s] + len(items[s]) for s in steps))
