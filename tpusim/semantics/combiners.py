"""What a reduction's combiner computes: XLA's binary ops as numpy ufuncs, their exact identities, and the
types whose sums accumulate in f32. Shared by the reference interpreter, the vector unit and the
lowering (which pads reduction blocks with the identity)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tpusim.memory import ELEMENT_TYPES
from tpusim.semantics.elementwise import INT_ARITHMETIC, PRED_ARITHMETIC

__all__ = ["NARROW_FLOATS", "exact_identity", "ufunc_for"]

# Floating-point types whose sums and products accumulate in f32 and round once, as TPUs do: every float type
# narrower than f32 (convert.is_narrow_float's rule; a hand list once left out f8e4m3, f8e3m4 and f4e2m1fn).
NARROW_FLOATS = frozenset(
    et.dtype for et in ELEMENT_TYPES.values() if et.kind == "float" and et.bits < 32 and et.dtype is not None
)


def ufunc_for(opcode: str, dtype: np.dtype) -> np.ufunc:
    """The numpy ufunc computing XLA's ``opcode`` on ``dtype``: the elementwise kernels' own tables (pred
    arithmetic is logical, :data:`~tpusim.semantics.elementwise.PRED_ARITHMETIC`; floats combine with the
    same ufuncs as integers, their rounding and flushing being the caller's)."""
    return PRED_ARITHMETIC[opcode] if dtype == np.bool_ else INT_ARITHMETIC[opcode]


def exact_identity(opcode: str, dtype: np.dtype) -> np.ndarray | None:
    """The value ``e`` of ``dtype`` with ``opcode(e, x) == x`` bit for bit for every ``x`` (NaNs and signed
    zeros included), or None when there is none: -0.0 for float add (``+0.0 + -0.0`` is ``+0.0``), the lowest
    finite value for the maximum of a float type without infinities; complex multiply has none
    (``(1+0j) * (inf+0j)`` has a NaN imaginary part)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.asarray(opcode in ("multiply", "minimum", "and"))
    if dtype.kind == "c":
        return np.asarray(complex(-0.0, -0.0), dtype) if opcode == "add" else None
    if dtype.kind == "f" or dtype in NARROW_FLOATS:
        if opcode in ("maximum", "minimum"):
            sign = -1.0 if opcode == "maximum" else 1.0
            inf = np.asarray(sign * np.inf).astype(dtype)
            if np.isinf(inf):
                return inf
            finfo = ml_dtypes.finfo(dtype)
            return np.asarray(finfo.min if opcode == "maximum" else finfo.max, dtype)
        fvalue = {"add": -0.0, "multiply": 1.0}.get(opcode)
        ident = None if fvalue is None else np.asarray(fvalue).astype(dtype)
        return None if ident is None or np.isnan(ident) else ident  # (f8e8m0fnu has no zero)
    iinfo = ml_dtypes.iinfo(dtype)  # (numpy's iinfo does not know the 4-bit integers)
    lo, hi = int(iinfo.min), int(iinfo.max)
    table = {"add": 0, "or": 0, "xor": 0, "multiply": 1, "maximum": lo, "minimum": hi, "and": -1 if lo < 0 else hi}
    ivalue = table.get(opcode)
    return None if ivalue is None else np.asarray(ivalue).astype(dtype)
