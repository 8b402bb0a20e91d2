"""Numerics of the VPU's elementwise ops: the kernels of :mod:`tpusim.semantics.elementwise`, the same ones
the reference interpreter computes with, so the device and the oracle cannot drift apart.

The rules they implement (each pinned against XLA on CPU by the reference's tests): floats narrower than
f32 computed in f32 and rounded once; denormals flushed as on TPUs; transcendentals correctly rounded in
f32; integer arithmetic wraps; XLA's division-by-zero, shift and saturating-convert rules. A reduction's
combiner (:func:`tpusim.semantics.combiners.ufunc_for`) and denormal flushing
(:func:`tpusim.semantics.convert.flush`) come from the same package.
"""

from __future__ import annotations

import numpy as np

from tpusim.isa import REINTERPRETS
from tpusim.memory import ElementType
from tpusim.semantics.elementwise import apply

__all__ = ["apply", "convert", "result_types"]


def convert(x: np.ndarray, to: ElementType) -> np.ndarray:
    """XLA ``convert`` (saturating float to integer, NaN to 0, x != 0 to pred, round to nearest even)."""
    return apply("convert", [np.asarray(x)], to)


def result_types(fn: str, operands: list[ElementType], out: ElementType) -> str | None:
    """The HLO typing rule of ``fn``: None when ``operands -> out`` is allowed, else what is wrong."""
    names = [t.name for t in operands]
    if fn == "convert":
        return None
    if fn in REINTERPRETS:
        widths = {t.bits for t in operands}
        return None if widths == {out.bits} else f"vpu.{fn} keeps the width: {names[0]} is not {out.bits} bits"
    if fn == "select":
        if names[0] != "pred":
            return f"select's predicate must be pred, not {names[0]}"
        names = names[1:]
    if len(set(names)) > 1:
        return f"vpu.{fn} operands must share one element type, not {', '.join(names)}"
    if fn in ("compare", "is-finite"):
        return None if out.name == "pred" else f"vpu.{fn} gives pred, not {out.name}"
    if names and out.name != names[0]:
        return f"vpu.{fn} of {names[0]} operands gives {names[0]}, not {out.name} (use vpu.convert)"
    return None
