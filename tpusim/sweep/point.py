"""Running one sweep point: compile (or reuse an earlier point's compilation), simulate, and reduce the run
to one row of headline metrics.

:func:`run_point` is a plain top-level function of picklable arguments, so it runs the same in this process,
in a local process pool or on a Dask worker; it never raises for a failing point but returns a row with
``status: error`` and the message.
"""

from __future__ import annotations

import hashlib
import traceback
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tpusim.compiler.config_reads import Path, read_values, recorded_reads
from tpusim.compiler.options import CompileOptions
from tpusim.config import ChipConfig
from tpusim.errors import TpusimError
from tpusim.sweep.spec import METRIC_COLUMNS, Point

if TYPE_CHECKING:
    from tpusim.compiler.pipeline import CompiledProgram

__all__ = ["compiled_for", "costs", "payload", "run_point"]


def costs(cfg: ChipConfig) -> dict[str, float]:
    return {
        "mxu_macs": cfg.core.count * cfg.mxu.count * cfg.mxu.rows * cfg.mxu.cols,
        "hbm_bandwidth_bytes_per_s": cfg.hbm.bandwidth_bytes_per_s,
        "vmem_bytes": cfg.vmem.bytes,
        "peak_flops_per_s": cfg.peak_bf16_flops_per_s,
    }


def payload(point: Point, program_text: str) -> dict[str, Any]:
    """What a worker needs to run ``point``: the HLO text travels with it, so workers need no shared files
    (an ``inputs`` file must still be readable where the point runs)."""
    return {"point": point, "program_text": program_text}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _metrics(result: Any) -> dict[str, Any]:
    from tpusim.report.analysis import analyse

    a = analyse(result)
    cfg = result.compiled.config
    seconds = result.cycles / cfg.clock_hz
    flops = int(result.trace.flops.sum())
    chips = max(len({s.chip for s in result.trace.streams}), 1)
    hbm = [m for m in a.memories if m["kind"] == "hbm"]
    hbm_bytes = sum(m["dma_bytes_read"] + m["dma_bytes_written"] for m in hbm)

    def busy(kind: str) -> float:
        return _mean([u["busy_fraction"] or 0.0 for u in a.units if u["kind"] == kind])

    return {
        "cycles": int(result.cycles), "seconds": seconds, "instructions": len(result.trace), "flops": flops,
        "flops_per_s": flops / seconds if seconds else None,
        "flops_fraction_of_peak": flops / seconds / (cfg.peak_bf16_flops_per_s * chips) if seconds else None,
        "hbm_bytes": hbm_bytes, "hbm_bytes_per_s": hbm_bytes / seconds if seconds else None,
        "hbm_bandwidth_fraction": hbm_bytes / seconds / (cfg.hbm.bandwidth_bytes_per_s * chips) if seconds else None,
        "mxu_busy_fraction": busy("mxu"), "vpu_busy_fraction": busy("vpu"), "dma_busy_fraction": busy("dma"),
        "peak_hbm_bytes": max((m["occupancy"]["peak_bytes"] for m in hbm), default=0),
        "peak_vmem_bytes": max((m["occupancy"]["peak_bytes"] for m in a.memories if m["kind"] == "vmem"), default=0),
        "fallbacks": len(result.compiled.fallbacks), "relayouts": len(result.compiled.relayouts),
    }  # fmt: skip


_COMPILED: OrderedDict[tuple[str, CompileOptions], list[tuple[frozenset[Path], Any, CompiledProgram]]] = OrderedDict()
_KEEP = 8
"""Programs (with their compile options) whose compilations a process keeps for later points."""
_KEEP_EACH = 4
"""Compilations (for different values of the keys the compiler read) a process keeps per program: a sweep
over those keys compiles every point, and keeping them all would grow with the sweep."""


def compiled_for(program_text: str, config: ChipConfig, options: CompileOptions) -> CompiledProgram:
    """The program compiled for ``config``: an earlier point's compilation when ``config`` agrees with that
    point's on every key the compiler read (:mod:`tpusim.compiler.config_reads`; a sweep over timing keys
    the compiler does not read compiles once), else a new one.

    Raises:
        TpusimError: the program does not parse or compile for ``config``.
    """
    from tpusim.api import compile_checked
    from tpusim.compiler.hlo import parse_module

    key = (hashlib.sha256(program_text.encode()).hexdigest(), options)
    entries = _COMPILED.get(key)
    if entries is None:
        entries = _COMPILED[key] = []
        while len(_COMPILED) > _KEEP:
            _COMPILED.popitem(last=False)
    _COMPILED.move_to_end(key)
    for paths, values, compiled in entries:
        if read_values(config, paths) == values:
            return replace(compiled, config=config)
    module = parse_module(program_text)
    with recorded_reads(config) as reads:
        compiled = compile_checked(module, config, options)
    paths = frozenset(reads)
    entries.append((paths, read_values(config, paths), compiled))
    del entries[:-_KEEP_EACH]
    return compiled


def run_point(job: dict[str, Any]) -> dict[str, Any]:
    """Run one point (``job`` from :func:`payload`); returns its row (parameters, status, metrics, costs)."""
    point: Point = job["point"]
    row: dict[str, Any] = {"index": point.index, "id": point.id, "program": point.program}
    row.update({k: v for k, v in point.params if k != "program"})
    row["status"] = "ok"
    metrics: dict[str, Any] = dict.fromkeys(METRIC_COLUMNS)
    error = None
    try:
        from tpusim.api import simulate
        from tpusim.compiler.hlo.reference.io import load_inputs

        compiled = compiled_for(job["program_text"], point.config, point.options)
        module = compiled.source
        inputs = load_inputs(point.inputs, module)[0] if point.inputs else None
        result = simulate(compiled, inputs, timing_only=point.timing_only, seed=point.seed)
        metrics = _metrics(result)
    except TpusimError as e:
        error = f"{type(e).__name__}: {e}"
    except Exception as e:  # a bug, not bad input: keep the place it happened, and go on with the sweep
        where = traceback.extract_tb(e.__traceback__)[-1]
        error = f"{type(e).__name__}: {e} (at {where.filename}:{where.lineno})"
    if error is not None:
        row["status"] = "error"
    row.update(metrics)
    row.update(costs(point.config))
    row["error"] = error
    return row
