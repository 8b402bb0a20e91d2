"""Element types, shapes, tiled layouts, their memory geometry and byte packing."""

from tpusim.memory.dtypes import ELEMENT_TYPES, ElementType, element_type, element_type_of_dtype
from tpusim.memory.packing import PackError, pack, unpack
from tpusim.memory.shape import (
    COMBINE,
    UNBOUNDED,
    AnyShape,
    Layout,
    Shape,
    SplitConfig,
    Tile,
    TupleShape,
    lane_dim,
    sublane_dim,
)
from tpusim.memory.shape_text import ShapeReader, parse_layout, parse_shape
from tpusim.memory.tiling import Geometry, TilingLevel, geometry

__all__ = [
    "COMBINE",
    "ELEMENT_TYPES",
    "UNBOUNDED",
    "AnyShape",
    "ElementType",
    "Geometry",
    "Layout",
    "PackError",
    "Shape",
    "ShapeReader",
    "SplitConfig",
    "Tile",
    "TilingLevel",
    "TupleShape",
    "element_type",
    "element_type_of_dtype",
    "geometry",
    "lane_dim",
    "pack",
    "parse_layout",
    "parse_shape",
    "sublane_dim",
    "unpack",
]
