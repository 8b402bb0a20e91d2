"""The MXU: exact cycle counts of weight loads and passes, peak throughput, and numerics against numpy and JAX."""

from __future__ import annotations

from math import ceil

import ml_dtypes
import numpy as np
import pytest

from tpusim.config import load_config, with_overrides
from tpusim.devices import Chip, ExecutionError
from tpusim.devices.mxu import matmul_f32, split_bf16
from tpusim.isa import MemRef, MxuLoadWeights, MxuMatmul, MxuPop, Program, Space, Stream, Symbol, VpuCopy
from tpusim.memory import parse_shape

BF16 = ml_dtypes.bfloat16
TEACH = load_config("teaching")
TEACH_SB = with_overrides(TEACH, {"mxu.double_buffered": False})


def vm(address: int, shape: str) -> MemRef:
    return MemRef(Space.VMEM, address, parse_shape(shape))


def bf16_tile(rows: int, cols: int) -> str:
    return f"bf16[{rows},{cols}]{{1,0:T(8,8)(2,1)}}"


def mxu_rows(result):
    return [(s, text.split(" ")[0], e) for s, unit, text, e, _, _ in result.trace.rows() if ".mxu" in unit]


# ---------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [TEACH, TEACH_SB], ids=["double_buffered", "single_buffered"])
@pytest.mark.parametrize("m", [1, 8, 24])
def test_one_weight_tile_takes_the_documented_cycles(cfg, m):
    r_, c_ = cfg.mxu.rows, cfg.mxu.cols
    prog = Program.single([MxuLoadWeights(0, vm(0x0, bf16_tile(8, 8))), MxuMatmul(0, vm(0x100, bf16_tile(m, 8)))])
    res = Chip(cfg).run(prog, timing_only=True)
    # load: R cycles; stream M rows, plus R-1 input skew and C-1 output skew
    assert mxu_rows(res) == [(0, "mxu.load_weights", r_), (r_, "mxu.matmul", r_ + m + r_ - 1 + c_ - 1)]
    assert res.cycles == 2 * r_ + c_ + m - 2


@pytest.mark.parametrize(("m", "k", "n"), [(8, 8, 8), (24, 16, 16), (5, 24, 8), (40, 8, 24)])
def test_single_buffered_passes_follow_the_textbook_count(m, k, n):
    cfg = TEACH_SB
    r_, c_ = cfg.mxu.rows, cfg.mxu.cols
    ins = []
    for j in range(ceil(n / c_)):
        for kk in range(ceil(k / r_)):
            ins.append(MxuLoadWeights(0, vm(0x1000 + 0x100 * (j * 8 + kk), bf16_tile(8, 8))))
            ins.append(MxuMatmul(0, vm(0x4000 * kk, bf16_tile(m, 8)), acc=0, accumulate=kk > 0))
    res = Chip(cfg).run(Program.single(ins), timing_only=True)
    passes = ceil(k / r_) * ceil(n / c_)
    assert res.cycles == passes * (2 * r_ + c_ + m - 2)
    # each pass is load then stream, strictly after the previous pass drained
    rows = mxu_rows(res)
    for p in range(passes):
        assert rows[2 * p][0] == p * (2 * r_ + c_ + m - 2)


def test_double_buffering_overlaps_the_next_load():
    cfg = TEACH
    m = 16
    ins = [MxuLoadWeights(0, vm(0x0, bf16_tile(8, 8))), MxuMatmul(0, vm(0x100, bf16_tile(m, 8)))] * 3
    res = Chip(cfg).run(Program.single(ins), timing_only=True)
    # loads: 0-8, then during the first stream (8-24): 8-16, then 24-32; streams back to back: 8, 24, 40
    assert mxu_rows(res) == [
        (0, "mxu.load_weights", 8),
        (8, "mxu.load_weights", 16),
        (8, "mxu.matmul", 38),
        (24, "mxu.load_weights", 32),
        (24, "mxu.matmul", 54),
        (40, "mxu.matmul", 70),
    ]


@pytest.mark.parametrize("chip", ["tpu_v5e", "tpu_v5p", "tpu_v6e"])
def test_long_resident_stream_reaches_peak(chip):
    cfg = load_config(chip)
    r_, c_ = cfg.mxu.rows, cfg.mxu.cols
    tile = f"bf16[{r_},{c_}]{{1,0:T(8,128)(2,1)}}"
    passes = 120
    ins = []
    for _ in range(passes):
        for u in range(cfg.mxu.count):
            ins.append(MxuLoadWeights(u, vm(0x100000 * u, tile)))
            ins.append(MxuMatmul(u, vm(0x100000 * u + 0x80000, tile), acc=0, accumulate=True))
    # every core of the chip runs the stream: the config's peak is the chip's
    prog = Program(tuple(Stream(core, tuple(ins)) for core in range(cfg.core.count)))
    res = Chip(cfg).run(prog, timing_only=True)
    flops = int(res.trace.flops.sum())
    assert flops == cfg.core.count * passes * cfg.mxu.count * 2 * r_ * r_ * c_
    achieved = flops / res.seconds
    assert achieved >= 0.97 * cfg.peak_bf16_flops_per_s, achieved / cfg.peak_bf16_flops_per_s


def test_multi_pass_precision_costs_its_passes():
    m = 16
    f32 = f"f32[{m},8]{{1,0:T(8,8)}}"
    ins = [
        MxuLoadWeights(0, vm(0x0, "f32[8,8]{1,0:T(8,8)}"), precision="bf16_3x"),
        MxuMatmul(0, vm(0x1000, f32), precision="bf16_3x"),
    ]
    res = Chip(TEACH).run(Program.single(ins), timing_only=True)
    # 2 weight parts (hi, lo) load in 2 x 8 cycles; 3 passes stream 3 x M rows
    assert mxu_rows(res) == [(0, "mxu.load_weights", 16), (16, "mxu.matmul", 16 + 3 * m + 14)]


def test_int8_streams_at_the_configured_speedup():
    ins = [MxuLoadWeights(0, vm(0x0, "s8[8,8]{1,0:T(8,8)(4,1)}")), MxuMatmul(0, vm(0x100, "s8[32,8]{1,0:T(8,8)(4,1)}"))]
    res = Chip(TEACH).run(Program.single(ins), timing_only=True)
    assert mxu_rows(res)[1] == (8, "mxu.matmul", 8 + 32 // 2 + 14)


def test_pop_waits_for_the_matmul_and_then_streams_rows():
    ins = [
        MxuLoadWeights(0, vm(0x0, bf16_tile(8, 8))),
        MxuMatmul(0, vm(0x100, bf16_tile(16, 8))),
        MxuPop(0, vm(0x400, "f32[16,8]{1,0:T(8,8)}")),
    ]
    res = Chip(TEACH).run(Program.single(ins), timing_only=True)
    end = 8 + 16 + 14
    # two rows-of-8 per pop cycle, and 2 vregs through one store port: 2 cycles
    assert mxu_rows(res)[2] == (end, "mxu.pop", end + 2)


# ---------------------------------------------------------------------------------------------------------
# Numerics
# ---------------------------------------------------------------------------------------------------------
def run_matmul(lhs: np.ndarray, w: np.ndarray, *, precision="bf16", transpose=False, out="f32", accumulate_twice=False):
    et = {np.dtype(BF16): "bf16", np.dtype(np.float32): "f32", np.dtype(np.int8): "s8"}[lhs.dtype]
    tile = {"bf16": "(8,8)(2,1)", "f32": "(8,8)", "s8": "(8,8)(4,1)"}[et]
    m, k = lhs.shape
    ws = f"{et}[{w.shape[0]},{w.shape[1]}]{{1,0:T{tile}}}"
    ls = f"{et}[{m},{k}]{{1,0:T{tile}}}"
    n = w.shape[0] if transpose else w.shape[1]
    os_ = f"{out}[{m},{n}]{{1,0:T(8,8){'(2,1)' if out == 'bf16' else ''}}}"
    syms = [Symbol("w", vm(0x0, ws)), Symbol("a", vm(0x1000, ls)), Symbol("o", vm(0x8000, os_))]
    ins = [
        MxuLoadWeights(0, syms[0].ref, transpose=transpose, precision=precision),
        MxuMatmul(0, syms[1].ref, precision=precision),
    ]
    if accumulate_twice:
        ins.append(MxuMatmul(0, syms[1].ref, accumulate=True, precision=precision))
    ins.append(MxuPop(0, syms[2].ref))
    res = Chip(TEACH).run(Program.single(ins, symbols=syms), {"w": w, "a": lhs})
    return res.read("o")


def reference(lhs: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Exact products of the bf16 values, float64 sums, one rounding to f32 (for error bounds)."""
    return (lhs.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)


def f32_product(lhs: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The MXU's rule (docs/model.md, MXU numerics): the bf16 values as f32, one f32 matrix product."""
    return np.ascontiguousarray(lhs, np.float32) @ np.ascontiguousarray(w, np.float32)


def within_f32_accumulation(got: np.ndarray, lhs: np.ndarray, w: np.ndarray) -> bool:
    """|got - exact| <= K u sum |a||w| (u = 2^-24): the error bound of any order of f32 additions."""
    exact = lhs.astype(np.float64) @ w.astype(np.float64)
    bound = lhs.shape[1] * 2.0**-24 * (np.abs(lhs.astype(np.float64)) @ np.abs(w.astype(np.float64)))
    return bool(np.all(np.abs(got - exact) <= bound))


def test_bf16_products_accumulate_in_f32_as_documented():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((16, 8)).astype(BF16)
    w = (rng.standard_normal((8, 8)) * 100).astype(BF16)
    got = run_matmul(a, w)
    assert np.array_equal(got, f32_product(a, w))
    assert within_f32_accumulation(got, a, w)
    # a second matmul accumulating into the same rows joins the first: one f32 product over both
    twice = run_matmul(a, w, accumulate_twice=True)
    assert np.array_equal(twice, f32_product(np.concatenate([a, a], 1), np.concatenate([w, w], 0)))
    assert within_f32_accumulation(twice, np.concatenate([a, a], 1), np.concatenate([w, w], 0))


def _numeric_program(ins: list, arrays: dict[str, tuple[int, str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Run ``ins`` with VMEM symbols ``name -> (address, shape, value or None)``; the final value of each."""
    syms = [Symbol(n, vm(at, shape)) for n, (at, shape, _) in arrays.items()]
    inputs = {n: v for n, (_, _, v) in arrays.items() if v is not None}
    res = Chip(TEACH).run(Program.single(ins, symbols=syms), inputs)
    return {n: res.read(n) for n in arrays}


def test_groups_on_separate_rows_interleave_and_add_to_earlier_results():
    rng = np.random.default_rng(6)
    a0, a1, a2 = (rng.standard_normal((8, 8)).astype(BF16) for _ in range(3))
    w0, w1 = (rng.standard_normal((8, 8)).astype(BF16) for _ in range(2))
    t8, f8 = bf16_tile(8, 8), "f32[8,8]{1,0:T(8,8)}"
    arrays = {
        "w0": (0x0, t8, w0), "w1": (0x100, t8, w1), "a0": (0x200, t8, a0), "a1": (0x300, t8, a1),
        "a2": (0x400, t8, a2), "p": (0x1000, f8, None), "q": (0x1100, f8, None), "r": (0x1200, f8, None),
    }  # fmt: skip
    ref = {n: vm(at, shape) for n, (at, shape, _) in arrays.items()}
    ins = [
        MxuLoadWeights(0, ref["w0"]),
        MxuMatmul(0, ref["a0"], acc=0),  # rows 0..7: a0 w0 ...
        MxuMatmul(0, ref["a1"], acc=8),  # rows 8..15: a1 w0 ...
        MxuLoadWeights(0, ref["w1"]),
        MxuMatmul(0, ref["a2"], acc=0, accumulate=True),  # ... + a2 w1
        MxuMatmul(0, ref["a0"], acc=8, accumulate=True),  # ... + a0 w1
        MxuPop(0, ref["p"], acc=0),
        MxuPop(0, ref["q"], acc=8),
        MxuMatmul(0, ref["a1"], acc=0, accumulate=True),  # rows 0..7 again: the popped value + a1 w1
        MxuPop(0, ref["r"], acc=0),
    ]
    out = _numeric_program(ins, arrays)
    cat = np.concatenate
    p = f32_product(cat([a0, a2], 1), cat([w0, w1], 0))
    assert np.array_equal(out["p"], p)
    assert np.array_equal(out["q"], f32_product(cat([a1, a0], 1), cat([w0, w1], 0)))
    assert np.array_equal(out["r"], p + f32_product(a1, w1))


def test_latched_weights_and_streamed_rows_are_the_values_at_issue():
    """Overwriting the weights' or the LHS's memory after load_weights / matmul changes nothing: the MXU holds
    the values it read (the value cache keeps snapshots, and forgets them when memory is written)."""
    rng = np.random.default_rng(7)
    a, a_new, w, w_new = (rng.standard_normal((8, 8)).astype(BF16) for _ in range(4))
    t8, f8 = bf16_tile(8, 8), "f32[8,8]{1,0:T(8,8)}"
    arrays = {
        "w": (0x0, t8, w), "a": (0x100, t8, a), "w_new": (0x200, t8, w_new), "a_new": (0x300, t8, a_new),
        "p": (0x1000, f8, None), "q": (0x1100, f8, None),
    }  # fmt: skip
    ref = {n: vm(at, shape) for n, (at, shape, _) in arrays.items()}
    ins = [
        MxuLoadWeights(0, ref["w"]),
        VpuCopy(ref["w"], ref["w_new"]),  # the weights' memory changes after the load ...
        MxuMatmul(0, ref["a"]),
        VpuCopy(ref["a"], ref["a_new"]),  # ... and the LHS's after the matmul, before the pop
        MxuPop(0, ref["p"]),
        MxuLoadWeights(0, ref["w"]),  # reading them again sees the new values
        MxuMatmul(0, ref["a"]),
        MxuPop(0, ref["q"]),
    ]
    out = _numeric_program(ins, arrays)
    assert np.array_equal(out["p"], f32_product(a, w))
    assert np.array_equal(out["q"], f32_product(a_new, w_new))
    assert np.array_equal(out["w"], w_new) and np.array_equal(out["a"], a_new)


def test_bf16_matmul_agrees_with_jax():
    import jax.numpy as jnp

    rng = np.random.default_rng(2)
    a = rng.standard_normal((24, 8)).astype(BF16)
    w = rng.standard_normal((8, 8)).astype(BF16)
    expect = np.asarray(jnp.matmul(jnp.asarray(a), jnp.asarray(w), preferred_element_type=jnp.float32))
    np.testing.assert_allclose(run_matmul(a, w), expect, rtol=2e-6, atol=1e-6)


def test_transposed_weights_and_bf16_results():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((8, 8)).astype(BF16)
    w = rng.standard_normal((8, 8)).astype(BF16)
    got = run_matmul(a, w, transpose=True, out="bf16")
    assert got.dtype == BF16
    assert np.array_equal(got, f32_product(a, w.T).astype(BF16))


def test_int8_accumulates_exactly_in_s32():
    rng = np.random.default_rng(4)
    a = rng.integers(-128, 128, (16, 8)).astype(np.int8)
    w = rng.integers(-128, 128, (8, 8)).astype(np.int8)
    got = run_matmul(a, w, out="s32")
    assert got.dtype == np.int32
    assert np.array_equal(got, a.astype(np.int64) @ w.astype(np.int64))


def test_split_follows_xla():
    x = np.array([1.0, np.pi, -1e-3, 3.0e38, 1 / 3], np.float32)
    hi, lo = split_bf16(x, 2)
    assert np.array_equal(hi.view(np.uint32) & 0xFFFF, np.zeros(5, np.uint32))  # truncated, bf16-exact
    assert np.array_equal(lo.astype(BF16).astype(np.float32), lo)
    hi3, mid3, lo3 = split_bf16(x, 3)
    err = np.abs(hi3.astype(np.float64) + mid3 + lo3 - x.astype(np.float64))
    assert np.all(err <= np.abs(x.astype(np.float64)) * 2.0**-24)


def test_f32_precision_modes_converge_to_f32():
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(5)
    a = rng.standard_normal((16, 8)).astype(np.float32)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    truth = a.astype(np.float64) @ w.astype(np.float64)
    errs = {p: np.abs(run_matmul(a, w, precision=p) - truth).max() for p in ("bf16", "bf16_3x", "bf16_6x")}
    assert errs["bf16"] > 30 * errs["bf16_3x"] > 0
    assert errs["bf16_3x"] > 30 * errs["bf16_6x"]
    assert errs["bf16_6x"] <= errs["bf16_3x"]
    highest = np.asarray(jnp.matmul(jnp.asarray(a), jnp.asarray(w), precision=jax.lax.Precision.HIGHEST))
    np.testing.assert_allclose(run_matmul(a, w, precision="bf16_6x"), highest, rtol=1e-6, atol=1e-6)
    # the device and the pure function agree bit for bit
    assert np.array_equal(run_matmul(a, w, precision="bf16_3x"), matmul_f32(a, w, "bf16_3x"))


def test_non_finite_values_survive_the_split():
    a = np.ones((8, 8), np.float32)
    w = np.full((8, 8), np.inf, np.float32)
    assert np.all(np.isposinf(run_matmul(a, w, precision="bf16_3x")))


# ---------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------
def test_errors_name_the_instruction():
    with pytest.raises(ExecutionError, match=r"instruction 0 `mxu.matmul .*`: mxu.matmul before any mxu.load_weights"):
        Chip(TEACH).run(Program.single([MxuMatmul(0, vm(0x0, bf16_tile(8, 8)))]), timing_only=True)
    bad_k = [MxuLoadWeights(0, vm(0x0, bf16_tile(4, 8))), MxuMatmul(0, vm(0x100, bf16_tile(8, 8)), hlo="dot.7")]
    with pytest.raises(ExecutionError, match=r"\(from HLO dot.7\): left operand has 8 columns but .* have 4 rows"):
        Chip(TEACH).run(Program.single(bad_k), timing_only=True)
    with pytest.raises(ExecutionError, match=r"a 16 x 8 weight tile does not fit the 8 x 8 MXU"):
        Chip(TEACH).run(Program.single([MxuLoadWeights(0, vm(0x0, bf16_tile(16, 8)))]))
    with pytest.raises(ExecutionError, match=r"MXU 3 does not exist \(the core has 1\)"):
        Chip(TEACH).run(Program.single([MxuLoadWeights(3, vm(0x0, bf16_tile(8, 8)))]))
