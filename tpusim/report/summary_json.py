"""``summary.json``: a run's report as one JSON document with a versioned schema (:mod:`tpusim.report.schema`).

Everything a person reads in ``report.md`` and every plot but the unit timeline come from this document, so
``tpusim report DIR`` can re-render a report without the simulation. Units are in the key names
(``_cycles``, ``_bytes``, ``_per_s``, ``_fraction`` for shares between 0 and 1).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

import tpusim
from tpusim.report.analysis import RunAnalysis, analyse
from tpusim.report.occupancy import Occupancy
from tpusim.report.schema import SCHEMA_ID, SCHEMA_VERSION
from tpusim.report.timeline import binned_busy

if TYPE_CHECKING:
    from tpusim.api import SimulationResult

__all__ = ["SERIES_BINS", "build_summary", "summary_from_analysis"]

SERIES_BINS = 200
"""Time bins of the utilisation series."""

MAX_STEPS = 4000
"""Occupancy step functions with more change points are resampled to this many bins (keeping each bin's peak)."""


def _edges(total: int, bins: int) -> np.ndarray:
    return np.unique(np.linspace(0, max(total, 1), min(bins, max(total, 1)) + 1).round().astype(np.int64))


def _hbm_rate_series(a: RunAnalysis, chip: int, edges: np.ndarray) -> list[float]:
    """HBM payload bytes moved per bin, as a share of the bin's peak bytes.

    The trace gives each transfer's data phase but not its rate over time (the flow model shares bandwidth
    between transfers). Each transfer's bytes are spread evenly over its data phase; a bin offered more than
    the peak serves the peak and carries the rest into the next bins, as the shared HBM would. Totals are
    exact; the shape within a busy stretch is a reconstruction.
    """
    f, tr = a.facts, a.facts.trace
    cfg = a.result.compiled.config
    here = f.chip == chip
    moved = f.hbm_read * here + f.hbm_write * here
    sel = moved > 0
    cap = cfg.hbm_bytes_per_cycle * np.diff(edges).astype(float)
    if not sel.any():
        return [0.0] * len(cap)
    s = np.minimum(tr.start[sel] + cfg.dma.setup_cycles, f.data_end[sel]).astype(float)
    e = np.maximum(f.data_end[sel], s + 1).astype(float)
    rate = moved[sel] / (e - s)
    # Cumulative offered bytes: piecewise linear, slope +rate from s and -rate from e.
    times = np.concatenate([s, e])
    slope_change = np.concatenate([rate, -rate])
    order = np.argsort(times, kind="stable")
    times, slope_change = times[order], slope_change[order]
    slope = np.cumsum(slope_change)
    cum = np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(times))])
    offered = np.diff(np.interp(edges.astype(float), times, cum, left=0.0, right=float(cum[-1]))).clip(min=0.0)
    served = np.zeros(len(cap))
    carry = 0.0
    for i, (o, c) in enumerate(zip(offered.tolist(), cap.tolist())):
        served[i] = min(c, o + carry)
        carry = o + carry - served[i]
    served[-1] += carry  # never more than rounding: the bytes fit the busy stretches
    return [float(x) for x in served / cap]


def _steps(o: Occupancy, total: int) -> dict[str, list[int]]:
    cyc, val = o.cycles, o.bytes
    if len(cyc) > MAX_STEPS:
        edges = _edges(total, MAX_STEPS)
        nb = len(edges) - 1
        which = (np.searchsorted(edges, cyc, side="right") - 1).clip(0, nb - 1)
        inside = np.zeros(nb, np.int64)
        np.maximum.at(inside, which, val)
        held = val[np.searchsorted(cyc, edges[:-1], side="right") - 1]  # the value each bin starts with
        cyc, val = edges[:-1], np.maximum(inside, held)
    return {"cycles": [int(c) for c in cyc], "bytes": [int(v) for v in val]}


def _series(a: RunAnalysis) -> dict[str, Any]:
    tr = a.facts.trace
    edges = _edges(a.cycles, SERIES_BINS)
    width = np.diff(edges).astype(float)
    util: dict[str, list[float]] = {}
    for uid, name in enumerate(tr.units):
        sel = tr.unit == uid
        util[name] = [float(x) for x in binned_busy(tr.start[sel], tr.end[sel], edges) / width]
    f = a.facts
    for row in a.units:
        if row["kind"] != "dma_engine":
            continue
        pool, k = re.fullmatch(r".*\.dma\.(engine|ici)(\d+)", row["name"]).groups()  # type: ignore[union-attr]
        remote = f.remote if pool == "ici" else ~f.remote
        sel = (a.engine == int(k)) & remote & (f.chip == row["chip"]) & (f.core == row["core"])
        util[row["name"]] = [float(x) for x in binned_busy(tr.start[sel], f.data_end[sel], edges) / width]
    hbm = {m["name"]: _hbm_rate_series(a, m["chip"], edges) for m in a.memories if m["kind"] == "hbm"}
    return {
        "edges_cycles": [int(e) for e in edges],
        "utilisation": util,
        "hbm_bandwidth_fraction": hbm,
        "occupancy": {name: _steps(o, a.cycles) for name, o in a.occupancy.items()},
    }


def _xla(result: Any) -> dict[str, Any] | None:
    """XLA:TPU's estimates beside tpusim's (tpusim.report.xla_compare), or None for a module without them."""
    from dataclasses import asdict

    from tpusim.report.xla_compare import CAVEAT, xla_kernels, xla_program

    program, kernels = xla_program(result), xla_kernels(result)
    if program is None and not kernels:
        return None
    rows = [asdict(k) | {"ratio": k.ratio} for k in kernels]
    return {"caveat": CAVEAT, "program": program, "kernels": rows}


def summary_from_analysis(
    a: RunAnalysis, *, program_path: str | None = None, wall_seconds: float | None = None
) -> dict[str, Any]:
    """The ``summary.json`` document of an analysed run."""
    r = a.result
    compiled = r.compiled
    cfg = compiled.config
    tr = a.facts.trace
    total = a.cycles
    seconds = total / cfg.clock_hz
    chips = sorted({s.chip for s in tr.streams}) or [0]
    cores = len({(s.chip, s.core) for s in tr.streams}) or 1
    kind = a.facts.kind
    flops = int(tr.flops.sum())
    peak_flops = cfg.peak_bf16_flops_per_s * len(chips)
    hbm_rows = [m for m in a.memories if m["kind"] == "hbm"]
    hbm_bytes = sum(m["dma_bytes_read"] + m["dma_bytes_written"] for m in hbm_rows)
    peak_hbm = cfg.hbm.bandwidth_bytes_per_s * len(chips)
    by_bound: dict[str, int] = {"compute": 0, "memory": 0, "latency": 0, "fallback": 0}
    for op in a.ops:
        by_bound[op["bound"]] += op["critical_path_cycles"]
    vreg = cfg.vpu.sublanes * cfg.vpu.lanes
    timing_only = not r.outputs and bool(compiled.outputs)
    return {
        "schema": SCHEMA_ID,
        "schema_version": SCHEMA_VERSION,
        "generator": {"tpusim": tpusim.__version__},
        "program": {
            "name": compiled.source.name,
            "path": program_path,
            "hlo_instructions": sum(len(c.instructions) for c in compiled.module.computations),
            "isa_instructions": compiled.program.instruction_count,
        },
        "config": {
            "name": cfg.name,
            "source": cfg.source,
            "overrides": list(cfg.overrides),
            "clock_hz": cfg.clock_hz,
            "chips": len(chips),
            "cores": cores,
        },
        "options": {
            "tiling": compiled.options.tiling,
            "matmul_precision": compiled.options.matmul_precision,
            "fuse": compiled.options.fuse,
            "vmem_fraction": compiled.options.vmem_fraction,
            "megacore": compiled.options.megacore,
            "timing_only": timing_only,
        },
        "totals": {
            "cycles": total,
            "seconds": seconds,
            "instructions": len(tr),
            "flops": flops,
            "mxu_flops": int(tr.flops[kind == "mxu"].sum()),
            "vpu_flops": int(tr.flops[(kind == "vpu") | (kind == "xlu")].sum()),
            "fallback_flops": int(tr.flops[kind == "fallback"].sum()),
            "flops_per_s": flops / seconds if seconds else None,
            "peak_flops_per_s": peak_flops,
            "flops_fraction_of_peak": (flops / seconds / peak_flops) if seconds else None,
            "hbm_bytes": hbm_bytes,
            "hbm_bytes_per_s": hbm_bytes / seconds if seconds else None,
            "peak_hbm_bytes_per_s": peak_hbm,
            "hbm_bandwidth_fraction": (hbm_bytes / seconds / peak_hbm) if seconds else None,
            "ici_bytes": sum(k["bytes"] for k in a.links),
            "critical_path_cycles_by_bound": by_bound,
        },
        "peaks": {
            "mxu_flops_per_cycle_per_core": cfg.mxu.count * cfg.mxu.rows * cfg.mxu.cols * 2,
            "vpu_ops_per_cycle_per_core": cfg.vpu.alu.issue_vregs_per_cycle * vreg,
            "hbm_bytes_per_cycle_per_chip": cfg.hbm_bytes_per_cycle,
            "hbm_bytes_per_s_per_chip": cfg.hbm.bandwidth_bytes_per_s,
            "ici_link_bytes_per_s": cfg.ici.link_bandwidth_bytes_per_s,
        },
        "units": a.units,
        "memories": a.memories,
        "links": a.links,
        "collectives": a.collectives,
        "ops": a.ops,
        "xla": _xla(r),
        "fallbacks": [
            {"computation": c, "instruction": n, "opcode": o, "reason": why} for c, n, o, why in compiled.fallbacks
        ],
        "relayouts": [
            {
                "computation": x.computation,
                "name": x.name,
                "from_shape": str(x.from_shape),
                "to_shape": str(x.to_shape),
                "reason": x.reason,
            }
            for x in compiled.relayouts
        ],
        "series": _series(a),
        "notes": list(a.notes),
        "host": {
            "wall_seconds": wall_seconds,
            "instructions_per_s": len(tr) / wall_seconds if wall_seconds else None,
        },
    }


def build_summary(
    result: SimulationResult, *, program_path: str | None = None, wall_seconds: float | None = None
) -> dict[str, Any]:
    """The ``summary.json`` document of a simulation (``host`` holds the only numbers that vary between runs)."""
    return summary_from_analysis(analyse(result), program_path=program_path, wall_seconds=wall_seconds)
