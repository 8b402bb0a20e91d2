"""map: a scalar computation applied to every element of N same-shaped operands (Operation Semantics, "Map").

The computation runs once over whole arrays through :meth:`EvalContext.vectorized_call` (element by
element only when it holds a non-elementwise instruction).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value, register

__all__: list[str] = []


@register("map")
def _map(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    if not args or not all(isinstance(a, np.ndarray) for a in args):
        raise EvaluationError(instr, "takes one or more array operands")
    arrays = [np.asarray(a) for a in args]
    if any(a.shape != arrays[0].shape for a in arrays):
        raise EvaluationError(instr, f"operands have different dimensions {[list(a.shape) for a in arrays]}")
    dims = tuple(int(d) for d in instr.attr("dimensions", range(arrays[0].ndim)))
    if dims != tuple(range(arrays[0].ndim)):
        raise EvaluationError(instr, f"dimensions={list(dims)}: XLA maps over all dimensions in order")
    out = ctx.vectorized_call(instr.attr("to_apply"), arrays)
    if not isinstance(out, np.ndarray):
        raise EvaluationError(instr, "the mapped computation must return a scalar")
    return np.asarray(np.broadcast_to(out, arrays[0].shape), order="C")
