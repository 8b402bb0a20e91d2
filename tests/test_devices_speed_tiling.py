"""Closed forms for windows (tpusim.memory.tiling.is_separable / axis_slots, used by tpusim.devices.stores):
for every layout without ``*`` merges a slot is a sum of one term per dimension, so window slots and byte
extents computed from per-dimension terms equal the index map's, element for element."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_layout_properties import tiled_shapes

from tpusim.devices.stores import ByteStore, read_value, write_value
from tpusim.memory import geometry, pack, parse_shape, unpack
from tpusim.memory.tiling import axis_slots, is_separable
from tpusim.memory.windows import window_extent, window_slots, window_strides, window_vregs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiled_shapes())
def test_slots_are_sums_of_axis_terms_exactly_when_nothing_merges(shape):
    geo = geometry(shape)
    merges = any(lvl.merges for lvl in geo.levels)
    assert is_separable(geo) == (not merges)
    if shape.rank == 0 or shape.element_count == 0:
        return
    idx = np.moveaxis(np.indices(shape.dimensions), 0, -1).reshape(-1, shape.rank)
    want = geo.linear_index(idx)
    terms = [axis_slots(geo, d, np.arange(n)) for d, n in enumerate(shape.dimensions)]
    got = sum(terms[d][idx[:, d]] for d in range(shape.rank))
    if not merges:
        np.testing.assert_array_equal(got, want)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiled_shapes(), st.data())
def test_window_slots_and_extents_match_the_index_map(shape, data):
    if shape.rank == 0 or shape.element_count == 0:
        return
    offsets = tuple(data.draw(st.integers(0, n - 1)) for n in shape.dimensions)
    sizes = tuple(data.draw(st.integers(1, n - o)) for n, o in zip(shape.dimensions, offsets))
    _assert_window_matches_the_index_map(shape, offsets, sizes)


def _assert_window_matches_the_index_map(shape, offsets, sizes):
    """window_slots and window_extent of a window equal what the index map gives element by element."""
    geo = geometry(shape)
    grid = np.moveaxis(np.indices(sizes), 0, -1).reshape(-1, shape.rank) + np.array(offsets)
    want = geo.linear_index(grid)
    np.testing.assert_array_equal(window_slots(shape, offsets, sizes), want)
    bits = geo.element_bits
    lo = geo.prefix_bytes + int(want.min()) * bits // 8
    hi = geo.prefix_bytes + -(-(int(want.max()) + 1) * bits // 8)
    assert window_extent(shape, offsets, sizes) == (lo, hi)


def test_merged_layouts_take_the_index_map():
    shape = parse_shape("f32[4,6,8]{2,1,0:T(*,4,8)}")
    geo = geometry(shape)
    assert not is_separable(geo)
    grid = np.moveaxis(np.indices((2, 3, 5)), 0, -1).reshape(-1, 3) + np.array([1, 2, 3])
    np.testing.assert_array_equal(window_slots(shape, (1, 2, 3), (2, 3, 5)), geo.linear_index(grid))


def _window(shape, data):
    offsets = tuple(data.draw(st.integers(0, n - 1)) for n in shape.dimensions)
    sizes = tuple(data.draw(st.integers(1, n - o)) for n, o in zip(shape.dimensions, offsets))
    return offsets, sizes


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiled_shapes(), st.data())
def test_strided_window_forms_name_the_index_maps_slots(shape, data):
    """window_strides, when it finds a strided view, describes exactly the window's slots in row-major order."""
    if shape.rank == 0 or shape.element_count == 0:
        return
    offsets, sizes = _window(shape, data)
    form = window_strides(shape, offsets, sizes)
    if form is None:
        return
    start, dims, strides = form
    assert all(g > 0 for g in strides) and np.prod(dims, dtype=np.int64) == np.prod(sizes, dtype=np.int64)
    digits = np.indices(dims).reshape(len(dims), -1) if dims else np.zeros((0, 1), np.int64)
    slots = start + (np.asarray(strides, np.int64).reshape(-1, 1) * digits).sum(axis=0)
    np.testing.assert_array_equal(slots, window_slots(shape, offsets, sizes))


@pytest.mark.parametrize(
    "text, offsets, sizes, strided",
    [
        ("bf16[512,256]{1,0:T(8,128)(2,1)}", (0, 128), (512, 128), True),  # an MXU LHS tile
        ("bf16[256,128]{1,0:T(8,128)(2,1)}", (128, 0), (128, 128), True),  # a weight tile
        ("f32[64,384]{1,0:T(8,128)}", (8, 128), (16, 256), True),
        ("s8[64,256]{1,0:T(32,128)(4,1)}", (32, 0), (32, 256), True),
        ("bf16[4,16,256]{2,1,0:T(8,128)(2,1)}", (1, 0, 0), (2, 16, 256), True),
        ("f32[3,5]{1,0:T(2,4)}", (1, 1), (2, 3), True),  # rows 1 and 2 sit in two tiles, 12 slots apart
        ("f32[3,5]{1,0:T(2,4)}", (0, 1), (3, 3), False),  # rows 0, 1, 2 at slots 0, 4, 16: not a view
    ],
)
def test_window_values_read_and_write_through_strided_views_as_through_slots(text, offsets, sizes, strided):
    """read_value / write_value take the strided view when there is one; the bytes are those of the slots."""
    shape = parse_shape(text)
    assert (window_strides(shape, offsets, sizes) is not None) == strided
    rng = np.random.default_rng(0)
    x = rng.integers(0, 100, shape.dimensions).astype(shape.element_type.dtype)
    store = ByteStore("vmem", 1 << 24)
    store.write(0, pack(x, shape))
    window = tuple(slice(o, o + s) for o, s in zip(offsets, sizes))
    got = read_value(store, 0, shape, offsets, sizes)
    assert got.flags.c_contiguous and not np.may_share_memory(got, store.view(0, shape.byte_size))
    np.testing.assert_array_equal(got, x[window])
    y = rng.integers(0, 100, sizes).astype(shape.element_type.dtype)
    write_value(store, 0, shape, offsets, sizes, y)
    want = x.copy()
    want[window] = y
    np.testing.assert_array_equal(unpack(store.view(0, shape.byte_size), shape), want)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiled_shapes(), st.data(), st.sampled_from([64, 512, 4096]))
def test_window_vregs_count_the_pieces_the_index_maps_slots_touch(shape, data, vreg_bytes):
    """window_vregs (runs of slots) counts exactly the distinct vreg-sized pieces of the window's elements."""
    if shape.rank == 0 or shape.element_count == 0:
        return
    geo = geometry(shape)
    offsets, sizes = _window(shape, data)
    grid = np.moveaxis(np.indices(sizes), 0, -1).reshape(-1, shape.rank) + np.array(offsets)
    slots = geo.linear_index(grid)
    lo = (geo.prefix_bytes + slots * geo.element_bits // 8) // vreg_bytes
    hi = (geo.prefix_bytes + ((slots + 1) * geo.element_bits - 1) // 8) // vreg_bytes
    want = np.unique(np.concatenate([lo, hi])).size
    assert window_vregs(shape, offsets, sizes, vreg_bytes) == want


def test_window_vregs_count_an_element_that_crosses_into_the_next_piece():
    """c128 after an 8-byte ``M(8)`` prefix: the window's elements are bytes 40..71, across two 64-byte pieces
    (hypothesis found it; both the closed form and the marking counted the first byte's piece only)."""
    shape = parse_shape("c128[1,1,2,2]{0,1,2,3:M(8)}")
    assert geometry(shape).prefix_bytes == 8
    assert window_vregs(shape, (0, 0, 0, 1), (1, 1, 2, 1), 64) == 2
    assert window_vregs(shape, (0, 0, 0, 0), (1, 1, 2, 1), 64) == 1  # bytes 8..39


def test_window_vregs_of_a_large_packed_window_come_from_each_dimensions_pieces():
    """A 1024 x 1024 bf16 window in T(8,128)(2,1) tiles is 512 whole 4 KiB pieces, told from 64 x 8 tile
    positions, not from its 1 M element slots."""
    from tpusim.memory.windows import _axis_terms, _pieces_by_axis

    shape = parse_shape("bf16[8,1024,1024]{2,1,0:T(8,128)(2,1)}")
    geo = geometry(shape)
    terms = _axis_terms(geo, (3, 0, 0), (1, 1024, 1024))
    assert terms is not None
    assert _pieces_by_axis(terms, geo.element_bits, geo.prefix_bytes, 4096) == 512
    assert window_vregs(shape, (3, 0, 0), (1, 1024, 1024), 4096) == 512
    # rows 8..23 are two rows of 2 KiB (8,128) tiles; lanes 0..255 the two tiles of one 4 KiB piece in each
    assert window_vregs(shape, (3, 8, 0), (1, 16, 256), 4096) == 2


LONG_SHAPES = [
    "f32[300000]{0}",
    "bf16[70001,256]{1,0:T(8,128)(2,1)}",
    "f32[130,70000]{0,1:T(8,128)}",
    "s8[66000,128]{1,0:T(32,128)(4,1)}",
    "f32[3,70000,5]{2,1,0:T(4,128)}",
]


@pytest.mark.parametrize("text", LONG_SHAPES)
def test_a_long_dimension_keeps_one_period_of_terms(text):
    """A dimension longer than 2^16 coordinates keeps one tile period of slot terms, not one per coordinate
    (a 64 MiB f32 vector's 16 M terms took 0.9 s and 128 MB in a 256-chip all-reduce), and its windows'
    extents and slots still equal the index map's."""
    from tpusim.memory.tiling import tile_periods
    from tpusim.memory.windows import _WHOLE_AXIS, _shape_axes

    shape = parse_shape(text)
    geo = geometry(shape)
    axes = _shape_axes(shape)
    periods = tile_periods(geo)
    for d, n in enumerate(shape.dimensions):
        assert axes[d].base.size == (periods[d] if n > _WHOLE_AXIS else n)
    rng = np.random.default_rng(0)
    for _ in range(40):
        offsets, sizes = [], []
        for n in shape.dimensions:
            o = int(rng.integers(0, n))
            cap = n - o if n > _WHOLE_AXIS or rng.random() < 0.5 else min(n - o, 3)
            offsets.append(o)
            sizes.append(int(rng.integers(1, cap + 1)) if rng.random() < 0.7 else cap)
        long = [d for d, n in enumerate(shape.dimensions) if n > _WHOLE_AXIS]
        if np.prod(sizes) > 2_000_000:  # (keep the index map's grid small: shrink the short dimensions)
            sizes = [s if d in long else 1 for d, s in enumerate(sizes)]
        _assert_window_matches_the_index_map(shape, tuple(offsets), tuple(sizes))
