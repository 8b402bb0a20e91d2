"""Printing a :class:`~tpusim.compiler.hlo.ir.Module` as HLO text that parses back to an equal module.

The output is XLA's default form (``%names``, computation signatures, ``ENTRY``), with every constant in
full and every typed attribute value written back in XLA's syntax (one formatter per kind of value, the
same kinds the parser reads). Values kept as :class:`~ir.Raw` are written back verbatim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpusim.compiler.hlo.attributes import ATTRIBUTE_KINDS, PRINTED_NAMES
from tpusim.compiler.hlo.ir import (
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
)
from tpusim.compiler.hlo.lexer import escape
from tpusim.compiler.hlo.literals import format_literal
from tpusim.compiler.hlo.opcodes import OPCODES

__all__ = ["FORMATTERS", "format_value", "print_computation", "print_instruction", "print_module"]

FORMATTERS: dict[str, Callable[[Any], str]] = {}
"""Kind of attribute value -> formatter (the inverse of ``attributes.KIND_READERS``)."""

_HEADER_KINDS = {
    "is_scheduled": "bool",
    "alias_passthrough_params": "bool",
    "replica_count": "int",
    "num_partitions": "int",
    "entry_computation_layout": "program_shape",
}
_ASYNC_SUFFIX = {"async-start": "-start", "async-update": "-update", "async-done": "-done"}


def formatter(kind: str) -> Callable[[Callable[[Any], str]], Callable[[Any], str]]:
    def deco(fn: Callable[[Any], str]) -> Callable[[Any], str]:
        FORMATTERS[kind] = fn
        return fn

    return deco


def _ints(values: tuple[int, ...]) -> str:
    return "{" + ",".join(str(v) for v in values) + "}"


formatter("int")(str)
formatter("ident")(str)
formatter("string")(escape)
formatter("ints")(_ints)
formatter("float")(repr)


@formatter("bool")
def _bool(value: bool) -> str:
    return "true" if value else "false"


@formatter("intss")
@formatter("pairs")
def _intss(values: tuple[tuple[int, ...], ...]) -> str:
    return "{" + ",".join(_ints(v) for v in values) + "}"


@formatter("computation")
def _computation(name: str) -> str:
    return "%" + name


@formatter("computations")
@formatter("names")
def _names(names: tuple[str, ...]) -> str:
    return "{" + ", ".join("%" + n for n in names) + "}"


@formatter("slice")
def _slice(dims: tuple[SliceDim, ...]) -> str:
    parts = [f"[{d.start}:{d.limit}]" if d.stride == 1 else f"[{d.start}:{d.limit}:{d.stride}]" for d in dims]
    return "{" + ", ".join(parts) + "}"


@formatter("padding")
def _padding(dims: tuple[PadDim, ...]) -> str:
    interior = any(d.interior for d in dims)
    return "x".join(f"{d.low}_{d.high}_{d.interior}" if interior else f"{d.low}_{d.high}" for d in dims)


@formatter("window")
def _window(window: Window) -> str:
    dims = window.dims
    if not dims:
        return "{}"
    parts = ["size=" + "x".join(str(d.size) for d in dims)]
    if any(d.stride != 1 for d in dims):
        parts.append("stride=" + "x".join(str(d.stride) for d in dims))
    if any(d.pad_low or d.pad_high for d in dims):
        parts.append("pad=" + "x".join(f"{d.pad_low}_{d.pad_high}" for d in dims))
    if any(d.lhs_dilate != 1 for d in dims):
        parts.append("lhs_dilate=" + "x".join(str(d.lhs_dilate) for d in dims))
    if any(d.rhs_dilate != 1 for d in dims):
        parts.append("rhs_dilate=" + "x".join(str(d.rhs_dilate) for d in dims))
    if any(d.reversal for d in dims):
        parts.append("rhs_reversal=" + "x".join("1" if d.reversal else "0" for d in dims))
    return "{" + " ".join(parts) + "}"


def _labels(a: str, a_at: int, b: str, b_at: int, spatial: tuple[int, ...]) -> str:
    chars = [""] * (2 + len(spatial))
    chars[a_at], chars[b_at] = a, b
    for i, at in enumerate(spatial):
        chars[at] = str(i)
    return "".join(chars)


@formatter("dim_labels")
def _dim_labels(d: ConvDims | Raw) -> str:
    if isinstance(d, Raw):
        return d.text
    return (
        _labels("b", d.input_batch, "f", d.input_feature, d.input_spatial)
        + "_"
        + _labels("i", d.kernel_input_feature, "o", d.kernel_output_feature, d.kernel_spatial)
        + "->"
        + _labels("b", d.output_batch, "f", d.output_feature, d.output_spatial)
    )


@formatter("precision")
def _precision(values: tuple[str, ...]) -> str:
    return "{" + ",".join(values) + "}"


@formatter("replica_groups")
def _replica_groups(groups: ReplicaGroups) -> str:
    return groups.text or _intss(groups.groups)


@formatter("shape")
def _shape(shape: Any) -> str:
    return str(shape)


@formatter("shapes")
def _shapes(shapes: tuple[Any, ...]) -> str:
    return "{" + ", ".join(str(s) for s in shapes) + "}"


@formatter("program_shape")
def _program_shape(value: ProgramShape) -> str:
    return "{" + str(value) + "}"


@formatter("typed_literal")
def _typed_literal(value: Literal) -> str:
    if value.value is None:
        return "(" + ", ".join(_typed_literal(e) for e in value.tuple_elements) + ")"
    return f"{value.shape} {format_literal(value)}"


@formatter("raw")
def _raw(value: Raw) -> str:
    return value.text


def format_value(key: str, value: Any, opcode: str | None = None) -> str:
    """An attribute value in XLA's syntax, chosen by the kind of ``key`` (for ``opcode``)."""
    kind = None
    if opcode in OPCODES:
        kind = dict(OPCODES[opcode].kinds).get(key)
    kind = kind or ATTRIBUTE_KINDS.get(key) or _HEADER_KINDS.get(key)
    if isinstance(value, Raw):
        return value.text
    if kind is not None:
        return FORMATTERS[kind](value)
    if isinstance(value, bool):
        return _bool(value)
    if isinstance(value, str):
        return escape(value)
    return str(value)


def print_instruction(instruction: Instruction, is_root: bool = False) -> str:
    """One instruction as ``[ROOT ]%name = shape opcode(operands), attributes``."""
    opcode = instruction.opcode
    attrs = instruction.attributes
    wrapped = attrs.get("async_wrapped_opcode")
    shown = wrapped + _ASYNC_SUFFIX[opcode] if wrapped is not None and opcode in _ASYNC_SUFFIX else opcode
    skip = {"async_wrapped_opcode"}
    if opcode == "parameter":
        inside = str(attrs.get("parameter_number"))
        skip.add("parameter_number")
    elif opcode == "constant" and isinstance(attrs.get("literal"), Literal):
        inside = format_literal(attrs["literal"])
        skip.add("literal")
    else:
        inside = ", ".join("%" + o for o in instruction.operands)
    spec_opcode = wrapped if wrapped is not None else opcode
    parts = [f"{'ROOT ' if is_root else ''}%{instruction.name} = {instruction.shape} {shown}({inside})"]
    for key, value in attrs.items():
        if key not in skip:
            parts.append(f"{PRINTED_NAMES.get(key, key)}={format_value(key, value, spec_opcode)}")
    return ", ".join(parts)


def print_computation(computation: Computation) -> str:
    """A computation with its signature, instructions in order and the ROOT marked."""
    params = []
    for p in computation.instructions:
        if p.opcode == "parameter":
            params.append((p.attr("parameter_number", 0) if isinstance(p.attr("parameter_number"), int) else 0, p))
    params.sort(key=lambda t: t[0])
    signature = ", ".join(f"{p.name}: {p.shape}" for _, p in params)
    result = computation[computation.root].shape if computation.root in computation else None
    head = f"{'ENTRY ' if computation.is_entry else ''}%{computation.name} ({signature})"
    if result is not None:
        head += f" -> {result}"
    lines = [head + " {"]
    for instruction in computation.instructions:
        lines.append("  " + print_instruction(instruction, instruction.name == computation.root))
    tail = "}"
    for key, value in computation.attributes.items():
        tail += f", {key}={escape(value) if isinstance(value, str) else format_value(key, value)}"
    lines.append(tail)
    return "\n".join(lines)


def print_module(module: Module) -> str:
    """The module as HLO text; :func:`~tpusim.compiler.hlo.parser.parse_module` reads it back equal."""
    header = f"HloModule {module.name}"
    for key, value in module.attributes.items():
        header += f", {key}={format_value(key, value)}"
    chunks = [header]
    for title, entries in module.sections:
        chunks.append(title + "".join("\n" + e for e in entries))
    chunks.extend(print_computation(c) for c in module.computations)
    return "\n\n".join(chunks) + "\n"
