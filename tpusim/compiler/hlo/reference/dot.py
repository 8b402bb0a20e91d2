"""dot (XLA's DotGeneral): batch and contracting dimensions, mixed and preferred element types.

The result has the batch dimensions first (in ``lhs_batch_dims`` order), then the free dimensions of
the left operand, then those of the right one (Operation Semantics, "DotGeneral").

Numerics, checked against XLA CPU through JAX:

* operands are converted to an *accumulation type* and multiplied there, the sum rounded once to the
  result type: f32 for floating results narrower than f32 (bf16, f16, f8: "bf16 operands accumulate
  in f32"), otherwise the result type itself (f32, f64, complex; integers wrap modulo 2^bits, s8 x s8 ->
  s32 converts the operands to s32 first, like XLA).
* ``precision_config`` does not change the oracle: XLA CPU computes f32 dots exactly in f32 at every
  precision. TPU-like bf16 passes belong to the device model.
* ``algorithm=`` presets (``dot_bf16_bf16_f32``, ``_x3``, ``_x6``) do not change it either: XLA CPU (JAX
  0.10.2) runs them as plain f32 dots (measured on 8x64 @ 64x4 normal data: max |error| against f64 1.7e-6,
  against the product of bf16-rounded operands 3.6e-2), and so does the oracle.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np

from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value, register
from tpusim.semantics.combiners import NARROW_FLOATS

__all__ = ["accumulation_dtype", "dot_general"]


def accumulation_dtype(result: np.dtype) -> np.dtype:
    """The type a dot or convolution with result type ``result`` multiplies and accumulates in."""
    result = np.dtype(result)
    if result in NARROW_FLOATS:
        return np.dtype(np.float32)
    if result == np.bool_:
        return np.dtype(np.int32)
    return result


def dot_general(
    lhs: np.ndarray,
    rhs: np.ndarray,
    lhs_batch: Sequence[int],
    rhs_batch: Sequence[int],
    lhs_contracting: Sequence[int],
    rhs_contracting: Sequence[int],
    result: np.dtype,
) -> np.ndarray:
    """XLA's DotGeneral of ``lhs`` and ``rhs`` with result element type ``result``.

    Args:
        lhs, rhs: the operands (any element types; converted to the accumulation type).
        lhs_batch, rhs_batch: paired batch dimensions.
        lhs_contracting, rhs_contracting: paired contracting dimensions.
        result: the result's numpy dtype.

    Returns:
        ``batch... x lhs_free... x rhs_free...`` in dtype ``result``.
    """
    acc = accumulation_dtype(result)
    lb, rb, lc, rc = (list(map(int, d)) for d in (lhs_batch, rhs_batch, lhs_contracting, rhs_contracting))
    lf = [d for d in range(lhs.ndim) if d not in lb and d not in lc]
    rf = [d for d in range(rhs.ndim) if d not in rb and d not in rc]
    batch = [lhs.shape[d] for d in lb]
    lfree = [lhs.shape[d] for d in lf]
    rfree = [rhs.shape[d] for d in rf]
    k = prod(lhs.shape[d] for d in lc)
    a = lhs.transpose(lb + lf + lc).astype(acc).reshape(prod(batch), prod(lfree), k)
    b = rhs.transpose(rb + rc + rf).astype(acc).reshape(prod(batch), k, prod(rfree))
    out = np.matmul(a, b)
    out = out.reshape(batch + lfree + rfree)
    if np.dtype(result) == np.bool_:
        return out != 0
    return out.astype(result)


@register("dot")
def _dot(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    if len(args) != 2:
        if instr.attr("sparsity") is not None:
            raise EvaluationError(instr, "sparse dots (sparsity=, with metadata operands) are not supported")
        raise EvaluationError(instr, f"takes 2 operands, got {len(args)}")
    lhs, rhs = args
    if not isinstance(lhs, np.ndarray) or not isinstance(rhs, np.ndarray):
        raise EvaluationError(instr, "operands must be arrays")
    dims = tuple(
        tuple(int(d) for d in instr.attr(key, ()))
        for key in ("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims")
    )
    lb, rb, lc, rc = dims
    if len(lb) != len(rb) or len(lc) != len(rc):
        raise EvaluationError(instr, "lhs and rhs must have as many batch and as many contracting dimensions")
    for name, ds, op in (("lhs", lb + lc, lhs), ("rhs", rb + rc, rhs)):
        if len(set(ds)) != len(ds) or any(not 0 <= d < op.ndim for d in ds):
            raise EvaluationError(instr, f"{name} batch/contracting dimensions {list(ds)} are invalid (rank {op.ndim})")
    for a, b in zip(lb + lc, rb + rc):
        if lhs.shape[a] != rhs.shape[b]:
            raise EvaluationError(
                instr, f"lhs dimension {a} (size {lhs.shape[a]}) does not match rhs dimension {b} (size {rhs.shape[b]})"
            )
    result = instr.array_shape.element_type.dtype
    assert result is not None
    return dot_general(lhs, rhs, lb, rb, lc, rc, result)
