"""Reading shape strings exactly as XLA's HLO parser reads them.

Grammar (xla/hlo/parser/hlo_parser.cc, ``ParseShape`` and ``ParseLayout``)::

    shape   ::= '(' [shape (',' shape)*] ')' | type '[' [dim (',' dim)*] ']' [layout]
    dim     ::= '?' | ['<='] int
    layout  ::= '{' [int (',' int)*]
                [':' D(...)? T(...)+? L(n)? #(uN)? *(uN)? E(n)? S(n)? SC(...)+? P(shape)? M(n)?] '}'

The parts after the colon come in that fixed order, each at most once. A ``{`` after the dimensions
starts a layout only when an integer or ``:`` follows it, as in XLA (so ``ENTRY f() -> f32[] {`` works).
Every rejection is a :class:`~tpusim.errors.LayoutError` with a caret under the offending column.
"""

from __future__ import annotations

import re

import numpy as np

from tpusim.errors import LayoutError
from tpusim.memory.dtypes import ELEMENT_TYPES, element_type
from tpusim.memory.shape import (
    COMBINE,
    DIM_LEVEL_TYPES,
    UNBOUNDED,
    AnyShape,
    Layout,
    Shape,
    SplitConfig,
    Tile,
    TupleShape,
)

__all__ = ["ShapeReader", "parse_layout", "parse_shape"]

_INT = re.compile(r"-?\d+")
_INT64_MAX = 2**63 - 1  # XLA's dimension sizes, tiles and layout numbers are int64
MAX_TUPLE_DEPTH = 100
"""How deep tuple shapes may nest. Shapes are nested values and every stage walks them recursively; 100 is
also protobuf's default recursion limit, which a deeper shape would exceed in XLA's own HloModuleProto."""
MAX_RANK = 32 if int(np.__version__.split(".")[0]) >= 2 else 16
"""The most dimensions an array may have: numpy's limit (64 dimensions, 32 before numpy 2) halved, since
tiled layouts and windows add a dimension per dimension."""
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WS = re.compile(r"\s*")
# Order of the parts after the colon; the index of a part must grow strictly.
_PART_ORDER = ("D", "T", "L", "#", "*", "E", "S", "SC", "P", "M")
_PART_NAMES = {
    "D": "dimension level types D(...)",
    "T": "tiles T(...)",
    "L": "tail padding alignment L(n)",
    "#": "index type #(uN)",
    "*": "pointer type *(uN)",
    "E": "element size E(n)",
    "S": "memory space S(n)",
    "SC": "split configs SC(...)",
    "P": "physical shape P(...)",
    "M": "metadata prefix M(n)",
}


class ShapeReader:
    """A cursor over ``text`` that reads shapes and layouts and reports errors at their column.

    The HLO parser uses it in place: start at any offset, read a shape, continue from :attr:`pos`.
    """

    def __init__(self, text: str, pos: int = 0, source: str | None = None) -> None:
        self.text = text
        self.pos = pos
        self.source = source
        self.depth = 0  # tuples open at the cursor

    # ------------------------------------------------------------------ helpers
    def error(self, message: str, offset: int | None = None) -> LayoutError:
        return LayoutError(message, self.text, self.pos if offset is None else offset, self.source)

    def skip_ws(self) -> None:
        m = _WS.match(self.text, self.pos)
        self.pos = m.end() if m else self.pos

    def peek(self) -> str:
        self.skip_ws()
        return self.text[self.pos : self.pos + 1]

    def found(self) -> str:
        """A short description of what stands at the cursor, for error messages."""
        self.skip_ws()
        if self.pos >= len(self.text):
            return "end of text"
        m = _IDENT.match(self.text, self.pos) or _INT.match(self.text, self.pos)
        return repr(m.group(0)) if m else repr(self.text[self.pos])

    def expect(self, ch: str, what: str) -> None:
        if self.peek() != ch:
            raise self.error(f"expected '{ch}' {what}, found {self.found()}")
        self.pos += 1

    def eat(self, ch: str) -> bool:
        if self.peek() == ch:
            self.pos += 1
            return True
        return False

    def read_int(self, what: str) -> tuple[int, int]:
        """Read an integer; returns (value, offset)."""
        self.skip_ws()
        m = _INT.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected {what}, found {self.found()}")
        digits = m.group(0).lstrip("-")
        if len(digits) > 19 or int(digits) > _INT64_MAX:  # (Python refuses to convert over 4300 digits)
            shown = digits if len(digits) <= 30 else f"{digits[:12]}...{digits[-6:]} ({len(digits)} digits)"
            raise self.error(f"integer {shown} does not fit in 64 bits (XLA's largest is {_INT64_MAX})", m.start())
        self.pos = m.end()
        return int(m.group(0)), m.start()

    # ------------------------------------------------------------------ shapes
    def read_shape(self) -> AnyShape:
        """Read one shape (array or tuple) starting at the cursor."""
        if self.eat("("):
            self._enter(self.pos - 1)
            elements: list[AnyShape] = []
            if not self.eat(")"):
                while True:
                    elements.append(self.read_shape())
                    if self.eat(")"):
                        break
                    self.expect(",", "or ')' in a tuple shape")
            self.depth -= 1
            return TupleShape(tuple(elements))
        self.skip_ws()
        start = self.pos
        m = _IDENT.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected an element type or '(', found {self.found()}")
        name = m.group(0)
        if name not in ELEMENT_TYPES:
            raise self.error(f"unknown element type '{name}' (known: {', '.join(ELEMENT_TYPES)})", start)
        self.pos = m.end()
        dims, dynamic = self._read_dims()
        layout: Layout | None = None
        self.skip_ws()
        if self.text.startswith("{", self.pos):
            after = _WS.match(self.text, self.pos + 1)
            nxt = self.text[after.end() : after.end() + 1] if after else ""
            if nxt == ":" or nxt.isdigit() or nxt == "-":
                layout_start = self.pos
                layout = self.read_layout(len(dims))
                try:
                    return Shape(element_type(name), dims, dynamic, layout)
                except LayoutError as err:
                    raise self.error(err.message, layout_start) from None
        return Shape(element_type(name), dims, dynamic, None)

    def _enter(self, at: int) -> None:
        """One more tuple (or physical shape) open at ``at``; raise past :data:`MAX_TUPLE_DEPTH`."""
        if self.depth >= MAX_TUPLE_DEPTH:
            raise self.error(f"shapes nest more than {MAX_TUPLE_DEPTH} deep (tpusim's limit)", at)
        self.depth += 1

    def _read_dims(self) -> tuple[tuple[int, ...], tuple[bool, ...]]:
        self.expect("[", "after the element type")
        dims: list[int] = []
        dynamic: list[bool] = []
        if self.eat("]"):
            return (), ()
        while True:
            self.skip_ws()
            if len(dims) == MAX_RANK:
                raise self.error(f"the shape has more than {MAX_RANK} dimensions (tpusim's limit)")
            if self.eat("?"):
                dims.append(UNBOUNDED)
                dynamic.append(True)
            else:
                bounded = self.text.startswith("<=", self.pos)
                if bounded:
                    self.pos += 2
                value, at = self.read_int("a dimension size, '<=N' or '?'")
                if value < 0:
                    raise self.error(f"dimension size {value} is negative", at)
                dims.append(value)
                dynamic.append(bounded)
            if self.eat("]"):
                return tuple(dims), tuple(dynamic)
            self.expect(",", "or ']' after a dimension size")

    # ------------------------------------------------------------------ layouts
    def read_layout(self, rank: int) -> Layout:
        """Read ``{...}`` for an array of the given rank and check it against the rank."""
        open_at = self.pos
        self.expect("{", "to start a layout")
        m2m: list[int] = []
        m2m_at: list[int] = []
        if self.peek() not in ("}", ":"):
            while True:
                value, at = self.read_int("a dimension number in minor_to_major")
                m2m.append(value)
                m2m_at.append(at)
                if not self.eat(","):
                    break
        self._check_minor_to_major(m2m, m2m_at, rank, open_at)
        fields: dict[str, object] = {}
        if self.eat(":"):
            last = -1
            while self.peek() != "}":
                key, at = self._read_part_key()
                index = _PART_ORDER.index(key)
                if index <= last:
                    earlier = _PART_ORDER[last]
                    if index == last:
                        raise self.error(f"{_PART_NAMES[key]} appears twice in the layout", at)
                    raise self.error(
                        f"{_PART_NAMES[key]} must come before {_PART_NAMES[earlier]} "
                        f"(XLA's order is {' '.join(_PART_ORDER)})",
                        at,
                    )
                last = index
                self._read_part(key, fields, rank)
        self.expect("}", "to end the layout")
        return Layout(tuple(m2m), **fields)  # type: ignore[arg-type]

    def _check_minor_to_major(self, m2m: list[int], at: list[int], rank: int, open_at: int) -> None:
        seen: set[int] = set()
        for value, offset in zip(m2m, at):
            if not 0 <= value < rank:
                raise self.error(f"minor_to_major entry {value} is not a dimension of a rank-{rank} shape", offset)
            if value in seen:
                raise self.error(
                    f"minor_to_major repeats dimension {value}: it must be a permutation of 0..{rank - 1}", offset
                )
            seen.add(value)
        if len(m2m) != rank:
            raise self.error(f"shape has {rank} dimensions but minor_to_major lists {len(m2m)}", open_at)

    def _read_part_key(self) -> tuple[str, int]:
        self.skip_ws()
        at = self.pos
        ch = self.text[self.pos : self.pos + 1]
        if ch in ("#", "*"):
            self.pos += 1
            return ch, at
        m = _IDENT.match(self.text, self.pos)
        if m and m.group(0) in _PART_ORDER:
            self.pos = m.end()
            return m.group(0), at
        raise self.error(f"expected a layout part ({' '.join(_PART_ORDER)}) or '}}', found {self.found()}", at)

    def _read_part(self, key: str, fields: dict[str, object], rank: int) -> None:
        if key == "D":
            fields["dim_level_types"] = self._read_dim_level_types()
        elif key == "T":
            tiles = [self._read_tile()]
            while self.peek() == "(":
                tiles.append(self._read_tile())
            fields["tiles"] = tuple(tiles)
        elif key == "L":
            fields["tail_padding_alignment"] = self._read_paren_int("tail padding alignment", minimum=1)
        elif key in ("#", "*"):
            self.expect("(", f"after '{key}'")
            self.skip_ws()
            at = self.pos
            m = _IDENT.match(self.text, self.pos)
            name = m.group(0) if m else ""
            if name not in ELEMENT_TYPES or ELEMENT_TYPES[name].kind != "unsigned":
                raise self.error(f"expected an unsigned integer type such as u32, found {self.found()}", at)
            self.pos = m.end() if m else self.pos
            self.expect(")", "after the type")
            fields["index_primitive_type" if key == "#" else "pointer_primitive_type"] = name
        elif key == "E":
            fields["element_size_bits"] = self._read_paren_int("element size in bits", minimum=0)
        elif key == "S":
            fields["memory_space"] = self._read_paren_int("memory space", minimum=0)
        elif key == "SC":
            configs = [self._read_split_config()]
            while self.peek() == "(":
                configs.append(self._read_split_config())
            fields["split_configs"] = tuple(configs)
        elif key == "P":
            self.expect("(", "to start the physical shape")
            self._enter(self.pos - 1)
            fields["physical_shape"] = self.read_shape()
            self.depth -= 1
            self.expect(")", "to end the physical shape")
        elif key == "M":
            fields["dynamic_shape_metadata_prefix_bytes"] = self._read_paren_int("metadata prefix bytes", minimum=0)

    def _read_paren_int(self, what: str, minimum: int) -> int:
        self.expect("(", f"to start the {what}")
        value, at = self.read_int(what)
        if value < minimum:
            raise self.error(f"{what} must be at least {minimum}, got {value}", at)
        self.expect(")", f"to end the {what}")
        return value

    def _read_tile(self) -> Tile:
        self.expect("(", "to start a tile")
        dims: list[int] = []
        if self.eat(")"):
            return Tile(())
        while True:
            self.skip_ws()
            at = self.pos
            if self.eat("*"):
                dims.append(COMBINE)
            elif self.text.startswith("?", self.pos):
                raise self.error("a tile size must be a positive integer or '*', not '?'", at)
            else:
                value, at = self.read_int("a tile size or '*'")
                if value <= 0:
                    raise self.error(f"a tile size must be a positive integer or '*', not {value}", at)
                dims.append(value)
            if self.eat(")"):
                break
            self.expect(",", "or ')' in a tile")
        if dims[-1] == COMBINE:
            raise self.error(
                "the most-minor tile entry cannot be '*': there is no more minor dimension to merge into", at
            )
        return Tile(tuple(dims))

    def _read_dim_level_types(self) -> tuple[str, ...]:
        self.expect("(", "after 'D'")
        out: list[str] = []
        if self.eat(")"):
            return ()
        while True:
            self.skip_ws()
            ch = self.text[self.pos : self.pos + 1]
            if ch not in DIM_LEVEL_TYPES:
                raise self.error(f"expected a dimension level type (D, C, S or H), found {self.found()}")
            self.pos += 1
            entry = ch
            for flag in ("+", "~"):
                if self.text.startswith(flag, self.pos):
                    entry += flag
                    self.pos += 1
            out.append(entry)
            if self.eat(")"):
                return tuple(out)
            self.expect(",", "or ')' in D(...)")

    def _read_split_config(self) -> SplitConfig:
        self.expect("(", "to start a split config")
        dim, _ = self.read_int("the split dimension")
        self.expect(":", "after the split dimension")
        indices: list[int] = []
        if not self.eat(")"):
            while True:
                indices.append(self.read_int("a split index")[0])
                if self.eat(")"):
                    break
                self.expect(",", "or ')' in a split config")
        return SplitConfig(dim, tuple(indices))

    def at_end(self) -> bool:
        self.skip_ws()
        return self.pos >= len(self.text)


def parse_shape(text: str) -> AnyShape:
    """Parse a whole shape string such as ``bf16[256,512]{1,0:T(8,128)(2,1)}`` or ``(f32[2]{0}, s32[])``.

    Raises:
        LayoutError: the string is not a shape XLA would accept; the message quotes it with a caret.
    """
    reader = ShapeReader(text)
    shape = reader.read_shape()
    if not reader.at_end():
        raise reader.error(f"unexpected {reader.found()} after the shape")
    return shape


def parse_layout(text: str, rank: int) -> Layout:
    """Parse a layout string such as ``{1,0:T(8,128)(2,1)}`` for an array of the given rank."""
    reader = ShapeReader(text)
    layout = reader.read_layout(rank)
    if not reader.at_end():
        raise reader.error(f"unexpected {reader.found()} after the layout")
    return layout
