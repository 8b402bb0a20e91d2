"""Dot strength reduction (tpusim.compiler.dot_strength): a dot one of whose operands has no free dimension (a
batch of vector-vector or matrix-vector products) is a multiply and a reduce on the vector unit, as XLA's
algebraic simplifier makes it; on the MXU each product was a 1 x K x N pass (``einsum("bi,bi->b")`` of 256 x
512: 119 us on v5e, XLA estimates 1.4 us)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpusim
from tpusim.compiler.dot_strength import reduce_vector_dots
from tpusim.compiler.hlo import parse_module

FORMS = {
    "bi,bi->b": ((256, 512), (256, 512)),
    "i,i->": ((1000,), (1000,)),
    "bij,bij->b": ((8, 16, 64), (8, 16, 64)),
    "ib,bi->b": ((64, 32), (32, 64)),
    "ebd,be->bd": ((4, 64, 128), (64, 4)),  # a mixture of experts' outputs weighted by their gates
    "ij,j->i": ((4, 200), (200,)),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_vector_products_equal_jax_on_the_vector_unit(form: str, dtype: str) -> None:
    rng = np.random.default_rng(0)
    a, b = (np.asarray(rng.uniform(-2, 2, s)).astype(jnp.dtype(dtype)) for s in FORMS[form])

    def f(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.einsum(form, x, y, preferred_element_type=jnp.int32 if dtype == "int8" else None)

    result = tpusim.simulate(jax.jit(f).lower(a, b).as_text(dialect="hlo"), [a, b], config="tpu_v5e")
    want = np.asarray(jax.jit(f)(a, b), np.float64)
    np.testing.assert_allclose(
        np.asarray(result.outputs[0], np.float64), want, rtol=1e-5, atol=1e-5 * np.abs(want).max()
    )
    ops = {type(i).__name__ for s in result.compiled.program.streams for i in s.instructions}
    assert not ops & {"MxuMatmul", "MxuLoadWeights"}, ops
    assert not result.fallbacks


def test_a_batch_of_row_products_runs_at_the_vector_units_speed() -> None:
    a = np.ones((256, 512), np.float32)
    text = jax.jit(lambda x, y: jnp.einsum("bi,bi->b", x, y)).lower(a, a).as_text(dialect="hlo")
    assert tpusim.simulate(text, config="tpu_v5e", timing_only=True).seconds < 5e-6  # (was 119 us)


def test_products_with_free_dimensions_on_both_sides_and_laid_out_modules_are_left_alone() -> None:
    matmul = parse_module(
        "HloModule m\nENTRY e {\n  a = f32[8,16] parameter(0)\n  b = f32[16,4] parameter(1)\n"
        "  ROOT d = f32[8,4] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n"
    )
    assert reduce_vector_dots(matmul) is matmul
    tiled = parse_module(
        "HloModule m\nENTRY e {\n  a = f32[8,16]{1,0:T(8,128)} parameter(0)\n"
        "  b = f32[8,16]{1,0:T(8,128)} parameter(1)\n"
        "  ROOT d = f32[8]{0:T(256)} dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={1}, "
        "rhs_contracting_dims={1}\n}\n"
    )
    assert reduce_vector_dots(tiled) is tiled
    long = parse_module(  # (a contraction of 64 into 256 columns: MXU tiles worth latching)
        "HloModule m\nENTRY e {\n  a = f32[32,64] parameter(0)\n  b = f32[32,256,64] parameter(1)\n"
        "  ROOT d = f32[32,256] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={1}, "
        "rhs_contracting_dims={2}\n}\n"
    )
    assert reduce_vector_dots(long) is long


def test_a_gated_sum_of_expert_outputs_runs_on_the_vector_unit() -> None:
    """The gradient of a top-2 mixture of experts weights 64 tokens' outputs of 4 experts by their gates: a
    batch of 64 matrix-vector products ``[4,128] x [4]``. On the MXU each was a 1 x 4 x 128 pass with its own
    weight latch (21,800 cycles); as a multiply and a reduce a few hundred."""
    x, g = np.ones((4, 64, 128), np.float32), np.ones((64, 4), np.float32)
    text = jax.jit(lambda x, g: jnp.einsum("ebd,be->bd", x, g)).lower(x, g).as_text(dialect="hlo")
    assert tpusim.simulate(text, config="tpu_v5e", timing_only=True).cycles < 3_000
