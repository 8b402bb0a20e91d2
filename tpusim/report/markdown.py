"""``report.md``: the summary for a person, every number with its unit, the plots embedded."""

from __future__ import annotations

from typing import Any

from tpusim.report import fmt

__all__ = ["MAX_OP_ROWS", "render_markdown"]

MAX_OP_ROWS = 40
"""HLO instructions listed in report.md (all of them are in summary.json)."""

_BOUND_MEANING = (
    "**bound**: *compute* when the ideal compute time (its FLOPs at the peak of the units that ran them) is at "
    "least half its span, *memory* when the ideal HBM time (its HBM bytes at peak bandwidth) is, the larger "
    "of the two winning; *latency* when neither is (issue, DMA setup and memory latency dominate); "
    "*fallback* when it ran as a reference kernel with a declared cost."
)


_TOP_LINKS = 16


def _table(header: list[str], rows: list[list[str]], align: str) -> list[str]:
    marks = {"l": "---", "r": "---:"}
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(marks[a] for a in align) + " |"] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def _xla_section(x: dict[str, Any]) -> list[str]:
    """XLA:TPU's estimates beside tpusim's (the module was compiled by XLA:TPU)."""
    lines = ["## Beside XLA:TPU's estimates", "", f"XLA's numbers are {x['caveat']}.", ""]
    program = x.get("program")
    if program:
        lines += [
            f"Program: XLA's `optimal_seconds` {program['optimal_seconds'] * 1e6:,.2f} us, tpusim "
            f"{program['tpusim_seconds'] * 1e6:,.2f} us (tpusim / XLA = {program['ratio']:.2f}).",
            "",
        ]
    rows = [
        [f"`{k['name']}`", k["opcode"], f"{k['xla_cycles']:,}", fmt.percent(k["xla_share"]),
         fmt.cycles(k["tpusim_cycles"]), fmt.percent(k["tpusim_share"]),
         f"{k['ratio']:.2f}" if k["ratio"] is not None else ""]
        for k in x["kernels"][:MAX_OP_ROWS]
    ]  # fmt: skip
    if rows:
        header = ["kernel", "opcode", "XLA estimated cycles", "XLA share", "tpusim span", "tpusim share", "ratio"]
        lines += [*_table(header, rows, "llrrrrr"), ""]
    return lines


def render_markdown(s: dict[str, Any], plots: dict[str, str]) -> str:
    """The report for a person from the ``summary.json`` document; ``plots`` maps a figure's kind
    (``timeline``, ``utilisation``, ``roofline``, ``memory``) to its file name next to the report."""
    t, cfg, prog, opt = s["totals"], s["config"], s["program"], s["options"]
    clock = cfg["clock_hz"]
    lines = [
        f"# {prog['name']} on {cfg['name']}",
        "",
        f"{fmt.cycles(t['cycles'])} = {fmt.seconds(t['seconds'])} at {clock / 1e9:g} GHz; "
        f"{t['instructions']:,} instructions executed on {cfg['chips']} chip(s), {cfg['cores']} core(s). "
        f"{fmt.flops(t['flops'])} at {fmt.flop_rate(t['flops_per_s'])} "
        f"({fmt.percent(t['flops_fraction_of_peak'])} of the {fmt.flop_rate(t['peak_flops_per_s'])} peak); "
        f"HBM {fmt.bytes_(t['hbm_bytes'])} at {fmt.rate(t['hbm_bytes_per_s'])} "
        f"({fmt.percent(t['hbm_bandwidth_fraction'])} of {fmt.rate(t['peak_hbm_bytes_per_s'])}).",
        "",
        f"Options: tiling `{opt['tiling']}`, matmul precision `{opt['matmul_precision']}`, "
        f"fusion {'on' if opt['fuse'] else 'off'}{', timing only' if opt['timing_only'] else ''}"
        + (f"; config overrides: {', '.join(f'`{o}`' for o in cfg['overrides'])}" if cfg["overrides"] else "")
        + ".",
        "",
        "Where the time went (cycles on the critical path by what bound each HLO instruction): "
        + ", ".join(
            f"{k} {fmt.cycles(v)} ({fmt.percent(v / t['cycles'] if t['cycles'] else None)})"
            for k, v in t["critical_path_cycles_by_bound"].items()
            if v
        )
        + ".",
        "",
    ]
    if "timeline" in plots:
        lines += [f"![timeline by unit]({plots['timeline']})", ""]
    lines += ["## Units", ""]
    unit_rows = [
        [
            u["name"], u["kind"], f"{u['instructions']:,}", fmt.cycles(u["busy_cycles"]),
            fmt.percent(u["busy_fraction"]), fmt.bytes_(u["bytes"]), fmt.flops(u["flops"]),
            "" if u["critical_path_cycles"] is None else fmt.cycles(u["critical_path_cycles"]),
        ]
        for u in s["units"]
    ]  # fmt: skip
    header = ["unit", "kind", "instructions", "busy", "busy share", "bytes", "work", "on critical path"]
    lines += _table(header, unit_rows, "llrrrrrr")
    lines += [
        "",
        "DMA engines are reconstructed from the trace (a transfer holds an engine from its start to its last byte); "
        "`dma` is the core's whole DMA queue (transfers in flight, latency included). `sync` is time spent waiting "
        "on semaphores and barriers, never on the critical path.",
        "",
    ]
    if "utilisation" in plots:
        lines += [f"![utilisation over time]({plots['utilisation']})", ""]
    lines += ["## Memories", ""]
    mem_rows = []
    for m in s["memories"]:
        occ = m["occupancy"] or {}
        mem_rows.append([
            m["name"], fmt.bytes_(m["capacity_bytes"]), fmt.bytes_(m["dma_bytes_read"]),
            fmt.bytes_(m["dma_bytes_written"]), fmt.bytes_(m["compute_bytes"]), fmt.rate(m["bytes_per_s"]),
            fmt.percent(m["bandwidth_fraction"]),
            fmt.bytes_(occ.get("peak_bytes")), fmt.bytes_(occ.get("mean_bytes")),
        ])  # fmt: skip
    header = ["memory", "capacity", "DMA read", "DMA written", "compute traffic", "bandwidth", "of peak", "peak live",
              "mean live"]  # fmt: skip
    lines += _table(header, mem_rows, "lrrrrrrrr")
    lines += [""]
    if "memory" in plots:
        lines += [f"![memory occupancy]({plots['memory']})", ""]
    if s["links"]:
        used = sorted((k for k in s["links"] if k["bytes"]), key=lambda k: (-k["bytes"], k["name"]))
        lines += ["## ICI links", "", f"{len(used)} of {len(s['links'])} directed links carried data"
                  + (f"; the {_TOP_LINKS} busiest:" if len(used) > _TOP_LINKS else ":"), ""]  # fmt: skip
        link_rows = [
            [k["name"], fmt.bytes_(k["bytes"]), fmt.rate(k["bytes_per_s"]), fmt.percent(k["bandwidth_fraction"]),
             fmt.percent(k["busy_fraction"])]
            for k in used[:_TOP_LINKS]
        ]  # fmt: skip
        lines += [*_table(["link", "bytes", "bandwidth", "of peak", "busy share"], link_rows, "lrrrr"), ""]
    if s.get("collectives"):
        lines += ["## Collectives", ""]
        rows = [[f"chip{c['chip']}", fmt.cycles(c["cycles"]), fmt.percent(c["fraction"]),
                 fmt.percent(c["overlapped_cycles"] / c["cycles"] if c["cycles"] else None),
                 fmt.cycles(c["compute_cycles"] - c["overlapped_cycles"]), fmt.cycles(c["exposed_cycles"]),
                 fmt.cycles(c["overlapped_cycles"])]
                for c in s["collectives"]]  # fmt: skip
        head = ["chip", "cycles in collectives", "of the run", "overlapped compute", "compute only",
                "communication exposed", "communication overlapped"]  # fmt: skip
        lines += [*_table(head, rows, "lrrrrrr"), ""]
    lines += ["## HLO instructions", ""]
    op_rows = [
        [
            f"`{o['name']}`", o["opcode"] or "", fmt.cycles(o["critical_path_cycles"]),
            fmt.percent(o["critical_path_fraction"]), fmt.cycles(o["span_cycles"]), fmt.flops(o["flops"]),
            fmt.bytes_(o["hbm_bytes"]), fmt.intensity(o["arithmetic_intensity"]), fmt.flop_rate(o["flops_per_s"]),
            o["bound"],
        ]
        for o in s["ops"][:MAX_OP_ROWS]
    ]  # fmt: skip
    header = ["HLO instruction", "opcode", "on critical path", "share", "span", "work", "HBM traffic", "intensity",
              "achieved", "bound"]  # fmt: skip
    lines += _table(header, op_rows, "llrrrrrrrl")
    more = len(s["ops"]) - MAX_OP_ROWS
    lines += [""] + ([f"{more} more HLO instructions are listed in summary.json.", ""] if more > 0 else [])
    lines += [_BOUND_MEANING, ""]
    if "roofline" in plots:
        lines += [f"![roofline]({plots['roofline']})", ""]
    if s.get("xla"):
        lines += _xla_section(s["xla"])
    if s["fallbacks"]:
        lines += ["## Fallbacks", "", "Run as reference kernels on device bytes, with a declared cost:", ""]
        lines += [f"- `{x['computation']}/{x['instruction']}` ({x['opcode']}): {x['reason']}" for x in s["fallbacks"]]
        lines += [""]
    if s["relayouts"]:
        lines += ["## Relayout copies", ""]
        lines += [f"- `{x['computation']}/{x['name']}`: `{x['from_shape']}` -> `{x['to_shape']}` ({x['reason']})"
                  for x in s["relayouts"]]  # fmt: skip
        lines += [""]
    if s["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in s["notes"]] + [""]
    lines += [
        "## Files",
        "",
        "- `summary.json`: every number above and more (schema `tpusim.report.summary` version "
        f"{s['schema_version']}; `tpusim report --schema` prints it).",
        "- `trace.json`: the timeline for https://ui.perfetto.dev or chrome://tracing (open the file there); "
        "its time axis is simulated time (whole nanoseconds), each slice's cycles are in its arguments.",
        "- `tpusim report DIR` renders this page and the plots again from the JSON files.",
        "",
    ]
    return "\n".join(lines)
