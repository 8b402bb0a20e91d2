"""JAX's threefry random numbers on the simulated chip, bit for bit against JAX (issue 13).

JAX lowers threefry for TPU unrolled: 20 rounds of u32 adds, rotates (shift-left | shift-right-logical),
xors, a u64 iota split into two u32 halves, then bitcast-convert and float arithmetic for uniform and
normal. Everything here runs on the device model (VPU, no fallback kernel) and must equal
``jax.jit(f)(...)``.

``jax.random.normal`` is the one exception, and not tpusim's: XLA CPU, the oracle, contracts each
``multiply`` + ``add`` of erf_inv's Horner polynomial into one fused multiply-add (one rounding instead of
two: :func:`test_xla_cpu_contracts_multiply_add`) and uses its own log1p approximation, while HLO's
semantics, the reference interpreter and the device round every op. Emulating those two XLA CPU choices on
JAX's own uniform values reproduces JAX's normals bit for bit (measured: 0 of 11,100 differ; 489 differ
without), so normals are checked bit for bit against the reference interpreter and within a few ulp of JAX.

Lowered for CPU instead (``lowering_platforms=("cpu",)``), JAX rolls the rounds into a ``while`` loop whose
body rotates the key schedule (``ks0, ks1, ks2 -> ks1, ks2, ks0``) and swaps the rotation tables: that is
the loop-state permutation bug of issue 13 (every output wrong on the device, the reference right).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax_oracle import ulp_distance

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate

KEYS: dict[str, Callable[[], Any]] = {
    "PRNGKey0": lambda: jax.random.PRNGKey(0),
    "key0": lambda: jax.random.key(0),
    "PRNGKey_big": lambda: jax.random.PRNGKey(2**31 - 3),
}

FUNCTIONS: dict[str, Callable[[Any], Any]] = {
    "split": lambda k: jax.random.split(k),
    "split_5x3": lambda k: jax.random.split(k, (5, 3)),
    "fold_in": lambda k: jax.random.fold_in(k, 7),
    "bits_u32": lambda k: jax.random.bits(k, (3, 5)),
    "bits_u32_tiles": lambda k: jax.random.bits(k, (9, 260)),
    "bits_u8": lambda k: jax.random.bits(k, (100,), jnp.uint8),
    "bits_u16": lambda k: jax.random.bits(k, (7, 9), jnp.uint16),
    "uniform": lambda k: jax.random.uniform(k, (16, 128)),
    "uniform_range": lambda k: jax.random.uniform(k, (1000,), minval=-3.0, maxval=5.0),
    "uniform_bf16": lambda k: jax.random.uniform(k, (256,), jnp.bfloat16),
    "bernoulli": lambda k: jax.random.bernoulli(k, 0.3, (64, 5)),
    "randint": lambda k: jax.random.randint(k, (100,), -5, 1000),
    "split_then_uniform": lambda k: jax.random.uniform(jax.random.split(k)[1], (8,)),
    "scalar_bits": lambda k: jax.random.bits(k, ()),
}


def _data(x: Any) -> np.ndarray:
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(x))
    return np.asarray(x)


# Every function on the classic key; the typed key (a key<fry> parameter behind a Sharding annotation) and
# another seed on a few (each run is about a second of a shared machine).
CASES = [
    *((name, "PRNGKey0") for name in sorted(FUNCTIONS)),
    *((name, "key0") for name in ("split", "bits_u32", "uniform", "bernoulli", "split_then_uniform")),
    ("bits_u32_tiles", "PRNGKey_big"),
]


@pytest.mark.parametrize(("name", "key"), CASES)
def test_threefry_bit_exact(name: str, key: str) -> None:
    fn, k = FUNCTIONS[name], KEYS[key]()
    want = jax.jit(fn)(k)
    result = tpusim.simulate_jax(fn, k)
    assert not result.fallbacks, result.fallbacks  # the device computed it, not the reference
    got = result.tree
    assert jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key) == jax.dtypes.issubdtype(
        want.dtype, jax.dtypes.prng_key
    )
    np.testing.assert_array_equal(_data(got), _data(want))
    assert _data(got).dtype == _data(want).dtype


def test_permutation_bit_exact() -> None:
    """Random bits as sort keys (the sort itself is a fallback kernel)."""
    fn = lambda k: jax.random.permutation(k, 50)  # noqa: E731
    k = jax.random.PRNGKey(0)
    np.testing.assert_array_equal(tpusim.simulate_jax(fn, k).tree, np.asarray(jax.jit(fn)(k)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_normal(dtype: Any) -> None:
    """Device == reference interpreter bit for bit; both within a few ulp of JAX (see the module note)."""
    fn = lambda k: jax.random.normal(k, (37, 300), dtype)  # noqa: E731
    k = jax.random.PRNGKey(0)
    want = np.asarray(jax.jit(fn)(k))
    result = tpusim.simulate_jax(fn, k)
    assert not result.fallbacks, result.fallbacks
    got = np.asarray(result.tree)
    hlo = jax.jit(fn).trace(k).lower(lowering_platforms=("tpu",)).as_text(dialect="hlo")
    ref = np.asarray(evaluate(parse_module(hlo), [np.asarray(k)])[0])
    np.testing.assert_array_equal(got, ref)
    # f32: log1p off by <= 2 ulp and unfused multiply-adds move the polynomial by <= 3 ulp (measured 3)
    assert ulp_distance(got, want).max() <= (4 if dtype == jnp.float32 else 1)


def test_xla_cpu_contracts_multiply_add() -> None:
    """Why normals are not bit-exact against JAX: XLA CPU turns ``a * b + c`` into ``fma(a, b, c)``.

    A canary: should XLA CPU stop contracting, the tolerance of :func:`test_normal` can shrink."""
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(4096).astype(np.float32) for _ in range(3))
    got = np.asarray(jax.jit(lambda a, b, c: a * b + c)(a, b, c))
    fused = (a.astype(np.float64) * b + c).astype(np.float32)  # the f64 product is exact: one rounding
    np.testing.assert_array_equal(got, fused)
    assert (got != a * b + c).any()


@pytest.mark.parametrize(
    "fn",
    [lambda k: jax.random.split(k), lambda k: jax.random.bits(k, (64,)), lambda k: jax.random.uniform(k, (64,))],
    ids=["split", "bits", "uniform"],
)
def test_rolled_threefry_loop(fn: Callable[[Any], Any]) -> None:
    """JAX's CPU lowering rolls threefry into a while loop whose body rotates its state."""
    k = jax.random.PRNGKey(0)
    hlo = jax.jit(fn).trace(k).lower(lowering_platforms=("cpu",)).as_text(dialect="hlo")
    assert " while(" in hlo
    want = np.asarray(jax.jit(fn)(k))
    ref = np.asarray(evaluate(parse_module(hlo), [np.asarray(k)])[0])
    np.testing.assert_array_equal(ref, want)
    np.testing.assert_array_equal(tpusim.simulate(hlo, [np.asarray(k)]).outputs[0], want)
