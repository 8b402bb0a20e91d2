"""Shapes and layouts as frozen values, printed exactly as XLA prints them.

A :class:`Shape` is an element type, dimension sizes and an optional :class:`Layout`; a
:class:`TupleShape` nests shapes. The layout follows XLA's ``Layout`` (xla/layout.h): the
``minor_to_major`` permutation, a list of :class:`Tile` s applied one after the other, and the rarer
parts real TPU dumps carry after the colon. The text form is produced by ``str()`` and read back by
:func:`tpusim.memory.parse_shape`.

What a layout means for memory (physical shape, byte size, linear positions) lives in
:mod:`tpusim.memory.tiling`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import prod
from typing import TYPE_CHECKING, Any, ClassVar, Final

from tpusim.errors import LayoutError
from tpusim.memory.dtypes import ElementType, element_type

if TYPE_CHECKING:
    from tpusim.memory.tiling import Geometry

__all__ = [
    "COMBINE",
    "UNBOUNDED",
    "AnyShape",
    "Layout",
    "Shape",
    "SplitConfig",
    "Tile",
    "TupleShape",
    "lane_dim",
    "sublane_dim",
]

COMBINE: Final = -1
"""A tile entry written ``*``: merge this dimension into the next more minor one before tiling."""

UNBOUNDED: Final = -1
"""The size recorded for an unbounded dynamic dimension, written ``?``."""

# Dimension level types of sparse layouts, as XLA abbreviates them inside D(...).
DIM_LEVEL_TYPES: Final = ("D", "C", "S", "H")


class _CachedHash:
    """A frozen dataclass's hash, computed once (a Shape or Layout is hashed every time a cache or a decoded
    stream looks up an instruction that holds it: 2 s of the d1024 decoder block's decode went to re-hashing
    the same layouts). Cache fields (named ``_...``) are not compared, not copied by ``replace`` and not
    pickled: a string's hash differs between processes."""

    __slots__ = ()
    _HASHED: ClassVar[tuple[str, ...]] = ()  # the compared fields (set below, once the dataclasses exist)

    def __hash__(self) -> int:
        h: int | None = self._hash  # type: ignore[attr-defined]
        if h is None:
            h = hash(tuple(getattr(self, name) for name in self._HASHED))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> list[object]:
        return [None if name.startswith("_") else getattr(self, name) for name in self.__dataclass_fields__]  # type: ignore[attr-defined]

    def __setstate__(self, state: list[object]) -> None:
        for name, value in zip(self.__dataclass_fields__, state):  # type: ignore[attr-defined]
            object.__setattr__(self, name, value)


@dataclass(frozen=True, slots=True)
class Tile:
    """One tiling level: tile sizes for the most-minor dimensions, major to minor (``T(8,128)``).

    An entry equal to :data:`COMBINE` is printed ``*``.
    """

    dimensions: tuple[int, ...]

    def __str__(self) -> str:
        return "(" + ",".join("*" if d == COMBINE else str(d) for d in self.dimensions) + ")"

    @property
    def element_count(self) -> int:
        return prod(d for d in self.dimensions if d != COMBINE)


@dataclass(frozen=True, slots=True)
class SplitConfig:
    """``SC(dimension:index,...)``: where a dimension is split across memory (kept, not interpreted)."""

    dimension: int
    split_indices: tuple[int, ...]

    def __str__(self) -> str:
        return f"({self.dimension}:{','.join(map(str, self.split_indices))})"


@dataclass(frozen=True, slots=True)
class Layout(_CachedHash):
    """How an array is laid out in memory (XLA's ``Layout``).

    Attributes:
        minor_to_major: dimension numbers from fastest- to slowest-varying.
        tiles: tiling levels, each applied to the shape the previous one produced (``T(8,128)(2,1)``).
        dim_level_types: sparse dimension level types as printed inside ``D(...)`` (``"D"``, ``"C~"``,
            ``"S+"``); empty for dense arrays.
        tail_padding_alignment: ``L(n)``, the element count is padded to a multiple of n.
        index_primitive_type: ``#(u32)``, the index type of sparse arrays.
        pointer_primitive_type: ``*(u32)``, the pointer type of sparse arrays.
        element_size_bits: ``E(n)``, bits one element occupies in memory; 0 means the type's own width
            (a whole byte for sub-byte types).
        memory_space: ``S(n)``; on TPUs 0 is HBM and 1 is VMEM.
        split_configs: ``SC(...)`` entries.
        physical_shape: ``P(shape)``, the physical shape of a sparse array.
        dynamic_shape_metadata_prefix_bytes: ``M(n)``, bytes before the data that hold dynamic sizes.
        padded_dimensions: old-style padding from the Shapes and Layout document: each logical dimension
            widened to this size. Python-level only; XLA's text form has no syntax for it.
        padding_value: the value stored in old-style padding (and the default for tile padding).
    """

    minor_to_major: tuple[int, ...]
    tiles: tuple[Tile, ...] = ()
    dim_level_types: tuple[str, ...] = ()
    tail_padding_alignment: int = 1
    index_primitive_type: str | None = None
    pointer_primitive_type: str | None = None
    element_size_bits: int = 0
    memory_space: int = 0
    split_configs: tuple[SplitConfig, ...] = ()
    physical_shape: AnyShape | None = None
    dynamic_shape_metadata_prefix_bytes: int = 0
    padded_dimensions: tuple[int, ...] | None = field(default=None, compare=True)
    padding_value: float = 0
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)

    @staticmethod
    def default(rank: int) -> Layout:
        """The default major-to-minor layout ``{rank-1,...,0}``."""
        return Layout(tuple(range(rank - 1, -1, -1)))

    @property
    def is_sparse(self) -> bool:
        return any(t[0] != "D" for t in self.dim_level_types)

    def with_tiles(self, *tiles: tuple[int, ...] | Tile) -> Layout:
        """A copy with the given tiling levels, e.g. ``layout.with_tiles((8, 128), (2, 1))``."""
        return replace(self, tiles=tuple(t if isinstance(t, Tile) else Tile(tuple(t)) for t in tiles))

    def _colon_parts(self) -> str:
        parts: list[str] = []
        if self.is_sparse:
            parts.append("D(" + ",".join(self.dim_level_types) + ")")
        if self.tiles:
            parts.append("T" + "".join(str(t) for t in self.tiles))
        if self.tail_padding_alignment != 1:
            parts.append(f"L({self.tail_padding_alignment})")
        if self.index_primitive_type is not None:
            parts.append(f"#({self.index_primitive_type})")
        if self.pointer_primitive_type is not None:
            parts.append(f"*({self.pointer_primitive_type})")
        if self.element_size_bits != 0:
            parts.append(f"E({self.element_size_bits})")
        if self.memory_space != 0:
            parts.append(f"S({self.memory_space})")
        if self.split_configs:
            parts.append("SC" + "".join(str(s) for s in self.split_configs))
        if self.physical_shape is not None:
            parts.append(f"P({self.physical_shape})")
        if self.dynamic_shape_metadata_prefix_bytes > 0:
            parts.append(f"M({self.dynamic_shape_metadata_prefix_bytes})")
        return "".join(parts)

    def __str__(self) -> str:
        colon = self._colon_parts()
        return "{" + ",".join(map(str, self.minor_to_major)) + (":" + colon if colon else "") + "}"


@dataclass(frozen=True, slots=True)
class Shape(_CachedHash):
    """An array shape: element type, dimension sizes and an optional layout.

    Attributes:
        element_type: the XLA element type (a name is accepted and looked up).
        dimensions: sizes in dimension-number order; an unbounded dynamic dimension is :data:`UNBOUNDED`.
        dynamic: per dimension, True when the size is dynamic (``<=N`` bounded, ``?`` unbounded).
        layout: the memory layout, or None when the text gave none.
    """

    element_type: ElementType
    dimensions: tuple[int, ...] = ()
    dynamic: tuple[bool, ...] = ()
    layout: Layout | None = None
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)
    # (the geometry, once asked for: the shared cache of geometries compares equal shapes field by field,
    # and every DMA and report asks its shapes' byte sizes)
    _geometry: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.element_type, ElementType):
            object.__setattr__(self, "element_type", element_type(self.element_type))
        object.__setattr__(self, "dimensions", tuple(int(d) for d in self.dimensions))
        if not self.dynamic:
            object.__setattr__(self, "dynamic", (False,) * len(self.dimensions))
        if len(self.dynamic) != len(self.dimensions):
            raise LayoutError(f"shape has {len(self.dimensions)} dimensions but {len(self.dynamic)} dynamic flags")
        for d, dyn in zip(self.dimensions, self.dynamic):
            if d < 0 and not (dyn and d == UNBOUNDED):
                raise LayoutError(f"dimension size {d} is negative")
        if self.layout is None and not self.dimensions and self.element_type.kind != "token":
            # As in XLA's parser, a scalar always has the (only) default layout `{}`, printed as nothing.
            object.__setattr__(self, "layout", Layout(()))
        if self.layout is not None:
            validate_layout(self, self.layout)

    # ----------------------------------------------------------------- basic queries
    @property
    def is_tuple(self) -> bool:
        return False

    @property
    def rank(self) -> int:
        return len(self.dimensions)

    @property
    def true_rank(self) -> int:
        """The number of dimensions of size greater than 1."""
        return sum(1 for d in self.dimensions if d > 1)

    @property
    def is_unbounded(self) -> bool:
        return any(d == UNBOUNDED and dyn for d, dyn in zip(self.dimensions, self.dynamic))

    @property
    def element_count(self) -> int:
        """Number of logical elements (bounded dynamic dimensions count at their bound)."""
        if self.is_unbounded:
            raise LayoutError(f"{self} has an unbounded dimension and no element count")
        return prod(self.dimensions)

    def dimension(self, index: int) -> int:
        """Size of dimension ``index``; negative numbers count from the end as in XLA."""
        return self.dimensions[self.dimension_number(index)]

    def dimension_number(self, index: int) -> int:
        """Normalise a possibly negative dimension number to 0..rank-1."""
        if not -self.rank <= index < self.rank:
            raise IndexError(f"dimension {index} out of range for rank-{self.rank} shape {self}")
        return index % self.rank if self.rank else index

    @property
    def effective_layout(self) -> Layout:
        """The layout, or the default major-to-minor layout when none was given."""
        return self.layout if self.layout is not None else Layout.default(self.rank)

    @property
    def has_tiles(self) -> bool:
        """Whether the layout given (not the default one) is tiled: a value of a module laid out already."""
        return self.layout is not None and bool(self.layout.tiles)

    def lays_out_like(self, other: Shape) -> bool:
        """Whether ``other`` has this element type and places elements as this layout does (the same order and
        tiles, whatever the dimensions and memory space): a block of one can be written as a block of the other."""
        a, b = self.effective_layout, other.effective_layout
        return self.element_type == other.element_type and (a.minor_to_major, a.tiles) == (b.minor_to_major, b.tiles)

    def with_layout(self, layout: Layout | None) -> Shape:
        return replace(self, layout=layout)

    def with_element_type(self, name: str | ElementType) -> Shape:
        return replace(self, element_type=element_type(name))

    @property
    def geometry(self) -> Geometry:
        """The physical geometry (tiled shape, byte size, index maps) of this shape's layout (cached)."""
        g = self._geometry
        if g is None:
            from tpusim.memory.tiling import geometry

            g = geometry(self)
            object.__setattr__(self, "_geometry", g)
        return g

    @property
    def byte_size(self) -> int:
        """Bytes the array occupies in memory, padding and ``E(n)`` included."""
        return self.geometry.byte_size

    # ----------------------------------------------------------------- text
    def dims_str(self) -> str:
        out = []
        for d, dyn in zip(self.dimensions, self.dynamic):
            out.append("?" if d == UNBOUNDED and dyn else (f"<={d}" if dyn else str(d)))
        return "[" + ",".join(out) + "]"

    def __str__(self) -> str:
        text = f"{self.element_type.name}{self.dims_str()}"
        if self.layout is not None:
            layout_text = str(self.layout)
            # XLA does not print "{}" as the layout of a scalar.
            if not (self.rank == 0 and layout_text == "{}"):
                text += layout_text
        return text


def lane_dim(shape: Shape) -> int | None:
    """The logical dimension laid along the lanes (the layout's most minor), None for scalars."""
    m2m = shape.effective_layout.minor_to_major
    return m2m[0] if m2m else None


def sublane_dim(shape: Shape) -> int | None:
    """The logical dimension laid along the sublanes (second most minor), None below rank 2."""
    m2m = shape.effective_layout.minor_to_major
    return m2m[1] if len(m2m) > 1 else None


@dataclass(frozen=True, slots=True)
class TupleShape:
    """A tuple of shapes, printed ``(f32[2]{0}, s32[])``."""

    elements: tuple[AnyShape, ...] = ()

    @property
    def is_tuple(self) -> bool:
        return True

    def leaves(self) -> list[Shape]:
        """The array shapes of the tuple, depth first, in order."""
        out: list[Shape] = []
        for e in self.elements:
            out.extend(e.leaves() if isinstance(e, TupleShape) else [e])
        return out

    def __str__(self) -> str:
        return "(" + ", ".join(str(e) for e in self.elements) + ")"


AnyShape = Shape | TupleShape


def validate_layout(shape: Shape, layout: Layout) -> None:
    """Raise :class:`LayoutError` when ``layout`` cannot describe ``shape`` (the checks of XLA's parser and
    ``ShapeUtil::ValidateShape``)."""
    rank = shape.rank
    m2m = layout.minor_to_major
    if len(m2m) != rank:
        listed = ",".join(map(str, m2m))
        raise LayoutError(f"shape has {rank} dimensions but minor_to_major {{{listed}}} has {len(m2m)}")
    if sorted(m2m) != list(range(rank)):
        raise LayoutError(
            f"minor_to_major {{{','.join(map(str, m2m))}}} is not a permutation of the dimensions 0..{rank - 1}"
        )
    if layout.dim_level_types and len(layout.dim_level_types) != rank:
        raise LayoutError(f"shape has {rank} dimensions but D(...) lists {len(layout.dim_level_types)} level types")
    if layout.is_sparse and layout.tiles:
        raise LayoutError("a sparse layout cannot have tiles")
    if layout.physical_shape is not None and not layout.is_sparse:
        raise LayoutError("P(...) physical shape is only allowed on a sparse layout")
    for tile in layout.tiles:
        if not tile.dimensions:
            raise LayoutError("a tile needs at least one dimension")
        for d in tile.dimensions:
            if d != COMBINE and d <= 0:
                raise LayoutError(f"tile {tile} has a non-positive size {d}")
        if tile.dimensions[-1] == COMBINE:
            raise LayoutError(f"tile {tile} combines its most-minor dimension with nothing")
    bits = layout.element_size_bits
    if bits < 0:
        raise LayoutError(f"element size E({bits}) is negative")
    if bits:
        natural = 1 if shape.element_type.name == "pred" else shape.element_type.bits
        if bits < natural:
            raise LayoutError(f"element size E({bits}) is narrower than {shape.element_type.name} ({natural} bits)")
        if bits not in (1, 2, 4) and bits % 8:
            raise LayoutError(f"element size E({bits}) must be 1, 2, 4 or a multiple of 8 bits")
    if layout.tail_padding_alignment < 1:
        raise LayoutError(f"tail padding alignment L({layout.tail_padding_alignment}) must be at least 1")
    if layout.memory_space < 0:
        raise LayoutError(f"memory space S({layout.memory_space}) is negative")
    if layout.dynamic_shape_metadata_prefix_bytes < 0:
        raise LayoutError(f"metadata prefix M({layout.dynamic_shape_metadata_prefix_bytes}) is negative")
    if layout.padded_dimensions is not None:
        pads = layout.padded_dimensions
        if len(pads) != rank:
            raise LayoutError(f"padded_dimensions {list(pads)} must have one entry per dimension ({rank})")
        for i, (d, p) in enumerate(zip(shape.dimensions, pads)):
            if p < d:
                raise LayoutError(f"padded_dimensions[{i}] = {p} is smaller than the dimension size {d}")


# (dataclass() writes its own __hash__ and pickling methods into each class: put the cached ones back)
for _cls in (Layout, Shape):
    _cls._HASHED = tuple(f for f in _cls.__dataclass_fields__ if not f.startswith("_"))
    _cls.__hash__ = _CachedHash.__hash__  # type: ignore[method-assign]
    _cls.__getstate__ = _CachedHash.__getstate__  # type: ignore[method-assign]
    _cls.__setstate__ = _CachedHash.__setstate__  # type: ignore[method-assign]
del _cls
