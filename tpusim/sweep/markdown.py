"""``sweep.md``: what was varied, the best point, the table with units, failures, and the plots."""

from __future__ import annotations

from typing import Any

from tpusim.report import fmt
from tpusim.sweep.spec import SweepSpec

__all__ = ["MAX_ROWS", "render_sweep"]

MAX_ROWS = 200
"""Rows shown in sweep.md (results.csv has all of them)."""

_SHOWN = (
    ("seconds", "time", fmt.seconds), ("cycles", "cycles", lambda v: f"{v:,}"),
    ("flops_per_s", "compute", fmt.flop_rate), ("flops_fraction_of_peak", "of peak", fmt.percent),
    ("hbm_bytes_per_s", "HBM bandwidth", fmt.rate), ("hbm_bandwidth_fraction", "of peak", fmt.percent),
    ("mxu_busy_fraction", "MXU busy", fmt.percent), ("peak_vmem_bytes", "peak VMEM", fmt.bytes_),
    ("fallbacks", "fallbacks", str),
)  # fmt: skip


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render_sweep(
    spec: SweepSpec, rows: list[dict[str, Any]], best: dict[str, dict[str, Any]], plots: dict[str, str]
) -> str:
    """The sweep's page (``plots`` maps a plot's name to its path relative to the page)."""
    params = [p for p in spec.parameters if p != "program"]
    multi = "program" in spec.parameters
    ok = sum(r["status"] == "ok" for r in rows)
    metric, maximise = spec.objective
    lines = [f"# Sweep {spec.name}", ""]
    if spec.description:
        lines += [spec.description.strip(), ""]
    lines += [
        f"{len(spec.points)} points ({ok} ok, {len(rows) - ok} failed"
        + (f", {len(spec.points) - len(rows)} not run yet" if len(rows) < len(spec.points) else "")
        + f"); varied: {', '.join(spec.parameters) or 'nothing'}; programs: "
        + ", ".join(f"`{n}` ({p.name})" for n, p in spec.programs.items())
        + ".",
        "",
    ]
    for program, b in best.items():
        setting = ", ".join(f"{k} = {_value(b[k])}" for k in params)
        shown = fmt.seconds(b["seconds"]) if metric == "seconds" else _value(b.get(metric))
        lines += [
            f"**Best point{f' for `{program}`' if multi else ''}** ({'highest' if maximise else 'lowest'} "
            f"`{metric}`): #{b['index']}, {setting or 'the base'}: `{metric}` = {shown} ({b['cycles']:,} cycles).",
            "",
        ]
    header = ["#", *(["program"] if multi else []), *params, "status", *[h for _, h, _ in _SHOWN]]
    lines += ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for r in rows[:MAX_ROWS]:
        cells = [str(r["index"]), *([r["program"]] if multi else []), *[_value(r.get(p)) for p in params], r["status"]]
        cells += ["" if r.get(k) is None else f(r[k]) for k, _, f in _SHOWN]
        lines.append("| " + " | ".join(cells) + " |")
    if len(rows) > MAX_ROWS:
        lines += ["", f"{len(rows) - MAX_ROWS} more rows are in results.csv."]
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines += ["", "## Failed points", ""] + [f"- #{r['index']}: {r['error']}" for r in failed]
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{name}]({path})" for name, path in plots.items()]
    lines += ["", "Files: `results.csv` and `results.jsonl` (one row per point, in spec order), `journal.jsonl` "
              "(rows as they finished), `spec.yaml` (the spec that ran).", ""]  # fmt: skip
    return "\n".join(lines)
