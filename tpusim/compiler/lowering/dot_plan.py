"""Blocking of a dot on the MXUs: block sizes, loop order and which operand blocks stay in VMEM.

A dot is a set of 2-D products ``A[M,K] @ B[K,N]`` (see :mod:`.dot`). Each is cut into output blocks of
``tm x tn`` and contraction steps of ``tk``:

* ``tn``: at most one MXU-width (``mxu.cols``) tile per MXU. When N has fewer tiles than there are MXUs,
  the spare MXUs take row *groups* of the block: MXU ``t * groups + j`` multiplies rows group ``j`` by
  weight tile ``t`` (each latches the same weights), so a 256-wide product still keeps four MXUs busy.
* *turns*: a block that leaves MXUs idle (one weight tile, one row group: an 8-row block of a small product)
  shares the core with the next blocks, ``mxu.count / MXUs per block`` of them at once on disjoint MXUs, their
  contraction steps interleaved (:mod:`.dot`); the estimate counts rounds of such blocks.
* ``tm``: at most half a result buffer per row group, so the other half is popped while the next block
  accumulates (``halves = 2``); or, as one more candidate, the whole result buffer per row group
  (``halves = 1``): then the next block's first matmul waits for the pop of the rows it overwrites, which
  the estimate charges per block (below). Without double buffering every weight tile costs a fixed
  load and drain, so streaming more rows through each tile (fewer tiles) is what pays.
* ``tk``: the whole K when the blocks fit VMEM, else halves of it in whole weight tiles.
* ``depth``: the operand loads of that many steps are in flight ahead of the MXU work, enough to cover
  a load's latency and transfer time; ``lag``: the MXUs may still read the windows of that many earlier
  steps (the sequencer runs ahead by up to a unit queue of instructions), so those slots are not reloaded
  (a DMA waiting for an MXU read would hold a DMA engine idle). Every operand needs
  ``depth + lag + 1`` slots.

Loop order ``mn`` walks the N blocks of one row of blocks before the next row, ``nm`` the other way.
With a row-major result, consecutive ``mn`` blocks interleave in memory (they share rows of tiles), so the
scoreboard, which tracks a window by its byte extent, orders their stores one after the other; the
planner charges that wait (``nm`` blocks are disjoint).
Operand windows live in VMEM slots managed as least-recently-used caches: two slots per operand give
double buffering; ``nk + 1`` A slots keep a row panel of A resident across the N blocks (``mn``); enough
B slots keep all of B resident across the rows. The planner enumerates these choices, keeps those that fit
the instruction's VMEM share, and picks the one with the least estimated time
``max(HBM bytes / HBM bytes per cycle, MXU cycles)`` plus the pipeline's fill (the first step's operands
arrive before any MXU work) and drain (the last block's pop and store) and a DMA set-up share per step,
plus the stores the MXU work does not cover: blocks pop into two slots in turn, so a block's pop waits
for the store (latency included) of the block two before it.
The MXU term follows the MXU's timing contract (:mod:`tpusim.devices.mxu`) for the config's keys, per MXU
and weight tile (a *pass*), with ``L = mxu.weight_load_cycles`` (``mxu.rows`` when null) times the weight's
bf16 parts, ``S`` the rows streamed (times the precision's passes, over ``mxu.int8_speedup``) and
``D = mxu.rows - 1 + mxu.cols - 1`` the array's input and output skew:

* ``mxu.double_buffered``: a tile loads while the previous one streams, so a pass costs ``max(L, S)``,
  plus one unhidden load at the start and one drain ``D`` at the end;
* single-buffered: a load waits until the previous pass has drained, so a pass costs ``L + S + D``
  (SCALE-Sim's ``2R + C + T - 2`` per fold when ``L = R``, ``S = T``);
* a block using the whole result buffer (``halves = 1``) adds, per block after the first, the wait of the
  next block's first matmul for the pop (``ceil(rows / mxu.pop_rows_per_cycle)`` cycles) of the rows it
  overwrites: ``D + pop`` when double-buffered (the next tile is already staged), ``max(0, pop - L)``
  single-buffered (the next tile's load runs while the pop does); and once, the first block's pops of its
  ``tiles`` MXUs one after another (they write interleaved windows of one block, which the scoreboard
  orders: the MXUs stay staggered by that afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from tpusim.config import ChipConfig
from tpusim.memory import Shape

__all__ = ["DotPlan", "Problem", "plan_dot", "row_groups"]

_TIE = 0.002
"""Estimated times within this fraction of the best count as equal when choosing a blocking."""

_MAX_DEPTH = 8
"""Most contraction steps whose operand loads are in flight at once."""


@dataclass(frozen=True)
class Problem:
    """What the planner needs to know about a dot.

    Attributes:
        m, n, k: sizes of one 2-D product.
        products: output blocks' worth of 2-D products (batch and free loop dimensions).
        contracts: 2-D products summed into each output (further contracting dimensions).
        a_bytes, b_bytes: bytes per element of the operands; c_bytes of the result.
        passes: bf16 passes per streamed row (f32 precision modes); weight_parts likewise per load.
        speedup: rows per cycle factor (``mxu.int8_speedup`` for 8-bit operands).
        block_bytes: callable giving the VMEM bytes of the blocks for ``(tm, tn, tk)``:
            ``(A window, B window, A staging, B staging, result blocks)``.
        rows_major: the result's M dimension is physically major to N (row-major results).
        side_bytes: HBM bytes per result element an epilogue's side operands add (a residual of the
            result's shape: its element size; a bias along the rows: almost nothing).
        out_in_vmem: the result lives in VMEM (its blocks are not stored to HBM).
        a_shared, b_shared: every product reads the same A (B) windows (the operand has no dimension of the
            products' loop: the weight of ``einsum("bshd,hdD->bsD")`` when b is a product of its own), so a
            residency that holds all of it loads it once for all products.
    """

    m: int
    n: int
    k: int
    products: int
    contracts: int
    a_bytes: int
    b_bytes: int
    c_bytes: int
    passes: int
    weight_parts: int
    speedup: int
    block_bytes: object
    rows_major: bool = True
    side_bytes: float = 0.0
    out_in_vmem: bool = False
    a_shared: bool = False
    b_shared: bool = False


@dataclass(frozen=True)
class DotPlan:
    """A blocking of the dot (see the module docstring)."""

    tm: int
    tn: int
    tk: int
    groups: int
    order: str
    a_slots: int
    b_slots: int
    depth: int
    lag: int
    hbm_bytes: int
    cycles: float
    vmem_bytes: int
    halves: int = 2  # result-buffer regions blocks alternate between (1: every block uses the whole buffer)
    turns: int = 1  # consecutive blocks that run at once on disjoint MXUs (a block leaving MXUs idle)


def row_groups(rows: int, groups: int, sublanes: int) -> list[tuple[int, int]]:
    """``(first row, rows)`` of each MXU row group of a block of ``rows`` rows (whole sublane groups)."""
    if groups <= 1 or rows <= sublanes:
        return [(0, rows)]
    per = ceil(ceil(rows / groups) / sublanes) * sublanes
    return [(r, min(per, rows - r)) for r in range(0, rows, per)]


def _halvings(top: int, unit: int) -> list[int]:
    out = [top]
    while out[-1] > unit:
        nxt = max(unit, out[-1] // 2 // unit * unit)
        if nxt == out[-1]:
            break
        out.append(nxt)
    return out


def plan_dot(problem: Problem, config: ChipConfig, vmem_bytes: int) -> list[DotPlan]:
    """Every blocking that fits ``vmem_bytes``, best first."""
    cfg = config.mxu
    p = problem
    tn = min(p.n, cfg.cols * cfg.count)
    tiles = ceil(tn / cfg.cols)
    groups = max(1, cfg.count // tiles)
    half = cfg.result_buffer_rows // 2
    sub = config.vpu.sublanes
    tm_top = min(p.m, half * groups)
    tms = [t for t in _halvings(tm_top, sub) if t <= p.m] or [p.m]
    whole = min(p.m, cfg.result_buffer_rows * groups)  # one block's rows in the whole result buffer
    if whole > tms[0]:
        tms.insert(0, whole)
    tks = _halvings(p.k, cfg.rows) if p.k > cfg.rows else [p.k]
    load = cfg.load_cycles * p.weight_parts  # one weight tile, every bf16 part
    skew = cfg.rows - 1 + cfg.cols - 1  # a matmul's results are complete this long after its last row entered
    plans: list[DotPlan] = []
    for tk in tks:
        for tm in tms:
            a_win, b_win, a_stage, b_stage, c_blocks = p.block_bytes(tm, tn, tk)  # type: ignore[operator]
            nm, nn, nk = ceil(p.m / tm), ceil(p.n / tn), ceil(p.k / tk) * p.contracts
            g = len(row_groups(tm, groups, sub))
            rows = max(r for _, r in row_groups(tm, groups, sub))
            halves = 2 if rows <= half else 1
            stream = p.passes * ceil(rows / p.speedup)
            pop = ceil(rows / cfg.pop_rows_per_cycle)
            if cfg.double_buffered:  # the next tile loads while this one streams
                per_tile, ends = max(load, stream), load + skew
                turn = skew + pop  # the next block's first matmul waits for this block's pop
            else:  # each load waits until the previous pass has drained
                per_tile, ends = load + stream + skew, 0
                turn = max(0, pop - load)  # the pop runs while the next tile loads
            k_tiles = ceil(p.k / cfg.rows) * p.contracts
            n_blocks = p.products * nm * nn
            # blocks that leave MXUs idle take turns on them (``turns`` blocks at once, see dot.py)
            turns = max(1, cfg.count // (tiles * g))
            mxu_cycles = ceil(n_blocks / turns) * k_tiles * per_tile + ends
            if halves == 1 and n_blocks > 1:
                # The first block's pops of one row group write interleaved windows of one VMEM block, which
                # the scoreboard orders one after another; the MXUs stay staggered by that, so later pops
                # do not collide.
                mxu_cycles += (n_blocks - 1) * turn + (tiles - 1) * pop
            bpc = config.hbm_bytes_per_cycle
            # Prefetch depth: enough steps in flight to cover a load's latency and transfer time.
            step_cycles = ceil(min(tk, p.k) / cfg.rows) * per_tile / turns
            arrival = config.cycles(config.hbm.latency_ns) + config.dma.setup_cycles + (a_win + b_win) / bpc
            depth = max(1, min(_MAX_DEPTH, ceil(arrival / max(step_cycles, 1))))
            # Steps the MXUs may run behind the sequencer (each MXU queues instruction_queue_depth
            # instructions, two per weight tile): their slots are not reloaded yet, since a DMA that must
            # wait for an MXU read holds its DMA engine idle.
            lag = ceil(config.core.instruction_queue_depth / (2 * ceil(min(tk, p.k) / cfg.rows))) + 1
            a_all = p.m * p.k * p.a_bytes * p.contracts
            b_all = p.k * p.n * p.b_bytes * p.contracts
            c_all = p.m * p.n * (p.c_bytes + p.side_bytes)
            a_whole, b_whole = nm * nk + 1, nn * nk + 1  # slots that hold all of A (B) of a product
            for order in ("mn", "nm"):
                # (slots, loads of the operand per product) for each residency choice; an operand every
                # product shares, held whole, loads once for all of them (1 / products per product)
                if order == "mn":
                    a_opts = [(2, nn if nk > 1 else 1)] + ([(nk + 1, 1)] if nk > 1 and nn > 1 else [])
                    b_opts = [(2, nm)] + ([(b_whole, 1)] if nm > 1 or p.b_shared else [])
                    a_opts += [(a_whole, 1)] if p.a_shared and p.products > 1 else []
                else:
                    b_opts = [(2, nm if nk > 1 else 1)] + ([(nk + 1, 1)] if nk > 1 and nm > 1 else [])
                    a_opts = [(2, nn)] + ([(a_whole, 1)] if nn > 1 or p.a_shared else [])
                    b_opts += [(b_whole, 1)] if p.b_shared and p.products > 1 else []
                a_costs = [(r, 1 / p.products if p.a_shared and r == a_whole else n) for r, n in a_opts]
                b_costs = [(r, 1 / p.products if p.b_shared and r == b_whole else n) for r, n in b_opts]
                for a_res, a_loads in a_costs:
                    for b_res, b_loads in b_costs:
                        a_slots, b_slots = max(a_res, depth + 1 + lag), max(b_res, depth + 1 + lag)
                        stages = (depth + 1) * (a_stage + b_stage)
                        need = a_slots * a_win + b_slots * b_win + stages + c_blocks
                        if need > vmem_bytes:
                            continue
                        hbm = round(p.products * (a_all * a_loads + b_all * b_loads) + p.products * c_all)
                        # fill: the first step's operands arrive before any MXU work; drain: the last
                        # block's pop and store
                        store = c_blocks / 2 / bpc + config.cycles(config.hbm.latency_ns)
                        drain = store + tm / config.mxu.pop_rows_per_cycle
                        # A block's pop waits for the store of the block two before it (two pop slots), so
                        # the stores of every other block follow one another (the last one is the drain);
                        # what the MXU work after the first blocks finish does not cover stalls the MXUs
                        # (the stores' bytes are already in the HBM term, which stays a floor of its own).
                        rounds = ceil(n_blocks / turns)
                        chain = 0.0 if p.out_in_vmem else (ceil(n_blocks / 2) - 1) * store
                        waits = max(0.0, chain - (rounds - 1) * k_tiles * per_tile)
                        cycles = max(hbm / bpc, mxu_cycles + waits) + arrival + drain
                        if (order == "mn") == p.rows_major and nn > 1 and nm > 1:
                            # Consecutive result blocks share rows of tiles: the stores' byte ranges
                            # interleave, and the scoreboard orders DMAs whose ranges overlap (and stalls
                            # the sequencer meanwhile): charge the wait, and at least 3%.
                            block_cycles = mxu_cycles / (p.products * nm * nn)
                            cycles += p.products * nm * nn * max(0.0, store - block_cycles)
                            cycles *= 1.03
                        slots = (a_slots, b_slots, depth, lag)
                        plans.append(DotPlan(tm, tn, tk, g, order, *slots, hbm, cycles, need, halves, turns))
    # Least time, where plans within _TIE of the best count as equal (the estimate is not that exact); among
    # those, taller blocks first: each weight tile then streams more rows, so there are fewer weight loads
    # (each reads a whole R x C tile out of VMEM) and fewer instructions; then fewer steps, bytes, VMEM.
    best = min((d.cycles for d in plans), default=0.0)

    def key(d: DotPlan) -> tuple[float, int, int, int, int, str]:
        return (0.0 if d.cycles <= best * (1 + _TIE) else d.cycles, -d.tm, -d.tk, d.hbm_bytes, d.vmem_bytes, d.order)

    plans.sort(key=key)
    return plans


def vmem_size(shape: Shape, vreg_bytes: int) -> int:
    """Bytes :meth:`Lowering.vmem` reserves for ``shape`` (whole vector registers)."""
    return -(-shape.byte_size // vreg_bytes) * vreg_bytes
