"""Numeric kernels of the VPU: the HLO elementwise ops with XLA semantics, in numpy.

Floating-point inputs are widened to f32 (f64 stays f64) before the op and the result is rounded once to
the destination type, as the VPU computes in 32 bits (DESIGN.md principle 4). Integer ops work in the
operands' own type and wrap; division by zero and shifts past the width follow XLA's rules
(xla/service/elemental_ir_emitter.cc semantics, as documented in the Operation Semantics page, seed 003).

One function per op in :data:`KERNELS`, filled by :func:`kernel`. These are tpusim's own kernels;
``docs/model.md`` records how they relate to the reference interpreter.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import ml_dtypes
import numpy as np

from tpusim.memory import ElementType

__all__ = ["KERNELS", "apply", "compute_dtype", "convert", "kernel"]

Kernel = Callable[..., np.ndarray]
KERNELS: dict[str, Kernel] = {}


def kernel(*names: str) -> Callable[[Kernel], Kernel]:
    def register(fn: Kernel) -> Kernel:
        for n in names:
            KERNELS[n] = fn
        return fn

    return register


def compute_dtype(dtypes: list[np.dtype]) -> np.dtype:
    """The dtype an op computes in: f64 if any input is f64, f32 if any is another float, else the first
    input's integer or bool dtype."""
    floats = [d for d in dtypes if _is_float(d)]
    if floats:
        return np.dtype(np.float64) if any(d == np.float64 for d in floats) else np.dtype(np.float32)
    return dtypes[0]


def _is_float(d: np.dtype) -> bool:
    return d.kind == "f" or d in (np.dtype(ml_dtypes.bfloat16),) or "float8" in d.name or "float4" in d.name


def convert(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """XLA ``convert``: float to integer truncates toward zero, saturates, and maps NaN to 0; to pred is
    ``x != 0``; float to narrower float rounds to nearest even (ml_dtypes)."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    if dtype == np.bool_:
        return x != 0
    if dtype.kind in "iu" and _is_float(x.dtype):
        info = np.iinfo(dtype)
        f = np.trunc(x.astype(np.float64))
        f = np.where(np.isnan(f), 0.0, f)
        f = np.clip(f, info.min, info.max)
        return f.astype(dtype)
    if x.dtype == np.bool_:
        return x.astype(np.uint8).astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        if _is_float(dtype) and dtype.itemsize < 4 and x.dtype.kind in "iu":
            x = x.astype(np.float64)  # integer -> narrow float rounds once
        return x.astype(dtype)


def apply(fn: str, args: list[np.ndarray], out: ElementType, direction: str | None = None) -> np.ndarray:
    """Evaluate elementwise ``fn`` on broadcastable ``args`` and return an array of ``out``'s dtype.

    Args:
        fn: an HLO opcode in :data:`KERNELS`.
        args: operand values (arrays or 0-d arrays for splats), in their storage dtypes.
        out: the destination element type.
        direction: the comparison direction for ``compare``.
    """
    assert out.dtype is not None
    if fn == "convert":
        return convert(args[0], out.dtype)
    if fn == "select":
        pred, a, b = args
        ct = compute_dtype([a.dtype, b.dtype])
        return convert(np.where(pred.astype(bool), a.astype(ct), b.astype(ct)), out.dtype)
    ct = compute_dtype([a.dtype for a in args])
    xs = [a.astype(ct, copy=False) for a in args]
    with np.errstate(all="ignore"):
        result = KERNELS[fn](*xs, direction) if fn == "compare" else KERNELS[fn](*xs)
    result = np.asarray(result)
    if result.dtype == np.bool_ or out.dtype == np.bool_:
        return result.astype(out.dtype) if out.dtype != np.bool_ else result.astype(bool)
    return result.astype(out.dtype) if _is_float(out.dtype) else convert(result, out.dtype)


# ---------------------------------------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------------------------------------
kernel("add")(np.add)
kernel("subtract")(np.subtract)
kernel("multiply")(np.multiply)
kernel("maximum")(np.maximum)  # propagates NaN, as XLA does
kernel("minimum")(np.minimum)
kernel("negate")(np.negative)
kernel("abs")(np.abs)
kernel("copy")(lambda x: x.copy())
kernel("atan2")(np.arctan2)


@kernel("divide")
def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return a / b
    a, b = np.broadcast_arrays(a, b)
    zero = b == 0
    safe = np.where(zero, 1, b).astype(a.dtype)
    if a.dtype.kind == "i":
        info = np.iinfo(a.dtype)
        overflow = (a == info.min) & (safe == -1)
        safe = np.where(overflow, 1, safe).astype(a.dtype)
        q = np.abs(a.astype(np.int64)) // np.abs(safe.astype(np.int64))
        q = np.where((a < 0) != (safe < 0), -q, q).astype(a.dtype)
        q = np.where(overflow, a, q)
        return np.where(zero, np.array(-1, a.dtype), q)
    return np.where(zero, np.array(np.iinfo(a.dtype).max, a.dtype), a // safe)


@kernel("remainder")
def _remainder(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return np.fmod(a, b)
    a, b = np.broadcast_arrays(a, b)
    zero = b == 0
    safe = np.where(zero | ((b == -1) if a.dtype.kind == "i" else False), 1, b).astype(a.dtype)
    r = np.fmod(a, safe)
    r = np.where(b == -1, np.zeros_like(a), r) if a.dtype.kind == "i" else r
    return np.where(zero, a, r)


@kernel("power")
def _power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return np.power(a, b)
    a, b = np.broadcast_arrays(a, b)
    # XLA: integer power by squaring; a negative exponent gives 0 except for bases 1 and -1.
    result = np.ones(a.shape, a.dtype)
    base = a.copy()
    e = np.where(b < 0, 0, b).astype(np.int64)
    while np.any(e > 0):
        odd = (e & 1) == 1
        result = np.where(odd, result * base, result)
        base = base * base
        e >>= 1
    if a.dtype.kind == "i":
        neg = b < 0
        result = np.where(neg, np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0)), result)
    return result.astype(a.dtype)


@kernel("sign")
def _sign(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "f":
        return np.where(x == 0, x, np.sign(x))  # keeps -0.0 and NaN, as XLA does
    return np.sign(x)


# ---------------------------------------------------------------------------------------------------------
# Rounding, predicates, bits
# ---------------------------------------------------------------------------------------------------------
kernel("floor")(np.floor)
kernel("ceil")(np.ceil)
kernel("round-nearest-even")(np.rint)
kernel("is-finite")(np.isfinite)


@kernel("round-nearest-afz")
def _round_afz(x: np.ndarray) -> np.ndarray:
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


@kernel("not")
def _not(x: np.ndarray) -> np.ndarray:
    return np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)


@kernel("and")
def _and(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.bitwise_and(a, b)


@kernel("or")
def _or(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.bitwise_or(a, b)


@kernel("xor")
def _xor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.bitwise_xor(a, b)


def _unsigned(x: np.ndarray) -> np.ndarray:
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


@kernel("shift-left")
def _shl(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    bits = a.dtype.itemsize * 8
    n = _unsigned(np.ascontiguousarray(b)).astype(np.uint64)
    out = np.left_shift(_unsigned(np.ascontiguousarray(a)), np.minimum(n, bits - 1).astype(_unsigned(a).dtype))
    return np.where(n >= bits, 0, out).astype(_unsigned(a).dtype).view(a.dtype)


@kernel("shift-right-logical")
def _shrl(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    bits = a.dtype.itemsize * 8
    n = _unsigned(np.ascontiguousarray(b)).astype(np.uint64)
    ua = _unsigned(np.ascontiguousarray(a))
    out = np.right_shift(ua, np.minimum(n, bits - 1).astype(ua.dtype))
    return np.where(n >= bits, 0, out).astype(ua.dtype).view(a.dtype)


@kernel("shift-right-arithmetic")
def _shra(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    bits = a.dtype.itemsize * 8
    n = _unsigned(np.ascontiguousarray(b)).astype(np.uint64)
    signed = np.ascontiguousarray(a).view(np.dtype(f"i{a.dtype.itemsize}"))
    out = np.right_shift(signed, np.minimum(n, bits - 1).astype(signed.dtype))
    return out.view(a.dtype)


@kernel("popcnt")
def _popcnt(x: np.ndarray) -> np.ndarray:
    u = _unsigned(np.ascontiguousarray(x)).astype(np.uint64)
    count = np.zeros(u.shape, np.uint64)
    for _ in range(x.dtype.itemsize * 8):
        count += u & np.uint64(1)
        u = u >> np.uint64(1)
    return count.astype(x.dtype)


@kernel("count-leading-zeros")
def _clz(x: np.ndarray) -> np.ndarray:
    bits = x.dtype.itemsize * 8
    v = _unsigned(np.ascontiguousarray(x)).astype(np.uint64)
    length = np.zeros(v.shape, np.int64)  # bit length: clz = width - bit length
    while np.any(v):
        length += (v > 0).astype(np.int64)
        v = v >> np.uint64(1)
    return (bits - length).astype(x.dtype)


@kernel("compare")
def _compare(a: np.ndarray, b: np.ndarray, direction: str) -> np.ndarray:
    return {
        "EQ": np.equal,
        "NE": np.not_equal,
        "LT": np.less,
        "LE": np.less_equal,
        "GT": np.greater,
        "GE": np.greater_equal,
    }[direction](a, b)


@kernel("clamp")
def _clamp(lo: np.ndarray, x: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.minimum(np.maximum(x, lo), hi)


# ---------------------------------------------------------------------------------------------------------
# Transcendental path
# ---------------------------------------------------------------------------------------------------------
kernel("exponential")(np.exp)
kernel("exponential-minus-one")(np.expm1)
kernel("log")(np.log)
kernel("log-plus-one")(np.log1p)
kernel("tanh")(np.tanh)
kernel("sqrt")(np.sqrt)
kernel("cbrt")(np.cbrt)
kernel("sine")(np.sin)
kernel("cosine")(np.cos)
kernel("tan")(np.tan)


@kernel("rsqrt")
def _rsqrt(x: np.ndarray) -> np.ndarray:
    return (1 / np.sqrt(x.astype(np.float64))).astype(x.dtype)


@kernel("logistic")
def _logistic(x: np.ndarray) -> np.ndarray:
    return (1 / (1 + np.exp(-x.astype(np.float64)))).astype(x.dtype)


_ERF = np.frompyfunc(math.erf, 1, 1)


@kernel("erf")
def _erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_ERF(x.astype(np.float64))).astype(x.dtype)
