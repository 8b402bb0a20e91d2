"""Packing numpy arrays into the exact bytes a layout describes, and back.

``pack`` replays the layout's padded reshape-transposes (:class:`~tpusim.memory.tiling.TilingLevel`) on
numpy views, so a layout whose later levels need no padding costs a single strided copy; ``unpack``
writes through the same views of the destination. Element storage then follows ``E(n)``: sub-byte
values are packed least-significant bits first, wider slots hold the value's bit pattern zero-extended,
and all multi-byte values are little-endian (as on TPU and x86 hosts).
"""

from __future__ import annotations

from math import prod

import numpy as np

from tpusim.errors import TpusimError
from tpusim.memory.shape import AnyShape, Shape
from tpusim.memory.tiling import Geometry, TilingLevel, geometry

__all__ = ["PackError", "pack", "padding_bits", "strided_assign", "unpack"]


class PackError(TpusimError):
    """An array or a buffer that does not match the shape it is packed or unpacked with."""


def padding_bits(shape: Shape, value: float | None = None) -> np.ndarray:
    """The raw bit pattern (a 0-d array of the raw dtype) stored in padding slots.

    ``value`` defaults to the layout's ``padding_value`` (0 unless set).
    """
    et = shape.element_type
    if value is None:
        value = shape.effective_layout.padding_value
    return np.asarray(np.array(value, dtype=et.dtype)).view(et.raw_dtype)


def _as_raw(array: np.ndarray, shape: Shape) -> np.ndarray:
    et = shape.element_type
    if et.dtype is None:
        raise PackError(f"{shape} has no bytes to pack")
    if not isinstance(array, np.ndarray):
        array = np.asarray(array, dtype=et.dtype)
    if array.dtype != et.dtype:
        raise PackError(
            f"array of dtype {array.dtype} cannot be packed as {shape}: convert it first, "
            f"e.g. array.astype({et.dtype.name!r}) (tpusim never converts silently)"
        )
    if array.shape != shape.dimensions:
        raise PackError(f"array of shape {array.shape} does not match {shape} (dimensions {shape.dimensions})")
    return array.view(et.raw_dtype)


_SHORT_AXIS = 8  # an innermost axis at most this long is copied one index at a time (see strided_assign)


def strided_assign(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for same-shaped arrays in tiled order, where the axis numpy would loop over
    innermost is often a sub-tile of 2 or 4 elements.

    NOTE: speed. numpy runs a copy with the destination's smallest-stride axis as its inner loop; for a (2,1)
    or (4,1) sub-tile that loop is 2 or 4 elements long. Copying one index of that axis at a time makes the
    next axis (a tile's 128 lanes) the inner loop: 5-6x faster on a bf16 (8,128)(2,1) array.
    """
    axes = [a for a in range(dst.ndim) if dst.shape[a] > 1]
    if dst.size >= 4096 and len(axes) > 1:
        inner = min(axes, key=lambda a: abs(dst.strides[a]))
        k = dst.shape[inner]
        if k <= _SHORT_AXIS:
            d, s = np.moveaxis(dst, inner, 0), np.moveaxis(src, inner, 0)
            for i in range(k):
                d[i] = s[i]
            return
    dst[...] = src


def _pad_to(a: np.ndarray, dims: tuple[int, ...], fill: np.ndarray) -> np.ndarray:
    if a.shape == dims:
        return a
    out = np.empty(dims, dtype=a.dtype)
    out[...] = fill
    out[tuple(slice(0, d) for d in a.shape)] = a
    return out


def _level_forward(a: np.ndarray, lvl: TilingLevel, fill: np.ndarray) -> np.ndarray:
    a = a.reshape((1,) * lvl.prepended + a.shape)
    if lvl.merges:
        a = a.reshape(lvl.combined_dims)
    a = _pad_to(a, lvl.padded_dims, fill)
    return a.reshape(lvl.split_dims).transpose(lvl.permutation)


def pack(
    array: np.ndarray, shape: Shape, padding_value: float | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """The bytes of ``array`` stored in ``shape``'s layout.

    Args:
        array: values with exactly the shape's dimensions and numpy dtype.
        shape: an array shape; its layout (default: major-to-minor) decides the bytes.
        padding_value: value written into every padding slot; defaults to the layout's ``padding_value``.
        out: a 1-D uint8 array of ``shape.byte_size`` bytes to write the bytes into (e.g. a memory's view),
            instead of a new array.

    Returns:
        A 1-D uint8 array of ``shape.byte_size`` bytes (``out`` when given).
    """
    geo = geometry(shape)
    raw = _as_raw(array, shape)
    if out is not None and (out.dtype != np.uint8 or out.shape != (geo.byte_size,)):
        raise PackError(f"out: {out.dtype}[{out.size}] is not the {geo.byte_size} bytes of {shape}")
    fill = padding_bits(shape, padding_value)
    a = raw.transpose(geo.physical_permutation)
    a = _pad_to(a, geo.physical_dims, fill)
    for lvl in geo.levels:
        a = _level_forward(a, lvl, fill)
    natural = geo.element_bits == 8 * raw.itemsize
    direct = natural and not geo.prefix_bytes and a.size == geo.element_slots
    if out is not None and direct and not np.may_share_memory(raw, out):  # (else: via a copy, below)
        strided_assign(out.view(raw.dtype).reshape(a.shape), a)  # straight into the destination
        return out
    slots = np.empty(a.shape, a.dtype)
    strided_assign(slots, a)
    slots = slots.reshape(-1)
    if slots.size < geo.element_slots:
        slots = np.concatenate([slots, np.full(geo.element_slots - slots.size, fill, dtype=slots.dtype)])
    data = _encode_slots(slots, geo)
    if geo.prefix_bytes:
        data = np.concatenate([_metadata_prefix(shape, geo.prefix_bytes), data])
    if out is None:
        return data
    out[...] = data
    return out


def _metadata_prefix(shape: Shape, nbytes: int) -> np.ndarray:
    # NOTE: tpusim's convention for M(n): the dimension sizes as little-endian int32, zero-filled.
    prefix = np.zeros(nbytes, np.uint8)
    sizes = np.asarray(shape.dimensions, dtype="<i4").view(np.uint8)[:nbytes]
    prefix[: sizes.size] = sizes
    return prefix


def _encode_slots(slots: np.ndarray, geo: Geometry) -> np.ndarray:
    """Raw per-element bit patterns -> bytes, honouring the slot width ``E(n)``."""
    bits = geo.element_bits
    natural_bytes = slots.dtype.itemsize
    if bits == natural_bytes * 8:
        return slots.view(np.uint8).reshape(-1)
    if bits % 8 == 0:
        out = np.zeros((slots.size, bits // 8), np.uint8)
        out[:, :natural_bytes] = slots.view(np.uint8).reshape(slots.size, natural_bytes)
        return out.reshape(-1)
    per_byte = 8 // bits
    values: np.ndarray = slots.view(np.uint8) & np.uint8((1 << bits) - 1)
    total = -(-values.size // per_byte) * per_byte
    if total != values.size:
        values = np.concatenate([values, np.zeros(total - values.size, np.uint8)])
    groups = values.reshape(-1, per_byte)
    packed = np.zeros(groups.shape[0], np.uint8)
    for i in range(per_byte):
        packed |= groups[:, i] << np.uint8(i * bits)
    return packed


def _decode_slots(data: np.ndarray, geo: Geometry, raw_dtype: np.dtype, value_bits: int) -> np.ndarray:
    """Bytes -> raw per-element bit patterns (length ``element_slots``); ``value_bits`` masks sub-byte values."""
    bits = geo.element_bits
    n = geo.element_slots
    natural_bytes = raw_dtype.itemsize
    if bits == natural_bytes * 8:
        return data.view(raw_dtype)
    if bits % 8 == 0:
        rows = data.reshape(n, bits // 8)[:, :natural_bytes]
        return np.ascontiguousarray(rows).view(raw_dtype).reshape(n)
    per_byte = 8 // bits
    shifts = (np.arange(per_byte, dtype=np.uint8) * bits).astype(np.uint8)
    values = (data[:, None] >> shifts) & np.uint8((1 << bits) - 1)
    values = values.reshape(-1)[:n]
    if value_bits < bits:
        values = values & np.uint8((1 << value_bits) - 1)  # ml_dtypes holds sub-byte values in the low bits
    return values.astype(raw_dtype, copy=False)


def unpack(buffer: bytes | bytearray | memoryview | np.ndarray, shape: AnyShape) -> np.ndarray:
    """The array stored in ``buffer`` under ``shape``'s layout (the inverse of :func:`pack`).

    Padding bytes are ignored. Raises :class:`PackError` if the buffer is shorter than the shape's byte size.
    """
    geo = geometry(shape)  # type: ignore[arg-type]
    assert isinstance(shape, Shape)
    et = shape.element_type
    if et.dtype is None:
        raise PackError(f"{shape} holds no values to unpack")
    data = np.frombuffer(buffer, dtype=np.uint8) if not isinstance(buffer, np.ndarray) else buffer.view(np.uint8)
    data = data.reshape(-1)
    if data.size < geo.byte_size:
        raise PackError(f"buffer of {data.size} bytes is too small for {shape} ({geo.byte_size} bytes)")
    body = data[geo.prefix_bytes : geo.byte_size]
    slots = _decode_slots(body, geo, et.raw_dtype, max(1, et.bits))[: prod(geo.tiled_dims)]
    tiled = slots.reshape(geo.tiled_dims)
    physical = _unpack_through_views(tiled, geo) if _views_suffice(geo) else _unpack_level_by_level(tiled, geo)
    if shape.rank:  # (indexing a 0-d array with () would give a numpy scalar, not an array)
        physical = physical[tuple(slice(0, shape.dimensions[p]) for p in geo.physical_permutation)]
    inverse = np.argsort(geo.physical_permutation)
    out = physical.transpose(inverse)
    if not (out.flags.c_contiguous and out.shape and not np.may_share_memory(out, data)):
        out = out.copy(order="C")  # (a new array, never a view of the buffer; 0-d stays 0-d)
    return out.view(et.dtype)


def _views_suffice(geo: Geometry) -> bool:
    """True when every level after the first only splits and transposes (no merge, no padding)."""
    return all(not lvl.merges and not lvl.needs_padding for lvl in geo.levels[1:])


def _unpack_through_views(tiled: np.ndarray, geo: Geometry) -> np.ndarray:
    """Copy ``tiled`` into a contiguous array of the first level's padded shape through forward views."""
    if not geo.levels:
        return tiled.reshape(geo.physical_dims)
    first = geo.levels[0]
    dest = np.empty(first.padded_dims, dtype=tiled.dtype)
    view = dest.reshape(first.split_dims).transpose(first.permutation)
    for lvl in geo.levels[1:]:
        view = view.reshape((1,) * lvl.prepended + view.shape).reshape(lvl.split_dims).transpose(lvl.permutation)
    if not np.may_share_memory(view, dest):  # numpy copied instead of viewing: take the general route
        return _unpack_level_by_level(tiled, geo)
    strided_assign(view, tiled)
    return _undo_first_merge(dest[tuple(slice(0, d) for d in first.combined_dims)], first)


def _undo_first_merge(a: np.ndarray, lvl: TilingLevel) -> np.ndarray:
    a = a.reshape((1,) * lvl.prepended + lvl.input_dims) if lvl.merges else a
    return a.reshape(lvl.input_dims)


def _unpack_level_by_level(tiled: np.ndarray, geo: Geometry) -> np.ndarray:
    a = tiled
    for lvl in reversed(geo.levels):
        a = a.transpose(np.argsort(lvl.permutation)).reshape(lvl.padded_dims)
        a = a[tuple(slice(0, d) for d in lvl.combined_dims)]
        a = _undo_first_merge(a, lvl)
    return a
