"""Shape strings: parse, print, round-trip, and precise errors with a caret."""

from pathlib import Path

import pytest

from tpusim.errors import LayoutError
from tpusim.memory import COMBINE, UNBOUNDED, Layout, Shape, SplitConfig, Tile, TupleShape, parse_shape
from tpusim.memory.shape_text import ShapeReader, parse_layout

ISSUE_EXAMPLES = [
    "f32[3,5]{1,0:T(2,2)}",
    "bf16[256,512]{1,0:T(8,128)(2,1)}",
    "s8[1024,128]{1,0:T(32,128)(4,1)}",
    "pred[8,128]{1,0:T(8,128)E(32)}",
    "f32[8,128]{1,0:T(8,128)S(1)}",
    "f32[]",
    "f32[]{:T(256)}",
    "bf16[1024]{0:T(1024)(128)(2,1)}",
    "(f32[2]{0}, (s32[], u8[4]{0}))",
]

OTHER_FORMS = [
    "f32[3,5]",  # no layout: kept as None, printed without one
    "f32[<=10,?]{1,0}",  # bounded and unbounded dynamic dimensions
    "f32[2,7,8,11,10]{4,3,2,1,0:T(*,*,2,*,3)}",
    "f32[100]{0:D(C+~)#(u16)*(u32)}",
    "f32[100,200]{1,0:D(D,C)#(u32)*(u64)P(s32[100,200]{1,0})}",
    "f32[64,64]{1,0:T(8,128)L(1024)E(32)S(2)SC(0:16,32)(1:8)M(16)}",
    "token[]",
    "()",
    "(())",
    "c64[4]{0}",
    "f8e4m3fn[16,128]{1,0:T(32,128)(4,1)}",
    "s4[256,256]{1,0:T(8,128)(2,1)E(4)}",
    "u2[64]{0:E(2)}",
    "f4e2m1fn[16]{0:E(4)}",
]


@pytest.mark.parametrize("text", ISSUE_EXAMPLES + OTHER_FORMS)
def test_print_is_exactly_the_input(text: str) -> None:
    shape = parse_shape(text)
    assert str(shape) == text
    assert parse_shape(str(shape)) == shape


def test_real_tpu_shape_strings_round_trip() -> None:
    lines = (Path(__file__).parent / "data" / "tpu_shapes.txt").read_text().splitlines()
    texts = [line for line in lines if line.strip() and not line.startswith("#")]
    assert len(set(texts)) >= 30
    for text in texts:
        shape = parse_shape(text)
        assert str(shape) == text
        assert parse_shape(str(shape)) == shape
        for leaf in shape.leaves() if isinstance(shape, TupleShape) else [shape]:
            assert leaf.byte_size >= leaf.element_count * leaf.element_type.bits // 8


def test_parsed_values() -> None:
    s = parse_shape("bf16[256,512]{1,0:T(8,128)(2,1)}")
    assert isinstance(s, Shape)
    assert s.element_type.name == "bf16"
    assert s.dimensions == (256, 512)
    assert s.layout == Layout((1, 0), tiles=(Tile((8, 128)), Tile((2, 1))))
    assert parse_shape("f32[2,7,8,11,10]{4,3,2,1,0:T(*,*,2,*,3)}").layout.tiles[0].dimensions == (  # type: ignore[union-attr]
        COMBINE,
        COMBINE,
        2,
        COMBINE,
        3,
    )
    dyn = parse_shape("f32[<=10,?]{1,0}")
    assert dyn.dimensions == (10, UNBOUNDED) and dyn.dynamic == (True, True)  # type: ignore[union-attr]
    full = parse_shape("f32[64,64]{1,0:T(8,128)L(1024)E(32)S(2)SC(0:16,32)(1:8)M(16)}")
    assert full.layout is not None  # type: ignore[union-attr]
    lay = full.layout  # type: ignore[union-attr]
    assert (lay.tail_padding_alignment, lay.element_size_bits, lay.memory_space) == (1024, 32, 2)
    assert lay.split_configs == (SplitConfig(0, (16, 32)), SplitConfig(1, (8,)))
    assert lay.dynamic_shape_metadata_prefix_bytes == 16


def test_shape_queries() -> None:
    s = parse_shape("f32[1,3,1,5]")
    assert isinstance(s, Shape)
    assert (s.rank, s.true_rank, s.element_count) == (4, 2, 15)
    assert s.dimension(-1) == 5 and s.dimension_number(-3) == 1
    assert s.effective_layout == Layout((3, 2, 1, 0))
    with pytest.raises(IndexError):
        s.dimension(4)
    t = parse_shape("(f32[2]{0}, (s32[], u8[4]{0}))")
    assert isinstance(t, TupleShape)
    assert [str(x) for x in t.leaves()] == ["f32[2]{0}", "s32[]", "u8[4]{0}"]


def test_reader_continues_after_a_shape() -> None:
    text = "ENTRY %f (x: f32[2]{0}) -> f32[] {"
    reader = ShapeReader(text, text.index("f32"))
    assert str(reader.read_shape()) == "f32[2]{0}"
    assert text[reader.pos] == ")"
    # A '{' after a scalar starts the computation body, not a layout (XLA's lookahead rule).
    reader = ShapeReader(text, text.index("-> ") + 3)
    assert str(reader.read_shape()) == "f32[]"
    assert text[reader.pos :].strip() == "{"


def test_parse_layout_alone() -> None:
    assert parse_layout("{0,1:T(8,128)}", 2) == Layout((0, 1), tiles=(Tile((8, 128)),))


ERRORS = [
    ("f32[3,5]{1,1}", 11, "minor_to_major repeats dimension 1: it must be a permutation of 0..1"),
    ("f32[3,5]{0,2}", 11, "minor_to_major entry 2 is not a dimension of a rank-2 shape"),
    ("f32[3,5]{0}", 8, "shape has 2 dimensions but minor_to_major lists 1"),
    ("f32[3,5]{1,0:T(0,2)}", 15, r"a tile size must be a positive integer or '\*', not 0"),
    ("f32[3,5]{1,0:T(-2,2)}", 15, r"a tile size must be a positive integer or '\*', not -2"),
    ("f32[3,5]{1,0:T(?,2)}", 15, r"a tile size must be a positive integer or '\*', not '\?'"),
    ("f32[3,5]{1,0:T(2,*)}", 17, r"the most-minor tile entry cannot be '\*': there is no more minor dimension"),
    ("f32[3,5]{1,0:S(1)T(2,2)}", 17, r"tiles T\(...\) must come before memory space S\(n\)"),
    ("f32[3,5]{1,0:E(32)E(32)}", 18, r"element size E\(n\) appears twice in the layout"),
    ("f32[3,5]{1,0:Q(1)}", 13, r"expected a layout part \(D T L # \* E S SC P M\) or '}', found 'Q'"),
    ("f32[3]{0:E(4)}", 6, r"element size E\(4\) is narrower than f32 \(32 bits\)"),
    ("f32[3]{0:#(s32)}", 11, "expected an unsigned integer type such as u32, found 's32'"),
    ("f32[3]{0:T(8)P(f32[3]{0})}", 6, r"P\(...\) physical shape is only allowed on a sparse layout"),
    ("f32[3]{0:D(C)T(8)}", 6, "a sparse layout cannot have tiles"),
    ("f33[3]", 0, "unknown element type 'f33'"),
    ("f32[3,5", 7, "expected ',' or ']' after a dimension size, found end of text"),
    ("f32[3,-5]", 6, "dimension size -5 is negative"),
    ("(f32[2], s32[]", 14, "expected ',' or '\\)' in a tuple shape, found end of text"),
    ("f32[2]{0} x", 10, "unexpected 'x' after the shape"),
    ("f32[2]{0", 8, "expected '}' to end the layout, found end of text"),
]


@pytest.mark.parametrize(("text", "offset", "message"), ERRORS)
def test_errors_name_the_problem_and_point_at_it(text: str, offset: int, message: str) -> None:
    with pytest.raises(LayoutError, match=rf"^invalid shape or layout at column {offset + 1}: {message}") as info:
        parse_shape(text)
    err = info.value
    assert err.offset == offset
    lines = str(err).splitlines()
    assert lines[1] == f"  {text}"
    assert lines[2] == "  " + " " * offset + "^"


def test_python_built_layouts_are_validated() -> None:
    with pytest.raises(LayoutError, match="is not a permutation"):
        Shape("f32", (2, 3), layout=Layout((0, 0)))
    with pytest.raises(LayoutError, match="padded_dimensions\\[1\\] = 2 is smaller than the dimension size 3"):
        Shape("f32", (2, 3), layout=Layout((1, 0), padded_dimensions=(2, 2)))
    with pytest.raises(LayoutError, match="negative"):
        Shape("f32", (-1,))
    with pytest.raises(KeyError, match="unknown element type 'f7'"):
        Shape("f7", (1,))


def test_cached_hashes_are_not_compared_copied_or_pickled():
    """Shape and Layout keep their hash once computed (decode hashes every instruction); the cache must not
    change equality, must not survive ``replace`` (another value) or pickling (a string's hash differs between
    processes)."""
    import dataclasses
    import os
    import pickle
    import subprocess
    import sys

    s = parse_shape("bf16[256,512]{1,0:T(8,128)(2,1)}")
    fresh = parse_shape("bf16[256,512]{1,0:T(8,128)(2,1)}")
    assert hash(s) == hash(fresh) and s == fresh  # (one hashed, one not: still equal)
    assert dataclasses.replace(s, dimensions=(256, 256))._hash is None
    assert pickle.loads(pickle.dumps(s))._hash is None
    # in another process (another string-hash seed) the unpickled shape hashes as that process's own shapes do
    code = (
        "import pickle, sys; from tpusim.memory import parse_shape; "
        "s = pickle.loads(sys.stdin.buffer.read()); t = parse_shape(str(s)); "
        "print(hash(s) == hash(t) and {s: 1}.get(t) == 1)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(s), capture_output=True, check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )  # fmt: skip
    assert out.stdout.strip() == b"True"
