"""A picture of ``trace.json`` as a trace viewer lays it out: a row per track, labelled slices, flow arrows
and counter tracks, drawn with matplotlib from the JSON alone.

For where no trace viewer runs (a headless machine, a document): it draws what Perfetto or chrome://tracing
would show for the same file, but it is not either of them.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from typing import Any

from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

__all__ = ["trace_view_figure"]


def _colour(name: str) -> Any:
    """A stable colour per slice name, as trace viewers colour slices by name."""
    return colormaps["tab20"](zlib.crc32(name.encode()) % 20)


_INF = float("inf")
_PIXELS = 2000
"""Horizontal resolution the slices are drawn at (about what the figure's width holds at its dpi)."""
_MAX_ARROWS = 500
"""Flow arrows drawn at most (every n-th beyond that)."""


def trace_view_figure(doc: dict[str, Any], start: float | None = None, end: float | None = None,
                      title: str = "") -> Figure:  # fmt: skip
    """Draw the tracks of a Chrome trace between ``start`` and ``end`` (trace time units, microseconds;
    default: all of it)."""
    events = doc["traceEvents"]
    names: dict[tuple[int, int], str] = {}
    procs: dict[int, str] = {}
    slices: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    counters: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    flows: dict[Any, dict[str, dict[str, Any]]] = defaultdict(dict)
    for ev in events:
        ph = ev.get("ph")
        if ph == "M" and ev["name"] == "thread_name":
            names[(ev["pid"], ev["tid"])] = ev["args"]["name"]
        elif ph == "M" and ev["name"] == "process_name":
            procs[ev["pid"]] = ev["args"]["name"]
        elif ph == "X":
            slices[(ev["pid"], ev["tid"])].append(ev)
        elif ph == "C":
            for series, v in ev["args"].items():
                counters[(ev["pid"], f"{ev['name']} ({series})")].append((ev["ts"], v))
        elif ph in ("s", "f"):
            flows[ev["id"]][ph] = ev
    t0 = start if start is not None else 0.0
    t1 = end if end is not None else max((e["ts"] + e["dur"] for v in slices.values() for e in v), default=1.0)
    tracks = sorted(slices)
    crows = sorted(counters)
    rows = len(tracks) + 2 * len(crows)
    fig = Figure(figsize=(16, 1.0 + 0.34 * rows), layout="constrained")
    ax = fig.add_subplot()
    row_of = {k: i for i, k in enumerate(tracks)}
    span = t1 - t0
    # a label's width in trace time: about 0.05 inch a character at 6 points, on an axis about 15 inches wide
    per_char = 0.05 * span / 15
    pixel = span / _PIXELS
    for key, evs in slices.items():
        y = row_of[key]
        free_from = -_INF  # where the row's last label ends (labels of adjacent long slices must not collide)
        bars: list[tuple[float, float]] = []
        colours: list[Any] = []
        for e in sorted(evs, key=lambda e: e["ts"]):
            s, d = max(e["ts"], t0), min(e["ts"] + e["dur"], t1) - max(e["ts"], t0)
            if d <= 0 and not (t0 <= e["ts"] <= t1):
                continue
            # slices narrower than a pixel that touch the bar before (also narrow) join it, as trace viewers
            # merge what the screen cannot separate: a long run draws in seconds, not one patch per slice
            if d < pixel and bars and bars[-1][1] < 2 * pixel and s <= bars[-1][0] + bars[-1][1] + pixel:
                bars[-1] = (bars[-1][0], max(bars[-1][1], s + max(d, pixel) - bars[-1][0]))
                continue
            bars.append((s, max(d, pixel)))
            colours.append(_colour(e["name"]))
            half = len(e["name"]) * per_char / 2
            if d > span / 25 and s + d / 2 - half > free_from:
                ax.text(s + d / 2, y, e["name"], ha="center", va="center", fontsize=6, clip_on=True)
                free_from = s + d / 2 + half
        if bars:
            ax.broken_barh(bars, (y - 0.38, 0.76), facecolors=colours, edgecolor="white", linewidth=0.3)
    arrows = [
        (a, b)
        for ends in flows.values()
        if (a := ends.get("s")) is not None and (b := ends.get("f")) is not None
        and t0 <= a["ts"] <= t1 and t0 <= b["ts"] <= t1
        and (a["pid"], a["tid"]) in row_of and (b["pid"], b["tid"]) in row_of
    ]  # fmt: skip
    step = max(1, -(-len(arrows) // _MAX_ARROWS))  # (more arrows than that are a black smear: every step-th)
    for a, b in arrows[::step]:
        ya, yb = row_of[(a["pid"], a["tid"])], row_of[(b["pid"], b["tid"])]
        arrow = FancyArrowPatch((a["ts"], ya), (b["ts"], yb), arrowstyle="-|>", mutation_scale=7, color="black",
                                linewidth=0.6, connectionstyle="arc3,rad=-0.15")  # fmt: skip
        arrow.set_in_layout(False)  # (inside the axes: the layout need not measure each one)
        ax.add_patch(arrow)
    if step > 1:
        title = f"{title} ({len(arrows[::step]):,} of {len(arrows):,} flow arrows drawn)" if title else title
    labels = [names.get(k, str(k)) for k in tracks]
    for i, ckey in enumerate(crows):
        base = len(tracks) + 2 * i + 1.4
        pts = sorted(counters[ckey])
        peak = max((v for _, v in pts), default=0) or 1
        xs = [max(min(t, t1), t0) for t, _ in pts] + [t1]
        ys = [v for _, v in pts] + [pts[-1][1]]
        ax.fill_between(xs, [base + 0.45] * len(xs), [base + 0.45 - 1.5 * v / peak for v in ys], step="post",
                        color="tab:gray", alpha=0.6)  # fmt: skip
        labels.append(f"{ckey[1]}, peak {peak:,.0f}")
    ax.set_yticks(list(range(len(tracks))) + [len(tracks) + 2 * i + 1 for i in range(len(crows))], labels,
                  fontsize=7)  # fmt: skip
    ax.set_ylim(rows, -1)
    ax.set_xlim(t0, t1)
    ax.set_xlabel("time (us)" if "time_axis" not in doc.get("otherData", {}) else "time (us = cycles)")
    proc = "; ".join(procs.values())
    ax.set_title(title or proc, fontsize=9)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig
