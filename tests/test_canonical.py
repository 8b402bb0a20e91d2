"""XLA:TPU's compiled forms rewritten as plain HLO (tpusim/compiler/canonical.py): each rewrite keeps the
module's values (the reference interpreter gives the same outputs before and after) and leaves the form the
lowerings know."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

import tpusim
from tpusim.compiler.canonical import canonicalize, concat_bitcasts, flatten_fusions, fused_bitcasts
from tpusim.compiler.hlo import parse_module, print_module
from tpusim.compiler.hlo.ir import Module
from tpusim.compiler.hlo.reference import evaluate, evaluate_spmd
from tpusim.compiler.hlo.xla_forms import estimated_cycles

RNG = np.random.default_rng(0)

_SLICE = "((f32[512,256]{1,0:T(8,128)}), f32[128,256]{1,0:T(8,128)S(1)}, s32[]{:S(2)})"
PREFETCH = f"""
HloModule prefetch, is_scheduled=true
ENTRY main {{
  w = f32[512,256]{{1,0:T(8,128)}} parameter(0)
  x = f32[8,512]{{1,0:T(8,128)}} parameter(1)
  s1 = {_SLICE} slice-start(w), slice={{[128:256], [0:256]}}
  s2 = {_SLICE} slice-start(w), slice={{[256:384], [0:256]}}
  s3 = {_SLICE} slice-start(w), slice={{[384:512], [0:256]}}
  s0 = {_SLICE} slice-start(w), slice={{[0:128], [0:256]}}
  e = f32[8,512]{{1,0:T(8,128)}} exponential(x)
  d1 = f32[128,256]{{1,0:T(8,128)S(1)}} slice-done(s1)
  d2 = f32[128,256]{{1,0:T(8,128)S(1)}} slice-done(s2)
  d3 = f32[128,256]{{1,0:T(8,128)S(1)}} slice-done(s3)
  d0 = f32[128,256]{{1,0:T(8,128)S(1)}} slice-done(s0)
  c = f32[512,256]{{1,0:T(8,128)S(1)}} custom-call(d1, d2, d3, d0), custom_call_target="ConcatBitcast"
  ROOT y = f32[8,256]{{1,0:T(8,128)}} dot(e, c), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
"""


def _same_values(before: Module, after: Module) -> None:
    xs = [RNG.standard_normal(p.shape.dimensions).astype(np.float32) for p in before.entry_computation.parameters]
    for a, b in zip(evaluate(before, xs), evaluate(after, xs)):
        np.testing.assert_array_equal(a, b)


def test_slices_concatenated_by_a_concat_bitcast_become_one_async_slice_of_their_range() -> None:
    """XLA:TPU prefetches a weight as row slices in any order and reassembles them with ConcatBitcast; the group
    becomes one async slice, started where the first slice was and waited for where the ConcatBitcast was."""
    before = parse_module(PREFETCH)
    after = concat_bitcasts(before)
    _same_values(before, after)
    ops = [(i.name, i.opcode) for i in after.entry_computation.instructions]
    assert ("c", "async-done") in ops and [n for n, o in ops if o == "async-start"] == ["s1"]
    names = [n for n, _ in ops]
    assert names.index("s1") < names.index("e") < names.index("c")  # the exponential overlaps the prefetch
    start = after.entry_computation["s1"]
    assert [(r.start, r.limit) for r in start.attr("slice")] == [(0, 512), (0, 256)]


def test_a_concat_bitcast_of_other_values_is_a_concatenate_in_result_order() -> None:
    text = PREFETCH.replace(
        "c = f32[512,256]{1,0:T(8,128)S(1)} custom-call(d1, d2, d3, d0)",
        "c = f32[512,256]{1,0:T(8,128)S(1)} custom-call(d1, d2, d3, n0)",
    )
    text = text.replace(
        "  d0 = f32[128,256]{1,0:T(8,128)S(1)} slice-done(s0)\n",
        "  d0 = f32[128,256]{1,0:T(8,128)S(1)} slice-done(s0)\n  n0 = f32[128,256]{1,0:T(8,128)S(1)} negate(d0)\n",
    )
    before = parse_module(text)
    after = concat_bitcasts(before)
    _same_values(before, after)
    concat = after.entry_computation["c"]
    assert concat.opcode == "concatenate" and concat.operands == ("d1", "d2", "d3", "n0")


NESTED = """
HloModule nested
inner {
  p = bf16[64,256]{1,0:T(8,128)(2,1)} parameter(0)
  ROOT b = bf16[64,256,1]{1,0,2:T(8,128)(2,1)} bitcast(p)
}
outer {
  q = bf16[64,256]{1,0:T(8,128)(2,1)} parameter(0)
  f = bf16[64,256,1]{1,0,2:T(8,128)(2,1)} fusion(q), kind=kLoop, calls=inner
  ROOT n = bf16[64,256,1]{1,0,2:T(8,128)(2,1)} negate(f)
}
ENTRY main {
  x = bf16[64,256]{1,0:T(8,128)(2,1)} parameter(0)
  ROOT y = bf16[64,256,1]{1,0,2:T(8,128)(2,1)} fusion(x), kind=kLoop, calls=outer
}
"""


def test_fusions_nested_in_fused_computations_are_inlined() -> None:
    before = parse_module(NESTED)
    after = flatten_fusions(before)
    assert [c.name for c in after.computations] == ["outer", "main"]
    assert "fusion" not in {i.opcode for i in after["outer"].instructions}
    xs = [
        RNG.standard_normal((64, 256))
        .astype(np.float32)
        .astype(before.entry_computation.parameters[0].shape.element_type.dtype)
    ]
    np.testing.assert_array_equal(evaluate(before, xs)[0], evaluate(after, xs)[0])


@pytest.mark.parametrize(
    ("source", "result"),
    [
        ("f32[256,128]{0,1:T(8,128)}", "f32[128,256]{1,0:T(8,128)}"),  # a transpose that moves no byte
        ("f32[64,256]{1,0:T(8,128)}", "f32[64,256,1]{1,0,2:T(8,128)}"),  # a unit dimension, physically major
        ("f32[4,64,256]{2,1,0:T(8,128)}", "f32[256,4,64]{0,2,1:T(8,128)}"),  # XLA:TPU's head splits and merges
    ],
)
def test_bitcasts_in_fusions_become_the_moves_their_layouts_mean(source: str, result: str) -> None:
    text = f"""HloModule b
fused {{
  p = {source} parameter(0)
  ROOT b = {result} bitcast(p)
}}
ENTRY main {{
  x = {source} parameter(0)
  ROOT y = {result} fusion(x), kind=kLoop, calls=fused
}}
"""
    before = parse_module(text)
    after = fused_bitcasts(before)
    assert "bitcast" not in {i.opcode for i in after["fused"].instructions}
    _same_values(before, after)
    assert after["fused"].root_instruction.shape == before["fused"].root_instruction.shape


def test_a_window_holding_whole_rows_is_a_reduce_and_a_broadcast() -> None:
    text = """HloModule w
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
ENTRY main {
  x = f32[16,256]{1,0:T(8,128)} parameter(0)
  inf = f32[] constant(-inf)
  ROOT r = f32[16,256]{1,0:T(8,128)} reduce-window(x, inf), window={size=1x511 pad=0_0x255_255}, to_apply=max
}
"""
    before = parse_module(text)
    after = canonicalize(before)
    assert [i.opcode for i in after.entry_computation.instructions][-2:] == ["reduce", "broadcast"]
    _same_values(before, after)


# ------------------------------------------------------------------------------------- async collective fusions
ASYNC_DATA = Path(__file__).parent / "data" / "xla_async_collective"  # scripts/make_xla_async_collective.py


def _async_collective_module() -> str:
    return gzip.decompress((ASYNC_DATA / "module.hlo.gz").read_bytes()).decode()


def _async_collective_inputs() -> tuple[list[list[np.ndarray]], list[np.ndarray]]:
    """Per-chip shards of the seeded global inputs (rows split over 8 chips), and JAX's outputs."""
    rng = np.random.default_rng(0)
    whole = [(rng.standard_normal(s) / 4).astype(np.float32) for s in ((64, 128), (128, 32), (64, 64))]
    per = [[a[c * (a.shape[0] // 8) : (c + 1) * (a.shape[0] // 8)] for a in whole] for c in range(8)]
    with np.load(ASYNC_DATA / "outputs.npz") as f:
        return per, [f["out0"], f["out1"]]


def test_an_async_collective_fusion_becomes_one_collective_at_its_start() -> None:
    module = parse_module(_async_collective_module())

    def copies(m: Module) -> int:  # the all-gathers of the async one's channel (XLA reuses other channel ids)
        return sum(i.attr("channel_id") == channel for c in m.computations for i in c.instructions)

    (channel,) = [
        c[c.root].operands and c[c[c.root].operands[0]].attr("channel_id")
        for c in module.computations
        if "AsyncCollectiveStart" in str(c[c.root].attributes)
    ]
    assert copies(module) == 3  # at the start, in the continuation and in the done
    flat = canonicalize(module)
    text = print_module(flat)
    assert "AsyncCollectiveStart" not in text and "AsyncCollectiveDone" not in text
    assert copies(flat) == 1  # it runs once, at the start


def test_xlas_fsdp_step_with_an_async_collective_fusion_gives_jaxs_answer() -> None:
    """The reference interpreter on XLA:TPU's module and tpusim's 8 simulated chips, against JAX (every chip
    returns the whole updated weights: XLA partitioned the step without the outputs' shardings)."""
    per, want = _async_collective_inputs()
    module = parse_module(_async_collective_module())
    reference = evaluate_spmd(module, per, num_devices=8)
    stacked = [np.stack([chip[i] for chip in per]) for i in range(3)]
    result = tpusim.simulate(module, stacked, chips=8, topology=(2, 4), config="tpu_v5e")
    for j in range(2):
        for chip in range(8):
            np.testing.assert_allclose(np.asarray(reference[chip][j]), want[j], rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(np.asarray(result.outputs[j][chip]), want[j], rtol=1e-4, atol=1e-4)


_S8, _S64 = "s32[8]{0:T(128)}", "s32[64]{0:T(128)}"
_SC = 'async_execution_thread="sparsecore"'
SPARSECORE = f"""
HloModule bincount, is_scheduled=true
region (a: s32[], b: s32[]) -> s32[] {{
  a = s32[]{{:T(128)S(7)}} parameter(0)
  b = s32[]{{:T(128)S(7)}} parameter(1)
  ROOT s = s32[]{{:T(128)S(7)}} add(a, b)
}}, execution_thread="sparsecore"

scatter_kernel (p0: s32[8], p1: s32[64], p2: s32[64]) -> s32[8] {{
  p0 = {_S8} parameter(0)
  p1 = {_S64} parameter(1)
  p2 = {_S64} parameter(2)
  ROOT sc = {_S8} scatter(p0, p1, p2), update_window_dims={{}}, inserted_window_dims={{0}},
    scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=region
}}, execution_thread="sparsecore"

inner (q0: s32[8], q1: s32[64], q2: s32[64]) -> s32[8] {{
  q0 = {_S8} parameter(0)
  q1 = {_S64} parameter(1)
  q2 = {_S64} parameter(2)
  ROOT f = {_S8} fusion(q0, q1, q2), kind=kCustom, calls=scatter_kernel,
    backend_config={{"window_config":{{"estimated_cycles":"9223372036854775807"}}}}
}}, execution_thread="sparsecore"

outer (r0: s32[8], r1: s32[64], r2: s32[64], r3: token[]) -> s32[8] {{
  r0 = {_S8} parameter(0)
  r1 = {_S64} parameter(1)
  r2 = {_S64} parameter(2)
  r3 = token[] parameter(3)
  cs = (({_S8}, {_S64}, {_S64}), {_S8}, u32[]{{:S(8)}}) call-start(r0, r1, r2), {_SC}, to_apply=inner
  ROOT cd = {_S8} call-done(cs)
}}, execution_thread="sparsecore"

ENTRY main (e: s32[64]) -> s32[8] {{
  e = {_S64} parameter(0)
  one = s32[]{{:T(128)}} constant(1)
  zero = s32[]{{:T(128)}} constant(0)
  handle = s32[]{{:S(2)}} custom-call(), custom_call_target="PrepareAsyncCallStart"
  ones = {_S64} broadcast(one), dimensions={{}}
  zeros = {_S8} broadcast(zero), dimensions={{}}
  ready = token[] custom-call(handle), custom_call_target="PrepareAsyncCallDone"
  start = (({_S8}, {_S64}, {_S64}, token[]), {_S8}) call-start(zeros, e, ones, ready), {_SC}, to_apply=outer
  ROOT done = {_S8} call-done(start)
}}
"""


def test_a_call_on_the_sparsecore_runs_as_a_call_on_the_tensorcore() -> None:
    """v6e's XLA:TPU offloads jnp.bincount's scatter to the SparseCore; the module was refused ('custom-call
    target PrepareAsyncCallStart has no reference function'), then ran the call pair as fallback kernels."""
    module = parse_module(SPARSECORE)
    after = canonicalize(module)
    opcodes = {i.opcode for c in after.computations for i in c.instructions}
    assert "async-start" not in opcodes and "async-done" not in opcodes and "call" in opcodes
    ids = RNG.integers(0, 8, 64).astype(np.int32)
    want = np.bincount(ids, minlength=8)
    np.testing.assert_array_equal(evaluate(module, [ids])[0], want)
    result = tpusim.simulate(SPARSECORE, [ids], config="tpu_v6e")
    np.testing.assert_array_equal(result.outputs[0], want)
    assert not result.fallbacks
    # XLA's placeholder for a kernel it does not estimate (INT64_MAX) is no estimate
    assert estimated_cycles(module["inner"]["f"]) is None
