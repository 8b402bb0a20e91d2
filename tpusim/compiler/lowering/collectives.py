"""Collectives as ICI data movement: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute
(and their async ``-start`` / ``-done`` pairs), replica-id and partition-id.

Every chip runs the same stream; device ``d`` (``replica * num_partitions + partition``) is chip ``d``.
Algorithms (docs/multichip.md has the cost model):

* all-reduce: reduce-scatter then all-gather over the group's rings, on a flat view of the buffer (the
  reduction is elementwise, so any split of the bytes works): for a group that is an aligned block of the
  grid, one ring per axis (reduce-scatter over the most major axis first, all-gather in reverse order),
  else one logical ring in rank order. Every ring is bidirectional when its chunks can be halved.
  The reduction runs on the receiving chip's VPU (:mod:`.collective_ring`).
* reduce-scatter / all-gather: the same phases on windows along the collective's dimension, so chunk
  ``r`` of the result is rank ``r``'s as HLO requires.
* all-to-all and collective-permute: direct pushes to each partner (routed over the torus).

Each collective starts with the handshake of :mod:`.collective_sync`. An async pair overlaps compute with
what can be issued without waiting for other chips: collective-permute-start pushes at once and its done
waits; all-gather-start pushes stage 0 of a single-ring gather and its done runs the forwarding stages;
all-reduce-start runs the whole reduction (its stages need the operand, which may die at the start).
``-done`` copies the result out of the start's buffer when buffer assignment gave it another one.
"""

from __future__ import annotations

from math import ceil, prod

from tpusim.compiler.buffer_assignment import leaf_paths
from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.lowering.collective_plan import GroupPlan, permute_pairs, plan_groups
from tpusim.compiler.lowering.collective_ring import (
    Ring,
    RingWork,
    all_gather_phase,
    pieces,
    reduce_scatter_phase,
    window,
    zigzag_coordinate,
)
from tpusim.compiler.lowering.collective_sync import (
    Bank,
    CollectiveState,
    Facts,
    collective_state,
    participants,
)
from tpusim.compiler.lowering.context import Lowering
from tpusim.compiler.lowering.control import copy_arrays
from tpusim.compiler.lowering.registry import lowering
from tpusim.isa import (
    Branch,
    Const,
    DmaStart,
    Jump,
    MemRef,
    Reg,
    ScalarAlu,
    ScalarStore,
    SemSignal,
    SemWait,
    Space,
    VpuBroadcast,
    Window,
)
from tpusim.memory import Layout, Shape, geometry

__all__ = ["REDUCERS"]

REDUCERS = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})
"""``to_apply`` roots the VPU reduces with (commutative, as the ring order is not the group order)."""


# --------------------------------------------------------------------------------------------- helpers
def _fail(instr: Instruction, message: str) -> CompileError:
    return CompileError(f"{instr.name} ({instr.opcode}): {message}")


def _reducer(ctx: Lowering, instr: Instruction) -> str:
    name = instr.attr("to_apply")
    comp = ctx.module[name]
    root = comp[comp.root]
    params = sorted(i.name for i in comp.instructions if i.opcode == "parameter")
    if root.opcode in REDUCERS and len(params) == 2 and sorted(root.operands) == params:
        return root.opcode
    raise _fail(
        instr,
        f"the reduction {name} (root {root.opcode}) is not one elementwise op of its two parameters; "
        f"collectives reduce with {', '.join(sorted(REDUCERS))}",
    )


def _flat(ref: MemRef) -> MemRef | None:
    """The buffer as a 1-D array of its element slots (padding included; slots keep their width, e.g. the
    32-bit ``E(32)`` slots of TPU pred arrays), or None for sub-byte slots."""
    geo = geometry(ref.shape)
    et = ref.shape.element_type
    bits = geo.element_bits
    if et.dtype is None or bits < 8 or bits % 8 or geo.prefix_bytes:
        return None
    layout = Layout((0,), element_size_bits=bits if bits != et.bits else 0)
    return MemRef(Space.HBM, ref.address, Shape(et, (geo.byte_size * 8 // bits,), layout=layout))


def _result_leaves(ctx: Lowering, comp: Computation, instr: Instruction) -> list[MemRef]:
    """The result arrays of a collective, or of the result part of an async start's tuple."""
    if instr.opcode in ("all-gather-start", "collective-permute-start"):
        return [ctx.hbm(comp.name, instr.name, path) for path, _ in leaf_paths(instr.shape) if path[:1] == (1,)]
    return ctx.hbm_leaves(comp.name, instr.name)


def _operands(ctx: Lowering, comp: Computation, instr: Instruction) -> list[MemRef]:
    return [ref for o in instr.operands for ref in ctx.hbm_leaves(comp.name, o)]


def _bank(state: CollectiveState) -> int:
    """The lowest bank no open async collective holds."""
    held = {level for level, _ in state.open_async.values()}
    return min(set(range(len(state.banks))) - held)


def _release(ctx: Lowering, *regs: Reg) -> None:
    for r in dict.fromkeys(regs):
        ctx.release_register(r)


def _make_ring(facts: Facts, plan: GroupPlan, i: int, bank: Bank) -> Ring:
    """Registers of ring ``i`` of ``plan`` for this chip: position, own chunk, the chips of both directions.

    A ring along a grid axis without wraparound (a line) of four or more chips is walked in zigzag order, so
    every step is at most two hops (the natural order's last step would cross the whole line)."""
    state = facts.state
    if plan.axes is None:
        n = state.who.devices
        rank = plan.rank_of()
        pos = facts.table(rank)
        nxt = facts.table([plan.member(d, (rank[d] + 1) % plan.size) for d in range(n)])
        prv = facts.table([plan.member(d, (rank[d] - 1) % plan.size) for d in range(n)])
        return Ring(plan.size, pos, pos, {1: nxt, -1: prv}, {1: bank.arrive[0], -1: bank.arrive[1]})
    ax = plan.axes[i]
    L = ax.length
    arrive = {1: bank.arrive[state.channel(ax.axis, 1)], -1: bank.arrive[state.channel(ax.axis, -1)]}
    coord = facts.axis_position(ax)
    if ax.wraps or L <= 3:
        to = {s: facts.axis_neighbor(ax, coord, s) for s in (1, -1)}
        return Ring(L, coord, coord, to, arrive)
    # zigzag: coordinate c sits at position c/2 (c even) or L-1-(c-1)/2 (c odd)
    pos, odd, t = facts.reg(), facts.reg(), facts.reg()
    facts.alu("div", pos, coord, 2)
    facts.alu("rem", odd, coord, 2)
    facts.alu("mul", t, pos, -2)
    facts.alu("add", t, t, L - 1)
    facts.alu("mul", t, t, odd)
    facts.alu("add", pos, pos, t)
    to = {}
    for s in (1, -1):
        chip = facts.reg()
        facts.alu("add", t, pos, s % L)
        facts.alu("rem", t, t, L)
        zigzag_coordinate(facts, t, chip, L)
        facts.alu("sub", chip, chip, coord)
        facts.alu("mul", chip, chip, ax.stride)
        facts.alu("add", chip, chip, facts.me)
        to[s] = chip
    _release(facts.ctx, odd, t)
    return Ring(L, pos, coord, to, arrive, zigzag=True)


def _lengths(plan: GroupPlan) -> list[int]:
    return [a.length for a in plan.axes] if plan.axes is not None else [plan.size]


def _ring_handshake(facts: Facts, plan: GroupPlan, bank: Bank, directions: list[int]) -> None:
    """Ready signals to every chip that pushes to this one on the rings (``directions[i]`` of ring i: 1 or
    2), then wait for those of the chips this one pushes to."""
    receivers = 0
    for i, nd in enumerate(directions):
        ring = _make_ring(facts, plan, i, bank)
        steps = [1, -1][:nd]
        facts.handshake(bank, [ring.to[-s] for s in steps], 0)
        receivers += nd
        _release(facts.ctx, ring.pos, ring.coord, *ring.to.values())
    if receivers:
        facts.ctx.emit(SemWait, sem=bank.ready, count=receivers)


def _bases(facts: Facts, plan: GroupPlan, bank: Bank, sizes: list[int]) -> list[Reg | int]:
    """``base[i]``: where this chip's chunk of ring ``i`` starts (``base[i-1] + pos_i * sizes[i]``)."""
    out: list[Reg | int] = [0]
    for i, size in enumerate(sizes):
        ring = _make_ring(facts, plan, i, bank)
        b = facts.reg()
        facts.alu("mul", b, ring.coord, size)
        if out[-1] != 0:
            facts.alu("add", b, b, out[-1])
        _release(facts.ctx, ring.pos, ring.coord, *ring.to.values())
        out.append(b)
    return out


# --------------------------------------------------------------------------------------------- algorithms
def all_reduce(
    ctx: Lowering, state: CollectiveState, bank: Bank, plan: GroupPlan, x: MemRef, y: MemRef, fn: str
) -> None:
    """Reduce-scatter then all-gather over the rings of ``plan``, on flat views of ``x`` and ``y``."""
    if plan.size == 1:
        copy_arrays(ctx, [(x, y)])
        return
    facts = Facts(ctx, state)
    xf, yf = _flat(x), _flat(y)
    if yf is None:
        raise CompileError(f"{ctx.hlo}: an all-reduce of {y.shape} (sub-byte elements) is not supported")
    lengths = _lengths(plan)
    group = prod(lengths)
    post: tuple[MemRef, MemRef] | None = None
    if xf is None or x.shape != y.shape:  # different layouts: reduce y in place after a relayout copy
        copy_arrays(ctx, [(x, y)])
        xf = yf
    n = yf.shape.dimensions[0]
    if n % group:  # pad to whole chunks in a scratch copy
        padded = ceil(n / group) * group
        work_ref = ctx.scratch(Shape(yf.shape.element_type, (padded,), layout=Layout((0,))))
        head = MemRef(Space.HBM, work_ref.address, work_ref.shape, Window((0,), (n,)))
        copy_arrays(ctx, [(xf, head)])
        post = (head, yf)
        xf = yf = work_ref
        n = padded
    sizes = [n // prod(lengths[: i + 1]) for i in range(len(lengths))]
    dirs = [len(pieces((n,), 0, s)) for s in sizes]
    _ring_handshake(facts, plan, bank, dirs)
    bases = _bases(facts, plan, bank, sizes)
    work = RingWork(facts)
    for i, size in enumerate(sizes):
        ring = _make_ring(facts, plan, i, bank)
        reduce_scatter_phase(work, ring, xf if i == 0 else yf, yf, bases[i + 1], 0, bases[i], size, fn)
        _release(ctx, ring.pos, ring.coord, *ring.to.values())
    for i in reversed(range(len(sizes))):
        ring = _make_ring(facts, plan, i, bank)
        all_gather_phase(work, ring, yf, 0, bases[i], sizes[i])
        _release(ctx, ring.pos, ring.coord, *ring.to.values())
    if post is not None:
        copy_arrays(ctx, [post])


def reduce_scatter(
    ctx: Lowering, state: CollectiveState, bank: Bank, plan: GroupPlan, x: MemRef, y: MemRef, dim: int, fn: str
) -> None:
    """Reduce-scatter phases along ``dim``: chunk ``rank`` of the sum lands in ``y``."""
    if plan.size == 1:
        copy_arrays(ctx, [(x, y)])
        return
    facts = Facts(ctx, state)
    lengths = _lengths(plan)
    total = x.shape.dimensions[dim]
    sizes = [total // prod(lengths[: i + 1]) for i in range(len(lengths))]
    dirs = [len(pieces(x.shape.dimensions, dim, s)) for s in sizes]
    _ring_handshake(facts, plan, bank, dirs)
    bases = _bases(facts, plan, bank, sizes[:-1])
    partial = ctx.scratch(x.shape) if len(sizes) > 1 else None
    work = RingWork(facts)
    for i, size in enumerate(sizes):
        ring = _make_ring(facts, plan, i, bank)
        last = i == len(sizes) - 1
        src = x if i == 0 else partial
        assert src is not None
        fin, fin_start = (y, 0) if last else (partial, bases[i + 1])
        assert fin is not None
        reduce_scatter_phase(work, ring, src, fin, fin_start, dim, bases[i], size, fn)
        _release(ctx, ring.pos, ring.coord, *ring.to.values())


def all_gather(
    ctx: Lowering,
    state: CollectiveState,
    bank: Bank,
    plan: GroupPlan,
    x: MemRef,
    y: MemRef,
    dim: int,
    part: str = "all",
) -> None:
    """All-gather phases along ``dim``, innermost ring first. ``part`` is ``all``, or for an async
    single-ring gather ``start`` (handshake, stage 0) or ``done`` (the forwarding stages); the split parts
    signal the bank's ``local`` semaphore, which outlives the start."""
    if plan.size == 1:
        copy_arrays(ctx, [(x, y)])
        return
    facts = Facts(ctx, state)
    lengths = _lengths(plan)
    k = x.shape.dimensions[dim]
    sizes = [k * plan.size // prod(lengths[: i + 1]) for i in range(len(lengths))]
    bases = _bases(facts, plan, bank, sizes)
    sent = None
    if part != "all":
        assert bank.local is not None and len(sizes) == 1
        sent = bank.local
    work = RingWork(facts, sent)
    if part != "done":
        _ring_handshake(facts, plan, bank, [len(pieces(y.shape.dimensions, dim, s)) for s in sizes])
    for i in reversed(range(len(sizes))):
        ring = _make_ring(facts, plan, i, bank)
        if i < len(sizes) - 1:
            all_gather_phase(work, ring, y, dim, bases[i], sizes[i])
        elif part == "done":
            all_gather_phase(work, ring, y, dim, bases[i], sizes[i], stages=(1, ring.length))
        else:
            # this chip's shard goes straight to the neighbours at stage 0 and to its own copy of the result
            stages = (0, 1) if part == "start" else None
            all_gather_phase(work, ring, y, dim, bases[i], sizes[i], first=x, stages=stages)
            own = window(ctx, y, dim, bases[-1], k, pieces(y.shape.dimensions, dim, k, False)[0], None, work.tmp[0])
            sem = ctx.semaphore()
            ctx.emit(DmaStart, src=x, dst=own, sem=sem)
            ctx.emit(SemWait, sem=sem, count=1)
        _release(ctx, ring.pos, ring.coord, *ring.to.values())


def _rank(facts: Facts, plan: GroupPlan) -> Reg:
    """A register holding this chip's rank in its group."""
    if plan.axes is None:
        return facts.table(plan.rank_of())
    out, t = facts.reg(), facts.reg()
    facts.alu("mov", out, 0)
    q = plan.size
    for ax in plan.axes:
        q //= ax.length
        facts.axis_position(ax, t)
        facts.alu("mul", t, t, q)
        facts.alu("add", out, out, t)
    _release(facts.ctx, t)
    return out


def _member(facts: Facts, plan: GroupPlan, rank: Reg, j: Reg) -> Reg:
    """The chip of rank ``j`` (a register) in this chip's group (``rank`` holds this chip's rank)."""
    assert plan.axes is not None
    out = facts.reg()
    t, u = facts.reg(), facts.reg()
    facts.alu("mov", out, facts.me)
    q = plan.size
    for ax in plan.axes:
        q //= ax.length
        for reg, src in ((t, j), (u, rank)):
            facts.alu("div", reg, src, q)
            facts.alu("rem", reg, reg, ax.length)
        facts.alu("sub", t, t, u)
        facts.alu("mul", t, t, ax.stride)
        facts.alu("add", out, out, t)
    _release(facts.ctx, t, u)
    return out


def _select(facts: Facts, key: Reg, values: list[int]) -> Reg:
    """A register holding ``values[key]`` (branch-free, as :meth:`Facts.table` but keyed by a register)."""
    out, t = facts.reg(), facts.reg()
    facts.alu("mov", out, values[0])
    for i, v in enumerate(values):
        if i and v != values[0]:
            facts.alu("eq", t, key, i)
            facts.alu("mul", t, t, v - values[0])
            facts.alu("add", out, out, t)
    _release(facts.ctx, t)
    return out


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
    n = state.who.devices
    rank_of = plan.rank_of()
    rank = _rank(facts, plan)
    j, off_j, off_r = facts.reg(), facts.reg(), facts.reg()

    def peer(delta: int) -> Reg:
        """The chip of rank ``(rank + delta) % S``; also leaves that rank in ``j``."""
        facts.alu("add", j, rank, delta)
        facts.alu("rem", j, j, S)
        if plan.axes is not None:
            return _member(facts, plan, rank, j)
        return facts.table([plan.member(d, (rank_of[d] + delta) % S) for d in range(n)])

    for delta in range(1, S):  # every other member pushes to this chip
        chip = peer(delta)
        ctx.emit(SemSignal, sem=bank.ready, count=1, chip=chip)
        _release(ctx, chip)
    ctx.emit(SemWait, sem=bank.ready, count=S - 1)
    sem, local = ctx.semaphore(), ctx.semaphore()
    if dim is not None:
        x, y = xs[0], ys[0]
        c = x.shape.dimensions[dim] // S
        facts.alu("mul", off_r, rank, c)

        def chunk(ref: MemRef, start: Reg) -> MemRef:
            offsets: list[Reg | int] = [0] * ref.shape.rank
            sizes = list(ref.shape.dimensions)
            offsets[dim], sizes[dim] = start, c
            return MemRef(Space.HBM, ref.address, ref.shape, Window(tuple(offsets), tuple(sizes)))

        for delta in range(1, S):
            chip = peer(delta)
            facts.alu("mul", off_j, j, c)
            ctx.emit(DmaStart, src=chunk(x, off_j), dst=chunk(y, off_r), chip=chip, dst_sem=bank.arrive[0], sem=sem)
            _release(ctx, chip)
        ctx.emit(DmaStart, src=chunk(x, off_r), dst=chunk(y, off_r), sem=local)
    else:
        if any(r.shape != xs[0].shape for r in xs + ys):
            raise CompileError(f"{ctx.hlo}: the tuple form of all-to-all needs operands and results of one shape")
        ya = [r.address - ys[0].address for r in ys]
        xa = [r.address - xs[0].address for r in xs]
        dst_base = _select(facts, rank, ya)
        for delta in range(1, S):
            chip = peer(delta)
            src_base = _select(facts, j, xa)
            src = MemRef(Space.HBM, xs[0].address, xs[0].shape, None, src_base)
            dst = MemRef(Space.HBM, ys[0].address, ys[0].shape, None, dst_base)
            ctx.emit(DmaStart, src=src, dst=dst, chip=chip, dst_sem=bank.arrive[0], sem=sem)
            _release(ctx, chip, src_base)
        own = _select(facts, rank, xa)
        ctx.emit(
            DmaStart, src=MemRef(Space.HBM, xs[0].address, xs[0].shape, None, own),
            dst=MemRef(Space.HBM, ys[0].address, ys[0].shape, None, dst_base), sem=local,
        )  # fmt: skip
    ctx.emit(SemWait, sem=bank.arrive[0], count=S - 1)
    ctx.emit(SemWait, sem=sem, count=S - 1)
    ctx.emit(SemWait, sem=local, count=1)


def _zero_fill(ctx: Lowering, y: MemRef) -> None:
    """Write zeros over ``y`` (a collective-permute result no pair sends to)."""
    flat = _flat(y)
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


def collective_permute(
    ctx: Lowering, state: CollectiveState, instr: Instruction, x: MemRef, y: MemRef, part: str, bank: Bank
) -> None:
    """Push ``x`` to this chip's target; ``part`` is ``all`` (sync), ``start`` (push) or ``done`` (wait)."""
    target, source = permute_pairs(instr, state.who)
    facts = Facts(ctx, state)
    tgt, src = facts.table(target), facts.table(source)
    sent = bank.local if part != "all" and bank.local is not None else None
    if part in ("all", "start"):
        if sent is None:
            sent = ctx.semaphore()
        no_signal, no_push, self_copy, end = (
            ctx.label(f"{instr.name}.{t}") for t in ("nosig", "nopush", "self", "end")
        )
        ctx.emit(Branch, cond="lt", a=src, b=0, target=no_signal)
        ctx.emit(Branch, cond="eq", a=src, b=facts.me, target=no_signal)
        ctx.emit(SemSignal, sem=bank.ready, count=1, chip=src)
        ctx.place_label(no_signal)
        ctx.emit(Branch, cond="lt", a=tgt, b=0, target=no_push)
        ctx.emit(Branch, cond="eq", a=tgt, b=facts.me, target=self_copy)
        ctx.emit(SemWait, sem=bank.ready, count=1)
        ctx.emit(DmaStart, src=x, dst=y, chip=tgt, dst_sem=bank.arrive[0], sem=sent)
        ctx.emit(Jump, target=no_push)
        ctx.place_label(self_copy)
        local = ctx.semaphore()
        ctx.emit(DmaStart, src=x, dst=y, sem=local)
        ctx.emit(SemWait, sem=local, count=1)
        ctx.place_label(no_push)
        if -1 in source:
            ctx.emit(Branch, cond="ge", a=src, b=0, target=end)
            _zero_fill(ctx, y)
            ctx.place_label(end)
    if part in ("all", "done"):
        assert sent is not None
        skip_recv, skip_sent = ctx.label(f"{instr.name}.norecv"), ctx.label(f"{instr.name}.nosent")
        ctx.emit(Branch, cond="lt", a=src, b=0, target=skip_recv)
        ctx.emit(Branch, cond="eq", a=src, b=facts.me, target=skip_recv)
        ctx.emit(SemWait, sem=bank.arrive[0], count=1)
        ctx.place_label(skip_recv)
        ctx.emit(Branch, cond="lt", a=tgt, b=0, target=skip_sent)
        ctx.emit(Branch, cond="eq", a=tgt, b=facts.me, target=skip_sent)
        ctx.emit(SemWait, sem=sent, count=1)
        ctx.place_label(skip_sent)


# --------------------------------------------------------------------------------------------- rules
def _setup(ctx: Lowering, instr: Instruction) -> tuple[CollectiveState, GroupPlan]:
    state = collective_state(ctx)
    return state, plan_groups(ctx.module, instr, state.who, state.topology)


def _check_split(
    instr: Instruction, whole: tuple[int, ...], part: tuple[int, ...], dim: int, size: int, big: str, small: str
) -> None:
    """The ``whole`` array is ``size`` chunks of ``part`` along ``dim`` and equal elsewhere."""
    expect = tuple(size * n if d == dim else n for d, n in enumerate(part))
    if whole != expect:
        raise _fail(
            instr,
            f"dimension {dim} of the {big} is {whole[dim] if dim < len(whole) else '?'}, not {size} x "
            f"{part[dim] if dim < len(part) else '?'} (group size x {small}), or other dimensions differ",
        )


def _pairs(instr: Instruction, xs: list[MemRef], ys: list[MemRef]) -> list[tuple[MemRef, MemRef]]:
    """Operand and result arrays, one pair per leaf; empty arrays have nothing to move."""
    if len(xs) != len(ys):
        raise _fail(instr, f"{len(xs)} operand arrays but {len(ys)} results")
    return [(x, y) for x, y in zip(xs, ys) if x.shape.element_count and y.shape.element_count]


@lowering("all-reduce", "all-reduce-start")
def lower_all_reduce(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    state, plan = _setup(ctx, instr)
    fn = _reducer(ctx, instr)
    level = _bank(state)
    for x, y in _pairs(instr, _operands(ctx, comp, instr), _result_leaves(ctx, comp, instr)):
        all_reduce(ctx, state, state.banks[level], plan, x, y, fn)
    if instr.opcode.endswith("-start"):
        state.open_async[instr.name] = (level, False)


@lowering("reduce-scatter")
def lower_reduce_scatter(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    state, plan = _setup(ctx, instr)
    fn = _reducer(ctx, instr)
    (dim,) = instr.attr("dimensions", (0,))
    bank = state.banks[_bank(state)]
    for x, y in _pairs(instr, _operands(ctx, comp, instr), _result_leaves(ctx, comp, instr)):
        _check_split(instr, x.shape.dimensions, y.shape.dimensions, dim, plan.size, "operand", "result")
        reduce_scatter(ctx, state, bank, plan, x, y, dim, fn)


@lowering("all-gather", "all-gather-start")
def lower_all_gather(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    state, plan = _setup(ctx, instr)
    (dim,) = instr.attr("dimensions", (0,))
    pairs = _pairs(instr, _operands(ctx, comp, instr), _result_leaves(ctx, comp, instr))
    level = _bank(state)
    start = instr.opcode.endswith("-start")
    split = start and len(pairs) == 1 and len(_lengths(plan)) == 1 and plan.size > 2
    for x, y in pairs:
        _check_split(instr, y.shape.dimensions, x.shape.dimensions, dim, plan.size, "result", "operand")
        all_gather(ctx, state, state.banks[level], plan, x, y, dim, "start" if split else "all")
    if start:
        state.open_async[instr.name] = (level, split)


@lowering("all-to-all")
def lower_all_to_all(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    state, plan = _setup(ctx, instr)
    dims = instr.attr("dimensions")
    xs, ys = _operands(ctx, comp, instr), _result_leaves(ctx, comp, instr)
    bank = state.banks[_bank(state)]
    if dims:
        for x, y in _pairs(instr, xs, ys):
            if x.shape.dimensions != y.shape.dimensions or x.shape.dimensions[dims[0]] % plan.size:
                raise _fail(
                    instr, f"dimension {dims[0]} of {x.shape} does not split into {plan.size} chunks (or the result "
                    f"{y.shape} has other dimensions)",
                )  # fmt: skip
            all_to_all(ctx, state, bank, plan, [x], [y], dims[0])
    else:
        if len(xs) != plan.size:
            raise _fail(instr, f"the tuple form needs one operand per participant ({plan.size}), got {len(xs)}")
        all_to_all(ctx, state, bank, plan, xs, ys, None)


@lowering("collective-permute", "collective-permute-start")
def lower_collective_permute(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    state = collective_state(ctx)
    xs, ys = _operands(ctx, comp, instr), _result_leaves(ctx, comp, instr)
    if len(instr.operands) != 1 or len(xs) != 1 or len(ys) != 1:
        raise _fail(instr, "only the one-operand form (no in-place start indices) is supported")
    start = instr.opcode.endswith("-start")
    level = _bank(state)
    collective_permute(ctx, state, instr, xs[0], ys[0], "start" if start else "all", state.banks[level])
    if start:
        state.open_async[instr.name] = (level, True)


@lowering("all-reduce-done", "all-gather-done", "collective-permute-done")
def lower_done(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    state = collective_state(ctx)
    start = comp[instr.operands[0]]
    held = state.open_async.pop(start.name, None)
    if held is None:
        raise _fail(instr, f"its operand {start.name} is not an async start lowered before it")
    level, split = held
    bank = state.banks[level]
    results = _result_leaves(ctx, comp, start)
    if start.opcode == "collective-permute-start":
        collective_permute(ctx, state, start, _operands(ctx, comp, start)[0], results[0], "done", bank)
    elif start.opcode == "all-gather-start" and split:
        plan = plan_groups(ctx.module, start, state.who, state.topology)
        (dim,) = start.attr("dimensions", (0,))
        all_gather(ctx, state, bank, plan, _operands(ctx, comp, start)[0], results[0], dim, "done")
    copy_arrays(ctx, list(zip(results, ctx.hbm_leaves(comp.name, instr.name))))


@lowering("replica-id", "partition-id")
def lower_device_id(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """``chip_id // num_partitions`` (replica) or ``chip_id % num_partitions`` (partition), as a u32[]."""
    who = participants(ctx.module, ctx.config.ici.shape)
    out = ctx.hbm(comp.name, instr.name)
    reg = ctx.register()
    ctx.emit(ScalarAlu, fn="chip_id", dst=reg)
    ctx.emit(ScalarAlu, fn="div" if instr.opcode == "replica-id" else "rem", dst=reg, a=reg, b=who.partitions)
    slot = ctx.smem(out.shape)
    ctx.emit(ScalarStore, dst=slot, src=reg)
    sem = ctx.semaphore()
    ctx.emit(DmaStart, src=slot, dst=out, sem=sem)
    ctx.emit(SemWait, sem=sem, count=1)
