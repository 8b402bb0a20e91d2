"""Elementwise ops in the reference interpreter: each opcode of :data:`tpusim.semantics.elementwise.KERNELS`
registered with the instruction's result element type and attributes.

The kernels work on operands of any broadcastable shape and read only the result *element type* from the
instruction, so scalar computations built from them run on whole arrays at once
(``register(..., elementwise=True)``, used by :meth:`EvalContext.vectorized_call`). The XLA facts they
implement are listed in :mod:`tpusim.semantics.elementwise`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, RefFn, Value, register
from tpusim.memory import Shape
from tpusim.semantics.elementwise import KERNELS, NOT_ELEMENTWISE, Kernel
from tpusim.semantics.errors import SemanticsError

__all__: list[str] = []


def _reference(kernel: Kernel) -> RefFn:
    def evaluate(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
        if instr.opcode == "select" and isinstance(args[1], tuple):
            return args[1] if bool(args[0]) else args[2]  # the old tuple form selects whole values
        shape = instr.shape
        if not isinstance(shape, Shape):
            raise EvaluationError(instr, f"{instr.opcode} gives an array, not {shape}")
        try:
            return kernel(instr.opcode, args, shape.element_type, instr.attributes)
        except SemanticsError as exc:
            raise EvaluationError(instr, str(exc)) from None

    return evaluate


TUPLES_TOO = frozenset({"copy"})
"""Opcodes whose reference function is registered elsewhere because it also takes tuples (movement.py)."""

for _op, _kernel in KERNELS.items():
    if _op not in TUPLES_TOO:
        register(_op, elementwise=_op not in NOT_ELEMENTWISE)(_reference(_kernel))
