"""The digit forms of tiled layouts (tpusim.memory.digits) against the element-by-element oracle.

Whether a reshape or a bitcast moves bytes is decided on the layouts' digit forms at any size. The oracle
here reads every element's slot through both layouts' index maps; the two must agree on random shapes,
layouts and reshapes, and on arrays above the size the compiler once compared element by element.
"""

from fractions import Fraction
from math import prod

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpusim.memory import Layout, Shape, Tile, parse_shape
from tpusim.memory.digits import Mode, dimension_modes, normal_form
from tpusim.memory.reinterpret import MEANING_CHECK_ELEMENTS, bytes_agree, bytes_agree_by_elements
from tpusim.memory.tiling import geometry

oracle = bytes_agree_by_elements  # every element of dst read from src's bytes is the element meant


def test_a_digit_form_gives_the_slot_of_every_element() -> None:
    shape = parse_shape("bf16[12,300]{1,0:T(8,128)(2,1)}")
    modes = dimension_modes(shape)
    assert modes is not None
    rows, cols = np.indices(shape.dimensions)

    def term(c: np.ndarray, dim_modes: tuple) -> np.ndarray:
        out, place = np.zeros_like(c), 1
        for mode in reversed(dim_modes):
            reach = mode.extent.__ceil__()
            out += (c // place) % reach * mode.stride
            place *= reach
        return out

    got = term(rows, modes[0]) + term(cols, modes[1])
    np.testing.assert_array_equal(got, geometry(shape).linear_map())


def test_the_reshape_of_the_issue_is_free_at_every_batch() -> None:
    """f32[B,512,1024] -> f32[B*512,1024]: free at B = 8 and at B = 16 (the element comparison stopped at
    4 M elements, so B = 16 was a 32 MiB copy)."""
    for batch in (8, 16, 64):
        src = parse_shape(f"f32[{batch},512,1024]{{2,1,0:T(8,128)}}")
        dst = parse_shape(f"f32[{batch * 512},1024]{{1,0:T(8,128)}}")
        assert bytes_agree(src, dst, row_major=True) is True


LARGE = [
    ("f32[16,512,1024]{2,1,0:T(8,128)}", "f32[8192,1024]{1,0:T(8,128)}", True),
    ("bf16[8,1024,640]{2,1,0:T(8,128)(2,1)}", "bf16[8192,640]{1,0:T(8,128)(2,1)}", True),
    # 1020 rows per batch: each batch's last row tile is padded, the merged rows are not
    ("bf16[8,1020,640]{2,1,0:T(8,128)(2,1)}", "bf16[8160,640]{1,0:T(8,128)(2,1)}", False),
    # splitting the lane dimension moves elements between tiles
    ("f32[8192,1024]{1,0:T(8,128)}", "f32[8192,16,64]{2,1,0:T(8,128)}", False),
    # heads split off the lanes become the tiles' rows: every element moves
    ("bf16[16,512,8,128]{3,2,1,0:T(8,128)(2,1)}", "bf16[16,512,1024]{2,1,0:T(8,128)(2,1)}", False),
]


@pytest.mark.parametrize(("src", "dst", "free"), LARGE)
def test_large_reshapes_agree_with_the_oracle(src: str, dst: str, free: bool) -> None:
    s, d = parse_shape(src), parse_shape(dst)
    assert s.element_count > MEANING_CHECK_ELEMENTS
    assert bytes_agree(s, d, row_major=True) is free
    assert oracle(s, d, row_major=True) is free


# ------------------------------------------------------------------------------------------ properties
TYPES = [("f32", 0), ("bf16", 0), ("s8", 0), ("bf16", 32), ("s4", 4), ("pred", 0)]
TILES = [
    (),
    (Tile((8, 128)),),
    (Tile((8, 128)), Tile((2, 1))),
    (Tile((2, 4)),),
    (Tile((4,)),),
    (Tile((3, 2)),),
    (Tile((2, 2)), Tile((2, 1))),
    (Tile((4, 2)), Tile((3, 1))),
    (Tile((1, 4)), Tile((2, 1))),
    (Tile((2, 1, 2)),),
]


def factorizations(n: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Dimension tuples whose product is ``n`` (size-1 dimensions included)."""

    @st.composite
    def build(draw: st.DrawFn) -> tuple[int, ...]:
        dims, rest = [], n
        for _ in range(draw(st.integers(0, 3))):
            divisors = [d for d in range(1, rest + 1) if rest % d == 0]
            d = draw(st.sampled_from(divisors))
            dims.append(d)
            rest //= d
        dims.append(rest)
        return tuple(draw(st.permutations(dims)))

    return build()


@st.composite
def reshape_pairs(draw: st.DrawFn) -> tuple[Shape, Shape, bool]:
    name, bits = draw(st.sampled_from(TYPES))
    n = draw(st.sampled_from([1, 6, 12, 16, 24, 32, 48, 64, 96, 128, 256, 384]))
    pair = []
    for _ in range(2):
        dims = draw(factorizations(n))
        rank = len(dims)
        row_major = draw(st.booleans())
        order = tuple(range(rank - 1, -1, -1)) if row_major else tuple(draw(st.permutations(range(rank))))
        tiles = draw(st.sampled_from(TILES)) if not pair or not draw(st.booleans()) else pair[0].effective_layout.tiles
        pair.append(Shape(name, dims, layout=Layout(order, tiles=tiles, element_size_bits=bits)))
    return pair[0], pair[1], draw(st.booleans())


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reshape_pairs())
def test_digit_forms_decide_reshapes_and_bitcasts_as_the_oracle_does(pair: tuple[Shape, Shape, bool]) -> None:
    src, dst, row_major = pair
    assert bytes_agree.__wrapped__(src, dst, row_major) == oracle(src, dst, row_major)


def test_size_one_and_padded_dimensions_drop_out_of_the_form() -> None:
    a = parse_shape("f32[1,1,8,128]{3,2,1,0:T(8,128)}")
    b = parse_shape("f32[8,128]{1,0:T(8,128)}")
    assert normal_form(a, (0, 1, 2, 3)) == normal_form(b, (0, 1)) == (Mode(Fraction(1024), 1),)
    three = parse_shape("f32[3,128]{1,0:T(8,128)}")  # 3 of 8 tile rows used: one digit of extent 3
    (rows, _), form = dimension_modes(three), normal_form(three, (0, 1))
    assert [m.extent for m in rows] == [3] and form is not None and prod(m.extent for m in form) == 3 * 128
