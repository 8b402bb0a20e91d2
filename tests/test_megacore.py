"""Megacore (issue 15): on v4 and v5p the compiler splits dots and vector blocks between the chip's two
TensorCores, one instruction stream each, with chip barriers where one core reads what the other wrote.

Numerics: the programs of the end-to-end suite (a selection covering dots, fusions, reductions, loops,
branches, gathers and scatters, scalar loop counters) give the reference interpreter's outputs on both
chips. Timing: a large bf16 matmul runs at the chip's peak (both cores), twice as fast as on one core.
Single-core chips, and ``megacore=False``, compile exactly the program they compiled before.
"""

from __future__ import annotations

import os

import pytest
from e2e_support import EXAMPLES_DIR, run_checked
from test_e2e_programs import CASES, built

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference.io import random_inputs
from tpusim.compiler.options import CompileOptions
from tpusim.config import load_config
from tpusim.isa import Barrier, DmaStart
from tpusim.isa.text import print_program

os.environ.setdefault("TPUSIM_VERIFY", "1")

# Programs of the end-to-end suite run on both two-core chips: dots (batched, awkward, int8, f32 passes),
# fusions and reductions, attention and transformer blocks, a training step, loops with scalar counters,
# data-dependent loops and branches, gathers, scatters, dynamic slices and async copies.
MEGACORE_CASES = [
    "example_transformer_block_bf16",
    "example_attention_f32",
    "example_train_step_f32",
    "example_convnet_f32",
    "conv_strided_bf16",
    "convnet_train_step_f32",
    "pooling_windows",
    "matmul_f32_awkward_3x5x7",
    "matmul_int8_to_s32",
    "batched_einsum_bf16",
    "layer_norm_softmax_bf16",
    "while_fori_loop_matmul",
    "while_data_dependent",
    "scan_rnn_bf16",
    "cond_two_branches",
    "switch_three_branches",
    "dynamic_slice_update",
    "awkward_shapes_3x5_1000x1000",
    "gather_embedding",
    "scatter_segment_sum",
    "reductions",
    "hand_async_and_copy_start",
    "hand_names_repeat_in_loop_body_and_entry",
]


def _matmul(n: int, dtype: str = "bf16") -> str:
    return f"""HloModule mm
ENTRY main {{
  a = {dtype}[{n},{n}] parameter(0)
  b = {dtype}[{n},{n}] parameter(1)
  ROOT d = {dtype}[{n},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}"""


# On v4 (16 MiB of VMEM, other block plans) a subset: one of each kind.
V4_CASES = [
    "example_transformer_block_bf16",
    "example_convnet_f32",
    "matmul_int8_to_s32",
    "while_fori_loop_matmul",
    "scan_rnn_bf16",
    "switch_three_branches",
    "scatter_segment_sum",
    "reductions",
]


@pytest.mark.parametrize(
    ("name", "config"), [(n, "tpu_v5p") for n in MEGACORE_CASES] + [(n, "tpu_v4") for n in V4_CASES]
)
def test_megacore_program_matches_reference(name: str, config: str) -> None:
    case = CASES[name]
    module, inputs = built(name)
    run = run_checked(module, inputs, config=config, options=case.options, host=case.host)
    run.assert_ok(f"{name} on {config} with megacore")
    assert len(run.result.compiled.program.streams) == 2


def test_both_cores_share_the_work() -> None:
    """A transformer block: both streams hold MXU and vector work, and barriers order the cores."""
    text = (EXAMPLES_DIR / "transformer_block_bf16.hlo").read_text()
    program = tpusim.compile_program(text, config="tpu_v5p").program
    streams = program.streams
    assert [s.core for s in streams] == [0, 1]
    for s in streams:
        mnemonics = {type(i).__name__ for i in s.instructions}
        assert {"MxuMatmul", "VpuFused", "DmaStart"} <= mnemonics
    barriers = [sum(isinstance(i, Barrier) for i in s.instructions) for s in streams]
    assert barriers[0] == barriers[1] > 0


@pytest.mark.parametrize("config", ["tpu_v5e", "tpu_v6e"])
def test_single_core_chips_compile_the_same_program(config: str) -> None:
    text = (EXAMPLES_DIR / "transformer_block_bf16.hlo").read_text()
    on = tpusim.compile_program(text, config=config, options=CompileOptions(megacore=True)).program
    off = tpusim.compile_program(text, config=config, options=CompileOptions(megacore=False)).program
    assert len(on.streams) == 1
    assert print_program(on) == print_program(off)


def test_megacore_off_runs_one_stream() -> None:
    program = tpusim.compile_program(_matmul(256), config="tpu_v5p", options=CompileOptions(megacore=False)).program
    assert len(program.streams) == 1
    assert not any(isinstance(i, Barrier) for i in program.streams[0].instructions)


def test_matmul_runs_at_the_chips_peak() -> None:
    """2048^3 bf16 on v5p: both cores' MXUs busy, at least 90% of the chip's peak (two cores), and at least
    1.9x the one-core time."""
    cfg = load_config("tpu_v5p")
    n = 2048
    both = tpusim.simulate(_matmul(n), config="tpu_v5p", timing_only=True)
    one = tpusim.simulate(_matmul(n), config="tpu_v5p", timing_only=True, options=CompileOptions(megacore=False))
    peak = cfg.core.count * cfg.mxu.count * cfg.mxu.rows * cfg.mxu.cols * 2 * cfg.clock_hz
    assert 2 * n**3 / both.seconds >= 0.9 * peak
    assert one.cycles / both.cycles >= 1.9


MIXED = """HloModule mixed
argmax {
  av = f32[] parameter(0)
  ai = s32[] parameter(1)
  bv = f32[] parameter(2)
  bi = s32[] parameter(3)
  gt = pred[] compare(av, bv), direction=GE
  v = f32[] select(gt, av, bv)
  i = s32[] select(gt, ai, bi)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
ENTRY main {
  x = f32[1024] parameter(0)
  io = s32[1024] iota(), iota_dimension=0
  ninf = f32[] constant(-inf)
  zero = s32[] constant(0)
  r = (f32[], s32[]) reduce(x, io, ninf, zero), dimensions={0}, to_apply=argmax
  v = f32[] get-tuple-element(r), index=0
  i = s32[] get-tuple-element(r), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  y = f32[64,128] parameter(1)
  b = s32[64,128] broadcast(i1), dimensions={}
  bf = f32[64,128] convert(b)
  vb = f32[64,128] broadcast(v), dimensions={}
  s = f32[64,128] add(y, bf)
  ROOT o = f32[64,128] multiply(s, vb)
}"""


def test_scalar_results_reach_every_core() -> None:
    """An argmax (a variadic reduce, a fallback) writes an f32 scalar to HBM and an s32 one to SMEM: it runs
    on core 0, which pushes the s32 to core 1's SMEM; the scalar unit's add runs on both cores, and the
    split elementwise op that reads both scalars is right on both."""
    module = parse_module(MIXED)
    inputs = random_inputs(module, 3)[0]
    run = run_checked(module, inputs, config="tpu_v5p")
    run.assert_ok("mixed SMEM/HBM results on tpu_v5p")
    streams = run.result.compiled.program.streams
    assert any(isinstance(i, DmaStart) and i.dst_core == 1 for i in streams[0].instructions)


NESTED = """HloModule nested

negate_it {
  a = f32[256,128] parameter(0)
  ROOT n = f32[256,128] negate(a)
}

keep_it {
  a = f32[256,128] parameter(0)
  h = f32[] constant(0.5)
  hb = f32[256,128] broadcast(h), dimensions={}
  ROOT m = f32[256,128] multiply(a, hb)
}

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
inner_body {
  p = (s32[], f32[256,128], f32[128,128]) parameter(0)
  j = s32[] get-tuple-element(p), index=0
  x = f32[256,128] get-tuple-element(p), index=1
  w = f32[128,128] get-tuple-element(p), index=2
  one = s32[] constant(1)
  j1 = s32[] add(j, one)
  d = f32[256,128] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  t = f32[256,128] tanh(d)
  ROOT r = (s32[], f32[256,128], f32[128,128]) tuple(j1, t, w)
}
inner_cond {
  p = (s32[], f32[256,128], f32[128,128]) parameter(0)
  j = s32[] get-tuple-element(p), index=0
  n = s32[] constant(2)
  ROOT lt = pred[] compare(j, n), direction=LT
}
outer_body {
  p = (s32[], f32[256,128], f32[128,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[256,128] get-tuple-element(p), index=1
  w = f32[128,128] get-tuple-element(p), index=2
  zero = s32[] constant(0)
  init = (s32[], f32[256,128], f32[128,128]) tuple(zero, x, w)
  l = (s32[], f32[256,128], f32[128,128]) while(init), condition=inner_cond, body=inner_body
  y = f32[256,128] get-tuple-element(l), index=1
  yt = f32[128,256] transpose(y), dimensions={1,0}
  zf = f32[] constant(0)
  s = f32[128] reduce(yt, zf), dimensions={1}, to_apply=add_f32
  sb = f32[128,128] broadcast(s), dimensions={0}
  eps = f32[] constant(0.001)
  eb = f32[128,128] broadcast(eps), dimensions={}
  se = f32[128,128] multiply(sb, eb)
  w1 = f32[128,128] add(w, se)
  wt = f32[128,128] transpose(w1), dimensions={1,0}
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  c = pred[] compare(i, one), direction=EQ
  y2 = f32[256,128] conditional(c, y, x), true_computation=negate_it, false_computation=keep_it
  ROOT r = (s32[], f32[256,128], f32[128,128]) tuple(i1, y2, wt)
}
outer_cond {
  p = (s32[], f32[256,128], f32[128,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}
ENTRY main {
  x = f32[256,128] parameter(0)
  w = f32[128,128] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], f32[256,128], f32[128,128]) tuple(zero, x, w)
  l = (s32[], f32[256,128], f32[128,128]) while(init), condition=outer_cond, body=outer_body
  ROOT out = f32[256,128] get-tuple-element(l), index=1
}"""


@pytest.mark.parametrize("config", ["tpu_v5p", "tpu_v4"])
def test_nested_loops_and_branches(config: str) -> None:
    """Split dots, elementwise ops and row reductions in a loop inside a loop, a conditional, transposes on
    one core: right on both cores (f32 at HIGHEST precision, so the reference's bound is tight)."""
    module = parse_module(NESTED)
    inputs = random_inputs(module, 5)[0]
    run = run_checked(module, inputs, config=config, options=CompileOptions(matmul_precision="highest"))
    run.assert_ok(f"nested loops on {config}")
    assert len(run.result.compiled.program.streams) == 2


REDUCTIONS = """HloModule fullred
add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
add_s32 {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT s = s32[] add(a, b)
}
max_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] maximum(a, b)
}
ENTRY main {
  x = f32[2048,1024] parameter(0)
  i = s32[1536,1024] parameter(1)
  init = f32[] constant(2.5)
  s = f32[] reduce(x, init), dimensions={0,1}, to_apply=add_f32
  n = f32[] constant(2097152)
  mean = f32[] divide(s, n)
  sevens = s32[] constant(7)
  si = s32[] reduce(i, sevens), dimensions={0,1}, to_apply=add_s32
  big = f32[] constant(3)
  m = f32[] reduce(x, big), dimensions={0,1}, to_apply=max_f32
  cols = f32[1024] reduce(x, init), dimensions={0}, to_apply=add_f32
  ROOT t = (f32[], f32[], s32[], f32[], f32[1024]) tuple(s, mean, si, m, cols)
}"""

COLUMN_SUMS = """HloModule cols
add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[2048,1024] parameter(0)
  init = f32[] constant(2.5)
  ROOT cols = f32[1024] reduce(x, init), dimensions={0}, to_apply=add_f32
}"""


@pytest.mark.parametrize("config", ["tpu_v5p", "tpu_v4"])
@pytest.mark.parametrize("text", [REDUCTIONS, COLUMN_SUMS], ids=["full_reductions", "column_sums"])
def test_reductions(text: str, config: str) -> None:
    """Full sums (init 2.5, a mean, an exact s32 sum with init 7, a max): each core reduces its share of
    the operand's blocks, core 0 adds the others' partial results and the init value once. Column sums on
    v4 (16 MiB of VMEM): every core plans the same blocks (an empty share once planned bigger ones)."""
    module = parse_module(text)
    run = run_checked(module, random_inputs(module, 11)[0], config=config)
    run.assert_ok(f"reductions on {config}")


def test_full_sum_splits_across_cores() -> None:
    """An f32 sum of 4096 x 4096 on v5p: both cores stream half the operand, at the chip's HBM floor (the
    cores share its HBM; one core alone reaches it too since a row's registers are added on the ALUs before
    one cross-lane reduction, so the split buys nothing here but must not cost much either)."""
    text = (
        REDUCTIONS.split("ENTRY")[0]
        + """ENTRY main {
  x = f32[4096,4096] parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[] reduce(x, z), dimensions={0,1}, to_apply=add_f32
}"""
    )
    both = tpusim.simulate(text, config="tpu_v5p", timing_only=True)
    one = tpusim.simulate(text, config="tpu_v5p", timing_only=True, options=CompileOptions(megacore=False))
    streams = both.compiled.program.streams
    assert all(any(isinstance(i, Barrier) for i in s.instructions) for s in streams)
    cfg = load_config("tpu_v5p")
    floor = 4096 * 4096 * 4 / cfg.hbm_bytes_per_cycle
    assert both.cycles <= 1.10 * floor and both.cycles <= 1.05 * one.cycles, (both.cycles, one.cycles, floor)


def test_cores_that_plan_differently_run_the_instruction_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """If the cores' passes split different numbers of pieces (a VMEM plan that fits one share and not
    another), their shares would not tile the work: the instruction then runs whole on one core."""
    from tpusim.compiler.lowering.context import Lowering

    split = Lowering.split

    def skewed(self: Lowering, items: int) -> range:
        got = split(self, items)
        if self.share is not None and self.share[0] == 1:
            self.split_log.append(-1)  # core 1 planned something core 0 did not
        return got

    monkeypatch.setattr(Lowering, "split", skewed)
    text = """HloModule one
ENTRY main {
  x = f32[256,128] parameter(0)
  ROOT t = f32[256,128] tanh(x)
}"""
    module = parse_module(text)
    run = run_checked(module, random_inputs(module, 1)[0], config="tpu_v5p")
    run.assert_ok("a skewed split on tpu_v5p")
    working = [s for s in run.result.compiled.program.streams if any(isinstance(i, DmaStart) for i in s.instructions)]
    assert len(working) == 1


def test_a_blocking_taken_back_is_not_part_of_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule that tries a blocking, runs out of VMEM and retries with smaller blocks logged both attempts,
    so a core that retried (its VMEM held something the other's did not) disagreed with one that did not,
    and the instruction ran whole on one core: the d1024 decoder's attention softmax on v5p (430 us on one
    core, the whole decoder 1,297 us instead of 1,122). Rolling back takes the attempt out of the log."""
    from tpusim.compiler.lowering.context import Lowering

    logs: list[tuple[list[int], list[int]]] = []
    split = Lowering.split

    def try_first(self: Lowering, items: int) -> range:
        if self.share is not None and not logs:  # an attempt taken back, inside a real lowering
            before = list(self.split_log)
            mark = self.checkpoint()
            split(self, items + 8)
            self.rollback(mark)
            logs.append((before, list(self.split_log)))
        return split(self, items)

    monkeypatch.setattr(Lowering, "split", try_first)
    text = "HloModule t\nENTRY main {\n  x = f32[256,128] parameter(0)\n  ROOT t = f32[256,128] tanh(x)\n}"
    compiled = tpusim.compile_program(text, config="tpu_v5p")
    assert logs and logs[0][0] == logs[0][1]
    assert all(any(i.hlo == "t" for i in s.instructions) for s in compiled.program.streams)  # split, both cores
