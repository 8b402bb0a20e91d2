"""After fusing, a broadcast of a scalar constant that only fusions read is computed inside each of them (XLA
duplicates such cheap producers into their consumers): JAX's lowering of a model shares one broadcast of each
GELU constant between all its layers, and as its users sit in different fusions it stayed a kernel writing a
whole activation-sized array to HBM for every layer's MLP to read back (four d1024 decoder blocks took
12,442 us, 4.9x one block; now 4.0x)."""

from __future__ import annotations

import numpy as np

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate
from tpusim.compiler.hlo.reference.io import random_inputs
from tpusim.compiler.options import CompileOptions
from tpusim.compiler.passes import prepare_module

TWO_LAYERS = """HloModule two_layers
ENTRY main {
  x = f32[256,512] parameter(0)
  w = f32[512,512] parameter(1)
  c = f32[] constant(0.5)
  cb = f32[256,512] broadcast(c), dimensions={}
  h1 = f32[256,512] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={highest,highest}
  t1 = f32[256,512] tanh(h1)
  g1 = f32[256,512] multiply(t1, cb)
  h2 = f32[256,512] dot(g1, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={highest,highest}
  t2 = f32[256,512] tanh(h2)
  ROOT g2 = f32[256,512] multiply(t2, cb)
}"""


def test_a_broadcast_shared_by_two_layers_is_computed_inside_each_kernel() -> None:
    m = parse_module(TWO_LAYERS)
    prepared = prepare_module(m, CompileOptions())
    entry = prepared.entry_computation
    assert not [i.name for i in entry.instructions if i.opcode in ("broadcast", "constant") and i.shape.rank]
    fusions = [i for i in entry.instructions if i.opcode == "fusion"]
    assert len(fusions) == 2 and all(not prepared[f.attr("calls")].parameters[1:] for f in fusions)
    assert all(any(j.opcode == "broadcast" for j in prepared[f.attr("calls")].instructions) for f in fusions)
    inputs = random_inputs(m, 3)[0]
    got = np.asarray(tpusim.simulate(m, inputs, config="tpu_v5e").outputs[0])
    want = np.asarray(evaluate(m, inputs)[0])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)  # (f32 sums in another order)


def test_a_fused_value_does_not_lay_a_few_elements_along_the_lanes() -> None:
    """``jnp.repeat(x, 2, axis=1)``: a fused ``[512,512,2]`` broadcast reshaped to ``[512,1024]``. In the
    reshape's row-major order its lanes hold 2 of 128 values, so every block held 64 times its bytes (220 us
    on v5e; XLA estimates 18.5 us); with the two minor dimensions swapped the reshape crosses lanes once."""
    text = """HloModule repeat
ENTRY main {
  x = f32[512,512] parameter(0)
  b = f32[512,512,2] broadcast(x), dimensions={0,1}
  ROOT r = f32[512,1024] reshape(b)
}
"""
    x = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    result = tpusim.simulate(text, [x], config="tpu_v5e")
    np.testing.assert_array_equal(result.outputs[0], np.repeat(x, 2, axis=1))
    inner = next(c for c in result.compiled.module.computations if not c.is_entry)
    assert inner["b"].array_shape.effective_layout.minor_to_major[:2] == (1, 2)  # 512 along the lanes
    assert result.seconds < 10e-6


def test_statistics_over_the_blocked_dimension_stay_kernels_of_their_own() -> None:
    """Batch norm of f32[16,28,28,256] (statistics over N, H and W, as JAX writes ``x.mean((0, 1, 2))`` and
    ``x.var``): fused into the normalisation, which is cut into blocks along N, each reduction over the whole
    array ran again for every block (232 us on v5e; XLA:TPU's own module runs in 55 us in tpusim and XLA
    estimates 139). The reductions now stay out of the blocked kernel: within 1.5x of the array's HBM floor
    for the passes the program needs (read it for the mean, again for the variance, once more to normalise,
    and write the result: four times its bytes)."""

    def bn(x: object) -> object:
        import jax

        m = x.mean((0, 1, 2))  # type: ignore[attr-defined]
        v = x.var((0, 1, 2))  # type: ignore[attr-defined]
        return (x - m) * jax.lax.rsqrt(v + 1e-5)

    x = np.random.default_rng(2).standard_normal((16, 28, 28, 256)).astype(np.float32)
    result = tpusim.simulate_jax(bn, x, config="tpu_v5e")
    import jax

    np.testing.assert_allclose(np.asarray(result.outputs[0]), np.asarray(jax.jit(bn)(x)), rtol=1e-4, atol=1e-4)
    floor = 4 * x.nbytes / result.compiled.config.hbm.bandwidth_bytes_per_s
    assert result.seconds <= 1.5 * floor, (result.seconds, floor)


def test_pads_with_interior_padding_stay_out_of_kernels() -> None:
    """``jax.lax.associative_scan`` interleaves its levels with pads that leave gaps between the elements; the
    fusion pass took them into one kernel with everything else, whose vector blocks cannot hold gaps, so the
    whole program ran as one fallback (its declared cost: 2 us where it takes 19). Such a pad stays out of
    kernels (the pad lowering fills a VMEM block and copies the elements into place): no fallback, JAX's
    answer."""
    import jax

    def linear_recurrence(a: object, b: object) -> object:
        def combine(x: tuple[object, object], y: tuple[object, object]) -> tuple[object, object]:
            return x[0] * y[0], y[0] * x[1] + y[1]  # type: ignore[operator]

        return jax.lax.associative_scan(combine, (a, b), axis=1)[1]

    rng = np.random.default_rng(0)
    a, b = (
        rng.uniform(0.5, 1.0, (4, 256, 128)).astype(np.float32),
        rng.standard_normal((4, 256, 128)).astype(np.float32),
    )
    result = tpusim.simulate_jax(linear_recurrence, a, b)
    assert result.fallbacks == ()
    want = np.asarray(jax.jit(linear_recurrence)(a, b))
    np.testing.assert_allclose(np.asarray(result.tree), want, rtol=1e-5, atol=1e-5)
