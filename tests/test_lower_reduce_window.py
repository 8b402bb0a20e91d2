"""``reduce-window`` and ``select-and-scatter`` on the VPU (tpusim/compiler/lowering/windowed.py) end to end:
max and average pools and other windows written with jax.lax.reduce_window, and max-pool gradients,
simulated on tpu_v5e and on the teaching chip (8x8-word vector registers, 64 KiB VMEM: many blocks), compared
with the reference interpreter; they must lower (no fallback). Also: one VPU instruction per tap and block,
and what declines says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from e2e_support import run_checked

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.ir import Module
from tpusim.isa import VpuCopy, VpuFused, VpuMap

CHIPS = ("teaching", "tpu_v5e")
BF16 = ml_dtypes.bfloat16
F8E4M3 = ml_dtypes.float8_e4m3fn
F8E5M2 = ml_dtypes.float8_e5m2
NEG_INF = -jnp.inf


def rw(
    init: Any, op: Callable[..., Any], size: tuple[int, ...], strides: tuple[int, ...], padding: Any, **kw: Any
) -> Any:
    return lambda x: jax.lax.reduce_window(x, init, op, size, strides, padding, **kw)


def data(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    rng = np.random.default_rng(sum(shape) + len(shape))
    if np.dtype(dtype).kind == "i":
        return rng.integers(-100, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


NHWC = (2, 8, 8, 4)
# name -> (function, operand shape, dtype)
CASES: dict[str, tuple[Callable[..., Any], tuple[int, ...], Any]] = {
    "max_pool_2x2_stride2": (rw(NEG_INF, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"), NHWC, np.float32),
    "max_pool_3x3_stride2_same": (rw(NEG_INF, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), NHWC, np.float32),
    "sum_pool_3x3_stride1_same": (rw(0.0, jax.lax.add, (1, 3, 3, 1), (1, 1, 1, 1), "SAME"), NHWC, np.float32),
    "sum_pool_nchw": (rw(0.0, jax.lax.add, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"), (2, 4, 8, 8), np.float32),
    "min_window_dilation": (
        rw(jnp.inf, jax.lax.min, (1, 3, 2, 1), (1, 2, 1, 1), "SAME", window_dilation=(1, 2, 3, 1)),
        NHWC,
        np.float32,
    ),
    "base_dilation": (
        rw(0.0, jax.lax.add, (1, 3, 3, 1), (1, 1, 2, 1), "SAME", base_dilation=(1, 2, 3, 1)),
        NHWC,
        np.float32,
    ),
    "non_identity_init": (rw(1.5, jax.lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), NHWC, np.float32),
    "window_over_lanes": (rw(NEG_INF, jax.lax.max, (2, 3), (1, 2), ((1, 0), (1, 1))), (9, 40), np.float32),
    "vector_stride2": (rw(0.0, jax.lax.add, (3,), (2,), "SAME"), (100,), np.float32),
    "bf16_sum_accumulates_in_f32": (rw(0.0, jax.lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), NHWC, BF16),
    "bf16_max": (rw(NEG_INF, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"), NHWC, BF16),
    # f8 sums accumulate in f32 as bf16's do (a window of 32 ones once summed to 16 in f8)
    "f8e4m3fn_sum_accumulates_in_f32": (rw(0.0, jax.lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), NHWC, F8E4M3),
    "f8e5m2_sum": (rw(0.0, jax.lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), NHWC, F8E5M2),
    "f8e5m2_max": (rw(NEG_INF, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"), NHWC, F8E5M2),
    "s32_sum": (rw(0, jax.lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), NHWC, np.int32),
    "many_blocks": (rw(NEG_INF, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), (4, 33, 31, 24), np.float32),
    "cumulative_sum": (jnp.cumsum, (100,), np.float32),
    # prefix scans (a window of the whole axis): by doubling, block after block along the axis with a running
    # total (the teaching chip's 64 KiB of VMEM cuts these axes into several blocks)
    "cumsum_rows": (lambda x: jnp.cumsum(x, 0), (300, 40), np.float32),
    "cumsum_lanes_bf16": (lambda x: jnp.cumsum(x, 1), (5, 700), BF16),
    "cummax_rows": (lambda x: jax.lax.cummax(x, 0), (300, 24), np.float32),
    "cumsum_s32": (lambda x: jnp.cumsum(x, 0), (300, 24), np.int32),
    "cumsum_reverse_rows": (lambda x: jax.lax.cumsum(x, 0, reverse=True), (300, 40), np.float32),
    "cummin_reverse_lanes": (lambda x: jax.lax.cummin(x, 1, reverse=True), (6, 500), np.float32),
}


def jax_module(fn: Callable[..., Any], *args: Any) -> Module:
    return parse_module(jax.jit(fn).lower(*args).as_text(dialect="hlo"))


def opcodes(m: Module, opcode: str) -> int:
    return sum(i.opcode == opcode for c in m.computations for i in c.instructions)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_reference(name: str, chip: str) -> None:
    fn, shape, dtype = CASES[name]
    x = data(shape, dtype)
    m = jax_module(fn, x)
    assert opcodes(m, "reduce-window") == 1
    checked = run_checked(m, [x], config=chip)
    checked.assert_ok(f"{name} on {chip}")
    assert not checked.result.fallbacks, checked.result.fallbacks


@pytest.mark.parametrize("chip", CHIPS)
def test_pooling_net_gradient(chip: str) -> None:
    """A max pool and an average pool, and their gradients: the max pool's is a select-and-scatter, the
    average pool's a reduce-window over a padded, interior-padded cotangent. The windowed ops lower; the
    program matches the reference."""

    def net(x: Any) -> Any:
        y = jax.lax.reduce_window(x, NEG_INF, jax.lax.max, (1, 2, 2, 1), (1, 1, 1, 1), "SAME")
        y = jax.lax.reduce_window(y, 0.0, jax.lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME") / 9.0
        return jnp.sum(y**2)

    x = data(NHWC)
    m = jax_module(jax.value_and_grad(net), x)
    checked = run_checked(m, [x], config=chip)
    checked.assert_ok(chip)
    fell = [f for f in checked.result.fallbacks if f[2] in ("reduce-window", "select-and-scatter")]
    assert not fell, fell
    assert opcodes(m, "reduce-window") == 3
    assert opcodes(m, "select-and-scatter") == 1


def test_one_vpu_instruction_per_tap_and_block() -> None:
    """A 3x3 max pool with stride 2 over an image that fits one block: one copy for the first tap and one
    ``vpu.maximum`` for each of the other eight, each over the whole block (strided windows of the staging
    block, no per-row instructions)."""
    x = data((8, 32, 32, 128))
    m = jax_module(rw(NEG_INF, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), x)
    result = tpusim.simulate(m, [x], config="tpu_v5e", timing_only=True)
    stream = result.compiled.program.streams[0].instructions
    maps = [i for i in stream if isinstance(i, VpuMap) and i.fn == "maximum"]
    copies = [i for i in stream if isinstance(i, VpuCopy)]
    blocks = len(copies)
    assert len(maps) == 8 * blocks
    assert blocks <= 8
    assert all(i.dst.element_count == 8 * 16 * 16 * 128 // blocks for i in maps)


def test_a_prefix_scan_takes_a_logarithmic_number_of_passes() -> None:
    """``jnp.cumsum`` over the rows of f32[n,256] is a reduce-window of n taps; it fell back to the reference
    at a declared cost of one operation per tap (180 us for n = 2048 on v5e, where XLA:TPU estimates 17 us).
    As a scan by doubling it takes ``3 + 2 ceil(log2 n)`` VPU instructions per block (the copy in, the running
    total in, two per step, the total out), so four times the rows take far less than 16 times as long."""
    cycles = {}
    for n in (512, 2048):
        x = data((n, 256))
        result = tpusim.simulate(jax_module(lambda a: jnp.cumsum(a, 0), x), [x], config="tpu_v5e", timing_only=True)
        assert not result.fallbacks, result.fallbacks
        vpu = [i for i in result.compiled.program.streams[0].instructions if isinstance(i, (VpuMap, VpuCopy))]
        # a block's running total folds into its first row in place
        blocks = sum(isinstance(i, VpuMap) and i.dst.address == i.srcs[1].address for i in vpu)
        most = blocks * (3 + 2 * int(np.ceil(np.log2(n))))
        assert blocks >= 1 and 3 * blocks <= len(vpu) <= most, (blocks, len(vpu))
        cycles[n] = result.cycles
    assert cycles[2048] < 6 * cycles[512], cycles


def test_narrow_sums_are_fused_convert_add() -> None:
    """bf16 sums accumulate in f32 (``vpu.fused`` convert + add per tap, the first adding the init value: +0.0
    is no exact identity of a sum, +0.0 + -0.0 is +0.0) and round once, as the reference does; a bf16 max
    needs no widening."""
    x = data(NHWC, BF16)
    for fn, fused in ((CASES["bf16_sum_accumulates_in_f32"][0], 9), (CASES["bf16_max"][0], 0)):
        stream = tpusim.simulate(jax_module(fn, x), [x], config="tpu_v5e").compiled.program.streams[0].instructions
        assert sum(isinstance(i, VpuFused) for i in stream) == fused


def test_declines_with_reason() -> None:
    """A window of more than 256 taps that is no prefix scan (a long sliding sum) and a variadic reduce-window
    (an arg-max pool) fall back to the exact reference semantics, with the reason in the run's fallback list."""
    v = data((600,))
    checked = run_checked(jax_module(rw(0.0, jax.lax.add, (300,), (1,), "VALID"), v), [v], config="teaching")
    checked.assert_ok("sliding sum")
    (reason,) = [f[3] for f in checked.result.fallbacks if f[2] == "reduce-window"]
    assert reason.startswith("a window of 300 taps (more than 256)")

    def argmax_pool(x: Any) -> Any:
        idx = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)

        def pick(a: Any, b: Any) -> Any:
            take = a[0] >= b[0]
            return jnp.where(take, a[0], b[0]), jnp.where(take, a[1], b[1])

        return jax.lax.reduce_window((x, idx), (-jnp.inf, 0), pick, (1, 2), (1, 2), "VALID")

    x = data((4, 16))
    checked = run_checked(jax_module(argmax_pool, x), [x], config="teaching")
    checked.assert_ok("argmax pool")
    (reason,) = [f[3] for f in checked.result.fallbacks if f[2] == "reduce-window"]
    assert reason == "a variadic reduce-window (several operands)"


# ---------------------------------------------------------------------------------------------------------
# select-and-scatter (the gradient of a max pool)
# ---------------------------------------------------------------------------------------------------------
def max_pool_grad(size: tuple[int, ...], stride: tuple[int, ...], padding: Any, op: Any = jax.lax.max) -> Any:
    init = NEG_INF if op is jax.lax.max else jnp.inf
    return jax.grad(lambda x: jnp.sum(jax.lax.reduce_window(x, init, op, size, stride, padding) ** 2))


def ties(shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(3).integers(-2, 3, shape).astype(np.float32)


SCATTER_CASES: dict[str, tuple[Callable[..., Any], np.ndarray]] = {
    "2x2_stride2": (max_pool_grad((1, 2, 2, 1), (1, 2, 2, 1), "VALID"), data(NHWC)),
    "3x3_stride2_same_overlapping": (max_pool_grad((1, 3, 3, 1), (1, 2, 2, 1), "SAME"), data(NHWC)),
    "3x3_stride1_same": (max_pool_grad((1, 3, 3, 1), (1, 1, 1, 1), "SAME"), data(NHWC)),
    "2x2_stride3_gaps": (max_pool_grad((1, 2, 2, 1), (1, 3, 3, 1), "VALID"), data((2, 9, 10, 4))),
    "ties_pick_the_first": (max_pool_grad((1, 3, 3, 1), (1, 2, 2, 1), "SAME"), ties(NHWC)),
    "min_pool": (max_pool_grad((1, 2, 2, 1), (1, 2, 2, 1), "SAME", jax.lax.min), data((2, 7, 7, 4))),
    "bf16": (max_pool_grad((1, 2, 2, 1), (1, 2, 2, 1), "VALID"), data(NHWC, BF16)),
    "overlapping_windows_across_blocks": (max_pool_grad((1, 3, 3, 1), (1, 2, 2, 1), "SAME"), data((2, 21, 19, 16))),
}


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("name", sorted(SCATTER_CASES))
def test_select_and_scatter_matches_reference(name: str, chip: str) -> None:
    fn, x = SCATTER_CASES[name]
    m = jax_module(fn, x)
    assert opcodes(m, "select-and-scatter") == 1
    checked = run_checked(m, [x], config=chip)
    checked.assert_ok(f"{name} on {chip}")
    fell = [f for f in checked.result.fallbacks if f[2] in ("select-and-scatter", "reduce-window")]
    assert not fell, fell


def scatter_module(select: str, scatter: str, init: str) -> str:
    return f"""HloModule sas
select {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] {select}
}}
scatter {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] {scatter}
}}
ENTRY main {{
  x = f32[2,9,8,3] parameter(0)
  s = f32[2,5,4,3] parameter(1)
  i = f32[] constant({init})
  ROOT r = f32[2,9,8,3] select-and-scatter(x, s, i), window={{size=1x3x2x1 stride=1x2x2x1 pad=0_0x1_1x0_0x0_0}},
    select=select, scatter=scatter
}}"""


@pytest.mark.parametrize(
    ("select", "scatter", "init"),
    [
        ("compare(a, b), direction=GT", "add(a, b)", "0"),  # ties move the pick to the later element
        ("compare(b, a), direction=GE", "add(b, a)", "0.5"),  # arguments swapped: keep the pick while b >= a
        ("compare(a, b), direction=LE", "maximum(a, b)", "-1"),  # min pick, scatter by maximum over an init
    ],
)
def test_select_and_scatter_hlo_forms(select: str, scatter: str, init: str) -> None:
    m = parse_module(scatter_module(select, scatter, init))
    args = [ties((2, 9, 8, 3)), data((2, 5, 4, 3))]
    checked = run_checked(m, args, config="teaching")
    checked.assert_ok(select)
    assert not checked.result.fallbacks, checked.result.fallbacks


def test_select_and_scatter_declines_with_reason() -> None:
    m = parse_module(scatter_module("compare(a, a), direction=GE", "add(a, b)", "0"))
    checked = run_checked(m, [ties((2, 9, 8, 3)), data((2, 5, 4, 3))], config="teaching")
    checked.assert_ok("fallback")
    (reason,) = [f[3] for f in checked.result.fallbacks]
    assert reason == "a select computation that is not one comparison of its two parameters"


def random_windowed(rng: np.random.Generator) -> tuple[Module, list[np.ndarray]]:
    """A reduce-window (f32, bf16 or s32; add/max/min; strides, padding (negative too), window and base
    dilation, sometimes a non-identity init) or a select-and-scatter (GE/GT/LE/LT select, add scatter,
    strides, padding) of rank 1 to 3, in a random layout."""
    scatter = bool(rng.integers(0, 2))
    rank = int(rng.integers(1, 4))
    dims, outs, windows = [], [], []
    while len(dims) < rank:
        i, k, s = (int(v) for v in rng.integers([2, 1, 1], [10, 4, 4]))
        d, b = (1, 1) if scatter else (int(v) for v in rng.integers(1, 3, 2))
        lo, hi = (int(v) for v in rng.integers(0 if scatter else -1, 3, 2))
        span, padded = (k - 1) * d + 1, (i - 1) * b + 1 + lo + hi
        if padded >= span:
            dims.append(i)
            outs.append((padded - span) // s + 1)
            windows.append((k, s, f"{lo}_{hi}", b, d))
    keys = ("size", "stride", "pad") if scatter else ("size", "stride", "pad", "lhs_dilate", "rhs_dilate")
    window = " ".join(f"{key}={'x'.join(str(w[i]) for w in windows)}" for i, key in enumerate(keys))
    et = str(rng.choice(["f32", "bf16"] if scatter else ["f32", "bf16", "s32"]))
    layout = ",".join(map(str, rng.permutation(rank)))
    x, y = (f"{et}[{','.join(map(str, s))}]" for s in (dims, outs))
    if scatter:
        direction = rng.choice(["GE", "GT", "LE", "LT"])
        text = (
            f"HloModule s\nsel {{\n  a = {et}[] parameter(0)\n  b = {et}[] parameter(1)\n"
            f"  ROOT c = pred[] compare(a, b), direction={direction}\n}}\n"
            f"sc {{\n  a = {et}[] parameter(0)\n  b = {et}[] parameter(1)\n  ROOT c = {et}[] add(a, b)\n}}\n"
            f"ENTRY main {{\n  x = {x}{{{layout}}} parameter(0)\n  s = {y} parameter(1)\n  i = {et}[] constant(0)\n"
            f"  ROOT r = {x} select-and-scatter(x, s, i), window={{{window}}}, select=sel, scatter=sc\n}}"
        )
    else:
        fn = str(rng.choice(["add", "maximum", "minimum"]))
        big = "inf" if et != "s32" else "2147483647"
        init = {"add": "0", "maximum": f"-{big}" if et != "s32" else "-2147483648", "minimum": big}[fn]
        if fn == "add" and rng.integers(0, 2):
            init = "2"  # not the identity: counted once per window, never for padding or holes
        text = (
            f"HloModule r\ncomb {{\n  a = {et}[] parameter(0)\n  b = {et}[] parameter(1)\n"
            f"  ROOT c = {et}[] {fn}(a, b)\n}}\nENTRY main {{\n  x = {x}{{{layout}}} parameter(0)\n"
            f"  i = {et}[] constant({init})\n  ROOT r = {y} reduce-window(x, i), window={{{window}}}, to_apply=comb\n}}"
        )
    dtype = {"f32": np.float32, "bf16": BF16, "s32": np.int32}[et]
    small = scatter or et == "s32"  # small integers: ties in the picks, exact sums

    def values(shape: list[int]) -> np.ndarray:
        return (rng.integers(-3, 4, shape) if small else rng.standard_normal(shape)).astype(dtype)

    return parse_module(text), [values(dims)] + ([values(outs)] if scatter else [])


# ---------------------------------------------------------------------------------------------------------
# init values that are not identities: XLA combines init with a window's in-bounds elements only (padding and
# base-dilation holes take no part); the device once pre-filled padding with init and added init once more
# ---------------------------------------------------------------------------------------------------------
def _bits(a: Any) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype != np.bool_ else a


INIT_CASES: dict[str, tuple[Callable[..., Any], tuple[int, ...], Any]] = {
    "issue_13_sum_init_2": (rw(2.0, jax.lax.add, (3, 3), (1, 1), ((1, 1), (1, 1))), (4, 4), np.float32),
    "sum_init_1_5_same": (rw(1.5, jax.lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), NHWC, np.float32),
    "s32_sum_base_dilation": (
        rw(7, jax.lax.add, (3, 2), (2, 1), ((1, 2), (-1, 1)), base_dilation=(2, 1), window_dilation=(1, 2)),
        (9, 12),
        np.int32,
    ),
    "s32_product_padded": (rw(3, jax.lax.mul, (2, 2), (1, 1), ((1, 1), (1, 1))), (5, 6), np.int32),
    "bf16_sum_init_half": (rw(BF16(0.5), jax.lax.add, (2, 3), (2, 1), ((1, 1), (1, 1))), (6, 40), BF16),
    "max_init_above_data": (rw(0.5, jax.lax.max, (3, 3), (2, 2), ((1, 1), (1, 1))), (7, 9), np.float32),
    "windows_in_padding_only": (rw(2.0, jax.lax.add, (6,), (1,), ((3, 3),)), (3,), np.float32),
    "windows_in_holes_only": (rw(2.0, jax.lax.add, (2,), (1,), "VALID", base_dilation=(3,)), (4,), np.float32),
}


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("name", sorted(INIT_CASES))
def test_non_identity_init_against_jax(name: str, chip: str) -> None:
    """The device (no fallback) and the reference equal JAX on CPU bit for bit (small integers: exact)."""
    fn, shape, dtype = INIT_CASES[name]
    x = np.random.default_rng(len(name)).integers(-3, 4, shape).astype(dtype)
    if name.startswith("issue"):
        x = np.ones(shape, dtype)
    want = np.asarray(jax.jit(fn)(x))
    m = jax_module(fn, x)
    result = tpusim.simulate(m, [x], config=chip)
    assert not result.fallbacks, result.fallbacks
    np.testing.assert_array_equal(_bits(result.outputs[0]), _bits(want))
    checked = run_checked(m, [x], config=chip)
    checked.assert_ok(f"{name} on {chip}")


def test_issue_13_example_through_simulate_jax() -> None:
    f = rw(2.0, jax.lax.add, (3, 3), (1, 1), ((1, 1), (1, 1)))
    x = jnp.ones((4, 4))
    got = np.asarray(tpusim.simulate_jax(f, x).tree)
    np.testing.assert_array_equal(got, [[6, 8, 8, 6], [8, 11, 11, 8], [8, 11, 11, 8], [6, 8, 8, 6]])
    np.testing.assert_array_equal(got, np.asarray(jax.jit(f)(x)))


@pytest.mark.parametrize("init", ["0", "-0.0"])
@pytest.mark.parametrize("et", ["f32", "bf16"])
def test_sum_of_negative_zeros_has_the_sign_of_init(et: str, init: str) -> None:
    """Windows of -0.0s sum to -0.0 with init -0.0 and to +0.0 with init +0.0, padded or not, as on XLA: the
    padding holds -0.0 (+0.0 is no identity of a sum) and a +0.0 init is added, not skipped."""
    from jax_oracle import run_hlo_on_xla

    text = (
        f"HloModule z\ncomb {{\n  a = {et}[] parameter(0)\n  b = {et}[] parameter(1)\n"
        f"  ROOT c = {et}[] add(a, b)\n}}\nENTRY main {{\n  x = {et}[8,16] parameter(0)\n"
        f"  i = {et}[] constant({init})\n"
        f"  ROOT r = {et}[9,16] reduce-window(x, i), window={{size=2x3 pad=1_1x1_1}}, to_apply=comb\n}}"
    )
    x = np.full((8, 16), -0.0, {"f32": np.float32, "bf16": BF16}[et])
    (want,) = run_hlo_on_xla(text, x)
    for chip in CHIPS:
        result = tpusim.simulate(parse_module(text), [x], config=chip)
        assert not result.fallbacks, result.fallbacks
        np.testing.assert_array_equal(_bits(result.outputs[0]), _bits(want))
    assert np.signbit(want.astype(np.float32)).all() == (init == "-0.0")


@pytest.mark.parametrize("seed", range(24))
def test_random_windows(seed: int) -> None:
    """24 seeded random reduce-windows and select-and-scatters on the teaching chip (sweeps of 650 such on
    both chips found no mismatch)."""
    m, args = random_windowed(np.random.default_rng(seed))
    checked = run_checked(m, args, config="teaching")
    checked.assert_ok(f"seed {seed}")
    assert not checked.result.fallbacks, checked.result.fallbacks


@pytest.mark.parametrize("chip", CHIPS)
def test_f8_window_sums_accumulate_in_f32(chip: str) -> None:
    """32 ones in one window sum to 32: accumulated in f8e4m3fn (3 mantissa bits) they stop at 16."""
    x = np.ones(32, F8E4M3)
    m = jax_module(rw(0.0, jax.lax.add, (32,), (1,), "VALID"), x)
    result = tpusim.simulate(m, [x], config=chip)
    assert not result.fallbacks
    assert result.outputs[0].astype(np.float32).tolist() == [32.0]
