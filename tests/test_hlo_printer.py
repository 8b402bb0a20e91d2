"""HLO printer: every module round-trips (print, parse back, equal), XLA's own parser accepts what we print
and reads the same program, constants keep their exact bits, and each kind of attribute value prints in
XLA's syntax."""

from __future__ import annotations

from pathlib import Path

import hlo_corpus as hc
import ml_dtypes
import numpy as np
import pytest

from tpusim.compiler.hlo import parse_module, print_module
from tpusim.compiler.hlo.ir import (
    Attributes,
    Computation,
    ConvDims,
    Instruction,
    Literal,
    Module,
    PadDim,
    ProgramShape,
    Raw,
    ReplicaGroups,
    SliceDim,
    Window,
    WindowDim,
)
from tpusim.compiler.hlo.lexer import escape, unescape
from tpusim.compiler.hlo.literals import format_literal
from tpusim.compiler.hlo.printer import format_value
from tpusim.memory import ELEMENT_TYPES, Shape, parse_shape

SAMPLES = Path(__file__).parent / "hlo_samples"
TEXTS = [*hc.corpus(), *((p.name, p.read_text()) for p in sorted(SAMPLES.glob("*.hlo")) if p.name != "elided.hlo")]


@pytest.mark.parametrize(("key", "text"), TEXTS, ids=[k for k, _ in TEXTS])
def test_round_trip(key, text):
    module = parse_module(text, key)
    printed = print_module(module)
    again = parse_module(printed, key + ".printed")
    assert again == module
    assert print_module(again) == printed  # printing is a fixed point after one round


def _same_literal(a, b):
    if a.value is None:
        return len(a.tuple_elements) == len(b.tuple_elements) and all(
            map(_same_literal, a.tuple_elements, b.tuple_elements)
        )
    x, y = np.asarray(a.value), np.asarray(b.value)
    if x.dtype.kind in "biu" or x.dtype == np.bool_:
        return np.array_equal(x, y)
    wide = np.complex128 if x.dtype.kind == "c" else np.float64
    with np.errstate(invalid="ignore", over="ignore"):
        # XLA's parser reads "-0" as the integer 0 (hlo_lexer.cc lexes it as kInt), so only values are compared.
        return x.shape == y.shape and np.array_equal(x.astype(wide), y.astype(wide), equal_nan=True)


XLA_TEXTS = [(k, t) for k, t in TEXTS if "mesh[" not in t]  # jaxlib's parser cannot read mesh replica groups yet


@pytest.mark.parametrize(("key", "text"), XLA_TEXTS, ids=[k for k, _ in XLA_TEXTS])
def test_xla_reads_what_we_print(key, text):
    """XLA's own parser accepts our text and, printed by XLA and parsed by us, it is the same program."""
    from jax._src.lib import xla_client

    ours = parse_module(text)
    options = xla_client.hlo.HloPrintOptions()
    options.print_large_constants = True
    theirs = parse_module(hc.xla_parse(print_module(ours)).to_string(options))
    wrapped = {i.attr("calls") for c in ours.computations for i in c.instructions if i.opcode == "async-start"}
    for comp in ours.computations:
        if comp.name not in theirs and comp.name in wrapped:
            continue  # XLA prints an async op that wraps one instruction in its short form, without the computation
        other = theirs[comp.name]
        assert {i.name for i in comp.instructions} == {i.name for i in other.instructions}
        assert other.root == comp.root
        for ins in comp.instructions:
            twin = other[ins.name]
            assert (twin.opcode, twin.shape, twin.operands) == (ins.opcode, ins.shape, ins.operands)
            if ins.opcode.startswith("async-"):
                continue  # the long and the short async form carry different attributes
            mine = {k: v for k, v in ins.attributes.items() if k not in ("metadata", "literal")}
            assert {k: v for k, v in twin.attributes.items() if k not in ("metadata", "literal")} == mine
            if ins.opcode == "constant":
                assert _same_literal(ins.attr("literal"), twin.attr("literal"))
            # XLA renumbers the stack frames; the resolved user locations must agree.
            assert (twin.loc.op_name, twin.loc.source_file, twin.loc.source_line) == (
                ins.loc.op_name,
                ins.loc.source_file,
                ins.loc.source_line,
            )


# ---------------------------------------------------------------------------------------------
# Constants keep their bits
# ---------------------------------------------------------------------------------------------
def _constant_round_trip(values: np.ndarray, type_name: str) -> np.ndarray:
    shape = Shape(type_name, values.shape)
    text = f"ENTRY e {{\n ROOT c = {shape} constant({format_literal(Literal(shape, values))})\n}}\n"
    return parse_module(text).entry_computation.root_instruction.attr("literal").value


NARROW = [name for name, t in ELEMENT_TYPES.items() if t.kind == "float" and t.bits <= 16]


@pytest.mark.parametrize("type_name", NARROW)
def test_every_bit_pattern_of_narrow_floats(type_name):
    etype = ELEMENT_TYPES[type_name]
    raw = np.arange(1 << etype.bits, dtype=np.uint16 if etype.bits == 16 else np.uint8)
    values = raw.view(etype.dtype) if etype.bits >= 8 else raw.astype(np.uint8).view(etype.dtype)
    back = _constant_round_trip(values, type_name)
    assert back.dtype == etype.dtype
    assert np.array_equal(back.view(raw.dtype), values.view(raw.dtype))


@pytest.mark.parametrize("type_name", ["f32", "f64"])
def test_random_bit_patterns_of_wide_floats(type_name):
    etype = ELEMENT_TYPES[type_name]
    raw_type = np.uint32 if etype.bits == 32 else np.uint64
    rng = np.random.default_rng(7)
    raw = rng.integers(0, np.iinfo(raw_type).max, 20000, dtype=raw_type, endpoint=True)
    exponent_all_ones = np.array([0x7F800000 if etype.bits == 32 else 0x7FF0000000000000], raw_type)[0]
    raw[:2000] |= exponent_all_ones  # many NaNs with payloads, signs and infinities
    values = raw.view(etype.dtype)
    back = _constant_round_trip(values, type_name)
    assert np.array_equal(back.view(raw_type), raw)


def test_integer_and_complex_extremes():
    for name in ("s2", "s4", "s8", "s16", "s32", "s64", "u2", "u4", "u8", "u16", "u32", "u64"):
        dtype = ELEMENT_TYPES[name].dtype
        info = ml_dtypes.iinfo(dtype) if dtype.itemsize == 1 and name[1:] in ("2", "4") else np.iinfo(dtype)
        values = np.array([int(info.min), int(info.max), 0], dtype=np.int64 if name != "u64" else np.uint64)
        values = values.astype(dtype)
        assert np.array_equal(_constant_round_trip(values, name), values), name
    c = np.array([complex(np.nan, -0.0), complex(-np.inf, 1e-45), 3 - 4j], np.complex64)
    back = _constant_round_trip(c, "c64")
    assert np.array_equal(back.view(np.uint32), c.view(np.uint32))
    p = np.array([[True, False], [False, True]])
    assert np.array_equal(_constant_round_trip(p, "pred"), p)


def test_literal_text():
    shape = parse_shape("f32[2,3]")
    values = np.array([[0, 1.5, -0.0], [np.nan, np.inf, 1e-30]], np.float32)
    assert format_literal(Literal(shape, values)) == "{ {0, 1.5, -0}, {nan, inf, 1e-30} }"
    assert format_literal(Literal(parse_shape("pred[]"), np.array(True))) == "true"
    assert format_literal(Literal(parse_shape("s32[2,0,3]"), np.zeros((2, 0, 3), np.int32))) == "{ {}, {} }"
    nan = np.array([0x7F800001, 0xFFC00000], np.uint32).view(np.float32)
    assert format_literal(Literal(parse_shape("f32[2]"), nan)) == "{nan(0x1), -nan}"


# ---------------------------------------------------------------------------------------------
# Attribute values in XLA's syntax
# ---------------------------------------------------------------------------------------------
def test_value_formats():
    window = Window((WindowDim(3, 2, 1, 1, 1, 2, False), WindowDim(3, 1, 0, 2, 2, 1, True)))
    assert (
        format_value("window", window)
        == "{size=3x3 stride=2x1 pad=1_1x0_2 lhs_dilate=1x2 rhs_dilate=2x1 rhs_reversal=0x1}"
    )
    assert format_value("window", Window((WindowDim(2),))) == "{size=2}"
    assert format_value("slice", (SliceDim(0, 4), SliceDim(1, 9, 2))) == "{[0:4], [1:9:2]}"
    assert format_value("padding", (PadDim(1, 2), PadDim(0, -1))) == "1_2x0_-1"
    assert format_value("padding", (PadDim(1, 2), PadDim(0, 0, 3))) == "1_2_0x0_0_3"
    dims = ConvDims(0, 3, (1, 2), 2, 3, (0, 1), 0, 3, (1, 2))
    assert format_value("dim_labels", dims) == "b01f_01io->b01f"
    assert format_value("dim_labels", ConvDims(0, 1, (3, 2), 1, 0, (2, 3), 1, 0, (2, 3))) == "bf10_oi01->fb01"
    assert format_value("precision_config", ("default", "highest")) == "{default,highest}"
    assert format_value("replica_groups", ReplicaGroups(((0, 1),), "[1,2]<=[2]")) == "[1,2]<=[2]"
    assert format_value("source_target_pairs", ((0, 1), (1, 0))) == "{{0,1},{1,0}}"
    assert format_value("branch_computations", ("a", "b.1")) == "{%a, %b.1}"
    assert format_value("to_apply", "add.3") == "%add.3"
    assert format_value("custom_call_target", 'say "hi"\n') == '"say \\"hi\\"\\n"'
    assert format_value("is_stable", True) == "true" and format_value("epsilon", 0.001) == "0.001"
    assert format_value("backend_config", Raw('{"a":[1, 2]}')) == '{"a":[1, 2]}'
    layout = ProgramShape((parse_shape("f32[2]{0}"),), parse_shape("(f32[], s32[])"))
    assert format_value("entry_computation_layout", layout) == "{(f32[2]{0})->(f32[], s32[])}"


@pytest.mark.parametrize("value", ["plain", 'quote " and \\ backslash', "tab\tnew\nline", "ünïcødé ☃", "\x01\x7f"])
def test_string_escapes_round_trip(value):
    printed = escape(value)
    assert printed.startswith('"') and printed.endswith('"')
    assert unescape(printed[1:-1]) == value
    text = f"ENTRY e {{\n ROOT c = f32[] custom-call(), custom_call_target={printed}\n}}"
    assert parse_module(text).entry_computation.root_instruction.attr("custom_call_target") == value


def test_printing_a_module_built_in_python():
    f32 = Shape("f32", (4,))
    scalar = Shape("f32", ())
    add = Computation(
        "add",
        (
            Instruction("a", "parameter", scalar, (), Attributes({"parameter_number": 0})),
            Instruction("b", "parameter", scalar, (), Attributes({"parameter_number": 1})),
            Instruction("s", "add", scalar, ("a", "b")),
        ),
        "s",
    )
    values = np.arange(4, dtype=np.float32)
    main = Computation(
        "main",
        (
            Instruction("x", "parameter", f32, (), Attributes({"parameter_number": 0})),
            Instruction("k", "constant", f32, (), Attributes({"literal": Literal(f32, values)})),
            Instruction("y", "multiply", f32, ("x", "k")),
            Instruction("z", "constant", scalar, (), Attributes({"literal": Literal(scalar, np.float32(0))})),
            Instruction("r", "reduce", scalar, ("y", "z"), Attributes({"dimensions": (0,), "to_apply": "add"})),
        ),
        "r",
        is_entry=True,
    )
    module = Module("built", (add, main), "main")
    text = print_module(module)
    assert "ROOT %r = f32[] reduce(%y, %z), dimensions={0}, to_apply=%add" in text
    assert "%k = f32[4] constant({0, 1, 2, 3})" in text
    assert parse_module(text) == module


def test_async_short_form_prints_back_as_written():
    module = parse_module((SAMPLES / "tpu_scheduled.hlo").read_text())
    text = print_module(module)
    assert 'custom-call-start(%collective-permute-done), async_execution_thread="sparsecore"' in text
    assert "%custom-call-done = f32[8,128]{1,0:T(8,128)} custom-call-done(%custom-call-start)" in text
    assert "replica_groups=mesh[x=2,y=4] {y,x}" in text and "replica_groups=[2,4]<=[4,2]T(1,0)" in text
