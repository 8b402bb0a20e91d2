"""When two shapes hold their elements at the same bytes: reshapes and bitcasts that move no byte.

A reshape (row-major meaning) or a bitcast (the meaning the layouts' dimension orders give) between two
tiled layouts is free when reading the first array's bytes as the second gives what the operation means.
Buffer assignment then lets the two values share one buffer, and the lowering emits nothing.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from tpusim.memory.digits import normal_form
from tpusim.memory.shape import Layout, Shape
from tpusim.memory.tiling import geometry

__all__ = [
    "MEANING_CHECK_ELEMENTS",
    "LayoutViewError",
    "bitcast_is_reshape",
    "bytes_agree",
    "bytes_agree_by_elements",
    "bytes_in_place",
    "free_transpose",
    "merged_shape",
    "physical_is_logical",
    "untiled",
    "view_shape",
]

MEANING_CHECK_ELEMENTS = 1 << 22
"""Shapes whose layouts have no digit form (``*`` merges) up to this many elements have their byte meaning
compared element by element."""


class LayoutViewError(ValueError):
    """A layout no byte-identical view describes."""


def view_shape(shape: Shape, order: tuple[int | None, ...]) -> Shape:
    """``shape`` seen with logical dimension ``i`` = dimension ``order[i]`` (None: a new size-1 dimension),
    describing the same bytes.

    Raises:
        LayoutViewError: the layout has per-dimension parts a view cannot carry (old-style padding, sparse
            levels, split configs, dynamic dimensions).
    """
    present = [o for o in order if o is not None]
    if sorted(present) != list(range(shape.rank)):
        raise ValueError(f"order {order} is not a permutation of the {shape.rank} dimensions of {shape}")
    layout = shape.effective_layout
    if layout.padded_dimensions is not None or layout.dim_level_types or layout.split_configs or any(shape.dynamic):
        raise LayoutViewError(f"no byte-identical view of {shape}")
    if order == tuple(range(shape.rank)):
        return shape.with_layout(layout)
    position = {o: i for i, o in enumerate(order) if o is not None}
    units = [i for i, o in enumerate(order) if o is None]
    minor_to_major = tuple(position[d] for d in layout.minor_to_major) + tuple(reversed(units))
    dims = tuple(1 if o is None else shape.dimensions[o] for o in order)
    return Shape(shape.element_type, dims, layout=replace(layout, minor_to_major=minor_to_major))


def merged_shape(shape: Shape, major: int, minor: int) -> Shape | None:
    """``shape`` with logical dimension ``major`` folded into ``minor`` (``minor``'s size multiplied by
    ``major``'s, ``major`` removed, later dimensions renumbered), describing the same bytes; None when no such
    shape does.

    It does when ``major`` is the next physical dimension out from ``minor`` (``minor_to_major`` lists them
    side by side), no tile cuts ``major`` and the tile cutting ``minor`` (if any) divides its size: the
    elements of ``minor``'s successive indices of ``major`` then follow one another in whole tiles, as
    one dimension of the product of their sizes would. ``bf16[8,64,512]{2,1,0:T(8,128)(2,1)}`` folding 0
    into 1 is ``bf16[512,512]{1,0:T(8,128)(2,1)}``; with 60 rows instead of 64 each head's last tile would be
    padded, and no shape of 480 rows has that padding. A ``major`` of size 1 that no tile level reaches folds
    into any ``minor``: it is dropped (an epilogue's bias seen as ``[1,1,N]`` folds with the result's rows).
    """
    layout = shape.effective_layout
    if layout.padded_dimensions is not None or layout.dim_level_types or layout.split_configs or any(shape.dynamic):
        return None
    order = list(layout.minor_to_major)
    if major == minor:
        return None
    physical = list(reversed(order))  # major to minor
    reach = max((len(level.dimensions) for level in layout.tiles), default=0)
    combined = any(t <= 0 for level in layout.tiles for t in level.dimensions)
    if shape.dimensions[major] == 1 and physical.index(major) < shape.rank - reach and not combined:
        return _without(shape, major)  # a size-1 dimension outside every tile: nothing to fold, wherever it is
    if order.index(major) != order.index(minor) + 1:
        return None
    tile = layout.tiles[0].dimensions if layout.tiles else ()
    if any(t <= 0 for level in layout.tiles for t in level.dimensions) or any(
        len(level.dimensions) > len(tile) for level in layout.tiles
    ):  # combined dimensions, or later levels reaching past the first tile: not this simple picture
        return None
    covered = shape.rank - len(tile)  # the first physical position a tile dimension applies to

    def tile_of(d: int) -> int:
        at = physical.index(d) - covered
        return tile[at] if at >= 0 else 1

    if physical.index(major) >= covered or shape.dimensions[minor] % tile_of(minor):
        return None
    return _without(shape, major, minor)


def _without(shape: Shape, major: int, minor: int | None = None) -> Shape:
    """``shape`` without dimension ``major``, its size multiplied into ``minor``'s (if any)."""
    layout = shape.effective_layout
    dims = list(shape.dimensions)
    if minor is not None:
        dims[minor] *= dims[major]
    del dims[major]
    renumber = {d: d - (d > major) for d in range(shape.rank) if d != major}
    minor_to_major = tuple(renumber[d] for d in layout.minor_to_major if d != major)
    return Shape(shape.element_type, tuple(dims), layout=replace(layout, minor_to_major=minor_to_major))


def free_transpose(src: Shape, permutation: tuple[int, ...], dst: Shape) -> bool:
    """True when ``transpose(src, permutation)`` stored as ``dst`` has every element at the byte it has in
    ``src``: the permuted view of ``src`` is ``dst`` (dimensions and layout), a bitcast of the buffer."""
    try:
        seen = view_shape(src, permutation)
    except LayoutViewError:
        return False
    return seen.dimensions == dst.dimensions and seen.effective_layout == dst.effective_layout


def untiled(shape: Shape, row_major: bool = False) -> Shape:
    """``shape`` with only its dimension order (or the row-major order): the layout that defines what a
    bitcast (or a reshape) means when no tiles are involved."""
    order = Layout.default(shape.rank).minor_to_major if row_major else shape.effective_layout.minor_to_major
    return shape.with_layout(Layout(order))


@lru_cache(maxsize=1024)
def bytes_agree(src: Shape, dst: Shape, row_major: bool = False) -> bool | None:
    """Whether reading ``src``'s tiled bytes as ``dst`` gives what the operation means: a bitcast of the
    untiled layouts (elements read in each shape's physical order), or with ``row_major`` a reshape
    (elements read in row-major order). Decided on the layouts' digit forms (:mod:`tpusim.memory.digits`)
    at any size. Layouts with ``*`` merges have no digit form; they are compared element by element up to
    :data:`MEANING_CHECK_ELEMENTS` elements, None (unknown) above."""
    gs, gd = geometry(src), geometry(dst)
    if gs.element_bits != gd.element_bits or src.byte_size != dst.byte_size:
        return False
    if src.element_count == 0 or dst.element_count == 0:
        return src.element_count == dst.element_count
    fs = normal_form(src, _reading_order(src, row_major))
    fd = normal_form(dst, _reading_order(dst, row_major))
    if fs is not None and fd is not None:
        return fs == fd
    if dst.element_count > MEANING_CHECK_ELEMENTS:
        return None
    return bytes_agree_by_elements(src, dst, row_major)


def physical_is_logical(shape: Shape) -> bool:
    """Whether ``shape``'s layout orders its dimensions as its logical (row-major) order does, the dimensions
    of size 1 aside: a bitcast between two such shapes means a row-major reshape."""
    order = [d for d in reversed(shape.effective_layout.minor_to_major) if shape.dimensions[d] != 1]
    return order == sorted(order)


def bitcast_is_reshape(src: Shape, dst: Shape) -> bool:
    """Whether a bitcast from ``src`` to ``dst``, laid out as the HLO text says, means a row-major reshape (so
    that a kernel may compute it as one). When the text tiles both layouts (XLA:TPU's compiled modules) the
    bitcast means its operand's bytes, read as ``dst``: a reshape when those bytes hold the elements in
    row-major order (:func:`bytes_agree`); ``s32[8,256]{1,0:T(8,128)}`` to ``s32[1,2,8,128]{3,2,1,0:T(8,128)}``
    is not one (column block ``b`` is tile ``b``). Otherwise it reads the elements in each layout's physical
    order: a reshape when both orders are the logical ones (:func:`physical_is_logical`)."""
    if src.has_tiles and dst.has_tiles:
        return bytes_agree(src, dst, row_major=True) is True
    return physical_is_logical(src) and physical_is_logical(dst)


def bytes_in_place(src: Shape, dst: Shape) -> bool:
    """Whether a bitcast from ``src`` to ``dst`` is its operand's bytes where they are: reading them as ``dst``
    gives the bitcast of the untiled layouts (:func:`bytes_agree`), or the untiled arrays differ in size while
    the tiled ones do not, so that only the tiled bytes give the bitcast a meaning (XLA:TPU's bitcast to a
    tile-padded shape, ``f32[501]{0:T(512)}`` to ``f32[512]{0:T(512)}``, whose last 11 elements are the
    operand's padding: XLA's rule, the same physical size, and the reference interpreter's meaning)."""
    if geometry(src).element_bits != geometry(dst).element_bits or src.byte_size != dst.byte_size:
        return False
    return untiled(src).byte_size != untiled(dst).byte_size or bytes_agree(src, dst) is True


def bytes_agree_by_elements(src: Shape, dst: Shape, row_major: bool = False) -> bool:
    """:func:`bytes_agree` element by element, at any size (memory and time grow with the element count):
    every element of ``dst`` read from ``src``'s bytes is the element the operation means. The mechanism
    for layouts with ``*`` merges, and the oracle the digit forms are tested against."""
    gs, gd = geometry(src), geometry(dst)
    if gs.element_bits != gd.element_bits or src.byte_size != dst.byte_size:
        return False
    slot = geometry(untiled(dst, row_major)).linear_map().reshape(-1)  # where each dst element sits untiled
    source_index, _ = geometry(untiled(src, row_major)).logical_index(slot)  # the src element at that slot
    return bool(np.array_equal(gs.linear_index(source_index), gd.linear_map().reshape(-1)))


def _reading_order(shape: Shape, row_major: bool) -> tuple[int, ...]:
    """The order a reshape (row-major) or a bitcast (physical order) reads ``shape``'s elements in."""
    return tuple(range(shape.rank)) if row_major else tuple(reversed(shape.effective_layout.minor_to_major))
