"""Reports of simulations: statistics from the trace, summaries for people and machines, Perfetto traces, plots.

``write_report(result, "reports/x")`` writes summary.json (schema in :mod:`tpusim.report.schema`), trace.json,
report.md and the plots; ``render_report("reports/x")`` renders report.md and the plots again from the JSON.
See ``docs/reports.md``. The names below are imported when first used, so that importing a submodule (the
command line's ``tpusim.report.command``) does not load the statistics and plots.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

_WHERE = {
    "OpStats": "stats", "UnitStats": "stats", "op_stats": "stats", "unit_stats": "stats",
    "ReportError": "writer", "render_report": "writer", "write_report": "writer",
}  # fmt: skip

__all__ = ["OpStats", "ReportError", "UnitStats", "op_stats", "render_report", "unit_stats", "write_report"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"tpusim.report.{_WHERE[name]}"), name)
    if importlib.util.find_spec(f"tpusim.report.{name}") is not None:  # a submodule, as an eager import set it
        return importlib.import_module(f"tpusim.report.{name}")
    raise AttributeError(f"module 'tpusim.report' has no attribute {name!r}")
