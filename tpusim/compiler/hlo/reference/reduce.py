"""reduce, reduce-window and select-and-scatter.

Semantics from XLA's Operation Semantics ("Reduce", "ReduceWindow", "SelectAndScatter"):

* reduce applies its computation over ``dimensions`` of N operands at once (variadic reduce returns a
  tuple); init values are identities of the computation, and the order of application is left to the
  backend. Here: reduced elements are taken in row-major order and combined pairwise (a balanced tree)
  with one vectorised call per tree level; recognised one-op computations (add, max, ...) run as numpy
  reductions, sums and products of narrow floats accumulating in f32 (see :mod:`.combiners`).
* reduce-window combines each window's init value with the window's in-bounds elements only: padding and
  base-dilation holes take no part (XLA's evaluator and CPU backend skip them; Operation Semantics and
  StableHLO describe padding with the init value, which agrees only when init is an identity: a sum with
  init 2 over a 3x3 window at a corner of ones is 2 + 4 = 6 on XLA, not 2 + 4 + 5 x 2).
* select-and-scatter picks one element per window by folding ``select`` over the window's in-bounds
  elements in row-major order (the current pick is the first argument), then combines the source value
  into that position of an ``init``-filled output with ``scatter``; positions picked by several windows
  receive their source values in row-major window order. Among equal picks the rule of XLA's operation
  semantics (SelectAndScatter, https://openxla.org/xla/operation_semantics: select is called with the
  lexicographically smaller index first) keeps the first; XLA CPU picks a later one in many 2-D windows, so
  ties are tested against the rule, not against JAX.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tpusim.compiler.hlo.ir import Instruction, Window
from tpusim.compiler.hlo.reference.combiners import apply_ordered, computation, reduce_last_axis
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value, register
from tpusim.compiler.hlo.reference.windows import dilate_pad, windows

__all__ = ["reduce_arrays", "reduce_window_arrays", "select_and_scatter_array"]


def _arrays(instr: Instruction, args: Sequence[Value]) -> list[np.ndarray]:
    """The N operands and the N init values, each already in the type its computation takes (mixed
    precision: the evaluator converts them, and the results to their declared types, core.called_arguments)."""
    out = []
    for i, a in enumerate(args):
        if not isinstance(a, np.ndarray):
            raise EvaluationError(instr, f"operand {i} must be an array")
        out.append(a)
    if len(out) % 2:
        raise EvaluationError(instr, f"takes N operands and N init values, got {len(out)} operands")
    return out


def _window(instr: Instruction, rank: int) -> Window:
    window = instr.attr("window")
    if window is None:
        # A window-less reduce-window is a rank-0 operand (or a text without `window=`).
        window = Window(())
    if not isinstance(window, Window) or len(window.dims) != rank:
        raise EvaluationError(instr, f"window {window} does not have one dimension per operand dimension ({rank})")
    return window


def reduce_arrays(
    ctx: EvalContext, instr: Instruction, operands: Sequence[np.ndarray], inits: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """XLA reduce of ``operands`` over ``instr``'s ``dimensions`` with its ``to_apply``."""
    rank = operands[0].ndim
    dims = tuple(int(d) for d in instr.attr("dimensions", ()))
    if any(not 0 <= d < rank for d in dims) or len(set(dims)) != len(dims):
        raise EvaluationError(instr, f"dimensions {list(dims)} are not distinct dimensions of a rank-{rank} operand")
    if any(a.shape != operands[0].shape for a in operands):
        raise EvaluationError(instr, f"operands have different shapes {[list(a.shape) for a in operands]}")
    keep = [d for d in range(rank) if d not in dims]
    red = sorted(dims)
    out_shape = tuple(operands[0].shape[d] for d in keep)
    taps = int(np.prod([operands[0].shape[d] for d in red], dtype=np.int64))  # (not -1: the array may be empty)
    moved = [np.asarray(a.transpose(keep + red), order="C").reshape((*out_shape, taps)) for a in operands]
    comp = computation(ctx, instr, instr.attr("to_apply"))
    return reduce_last_axis(ctx, comp, moved, inits)


@register("reduce")
def _reduce(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    arrays = _arrays(instr, args)
    n = len(arrays) // 2
    res = reduce_arrays(ctx, instr, arrays[:n], arrays[n:])
    return tuple(res) if n > 1 else res[0]


def reduce_window_arrays(
    ctx: EvalContext, instr: Instruction, operands: Sequence[np.ndarray], inits: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """XLA reduce-window of ``operands`` with ``instr``'s window and ``to_apply``."""
    window = _window(instr, operands[0].ndim)
    rank = operands[0].ndim
    shape = operands[0].shape
    whole = [d for d, w in enumerate(window.dims) if w.size > 1 and w.covers(shape[d])]
    if whole and all(w.trivial or d in whole for d, w in enumerate(window.dims)):
        # Every window holds whole dimensions: reduce them (init combined once, as each window does) and
        # broadcast the result back along them, without materialising one window per position.
        keep = [d for d in range(rank) if d not in whole]
        taps = int(np.prod([shape[d] for d in whole], dtype=np.int64))
        kept = tuple(shape[d] for d in keep)
        moved = [np.asarray(a.transpose(keep + whole), order="C").reshape((*kept, taps)) for a in operands]
        reduced = reduce_last_axis(ctx, computation(ctx, instr, instr.attr("to_apply")), moved, inits, exact_zero=True)
        out_shape = tuple(
            (shape[d] + w.pad_low + w.pad_high - w.size) // w.stride + 1 for d, w in enumerate(window.dims)
        )
        expanded = [r.reshape(tuple(1 if d in whole else shape[d] for d in range(rank))) for r in reduced]
        return [np.ascontiguousarray(np.broadcast_to(r, out_shape)) for r in expanded]
    strided = [windows(dilate_pad(a, window.dims, init), window.dims) for a, init in zip(operands, inits)]
    # Padding and base-dilation holes take no part (XLA applies the computation to init and the window's
    # in-bounds elements only; padding with init would count a non-identity init once per padded tap).
    mask = None
    if any(d.lhs_dilate > 1 or d.pad_low > 0 or d.pad_high > 0 for d in window.dims):
        mask = windows(dilate_pad(np.ones(operands[0].shape, np.bool_), window.dims, False), window.dims)
    comp = computation(ctx, instr, instr.attr("to_apply"))
    positions = strided[0].shape[:rank]
    taps = int(np.prod(strided[0].shape[rank:]))
    # Materialising every window at once takes positions x taps elements (quadratic for a cumulative sum):
    # reduce the windows in chunks of the leading position axis that stay within _WINDOW_CHUNK elements.
    if rank == 0 or int(np.prod(positions)) * taps <= _WINDOW_CHUNK:
        views = [np.asarray(v, order="C").reshape((*positions, -1)) for v in strided]
        valid = None if mask is None else np.asarray(mask, order="C").reshape((*positions, -1))
        return reduce_last_axis(ctx, comp, views, inits, valid, exact_zero=True)
    step = max(1, _WINDOW_CHUNK // max(1, taps * int(np.prod(positions[1:]))))
    parts: list[list[np.ndarray]] = []
    for start in range(0, positions[0], step):
        chunk = (-1, *positions[1:], taps)
        views = [np.asarray(v[start : start + step], order="C").reshape(chunk) for v in strided]
        valid = None if mask is None else np.asarray(mask[start : start + step], order="C").reshape(chunk)
        parts.append(reduce_last_axis(ctx, comp, views, inits, valid, exact_zero=True))
    return [np.concatenate([p[i] for p in parts], axis=0) for i in range(len(operands))]


_WINDOW_CHUNK = 1 << 24
"""Most window elements reduce-window materialises at once."""


@register("reduce-window")
def _reduce_window(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    arrays = _arrays(instr, args)
    n = len(arrays) // 2
    res = reduce_window_arrays(ctx, instr, arrays[:n], arrays[n:])
    return tuple(res) if n > 1 else res[0]


def select_and_scatter_array(
    ctx: EvalContext, instr: Instruction, operand: np.ndarray, source: np.ndarray, init: np.ndarray
) -> np.ndarray:
    """XLA select-and-scatter (see the module docstring)."""
    window = _window(instr, operand.ndim)
    select = computation(ctx, instr, instr.attr("select"))
    scatter = computation(ctx, instr, instr.attr("scatter"))
    size = operand.size
    vals = windows(dilate_pad(operand, window.dims, np.zeros((), operand.dtype)), window.dims)
    pos = windows(dilate_pad(np.arange(size, dtype=np.int64).reshape(operand.shape), window.dims, -1), window.dims)
    rank = operand.ndim
    if vals.shape[:rank] != source.shape:
        raise EvaluationError(
            instr, f"source dimensions {list(source.shape)} differ from the window positions {list(vals.shape[:rank])}"
        )
    vals = vals.reshape((*source.shape, -1))
    pos = pos.reshape((*source.shape, -1))
    out = np.full(operand.shape, init, dtype=init.dtype).reshape(-1)  # (the scatter's type: mixed precision)
    taps = vals.shape[-1]
    if taps == 0 or source.size == 0:
        return out.reshape(operand.shape)
    sel_val = vals[..., 0].copy()
    sel_pos = pos[..., 0].copy()
    have = sel_pos >= 0
    for t in range(1, taps):
        cand_pos = pos[..., t]
        valid = cand_pos >= 0
        if not valid.any():
            continue
        cand = vals[..., t]
        keep = ctx.vectorized_call(select.name, [sel_val, cand])
        if not isinstance(keep, np.ndarray) or keep.dtype != np.bool_:
            raise EvaluationError(instr, f"select computation {select.name} must return pred")
        take = valid & (~have | ~keep)
        sel_val = np.where(take, cand, sel_val)
        sel_pos = np.where(take, cand_pos, sel_pos)
        have |= valid
    apply_ordered(ctx, scatter, [out], sel_pos[have], [source[have]])
    return out.reshape(operand.shape)


@register("select-and-scatter")
def _select_and_scatter(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    if len(args) != 3 or not all(isinstance(a, np.ndarray) for a in args):
        raise EvaluationError(instr, "takes three array operands: operand, source, init value")
    operand, source, init = args
    assert isinstance(operand, np.ndarray) and isinstance(source, np.ndarray) and isinstance(init, np.ndarray)
    return select_and_scatter_array(ctx, instr, operand, source, init)
