"""Attribute values: one reader per kind of value, and the table of attribute names and their kinds.

Every ``name=value`` after an instruction's operands is read by the reader of its kind
(:data:`KIND_READERS`, filled by :func:`reader`) into the Python type documented in ``docs/hlo.md``. The
syntax of each kind is XLA's (xla/hlo/parser/hlo_parser.cc, ``ParseAttributeHelper`` and the ``Parse*``
functions it calls). Values without meaning for simulation are kept verbatim as :class:`~ir.Raw`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

from tpusim.compiler.hlo.ir import ConvDims, Literal, PadDim, ProgramShape, Raw, SliceDim, Window, WindowDim
from tpusim.compiler.hlo.lexer import FLOAT, STRING, SourceText
from tpusim.compiler.hlo.replica_groups import read_replica_groups
from tpusim.errors import LayoutError
from tpusim.memory import AnyShape, ShapeReader, TupleShape

__all__ = [
    "ALIASES",
    "ATTRIBUTE_KINDS",
    "KIND_READERS",
    "PRINTED_NAMES",
    "read_shape",
    "reader",
]

Reader = Callable[[SourceText, int], tuple[Any, int]]
KIND_READERS: dict[str, Reader] = {}
"""Kind name -> ``read(src, pos) -> (value, end)``; ``pos`` is just after ``name=``."""

# Attribute key -> kind. Keys are the names XLA prints, except where ALIASES renames them.
ATTRIBUTE_KINDS: dict[str, str] = {
    # structure and calls
    "dimensions": "ints",
    "index": "int",
    "iota_dimension": "int",
    "to_apply": "computation",
    "calls": "computation",
    "condition": "computation",
    "body": "computation",
    "select": "computation",
    "scatter": "computation",
    "true_computation": "computation",
    "false_computation": "computation",
    "branch_computations": "computations",
    "called_computations": "computations",
    "control-predecessors": "names",
    "kind": "ident",
    "is_composite": "bool",
    "slice": "slice",
    "padding": "padding",
    "dynamic_slice_sizes": "ints",
    "inferred_dimension": "int",
    # dot / convolution
    "lhs_batch_dims": "ints",
    "rhs_batch_dims": "ints",
    "lhs_contracting_dims": "ints",
    "rhs_contracting_dims": "ints",
    "lhs_ragged_dims": "ints",
    "rhs_group_dims": "ints",
    "precision_config": "precision",
    "algorithm": "ident",
    "window": "window",
    "dim_labels": "dim_labels",
    "feature_group_count": "int",
    "batch_group_count": "int",
    "conv_kind": "ident",
    # compare, sort, topk
    "direction": "ident",
    "type": "ident",
    "is_stable": "bool",
    "k": "int",
    "largest": "bool",
    # gather / scatter
    "offset_dims": "ints",
    "collapsed_slice_dims": "ints",
    "start_index_map": "ints",
    "operand_batching_dims": "ints",
    "start_indices_batching_dims": "ints",
    "index_vector_dim": "int",
    "slice_sizes": "ints",
    "indices_are_sorted": "bool",
    "update_window_dims": "ints",
    "inserted_window_dims": "ints",
    "scatter_dims_to_operand_dims": "ints",
    "input_batching_dims": "ints",
    "scatter_indices_batching_dims": "ints",
    "unique_indices": "bool",
    # numerics
    "fft_type": "ident",
    "fft_length": "ints",
    "distribution": "ident",
    "exponent_bits": "int",
    "mantissa_bits": "int",
    "epsilon": "float",
    "feature_index": "int",
    "left_side": "bool",
    "lower": "bool",
    "unit_diagonal": "bool",
    "transpose_a": "ident",
    "delta": "int",
    "num_carries": "int",
    "is_reverse": "bool",
    "is_associative": "bool",
    "result_accuracy": "raw",
    # collectives, channels, async
    "replica_groups": "replica_groups",
    "source_target_pairs": "pairs",
    "channel_id": "int",
    "use_global_device_ids": "bool",
    "constrain_layout": "bool",
    "mode": "ident",
    "barrier": "string",
    "is_host_transfer": "bool",
    "async_execution_thread": "string",
    "cross_program_prefetch_index": "int",
    "infeed_config": "string",
    "outfeed_config": "string",
    "outfeed_shape": "shape",
    # custom-call
    "custom_call_target": "string",
    "custom_call_has_side_effect": "bool",
    "operand_layout_constraints": "shapes",
    "api_version": "ident",
    "schedule": "ident",
    "padding_type": "ident",
    "literal": "typed_literal",
    "output_to_operand_aliasing": "raw",
    # kept verbatim
    "metadata": "raw",
    "sharding": "raw",
    "frontend_attributes": "raw",
    "backend_config": "raw",
    "statistics": "raw",
    "origin": "raw",
    "parameter_replication": "raw",
    "domain": "raw",
}

ALIASES: dict[str, str] = {
    "operand_precision": "precision_config",
    # Gather before XLA renamed its dimension numbers (2018): same meaning, new names.
    "output_window_dims": "offset_dims",
    "elided_window_dims": "collapsed_slice_dims",
    "gather_dims_to_operand_dims": "start_index_map",
    "window_bounds": "slice_sizes",
    # All-reduce before channel ids were shared by all collectives (2019).
    "all_reduce_id": "channel_id",
}
"""Printed attribute name -> key it is stored under."""

PRINTED_NAMES: dict[str, str] = {"precision_config": "operand_precision"}
"""Key -> the name the printer writes (when it differs from the key)."""


def reader(kind: str) -> Callable[[Reader], Reader]:
    """Decorator registering the reader of one kind of attribute value."""

    def deco(fn: Reader) -> Reader:
        KIND_READERS[kind] = fn
        return fn

    return deco


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_BOOL = re.compile(r"(true|false)\b")
_DXD = re.compile(r"\d+(?:x\d+)*(?![\w.])")
_PAD = re.compile(r"-?\d+_-?\d+(?:_-?\d+)?(?:x-?\d+_-?\d+(?:_-?\d+)?)*(?![\w.])")
_DIM_LABELS = re.compile(r"([0-9bf?]+)_([0-9io?]+)->([0-9bf?]+)")
_SLICE_DIM = re.compile(r"\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+)\s*)?\]")
_BARE = re.compile(r"[^\s,{}()\"']+")
_FLAT_BRACES = re.compile(r"""\s*(\{(?:[^{}"']|"(?:[^"\\]|\\.)*")*\})""")
_WS_INT = re.compile(r"\s*(-?\d+)")
_WS_NAME = re.compile(r"\s*%?([A-Za-z_][A-Za-z0-9_.\-]*)")
_WS_WORD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.\-]*)")


def _ws(src: SourceText, pos: int) -> int:
    return src.skip_ws(pos)


@reader("int")
def _read_int(src: SourceText, pos: int) -> tuple[int, int]:
    m = _WS_INT.match(src.text, pos)
    if m is None:
        return src.integer(pos, "an integer value")
    return int(m.group(1)), m.end()


@reader("bool")
def _read_bool(src: SourceText, pos: int) -> tuple[bool, int]:
    pos = _ws(src, pos)
    m = _BOOL.match(src.text, pos)
    if not m:
        raise src.error(pos, f"expected true or false, found {src.found(pos)}")
    return m.group(1) == "true", m.end()


@reader("float")
def _read_float(src: SourceText, pos: int) -> tuple[float, int]:
    pos = _ws(src, pos)
    m = FLOAT.match(src.text, pos)
    if not m:
        raise src.error(pos, f"expected a number, found {src.found(pos)}")
    return float(m.group(0)), m.end()


@reader("string")
def _read_string(src: SourceText, pos: int) -> tuple[str, int]:
    return src.string(pos, "the attribute value")


@reader("ident")
def _read_ident(src: SourceText, pos: int) -> tuple[str, int]:
    m = _WS_WORD.match(src.text, pos)
    if not m:
        raise src.error(src.skip_ws(pos), f"expected a name such as LT or kLoop, found {src.found(pos)}")
    return m.group(1), m.end()


@reader("ints")
def _read_ints(src: SourceText, pos: int) -> tuple[tuple[int, ...], int]:
    return src.int_list(pos, "a list of integers like {0,1}")


@reader("intss")
def _read_intss(src: SourceText, pos: int) -> tuple[tuple[tuple[int, ...], ...], int]:
    return src.int_lists(pos, "a list of integer lists like {{0,1},{2,3}}")


@reader("pairs")
def _read_pairs(src: SourceText, pos: int) -> tuple[tuple[tuple[int, int], ...], int]:
    start = _ws(src, pos)
    lists, end = _read_intss(src, pos)
    for item in lists:
        if len(item) != 2:
            raise src.error(start, f"expected {{source,target}} pairs, found a group of {len(item)}: {set(item)}")
    return tuple((a, b) for a, b in lists), end  # type: ignore[misc]


@reader("computation")
def _read_computation(src: SourceText, pos: int) -> tuple[str, int]:
    m = _WS_NAME.match(src.text, pos)
    if m is None:
        return src.name(pos, "a computation name")
    return m.group(1), m.end()


@reader("computations")
def _read_computations(src: SourceText, pos: int) -> tuple[tuple[str, ...], int]:
    return _read_names(src, pos, "a computation name")


@reader("names")
def _read_instruction_names(src: SourceText, pos: int) -> tuple[tuple[str, ...], int]:
    return _read_names(src, pos, "an instruction name")


def _read_names(src: SourceText, pos: int, what: str) -> tuple[tuple[str, ...], int]:
    return _braced_list(
        src, pos, f"to start a list of {what}s", lambda s, p: s.name(p, what), f"or ',' in a list of {what}s"
    )


_T = TypeVar("_T")


def _braced_list(
    src: SourceText, pos: int, start: str, read_item: Callable[[SourceText, int], tuple[_T, int]], end: str
) -> tuple[tuple[_T, ...], int]:
    """``{item, item, ...}`` (possibly empty), each item read by ``read_item``; ``start`` and ``end`` finish the
    errors for a missing ``{`` and for what follows an item when it is neither ``,`` nor ``}``."""
    pos = src.expect(pos, "{", start)
    out: list[_T] = []
    pos = _ws(src, pos)
    if src.text.startswith("}", pos):
        return (), pos + 1
    while True:
        item, pos = read_item(src, pos)
        out.append(item)
        pos = _ws(src, pos)
        if not src.text.startswith(",", pos):
            return tuple(out), src.expect(pos, "}", end)
        pos += 1


@reader("slice")
def _read_slice(src: SourceText, pos: int) -> tuple[tuple[SliceDim, ...], int]:
    return _braced_list(
        src, pos, "to start slice ranges like {[0:4], [2:8:2]}", _read_slice_dim, "or ',' in slice ranges"
    )


def _read_slice_dim(src: SourceText, pos: int) -> tuple[SliceDim, int]:
    pos = _ws(src, pos)
    m = _SLICE_DIM.match(src.text, pos)
    if not m:
        raise src.error(pos, f"expected a range [start:limit] or [start:limit:stride], found {src.found(pos)}")
    return SliceDim(int(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) else 1), m.end()


@reader("padding")
def _read_padding(src: SourceText, pos: int) -> tuple[tuple[PadDim, ...], int]:
    pos = _ws(src, pos)
    m = _PAD.match(src.text, pos)
    if not m:
        raise src.error(pos, f"expected padding like 0_0x1_2 (low_high[_interior] each), found {src.found(pos)}")
    dims = []
    for part in m.group(0).split("x"):
        nums = [int(v) for v in part.split("_")]
        dims.append(PadDim(nums[0], nums[1], nums[2] if len(nums) == 3 else 0))
    return tuple(dims), m.end()


@reader("window")
def _read_window(src: SourceText, pos: int) -> tuple[Window, int]:
    open_at = _ws(src, pos)
    pos = src.expect(pos, "{", "to start a window like {size=3x3 stride=2x2 pad=1_1x1_1}")
    fields: dict[str, list[Any]] = {}
    while True:
        pos = _ws(src, pos)
        if src.text.startswith("}", pos):
            pos += 1
            break
        m = _WORD.match(src.text, pos)
        if not m or not src.text.startswith("=", m.end()):
            raise src.error(pos, f"expected a window field like size=3x3 or '}}', found {src.found(pos)}")
        key = m.group(0)
        if key not in ("size", "stride", "pad", "lhs_dilate", "rhs_dilate", "rhs_reversal"):
            raise src.error(
                pos, f"unknown window field '{key}' (known: size, stride, pad, lhs_dilate, rhs_dilate, rhs_reversal)"
            )
        if key in fields:
            raise src.error(pos, f"window field '{key}' appears twice")
        pos = m.end() + 1
        if key == "pad":
            v = _PAD.match(src.text, pos)
            if not v:
                raise src.error(pos, f"expected window padding like 1_1x0_2, found {src.found(pos)}")
            pairs = [part.split("_") for part in v.group(0).split("x")]
            if any(len(p) != 2 for p in pairs):
                raise src.error(pos, "window padding has low_high per dimension, not low_high_interior")
            fields[key] = [(int(a), int(b)) for a, b in pairs]
        else:
            v = _DXD.match(src.text, pos)
            if not v:
                raise src.error(pos, f"expected sizes like 3x3 for window field '{key}', found {src.found(pos)}")
            fields[key] = [int(x) for x in v.group(0).split("x")]
        pos = v.end()
    sizes = fields.get("size", [])
    for key, values in fields.items():
        if len(values) != len(sizes):
            raise src.error(open_at, f"window field '{key}' has {len(values)} dimensions but size= has {len(sizes)}")
    n = len(sizes)
    stride = fields.get("stride", [1] * n)
    pad = fields.get("pad", [(0, 0)] * n)
    lhs = fields.get("lhs_dilate", [1] * n)
    rhs = fields.get("rhs_dilate", [1] * n)
    rev = fields.get("rhs_reversal", [0] * n)
    dims = tuple(WindowDim(sizes[i], stride[i], pad[i][0], pad[i][1], lhs[i], rhs[i], rev[i] == 1) for i in range(n))
    return Window(dims), pos


@reader("dim_labels")
def _read_dim_labels(src: SourceText, pos: int) -> tuple[ConvDims | Raw, int]:
    pos = _ws(src, pos)
    m = _DIM_LABELS.match(src.text, pos)
    if not m:
        raise src.error(pos, f"expected convolution dimension labels like b01f_01io->b01f, found {src.found(pos)}")
    if "?" in m.group(0):
        # XLA prints '?' for dimensions a custom-call does not use (dim_labels=?b01f_0?1io->b01?f); ConvDims
        # cannot say where they are, so such labels are kept verbatim.
        return Raw(src.original[m.start() : m.end()]), m.end()
    parts = []
    for label, (a, b), what in zip(m.groups(), (("b", "f"), ("i", "o"), ("b", "f")), ("input", "kernel", "output")):
        if len(set(label)) != len(label):
            raise src.error(pos, f"the {what} labels {label!r} repeat a dimension")
        spatial = sorted((c, i) for i, c in enumerate(label) if c.isdigit())
        if a not in label or b not in label or [c for c, _ in spatial] != [str(k) for k in range(len(spatial))]:
            raise src.error(pos, f"the {what} labels {label!r} need '{a}', '{b}' and spatial digits 0..n-1")
        parts.append((label.index(a), label.index(b), tuple(i for _, i in spatial)))
    (ib, if_, isp), (ki, ko, ksp), (ob, of, osp) = parts
    if not len(isp) == len(ksp) == len(osp):
        raise src.error(pos, f"input, kernel and output have {len(isp)}, {len(ksp)} and {len(osp)} spatial dimensions")
    return ConvDims(ib, if_, isp, ki, ko, ksp, ob, of, osp), m.end()


@reader("precision")
def _read_precision(src: SourceText, pos: int) -> tuple[tuple[str, ...], int]:
    start = "to start an operand precision list like {default,highest}"
    return _braced_list(src, pos, start, _read_one_precision, "or ',' in an operand precision list")


def _read_one_precision(src: SourceText, pos: int) -> tuple[str, int]:
    pos = _ws(src, pos)
    m = _WORD.match(src.text, pos)
    if not m or m.group(0).lower() not in ("default", "high", "highest", "packed_nibble"):
        raise src.error(pos, f"expected a precision (default, high, highest), found {src.found(pos)}")
    return m.group(0).lower(), m.end()


def read_shape(src: SourceText, pos: int) -> tuple[AnyShape, int]:
    """Read one shape with :class:`tpusim.memory.ShapeReader`, turning its errors into HLO parse errors."""
    reader_ = ShapeReader(src.text, src.skip_ws(pos), src.source)
    try:
        shape = reader_.read_shape()
    except LayoutError as err:
        raise src.error(err.offset, err.message) from None
    return shape, reader_.pos


reader("replica_groups")(read_replica_groups)


@reader("shape")
def _read_shape(src: SourceText, pos: int) -> tuple[AnyShape, int]:
    return read_shape(src, pos)


@reader("shapes")
def _read_shapes(src: SourceText, pos: int) -> tuple[tuple[AnyShape, ...], int]:
    return _braced_list(src, pos, "to start a list of shapes", read_shape, "or ',' in a list of shapes")


@reader("program_shape")
def _read_program_shape(src: SourceText, pos: int) -> tuple[ProgramShape, int]:
    start = _ws(src, pos)
    pos = src.expect(start, "{", "to start the computation layout {(parameters)->result}")
    pos = src.expect(pos, "(", "before the parameter shapes")
    params: list[AnyShape] = []
    pos = _ws(src, pos)
    if not src.text.startswith(")", pos):
        while True:
            shape, pos = read_shape(src, pos)
            params.append(shape)
            pos = _ws(src, pos)
            if src.text.startswith(",", pos):
                pos += 1
                continue
            break
    pos = src.expect(pos, ")", "or ',' after a parameter shape")
    pos = src.expect(pos, "->", "before the result shape")
    result, pos = read_shape(src, pos)
    pos = src.expect(pos, "}", "to end the computation layout")
    return ProgramShape(tuple(params), result, src.original[start:pos]), pos


@reader("typed_literal")
def _read_typed_literal(src: SourceText, pos: int) -> tuple[Any, int]:
    """``literal=s32[2]{0} {1, 2}``, ``literal=f32[] 0.1`` or a tuple ``( s32[2] {1, 2}, pred[] 1 )``."""
    from tpusim.compiler.hlo.literals import parse_literal, written_shape

    pos = src.skip_ws(pos)
    if src.text.startswith("(", pos):
        elements = []
        pos = src.skip_ws(pos + 1)
        while not src.text.startswith(")", pos):
            element, pos = _read_typed_literal(src, pos)
            elements.append(element)
            pos = src.skip_ws(pos)
            if src.text.startswith(",", pos):
                pos = src.skip_ws(pos + 1)
            elif not src.text.startswith(")", pos):
                raise src.error(pos, f"expected ',' or ')' in a tuple literal, found {src.found(pos)}")
        return Literal(TupleShape(tuple(e.shape for e in elements)), None, tuple(elements)), pos + 1
    written = written_shape(src, pos)
    if written is None:
        raise src.error(pos, f"expected a shape and a value like s32[2] {{1, 2}}, found {src.found(pos)}")
    return parse_literal(src, pos, written[0])


@reader("raw")
def _read_raw(src: SourceText, pos: int) -> tuple[Raw, int]:
    m = _FLAT_BRACES.match(src.text, pos)
    if m is not None:  # the common case (metadata): one level of braces, strings inside
        return Raw(src.original[m.start(1) : m.end(1)]), m.end()
    start = _ws(src, pos)
    text = src.text
    ch = text[start : start + 1]
    if ch == "{":
        end = src.match_brace(start, "the attribute value")
    elif ch in ("'", '"'):
        m = STRING.match(text, start)
        if not m:
            raise src.error(start, "unterminated string in the attribute value")
        end = m.end()
    else:
        m = _BARE.match(text, start)
        if not m:
            raise src.error(start, f"expected an attribute value, found {src.found(start)}")
        end = m.end()
    return Raw(src.original[start:end]), end
