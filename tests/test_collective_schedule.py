"""Collectives as async pairs scheduled around the compute that does not depend on them (XLA:TPU's async
collective creator and latency-hiding scheduler, tpusim.compiler.collective_schedule)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tpusim
from tpusim.compiler.collective_schedule import schedule_collectives
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate_spmd
from tpusim.compiler.hlo.reference.io import random_inputs
from tpusim.compiler.options import CompileOptions

SUM = "sum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"

# Two "layers" of a backward pass: the gradient g1 is ready after the first product, its all-reduce can run
# while the second product (independent of it) computes; g2's all-reduce comes after g1's (one in flight).
STEP = f"""HloModule step, replica_count=8
{SUM}ENTRY main {{
  x = f32[4096,1024] parameter(0)
  a = bf16[2048,2048] parameter(1)
  b = bf16[2048,2048] parameter(2)
  c = bf16[2048,2048] parameter(3)
  g1 = f32[4096,1024] negate(x)
  r1 = f32[4096,1024] all-reduce(g1), replica_groups={{}}, to_apply=sum
  m = bf16[2048,2048] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  g2 = f32[4096,1024] exponential(x)
  n = bf16[2048,2048] dot(m, c), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  r2 = f32[4096,1024] all-reduce(g2), replica_groups={{}}, to_apply=sum
  ROOT t = (f32[4096,1024], f32[4096,1024], bf16[2048,2048]) tuple(r1, r2, n)
}}
"""


def _gives_the_reference_answer(text: str, rtol: float = 2e-2, atol: float = 1e-5, **run: Any) -> None:
    """Every chip's outputs of ``text`` (8 devices) equal the reference interpreter's."""
    module = parse_module(text)
    per = random_inputs(module, 0, 8)
    want = evaluate_spmd(module, per, num_devices=8)
    inputs = [np.stack([d[i] for d in per]) for i in range(len(per[0]))]
    got = tpusim.simulate(module, inputs, chips=8, **run).outputs
    for j, out in enumerate(got):
        np.testing.assert_allclose(out, np.stack([d[j] for d in want]), rtol=rtol, atol=atol)


def _seconds(text: str, async_collectives: bool) -> float:
    """Simulated seconds on 8 v5e chips, timing only, with or without the schedule pass."""
    options = CompileOptions(async_collectives=async_collectives)
    return tpusim.simulate(text, chips=8, config="tpu_v5e", timing_only=True, options=options).seconds


def _small(text: str) -> str:
    """``text`` at sizes a numeric run takes a moment for."""
    return text.replace("4096,1024", "64,128").replace("512,1024", "8,128").replace("2048,2048", "128,128")


MATMUL = 140_800 / 1.5e9  # a 2048^3 bf16 product's span on v5e's MXUs (93.9 us)


def _order(text: str) -> list[str]:
    module = schedule_collectives(parse_module(text))
    return [f"{i.name}:{i.opcode}" for i in module.entry_computation.instructions if i.opcode != "parameter"]


def test_a_start_goes_up_to_its_operand_and_its_done_down_to_where_it_is_due() -> None:
    assert _order(STEP) == [
        "g1:negate",
        "r1:all-reduce-start",  # as soon as its operand is ready
        "m:dot",  # the compute that does not need it runs in between
        "g2:exponential",
        "r1.done:all-reduce-done",  # due: the next collective's operand is ready (one in flight)
        "r2:all-reduce-start",
        "n:dot",
        "r2.done:all-reduce-done",
        "t:tuple",
    ]
    root = schedule_collectives(parse_module(STEP)).entry_computation.root_instruction
    assert root.operands == ("r1.done", "r2.done", "n")  # the users read the dones


def test_a_pair_that_would_overlap_nothing_stays_the_plain_collective() -> None:
    """XLA's ConvertAsyncCollectivesToSync: a start right before its done is the plain op again."""
    text = STEP.replace("ROOT t = (f32[4096,1024], f32[4096,1024], bf16[2048,2048]) tuple(r1, r2, n)",
                        "ROOT t = (f32[4096,1024], f32[4096,1024], bf16[2048,2048]) tuple(r1, r2, m)")  # fmt: skip
    text = text.replace("  n = bf16[2048,2048] dot(m, c), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n", "")
    assert "r2:all-reduce" in _order(text) and "r1:all-reduce-start" in _order(text)


def test_modules_it_leaves_alone() -> None:
    one_device = STEP.replace("replica_count=8", "replica_count=1")
    assert schedule_collectives(parse_module(one_device)) == parse_module(one_device)
    scheduled = schedule_collectives(parse_module(STEP))
    assert schedule_collectives(scheduled) is scheduled  # already has async collectives (XLA:TPU's own)


def test_control_predecessors_hold_a_start_back() -> None:
    r1 = "  r1 = f32[4096,1024] all-reduce(g1), replica_groups={}, to_apply=sum\n"
    m = "  m = bf16[2048,2048] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    assert r1 in STEP and m in STEP
    text = STEP.replace(r1, "").replace(m, m + r1.replace("to_apply=sum", "to_apply=sum, control-predecessors={m}"))
    order = _order(text)
    assert order.index("m:dot") < order.index("r1:all-reduce-start")  # (without: right after g1)


@pytest.mark.parametrize("async_collectives", [False, True])
def test_the_scheduled_step_gives_the_reference_answer(async_collectives: bool) -> None:
    _gives_the_reference_answer(_small(STEP), options=CompileOptions(async_collectives=async_collectives))


def test_compute_between_the_pairs_hides_the_collectives() -> None:
    """v5e, 8 chips: each 16 MiB all-reduce takes 706 us where the module puts it (1,662 us in all with
    the two 2048^3 matmuls, 94 us each, and the fused elementwise kernel). The first pair would overlap
    nothing (the fusion pass computes both gradients in one kernel, so the second pair's operand is ready at
    once and one pair is in flight at a time): it stays the plain op. The second starts right after it and
    hides both matmuls: 1,482 us (1,571 us when the multi-output fusion's results were taken apart around
    the first matmul, which then ran before the second pair could start)."""
    assert _seconds(STEP, True) == pytest.approx(_seconds(STEP, False) - 2 * MATMUL, rel=0.01)


# The same two products in a loop body (a scanned backward pass): each iteration's gradient all-reduce can
# run under the iteration's products, which do not depend on it.
_CARRY = "(s32[], f32[4096,1024], bf16[2048,2048], bf16[2048,2048], bf16[2048,2048])"
LOOP = f"""HloModule scan, replica_count=8
{SUM}cond {{
  p = {_CARRY} parameter(0)
  i = s32[] get-tuple-element(p), index=0
  trips = s32[] constant(2)
  ROOT more = pred[] compare(i, trips), direction=LT
}}

body {{
  p = {_CARRY} parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[4096,1024] get-tuple-element(p), index=1
  a = bf16[2048,2048] get-tuple-element(p), index=2
  b = bf16[2048,2048] get-tuple-element(p), index=3
  c = bf16[2048,2048] get-tuple-element(p), index=4
  g = f32[4096,1024] negate(x)
  r = f32[4096,1024] all-reduce(g), replica_groups={{}}, to_apply=sum
  m = bf16[2048,2048] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  n = bf16[2048,2048] dot(m, c), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  one = s32[] constant(1)
  next = s32[] add(i, one)
  ROOT out = {_CARRY} tuple(next, r, a, b, n)
}}

ENTRY main {{
  x = f32[4096,1024] parameter(0)
  a = bf16[2048,2048] parameter(1)
  b = bf16[2048,2048] parameter(2)
  c = bf16[2048,2048] parameter(3)
  zero = s32[] constant(0)
  init = {_CARRY} tuple(zero, x, a, b, c)
  ROOT loop = {_CARRY} while(init), condition=cond, body=body
}}
"""


def test_a_loop_body_schedules_its_own_collectives() -> None:
    body = schedule_collectives(parse_module(LOOP))["body"]
    kept = ("all-reduce-start", "all-reduce-done", "dot", "negate")
    order = [f"{i.name}:{i.opcode}" for i in body.instructions if i.opcode in kept]
    assert order == ["g:negate", "r:all-reduce-start", "m:dot", "n:dot", "r.done:all-reduce-done"]
    assert body.root_instruction.operands[1] == "r.done"


def test_the_scheduled_loop_gives_the_reference_answer() -> None:
    _gives_the_reference_answer(_small(LOOP))


def test_each_iteration_hides_its_products_under_its_all_reduce() -> None:
    """v5e, 8 chips, two iterations: the 16 MiB all-reduce (706 us) hides both 2048^3 products (94 us each)
    of its iteration."""
    assert _seconds(LOOP, True) == pytest.approx(_seconds(LOOP, False) - 2 * 2 * MATMUL, rel=0.02)


# XLA's combined (variadic) all-reduce: both gradients in one collective, then a product that does not need it.
VARIADIC = f"""HloModule combined, replica_count=8
{SUM}ENTRY main {{
  x = f32[4096,1024] parameter(0)
  a = bf16[2048,2048] parameter(1)
  b = bf16[2048,2048] parameter(2)
  g1 = f32[4096,1024] negate(x)
  g2 = f32[4096,1024] exponential(x)
  r = (f32[4096,1024], f32[4096,1024]) all-reduce(g1, g2), replica_groups={{}}, to_apply=sum
  m = bf16[2048,2048] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  r1 = f32[4096,1024] get-tuple-element(r), index=0
  r2 = f32[4096,1024] get-tuple-element(r), index=1
  ROOT t = (f32[4096,1024], f32[4096,1024], bf16[2048,2048]) tuple(r1, r2, m)
}}
"""


def test_a_combined_all_reduce_becomes_one_pair() -> None:
    order = _order(VARIADIC)
    assert order.index("r:all-reduce-start") < order.index("m:dot") < order.index("r.done:all-reduce-done")


def test_the_combined_pair_gives_the_reference_answer() -> None:
    _gives_the_reference_answer(_small(VARIADIC))


def test_the_combined_pair_hides_the_product() -> None:
    """v5e, 8 chips: two 16 MiB arrays reduced one after the other on the async sequencer (about 706 us each)
    hide the 2048^3 product (94 us)."""
    assert _seconds(VARIADIC, True) == pytest.approx(_seconds(VARIADIC, False) - MATMUL, rel=0.01)


# An FSDP-style backward: the weight gradient is reduce-scattered while the next product computes.
SCATTER = f"""HloModule fsdp, replica_count=8
{SUM}ENTRY main {{
  x = f32[4096,1024] parameter(0)
  a = bf16[2048,2048] parameter(1)
  b = bf16[2048,2048] parameter(2)
  g = f32[4096,1024] negate(x)
  r = f32[512,1024] reduce-scatter(g), replica_groups={{}}, dimensions={{0}}, to_apply=sum
  m = bf16[2048,2048] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  ROOT t = (f32[512,1024], bf16[2048,2048]) tuple(r, m)
}}
"""


def test_a_reduce_scatter_becomes_an_async_pair() -> None:
    order = _order(SCATTER)
    assert order.index("r:async-start") < order.index("m:dot") < order.index("r.done:async-done")
    start = schedule_collectives(parse_module(SCATTER)).entry_computation["r"]
    assert start.async_wrapped_instruction() is not None  # XLA's short form, reduce-scatter-start


def test_the_reduce_scatter_pair_gives_the_reference_answer() -> None:
    _gives_the_reference_answer(_small(SCATTER))


def test_the_reduce_scatter_pair_hides_the_product() -> None:
    """v5e, 8 chips: the 16 MiB reduce-scatter on the async sequencer hides the 2048^3 product (94 us)."""
    assert _seconds(SCATTER, True) == pytest.approx(_seconds(SCATTER, False) - MATMUL, rel=0.02)


# An expert-parallel layer: tokens are exchanged with an all-to-all while an independent product computes.
EXCHANGE = """HloModule moe, replica_count=8
ENTRY main {
  x = f32[4096,1024] parameter(0)
  a = bf16[2048,2048] parameter(1)
  b = bf16[2048,2048] parameter(2)
  g = f32[4096,1024] negate(x)
  r = f32[4096,1024] all-to-all(g), replica_groups={}, dimensions={0}
  m = bf16[2048,2048] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (f32[4096,1024], bf16[2048,2048]) tuple(r, m)
}
"""


def test_an_all_to_all_becomes_an_async_pair() -> None:
    order = _order(EXCHANGE)
    assert order.index("r:async-start") < order.index("m:dot") < order.index("r.done:async-done")
    start = schedule_collectives(parse_module(EXCHANGE)).entry_computation["r"]
    assert start.async_wrapped_instruction() is not None  # XLA's short form, all-to-all-start


def test_the_all_to_all_pair_gives_the_reference_answer() -> None:
    _gives_the_reference_answer(_small(EXCHANGE))


def test_the_all_to_all_pair_hides_the_product() -> None:
    """v5e, 8 chips: the 16 MiB all-to-all on the async sequencer hides the 2048^3 product (94 us)."""
    assert _seconds(EXCHANGE, True) == pytest.approx(_seconds(EXCHANGE, False) - MATMUL, rel=0.02)


# A small collective made a pair over a 2-D or 3-D topology: the async sequencer's HBM reservation (twice
# the operand) was smaller than its temporaries, each rounded up to a whole buffer alignment ("HBM is full").
SMALL = """HloModule small, num_partitions=8
sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[8] parameter(0)
  y = f32[128,128] parameter(1)
  COLLECTIVE
  e = f32[128,128] exponential(y)
  ROOT t = (SHAPE, f32[128,128]) tuple(r, e)
}
"""
SMALL_COLLECTIVES = {
    "all-reduce": ("f32[8]", "r = f32[8] all-reduce(x), channel_id=1, replica_groups={}, to_apply=sum"),
    "all-to-all": ("f32[8]", "r = f32[8] all-to-all(x), channel_id=1, replica_groups={}, dimensions={0}"),
    "reduce-scatter": (
        "f32[1]",
        "r = f32[1] reduce-scatter(x), channel_id=1, replica_groups={}, dimensions={0}, to_apply=sum",
    ),
}


@pytest.mark.parametrize("collective", sorted(SMALL_COLLECTIVES))
@pytest.mark.parametrize(
    ("config", "topology", "overrides"),
    [("tpu_v5e", (2, 4), ()), ("tpu_v4", (2, 2, 2), ()), ("tpu_v5e", (2, 2), ("dcn.slices=2",))],
    ids=["v5e-2x4", "v4-2x2x2", "v5e-2-slices"],
)
def test_small_pairs_over_several_axes(
    collective: str, config: str, topology: tuple[int, ...], overrides: tuple[str, ...]
) -> None:
    shape, line = SMALL_COLLECTIVES[collective]
    text = SMALL.replace("COLLECTIVE", line).replace("SHAPE", shape)
    scheduled = schedule_collectives(parse_module(text)).entry_computation
    assert scheduled["r"].opcode in ("all-reduce-start", "async-start")  # (the pair this test is about)
    _gives_the_reference_answer(text, 1e-5, 1e-6, topology=topology, config=config, overrides=overrides)
