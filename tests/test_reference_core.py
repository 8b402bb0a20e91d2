"""The reference interpreter's core: evaluate / evaluate_instruction / vectorized_call, input checks, the
error of each kind, and small realistic programs (MLP in f32 and bf16, softmax, layer norm) against JAX."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import ml_dtypes
import numpy as np
import pytest
from jax_oracle import Tolerance, check_against_jax

from tpusim.compiler.hlo import ir, parse_module
from tpusim.compiler.hlo.reference import (
    REFERENCE,
    EvalContext,
    EvaluationError,
    InputError,
    UnsupportedOpcodeError,
    Value,
    evaluate,
    evaluate_instruction,
)
from tpusim.errors import TpusimError
from tpusim.memory import parse_shape

RNG = np.random.default_rng(11)  # reseeded for every test (conftest.py)


# ---------------------------------------------------------------------------------------------
# Realistic programs
# ---------------------------------------------------------------------------------------------
def mlp(x: jax.Array, w1: jax.Array, b1: jax.Array, w2: jax.Array, b2: jax.Array) -> jax.Array:
    return jax.nn.gelu(x @ w1 + b1) @ w2 + b2


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["f32", "bf16"])
def test_mlp_forward(dtype: object) -> None:
    args = [RNG.standard_normal(s).astype(dtype) for s in ((8, 16), (16, 32), (32,), (32, 4), (4,))]
    check_against_jax(mlp, *args, tol="composite")
    check_against_jax(mlp, *args, tol="composite", optimized=True)


def test_softmax_and_layer_norm() -> None:
    def f(x: jax.Array, g: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return jax.nn.softmax(x * 3.0, axis=-1), (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b

    x = RNG.standard_normal((6, 32)).astype(np.float32)
    g, b = RNG.standard_normal(32).astype(np.float32), RNG.standard_normal(32).astype(np.float32)
    check_against_jax(f, x, g, b, tol="composite")
    xb = x.astype(ml_dtypes.bfloat16)
    # XLA CPU keeps bf16 intermediates in f32 where its optimized module drops convert pairs
    # (xla_allow_excess_precision), so JAX's results are closer to f32 than the HLO JAX emitted says: the
    # reference follows that HLO within bf16 accuracy, and the optimized module itself almost exactly.
    bf16_steps = Tolerance(atol=1e-2, rtol=1e-2, why="bf16 rounding of intermediates that XLA keeps in f32")
    check_against_jax(f, xb, g, b, tol=bf16_steps)
    check_against_jax(f, xb, g, b, tol="composite", optimized=True)


# ---------------------------------------------------------------------------------------------
# evaluate and its input checks
# ---------------------------------------------------------------------------------------------
SIMPLE = """
HloModule simple
ENTRY main {
  x = f32[2,3] parameter(0)
  n = s32[] parameter(1)
  c = f32[] convert(n)
  b = f32[2,3] broadcast(c), dimensions={}
  ROOT r = f32[2,3] add(x, b)
}
"""


def test_evaluate_checks_every_input_exactly() -> None:
    module = parse_module(SIMPLE)
    x = np.ones((2, 3), np.float32)
    (out,) = evaluate(module, [x, np.int32(2)])
    np.testing.assert_array_equal(out, np.full((2, 3), 3.0, np.float32))
    with pytest.raises(InputError, match=r"^simple: the entry computation main takes 2 inputs \(%x: f32\[2,3\], "
                       r"%n: s32\[\]\), 1 were given$"):  # fmt: skip
        evaluate(module, [x])
    with pytest.raises(InputError, match=r"^simple: parameter 0 \(%x: f32\[2,3\]\): expected element type f32 "
                       r"\(numpy float32\), got float64$"):  # fmt: skip
        evaluate(module, [x.astype(np.float64), np.int32(2)])
    with pytest.raises(InputError, match=r"^simple: parameter 0 \(%x: f32\[2,3\]\): expected dimensions \[2, 3\], "
                       r"got \[3, 2\]$"):  # fmt: skip
        evaluate(module, [x.T.copy(), np.int32(2)])
    with pytest.raises(InputError, match=r"^simple: parameter 1 \(%n: s32\[\]\): expected an array s32\[\], got int$"):
        evaluate(module, [x, 2])


def test_text_order_does_not_matter_and_cycles_are_reported() -> None:
    shape = parse_shape("f32[2]")
    p = ir.Instruction("p", "parameter", shape, (), ir.Attributes({"parameter_number": 0}))
    late = ir.Instruction("late", "negate", shape, ("early",))
    early = ir.Instruction("early", "add", shape, ("p", "p"))
    comp = ir.Computation("main", (late, p, early), "late", is_entry=True)
    (out,) = evaluate(ir.Module("m", (comp,), "main"), [np.array([1, 2], np.float32)])
    np.testing.assert_array_equal(out, [-2, -4])
    a = ir.Instruction("a", "negate", shape, ("b",))
    b = ir.Instruction("b", "negate", shape, ("a",))
    cyclic = ir.Computation("main", (p, a, b), "b", is_entry=True)
    with pytest.raises(EvaluationError, match=r"computation main has a cycle through %"):
        evaluate(ir.Module("m", (cyclic,), "main"), [np.zeros(2, np.float32)])


def _module_with(opcode: str) -> ir.Module:
    shape = parse_shape("f32[2]")
    p = ir.Instruction("p", "parameter", shape, (), ir.Attributes({"parameter_number": 0}))
    op = ir.Instruction("weird", opcode, shape, ("p",), loc=ir.SourceLoc(3))
    return ir.Module("m", (ir.Computation("main", (p, op), "weird", is_entry=True),), "main")


def test_unknown_opcode_names_it_and_lists_the_supported_ones() -> None:
    with pytest.raises(
        UnsupportedOpcodeError,
        match=r"^%weird \(frobnicate, line 3\): the reference interpreter has no function for opcode 'frobnicate'; "
        r"supported opcodes: abs, acos, .*, add, .*, while, xor$",
    ):
        evaluate(_module_with("frobnicate"), [np.zeros(2, np.float32)])


def test_wrong_result_and_internal_failures_name_the_instruction(monkeypatch: pytest.MonkeyPatch) -> None:
    def wrong_dtype(ctx: EvalContext, instr: ir.Instruction, args: Sequence[Value]) -> Value:
        return args[0].astype(np.float64)

    def broken(ctx: EvalContext, instr: ir.Instruction, args: Sequence[Value]) -> Value:
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(REFERENCE, "test-wrong", wrong_dtype)
    monkeypatch.setitem(REFERENCE, "test-broken", broken)
    with pytest.raises(EvaluationError, match=r"^%weird \(test-wrong, line 3\): reference of 'test-wrong' returned a "
                       r"wrong value: expected element type f32 \(numpy float32\), got float64$"):  # fmt: skip
        evaluate(_module_with("test-wrong"), [np.zeros(2, np.float32)])
    with pytest.raises(EvaluationError, match=r"^%weird \(test-broken, line 3\): reference failed: "
                       r"ZeroDivisionError: boom$") as info:  # fmt: skip
        evaluate(_module_with("test-broken"), [np.zeros(2, np.float32)])
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert issubclass(EvaluationError, TpusimError) and issubclass(InputError, TpusimError)


def test_evaluate_instruction_runs_one_instruction() -> None:
    module = parse_module(SIMPLE)
    comp = module.entry_computation
    ctx = EvalContext(module)
    out = evaluate_instruction(ctx, comp, comp["r"], [np.ones((2, 3), np.float32), np.full((2, 3), 2, np.float32)])
    np.testing.assert_array_equal(out, np.full((2, 3), 3, np.float32))
    with pytest.raises(UnsupportedOpcodeError, match=r"no function for opcode 'frobnicate'"):
        weird = _module_with("frobnicate")
        evaluate_instruction(EvalContext(weird), weird.entry_computation, weird.entry_computation["weird"], [None])


# ---------------------------------------------------------------------------------------------
# vectorized_call
# ---------------------------------------------------------------------------------------------
COMBINERS = """
HloModule combiners
max_plus {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  one = f32[] constant(1)
  m = f32[] maximum(a, b)
  ROOT r = f32[] add(m, one)
}
argmax {
  a = f32[] parameter(0)
  i = s32[] parameter(1)
  b = f32[] parameter(2)
  j = s32[] parameter(3)
  gt = pred[] compare(a, b), direction=GT
  v = f32[] select(gt, a, b)
  k = s32[] select(gt, i, j)
  ROOT t = (f32[], s32[]) tuple(v, k)
}
not_elementwise {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  r1 = f32[1] reshape(a)
  r2 = f32[1] reshape(b)
  s = f32[1] subtract(r1, r2)
  ROOT r = f32[] reshape(s)
}
ENTRY main {
  ROOT x = f32[] parameter(0)
}
"""


def test_vectorized_call_on_whole_arrays_and_per_element_fallback() -> None:
    module = parse_module(COMBINERS)
    ctx = EvalContext(module)
    a = RNG.standard_normal((3, 4)).astype(np.float32)
    b = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(ctx.vectorized_call("max_plus", [a, b]), np.maximum(a, b) + 1)
    i = np.arange(12, dtype=np.int32).reshape(3, 4)
    v, k = ctx.vectorized_call("argmax", [a, i, b, i + 100])  # type: ignore[misc]
    np.testing.assert_array_equal(v, np.where(a > b, a, b))
    np.testing.assert_array_equal(k, np.where(a > b, i, i + 100))
    # a computation with non-elementwise ops runs element by element, with the same result
    np.testing.assert_array_equal(ctx.vectorized_call("not_elementwise", [a, b]), a - b)
    np.testing.assert_array_equal(ctx.vectorized_call("max_plus", [a, np.float32(0.5)]), np.maximum(a, 0.5) + 1)
    with pytest.raises(EvaluationError, match=r"argument 1 of computation max_plus: expected element type f32"):
        ctx.vectorized_call("max_plus", [a, i])
    with pytest.raises(EvaluationError, match=r"computation max_plus takes 2 arguments, 3 were passed"):
        ctx.vectorized_call("max_plus", [a, a, a])


def test_reference_doc_tables_are_up_to_date() -> None:
    """docs/reference.md's coverage and tolerance tables are what tools/coverage_table.py generates."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("coverage_table", root / "tools" / "coverage_table.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    doc = (root / "docs" / "reference.md").read_text()
    assert tool.render(doc) == doc, "docs/reference.md is out of date: run python tools/coverage_table.py --write"
