"""reduce, reduce-window and select-and-scatter against JAX on CPU and XLA CPU on HLO text."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from heavy_checks import check_hlo
from jax_oracle import Tolerance, check_against_jax

from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.ir import WindowDim
from tpusim.compiler.hlo.reference import evaluate

RNG = np.random.default_rng(0)  # reseeded for every test (conftest.py)


def _rand(shape: tuple[int, ...], dtype: object = np.float32) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return RNG.random(shape) < 0.5
    if dt.kind in "iu":
        return RNG.integers(0 if dt.kind == "u" else -50, 50, size=shape).astype(dt)
    if dt.kind == "c":
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dt)
    return RNG.standard_normal(shape).astype(dt)


def _reduce(op: object, init: object, dims: tuple[int, ...]) -> object:
    return lambda x: jax.lax.reduce(x, np.asarray(init, x.dtype), op, dims)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16, np.int32, np.uint8, np.complex64])
@pytest.mark.parametrize("dims", [(0,), (1,), (0, 2), (0, 1, 2)])
def test_sum_over_dimensions(dtype: object, dims: tuple[int, ...]) -> None:
    check_against_jax(_reduce(jax.lax.add, 0, dims), _rand((5, 4, 3), dtype))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int32, np.uint8])
@pytest.mark.parametrize(("op", "ident"), [(jax.lax.max, "min"), (jax.lax.min, "max"), (jax.lax.mul, 1)])
def test_max_min_product(dtype: object, op: object, ident: object) -> None:
    dt = np.dtype(dtype)
    info = ml_dtypes.finfo(dt) if dt.kind not in "iu" else np.iinfo(dt)
    init = {"min": -np.inf if dt.kind not in "iu" else info.min, "max": np.inf if dt.kind not in "iu" else info.max}
    check_against_jax(_reduce(op, init.get(ident, ident), (1,)), _rand((4, 6), dtype))


def test_max_propagates_nan() -> None:
    x = _rand((3, 4))
    x[1, 2] = np.nan
    got = check_against_jax(_reduce(jax.lax.max, -np.inf, (1,)), x)
    assert np.isnan(got[0][1]) and not np.isnan(got[0][0])


def test_pred_any_and_all() -> None:
    x = _rand((4, 7), np.bool_)
    check_against_jax(lambda a: (jnp.any(a, axis=1), jnp.all(a, axis=0)), x)


def test_long_f32_sum_stays_within_a_few_ulp() -> None:
    check_against_jax(lambda a: jnp.sum(a, axis=-1), _rand((3, 4000)))


def test_bf16_reduce_accumulates_in_f32() -> None:
    # 4096 ones: a bf16 accumulator would stop at 256.
    got = check_against_jax(_reduce(jax.lax.add, 0, (0,)), np.ones(4096, ml_dtypes.bfloat16))
    assert float(got[0]) == 4096.0


def test_empty_reduction_gives_init() -> None:
    got = check_against_jax(_reduce(jax.lax.max, -np.inf, (1,)), np.zeros((3, 0), np.float32))
    assert np.all(got[0] == -np.inf)


def test_argmax_and_argmin_variadic_reduce() -> None:
    x = np.round(_rand((5, 9)), 1)
    x[2, 3] = np.nan
    check_against_jax(lambda a: (jnp.argmax(a, axis=1), jnp.argmin(a, axis=0)), x)


def test_variadic_reduce_with_a_generic_computation_against_xla() -> None:
    # (sum, sum of squares) of a row, and a non-commutative-looking but associative combiner (max of
    # value, keeping the first index of the max): one vectorised call per tree level.
    text = """HloModule m
comb {
  a0 = f32[] parameter(0)
  a1 = s32[] parameter(1)
  b0 = f32[] parameter(2)
  b1 = s32[] parameter(3)
  gt = pred[] compare(b0, a0), direction=GT
  v = f32[] select(gt, b0, a0)
  i = s32[] select(gt, b1, a1)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
ENTRY e {
  x = f32[4,13] parameter(0)
  idx = s32[4,13] parameter(1)
  lo = f32[] constant(-inf)
  z = s32[] constant(0)
  ROOT r = (f32[4], s32[4]) reduce(x, idx, lo, z), dimensions={1}, to_apply=comb
}
"""
    x = np.round(_rand((4, 13)), 0)
    idx = np.broadcast_to(np.arange(13, dtype=np.int32), (4, 13)).copy()
    check_hlo(text, x, idx)


POOLS = [
    # window, strides, padding, base_dilation, window_dilation
    ((2, 2), (2, 2), "VALID", None, None),
    ((3, 3), (1, 1), "SAME", None, None),
    ((3, 2), (2, 1), ((1, 2), (0, 1)), (1, 2), (2, 1)),
    ((1, 4), (1, 3), ((0, 0), (2, 2)), None, (1, 2)),
]


@pytest.mark.parametrize(("window", "strides", "padding", "base", "wdil"), POOLS)
@pytest.mark.parametrize("kind", ["max", "sum"])
def test_reduce_window_pools(
    window: tuple[int, int],
    strides: tuple[int, int],
    padding: object,
    base: tuple[int, int] | None,
    wdil: tuple[int, int] | None,
    kind: str,
) -> None:
    op, init = (jax.lax.max, -np.inf) if kind == "max" else (jax.lax.add, 0.0)

    def f(x: jax.Array) -> jax.Array:
        return jax.lax.reduce_window(x, np.float32(init), op, window, strides, padding, base, wdil)

    check_against_jax(f, _rand((7, 9)))


@pytest.mark.parametrize("dtype", [np.int32, ml_dtypes.bfloat16])
def test_cumulative_ops(dtype: object) -> None:
    check_against_jax(lambda a: (jnp.cumsum(a, axis=1), jax.lax.cummax(a, axis=0)), _rand((6, 10), dtype))


def test_variadic_reduce_window_against_xla() -> None:
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
  x = f32[6,5] parameter(0)
  y = s32[6,5] parameter(1)
  z = f32[] constant(0)
  lo = s32[] constant(-2147483648)
  ROOT r = (f32[3,5], s32[3,5]) reduce-window(x, y, z, lo), window={size=3x2 stride=2x1 pad=1_1x1_0}, to_apply=comb
}
"""
    check_hlo(text, _rand((6, 5)), _rand((6, 5), np.int32))


def test_max_pool_gradient_uses_select_and_scatter() -> None:
    def pool_sum(x: jax.Array) -> jax.Array:
        return jnp.sum(jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME") ** 2)

    x = np.round(_rand((2, 7, 8, 3)), 1)  # rounded: ties inside windows
    check_against_jax(jax.grad(pool_sum), x)


_SELECT_AND_SCATTER_2D = """HloModule m
ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GE
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY e {
  x = f32[5,6] parameter(0)
  s = f32[3,3] parameter(1)
  z = f32[] constant(0.5)
  ROOT r = f32[5,6] select-and-scatter(x, s, z), window={size=3x3 stride=2x2 pad=1_1x0_1}, select=ge, scatter=add
}
"""


def test_select_and_scatter_overlapping_windows_and_padding_against_xla() -> None:
    # Distinct operand values: one maximum per window. Overlapping windows add their source values.
    x = np.random.default_rng(3).permutation(30).reshape(5, 6).astype(np.float32)
    check_hlo(_SELECT_AND_SCATTER_2D, x, _rand((3, 3)))


def test_select_and_scatter_ties_pick_the_lexicographically_first_element() -> None:
    """XLA's operation semantics (SelectAndScatter, https://openxla.org/xla/operation_semantics) call select
    with the lexicographically smaller index first, so GE keeps the first of equal maxima. XLA CPU (jax 0.10)
    does not: it picks a later one in most 2-D windows with ties (for example (2,2) over (1,4) below), so this
    case is checked against that rule, written out here."""
    x = np.array(
        [[1, 1, 2, 2, 0, 0], [2, 2, 0, 0, 2, 1], [0, 2, 0, 1, 1, 1], [0, 0, 2, 2, 2, 1], [2, 0, 1, 2, 0, 0]],
        np.float32,
    )
    source = np.arange(1, 10, dtype=np.float32).reshape(3, 3)
    want = np.full((5, 6), 0.5, np.float32)
    for i in range(3):
        for j in range(3):
            cells = [(r, c) for r in range(2 * i - 1, 2 * i + 2) for c in range(2 * j, 2 * j + 3)]
            inside = [(r, c) for r, c in cells if 0 <= r < 5 and 0 <= c < 6]  # row-major: lexicographic order
            best = max(x[cell] for cell in inside)
            want[next(cell for cell in inside if x[cell] == best)] += source[i, j]
    (got,) = evaluate(parse_module(_SELECT_AND_SCATTER_2D), [x, source])
    np.testing.assert_array_equal(got, want)


def test_select_and_scatter_min_select_and_non_commutative_scatter_against_xla() -> None:
    text = """HloModule m
le {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=LE
}
sub {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT c = s32[] subtract(a, b)
}
ENTRY e {
  x = s32[6] parameter(0)
  s = s32[5] parameter(1)
  z = s32[] constant(100)
  ROOT r = s32[6] select-and-scatter(x, s, z), window={size=2 stride=1}, select=le, scatter=sub
}
"""
    check_hlo(text, np.array([3, 1, 1, 4, 0, 0], np.int32), np.array([1, 2, 4, 8, 16], np.int32))


def test_map_applies_a_scalar_computation_to_every_element_against_xla() -> None:
    text = """HloModule m
fma {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = s32[] parameter(2)
  cf = f32[] convert(c)
  m = f32[] multiply(a, b)
  ROOT r = f32[] add(m, cf)
}
ENTRY e {
  x = f32[3,4] parameter(0)
  y = f32[3,4] parameter(1)
  z = s32[3,4] parameter(2)
  ROOT r = f32[3,4] map(x, y, z), dimensions={0,1}, to_apply=fma
}
"""
    x, y, z = _rand((3, 4)), _rand((3, 4)), _rand((3, 4), np.int32)
    # XLA CPU contracts a*b + c into one fused multiply-add (one rounding); HLO's multiply then add round
    # twice, as the reference does: the two differ by at most one f32 ulp (seen in 1 of 6 draws).
    fma = Tolerance(ulps=1, why="XLA CPU fuses multiply and add into one FMA")
    (got,) = check_hlo(text, x, y, z, tol=fma)
    np.testing.assert_array_equal(got, x * y + z.astype(np.float32))  # the HLO semantics, bit for bit


@pytest.mark.parametrize(
    "fn",
    [
        _reduce(jax.lax.add, 0, (1,)),
        _reduce(jax.lax.mul, 1, (1,)),
        lambda x: jax.lax.reduce_window(x, np.float32(0), jax.lax.add, (1, 2), (1, 1), "VALID"),
    ],
    ids=["sum", "product", "window_sum"],
)
def test_denormals_flush_in_sums_and_products_as_on_xla(fn: object) -> None:
    """XLA CPU (and a TPU) reads denormal operands as zero and flushes denormal results: [1e-40, 0] sums to
    0, 1e-20 * 1e-20 is 0; the reference's whole-array reductions once kept them."""
    x = np.array([[1e-40, 0.0, 3.0], [-1e-40, 1e-40, 0.0], [1e-20, 1e-20, 1.0], [1e-38, -0.99e-38, 0.0]], np.float32)
    check_against_jax(fn, x, tol=Tolerance(0, 0.0, 0.0, "exact: a flushed value is 0, a kept one is not"))


@pytest.mark.parametrize("name", ["f16", "bf16", "f8e4m3fn", "f8e5m2", "f8e4m3", "f8e3m4", "f8e4m3fnuz", "f4e2m1fn"])
def test_every_narrow_float_sum_accumulates_in_f32(name: str) -> None:
    """32 x 0.5 sums to 16 (rounded once to the type) for every float type narrower than f32; a hand list of
    such types once left out f8e4m3, f8e3m4 and f4e2m1fn, whose sums then stalled at 8 or 2."""
    from tpusim.memory import element_type

    dt = element_type(name).dtype
    text = f"""HloModule m
c {{
  a = {name}[] parameter(0)
  b = {name}[] parameter(1)
  ROOT s = {name}[] add(a, b)
}}
ENTRY e {{
  p = {name}[32] parameter(0)
  z = {name}[] constant(0)
  r = {name}[] reduce(p, z), dimensions={{0}}, to_apply=c
  w = {name}[1] reduce-window(p, z), window={{size=32}}, to_apply=c
  ROOT t = ({name}[], {name}[1]) tuple(r, w)
}}"""
    got = evaluate(parse_module(text), [np.full(32, 0.5, dt)])
    want = np.float32(16).astype(dt)  # (f4e2m1fn saturates at 6)
    assert got[0].astype(np.float32) == want.astype(np.float32)
    assert got[1].astype(np.float32).tolist() == [float(want.astype(np.float32))]


# ---------------------------------------------------------------------------------------------------------
# reduce-window: padding and base-dilation holes take no part (XLA combines init with the in-bounds
# elements only; padding with init, as Operation Semantics and StableHLO describe it, agrees only when init
# is an identity). Small integers: every case is exact, compared bit for bit with XLA CPU.
# ---------------------------------------------------------------------------------------------------------
EXACT = Tolerance()


def _window_module(et: str, shape: tuple[int, ...], init: str, fn: str, window: str) -> str:
    """A one-reduce-window module; the result shape follows from ``window`` (XLA's shape rule)."""
    attrs = dict(kv.split("=") for kv in window.split())
    rank = len(shape)

    def per_dim(key: str, default: str) -> list[str]:
        return attrs.get(key, "x".join([default] * rank)).split("x")

    out = []
    for n, k, st, pad, base, dil in zip(
        shape,
        per_dim("size", "1"),
        per_dim("stride", "1"),
        per_dim("pad", "0_0"),
        per_dim("lhs_dilate", "1"),
        per_dim("rhs_dilate", "1"),
    ):
        lo, hi = (int(v) for v in pad.split("_"))
        padded = (n - 1) * int(base) + 1 + lo + hi
        out.append(max(0, (padded - ((int(k) - 1) * int(dil) + 1)) // int(st) + 1))
    dims, odims = ",".join(map(str, shape)), ",".join(map(str, out))
    return f"""HloModule m
comb {{
  a = {et}[] parameter(0)
  b = {et}[] parameter(1)
  ROOT c = {et}[] {fn}(a, b)
}}
ENTRY e {{
  x = {et}[{dims}] parameter(0)
  z = {et}[] constant({init})
  ROOT r = {et}[{odims}] reduce-window(x, z), window={{{window}}}, to_apply=comb
}}
"""


WINDOWS_WITH_INIT = [
    # element type, operand shape, init, computation, window
    ("f32", (4, 4), "2", "add", "size=3x3 pad=1_1x1_1"),  # a corner: 2 + 4 ones, not 2 + 4 + 5 x 2
    ("f32", (5, 6), "1", "add", "size=3x3 stride=1x2 pad=1_2x0_1 lhs_dilate=2x1"),
    ("f32", (5, 6), "1", "add", "size=3x2 pad=1_1x2_2 lhs_dilate=1x2 rhs_dilate=2x2"),
    ("s32", (5, 6), "7", "add", "size=3x2 stride=2x1 pad=1_2x-1_1 lhs_dilate=2x1 rhs_dilate=1x2"),
    ("s32", (5, 6), "3", "multiply", "size=2x2 pad=1_1x1_1"),
    ("s32", (5, 6), "-100", "minimum", "size=2x3 pad=1_1x1_1 lhs_dilate=2x2"),
    ("f32", (5, 6), "-3", "maximum", "size=3x2 stride=2x1 pad=2_1x0_3"),
    ("f32", (3,), "2", "add", "size=6 pad=3_3"),  # windows entirely in the padding give init
    ("f32", (3,), "2", "add", "size=2 lhs_dilate=3"),  # windows entirely in holes give init
    ("bf16", (6, 5), "0.5", "add", "size=2x3 stride=2x1 pad=1_1x1_1"),
    ("f16", (6, 5), "-1", "multiply", "size=2x2 pad=0_1x1_0 lhs_dilate=1x2"),
    ("s8", (4, 7), "5", "add", "size=1x4 stride=1x3 pad=0_0x2_2"),
    ("pred", (4, 7), "true", "and", "size=2x3 pad=1_1x1_1"),
    ("pred", (4, 7), "true", "xor", "size=2x3 pad=1_1x1_1"),
    ("u32", (4, 7), "4294967295", "and", "size=2x3 pad=1_1x1_1"),
]


@pytest.mark.parametrize(("et", "shape", "init", "fn", "window"), WINDOWS_WITH_INIT)
def test_reduce_window_padding_and_holes_take_no_part(
    et: str, shape: tuple[int, ...], init: str, fn: str, window: str
) -> None:
    from tpusim.memory import element_type

    dt = element_type(et).dtype
    x = RNG.integers(0 if et in ("u32", "pred") else -3, 4, shape).astype(dt)
    if et in ("f32", "bf16", "f16") and fn == "add":
        x = np.ones(shape, dt)
    check_hlo(_window_module(et, shape, init, fn, window), x, tol=EXACT)


def test_reduce_window_issue_example_against_jax() -> None:
    """``reduce_window(ones((4,4)), 2.0, add, (3,3), (1,1), ((1,1),(1,1)))`` is 6 at the corners on XLA
    (2 + four ones), 8 on the edges, 11 inside; the reference once said 16, 14 and 11."""
    f = lambda x: jax.lax.reduce_window(x, 2.0, jax.lax.add, (3, 3), (1, 1), ((1, 1), (1, 1)))  # noqa: E731
    (got,) = evaluate(
        parse_module(jax.jit(f).lower(np.ones((4, 4), np.float32)).as_text(dialect="hlo")),
        [np.ones((4, 4), np.float32)],
    )
    want = np.array([[6, 8, 8, 6], [8, 11, 11, 8], [8, 11, 11, 8], [6, 8, 8, 6]], np.float32)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(np.ones((4, 4), np.float32))), want)
    check_against_jax(f, np.ones((4, 4), np.float32), tol=EXACT)


def test_variadic_and_generic_reduce_window_skip_padding_against_xla() -> None:
    """A variadic reduce-window with non-identity inits, and a complex product (no exact identity: the
    generic pairwise fold with a validity mask), with padding and base dilation."""
    text = """HloModule m
comb {
  a0 = f32[] parameter(0)
  a1 = s32[] parameter(1)
  b0 = f32[] parameter(2)
  b1 = s32[] parameter(3)
  s = f32[] add(a0, b0)
  m = s32[] add(a1, b1)
  ROOT t = (f32[], s32[]) tuple(s, m)
}
ENTRY e {
  x = f32[4,5] parameter(0)
  y = s32[4,5] parameter(1)
  z = f32[] constant(2)
  lo = s32[] constant(10)
  ROOT r = (f32[4,9], s32[4,9]) reduce-window(x, y, z, lo), window={size=3x3 pad=1_1x1_1 lhs_dilate=1x2}, to_apply=comb
}
"""
    check_hlo(text, np.ones((4, 5), np.float32), RNG.integers(-3, 4, (4, 5)).astype(np.int32), tol=EXACT)
    product = _window_module("c64", (3, 4), "(2, 1)", "multiply", "size=2x2 pad=1_1x1_0 lhs_dilate=2x1")
    x = (RNG.integers(-2, 3, (3, 4)) + 1j * RNG.integers(-2, 3, (3, 4))).astype(np.complex64)
    check_hlo(product, x, tol=EXACT)


@pytest.mark.parametrize("init", ["0", "-0.0"])  # (XLA reads constant(-0) as +0.0)
def test_reduce_window_sum_of_negative_zeros_keeps_the_sign_of_init(init: str) -> None:
    """A window of -0.0s sums to init + -0.0 + ...: -0.0 with init -0.0, +0.0 with init +0.0 (on XLA, padded
    or not; numpy's sums start at +0.0)."""
    text = _window_module("f32", (4, 4), init, "add", "size=2x2 pad=1_1x1_1")
    check_hlo(text, np.full((4, 4), -0.0, np.float32), tol=EXACT)


@pytest.mark.parametrize(
    ("window", "strides", "padding", "op", "init"),
    [
        ((1, 511), (1, 1), ((0, 0), (255, 255)), jax.lax.max, -np.inf),  # XLA:TPU's softmax row maximum
        ((1, 511), (1, 1), ((0, 0), (255, 255)), jax.lax.add, 0.0),
        ((3, 256), (1, 1), ((1, 1), (0, 0)), jax.lax.add, 0.0),  # a window over the whole row, 3 rows
        ((1, 260), (1, 2), ((0, 0), (4, 4)), jax.lax.max, -np.inf),  # strided: three windows, each whole
        ((1, 256), (1, 1), ((0, 0), (0, 0)), jax.lax.min, np.inf),  # one position per row
    ],
)
def test_windows_covering_whole_rows_reduce_and_broadcast_as_on_xla(
    window: tuple[int, int], strides: tuple[int, int], padding: object, op: object, init: float
) -> None:
    """A window that holds the whole of a dimension at every position is a reduction of that dimension
    broadcast back; the reference takes that shortcut (softmax compiled by XLA:TPU has 511-tap windows,
    which took 23 s window by window) and must give XLA's values."""
    x = _rand((8, 256))
    (lo, hi) = padding[1]  # type: ignore[index]
    assert WindowDim(window[1], strides[1], lo, hi).covers(256)
    order = Tolerance(ulps=64, atol=1e-4, rtol=1e-5, why="a 256-term f32 sum in another order")
    check_against_jax(lambda a: jax.lax.reduce_window(a, np.float32(init), op, window, strides, padding), x, tol=order)
