"""The numbers of a report, computed once from a simulation: units, DMA engines, HBM, memories, HLO ops.

:func:`analyse` turns a :class:`~tpusim.api.SimulationResult` into a :class:`RunAnalysis` (plain numpy
arrays and rows); :mod:`tpusim.report.summary_json` writes it as the versioned ``summary.json``. Every
method is stated where it is computed and collected in ``docs/reports.md``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tpusim.compiler.buffer_assignment import sequential_computations
from tpusim.report.entries import TraceFacts, decode_trace, unit_kind
from tpusim.report.occupancy import Occupancy, Region, merge_ranges, occupancy
from tpusim.report.timeline import assign_lanes, critical_path, merged_runs

if TYPE_CHECKING:
    from tpusim.api import SimulationResult
    from tpusim.config import ChipConfig

__all__ = ["BOUND_FRACTION", "NO_HLO", "RunAnalysis", "analyse"]

BOUND_FRACTION = 0.5
"""An HLO instruction is compute (memory) bound when its ideal compute (HBM) time is at least this share of
its span; below that for both, latency bound (issue, setup and pipeline latencies dominate)."""

NO_HLO = "(no HLO instruction)"

# Critical-path priority per unit kind: waits are never on the path; scalar steps lose ties to real work.
_PRIORITY = {"sync": -1, "scalar": 0}


@dataclass(frozen=True, eq=False)
class RunAnalysis:
    """Everything a report shows, computed from one simulation.

    Attributes:
        result: the simulation.
        facts: per-entry facts of its trace.
        cycles: total cycles of the run.
        critical: per trace entry, cycles of the run charged to it along the critical path.
        engine: per trace entry, the DMA engine that carried it (-1 for other instructions).
        units: one row per unit (trace units, DMA engines, HBMs, ICI links), as dicts.
        memories: one row per memory (each chip's HBM, each core's VMEM and SMEM), as dicts.
        ops: one row per HLO instruction, as dicts, costliest on the critical path first.
        occupancy: per memory name (``chip0.hbm``, ``chip0.core0.vmem``), its occupancy over time.
        notes: statements about methods and limits that apply to this run.
        links: one row per directed ICI link of a run on several chips, as dicts (empty on one chip).
        collectives: per chip of a run on several chips, cycles in collectives and how many of them overlapped
            compute, as dicts.
    """

    result: SimulationResult
    facts: TraceFacts
    cycles: int
    critical: np.ndarray
    engine: np.ndarray
    units: list[dict[str, Any]]
    memories: list[dict[str, Any]]
    ops: list[dict[str, Any]]
    occupancy: dict[str, Occupancy]
    notes: list[str]
    links: list[dict[str, Any]]
    collectives: list[dict[str, Any]]


def _ratio(a: float, b: float) -> float | None:
    return float(a) / float(b) if b else None


def _peaks(cfg: ChipConfig) -> dict[str, float]:
    """Per-core peak rates per cycle of each compute unit kind, and per-chip HBM bytes per cycle."""
    vreg_elems = cfg.vpu.sublanes * cfg.vpu.lanes
    return {
        "mxu": float(cfg.mxu.count * cfg.mxu.rows * cfg.mxu.cols * 2),  # 2 flops per multiply-add per cell
        "vpu": cfg.vpu.alu.issue_vregs_per_cycle * vreg_elems,  # one op per 32-bit element per issue slot
        "xlu": cfg.xlu.count * vreg_elems / cfg.xlu.lane_reduce_cycles_per_vreg,  # lane reductions
        "hbm": cfg.hbm_bytes_per_cycle,
    }


def _unit_rows(f: TraceFacts, total: int, critical: np.ndarray) -> list[dict[str, Any]]:
    tr = f.trace
    rows = []
    for uid, name in enumerate(tr.units):
        sel = tr.unit == uid
        rs, re_ = merged_runs(tr.start[sel], tr.end[sel])
        busy = int((re_ - rs).sum())
        chip, core = _place(name)
        rows.append({
            "name": name, "kind": _kind(name), "chip": chip, "core": core,
            "instructions": int(sel.sum()), "busy_cycles": busy, "busy_fraction": _ratio(busy, total),
            "bytes": int(tr.bytes[sel].sum()), "flops": int(tr.flops[sel].sum()),
            "critical_path_cycles": int(critical[sel].sum()),
        })  # fmt: skip
    return rows


def _kind(unit: str) -> str:
    return unit_kind(unit)


def _place(unit: str) -> tuple[int, int | None]:
    parts = unit.split(".")
    chip = int(parts[0][4:]) if parts[0].startswith("chip") else 0
    core = int(parts[1][4:]) if len(parts) > 2 and parts[1].startswith("core") else None
    return chip, core


def _engines(f: TraceFacts, cfg: ChipConfig, total: int) -> tuple[np.ndarray, list[dict[str, Any]], list[str]]:
    """Which engine carried each DMA: transfers take the lowest free engine of their pool in start order, an
    engine being held from the transfer's start to the end of its data phase (``docs/model.md``: FIFO
    engines, freed when the last byte moves). A core's local transfers take its ``dma.engines`` (rows
    ``dma.engineK``), its pushes to other chips its ICI queues, ``ici.pushes_per_link`` per link (rows
    ``dma.iciK``; an entry's number counts within its pool, ``TraceFacts.remote`` says which). Engines are
    identical, so the numbering is a convention; the count busy at any cycle is exact."""
    tr = f.trace
    engine = np.full(len(tr), -1, np.int64)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    dma = f.kind == "dma"
    pools = (
        (~f.remote, "engine", cfg.dma.engines),
        (f.remote, "ici", cfg.ici.links_per_chip * cfg.ici.pushes_per_link),
    )
    for chip, core in sorted({(int(a), int(b)) for a, b in zip(f.chip[dma], f.core[dma])}):
        for which, label, count in pools:
            sel = np.flatnonzero(dma & which & (f.chip == chip) & (f.core == core))
            if not sel.size:
                continue
            lanes = assign_lanes(tr.start[sel], f.data_end[sel], sel)
            engine[sel] = lanes
            n = max(count, int(lanes.max()) + 1)
            if n > count:
                notes.append(f"chip{chip}.core{core}: transfers overlap on {n} {label} queues but the config has "
                             f"{count}; the {label} rows are a reconstruction")  # fmt: skip
            for k in range(n):
                mine = sel[lanes == k]
                busy = int((f.data_end[mine] - tr.start[mine]).sum())
                rows.append({
                    "name": f"chip{chip}.core{core}.dma.{label}{k}", "kind": "dma_engine", "chip": chip,
                    "core": core, "instructions": len(mine), "busy_cycles": busy, "busy_fraction": _ratio(busy, total),
                    "bytes": int(tr.bytes[mine].sum()), "flops": 0, "critical_path_cycles": None,
                })  # fmt: skip
    return engine, rows, notes


def _hbm(f: TraceFacts, cfg: ChipConfig, total: int, chips: list[int]) -> tuple[list[dict[str, Any]], dict[int, Any]]:
    """HBM rows: busy while a transfer touching it is in its data phase (after ``dma.setup_cycles``)."""
    tr = f.trace
    setup = cfg.dma.setup_cycles
    rows, per_chip = [], {}
    for chip in chips:
        read = (f.chip == chip) & (f.hbm_read > 0)
        write = (f.hbm_write > 0) & (((f.dst_chip == chip) & (f.dst_chip >= 0)) | ((f.chip == chip) & (f.dst_chip < 0)))
        touch = read | write
        s = np.minimum(tr.start[touch] + setup, f.data_end[touch])
        rs, re_ = merged_runs(s, f.data_end[touch])
        busy = int((re_ - rs).sum())
        nbytes = int(f.hbm_read[read].sum() + f.hbm_write[write].sum())
        per_chip[chip] = (int(f.hbm_read[read].sum()), int(f.hbm_write[write].sum()), touch)
        rows.append({
            "name": f"chip{chip}.hbm", "kind": "hbm", "chip": chip, "core": None,
            "instructions": int(touch.sum()), "busy_cycles": busy, "busy_fraction": _ratio(busy, total),
            "bytes": nbytes, "flops": 0, "critical_path_cycles": None,
        })  # fmt: skip
    return rows, per_chip


def _hbm_regions(result: SimulationResult, f: TraceFacts, total: int, chip: int) -> list[Region]:
    """Live HBM byte ranges of one chip (see :mod:`tpusim.report.occupancy`)."""
    compiled = result.compiled
    tr = f.trace
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i in np.flatnonzero(f.chip == chip).tolist():
        h = f.hlo[i]
        first[h] = min(first.get(h, total), int(tr.issue[i]))
        last[h] = max(last.get(h, 0), int(tr.end[i]))
    names: dict[int, set[str]] = defaultdict(set)
    by_value: dict[tuple[str, str], set[int]] = defaultdict(set)
    for (comp_name, value, _), bid in compiled.buffers.leaves.items():
        names[bid].add(value)
        by_value[(comp_name, value)].add(bid)
    for comp in compiled.module.computations:
        for ins in comp.instructions:
            for op in ins.operands:
                for bid in by_value.get((comp.name, op), ()):
                    names[bid].add(ins.name)
    regions: list[Region] = []
    covered: list[tuple[int, int]] = []
    for b in compiled.buffers.buffers:
        covered.append((b.offset, b.offset + b.size))
        touched = [h for h in names[b.id] if h in first]
        t0 = min((first[h] for h in touched), default=None)
        t1 = max((last[h] for h in touched), default=None)
        if b.kind in ("parameter", "constant"):
            t0, t1 = 0, total
        elif b.kind == "output":
            t0, t1 = (t0 if t0 is not None else 0), total
        if t0 is not None and t1 is not None:
            regions.append((b.offset, b.offset + b.size, t0, t1))
    # HBM outside every buffer (per-instruction scratch): live from its first to its last access.
    covered = merge_ranges(covered)
    los = np.array([c[0] for c in covered] or [0], np.int64)
    his = np.array([c[1] for c in covered] or [0], np.int64)
    scratch: dict[tuple[int, int], list[int]] = {}
    for i in np.flatnonzero(f.chip == chip).tolist():
        for space, c, _, lo, hi in f.reads[i] + f.writes[i]:
            if space != "hbm" or c != chip:
                continue
            k = int(np.searchsorted(los, lo, side="right")) - 1
            if k >= 0 and lo < his[k] and hi <= his[k]:
                continue
            span = scratch.setdefault((lo, hi), [int(tr.issue[i]), int(tr.end[i])])
            span[0], span[1] = min(span[0], int(tr.issue[i])), max(span[1], int(tr.end[i]))
    regions += [(lo, hi, t0, t1) for (lo, hi), (t0, t1) in scratch.items()]
    return regions


def _vmem_regions(f: TraceFacts) -> dict[tuple[int, int], list[Region]]:
    """Live VMEM byte ranges per core: each HLO instruction's blocks, from its first to its last entry."""
    tr = f.trace
    ranges: dict[tuple[int, int, str], list[tuple[int, int]]] = defaultdict(list)
    span: dict[tuple[int, int, str], list[int]] = {}
    for i in range(len(tr)):
        for sp, chip, core, lo, hi in f.reads[i] + f.writes[i]:
            if sp != "vmem":
                continue
            key = (chip, core, f.hlo[i])
            ranges[key].append((lo, hi))
            s = span.setdefault(key, [int(tr.issue[i]), int(tr.end[i])])
            s[0], s[1] = min(s[0], int(tr.issue[i])), max(s[1], int(tr.end[i]))
    out: dict[tuple[int, int], list[Region]] = defaultdict(list)
    for key, rs in ranges.items():
        t0, t1 = span[key]
        out[key[:2]] += [(lo, hi, t0, t1) for lo, hi in merge_ranges(rs)]
    return out


def _memories(
    result: SimulationResult, f: TraceFacts, total: int, hbm: dict[int, Any]
) -> tuple[list[dict[str, Any]], dict[str, Occupancy]]:
    cfg = result.compiled.config
    tr = f.trace
    seconds = total / cfg.clock_hz if total else 0.0
    rows: list[dict[str, Any]] = []
    occ: dict[str, Occupancy] = {}
    vmem_regions = _vmem_regions(f)
    cores = sorted({(s.chip, s.core) for s in tr.streams})
    vreg = cfg.vpu.vreg_bytes
    # VMEM's peak: its vector load and store ports plus the DMA port, all busy at once.
    ports = cfg.vmem.load_vregs_per_cycle + cfg.vmem.store_vregs_per_cycle
    vmem_peak = ports * vreg + cfg.dma.local_bytes_per_cycle
    compute = np.isin(f.kind, ("mxu", "vpu", "xlu"))
    dma = f.kind == "dma"
    for chip in sorted(hbm):
        read, write, _ = hbm[chip]
        held = occ[f"chip{chip}.hbm"] = occupancy(_hbm_regions(result, f, total, chip), total)
        fb = int(tr.bytes[(f.kind == "fallback") & (f.chip == chip)].sum())
        rows.append(_memory_row(f"chip{chip}.hbm", "hbm", chip, None, cfg.hbm.bytes, read, write, 0, fb, seconds,
                                cfg.hbm.bandwidth_bytes_per_s, held))  # fmt: skip
    for chip, core in cores:
        here = (f.chip == chip) & (f.core == core)
        for space, capacity in (("vmem", cfg.vmem.bytes), ("smem", cfg.smem.bytes)):
            read = int(tr.bytes[dma & here & (f.src_space == space)].sum())
            write = int(tr.bytes[dma & (f.dst_space == space) & (f.dst_chip == chip) & (f.dst_core == core)].sum())
            comp = int(tr.bytes[compute & here].sum()) if space == "vmem" else 0
            name = f"chip{chip}.core{core}.{space}"
            o: Occupancy | None = None
            if space == "vmem":
                o = occ[name] = occupancy(vmem_regions.get((chip, core), []), total)
            peak = vmem_peak * cfg.clock_hz if space == "vmem" else None
            rows.append(_memory_row(name, space, chip, core, capacity, read, write, comp, 0, seconds, peak, o))
    return rows, occ


def _memory_row(
    name: str, kind: str, chip: int, core: int | None, capacity: int, read: int, write: int, compute: int,
    fallback: int, seconds: float, peak: float | None, occ: Occupancy | None,
) -> dict[str, Any]:  # fmt: skip
    moved = read + write + compute
    rate = moved / seconds if seconds else None
    return {
        "name": name, "kind": kind, "chip": chip, "core": core, "capacity_bytes": int(capacity),
        "dma_bytes_read": int(read), "dma_bytes_written": int(write), "compute_bytes": int(compute),
        "fallback_bytes": int(fallback), "bytes": int(moved), "bytes_per_s": rate, "peak_bytes_per_s": peak,
        "bandwidth_fraction": _ratio(rate, peak) if rate is not None and peak else None,
        "occupancy": None if occ is None else {
            "peak_bytes": occ.peak_bytes, "mean_bytes": occ.mean_bytes,
            "peak_fraction": _ratio(occ.peak_bytes, capacity), "mean_fraction": _ratio(occ.mean_bytes, capacity),
        },
    }  # fmt: skip


def hlo_index(result: SimulationResult) -> dict[str, tuple[str, str, str | None]]:
    """HLO name -> (computation, opcode, user source location) over the module as lowered. A fusion shares
    its name with its fused root, so the computations that run as code (entry, loop bodies ...) come first."""
    module = result.compiled.module
    first = sequential_computations(module)
    out: dict[str, tuple[str, str, str | None]] = {}
    for comp in [module[c] for c in first] + [c for c in module.computations if c.name not in first]:
        for ins in comp.instructions:
            loc = ins.loc
            src = loc.user_code if loc is not None else None
            out.setdefault(ins.name, (comp.name, ins.opcode, src))
    return out


def _ops(result: SimulationResult, f: TraceFacts, critical: np.ndarray, total: int) -> list[dict[str, Any]]:
    """One row per HLO instruction. Its span runs from the first issue of any of its instructions to the last
    completion; ideal times are its MXU, VPU and XLU flops at the peak of the cores it ran on and its HBM
    bytes at the peak bandwidth of the chips it touched."""
    cfg = result.compiled.config
    peaks = _peaks(cfg)
    tr = f.trace
    index = hlo_index(result)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, h in enumerate(f.hlo):
        groups[h].append(i)
    rows: list[dict[str, Any]] = []
    for h, members in groups.items():
        idx = np.asarray(members, np.int64)
        kinds = f.kind[idx]
        start, end = int(tr.issue[idx].min()), int(tr.end[idx].max())
        span = end - start
        work = kinds != "sync"
        rs, re_ = merged_runs(tr.start[idx][work], tr.end[idx][work])
        by_kind = {k: int(tr.flops[idx][kinds == k].sum()) for k in ("mxu", "vpu", "xlu", "fallback")}
        hbm_bytes = int(f.hbm_read[idx].sum() + f.hbm_write[idx].sum())
        flops = int(tr.flops[idx].sum())
        n_cores = len({(int(a), int(b)) for a, b in zip(f.chip[idx], f.core[idx])})
        n_chips = len({int(a) for a in f.chip[idx]})
        compute = max(by_kind[k] / (peaks[k] * n_cores) for k in ("mxu", "vpu", "xlu"))
        memory = hbm_bytes / (peaks["hbm"] * n_chips)
        if bool(f.fallback[idx].any()):
            bound = "fallback"
        elif span and max(compute, memory) >= BOUND_FRACTION * span:
            bound = "compute" if compute >= memory else "memory"
        else:
            bound = "latency"
        comp, opcode, src = index.get(h, (None, None, None))
        seconds = span / cfg.clock_hz
        rows.append({
            "name": h or NO_HLO, "computation": comp, "opcode": opcode, "source": src,
            "instructions": len(idx), "start_cycle": start, "end_cycle": end, "span_cycles": span,
            "active_cycles": int((re_ - rs).sum()), "critical_path_cycles": int(critical[idx].sum()),
            "critical_path_fraction": _ratio(int(critical[idx].sum()), total),
            "flops": flops, "mxu_flops": by_kind["mxu"], "vpu_flops": by_kind["vpu"] + by_kind["xlu"],
            "bytes": int(tr.bytes[idx].sum()), "hbm_bytes": hbm_bytes,
            "arithmetic_intensity": _ratio(flops, hbm_bytes), "flops_per_s": flops / seconds if seconds else None,
            "hbm_bytes_per_s": hbm_bytes / seconds if seconds else None,
            "ideal_compute_cycles": compute, "ideal_memory_cycles": memory, "bound": bound,
        })  # fmt: skip
    rows.sort(key=lambda r: (-r["critical_path_cycles"], -r["span_cycles"], r["name"]))
    return rows


def analyse(result: SimulationResult) -> RunAnalysis:
    """Compute a report's numbers from a simulation (see :class:`RunAnalysis`)."""
    cfg = result.compiled.config
    f = decode_trace(result.trace, cfg, result.compiled.program)
    tr = f.trace
    total = int(result.cycles)
    priority = np.array([_PRIORITY.get(k, 1) for k in f.kind.tolist()], np.int64)
    critical, _ = critical_path(tr.start, tr.end, priority, total)
    units = _unit_rows(f, total, critical)
    engine, engine_rows, notes = _engines(f, cfg, total)
    chips = sorted({s.chip for s in tr.streams}) or [0]
    hbm_rows, hbm = _hbm(f, cfg, total, chips)
    units += engine_rows + hbm_rows
    memories, occ = _memories(result, f, total, hbm)
    ops = _ops(result, f, critical, total)
    links, collectives = _ici(result, total, notes) if len(chips) > 1 else ([], [])
    units += [
        {"name": k["name"], "kind": "ici_link", "chip": k["chip"], "core": None, "instructions": k["transfers"],
         "busy_cycles": k["busy_cycles"], "busy_fraction": k["busy_fraction"], "bytes": k["bytes"], "flops": 0,
         "critical_path_cycles": None}
        for k in links if k["bytes"]
    ]  # fmt: skip
    return RunAnalysis(result, f, total, critical, engine, units, memories, ops, occ, notes, links, collectives)


def _ici(result: SimulationResult, total: int, notes: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Link rows (every directed link of the topology) and per-chip collective time of a multi-chip run.
    Link traffic is reconstructed from the remote DMAs (see :mod:`tpusim.report.links`)."""
    from tpusim.report.links import collective_time, link_usage

    cfg = result.compiled.config
    seconds = total / cfg.clock_hz
    uses, unknown = link_usage(result)
    if unknown:
        notes.append(f"{unknown} transfers to other chips have a destination computed at run time that the "
                     "report could not evaluate; their bytes are missing from the link rows")  # fmt: skip
    links = [
        {"name": u.name, "chip": u.link[0], "axis": u.link[1], "direction": "+" if u.link[2] > 0 else "-",
         "transfers": u.transfers, "bytes": u.bytes, "bytes_per_s": u.bytes / seconds if seconds else None,
         "peak_bytes_per_s": cfg.ici.link_bandwidth_bytes_per_s, "bandwidth_fraction": u.utilisation,
         "busy_cycles": u.busy_cycles, "busy_fraction": u.busy_cycles / total if total else None}
        for u in uses
    ]  # fmt: skip
    collectives = [
        {"chip": t.chip, "cycles": t.cycles, "fraction": t.cycles / total if total else None,
         "overlapped_cycles": t.overlapped, "exposed_cycles": t.cycles - t.overlapped,
         "compute_cycles": t.compute}
        for t in collective_time(result)
    ]  # fmt: skip
    return links, collectives
