"""Per-link reports of multi-chip runs, collective time and its overlap with compute, and the command line."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import tpusim
from tpusim.cli import main
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate_spmd
from tpusim.compiler.hlo.reference.io import random_inputs
from tpusim.compiler.options import CompileOptions
from tpusim.report.analysis import analyse
from tpusim.report.links import collective_time, format_links, link_trace_events, link_usage, remote_targets
from tpusim.report.summary_json import summary_from_analysis

SUM = "sum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"


def test_every_ring_link_carries_its_share_of_an_all_reduce() -> None:
    """A ring all-reduce of V bytes over L chips pushes (L-1)/L * V through every directed link of the
    ring (half of each chunk each way, 2(L-1) steps); the report attributes every transfer."""
    rows, chips = 4096, 8
    text = (f"HloModule ar, replica_count={chips}\n{SUM}ENTRY main {{\n  x = f32[{rows},1024] parameter(0)\n"
            f"  ROOT r = f32[{rows},1024] all-reduce(x), replica_groups={{}}, to_apply=sum\n}}\n")  # fmt: skip
    result = tpusim.simulate(text, chips=chips, config="tpu_v4", timing_only=True)
    uses, unknown = link_usage(result)
    assert unknown == 0 and len(uses) == 2 * chips
    volume = rows * 1024 * 4
    assert {u.bytes for u in uses} == {(chips - 1) * volume // chips}
    assert all(0.85 < u.busy_cycles / result.cycles < 1 and 0.85 < u.utilisation < 1 for u in uses)
    text_report = format_links(result)
    assert text_report.startswith("ICI (8 (axis 0 wraps), 16 directed links):")
    assert "16 of 16 carried data" in text_report
    tracks = {e["name"] for e in link_trace_events(result) if e["ph"] == "C"}
    assert tracks == {u.name for u in uses}


def test_multichip_runs_are_deterministic() -> None:
    """Same program, inputs and config: the same cycles, trace and bytes on every chip."""
    text = (f"HloModule ar, replica_count=8\n{SUM}ENTRY main {{\n  x = f32[64,128] parameter(0)\n"
            "  ROOT r = f32[64,128] all-reduce(x), replica_groups={}, to_apply=sum\n}\n")  # fmt: skip
    x = np.random.default_rng(0).standard_normal((8, 64, 128)).astype(np.float32)
    a, b = (tpusim.simulate(text, [x], chips=8, topology="2x4") for _ in range(2))
    assert a.cycles == b.cycles and a.trace.rows() == b.trace.rows()
    assert np.array_equal(a.outputs[0], b.outputs[0])


def test_destinations_come_from_the_chip_id_arithmetic() -> None:
    pairs = "{{0,3},{3,1},{1,0},{6,7}}"
    text = ("HloModule cp, replica_count=8\nENTRY main {\n  x = f32[8,128] parameter(0)\n"
            f"  ROOT r = f32[8,128] collective-permute(x), source_target_pairs={pairs}\n}}\n")  # fmt: skip
    result = tpusim.simulate(text, chips=8, timing_only=True)
    targets = list(remote_targets(result.compiled.program, 8).values())
    assert len(targets) == 1 and targets[0][[0, 3, 1, 6]].tolist() == [3, 1, 0, 7]
    uses, _ = link_usage(result)
    busy = {u.name: u.transfers for u in uses if u.transfers}
    # v5e, a line of 8: 0->3 over 0,1,2; 3->1 over 3,2; 1->0; 6->7
    assert busy == {"chip0.ici0+": 1, "chip1.ici0+": 1, "chip2.ici0+": 1, "chip3.ici0-": 1, "chip2.ici0-": 1,
                    "chip1.ici0-": 1, "chip6.ici0+": 1}  # fmt: skip


def _permute_and_dot(asynchronous: bool) -> str:
    pairs = "{{0,1},{1,2},{2,3},{3,0}}"
    if asynchronous:
        send = (f"  s = (f32[64,1024], f32[64,1024], u32[], u32[]) collective-permute-start(x), "
                f"source_target_pairs={pairs}\n")  # fmt: skip
        done = "  r = f32[64,1024] collective-permute-done(s)\n"
    else:
        send, done = f"  r = f32[64,1024] collective-permute(x), source_target_pairs={pairs}\n", ""
    return ("HloModule overlap, replica_count=4\nENTRY main {\n  x = f32[64,1024] parameter(0)\n"
            "  w = bf16[2048,2048] parameter(1)\n  a = bf16[1024,2048] parameter(2)\n" + send +
            "  d = f32[1024,2048] dot(a, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n" + done +
            "  ROOT t = (f32[64,1024], f32[1024,2048]) tuple(r, d)\n}\n")  # fmt: skip


def test_async_collectives_overlap_compute() -> None:
    """The 256 KiB pushes of collective-permute-start fly while the (longer) matmul between start and done
    runs, so most of the collective's span overlaps compute; a plain collective-permute overlaps nothing."""
    overlapped = {}
    for asynchronous in (False, True):
        result = tpusim.simulate(_permute_and_dot(asynchronous), chips=4, timing_only=True)
        times = collective_time(result)
        assert len(times) == 4 and all(t.cycles > 0 for t in times)
        overlapped[asynchronous] = min(t.overlapped / t.cycles for t in times)
        assert "overlapped compute" in format_links(result)
    assert overlapped[False] == 0.0 and overlapped[True] > 0.5


def _collective_and_dot(kind: str, asynchronous: bool) -> str:
    x, y = "f32[256,1024]", ("f32[1024,1024]" if kind == "all-gather" else "f32[256,1024]")
    attrs = "dimensions={0}" if kind == "all-gather" else "to_apply=sum"
    if asynchronous:
        shape = f"({x}, {y})" if kind == "all-gather" else y
        send = f"  s = {shape} {kind}-start(x), replica_groups={{}}, {attrs}\n"
        done = f"  r = {y} {kind}-done(s)\n"
    else:
        send, done = f"  r = {y} {kind}(x), replica_groups={{}}, {attrs}\n", ""
    return (f"HloModule overlap, replica_count=4\n{SUM}ENTRY main {{\n  x = {x} parameter(0)\n"
            "  w = bf16[2048,2048] parameter(1)\n  a = bf16[1024,2048] parameter(2)\n" + send +
            "  d = f32[1024,2048] dot(a, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n" + done +
            f"  ROOT t = ({y}, f32[1024,2048]) tuple(r, d)\n}}\n")  # fmt: skip


def test_ring_collectives_overlap_the_compute_between_start_and_done() -> None:
    """An async all-reduce or all-gather runs on the core's async sequencer while the matmul between start
    and done runs, so the run is shorter than the synchronous one; the plain collective, which the compiler
    makes such a pair (the matmul does not need it), takes as long as the explicit pair."""
    for kind in ("all-reduce", "all-gather"):
        runs = {a: tpusim.simulate(_collective_and_dot(kind, a), chips=4, config="tpu_v4", timing_only=True,
                                   options=CompileOptions(async_collectives=a))
                for a in (False, True)}  # fmt: skip
        overlap = min(t.overlapped for t in collective_time(runs[True]))
        assert min(t.overlapped for t in collective_time(runs[False])) == 0
        assert overlap > 0, kind
        assert runs[True].cycles < runs[False].cycles, kind
        plain = tpusim.simulate(_collective_and_dot(kind, False), chips=4, config="tpu_v4", timing_only=True)
        assert plain.cycles == runs[True].cycles, kind


def test_command_line_runs_many_chips(tmp_path: Path, capsys: object) -> None:
    text = (f"HloModule ar, replica_count=8\n{SUM}ENTRY main {{\n  x = f32[16,128] parameter(0)\n"
            "  r = f32[16,128] all-reduce(x), replica_groups={}, to_apply=sum\n"
            "  g = f32[128,128] all-gather(x), replica_groups={}, dimensions={0}\n"
            "  ROOT t = (f32[16,128], f32[128,128]) tuple(r, g)\n}\n")  # fmt: skip
    program = tmp_path / "ar.hlo"
    program.write_text(text)
    module = parse_module(text)
    per = random_inputs(module, 5, 8)
    np.savez(tmp_path / "in.npz", arg0=np.stack([d[0] for d in per]))
    out = tmp_path / "out.npz"
    argv = [str(program), "--chips", "8", "--topology", "2x4", "--inputs", str(tmp_path / "in.npz")]
    assert main(["run", *argv, "--check", "--out", str(out)]) == 0
    printed = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "ICI (2x4, 20 directed links):" in printed and "collectives:" in printed and " ok" in printed
    with np.load(out) as data:
        want = evaluate_spmd(module, per)
        for j in range(2):
            np.testing.assert_allclose(data[f"out{j}"], np.stack([w[j] for w in want]), rtol=1e-6, atol=1e-6)
    assert main(["run", *argv[:-2], "--topology", "3x3"]) == 1
    assert "topology 3x3 holds 9 chips, not the 8 chips of the run" in capsys.readouterr().err  # type: ignore[attr-defined]


def test_pushes_to_other_chips_show_as_ici_queues_in_the_report() -> None:
    """A core's local transfers take its ``dma.engines``, its pushes to other chips its ICI queues
    (``ici.pushes_per_link`` per link): the report rebuilds both pools per core (rows ``dma.engineK`` and
    ``dma.iciK``), never more of either than the config has, and every DMA is on exactly one row."""
    chips = 4
    text = (f"HloModule ar, replica_count={chips}\n{SUM}ENTRY main {{\n  x = f32[512,1024] parameter(0)\n"
            f"  ROOT r = f32[512,1024] all-reduce(x), replica_groups={{}}, to_apply=sum\n}}\n")  # fmt: skip
    result = tpusim.simulate(text, chips=chips, config="tpu_v4", timing_only=True)
    a = analyse(result)
    cfg = result.compiled.config
    rows = [u for u in a.units if u["kind"] == "dma_engine"]
    ici = [u for u in rows if ".dma.ici" in u["name"]]
    local = [u for u in rows if ".dma.engine" in u["name"]]
    assert ici and local and not a.notes
    for chip in range(chips):
        assert 0 < sum(u["chip"] == chip for u in ici) <= cfg.ici.links_per_chip * cfg.ici.pushes_per_link
        assert 0 < sum(u["chip"] == chip for u in local) <= cfg.dma.engines
    dmas = next(u for u in a.units if u["kind"] == "dma" and u["chip"] == 0)["instructions"]
    assert sum(u["instructions"] for u in rows if u["chip"] == 0) == dmas
    series = summary_from_analysis(a)["series"]["utilisation"]
    assert all(u["name"] in series for u in rows)
