"""Every figure tpusim draws, rendered with Agg: its text boxes (titles, tick and axis labels, legends, point
labels) lie inside the figure and do not overlap one another, and sweep legends read in engineering units."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

import tpusim
from tpusim.report import plots
from tpusim.report.trace_view import trace_view_figure
from tpusim.report.writer import write_report
from tpusim.sweep.plots import metric_figure, pareto_figure, setting

ROOT = Path(__file__).resolve().parent.parent
BLOCK = ROOT / "configs" / "sweeps" / "programs" / "transformer_block.hlo"


def text_problems(fig: Figure) -> list[str]:
    """Texts of ``fig`` that leave the figure or overlap another text (window extents from an Agg draw).
    Counted: visible texts with something to show; tick labels of ticks the axis draws (matplotlib keeps
    labels of ticks outside the view); clipped texts only where they meet their clip box."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    r = canvas.get_renderer()
    hidden: set[int] = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            drawn = {id(t) for tick in axis._update_ticks() for t in (tick.label1, tick.label2)}
            every = axis.get_major_ticks() + axis.get_minor_ticks()
            hidden |= {id(t) for tick in every for t in (tick.label1, tick.label2)} - drawn
    page = fig.bbox.padded(0.5)
    boxes = []
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip() or id(t) in hidden:
            continue
        box, clip = t.get_window_extent(r), t.get_clip_box() if t.get_clip_on() else None
        if clip is not None and not box.overlaps(clip):
            continue
        boxes.append((t.get_text(), box))
    problems = [f"{text!r} leaves the figure ({b} not in {page})" for text, b in boxes
                if not (page.x0 <= b.x0 and b.x1 <= page.x1 and page.y0 <= b.y0 and b.y1 <= page.y1)]  # fmt: skip
    for (ta, a), (tb, b) in itertools.combinations(boxes, 2):
        if a.padded(-0.5).overlaps(b.padded(-0.5)):
            problems.append(f"{ta!r} overlaps {tb!r}")
    return problems


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    result = tpusim.simulate(BLOCK.read_text(), config="tpu_v5e", timing_only=True)
    out = tmp_path_factory.mktemp("block")
    write_report(result, out, program_path=str(BLOCK), wall_seconds=0.1)
    return {"summary": json.loads((out / "summary.json").read_text()),
            "trace": json.loads((out / "trace.json").read_text())}  # fmt: skip


@pytest.mark.parametrize("name", ["timeline", "utilisation", "roofline", "memory"])
def test_report_plots_have_no_colliding_text(report: dict[str, Any], name: str) -> None:
    s = report["summary"]
    fig = plots.timeline_figure(s, report["trace"]) if name == "timeline" else getattr(plots, f"{name}_figure")(s)
    assert text_problems(fig) == []


def test_roofline_labels_its_costliest_points_and_title_fits(report: dict[str, Any]) -> None:
    s = json.loads(json.dumps(report["summary"]))
    s["program"]["name"] = "a_program_name_long_enough_to_run_off_the_edge_of_an_eight_inch_figure_" * 2
    fig = plots.roofline_figure(s)
    assert text_problems(fig) == []
    ax = fig.axes[0]
    assert "\n" in ax.get_title() and "not shown" in ax.get_title()
    labelled = " ".join(t.get_text() for t in ax.texts)
    pts = [o for o in s["ops"] if o["flops"] > 0 and o["hbm_bytes"] > 0 and o["span_cycles"] > 0]
    assert all(o["name"] in labelled for o in sorted(pts, key=lambda o: -o["critical_path_cycles"])[:8])


def test_trace_view_has_no_colliding_text(report: dict[str, Any]) -> None:
    fig = trace_view_figure(report["trace"], title="trace.json drawn by tpusim's trace view")
    assert text_problems(fig) == []


def test_trace_view_of_a_long_run_merges_what_a_pixel_cannot_separate() -> None:
    """A 3,000-iteration loop's trace took 43 s to draw (a patch per slice, an arrow per flow; a campaign of bad
    inputs): slices narrower than a pixel that touch merge into one bar, and at most 500 flow arrows are drawn."""
    events: list[dict[str, Any]] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "u"}}]
    for i in range(100_000):  # back-to-back slices of 1 us over 100,000 us: 50 per pixel
        events.append({"ph": "X", "name": f"op{i % 7}", "pid": 1, "tid": 1, "ts": i, "dur": 1})
    for i in range(0, 100_000, 20):
        flow = {"id": i, "pid": 1, "tid": 1, "name": "f", "cat": "c"}
        events += [{**flow, "ph": "s", "ts": i}, {**flow, "ph": "f", "ts": i + 10, "bp": "e"}]
    fig = trace_view_figure({"traceEvents": events})
    ax = fig.axes[0]
    bars = sum(len(c.get_paths()) for c in ax.collections)
    assert 1 <= bars <= 2000, bars
    assert len(ax.patches) <= 500
    assert "500 of 5,000 flow arrows drawn" in trace_view_figure({"traceEvents": events}, title="t").axes[0].get_title()


def _sweep_rows() -> list[dict[str, Any]]:
    rows = []
    for n, (bw, rows_) in enumerate(itertools.product([409.5e9, 819e9, 1638e9], [64, 128, 256])):
        cycles = 60_000 * 128 / rows_ + 2e13 / bw
        rows.append({"index": n, "program": "transformer_block", "status": "ok", "hbm.bandwidth_bytes_per_s": bw,
                     "mxu.rows": rows_, "cycles": cycles, "seconds": cycles / 1.5e9,
                     "hbm_bandwidth_bytes_per_s": bw})  # fmt: skip
    return rows


def test_sweep_plots_have_no_colliding_text_and_legends_in_units() -> None:
    rows = _sweep_rows()
    fig = metric_figure(rows, "seconds", [["hbm.bandwidth_bytes_per_s"], ["mxu.rows"]])
    assert text_problems(fig) == []
    legends = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert "HBM bandwidth = 409.5 GB/s" in legends and "mxu.rows = 128" in legends
    assert not any("e+" in t or "409500000000" in t for t in legends)
    best = {"transformer_block": min(rows, key=lambda r: r["seconds"])}
    fig = pareto_figure(rows, "hbm_bandwidth_bytes_per_s", "seconds", False, best)
    assert text_problems(fig) == []


@pytest.mark.parametrize(
    ("column", "value", "text"),
    [
        ("hbm.bandwidth_bytes_per_s", 409500000000.0, "HBM bandwidth = 409.5 GB/s"),
        ("vmem.bytes", 128 * 2**20, "VMEM per core = 128 MiB"),
        ("clock_hz", 1.5e9, "clock = 1.5 GHz"),
        ("ici.link_bandwidth_bytes_per_s", 4.5e10, "ici.link_bandwidth_bytes_per_s = 45 GB/s"),
        ("hbm.latency_ns", 350, "hbm.latency_ns = 350 ns"),
        ("dma.setup_cycles", 64, "dma.setup_cycles = 64 cycles"),
        ("smem.bytes", 16384, "smem.bytes = 16 KiB"),
        ("mxu.rows", 128, "mxu.rows = 128"),
        ("vmem_fraction", 0.25, "vmem_fraction = 0.25"),
        ("tiling", "bf16_16x128", "tiling = bf16_16x128"),
        ("fuse", True, "fuse = True"),
    ],
)
def test_settings_read_in_engineering_units(column: str, value: Any, text: str) -> None:
    assert setting(column, value) == text
