"""Elementwise ops of the reference interpreter against XLA CPU, per element type.

For every element type one HLO module holds every elementwise op that type supports (unary, binary,
compare in each direction and type, select, clamp, convert to every other type, bitcast-convert,
reduce-precision). The same module runs on XLA CPU (compiled by jaxlib from the HLO text) and on the
reference; every result must match within TOLERANCES (exact except transcendentals). Inputs are the
special values of each type (zeros of both signs, infinities, NaN, extremes, halves, denormals ...) in
every pairing, plus seeded random values.
"""

from __future__ import annotations

import itertools
from functools import cache

import ml_dtypes
import numpy as np
import pytest
from jax_oracle import Op, assert_close, ops_module, run_hlo_on_xla, tolerance_for, ulp_distance

from tpusim.compiler.hlo.reference import evaluate
from tpusim.memory import element_type, element_type_of_dtype

FLOATS = ("f32", "f64", "bf16", "f16", "f8e4m3fn", "f8e5m2")
INTS = ("s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64", "s4", "u4")
COMPLEX = ("c64", "c128")
N = 1536

UNARY_FLOAT = (
    "abs", "negate", "sign", "floor", "ceil", "round-nearest-afz", "round-nearest-even", "sqrt", "rsqrt", "cbrt",
    "exponential", "exponential-minus-one", "log", "log-plus-one", "sine", "cosine", "tan", "tanh", "logistic",
    "erf",
)  # fmt: skip
BINARY_FLOAT = ("add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power", "atan2")
UNARY_INT = ("abs", "negate", "sign", "not", "popcnt", "count-leading-zeros")
BINARY_INT = (
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power", "and", "or", "xor",
    "shift-left", "shift-right-logical", "shift-right-arithmetic",
)  # fmt: skip
UNARY_COMPLEX = ("abs", "negate", "sign", "sqrt", "exponential", "log", "tanh", "sine", "cosine", "real", "imag")
BINARY_COMPLEX = ("add", "subtract", "multiply", "divide")
DIRECTIONS = ("EQ", "NE", "LT", "LE", "GT", "GE")
TRANSCENDENTAL_FLOAT = {
    "rsqrt", "cbrt", "exponential", "exponential-minus-one", "log", "log-plus-one", "sine", "cosine", "tan",
    "tanh", "logistic", "erf", "power", "atan2",
}  # fmt: skip


def _float_values(t: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    dt = element_type(t).dtype
    if element_type(t).bits == 8:  # every bit pattern, each against each (256 x 256 would be slow: sample)
        every = np.arange(256, dtype=np.uint8).view(dt)
        a = np.concatenate([every, rng.choice(every, N - 256)])
        return a, rng.permutation(a)
    fi = ml_dtypes.finfo(dt)
    special = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, -7.0, 100.0, np.inf, -np.inf, np.nan,
               float(fi.max), -float(fi.max), float(fi.tiny), -float(fi.tiny), float(fi.smallest_subnormal),
               -float(fi.smallest_subnormal), 1e-3, 0.7853981633974483, 88.0, -88.0, 710.0]  # fmt: skip
    sp = np.array(special, dtype=np.float64).astype(dt)
    pairs = np.array(list(itertools.product(range(len(sp)), repeat=2)))
    k = N - len(pairs)
    mag = np.exp(rng.uniform(-8, 8, size=(2, k)))
    rnd = (mag * rng.choice([-1.0, 1.0], size=(2, k))).astype(dt)
    return np.concatenate([sp[pairs[:, 0]], rnd[0]]), np.concatenate([sp[pairs[:, 1]], rnd[1]])


def _int_values(t: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    dt = element_type(t).dtype
    info = ml_dtypes.iinfo(dt)
    bits = info.bits
    special = sorted(v for v in {0, 1, 2, 3, 7, bits - 1, bits, bits + 1, int(info.max), int(info.max) - 1,
                                 int(info.min), int(info.min) + 1, -1, -2, -7, -bits}
                     if int(info.min) <= v <= int(info.max))  # fmt: skip
    sp = np.array(special, dtype=object)
    pairs = np.array(list(itertools.product(range(len(sp)), repeat=2)))
    k = N - len(pairs)
    rnd = rng.integers(int(info.min), int(info.max), size=(2, k), dtype=np.int64 if bits < 64 else dt, endpoint=True)
    rnd = rnd.astype(dt)
    small = rng.integers(-3 if info.min < 0 else 0, bits + 3, size=k // 4)
    small = np.clip(small, int(info.min), int(info.max)).astype(dt)
    b = np.concatenate([sp[pairs[:, 1]].astype(dt), small, rnd[1][k // 4 :]])
    return np.concatenate([sp[pairs[:, 0]].astype(dt), rnd[0]]), b


def _values(t: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(sum(map(ord, t)))
    kind = element_type(t).kind
    if kind == "float":
        return _float_values(t, rng)
    if kind == "complex":
        # Finite values of moderate size: XLA's complex formulas for inf/NaN/denormal parts are its own
        # (abs(inf + nan*j) is NaN), a deviation docs/reference.md lists.
        special = np.array([0, 1, -1, 1j, -1j, 1 + 1j, 0.5 - 2j, 3j], dtype=element_type(t).dtype)
        parts = np.exp(rng.uniform(-4, 4, size=(4, N))) * rng.choice([-1.0, 1.0], size=(4, N))
        a = (parts[0] + 1j * parts[1]).astype(element_type(t).dtype)
        b = (parts[2] + 1j * parts[3]).astype(element_type(t).dtype)
        a[: len(special)] = special
        b[: len(special) ** 2] = np.tile(special, len(special))
        a[: len(special) ** 2] = np.repeat(special, len(special))
        return a, b
    if kind == "pred":
        return rng.integers(0, 2, N).astype(bool), rng.integers(0, 2, N).astype(bool)
    return _int_values(t, rng)


def _ops(t: str) -> list[Op]:
    """Every elementwise op of element type ``t``: operands p0, p1 (type t), p2 (pred), p3 (type t)."""
    et = element_type(t)
    ops: list[Op] = []
    if et.kind == "float":
        ops += [Op(o, t, (0,)) for o in UNARY_FLOAT] + [Op(o, t, (0, 1)) for o in BINARY_FLOAT]
        ops.append(Op("is-finite", "pred", (0,)))
        ctypes = ("FLOAT", "TOTALORDER")
    elif et.kind == "complex":
        ops += [Op(o, t if o not in ("abs", "real", "imag") else ("f32" if t == "c64" else "f64"), (0,))
                for o in UNARY_COMPLEX]  # fmt: skip
        ops += [Op(o, t, (0, 1)) for o in BINARY_COMPLEX]
        ctypes = ("FLOAT",)
    elif et.kind == "pred":
        ops += [Op("not", t, (0,))] + [Op(o, t, (0, 1)) for o in ("and", "or", "xor")]
        ctypes = ("UNSIGNED",)
    else:
        # StableHLO (the route to XLA here) has no abs or sign of unsigned integers
        unary = UNARY_INT if et.kind == "signed" else tuple(o for o in UNARY_INT if o not in ("abs", "sign"))
        ops += [Op(o, t, (0,)) for o in unary] + [Op(o, t, (0, 1)) for o in BINARY_INT]
        ctypes = ("SIGNED" if et.kind == "signed" else "UNSIGNED",)
    for d in DIRECTIONS if et.kind != "complex" else ("EQ", "NE"):
        for c in ctypes:
            ops.append(Op("compare", "pred", (0, 1), f", direction={d}, type={c}", (("direction", d), ("type", c))))
    ops.append(Op("select", t, (2, 0, 1)))
    if et.kind not in ("complex",):
        ops.append(Op("clamp", t, (0, 1, 3)))
    # StableHLO converts real -> complex only between equal part widths, and never complex -> real
    targets = FLOATS + INTS + ("pred",) if et.kind != "complex" else COMPLEX
    targets += {"f32": ("c64",), "f64": ("c128",)}.get(t, ())
    for to in targets:
        if to != t:
            ops.append(Op("convert", to, (0,)))
    for to in FLOATS + INTS:
        if to != t and element_type(to).bits == et.bits and et.kind not in ("pred", "complex"):
            ops.append(Op("bitcast-convert", to, (0,)))
    if et.kind == "float" and et.bits >= 16:
        for e, m in ((5, 10), (8, 7), (4, 3), (5, 2), (8, 0), (11, 52)):
            ops.append(Op("reduce-precision", t, (0,), f", exponent_bits={e}, mantissa_bits={m}",
                          (("exponent_bits", e), ("mantissa_bits", m))))  # fmt: skip
    return ops


def _is_denormal(x: np.ndarray) -> np.ndarray:
    if element_type_of_dtype(x.dtype).kind not in ("float", "complex"):
        return np.zeros(x.shape, bool)
    parts = (x.real, x.imag) if np.iscomplexobj(x) else (x,)
    out = np.zeros(x.shape, bool)
    for p in parts:
        v = np.abs(p.astype(np.float64))
        out |= (v > 0) & (v < float(ml_dtypes.finfo(np.float32 if p.dtype.itemsize <= 4 else p.dtype).tiny))
    return out


@cache
def _run(t: str) -> tuple[list[Op], list[np.ndarray], list[np.ndarray]]:
    ops = _ops(t)
    a, b = _values(t)
    pred = np.random.default_rng(1).integers(0, 2, N).astype(bool)
    c = np.random.default_rng(2).permutation(a)
    text, module = ops_module((t, t, "pred", t), (N,), ops)
    want = run_hlo_on_xla(text, a, b, pred, c)
    got = evaluate(module, [a, b, pred, c])
    return ops, got, want


@pytest.mark.parametrize("t", FLOATS + INTS + COMPLEX + ("pred",))
def test_elementwise_against_xla(t: str) -> None:
    failures = []
    for op, g, w in _compared(t):
        tol = tolerance_for(op.opcode, t)  # rows are keyed by the operand type (abs of c64 is an f32)
        if op.opcode in ("compare", "is-finite", "convert", "bitcast-convert", "select"):
            tol = tolerance_for("exact", t)
        if t == "s4" and op.opcode == "popcnt":
            # XLA CPU counts the bits of the sign-extended byte it stores an s4 in (popcnt(-8) = 5); the
            # reference counts the 4 bits of the value (1), a deviation docs/reference.md lists.
            continue
        try:
            assert_close(g, w, tol, f"{t} {op.opcode}{op.attrs_text} -> {op.result}")
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, "\n".join(failures)


def _compared(t: str) -> list[tuple[Op, np.ndarray, np.ndarray]]:
    """(op, reference, XLA) per op; transcendentals without the elements that have a denormal operand: XLA
    CPU's approximations treat those case by case (tanh returns x, cbrt does not flush) while the reference
    flushes them (docs/reference.md)."""
    ops, got, want = _run(t)
    a, b = _values(t)
    keep = ~(_is_denormal(a) | _is_denormal(b))
    return [
        (op, g[keep], w[keep]) if op.opcode in TRANSCENDENTAL_FLOAT else (op, g, w) for op, g, w in zip(ops, got, want)
    ]


def measured_differences() -> list[tuple[str, str, float, float]]:
    """(opcode, type, max ulp difference, max |difference| / |XLA value|) of every op with a non-exact row in
    TOLERANCES (transcendentals; complex arithmetic), against XLA CPU on this file's inputs."""
    rows = []
    for t in ("f32", "f64", "bf16", "f16", "f8e4m3fn", "f8e5m2", "c64", "c128"):
        for op, g, w in _compared(t):
            complex_op = element_type(t).kind == "complex" and op.opcode in UNARY_COMPLEX + BINARY_COMPLEX
            if op.opcode not in TRANSCENDENTAL_FLOAT and not complex_op:
                continue
            g, w = np.asarray(g), np.asarray(w)
            ok = np.isfinite(w) & np.isfinite(g)
            if g.dtype.kind == "c":
                d = np.maximum(ulp_distance(g.real, w.real), ulp_distance(g.imag, w.imag))
            else:
                d = ulp_distance(g, w)
            with np.errstate(all="ignore"):
                rel = np.abs(g.astype(np.complex128) - w.astype(np.complex128)) / np.abs(w.astype(np.complex128))
            rel = np.where(w.astype(np.complex128) == 0, 0, rel)
            rows.append((op.opcode, t, float(d[ok].max(initial=0)), float(rel[ok].max(initial=0))))
    return rows


def test_measured_differences() -> None:
    """The figures behind TOLERANCES: printed with ``pytest -s -k measured``; each must fit its row."""
    rows = measured_differences()
    for op, t, d, rel in rows:
        print(f"MEASURED {op:24s} {t:9s} {d:6.0f} ulp  {rel:.2e} rel")
    for op, t, d, rel in rows:
        tol = tolerance_for(op, t)
        assert d <= tol.ulps or rel <= tol.rtol, (op, t, d, rel, tol)


@pytest.mark.parametrize("t", ["s8", "u16", "s32", "u32", "s64", "u64"])
def test_mulhi_is_the_high_half_of_the_exact_product(t: str) -> None:
    """mulhi (a newer XLA opcode JAX 0.10's XLA cannot run) against Python's exact integers."""
    dt = element_type(t).dtype
    info = np.iinfo(dt)
    a, b = _int_values(t, np.random.default_rng(4))
    _, module = ops_module((t, t), (N,), [Op("mulhi", t, (0, 1))])
    (got,) = evaluate(module, [a, b])
    want = [((int(x) * int(y)) >> info.bits) % (1 << info.bits) for x, y in zip(a, b)]
    assert [int(g) % (1 << info.bits) for g in got] == want


def test_newer_trigonometric_opcodes_match_libm() -> None:
    """acos ... sinh (newer XLA opcodes, unimplemented by JAX 0.10's XLA CPU) against Python's math module."""
    import math

    ops = {"acos": math.acos, "asin": math.asin, "atan": math.atan, "acosh": math.acosh, "asinh": math.asinh,
           "atanh": math.atanh, "cosh": math.cosh, "sinh": math.sinh}  # fmt: skip
    x = np.array([-0.9, -0.3, 0.0, 0.25, 0.75, 1.5, 3.0], np.float64)
    _, module = ops_module(("f64",), x.shape, [Op(o, "f64", (0,)) for o in ops])
    for (name, f), got in zip(ops.items(), evaluate(module, [x])):
        for v, g in zip(x, got):
            try:
                want = f(float(v))
            except ValueError:  # outside the domain: NaN
                assert np.isnan(g), (name, v, g)
                continue
            assert ulp_distance(np.float64(g), np.float64(want)) <= 1, (name, v, g, want)


U4, S4 = ml_dtypes.uint4, ml_dtypes.int4


@pytest.mark.parametrize(
    "text, args, want",
    [
        ("pred[] not(p0)", [np.array(True)], np.array(False)),
        ("s8[] not(p0)", [np.array(5, np.int8)], np.array(-6, np.int8)),
        ("s32[] popcnt(p0)", [np.array(-1, np.int32)], np.array(32, np.int32)),
        ("u16[] count-leading-zeros(p0)", [np.array(1, np.uint16)], np.array(15, np.uint16)),
        ("u4[] add(p0, p1)", [np.array(9, U4), np.array(9, U4)], np.array(2, U4)),  # (wraps)
        ("s4[] maximum(p0, p1)", [np.array(-3, S4), np.array(2, S4)], np.array(2, S4)),
    ],
)
def test_scalar_results_are_arrays(text: str, args: list[np.ndarray], want: np.ndarray) -> None:
    """numpy's ufuncs give scalars for 0-d operands; the reference's results are 0-d arrays all the same (these
    once failed its own result check)."""
    from tpusim.compiler.hlo import parse_module
    from tpusim.memory import element_type_of_dtype

    params = "\n".join(f"  p{k} = {element_type_of_dtype(a.dtype)}[] parameter({k})" for k, a in enumerate(args))
    got = evaluate(parse_module(f"HloModule m\nENTRY e {{\n{params}\n  ROOT r = {text}\n}}"), args)[0]
    assert isinstance(got, np.ndarray) and got.shape == () and got.dtype == want.dtype
    assert got.astype(np.int64) == want.astype(np.int64)


def test_pred_dot_to_a_scalar_is_an_array() -> None:
    from tpusim.compiler.hlo import parse_module

    text = """HloModule m
ENTRY e {
  a = pred[7] parameter(0)
  b = pred[7] parameter(1)
  ROOT r = pred[] dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}
}"""
    a = np.array([1, 0, 1, 0, 0, 0, 0], bool)
    got = evaluate(parse_module(text), [a, ~a])[0]
    assert isinstance(got, np.ndarray) and got.shape == () and not got
    assert evaluate(parse_module(text), [a, a])[0]
