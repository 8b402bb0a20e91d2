"""Numerics helpers: XLA's convert, bitcast-convert and reduce-precision, integer wrapping, and the
rule for where narrow floats are computed.

Facts (each checked against XLA on CPU through JAX, see tests/test_reference_elementwise.py):

* Floats narrower than f32 are computed in a wider type and rounded to the result type after every op:
  XLA CPU's float normalization upcasts bf16 to f32 and the f8/f4 types to f16 (the optimized HLO shows
  ``convert``s around each op), and LLVM computes f16 in f32. So bf16 and f16 ops are f32 ops rounded once,
  and f8 ops are f32 ops rounded to f16 and then to the f8 type (:func:`round_result`). For + - * / and
  sqrt the single rounding equals the correctly rounded narrow result (24 >= 2p+2 bits for p <= 11).
* float -> float converts round to nearest even; f64 -> bf16/f8 goes through f32 (XLA gives
  ``bf16(f32(x))``: f64 1+2**-8+2**-30 becomes 1.0); overflow gives inf, or NaN for types without inf
  (f8e4m3fn: 464.0 -> 448, 1000 -> NaN). ``ml_dtypes`` implements exactly these rules (XLA's float8
  types are the same code), so conversions between floats go through it.
* float -> integer truncates toward zero and saturates; NaN gives 0 (XLA CPU: f32 1e10 -> s32
  2147483647, -1.0 -> u32 0, NaN -> 0).
* integer -> integer keeps the low bits (two's complement wrap); integer -> narrow float goes through f32
  (s32 2**24+2**16+1 -> bf16 16777216, a double rounding XLA CPU does too).
* Denormals: XLA CPU runs with denormals-are-zero and flush-to-zero (as TPUs, whose f32 has no
  denormals): every f32/f64 arithmetic op reads a denormal operand as a zero of its sign and flushes a
  denormal result (f32 1e-40 + 0 = 0, f32 1e-40 == 0 is true, f32 -> f64 of 1e-40 is 0). Operations XLA
  does on bits do not flush: copy, negate, abs, select, bitcast, reduce-precision, and conversions between
  f32 and bf16/f16/f8 (f32 1e-40 -> bf16 keeps a bf16 denormal). f16 and f8 denormals are normal f32
  values, so they survive their f32 computation. :func:`flush` implements this.
* x -> pred is ``x != 0`` (NaN -> true, a denormal -> false); pred -> x is 0 or 1. Complex -> real is not allowed (XLA's
  shape inference rejects it); real -> complex has a zero imaginary part.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tpusim.memory import ElementType, element_type, element_type_of_dtype
from tpusim.semantics.errors import SemanticsError

__all__ = [
    "bitcast_convert",
    "compute_dtype",
    "convert",
    "flush",
    "is_narrow_float",
    "reduce_precision",
    "round_result",
    "wrap_int",
]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_F8E8M0 = np.dtype(getattr(ml_dtypes, "float8_e8m0fnu", np.float32))  # exponent-only: no f16 detour


def is_narrow_float(dtype: np.dtype) -> bool:
    """True for float types narrower than f32 (bf16, f16, f8*, f4*): XLA CPU computes them in f32."""
    et = element_type_of_dtype(dtype)
    return et.kind == "float" and et.bits < 32


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype XLA CPU computes elementwise float ops in: f32 for narrow floats, the type itself otherwise."""
    return _F32 if is_narrow_float(dtype) else np.dtype(dtype)


def _np_dtype(et: ElementType) -> np.dtype:
    assert et.dtype is not None, "token types hold no values"
    return et.dtype


def round_result(r: np.ndarray, out: np.dtype) -> np.ndarray:
    """Round an f32/f64 result to the result type as XLA CPU does: the f8 and f4 types through f16."""
    out = np.dtype(out)
    if out.itemsize == 1 and out != _F8E8M0 and r.dtype != out:
        r = r.astype(np.float16)
    return r.astype(out, copy=False)


def flush(x: np.ndarray) -> np.ndarray:
    """Denormal f32/f64 values replaced by zeros of the same sign (other dtypes unchanged)."""
    if x.dtype != _F32 and x.dtype != _F64:
        return x
    return np.where(np.abs(x) < np.finfo(x.dtype).tiny, x * 0, x)


def wrap_int(values: np.ndarray, et: ElementType) -> np.ndarray:
    """Integers (any numpy int dtype) reduced modulo 2**bits into ``et`` (two's complement for signed)."""
    if et.bits >= 8:
        return values.astype(et.dtype)
    v = values.astype(np.int64) & ((1 << et.bits) - 1)
    if et.kind == "signed":
        v = np.where(v >= 1 << (et.bits - 1), v - (1 << et.bits), v)
    return v.astype(et.dtype)


def _int_limits(et: ElementType) -> tuple[int, int]:
    if et.kind == "unsigned":
        return 0, (1 << et.bits) - 1
    return -(1 << (et.bits - 1)), (1 << (et.bits - 1)) - 1


def _float_to_int(x: np.ndarray, et: ElementType) -> np.ndarray:
    """Truncate toward zero, saturate to the type's range, NaN -> 0 (XLA CPU's fptosi/fptoui with saturation)."""
    wide = flush(x.astype(_F64))
    lo, hi = _int_limits(et)
    too_big = wide >= float(hi)  # float(hi) may round up to 2**bits: every larger value saturates too
    too_small = wide <= float(lo)
    nan = np.isnan(wide)
    safe = np.where(too_big | too_small | nan, 0.0, np.trunc(wide))
    big = np.int64 if et.kind == "signed" or et.bits < 64 else np.uint64
    out = safe.astype(big)
    out = np.where(too_big, np.array(hi).astype(big), out)
    out = np.where(too_small, np.array(lo).astype(big), out)
    return out.astype(et.dtype)


def convert(x: np.ndarray, to: ElementType | str) -> np.ndarray:
    """XLA ``convert`` of ``x`` to element type ``to`` (see the module docstring for the rules).

    Raises:
        ValueError: for complex -> real (XLA rejects it) or a token type.
    """
    to = element_type(to)
    src = element_type_of_dtype(x.dtype)
    if to.dtype is None:
        raise SemanticsError("cannot convert to token")
    if src == to:
        return x
    if to.kind == "pred":
        if src.bits >= 32:  # f32/f64 compare with zero reads denormals as zero; narrower types do not
            x = flush(x)
        return np.asarray(x != 0) if src.kind != "pred" else x
    if src.kind == "pred":
        return x.astype(np.uint8).astype(to.dtype) if to.bits >= 8 else wrap_int(x.astype(np.int64), to)
    if src.kind == "complex":
        if to.kind != "complex":
            raise SemanticsError(f"convert from {src.name} to {to.name} is not allowed (XLA rejects complex to real)")
        return x.astype(to.dtype)
    if to.kind in ("signed", "unsigned"):
        if src.kind == "float":
            return _float_to_int(x, to)
        return wrap_int(x, to)
    if to.kind == "complex":
        part = convert(x, "f32" if to.bits == 64 else "f64")  # the real part follows the float rules
        return part.astype(to.dtype)
    # to is a float type
    if src.kind in ("signed", "unsigned"):
        if to.bits < 32:
            return x.astype(_F32).astype(to.dtype)  # XLA converts integers to narrow floats through f32
        return x.astype(to.dtype)
    if src.bits > 32:
        # f64 -> f32 is an arithmetic conversion (flushes); narrower types go on from f32, as XLA does
        return flush(flush(x).astype(_F32)).astype(to.dtype)
    if to.bits > 32:
        return flush(flush(x.astype(_F32)).astype(_F64))
    return x.astype(to.dtype)  # between f32 and narrower floats: bit manipulation, no flushing


# ---------------------------------------------------------------------------------------------
# bitcast-convert
# ---------------------------------------------------------------------------------------------
def _bits_u64(x: np.ndarray, et: ElementType) -> np.ndarray:
    raw = np.asarray(x, order="C").view(et.raw_dtype).astype(np.uint64)
    return raw & np.uint64((1 << et.bits) - 1) if et.bits < 8 else raw


def _from_bits(bits: np.ndarray, et: ElementType) -> np.ndarray:
    raw = (bits & np.uint64((1 << et.bits) - 1)) if et.bits < 64 else bits
    return raw.astype(et.raw_dtype).view(_np_dtype(et))


def bitcast_convert(x: np.ndarray, to: ElementType | str) -> np.ndarray:
    """XLA ``bitcast-convert``: reinterpret the bits of each element.

    Same width: element for element. Narrower target: each element becomes a new minor dimension of
    ``wide_bits / narrow_bits`` elements, least significant bits first (little-endian, as XLA CPU and TPUs
    give). Wider target: the minor dimension (of that ratio) is fused into one element.
    """
    to = element_type(to)
    src = element_type_of_dtype(x.dtype)
    if src.kind == "complex" or to.kind == "complex":
        if src.bits != to.bits:
            raise SemanticsError(f"bitcast-convert between {src.name} and {to.name} needs equal widths")
        return np.asarray(x, order="C").view(_np_dtype(to))
    if src.bits == to.bits:
        return _from_bits(_bits_u64(x, src), to)
    if src.bits > to.bits:
        k = src.bits // to.bits
        shifts = np.arange(k, dtype=np.uint64) * np.uint64(to.bits)
        parts = _bits_u64(x, src)[..., None] >> shifts
        return _from_bits(parts, to)
    k = to.bits // src.bits
    if x.ndim == 0 or x.shape[-1] != k:
        raise SemanticsError(f"bitcast-convert {src.name} -> {to.name} needs a minor dimension of size {k}")
    shifts = np.arange(k, dtype=np.uint64) * np.uint64(src.bits)
    combined = np.bitwise_or.reduce(_bits_u64(x, src) << shifts, axis=-1)
    return _from_bits(np.asarray(combined, dtype=np.uint64), to)


# ---------------------------------------------------------------------------------------------
# reduce-precision
# ---------------------------------------------------------------------------------------------
_FLOAT_FORMAT = {16: (5, 10), 32: (8, 23), 64: (11, 52)}  # f16, f32, f64: exponent and mantissa bits


def reduce_precision(x: np.ndarray, exponent_bits: int, mantissa_bits: int) -> np.ndarray:
    """XLA ``reduce-precision``: round ``x`` to a float format with the given exponent and mantissa widths,
    keeping its type. Mantissa rounding is to nearest even; exponents past the reduced range overflow to
    inf (keeping the sign) or flush to signed zero (no denormals in the reduced format); NaNs are returned
    unchanged (XLA's ``EmitReducePrecisionIR``; measured on XLA CPU).
    """
    et = element_type_of_dtype(x.dtype)
    if et.kind != "float":
        raise SemanticsError(f"reduce-precision needs a float operand, not {et.name}")
    if et.name == "bf16":
        src_exp, src_mant = 8, 7
    elif et.bits in _FLOAT_FORMAT and et.name in ("f16", "f32", "f64"):
        src_exp, src_mant = _FLOAT_FORMAT[et.bits]
    else:  # f8/f4 types: reduce in f32, where every value of theirs is exact, and convert back
        return reduce_precision(x.astype(_F32), exponent_bits, mantissa_bits).astype(x.dtype)
    nbits = et.bits
    udt = np.dtype(f"u{nbits // 8}")
    one = udt.type(1)
    bits = np.asarray(x, order="C").view(udt).copy()
    if mantissa_bits < src_mant:
        drop = src_mant - mantissa_bits
        last_kept = one << udt.type(drop)
        half_minus_one = (last_kept >> one) - one
        bias = ((bits & last_kept) >> udt.type(drop)) + half_minus_one
        bits = (bits + bias) & ~(last_kept - one)
    if exponent_bits < src_exp:
        sign = one << udt.type(nbits - 1)
        exp_mask = udt.type(((1 << src_exp) - 1) << src_mant)
        src_bias = (1 << (src_exp - 1)) - 1
        new_bias = (1 << (exponent_bits - 1)) - 1
        max_exp = udt.type((src_bias + new_bias) << src_mant)
        min_exp = udt.type((src_bias - new_bias) << src_mant)
        exponent = bits & exp_mask
        signed_zero = bits & sign
        bits = np.where(exponent > max_exp, signed_zero | exp_mask, np.where(exponent <= min_exp, signed_zero, bits))
    out = np.asarray(bits, dtype=udt).view(_np_dtype(et))
    # A NaN comes back unchanged, whatever the widths (XLA CPU keeps its bits, also for mantissa_bits=0).
    out = np.where(np.isnan(x.astype(_F32) if nbits < 32 else x), x, out)
    return np.asarray(out, dtype=et.dtype)
