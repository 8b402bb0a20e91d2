"""The report parts of the command line: ``tpusim run ... --report [DIR]`` and ``tpusim report DIR``.

``tpusim/cli.py`` registers them; this module imports only the standard library at the top, so building the
parser stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tpusim.argtypes import between

if TYPE_CHECKING:
    from tpusim.api import SimulationResult

__all__ = ["add_report_argument", "configure_report", "report_folder", "run_report", "write_run_report"]


def add_report_argument(p: argparse.ArgumentParser) -> None:
    """``--report [DIR]`` for ``tpusim run``."""
    p.add_argument("--report", nargs="?", const="", default=None, metavar="DIR",
                   help="write a report (summary.json, trace.json for Perfetto, report.md, plots) to DIR "
                        "(default: reports/<program>-<config>/)")  # fmt: skip


def report_folder(args: argparse.Namespace, config_name: str) -> Path:
    """The folder ``tpusim run --report [DIR]`` writes to: DIR, which must be new, empty or an earlier report
    (its ``summary.json``), or else ``reports/<program>-<config>``, numbered ``-2``, ``-3`` ... when taken (a
    report of another run is never replaced unasked). Worked out and checked once per run (kept on ``args``).

    Raises:
        OutputPathError: the folder cannot be written, holds other files, or a folder where a report file goes."""
    from tpusim.paths import OutputPathError, check_output_path, fresh_path
    from tpusim.report.writer import REPORT_FILES, default_report_dir

    chosen = getattr(args, "report_folder", None)
    if chosen is None:
        given = Path(args.report) if args.report else fresh_path(default_report_dir(args.program, config_name))
        chosen = check_output_path(given, "--report", folder=True)
        if args.report and chosen.is_dir() and any(chosen.iterdir()) and not (chosen / "summary.json").is_file():
            raise OutputPathError(
                f"--report {chosen}: the folder holds files that are not a tpusim report; give a new or empty folder"
            )
        for name in REPORT_FILES:  # (checked now: found only when writing, the run would be lost)
            if (chosen / name).exists() and not (chosen / name).is_file():
                raise OutputPathError(f"--report {chosen}: {chosen / name} is not a file; the report writes one there")
        args.report_folder = chosen
    return Path(chosen)


def write_run_report(args: argparse.Namespace, result: SimulationResult, wall_seconds: float) -> Path:
    """Write the report ``tpusim run --report`` asked for; returns its folder."""
    from tpusim.report.writer import write_report

    out = report_folder(args, result.compiled.config.name)
    write_report(result, out, program_path=str(args.program), wall_seconds=wall_seconds)
    print(f"wrote report to {out}/ (report.md, summary.json, trace.json, plots)", file=sys.stderr)
    return out


def configure_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", type=Path, nargs="?", help="a report folder written by 'tpusim run --report'")
    p.add_argument("--schema", action="store_true", help="print the JSON Schema of summary.json and exit")
    p.add_argument("--dpi", type=between(20, 1200), default=110, help="resolution of the plots (default 110)")
    p.add_argument("--trace-view", nargs="?", const=":", metavar="START:END",
                   help="also draw trace.json as a trace viewer lays it out (tracks, slices, flow arrows, counters) "
                        "into trace_view.png, between cycles START and END (default: the whole run)")  # fmt: skip


def run_report(args: argparse.Namespace) -> int:
    from tpusim.report.writer import ReportError, render_report

    if args.schema:
        from tpusim.report.schema import SUMMARY_SCHEMA

        print(json.dumps(SUMMARY_SCHEMA, indent=1))
        return 0
    if args.directory is None:
        raise ReportError("give a report folder (or --schema)")
    window = _trace_window(args.trace_view) if args.trace_view is not None else None  # before any work
    for path in render_report(args.directory, dpi=args.dpi):
        print(f"wrote {path}", file=sys.stderr)
    if window is not None:
        print(f"wrote {_trace_view(args.directory, window, args.dpi)}", file=sys.stderr)
    return 0


def _trace_window(text: str) -> tuple[float | None, float | None]:
    """``START:END`` in cycles (either may be left out): finite, START >= 0 and START < END."""
    import math

    from tpusim.report.writer import ReportError

    where = f"--trace-view {text[:60]}{'...' if len(text) > 60 else ''}"
    lo, sep, hi = text.partition(":")
    try:
        start, end = (float(lo) if lo.strip() else None), (float(hi) if hi.strip() else None)
    except ValueError:
        sep = ""
    if not sep:
        raise ReportError(f"{where}: give START:END in cycles (either may be left out), e.g. 3000:9000")
    for name, value in (("START", start), ("END", end)):
        if value is not None and not math.isfinite(value):
            raise ReportError(f"{where}: {name} must be a finite number of cycles, not {value}")
        if value is not None and value < 0:
            raise ReportError(f"{where}: {name} must be at least 0 cycles, not {value:g}")
    if start is not None and end is not None and start >= end:
        raise ReportError(f"{where}: START must come before END ({start:g} >= {end:g})")
    return start, end


def _trace_view(directory: Path, window: tuple[float | None, float | None], dpi: int) -> Path:
    from tpusim.report.trace_view import trace_view_figure
    from tpusim.report.writer import load_trace

    start, end = window
    doc = load_trace(directory / "trace.json")
    other = doc.get("otherData", {}) if isinstance(doc, dict) else {}
    clock = other.get("clock_hz")
    if "time_axis" not in other and isinstance(clock, (int, float)) and clock > 0:  # cycles -> the trace's us
        start, end = (None if t is None else t * 1e6 / clock for t in window)  # (older traces: 1 us = 1 cycle)
    out = directory / "trace_view.png"
    title = (f"{doc.get('otherData', {}).get('program', '')}: trace.json drawn by tpusim's trace view "
             "(not a Perfetto screenshot)")  # fmt: skip
    trace_view_figure(doc, start, end, title).savefig(out, dpi=dpi)
    return out
