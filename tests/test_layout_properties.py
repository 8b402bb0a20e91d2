"""Property tests over random shapes, permutations, tilings and element types.

For every generated shape: pack then unpack returns the array bit for bit; the linear map is injective,
stays inside the buffer and agrees with where pack actually put each element; the inverse map recovers
every index and marks exactly the padding as invalid; printing round-trips.
"""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpusim.memory import COMBINE, Layout, Shape, Tile, pack, parse_shape, unpack
from tpusim.memory.reinterpret import bytes_agree, merged_shape

# (type name, E(n) choices: 0 means "the type's default width")
TYPES = [
    ("f32", (0,)),
    ("bf16", (0, 32)),
    ("f16", (0,)),
    ("s8", (0, 32)),
    ("u8", (0,)),
    ("s16", (0,)),
    ("s64", (0,)),
    ("f64", (0,)),
    ("pred", (0, 32, 1)),
    ("s4", (0, 4)),
    ("u4", (0, 4, 8)),
    ("s2", (0, 2)),
    ("f8e4m3fn", (0,)),
    ("f8e5m2", (0, 16)),
    ("f4e2m1fn", (0, 4)),
    ("c64", (0,)),
    ("c128", (0,)),
]


@st.composite
def tiled_shapes(draw: st.DrawFn) -> Shape:
    name, widths = draw(st.sampled_from(TYPES))
    rank = draw(st.integers(0, 4))
    dims = tuple(draw(st.lists(st.integers(0, 7), min_size=rank, max_size=rank)))
    perm = tuple(draw(st.permutations(range(rank))))
    tiles = []
    for _ in range(draw(st.integers(0, 3))):
        k = draw(st.integers(1, rank + 1))
        entries = draw(st.lists(st.sampled_from([1, 2, 3, 4, 8]), min_size=k, max_size=k))
        combine = draw(st.lists(st.booleans(), min_size=k, max_size=k))
        entries = [COMBINE if c and i < k - 1 else e for i, (e, c) in enumerate(zip(entries, combine))]
        tiles.append(Tile(tuple(entries)))
    padded = None
    if rank and draw(st.booleans()) and not tiles:
        padded = tuple(d + draw(st.integers(0, 2)) for d in dims)
    layout = Layout(
        perm,
        tiles=tuple(tiles),
        element_size_bits=draw(st.sampled_from(widths)),
        tail_padding_alignment=draw(st.sampled_from([1, 1, 3, 16])),
        dynamic_shape_metadata_prefix_bytes=draw(st.sampled_from([0, 0, 8])),
        padded_dimensions=padded,
        padding_value=draw(st.sampled_from([0, 1])),
    )
    return Shape(name, dims, layout=layout)


def random_values(shape: Shape, seed: int) -> np.ndarray:
    """Random bit patterns of the element type (NaN payloads included), valid for the numpy dtype."""
    et = shape.element_type
    rng = np.random.default_rng(seed)
    if et.name == "pred":
        return rng.integers(0, 2, shape.dimensions).astype(bool)
    if et.is_sub_byte:
        return rng.integers(0, 1 << et.bits, shape.dimensions, dtype=np.uint8).view(et.dtype)
    raw = rng.integers(0, 256, (*shape.dimensions, et.dtype.itemsize), dtype=np.uint8)
    return raw.view(et.dtype).reshape(shape.dimensions)


def raw_bits(array: np.ndarray, shape: Shape) -> np.ndarray:
    return array.view(shape.element_type.raw_dtype)


COMMON = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@COMMON
@given(tiled_shapes(), st.integers(0, 2**32 - 1))
def test_pack_then_unpack_is_bit_exact(shape: Shape, seed: int) -> None:
    values = random_values(shape, seed)
    data = pack(values, shape)
    assert data.dtype == np.uint8 and data.size == shape.byte_size
    back = unpack(data, shape)
    assert back.dtype == values.dtype and back.shape == values.shape
    assert np.array_equal(raw_bits(back, shape), raw_bits(values, shape))


@COMMON
@given(tiled_shapes(), st.integers(0, 2**32 - 1))
def test_linear_map_is_injective_in_bounds_and_matches_pack(shape: Shape, seed: int) -> None:
    geo = shape.geometry
    linear = geo.linear_map().reshape(-1)
    assert len(np.unique(linear)) == linear.size
    if linear.size:
        assert linear.min() >= 0 and linear.max() < geo.element_slots
    assert geo.byte_size == geo.prefix_bytes + -(-geo.element_slots * geo.element_bits // 8)
    # Where pack put each element, read back with the index map alone.
    values = random_values(shape, seed)
    data = pack(values, shape)
    bits = geo.element_bits
    natural = max(1, shape.element_type.bits)
    flat = raw_bits(values, shape).reshape(-1)
    if bits % 8 == 0:
        nbytes = shape.element_type.raw_dtype.itemsize
        starts = geo.prefix_bytes + linear * (bits // 8)
        got = data[starts[:, None] + np.arange(nbytes)]
        assert np.array_equal(got, flat.view(np.uint8).reshape(-1, nbytes))
    else:
        bit_pos = linear * bits
        byte = data[geo.prefix_bytes + bit_pos // 8]
        got = (byte >> (bit_pos % 8).astype(np.uint8)) & ((1 << bits) - 1)
        assert np.array_equal(got & ((1 << natural) - 1), flat.astype(np.uint8))


@COMMON
@given(tiled_shapes())
def test_inverse_map_recovers_indices_and_flags_padding(shape: Shape) -> None:
    geo = shape.geometry
    slots = np.arange(geo.element_slots + 2) - 1  # one slot outside each end
    index, valid = geo.logical_index(slots)
    assert valid.sum() == shape.element_count
    assert not valid[0] and not valid[-1]
    forward = geo.linear_index(index[valid])
    assert np.array_equal(forward, slots[valid])


@COMMON
@given(tiled_shapes())
def test_printing_round_trips(shape: Shape) -> None:
    text = str(shape)
    reparsed = parse_shape(text)
    # Old-style padding and the padding value are Python-level only: the text form cannot carry them.
    assert reparsed == Shape(
        shape.element_type.name,
        shape.dimensions,
        layout=Layout(
            shape.layout.minor_to_major,  # type: ignore[union-attr]
            tiles=shape.layout.tiles,  # type: ignore[union-attr]
            element_size_bits=shape.layout.element_size_bits,  # type: ignore[union-attr]
            tail_padding_alignment=shape.layout.tail_padding_alignment,  # type: ignore[union-attr]
            dynamic_shape_metadata_prefix_bytes=shape.layout.dynamic_shape_metadata_prefix_bytes,  # type: ignore[union-attr]
        ),
    )
    assert str(reparsed) == text


@COMMON
@given(tiled_shapes(), st.data())
def test_a_merged_shape_holds_every_element_at_its_byte(shape: Shape, data: st.DataObject) -> None:
    """:func:`merged_shape` (a free dimension folded into its physical neighbour, as the dot lowering's views
    use it) against the element-by-element oracle: whenever it gives a shape, reading the original bytes as
    that shape is what the fold means (a bitcast of the dimension orders)."""
    if shape.rank < 2 or 0 in shape.dimensions:
        return
    order = shape.effective_layout.minor_to_major
    at = data.draw(st.integers(0, shape.rank - 2))
    major, minor = order[at + 1], order[at]
    if data.draw(st.booleans()):  # any pair: a size-1 major folds into a dimension it is not next to
        major, minor = data.draw(st.permutations(range(shape.rank)))[:2]
    merged = merged_shape(shape, major, minor)
    if merged is not None:
        assert merged.element_count == shape.element_count
        assert bytes_agree(shape, merged) is True


def test_merged_shape_folds_heads_into_rows_only_along_whole_tiles() -> None:
    heads = parse_shape("bf16[8,64,512]{2,1,0:T(8,128)(2,1)}")
    assert str(merged_shape(heads, 0, 1)) == "bf16[512,512]{1,0:T(8,128)(2,1)}"
    # The sequence-minor result of a head projection: the heads fold into the 64 rows of each.
    projected = parse_shape("bf16[4,256,8,64]{1,3,2,0:T(8,128)(2,1)}")
    assert str(merged_shape(projected, 2, 3)) == "bf16[4,256,512]{1,2,0:T(8,128)(2,1)}"
    # 60 rows per head: each head's last tile is padded, no 480-row shape has that padding.
    assert merged_shape(parse_shape("bf16[8,60,512]{2,1,0:T(8,128)(2,1)}"), 0, 1) is None
    # Not physical neighbours, or the major one cut by a tile.
    assert merged_shape(parse_shape("f32[4,8,256]{2,1,0:T(8,128)}"), 1, 2) is None
    assert merged_shape(parse_shape("f32[4,8,256]{2,0,1:T(8,128)}"), 0, 2) is None
