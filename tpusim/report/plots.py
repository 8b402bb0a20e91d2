"""A report's figures (matplotlib, not attached to pyplot): a timeline by unit, utilisation over time, a
roofline of the HLO instructions and memory occupancy over time.

Each function takes the ``summary.json`` document (and, for the timeline, the slices of ``trace.json``) and
returns a :class:`~matplotlib.figure.Figure`, so a report re-renders from its JSON alone.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from tpusim.report import fmt

__all__ = ["memory_figure", "roofline_figure", "timeline_figure", "utilisation_figure"]

_BOUND_COLOURS = {"compute": "tab:green", "memory": "tab:blue", "latency": "tab:orange", "fallback": "tab:red"}
_TOP_OPS = 12  # HLO instructions with their own colour in the timeline (by critical-path cycles); others grey


def _title(summary: dict[str, Any], what: str) -> str:
    t = summary["totals"]
    return f"{what}: {summary['program']['name']} on {summary['config']['name']} ({fmt.cycles(t['cycles'])})"


def renderer(fig: Figure) -> RendererAgg:
    """An Agg renderer of ``fig`` with its layout done, to measure text as it will be drawn."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    return canvas.get_renderer()


def fit_title(fig: Figure, title: Text, margin: float = 8.0) -> None:
    """Wrap ``title`` at spaces until it lies inside ``fig`` (less ``margin`` pixels on each side) where it is
    centred (an axes title is centred on its axes, not on the figure)."""
    lines = title.get_text().splitlines()
    r = renderer(fig)
    box = title.get_window_extent(r)
    centre = (box.x0 + box.x1) / 2
    room = 2 * min(centre - margin, fig.bbox.width - margin - centre)
    chars = max(map(len, lines), default=0)
    while title.get_window_extent(r).width > room:
        chars = min(chars - 1, int(chars * room / title.get_window_extent(r).width))
        if chars < 10:
            break  # (a figure too narrow for any title)
        title.set_text("\n".join(part for line in lines for part in textwrap.wrap(line, chars) or [""]))
        r = renderer(fig)


_LABEL_OFFSETS = [(dx * k, dy * k) for k in (1, 2, 3, 5) for dx, dy in
                  ((5, 5), (5, -5), (-5, 5), (-5, -5), (0, 8), (0, -8), (8, 0), (-8, 0))]  # fmt: skip
"""Candidate offsets (points) of a point's label from the point, nearest first."""


def place_labels(ax: Axes, labels: list[tuple[tuple[float, float], str]], avoid: list[Bbox]) -> list[str]:
    """Label points of ``ax`` so that no label overlaps another, ``avoid`` (e.g. the legend's box) or leaves
    the axes: each label takes the first free spot of :data:`_LABEL_OFFSETS` (with a leader line when it
    sits away from its point). Returns the texts for which no spot was free (not drawn)."""
    fig = ax.get_figure()
    assert isinstance(fig, Figure)
    r = renderer(fig)
    inside = ax.get_window_extent(r).padded(-2)
    taken = list(avoid)
    left_out: list[str] = []
    for xy, text in labels:
        for dx, dy in _LABEL_OFFSETS:
            ha = "left" if dx > 0 else "right" if dx < 0 else "center"
            va = "bottom" if dy > 0 else "top" if dy < 0 else "center"
            leader = {"arrowstyle": "-", "color": "grey", "linewidth": 0.5} if abs(dx) + abs(dy) > 16 else None
            ann = ax.annotate(text, xy, xytext=(dx, dy), textcoords="offset points", fontsize="x-small", ha=ha,
                              va=va, arrowprops=leader)  # fmt: skip
            ann.set_in_layout(False)
            box = ann.get_window_extent(r)
            if (
                inside.x0 <= box.x0
                and box.x1 <= inside.x1
                and inside.y0 <= box.y0
                and box.y1 <= inside.y1
                and not any(box.overlaps(b) for b in taken)
            ):
                taken.append(box.padded(1))
                break
            ann.remove()
        else:
            left_out.append(text)
    return left_out


def timeline_figure(summary: dict[str, Any], trace: dict[str, Any]) -> Figure:
    """Every instruction as a bar on its unit's track (the tracks of ``trace.json``), coloured by HLO instruction."""
    names: dict[tuple[int, int], str] = {}
    bars: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    for ev in trace["traceEvents"]:
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[(ev["pid"], ev["tid"])] = ev["args"]["name"]
        elif ev.get("ph") == "X":  # in cycles, which every slice carries in its args
            s, e = ev["args"]["start_cycle"], ev["args"]["end_cycle"]
            bars[(ev["pid"], ev["tid"])].append((s, e - s, ev["name"]))
    top = [op["name"] for op in summary["ops"][:_TOP_OPS]]
    cmap = colormaps["tab20"]
    palette = {name: cmap((2 * i + i // 10) % 20) for i, name in enumerate(top)}  # strong hues first
    tracks = sorted(bars, key=lambda k: k)
    fig = Figure(figsize=(12, 1.2 + 0.32 * max(len(tracks), 1)), layout="constrained")
    ax = fig.add_subplot()
    for row, key in enumerate(tracks):
        by_colour: dict[Any, list[tuple[float, float]]] = defaultdict(list)
        for ts, dur, name in bars[key]:
            by_colour[palette.get(name, "lightgrey")].append((ts, max(dur, 0.5)))
        for colour, spans in by_colour.items():
            ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colour, linewidth=0)
    multi_chip = len({k[0] for k in tracks}) > 1
    ax.set_yticks(range(len(tracks)), [(f"chip{k[0] - 1}." if multi_chip else "") + names.get(k, "?") for k in tracks])
    ax.invert_yaxis()
    ax.set_xlim(0, max(summary["totals"]["cycles"], 1))
    ax.set_xlabel("time (cycles)")
    fit_title(fig, ax.set_title(_title(summary, "Timeline by unit")))
    handles = [Patch(color=palette[n], label=n) for n in top] + [Patch(color="lightgrey", label="other")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", title="HLO instruction")
    return fig


def utilisation_figure(summary: dict[str, Any]) -> Figure:
    """Busy fraction of every unit that did work, and HBM bandwidth used, per time bin (a heat strip per row)."""
    series = summary["series"]
    edges = np.asarray(series["edges_cycles"], float)
    used = {u["name"] for u in summary["units"] if u["busy_cycles"] > 0 and u["kind"] not in ("sync", "hbm")}
    rows = [(name, np.asarray(v)) for name, v in series["utilisation"].items() if name in used]
    rows += [(f"{name} bandwidth", np.asarray(v)) for name, v in series["hbm_bandwidth_fraction"].items()]
    fig = Figure(figsize=(12, 1.4 + 0.3 * max(len(rows), 1)), layout="constrained")
    ax = fig.add_subplot()
    if rows:
        grid = np.vstack([v for _, v in rows])
        mesh = ax.pcolormesh(edges, np.arange(len(rows) + 1) - 0.5, grid, vmin=0.0, vmax=1.0, cmap="viridis")
        fig.colorbar(mesh, ax=ax, label="busy fraction (bandwidth: share of peak)", pad=0.01)
        ax.set_yticks(range(len(rows)), [n for n, _ in rows])
        ax.invert_yaxis()
    ax.set_xlabel("time (cycles)")
    fit_title(fig, ax.set_title(_title(summary, "Utilisation over time")))
    return fig


def roofline_figure(summary: dict[str, Any]) -> Figure:
    """One point per HLO instruction: achieved FLOP/s against arithmetic intensity (FLOPs per HBM byte), under
    the roof ``min(peak FLOP/s, intensity x peak HBM bandwidth)`` of the config."""
    t, cfg = summary["totals"], summary["config"]
    peak_flops = t["peak_flops_per_s"]
    peak_bw = summary["peaks"]["hbm_bytes_per_s_per_chip"] * cfg["chips"]
    pts = [o for o in summary["ops"] if o["flops"] > 0 and o["hbm_bytes"] > 0 and o["span_cycles"] > 0]
    left_out = len(summary["ops"]) - len(pts)
    fig = Figure(figsize=(8, 6), layout="constrained")
    ax = fig.add_subplot()
    ridge = peak_flops / peak_bw
    ai = np.asarray([o["arithmetic_intensity"] for o in pts] + [ridge], float)
    lo, hi = max(ai.min() / 4, 1e-3), ai.max() * 4
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.plot(xs, np.minimum(peak_flops, xs * peak_bw) / 1e12, color="black", linewidth=1.5,
            label=f"roof: {fmt.flop_rate(peak_flops)}, {fmt.rate(peak_bw)}")  # fmt: skip
    ax.axvline(ridge, color="grey", linestyle=":", linewidth=1)
    total = max(t["cycles"], 1)
    for bound, colour in _BOUND_COLOURS.items():
        mine = [o for o in pts if o["bound"] == bound]
        if not mine:
            continue
        size = [20 + 400 * o["critical_path_cycles"] / total for o in mine]
        ax.scatter([o["arithmetic_intensity"] for o in mine], [o["flops_per_s"] / 1e12 for o in mine], s=size,
                   color=colour, alpha=0.7, edgecolors="black", linewidths=0.5, label=f"{bound} bound")  # fmt: skip
    labels: dict[tuple[float, float], list[str]] = defaultdict(list)  # ops at one point share a label
    for o in sorted(pts, key=lambda o: -o["critical_path_cycles"])[:8]:
        labels[(o["arithmetic_intensity"], o["flops_per_s"] / 1e12)].append(o["name"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
    ax.set_ylabel("achieved compute (TFLOP/s)")
    note = f"\n{left_out} HLO instructions without FLOPs or HBM bytes are not shown" if left_out else ""
    fit_title(fig, ax.set_title(_title(summary, "Roofline") + note, fontsize="medium"))
    legend = ax.legend(fontsize="small", loc="lower right")
    place_labels(ax, [(xy, ", ".join(g)) for xy, g in labels.items()], [legend.get_window_extent(renderer(fig))])
    return fig


def memory_figure(summary: dict[str, Any]) -> Figure:
    """Bytes holding live data over time: each chip's HBM and each core's VMEM (peak and capacity in the legend)."""
    occ = summary["series"]["occupancy"]
    caps = {m["name"]: m["capacity_bytes"] for m in summary["memories"]}
    groups = [[n for n in occ if n.endswith(".hbm")], [n for n in occ if n.endswith(".vmem")]]
    groups = [g for g in groups if g]
    fig = Figure(figsize=(12, 2.6 * max(len(groups), 1) + 0.6), layout="constrained")
    axes = fig.subplots(max(len(groups), 1), 1, sharex=True, squeeze=False)[:, 0]
    total = max(summary["totals"]["cycles"], 1)
    for ax, names in zip(axes, groups):
        for name in names:
            c = np.append(occ[name]["cycles"], total)
            b = np.append(occ[name]["bytes"], occ[name]["bytes"][-1])
            peak = max(occ[name]["bytes"])
            ax.step(c, np.asarray(b) / 2**20, where="post",
                    label=f"{name}: peak {fmt.bytes_(peak)} of {fmt.bytes_(caps.get(name))}")  # fmt: skip
        ax.set_ylabel("live data (MiB)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small", loc="upper right")
    axes[-1].set_xlabel("time (cycles)")
    axes[-1].set_xlim(0, total)
    fit_title(fig, axes[0].set_title(_title(summary, "Memory occupancy")))
    return fig
