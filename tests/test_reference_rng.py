"""Random numbers: rng-bit-generator bit for bit against JAX CPU, jax.random end to end, rng's distribution."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from heavy_checks import check_hlo, reference_of_text
from jax_oracle import check_against_jax

from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate

ALGORITHMS = [
    jax.lax.RandomAlgorithm.RNG_THREE_FRY,
    jax.lax.RandomAlgorithm.RNG_PHILOX,
    jax.lax.RandomAlgorithm.RNG_DEFAULT,
]
SHAPES = [(), (1,), (5,), (5, 3), (3, 5), (2, 3, 4), (7, 1, 3)]
KEY = np.array([0x12345678, 0x9ABCDEF0, 7, 0xFFFFFFFF], np.uint32)  # counter low word about to carry


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", [np.uint32, np.uint8, np.uint16])
@pytest.mark.parametrize("shape", SHAPES)
def test_rng_bit_generator_bit_exact(algorithm: jax.lax.RandomAlgorithm, dtype: object, shape: tuple[int, ...]) -> None:
    check_against_jax(lambda k: jax.lax.rng_bit_generator(k, shape, dtype, algorithm=algorithm), KEY)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 3)])
def test_rng_bit_generator_u64_bit_exact(algorithm: jax.lax.RandomAlgorithm, shape: tuple[int, ...]) -> None:
    with jax.enable_x64(True):
        check_against_jax(lambda k: jax.lax.rng_bit_generator(k, shape, np.uint64, algorithm=algorithm), KEY)


def test_philox_with_a_three_word_state_against_xla() -> None:
    text = """HloModule m
ENTRY e {
  s = u64[3] parameter(0)
  ROOT r = (u64[3], u32[3,7]) rng-bit-generator(s), algorithm=rng_philox
}
"""
    state = np.array([0x0123456789ABCDEF, 2**64 - 3, 41], np.uint64)  # counter low word carries into high
    got = check_hlo(text, state)
    assert int(got[0][2]) == 42


def test_jax_random_threefry_end_to_end() -> None:
    def f(seed: jax.Array) -> tuple[jax.Array, ...]:
        key = jax.random.key(seed)
        k1, k2, k3, k4 = jax.random.split(key, 4)
        return (
            jax.random.bits(k1, (3, 5)),
            jax.random.uniform(k2, (4, 3)),
            jax.random.normal(k3, (6,)),
            jax.random.bernoulli(k4, 0.3, (10,)),
            jax.random.randint(k1, (7,), -5, 9),
        )

    check_against_jax(f, np.int32(42), tol="composite")


def test_jax_random_rbg_uses_rng_bit_generator() -> None:
    def f(seed: jax.Array) -> tuple[jax.Array, ...]:
        key = jax.random.key(seed, impl="rbg")
        return jax.random.bits(key, (4, 4)), jax.random.uniform(jax.random.fold_in(key, 3), (5,))

    check_against_jax(f, np.int32(7))


RNG_HLO = """HloModule m
ENTRY e {
  lo = f32[] constant(-2)
  hi = f32[] constant(3)
  u = f32[20000] rng(lo, hi), distribution=rng_uniform
  mu = f32[] constant(1.5)
  sd = f32[] constant(0.5)
  n = f32[20001] rng(mu, sd), distribution=rng_normal
  a = s32[] constant(-3)
  b = s32[] constant(4)
  i = s32[7000] rng(a, b), distribution=rng_uniform
  ROOT t = (f32[20000], f32[20001], s32[7000]) tuple(u, n, i)
}
"""


def test_rng_is_deterministic_and_distributed_as_asked() -> None:
    u, n, i = reference_of_text(RNG_HLO)
    again = reference_of_text(RNG_HLO)
    for x, y in zip((u, n, i), again):
        np.testing.assert_array_equal(x, y)
    assert u.min() >= -2 and u.max() < 3
    assert abs(u.mean() - 0.5) < 0.05 and abs(u.var() - 25 / 12) < 0.1
    assert abs(n.mean() - 1.5) < 0.02 and abs(n.std() - 0.5) < 0.02
    assert abs(np.mean(np.abs(n - 1.5) < 0.5) - 0.6827) < 0.02  # one sigma
    assert set(np.unique(i)) == set(range(-3, 4))
    assert np.all(np.abs(np.bincount(i + 3) / i.size - 1 / 7) < 0.02)
    # Successive rng instructions draw fresh numbers from the advancing state.
    assert not np.array_equal(u[:100], (n[:100] - 1.5) / 0.5)


def test_rng_of_bf16_rounds_f32_draws() -> None:
    text = """HloModule m
ENTRY e {
  lo = bf16[] constant(0)
  hi = bf16[] constant(1)
  ROOT u = bf16[1000] rng(lo, hi), distribution=rng_uniform
}
"""
    (u,) = reference_of_text(text)
    assert u.dtype == jnp.bfloat16 and float(u.min()) >= 0 and float(u.max()) <= 1


def test_the_bits_alone_as_xla_tpu_compiles_an_unused_state() -> None:
    """XLA:TPU drops an rng-bit-generator's new state when nothing reads it (its module of a JAX ``rbg``
    dropout: ``u32[128,256] rng-bit-generator(u64[2] state)``); the verifier refused the form. Its bits are
    those of the tuple form, on the device too."""
    import tpusim

    def module(result: str, root: str) -> str:
        return (
            "HloModule r\nENTRY e {\n  s = u64[2] parameter(0)\n"
            f"  g = {result} rng-bit-generator(s), algorithm=rng_philox\n{root}}}\n"
        )

    alone = parse_module(module("u32[16,256]", ""))
    pair = parse_module(module("(u64[2], u32[16,256])", "  ROOT b = u32[16,256] get-tuple-element(g), index=1\n"))
    state = np.array([7, 11], np.uint64)
    want = evaluate(pair, [state])[0]
    np.testing.assert_array_equal(evaluate(alone, [state])[0], want)
    np.testing.assert_array_equal(tpusim.simulate(alone, [state]).outputs[0], want)
