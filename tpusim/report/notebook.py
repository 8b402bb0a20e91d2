"""A simulation's summary as HTML (its time, busiest units, costliest HLO instructions and the timeline by
unit as an inline image), and the IPython extension that shows results so in a notebook::

    %load_ext tpusim.report.notebook
    result = tpusim.simulate(...)
    result            # the summary table, not the object's repr
"""

from __future__ import annotations

import base64
import io
from html import escape
from typing import TYPE_CHECKING, Any

from tpusim.report.analysis import RunAnalysis, analyse

if TYPE_CHECKING:
    from tpusim.api import SimulationResult

__all__ = ["load_ipython_extension", "summary_html"]

TOP_OPS = 12
"""HLO instructions the summary lists (the costliest on the critical path)."""


def summary_html(result: SimulationResult) -> str:
    """The run's time, its busiest units and its costliest HLO instructions as an HTML fragment."""
    a = analyse(result)
    cfg = result.compiled.config
    cycles = max(a.cycles, 1)
    us = 1e6 / cfg.clock_hz
    head = (
        f"<p><b>{escape(result.compiled.source.name)}</b> on {escape(cfg.name)}: {a.cycles:,} cycles = "
        f"{result.seconds * 1e6:,.2f} us, {result.instructions:,} instructions executed</p>"
    )
    units = sorted((u for u in a.units if u.get("busy_cycles")), key=lambda u: -u["busy_cycles"])[:8]
    unit_rows = "".join(
        f"<tr><td>{escape(str(u['name']))}</td><td>{escape(str(u['kind']))}</td>"
        f"<td style='text-align:right'>{u['busy_cycles'] / cycles:.1%}</td></tr>"
        for u in units
    )
    op_rows = "".join(
        f"<tr><td>{escape(str(o['name']))}</td><td>{escape(str(o['opcode'] or ''))}</td>"
        f"<td>{escape(str(o['source'] or ''))}</td>"
        f"<td style='text-align:right'>{o['span_cycles'] * us:,.2f}</td>"
        f"<td style='text-align:right'>{(o['critical_path_fraction'] or 0):.1%}</td>"
        f"<td style='text-align:right'>{o['flops']:.3g}</td></tr>"
        for o in a.ops[:TOP_OPS]
    )
    return (
        f"<div class='tpusim-summary'>{head}"
        "<table><thead><tr><th>unit</th><th>kind</th><th>busy</th></tr></thead>"
        f"<tbody>{unit_rows}</tbody></table>"
        "<table><thead><tr><th>HLO instruction</th><th>opcode</th><th>source</th><th>span (us)</th>"
        f"<th>critical path</th><th>flops</th></tr></thead><tbody>{op_rows}</tbody></table>"
        f"<img alt='timeline by unit' src='data:image/png;base64,{_timeline_png(a)}'/></div>"
    )


def _timeline_png(a: RunAnalysis, dpi: int = 80) -> str:
    """The report's timeline figure (units over time) as base64 PNG."""
    from tpusim.report import plots
    from tpusim.report.chrome_trace import trace_events
    from tpusim.report.summary_json import summary_from_analysis

    fig = plots.timeline_figure(summary_from_analysis(a), {"traceEvents": list(trace_events(a))})
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=dpi)
    return base64.b64encode(out.getvalue()).decode("ascii")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext tpusim.report.notebook``: notebooks show a :class:`~tpusim.api.SimulationResult` as
    :func:`summary_html`."""
    from tpusim.api import SimulationResult

    ipython.display_formatter.formatters["text/html"].for_type(SimulationResult, summary_html)
