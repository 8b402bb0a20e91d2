"""Reductions on the VPU when the reduced dimension does not fit one VMEM block: the blocks cut a reduced
dimension and ``vpu.reduce`` accumulates (tpusim/compiler/blocks.py, elementwise.py). Checked
against the reference interpreter and JAX on the teaching chip (a 64 KiB VMEM: every array here is many
blocks) and on tpu_v5e.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from e2e_support import run_checked

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference.io import random_inputs
from tpusim.isa import VpuReduce

COMBINERS = """add_c {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
max_c {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] maximum(a, b)
}
"""


def reduce_module(shape: str, out: str, dims: str, combiner: str = "add_c", init: str = "0") -> str:
    return (
        f"HloModule r\n{COMBINERS}ENTRY main {{\n  p = {shape} parameter(0)\n  z = f32[] constant({init})\n"
        f"  ROOT r = {out} reduce(p, z), dimensions={{{dims}}}, to_apply={combiner}\n}}"
    )


CASES = {
    "full_sum": reduce_module("f32[256,256]", "f32[]", "0,1"),
    "column_sums": reduce_module("f32[256,256]", "f32[256]", "0"),
    "row_sums": reduce_module("f32[256,256]", "f32[256]", "1"),
    "column_max": reduce_module("f32[200,300]", "f32[300]", "0", "max_c", "-inf"),
    "full_sum_with_init": reduce_module("f32[200,300]", "f32[]", "0,1", init="2.5"),
    "outer_and_lanes": reduce_module("f32[16,40,24]", "f32[40]", "0,2"),
}


def reduces(result: tpusim.api.SimulationResult) -> list[VpuReduce]:
    return [i for i in result.compiled.program.streams[0].instructions if isinstance(i, VpuReduce)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_teaching_chip_blocks_match_reference(name: str) -> None:
    m = parse_module(CASES[name])
    checked = run_checked(m, random_inputs(m, 4)[0], config="teaching")
    checked.assert_ok(name)
    assert not checked.result.fallbacks, checked.result.fallbacks
    assert len(reduces(checked.result)) > 1  # many blocks


def test_full_sum_accumulates_over_blocks_of_the_reduced_dimension() -> None:
    m = parse_module(CASES["full_sum"])
    checked = run_checked(m, random_inputs(m, 4)[0], config="teaching")
    ops = reduces(checked.result)
    assert not ops[0].accumulate and all(op.accumulate for op in ops[1:])
    assert all(op.dst.dims == () for op in ops)


def test_init_value_is_applied_once() -> None:
    """A non-identity init (2.5) is combined after the first block only, not once per block."""
    m = parse_module(CASES["full_sum_with_init"])
    x = np.zeros((200, 300), np.float32)
    result = tpusim.simulate(m, [x], config="teaching")
    assert float(result.outputs[0]) == 2.5


def test_big_full_sum_on_v5e_streams_at_hbm_speed() -> None:
    """A 16 MiB f32 sum is too big for one 512 KiB-ish block: it streams in blocks that accumulate, at
    least 70% of HBM bandwidth (measured 0.80 when written; 0.85 for 4096 x 4096)."""
    m = parse_module(reduce_module("f32[2048,2048]", "f32[]", "0,1"))
    result = tpusim.simulate(m, config="tpu_v5e", timing_only=True)
    assert not result.fallbacks
    assert len(reduces(result)) > 1
    cfg = result.compiled.config
    assert 2048 * 2048 * 4 / result.cycles / cfg.hbm_bytes_per_cycle >= 0.7


@pytest.mark.parametrize("chip", ["teaching", "tpu_v5e"])
def test_jax_reductions(chip: str) -> None:
    """jnp.sum, a column sum and jnp.mean (the divide runs after the last block) against JAX."""
    x = np.random.default_rng(3).standard_normal((384, 256)).astype(np.float32)

    def f(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        return jnp.sum(x), x.sum(axis=0), jnp.mean(x * x)

    result = tpusim.simulate_jax(f, x, config=chip)
    assert not result.fallbacks, result.fallbacks
    for got, want in zip(result.outputs, jax.jit(f)(x)):
        want = np.asarray(want)
        assert np.max(np.abs(got - want)) <= 1e-5 * max(1.0, float(np.max(np.abs(want))))


PRED_COMBINERS = {
    # XLA's pred arithmetic is logic: add and maximum are or, multiply and minimum are and
    "add": np.logical_or,
    "maximum": np.logical_or,
    "or": np.logical_or,
    "multiply": np.logical_and,
    "minimum": np.logical_and,
    "and": np.logical_and,
    "xor": np.logical_xor,
}


@pytest.mark.parametrize("init", [False, True])
@pytest.mark.parametrize("op", sorted(PRED_COMBINERS))
def test_pred_reductions_are_logic_across_accumulated_blocks(op: str, init: bool) -> None:
    """A pred reduce on the VPU, cut into blocks that accumulate on the teaching chip, combines as XLA does,
    with an init value that is the combiner's identity (skipped) or not (applied once)."""
    text = (
        f"HloModule r\nc {{\n  a = pred[] parameter(0)\n  b = pred[] parameter(1)\n  ROOT c = pred[] {op}(a, b)\n}}\n"
        f"ENTRY main {{\n  p = pred[64,1024] parameter(0)\n  z = pred[] constant({str(init).lower()})\n"
        "  ROOT r = pred[64] reduce(p, z), dimensions={1}, to_apply=c\n}"
    )
    rng = np.random.default_rng(5)
    x = rng.random((64, 1024)) < 0.999  # rows of all-true and rows with a few false ones, for and/or
    x[::3] = True
    x[1::3] = rng.random((len(x[1::3]), 1024)) < 0.001
    result = tpusim.simulate(parse_module(text), [x], config="teaching")
    assert len(reduces(result)) > 1 and not result.fallbacks
    combine = PRED_COMBINERS[op]
    np.testing.assert_array_equal(result.outputs[0], combine(init, combine.reduce(x, axis=1)))


@pytest.mark.parametrize("combiner", sorted(PRED_COMBINERS))
@pytest.mark.parametrize("t", ["s4", "u4"])
def test_narrow_integer_reductions_wrap_like_the_reference(t: str, combiner: str) -> None:
    """s4/u4 reductions accumulate in 32 bits and keep the low bits (sums wrap), as the reference computes;
    they once summed in f32 and saturated, or failed in numpy for and/or/xor."""
    low, high = (-8, 7) if t == "s4" else (0, 15)
    init = {"maximum": low, "minimum": high, "multiply": 1, "and": -1 if t == "s4" else 15}.get(combiner, 0)
    text = (
        f"HloModule r\nc {{\n  a = {t}[] parameter(0)\n  b = {t}[] parameter(1)\n"
        f"  ROOT c = {t}[] {combiner}(a, b)\n}}\n"
        f"ENTRY main {{\n  p = {t}[16,300] parameter(0)\n  z = {t}[] constant({init})\n"
        f"  ROOT r = {t}[16] reduce(p, z), dimensions={{1}}, to_apply=c\n}}"
    )
    m = parse_module(text)
    checked = run_checked(m, random_inputs(m, 7)[0], config="teaching")
    checked.assert_ok(f"{t} {combiner}")
    assert not checked.result.fallbacks, checked.result.fallbacks


@pytest.mark.parametrize("chip", ["teaching", "tpu_v5e"])
def test_denormals_flush_in_device_sums_as_in_the_reference(chip: str) -> None:
    """vpu.reduce reads denormal operands as zero and flushes a denormal result, as the VPU's maps do."""
    m = parse_module(CASES["row_sums"])
    x = np.random.default_rng(3).standard_normal((256, 256)).astype(np.float32)
    x[:, ::2] = np.float32(1e-40)
    x[7] = 0
    x[7, :3] = [1e-40, 1e-40, -1e-41]
    checked = run_checked(m, [x], config=chip)
    checked.assert_ok(f"denormal row sums on {chip}")
    assert checked.result.outputs[0][7] == 0


def test_a_softmax_whose_rows_of_one_batch_element_overflow_vmem_runs_row_by_row() -> None:
    """Attention scores [batch, heads, queries, keys]: when one index of the blocked (most major) dimension is
    already more than an instruction's VMEM (here one batch element is 8 x 64 x 64 f32 = 128 KiB on the
    teaching chip's 64 KiB), the fusion runs once per index, each blocked along the next dimension, instead
    of falling back."""
    softmax = lambda s: jax.nn.softmax(s.astype(jnp.float32), -1)  # noqa: E731
    x = np.random.default_rng(0).standard_normal((2, 8, 64, 64)).astype(np.float32)
    module = parse_module(jax.jit(softmax).lower(x).as_text(dialect="hlo"))
    checked = run_checked(module, [x], config="teaching")
    checked.assert_ok("softmax")
    assert not checked.result.fallbacks


def test_rows_of_an_outer_split_are_not_split_again_while_the_instruction_can_have_more_vmem() -> None:
    """The d1024 decoder's causal softmax over bf16 [8,16,1024,1024] scores, on v5e with 48 MiB of VMEM: a
    batch element does not fit the instruction's half of VMEM, so it runs once per batch element. Its heads
    did not fit the half either, and each row was split again, one head at a time: blocks of one index of
    two dimensions, nothing in flight while a head computes (57.8% of HBM's bandwidth). With all of the VMEM
    (the instruction's scope widens before a row is split again) each batch element pipelines its heads."""
    text = _attention_softmax()
    result = tpusim.simulate(text, config="tpu_v5e", timing_only=True, overrides=("vmem.bytes=50331648",))
    floor = 2 * 8 * 16 * 1024 * 1024 * 2 / result.compiled.config.hbm_bytes_per_cycle  # read and write once
    assert result.cycles <= floor / 0.95, (result.cycles, floor)


def _attention_softmax() -> str:
    return """HloModule softmax
mx {
  a = bf16[] parameter(0)
  b = bf16[] parameter(1)
  ROOT m = bf16[] maximum(a, b)
}
ad {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] add(a, b)
}
ENTRY main {
  s = bf16[8,16,1024,1024] parameter(0)
  i = s32[1024] iota(), iota_dimension=0
  r = s32[1024,1024] broadcast(i), dimensions={0}
  q = s32[1024,1024] broadcast(i), dimensions={1}
  k = pred[1024,1024] compare(r, q), direction=GE
  kb = pred[8,16,1024,1024] broadcast(k), dimensions={2,3}
  ninf = bf16[] constant(-inf)
  nb = bf16[8,16,1024,1024] broadcast(ninf), dimensions={}
  w = bf16[8,16,1024,1024] select(kb, s, nb)
  m = bf16[8,16,1024] reduce(w, ninf), dimensions={3}, to_apply=mx
  mb = bf16[8,16,1024,1024] broadcast(m), dimensions={0,1,2}
  d = bf16[8,16,1024,1024] subtract(w, mb)
  e = bf16[8,16,1024,1024] exponential(d)
  ef = f32[8,16,1024,1024] convert(e)
  z = f32[] constant(0)
  t = f32[8,16,1024] reduce(ef, z), dimensions={3}, to_apply=ad
  tb = bf16[8,16,1024] convert(t)
  sb = bf16[8,16,1024,1024] broadcast(tb), dimensions={0,1,2}
  ROOT o = bf16[8,16,1024,1024] divide(e, sb)
}"""
