"""Reports of simulations: statistics from the trace, summaries for people and machines."""

from tpusim.report.stats import OpStats, UnitStats, op_stats, unit_stats

__all__ = ["OpStats", "UnitStats", "op_stats", "unit_stats"]
