"""Numerics of the VPU's elementwise ops: the reference interpreter's own functions, so the device and the
oracle cannot drift apart (DESIGN principle 3).

Each HLO elementwise opcode has one function in :data:`tpusim.compiler.hlo.reference.REFERENCE`, taking
``(ctx, instruction, operands)`` and reading only the result element type and attributes (``direction``)
from the instruction. :func:`apply` builds that instruction once per (op, result type, direction) and calls
it on the operand arrays. The rules it implements (each pinned against XLA on CPU by the reference's
tests): floats narrower than f32 computed in f32 and rounded once; denormals flushed as on TPUs;
transcendentals correctly rounded in f32; integer arithmetic wraps; XLA's division-by-zero, shift and
saturating-convert rules. A reduction's combiner (:func:`combiner`) and its denormal flushing (:func:`flush`)
are the reference's too.
This is the devices' second, and last, use of the compiler package (the first is the fallback evaluator);
both are reference semantics, not compilation.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from tpusim.memory import ElementType, Shape, element_type

__all__ = ["apply", "combiner", "convert", "flush", "result_types"]


@lru_cache(maxsize=1024)
def _instruction(fn: str, out: str, direction: str | None) -> Any:
    from tpusim.compiler.hlo.ir import Attributes, Instruction

    attrs = Attributes({"direction": direction}) if direction is not None else Attributes()
    return Instruction(name=f"vpu.{fn}", opcode=fn, shape=Shape(element_type(out), ()), attributes=attrs)


def _reference() -> Any:
    from tpusim.compiler.hlo import reference

    return reference


def apply(fn: str, args: list[np.ndarray], out: ElementType, direction: str | None = None) -> np.ndarray:
    """Evaluate HLO elementwise opcode ``fn`` on broadcastable ``args`` (storage dtypes; 0-d for splats).

    Returns:
        An array of ``out``'s dtype.

    Raises:
        EvaluationError: from the reference interpreter, for operands the op does not accept.
    """
    ref = _reference()
    with np.errstate(all="ignore"):  # IEEE results (inf, NaN) are the point, not a warning
        result = np.asarray(ref.REFERENCE[fn](None, _instruction(fn, out.name, direction), args))
    return result if result.dtype == out.dtype else result.astype(out.dtype)


def combiner(fn: str, dtype: np.dtype) -> np.ufunc:
    """The numpy ufunc of reduction combiner ``fn`` (add, multiply, maximum, minimum, and, or, xor) on
    ``dtype``, as the reference reduces with it (pred arithmetic is logical: add is or, multiply is and)."""
    from tpusim.compiler.hlo.reference.combiners import ufunc_for

    return ufunc_for(fn, dtype)


def flush(x: np.ndarray) -> np.ndarray:
    """Denormal f32/f64 values as zeros of their sign (other types unchanged), as TPU arithmetic reads and
    writes them."""
    from tpusim.compiler.hlo.reference.convert import flush as reference_flush

    return reference_flush(x)


def convert(x: np.ndarray, to: ElementType) -> np.ndarray:
    """XLA ``convert`` (saturating float to integer, NaN to 0, x != 0 to pred, round to nearest even)."""
    return apply("convert", [np.asarray(x)], to)


def result_types(fn: str, operands: list[ElementType], out: ElementType) -> str | None:
    """The HLO typing rule of ``fn``: None when ``operands -> out`` is allowed, else what is wrong."""
    names = [t.name for t in operands]
    if fn == "convert":
        return None
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
