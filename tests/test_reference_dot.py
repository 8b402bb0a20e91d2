"""dot (DotGeneral) of the reference interpreter against JAX on CPU and XLA CPU on HLO text."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from heavy_checks import check_hlo
from jax_oracle import check_against_jax

from tpusim.compiler.hlo.reference import EvaluationError
from tpusim.compiler.hlo.reference.dot import dot_general

RNG = np.random.default_rng(0)  # reseeded for every test (conftest.py)


def _rand(shape: tuple[int, ...], dtype: object) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return RNG.integers(max(info.min, -100), min(info.max, 100), size=shape, endpoint=True).astype(dt)
    if dt.kind == "c":
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dt)
    return RNG.standard_normal(shape).astype(dt)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16, np.int32, np.complex64])
@pytest.mark.parametrize(
    ("spec", "lhs", "rhs"),
    [
        ("ij,jk->ik", (5, 7), (7, 3)),
        ("bi,bi->b", (2, 9), (2, 9)),
        ("bij,bjk->bik", (2, 4, 6), (2, 6, 3)),
        ("bij,bkj->bik", (3, 4, 5), (3, 2, 5)),
        ("abc,bcd->ad", (2, 3, 4), (3, 4, 5)),
        ("xbi,ybi->bxy", (3, 2, 5), (4, 2, 5)),
    ],
)
def test_einsum_shapes_and_dtypes(spec: str, lhs: tuple[int, ...], rhs: tuple[int, ...], dtype: object) -> None:
    check_against_jax(lambda a, b: jnp.einsum(spec, a, b), _rand(lhs, dtype), _rand(rhs, dtype))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int32])
def test_vector_dot_gives_a_scalar(dtype: object) -> None:
    check_against_jax(lambda a, b: jnp.dot(a, b), _rand((9,), dtype), _rand((9,), dtype))


def test_bf16_operands_accumulate_in_f32_and_round_once() -> None:
    # 1 + 256 terms of 2^-9: a bf16 accumulator stays at 1 (each add rounds back), an f32 one reaches 1.5.
    a = np.concatenate([[1.0], np.full(256, 2.0**-9)]).astype(ml_dtypes.bfloat16)[None, :]
    b = np.ones((257, 1), ml_dtypes.bfloat16)
    got = check_against_jax(lambda x, y: x @ y, a, b)
    assert got[0].dtype == ml_dtypes.bfloat16 and float(got[0][0, 0]) == 1.5


def test_preferred_element_type_f32_from_bf16() -> None:
    a, b = _rand((4, 8), ml_dtypes.bfloat16), _rand((8, 3), ml_dtypes.bfloat16)
    got = check_against_jax(lambda x, y: jax.lax.dot(x, y, preferred_element_type=jnp.float32), a, b)
    assert got[0].dtype == np.float32


def test_s8_operands_with_s32_result() -> None:
    a = RNG.integers(-128, 128, size=(6, 40)).astype(np.int8)
    b = RNG.integers(-128, 128, size=(40, 5)).astype(np.int8)
    check_against_jax(lambda x, y: jax.lax.dot(x, y, preferred_element_type=jnp.int32), a, b)


def test_integer_dot_wraps() -> None:
    a = np.full((2, 4), 2**30, np.int32)
    b = np.full((4, 2), 3, np.int32)
    got = check_against_jax(lambda x, y: x @ y, a, b)
    assert got[0][0, 0] == np.int32(np.int64(12 * 2**30) - 2**32 * 3)


def test_unsigned_dot() -> None:
    check_against_jax(lambda x, y: x @ y, _rand((3, 5), np.uint8), _rand((5, 4), np.uint8))


@pytest.mark.parametrize("precision", [jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGH, jax.lax.Precision.HIGHEST])
def test_precision_config_keeps_f32_exact_on_cpu(precision: jax.lax.Precision) -> None:
    a, b = _rand((16, 32), np.float32), _rand((32, 8), np.float32)
    check_against_jax(lambda x, y: jnp.dot(x, y, precision=precision), a, b)


@pytest.mark.parametrize(
    "preset",
    [
        jax.lax.DotAlgorithmPreset.BF16_BF16_F32,
        jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X3,
        jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X6,
    ],
)
def test_dot_algorithm_presets_are_f32_dots_on_cpu(preset: jax.lax.DotAlgorithmPreset) -> None:
    a, b = _rand((8, 64), np.float32), _rand((64, 4), np.float32)
    check_against_jax(lambda x, y: jax.lax.dot(x, y, precision=preset), a, b)


def test_f64_and_complex128() -> None:
    with jax.enable_x64(True):
        check_against_jax(lambda x, y: x @ y, _rand((4, 6), np.float64), _rand((6, 2), np.float64))
        check_against_jax(lambda x, y: x @ y, _rand((3, 6), np.complex128), _rand((6, 2), np.complex128))


def test_hlo_batch_dims_not_leading() -> None:
    # Batch dimension 1 of lhs and 2 of rhs; the result puts it first.
    text = """HloModule m
ENTRY e {
  a = f32[3,2,4] parameter(0)
  b = f32[4,5,2] parameter(1)
  ROOT d = f32[2,3,5] dot(a, b), lhs_batch_dims={1}, rhs_batch_dims={2}, lhs_contracting_dims={2}, DIMS
}
""".replace("DIMS", "rhs_contracting_dims={0}")
    a, b = _rand((3, 2, 4), np.float32), _rand((4, 5, 2), np.float32)
    got = check_hlo(text, a, b)
    np.testing.assert_allclose(got[0], np.einsum("ibk,kjb->bij", a, b), rtol=1e-5, atol=1e-5)


def test_empty_contraction_gives_zeros() -> None:
    out = dot_general(np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32), (), (), (1,), (0,), np.float32)
    assert out.shape == (2, 3) and not out.any()


def test_mismatched_contracting_sizes_name_the_instruction() -> None:
    text = """HloModule m
ENTRY e {
  a = f32[2,3] parameter(0)
  b = f32[3,4] parameter(1)
  ROOT bad = f32[2,4] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
    from tpusim.compiler.hlo import ir, parse_module
    from tpusim.compiler.hlo.reference import EvalContext, evaluate_instruction

    module = parse_module(text)
    comp = module.entry_computation
    instr = comp["bad"]
    ctx = EvalContext(module)
    wrong = ir.Instruction(instr.name, instr.opcode, instr.shape, instr.operands, instr.attributes)
    with pytest.raises(EvaluationError, match=r"^%bad \(dot.*\): lhs dimension 1 \(size 5\) does not match rhs"):
        evaluate_instruction(ctx, comp, wrong, [np.zeros((2, 5), np.float32), np.zeros((3, 4), np.float32)])
