"""Scalar constants of an HLO computation as vector-instruction immediates."""

from __future__ import annotations

import numpy as np

from tpusim.compiler.hlo.ir import Instruction
from tpusim.isa import Const
from tpusim.memory import Shape

__all__ = ["scalar_constant"]


def scalar_constant(instr: Instruction) -> Const | None:
    """``instr``'s value as an immediate when it is a rank-0 ``constant`` of a type immediates hold (a Python
    float, bool or int); None otherwise (another opcode, an array, a complex or byteless type)."""
    shape = instr.shape
    if instr.opcode != "constant" or not isinstance(shape, Shape) or shape.rank != 0:
        return None
    et = shape.element_type
    if et.is_complex or et.dtype is None:
        return None
    value = np.asarray(instr.attr("literal").value).reshape(())
    return Const(value.item() if et.is_float or et.name == "pred" else int(value), et)
