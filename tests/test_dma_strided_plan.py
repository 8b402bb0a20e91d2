"""The closed-form transfer costs of timing-only runs (``strided_plan``, tpusim/devices/dma.py) against the
element-by-element plan they replace (``transfer_plan``, the oracle): payload, joint runs (with and without
stepping over padding) and each side's own runs, on windows of tiled layouts of every kind, aligned or not."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_layout_properties import tiled_shapes

from tpusim.devices.dma import strided_plan, transfer_plan
from tpusim.memory import Layout, Shape, parse_shape


@st.composite
def copies(draw: st.DrawFn) -> tuple[Shape, tuple[int, ...], Shape, tuple[int, ...] | None, tuple[int, ...], int]:
    """A window of a tiled array copied into a block of its own size (some layout) or another tiled array."""
    src = draw(tiled_shapes())
    sizes = tuple(draw(st.integers(1, n)) if n else 0 for n in src.dimensions)
    offsets = tuple(draw(st.integers(0, n - s)) for n, s in zip(src.dimensions, sizes))
    if draw(st.booleans()):
        tiles = src.effective_layout.tiles if draw(st.booleans()) else ()
        try:
            dst = Shape(src.element_type, sizes, layout=Layout(tuple(reversed(range(len(sizes)))), tiles))
            dst.byte_size  # noqa: B018 (tiles that do not fit this rank raise)
        except Exception:
            dst = Shape(src.element_type, sizes)
        dst_off: tuple[int, ...] | None = None if draw(st.booleans()) else (0,) * len(sizes)
    else:
        dst = src
        dst_off = tuple(draw(st.integers(0, n - s)) for n, s in zip(dst.dimensions, sizes))
    return src, offsets, dst, dst_off, sizes, draw(st.sampled_from([0, 32, 512]))


def same_costs(
    src: Shape, s_off: tuple[int, ...], dst: Shape, d_off: tuple[int, ...] | None, sizes: tuple[int, ...], gap: int
) -> None:
    want = transfer_plan(src, s_off, dst, d_off, sizes, gap)
    got = strided_plan(src, s_off, dst, d_off, sizes, gap)
    assert (got.payload, got.runs) == (want.payload, want.runs)
    for a, b in zip((*got.src_runs, *got.dst_runs), (*want.src_runs, *want.dst_runs)):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(copies())
def test_closed_form_costs_equal_the_element_by_element_plan(case: tuple) -> None:  # type: ignore[type-arg]
    same_costs(*case)  # (empty windows included: the element-by-element plan's empty runs)


def test_block_loads_of_the_decoder_take_the_closed_form() -> None:
    """The transfers that made the d1024 decoder block's timing-only run sort 4,200 slot arrays: a 128x512
    bf16 window of an [8192,1024] activation into a VMEM block, a window crossing a tile boundary, and a
    bias row into a block of the bias's own layout."""
    act = parse_shape("bf16[8192,1024]{1,0:T(8,128)(2,1)}")
    block = parse_shape("bf16[128,512]{1,0:T(8,128)(2,1)}")
    bias = parse_shape("bf16[1,4096]{1,0:T(1024)(128)(2,1)}")
    padded = parse_shape("f32[4]{0:T(128)}")
    same_costs(padded, None, padded, None, (4,), 32)  # a whole array to its twin: the raw buffer, padding too
    for case in (
        (act, (2688, 256), block, None, (128, 512), 512),
        (act, (56, 192), act, (56, 384), (8, 128), 0),
        (bias, (0, 512), parse_shape("bf16[1,512]{1,0:T(1024)(128)(2,1)}"), None, (1, 512), 512),
    ):
        assert strided_plan(*case).timing_only  # no element maps built
        same_costs(*case)
