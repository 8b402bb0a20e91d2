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
* ``algorithm=`` (a dot algorithm preset, e.g. ``dot_bf16_bf16_f32``) *is* a numerics contract: the
  operands are rounded to the named input type (bf16, tf32, f16) before an exact f32 accumulation; the
  ``_x3``/``_x6``/``_x9`` variants split each f32 operand into 2 or 3 bf16 (tf32 for tf32_x3) terms and
  keep the 3, 6 or 9 most significant partial products, as XLA's algorithm documentation describes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod

import ml_dtypes
import numpy as np

from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.hlo.reference.combiners import NARROW_FLOATS
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value, register

__all__ = ["DOT_ALGORITHMS", "accumulation_dtype", "dot_general"]


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


# ---------------------------------------------------------------------------------------------
# Dot algorithm presets (``algorithm=dot_...``)
# ---------------------------------------------------------------------------------------------
def _round_to(dtype: object) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: x.astype(dtype).astype(np.float32)


def _tf32(x: np.ndarray) -> np.ndarray:
    """Round f32 to TF32 (10 explicit mantissa bits), to nearest even."""
    bits = x.astype(np.float32).view(np.uint32)
    finite = np.isfinite(x)
    lsb = (bits >> 13) & 1
    rounded = ((bits + 0x0FFF + lsb) & ~np.uint32(0x1FFF)).astype(np.uint32)
    return np.where(finite, rounded, bits).view(np.float32)


def _split(x: np.ndarray, parts: int, rounder: Callable[[np.ndarray], np.ndarray]) -> list[np.ndarray]:
    """``x`` (f32) as ``parts`` terms of decreasing magnitude, each representable in the rounder's type."""
    out = []
    rest = x.astype(np.float32)
    for _ in range(parts):
        term = rounder(rest)
        out.append(term)
        rest = (rest - term).astype(np.float32)
    return out


def _split_dot(parts: int, products: int, rounder: Callable[[np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    """A dot of f32 operands split into ``parts`` terms, keeping the ``products`` most significant pairs."""
    # Pairs (i, j) ordered by significance i + j; ties by i. 3 = hi*hi, hi*lo, lo*hi; 6 adds the three
    # with i + j == 2; 9 keeps all of a 3-way split.
    pairs = sorted(((i, j) for i in range(parts) for j in range(parts)), key=lambda p: (p[0] + p[1], p[0]))[:products]

    def run(lhs: np.ndarray, rhs: np.ndarray, dims: tuple[Sequence[int], ...], result: np.dtype) -> np.ndarray:
        ls, rs = _split(lhs, parts, rounder), _split(rhs, parts, rounder)
        # Accumulate the small products first, as the x3/x6 recipes do.
        total: np.ndarray | None = None
        for i, j in reversed(pairs):
            term = dot_general(ls[i], rs[j], *dims, np.dtype(np.float32))
            total = term if total is None else total + term
        assert total is not None
        return total.astype(result)

    return run


def _rounded_dot(rounder: Callable[[np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    def run(lhs: np.ndarray, rhs: np.ndarray, dims: tuple[Sequence[int], ...], result: np.dtype) -> np.ndarray:
        return dot_general(rounder(lhs), rounder(rhs), *dims, np.dtype(np.float32)).astype(result)

    return run


def _plain_dot(lhs: np.ndarray, rhs: np.ndarray, dims: tuple[Sequence[int], ...], result: np.dtype) -> np.ndarray:
    return dot_general(lhs, rhs, *dims, result)


def _f64_dot(lhs: np.ndarray, rhs: np.ndarray, dims: tuple[Sequence[int], ...], result: np.dtype) -> np.ndarray:
    return dot_general(lhs.astype(np.float64), rhs.astype(np.float64), *dims, np.dtype(np.float64)).astype(result)


_bf16 = _round_to(ml_dtypes.bfloat16)
DOT_ALGORITHMS: dict[str, Callable[..., np.ndarray]] = {
    "dot_any_f8_any_f8_f32": _plain_dot,
    "dot_any_f8_any_f8_f32_fast_accum": _plain_dot,
    "dot_any_f8_any_f8_any": _plain_dot,
    "dot_f16_f16_f16": _rounded_dot(_round_to(np.float16)),
    "dot_f16_f16_f32": _rounded_dot(_round_to(np.float16)),
    "dot_bf16_bf16_bf16": _rounded_dot(_bf16),
    "dot_bf16_bf16_f32": _rounded_dot(_bf16),
    "dot_bf16_bf16_f32_x3": _split_dot(2, 3, _bf16),
    "dot_bf16_bf16_f32_x6": _split_dot(3, 6, _bf16),
    "dot_bf16_bf16_f32_x9": _split_dot(3, 9, _bf16),
    "dot_tf32_tf32_f32": _rounded_dot(_tf32),
    "dot_tf32_tf32_f32_x3": _split_dot(2, 3, _tf32),
    "dot_f32_f32_f32": _plain_dot,
    "dot_f64_f64_f64": _f64_dot,
}
"""``algorithm=`` preset name (XLA's PrecisionConfig.Algorithm, lowercase) -> dot function."""


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
    algorithm = instr.attr("algorithm")
    if algorithm is None or str(algorithm) in ("alg_unset", "dot_any_any_any"):
        return dot_general(lhs, rhs, lb, rb, lc, rc, result)
    fn = DOT_ALGORITHMS.get(str(algorithm).lower())
    if fn is None:
        raise EvaluationError(instr, f"unknown dot algorithm {algorithm!s}; known: {', '.join(DOT_ALGORITHMS)}")
    return fn(lhs, rhs, dims, result)
