"""sort and topk against JAX on CPU and XLA CPU: key comparators, lexicographic ones, arbitrary ones."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from heavy_checks import check_hlo
from jax_oracle import check_against_jax

from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import EvalContext
from tpusim.compiler.hlo.reference.sort import _merge_sort, comparator_keys, order_keys

RNG = np.random.default_rng(4)  # reseeded for every test (conftest.py)
SPECIAL = np.array([np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 1.0, 0.0], np.float32)


def _rand(shape: tuple[int, ...], dtype: object = np.float32) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return RNG.integers(0, 20, size=shape).astype(dt)
    return np.round(RNG.standard_normal(shape), 1).astype(dt)  # rounded: many ties


def _with_specials(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x.reshape(-1)[: SPECIAL.size] = SPECIAL.astype(x.dtype)
    return x


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16, np.int32, np.uint8])
@pytest.mark.parametrize("axis", [0, 1])
def test_sort_and_argsort(dtype: object, axis: int) -> None:
    x = _rand((6, 9), dtype)
    if np.dtype(dtype).kind not in "iu":
        x = _with_specials(x)
    check_against_jax(
        lambda a: (jnp.sort(a, axis=axis), jnp.argsort(a, axis=axis), jnp.sort(a, axis=axis, descending=True)), x
    )


def test_argsort_descending_is_stable() -> None:
    check_against_jax(lambda a: jnp.argsort(a, descending=True, stable=True), _rand((40,), np.int32))


@pytest.mark.parametrize("num_keys", [1, 2, 3])
def test_multi_operand_sort(num_keys: int) -> None:
    ops = (_rand((5, 12), np.int32) % 3, _with_specials(_rand((5, 12))), _rand((5, 12), np.uint8) % 2)
    check_against_jax(lambda a, b, c: jax.lax.sort((a, b, c), dimension=1, num_keys=num_keys), *ops)


def test_lexsort() -> None:
    check_against_jax(lambda a, b: jnp.lexsort((a, b)), _rand((30,), np.int32) % 4, _rand((30,)))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int32])
def test_top_k(dtype: object) -> None:
    x = _rand((4, 11), dtype)
    if np.dtype(dtype).kind == "f":
        x = _with_specials(x)
    check_against_jax(lambda a: jax.lax.top_k(a, 5), x)


def test_top_k_tpu_lowering_is_the_topk_opcode() -> None:
    x = np.zeros((3, 8), np.float32)
    text = jax.jit(lambda a: jax.lax.top_k(a, 2)).trace(x).lower(lowering_platforms=("tpu",)).as_text("hlo")
    module = parse_module(text)
    assert any(i.opcode == "topk" for c in module.computations for i in c.instructions)


ABS_GT = """HloModule m
cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = s32[] parameter(2)
  d = s32[] parameter(3)
  aa = f32[] abs(a)
  ab = f32[] abs(b)
  ROOT gt = pred[] compare(aa, ab), direction=GT
}
ENTRY e {
  x = f32[3,10] parameter(0)
  i = s32[3,10] parameter(1)
  ROOT s = (f32[3,10], s32[3,10]) sort(x, i), dimensions={1}, is_stable=true, to_apply=cmp
}
"""

# Not a key comparator: the order depends on both operands at once (a0 + a1 < b0 + b1).
SUM_LT = """HloModule m
cmp {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  c = s32[] parameter(2)
  d = s32[] parameter(3)
  l = s32[] add(a, c)
  r = s32[] add(b, d)
  ROOT lt = pred[] compare(l, r), direction=LT
}
ENTRY e {
  x = s32[4,33] parameter(0)
  y = s32[4,33] parameter(1)
  ROOT s = (s32[4,33], s32[4,33]) sort(x, y), dimensions={1}, is_stable=true, to_apply=cmp
}
"""


def test_key_expression_comparator_against_xla() -> None:
    idx = np.broadcast_to(np.arange(10, dtype=np.int32), (3, 10)).copy()
    check_hlo(ABS_GT, _rand((3, 10)), idx)
    assert comparator_keys(parse_module(ABS_GT)["cmp"]) is not None


def test_arbitrary_comparator_uses_the_merge_sort_against_xla() -> None:
    assert comparator_keys(parse_module(SUM_LT)["cmp"]) is None
    check_hlo(SUM_LT, _rand((4, 33), np.int32), _rand((4, 33), np.int32))


def test_float_compare_without_totalorder_against_xla() -> None:
    text = """HloModule m
cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT
}
ENTRY e {
  x = f32[17] parameter(0)
  ROOT s = f32[17] sort(x), dimensions={0}, is_stable=true, to_apply=cmp
}
"""
    x = np.array([3, -0.0, 0.0, -1, np.inf, -np.inf, 2, 0.0, -0.0, 5, 1, 1, -2, 7, 0.5, -0.5, 9], np.float32)
    check_hlo(text, x)


def test_merge_sort_matches_the_key_sort_on_a_lexicographic_comparator() -> None:
    # JAX's (f32 key, s32 key) comparator is recognised; forcing the generic merge sort must give the
    # same stable permutation.
    x = _with_specials(_rand((3, 50)))
    y = _rand((3, 50), np.int32) % 3
    text = jax.jit(lambda a, b: jax.lax.sort((a, b), num_keys=2)).lower(x, y).as_text("hlo")
    module = parse_module(text)
    comp = next(c for c in module.computations if c.root_instruction.opcode == "or")
    keys = comparator_keys(comp)
    assert keys is not None and [k.operand for k in keys] == [0, 1]
    ctx = EvalContext(module)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(_merge_sort(ctx, comp, [x, y]), order_keys(ctx, keys, [x, y]))


def test_complex_and_bool_sorts_unique_and_searchsorted() -> None:
    c = (np.round(RNG.standard_normal(20)) + 1j * np.round(RNG.standard_normal(20))).astype(np.complex64)
    check_against_jax(lambda a: (jnp.sort(a), jnp.argsort(a)), c)
    check_against_jax(jnp.sort, RNG.random(10) < 0.5)
    check_against_jax(lambda a: jnp.unique(a, size=6, fill_value=-1), RNG.integers(0, 5, 12).astype(np.int32))
    check_against_jax(lambda a, v: jnp.searchsorted(jnp.sort(a), v, method="sort"), _rand((11,)), _rand((4,)))


def test_comparator_with_the_wrong_arity_names_the_instruction() -> None:
    from tpusim.compiler.hlo import ir
    from tpusim.compiler.hlo.reference import EvaluationError, evaluate_instruction

    module = parse_module(ABS_GT)
    comp = module.entry_computation
    one = ir.Instruction("s1", "sort", comp["x"].shape, ("x",), comp["s"].attributes)
    with pytest.raises(EvaluationError, match=r"^%s1 \(sort\): comparator cmp takes 4 parameters, expected 2$"):
        evaluate_instruction(EvalContext(module), comp, one, [_rand((3, 10))])


XLA_TOPK = """HloModule topk
%greater (p.0.lhs: f32[], p.0.rhs: f32[], p.1.lhs: s32[], p.1.rhs: s32[]) -> pred[] {
  %zero = s32[] constant(0)
  %mask = s32[] constant(2147483647)
  %p.1.rhs = s32[] parameter(3)
  %p.1.lhs = s32[] parameter(2)
  %p.0.rhs = f32[] parameter(1)
  %p.0.lhs = f32[] parameter(0)
  %bits.1 = s32[] bitcast-convert(%p.0.rhs)
  %negative.1 = pred[] compare(%bits.1, %zero), direction=LT
  %flipped.1 = s32[] xor(%mask, %bits.1)
  %key.1 = s32[] select(%negative.1, %flipped.1, %bits.1)
  %bits = s32[] bitcast-convert(%p.0.lhs)
  %negative = pred[] compare(%bits, %zero), direction=LT
  %flipped = s32[] xor(%mask, %bits)
  %key = s32[] select(%negative, %flipped, %bits)
  ROOT %gt = pred[] compare(%key, %key.1), direction=GT
}

ENTRY %main (x: f32[4,3000]) -> (f32[4,8], s32[4,8]) {
  %x = f32[4,3000] parameter(0)
  ROOT %top = (f32[4,8], s32[4,8]) custom-call(%x), custom_call_target="TopK", called_computations={%greater}
}
"""


def test_xla_tpus_topk_custom_call_is_jaxs_top_k() -> None:
    """XLA:TPU compiles ``jax.lax.top_k`` of a long row (32,000 logits) into ``custom-call`` ``TopK`` with a
    total-order comparator on the float's bits (this one is its v5e module's, renamed); tpusim refused it
    ("no reference function"). Its values and indices are JAX's, ties (small integers) to the lower index,
    on the device (a fallback) and in the reference, whose sort reads the comparator as a key (the scalar
    bit tricks run on whole arrays: 0.5 s instead of 6 s of per-pair calls)."""
    import tpusim
    from tpusim.compiler.hlo.reference import evaluate

    module = parse_module(XLA_TOPK)
    assert comparator_keys(module["greater"]) is not None
    x = np.random.default_rng(0).integers(-20, 20, (4, 3000)).astype(np.float32)
    want = jax.lax.top_k(jnp.asarray(x), 8)
    for got in (evaluate(module, [x]), tpusim.simulate(module, [x]).outputs):
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
