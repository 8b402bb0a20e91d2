"""batch-norm-training, batch-norm-inference and batch-norm-grad.

Semantics (Operation Semantics, "BatchNormTraining", "BatchNormInference", "BatchNormGrad"), with ``F``
the ``feature_index`` dimension, means and variances over every other dimension, variance biased (divided
by the element count ``N``), and ``inv = 1 / sqrt(var + epsilon)``:

* training: ``y = (x - mean) * inv * scale + offset``; returns ``(y, mean, var)``.
* inference: the same with the given mean and variance.
* grad: ``grad_offset = sum(dy)``, ``grad_scale = sum(dy * (x - mean) * inv)``,
  ``grad_x = scale * inv / N * (N * dy - grad_offset - (x - mean) * inv * grad_scale)``.

Computed in f32 (f64 for f64 operands) and rounded once to the element type.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value, register

__all__ = ["batch_norm_grad", "batch_norm_inference", "batch_norm_training"]


def _setup(x: np.ndarray, feature_index: int) -> tuple[np.dtype, tuple[int, ...], list[int]]:
    if not 0 <= feature_index < x.ndim:
        raise ValueError(f"feature_index {feature_index} is not a dimension of a rank-{x.ndim} operand")
    wide = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
    axes = tuple(d for d in range(x.ndim) if d != feature_index)
    shape = [1] * x.ndim
    shape[feature_index] = x.shape[feature_index]
    return wide, axes, shape


def batch_norm_training(
    x: np.ndarray, scale: np.ndarray, offset: np.ndarray, epsilon: float, feature_index: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(y, mean, var)`` of XLA's batch-norm-training."""
    wide, axes, shape = _setup(x, feature_index)
    xw = x.astype(wide)
    mean = xw.mean(axis=axes)
    var = np.square(xw - mean.reshape(shape)).mean(axis=axes)
    inv = 1 / np.sqrt(var + wide.type(epsilon))
    y = (xw - mean.reshape(shape)) * (inv * scale.astype(wide)).reshape(shape) + offset.astype(wide).reshape(shape)
    return y.astype(x.dtype), mean.astype(x.dtype), var.astype(x.dtype)


def batch_norm_inference(
    x: np.ndarray,
    scale: np.ndarray,
    offset: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    epsilon: float,
    feature_index: int,
) -> np.ndarray:
    """``y`` of XLA's batch-norm-inference."""
    wide, _, shape = _setup(x, feature_index)
    inv = 1 / np.sqrt(var.astype(wide) + wide.type(epsilon))
    y = (x.astype(wide) - mean.astype(wide).reshape(shape)) * (inv * scale.astype(wide)).reshape(shape)
    return (y + offset.astype(wide).reshape(shape)).astype(x.dtype)


def batch_norm_grad(
    x: np.ndarray,
    scale: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    dy: np.ndarray,
    epsilon: float,
    feature_index: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(grad_x, grad_scale, grad_offset)`` of XLA's batch-norm-grad."""
    wide, axes, shape = _setup(x, feature_index)
    n = x.size // max(x.shape[feature_index], 1)
    inv = (1 / np.sqrt(var.astype(wide) + wide.type(epsilon))).reshape(shape)
    centered = x.astype(wide) - mean.astype(wide).reshape(shape)
    dyw = dy.astype(wide)
    grad_offset = dyw.sum(axis=axes)
    grad_scale = (dyw * centered * inv).sum(axis=axes)
    grad_x = (scale.astype(wide).reshape(shape) * inv / n) * (
        n * dyw - grad_offset.reshape(shape) - centered * inv * grad_scale.reshape(shape)
    )
    return grad_x.astype(x.dtype), grad_scale.astype(x.dtype), grad_offset.astype(x.dtype)


def _arrays(instr: Instruction, args: Sequence[Value], n: int) -> list[np.ndarray]:
    if len(args) != n or not all(isinstance(a, np.ndarray) for a in args):
        raise EvaluationError(instr, f"takes {n} array operands, got {len(args)}")
    return list(args)  # type: ignore[arg-type]


def _params(instr: Instruction) -> tuple[float, int]:
    return float(instr.attr("epsilon", 0.0)), int(instr.attr("feature_index", 0))


@register("batch-norm-training")
def _training(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    x, scale, offset = _arrays(instr, args, 3)
    try:
        return batch_norm_training(x, scale, offset, *_params(instr))
    except ValueError as exc:
        raise EvaluationError(instr, str(exc)) from None


@register("batch-norm-inference")
def _inference(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    x, scale, offset, mean, var = _arrays(instr, args, 5)
    try:
        return batch_norm_inference(x, scale, offset, mean, var, *_params(instr))
    except ValueError as exc:
        raise EvaluationError(instr, str(exc)) from None


@register("batch-norm-grad")
def _grad(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    x, scale, mean, var, dy = _arrays(instr, args, 5)
    try:
        return batch_norm_grad(x, scale, mean, var, dy, *_params(instr))
    except ValueError as exc:
        raise EvaluationError(instr, str(exc)) from None
