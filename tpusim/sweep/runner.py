"""Running a sweep: every point not yet in the folder's journal, on an executor, then tables, plots and a page.

Output folder (default ``reports/sweeps/<name>/``): ``spec.yaml`` (a copy), ``journal.jsonl``, ``results.csv``,
``results.jsonl``, ``plots/<metric>.png``, ``plots/pareto.png`` and ``sweep.md`` naming the best point.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpusim.errors import TpusimError
from tpusim.report.progress import Progress
from tpusim.sweep.executors import EXECUTORS
from tpusim.sweep.point import payload
from tpusim.sweep.spec import COST_COLUMNS, METRIC_COLUMNS, SweepError, SweepSpec
from tpusim.sweep.store import Journal, write_tables
from tpusim.yamlio import load_yaml

__all__ = ["SweepInterrupted", "SweepResult", "best_points", "columns", "default_sweep_dir", "run_sweep"]


class SweepInterrupted(SweepError):
    """The sweep was stopped (Ctrl-C or SIGTERM); its finished rows are kept and a new run resumes it."""

    exit_code = 130  # the shell's 128 + SIGINT, as for an interrupted ``tpusim run`` (see cli.main)


@dataclass(frozen=True)
class SweepResult:
    """What a sweep produced.

    Attributes:
        rows: one row per point that has a result, in spec order.
        best: per program, its best successful row by the spec's objective (programs whose points all failed
            are missing); points of different programs are never compared.
        ran: points run this time (the others were already in the journal).
        files: the files written.
    """

    rows: list[dict[str, Any]]
    best: dict[str, dict[str, Any]]
    ran: int
    files: list[Path]


def default_sweep_dir(spec: SweepSpec) -> Path:
    return Path("reports") / "sweeps" / spec.name


def columns(spec: SweepSpec) -> list[str]:
    """The results table's columns: index, id, program, parameters, status, metrics, costs, error."""
    params = [p for p in spec.parameters if p != "program"]
    return ["index", "id", "program", *params, "status", *METRIC_COLUMNS, *COST_COLUMNS, "error"]


def best_points(spec: SweepSpec, rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per program, the successful row with the best objective (ties: the earlier point)."""
    metric, maximise = spec.objective
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["status"] != "ok" or not isinstance(r.get(metric), (int, float)):
            continue
        b = best.get(r["program"])
        key = ((-1 if maximise else 1) * r[metric], r["index"])
        if b is None or key < ((-1 if maximise else 1) * b[metric], b["index"]):
            best[r["program"]] = r
    return best


def _check_same_sweep(spec: SweepSpec, folder: Path) -> None:
    """A folder holding another sweep (its saved spec names another sweep, or, unnamed, varies none of this
    sweep's parameters) is not resumed by this one: its spec and tables would be replaced by this sweep's. An
    edited spec of the same sweep (axes added or removed) still resumes."""
    saved = folder / "spec.yaml"
    if not saved.is_file():
        return
    try:
        doc = load_yaml(saved)
    except TpusimError:
        return  # (a damaged copy: the journal decides, as before)
    if not isinstance(doc, dict):
        return
    name = doc.get("name")
    zipped = doc.get("zip")
    groups: list[Any] = [doc.get("grid"), *(zipped if isinstance(zipped, list) else [zipped])]
    varied = {str(k) for group in groups if isinstance(group, dict) for k in group}
    other = str(name) != spec.name if name is not None else bool(varied) and not varied & set(spec.parameters)
    if other:
        what = f"sweep {str(name)!r}" if name is not None else f"a sweep of {', '.join(sorted(varied))}"
        raise SweepError(f"{folder}: the folder holds {what} (its spec.yaml), not {spec.name!r}; give another --out, "
                         "or run that sweep's spec to resume it")  # fmt: skip


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _finish(
    spec: SweepSpec, out: Path, journal: Journal, dpi: int, with_plots: bool = True
) -> tuple[list[dict[str, Any]], Any, list[Path]]:
    from tpusim.sweep.markdown import render_sweep

    rows = [journal.rows[p.id] for p in spec.points if p.id in journal.rows]
    files = list(write_tables(out, rows, columns(spec)))
    best = best_points(spec, rows)
    plots_dir = out / "plots"
    plots: dict[str, str] = {}
    if with_plots and any(r["status"] == "ok" for r in rows):
        from tpusim.sweep.plots import metric_figure, pareto_figure

        plots_dir.mkdir(exist_ok=True)
        for metric in spec.metrics:
            path = plots_dir / f"{metric.replace('.', '_')}.png"
            metric_figure(rows, metric, spec.axes).savefig(path, dpi=dpi)
            plots[metric] = f"plots/{path.name}"
            files.append(path)
        metric, maximise = spec.objective
        path = plots_dir / "pareto.png"
        pareto_figure(rows, spec.cost, metric, maximise, best).savefig(path, dpi=dpi)
        plots["pareto"] = f"plots/{path.name}"
        files.append(path)
    md = out / "sweep.md"
    _write_text(md, render_sweep(spec, rows, best, plots))
    return rows, best, [*files, md]


def run_sweep(
    spec: SweepSpec,
    out: str | Path | None = None,
    *,
    workers: int = 1,
    executor: str = "local",
    scheduler: str | None = None,
    progress: bool | None = None,
    retry_failed: bool = False,
    dpi: int = 100,
    plots: bool = True,
) -> SweepResult:
    """Run every point of ``spec`` not already recorded in the output folder, then write the tables and plots.

    Args:
        spec: the sweep.
        out: the output folder (default ``reports/sweeps/<name>/``); a folder with a journal resumes.
        workers: local processes (``executor="local"``); 1 runs the points in this process.
        executor: ``local`` or ``dask``.
        scheduler: the Dask scheduler's address (``executor="dask"``).
        progress: show a progress line (default: when stderr is a terminal).
        retry_failed: run again the points recorded as failed.
        dpi: resolution of the plots.
        plots: render the plots (a few seconds; False writes the tables and ``sweep.md`` without them).

    Raises:
        SweepInterrupted: on Ctrl-C, after recording every finished row and writing the tables.
    """
    if executor not in EXECUTORS:
        raise SweepError(f"unknown executor {executor!r}; executors: {', '.join(EXECUTORS)}")
    folder = Path(out) if out is not None else default_sweep_dir(spec)
    if folder.is_dir() and any(folder.iterdir()) and not (folder / "journal.jsonl").exists():
        raise SweepError(f"{folder}: the folder holds files that are not a sweep's (no journal.jsonl); give a new or "
                         "empty folder, or a sweep's to resume it")  # fmt: skip
    _check_same_sweep(spec, folder)
    journal = Journal(folder)
    try:
        _write_text(folder / "spec.yaml", spec.text)
        done = {i for i, r in journal.rows.items() if r.get("status") == "ok" or not retry_failed}
        todo = [p for p in spec.points if p.id not in done]
        texts = {name: path.read_text() for name, path in spec.programs.items()}
        jobs = [payload(p, texts[p.program]) for p in todo]
        kept = len(spec.points) - len(todo)
        bar = Progress(len(jobs), "points", enabled=progress)
        if kept:
            bar.note = f"{kept} kept from an earlier run"

        def on_row(row: dict[str, Any]) -> None:
            journal.append(row)
            bar.advance(failed=row["status"] != "ok")

        try:
            EXECUTORS[executor](jobs, on_row, workers=workers, scheduler=scheduler)
        except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (see tpusim.cli.Terminated)
            bar.close()
            journal.reload()  # (the tables hold what the journal file holds)
            _finish(spec, folder, journal, dpi, plots)
            n = sum(p.id in journal.rows for p in spec.points)
            stopped = SweepInterrupted(
                f"interrupted: {n} of {len(spec.points)} points are recorded in {folder}; run the same command "
                "again to finish the rest"
            )
            stopped.exit_code = getattr(err, "exit_code", SweepInterrupted.exit_code)
            raise stopped from None
        bar.close()
        rows, best, files = _finish(spec, folder, journal, dpi, plots)
    finally:
        journal.close()
    return SweepResult(rows, best, len(jobs), files)
