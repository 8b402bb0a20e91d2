"""What a layout means for memory: the tiled physical shape, byte size and vectorised index maps.

The rules follow XLA's tiled-layout document (https://openxla.org/xla/tiled_layout) and Shapes and
Layout (https://openxla.org/xla/shapes); docs/layouts.md describes them:

1. Physical order is ``reverse(minor_to_major)``; old-style ``padded_dimensions`` widen the logical
   dimensions first.
2. Each tile applies to the most-minor dimensions of the shape the previous level produced (missing
   major dimensions count as size 1). A ``*`` entry first merges its dimension into the next more minor
   one. Every tiled dimension ``d`` is padded to a multiple of its tile size ``t`` and split into
   ``(ceil(d/t), t)``; all the ``t`` parts move, in order, to the most-minor end.
3. The final shape is laid out row-major. ``L(n)`` pads the element count to a multiple of ``n``;
   each element occupies ``E(n)`` bits (default: the type's width, a whole byte for sub-byte types);
   ``M(n)`` bytes of metadata come first.

:class:`Geometry` precomputes this per shape; its index maps work on whole numpy arrays of indices
with a fixed number of numpy operations (rank x tiling levels), never a Python loop per element.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import ceil, prod

import numpy as np

from tpusim.errors import LayoutError
from tpusim.memory.shape import COMBINE, AnyShape, Shape

__all__ = ["Geometry", "TilingLevel", "axis_slots", "geometry", "is_separable", "tile_periods"]


@dataclass(frozen=True, slots=True)
class TilingLevel:
    """One tiling level as a padded reshape-transpose of the shape before it.

    Attributes:
        input_dims: the shape the level starts from.
        prepended: size-1 major dimensions added because the tile has more entries than the shape.
        merges: groups ``(start, count)`` of adjacent dimensions (after prepending) merged by ``*`` entries.
        combined_dims: the shape after prepending and merging.
        tile: tile sizes for the ``len(tile)`` most-minor combined dimensions (no ``*`` left).
        padded_dims: ``combined_dims`` with each tiled dimension rounded up to a multiple of its tile size.
        split_dims: the reshape of ``padded_dims`` that splits each tiled ``d`` into ``(d/t, t)``.
        permutation: the transpose of ``split_dims`` that moves every ``t`` to the minor end.
        output_dims: the resulting shape, ``split_dims`` permuted.
    """

    input_dims: tuple[int, ...]
    prepended: int
    merges: tuple[tuple[int, int], ...]
    combined_dims: tuple[int, ...]
    tile: tuple[int, ...]
    padded_dims: tuple[int, ...]
    split_dims: tuple[int, ...]
    permutation: tuple[int, ...]
    output_dims: tuple[int, ...]

    @property
    def needs_padding(self) -> bool:
        return self.padded_dims != self.combined_dims

    @staticmethod
    def build(dims: tuple[int, ...], tile_entries: tuple[int, ...]) -> TilingLevel:
        prepended = max(0, len(tile_entries) - len(dims))
        work = (1,) * prepended + dims
        outer = len(work) - len(tile_entries)
        # Merge each '*' dimension into the next more minor one, major to minor, so chains accumulate.
        merges: list[tuple[int, int]] = []
        combined: list[int] = list(work[:outer])
        tile: list[int] = []
        run_start, run_len, acc = None, 0, 1
        for pos, t in enumerate(tile_entries):
            d = work[outer + pos]
            if t == COMBINE:
                if run_start is None:
                    run_start, run_len, acc = len(combined), 0, 1
                run_len += 1
                acc *= d
                continue
            if run_start is not None:
                merges.append((run_start, run_len + 1))
                d *= acc
                run_start = None
            combined.append(d)
            tile.append(t)
        k = len(tile)
        head = tuple(combined[: len(combined) - k])
        tiled = combined[len(combined) - k :]
        padded = tuple(-(-d // t) * t for d, t in zip(tiled, tile))
        split: list[int] = list(head)
        for d, t in zip(padded, tile):
            split += [d // t, t]
        h = len(head)
        perm = tuple(range(h)) + tuple(h + 2 * i for i in range(k)) + tuple(h + 2 * i + 1 for i in range(k))
        return TilingLevel(
            input_dims=dims,
            prepended=prepended,
            merges=tuple(merges),
            combined_dims=tuple(combined),
            tile=tuple(tile),
            padded_dims=head + padded,
            split_dims=tuple(split),
            permutation=perm,
            output_dims=tuple(split[p] for p in perm),
        )


@dataclass(frozen=True, slots=True)
class Geometry:
    """The memory geometry of one array shape under its layout.

    Attributes:
        shape: the shape (its layout, or the default layout when it has none).
        physical_permutation: logical dimension numbers in physical (major-to-minor) order.
        physical_dims: logical dimension sizes in physical order, old-style padding applied.
        levels: the tiling levels in order.
        tiled_dims: the final shape, laid out row-major.
        element_slots: number of element-sized slots in memory (``prod(tiled_dims)`` rounded up by ``L(n)``).
        element_bits: bits one slot occupies.
        prefix_bytes: metadata bytes before the data (``M(n)``).
        byte_size: total bytes.
    """

    shape: Shape
    physical_permutation: tuple[int, ...]
    physical_dims: tuple[int, ...]
    levels: tuple[TilingLevel, ...]
    tiled_dims: tuple[int, ...]
    element_slots: int
    element_bits: int
    prefix_bytes: int
    byte_size: int

    @staticmethod
    def of(shape: AnyShape) -> Geometry:
        if not isinstance(shape, Shape):
            raise LayoutError(f"tuple shape {shape} has no single memory geometry; take its elements")
        if shape.is_unbounded:
            raise LayoutError(f"{shape} has an unbounded dimension: its memory size is unknown")
        layout = shape.effective_layout
        perm = tuple(reversed(layout.minor_to_major))
        logical = layout.padded_dimensions or shape.dimensions
        dims = tuple(logical[p] for p in perm)
        levels: list[TilingLevel] = []
        current = dims
        for tile in layout.tiles:
            level = TilingLevel.build(current, tile.dimensions)
            levels.append(level)
            current = level.output_dims
        slots = prod(current)
        align = layout.tail_padding_alignment
        slots = -(-slots // align) * align
        et = shape.element_type
        bits = layout.element_size_bits or (max(8, et.bits) if et.kind != "token" else 0)
        prefix = layout.dynamic_shape_metadata_prefix_bytes
        return Geometry(
            shape=shape,
            physical_permutation=perm,
            physical_dims=dims,
            levels=tuple(levels),
            tiled_dims=current,
            element_slots=slots,
            element_bits=bits,
            prefix_bytes=prefix,
            byte_size=prefix + ceil(slots * bits / 8),
        )

    # ------------------------------------------------------------------ summary figures
    @property
    def padding_fraction(self) -> float:
        """Fraction of the element slots that hold padding rather than array elements."""
        if self.element_slots == 0:
            return 0.0
        return 1.0 - self.shape.element_count / self.element_slots

    @property
    def is_identity(self) -> bool:
        """True when memory order equals row-major logical order with no padding at all."""
        return (
            self.physical_permutation == tuple(range(self.shape.rank))
            and self.element_slots == self.shape.element_count
            and all(not lvl.needs_padding for lvl in self.levels)
            and self.physical_dims == self.shape.dimensions
            and _tiles_are_row_major(self.levels)
        )

    # ------------------------------------------------------------------ index maps
    def linear_index(self, index: np.ndarray | tuple[int, ...] | list[int]) -> np.ndarray:
        """Linear slot position of logical multi-indices.

        Args:
            index: integer array of shape ``(..., rank)`` (or one index as a tuple).

        Returns:
            int64 array of shape ``(...)``: the slot of each element (multiply by ``element_bits / 8`` and
            add ``prefix_bytes`` for a byte offset).
        """
        coords, dims, batch = self._forward(index, len(self.levels), keep_last_tile=True)
        return _ravel(coords, dims, batch)

    def tile_index(self, index: np.ndarray | tuple[int, ...] | list[int], level: int = 0) -> np.ndarray:
        """Which tile of tiling level ``level`` holds each logical multi-index (row-major tile number)."""
        if not 0 <= level < len(self.levels):
            raise ValueError(f"{self.shape} has {len(self.levels)} tiling levels, no level {level}")
        coords, dims, batch = self._forward(index, level + 1, keep_last_tile=False)
        return _ravel(coords, dims, batch)

    def _forward(
        self, index: np.ndarray | tuple[int, ...] | list[int], levels: int, keep_last_tile: bool
    ) -> tuple[list[np.ndarray], tuple[int, ...], tuple[int, ...]]:
        """Coordinates after the first ``levels`` tiling levels; without the last level's in-tile part
        when ``keep_last_tile`` is False."""
        idx = np.asarray(index, dtype=np.int64)
        rank = self.shape.rank
        if idx.shape[-1:] != (rank,) and not (rank == 0 and idx.shape[-1:] == (0,)):
            raise ValueError(f"index array must end in an axis of length {rank}, got shape {idx.shape}")
        coords = [idx[..., p] for p in self.physical_permutation]
        dims = self.physical_dims
        batch = idx.shape[:-1]
        for n, lvl in enumerate(self.levels[:levels]):
            coords = [np.zeros(batch, np.int64)] * lvl.prepended + coords
            coords = _merge_coords(coords, lvl)
            k = len(lvl.tile)
            head, tiled = coords[: len(coords) - k], coords[len(coords) - k :]
            quotients = [c // t for c, t in zip(tiled, lvl.tile)]
            if n == levels - 1 and not keep_last_tile:
                return head + quotients, lvl.output_dims[: len(lvl.output_dims) - k], batch
            coords = head + quotients + [c % t for c, t in zip(tiled, lvl.tile)]
            dims = lvl.output_dims
        return coords, dims, batch

    def logical_index(self, linear: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """Inverse of :meth:`linear_index`.

        Returns:
            ``(index, valid)``: an int64 array of shape ``(..., rank)`` and a bool array that is False
            where the slot holds padding (its index entries are then meaningless).
        """
        lin = np.asarray(linear, dtype=np.int64)
        valid = (lin >= 0) & (lin < prod(self.tiled_dims))
        rest = np.where(valid, lin, 0)
        coords: list[np.ndarray] = []
        for d in reversed(self.tiled_dims):
            d = max(d, 1)  # an empty array has no valid slot; avoid dividing by zero
            coords.append(rest % d)
            rest = rest // d
        coords.reverse()
        for lvl in reversed(self.levels):
            k = len(lvl.tile)
            h = len(coords) - 2 * k
            head, quotients, remainders = coords[:h], coords[h : h + k], coords[h + k :]
            tiled = [q * t + r for q, r, t in zip(quotients, remainders, lvl.tile)]
            for c, d in zip(tiled, lvl.combined_dims[h:]):
                valid &= c < d
            coords = _split_coords(head + tiled, lvl)[lvl.prepended :]
        for c, d in zip(coords, (self.shape.dimensions[p] for p in self.physical_permutation)):
            valid &= c < d
        logical: list[np.ndarray] = [np.empty(0)] * self.shape.rank
        for c, p in zip(coords, self.physical_permutation):
            logical[p] = c
        out = np.stack(logical, axis=-1) if logical else np.zeros((*lin.shape, 0), np.int64)
        return out, valid

    def linear_map(self) -> np.ndarray:
        """The slot of every element, as an int64 array with the logical shape."""
        grids = np.indices(self.shape.dimensions, dtype=np.int64)
        return self.linear_index(np.moveaxis(grids, 0, -1))


def _ravel(coords: list[np.ndarray], dims: tuple[int, ...], batch: tuple[int, ...]) -> np.ndarray:
    linear = np.zeros(batch, np.int64)
    for c, d in zip(coords, dims):
        linear = linear * d + c
    return linear


def _tiles_are_row_major(levels: tuple[TilingLevel, ...]) -> bool:
    # A tiling keeps row-major order only when every tiled dimension but the most major is untouched.
    for lvl in levels:
        tiled = lvl.combined_dims[len(lvl.combined_dims) - len(lvl.tile) :]
        if any(t != d for t, d in zip(lvl.tile[1:], tiled[1:])) or lvl.merges:
            return False
    return True


def _merge_coords(coords: list[np.ndarray], lvl: TilingLevel) -> list[np.ndarray]:
    if not lvl.merges:
        return coords
    dims = (1,) * lvl.prepended + lvl.input_dims
    out: list[np.ndarray] = []
    i = 0
    for start, count in lvl.merges:
        # `start` counts combined dimensions; translate it into the pre-merge position.
        while len(out) < start:
            out.append(coords[i])
            i += 1
        acc = coords[i]
        for j in range(1, count):
            acc = acc * dims[i + j] + coords[i + j]
        out.append(acc)
        i += count
    out.extend(coords[i:])
    return out


def _split_coords(coords: list[np.ndarray], lvl: TilingLevel) -> list[np.ndarray]:
    """Undo :func:`_merge_coords`: combined coordinates back to the pre-merge dimensions."""
    if not lvl.merges:
        return coords
    dims = (1,) * lvl.prepended + lvl.input_dims
    out: list[np.ndarray] = []
    src = 0  # position in the pre-merge dimensions
    ci = 0  # position in the combined coordinates
    for start, count in lvl.merges:
        while ci < start:
            out.append(coords[ci])
            ci += 1
            src += 1
        rest = coords[ci]
        parts: list[np.ndarray] = []
        for d in reversed(dims[src + 1 : src + count]):
            d = max(d, 1)  # empty arrays: every slot is padding anyway
            parts.append(rest % d)
            rest = rest // d
        parts.append(rest)
        out.extend(reversed(parts))
        ci += 1
        src += count
    out.extend(coords[ci:])
    return out


@lru_cache(maxsize=4096)
def geometry(shape: Shape) -> Geometry:
    """The (cached) :class:`Geometry` of an array shape."""
    return Geometry.of(shape)


# ---------------------------------------------------------------------------------------------------------
# Closed forms for windows (additive helpers; the index maps above are the definition)
# ---------------------------------------------------------------------------------------------------------
def is_separable(geo: Geometry) -> bool:
    """True when a slot is a sum of one term per logical dimension: ``linear_index(x) == sum(axis_slots(geo,
    d, x[d]))``.

    It holds for every layout without ``*`` merges: each tiling level replaces a coordinate by its quotient and
    remainder by the tile size (functions of that one coordinate), and the final ravel is a sum of coordinates
    times strides. A merge multiplies one coordinate into the next before dividing, which mixes them.
    """
    return not any(lvl.merges for lvl in geo.levels)


def tile_periods(geo: Geometry) -> tuple[int, ...]:
    """Per logical dimension, the first tiling level's tile size along it (1 for a dimension no tile covers):
    moving a coordinate by its period moves its slot term by a constant in XLA's tilings."""
    rank = geo.shape.rank
    periods = [1] * rank
    if geo.levels:
        tile = geo.levels[0].tile
        for j, t in enumerate(tile):
            phys = rank - len(tile) + j
            if phys >= 0:
                periods[geo.physical_permutation[phys]] = t
    return tuple(periods)


def axis_slots(geo: Geometry, dim: int, coords: np.ndarray) -> np.ndarray:
    """The term of logical dimension ``dim`` in the slot of indices whose ``dim`` coordinate is ``coords`` (a
    1-D int array): ``linear_index`` of the index that is ``coords`` along ``dim`` and 0 elsewhere.

    With :func:`is_separable`, the slots of a window are the outer sum of these terms over its coordinate
    ranges: ``sum(rank)`` index-map evaluations instead of ``prod(sizes)``.
    """
    c = np.asarray(coords, np.int64).reshape(-1)
    idx = np.zeros((c.size, geo.shape.rank), np.int64)
    idx[:, dim] = c
    return geo.linear_index(idx)
