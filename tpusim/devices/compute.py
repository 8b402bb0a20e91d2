"""Issue handlers of the compute instructions (MXU, VPU, XLU, fallback).

``issue_compute`` is the general rule: resolve the operands, ask the scoreboard, wait for the unit's
FIFO, place the instruction on the unit's timeline from its closed-form cost, record it, and apply its
numeric effect. ``issue_mxu_fast`` and ``issue_vpu_static`` are the same rule for the common cases the
core picks at decode (an MXU operand fixed or moved only by a base register; VPU operands fixed); they exist
for speed (see ``benchmarks/bench_devices.py``) and give the same cycles and numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpusim.devices.units import Access, Issued

if TYPE_CHECKING:
    from tpusim.devices.core import Core
    from tpusim.devices.decode import Decoded

__all__ = ["issue_compute", "issue_mxu_fast", "issue_vpu_static"]


def issue_compute(core: Core, d: Decoded, t: int) -> Issued:
    ins = d.ins
    numeric = d.numeric
    reads: tuple[Access, ...] = ()
    writes: tuple[Access, ...] = ()
    if d.static:
        rr, rw, cost = d.rr, d.rw, d.cost
        if numeric:
            reads, writes = core.bind(d)
    elif d.extra is not None and not numeric:
        # NOTE: speed. Operands that differ only by base registers, no numbers needed: ranges in place.
        regs = core.regs
        rl: list[Any] = []
        wl: list[Any] = []
        for key, address, base, lo, hi, top, is_write in d.extra:
            a = address if base < 0 else address + regs[base]
            if a < 0 or a > top:
                core.resolve_all(d)  # raises the addressing error
            (wl if is_write else rl).append((key, a + lo, a + hi))
        rr, rw, cost = tuple(rl), tuple(wl), d.cost
    else:
        i = core.pc
        cost = d.cost
        need_access = cost is None or numeric
        rl = []
        wl = []
        ra: list[Any] = []
        wa: list[Any] = []
        for p in d.plans_r:
            store, address, offsets, lo, hi, _, _ = core.resolve(p, i)
            rl.append((p.key, lo, hi))
            if need_access:
                ra.append(Access(store, p.space, address, p.shape, offsets, p.sizes, lo, hi))
        for p in d.plans_w:
            store, address, offsets, lo, hi, _, _ = core.resolve(p, i)
            wl.append((p.key, lo, hi))
            if need_access:
                wa.append(Access(store, p.space, address, p.shape, offsets, p.sizes, lo, hi))
        rr, rw, reads, writes = tuple(rl), tuple(wl), tuple(ra), tuple(wa)
        if cost is None:
            cost = d.cost_fn(core.cfg, ins, reads, writes)
    need, dma = core.scoreboard.check(t, rr, rw, d.box if d.static else None)
    if dma is not None:
        return core.block(d, "waits for {}, which touches its operands", dma.wait_event(), dma)
    assert cost is not None
    kind = cost.unit
    flops = cost.flops
    units = core.units
    if kind == "mxu":
        q = units.mxu_queues[ins.mxu]
        if len(q) == q.maxlen and q[0] > t:
            t = q[0]
        start, end, flops = units.mxus[ins.mxu].schedule(ins, t, need, cost, core, core.pc)
        unit = units.mxu_units[ins.mxu]
    else:
        q = units.queues[kind]
        if len(q) == q.maxlen and q[0] > t:
            t = q[0]
        if kind == "vpu":
            start = max(t, need, units.vpu_free)
            units.vpu_free = start + cost.occupancy
            unit = units.vpu_unit
        elif kind == "xlu":
            free = units.xlu_free
            k = free.index(min(free))
            start = max(t, need, free[k])
            free[k] = start + cost.occupancy
            unit = units.xlu_units[k]
        else:
            start = max(t, need, units.fallback_free)
            units.fallback_free = start + cost.occupancy
            unit = units.fallback_unit
        end = start + cost.occupancy + cost.latency
    q.append(start)
    if end > core.max_end:
        core.max_end = end
    core.scoreboard.add(rr, rw, end)
    core.records.extend((core.stream_id, core.pc, unit, core.first_try, start, end, cost.nbytes, flops))
    if numeric:
        d.spec.execute(core, ins, reads, writes)  # type: ignore[union-attr]
    core.pc = core.pc + 1
    return t + 1


def issue_mxu_fast(core: Core, d: Decoded, t: int) -> Issued:
    """``issue_compute`` for an MXU instruction whose one operand needs at most a base register (chosen at
    decode).

    NOTE: speed. MXU instructions dominate matmul loops; same rules as issue_compute, fewer branches.
    """
    if d.static:
        key, lo, hi, is_write, rng = d.fast
    else:
        key, address, base, lo, hi, top, is_write = d.extra[0]
        a = address if base < 0 else address + core.regs[base]
        if a < 0 or a > top:
            core.resolve_all(d)  # raises the addressing error
        lo += a
        hi += a
        rng = (key, lo, hi)
    sb = core.scoreboard
    need = t
    if sb.horizon > t or sb.dmas:
        # NOTE: speed. check_one's bounding-box gates, inlined: most MXU operands are near nothing in flight
        w_lo, w_hi = sb.writers_box
        r_lo, r_hi = sb.readers_box
        dw_lo, dw_hi = sb.dma_writes
        dr_lo, dr_hi = sb.dma_reads
        if (
            (sb.w_horizon > t and lo < w_hi and w_lo < hi)
            or (lo < dw_hi and dw_lo < hi)
            or (is_write and ((lo < r_hi and r_lo < hi) or (lo < dr_hi and dr_lo < hi)))
        ):
            need, dma = sb.check_one(t, key, lo, hi, is_write)
            if dma is not None:
                return core.block(d, "waits for {}, which touches its operands", dma.wait_event(), dma)
    mxu, q, unit, depth = core.units.mxu_ctx[d.mxu]
    if len(q) == depth and q[0] > t:
        t = q[0]
    cost = d.cost
    index = core.pc
    start, end, flops = d.sched(mxu, d.mx, t, need, cost, core, index)
    q.append(start)
    if end > core.max_end:
        core.max_end = end
    # sb.add, inlined for the one range this instruction reads or writes
    if end > sb.horizon:
        sb.horizon = end
    if is_write:
        if end > sb.w_horizon:
            sb.w_horizon = end
        table = sb.writers
        b_lo, b_hi = sb.writers_box
        if lo < b_lo or hi > b_hi:
            sb.writers_box = (lo if lo < b_lo else b_lo, hi if hi > b_hi else b_hi)
    else:
        table = sb.readers
        b_lo, b_hi = sb.readers_box
        if lo < b_lo or hi > b_hi:
            sb.readers_box = (lo if lo < b_lo else b_lo, hi if hi > b_hi else b_hi)
    if table.get(rng, -1) < end:
        table[rng] = end
    core.records.extend((core.stream_id, index, unit, core.first_try, start, end, cost.nbytes, flops))  # type: ignore[union-attr]
    if d.numeric:
        if d.static:
            reads, writes = core.bind(d)
        else:
            p = (d.plans_w or d.plans_r)[0]
            acc = (Access(core.stores[p.space], p.space, a, p.shape, p.offsets, p.sizes, lo, hi),)
            reads, writes = ((), acc) if is_write else (acc, ())
        d.spec.execute(core, d.ins, reads, writes)  # type: ignore[union-attr]
    core.pc = index + 1
    return t + 1


def issue_vpu_static(core: Core, d: Decoded, t: int) -> Issued:
    """``issue_compute`` for a VPU instruction whose operands need no registers (the common case).

    NOTE: speed. Same rules as issue_compute, with the decode-time facts used directly.
    """
    sb = core.scoreboard
    rr, rw = d.rr, d.rw
    if sb.horizon <= t and not sb.dmas:
        need = t
    else:
        need, dma = sb.check(t, rr, rw, d.box)
        if dma is not None:
            return core.block(d, "waits for {}, which touches its operands", dma.wait_event(), dma)
    units = core.units
    q = units.vpu_queue
    if len(q) == q.maxlen and q[0] > t:
        t = q[0]
    cost = d.cost
    start = units.vpu_free
    if start < t:
        start = t
    if start < need:
        start = need
    free = units.vpu_free = start + cost.occupancy  # type: ignore[union-attr]
    end = free + cost.latency  # type: ignore[union-attr]
    q.append(start)
    if end > core.max_end:
        core.max_end = end
    sb.add(rr, rw, end)
    core.records.extend(
        (
            core.stream_id,
            core.pc,
            units.vpu_unit,
            core.first_try,
            start,
            end,
            cost.nbytes,  # type: ignore[union-attr]
            cost.flops,  # type: ignore[union-attr]
        )
    )
    if d.numeric:
        reads, writes = core.bind(d)
        d.spec.execute(core, d.ins, reads, writes)  # type: ignore[union-attr]
    core.pc = core.pc + 1
    return t + 1
