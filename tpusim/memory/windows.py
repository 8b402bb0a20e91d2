"""Where a window of an array lies in memory: its element slots, its strided form, the bytes it spans and
the vector registers it occupies. Pure functions of a shape (with its layout) and a window's offsets and
sizes, shared by the compiler (which checks that two cores' windows do not overlap) and the device model.
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil, prod

import numpy as np

from tpusim.memory.shape import Shape
from tpusim.memory.tiling import Geometry, axis_slots, geometry, is_separable, tile_periods

__all__ = ["window_extent", "window_slots", "window_strides", "window_vregs"]


# ---------------------------------------------------------------------------------------------------------
@lru_cache(maxsize=512)
def window_slots(shape: Shape, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> np.ndarray:
    """Element slots (``Geometry.linear_index``) of a window, in row-major order of its sizes (read-only).

    NOTE: speed. For layouts without ``*`` merges a slot is a sum of one term per dimension
    (:func:`~tpusim.memory.tiling.is_separable`): the window is the outer sum of ``rank`` short vectors, not
    ``prod(sizes)`` evaluations of the index map."""
    count = prod(sizes)  # a rank-0 window (a scalar) holds one element
    geo = geometry(shape)
    terms = _axis_terms(geo, offsets, sizes)
    if terms is not None:
        slots = terms[0]
        for t in terms[1:]:
            slots = np.add.outer(slots, t)
        slots = np.ascontiguousarray(slots, np.int64).reshape(count)
    else:
        grids = np.indices(sizes, dtype=np.int64).reshape(len(sizes), count)
        grids += np.asarray(offsets, np.int64).reshape(-1, 1)
        slots = geo.linear_index(grids.T).reshape(count)
    slots.setflags(write=False)
    return slots


@lru_cache(maxsize=512)
def window_strides(
    shape: Shape, offsets: tuple[int, ...], sizes: tuple[int, ...]
) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
    """A window as a strided view of the element slots: ``(first slot, dims, strides in slots)`` such that
    the view, read in row-major order, holds the window's elements in row-major order; None when the slots
    are not such a view (an unseparable layout, a window cutting a tile unevenly, padding in between).

    NOTE: speed. In a tiled layout each coordinate's slot term is a mixed-radix number (tile index, row
    pair, row within pair, ...), so a tile-aligned window is an ordinary numpy view: copying it costs a
    strided copy instead of a gather through ``prod(sizes)`` indices."""
    terms = _axis_terms(geometry(shape), offsets, sizes)
    if terms is None:
        return None
    dims: list[int] = []
    strides: list[int] = []
    for t in terms:
        digits = _mixed_radix(t - t[0])
        if digits is None:
            return None
        dims += [r for r, _ in digits]
        strides += [g for _, g in digits]
    return sum(int(t[0]) for t in terms), tuple(dims), tuple(strides)


def _mixed_radix(t: np.ndarray) -> list[tuple[int, int]] | None:
    """``[(radix, stride), ...]`` (outermost first, strides > 0) with ``t[i] = sum(digit_k(i) * stride_k)``
    for the mixed-radix digits of ``i``, or None when ``t`` (with ``t[0] == 0``) has no such form."""
    n = t.size
    digits: list[tuple[int, int]] = []
    block = 1
    while block < n:
        g = int(t[block])
        if g <= 0:
            return None
        steps = t[::block]
        bad = np.flatnonzero(steps != np.arange(steps.size) * g)
        r = int(bad[0]) if bad.size else steps.size
        if n % (block * r):
            return None
        digits.append((r, g))
        block *= r
    i = np.arange(n)
    rebuilt = np.zeros(n, np.int64)
    block = 1
    for r, g in digits:
        rebuilt += (i // block % r) * g
        block *= r
    if not np.array_equal(rebuilt, t):
        return None
    return digits[::-1]


_WHOLE_AXIS = 1 << 16
"""Dimensions up to this many coordinates keep every coordinate's slot term; a longer one keeps one tile
period of them and the slot shift per period, so that nothing as long as the dimension is built (a 64 MiB f32
vector has 16 M coordinates: 0.9 s and 128 MB for an array of terms, used only for its extremes)."""


class _AxisTerms:
    """The slot terms of one dimension's coordinates ``c``: ``base[c % period] + (c // period) * step``."""

    __slots__ = ("base", "period", "step")

    def __init__(self, base: np.ndarray, period: int, step: int) -> None:
        self.base, self.period, self.step = base, period, step

    def range(self, lo: int, hi: int) -> np.ndarray:
        """The terms of coordinates ``lo .. hi - 1``."""
        if hi <= self.period:
            return self.base[lo:hi]
        q, r = np.divmod(np.arange(lo, hi, dtype=np.int64), self.period)
        return self.base[r] + q * self.step

    def extremes(self, lo: int, hi: int) -> tuple[int, int]:
        """The smallest and largest term of coordinates ``lo .. hi - 1`` (``hi > lo``). Past two periods,
        with a non-negative step, they lie in the first and last partial periods or the whole periods next
        to them."""
        p, g, b = self.period, self.step, self.base
        if hi - lo <= 2 * p or g < 0:
            t = self.range(lo, hi)
            return int(t.min()), int(t.max())
        q0, r0 = divmod(lo, p)
        q1, r1 = divmod(hi - 1, p)
        low = min(int(b[r0:].min()) + q0 * g, int(b.min()) + (q0 + 1) * g)
        high = max(int(b[: r1 + 1].max()) + q1 * g, int(b.max()) + (q1 - 1) * g)
        return low, high


def _axes(geo: Geometry, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[_AxisTerms, ...] | None:
    """Every dimension's slot terms for a non-empty window inside the array (None when the layout is not
    separable, or the window reaches past the array: left to the index map)."""
    if not sizes:
        return None
    axes = _shape_axes(geo.shape)
    if axes is None or any(o < 0 or o + s > n for n, o, s in zip(geo.shape.dimensions, offsets, sizes)):
        return None
    return axes


def _axis_terms(geo: Geometry, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> list[np.ndarray] | None:
    """Per dimension, the slot terms of the window's coordinates (None when the layout is not separable)."""
    axes = _axes(geo, offsets, sizes)
    if axes is None:
        return None
    return [a.range(o, o + s) for a, o, s in zip(axes, offsets, sizes)]


@lru_cache(maxsize=1024)
def _shape_axes(shape: Shape) -> tuple[_AxisTerms, ...] | None:
    """The slot terms of every dimension (:func:`~tpusim.memory.tiling.axis_slots`), or None when the layout
    is not separable. A dimension longer than ``_WHOLE_AXIS`` is kept as one period of the first tiling
    level's tile (:func:`~tpusim.memory.tiling.tile_periods`) when its first ``_WHOLE_AXIS`` terms shift by
    one constant per period (as a tiling's quotient and remainder make them), else whole."""
    geo = geometry(shape)
    if not is_separable(geo):
        return None
    periods = tile_periods(geo)
    axes = []
    for d, n in enumerate(shape.dimensions):
        t = axis_slots(geo, d, np.arange(min(n, _WHOLE_AXIS), dtype=np.int64))
        p = periods[d]
        if n > _WHOLE_AXIS and 4 * p <= _WHOLE_AXIS:
            step = int(t[p] - t[0])
            if np.all(t[p:] - t[:-p] == step):
                axes.append(_AxisTerms(_frozen(t[:p].copy()), p, step))
                continue
            t = axis_slots(geo, d, np.arange(n, dtype=np.int64))
        axes.append(_AxisTerms(_frozen(t), n, 0))
    return tuple(axes)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@lru_cache(maxsize=4096)
def window_extent(shape: Shape, offsets: tuple[int, ...] | None, sizes: tuple[int, ...] | None) -> tuple[int, int]:
    """Byte range ``[lo, hi)`` relative to the array's address that a window (None: the array) touches."""
    geo = geometry(shape)
    if offsets is None or sizes is None or prod(sizes) == 0:
        return (0, geo.byte_size) if offsets is None else (0, 0)
    axes = _axes(geo, offsets, sizes)
    if axes is not None:  # the extremes of a sum of independent terms are the sums of their extremes
        ends = [a.extremes(o, o + s) for a, o, s in zip(axes, offsets, sizes)]
        first = sum(lo for lo, _ in ends)
        last = sum(hi for _, hi in ends)
    else:
        slots = window_slots(shape, offsets, sizes)
        first, last = int(slots.min()), int(slots.max())
    bits = geo.element_bits
    lo = geo.prefix_bytes + first * bits // 8
    hi = geo.prefix_bytes + ceil((last + 1) * bits / 8)
    return lo, hi


@lru_cache(maxsize=4096)
def window_vregs(shape: Shape, offsets: tuple[int, ...] | None, sizes: tuple[int, ...] | None, vreg_bytes: int) -> int:
    """Vector registers a block occupies: ``ceil(bytes / vreg_bytes)`` for a whole array (padding counts),
    the distinct vreg-sized pieces (aligned to the array's start) a window touches otherwise."""
    geo = geometry(shape)
    if offsets is None or sizes is None:
        return max(1, ceil(geo.byte_size / vreg_bytes)) if geo.byte_size else 0
    if prod(sizes) == 0:
        return 0
    terms = _axis_terms(geo, offsets, sizes)
    pieces = None if terms is None else _pieces_by_axis(terms, geo.element_bits, geo.prefix_bytes, vreg_bytes)
    if pieces is not None:
        return pieces
    slots = window_slots(shape, offsets, sizes)
    bits = geo.element_bits
    first = (geo.prefix_bytes + slots * bits // 8) // vreg_bytes
    last = (geo.prefix_bytes + ((slots + 1) * bits - 1) // 8) // vreg_bytes  # (an element may cross a piece)
    # distinct pieces by marking them (linear in the window; sorting for np.unique took 9 ms a window)
    lo = int(first.min())
    marks = np.zeros(int(last.max()) - lo + 1, np.bool_)
    marks[first - lo] = True
    marks[last - lo] = True
    return int(np.count_nonzero(marks))


def _pieces_by_axis(terms: list[np.ndarray], bits: int, prefix: int, vreg_bytes: int) -> int | None:
    """The distinct vreg pieces of the window whose slots are ``sum(terms[d][i_d])``, from each dimension's
    own pieces; None when a piece cannot be told that way.

    NOTE: speed. Write each term as ``q * high + low`` with ``q`` the slots of a piece. When the element at
    the largest sum of the lows of all dimensions (after the prefix's remainder) still ends within its piece,
    which holds for tiled layouts whose tiles are whole pieces, an element's piece is the sum of its
    dimensions' highs (plus a constant), so only each dimension's distinct highs are combined: a 1024 x 1024
    bf16 window in ``T(8,128)(2,1)`` combines 64 x 8 highs instead of marking 1 M slots."""
    if bits % 8 or vreg_bytes % (bits // 8):
        return None
    size = bits // 8
    q = vreg_bytes // size
    lows = sum(int((t % q).max()) for t in terms)
    if prefix % vreg_bytes + (lows + 1) * size > vreg_bytes:  # an element would end in the next piece
        return None
    total = np.zeros(1, np.int64)
    for t in terms:
        total = np.add.outer(total, np.unique(t // q)).reshape(-1)
    return int(np.unique(total).size)
