"""What HLO's elementwise ops compute: unary and binary arithmetic, bitwise ops, comparisons, select,
clamp, convert, bitcast-convert and reduce-precision, on every element type, on numpy arrays.

:data:`KERNELS` maps each opcode to ``kernel(op, args, out, attrs) -> ndarray``: the operands (any
broadcastable shapes, storage dtypes), the result element type and the instruction's attributes (only
``direction``, ``type``, ``exponent_bits`` and ``mantissa_bits`` are read). The reference interpreter and
the vector unit both compute with these kernels, so the oracle and the device cannot drift apart. An
operand the op does not accept raises :class:`SemanticsError`.

XLA facts implemented here (each pinned by a test that runs the same HLO on XLA CPU through JAX):

* integer + - * and negate wrap (two's complement); abs(INT_MIN) = INT_MIN.
* integer divide truncates toward zero; x / 0 = -1 (all ones, also for unsigned); INT_MIN / -1 = INT_MIN;
  remainder takes the sign of the dividend; x % 0 = x; INT_MIN % -1 = 0.
* integer power: square-and-multiply with wrap over the exponent's low 6 bits (s8 26 ** 66 = 26 ** 2 = -92
  on XLA CPU); a negative exponent gives 1 for base 1, +-1 for base -1 and 0 otherwise (0 ** -1 = 0).
* shifts: the amount is read as unsigned; an amount >= the bit width gives 0 for shift-left and
  shift-right-logical and the sign fill for shift-right-arithmetic (which works on the bit pattern, also
  for unsigned types).
* float maximum/minimum propagate NaN and order -0 below +0 (max(-0, +0) = +0, min(+0, -0) = -0).
* sign(+-0) = +-0, sign(NaN) = NaN; round-nearest-afz rounds halves away from zero, round-nearest-even to
  even; float remainder is C ``fmod``.
* pred arithmetic: add/or/maximum are OR, multiply/and/minimum are AND, subtract/xor/NE are XOR.
* compare ``type=TOTALORDER`` orders -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN; the default FLOAT
  comparison is IEEE (every comparison with NaN is false except NE).
* transcendentals of narrow floats run in f32 and round, like every narrow float op (see convert.py);
  the reference evaluates them in f64 and rounds to f32 first, so it is the correctly rounded f32 result
  (XLA CPU's own approximations differ by the few ulp measured in docs/reference.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import ml_dtypes
import numpy as np

from tpusim.memory import ElementType, element_type_of_dtype
from tpusim.semantics.convert import (
    bitcast_convert,
    compute_dtype,
    convert,
    flush,
    reduce_precision,
    round_result,
    wrap_int,
)
from tpusim.semantics.errors import SemanticsError
from tpusim.semantics.special import erf

__all__ = [
    "INT_ARITHMETIC",
    "KERNELS",
    "NOT_ELEMENTWISE",
    "PRED_ARITHMETIC",
    "Attrs",
    "Kernel",
    "apply",
    "total_order_key",
]


class Attrs(Protocol):
    """An instruction's attributes, as far as a kernel reads them (a dict does)."""

    def get(self, name: str, default: Any = None, /) -> Any: ...


Kernel = Callable[[str, Sequence[Any], ElementType, Attrs], np.ndarray]

KERNELS: dict[str, Kernel] = {}
"""opcode -> its kernel."""

NOT_ELEMENTWISE = frozenset({"bitcast-convert"})
"""Kernels that are not shape-agnostic (a bitcast-convert between widths adds or removes a dimension)."""


def apply(fn: str, args: list[np.ndarray], out: ElementType, direction: str | None = None) -> np.ndarray:
    """Evaluate HLO elementwise opcode ``fn`` on broadcastable ``args`` (storage dtypes; 0-d for splats), as a
    VPU step does (the device's vector unit, and the compiler trying a collective's reduction chain).

    Returns:
        An array of ``out``'s dtype.

    Raises:
        SemanticsError: operands the op does not accept.
    """
    attrs = {} if direction is None else {"direction": direction}
    with np.errstate(all="ignore"):  # IEEE results (inf, NaN) are the point, not a warning
        result = np.asarray(KERNELS[fn](fn, args, out, attrs))
    return result if result.dtype == out.dtype else result.astype(out.dtype)


def kernel(*opcodes: str) -> Callable[[Kernel], Kernel]:
    """Register a kernel for ``opcodes`` in :data:`KERNELS`."""

    def add(fn: Kernel) -> Kernel:
        for op in opcodes:
            KERNELS[op] = fn
        return fn

    return add


_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_C128 = np.dtype(np.complex128)
_BF16 = np.dtype(ml_dtypes.bfloat16)


def _np_dtype(et: ElementType) -> np.dtype:
    if et.dtype is None:
        raise SemanticsError("the result is a token, not an array")
    return et.dtype


def _arr(x: object, dtype: np.dtype) -> np.ndarray:
    """``x`` as an ndarray of ``dtype`` (numpy ufuncs return scalars for 0-d inputs)."""
    return np.asarray(x).astype(dtype, copy=False)


def _kind(x: np.ndarray) -> str:
    return element_type_of_dtype(x.dtype).kind


# ---------------------------------------------------------------------------------------------
# Floating-point helpers
# ---------------------------------------------------------------------------------------------
def _float_op(f: Callable[..., np.ndarray], out: np.dtype, *xs: np.ndarray, daz: bool = True) -> np.ndarray:
    """An IEEE-exact op (+ - * / sqrt fmod rounding ...) computed in the type, or in f32 for narrow floats,
    with denormal operands and results flushed to zero (convert.py) unless ``daz`` is False."""
    wide = compute_dtype(xs[0].dtype)
    fl = flush if daz else _keep
    return _arr(round_result(fl(np.asarray(f(*(fl(x.astype(wide, copy=False)) for x in xs)))), out), out)


def _keep(x: np.ndarray) -> np.ndarray:
    return x


def _transcendental(f: Callable[..., np.ndarray], out: np.dtype, *xs: np.ndarray) -> np.ndarray:
    """A transcendental evaluated in f64 (c128), rounded to f32 (c64) first for f32-or-narrower types, then
    to the result type: the correctly rounded f32 value that XLA CPU approximates. Denormal operands and
    results are flushed (XLA CPU's approximations handle denormal operands case by case: tanh returns
    them, cbrt and power take their logarithm; docs/reference.md lists this deviation)."""
    kind = _kind(xs[0])
    if kind == "complex":
        r = np.asarray(f(*(x.astype(_C128) for x in xs)))
        if np.dtype(out).kind == "f":  # abs: a real result
            return _arr(r.real.astype(_F32) if np.dtype(out) == _F32 else r.real, out)
        return _arr(r if np.dtype(out) == _C128 else r.astype(np.complex64), out)
    narrow = np.dtype(out).itemsize < 8  # an f32-or-narrower result: XLA computes it in f32
    wide = [flush(x.astype(_F32 if narrow else _F64)).astype(_F64) for x in xs]
    r = np.asarray(f(*wide))
    return _arr(round_result(flush(r.astype(_F32)), out) if narrow else flush(r), out)


# ---------------------------------------------------------------------------------------------
# Unary ops
# ---------------------------------------------------------------------------------------------
def _sign(x: np.ndarray) -> np.ndarray:
    kind = _kind(x)
    if kind == "complex":
        mag = np.abs(x)
        return np.where(mag == 0, x, x / np.where(mag == 0, 1, mag))
    if kind == "float":
        w = flush(x.astype(compute_dtype(x.dtype)))
        return np.where(np.isnan(w), w, np.copysign((w != 0).astype(w.dtype), w))
    if kind == "unsigned":
        return (x != 0).astype(x.dtype)
    return np.sign(x)


def _round_afz(x: np.ndarray) -> np.ndarray:
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.copysign(np.ones_like(x), x), t)


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return 1.0 / np.sqrt(x)


def _erf(x: np.ndarray) -> np.ndarray:
    if _kind(x) == "complex":
        raise SemanticsError("erf of a complex operand is not defined by XLA")
    return erf(x)


# Transcendentals: evaluated in f64/c128 (see _transcendental).
_TRANSCENDENTAL: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exponential": np.exp,
    "exponential-minus-one": np.expm1,
    "log": np.log,
    "log-plus-one": np.log1p,
    "sine": np.sin,
    "cosine": np.cos,
    "tan": np.tan,
    "tanh": np.tanh,
    "rsqrt": _rsqrt,
    "cbrt": np.cbrt,
    "erf": _erf,
    # Newer XLA opcodes (not emitted by JAX 0.10; XLA CPU reports them unimplemented): libm definitions.
    "acos": np.arccos,
    "asin": np.arcsin,
    "atan": np.arctan,
    "acosh": np.arccosh,
    "asinh": np.arcsinh,
    "atanh": np.arctanh,
    "cosh": np.cosh,
    "sinh": np.sinh,
}

# Exactly rounded float ops: computed in the type (f32 for narrow floats).
_EXACT_FLOAT_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "sqrt": np.sqrt,
    "floor": np.floor,
    "ceil": np.ceil,
    "round-nearest-even": np.rint,
    "round-nearest-afz": _round_afz,
}


@kernel(*_TRANSCENDENTAL)
def _unary_transcendental(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    x = args[0]
    if _kind(x) not in ("float", "complex"):
        raise SemanticsError(f"{op} needs a float or complex operand, not {x.dtype}")
    if op == "cbrt" and _kind(x) == "complex":
        raise SemanticsError("cbrt of a complex operand is not defined by XLA")
    return _transcendental(_TRANSCENDENTAL[op], _np_dtype(out), x)


@kernel("logistic")
def _logistic(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    """``1 / (1 + exp(-x))``. XLA CPU computes it in f32 for f32 and bf16 (one rounding at the end) but step by
    step in f16 arithmetic for f16 and the f8 types (upcast to f16), so there ``exp(-x)`` overflows for
    x < -11.1 and the result is 0 (measured: f16 logistic(-15) = 0, not 3e-7)."""
    x = args[0]
    kind = _kind(x)
    if kind not in ("float", "complex"):
        raise SemanticsError(f"logistic needs a float or complex operand, not {x.dtype}")
    dt = _np_dtype(out)
    if kind == "float" and x.dtype.itemsize <= 2 and x.dtype != _BF16:
        f16 = np.dtype(np.float16)
        e = _transcendental(np.exp, f16, np.negative(x.astype(f16)))
        one = np.ones((), dtype=f16)
        return _arr(round_result(_float_op(np.divide, f16, one, _float_op(np.add, f16, e, one)), dt), dt)
    return _transcendental(lambda v: 1.0 / (1.0 + np.exp(-v)), dt, x)


@kernel(*_EXACT_FLOAT_UNARY)
def _unary_exact_float(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    x = args[0]
    if op == "sqrt" and _kind(x) == "complex":
        return _transcendental(np.sqrt, _np_dtype(out), x)
    if _kind(x) != "float":
        raise SemanticsError(f"{op} needs a float operand, not {x.dtype}")
    return _float_op(_EXACT_FLOAT_UNARY[op], _np_dtype(out), x)


@kernel("abs")
def _abs(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    x = args[0]
    kind = _kind(x)
    dt = _np_dtype(out)
    if kind == "complex":
        return _transcendental(np.abs, dt, x)
    if kind == "float":
        return _arr(np.abs(x), dt)  # clears the sign bit: denormals are kept
    if kind == "unsigned":
        return x
    return _int_result(np.abs(_int_work(x)), out)  # numpy wraps: abs(INT_MIN) = INT_MIN, as XLA


@kernel("negate")
def _negate(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    x = args[0]
    kind = _kind(x)
    if kind in ("float", "complex"):
        return _arr(np.negative(x), _np_dtype(out))  # flips the sign bit: denormals are kept
    if out.bits < 8:
        return wrap_int(-x.astype(np.int64), out)
    return _arr(np.negative(x), _np_dtype(out))


@kernel("sign")
def _sign_op(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    x = args[0]
    if out.bits < 8 and _kind(x) in ("signed", "unsigned"):
        return wrap_int(_sign(x.astype(np.int64)), out)
    return _arr(_sign(x), _np_dtype(out))


@kernel("not")
def _not(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    x = args[0]
    kind = _kind(x)
    if kind == "pred":
        return np.logical_not(x)
    if kind not in ("signed", "unsigned"):
        raise SemanticsError(f"not needs a pred or integer operand, not {x.dtype}")
    return wrap_int(~x.astype(np.int64), out)


@kernel("is-finite")
def _is_finite(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    x = args[0]
    if _kind(x) != "float":
        raise SemanticsError(f"is-finite needs a float operand, not {x.dtype}")
    return np.asarray(np.isfinite(x.astype(compute_dtype(x.dtype))))


@kernel("real", "imag")
def _real_imag(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    x = args[0]
    dt = _np_dtype(out)
    if _kind(x) == "complex":
        return _arr(np.real(x) if op == "real" else np.imag(x), dt)
    if _kind(x) != "float":
        raise SemanticsError(f"{op} needs a complex or float operand, not {x.dtype}")
    return _arr(x if op == "real" else np.zeros_like(x), dt)


def _unsigned_bits(x: np.ndarray) -> tuple[np.ndarray, int]:
    """The bit pattern of integer ``x`` as uint64 and the type's width."""
    et = element_type_of_dtype(x.dtype)
    raw = np.asarray(x, order="C").view(et.raw_dtype).astype(np.uint64)
    if et.bits < 8:
        raw &= np.uint64((1 << et.bits) - 1)
    return raw, et.bits


@kernel("popcnt")
def _popcnt(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    x = args[0]
    if _kind(x) not in ("signed", "unsigned"):
        raise SemanticsError(f"popcnt needs an integer operand, not {x.dtype}")
    raw, _ = _unsigned_bits(x)
    return wrap_int(np.bitwise_count(raw).astype(np.int64), out)


@kernel("count-leading-zeros")
def _clz(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    x = args[0]
    if _kind(x) not in ("signed", "unsigned"):
        raise SemanticsError(f"count-leading-zeros needs an integer operand, not {x.dtype}")
    smeared, bits = _unsigned_bits(x)
    shift = 1
    while shift < bits:  # after this, every bit below the highest set bit is set
        smeared = smeared | (smeared >> np.uint64(shift))
        shift *= 2
    return wrap_int(bits - np.bitwise_count(smeared).astype(np.int64), out)


# ---------------------------------------------------------------------------------------------
# Binary ops
# ---------------------------------------------------------------------------------------------
def _int_work(x: np.ndarray) -> np.ndarray:
    """Sub-byte integers are computed in int64 and wrapped; other integers in their own type."""
    return x.astype(np.int64) if element_type_of_dtype(x.dtype).bits < 8 else x


def _int_result(r: np.ndarray, et: ElementType) -> np.ndarray:
    return wrap_int(np.asarray(r), et) if et.bits < 8 else _arr(r, _np_dtype(et))


def _int_divide(a: np.ndarray, b: np.ndarray, signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """(quotient, remainder) with XLA's rules for zero divisors and INT_MIN / -1 (see the module docstring)."""
    zero = b == 0
    if signed and a.dtype.itemsize * 8 == np.iinfo(a.dtype).bits:
        overflow = (a == np.iinfo(a.dtype).min) & (b == -1)
    else:
        overflow = np.zeros(np.broadcast_shapes(a.shape, b.shape), dtype=bool)
    one = np.ones((), dtype=b.dtype)
    safe = np.where(zero | overflow, one, b)
    q = np.floor_divide(a, safe)
    r = a - q * safe
    if signed:
        fix = (r != 0) & ((a < 0) != (safe < 0))  # floor -> truncation toward zero
        q = np.where(fix, q + one, q)
        r = np.where(fix, r - safe, r)
    all_ones = np.array(-1).astype(a.dtype) if signed else np.array(np.iinfo(a.dtype).max, dtype=a.dtype)
    q = np.where(zero, all_ones, np.where(overflow, a, q))
    r = np.where(zero, a, np.where(overflow, np.zeros((), a.dtype), r))
    return q, r


def _int_power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """XLA's integer power on the two's complement bits: the exponent counts as negative when its top bit is
    set, also for unsigned types (u8 3 ** 254 = 0 on XLA CPU), and only its low 6 bits are used."""
    signed_dt = np.dtype(f"i{a.dtype.itemsize}")
    sa, sb = a.view(signed_dt), b.view(signed_dt)
    shape = np.broadcast_shapes(a.shape, b.shape)
    base = np.broadcast_to(sa, shape).copy()
    exp = np.broadcast_to(sb, shape).astype(np.int64)
    result = np.ones(shape, dtype=signed_dt)
    e = np.where(exp < 0, 0, exp) & 63
    for _ in range(6):
        result = np.where(e & 1, result * base, result)
        base = base * base
        e = e >> 1
    odd = (exp & 1) == 1
    neg = np.where(sa == 1, 1, np.where(sa == -1, np.where(odd, -1, 1), 0)).astype(signed_dt)
    return np.asarray(np.where(exp < 0, neg, result), dtype=signed_dt).view(a.dtype)


def _fmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C ``fmod`` as XLA CPU computes it: a denormal divisor counts as zero (NaN result), while the dividend
    and the result keep their denormals (|a| < |b| returns ``a`` itself)."""
    return np.fmod(a, flush(b))


def _float_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    r = np.maximum(a, b)  # propagates NaN
    both_zero = (a == 0) & (b == 0)
    return np.where(both_zero, np.where(np.signbit(a) & np.signbit(b), a, np.abs(a)), r)


def _float_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    r = np.minimum(a, b)
    both_zero = (a == 0) & (b == 0)
    return np.where(both_zero, np.where(np.signbit(a) | np.signbit(b), -np.abs(a), a), r)


PRED_ARITHMETIC: dict[str, np.ufunc] = {
    # XLA's arithmetic on pred: add/or/maximum are OR, multiply/and/minimum are AND, subtract/xor are XOR
    "add": np.logical_or,
    "or": np.logical_or,
    "maximum": np.logical_or,
    "multiply": np.logical_and,
    "and": np.logical_and,
    "minimum": np.logical_and,
    "subtract": np.logical_xor,
    "xor": np.logical_xor,
}

_FLOAT_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "remainder": _fmod,
    "maximum": _float_max,
    "minimum": _float_min,
}

INT_ARITHMETIC: dict[str, np.ufunc] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
}


@kernel("add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power")
def _arith(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    a, b = args[0], args[1]
    kind = _kind(a)
    if kind == "pred":
        if op not in PRED_ARITHMETIC:
            raise SemanticsError(f"{op} is not defined on pred operands")
        return np.asarray(PRED_ARITHMETIC[op](a, b))
    if kind == "float":
        if op == "power":
            return _transcendental(np.power, _np_dtype(out), a, b)
        if op == "remainder":
            return _float_op(_fmod, _np_dtype(out), a, b, daz=False)
        return _float_op(_FLOAT_BINARY[op], _np_dtype(out), a, b)
    if kind == "complex":
        if op in ("maximum", "minimum", "remainder"):
            raise SemanticsError(f"{op} is not defined on complex operands")
        if op in ("divide", "power"):
            return _transcendental(np.divide if op == "divide" else np.power, _np_dtype(out), a, b)
        return _arr(_FLOAT_BINARY[op](a, b), _np_dtype(out))
    wa, wb = _int_work(a), _int_work(b)
    signed = kind == "signed"
    if op in ("divide", "remainder"):
        q, r = _int_divide(wa, wb, signed)
        return _int_result(q if op == "divide" else r, out)
    if op == "power":
        return _int_result(_int_power(wa, wb), out)
    return _int_result(INT_ARITHMETIC[op](wa, wb), out)


@kernel("and", "or", "xor")
def _bitwise(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    a, b = args[0], args[1]
    kind = _kind(a)
    if kind == "pred":
        return np.asarray(PRED_ARITHMETIC[op](a, b))
    if kind not in ("signed", "unsigned"):
        raise SemanticsError(f"{op} needs pred or integer operands, not {a.dtype}")
    return _int_result(INT_ARITHMETIC[op](_int_work(a), _int_work(b)), out)


@kernel("shift-left", "shift-right-logical", "shift-right-arithmetic")
def _shift(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    a, b = args[0], args[1]
    if _kind(a) not in ("signed", "unsigned"):
        raise SemanticsError(f"{op} needs integer operands, not {a.dtype}")
    value, bits = _unsigned_bits(a)
    amount, _ = _unsigned_bits(b)
    in_range = amount < np.uint64(bits)
    amount = np.where(in_range, amount, np.uint64(0))
    if op == "shift-left":
        r = np.where(in_range, value << amount, np.uint64(0))
    elif op == "shift-right-logical":
        r = np.where(in_range, value >> amount, np.uint64(0))
    else:
        sign = (value >> np.uint64(bits - 1)) & np.uint64(1)
        fill = np.where(sign == 1, ~np.uint64(0), np.uint64(0))  # all ones when the sign bit is set
        shifted = (value >> amount) | (fill << (np.uint64(bits) - amount - np.uint64(1)) << np.uint64(1))
        r = np.where(in_range, shifted, fill)
    mask = np.uint64((1 << bits) - 1) if bits < 64 else ~np.uint64(0)
    r = np.asarray(r & mask, dtype=np.uint64)
    return r.astype(out.raw_dtype).view(_np_dtype(out)) if bits >= 8 else wrap_int(r.astype(np.int64), out)


@kernel("mulhi")
def _mulhi(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    """The high half of the full-width product (signed for signed types, unsigned for unsigned ones)."""
    a, b = args[0], args[1]
    if _kind(a) not in ("signed", "unsigned"):
        raise SemanticsError(f"mulhi needs integer operands, not {a.dtype}")
    signed = _kind(a) == "signed"
    if out.bits < 64:
        wide = np.int64 if signed else np.uint64
        product = a.astype(wide) * b.astype(wide)
        return _int_result(product >> wide(out.bits), out)
    ua, ub = a.view(np.uint64), b.view(np.uint64)
    lo32 = np.uint64(0xFFFF_FFFF)
    s32 = np.uint64(32)
    a_lo, a_hi, b_lo, b_hi = ua & lo32, ua >> s32, ub & lo32, ub >> s32
    cross = (a_lo * b_lo >> s32) + (a_hi * b_lo & lo32) + (a_lo * b_hi & lo32)
    high = a_hi * b_hi + (a_hi * b_lo >> s32) + (a_lo * b_hi >> s32) + (cross >> s32)
    if signed:  # two's complement correction of the unsigned high word
        high = high - np.where(a < 0, ub, np.uint64(0)) - np.where(b < 0, ua, np.uint64(0))
    return np.asarray(high, dtype=np.uint64).view(_np_dtype(out))


@kernel("atan2")
def _atan2(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    a, b = args[0], args[1]
    if _kind(a) == "complex":
        raise SemanticsError("atan2 of complex operands is not supported by the reference")
    return _transcendental(np.arctan2, _np_dtype(out), a, b)


@kernel("complex")
def _complex(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    re, im = args[0], args[1]
    dt = _np_dtype(out)
    return _arr(re.astype(dt) + im.astype(dt) * np.array(1j, dtype=dt), dt)


# ---------------------------------------------------------------------------------------------
# compare, select, clamp
# ---------------------------------------------------------------------------------------------
def total_order_key(x: np.ndarray) -> np.ndarray:
    """Signed integers ordered like XLA's TOTALORDER float comparison (-NaN < -inf < -0 < +0 < inf < NaN)."""
    et = element_type_of_dtype(x.dtype)
    bits = max(8, et.bits)
    raw = np.asarray(x, order="C").view(et.raw_dtype).astype(np.uint64)
    mag = (raw & np.uint64((1 << (bits - 1)) - 1)).astype(np.int64)
    negative = (raw >> np.uint64(bits - 1)) & np.uint64(1)
    return np.where(negative == 1, -mag - 1, mag)


_DIRECTIONS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "EQ": np.equal,
    "NE": np.not_equal,
    "LT": np.less,
    "LE": np.less_equal,
    "GT": np.greater,
    "GE": np.greater_equal,
}


@kernel("compare")
def _compare(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    a, b = args[0], args[1]
    direction = str(attrs.get("direction"))
    fn = _DIRECTIONS.get(direction)
    if fn is None:
        expected = ", ".join(_DIRECTIONS)
        raise SemanticsError(f"unknown comparison direction {direction!r}; expected one of {expected}")
    kind = _kind(a)
    ctype = attrs.get("type")
    if kind == "complex" and direction not in ("EQ", "NE"):
        raise SemanticsError(f"complex operands only compare EQ or NE, not {direction}")
    if kind == "float" and ctype is not None and str(ctype) == "TOTALORDER":
        return np.asarray(fn(total_order_key(a), total_order_key(b)))
    if kind == "float":
        a, b = flush(a.astype(compute_dtype(a.dtype))), flush(b.astype(compute_dtype(b.dtype)))
    elif kind in ("signed", "unsigned"):
        a, b = _int_work(a), _int_work(b)
    return np.asarray(fn(a, b))


@kernel("select")
def _select(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    pred, on_true, on_false = args
    return np.asarray(np.where(pred, on_true, on_false))


@kernel("clamp")
def _clamp(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    lo, x, hi = args
    kind = _kind(x)
    dt = _np_dtype(out)
    if kind == "float":
        return _float_op(lambda lo_, x_, hi_: _float_min(_float_max(x_, lo_), hi_), dt, lo, x, hi)
    if kind == "complex":
        raise SemanticsError("clamp is not defined on complex operands")
    if kind == "pred":
        return np.asarray(np.logical_and(np.logical_or(x, lo), hi))
    return _int_result(np.minimum(np.maximum(_int_work(x), _int_work(lo)), _int_work(hi)), out)


# ---------------------------------------------------------------------------------------------
# convert, bitcast-convert, reduce-precision
# ---------------------------------------------------------------------------------------------
@kernel("copy")
def _copy(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    return np.array(args[0], dtype=_np_dtype(out))  # a layout change leaves the values as they are


@kernel("convert")
def _convert(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    return np.asarray(convert(args[0], out))


@kernel("bitcast-convert")
def _bitcast_convert(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    return np.asarray(bitcast_convert(args[0], out))


@kernel("reduce-precision")
def _reduce_precision(op: str, args: Sequence[Any], out: ElementType, attrs: Attrs) -> np.ndarray:
    exponent_bits, mantissa_bits = attrs.get("exponent_bits"), attrs.get("mantissa_bits")
    if exponent_bits is None or mantissa_bits is None or exponent_bits < 1 or mantissa_bits < 0:
        got = f"{exponent_bits}, {mantissa_bits}"
        raise SemanticsError(f"needs exponent_bits >= 1 and mantissa_bits >= 0, got {got}")
    return reduce_precision(args[0], int(exponent_bits), int(mantissa_bits))
