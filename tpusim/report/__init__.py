"""Reports of simulations: statistics from the trace, summaries for people and machines, Perfetto traces, plots.

``write_report(result, "reports/x")`` writes summary.json (schema in :mod:`tpusim.report.schema`), trace.json,
report.md and the plots; ``render_report("reports/x")`` renders report.md and the plots again from the JSON.
See ``docs/reports.md``.
"""

from tpusim.report.stats import OpStats, UnitStats, op_stats, unit_stats
from tpusim.report.writer import ReportError, render_report, write_report

__all__ = ["OpStats", "ReportError", "UnitStats", "op_stats", "render_report", "unit_stats", "write_report"]
