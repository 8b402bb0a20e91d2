"""Collectives as direct pushes to each partner: all-to-all, collective-permute, collective-broadcast, and
all-gathers whose shards are so small that the ring's steps would cost more than routes to every partner
(:func:`direct_gather_pays`).

Each starts with the handshake of :mod:`.collective_sync` (a receiver signals every chip that will push to
it) and ends when every push to this chip has arrived (one arrival semaphore: within a collective the
arrivals are only counted, never told apart). Transfers to chips that are not neighbours are routed over
the torus by the device model.
"""

from __future__ import annotations

from collections.abc import Callable

from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.lowering.collective_plan import GroupPlan, permute_pairs
from tpusim.compiler.lowering.collective_ring import Piece, tile_rows, window
from tpusim.compiler.lowering.collective_sync import Bank, CollectiveState, Facts, flat_view
from tpusim.compiler.lowering.context import Lowering
from tpusim.compiler.lowering.control import copy_arrays
from tpusim.isa import Branch, Const, DmaStart, Jump, MemRef, Reg, SemSignal, SemWait, Space, VpuBroadcast, Window
from tpusim.memory import Layout, Shape

__all__ = [
    "all_gather_direct",
    "all_to_all",
    "collective_broadcast",
    "collective_permute",
    "direct_gather_pays",
    "zero_fill",
]


def all_to_all(
    ctx: Lowering,
    state: CollectiveState,
    bank: Bank,
    plan: GroupPlan,
    xs: list[MemRef],
    ys: list[MemRef],
    dim: int | None,
) -> None:
    """Direct pushes: chunk (or operand) ``j`` of every chip goes to rank ``j``, into chunk (result) ``rank``."""
    S = plan.size
    if S == 1:
        copy_arrays(ctx, list(zip(xs, ys)))
        return
    facts = Facts(ctx, state)
    rank_of = plan.rank_of()
    rank = facts.rank(plan)
    j, off_j, off_r = facts.reg(), facts.reg(), facts.reg()

    def peer(delta: int) -> Reg:
        return _peer(facts, plan, rank_of, rank, j, delta)

    _ready(facts, bank, peer, S)
    if ctx.on_async:  # (the async sequencer takes no scoped semaphore: its bank's and a reserved load's)
        assert bank.local is not None and state.async_loads, "an async all-to-all's bank and loads are reserved"
        sem, local = bank.local, state.async_loads[0]
    else:
        sem, local = ctx.semaphore(), ctx.semaphore()
    pushes = S - 1
    if dim is not None:
        x, y = xs[0], ys[0]
        c = x.shape.dimensions[dim] // S
        facts.alu("mul", off_r, rank, c)
        # the partner half-way round a ring (both ways as short) gets half its chunk each way (tile-aligned)
        ring = plan.axes is not None and len(plan.axes) == 1 and plan.axes[0].wraps and S % 2 == 0
        q = tile_rows(dim, x.shape, y.shape)
        half = c // 2 // q * q if ring else 0

        def chunk(ref: MemRef, start: Reg, at: int = 0, size: int = c, tmp: Reg | None = None) -> MemRef:
            offsets: list[Reg | int] = [0] * ref.shape.rank
            sizes = list(ref.shape.dimensions)
            if at:
                assert tmp is not None
                start = facts.alu("add", tmp, start, at)
            offsets[dim], sizes[dim] = start, size
            return MemRef(Space.HBM, ref.address, ref.shape, Window(tuple(offsets), tuple(sizes)))

        for delta in _both_ways(S):
            chip = peer(delta)
            facts.alu("mul", off_j, j, c)
            if delta == S // 2 and half:
                at_s, at_d = facts.reg(), facts.reg()
                for at, size, tie in ((0, half, 1), (half, c - half, -1)):
                    src, dst = chunk(x, off_j, at, size, at_s), chunk(y, off_r, at, size, at_d)
                    ctx.emit(DmaStart, src=src, dst=dst, chip=chip, dst_sem=bank.arrive[0], sem=sem, tie=tie)
                facts.release(at_s, at_d)
                pushes += 1
            else:
                dst = chunk(y, off_r)
                ctx.emit(DmaStart, src=chunk(x, off_j), dst=dst, chip=chip, dst_sem=bank.arrive[0], sem=sem)
            facts.release(chip)
        ctx.emit(DmaStart, src=chunk(x, off_r), dst=chunk(y, off_r), sem=local)
    else:
        if any(r.shape != xs[0].shape for r in xs + ys):
            raise CompileError(f"{ctx.hlo}: the tuple form of all-to-all needs operands and results of one shape")
        ya = [r.address - ys[0].address for r in ys]
        xa = [r.address - xs[0].address for r in xs]
        dst_base = facts.select(rank, ya)
        for delta in _both_ways(S):
            chip = peer(delta)
            src_base = facts.select(j, xa)
            src = MemRef(Space.HBM, xs[0].address, xs[0].shape, None, src_base)
            dst = MemRef(Space.HBM, ys[0].address, ys[0].shape, None, dst_base)
            ctx.emit(DmaStart, src=src, dst=dst, chip=chip, dst_sem=bank.arrive[0], sem=sem)
            facts.release(chip, src_base)
        own = facts.select(rank, xa)
        ctx.emit(
            DmaStart, src=MemRef(Space.HBM, xs[0].address, xs[0].shape, None, own),
            dst=MemRef(Space.HBM, ys[0].address, ys[0].shape, None, dst_base), sem=local,
        )  # fmt: skip
    ctx.emit(SemWait, sem=bank.arrive[0], count=pushes)
    ctx.emit(SemWait, sem=sem, count=pushes)
    ctx.emit(SemWait, sem=local, count=1)


def direct_gather_pays(ctx: Lowering, plan: GroupPlan, shard_bytes: int) -> bool:
    """Whether an all-gather of ``shard_bytes`` per chip takes less time as direct pushes to every partner
    than over the group's rings, by the cost model of docs/multichip.md. A ring step costs a hop (two on a
    line, walked in zigzag), a DMA's set-up and an HBM latency (the step's data lands before it is
    forwarded), and the rings cross ``sum(L - 1)`` steps after a handshake with the neighbours. Direct pushes
    pay the farthest partner's hops twice (its handshake, then the data), each push's set-up on the core's
    DMA engines, and bytes that travel the mean route length over the chip's links. Structured groups on
    ICI only (a group over slices, or one of arbitrary ranks, keeps its rings)."""
    if plan.axes is None or any(a.switched for a in plan.axes) or plan.size < 3:
        return False
    cfg = ctx.config
    hop, setup = cfg.cycles(cfg.ici.hop_latency_ns), cfg.dma.setup_cycles
    step = hop + setup + cfg.cycles(cfg.hbm.latency_ns)
    links = 2 * len(plan.axes)  # both directions of each axis' ring or line
    bw = cfg.link_bytes_per_cycle
    # (a ring walked in zigzag along a line goes two hops a step)
    per_axis = [(a.length - 1) * (step + (0 if a.wraps else hop)) for a in plan.axes]
    first = hop if all(a.wraps for a in plan.axes) else 2 * hop
    ring = first + sum(per_axis) + (plan.size - 1) * shard_bytes / (links * bw)
    far = sum(a.length // 2 if a.wraps else a.length - 1 for a in plan.axes)
    mean = sum(_mean_distance(a.length, a.wraps) for a in plan.axes)
    pushes = plan.size - 1
    direct = 2 * far * hop + step - hop + pushes * (setup / cfg.dma.engines + shard_bytes * mean / (links * bw))
    return direct < ring


def _mean_distance(length: int, wraps: bool) -> float:
    """Mean hops from a chip to the others of a ring (``wraps``) or a line of ``length`` chips (averaged over
    the line's positions)."""
    if wraps:
        return sum(min(d, length - d) for d in range(1, length)) / (length - 1)
    return sum(abs(i - j) for i in range(length) for j in range(length)) / (length * (length - 1))


def all_gather_direct(
    ctx: Lowering, state: CollectiveState, bank: Bank, plan: GroupPlan, x: MemRef, y: MemRef, dim: int
) -> None:
    """Every chip pushes its shard ``x`` straight into chunk ``rank`` of every partner's result ``y`` (and
    copies it into its own), the nearest partners first, both ways round; then waits for the ``S - 1``
    arrivals."""
    S = plan.size
    facts = Facts(ctx, state)
    rank_of = plan.rank_of()
    rank = facts.rank(plan)
    j, off_r = facts.reg(), facts.reg()

    def peer(delta: int) -> Reg:
        return _peer(facts, plan, rank_of, rank, j, delta)

    _ready(facts, bank, peer, S)
    sem, local = ctx.semaphore(), ctx.semaphore()
    c = x.shape.dimensions[dim]
    facts.alu("mul", off_r, rank, c)
    offsets: list[Reg | int] = [0] * y.shape.rank
    sizes = list(y.shape.dimensions)
    offsets[dim], sizes[dim] = off_r, c
    own = MemRef(Space.HBM, y.address, y.shape, Window(tuple(offsets), tuple(sizes)))
    for delta in _both_ways(S):
        chip = peer(delta)
        ctx.emit(DmaStart, src=x, dst=own, chip=chip, dst_sem=bank.arrive[0], sem=sem)
        facts.release(chip)
    ctx.emit(DmaStart, src=x, dst=own, sem=local)
    ctx.emit(SemWait, sem=bank.arrive[0], count=S - 1)
    ctx.emit(SemWait, sem=sem, count=S - 1)
    ctx.emit(SemWait, sem=local, count=1)
    facts.release(j, off_r)


def _peer(facts: Facts, plan: GroupPlan, rank_of: list[int], rank: Reg, j: Reg, delta: int) -> Reg:
    """The chip of rank ``(rank + delta) % S`` (``rank_of``: each device's rank, :meth:`GroupPlan.rank_of`);
    also leaves that rank in ``j``."""
    S = plan.size
    facts.alu("add", j, rank, delta)
    facts.alu("rem", j, j, S)
    if plan.axes is not None:
        return facts.member(plan, rank, j)
    return facts.table([plan.member(d, (rank_of[d] + delta) % S) for d in range(facts.state.who.devices)])


def _ready(facts: Facts, bank: Bank, peer: Callable[[int], Reg], size: int) -> None:
    """The handshake of direct pushes: tell every other member of the group (``peer(delta)``, ``delta`` in
    ``1 .. size-1``) that this chip is ready to receive, and wait until all of them are."""
    for delta in range(1, size):
        chip = peer(delta)
        facts.ctx.emit(SemSignal, sem=bank.ready, count=1, chip=chip)
        facts.release(chip)
    facts.ctx.emit(SemWait, sem=bank.ready, count=size - 1)


def _both_ways(size: int) -> list[int]:
    """Rank offsets ``1 .. size-1`` alternating between the nearest partners ahead and behind (1, size-1, 2,
    size-2, ...): the DMA engines serve pushes in order, so in rank order the first pushes all went the same
    way round the ring and the links of the other direction idled."""
    out: list[int] = []
    for d in range(1, size // 2 + 1):
        out += [d] if d == size - d else [d, size - d]
    return out


def zero_fill(ctx: Lowering, y: MemRef) -> None:
    """Write zeros over ``y`` (a collective-permute result no pair sends to)."""
    flat = flat_view(y)
    if flat is None:
        raise CompileError(f"{ctx.hlo}: zero-filling {y.shape} (sub-byte elements) is not supported")
    et = flat.shape.element_type
    n = flat.shape.dimensions[0]
    per = max(1, min(n, ctx.vmem_free_bytes() * 8 // et.bits))
    block = ctx.vmem(Shape(et, (per,), layout=Layout((0,))))
    ctx.emit(VpuBroadcast, dst=block, src=Const(0, et))
    sem = ctx.semaphore()
    count = 0
    for start in range(0, n, per):
        size = min(per, n - start)
        src = block if size == per else MemRef(Space.VMEM, block.address, Shape(et, (size,), layout=Layout((0,))))
        dst = MemRef(Space.HBM, flat.address, flat.shape, Window((start,), (size,)))
        ctx.emit(DmaStart, src=src, dst=dst, sem=sem)
        count += 1
    ctx.emit(SemWait, sem=sem, count=count)


def _routes(
    ctx: Lowering, state: CollectiveState, target: list[int], x: MemRef, y: MemRef, tmp: Reg
) -> list[tuple[MemRef, MemRef, tuple[int, ...] | None]]:
    """The pushes of a permute: ``(source window, destination window, route order)``. When some chip's target
    differs from it along two axes or more, the array goes as two halves along routes that correct the axes
    in opposite orders, which cross disjoint links: both ports of the corner of a grid carry data (the
    scaling book's point-to-point example), not one. The halves are cut along the leading dimension on a
    tile boundary (windows sharing a tile would touch the same bytes and go one after the other)."""
    topo = state.topology
    turns = any(
        t >= 0 and sum(a != b for a, b in zip(topo.coords(d), topo.coords(t))) >= 2 for d, t in enumerate(target)
    )
    rows = x.shape.dimensions[0] if x.shape.rank else 0
    q = tile_rows(0, x.shape, y.shape) if rows else 1
    half = rows // 2 // q * q
    if not turns or half == 0:
        return [(x, y, None)]
    orders: list[tuple[int, ...] | None] = [None, tuple(reversed(topo.order))]
    return [
        (window(ctx, x, 0, 0, rows, p, None, tmp), window(ctx, y, 0, 0, rows, p, None, tmp), order)
        for p, order in zip((Piece(0, 0, half), Piece(0, half, rows - half)), orders)
    ]


def collective_permute(
    ctx: Lowering, state: CollectiveState, instr: Instruction, x: MemRef, y: MemRef, part: str, bank: Bank
) -> None:
    """Push ``x`` to this chip's target (in two halves over two routes where targets are two axes or more
    away, :func:`_routes`); ``part`` is ``all`` (sync), ``start`` (push) or ``done`` (wait)."""
    target, source = permute_pairs(instr, state.who)
    # this relation's own semaphores, not the bank's (collective_sync: a later permute's signals and data
    # from other peers would be counted as this one's)
    ready, arrive = state.relations.get(tuple(target), (bank.ready, bank.arrive[0]))
    facts = Facts(ctx, state)
    tgt, src = facts.table(target), facts.table(source)
    pushes = _routes(ctx, state, target, x, y, tgt)
    sent = bank.local if part != "all" and bank.local is not None else None
    if part in ("all", "start"):
        if sent is None:
            sent = ctx.semaphore()
        no_signal, no_push, self_copy, end = (
            ctx.label(f"{instr.name}.{t}") for t in ("nosig", "nopush", "self", "end")
        )
        ctx.emit(Branch, cond="lt", a=src, b=0, target=no_signal)
        ctx.emit(Branch, cond="eq", a=src, b=facts.me, target=no_signal)
        ctx.emit(SemSignal, sem=ready, count=1, chip=src)
        ctx.place_label(no_signal)
        ctx.emit(Branch, cond="lt", a=tgt, b=0, target=no_push)
        ctx.emit(Branch, cond="eq", a=tgt, b=facts.me, target=self_copy)
        ctx.emit(SemWait, sem=ready, count=1)
        for xs, ys, order in pushes:
            ctx.emit(DmaStart, src=xs, dst=ys, chip=tgt, dst_sem=arrive, sem=sent, route=order)
        ctx.emit(Jump, target=no_push)
        ctx.place_label(self_copy)
        local = ctx.semaphore()
        ctx.emit(DmaStart, src=x, dst=y, sem=local)
        ctx.emit(SemWait, sem=local, count=1)
        ctx.place_label(no_push)
        if -1 in source:
            ctx.emit(Branch, cond="ge", a=src, b=0, target=end)
            zero_fill(ctx, y)
            ctx.place_label(end)
    if part in ("all", "done"):
        assert sent is not None
        skip_recv, skip_sent = ctx.label(f"{instr.name}.norecv"), ctx.label(f"{instr.name}.nosent")
        ctx.emit(Branch, cond="lt", a=src, b=0, target=skip_recv)
        ctx.emit(Branch, cond="eq", a=src, b=facts.me, target=skip_recv)
        ctx.emit(SemWait, sem=arrive, count=len(pushes))
        ctx.place_label(skip_recv)
        ctx.emit(Branch, cond="lt", a=tgt, b=0, target=skip_sent)
        ctx.emit(Branch, cond="eq", a=tgt, b=facts.me, target=skip_sent)
        ctx.emit(SemWait, sem=sent, count=len(pushes))
        ctx.place_label(skip_sent)


def collective_broadcast(
    ctx: Lowering, state: CollectiveState, bank: Bank, plan: GroupPlan, xs: list[MemRef], ys: list[MemRef]
) -> None:
    """The first member of each group pushes its operands to every other member's results (XLA's
    collective-broadcast); it keeps its own by a local copy."""
    if plan.size == 1:
        copy_arrays(ctx, list(zip(xs, ys)))
        return
    facts = Facts(ctx, state)
    n = state.who.devices
    rank = facts.rank(plan)
    if plan.axes is not None:
        zero = facts.reg()
        facts.alu("mov", zero, 0)
        root = facts.member(plan, rank, zero)
    else:
        root = facts.table([plan.member(d, 0) for d in range(n)])
    receiver, end = ctx.label("bcast.receiver"), ctx.label("bcast.end")
    sem = ctx.semaphore()
    ctx.emit(Branch, cond="ne", a=rank, b=0, target=receiver)
    ctx.emit(SemWait, sem=bank.ready, count=plan.size - 1)  # the root: every member is ready, push to each
    j = facts.reg()
    for delta in range(1, plan.size):
        facts.alu("mov", j, delta)
        if plan.axes is not None:
            chip = facts.member(plan, rank, j)
        else:
            chip = facts.table([plan.member(d, delta) for d in range(n)])
        for x, y in zip(xs, ys):
            ctx.emit(DmaStart, src=x, dst=y, chip=chip, dst_sem=bank.arrive[0], sem=sem)
        facts.release(chip)
    local = ctx.semaphore()
    for x, y in zip(xs, ys):
        ctx.emit(DmaStart, src=x, dst=y, sem=local)
    ctx.emit(SemWait, sem=local, count=len(xs))
    ctx.emit(SemWait, sem=sem, count=(plan.size - 1) * len(xs))
    ctx.emit(Jump, target=end)
    ctx.place_label(receiver)  # the others: say ready to the root, wait for its data
    ctx.emit(SemSignal, sem=bank.ready, count=1, chip=root)
    ctx.emit(SemWait, sem=bank.arrive[0], count=len(xs))
    ctx.place_label(end)
