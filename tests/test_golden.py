"""Golden snapshots: for a few small programs, the compiled instruction stream, every executed instruction's
issue/start/end cycles, and each unit's totals, compared with the text stored in ``tests/golden/<name>.txt``.

A snapshot fails on ANY change to what the compiler emits or to when the device model runs it, so that
changes of timing are always seen and reviewed, never silent. After a deliberate change (a new lowering, a
corrected timing rule), rewrite the snapshots and review the difference like code:

    TPUSIM_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py -q
    git diff tests/golden/          # check every changed line is the change you meant
    git add tests/golden/ && git commit -m "golden: <why the stream or the cycles changed>"

The programs are hand-written HLO (not JAX output), so that a JAX upgrade cannot move them; each run's outputs
are also checked against the reference interpreter, so a snapshot always records a correct run.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
from e2e_support import run_checked

from tpusim.api import SimulationResult
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference.io import random_inputs
from tpusim.isa.text import print_program
from tpusim.report.stats import unit_stats

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("TPUSIM_UPDATE_GOLDEN") == "1"

PROGRAMS: dict[str, tuple[str, str]] = {
    "teaching_matmul_relu": (
        "teaching",
        """HloModule matmul_relu
ENTRY main {
  x = bf16[16,16] parameter(0)
  y = bf16[16,16] parameter(1)
  d = f32[16,16] dot(x, y), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  z = f32[] constant(0)
  zb = f32[16,16] broadcast(z), dimensions={}
  ROOT r = f32[16,16] maximum(d, zb)
}""",
    ),
    "teaching_softmax_rows": (
        "teaching",
        """HloModule softmax_rows
max_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[8,16] parameter(0)
  ninf = f32[] constant(-inf)
  m = f32[8] reduce(x, ninf), dimensions={1}, to_apply=max_f32
  mb = f32[8,16] broadcast(m), dimensions={0}
  c = f32[8,16] subtract(x, mb)
  e = f32[8,16] exponential(c)
  zero = f32[] constant(0)
  s = f32[8] reduce(e, zero), dimensions={1}, to_apply=add_f32
  sb = f32[8,16] broadcast(s), dimensions={0}
  ROOT p = f32[8,16] divide(e, sb)
}""",
    ),
    "v5e_fused_elementwise": (
        "tpu_v5e",
        """HloModule fused_elementwise
ENTRY main {
  x = f32[16,256] parameter(0)
  y = f32[16,256] parameter(1)
  e = f32[16,256] exponential(x)
  m = f32[16,256] multiply(e, y)
  one = f32[] constant(1)
  ob = f32[16,256] broadcast(one), dimensions={}
  ROOT r = f32[16,256] add(m, ob)
}""",
    ),
    "v5e_while_loop": (
        "tpu_v5e",
        """HloModule while_loop
body {
  p = (s32[], f32[8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  acc = f32[8,128] get-tuple-element(p), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  half = f32[] constant(0.5)
  hb = f32[8,128] broadcast(half), dimensions={}
  scaled = f32[8,128] multiply(acc, hb)
  acc1 = f32[8,128] add(scaled, hb)
  ROOT t = (s32[], f32[8,128]) tuple(i1, acc1)
}
cond {
  p = (s32[], f32[8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}
ENTRY main {
  x = f32[8,128] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[8,128]) tuple(zero, x)
  w = (s32[], f32[8,128]) while(init), condition=cond, body=body
  ROOT out = f32[8,128] get-tuple-element(w), index=1
}""",
    ),
    "v5p_megacore_loop": (
        "tpu_v5p",
        """HloModule megacore_loop
body {
  p = (s32[], bf16[256,128], bf16[128,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = bf16[256,128] get-tuple-element(p), index=1
  w = bf16[128,128] get-tuple-element(p), index=2
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  d = bf16[256,128] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  t = bf16[256,128] tanh(d)
  ROOT r = (s32[], bf16[256,128], bf16[128,128]) tuple(i1, t, w)
}
cond {
  p = (s32[], bf16[256,128], bf16[128,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(2)
  ROOT lt = pred[] compare(i, n), direction=LT
}
ENTRY main {
  x = bf16[256,128] parameter(0)
  w = bf16[128,128] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], bf16[256,128], bf16[128,128]) tuple(zero, x, w)
  l = (s32[], bf16[256,128], bf16[128,128]) while(init), condition=cond, body=body
  ROOT out = bf16[256,128] get-tuple-element(l), index=1
}""",
    ),
    "teaching_sort_fallback": (
        "teaching",
        """HloModule sort_fallback
less {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT
}
ENTRY main {
  x = f32[4,16] parameter(0)
  ROOT s = f32[4,16] sort(x), dimensions={1}, to_apply=less
}""",
    ),
}
"""Snapshot name -> (chip config, HLO text)."""


def snapshot(name: str, config: str, result: SimulationResult) -> str:
    """The text stored for one run: header, instruction stream, per-instruction timeline, per-unit totals."""
    trace = result.trace
    lines = [
        f"# golden snapshot {name} on {config} (tests/test_golden.py; to update after a deliberate change:",
        "#   TPUSIM_UPDATE_GOLDEN=1 pytest tests/test_golden.py, then review `git diff tests/golden/`)",
        f"# {result.cycles} cycles, {result.instructions} instructions executed",
        "",
        "== instruction stream",
        print_program(result.compiled.program).rstrip(),
        "",
        "== timeline: issue start end unit  instruction (one line per executed instruction)",
    ]
    for k in range(len(trace.start)):
        stream = trace.streams[int(trace.stream[k])]
        text = stream.text[int(trace.index[k])]
        lines.append(
            f"{int(trace.issue[k]):7d} {int(trace.start[k]):7d} {int(trace.end[k]):7d} "
            f"{trace.units[int(trace.unit[k])].split('.')[-1]:9} {text}"
        )
    lines += ["", "== units: instructions busy_cycles bytes flops"]
    for u in unit_stats(trace):
        if u.instructions:
            lines.append(f"{u.name:24} {u.instructions:5d} {u.busy_cycles:8d} {u.bytes:9d} {u.flops:9d}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_golden_snapshot(name: str) -> None:
    config, text = PROGRAMS[name]
    module = parse_module(text)
    run = run_checked(module, random_inputs(module, 0)[0], config=config)
    run.assert_ok(name)
    got = snapshot(name, config, run.result)
    path = GOLDEN_DIR / f"{name}.txt"
    if UPDATE:
        GOLDEN_DIR.mkdir(exist_ok=True)
        path.write_text(got)
        return
    assert path.exists(), f"no snapshot {path}: create it with TPUSIM_UPDATE_GOLDEN=1 pytest tests/test_golden.py"
    want = path.read_text()
    if got != want:
        diff = "".join(
            list(difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(path), "this run", n=1))[:60]
        )
        pytest.fail(
            f"{name}: the instruction stream or its cycles changed. If the change is deliberate, rewrite the "
            f"snapshots with TPUSIM_UPDATE_GOLDEN=1 pytest tests/test_golden.py and review `git diff tests/golden/`."
            f"\n{diff}",
            pytrace=False,
        )


def test_snapshot_names_what_changed() -> None:
    """A changed cycle count shows up as a changed line of the snapshot (the failure message is a diff)."""
    config, text = PROGRAMS["v5e_fused_elementwise"]
    module = parse_module(text)
    result = run_checked(module, random_inputs(module, 0)[0], config=config).result
    slower = run_checked(
        module, random_inputs(module, 0)[0], config=config, overrides=("hbm.bandwidth_bytes_per_s=4e11",)
    ).result
    a, b = snapshot("x", config, result), snapshot("x", config, slower)
    stream_a, timeline_a = a.split("== timeline")
    stream_b, timeline_b = b.split("== timeline")
    assert stream_a.splitlines()[3:] == stream_b.splitlines()[3:]  # the same instructions (header lines aside)
    assert timeline_a != timeline_b  # but a slower HBM moves their cycles
    assert slower.cycles > result.cycles
