"""ICI reports of a multi-chip run: per-link traffic and utilisation, one trace track per link, and the time
chips spend in collectives and how much of it overlapped compute.

Which link a remote DMA crossed follows from its destination chip and the topology's dimension-order
route. The trace records the issuing chip; the destination is the value of the DMA's ``chip`` register,
which the compiler computes from ``s.chip_id`` with straight-line scalar arithmetic. :func:`remote_targets`
evaluates that arithmetic for every chip at once (a linear walk of the stream: registers written by
``s.load`` or in ways it cannot follow are unknown, and their DMAs are reported as unattributed).

A transfer's bytes are spread evenly over its data phase, ``[start + dma.setup_cycles, end - latency]``
(latency: ``hbm.latency_ns`` for an HBM side plus ``ici.hop_latency_ns`` per hop and ``dcn.latency_ns`` per
crossing between slices), on every link of its route. A link's utilisation is its bytes over what it could
carry in the run (``cycles x link_bandwidth / clock``; a chip's DCN egress and ingress count as links of
``dcn.bandwidth_bytes_per_s``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tpusim.compiler.hlo.opcodes import ASYNC_COLLECTIVE_DONES, ASYNC_COLLECTIVE_STARTS, COLLECTIVES
from tpusim.isa import DmaStart, Program, Reg, ScalarAlu, ScalarLoad, Space
from tpusim.report.timeline import merged_runs
from tpusim.topology import Link, Topology, system_topology

if TYPE_CHECKING:
    from tpusim.api import SimulationResult

__all__ = [
    "COLLECTIVE_OPCODES",
    "CollectiveTime",
    "LinkUse",
    "collective_time",
    "format_links",
    "link_trace_events",
    "link_usage",
    "remote_targets",
]

COLLECTIVE_OPCODES = COLLECTIVES | ASYNC_COLLECTIVE_STARTS | ASYNC_COLLECTIVE_DONES

_ALU = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}


def _alu(fn: str, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    if fn in _ALU:
        return _ALU[fn](a, b).astype(np.int64)
    if fn in ("div", "rem"):
        if np.any(b == 0):
            return None
        q = np.trunc(a / b).astype(np.int64)  # C semantics, as the scalar unit
        return q if fn == "div" else a - q * b
    if fn in ("shl", "shr", "sra"):
        s = b & 63
        if fn == "shl":
            return np.where(s < 32, (a << np.minimum(s, 31)) & 0xFFFFFFFF, 0).astype(np.int64)
        if fn == "shr":
            return np.where(s < 32, (a & 0xFFFFFFFF) >> np.minimum(s, 31), 0).astype(np.int64)
        return (a >> np.minimum(s, 31)).astype(np.int64)
    return None


def _wrap32(v: np.ndarray) -> np.ndarray:
    return ((v + 2**31) % 2**32) - 2**31


def remote_targets(program: Program, chips: int) -> dict[tuple[int, int], np.ndarray]:
    """``(stream, instruction) -> destination chip per issuing chip`` for every remote ``dma.start`` whose
    ``chip`` operand the scalar arithmetic before it determines (see the module docstring)."""
    out: dict[tuple[int, int], np.ndarray] = {}
    me = np.arange(chips, dtype=np.int64)
    for si, stream in enumerate(program.streams):
        regs: dict[int, np.ndarray | None] = {}

        def value(x: Any, regs: dict[int, np.ndarray | None] = regs) -> np.ndarray | None:
            if isinstance(x, Reg):
                return regs.get(x.index)
            if x is None:
                return np.zeros(chips, np.int64)
            return np.full(chips, int(x), np.int64)

        for i, ins in enumerate(stream.instructions):
            if isinstance(ins, ScalarAlu):
                if ins.fn == "chip_id":
                    v: np.ndarray | None = me.copy()
                elif ins.fn == "num_chips":
                    v = np.full(chips, chips, np.int64)
                elif ins.fn == "core_id":
                    v = np.full(chips, stream.core, np.int64)
                elif ins.fn == "mov":
                    v = value(ins.a)
                else:
                    a, b = value(ins.a), value(ins.b)
                    v = None if a is None or b is None else _alu(ins.fn, a, b)
                regs[ins.dst.index] = None if v is None else _wrap32(v)
            elif isinstance(ins, ScalarLoad):
                regs[ins.dst.index] = None
            elif isinstance(ins, DmaStart) and ins.chip is not None:
                target = value(ins.chip)
                if target is not None:
                    out[(si, i)] = target.copy()
    return out


@dataclass(frozen=True, slots=True)
class LinkUse:
    """Traffic of one directed ICI link over a run.

    Attributes:
        link: ``(chip it leaves, axis, +1 or -1)``.
        name: ``chip0.ici1+`` (the device model's resource name).
        transfers: transfers that crossed it.
        bytes: bytes that crossed it.
        busy_cycles: cycles in which at least one transfer was moving bytes over it.
        utilisation: bytes over what the link could carry in the whole run.
        intervals: ``(start, end, bytes)`` of each transfer's data phase on it.
    """

    link: Link
    name: str
    transfers: int
    bytes: int
    busy_cycles: int
    utilisation: float
    intervals: tuple[tuple[int, int, int], ...]


def _topology(result: SimulationResult) -> Topology:
    cfg = result.compiled.config
    chips = len({s.chip for s in result.trace.streams}) or 1
    return system_topology(cfg, chips, cfg.ici.shape)


def _remote_rows(result: SimulationResult) -> tuple[list[tuple[int, list[Link], int, int, int]], int]:
    """``(entry, route, data start, data end, bytes)`` of every attributed remote DMA, and how many remote
    DMAs could not be attributed."""
    tr = result.trace
    program = result.compiled.program
    cfg = result.compiled.config
    topo = _topology(result)
    targets = remote_targets(program, topo.chips)
    stream_of: dict[int, int] = {}
    for sid, ts in enumerate(tr.streams):
        for pi, ps in enumerate(program.streams):
            if ps.core == ts.core and ps.sequencer == ts.sequencer and (ps.chip is None or ps.chip == ts.chip):
                stream_of[sid] = pi
                break
    rows, unknown = [], 0
    setup, hbm = cfg.dma.setup_cycles, cfg.cycles(cfg.hbm.latency_ns)
    for e in range(len(tr)):
        sid, idx = int(tr.stream[e]), int(tr.index[e])
        if sid not in stream_of:
            continue
        pi = stream_of[sid]
        ins = program.streams[pi].instructions[idx]
        if not isinstance(ins, DmaStart) or ins.chip is None:
            continue
        src = tr.streams[sid].chip
        dst: int | None = int(ins.chip) if isinstance(ins.chip, int) else None
        if dst is None:
            t = targets.get((pi, idx))
            dst = int(t[src]) if t is not None else None
        if dst is None:
            unknown += 1
            continue
        route = topo.route(src, dst, ins.route, ins.tie) if dst != src else []
        if not route:
            continue
        latency = cfg.network_cycles(*topo.crossings(src, dst))
        latency += hbm if Space.HBM in (ins.src.space, ins.dst.space) else 0
        lo = int(tr.start[e]) + setup
        hi = max(lo + 1, int(tr.end[e]) - latency)
        rows.append((e, route, lo, hi, int(tr.bytes[e])))
    return rows, unknown


def link_usage(result: SimulationResult) -> tuple[list[LinkUse], int]:
    """Per directed link (of the topology, used or not): transfers, bytes, busy cycles, utilisation; and the
    number of remote DMAs whose destination could not be determined."""
    topo = _topology(result)
    cfg = result.compiled.config
    rows, unknown = _remote_rows(result)
    per: dict[Link, list[tuple[int, int, int]]] = {link: [] for link in topo.links()}
    for _, route, lo, hi, nbytes in rows:
        for link in route:
            per.setdefault(link, []).append((lo, hi, nbytes))
    out = []
    for link, iv in sorted(per.items()):
        capacity = (cfg.dcn_bytes_per_cycle if topo.is_dcn(link) else cfg.link_bytes_per_cycle) * max(result.cycles, 1)
        starts = np.array([a for a, _, _ in iv], np.int64)
        ends = np.array([b for _, b, _ in iv], np.int64)
        rs, re = merged_runs(starts, ends)
        total = sum(b for _, _, b in iv)
        busy = int(np.sum(re - rs))
        out.append(LinkUse(link, topo.link_name(link), len(iv), total, busy, total / capacity, tuple(iv)))
    return out, unknown


@dataclass(frozen=True, slots=True)
class CollectiveTime:
    """Time one chip spent in collectives.

    Attributes:
        chip: the chip.
        cycles: cycles in which some instruction of a collective was at work on this chip (the union of its
            instructions' ``[start, end)``: transfers in flight, waits, adds; an async pair's start and done
            count, the compute between them does not).
        overlapped: of those, cycles in which a compute unit (MXU, VPU, XLU, fallback) ran other work.
        compute: cycles in which a compute unit ran work of no collective (overlapped or not).
    """

    chip: int
    cycles: int
    overlapped: int
    compute: int


def _collective_names(result: SimulationResult) -> set[str]:
    return {
        ins.name
        for comp in result.compiled.module.computations
        for ins in comp.instructions
        if ins.opcode in COLLECTIVE_OPCODES or (ins.opcode.startswith("async-") and _wraps_collective(result, ins))
    }


def _wraps_collective(result: SimulationResult, ins: Any) -> bool:
    from tpusim.compiler.hlo.xla_forms import wrapped_collective

    module = result.compiled.module
    seen = ins
    for comp in module.computations:
        if ins.name in comp:
            while seen.opcode in ("async-update", "async-done") and seen.operands and seen.operands[0] in comp:
                seen = comp[seen.operands[0]]
    return wrapped_collective(module, seen) is not None


def collective_time(result: SimulationResult) -> list[CollectiveTime]:
    """Per chip, the cycles spent in collectives and how many of them overlapped compute."""
    tr = result.trace
    names = _collective_names(result)
    hlo = tr.hlo
    units = np.array([u.rsplit(".", 1)[-1].rstrip("0123456789") for u in tr.units])[tr.unit]
    chip_of = np.array([s.chip for s in tr.streams], np.int64)[tr.stream] if len(tr) else np.zeros(0, np.int64)
    is_coll = np.array([h in names for h in hlo], bool)
    compute = np.isin(units, ["mxu", "vpu", "xlu", "fallback"]) & ~is_coll
    out = []
    for chip in sorted({s.chip for s in tr.streams}):
        here = chip_of == chip
        cs, ce = merged_runs(tr.start[here & is_coll], tr.end[here & is_coll])
        ks, ke = merged_runs(tr.start[here & compute], tr.end[here & compute])
        overlap = 0
        for a, b in zip(cs.tolist(), ce.tolist()):
            lo, hi = np.maximum(ks, a), np.minimum(ke, b)
            overlap += int(np.sum(np.clip(hi - lo, 0, None)))
        out.append(CollectiveTime(chip, int(np.sum(ce - cs)), overlap, int(np.sum(ke - ks))))
    return out


def format_links(result: SimulationResult, top: int = 8) -> str:
    """A text section for the run summary: collectives per chip and the busiest links."""
    cycles = max(result.cycles, 1)
    times = collective_time(result)
    uses, unknown = link_usage(result)
    lines = [f"ICI ({_topology(result)}, {len(uses)} directed links):"]
    if times:
        c = np.array([t.cycles for t in times])
        o = np.array([t.overlapped for t in times])
        k = np.array([t.compute for t in times])
        share = o.sum() / max(c.sum(), 1)
        lines.append(
            f"  collectives: {c.mean() / cycles:6.1%} of the run per chip on average (max {c.max():,} cycles); "
            f"{share:.1%} of that time overlapped compute"
        )
        lines.append(
            f"  step per chip (mean): compute only {(k - o).mean() / cycles:.1%}, communication exposed "
            f"{(c - o).mean() / cycles:.1%}, overlapped {o.mean() / cycles:.1%}, neither "
            f"{(cycles - k - c + o).mean() / cycles:.1%}"
        )
    used = [u for u in uses if u.bytes]
    if used:
        mean = sum(u.utilisation for u in uses) / len(uses)
        lines.append(f"  links: {len(used)} of {len(uses)} carried data; mean utilisation {mean:.1%}")
        # the busiest first (a DCN egress is far slower than an ICI link: its utilisation, not its bytes)
        for u in sorted(used, key=lambda u: (-u.utilisation, -u.bytes, u.link))[:top]:
            lines.append(
                f"  {u.name:16} {u.utilisation:6.1%} {u.bytes:>14,} bytes in {u.transfers:5,} transfers, "
                f"busy {u.busy_cycles / cycles:6.1%}"
            )
    if unknown:
        lines.append(f"  {unknown} remote transfers could not be attributed to links (destination not static)")
    return "\n".join(lines)


def link_trace_events(result: SimulationResult, pid: int = 1_000_000) -> list[dict[str, Any]]:
    """Chrome-trace counter events: one track per used link, its load in bytes per cycle over time (each
    transfer's bytes spread evenly over its data phase), in the trace's time unit of one cycle."""
    uses, _ = link_usage(result)
    events: list[dict[str, Any]] = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": "ICI links"}}]
    for u in uses:
        if not u.bytes:
            continue
        deltas: dict[int, float] = {}
        for lo, hi, nbytes in u.intervals:
            rate = nbytes / max(hi - lo, 1)
            deltas[lo] = deltas.get(lo, 0.0) + rate
            deltas[hi] = deltas.get(hi, 0.0) - rate
        level = 0.0
        for t in sorted(deltas):
            level += deltas[t]
            events.append(
                {"ph": "C", "pid": pid, "name": u.name, "ts": t, "args": {"bytes_per_cycle": round(max(level, 0.0), 6)}}
            )
    return events
