"""Every worked example of XLA's public Shapes and Layout (https://openxla.org/xla/shapes) and Tiled layout
(https://openxla.org/xla/tiled_layout) documents."""

import numpy as np

from tpusim.memory import Layout, Shape, pack, parse_shape, unpack


def _letters(shape: Shape) -> np.ndarray:
    """The documents' [2x3] array `a b c / d e f`, encoded as 1..6 so that 0 stays free for padding."""
    return np.arange(1, 7, dtype=np.int32).reshape(shape.dimensions)


A, B, C, D, E, F = range(1, 7)


def test_minor_to_major_0_1_is_column_major() -> None:
    shape = Shape("s32", (2, 3), layout=Layout((0, 1)))
    assert pack(_letters(shape), shape).view(np.int32).tolist() == [A, D, B, E, C, F]


def test_minor_to_major_1_0_is_row_major() -> None:
    shape = Shape("s32", (2, 3), layout=Layout((1, 0)))
    assert pack(_letters(shape), shape).view(np.int32).tolist() == [A, B, C, D, E, F]


def test_default_layout_is_major_to_minor() -> None:
    shape = Shape("s32", (2, 3))
    assert shape.effective_layout == Layout((1, 0))
    assert pack(_letters(shape), shape).view(np.int32).tolist() == [A, B, C, D, E, F]


def test_old_style_padding_column_major() -> None:
    # Seed 002: [2x3] padded to [3,5], column-major, padding value 0 -> a d 0 b e 0 c f 0 0 0 0 0 0 0.
    shape = Shape("s32", (2, 3), layout=Layout((0, 1), padded_dimensions=(3, 5)))
    words = pack(_letters(shape), shape).view(np.int32).tolist()
    assert words == [A, D, 0, B, E, 0, C, F, 0, 0, 0, 0, 0, 0, 0]
    assert np.array_equal(unpack(pack(_letters(shape), shape), shape), _letters(shape))


def test_old_style_padding_value_is_selectable() -> None:
    shape = Shape("s32", (2, 3), layout=Layout((0, 1), padded_dimensions=(3, 5), padding_value=-1))
    words = pack(_letters(shape), shape).view(np.int32).tolist()
    assert words == [A, D, -1, B, E, -1, C, F] + [-1] * 7


def test_figure1_element_2_3_of_f32_3_5_tiled_2x2() -> None:
    # Seed 004, Figure 1: element (2,3) has tile index (1,1) and in-tile index (0,1): (1*3+1)*4 + 0*2+1 = 17.
    shape = parse_shape("f32[3,5]{1,0:T(2,2)}")
    assert shape.geometry.linear_index((2, 3)) == 17
    # The array is padded to [4,6]: 2x3 tiles of 4 elements.
    assert shape.geometry.levels[0].padded_dims == (4, 6)
    assert shape.geometry.element_slots == 24
    assert shape.byte_size == 24 * 4


def test_figure1_every_position() -> None:
    shape = parse_shape("f32[3,5]{1,0:T(2,2)}")
    expected = np.array(
        [
            [0, 1, 4, 5, 8],
            [2, 3, 6, 7, 10],
            [12, 13, 16, 17, 20],
        ]
    )
    assert np.array_equal(shape.geometry.linear_map(), expected)


def test_figure2_repeated_tiling_4x8() -> None:
    # Seed 004, Figure 2: 4x8 with (2,4)(2,1): vertically adjacent pairs share consecutive slots.
    shape = parse_shape("f32[4,8]{1,0:T(2,4)(2,1)}")
    expected = np.array(
        [
            [0, 2, 4, 6, 8, 10, 12, 14],
            [1, 3, 5, 7, 9, 11, 13, 15],
            [16, 18, 20, 22, 24, 26, 28, 30],
            [17, 19, 21, 23, 25, 27, 29, 31],
        ]
    )
    assert np.array_equal(shape.geometry.linear_map(), expected)


def test_bf16_pairs_share_a_32_bit_word() -> None:
    # Why TPUs tile bf16 as (8,128)(2,1): rows 2k and 2k+1 of a column fill one little-endian 32-bit word.
    shape = parse_shape("bf16[16,128]{1,0:T(8,128)(2,1)}")
    values = np.arange(16 * 128, dtype=np.float32).reshape(16, 128).astype(shape.element_type.dtype)
    words = pack(values, shape).view(np.uint32)
    halves = values.view(np.uint16).astype(np.uint32)
    assert words[0] == halves[0, 0] | (halves[1, 0] << 16)
    assert words[1] == halves[0, 1] | (halves[1, 1] << 16)
    assert words[128] == halves[2, 0] | (halves[3, 0] << 16)


def test_s8_quads_share_a_32_bit_word() -> None:
    shape = parse_shape("s8[32,128]{1,0:T(32,128)(4,1)}")
    values = (np.arange(32 * 128) % 251 - 125).astype(np.int8).reshape(32, 128)
    words = pack(values, shape).view(np.uint32)
    b = values.view(np.uint8).astype(np.uint32)
    assert words[0] == b[0, 0] | b[1, 0] << 8 | b[2, 0] << 16 | b[3, 0] << 24


def test_combining_dimensions_example() -> None:
    # F32[2,7,8,11,10]{4,3,2,1,0} with tile (*,*,2,*,3) is F32[112,110] tiled (2,3).
    combined = parse_shape("f32[2,7,8,11,10]{4,3,2,1,0:T(*,*,2,*,3)}")
    flat = parse_shape("f32[112,110]{1,0:T(2,3)}")
    level = combined.geometry.levels[0]
    assert level.combined_dims == (112, 110)
    assert level.tile == (2, 3)
    assert combined.geometry.tiled_dims == flat.geometry.tiled_dims
    assert combined.byte_size == flat.byte_size
    values = np.random.default_rng(0).standard_normal((2, 7, 8, 11, 10)).astype(np.float32)
    assert pack(values, combined).tobytes() == pack(values.reshape(112, 110), flat).tobytes()
    assert np.array_equal(unpack(pack(values, combined), combined), values)
