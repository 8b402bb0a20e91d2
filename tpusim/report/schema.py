"""The schema of ``summary.json`` (JSON Schema, draft 2020-12), versioned by :data:`SCHEMA_VERSION`.

The version changes when a key is removed or changes meaning; adding keys does not change it (objects allow
extra keys). ``tpusim report --schema`` prints it; ``docs/reports.md`` explains every field.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SCHEMA_ID", "SCHEMA_VERSION", "SUMMARY_SCHEMA"]

SCHEMA_ID = "tpusim.report.summary"
SCHEMA_VERSION = 1

_BIGGEST = 2**63 - 1  # (counts and cycles are 64-bit integers: a larger number is not one tpusim wrote)
_INT = {"type": "integer", "minimum": 0, "maximum": _BIGGEST}
_COUNT = {"type": "integer", "minimum": 1, "maximum": _BIGGEST}
_NUM = {"type": "number", "minimum": 0}
_NUM_OR_NULL = {"type": ["number", "null"], "minimum": 0}
_INT_OR_NULL = {"type": ["integer", "null"], "minimum": 0, "maximum": _BIGGEST}
_STR = {"type": "string"}
_STR_OR_NULL = {"type": ["string", "null"]}
_FRACTION = {"type": ["number", "null"], "minimum": 0}  # shares of a peak may exceed 1 only through rounding


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "object", "required": sorted(required), "properties": {**required, **(optional or {})}}


_UNIT = _obj({
    "name": _STR,
    "kind": {"enum": ["mxu", "vpu", "xlu", "dma", "fallback", "scalar", "sync", "dma_engine", "hbm", "ici_link"]},
    "chip": _INT, "core": _INT_OR_NULL, "instructions": _INT, "busy_cycles": _INT, "busy_fraction": _FRACTION,
    "bytes": _INT, "flops": _INT, "critical_path_cycles": _INT_OR_NULL,
})  # fmt: skip

_OCCUPANCY = _obj({"peak_bytes": _INT, "mean_bytes": _NUM, "peak_fraction": _FRACTION, "mean_fraction": _FRACTION})

_MEMORY = _obj({
    "name": _STR, "kind": {"enum": ["hbm", "vmem", "smem"]}, "chip": _INT, "core": _INT_OR_NULL,
    "capacity_bytes": _INT, "dma_bytes_read": _INT, "dma_bytes_written": _INT, "compute_bytes": _INT,
    "fallback_bytes": _INT, "bytes": _INT, "bytes_per_s": _NUM_OR_NULL, "peak_bytes_per_s": _NUM_OR_NULL,
    "bandwidth_fraction": _FRACTION, "occupancy": {"oneOf": [{"type": "null"}, _OCCUPANCY]},
})  # fmt: skip

_LINK = _obj({
    "name": _STR, "chip": _INT, "bytes": _INT, "bytes_per_s": _NUM_OR_NULL, "peak_bytes_per_s": _NUM,
    "bandwidth_fraction": _FRACTION, "busy_cycles": _INT, "busy_fraction": _FRACTION,
}, {"axis": _INT, "direction": {"enum": ["+", "-"]}, "transfers": _INT})  # fmt: skip

_COLLECTIVE = _obj({
    "chip": _INT, "cycles": _INT, "fraction": _FRACTION, "overlapped_cycles": _INT, "exposed_cycles": _INT,
    "compute_cycles": _INT,
})  # fmt: skip

_OP = _obj({
    "name": _STR, "computation": _STR_OR_NULL, "opcode": _STR_OR_NULL, "source": _STR_OR_NULL,
    "instructions": _INT, "start_cycle": _INT, "end_cycle": _INT, "span_cycles": _INT, "active_cycles": _INT,
    "critical_path_cycles": _INT, "critical_path_fraction": _FRACTION, "flops": _INT, "mxu_flops": _INT,
    "vpu_flops": _INT, "bytes": _INT, "hbm_bytes": _INT, "arithmetic_intensity": _NUM_OR_NULL,
    "flops_per_s": _NUM_OR_NULL, "hbm_bytes_per_s": _NUM_OR_NULL, "ideal_compute_cycles": _NUM,
    "ideal_memory_cycles": _NUM, "bound": {"enum": ["compute", "memory", "latency", "fallback"]},
})  # fmt: skip

_STEPS = _obj({"cycles": {"type": "array", "items": _INT}, "bytes": {"type": "array", "items": _INT}})
_SERIES_MAP = {"type": "object", "additionalProperties": {"type": "array", "items": _NUM}}

# fmt: off
_XLA = {"oneOf": [{"type": "null"}, _obj({
    "caveat": _STR,
    "program": {"oneOf": [{"type": "null"}, _obj({
        "optimal_seconds": _NUM, "tpusim_seconds": _NUM, "ratio": _NUM, "flops": _NUM, "bytes_accessed": _NUM})]},
    "kernels": {"type": "array", "items": _obj({
        "name": _STR, "opcode": _STR, "xla_cycles": _INT, "xla_share": _NUM, "tpusim_cycles": _INT,
        "tpusim_share": _NUM, "ratio": _NUM_OR_NULL})},
})]}
"""XLA:TPU's estimates beside tpusim's, for a module XLA:TPU compiled (tpusim.report.xla_compare)."""
# fmt: on

_TOP = _obj({
    "schema": {"const": SCHEMA_ID},
    "schema_version": {"const": SCHEMA_VERSION},
    "generator": _obj({"tpusim": _STR}),
    "program": _obj({"name": _STR, "path": _STR_OR_NULL, "hlo_instructions": _INT, "isa_instructions": _INT}),
    "config": _obj({
        "name": _STR, "source": _STR_OR_NULL, "overrides": {"type": "array", "items": _STR},
        "clock_hz": {"type": "number", "exclusiveMinimum": 0}, "chips": _COUNT, "cores": _COUNT,
    }),
    "options": _obj({
        "tiling": _STR, "matmul_precision": {"enum": ["default", "high", "highest"]}, "fuse": {"type": "boolean"},
        "vmem_fraction": _NUM, "timing_only": {"type": "boolean"},
    }, {"megacore": {"type": "boolean"}}),
    "totals": _obj({
        "cycles": _INT, "seconds": _NUM, "instructions": _INT, "flops": _INT, "mxu_flops": _INT,
        "vpu_flops": _INT, "fallback_flops": _INT, "flops_per_s": _NUM_OR_NULL, "peak_flops_per_s": _NUM,
        "flops_fraction_of_peak": _FRACTION, "hbm_bytes": _INT, "hbm_bytes_per_s": _NUM_OR_NULL,
        "peak_hbm_bytes_per_s": _NUM, "hbm_bandwidth_fraction": _FRACTION, "ici_bytes": _INT,
        "critical_path_cycles_by_bound": _obj({"compute": _INT, "memory": _INT, "latency": _INT, "fallback": _INT}),
    }),
    "peaks": _obj({
        "mxu_flops_per_cycle_per_core": _NUM, "vpu_ops_per_cycle_per_core": _NUM,
        "hbm_bytes_per_cycle_per_chip": _NUM, "hbm_bytes_per_s_per_chip": _NUM, "ici_link_bytes_per_s": _NUM,
    }),
    "units": {"type": "array", "items": _UNIT},
    "memories": {"type": "array", "items": _MEMORY},
    "links": {"type": "array", "items": _LINK},
    "ops": {"type": "array", "items": _OP},
    "fallbacks": {"type": "array", "items": _obj({
        "computation": _STR, "instruction": _STR, "opcode": _STR, "reason": _STR})},
    "relayouts": {"type": "array", "items": _obj({
        "computation": _STR, "name": _STR, "from_shape": _STR, "to_shape": _STR, "reason": _STR})},
    "series": _obj({
        "edges_cycles": {"type": "array", "items": _INT, "minItems": 2},
        "utilisation": _SERIES_MAP,
        "hbm_bandwidth_fraction": _SERIES_MAP,
        "occupancy": {"type": "object", "additionalProperties": _STEPS},
    }),
    "notes": {"type": "array", "items": _STR},
    "host": _obj({"wall_seconds": _NUM_OR_NULL, "instructions_per_s": _NUM_OR_NULL}),
}, {"collectives": {"type": "array", "items": _COLLECTIVE}, "xla": _XLA})  # fmt: skip

SUMMARY_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"{SCHEMA_ID}/{SCHEMA_VERSION}",
    "title": "tpusim run report",
    **_TOP,
}
"""JSON Schema of ``summary.json``."""
