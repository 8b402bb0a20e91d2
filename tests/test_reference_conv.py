"""convolution of the reference interpreter against JAX on CPU, and against XLA CPU on HLO text."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from heavy_checks import check_hlo
from jax_oracle import check_against_jax, convolution_text, run_hlo_on_xla

from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate

RNG = np.random.default_rng(1)  # reseeded for every test (conftest.py)


def _rand(shape: tuple[int, ...], dtype: object = np.float32) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return RNG.integers(-5, 6, size=shape).astype(dt)
    return RNG.standard_normal(shape).astype(dt)


CASES = [
    # (input NCHW, kernel OIHW, strides, padding, lhs_dilation, rhs_dilation, feature_group_count)
    ((2, 3, 8, 7), (4, 3, 3, 3), (1, 1), "SAME", None, None, 1),
    ((1, 2, 9, 9), (3, 2, 3, 2), (2, 3), "VALID", None, None, 1),
    ((2, 4, 6, 6), (4, 1, 3, 3), (1, 1), ((1, 2), (0, 1)), None, None, 4),  # depthwise
    ((1, 4, 5, 5), (6, 2, 2, 2), (1, 1), ((2, -1), (1, 1)), None, None, 2),  # negative padding, groups
    ((1, 2, 5, 4), (2, 2, 3, 3), (1, 1), ((2, 2), (2, 2)), (2, 2), None, 1),  # transposed-conv style
    ((1, 3, 10, 9), (2, 3, 3, 2), (2, 1), "SAME", None, (2, 3), 1),  # atrous
    ((1, 1, 4, 4), (1, 1, 5, 5), (1, 1), "VALID", None, None, 1),  # empty output
]


@pytest.mark.parametrize(("xs", "ks", "strides", "padding", "lhs_dil", "rhs_dil", "groups"), CASES)
def test_conv_general_dilated_f32(
    xs: tuple[int, ...],
    ks: tuple[int, ...],
    strides: tuple[int, int],
    padding: object,
    lhs_dil: tuple[int, int] | None,
    rhs_dil: tuple[int, int] | None,
    groups: int,
) -> None:
    def f(x: jax.Array, k: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(
            x, k, strides, padding, lhs_dilation=lhs_dil, rhs_dilation=rhs_dil, feature_group_count=groups
        )

    check_against_jax(f, _rand(xs), _rand(ks))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float64])
def test_conv_other_float_types(dtype: object) -> None:
    def f(x: jax.Array, k: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, k, (1, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    with jax.enable_x64(dtype == np.float64):
        check_against_jax(f, _rand((2, 6, 7, 3), dtype), _rand((3, 3, 3, 5), dtype))


def test_conv_bf16_with_f32_result() -> None:
    def f(x: jax.Array, k: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, k, (1,), "SAME", preferred_element_type=jnp.float32)

    check_against_jax(f, _rand((2, 3, 16), ml_dtypes.bfloat16), _rand((4, 3, 5), ml_dtypes.bfloat16))


def test_conv_1d_and_3d_with_odd_dimension_numbers() -> None:
    def f1(x: jax.Array, k: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, k, (2,), ((1, 0),), dimension_numbers=("WCN", "OWI", "CNW"))

    check_against_jax(f1, _rand((11, 3, 2)), _rand((4, 3, 3)))

    def f3(x: jax.Array, k: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, k, (1, 2, 1), "SAME", dimension_numbers=("NDHWC", "DHWIO", "NCDHW"))

    check_against_jax(f3, _rand((1, 4, 5, 4, 2)), _rand((2, 3, 2, 2, 3)))


def test_conv_batch_group_count() -> None:
    def f(x: jax.Array, k: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, k, (1, 1), "VALID", batch_group_count=2)

    check_against_jax(f, _rand((4, 3, 6, 6)), _rand((6, 3, 3, 3)))


def test_conv_gradients_of_a_grouped_strided_conv() -> None:
    def loss(x: jax.Array, k: jax.Array) -> jax.Array:
        y = jax.lax.conv_general_dilated(x, k, (2, 2), "SAME", rhs_dilation=(1, 2), feature_group_count=2)
        return jnp.sum(jnp.tanh(y) * y)

    check_against_jax(jax.grad(loss, argnums=(0, 1)), _rand((2, 4, 9, 8)), _rand((6, 2, 3, 3)))


def test_integer_conv_wraps() -> None:
    text = """HloModule m
ENTRY e {
  x = s32[1,2,5] parameter(0)
  k = s32[3,2,2] parameter(1)
  ROOT c = s32[1,3,4] convolution(x, k), window={size=2}, dim_labels=bf0_oi0->bf0
}
"""
    x = np.full((1, 2, 5), 2**30, np.int32)
    k = np.arange(12, dtype=np.int32).reshape(3, 2, 2)
    check_hlo(text, x, k)


def test_window_reversal_and_both_dilations_against_xla() -> None:
    text = """HloModule m
ENTRY e {
  x = f32[2,5,7,3] parameter(0)
  k = f32[3,2,3,4] parameter(1)
  ROOT c = f32[2,5,3,4] convolution(x, k), window={size=3x2 stride=2x2 pad=1_2x0_1 lhs_dilate=2x1 rhs_dilate=1x2 rhs_reversal=1x0}, dim_labels=b01f_01io->b01f
}
"""  # noqa: E501
    check_hlo(text, _rand((2, 5, 7, 3)), _rand((3, 2, 3, 4)))


def test_batch_group_count_with_batch_left_against_xla() -> None:
    # batch 6 in 3 groups of 2: the output keeps a batch of 2; output feature group g sees batch group g.
    text = """HloModule m
ENTRY e {
  x = f32[6,2,5] parameter(0)
  k = f32[2,2,6] parameter(1)
  ROOT c = f32[2,6,4] convolution(x, k), window={size=2}, dim_labels=bf0_i0o->bf0, batch_group_count=3
}
"""
    check_hlo(text, _rand((6, 2, 5)), _rand((2, 2, 6)))


def test_conv_transpose_and_depthwise_kernel_gradient() -> None:
    def up(x: jax.Array, k: jax.Array) -> jax.Array:
        return jax.lax.conv_transpose(x, k, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    check_against_jax(up, _rand((1, 5, 5, 2)), _rand((3, 3, 2, 4)))

    def loss(x: jax.Array, k: jax.Array) -> jax.Array:
        return jnp.sum(jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", feature_group_count=4) ** 2)

    check_against_jax(jax.grad(loss, argnums=1), _rand((2, 4, 6, 6)), _rand((8, 1, 3, 3)))


def test_feature_mismatch_names_the_instruction() -> None:
    from tpusim.compiler.hlo import parse_module
    from tpusim.compiler.hlo.reference import EvalContext, EvaluationError, evaluate_instruction

    text = """HloModule m
ENTRY e {
  x = f32[1,4,5] parameter(0)
  k = f32[2,4,3] parameter(1)
  ROOT c = f32[1,2,3] convolution(x, k), window={size=3}, dim_labels=bf0_oi0->bf0
}
"""
    module = parse_module(text)
    comp = module.entry_computation
    message = (
        r"^%c \(convolution.*\): input features 3 != kernel input features 4 x feature_group_count 1 "
        r"\(input \[1, 3, 5\], kernel \[2, 4, 3\]\)$"
    )
    with pytest.raises(EvaluationError, match=message):
        evaluate_instruction(EvalContext(module), comp, comp["c"], [_rand((1, 3, 5)), _rand((2, 4, 3))])


@pytest.mark.parametrize(
    ("lhs", "rhs", "out", "attrs"),
    [
        ("f32[4,16,8]", "f32[8,32,1]", "f32[4,16,32]", "window={size=1}, dim_labels=0bf_io0->0bf"),
        ("f32[4,16,32,1]", "f32[32,8,64,1]", "f32[4,16,8,64]",
         "window={size=1x8 pad=0_0x7_7 rhs_reversal=0x1}, dim_labels=0bf1_i1o0->0b1f"),
        ("f32[4,16,8,32]", "f32[8,32,64,1]", "f32[4,16,64,1]", "window={size=1x8}, dim_labels=0b1f_1io0->0bf1"),
        ("f32[4,16,8,32]", "f32[4,16,8,32]", "f32[4,8,16,16]",
         "window={size=4x8 stride=3x7 lhs_dilate=4x8}, dim_labels=0b1f_0o1i->01bf"),
        ("f32[8,16,32]", "f32[8,32,64]", "f32[8,16,64]",
         "window={size=8 stride=7 lhs_dilate=8}, dim_labels=0bf_0io->0bf"),
    ],
)  # fmt: skip
def test_products_xla_tpu_writes_as_convolutions_against_xla_cpu(lhs: str, rhs: str, out: str, attrs: str) -> None:
    """The matrix products of XLA:TPU's compiled modules, written as convolutions with dilations, strides and
    reversed padded windows (tests/data/corpus), evaluate as XLA CPU evaluates them."""
    text = convolution_text(lhs, rhs, out, attrs)
    module = parse_module(text)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(p.shape.dimensions).astype(np.float32) for p in module.entry_computation.parameters]
    want = run_hlo_on_xla(text, *xs)[0]
    got = evaluate(module, xs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_a_product_written_as_a_base_dilated_convolution_costs_its_products() -> None:
    """XLA:TPU writes attention's P @ V (b4 h16) as a convolution whose batch and head dimensions are spatial,
    base-dilated 4x16 (``window={size=4x16 stride=3x15 lhs_dilate=4x16}``): each output meets one input
    element per tap, so nearly all of the dilated input is holes. The reference materialised that input and
    its patch matrix (28 GB at sequence 1024, so ``--check`` of that program ran out of memory); now its memory
    follows the arrays: the peak here is a few times the operands' 1.5 MB, where the patch matrix alone was
    50 MB, and the result is the einsum."""
    import tracemalloc

    s, d = 64, 32
    text = convolution_text(
        f"f32[4,16,{s},{s}]", f"f32[4,16,{s},{d}]", f"f32[4,16,{s},{d}]",
        "window={size=4x16 stride=3x15 lhs_dilate=4x16}, dim_labels=01bf_01io->01bf",
    )  # fmt: skip
    p, v = _rand((4, 16, s, s)), _rand((4, 16, s, d))
    module = parse_module(text)
    tracemalloc.start()
    try:
        got = evaluate(module, [p, v])[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_allclose(got, np.einsum("bhqk,bhkd->bhqd", p, v), rtol=1e-5, atol=1e-4)
    assert peak < 8 * (p.nbytes + v.nbytes), peak
