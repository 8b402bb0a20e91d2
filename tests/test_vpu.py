"""The VPU and XLU: per-register cycle rules, packed bf16, and numerics of the elementwise ops against JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from tpusim.config import load_config
from tpusim.devices import Chip
from tpusim.isa import (
    Const,
    FusedOp,
    MemRef,
    Program,
    Reg,
    ScalarAlu,
    Space,
    Symbol,
    VpuBroadcast,
    VpuCopy,
    VpuFused,
    VpuIota,
    VpuMap,
    VpuReduce,
    VpuReshape,
    Window,
    XluTranspose,
)
from tpusim.isa.operands import IsaError
from tpusim.memory import pack, parse_shape

BF16 = ml_dtypes.bfloat16
TEACH = load_config(
    "teaching"
)  # alu 1 vreg/cycle, latency 2; transcendental 0.5/cycle, latency 6; ports 2 load, 1 store

TILES = {
    "f32": "(8,8)",
    "s32": "(8,8)",
    "u32": "(8,8)",
    "bf16": "(8,8)(2,1)",
    "s16": "(8,8)(2,1)",
    "s8": "(8,8)(4,1)",
    "u8": "(8,8)(4,1)",
    "pred": "(8,8)(4,1)",
}


def shape(et: str, dims: tuple[int, ...], m2m: str | None = None) -> str:
    m2m = m2m or ",".join(str(d) for d in reversed(range(len(dims))))
    return f"{et}[{','.join(map(str, dims))}]{{{m2m}:T{TILES[et]}}}"


def vm(address: int, text: str) -> MemRef:
    return MemRef(Space.VMEM, address, parse_shape(text))


def rows(result, unit_part=""):
    return [(s, u.split(".")[-1], e) for s, u, _, e, _, _ in result.trace.rows() if unit_part in u]


# ---------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 4, 16])
def test_elementwise_takes_registers_over_issue_rate_plus_latency(n):
    a = vm(0x0, shape("f32", (8 * n, 8)))
    ins = [
        VpuMap("add", vm(0x4000, shape("f32", (8 * n, 8))), (a, a)),
        VpuMap("negate", vm(0x8000, a.shape.__str__()), (a,)),
    ]
    res = Chip(TEACH).run(Program.single(ins), timing_only=True)
    # n registers at 1 per cycle, then 2 cycles of latency; the second op follows after the first's occupancy
    assert rows(res) == [(0, "vpu", n + 2), (n, "vpu", 2 * n + 2)]
    assert res.trace.bytes[0] == 3 * n * 256 and res.trace.flops[0] == 64 * n


def test_packed_bf16_doubles_elements_per_cycle():
    n = 8
    f = vm(0x0, shape("f32", (8 * n, 8)))
    b = vm(0x8000, shape("bf16", (8 * n, 8)))
    res_f = Chip(TEACH).run(Program.single([VpuMap("add", f, (f, f))]), timing_only=True)
    res_b = Chip(TEACH).run(Program.single([VpuMap("add", b, (b, b))]), timing_only=True)
    occupancy_f = res_f.trace.end[0] - 2
    occupancy_b = res_b.trace.end[0] - 2
    assert (occupancy_f, occupancy_b) == (n, n // 2)  # same elements, half the registers
    # and twice the elements fit the same cycles
    b2 = vm(0x8000, shape("bf16", (16 * n, 8)))
    res_b2 = Chip(TEACH).run(Program.single([VpuMap("add", b2, (b2, b2))]), timing_only=True)
    assert res_b2.trace.end[0] - 2 == n


def test_transcendental_path_is_slower():
    a = vm(0x0, shape("f32", (64, 8)))
    res = Chip(TEACH).run(Program.single([VpuMap("exponential", vm(0x4000, str(a.shape)), (a,))]), timing_only=True)
    assert rows(res) == [(0, "vpu", 8 / 0.5 + 6)]


def test_vmem_ports_bound_the_rate():
    cfg = load_config("tpu_v5e")  # 4 ALU vregs/cycle but 1 store per cycle
    a = vm(0x0, "f32[128,128]{1,0:T(8,128)}")  # 16 vregs
    res = Chip(cfg).run(Program.single([VpuMap("add", vm(0x10000, str(a.shape)), (a, a))]), timing_only=True)
    assert rows(res) == [(0, "vpu", 16 + 2)]


def test_padding_costs_registers():
    # 5 x 3 values in an (8,8) tile still occupy a whole register
    a = vm(0x0, shape("f32", (5, 3)))
    res = Chip(TEACH).run(Program.single([VpuMap("add", a, (a, a))]), timing_only=True)
    assert rows(res) == [(0, "vpu", 1 + 2)]


def test_fused_chain_pays_vmem_once():
    x = vm(0x0, shape("f32", (64, 8)))  # 8 registers
    y = vm(0x1000, shape("f32", (64, 8)))
    two, one = Const(2.0, "f32"), Const(1.0, "f32")
    chain = [VpuMap("multiply", y, (x, two)), VpuMap("add", y, (y, one)), VpuMap("tanh", y, (y,))]
    steps = (FusedOp("multiply", "f32", (0, 1)), FusedOp("add", "f32", (3, 2)), FusedOp("tanh", "f32", (4,)))
    fused = VpuFused(y, (x, two, one), steps)
    xs = np.linspace(-2, 2, 512, dtype=np.float32).reshape(64, 8)
    syms = [Symbol("x", x), Symbol("y", y)]
    res_chain = Chip(TEACH).run(Program.single(chain, symbols=syms), {"x": xs})
    res_fused = Chip(TEACH).run(Program.single([fused], symbols=syms), {"x": xs})
    np.testing.assert_array_equal(res_fused.read("y"), res_chain.read("y"))
    # chained: each op stores its 8 registers (8 cycles at one store per cycle) and waits for the previous
    # result; tanh runs at half a register per cycle. 0..8+2, 10..18+2, 20..36+6.
    assert rows(res_chain) == [(0, "vpu", 10), (10, "vpu", 20), (20, "vpu", 42)]
    # fused: 16 ALU register ops at 1 per cycle, 8 transcendental at 0.5 per cycle (in parallel slots),
    # one load and one store pass; then the latencies along the chain: 2 + 2 + 6.
    assert rows(res_fused) == [(0, "vpu", 16 + 10)]
    assert res_fused.trace.flops[0] == 3 * 512


def test_a_fused_source_of_size_one_broadcasts_in_registers():
    """A per-row value subtracted from every element of its row, as a softmax kernel does: the same values as
    a broadcast into a block then a subtraction, for one ALU op per result register instead of a stored
    block (8 stores) and its reload."""
    x = vm(0x0, shape("f32", (64, 8)))  # 8 registers
    m = vm(0x1000, "f32[64,1]{0,1:T(8)}")  # one value per row: 64 values, in 8 registers of a (8) tile
    b = vm(0x2000, shape("f32", (64, 8)))
    y = vm(0x3000, shape("f32", (64, 8)))
    xs = np.linspace(-2, 2, 512, dtype=np.float32).reshape(64, 8)
    ms = np.arange(64, dtype=np.float32).reshape(64, 1)
    syms = [Symbol("x", x), Symbol("m", m), Symbol("y", y)]
    m_row = MemRef(Space.VMEM, 0x1000, parse_shape("f32[64]{0:T(8)}"))
    apart = [VpuBroadcast(b, m_row, (0,)), VpuMap("subtract", y, (x, b))]
    fused = [VpuFused(y, (x, m), (FusedOp("subtract", "f32", (0, 1)),))]
    res_apart = Chip(TEACH).run(Program.single(apart, symbols=syms), {"x": xs, "m": ms})
    res_fused = Chip(TEACH).run(Program.single(fused, symbols=syms), {"x": xs, "m": ms})
    np.testing.assert_array_equal(res_fused.read("y"), xs - ms)
    np.testing.assert_array_equal(res_apart.read("y"), xs - ms)
    # 8 subtract + 8 broadcast register ops at one per cycle, then the latency of the one step.
    assert rows(res_fused) == [(0, "vpu", 16 + 2)]
    with pytest.raises(IsaError, match="does not broadcast"):
        VpuFused(y, (vm(0x1000, "f32[32,1]{0,1:T(8)}"),), (FusedOp("negate", "f32", (0,)),))


def test_reductions_cost_by_dimension():
    src = vm(0x0, shape("f32", (4, 16, 16)))  # 4 x 2 x 2 = 16 registers; lanes = dim 2, sublanes = dim 1
    cases = {
        (0,): (vm(0x8000, shape("f32", (16, 16))), "vpu", 16 + 2),  # major: one op per source register
        (1,): (vm(0x8000, "f32[4,16]{1,0:T(8)}"), "vpu", 16 + 3 * 1 + 2),  # sublane: + log2(8) per output reg
        # lane: a row spans 2 registers, added on the ALUs (8 ops); the 8 sums cross the lanes on an XLU at
        # 2 cycles each
        (2,): (vm(0x8000, shape("f32", (4, 16))), "xlu0", 8 * 2 + 4),
    }
    for dims, (dst, unit, end) in cases.items():
        res = Chip(TEACH).run(Program.single([VpuReduce("add", dst, src, dims)]), timing_only=True)
        assert rows(res) == [(0, unit, end)], dims


def test_broadcast_transpose_and_relayout_costs():
    src_row = vm(0x0, shape("f32", (1, 16)))
    dst = vm(0x4000, shape("f32", (16, 16)))  # 4 registers
    col = vm(0x2000, "f32[16]{0:T(8)}")
    prog = Program.single(
        [
            VpuBroadcast(dst, src_row, (0, 1)),  # along sublanes: one op per output reg
            VpuBroadcast(dst, col, (0,)),  # along lanes: cross-lane unit, 2 cycles per output reg
            XluTranspose(dst, dst, (1, 0)),  # swaps lanes and sublanes: 4 cycles per register
            VpuCopy(vm(0x8000, "f32[16,16]{1,0:T(8,8)}"), dst),  # same lane dim: load/store bound
            VpuCopy(vm(0x8000, "f32[16,16]{0,1:T(8,8)}"), dst),  # other lane dim: a transpose on the XLU
        ]
    )
    res = Chip(TEACH).run(prog, timing_only=True)
    spans = [(u, e - s) for s, u, e in rows(res)]
    assert spans == [("vpu", 4 + 2), ("xlu0", 8 + 4), ("xlu0", 16 + 4), ("vpu", 4 + 2), ("xlu0", 16 + 4)]


def test_a_strided_copy_loads_one_register_per_result_register_unless_it_gathers_across_lanes():
    """Strides off the lane dimension are load addressing (Mosaic's strided load takes any stride but the
    lanes'): V(dst) loads and stores. A lane stride gathers across lanes: the XLU, per source register."""
    src = vm(0x0, shape("f32", (64, 64)))  # (8, 8) teaching tiles: 64 registers
    rows_only = VpuCopy(vm(0x8000, shape("f32", (16, 64))), MemRef(Space.VMEM, 0, src.shape, Window((0, 0), (61, 64))),
                        strides=(4, 1))  # fmt: skip
    lanes = VpuCopy(vm(0x8000, shape("f32", (64, 16))), MemRef(Space.VMEM, 0, src.shape, Window((0, 0), (64, 61))),
                    strides=(1, 4))  # fmt: skip
    res = Chip(TEACH).run(Program.single([rows_only, lanes]), timing_only=True)
    spans = [(u, e - s) for s, u, e in rows(res)]
    # 16 result registers: 16 strided loads (2 a cycle) and 16 stores (1 a cycle), + the ALU latency 2
    assert spans[0] == ("vpu", 16 + 2)
    # the lane gather reads the 64 registers its 64 x 61 window touches, at 4 cycles each, + latency 4
    assert spans[1] == ("xlu0", 64 * 4 + 4)


def test_a_negative_stride_counts_from_the_end_of_the_window():
    x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    src = vm(0x0, shape("f32", (64, 64)))
    dst = vm(0x8000, shape("f32", (21, 64)))
    window = MemRef(Space.VMEM, 0, src.shape, Window((2, 0), (61, 64)))
    prog = Program.single([VpuCopy(dst, window, strides=(-3, -1))], symbols=[Symbol("x", src), Symbol("y", dst)])
    res = Chip(TEACH).run(prog, {"x": x})
    np.testing.assert_array_equal(res.read("y"), x[2:63][::-3, ::-1])
    # the lanes reversed cross lanes: the XLU, 4 cycles for each of the 64 registers the window touches
    assert [(u, e - s) for s, u, e in rows(res)] == [("xlu0", 64 * 4 + 4)]


def test_a_strided_copy_takes_every_kth_element():
    x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    src = vm(0x0, shape("f32", (64, 64)))
    dst = vm(0x8000, shape("f32", (21, 13)))
    window = MemRef(Space.VMEM, 0, src.shape, Window((2, 1), (61, 61)))
    prog = Program.single([VpuCopy(dst, window, strides=(3, 5))], symbols=[Symbol("x", src), Symbol("y", dst)])
    res = Chip(TEACH).run(prog, {"x": x})
    np.testing.assert_array_equal(res.read("y"), x[2:63:3, 1:62:5])


# ---------------------------------------------------------------------------------------------------------
# Numerics
# ---------------------------------------------------------------------------------------------------------
def vpu_eval(fn: str, args: list, out_et: str, direction: str | None = None, dims=(8, 16)) -> np.ndarray:
    syms, srcs, inputs = [], [], {}
    addr = 0
    for i, a in enumerate(args):
        if isinstance(a, (Const, Reg)):
            srcs.append(a)
            continue
        et = {np.dtype(BF16): "bf16"}.get(a.dtype) or {
            "float32": "f32",
            "int32": "s32",
            "uint32": "u32",
            "bool": "pred",
            "int8": "s8",
            "uint8": "u8",
            "int16": "s16",
        }[a.dtype.name]
        ref = vm(addr, shape(et, dims))
        addr += 0x1000
        syms.append(Symbol(f"x{i}", ref))
        srcs.append(ref)
        inputs[f"x{i}"] = a
    out = vm(addr, shape(out_et, dims))
    syms.append(Symbol("out", out))
    ins = [ScalarAlu("mov", Reg(3), -7), VpuMap(fn, out, tuple(srcs), direction=direction)]
    return Chip(TEACH).run(Program.single(ins, symbols=syms), inputs).read("out")


RNG = np.random.default_rng(7)  # reseeded for every test (conftest.py)
F = (RNG.standard_normal((8, 16)) * 3).astype(np.float32)
G = (RNG.standard_normal((8, 16)) * 3).astype(np.float32)
F[0, :6] = [np.nan, np.inf, -np.inf, -0.0, 0.5, 2.5]
POS = np.abs(F) + np.float32(0.1)
IA = RNG.integers(-50, 50, (8, 16)).astype(np.int32)
JB = RNG.integers(-5, 5, (8, 16)).astype(np.int32)
JB[0, :3] = [0, 0, -1]
IA[0, :3] = [7, -7, np.iinfo(np.int32).min]

FLOAT_OPS = [
    ("add", jax.lax.add, 2),
    ("subtract", jax.lax.sub, 2),
    ("multiply", jax.lax.mul, 2),
    ("divide", jax.lax.div, 2),
    ("maximum", jax.lax.max, 2),
    ("minimum", jax.lax.min, 2),
    ("remainder", jax.lax.rem, 2),
    ("negate", jax.lax.neg, 1),
    ("abs", jax.lax.abs, 1),
    ("sign", jax.lax.sign, 1),
    ("floor", jax.lax.floor, 1),
    ("ceil", jax.lax.ceil, 1),
    ("round-nearest-even", lambda x: jax.lax.round(x, 1), 1),
    ("round-nearest-afz", lambda x: jax.lax.round(x, 0), 1),
    ("is-finite", jax.lax.is_finite, 1),
    ("exponential", jax.lax.exp, 1),
    ("log", jax.lax.log, 1),
    ("tanh", jax.lax.tanh, 1),
    ("sqrt", jax.lax.sqrt, 1),
    ("rsqrt", jax.lax.rsqrt, 1),
    ("logistic", jax.lax.logistic, 1),
    ("sine", jax.lax.sin, 1),
    ("cosine", jax.lax.cos, 1),
    ("exponential-minus-one", jax.lax.expm1, 1),
    ("log-plus-one", jax.lax.log1p, 1),
    ("atan2", jax.lax.atan2, 2),
    ("power", jax.lax.pow, 2),
    ("cbrt", jax.lax.cbrt, 1),
    ("erf", jax.lax.erf, 1),
    ("tan", jax.lax.tan, 1),
]
EXACT = {
    "add",
    "subtract",
    "multiply",
    "divide",
    "maximum",
    "minimum",
    "remainder",
    "negate",
    "abs",
    "sign",
    "floor",
    "ceil",
    "round-nearest-even",
    "round-nearest-afz",
    "is-finite",
    "sqrt",
}


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize(("fn", "ref", "arity"), FLOAT_OPS, ids=[o[0] for o in FLOAT_OPS])
def test_float_elementwise_matches_jax(fn, ref, arity, dtype):
    args = [(POS if fn in ("log", "sqrt", "rsqrt", "power", "cbrt") else F).astype(dtype), G.astype(dtype)][:arity]
    out_et = "pred" if fn == "is-finite" else ("bf16" if dtype is BF16 else "f32")
    got = vpu_eval(fn, args, out_et)
    expect = np.asarray(ref(*[jnp.asarray(a) for a in args]))
    # f32 arithmetic then one rounding: IEEE ops are bit-exact; others within f32 or bf16 rounding
    tol = 0 if fn in EXACT else (2e-6 if dtype is np.float32 else 2.0**-7)
    np.testing.assert_allclose(
        got.astype(np.float64), expect.astype(np.float64), rtol=tol, atol=tol * 1e-3, equal_nan=True
    )


INT_OPS = [
    ("add", jax.lax.add),
    ("subtract", jax.lax.sub),
    ("multiply", jax.lax.mul),
    ("divide", jax.lax.div),
    ("remainder", jax.lax.rem),
    ("maximum", jax.lax.max),
    ("and", jax.lax.bitwise_and),
    ("xor", jax.lax.bitwise_xor),
    ("shift-left", jax.lax.shift_left),
    ("shift-right-logical", jax.lax.shift_right_logical),
    ("shift-right-arithmetic", jax.lax.shift_right_arithmetic),
]


@pytest.mark.parametrize(("fn", "ref"), INT_OPS, ids=[o[0] for o in INT_OPS])
def test_int32_elementwise_matches_jax_including_edge_cases(fn, ref):
    b = JB * 9 if fn.startswith("shift") else JB  # shifts by 0..45 and negative amounts
    got = vpu_eval(fn, [IA, b], "s32")
    assert np.array_equal(got, np.asarray(ref(jnp.asarray(IA), jnp.asarray(b))))


def test_unary_int_ops_match_jax():
    assert np.array_equal(vpu_eval("popcnt", [IA], "s32"), np.asarray(jax.lax.population_count(jnp.asarray(IA))))
    assert np.array_equal(vpu_eval("count-leading-zeros", [IA], "s32"), np.asarray(jax.lax.clz(jnp.asarray(IA))))
    assert np.array_equal(vpu_eval("not", [IA], "s32"), ~IA)


@pytest.mark.parametrize("direction", ["EQ", "NE", "LT", "LE", "GT", "GE"])
def test_compare_and_select(direction):
    got = vpu_eval("compare", [F, G], "pred", direction)
    expect = {"EQ": F == G, "NE": F != G, "LT": F < G, "LE": F <= G, "GT": F > G, "GE": F >= G}[direction]
    assert np.array_equal(got, expect)
    picked = vpu_eval("select", [expect, F, G], "f32")
    assert np.array_equal(picked, np.where(expect, F, G), equal_nan=True)


@pytest.mark.parametrize(
    ("src", "dst"),
    [("f32", "bf16"), ("f32", "s32"), ("f32", "u8"), ("s32", "f32"), ("bf16", "f32"), ("f32", "pred"), ("s32", "s8")],
)
def test_convert_follows_xla(src, dst):
    x = {"f32": F * 1e9, "s32": IA * 99999, "bf16": F.astype(BF16)}[src]
    x = x.astype(np.float32) if src == "f32" else x
    got = vpu_eval("convert", [x], dst)
    np_dst = {"bf16": BF16, "s32": jnp.int32, "u8": jnp.uint8, "f32": jnp.float32, "pred": jnp.bool_, "s8": jnp.int8}[
        dst
    ]
    expect = np.asarray(jax.lax.convert_element_type(jnp.asarray(x), np_dst))
    assert np.array_equal(got, expect, equal_nan=True) if dst != "pred" else np.array_equal(got, x != 0)


def test_constants_and_registers_splat():
    got = vpu_eval("add", [F, Const(1.5, "f32")], "f32")
    np.testing.assert_array_equal(got, F + np.float32(1.5))
    got = vpu_eval("multiply", [IA, Reg(3)], "s32")  # s3 holds -7
    np.testing.assert_array_equal(got, IA * -7)
    got = vpu_eval("clamp", [Const(-1.0, "f32"), F, Const(1.0, "f32")], "f32")
    np.testing.assert_array_equal(got, np.asarray(jax.lax.clamp(-1.0, jnp.asarray(F), 1.0)))


def test_structural_ops_move_real_bytes():
    x = np.arange(4 * 16 * 16, dtype=np.float32).reshape(4, 16, 16) / 7
    syms = [
        Symbol("x", vm(0x0, shape("f32", (4, 16, 16), "2,1,0"))),
        Symbol("sum1", vm(0x4000, "f32[4,16]{1,0:T(8)}")),
        Symbol("max2", vm(0x5000, shape("f32", (4, 16)))),
        Symbol("t", vm(0x6000, shape("f32", (16, 4, 16), "2,1,0"))),
        Symbol("col", vm(0xA000, "f32[16,16]{0,1:T(8,8)}")),
        Symbol("bc", vm(0xB000, shape("f32", (16, 16)))),
        Symbol("iota", vm(0xC000, shape("s32", (16, 16)))),
        Symbol("flat", vm(0xD000, "f32[1024]{0}")),
        Symbol("acc", vm(0x4000, "f32[4,16]{1,0:T(8)}")),
    ]
    r = {s.name: s.ref for s in syms}
    x_block = MemRef(Space.VMEM, 0x0, r["x"].shape)
    sub = MemRef(Space.VMEM, 0x0, r["x"].shape, window=Window((1, 0, 0), (1, 16, 16)))
    first_row = MemRef(Space.VMEM, 0x5000, r["max2"].shape, window=Window((0, 0), (1, 16)))
    prog = Program.single(
        [
            VpuReduce("add", r["sum1"], x_block, (1,)),
            VpuReduce("add", r["acc"], x_block, (1,), accumulate=True),  # doubles sum1
            VpuReduce("maximum", r["max2"], x_block, (2,)),
            XluTranspose(r["t"], x_block, (1, 0, 2)),
            VpuReshape(r["col"], sub),
            VpuBroadcast(r["bc"], first_row, (0, 1)),
            VpuIota(r["iota"], 1),
            VpuCopy(r["flat"], MemRef(Space.VMEM, 0x0, parse_shape("f32[1024]{0}"))),
        ],
        symbols=syms,
    )
    res = Chip(TEACH).run(prog, {"x": x})
    np.testing.assert_array_equal(res.read("sum1"), 2 * np.add.reduce(x, axis=1))
    np.testing.assert_array_equal(res.read("max2"), x.max(axis=2))
    np.testing.assert_array_equal(res.read("t"), x.transpose(1, 0, 2))
    np.testing.assert_array_equal(res.read("col"), x[1])
    # the column-major copy really is column-major in memory
    assert np.array_equal(res.memory("vmem").read(0xA000, 1024), pack(x[1], r["col"].shape))
    np.testing.assert_array_equal(res.read("bc"), np.broadcast_to(x.max(axis=2)[0], (16, 16)))
    np.testing.assert_array_equal(res.read("iota"), np.broadcast_to(np.arange(16, dtype=np.int32), (16, 16)))
    assert res.read("flat").shape == (1024,)


def test_numerics_are_the_oracles():
    # denormals flush as on TPUs, -0 orders below +0 in maximum, pred arithmetic is logic: the device runs
    # the reference interpreter's elementwise functions, so it agrees with the oracle on such corners
    tiny = np.full((8, 16), 1e-40, np.float32)
    assert not vpu_eval("add", [tiny, np.zeros_like(tiny)], "f32").any()
    neg_zero = np.full((8, 16), -0.0, np.float32)
    assert not np.signbit(vpu_eval("maximum", [neg_zero, np.zeros_like(neg_zero)], "f32")).any()
    p = RNG.integers(0, 2, (8, 16)).astype(bool)
    q = RNG.integers(0, 2, (8, 16)).astype(bool)
    np.testing.assert_array_equal(vpu_eval("subtract", [p, q], "pred"), p ^ q)


def test_operand_types_are_checked_at_load():
    from tpusim.devices import ExecutionError

    f = vm(0x0, shape("f32", (8, 16)))
    bad = [
        (VpuMap("add", f, (f, Const(1, "s32"))), r"vpu.add operands must share one element type, not f32, s32"),
        (VpuMap("add", vm(0x800, shape("bf16", (8, 16))), (f, f)), r"vpu.add of f32 operands gives f32, not bf16"),
        (VpuMap("compare", f, (f, f), direction="LT"), r"vpu.compare gives pred, not f32"),
    ]
    for ins, message in bad:
        with pytest.raises(ExecutionError, match=r"instruction 0 `vpu\..*: " + message):
            Chip(TEACH).run(Program.single([ins]), timing_only=True)


def test_an_op_of_broadcast_constants_fills_its_whole_result() -> None:
    """subtract(b, b) of one broadcast constant: both sources become immediates and the VPU computes one value,
    which must fill the whole result (it raised 'cannot reshape array of size 1' inside the device)."""
    import tpusim

    text = """
HloModule imm
ENTRY main {
  c = bf16[] constant(1.5)
  b = bf16[3,5,7] broadcast(c), dimensions={}
  ROOT m = bf16[3,5,7] subtract(b, b)
}
"""
    (out,) = tpusim.simulate(text, []).outputs
    assert out.shape == (3, 5, 7) and not np.asarray(out, np.float32).any()
