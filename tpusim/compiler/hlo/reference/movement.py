"""Data movement: iota, broadcast, reshape, transpose, slice, dynamic-slice, dynamic-update-slice, pad,
concatenate, reverse, copy, bitcast, and get/set-dimension-size.

Semantics from XLA's operation semantics (https://openxla.org/xla/operation_semantics) and, where that
document is silent, XLA CPU:

* dynamic-slice and dynamic-update-slice clamp each start index to ``[0, dim - size]`` (operation
  semantics, DynamicSlice), reading unsigned indices as unsigned.
* pad: ``padding`` low/high may be negative (crop); interior padding goes between elements only.
* broadcast: ``dimensions[i]`` is the output dimension operand dimension i maps to (any order).
* bitcast reinterprets the *physical bytes*: the operand is packed in its layout and the bytes are read
  back in the result's layout (:func:`tpusim.memory.pack` / :func:`~tpusim.memory.unpack`), so
  ``f32[2,3]{0,1} -> f32[3,2]{1,0}`` is a transpose, not a row-major reshape.
* get-dimension-size returns the size set by set-dimension-size on the same value, else the static size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value, register
from tpusim.memory import Layout, PackError, Shape, element_type_of_dtype, pack, unpack
from tpusim.semantics.convert import convert

__all__: list[str] = []


def _dims(instr: Instruction) -> tuple[int, ...]:
    return tuple(instr.attr("dimensions", ()) or ())


def _out_dims(instr: Instruction) -> tuple[int, ...]:
    return instr.array_shape.dimensions


def _copy(value: Value) -> Value:
    if isinstance(value, tuple):
        return tuple(_copy(v) for v in value)
    return value.copy() if isinstance(value, np.ndarray) else value


@register("copy")
def _copy_op(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return _copy(args[0])  # a layout change leaves the logical values as they are


@register("iota")
def _iota(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    shape = instr.array_shape
    d = instr.attr("iota_dimension", 0)
    if not 0 <= d < max(shape.rank, 1):
        raise EvaluationError(instr, f"iota_dimension {d} is out of range for {shape}")
    if shape.rank == 0:
        return convert(np.zeros((), np.int64), shape.element_type)
    counts = np.arange(shape.dimensions[d], dtype=np.int64)
    view = counts.reshape([-1 if i == d else 1 for i in range(shape.rank)])
    values = convert(np.broadcast_to(view, shape.dimensions), shape.element_type)
    return np.asarray(values, order="C")


@register("broadcast")
def _broadcast(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    x = args[0]
    out = _out_dims(instr)
    dims = _dims(instr)
    if len(dims) != x.ndim:
        raise EvaluationError(instr, f"dimensions={list(dims)} must name one output dimension per operand dimension")
    order = np.argsort(dims, kind="stable")
    x = np.transpose(x, order)
    view = [1] * len(out)
    for i, d in enumerate(sorted(dims)):
        if x.shape[i] != out[d]:
            raise EvaluationError(instr, f"operand dimension of size {x.shape[i]} cannot become output dimension {d}")
        view[d] = x.shape[i]
    return np.broadcast_to(x.reshape(view), out).copy()


@register("reshape")
def _reshape(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return args[0].reshape(_out_dims(instr))


@register("transpose")
def _transpose(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return np.asarray(np.transpose(args[0], _dims(instr)), order="C")


@register("reverse")
def _reverse(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return np.flip(args[0], axis=_dims(instr)).copy()


@register("slice")
def _slice(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    dims = instr.attr("slice", ())
    return args[0][tuple(slice(d.start, d.limit, d.stride) for d in dims)].copy()


@register("concatenate")
def _concatenate(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    (axis,) = _dims(instr)
    return np.concatenate(args, axis=axis)


def _start_indices(instr: Instruction, args: Sequence[Any], rank: int) -> list[int]:
    """Start indices given as one scalar operand per dimension (or XLA's old single 1-D operand)."""
    if len(args) == 1 and np.ndim(args[0]) == 1:
        return [int(v) for v in np.asarray(args[0]).tolist()]
    if len(args) != rank:
        raise EvaluationError(instr, f"needs {rank} start indices, got {len(args)}")
    return [int(np.asarray(a)) for a in args]


@register("dynamic-slice")
def _dynamic_slice(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    x = args[0]
    sizes = tuple(instr.attr("dynamic_slice_sizes") or _out_dims(instr))
    starts = _start_indices(instr, args[1:], x.ndim)
    index = []
    for start, size, dim in zip(starts, sizes, x.shape):
        s = min(max(start, 0), dim - size)  # XLA clamps so the slice stays inside the operand
        index.append(slice(s, s + size))
    return np.array(x[tuple(index)])  # (a copy; indexing a 0-d array with () would give a scalar)


@register("dynamic-update-slice")
def _dynamic_update_slice(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    x, update = args[0], args[1]
    if update.dtype != x.dtype:  # mixed precision: the update is stored in the operand's type (XLA convert)
        update = convert(update, element_type_of_dtype(x.dtype))
    starts = _start_indices(instr, args[2:], x.ndim)
    out = x.copy()
    index = []
    for start, size, dim in zip(starts, update.shape, x.shape):
        s = min(max(start, 0), dim - size)
        index.append(slice(s, s + size))
    out[tuple(index)] = update
    return out


@register("pad")
def _pad(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    x, value = args
    pads = instr.attr("padding", ())
    if len(pads) != x.ndim:
        raise EvaluationError(instr, f"padding has {len(pads)} dimensions, the operand {x.ndim}")
    result = instr.shape
    if isinstance(result, Shape) and result.element_type.is_float and x.dtype != result.element_type.dtype:
        # mixed precision: the operand and the value move converted to the result type (f32 pad(bf16 x, f32 0.1)
        # pads with 0.1, not with its bf16 rounding)
        x, value = convert(x, result.element_type), convert(value, result.element_type)
    out_dims = _out_dims(instr)
    out = np.full(out_dims, value, dtype=x.dtype)
    src, dst = [], []
    for p, d, n in zip(pads, x.shape, out_dims):
        step = p.interior + 1
        # operand element i lands at p.low + i*step; keep those inside [0, n)
        first = 0 if p.low >= 0 else (-p.low + step - 1) // step
        last = max(0, min(d, (n - 1 - p.low) // step + 1))
        if last <= first:
            return out
        src.append(slice(first, last))
        dst.append(slice(p.low + first * step, p.low + (last - 1) * step + 1, step))
    out[tuple(dst)] = x[tuple(src)]
    return out


@register("bitcast")
def _bitcast(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    x = args[0]
    src = ctx.operand_shape(instr, 0)
    dst = instr.array_shape
    if not isinstance(src, Shape):
        raise EvaluationError(instr, f"cannot bitcast a tuple {src}")
    src_layout, dst_layout = src.effective_layout, dst.effective_layout
    if src.element_type == dst.element_type and _row_major(src_layout) and _row_major(dst_layout):
        return x.reshape(dst.dimensions)  # both layouts are plain major-to-minor: the bytes are a reshape
    try:
        if src.byte_size != dst.byte_size:
            raise EvaluationError(
                instr, f"bitcast from {src} ({src.byte_size} bytes) to {dst} ({dst.byte_size} bytes) changes the size"
            )
        return unpack(pack(x, src), dst)
    except PackError as exc:
        raise EvaluationError(instr, str(exc)) from None


def _row_major(layout: Layout) -> bool:
    rank = len(layout.minor_to_major)
    return (
        layout.minor_to_major == tuple(range(rank - 1, -1, -1))
        and not layout.tiles
        and layout.element_size_bits == 0
        and layout.padded_dimensions is None
        and layout.dynamic_shape_metadata_prefix_bytes == 0
        and layout.tail_padding_alignment == 1
    )


# ---------------------------------------------------------------------------------------------
# Dynamic dimension sizes
# ---------------------------------------------------------------------------------------------
_DYNAMIC_SIZES = "_tpusim_dynamic_sizes"


def _size_table(ctx: EvalContext) -> dict[int, tuple[np.ndarray, list[int]]]:
    table = getattr(ctx, _DYNAMIC_SIZES, None)
    if table is None:
        table = {}
        setattr(ctx, _DYNAMIC_SIZES, table)
    return table


@register("set-dimension-size")
def _set_dimension_size(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    x, size = args
    (d,) = _dims(instr)
    n = int(np.asarray(size))
    if not 0 <= n <= x.shape[d]:
        raise EvaluationError(instr, f"dynamic size {n} is outside [0, {x.shape[d]}] of dimension {d}")
    out = x.copy()
    table = _size_table(ctx)
    sizes = list(table[id(x)][1]) if id(x) in table and table[id(x)][0] is x else list(x.shape)
    sizes[d] = n
    table[id(out)] = (out, sizes)  # the array is kept alive by the table, so its id is not reused
    return out


@register("get-dimension-size")
def _get_dimension_size(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    x = args[0]
    (d,) = _dims(instr)
    entry = _size_table(ctx).get(id(x))
    n = entry[1][d] if entry is not None and entry[0] is x else x.shape[d]
    return np.array(n, dtype=instr.array_shape.element_type.dtype)
