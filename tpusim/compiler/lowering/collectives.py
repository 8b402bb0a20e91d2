"""Collectives as ICI data movement: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute,
collective-broadcast (and async ``-start`` / ``-done`` pairs, or ``async-start`` wrapping any of them),
replica-id and partition-id.

Every chip runs the same stream; device ``d`` (``replica * num_partitions + partition``) is chip ``d``.
Algorithms (docs/multichip.md has the cost model):

* all-reduce: reduce-scatter then all-gather over the group's rings, on a flat view of the buffer (the
  reduction is elementwise, so any split of the bytes works): for a group that is an aligned block of the
  grid, one ring per axis (reduce-scatter over the most major axis first, all-gather in reverse order),
  else one logical ring in rank order. Every ring is bidirectional when its chunks can be halved.
  The reduction runs on the receiving chip's VPU (:mod:`.collective_ring`).
* reduce-scatter / all-gather: the same phases on windows along the collective's dimension, so chunk
  ``r`` of the result is rank ``r``'s as HLO requires.
* all-to-all, collective-permute, collective-broadcast: direct pushes (:mod:`.collective_direct`).

Each collective starts with the handshake of :mod:`.collective_sync`. An async pair overlaps compute:
collective-permute-start pushes at once and its done waits. An all-reduce-start runs whole on the core's
async sequencer (a site of it the start requests, :meth:`Lowering.on_async_site`), and an all-gather-start
pushes its first step (it reads the operand, which may die at the start) and leaves the other steps to the
async sequencer; the done waits for it. Under megacore the start runs up to the pushes of the first
all-gather step and the done runs the forwarding steps. ``-done`` copies the result out of the start's
buffer when buffer assignment gave it another one.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from math import ceil, prod

import ml_dtypes
import numpy as np

from tpusim.compiler.buffer_assignment import leaf_paths
from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.hlo.opcodes import COLLECTIVES
from tpusim.compiler.hlo.xla_forms import wrapped_collective
from tpusim.compiler.lowering.collective_direct import (
    all_gather_direct,
    all_to_all,
    collective_broadcast,
    collective_permute,
    direct_gather_pays,
)
from tpusim.compiler.lowering.collective_landing import reduce_scatter_phase
from tpusim.compiler.lowering.collective_plan import GroupPlan, plan_groups
from tpusim.compiler.lowering.collective_ring import (
    Reducer,
    Ring,
    RingWork,
    all_gather_stages,
    emit,
    interleave,
    pieces,
    tile_rows,
    window,
    zigzag_coordinate,
)
from tpusim.compiler.lowering.collective_sync import (
    PARTS,
    Bank,
    CollectiveState,
    Facts,
    collective_state,
    flat_view,
    participants,
)
from tpusim.compiler.lowering.context import Lowering
from tpusim.compiler.lowering.control import copy_arrays
from tpusim.compiler.lowering.epilogue import Chain, Side, epilogue_chain
from tpusim.compiler.lowering.registry import lowering
from tpusim.isa import (
    Const,
    DmaStart,
    MemRef,
    Reg,
    ScalarAlu,
    ScalarStore,
    SemSignal,
    SemWait,
    Space,
    Window,
)
from tpusim.memory import AnyShape, ElementType, Layout, Shape
from tpusim.semantics.elementwise import apply
from tpusim.semantics.errors import SemanticsError

__all__ = ["REDUCERS"]

REDUCERS = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})
"""``to_apply`` roots the VPU reduces with (commutative, as the ring order is not the group order)."""


# --------------------------------------------------------------------------------------------- helpers
def _fail(instr: Instruction, message: str) -> CompileError:
    return CompileError(f"{instr.name} ({instr.opcode}): {message}")


def _reducer(ctx: Lowering, instr: Instruction) -> Reducer:
    """How ``instr`` combines two blocks: its reduction's one elementwise op, or the computation as an
    elementwise chain of its two parameters (XLA:TPU's packed u8 reductions)."""
    name = instr.attr("to_apply")
    comp = ctx.module[name]
    root = comp[comp.root]
    params = sorted(i.name for i in comp.instructions if i.opcode == "parameter")
    if root.opcode in REDUCERS and len(params) == 2 and sorted(root.operands) == params:
        return Reducer(fn=root.opcode)
    try:
        chain = epilogue_chain(comp, 0, ctx.module) if len(params) == 2 and isinstance(root.shape, Shape) else None
    except ValueError:
        chain = None
    sides = [s for s in chain.sources if isinstance(s, Side)] if chain is not None else []
    if chain is not None and sides == [Side(1, ())] and _reduces(chain, root.shape):
        return Reducer(chain=chain)
    raise _fail(
        instr,
        f"the reduction {name} (root {root.opcode}) is not one elementwise op of its two parameters "
        f"({', '.join(sorted(REDUCERS))}) nor an elementwise chain of them that commutes and associates",
    )


_SAMPLES = 4096
"""Values a reduction chain is tried on before it combines a collective's blocks."""


def _reduces(chain: Chain, shape: AnyShape) -> bool:
    """Whether ``chain`` commutes and associates (exactly for integers, to a relative 1e-3 for floats) on
    :data:`_SAMPLES` random values and the type's extremes, computed with the VPU's own elementwise kernels:
    a ring combines blocks in its own order, not the reference's, which only such a reduction makes
    irrelevant (XLA requires it of a collective's computation). Integer words whose lanes the chain computes
    on as floats (XLA:TPU's f16 sums, two to a u32 word) are tried exactly, on words of small integers in
    every lane (:func:`_float_lanes`), where float sums and products do not round."""
    if not isinstance(shape, Shape) or shape.element_type.dtype is None:
        return False
    dtype = np.dtype(shape.element_type.dtype)
    rng = np.random.default_rng(0)
    lanes = [s.etype for s in chain.steps if s.etype.is_float] if dtype.kind in "iu" else []
    if lanes:
        values = _float_lanes(rng, dtype, min(lanes, key=lambda t: t.bits))
        if values is None:
            return False
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, (3, _SAMPLES), dtype=dtype, endpoint=True)
        values[:, :4] = np.array([info.min, info.max, 0, 1], dtype)
    elif dtype.kind == "f":
        values = rng.standard_normal((3, _SAMPLES)).astype(dtype)
    else:
        return False
    a, b, c = values
    try:
        ab, ba = _combine(chain, a, b), _combine(chain, b, a)
        left, right = _combine(chain, ab, c), _combine(chain, a, _combine(chain, b, c))
    except SemanticsError:
        return False
    if dtype.kind == "f":
        return bool(np.array_equal(ab, ba, equal_nan=True) and np.allclose(left, right, rtol=1e-3, equal_nan=True))
    return bool(np.array_equal(ab, ba) and np.array_equal(left, right))


def _float_lanes(rng: np.random.Generator, dtype: np.dtype, lane: ElementType) -> np.ndarray | None:
    """Three rows of :data:`_SAMPLES` words of ``dtype``, each lane of ``lane``'s width a small integer in that
    float type (so small that the sum or product of three is exact), little-endian: None when the lanes do not
    tile the word."""
    bits = dtype.itemsize * 8
    if lane.dtype is None or bits % lane.bits:
        return None
    m = int(2 ** ((ml_dtypes.finfo(lane.dtype).nmant + 1) / 3))
    small = rng.integers(-m, m, (3, _SAMPLES, bits // lane.bits), endpoint=True).astype(lane.dtype)
    return np.ascontiguousarray(small).view(dtype).reshape(3, _SAMPLES)


def _combine(chain: Chain, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``chain`` on values ``a`` (value 0) and ``b`` (its side operand), step by step."""
    values = [a]
    for s in chain.sources:
        if not isinstance(s, (Side, Const)):
            raise SemanticsError(f"a reduction reads {s}")
        values.append(b if isinstance(s, Side) else np.asarray(s.value, s.etype.dtype))
    for step in chain.steps:
        values.append(apply(step.fn, [values[k] for k in step.args], step.etype, step.direction))
    return values[-1]


def _result_leaves(ctx: Lowering, comp: Computation, instr: Instruction) -> list[MemRef]:
    """The result arrays of a collective, or of the result part of an async start's tuple."""
    if instr.opcode in ("all-gather-start", "collective-permute-start", "async-start", "async-update"):
        return [ctx.home(comp.name, instr.name, path) for path, _ in leaf_paths(instr.shape) if path[:1] == (1,)]
    return ctx.home_leaves(comp.name, instr.name)


def _operands(ctx: Lowering, comp: Computation, instr: Instruction) -> list[MemRef]:
    return [ref for o in instr.operands for ref in ctx.home_leaves(comp.name, o)]


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
        arrive = {1: bank.arrive[0], -1: bank.arrive[1]}
        return Ring(plan.size, pos, pos, {1: nxt, -1: prv}, arrive, credit=_credits(bank, arrive))
    ax = plan.axes[i]
    L = ax.length
    arrive = {1: bank.arrive[state.channel(ax.axis, 1)], -1: bank.arrive[state.channel(ax.axis, -1)]}
    coord = facts.axis_position(ax)
    if ax.wraps or L <= 3:
        to = {s: facts.axis_neighbor(ax, coord, s) for s in (1, -1)}
        return Ring(L, coord, coord, to, arrive, credit={} if ax.switched else _credits(bank, arrive))
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
    return Ring(L, pos, coord, to, arrive, zigzag=True, credit={} if ax.switched else _credits(bank, arrive))


def _credits(bank: Bank, arrive: dict[int, int]) -> dict[int, int]:
    """The credit semaphores beside a ring's arrival semaphores (none for a ring over the data-center network,
    whose partial sums land in HBM: a credit would cross the network again)."""
    out = {s: bank.credit_for(a) for s, a in arrive.items()}
    return {s: c for s, c in out.items() if c is not None}


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


def _bases(
    facts: Facts, plan: GroupPlan, bank: Bank, sizes: list[int], order: list[int] | None = None, start: int = 0
) -> list[Reg | int]:
    """``base[r]``: where this chip's chunk of round ``r`` starts (``base[r-1] + pos * sizes[r]`` on the ring
    of round ``r``: ring ``order[r]``, default ``r``), from ``start``."""
    out: list[Reg | int] = [start]
    for r, size in enumerate(sizes):
        ring = _make_ring(facts, plan, order[r] if order is not None else r, bank)
        b = facts.reg()
        facts.alu("mul", b, ring.coord, size)
        if out[-1] != 0:
            facts.alu("add", b, b, out[-1])
        _release(facts.ctx, ring.pos, ring.coord, *ring.to.values())
        out.append(b)
    return out


def _axis_orders(plan: GroupPlan, kind: str) -> list[list[int]] | None:
    """The rings a collective over several torus axes runs at once: part ``j`` of the data takes the group's
    ICI axes (of two or more chips) in the order rotated by ``j``, so in every round each part is on another
    axis and the parts' rings carry data together (XLA:TPU's collectives over several axes use every axis's
    links at once; the scaling book prices a gather over ``n`` axes at ``n`` times one axis's bandwidth).

    The slices of a multi-slice system (joined by the data-center network, far slower than ICI) come where
    the data is smallest: every part reduces over them last and gathers over them first (``kind``
    ``gather``; ``scatter`` and ``reduce`` put them last; an all-reduce gathers in reverse), so the network
    carries one slice's share of the data, as a hierarchical collective does. None for one axis or a group
    that is not a block of the grid."""
    if plan.axes is None:
        return None
    axes = [i for i, a in enumerate(plan.axes) if a.length > 1 and not a.switched]
    slow = [i for i, a in enumerate(plan.axes) if a.length > 1 and a.switched]
    if len(axes) + len(slow) < 2:
        return None
    rotations = [axes[j:] + axes[:j] for j in range(min(PARTS, len(axes)))] or [[]]
    return [slow + o if kind == "gather" else o + slow for o in rotations]


def _part_rings(facts: Facts, plan: GroupPlan, bank: Bank, rings: dict[int, Ring], parts: int) -> list[dict[int, Ring]]:
    """Each part's rings: the group's own, but along the slices of a multi-slice system (the one ring every
    part takes in the same round) with the part's own arrival semaphores, so the parts' phases there run at
    once and each counts only its own arrivals."""
    assert plan.axes is not None
    state = facts.state
    out = []
    for j in range(parts):
        mine = dict(rings)
        for a, ring in rings.items():
            ax = plan.axes[a]
            if j and ax.switched:
                arrive = {s: bank.arrive[state.channel(ax.axis, s, j)] for s in (1, -1)}
                mine[a] = replace(ring, arrive=arrive)
        out.append(mine)
    return out


_SPLIT_STEPS = 60
"""Fractions of the data the parts of a collective over several axes may take, in steps of 1/60."""


def _part_units(plan: GroupPlan, orders: list[list[int]], units: int, kind: str) -> list[int]:
    """How many of ``units`` each part takes: the split whose rounds, each as long as its slowest part's ring,
    take the least time in all. A ring whose both directions have links of their own carries a chunk twice
    as fast as a line (an axis of two chips, or one without its wraparound link), so on a ring-and-line block
    the part that crosses the line with the most data takes less (v5p 4x2); where every axis is alike the
    split is even. ``kind``: ``gather`` (round ``r`` moves the data of the axes before it), ``scatter`` (of
    those after it) or ``reduce`` (a scatter then a gather of the same rounds, on a flat buffer)."""
    m = min(len(orders), units)
    even = [units // m + (j < units % m) for j in range(m)]
    assert plan.axes is not None
    axes = plan.axes

    def factors(order: list[int]) -> list[float]:
        out = []
        for r, a in enumerate(order):
            speed = 2.0 if axes[a].wraps and axes[a].length >= 3 else 1.0
            size: float
            if kind == "gather":
                size = prod(axes[b].length for b in order[:r])
            elif kind == "scatter":
                size = prod(axes[b].length for b in order[r + 1 :])
            else:
                size = 1 / prod(axes[b].length for b in order[: r + 1])
            out.append((axes[a].length - 1) * size / speed)
        return out

    per = [factors(o) for o in orders[:m]]
    if m < 2 or all(f == per[0] for f in per):
        return even

    def cost(split: tuple[float, ...]) -> float:
        return sum(max(w * f[r] for w, f in zip(split, per)) for r in range(len(per[0])))

    grid = [
        tuple(k / _SPLIT_STEPS for k in ks)
        for ks in itertools.product(range(1, _SPLIT_STEPS), repeat=m - 1)
        if sum(ks) < _SPLIT_STEPS
    ]
    splits = [(*g, 1 - sum(g)) for g in grid]
    best = min(splits, key=lambda sp: (round(cost(sp), 9), max(sp) - min(sp)))
    if cost(best) >= cost(tuple(n / units for n in even)) * (1 - 1e-9):
        return even
    counts = [max(1, int(units * f)) for f in best[:-1]]
    return [*counts, units - sum(counts)] if units - sum(counts) >= 1 else even


def _works(facts: Facts, sent: list[int | None]) -> list[RingWork]:
    """The works of ``len(sent)`` parts run at once, sharing the first one's scratch registers."""
    m = len(sent)
    lead = RingWork(facts, sent[0], share=(0, m))
    return [lead, *(RingWork(facts, sent[j], share=(j, m), lead=lead) for j in range(1, m))]


# --------------------------------------------------------------------------------------------- algorithms
def _all_reduce_in_place(x: MemRef, y: MemRef, plan: GroupPlan) -> bool:
    """Whether the ring phases can run on the flat views of ``x`` and ``y`` as they are (no relayout copy,
    no padded scratch copy): the condition for splitting an async all-reduce between its start and done."""
    xf, yf = flat_view(x), flat_view(y)
    chunks = plan.size
    return xf is not None and yf is not None and x.shape == y.shape and yf.shape.dimensions[0] % chunks == 0


def all_reduce(
    ctx: Lowering,
    state: CollectiveState,
    bank: Bank,
    plan: GroupPlan,
    x: MemRef,
    y: MemRef,
    fn: Reducer,
    part: str = "all",
) -> None:
    """Reduce-scatter then all-gather over the rings of ``plan``, on flat views of ``x`` and ``y``.

    ``part`` ``start`` stops after the first all-gather step's pushes (async start: the operand is read
    only up to there), ``done`` emits the rest; both need :func:`_all_reduce_in_place`."""
    if plan.size == 1:
        if part != "done":
            copy_arrays(ctx, [(x, y)])
        return
    facts = Facts(ctx, state)
    xf, yf = flat_view(x), flat_view(y)
    if yf is None:
        raise CompileError(f"{ctx.hlo}: an all-reduce of {y.shape} (sub-byte elements) is not supported")
    lengths = _lengths(plan)
    orders = _axis_orders(plan, "reduce")
    group = prod(lengths)
    post: tuple[MemRef, MemRef] | None = None
    if part == "all" and (xf is None or x.shape != y.shape):  # other layouts: reduce y in place after a copy
        copy_arrays(ctx, [(x, y)])
        xf = yf
    n = yf.shape.dimensions[0]
    if part == "all" and n % group:  # pad to whole chunks in a scratch copy
        padded = ceil(n / group) * group
        work_ref = ctx.scratch(Shape(yf.shape.element_type, (padded,), layout=Layout((0,))))
        head = MemRef(Space.HBM, work_ref.address, work_ref.shape, Window((0,), (n,)))
        assert xf is not None  # part == "all" made it yf above when the layouts differ
        copy_arrays(ctx, [(xf, head)])
        post = (head, yf)
        xf = yf = work_ref
        n = padded
    assert xf is not None
    if orders:
        _all_reduce_axes_at_once(facts, plan, bank, orders, xf, yf, fn, part)
        if post is not None:
            copy_arrays(ctx, [post])
        return
    sizes = [n // prod(lengths[: i + 1]) for i in range(len(lengths))]
    bases = _bases(facts, plan, bank, sizes)
    work = RingWork(facts, bank.local if part != "all" else None)
    last = len(sizes) - 1
    if part != "done":
        _ring_handshake(facts, plan, bank, [len(pieces((n,), 0, s)) for s in sizes])
        used: set[int] = set()  # (arrival channels the reduce-scatter phases have taken since the handshake)
        for i, size in enumerate(sizes):
            ring = _make_ring(facts, plan, i, bank)
            src = xf if i == 0 else yf
            emit(
                reduce_scatter_phase(
                    work, ring, src, yf, bases[i + 1], 0, bases[i], size, fn, unrolled=False, used=used
                )
            )
            _release(ctx, ring.pos, ring.coord, *ring.to.values())
    for i in reversed(range(len(sizes))):
        stages = {"start": (0, 1), "done": (1, lengths[i])}.get(part) if i == last else None
        if part == "start" and i != last:
            break
        ring = _make_ring(facts, plan, i, bank)
        emit(all_gather_stages(work, ring, yf, 0, bases[i], sizes[i], stages=stages, unrolled=False))
        _release(ctx, ring.pos, ring.coord, *ring.to.values())
    if post is not None:
        copy_arrays(ctx, [post])


def _stages(part: str, length: int, first: bool) -> tuple[int, int] | None:
    """The stages of an all-gather phase a ``part`` of an async collective emits: the start only the first
    phase's stage 0, the done the rest of it (later phases whole)."""
    if not first or part == "all":
        return None
    return (0, 1) if part == "start" else (1, length)


def _all_reduce_axes_at_once(
    facts: Facts,
    plan: GroupPlan,
    bank: Bank,
    orders: list[list[int]],
    xf: MemRef,
    yf: MemRef,
    fn: Reducer,
    part: str = "all",
) -> None:
    """All-reduce of flat ``xf`` into ``yf`` over a torus block: part ``j`` of the buffer (its ``j``-th of
    ``len(orders)`` slices, as equal as whole multiples of the group size allow) reduce-scatters over the
    axes in ``orders[j]`` and all-gathers back in the reverse order; in every round the parts' rings (one
    axis each, all different) run at once. ``part`` ``start`` stops after the first all-gather stage's
    pushes, ``done`` emits the rest (each part's pushes signal a semaphore of the bank's, which outlives the
    start)."""
    ctx = facts.ctx
    lengths = _lengths(plan)
    unit = prod(lengths)
    counts = [unit * n for n in _part_units(plan, orders, yf.shape.dimensions[0] // unit, "reduce")]
    m = len(counts)
    orders = orders[:m]
    offsets = [sum(counts[:j]) for j in range(m)]
    sizes = [[c // prod(lengths[a] for a in o[: r + 1]) for r in range(len(o))] for c, o in zip(counts, orders)]
    directions: dict[int, int] = {}
    for c, order, sz in zip(counts, orders, sizes):
        for a, size in zip(order, sz):
            directions[a] = max(directions.get(a, 0), len(pieces((c,), 0, size)))
    if part != "done":
        _ring_handshake(facts, plan, bank, [directions.get(i, 0) for i in range(len(lengths))])
    rings = {a: _make_ring(facts, plan, a, bank) for a in orders[0]}
    own = _part_rings(facts, plan, bank, rings, m)
    used: set[int] = set()  # (arrival channels the reduce-scatter phases have taken since the handshake)
    assert part == "all" or len(bank.locals) >= m, "an async collective's bank holds a semaphore per part"
    works = _works(facts, [bank.locals[j] if part != "all" else None for j in range(m)])
    rounds = range(len(orders[0]))

    def base(j: int, r: int) -> Reg | int:
        """Where part ``j``'s chunk of round ``r`` starts: its slice, then this chip's chunk of each earlier
        round (a fresh register, computed when a round needs it so few are live at once)."""
        if r == 0:
            return offsets[j]
        out, t = facts.reg(), facts.reg()
        facts.alu("mul", out, rings[orders[j][0]].coord, sizes[j][0])
        for i in range(1, r):
            facts.alu("mul", t, rings[orders[j][i]].coord, sizes[j][i])
            facts.alu("add", out, out, t)
        facts.release(t)
        if offsets[j]:
            facts.alu("add", out, out, offsets[j])
        return out

    if part != "done":
        starts = [base(j, 0) for j in range(m)]
        for r in rounds:
            src = xf if r == 0 else yf
            ends = [base(j, r + 1) for j in range(m)]
            interleave(
                [
                    reduce_scatter_phase(w, own[j][o[r]], src, yf, ends[j], 0, starts[j], sz[r], fn, used=used)
                    for j, (w, o, sz) in enumerate(zip(works, orders, sizes))
                ]
            )
            facts.release(*starts)
            starts = ends
        facts.release(*starts)
    for r in reversed(rounds):
        first = r == rounds[-1]
        if part == "start" and not first:
            break
        starts = [base(j, r) for j in range(m)]
        interleave(
            [
                all_gather_stages(
                    w, own[j][o[r]], yf, 0, starts[j], sz[r], stages=_stages(part, rings[o[r]].length, first)
                )
                for j, (w, o, sz) in enumerate(zip(works, orders, sizes))
            ]
        )
        facts.release(*starts)
    for ring in rings.values():
        _release(ctx, ring.pos, ring.coord, *ring.to.values())
    for w in works:
        w.release()


def reduce_scatter(
    ctx: Lowering, state: CollectiveState, bank: Bank, plan: GroupPlan, x: MemRef, y: MemRef, dim: int, fn: Reducer
) -> None:
    """Reduce-scatter phases along ``dim``: chunk ``rank`` of the sum lands in ``y``."""
    if plan.size == 1:
        copy_arrays(ctx, [(x, y)])
        return
    facts = Facts(ctx, state)
    lengths = _lengths(plan)
    orders = _axis_orders(plan, "scatter")
    if orders is not None:
        _reduce_scatter_axes_at_once(facts, plan, bank, orders, x, y, dim, fn)
        return
    total = x.shape.dimensions[dim]
    sizes = [total // prod(lengths[: i + 1]) for i in range(len(lengths))]
    dirs = [len(pieces(x.shape.dimensions, dim, s)) for s in sizes]
    _ring_handshake(facts, plan, bank, dirs)
    used: set[int] = set()  # (arrival channels the reduce-scatter phases have taken since the handshake)
    bases = _bases(facts, plan, bank, sizes[:-1])
    partial = ctx.scratch(x.shape) if len(sizes) > 1 else None
    work = RingWork(facts, bank.local if ctx.on_async else None)  # (the async sequencer takes no scoped one)
    for i, size in enumerate(sizes):
        ring = _make_ring(facts, plan, i, bank)
        last = i == len(sizes) - 1
        src = x if i == 0 else partial
        assert src is not None
        fin, fin_start = (y, 0) if last else (partial, bases[i + 1])
        assert fin is not None
        emit(reduce_scatter_phase(work, ring, src, fin, fin_start, dim, bases[i], size, fn, unrolled=False, used=used))
        _release(ctx, ring.pos, ring.coord, *ring.to.values())


@dataclass(frozen=True)
class _Block:
    """What a gather or scatter over the axes of a torus block at once shares: each part's rows of a
    ``k``-row chunk (``rows[j]`` from ``offsets[j]``), the group's lengths, the rows between neighbours along
    each axis (ranks are row-major over the group's axes), the rings (registers) and each part's rings
    (:func:`_part_rings`)."""

    rows: list[int]
    offsets: list[int]
    lengths: list[int]
    rank_stride: list[int]
    rings: dict[int, Ring]
    own: list[dict[int, Ring]]

    def windows(self, axes: Sequence[int]) -> list[tuple[int, int]]:
        """The window levels of a chunk that spans every coordinate along ``axes``."""
        return [(self.lengths[a], self.rank_stride[a]) for a in axes]

    def start(self, facts: Facts, axes: Sequence[int], j: int) -> Reg | int:
        """Part ``j``'s rows of this chip's coordinates along ``axes`` (a fresh register, or the part's offset
        when ``axes`` is empty)."""
        if not axes:
            return self.offsets[j]
        out, t = facts.reg(), facts.reg()
        facts.alu("mov", out, self.offsets[j])
        for a in axes:
            facts.alu("mul", t, self.rings[a].coord, self.rank_stride[a])
            facts.alu("add", out, out, t)
        facts.release(t)
        return out

    def release(self, facts: Facts) -> None:
        for ring in self.rings.values():
            _release(facts.ctx, ring.pos, ring.coord, *ring.to.values())


def _block(
    facts: Facts, plan: GroupPlan, bank: Bank, orders: list[list[int]], k: int, dims: tuple[int, ...], dim: int,
    handshake: bool, quantum: int, kind: str,
) -> _Block:  # fmt: skip
    """The shared set-up of a gather or scatter over a torus block's axes at once; with ``handshake`` the entry
    handshake over every ring. The parts split a shard's ``k`` rows in whole ``quantum``-row units (tiles along
    ``dim``: windows that start inside a tile would share its bytes with their neighbours' windows), or in
    rows when the shard is not whole units, as :func:`_part_units` says for ``kind``."""
    q = quantum if k % quantum == 0 else 1
    rows = [q * n for n in _part_units(plan, orders, k // q, kind)]
    m = len(rows)
    offsets = [sum(rows[:j]) for j in range(m)]
    lengths = _lengths(plan)
    rank_stride = [k * prod(lengths[i + 1 :]) for i in range(len(lengths))]
    rings = {a: _make_ring(facts, plan, a, bank) for a in orders[0]}
    if handshake:
        directions = max(len(pieces(dims, dim, h)) for h in rows)
        _ring_handshake(facts, plan, bank, [directions if i in rings else 0 for i in range(len(lengths))])
    return _Block(rows, offsets, lengths, rank_stride, rings, _part_rings(facts, plan, bank, rings, m))


def _reduce_scatter_axes_at_once(
    facts: Facts, plan: GroupPlan, bank: Bank, orders: list[list[int]], x: MemRef, y: MemRef, dim: int, fn: Reducer
) -> None:
    """Reduce-scatter over a block of torus axes, all at once: part ``j`` of every result chunk (its ``j``-th
    slice along ``dim``) is reduced over the axes in ``orders[j]``, one per round. In round ``r`` along axis
    ``a`` a chunk is one coordinate along ``a`` at the chip's own coordinates along the axes reduced before,
    over every coordinate of the axes still to come (ranks are row-major over the group's axes, so these are
    windows apart in the operand); the chip keeps its own chunk's sums in a scratch copy of the operand, and
    the last round reduces them into the result."""
    ctx = facts.ctx
    k = y.shape.dimensions[dim]
    blk = _block(
        facts, plan, bank, orders, k, x.shape.dimensions, dim, True, tile_rows(dim, x.shape, y.shape), "scatter"
    )
    orders = orders[: len(blk.rows)]
    partial = ctx.scratch(x.shape)
    works = _works(facts, [bank.locals[j] if ctx.on_async else None for j in range(len(orders))])
    rounds = len(orders[0])
    used: set[int] = set()  # (arrival channels the reduce-scatter phases have taken since the handshake)
    base: list[Reg | int] = list(blk.offsets)
    for r in range(rounds):
        last = r == rounds - 1
        fin: list[Reg | int] = (
            list(blk.offsets) if last else [blk.start(facts, o[: r + 1], j) for j, o in enumerate(orders)]
        )
        interleave(
            [
                reduce_scatter_phase(
                    w, blk.own[j][o[r]], x if r == 0 else partial, y if last else partial, fin[j], dim, base[j],
                    blk.rows[j], fn, stride=blk.rank_stride[o[r]], repeat=blk.windows(o[r + 1 :]), used=used,
                )
                for j, (w, o) in enumerate(zip(works, orders))
            ]
        )  # fmt: skip
        facts.release(*base)
        base = fin
    blk.release(facts)
    for w in works:
        w.release()


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
    """All-gather phases along ``dim``, innermost ring first. ``part`` is ``all``, or for an async gather
    ``start`` (handshake, the first ring's stage 0) or ``done`` (the rest); the split parts signal the bank's
    ``local`` semaphore, which outlives the start."""
    if plan.size == 1:
        if part != "done":
            copy_arrays(ctx, [(x, y)])
        return
    facts = Facts(ctx, state)
    lengths = _lengths(plan)
    k = x.shape.dimensions[dim]
    orders = _axis_orders(plan, "gather")
    if orders is not None:
        _all_gather_axes_at_once(facts, plan, bank, orders, x, y, dim, part)
        return
    sizes = [k * plan.size // prod(lengths[: i + 1]) for i in range(len(lengths))]
    bases = _bases(facts, plan, bank, sizes)
    work = RingWork(facts, bank.local if part != "all" else None)
    last = len(sizes) - 1
    if part != "done":
        _ring_handshake(facts, plan, bank, [len(pieces(y.shape.dimensions, dim, s)) for s in sizes])
    for i in reversed(range(len(sizes))):
        if part == "start" and i != last:
            break
        ring = _make_ring(facts, plan, i, bank)
        if i < last:
            emit(all_gather_stages(work, ring, y, dim, bases[i], sizes[i], unrolled=False))
        elif part == "done":
            emit(all_gather_stages(work, ring, y, dim, bases[i], sizes[i], stages=(1, ring.length), unrolled=False))
        else:
            # this chip's shard goes straight to the neighbours at stage 0 and to its own copy of the result
            stages = (0, 1) if part == "start" else None
            emit(all_gather_stages(work, ring, y, dim, bases[i], sizes[i], first=x, stages=stages, unrolled=False))
            own = window(ctx, y, dim, bases[-1], k, pieces(y.shape.dimensions, dim, k, False)[0], None, work.tmp[0])
            sem = ctx.semaphore()
            ctx.emit(DmaStart, src=x, dst=own, sem=sem)
            ctx.emit(SemWait, sem=sem, count=1)
        _release(ctx, ring.pos, ring.coord, *ring.to.values())


def _all_gather_axes_at_once(
    facts: Facts, plan: GroupPlan, bank: Bank, orders: list[list[int]], x: MemRef, y: MemRef, dim: int, part: str
) -> None:
    """All-gather over a block of torus axes, all at once: part ``j`` of every shard (its ``j``-th slice along
    ``dim``) is gathered over the axes in ``orders[j]``, one per round. Before round ``r`` a chip holds its
    part of the shards of its sub-block along the axes gathered so far; these are windows apart in the result
    (ranks are row-major over the group's axes), so each chunk of round ``r`` is those windows at one
    coordinate along the round's axis. ``part`` ``start`` (of an async gather) stops after the first stage's
    pushes, ``done`` emits the rest."""
    ctx = facts.ctx
    k = x.shape.dimensions[dim]
    blk = _block(
        facts, plan, bank, orders, k, y.shape.dimensions, dim, part != "done", tile_rows(dim, x.shape, y.shape),
        "gather",
    )  # fmt: skip
    orders = orders[: len(blk.rows)]
    if part != "done":
        own = blk.start(facts, list(blk.rings), 0)  # this chip's shard: rows rank * k of the result
        assert isinstance(own, Reg)
        whole = pieces(y.shape.dimensions, dim, k, False)[0]
        sem = ctx.semaphore()
        ctx.emit(DmaStart, src=x, dst=window(ctx, y, dim, own, k, whole, None, own), sem=sem)
        ctx.emit(SemWait, sem=sem, count=1)
        _release(ctx, own)
    assert part == "all" or len(bank.locals) >= len(orders), "an async collective's bank holds a semaphore per part"
    works = _works(facts, [bank.locals[j] if part != "all" else None for j in range(len(orders))])
    for r in range(len(orders[0])):
        if part == "start" and r > 0:
            break
        base = [blk.start(facts, o[r + 1 :], j) for j, o in enumerate(orders)]
        interleave(
            [
                all_gather_stages(
                    w, blk.own[j][o[r]], y, dim, base[j], blk.rows[j], stride=blk.rank_stride[o[r]],
                    repeat=blk.windows(o[:r]), stages=_stages(part, blk.lengths[o[r]], r == 0),
                )
                for j, (w, o) in enumerate(zip(works, orders))
            ]
        )  # fmt: skip
        facts.release(*base)
    blk.release(facts)
    for w in works:
        w.release()


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


def run_collective(ctx: Lowering, instr: Instruction, xs: list[MemRef], ys: list[MemRef], part: str = "all") -> bool:
    """Lower collective ``instr`` from operand arrays ``xs`` to result arrays ``ys``; ``part`` ``start``
    begins an async one. Returns whether the start left work for its done (a split start)."""
    state = collective_state(ctx)
    level = state.free_bank()
    bank = state.banks[level]
    op = instr.opcode.removesuffix("-start")
    split = False
    if op == "collective-permute":
        if len(instr.operands) != 1 or len(xs) != 1 or len(ys) != 1:
            raise _fail(instr, "only the one-operand form (no in-place start indices) is supported")
        collective_permute(ctx, state, instr, xs[0], ys[0], part, bank)
        split = part == "start"
    else:
        plan = plan_groups(ctx.module, instr, state.who, state.topology)
        pairs = _pairs(instr, xs, ys)
        if op == "all-reduce":
            fn = _reducer(ctx, instr)
            # the whole of it on the async sequencer (which holds VMEM and HBM for an all-reduce-start's, and
            # buffer assignment keeps its operands until the done), each array of a variadic one in turn
            whole = (
                part == "start"
                and instr.opcode == "all-reduce-start"
                and plan.size > 1
                and bool(pairs)
                and all(_all_reduce_in_place(x, y, plan) for x, y in pairs)
                and _forwards(ctx)
                and _done_beside(ctx, instr)
            )
            if whole:
                _on_async_sequencer(ctx, state, bank, instr, pairs, whole=True)
                state.open_async[instr.name] = (level, True, True)
                return True
            # (an async-start wrapping one splits: its reduce-scatter now, its all-gather forwarded)
            split = part == "start" and len(pairs) == 1 and _all_reduce_in_place(*pairs[0], plan) and plan.size > 1
            for x, y in pairs:
                all_reduce(ctx, state, bank, plan, x, y, fn, "start" if split else "all")
        elif op == "reduce-scatter":
            fn = _reducer(ctx, instr)
            (dim,) = instr.attr("dimensions", (0,))
            for x, y in pairs:
                _check_split(instr, x.shape.dimensions, y.shape.dimensions, dim, plan.size, "operand", "result")
            # an async one (an async-start wrapping it) whole on the async sequencer, as an all-reduce-start
            if part == "start" and plan.size > 1 and pairs and _forwards(ctx) and _done_beside(ctx, instr):
                _on_async_sequencer(ctx, state, bank, instr, pairs, whole=True)
                state.open_async[instr.name] = (level, True, True)
                return True
            for x, y in pairs:
                reduce_scatter(ctx, state, bank, plan, x, y, dim, fn)
        elif op == "all-gather":
            (dim,) = instr.attr("dimensions", (0,))
            for x, y in pairs:
                _check_split(instr, y.shape.dimensions, x.shape.dimensions, dim, plan.size, "result", "operand")
            if part == "all" and pairs and all(direct_gather_pays(ctx, plan, x.shape.byte_size) for x, _ in pairs):
                for x, y in pairs:  # latency-bound: straight to every partner
                    all_gather_direct(ctx, state, bank, plan, x, y, dim)
            else:
                split = part == "start" and len(pairs) == 1 and plan.size > 1
                for x, y in pairs:
                    all_gather(ctx, state, bank, plan, x, y, dim, "start" if split else "all")
        elif op == "all-to-all":
            dims = instr.attr("dimensions")
            if dims:
                for x, y in pairs:
                    if x.shape.dimensions != y.shape.dimensions or x.shape.dimensions[dims[0]] % plan.size:
                        raise _fail(
                            instr, f"dimension {dims[0]} of {x.shape} does not split into {plan.size} chunks (or "
                            f"the result {y.shape} has other dimensions)",
                        )  # fmt: skip
                # an async one (an async-start wrapping it) whole on the async sequencer, as a reduce-scatter
                if part == "start" and plan.size > 1 and pairs and _forwards(ctx) and _done_beside(ctx, instr):
                    _on_async_sequencer(ctx, state, bank, instr, pairs, whole=True)
                    state.open_async[instr.name] = (level, True, True)
                    return True
                for x, y in pairs:
                    all_to_all(ctx, state, bank, plan, [x], [y], dims[0])
            else:
                if len(xs) != plan.size:
                    raise _fail(instr, f"the tuple form needs one operand per participant ({plan.size}), got {len(xs)}")
                all_to_all(ctx, state, bank, plan, xs, ys, None)
        elif op == "collective-broadcast":
            collective_broadcast(ctx, state, bank, plan, [x for x, _ in pairs], [y for _, y in pairs])
        else:
            raise _fail(instr, "is not a collective tpusim lowers")
    forwarded = split and op != "collective-permute" and _forwards(ctx)  # (a permute's done only waits)
    if forwarded:
        _on_async_sequencer(ctx, state, bank, instr, [(xs[0], ys[0])], whole=False)
    if part == "start":
        state.open_async[instr.name] = (level, split, forwarded)
    return split


def _forwards(ctx: Lowering) -> bool:
    """Whether a split start goes on on the async sequencer: when one core runs the program (without
    megacore), as :func:`~tpusim.compiler.lowering.context._uses_async_sequencer` promised the context."""
    return ctx.async_requests


def _done_beside(ctx: Lowering, start: Instruction) -> bool:
    """Whether the done of ``start`` is in the computation being lowered (buffer assignment holds the start's
    operand until a done there)."""
    comp = ctx.computation
    return comp is not None and any(i.opcode.endswith("-done") and start.name in i.operands for i in comp.instructions)


def _on_async_sequencer(
    ctx: Lowering,
    state: CollectiveState,
    bank: Bank,
    op: Instruction,
    arrays: list[tuple[MemRef, MemRef]],
    whole: bool,
) -> None:
    """A site of the async sequencer, which the main sequencer requests here (each time it gets here: in a
    loop, every iteration): it runs the collective on each (operand, result) pair of ``arrays`` in turn
    (``whole``: a reduce-scatter, an all-to-all, or an all-reduce: its reduce-scatter and all-gather) or the
    ring steps the start left (an all-gather of one array: the start pushed the first step), and signals
    the bank's ``done``, which the ``-done`` waits for; the main sequencer runs the next kernels meanwhile.
    The code uses the async sequencer's own VMEM, HBM scratch and scalar registers and reserved semaphores
    (:meth:`Lowering.on_async_site`)."""
    assert bank.done is not None and state.doorbell is not None, "async collectives reserve these"
    state.arena = None  # (the reduce-scatter's VMEM is the async sequencer's own)
    with ctx.on_async_site(state.doorbell):
        for x, y in arrays:
            # each array in the same VMEM, HBM scratch and registers: they run one after the other
            mark, scratch = ctx.checkpoint(), ctx.scope.scratch_next
            if whole and op.opcode == "reduce-scatter":
                plan = plan_groups(ctx.module, op, state.who, state.topology)
                (dim,) = op.attr("dimensions", (0,))
                reduce_scatter(ctx, state, bank, plan, x, y, dim, _reducer(ctx, op))
            elif whole and op.opcode == "all-to-all":
                plan = plan_groups(ctx.module, op, state.who, state.topology)
                all_to_all(ctx, state, bank, plan, [x], [y], op.attr("dimensions")[0])
            else:
                if whole:
                    plan = plan_groups(ctx.module, op, state.who, state.topology)
                    all_reduce(ctx, state, bank, plan, x, y, _reducer(ctx, op), "start")
                _forwarding(ctx, state, bank, op, x, y)
            ctx.release_since(mark)
            ctx.scope.scratch_next = scratch
            state.arena = None
        ctx.emit(SemSignal, sem=bank.done)
    state.arena = None


def _forwarding(ctx: Lowering, state: CollectiveState, bank: Bank, op: Instruction, x: MemRef, y: MemRef) -> None:
    """The ring steps a split start of collective ``op`` left (operand ``x``, result ``y``)."""
    if op.opcode.startswith("collective-permute"):
        collective_permute(ctx, state, op, x, y, "done", bank)
        return
    plan = plan_groups(ctx.module, op, state.who, state.topology)
    if op.opcode.startswith("all-reduce"):
        all_reduce(ctx, state, bank, plan, x, y, _reducer(ctx, op), "done")
    else:
        (dim,) = op.attr("dimensions", (0,))
        all_gather(ctx, state, bank, plan, x, y, dim, "done")


@lowering(
    "all-reduce", "all-reduce-start", "reduce-scatter", "all-gather", "all-gather-start", "all-to-all",
    "collective-permute", "collective-permute-start", "collective-broadcast",
)  # fmt: skip
def lower_collective(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    part = "start" if instr.opcode.endswith("-start") else "all"
    run_collective(ctx, instr, _operands(ctx, comp, instr), _result_leaves(ctx, comp, instr), part)


def finish_collective(
    ctx: Lowering, comp: Computation, instr: Instruction, start: Instruction, op: Instruction
) -> None:
    """The ``-done`` of async start ``start`` running collective ``op``: the forwarding it left, then a copy of
    the result out of the start's buffer."""
    state = collective_state(ctx)
    held = state.open_async.pop(start.name, None)
    if held is None:
        raise _fail(instr, f"its operand {start.name} is not an async start lowered before it")
    level, split, forwarded = held
    bank = state.banks[max(level, 0)]
    results = _result_leaves(ctx, comp, start)
    if forwarded:
        assert bank.done is not None
        ctx.emit(SemWait, sem=bank.done, count=1)
    elif split:
        _forwarding(ctx, state, bank, op, _operands(ctx, comp, start)[0], results[0])
    copy_arrays(ctx, list(zip(results, ctx.home_leaves(comp.name, instr.name))))


@lowering("all-reduce-done", "all-gather-done", "collective-permute-done")
def lower_done(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    start = comp[instr.operands[0]]
    finish_collective(ctx, comp, instr, start, start)


_STARTS = frozenset({"all-reduce", "all-gather", "collective-permute", "reduce-scatter", "all-to-all"})
"""Collectives an ``async-start`` begins (and its done ends); the others run whole at the start."""


def _wrapped(ctx: Lowering, instr: Instruction) -> Instruction | None:
    return wrapped_collective(ctx.module, instr)


def _starts_collective(ctx: Lowering, comp: Computation, instr: Instruction) -> bool:
    return _wrapped(ctx, instr) is not None


def _async_origin(comp: Computation, instr: Instruction) -> Instruction | None:
    """The ``async-start`` an ``async-update`` / ``async-done`` continues (through earlier updates)."""
    seen = instr
    while seen.operands and seen.operands[0] in comp:
        seen = comp[seen.operands[0]]
        if seen.opcode == "async-start":
            return seen
        if seen.opcode != "async-update":
            return None
    return None


def _ends_collective(ctx: Lowering, comp: Computation, instr: Instruction) -> bool:
    origin = _async_origin(comp, instr)
    return origin is not None and _wrapped(ctx, origin) is not None


@lowering("async-start", when=_starts_collective)
def lower_async_start(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """An async-start wrapping a collective: the collective's own start (results in element 1)."""
    op = _wrapped(ctx, instr)
    assert op is not None
    ys = [ctx.home(comp.name, instr.name, path) for path, _ in leaf_paths(instr.shape) if path[:1] == (1,)]
    part = "start" if op.opcode in _STARTS else "all"
    run_collective(ctx, op, _operands(ctx, comp, instr), ys, part)
    state = collective_state(ctx)
    state.open_async[instr.name] = state.open_async.pop(op.name, (-1, False, False))  # -1: done, holds no bank


@lowering("async-update", when=_ends_collective)
def lower_async_update(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """The collective runs on; its result (element 1 of the async value) moves to the update's buffers."""
    source = comp[instr.operands[0]]
    state = collective_state(ctx)
    if source.name in state.open_async:
        level, split, forwarded = state.open_async.pop(source.name)
        done = state.banks[level].done
        if forwarded and done is not None:  # the update reads the result: the async sequencer must have ended
            ctx.emit(SemWait, sem=done, count=1)
            split = forwarded = False
        state.open_async[instr.name] = (level, split, forwarded)
    pairs = [(ctx.home(comp.name, source.name, path), ctx.home(comp.name, instr.name, path))
             for path, _ in leaf_paths(instr.shape) if path[:1] == (1,)]  # fmt: skip
    copy_arrays(ctx, pairs)


@lowering("async-done", when=_ends_collective)
def lower_async_done(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    start = comp[instr.operands[0]]  # the start, or the last update (which holds the start's place)
    origin = _async_origin(comp, instr)
    op = _wrapped(ctx, origin) if origin is not None else None
    assert op is not None
    finish_collective(ctx, comp, instr, start, op)


def _several_devices(ctx: Lowering, comp: Computation, instr: Instruction) -> bool:
    if instr.opcode in ("send", "recv") and instr.attr("is_host_transfer"):
        return False
    return participants(ctx.module, ctx.config).devices > 1


@lowering("ragged-all-to-all", "send", "recv", when=_several_devices)
def lower_unsupported(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """A fallback would run these on one device's bytes only: refuse instead of answering wrong."""
    raise _fail(instr, f"has no lowering for a run of several chips (tpusim lowers {', '.join(sorted(COLLECTIVES))})")


@lowering("replica-id", "partition-id")
def lower_device_id(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """``chip_id // num_partitions`` (replica) or ``chip_id % num_partitions`` (partition), as a u32[]."""
    who = participants(ctx.module, ctx.config)
    out = ctx.home(comp.name, instr.name)
    reg = ctx.register()
    ctx.emit(ScalarAlu, fn="chip_id", dst=reg)
    ctx.emit(ScalarAlu, fn="div" if instr.opcode == "replica-id" else "rem", dst=reg, a=reg, b=who.partitions)
    slot = ctx.smem(out.shape)
    ctx.emit(ScalarStore, dst=slot, src=reg)
    sem = ctx.semaphore()
    ctx.emit(DmaStart, src=slot, dst=out, sem=sem)
    ctx.emit(SemWait, sem=sem, count=1)
