"""XLA element types: name, bit width and the numpy dtype that holds one value.

Narrow floats and integers (bf16, the f8 family, f4, s2/s4/u2/u4) come from ``ml_dtypes``. Sub-byte
types occupy one byte each in numpy (the value sits in the low bits); their storage width in memory is
set by the layout (``E(n)``, see :mod:`tpusim.memory.tiling`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import ml_dtypes
import numpy as np

__all__ = ["ELEMENT_TYPES", "ElementType", "element_type", "element_type_of_dtype"]

Kind = Literal["pred", "signed", "unsigned", "float", "complex", "token"]


@dataclass(frozen=True, slots=True)
class ElementType:
    """One XLA primitive type.

    Attributes:
        name: the lowercase name XLA prints (``bf16``, ``f8e4m3fn``, ...).
        bits: width of one value in bits (0 for ``token``).
        kind: ``pred``, ``signed``, ``unsigned``, ``float``, ``complex`` or ``token``.
        dtype: the numpy dtype holding one value, or None for ``token``.
    """

    name: str
    bits: int
    kind: Kind
    dtype: np.dtype | None

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("signed", "unsigned")

    @property
    def is_complex(self) -> bool:
        return self.kind == "complex"

    @property
    def is_sub_byte(self) -> bool:
        """True for types narrower than a byte (s2, s4, u2, u4, f4e2m1fn)."""
        return 0 < self.bits < 8

    @property
    def raw_dtype(self) -> np.dtype:
        """The dtype that holds this type's bit pattern: an unsigned integer of the same width (uint8 for
        sub-byte types), or 16 raw bytes for c128."""
        return np.dtype(f"u{max(1, self.bits // 8)}") if self.bits <= 64 else np.dtype(f"V{self.bits // 8}")

    def __str__(self) -> str:
        return self.name


def _table() -> dict[str, ElementType]:
    entries: list[tuple[str, int, Kind, Any]] = [
        ("pred", 8, "pred", np.bool_),
        ("s2", 2, "signed", ml_dtypes.int2),
        ("s4", 4, "signed", ml_dtypes.int4),
        ("s8", 8, "signed", np.int8),
        ("s16", 16, "signed", np.int16),
        ("s32", 32, "signed", np.int32),
        ("s64", 64, "signed", np.int64),
        ("u2", 2, "unsigned", ml_dtypes.uint2),
        ("u4", 4, "unsigned", ml_dtypes.uint4),
        ("u8", 8, "unsigned", np.uint8),
        ("u16", 16, "unsigned", np.uint16),
        ("u32", 32, "unsigned", np.uint32),
        ("u64", 64, "unsigned", np.uint64),
        ("f16", 16, "float", np.float16),
        ("bf16", 16, "float", ml_dtypes.bfloat16),
        ("f32", 32, "float", np.float32),
        ("f64", 64, "float", np.float64),
        ("f8e4m3fn", 8, "float", ml_dtypes.float8_e4m3fn),
        ("f8e5m2", 8, "float", ml_dtypes.float8_e5m2),
        ("f8e4m3fnuz", 8, "float", ml_dtypes.float8_e4m3fnuz),
        ("f8e5m2fnuz", 8, "float", ml_dtypes.float8_e5m2fnuz),
        ("f8e4m3b11fnuz", 8, "float", ml_dtypes.float8_e4m3b11fnuz),
        ("f8e4m3", 8, "float", getattr(ml_dtypes, "float8_e4m3", None)),
        ("f8e3m4", 8, "float", getattr(ml_dtypes, "float8_e3m4", None)),
        ("f8e8m0fnu", 8, "float", getattr(ml_dtypes, "float8_e8m0fnu", None)),
        ("f4e2m1fn", 4, "float", getattr(ml_dtypes, "float4_e2m1fn", None)),
        ("c64", 64, "complex", np.complex64),
        ("c128", 128, "complex", np.complex128),
    ]
    table = {name: ElementType(name, bits, kind, np.dtype(dt)) for name, bits, kind, dt in entries if dt is not None}
    table["token"] = ElementType("token", 0, "token", None)
    return table


ELEMENT_TYPES: dict[str, ElementType] = _table()
_BY_DTYPE: dict[np.dtype, ElementType] = {t.dtype: t for t in ELEMENT_TYPES.values() if t.dtype is not None}


def element_type(name: str | ElementType) -> ElementType:
    """Look up an element type by its XLA name; raises KeyError naming the known types."""
    if isinstance(name, ElementType):
        return name
    try:
        return ELEMENT_TYPES[name]
    except KeyError:
        raise KeyError(f"unknown element type {name!r}; known: {', '.join(ELEMENT_TYPES)}") from None


def element_type_of_dtype(dtype: np.dtype | type) -> ElementType:
    """The XLA element type whose numpy dtype is ``dtype`` (``np.float32`` -> ``f32``)."""
    try:
        return _BY_DTYPE[np.dtype(dtype)]
    except KeyError:
        raise KeyError(f"numpy dtype {np.dtype(dtype)} has no XLA element type") from None
