"""Write a report folder from a simulation, or render one again from its JSON files.

A report folder holds ``summary.json``, ``trace.json``, ``report.md`` and the plots ``timeline.png``,
``utilisation.png``, ``roofline.png`` and ``memory.png``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpusim.errors import TpusimError
from tpusim.report.markdown import render_markdown
from tpusim.report.schema import SCHEMA_ID, SCHEMA_VERSION, SUMMARY_SCHEMA
from tpusim.report.schema_check import first_problem

if TYPE_CHECKING:
    from tpusim.api import SimulationResult

__all__ = [
    "PLOTS",
    "REPORT_FILES",
    "ReportError",
    "default_report_dir",
    "load_json",
    "load_trace",
    "render_report",
    "write_report",
]

PLOTS = ("timeline", "utilisation", "roofline", "memory")
"""The figures of a report, each written as ``<name>.png``."""

REPORT_FILES = ("summary.json", "trace.json", "report.md", *(f"{p}.png" for p in PLOTS))
"""Every file a report folder gets."""


class ReportError(TpusimError):
    """A report folder that cannot be read or rendered."""


def default_report_dir(program: str | Path, config_name: str) -> Path:
    """``reports/<program>-<config>``: the program's file name without its suffix, and the config's name."""
    return Path("reports") / f"{Path(program).stem}-{config_name}"


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _render(directory: Path, summary: dict[str, Any], trace: dict[str, Any] | None, dpi: int) -> list[Path]:
    from tpusim.report import plots

    figures = {
        "utilisation": lambda: plots.utilisation_figure(summary),
        "roofline": lambda: plots.roofline_figure(summary),
        "memory": lambda: plots.memory_figure(summary),
    }
    if trace is not None:
        figures = {"timeline": lambda: plots.timeline_figure(summary, trace), **figures}
    written = []
    for name in PLOTS:
        if name not in figures:
            continue
        path = directory / f"{name}.png"
        try:
            figure = figures[name]()
        except (KeyError, TypeError, ValueError) as e:  # (the timeline reads trace.json too: say which file)
            source = "trace.json" if name == "timeline" else "summary.json"
            raise ReportError(f"{directory / source}: cannot draw the {name} plot ({type(e).__name__}: {e})") from None
        figure.savefig(path, dpi=dpi)
        written.append(path)
    md = directory / "report.md"
    _write_text(md, render_markdown(summary, {p.stem: p.name for p in written}))
    return [md, *written]


def write_report(
    result: SimulationResult,
    directory: str | Path,
    *,
    program_path: str | None = None,
    wall_seconds: float | None = None,
    dpi: int = 110,
) -> list[Path]:
    """Write the report of a simulation into ``directory`` (created if needed).

    Args:
        result: the simulation.
        directory: the report folder.
        program_path: where the program came from (recorded in summary.json).
        wall_seconds: how long the simulation took on this machine (recorded under ``host``).
        dpi: resolution of the plots.

    Returns:
        The files written.
    """
    from tpusim.report.analysis import analyse
    from tpusim.report.chrome_trace import write_trace
    from tpusim.report.summary_json import summary_from_analysis

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    analysis = analyse(result)
    summary = summary_from_analysis(analysis, program_path=program_path, wall_seconds=wall_seconds)
    _write_text(out / "summary.json", json.dumps(summary, indent=1, allow_nan=False) + "\n")
    write_trace(analysis, out / "trace.json")
    trace = json.loads((out / "trace.json").read_text())
    return [out / "summary.json", out / "trace.json", *_render(out, summary, trace, dpi)]


def load_json(path: Path, what: str) -> dict[str, Any]:
    """A report file's JSON object, or a ReportError naming the file and what is wrong with it."""
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ReportError(f"cannot read {what} {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ReportError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    except RecursionError:
        raise ReportError(f"{path}: not {what} (nested too deeply to read)") from None
    if not isinstance(doc, dict):
        raise ReportError(f"{path}: expected a JSON object")
    return doc


def load_trace(path: Path) -> dict[str, Any]:
    """A report's trace.json, checked against the Trace Event Format's rules (its first problem is the error)."""
    from tpusim.report.chrome_trace import check_trace

    doc = load_json(path, "the trace")
    problems = check_trace(doc)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ReportError(f"{path}: {problems[0]}{more}")
    return doc


def render_report(directory: str | Path, *, dpi: int = 110) -> list[Path]:
    """Render ``report.md`` and the plots of a report folder again from its ``summary.json`` (and ``trace.json``
    for the timeline, when present). Returns the files written."""
    out = Path(directory)
    summary = load_json(out / "summary.json", "the report summary")
    if summary.get("schema") != SCHEMA_ID or summary.get("schema_version") != SCHEMA_VERSION:
        raise ReportError(
            f"{out / 'summary.json'}: schema {summary.get('schema')!r} version {summary.get('schema_version')!r}; "
            f"this tpusim renders {SCHEMA_ID!r} version {SCHEMA_VERSION}"
        )
    problem = first_problem(summary, SUMMARY_SCHEMA)
    if problem:
        raise ReportError(f"{out / 'summary.json'}: {problem} (`tpusim report --schema` prints the schema)")
    trace_path = out / "trace.json"
    trace = load_trace(trace_path) if trace_path.exists() else None
    try:
        return _render(out, summary, trace, dpi)
    except (KeyError, TypeError, ValueError) as e:
        raise ReportError(f"{out / 'summary.json'}: cannot render it ({type(e).__name__}: {e})") from None
