"""Sweep figures: each metric against each varied parameter, and the Pareto front of the objective against a cost."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from tpusim.report.plots import fit_title, place_labels, renderer

__all__ = ["LABELS", "label", "metric_figure", "pareto_figure", "pareto_front", "scaled", "setting"]

LABELS = {
    "cycles": "time (cycles)", "seconds": "time (us)", "instructions": "instructions executed",
    "flops": "work (GFLOP)", "flops_per_s": "achieved compute (TFLOP/s)",
    "flops_fraction_of_peak": "compute, share of peak (%)", "hbm_bytes": "HBM traffic (MiB)",
    "hbm_bytes_per_s": "HBM bandwidth used (GB/s)", "hbm_bandwidth_fraction": "HBM bandwidth, share of peak (%)",
    "mxu_busy_fraction": "MXU busy (%)", "vpu_busy_fraction": "VPU busy (%)", "dma_busy_fraction": "DMA queue busy (%)",
    "peak_hbm_bytes": "peak HBM in use (MiB)", "peak_vmem_bytes": "peak VMEM in use (MiB)",
    "fallbacks": "fallback instructions", "relayouts": "relayout copies", "mxu_macs": "MXU multiply-add cells per chip",
    "hbm_bandwidth_bytes_per_s": "HBM bandwidth (GB/s)", "vmem_bytes": "VMEM per core (MiB)",
    "peak_flops_per_s": "peak compute (TFLOP/s)", "hbm.bandwidth_bytes_per_s": "HBM bandwidth (GB/s)",
    "vmem.bytes": "VMEM per core (MiB)", "clock_hz": "clock (GHz)",
}  # fmt: skip
"""Axis labels with units; values are scaled to them by :func:`scaled`."""

_SCALE = {
    "seconds": 1e6, "flops": 1e-9, "flops_per_s": 1e-12, "flops_fraction_of_peak": 100, "hbm_bytes": 2**-20,
    "hbm_bytes_per_s": 1e-9, "hbm_bandwidth_fraction": 100, "mxu_busy_fraction": 100, "vpu_busy_fraction": 100,
    "dma_busy_fraction": 100, "peak_hbm_bytes": 2**-20, "peak_vmem_bytes": 2**-20,
    "hbm_bandwidth_bytes_per_s": 1e-9, "vmem_bytes": 2**-20, "peak_flops_per_s": 1e-12,
    "hbm.bandwidth_bytes_per_s": 1e-9, "vmem.bytes": 2**-20, "clock_hz": 1e-9,
}  # fmt: skip


def label(column: str) -> str:
    """An axis label with its unit (the column name itself for parameters without a known unit)."""
    return LABELS.get(column, column)


def scaled(column: str, value: Any) -> Any:
    """A value in the unit of :func:`label`."""
    return value * _SCALE[column] if column in _SCALE and isinstance(value, (int, float)) else value


def _number(x: float) -> str:
    """A number as a person writes it: ``409.5``, ``128``, ``0.25``, ``1,229``."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _bytes(n: float) -> str:
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= scale:
            return f"{_number(n / scale)} {unit}"
    return f"{_number(n)} B"


_SUFFIXES = (("bytes_per_s", 1e-9, "GB/s"), ("_hz", 1e-9, "GHz"), ("_ns", 1.0, "ns"), ("_cycles", 1.0, "cycles"))
"""Units of config keys without a label, read from the end of their name."""


def setting(column: str, value: Any) -> str:
    """A parameter's setting for a legend, in engineering units: ``HBM bandwidth = 409.5 GB/s`` for
    ``hbm.bandwidth_bytes_per_s=409500000000.0``, ``hbm.latency_ns = 350 ns``, ``mxu.rows = 128``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{label(column)} = {value}"
    if column in LABELS and LABELS[column].endswith(")"):
        name, _, unit = LABELS[column][:-1].rpartition(" (")
        number = _number(scaled(column, value))
        return f"{name} = {number}%" if unit == "%" else f"{name} = {number} {unit}"
    for suffix, scale, unit in _SUFFIXES:
        if column.endswith(suffix):
            return f"{column} = {_number(value * scale)} {unit}"
    if column.endswith("bytes"):
        return f"{column} = {_bytes(value)}"
    return f"{column} = {_number(value)}"


def _order(values: Sequence[Any]) -> tuple[tuple[int, Any], ...]:
    """A sort key that orders numbers by value and anything else by its text."""
    return tuple((0, v) if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, str(v)) for v in values)


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def metric_figure(rows: Sequence[dict[str, Any]], metric: str, axes_names: Sequence[Sequence[str]]) -> Figure:
    """``metric`` against each axis of the sweep (a zip group is one axis, drawn against its first parameter);
    one line per setting of the other axes."""
    ok = [r for r in rows if r["status"] == "ok" and r.get(metric) is not None]
    groups = [list(a) for a in axes_names] or [["index"]]
    fig = Figure(figsize=(5.0 * len(groups), 4.2), layout="constrained")
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    for ax, group in zip(axes, groups):
        p = group[0]
        xs_all = sorted({r[p] for r in ok}, key=lambda v: _order([v]))
        numeric = _numeric(xs_all)
        others = [q for g in groups if g is not group for q in g]
        series: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
        for r in ok:
            series[tuple(r[q] for q in others)].append(r)
        for key, members in sorted(series.items(), key=lambda kv: _order(kv[0])):
            members.sort(key=lambda r: xs_all.index(r[p]))
            xs = [scaled(p, r[p]) if numeric else xs_all.index(r[p]) for r in members]
            ys = [scaled(metric, r[metric]) for r in members]
            name = ", ".join(setting(q, v) for q, v in zip(others, key)) or None
            ax.plot(xs, ys, marker="o", label=name)
        if not numeric:
            ax.set_xticks(range(len(xs_all)), [str(v) for v in xs_all], rotation=20)
        ax.set_xlabel(label(p) + (f" (with {', '.join(group[1:])})" if len(group) > 1 else ""))
        ax.set_ylabel(label(metric))
        if others and len(series) > 1:
            ax.legend(fontsize="x-small")
    fit_title(fig, fig.suptitle(f"{label(metric)} against each parameter ({len(ok)} points)"))
    return fig


def pareto_front(rows: Sequence[dict[str, Any]], cost: str, objective: str, maximise: bool) -> list[dict[str, Any]]:
    """The points no other point beats on both: lower (or equal) cost and a better (or equal) objective."""
    ok = [r for r in rows if r["status"] == "ok" and r.get(cost) is not None and r.get(objective) is not None]
    sign = -1.0 if maximise else 1.0
    front: list[dict[str, Any]] = []
    best = float("inf")
    for r in sorted(ok, key=lambda r: (r[cost], sign * r[objective], r["index"])):
        if sign * r[objective] < best:
            front.append(r)
            best = sign * r[objective]
    return front


def pareto_figure(rows: Sequence[dict[str, Any]], cost: str, objective: str, maximise: bool,
                  best: dict[str, dict[str, Any]]) -> Figure:  # fmt: skip
    """Every point by cost and objective, each program's Pareto front as a step line, its best point starred."""
    fig = Figure(figsize=(7, 5), layout="constrained")
    ax = fig.add_subplot()
    programs = sorted({r["program"] for r in rows})
    numbers: list[tuple[tuple[float, float], str]] = []  # the front's points, labelled with their number
    for k, program in enumerate(programs):
        mine = [r for r in rows if r["program"] == program]
        ok = [r for r in mine if r["status"] == "ok" and r.get(cost) is not None and r.get(objective) is not None]
        tag = f"{program}: " if len(programs) > 1 else ""
        colour = f"C{k % 10}"
        ax.scatter([scaled(cost, r[cost]) for r in ok], [scaled(objective, r[objective]) for r in ok], color=colour,
                   alpha=0.35, label=f"{tag}points")  # fmt: skip
        front = pareto_front(mine, cost, objective, maximise)
        if front:
            fx, fy = [scaled(cost, r[cost]) for r in front], [scaled(objective, r[objective]) for r in front]
            ax.step(fx, fy, where="post", color=colour, marker="o", label=f"{tag}Pareto front")
            numbers += [((x, y), f"#{r['index']}") for r, x, y in zip(front, fx, fy)]
        b = best.get(program)
        if b is not None:
            ax.scatter([scaled(cost, b[cost])], [scaled(objective, b[objective])], marker="*", s=250, color=colour,
                       edgecolors="black", zorder=3, label=f"{tag}best: point {b['index']}")  # fmt: skip
    ax.set_xlabel(label(cost))
    ax.set_ylabel(label(objective))
    fit_title(fig, ax.set_title(f"{label(objective)} against {label(cost)}"))
    legend = ax.legend(fontsize="small")
    place_labels(ax, numbers, [legend.get_window_extent(renderer(fig))])
    return fig
