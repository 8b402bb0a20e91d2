"""Reports of simulations: statistics from the trace, summaries for people and machines, Perfetto traces, plots.

``write_report(result, "reports/x")`` writes summary.json (schema in :mod:`tpusim.report.schema`), trace.json,
report.md and the plots; ``render_report("reports/x")`` renders report.md and the plots again from the JSON.
See ``docs/reports.md``. The names below are imported when first used, so that importing a submodule (the
command line's ``tpusim.report.command``) does not load the statistics and plots.
"""

from __future__ import annotations

from typing import Any

from tpusim.lazy import lazy_attribute

_WHERE = {
    "OpStats": "tpusim.report.stats", "UnitStats": "tpusim.report.stats", "op_stats": "tpusim.report.stats",
    "unit_stats": "tpusim.report.stats", "ReportError": "tpusim.report.writer",
    "render_report": "tpusim.report.writer", "write_report": "tpusim.report.writer",
    "to_pandas": "tpusim.report.frames", "units_to_pandas": "tpusim.report.frames",
    "summary_html": "tpusim.report.notebook",
}  # fmt: skip

__all__ = [
    "OpStats", "ReportError", "UnitStats", "op_stats", "render_report", "summary_html", "to_pandas", "unit_stats",
    "units_to_pandas", "write_report",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _WHERE, name, submodules=True)
