"""Closed forms for windows (tpusim.memory.tiling.is_separable / axis_slots, used by tpusim.devices.memory):
for every layout without ``*`` merges a slot is a sum of one term per dimension, so window slots and byte
extents computed from per-dimension terms equal the index map's, element for element."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_layout_properties import tiled_shapes

from tpusim.devices.memory import window_extent, window_slots
from tpusim.memory import geometry, parse_shape
from tpusim.memory.tiling import axis_slots, is_separable


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
    geo = geometry(shape)
    offsets = tuple(data.draw(st.integers(0, n - 1)) for n in shape.dimensions)
    sizes = tuple(data.draw(st.integers(1, n - o)) for n, o in zip(shape.dimensions, offsets))
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
