"""Reading HLO module text into a :class:`~tpusim.compiler.hlo.ir.Module`.

Accepts every form XLA prints (xla/hlo/parser/hlo_parser.cc is the reference grammar):

* the default form (``HloModule m, entry_computation_layout={...}``, ``%names``, ``ENTRY %main (p: f32[2])
  -> f32[2] {``, ``metadata={...}``, the FileNames / FunctionNames / FileLocations / StackFrames tables)
  and the short form JAX prints (``jax.jit(f).lower(x).as_text(dialect="hlo")``);
* modules before and after optimisation: fusions, scheduled modules, layouts with tiles and memory
  spaces on every shape, async ops in XLA's short form (``custom-call-start``), comments.

The parser walks the text once with position-anchored compiled regexes. Shapes are read by
:class:`tpusim.memory.ShapeReader` and cached by their text; constants are converted in bulk by numpy.
Every error is an :class:`HloParseError` with file, line, column, the line, a caret, and what was
expected and found.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from tpusim.compiler.hlo.attributes import ALIASES, ATTRIBUTE_KINDS, KIND_READERS
from tpusim.compiler.hlo.errors import HloParseError
from tpusim.compiler.hlo.ir import _CALL_ATTRIBUTES, Attributes, Computation, Instruction, Module, Raw, SourceLoc
from tpusim.compiler.hlo.lexer import NAME, SourceText, unescape
from tpusim.compiler.hlo.literals import parse_literal
from tpusim.compiler.hlo.opcodes import COMMON_ATTRIBUTES, OPCODE_ALIASES, OPCODES, OpcodeInfo, lookup_async
from tpusim.compiler.hlo.shape_rules import compatible
from tpusim.errors import LayoutError
from tpusim.gcpause import paused_gc
from tpusim.memory import AnyShape, ShapeReader
from tpusim.paths import InputPathError, regular_file_problem

__all__ = ["decode_text", "load_module", "parse_module", "read_hlo_text"]

_HEADER = re.compile(r"\s*HloModule\b\s*")
_ATTR = re.compile(r"\s*,\s*([A-Za-z_][A-Za-z0-9_\-]*)\s*=")
_INSTR = re.compile(r"\s*(?:(ROOT)\s+)?%?([A-Za-z_][A-Za-z0-9_.\-]*)\s*=\s*")
_OPERAND_NAME = re.compile(r"%?([A-Za-z_][A-Za-z0-9_.\-]*)")
_OPCODE = re.compile(r"(?<![A-Za-z0-9_\-])([a-z][a-z0-9\-]*)\s*\(")
_OPERANDS = re.compile(r"\s*((?:%?[A-Za-z_][A-Za-z0-9_.\-]*\s*,\s*)*%?[A-Za-z_][A-Za-z0-9_.\-]*)?\s*\)")
_PARAMETER = re.compile(r"\s*(\d+)\s*\)")
_SECTION = re.compile(r"\s*(FileNames|FunctionNames|FileLocations|StackFrames)\b")
_SECTION_ENTRY = re.compile(r"\s*(\d+)\s+")
_ENTRY = re.compile(r"\s*ENTRY\b\s*")
_META_FIELD = re.compile(
    r"""\b(op_name|source_file|source_line|stack_frame_id)=(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|(-?\d+))"""
)
_SIMPLE_SHAPE = re.compile(r"[a-z][a-z0-9]*\[[0-9,]*\](?:\{[0-9,]*\})?(?![{\w])")
_FIELD = re.compile(r"\b([a-z_]+)=(-?\d+)")
_HINTS = {
    "cos": "cosine",
    "sin": "sine",
    "exp": "exponential",
    "expm1": "exponential-minus-one",
    "log1p": "log-plus-one",
    "clz": "count-leading-zeros",
    "optimization-barrier": "opt-barrier",
    "population-count": "popcnt",
}

_HEADER_KINDS = {
    "is_scheduled": "bool",
    "replica_count": "int",
    "num_partitions": "int",
    "alias_passthrough_params": "bool",
    "entry_computation_layout": "program_shape",
    "input_output_alias": "raw",
    "buffer_donor": "raw",
    "frontend_attributes": "raw",
    "allow_spmd_sharding_propagation_to_parameters": "raw",
    "allow_spmd_sharding_propagation_to_output": "raw",
    "origin_recovery_table": "raw",
}


def parse_module(text: str, source: str | None = None, *, verify: bool = True) -> Module:
    """Parse HLO module text.

    Args:
        text: the module as XLA prints it (default or short form).
        source: the file name to show in errors and source locations, or None.
        verify: run :func:`~tpusim.compiler.hlo.verifier.verify_module` on the result.

    Returns:
        The module, with typed attribute values (see docs/hlo.md).

    Raises:
        HloParseError: the text is not HLO; the message has file, line, column and a caret.
        HloVerifyError: (when ``verify``) the module breaks an HLO rule.
    """
    with paused_gc():  # (hundreds of thousands of small acyclic objects, see tpusim.gcpause)
        module = _Parser(text, source).module()
    if verify:
        from tpusim.compiler.hlo.verifier import verify_module

        verify_module(module)
    return module


def load_module(path: str | Path, *, verify: bool = True) -> Module:
    """Read and parse the HLO text file at ``path`` (verified by default); a ``.gz`` file is read through gzip."""
    path = Path(path)
    return parse_module(read_hlo_text(path), str(path), verify=verify)


def read_hlo_text(path: Path) -> str:
    """The text of an HLO file (through gzip for a ``.gz`` file), as UTF-8.

    Raises:
        HloParseError: not gzip (for ``.gz``) or not UTF-8, saying where.
    """
    problem = regular_file_problem(path)
    if problem:
        raise InputPathError(f"{path} {problem}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputPathError(f"cannot open {path}: {e.strerror}") from None
    if path.suffix == ".gz":
        import gzip

        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise HloParseError(f"{path} is not a readable gzip file ({err})", "", 0, str(path)) from None
    return decode_text(data, str(path))


def decode_text(data: bytes, source: str) -> str:
    """``data`` as UTF-8 text, or an :class:`HloParseError` at the first byte that is not UTF-8 (its byte
    offset, line and column in the message)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        at = err.start
        line = data.count(b"\n", 0, at) + 1
        column = at - (data.rfind(b"\n", 0, at) + 1) + 1
        what = f"byte 0x{data[at]:02x} at byte offset {at} (line {line}, byte {column} of the line) is not UTF-8"
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            what += "; the file is UTF-16 (it starts with a UTF-16 byte-order mark): convert it to UTF-8"
        elif b"\0" in data[:1024]:
            what += "; the file looks binary: tpusim reads HLO text (an HLO proto is not text)"
        text = data.decode("utf-8", errors="replace")
        offset = len(data[:at].decode("utf-8"))  # (everything before the first bad byte decodes)
        raise HloParseError(what, text, offset, source) from None


class _Parser:
    def __init__(self, text: str, source: str | None) -> None:
        self.src = SourceText(text, source)
        self.src.check_integers()
        self.text = self.src.text
        self.source = source
        self.shapes: dict[str, AnyShape] = {}
        self.computations: list[Computation] = []
        self.computation_at: dict[str, int] = {}
        self.frames: dict[int, tuple[str | None, int | None, str | None]] = {}  # file, line, function
        self._line_pos = 0
        self._line_no = 1

    # ----------------------------------------------------------------------------------------- module
    def module(self) -> Module:
        src, text = self.src, self.text
        pos = 0
        name = None
        header: list[tuple[str, Any]] = []
        m = _HEADER.match(text, pos)
        if m:
            name, pos = src.name(m.end(), "the module name after HloModule")
            pos = self._attributes(pos, header, _HEADER_KINDS, "the HloModule header")
        elif not text.strip():
            raise src.error(0, "expected 'HloModule name' or a computation, found an empty text")
        sections, pos = self._sections(pos)
        entry: str | None = None
        while True:
            pos = src.skip_ws(pos)
            if pos >= len(text):
                break
            m = _ENTRY.match(text, pos)
            if m and entry is not None:
                raise src.error(pos, f"a second ENTRY computation (the first is {entry})")
            computation, pos = self._computation(m.end() if m else pos, is_entry=bool(m))
            if m:
                entry = computation.name
        if not self.computations:
            raise src.error(pos, "expected at least one computation, found end of text")
        if entry is None:  # XLA: without ENTRY, the last computation is the entry.
            last = replace(self.computations[-1], is_entry=True)
            self.computations[-1] = last
            entry = last.name
        return Module(name or f"module_{entry}", tuple(self.computations), entry, Attributes(header), sections)

    def _attributes(self, pos: int, out: list[tuple[str, Any]], kinds: dict[str, str], where: str) -> int:
        src, text = self.src, self.text
        while True:
            m = _ATTR.match(text, pos)
            if not m:
                return pos
            key = m.group(1)
            if key not in kinds:
                raise src.error(m.start(1), f"unknown attribute '{key}' in {where} (known: {', '.join(kinds)})")
            if any(k == key for k, _ in out):
                raise src.error(m.start(1), f"attribute '{key}' appears twice in {where}")
            value, pos = KIND_READERS[kinds[key]](src, m.end())
            out.append((key, value))

    def _sections(self, pos: int) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], int]:
        """The FileNames / FunctionNames / FileLocations / StackFrames tables after the header."""
        src, text = self.src, self.text
        sections: list[tuple[str, tuple[str, ...]]] = []
        tables: dict[str, dict[int, str]] = {}
        while True:
            m = _SECTION.match(text, pos)
            if not m:
                break
            title = m.group(1)
            if title in tables:
                raise src.error(m.start(1), f"a second {title} table")
            pos = m.end()
            lines: list[str] = []
            table: dict[int, str] = {}
            while True:
                e = _SECTION_ENTRY.match(text, pos)
                if not e:
                    break
                value_at = e.end()
                if title in ("FileNames", "FunctionNames"):
                    value, end = src.string(value_at, f"an entry of {title}")
                else:
                    if not text.startswith("{", value_at):
                        raise src.error(
                            value_at, f"expected '{{' to start an entry of {title}, found {src.found(value_at)}"
                        )
                    end = src.match_brace(value_at, f"an entry of {title}")
                    value = text[value_at:end]
                table[int(e.group(1))] = value
                lines.append(src.original[e.start(1) : end])
                pos = end
            tables[title] = table
            sections.append((title, tuple(lines)))
        self._resolve_frames(tables)
        return tuple(sections), pos

    def _resolve_frames(self, tables: dict[str, dict[int, str]]) -> None:
        files = tables.get("FileNames", {})
        functions = tables.get("FunctionNames", {})
        locations = {}
        for k, body in tables.get("FileLocations", {}).items():
            fields = {f: int(v) for f, v in _FIELD.findall(body)}
            function = functions.get(fields.get("function_name_id", 0))
            locations[k] = (files.get(fields.get("file_name_id", 0)), fields.get("line"), function)
        for k, body in tables.get("StackFrames", {}).items():
            fields = {f: int(v) for f, v in _FIELD.findall(body)}
            self.frames[k] = locations.get(fields.get("file_location_id", 0), (None, None, None))

    # ------------------------------------------------------------------------------------ computation
    def _computation(self, pos: int, is_entry: bool) -> tuple[Computation, int]:
        src, text = self.src, self.text
        name_at = src.skip_ws(pos)
        name, pos = src.name(name_at, "a computation name (or ENTRY)")
        if name == "HloModule" and not is_entry:
            raise src.error(name_at, "a second HloModule header: the text holds several modules, parse them one by one")
        if name in self.computation_at:
            line = self.src.original.count("\n", 0, self.computation_at[name]) + 1
            raise src.error(name_at, f"computation {name} is defined twice (first at line {line})")
        signature: AnyShape | None = None
        params: list[tuple[str, AnyShape, int]] = []
        pos = src.skip_ws(pos)
        sig_at = pos
        if text.startswith("(", pos):
            params, signature, pos = self._signature(pos)
        pos = src.skip_ws(pos)
        if not text.startswith("{", pos):
            raise src.error(pos, f"expected '{{' to start the body of computation {name}, found {src.found(pos)}")
        instructions, root, pos = self._body(pos + 1, name)
        attrs: list[tuple[str, Any]] = []
        pos = self._attributes(pos, attrs, {"execution_thread": "string"}, f"computation {name}")
        if signature is not None and not compatible(signature, instructions[root].shape):
            raise src.error(
                sig_at,
                f"computation {name} declares result {signature} but its root %{root} has shape "
                f"{instructions[root].shape}",
            )
        if signature is not None:
            self._check_signature_parameters(name, sig_at, params, instructions)
        computation = Computation(name, tuple(instructions.values()), root, is_entry, Attributes(attrs))
        self.computation_at[name] = name_at
        self.computations.append(computation)
        return computation, pos

    def _check_signature_parameters(
        self, name: str, sig_at: int, params: list[tuple[str, AnyShape, int]], instructions: dict[str, Instruction]
    ) -> None:
        """The signature's parameters must be the parameter instructions: as many, with their shapes (layouts
        ignored, as for the result). Names may differ (XLA does not read them)."""
        by_number = {i.attr("parameter_number"): i for i in instructions.values() if i.opcode == "parameter"}
        if len(params) != len(by_number):
            listed = ", ".join(p for p, _, _ in params) or "none"
            raise self.src.error(
                sig_at,
                f"computation {name} declares {len(params)} parameter(s) ({listed}) but has {len(by_number)} "
                "parameter instruction(s)",
            )
        for k, (param, shape, at) in enumerate(params):
            instr = by_number.get(k)
            if instr is not None and not compatible(shape, instr.shape):
                raise self.src.error(
                    at,
                    f"computation {name} declares parameter {param} as {shape} but parameter({k}) %{instr.name} "
                    f"has shape {instr.shape}",
                )

    def _signature(self, pos: int) -> tuple[list[tuple[str, AnyShape, int]], AnyShape, int]:
        """``(p0: f32[2], p1: s32[]) -> f32[2]``: the parameters as ``(name, shape, offset of the name)``, the
        result shape and the end; the parameters are the instructions (checked against them after the body)."""
        src, text = self.src, self.text
        pos = src.skip_ws(pos + 1)
        params: list[tuple[str, AnyShape, int]] = []
        if not text.startswith(")", pos):
            while True:
                at = src.skip_ws(pos)
                param, pos = src.name(pos, "a parameter name in the computation's signature")
                pos = src.expect(pos, ":", f"after parameter {param} in the signature")
                shape, pos = self._shape(src.skip_ws(pos))
                params.append((param, shape, at))
                pos = src.skip_ws(pos)
                if text.startswith(",", pos):
                    pos += 1
                    continue
                break
        pos = src.expect(pos, ")", "or ',' in the computation's parameter list")
        pos = src.expect(pos, "->", "between the parameter list and the result shape")
        result, pos = self._shape(src.skip_ws(pos))
        return params, result, pos

    def _body(self, pos: int, computation: str) -> tuple[dict[str, Instruction], str, int]:
        src, text = self.src, self.text
        instructions: dict[str, Instruction] = {}
        root: str | None = None
        match_instruction = _INSTR.match
        while True:
            m = match_instruction(text, pos)
            if m is None:
                pos = src.skip_ws(pos)
                if text.startswith("}", pos):
                    pos += 1
                    break
                if pos >= len(text):
                    raise src.error(pos, f"computation {computation} is never closed: expected '}}', found end of text")
                raise src.error(
                    pos,
                    f"expected an instruction 'name = shape opcode(operands)' or '}}' in computation "
                    f"{computation}, found {src.found(pos)}",
                )
            name = m.group(2)
            if name in instructions:
                line = _line(instructions[name])
                raise src.error(
                    m.start(2),
                    f"instruction %{name} is defined twice in computation {computation} (first at line {line})",
                )
            instruction, pos = self._instruction(m.end(), name, m.start(2), instructions, computation)
            if m.group(1):
                if root is not None:
                    raise src.error(
                        m.start(1),
                        f"a second ROOT in computation {computation} (the first is "
                        f"%{root} at line {_line(instructions[root])})",
                    )
                root = name
            instructions[name] = instruction
        if not instructions:
            raise src.error(pos - 1, f"computation {computation} has no instructions")
        return instructions, root if root is not None else next(reversed(instructions)), pos

    # ------------------------------------------------------------------------------------ instruction
    def _instruction(
        self, pos: int, name: str, name_at: int, defined: dict[str, Instruction], computation: str
    ) -> tuple[Instruction, int]:
        # NOTE: this is the hot path (one call per instruction): regexes anchored at `pos`, few calls.
        src, text = self.src, self.text
        line_end = text.find("\n", pos)
        om = _OPCODE.search(text, pos, len(text) if line_end < 0 else line_end)
        if om is None:
            om = _OPCODE.search(text, pos, pos + 4096)
        shape = self.shapes.get(text[pos : om.start()]) if om else None
        if shape is None and om is not None and src.skip_ws(pos) == om.start():
            raise src.error(om.start(), f"expected the result shape of %{name} before its opcode {om.group(1)}")
        if shape is None:
            shape, end = self._shape(pos)
            end = src.skip_ws(end)
            if om is None or end != om.start():
                raise src.error(end, f"expected an opcode and '(' after the shape of %{name}, found {src.found(end)}")
            self.shapes[text[pos : om.start()]] = shape
        assert om is not None  # the branch above raised otherwise
        opcode = om.group(1)
        info = OPCODES.get(OPCODE_ALIASES.get(opcode, opcode))
        wrapped: OpcodeInfo | None = None
        attrs: list[tuple[str, Any]] = []
        if info is None:
            sugar = lookup_async(opcode)
            if sugar is None:
                raise src.error(om.start(1), _unknown_opcode(opcode))
            info, wrapped = OPCODES[sugar[0]], OPCODES[sugar[1]]
            attrs.append(("async_wrapped_opcode", wrapped.name))
            if info.name != "async-start":
                wrapped = None  # -update and -done take only the async attributes (XLA parses no wrapped ones)
        pos = om.end()
        operands: tuple[str, ...] = ()
        opcode = info.name
        if opcode == "parameter":
            p = _PARAMETER.match(text, pos)
            if not p:
                raise src.error(pos, f"expected the parameter number and ')' in parameter(N), found {src.found(pos)}")
            attrs.append(("parameter_number", int(p.group(1))))
            pos = p.end()
        elif opcode == "constant":
            literal, pos = parse_literal(src, pos, shape)
            attrs.append(("literal", literal))
            pos = src.expect(pos, ")", f"to end the value of constant %{name}")
        else:
            p = _OPERANDS.match(text, pos)
            if p:
                group = p.group(1)
                if group:
                    operands = tuple(_OPERAND_NAME.findall(group))
                    for operand in operands:
                        if operand not in defined:
                            raise src.error(text.find(operand, pos, p.end()), _undefined(operand, defined, computation))
                pos = p.end()
            else:
                operands, pos = self._operands_slow(pos, defined, computation)
        spec = wrapped if wrapped is not None else info
        metadata = None
        m = _ATTR.match(text, pos)
        if m is not None:
            readers = _readers(info, wrapped)
            while m is not None:
                printed = m.group(1)
                key = ALIASES.get(printed, printed)
                read = readers.get(key)
                if read is None:
                    raise src.error(m.start(1), _unknown_attribute(printed, info, wrapped))
                if any(k == key for k, _ in attrs):
                    raise src.error(m.start(1), f"attribute '{printed}' appears twice on %{name}")
                value, pos = read(src, m.end())
                if key in _CALL_ATTRIBUTES:
                    self._check_callees(value, key, m.end())
                elif key == "metadata":
                    metadata = value
                attrs.append((key, value))
                m = _ATTR.match(text, pos)
        if spec.required:
            missing = spec.required.difference(k for k, _ in attrs)
            if missing:
                raise src.error(om.start(1), f"{spec.name} %{name} needs attribute(s) {', '.join(sorted(missing))}")
        if opcode == "async-start" and wrapped is None and not any(k == "calls" for k, _ in attrs):
            raise src.error(om.start(1), f"async-start %{name} needs attribute calls (or XLA's short form X-start)")
        n = len(operands)
        if (n < spec.min_operands or (spec.max_operands is not None and n > spec.max_operands)) and opcode not in (
            "parameter",
            "constant",
        ):
            raise src.error(om.end(), f"{spec.name} takes {spec.arity_text()}, found {n}")
        return Instruction(name, opcode, shape, operands, Attributes(attrs), self._loc(name_at, metadata)), pos

    def _check_callees(self, value: Any, key: str, at: int) -> None:
        for callee in value if isinstance(value, tuple) else (value,):
            if callee not in self.computation_at:
                raise self.src.error(self.src.skip_ws(at), self._undefined_computation(callee, key))

    def _shape(self, pos: int) -> tuple[AnyShape, int]:
        """Read a shape at ``pos``; plain array shapes are cached by their text."""
        m = _SIMPLE_SHAPE.match(self.text, pos)
        if m:
            shape = self.shapes.get(m.group(0))
            if shape is not None:
                return shape, m.end()
        reader = ShapeReader(self.text, pos, self.source)
        try:
            shape = reader.read_shape()
        except LayoutError as err:
            raise self.src.error(err.offset, err.message) from None
        if m and reader.pos == m.end():
            self.shapes[m.group(0)] = shape
        return shape, reader.pos

    def _operands_slow(
        self, pos: int, defined: dict[str, Instruction], computation: str
    ) -> tuple[tuple[str, ...], int]:
        """Operands in the long form (``f32[2]{0} %x``) or with odd spacing; checks declared shapes."""
        src, text = self.src, self.text
        out: list[str] = []
        pos = src.skip_ws(pos)
        if text.startswith(")", pos):
            return (), pos + 1
        while True:
            pos = src.skip_ws(pos)
            declared: AnyShape | None = None
            if not NAME.match(text, pos) or _looks_like_shape(text, pos):
                declared, pos = self._shape(pos)
                pos = src.skip_ws(pos)
            at = pos
            operand, pos = src.name(pos, "an operand name")
            after = src.skip_ws(pos)
            if text.startswith("=", after):
                raise src.error(at, f"expected ')' to end the operands, found the attribute '{operand}='")
            if text.startswith("(", after):
                raise src.error(
                    at,
                    f"expected an operand name, found the nested instruction '{operand}(...)' "
                    "(not supported: define it on its own line)",
                )
            if operand not in defined:
                raise src.error(at, _undefined(operand, defined, computation))
            if declared is not None and not compatible(declared, defined[operand].shape):
                raise src.error(
                    at, f"operand %{operand} is written with shape {declared} but has shape {defined[operand].shape}"
                )
            out.append(operand)
            pos = src.skip_ws(pos)
            if text.startswith(",", pos):
                pos += 1
                continue
            return tuple(out), src.expect(pos, ")", "or ',' after an operand")

    def _undefined_computation(self, callee: str, key: str) -> str:
        known = list(self.computation_at)
        close = difflib.get_close_matches(callee, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        where = f" (defined so far: {', '.join(known[-8:])})" if known else " (none is defined before this point)"
        return f"{key} names computation {callee}, which is not defined before this point{where}{hint}"

    def _loc(self, pos: int, metadata: Raw | None) -> SourceLoc:
        text = self.text
        if pos < self._line_pos:
            self._line_pos, self._line_no = 0, 1
        self._line_no += text.count("\n", self._line_pos, pos)
        self._line_pos = pos
        column = pos - text.rfind("\n", 0, pos)
        if metadata is None:
            return SourceLoc(self._line_no, column, self.source)
        op_name = source_file = source_line = frame = None
        for m in _META_FIELD.finditer(metadata.text):
            field, double_quoted, single_quoted, int_value = m.groups()
            text_value = double_quoted if double_quoted is not None else single_quoted
            if field == "op_name":
                op_name = unescape(text_value or "")
            elif field == "source_file":
                source_file = unescape(text_value or "")
            elif field == "source_line":
                source_line = int(int_value) if int_value else None
            else:
                frame = int(int_value) if int_value else None
        function = None
        if source_file is None and frame in self.frames:
            source_file, source_line, function = self.frames[frame]
        return SourceLoc(self._line_no, column, self.source, op_name, source_file, source_line, function)


def _line(instruction: Instruction) -> int:
    return instruction.loc.line if instruction.loc is not None else 0


def _looks_like_shape(text: str, pos: int) -> bool:
    m = NAME.match(text, pos)
    return bool(m and not m.group(0).startswith("%") and text.startswith("[", m.end()))


_READERS: dict[tuple[str, str | None], dict[str, Any]] = {}


def _readers(info: OpcodeInfo, wrapped: OpcodeInfo | None) -> dict[str, Any]:
    """Attribute key -> value reader, for the keys ``info`` (and the op it wraps) accept."""
    cache_key = (info.name, wrapped.name if wrapped is not None else None)
    table = _READERS.get(cache_key)
    if table is None:
        table = {}
        for spec in (info, wrapped) if wrapped is not None else (info,):
            kinds = dict(spec.kinds)
            for key in (*spec.required, *spec.optional, *COMMON_ATTRIBUTES):
                if key in ATTRIBUTE_KINDS or key in kinds:
                    table[key] = KIND_READERS[kinds.get(key) or ATTRIBUTE_KINDS[key]]
        _READERS[cache_key] = table
    return table


def _unknown_attribute(printed: str, info: OpcodeInfo, wrapped: OpcodeInfo | None) -> str:
    spec = wrapped if wrapped is not None else info
    shown = wrapped.name + "-start" if wrapped is not None else info.name
    allowed = ", ".join(spec.attribute_names) or "only metadata, sharding, backend_config and the like"
    close = difflib.get_close_matches(printed, [*spec.attribute_names, *COMMON_ATTRIBUTES], n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown attribute '{printed}' for opcode {shown} (allowed: {allowed}){hint}"


def _unknown_opcode(opcode: str) -> str:
    close = difflib.get_close_matches(opcode, OPCODES, n=3, cutoff=0.6)
    if opcode in _HINTS:
        close = [_HINTS[opcode], *[c for c in close if c != _HINTS[opcode]]]
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"unknown opcode '{opcode}'{hint}"


def _undefined(operand: str, defined: dict[str, Instruction], computation: str) -> str:
    close = difflib.get_close_matches(operand, list(defined), n=1)
    hint = f"; did you mean %{close[0]}?" if close else ""
    return f"operand %{operand} is not defined before this point in computation {computation}{hint}"
