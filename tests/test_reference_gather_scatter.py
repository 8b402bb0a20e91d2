"""gather and scatter against JAX on CPU (jnp indexing, .at[] updates, vmap batching dims) and XLA CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from heavy_checks import check_hlo
from jax_oracle import check_against_jax

RNG = np.random.default_rng(3)  # reseeded for every test (conftest.py)


def _rand(shape: tuple[int, ...], dtype: object = np.float32) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return RNG.random(shape) < 0.5
    if dt.kind in "iu":
        return RNG.integers(0, 100, size=shape).astype(dt)
    if dt.kind == "c":
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dt)
    return RNG.standard_normal(shape).astype(dt)


IDX = np.array([3, 0, 3, -1, 7, -9], np.int32)  # duplicates, negatives, out of bounds (size 6 below)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int32, np.uint8, np.bool_, np.complex64])
def test_jnp_indexing(dtype: object) -> None:
    x = _rand((6, 5), dtype)

    def f(a: jax.Array, i: jax.Array) -> tuple[jax.Array, ...]:
        return a[i], a[:, i[:3]], a[i[:2], i[2:4]], a[jnp.array([[0, 1], [5, 2]])], a[1:4, 2]

    check_against_jax(f, x, IDX)


@pytest.mark.parametrize("mode", ["clip", "fill", "wrap"])
def test_take_modes(mode: str) -> None:
    check_against_jax(lambda a, i: jnp.take(a, i, axis=1, mode=mode), _rand((3, 6)), IDX)


def test_gather_of_a_single_element_is_a_rank_0_array() -> None:
    x = RNG.standard_normal(11).astype(np.float32)
    check_against_jax(lambda a: (jnp.median(a), jnp.percentile(a, 30.0), a[jnp.argmax(a)]), x)


def test_take_along_axis_and_dynamic_slice_like_gather() -> None:
    x = _rand((4, 7))
    idx = RNG.integers(0, 7, size=(4, 3)).astype(np.int32)
    check_against_jax(lambda a, i: jnp.take_along_axis(a, i, axis=1), x, idx)


def test_vmapped_gather_uses_batching_dims() -> None:
    x = _rand((3, 6, 2))
    idx = RNG.integers(0, 6, size=(3, 4)).astype(np.int32)
    check_against_jax(jax.vmap(lambda a, i: a[i]), x, idx)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int32, np.uint8])
@pytest.mark.parametrize("update", ["add", "set", "max", "min", "mul"])
def test_at_updates_with_duplicates(update: str, dtype: object) -> None:
    x = _rand((6, 3), dtype)
    u = _rand((6, 3), dtype)

    def f(a: jax.Array, i: jax.Array, v: jax.Array) -> jax.Array:
        return getattr(a.at[i], update)(v)

    check_against_jax(f, x, IDX, u)


@pytest.mark.parametrize("mode", ["drop", "clip", "promise_in_bounds"])
def test_scatter_modes(mode: str) -> None:
    x = _rand((6,))
    check_against_jax(lambda a, i, v: a.at[i].add(v, mode=mode), x, IDX, _rand((6,)))


def test_scatter_windows_and_pred() -> None:
    x = _rand((5, 4), np.bool_)
    check_against_jax(lambda a, i: a.at[i, 1:3].set(True), x, np.array([0, 4, 4], np.int32))
    check_against_jax(lambda a, i, v: a.at[:, i].add(v), _rand((3, 5)), np.array([1, 1, 4], np.int32), _rand((3, 3)))


def test_vmapped_scatter_uses_batching_dims() -> None:
    x = _rand((3, 6))
    idx = RNG.integers(0, 6, size=(3, 4)).astype(np.int32)
    check_against_jax(jax.vmap(lambda a, i, v: a.at[i].add(v)), x, idx, _rand((3, 4)))


def test_scatter_add_is_ordered_for_floats() -> None:
    # Many duplicate float adds into one slot: updates apply in row-major order like XLA CPU's loop.
    u = (RNG.standard_normal(500) * 10.0 ** RNG.integers(-4, 5, 500)).astype(np.float32)
    check_against_jax(lambda v, i: jnp.zeros(2, jnp.float32).at[i].add(v), u, np.zeros(500, np.int32))


def test_scatter_arithmetic_flushes_denormals_like_xla() -> None:
    """XLA CPU's f32 (and bf16-in-f32) arithmetic flushes denormal operands and results; scatter's combiner
    is that arithmetic: 1e-39 + 1e-39 adds two zeros, and 1.5e-38 - 1.4e-38 (a denormal) becomes 0."""
    x = np.array([0, 1.5e-38, 0, 2], np.float32)
    u = np.array([1e-39, 1e-39, -1.4e-38, 1e-39, 5], np.float32)
    i = np.array([0, 0, 1, 2, 3], np.int32)
    for dtype in (np.float32, ml_dtypes.bfloat16):
        check_against_jax(lambda a, j, v: (a.at[j].add(v), a.at[j].max(v)), x.astype(dtype), i, u.astype(dtype))


def test_non_commutative_scatter_applies_updates_in_order_against_xla() -> None:
    # subtract is order-sensitive: rows 1 and 3 receive two updates each; index 9 drops its whole window.
    text = """HloModule m
sub {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] subtract(a, b)
}
ENTRY e {
  op = f32[5,3] parameter(0)
  idx = s32[1,5] parameter(1)
  up = f32[5,3] parameter(2)
  ROOT sc = f32[5,3] scatter(op, idx, up), update_window_dims={1}, inserted_window_dims={0}, ATTRS, to_apply=sub
}
""".replace("ATTRS", "scatter_dims_to_operand_dims={0}, index_vector_dim=0")
    idx = np.array([[1, 3, 1, 9, 3]], np.int32)
    check_hlo(text, _rand((5, 3)), idx, _rand((5, 3)))


def test_variadic_scatter_with_window_first_against_xla() -> None:
    # Two operands updated together; the update window dimension comes before the scatter dimension, and a
    # window of 2 starting at 4 (of 5) is out of bounds as a whole.
    text = """HloModule m
comb {
  a0 = f32[] parameter(0)
  a1 = s32[] parameter(1)
  b0 = f32[] parameter(2)
  b1 = s32[] parameter(3)
  s = f32[] add(a0, b0)
  m = s32[] maximum(a1, b1)
  ROOT t = (f32[], s32[]) tuple(s, m)
}
ENTRY e {
  x = f32[5,4] parameter(0)
  y = s32[5,4] parameter(1)
  idx = s32[3,2] parameter(2)
  u = f32[2,3] parameter(3)
  v = s32[2,3] parameter(4)
  ROOT sc = (f32[5,4], s32[5,4]) scatter(x, y, idx, u, v), update_window_dims={0}, inserted_window_dims={1}, ATTRS
}
""".replace("ATTRS", "scatter_dims_to_operand_dims={0,1}, index_vector_dim=1, to_apply=comb")
    idx = np.array([[0, 1], [3, 3], [4, 0]], np.int32)
    check_hlo(text, _rand((5, 4)), _rand((5, 4), np.int32), idx, _rand((2, 3)), _rand((2, 3), np.int32))


def test_gather_index_vector_in_the_middle_and_clamping_against_xla() -> None:
    # Index vectors along indices dim 1 map to operand dims (2, 0); out-of-range starts are clamped.
    text = """HloModule m
ENTRY e {
  x = f32[4,5,6] parameter(0)
  i = s32[3,2,2] parameter(1)
  ROOT g = f32[5,3,2,2] gather(x, i), offset_dims={0,3}, collapsed_slice_dims={0}, start_index_map={2,0}, ATTRS
}
""".replace("ATTRS", "index_vector_dim=1, slice_sizes={1,5,2}")
    idx = np.array([[[0, 1], [3, 9]], [[5, -2], [4, 3]], [[1, 0], [2, 2]]], np.int32)
    check_hlo(text, _rand((4, 5, 6)), idx)


def test_gather_batching_dims_against_xla() -> None:
    text = """HloModule m
ENTRY e {
  x = f32[3,6,2] parameter(0)
  i = s32[4,3] parameter(1)
  ROOT g = f32[4,3,2] gather(x, i), offset_dims={2}, collapsed_slice_dims={1}, start_index_map={1}, ATTRS
}
""".replace(
        "ATTRS",
        "operand_batching_dims={0}, start_indices_batching_dims={1}, index_vector_dim=2, slice_sizes={1,1,2}",
    )
    check_hlo(text, _rand((3, 6, 2)), RNG.integers(-1, 7, size=(4, 3)).astype(np.int32))
