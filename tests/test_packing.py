"""Packing specifics: padding values, byte order, E(n) widths, metadata prefix and precise errors."""

import ml_dtypes
import numpy as np
import pytest

from tpusim.memory import PackError, Shape, pack, parse_shape, unpack
from tpusim.memory.packing import strided_assign


def test_tile_padding_takes_the_requested_value() -> None:
    shape = parse_shape("f32[3,5]{1,0:T(2,2)}")
    values = np.arange(15, dtype=np.float32).reshape(3, 5)
    words = pack(values, shape, padding_value=-7.0).view(np.float32)
    assert (words == -7.0).sum() == shape.geometry.element_slots - 15
    assert np.array_equal(unpack(pack(values, shape, padding_value=np.nan), shape), values)


def test_pred_with_e32_occupies_whole_words() -> None:
    shape = parse_shape("pred[8,128]{1,0:T(8,128)E(32)}")
    values = np.zeros((8, 128), bool)
    values[0, 1] = True
    words = pack(values, shape).view(np.uint32)
    assert shape.byte_size == 8 * 128 * 4
    assert words[1] == 1 and words.sum() == 1


def test_s4_with_e4_packs_two_per_byte_low_nibble_first() -> None:
    shape = parse_shape("s4[4]{0:E(4)}")
    values = np.array([1, -1, 7, -8], dtype=ml_dtypes.int4)
    assert pack(values, shape).tolist() == [0xF1, 0x87]
    # Without E(4) a sub-byte type takes a whole byte per element, as in XLA.
    assert parse_shape("s4[4]{0}").byte_size == 4


def test_metadata_prefix_holds_the_dimension_sizes() -> None:
    shape = parse_shape("f32[3,2]{1,0:M(16)}")
    data = pack(np.ones((3, 2), np.float32), shape)
    assert data[:16].view("<i4").tolist() == [3, 2, 0, 0]
    assert shape.byte_size == 16 + 24


def test_tail_padding_alignment_pads_the_element_count() -> None:
    shape = parse_shape("f32[5]{0:L(8)}")
    assert shape.byte_size == 32
    assert pack(np.ones(5, np.float32), shape).view(np.float32).tolist() == [1] * 5 + [0] * 3


def test_little_endian_multi_byte_values() -> None:
    shape = Shape("u32", (1,))
    assert pack(np.array([0x11223344], np.uint32), shape).tolist() == [0x44, 0x33, 0x22, 0x11]


def test_dtype_mismatch_is_refused_not_converted() -> None:
    message = r"^array of dtype float32 cannot be packed as bf16\[2\]\{0\}: convert it first"
    with pytest.raises(PackError, match=message):
        pack(np.zeros(2, np.float32), parse_shape("bf16[2]{0}"))  # type: ignore[arg-type]


def test_shape_mismatch_is_refused() -> None:
    with pytest.raises(PackError, match=r"^array of shape \(2, 3\) does not match f32\[3,2\] \(dimensions \(3, 2\)\)$"):
        pack(np.zeros((2, 3), np.float32), Shape("f32", (3, 2)))


def test_short_buffer_is_refused() -> None:
    with pytest.raises(PackError, match=r"^buffer of 8 bytes is too small for f32\[3\] \(12 bytes\)$"):
        unpack(bytes(8), Shape("f32", (3,)))


def test_python_lists_are_accepted_with_the_shape_dtype() -> None:
    shape = Shape("s32", (2, 2))
    assert np.array_equal(unpack(pack([[1, 2], [3, 4]], shape), shape), [[1, 2], [3, 4]])  # type: ignore[arg-type]


def test_scalars_unpack_to_zero_dimensional_arrays() -> None:
    for text in ("f32[]", "s32[]{:T(128)}", "bf16[]{:T(256)}", "pred[]"):
        shape = parse_shape(text)
        assert isinstance(shape, Shape)
        value = np.zeros((), shape.element_type.dtype)
        back = unpack(pack(value, shape), shape)
        assert isinstance(back, np.ndarray) and back.shape == ()


@pytest.mark.parametrize(
    "text",
    [
        "bf16[64,256]{1,0:T(8,128)(2,1)}",  # written straight into the destination
        "s8[64,256]{0,1:T(32,128)(4,1)}",
        "f32[3,5]{1,0:T(2,4)}",
        "s4[16,16]{1,0:T(8,8)E(4)}",  # sub-byte slots: encoded first, then copied
        "f32[4,4]{1,0:T(2,2)M(16)}",  # metadata prefix
    ],
)
def test_packing_into_a_given_buffer_writes_the_same_bytes(text: str) -> None:
    shape = parse_shape(text)
    rng = np.random.default_rng(1)
    x = rng.integers(-7, 7, shape.dimensions).astype(shape.element_type.dtype)
    out = np.full(shape.byte_size, 0xAB, np.uint8)
    assert pack(x, shape, out=out) is out
    np.testing.assert_array_equal(out, pack(x, shape))
    with pytest.raises(PackError, match=r"not the .* bytes"):
        pack(x, shape, out=np.zeros(shape.byte_size + 1, np.uint8))


@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (1, 0, 3, 2), (3, 2, 1, 0)])
@pytest.mark.parametrize("short", [1, 2, 4, 8, 9])
def test_strided_assign_copies_like_plain_assignment(perm: tuple[int, ...], short: int) -> None:
    """Large copies whose smallest-stride axis is short go one index at a time; the result is the same."""
    rng = np.random.default_rng(2)
    src = rng.integers(0, 1 << 16, (16, 33, 24, short), dtype=np.uint16).transpose(perm)
    dst = np.zeros(src.shape[::-1], np.uint16).transpose(3, 2, 1, 0)  # a strided destination too
    strided_assign(dst, src)
    np.testing.assert_array_equal(dst, src)
    flat = np.empty(src.shape, np.uint16)
    strided_assign(flat, src)
    np.testing.assert_array_equal(flat, src)


def test_packing_into_the_arrays_own_bytes_reads_them_first() -> None:
    shape = parse_shape("s16[16,256]{1,0:T(8,128)}")
    x = np.arange(16 * 256, dtype=np.int16).reshape(16, 256)
    want = pack(x, shape)
    buf = x.reshape(-1).view(np.uint8)  # the array and the destination are the same bytes
    pack(x, shape, out=buf)
    np.testing.assert_array_equal(buf, want)
