"""Reports: summary.json against its schema, totals that add up against the trace, the Chrome trace against
the Trace Event Format's rules, plots checked as images, re-rendering from JSON, and the command line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from matplotlib.image import imread

import tpusim
from tpusim.cli import main
from tpusim.report.chrome_trace import check_trace
from tpusim.report.schema import SUMMARY_SCHEMA
from tpusim.report.schema_check import first_problem
from tpusim.report.summary_json import build_summary
from tpusim.report.timeline import merged_runs
from tpusim.report.writer import PLOTS, write_report

ROOT = Path(__file__).resolve().parent.parent


def _colours(rgb: np.ndarray) -> int:
    """Distinct colours of an image (8 bits per channel)."""
    q = (rgb[..., :3] * 255).round().astype(np.uint32)
    return len(np.unique((q[..., 0] << 16) | (q[..., 1] << 8) | q[..., 2]))


MLP = ROOT / "tests" / "hlo_samples" / "jax_mlp_short.hlo"
BLOCK = ROOT / "configs" / "sweeps" / "programs" / "transformer_block.hlo"


@pytest.fixture(scope="module", params=["mlp-teaching", "block-tpu_v5e"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A simulation and its report folder: a small MLP on the teaching chip (numeric run) and a transformer
    block with fallbacks on TPU v5e (timing only)."""
    program, config = (MLP, "teaching") if request.param.startswith("mlp") else (BLOCK, "tpu_v5e")
    result = tpusim.simulate(program.read_text(), config=config, timing_only=program is BLOCK)
    out = tmp_path_factory.mktemp(request.param)
    write_report(result, out, program_path=str(program), wall_seconds=0.25)
    return {
        "result": result,
        "dir": out,
        "summary": json.loads((out / "summary.json").read_text()),
        "trace": json.loads((out / "trace.json").read_text()),
    }


def test_summary_follows_its_schema(run: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(SUMMARY_SCHEMA)
    jsonschema.Draft202012Validator(SUMMARY_SCHEMA).validate(run["summary"])
    assert run["summary"]["schema_version"] == 1


def test_schema_rejects_a_broken_summary(run: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(run["summary"]))
    broken["ops"][0]["bound"] = "vibes"
    with pytest.raises(jsonschema.ValidationError, match="vibes"):
        jsonschema.validate(broken, SUMMARY_SCHEMA, cls=jsonschema.Draft202012Validator)


def _leaves(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every scalar value of a JSON document."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _leaves(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _leaves(v, (*path, i))]
    return [path]


def test_the_reports_own_schema_check_agrees_with_jsonschema(run: dict[str, Any]) -> None:
    """``tpusim report`` checks summary.json with a small checker of its own (jsonschema is a test
    dependency): on every scalar of a real summary replaced by a wrong-typed, negative or foreign value, it
    refuses exactly what jsonschema refuses, and names the value's path."""
    validator = jsonschema.Draft202012Validator(SUMMARY_SCHEMA)
    assert first_problem(run["summary"], SUMMARY_SCHEMA) is None
    leaves = _leaves(run["summary"])
    rng = np.random.default_rng(0)
    picked = [leaves[i] for i in rng.choice(len(leaves), min(60, len(leaves)), replace=False)]
    refused = 0
    for path in picked:
        for bad in ("lots", -5, None, 2.5, [1], {"a": 1}, True):
            doc = json.loads(json.dumps(run["summary"]))
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = bad
            mine = first_problem(doc, SUMMARY_SCHEMA)
            assert (mine is None) == validator.is_valid(doc), (path, bad, mine)
            if mine is not None:
                refused += 1
                assert str(path[-1]) in mine, (path, mine)
    assert refused > len(picked)
    doc = json.loads(json.dumps(run["summary"]))
    doc["config"]["clock_hz"] = 0  # (exclusiveMinimum)
    assert first_problem(doc, SUMMARY_SCHEMA) is not None and not validator.is_valid(doc)
    doc = json.loads(json.dumps(run["summary"]))
    del doc["totals"]["cycles"]
    assert first_problem(doc, SUMMARY_SCHEMA) == "totals: the key 'cycles' is missing"


def test_a_report_of_an_edited_summary_names_the_bad_value(
    run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a campaign of bad inputs: a text ``totals.cycles`` was blamed on trace.json (the timeline
    plot failed) and a negative one rendered as ``-5 cycles``."""
    for bad in ("lots", -5):
        summary = json.loads(json.dumps(run["summary"]))
        summary["totals"]["cycles"] = bad
        (tmp_path / "summary.json").write_text(json.dumps(summary))
        assert main(["report", str(tmp_path)]) == 1
        err = capsys.readouterr().err
        assert "summary.json: totals.cycles: must be" in err and "trace.json" not in err, err
        assert not (tmp_path / "report.md").exists()


def test_totals_add_up(run: dict[str, Any]) -> None:
    s, trace = run["summary"], run["result"].trace
    t = s["totals"]
    assert t["cycles"] == run["result"].cycles
    assert t["instructions"] == len(trace)
    # Every cycle of the run is charged to exactly one HLO instruction on the critical path.
    assert sum(o["critical_path_cycles"] for o in s["ops"]) == t["cycles"]
    assert sum(o["instructions"] for o in s["ops"]) == len(trace)
    assert sum(o["flops"] for o in s["ops"]) == t["flops"] == int(trace.flops.sum())
    assert sum(o["bytes"] for o in s["ops"]) == int(trace.bytes.sum())
    assert sum(t["critical_path_cycles_by_bound"].values()) == t["cycles"]
    units = {u["name"]: u for u in s["units"]}
    for name in trace.units:  # busy time against the trace's own (independent) union of intervals
        assert units[name]["busy_cycles"] == trace.busy_cycles(name), name
        assert units[name]["instructions"] == int((trace.unit == trace.unit_id(name)).sum())
    assert sum(u["critical_path_cycles"] for u in s["units"] if u["critical_path_cycles"] is not None) == t["cycles"]
    assert t["seconds"] == pytest.approx(t["cycles"] / s["config"]["clock_hz"])


def test_hbm_traffic_matches_the_dma_texts(run: dict[str, Any]) -> None:
    """HBM bytes read and written, counted again from the instruction texts of the trace."""
    trace = run["result"].trace
    read = written = 0
    for i in range(len(trace)):
        text = trace.text(i)
        if text.startswith("dma.start"):
            src, dst = text.split(None, 1)[1].split(" -> ")
            read += int(trace.bytes[i]) if src.startswith("hbm[") else 0
            written += int(trace.bytes[i]) if dst.startswith("hbm[") else 0
    (hbm,) = [m for m in run["summary"]["memories"] if m["kind"] == "hbm"]
    assert (hbm["dma_bytes_read"], hbm["dma_bytes_written"]) == (read, written)
    assert run["summary"]["totals"]["hbm_bytes"] == read + written > 0


def test_dma_engines_never_exceed_the_config(run: dict[str, Any]) -> None:
    s = run["summary"]
    engines = [u for u in s["units"] if u["kind"] == "dma_engine"]
    cfg = run["result"].compiled.config
    assert len(engines) == cfg.dma.engines
    assert sum(u["instructions"] for u in engines) == next(u for u in s["units"] if u["kind"] == "dma")["instructions"]
    events = [ev for ev in run["trace"]["traceEvents"] if ev.get("ph") == "X" and "dma_engine" in ev["args"]]
    assert {ev["args"]["dma_engine"] for ev in events} <= set(range(cfg.dma.engines))
    assert not any("reconstruction" in n for n in s["notes"])


def test_trace_follows_the_format(run: dict[str, Any]) -> None:
    doc, trace = run["trace"], run["result"].trace
    assert check_trace(doc) == []
    slices = [ev for ev in doc["traceEvents"] if ev["ph"] == "X"]
    assert len(slices) == len(trace) == doc["otherData"]["slices"]
    hlo = sorted(h or "" for h in trace.hlo)
    assert sorted(ev["name"] if not ev["name"].startswith("(") else "" for ev in slices) == hlo
    assert all({"bytes", "flops", "instruction"} <= set(ev["args"]) for ev in slices)
    flows = [ev for ev in doc["traceEvents"] if ev["ph"] in "sf"]
    assert len(flows) == 2 * doc["otherData"]["flows"] > 0
    counters = {ev["name"] for ev in doc["traceEvents"] if ev["ph"] == "C"}
    assert counters == {"HBM occupancy", "core0 VMEM occupancy"}


def test_unit_busy_time_agrees_with_the_trace_file(run: dict[str, Any]) -> None:
    """Each unit's busy cycles in summary.json equal the union of its slices in trace.json."""
    doc = run["trace"]
    names = {(ev["pid"], ev["tid"]): ev["args"]["name"] for ev in doc["traceEvents"] if ev.get("name") == "thread_name"}
    spans: dict[str, list[tuple[int, int]]] = {}
    for ev in doc["traceEvents"]:
        if ev["ph"] == "X":
            unit = f"chip{ev['pid'] - 1}." + re.sub(r" \[\d+\]$", "", names[(ev["pid"], ev["tid"])])
            assert unit == ev["args"]["unit"]
            spans.setdefault(unit, []).append((ev["args"]["start_cycle"], ev["args"]["end_cycle"]))
    for u in run["summary"]["units"]:
        if u["name"] in spans:
            s, e = (np.array(x) for x in zip(*spans[u["name"]]))
            rs, re_ = merged_runs(s, e)
            assert int((re_ - rs).sum()) == u["busy_cycles"], u["name"]


def test_trace_is_in_simulated_microseconds(run: dict[str, Any]) -> None:
    """ts and dur are microseconds of simulated time in whole nanoseconds (cycle / clock, nearest ns), which
    Perfetto's importer (``llround(us * 1000)``; older versions truncate) turns back into the same ns; the
    cycles are in each slice's args; the last slice ends at the run's length in us, not at its cycle count."""
    doc, clock = run["trace"], run["result"].compiled.config.clock_hz
    slices = [ev for ev in doc["traceEvents"] if ev["ph"] == "X"]
    for ev in slices:
        s, e = ev["args"]["start_cycle"], ev["args"]["end_cycle"]
        assert ev["args"]["cycles"] == e - s
        s_ns, e_ns = round(s * 1e9 / clock), round(e * 1e9 / clock)
        assert round(ev["ts"] * 1000.0) == int(ev["ts"] * 1000.0) == s_ns, ev
        assert round(ev["dur"] * 1000.0) == int(ev["dur"] * 1000.0) == e_ns - s_ns, ev
    for ev in doc["traceEvents"]:
        if ev["ph"] != "M":
            assert int(ev["ts"] * 1000.0) == round(ev["ts"] * 1000.0), ev  # whole ns, however the viewer rounds
    cycles = run["summary"]["totals"]["cycles"]
    last = max(ev["ts"] + ev["dur"] for ev in slices)
    assert last == pytest.approx(cycles / clock * 1e6, abs=1e-3)
    assert doc["otherData"]["clock_hz"] == clock and doc["otherData"]["cycles"] == cycles
    assert doc["otherData"]["seconds"] == pytest.approx(run["summary"]["totals"]["seconds"])


def test_trace_names_processes_and_threads(run: dict[str, Any]) -> None:
    """A process per chip named ``chip 0``, a named and sorted thread per unit track; no thread id equals a
    process id (viewers show such a thread as the process's "main thread") or repeats in another process."""
    meta = [ev for ev in run["trace"]["traceEvents"] if ev["ph"] == "M"]
    procs = {ev["pid"]: ev["args"]["name"] for ev in meta if ev["name"] == "process_name"}
    assert procs == {1: "chip 0"}
    threads = {(ev["pid"], ev["tid"]): ev["args"]["name"] for ev in meta if ev["name"] == "thread_name"}
    order = {(ev["pid"], ev["tid"]): ev["args"]["sort_index"] for ev in meta if ev["name"] == "thread_sort_index"}
    assert set(order) == set(threads)
    tids = [t for _, t in threads]
    assert len(set(tids)) == len(tids) and not set(tids) & set(procs)
    ranked = [threads[k] for k in sorted(threads, key=order.__getitem__)]
    assert ranked[0] == "core0.scalar" and "main thread" not in ranked
    assert ranked.index("core0.mxu0") < ranked.index("core0.vpu") < ranked.index("core0.dma")
    used = {(ev["pid"], ev["tid"]) for ev in run["trace"]["traceEvents"] if ev["ph"] == "X"}
    assert used == set(threads)


@pytest.mark.parametrize("ns", [0, 1, 7, 999, 1000, 1001, 4_350, 63_587_667, 2**40 + 3])
def test_trace_microseconds_come_back_as_the_same_nanoseconds(ns: int) -> None:
    from tpusim.report.chrome_trace import ns_to_us

    us = ns_to_us(ns)
    back = json.loads(json.dumps(us))  # as written to and read from the file
    assert int(back * 1000.0) == round(back * 1000.0) == ns
    assert abs(back - ns / 1000) <= 1e-9 * max(1, ns)


def test_trace_checker_catches_broken_traces() -> None:
    x = {"ph": "X", "name": "a", "pid": 1, "tid": 1}
    assert check_trace([]) == ["the document must be a JSON object with a 'traceEvents' list"]
    overlap = {"traceEvents": [{**x, "ts": 0, "dur": 10}, {**x, "ts": 5, "dur": 10}]}
    assert "overlaps the end of an enclosing one" in check_trace(overlap)[0]
    nested = {"traceEvents": [{**x, "ts": 0, "dur": 10}, {**x, "ts": 2, "dur": 3}]}
    assert check_trace(nested) == []
    lonely = {"traceEvents": [{**x, "ts": 0, "dur": 10}, {"ph": "s", "id": 7, "ts": 1, "pid": 1, "tid": 1}]}
    assert check_trace(lonely) == ["flow id 7: needs one 's' and one 'f' event"]
    flow = {"id": 1, "pid": 1, "cat": "c", "name": "n"}
    ends = [{"ph": "s", "ts": 1, "tid": 1, **flow}, {"ph": "f", "bp": "e", "ts": 2, "tid": 2, **flow}]
    outside = {"traceEvents": ends}  # neither end is inside a slice
    assert len(check_trace(outside)) == 2
    assert "'ts' must be a number" in check_trace({"traceEvents": [{**x, "ts": -1, "dur": 1}]})[0]
    assert "needs args.name" in check_trace({"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 1}]})[0]
    counter = {"ph": "C", "name": "c", "ts": 0, "pid": 1, "args": {}}
    assert "numeric series" in check_trace({"traceEvents": [counter]})[0]


def test_ops_say_what_bound_them(run: dict[str, Any]) -> None:
    ops = run["summary"]["ops"]
    fallbacks = {f["instruction"] for f in run["summary"]["fallbacks"]}
    for o in ops:
        assert (o["bound"] == "fallback") == (o["name"] in fallbacks)
        assert o["start_cycle"] + o["span_cycles"] == o["end_cycle"]
        assert o["active_cycles"] <= o["span_cycles"]
        if o["hbm_bytes"]:
            assert o["arithmetic_intensity"] == pytest.approx(o["flops"] / o["hbm_bytes"])
    dots = [o for o in ops if o["opcode"] == "dot" and o["bound"] != "fallback"]
    assert dots and all(o["mxu_flops"] == o["flops"] > 0 for o in dots)


def test_memory_occupancy(run: dict[str, Any]) -> None:
    s = run["summary"]
    hbm = next(m for m in s["memories"] if m["kind"] == "hbm")
    # Entry parameters live for the whole run: at least their bytes are occupied from cycle 0.
    params = sum(b.size for b in run["result"].compiled.buffers.buffers if b.kind == "parameter")
    steps = s["series"]["occupancy"]["chip0.hbm"]
    assert steps["cycles"][0] == 0 and steps["bytes"][0] >= params > 0
    assert params <= hbm["occupancy"]["mean_bytes"] <= hbm["occupancy"]["peak_bytes"] == max(steps["bytes"])
    assert hbm["occupancy"]["peak_bytes"] <= run["result"].compiled.hbm_bytes
    vmem = next(m for m in s["memories"] if m["kind"] == "vmem")
    assert 0 < vmem["occupancy"]["peak_bytes"] <= run["result"].compiled.config.vmem.bytes


def test_plots_render(run: dict[str, Any]) -> None:
    for name in PLOTS:
        img = imread(run["dir"] / f"{name}.png")
        h, w = img.shape[:2]
        assert h > 300 and w > 600, name
        rgb = img[..., :3]
        ink = (rgb < 0.9).any(axis=-1).mean()  # share of pixels that are not (near) white
        assert 0.02 < ink < 0.95, (name, ink)
        assert _colours(rgb) > 20, name  # more than text on a blank page
    # The timeline shows the costliest HLO instruction's colour (the first of the palette).
    from matplotlib import colormaps

    top = np.array(colormaps["tab20"](0)[:3])
    img = imread(run["dir"] / "timeline.png")[..., :3]
    assert (np.abs(img - top).max(axis=-1) < 0.02).sum() > 50


def test_report_md_names_units(run: dict[str, Any]) -> None:
    md = (run["dir"] / "report.md").read_text()
    first = md.splitlines()[2]
    for unit in ("cycles = ", "GHz", "FLOP at", "TFLOP/s", "GB/s"):
        assert unit in first
    assert re.search(r"cycles = [\d.,]+ (ns|us|ms|s) at", first)
    for name in PLOTS:
        assert f"({name}.png)" in md
    # Numbers in the unit and op tables carry units, except counts of instructions and shares in percent.
    table = [line for line in md.splitlines() if line.startswith("| chip0.")]
    for line in table:
        for cell in line.strip("| ").split(" | ")[3:]:
            assert cell == "" or re.search(r"(cycles?|%|B|FLOP|GB/s|n/a)$", cell), (line, cell)


def test_render_again_from_json(run: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    out = run["dir"]
    before = (out / "report.md").read_text()
    for name in ("report.md", *(f"{p}.png" for p in PLOTS)):
        (out / name).unlink()
    assert main(["report", str(out)]) == 0
    assert (out / "report.md").read_text() == before
    assert all((out / f"{p}.png").stat().st_size > 10_000 for p in PLOTS)
    assert "wrote" in capsys.readouterr().err


def test_summary_is_deterministic() -> None:
    docs = []
    for _ in range(2):
        r = tpusim.simulate(MLP.read_text(), config="teaching", timing_only=True)
        docs.append(json.dumps(build_summary(r)))
    assert docs[0] == docs[1]


def test_cli_run_writes_the_default_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(MLP), "--config", "teaching", "--timing-only", "--report"]) == 0
    out = tmp_path / "reports" / "jax_mlp_short-teaching"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["summary.json", "trace.json", "report.md", *(f"{p}.png" for p in PLOTS)]
    )
    assert json.loads((out / "summary.json").read_text())["program"]["path"] == str(MLP)


def test_cli_report_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 1
    assert f"tpusim report: cannot read the report summary {tmp_path / 'summary.json'}" in capsys.readouterr().err
    (tmp_path / "summary.json").write_text('{"schema": "something else"}')
    assert main(["report", str(tmp_path)]) == 1
    assert "this tpusim renders 'tpusim.report.summary' version 1" in capsys.readouterr().err
    assert main(["report", "--schema"]) == 0
    assert json.loads(capsys.readouterr().out)["$id"] == "tpusim.report.summary/1"


def test_facts_from_the_program_equal_facts_parsed_from_the_trace(run: dict[str, Any]) -> None:
    from tpusim.report.entries import decode_trace

    r = run["result"]
    fast = decode_trace(r.trace, r.compiled.config, r.compiled.program)
    slow = decode_trace(r.trace, r.compiled.config)
    for name in ("kind", "hbm_read", "hbm_write", "data_end", "dst_chip", "dst_core"):
        assert np.array_equal(getattr(fast, name), getattr(slow, name)), name
    assert fast.reads == slow.reads and fast.writes == slow.writes and fast.mnemonic == slow.mnemonic


def test_trace_view_draws_the_trace(run: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    out = run["dir"]
    assert main(["report", str(out), "--trace-view", f"0:{run['summary']['totals']['cycles'] // 2}"]) == 0
    img = imread(out / "trace_view.png")[..., :3]
    assert img.shape[0] > 400 and 0.02 < (img < 0.9).any(axis=-1).mean() < 0.9
    assert main(["report", str(out), "--trace-view", "soon"]) == 1
    assert "--trace-view soon: give START:END in cycles" in capsys.readouterr().err


def test_report_of_many_chips_has_links_and_collectives(tmp_path: Path) -> None:
    """A ring all-reduce of V bytes on a 4-chip v4 ring: summary.json lists every directed link with (L-1)/L * V
    bytes, the per-chip collective time, one ICI unit row per link; trace.json has one counter track per link;
    report.md has both sections."""
    sum_ = "sum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"
    text = (f"HloModule ar, replica_count=4\n{sum_}ENTRY main {{\n  x = f32[256,128] parameter(0)\n"
            "  ROOT r = f32[256,128] all-reduce(x), replica_groups={}, to_apply=sum\n}\n")  # fmt: skip
    result = tpusim.simulate(text, chips=4, config="tpu_v4", timing_only=True)
    write_report(result, tmp_path, wall_seconds=0.1)
    summary = json.loads((tmp_path / "summary.json").read_text())
    jsonschema.Draft202012Validator(SUMMARY_SCHEMA).validate(summary)
    volume = 256 * 128 * 4
    links = summary["links"]
    assert len(links) == 8 and {k["bytes"] for k in links} == {3 * volume // 4}
    assert summary["totals"]["ici_bytes"] == 8 * (3 * volume // 4)
    assert all(0 < k["busy_fraction"] <= 1 and 0 < k["bandwidth_fraction"] <= 1 for k in links)
    assert [c["chip"] for c in summary["collectives"]] == [0, 1, 2, 3]
    assert all(0.5 < c["fraction"] <= 1 for c in summary["collectives"])
    assert {u["name"] for u in summary["units"] if u["kind"] == "ici_link"} == {k["name"] for k in links}
    doc = json.loads((tmp_path / "trace.json").read_text())
    assert check_trace(doc) == []
    counters = {ev["name"] for ev in doc["traceEvents"] if ev["ph"] == "C"}
    assert {k["name"] for k in links} <= counters
    md = (tmp_path / "report.md").read_text()
    assert "## ICI links" in md and "8 of 8 directed links carried data" in md and "## Collectives" in md


def test_a_broken_trace_is_blamed_on_trace_json(tmp_path: Path) -> None:
    """The timeline reads trace.json: a damaged one was reported as summary.json's fault (a helper's sweep)."""
    from tpusim.report.writer import ReportError, render_report, write_report

    result = tpusim.simulate(MLP, timing_only=True)
    write_report(result, tmp_path)
    trace = json.loads((tmp_path / "trace.json").read_text())
    for event in trace["traceEvents"]:
        event.pop("args", None)
    (tmp_path / "trace.json").write_text(json.dumps(trace))
    with pytest.raises(ReportError, match=r"trace\.json: event 0: metadata event 'process_name' needs args\.name"):
        render_report(tmp_path)


@pytest.mark.parametrize(
    ("file", "damage", "message"),
    [
        ("trace.json", b"\xff\xfe not text", r"trace\.json: not UTF-8 text \(byte 0\)"),
        ("trace.json", b'{"traceEvents": ' + b"[" * 100000 + b"]" * 100000 + b"}", r"nested too deeply"),
        ("trace.json", "nan_ts", r"trace\.json: event \d+: 'ts' must be a number >= 0, not nan"),
        ("summary.json", "chips0", r"summary\.json: config\.chips: must be at least 1, not 0"),
        ("summary.json", "cycles_huge", r"summary\.json: totals\.cycles: must be at most 9223372036854775807"),
    ],
)
def test_damaged_report_files_are_one_named_error(tmp_path: Path, file: str, damage: object, message: str) -> None:
    """Found by a campaign of bad inputs: each was a bare UnicodeDecodeError, RecursionError, ValueError from the
    plot's axis limits, ZeroDivisionError, or blamed on the other file."""
    from tpusim.report.writer import ReportError, render_report, write_report

    write_report(tpusim.simulate(MLP, timing_only=True), tmp_path)
    path = tmp_path / file
    if isinstance(damage, bytes):
        path.write_bytes(damage)
    else:
        doc = json.loads(path.read_text())
        if damage == "nan_ts":
            next(e for e in doc["traceEvents"] if e.get("ph") == "X")["ts"] = float("nan")
        elif damage == "chips0":
            doc["config"]["chips"] = 0
        else:
            doc["totals"]["cycles"] = 10**30
        path.write_text(json.dumps(doc))
    with pytest.raises(ReportError, match=message):
        render_report(tmp_path)
