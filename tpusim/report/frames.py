"""Per-HLO-op and per-unit metrics of a simulation as pandas DataFrames (pandas is optional: the same rows
are plain dicts in :func:`tpusim.report.analysis.analyse`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpusim.report.analysis import analyse

if TYPE_CHECKING:
    from tpusim.api import SimulationResult

__all__ = ["to_pandas", "units_to_pandas"]


def _pandas() -> Any:
    try:
        import pandas
    except ImportError as e:
        raise ImportError(
            "tpusim.report.to_pandas needs pandas (pip install pandas); without it the same rows are "
            "tpusim.report.analysis.analyse(result).ops, a list of dicts"
        ) from e
    return pandas


def to_pandas(result: SimulationResult) -> Any:
    """One row per HLO instruction of the run, indexed by its name, costliest on the critical path first:
    span and active cycles, instructions, flops by unit, bytes, ideal cycles, the source line where the HLO
    carries one (the columns of ``report.md``'s op table, see ``docs/reports.md``)."""
    return _pandas().DataFrame(analyse(result).ops).set_index("name")


def units_to_pandas(result: SimulationResult) -> Any:
    """One row per unit of the run (MXUs, VPU, XLUs, DMA engines, HBMs, ICI links), indexed by its name."""
    return _pandas().DataFrame(analyse(result).units).set_index("name")
