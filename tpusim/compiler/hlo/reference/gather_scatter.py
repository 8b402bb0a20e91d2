"""gather and scatter with XLA's full dimension numbers (batching dimensions included).

Semantics (Operation Semantics, "Gather" and "Scatter"):

* gather: for every batch position (the indices' dimensions other than ``index_vector_dim``) a start
  vector is built from the index vector through ``start_index_map`` (plus, for each operand batching
  dimension, the position along the paired indices batching dimension), *clamped* so the whole slice of
  ``slice_sizes`` lies inside the operand, and the slice is copied; collapsed and operand batching
  dimensions (size 1) are dropped, the remaining slice dimensions become ``offset_dims`` of the output.
* scatter: every update element is routed to ``operand[start + window index]``; an update window whose
  slice would leave the operand is *skipped whole* (XLA's implementation-defined choice, which JAX's
  ``mode='drop'`` and ``.at[]`` rely on). Updates are combined with ``to_apply(current, update)`` in
  row-major order of the update elements, which is what XLA CPU's serial loop does; with
  ``unique_indices`` the order does not matter. Variadic scatter updates N operands together.

Both are vectorised through index arrays; scatter combines with ``ufunc.at`` or with the computation
called once per duplicate rank (:func:`.combiners.apply_ordered`).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np

from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.hlo.reference.combiners import apply_ordered, computation
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value, register

__all__ = ["gather", "scatter_targets"]


def _ints(instr: Instruction, key: str) -> tuple[int, ...]:
    return tuple(int(d) for d in instr.attr(key, ()))


def _index_vectors(indices: np.ndarray, index_vector_dim: int) -> np.ndarray:
    """Indices as ``(batch..., K)`` int64 with the index vector last (a trailing 1 when it is implicit)."""
    indices = indices[..., None] if index_vector_dim == indices.ndim else np.moveaxis(indices, index_vector_dim, -1)
    return indices.astype(np.int64)


def _batch_positions(batch_shape: tuple[int, ...], dim: int, index_vector_dim: int) -> np.ndarray:
    """Position along indices dimension ``dim`` (numbered with the index vector dim in place) as an array
    over the batch shape."""
    axis = dim if dim < index_vector_dim else dim - 1
    shape = [1] * len(batch_shape)
    shape[axis] = batch_shape[axis]
    return np.arange(batch_shape[axis], dtype=np.int64).reshape(shape)


def gather(
    operand: np.ndarray,
    indices: np.ndarray,
    *,
    offset_dims: Sequence[int],
    collapsed_slice_dims: Sequence[int],
    start_index_map: Sequence[int],
    index_vector_dim: int,
    slice_sizes: Sequence[int],
    operand_batching_dims: Sequence[int] = (),
    start_indices_batching_dims: Sequence[int] = (),
) -> np.ndarray:
    """XLA gather (see the module docstring); arguments are XLA's GatherDimensionNumbers."""
    r = operand.ndim
    if len(slice_sizes) != r:
        raise ValueError(f"slice_sizes has {len(slice_sizes)} entries for a rank-{r} operand")
    idx = _index_vectors(indices, index_vector_dim)
    batch_shape = idx.shape[:-1]
    if idx.shape[-1] != len(start_index_map):
        raise ValueError(f"index vectors have {idx.shape[-1]} entries but start_index_map has {len(start_index_map)}")
    nb = len(batch_shape)
    starts: list[np.ndarray | int] = [0] * r
    for k, d in enumerate(start_index_map):
        starts[d] = idx[..., k]
    for od, idim in zip(operand_batching_dims, start_indices_batching_dims):
        starts[od] = np.broadcast_to(_batch_positions(batch_shape, idim, index_vector_dim), batch_shape)
    dropped = set(collapsed_slice_dims) | set(operand_batching_dims)
    window_dims = [d for d in range(r) if d not in dropped]
    if len(window_dims) != len(offset_dims):
        raise ValueError(f"{len(window_dims)} slice dimensions remain but offset_dims has {len(offset_dims)}")
    nw = len(window_dims)
    index: list[np.ndarray] = []
    for d in range(r):
        size = int(slice_sizes[d])
        if not 0 <= size <= operand.shape[d]:
            raise ValueError(f"slice size {size} does not fit operand dimension {d} of size {operand.shape[d]}")
        if d in dropped and size > 1:
            raise ValueError(f"collapsed or batching dimension {d} must have slice size <= 1, not {size}")
        start = np.clip(np.broadcast_to(starts[d], batch_shape), 0, operand.shape[d] - size)
        start = start.reshape(batch_shape + (1,) * nw)
        if d in dropped:
            index.append(start)
        else:
            shape = [1] * (nb + nw)
            shape[nb + window_dims.index(d)] = size
            index.append(start + np.arange(size, dtype=np.int64).reshape(shape))
    if any(int(s) == 0 for s in slice_sizes):
        out = np.zeros(batch_shape + tuple(int(slice_sizes[d]) for d in window_dims), operand.dtype)
    else:
        out = np.asarray(operand[tuple(index)]) if r else np.broadcast_to(operand, batch_shape).copy()
    # Output dimension j is a window dimension when j is in offset_dims, a batch dimension otherwise.
    offsets = sorted(int(d) for d in offset_dims)
    perm, bi = [], 0
    for j in range(nb + nw):
        if j in offsets:
            perm.append(nb + offsets.index(j))
        else:
            perm.append(bi)
            bi += 1
    return out.transpose(perm)


@register("gather")
def _gather(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    if len(args) != 2 or not all(isinstance(a, np.ndarray) for a in args):
        raise EvaluationError(instr, "takes two array operands: operand and start indices")
    operand, indices = args
    assert isinstance(operand, np.ndarray) and isinstance(indices, np.ndarray)
    try:
        return gather(
            operand,
            indices,
            offset_dims=_ints(instr, "offset_dims"),
            collapsed_slice_dims=_ints(instr, "collapsed_slice_dims"),
            start_index_map=_ints(instr, "start_index_map"),
            index_vector_dim=int(instr.attr("index_vector_dim", indices.ndim)),
            slice_sizes=_ints(instr, "slice_sizes"),
            operand_batching_dims=_ints(instr, "operand_batching_dims"),
            start_indices_batching_dims=_ints(instr, "start_indices_batching_dims"),
        )
    except ValueError as exc:
        raise EvaluationError(instr, str(exc)) from None


def scatter_targets(
    operand_shape: tuple[int, ...],
    indices: np.ndarray,
    updates_shape: tuple[int, ...],
    *,
    update_window_dims: Sequence[int],
    inserted_window_dims: Sequence[int],
    scatter_dims_to_operand_dims: Sequence[int],
    index_vector_dim: int,
    input_batching_dims: Sequence[int] = (),
    scatter_indices_batching_dims: Sequence[int] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Where each update element goes.

    Returns:
        ``(targets, valid)``: for every update element in row-major order, its flat (row-major) position in
        the operand, and whether its window lies inside the operand (invalid ones are skipped).
    """
    r = len(operand_shape)
    idx = _index_vectors(indices, index_vector_dim)
    batch_shape = idx.shape[:-1]
    if idx.shape[-1] != len(scatter_dims_to_operand_dims):
        raise ValueError(
            f"index vectors have {idx.shape[-1]} entries but scatter_dims_to_operand_dims has "
            f"{len(scatter_dims_to_operand_dims)}"
        )
    uw = sorted(int(d) for d in update_window_dims)
    scatter_dims = [d for d in range(len(updates_shape)) if d not in uw]
    if tuple(updates_shape[d] for d in scatter_dims) != batch_shape:
        raise ValueError(
            f"update scatter dimensions {[updates_shape[d] for d in scatter_dims]} differ from the indices' "
            f"batch dimensions {list(batch_shape)}"
        )
    dropped = set(inserted_window_dims) | set(input_batching_dims)
    window_operand_dims = [d for d in range(r) if d not in dropped]
    if len(window_operand_dims) != len(uw):
        raise ValueError(f"{len(uw)} update window dimensions for {len(window_operand_dims)} operand window dimensions")
    wsizes = [updates_shape[d] for d in uw]
    for d, s in zip(window_operand_dims, wsizes):
        if s > operand_shape[d]:
            raise ValueError(f"update window size {s} exceeds operand dimension {d} of size {operand_shape[d]}")
    starts: list[np.ndarray] = [np.zeros(batch_shape, np.int64) for _ in range(r)]
    for k, d in enumerate(scatter_dims_to_operand_dims):
        starts[d] = idx[..., k]
    for od, idim in zip(input_batching_dims, scatter_indices_batching_dims):
        starts[od] = np.broadcast_to(_batch_positions(batch_shape, idim, index_vector_dim), batch_shape)
    valid = np.ones(batch_shape, dtype=bool)
    for d in range(r):
        size = wsizes[window_operand_dims.index(d)] if d in window_operand_dims else 1
        valid &= (starts[d] >= 0) & (starts[d] <= operand_shape[d] - size)
    # Flat target = sum_d (start_d + window_d) * stride_d, laid out as (batch..., window...).
    strides = [prod(operand_shape[d + 1 :]) for d in range(r)]
    nb, nw = len(batch_shape), len(uw)
    flat = np.zeros(batch_shape + (1,) * nw, np.int64)
    for d in range(r):
        flat = flat + starts[d].reshape(batch_shape + (1,) * nw) * strides[d]
    for i, d in enumerate(window_operand_dims):
        shape = [1] * (nb + nw)
        shape[nb + i] = wsizes[i]
        flat = flat + np.arange(wsizes[i], dtype=np.int64).reshape(shape) * strides[d]
    flat = np.broadcast_to(flat, batch_shape + tuple(wsizes))
    valid = np.broadcast_to(valid.reshape(batch_shape + (1,) * nw), flat.shape)
    # Back to the updates' own dimension order, then row-major.
    src_axis = {d: i for i, d in enumerate(scatter_dims)} | {d: nb + i for i, d in enumerate(uw)}
    perm = [src_axis[d] for d in range(len(updates_shape))]
    return flat.transpose(perm).reshape(-1), valid.transpose(perm).reshape(-1)


@register("scatter")
def _scatter(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    if len(args) < 3 or len(args) % 2 == 0 or not all(isinstance(a, np.ndarray) for a in args):
        raise EvaluationError(instr, f"takes N operands, the indices and N updates (2N+1 arrays), got {len(args)}")
    n = (len(args) - 1) // 2
    operands = [np.asarray(a) for a in args[:n]]
    indices = args[n]
    updates = [np.asarray(a) for a in args[n + 1 :]]
    assert isinstance(indices, np.ndarray)
    if any(o.shape != operands[0].shape for o in operands) or any(u.shape != updates[0].shape for u in updates):
        raise EvaluationError(instr, "all operands, and all updates, must have the same dimensions")
    try:
        targets, valid = scatter_targets(
            operands[0].shape,
            indices,
            updates[0].shape,
            update_window_dims=_ints(instr, "update_window_dims"),
            inserted_window_dims=_ints(instr, "inserted_window_dims"),
            scatter_dims_to_operand_dims=_ints(instr, "scatter_dims_to_operand_dims"),
            index_vector_dim=int(instr.attr("index_vector_dim", indices.ndim)),
            input_batching_dims=_ints(instr, "input_batching_dims"),
            scatter_indices_batching_dims=_ints(instr, "scatter_indices_batching_dims"),
        )
    except ValueError as exc:
        raise EvaluationError(instr, str(exc)) from None
    outs = [o.copy().reshape(-1) for o in operands]
    comp = computation(ctx, instr, instr.attr("to_apply"))
    apply_ordered(ctx, comp, outs, targets[valid], [u.reshape(-1)[valid] for u in updates])
    res = [o.reshape(operands[0].shape) for o in outs]
    return tuple(res) if n > 1 else res[0]
