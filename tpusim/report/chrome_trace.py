"""``trace.json``: a run as a Chrome trace (Trace Event Format, JSON object form) for Perfetto and chrome://tracing.

* One process per chip, named ``chip 0``; one thread per unit of each core, named ``core0.mxu1`` and sorted
  scalar, MXUs, VPU, XLUs, DMA, fallback, sync. Instructions that overlap on one unit (pipelined MXU passes,
  concurrent DMAs) go to extra tracks of that unit, so slices on a track never overlap (both viewers require
  proper nesting on a thread). Thread ids are unique across processes and never equal a process id (a
  viewer shows a thread whose id is its process's as the "main thread").
* One complete event (``ph: X``) per executed instruction, named after its HLO instruction, with the
  instruction text, bytes, flops and its issue, start and end cycle in ``args``.
* Flow arrows (``ph: s`` / ``f``) from each DMA to the first instruction that reads what it wrote.
* Counters (``ph: C``) of HBM occupancy per chip and VMEM occupancy per core, in bytes.

Time axis: **microseconds of simulated time**, as the format defines ``ts`` and ``dur``. Every time is a whole
number of nanoseconds (``cycle / clock_hz`` rounded to the nearest ns, written as microseconds with three
decimals), because Perfetto's importer stores nanoseconds: a slice's end is its start plus its duration,
so slices that abut in cycles abut in the viewer and nesting survives the import exactly. The exact cycles
are in each slice's ``args``; the clock is in ``otherData``. Flow ends sit inside their slices (one ns in
from the edge where the slice is long enough).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

import tpusim
from tpusim.report.analysis import RunAnalysis
from tpusim.report.timeline import assign_lanes

__all__ = ["FLOW_SCAN", "check_trace", "ns_to_us", "trace_events", "write_trace"]

FLOW_SCAN = 4096
"""Accesses examined after a DMA completes when looking for the instruction that reads its data."""

_UNIT_ORDER = ("scalar", "mxu", "vpu", "xlu", "dma", "fallback", "sync")


def ns_to_us(ns: int) -> float:
    """``ns`` nanoseconds as the float of microseconds that a viewer turns back into exactly ``ns``: the
    nearest double to ``ns / 1000``, nudged up where multiplying it by 1000 falls short, so that rounding
    (Perfetto today) and truncation (older Perfetto) of ``us * 1000.0`` both give ``ns``."""
    us = ns / 1000
    while us * 1000.0 < ns:
        us = math.nextafter(us, math.inf)
    return us


def _ns(cycles: np.ndarray | float, clock_hz: float) -> np.ndarray:
    """Cycles as whole nanoseconds of simulated time (nearest)."""
    return np.rint(np.asarray(cycles, np.float64) * (1e9 / clock_hz)).astype(np.int64)


def _consumers(a: RunAnalysis) -> dict[int, int]:
    """DMA entry -> the first entry that reads bytes it wrote (after it completed, before anything overwrote
    them), on the memory the DMA wrote."""
    f, tr = a.facts, a.facts.trace
    accesses: dict[tuple[str, int, int], list[tuple[int, int, int, int, bool]]] = defaultdict(list)
    for i in range(len(tr)):
        if f.kind[i] == "sync":
            continue
        for sp, chip, core, lo, hi in f.reads[i]:
            accesses[(sp, chip, core)].append((int(tr.start[i]), i, lo, hi, False))
        for sp, chip, core, lo, hi in f.writes[i]:
            accesses[(sp, chip, core)].append((int(tr.start[i]), i, lo, hi, True))
    index = {k: (sorted(v), np.array(sorted(t[0] for t in v), np.int64)) for k, v in accesses.items()}
    out: dict[int, int] = {}
    for i in np.flatnonzero(f.kind == "dma").tolist():
        for sp, chip, core, lo, hi in f.writes[i]:
            acc, starts = index[(sp, chip, core)]
            pos = int(np.searchsorted(starts, int(tr.end[i]), side="left"))
            for _, j, a_lo, a_hi, is_write in acc[pos : pos + FLOW_SCAN]:
                if j == i or a_hi <= lo or a_lo >= hi:
                    continue
                if is_write:
                    break
                out[i] = j
                break
    return out


def _links_pid(a: RunAnalysis) -> int:
    return len(a.result.trace.streams) + 2


def _tracks(a: RunAnalysis) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, str]]]:
    """(pid, tid) of every entry and the thread names ``(pid, tid, name)``. Thread ids count up from above
    every process id, so no thread shares its id with a process (viewers call such a thread the process's
    "main thread") or with a thread of another process."""
    f, tr = a.facts, a.facts.trace
    pid = f.chip.astype(np.int64) + 1  # pid 0 is special in some viewers
    tid = np.zeros(len(tr), np.int64)
    names: list[tuple[int, int, str]] = []
    next_tid = _links_pid(a) + 1

    def order(u: int) -> tuple[int, int, str]:
        name = tr.units[u]
        kind = name.rsplit(".", 1)[-1].rstrip("0123456789")
        core = int(name.split(".")[1][4:]) if ".core" in name else 0
        return (core, _UNIT_ORDER.index(kind) if kind in _UNIT_ORDER else len(_UNIT_ORDER), name)

    for u in sorted(range(len(tr.units)), key=order):
        sel = np.flatnonzero(tr.unit == u)
        if len(sel) == 0:
            continue
        lanes = assign_lanes(tr.start[sel], tr.end[sel], sel)
        chip = int(f.chip[sel[0]])
        label = tr.units[u].split(".", 1)[1] if "." in tr.units[u] else tr.units[u]
        for lane in range(int(lanes.max()) + 1):
            t = next_tid
            next_tid += 1
            tid[sel[lanes == lane]] = t
            names.append((chip + 1, t, label if lane == 0 else f"{label} [{lane + 1}]"))
    return pid, tid, names


def trace_events(a: RunAnalysis) -> Iterator[dict[str, Any]]:
    """The trace's events in timestamp order after the metadata (see the module docstring)."""
    f, tr = a.facts, a.facts.trace
    cfg = a.result.compiled.config
    clock = float(cfg.clock_hz)
    pid, tid, names = _tracks(a)
    for chip in sorted({p for p, _, _ in names}):
        yield {"ph": "M", "name": "process_name", "pid": chip, "tid": 0, "args": {"name": f"chip {chip - 1}"}}
        yield {"ph": "M", "name": "process_sort_index", "pid": chip, "tid": 0, "args": {"sort_index": chip}}
    for p, t, name in names:
        yield {"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": name}}
        yield {"ph": "M", "name": "thread_sort_index", "pid": p, "tid": t, "args": {"sort_index": t}}
    start_ns, end_ns = _ns(tr.start, clock), _ns(tr.end, clock)
    timed: list[tuple[int, int, dict[str, Any]]] = []
    for i in range(len(tr)):
        s, e = int(tr.start[i]), int(tr.end[i])
        s_ns, e_ns = int(start_ns[i]), int(end_ns[i])
        args: dict[str, Any] = {
            "instruction": tr.text(i), "unit": tr.units[int(tr.unit[i])], "bytes": int(tr.bytes[i]),
            "flops": int(tr.flops[i]), "issue_cycle": int(tr.issue[i]), "start_cycle": s, "end_cycle": e,
            "cycles": e - s,
        }  # fmt: skip
        if a.engine[i] >= 0:
            args["ici_queue" if f.remote[i] else "dma_engine"] = int(a.engine[i])
        name = f.hlo[i] or f"({f.mnemonic[i]})"
        ev = {"ph": "X", "name": name, "cat": str(f.kind[i]), "ts": ns_to_us(s_ns), "dur": ns_to_us(e_ns - s_ns),
              "pid": int(pid[i]), "tid": int(tid[i]), "args": args}  # fmt: skip
        timed.append((s_ns, 0, ev))
    for n, (i, j) in enumerate(sorted(_consumers(a).items())):
        (i0, i1), (j0, j1) = (int(start_ns[i]), int(end_ns[i])), (int(start_ns[j]), int(end_ns[j]))
        if i1 - i0 < 1 or j1 - j0 < 1:
            continue  # a slice of no time in whole nanoseconds cannot hold the arrow's end
        flow = {"cat": "dma", "name": "data", "id": n + 1}
        s_ts, f_ts = i1 - 1, j0 + 1 if j1 - j0 >= 2 else j0
        timed.append((s_ts, 1, {"ph": "s", "ts": ns_to_us(s_ts), "pid": int(pid[i]), "tid": int(tid[i]), **flow}))
        timed.append((f_ts, 1, {"ph": "f", "bp": "e", "ts": ns_to_us(f_ts), "pid": int(pid[j]), "tid": int(tid[j]),
                                **flow}))  # fmt: skip
    for name, occ in a.occupancy.items():
        chip = int(name.split(".")[0][4:])
        label = "HBM occupancy" if name.endswith("hbm") else f"{name.split('.')[1]} VMEM occupancy"
        for c, v in zip(_ns(occ.cycles, clock).tolist(), occ.bytes.tolist()):
            timed.append((c, 2, {"ph": "C", "name": label, "ts": ns_to_us(c), "pid": chip + 1, "args": {"bytes": v}}))
    if a.links:
        from tpusim.report.links import link_trace_events

        for ev in link_trace_events(a.result, pid=_links_pid(a)):
            ts = ev.get("ts")
            if isinstance(ts, (int, float)):
                c = int(_ns(ts, clock))
                timed.append((c, 2, {**ev, "ts": ns_to_us(c)}))
            else:
                timed.append((-1, 2, ev))
    timed.sort(key=lambda x: (x[0], x[1]))
    for _, _, ev in timed:
        yield ev


def write_trace(a: RunAnalysis, path: Path) -> dict[str, int]:
    """Write ``trace.json``; returns counts of slices, flows and counter samples."""
    cfg = a.result.compiled.config
    counts = {"slices": 0, "flows": 0, "counters": 0}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as out:
        out.write('{"traceEvents":[\n')
        first = True
        for ev in trace_events(a):
            counts["slices"] += ev["ph"] == "X"
            counts["flows"] += ev["ph"] == "s"
            counts["counters"] += ev["ph"] == "C"
            out.write(("" if first else ",\n") + json.dumps(ev, separators=(",", ":"), allow_nan=False))
            first = False
        other = {
            "tpusim": tpusim.__version__, "program": a.result.compiled.source.name, "config": cfg.name,
            "clock_hz": cfg.clock_hz, "time_unit": "us of simulated time (whole ns; cycles in each slice's args)",
            "cycles": a.cycles, "seconds": a.cycles / float(cfg.clock_hz), **counts,
        }  # fmt: skip
        out.write('\n],"otherData":' + json.dumps(other) + "}\n")
    tmp.replace(path)
    return counts


# ----------------------------------------------------------------------------------------------- checks
_META = {"process_name": "name", "process_labels": "labels", "process_sort_index": "sort_index",
         "thread_name": "name", "thread_sort_index": "sort_index"}  # fmt: skip
_PHASES = set("BEXIiCMsftbenPOND") | {"(", ")"}


def _import_ns(us: float) -> int:
    """A time in microseconds as Perfetto's JSON importer stores it: whole nanoseconds, nearest."""
    return int(us) * 1000 if us == int(us) else round(us * 1000.0)


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_trace(doc: Any) -> list[str]:
    """Problems of a Chrome trace against the Trace Event Format's rules (empty when it follows them).

    Checked: the JSON object form with a ``traceEvents`` list; every event has a known ``ph``; timed events
    have a numeric ``ts >= 0`` and integer ``pid`` (and ``tid`` for thread events); ``X`` has ``dur >= 0``;
    counters carry at least one numeric series in ``args``; metadata names are the documented ones with the
    documented argument; complete events on one thread nest properly (no partial overlap) in the whole
    nanoseconds a viewer stores (``ts`` and ``dur`` each rounded, as Perfetto imports them); every flow id has
    one start and one end with the same ``cat`` and ``name``, the end not before the start, the start inside
    a slice of its thread and the end (``bp: e``) inside a slice of its thread.
    """
    problems: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["the document must be a JSON object with a 'traceEvents' list"]
    slices: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    flows: dict[Any, dict[str, dict[str, Any]]] = defaultdict(dict)
    for n, ev in enumerate(doc["traceEvents"]):
        where = f"event {n}"
        if not isinstance(ev, dict) or ev.get("ph") not in _PHASES:
            problems.append(f"{where}: not an event with a known 'ph'")
            continue
        ph = ev["ph"]
        if ph == "M":
            key = _META.get(ev.get("name", ""))
            if key is None or not isinstance(ev.get("args"), dict) or key not in ev["args"]:
                problems.append(f"{where}: metadata event {ev.get('name')!r} needs args.{key or 'name'}")
            continue
        ts = ev.get("ts")
        if not _finite(ts) or ts < 0:
            problems.append(f"{where}: 'ts' must be a number >= 0, not {ts!r}")
            continue
        if not isinstance(ev.get("pid"), int) or (ph != "C" and not isinstance(ev.get("tid"), int)):
            problems.append(f"{where}: 'pid' and 'tid' must be integers")
            continue
        if ph == "X":
            dur = ev.get("dur")
            if not _finite(dur) or dur < 0 or not isinstance(ev.get("name"), str):
                problems.append(f"{where}: a complete event needs a 'name' and 'dur' >= 0")
                continue
            slices[(ev["pid"], ev["tid"])].append((_import_ns(ts), _import_ns(ts) + _import_ns(dur)))
        elif ph == "C":
            args = ev.get("args")
            if not isinstance(args, dict) or not args or not all(_finite(v) for v in args.values()):
                problems.append(f"{where}: a counter needs numeric series in 'args'")
        elif ph in "stf":
            if "id" not in ev:
                problems.append(f"{where}: a flow event needs an 'id'")
                continue
            if ph in flows[ev["id"]]:
                problems.append(f"{where}: flow id {ev['id']} has two {ph!r} events")
            flows[ev["id"]][ph] = ev
    for (p, t), spans in slices.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[int] = []
        for s, e in spans:
            while stack and stack[-1] <= s:
                stack.pop()
            if stack and e > stack[-1]:
                problems.append(f"pid {p} tid {t}: a slice [{s}, {e}) ns overlaps the end of an enclosing one")
            stack.append(e)
    # per thread: slice starts in order and the latest end among the slices started so far, so "inside a slice"
    # is one binary search (a scan per flow end took minutes on a long run's trace)
    reach: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    for thread, spans in slices.items():
        ends_so_far = list(itertools.accumulate((e for _, e in spans), max))
        reach[thread] = ([s for s, _ in spans], ends_so_far)

    def inside(thread: tuple[int, int], t: int) -> bool:
        starts, latest = reach.get(thread, ([], []))
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and latest[i] > t

    for fid, ends in flows.items():
        s_ev, f_ev = ends.get("s"), ends.get("f")
        if s_ev is None or f_ev is None:
            problems.append(f"flow id {fid}: needs one 's' and one 'f' event")
            continue
        if (s_ev.get("cat"), s_ev.get("name")) != (f_ev.get("cat"), f_ev.get("name")):
            problems.append(f"flow id {fid}: 's' and 'f' differ in cat or name")
        if f_ev["ts"] < s_ev["ts"]:
            problems.append(f"flow id {fid}: ends before it starts")
        for ev in (s_ev, f_ev):
            if ev is f_ev and ev.get("bp") != "e":
                continue  # binds to the next slice instead
            if not inside((ev["pid"], ev["tid"]), _import_ns(ev["ts"])):
                problems.append(f"flow id {fid}: its {ev['ph']!r} event at {ev['ts']} is not inside a slice")
    return problems
