"""Low-level reading of HLO text: comments, names, strings, balanced groups and error positions.

XLA's lexer (xla/hlo/parser/hlo_lexer.cc) is the reference for the token shapes: names are
``[A-Za-z_][A-Za-z0-9_.-]*`` with an optional ``%`` sigil, strings are C-escaped and double (or single)
quoted, ``/* ... */`` and ``// ...`` are comments. The parser works on the text directly with compiled,
position-anchored regular expressions; nothing here loops over characters in Python except inside short
strings.
"""

from __future__ import annotations

import re

from tpusim.compiler.hlo.errors import HloParseError

__all__ = [
    "FLOAT",
    "INT",
    "NAME",
    "WS",
    "SourceText",
    "escape",
    "int_tuple",
    "unescape",
]

WS = re.compile(r"\s*")
NAME = re.compile(r"%?([A-Za-z_][A-Za-z0-9_.\-]*)")
INT = re.compile(r"-?\d+")
FLOAT = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|inf|nan)")
STRING = re.compile(r""""((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'""", re.S)

_COMMENT_OR_STRING = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|/\*[\s\S]*?\*/|//[^\n]*""")
_NOT_NEWLINE = re.compile(r"[^\n]")
_BRACE_SCAN = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|["'{}]""", re.S)
_FOUND = re.compile(r"""%?[A-Za-z_][A-Za-z0-9_.\-]*|-?\d[\w.+\-]*|"(?:[^"\\\n]|\\.){0,40}"?|\S""")
_INT_LIST = re.compile(r"\s*\{\s*(-?\d+(?:\s*,\s*-?\d+)*)?\s*,?\s*\}")
_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{1,2}|[0-7]{1,3}|.)", re.S)
_SIMPLE_ESCAPES = {"n": 10, "t": 9, "r": 13, "a": 7, "b": 8, "f": 12, "v": 11, '"': 34, "'": 39, "\\": 92, "?": 63}
_ESCAPE_OUT = {10: "\\n", 9: "\\t", 13: "\\r", 34: '\\"', 39: "\\'", 92: "\\\\"}


# XLA's lexer reads an integer token into an int64 (or, failing that, a uint64) and rejects larger ones
# ("Failed to parse int literal"). A number group is integers joined by '_' or 'x' (paddings 0_1x2_3, window
# sizes 3x3) standing alone: a digit run that is part of a float (after '.' or 'e-', before '.' or 'e') or of a
# name or hex number (after a letter) is not an integer token. Strings are skipped whole.
_LONG_DIGITS = re.compile(r"\d{20}")
_INT_GROUP = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|(?<![\w.])(?<![eE][-+])-?\d+(?:[_x]-?\d+)*(?![\w.])""")
_DIGITS = re.compile(r"\d{20,}")
INT_MAX = 2**64 - 1
"""The largest integer HLO text may hold (XLA reads integers as int64 or uint64)."""


def _blank(match: re.Match[str]) -> str:
    piece = match.group(0)
    if piece[0] in "\"'":
        return piece
    return _NOT_NEWLINE.sub(" ", piece)


class SourceText:
    """The text being parsed, its comment-free twin and where it came from.

    Comments are replaced by spaces (newlines kept), so every offset means the same character in both
    texts and errors quote the original line.

    Attributes:
        text: the text with comments blanked out; the parser reads this one.
        original: the text as given; error messages quote it.
        source: a file name, or None.
    """

    __slots__ = ("original", "source", "text")

    def __init__(self, text: str, source: str | None = None) -> None:
        self.original = text
        self.source = source
        self.text = _COMMENT_OR_STRING.sub(_blank, text) if ("/*" in text or "//" in text) else text
        if self.text.startswith("\ufeff"):  # a byte-order mark left by some editors: a blank
            self.text = " " + self.text[1:]

    def check_integers(self) -> None:
        """Raise at the first integer too large for 64 bits (before anything converts it: Python refuses
        to convert more than 4300 digits, and numpy or range() calls would exhaust memory)."""
        if _LONG_DIGITS.search(self.text) is None:  # NOTE: speed. The common case: no 20-digit run at all.
            return
        for group in _INT_GROUP.finditer(self.text):
            if group.group(0)[0] in "\"'":
                continue
            for m in _DIGITS.finditer(group.group(0)):
                digits = m.group(0)
                if len(digits) == 20 and int(digits) <= INT_MAX:
                    continue
                shown = digits if len(digits) <= 30 else f"{digits[:12]}...{digits[-6:]} ({len(digits)} digits)"
                at = group.start() + m.start()
                raise self.error(at, f"integer {shown} does not fit in 64 bits (XLA's largest is {INT_MAX})")

    def error(self, pos: int, message: str) -> HloParseError:
        """An :class:`HloParseError` at offset ``pos``."""
        return HloParseError(message, self.original, pos, self.source)

    def skip_ws(self, pos: int) -> int:
        return WS.match(self.text, pos).end()  # type: ignore[union-attr]

    def found(self, pos: int) -> str:
        """What stands at ``pos`` (after blanks), for 'expected X, found Y' messages."""
        pos = self.skip_ws(pos)
        if pos >= len(self.text):
            return "end of text"
        m = _FOUND.match(self.text, pos)
        token = m.group(0) if m else self.text[pos]
        if len(token) > 40:
            token = token[:37] + "..."
        return repr(token)

    def expect(self, pos: int, token: str, what: str) -> int:
        """Skip blanks, require ``token`` at the cursor and return the offset after it."""
        pos = self.skip_ws(pos)
        if not self.text.startswith(token, pos):
            raise self.error(pos, f"expected '{token}' {what}, found {self.found(pos)}")
        return pos + len(token)

    def name(self, pos: int, what: str) -> tuple[str, int]:
        """Read a name (``%`` optional) after blanks; returns (name without %, end)."""
        pos = self.skip_ws(pos)
        m = NAME.match(self.text, pos)
        if not m:
            raise self.error(pos, f"expected {what}, found {self.found(pos)}")
        return m.group(1), m.end()

    def integer(self, pos: int, what: str) -> tuple[int, int]:
        pos = self.skip_ws(pos)
        m = INT.match(self.text, pos)
        if not m:
            raise self.error(pos, f"expected {what} (an integer), found {self.found(pos)}")
        return int(m.group(0)), m.end()

    def string(self, pos: int, what: str) -> tuple[str, int]:
        """Read a quoted, C-escaped string; returns (unescaped value, end)."""
        pos = self.skip_ws(pos)
        m = STRING.match(self.text, pos)
        if not m:
            if self.text[pos : pos + 1] in ("'", '"'):
                raise self.error(pos, f"unterminated string in {what}")
            raise self.error(pos, f"expected {what} (a quoted string), found {self.found(pos)}")
        raw = m.group(1) if m.group(1) is not None else m.group(2)
        try:
            return unescape(raw), m.end()
        except ValueError as err:
            raise self.error(pos, f"bad escape in {what}: {err}") from None

    def int_list(self, pos: int, what: str) -> tuple[tuple[int, ...], int]:
        """Read ``{1,2,3}`` (or ``{}``); returns (values, end)."""
        m = _INT_LIST.match(self.text, pos)
        if m is None:
            self._explain_list(self.skip_ws(pos), what)
        return int_tuple(m.group(1) or ""), m.end()  # type: ignore[union-attr]

    def int_lists(self, pos: int, what: str) -> tuple[tuple[tuple[int, ...], ...], int]:
        """Read ``{{0,1},{2,3}}`` (or ``{}``); returns (lists, end)."""
        pos = self.expect(pos, "{", f"to start {what}")
        out: list[tuple[int, ...]] = []
        pos = self.skip_ws(pos)
        if self.text.startswith("}", pos):
            return (), pos + 1
        while True:
            values, pos = self.int_list(pos, what)
            out.append(values)
            pos = self.skip_ws(pos)
            if self.text.startswith(",", pos):
                pos += 1
                continue
            return tuple(out), self.expect(pos, "}", f"or ',' in {what}")

    def _explain_list(self, pos: int, what: str) -> None:
        """Raise at the first character of a ``{...}`` list that does not belong in ``what``."""
        if not self.text.startswith("{", pos):
            raise self.error(pos, f"expected {what}, found {self.found(pos)}")
        p = self.skip_ws(pos + 1)
        while True:
            m = INT.match(self.text, p)
            if not m:
                if self.text.startswith("}", p):
                    raise self.error(pos, f"expected {what}, found {self.found(pos)}")
                raise self.error(p, f"expected an integer or '}}' in {what}, found {self.found(p)}")
            p = self.skip_ws(m.end())
            if self.text.startswith(",", p):
                p = self.skip_ws(p + 1)
                continue
            if self.text.startswith("}", p):
                raise self.error(pos, f"expected {what}, found {self.found(pos)}")
            raise self.error(p, f"expected ',' or '}}' in {what}, found {self.found(p)}")

    def match_brace(self, pos: int, what: str) -> int:
        """``text[pos]`` is ``{``: return the offset after its matching ``}`` (strings may hold braces)."""
        depth = 0
        text = self.text
        for m in _BRACE_SCAN.finditer(text, pos):
            start = m.start()
            ch = text[start]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return m.end()
            elif m.end() - start == 1:
                raise self.error(start, f"unterminated string in {what}")
        raise self.error(pos, f"'{{' of {what} is never closed")


def int_tuple(text: str) -> tuple[int, ...]:
    """``"1, 2,3"`` -> ``(1, 2, 3)``; blank text gives ``()``."""
    return tuple(int(x) for x in text.split(",")) if text.strip() else ()


def unescape(raw: str) -> str:
    """Undo C escapes (``\\n``, ``\\"``, ``\\x41``, ``\\101``) as XLA's lexer does (absl::CUnescape); escaped
    bytes are reassembled as UTF-8."""
    if "\\" not in raw:
        return raw
    out = bytearray()
    last = 0
    for m in _ESCAPE.finditer(raw):
        out += raw[last : m.start()].encode()
        code = m.group(1)
        if code[0] == "x":
            out.append(int(code[1:], 16))
        elif code[0] in "01234567":
            value = int(code, 8)
            if value > 255:
                raise ValueError(f"octal escape \\{code} is above \\377")
            out.append(value)
        elif code in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[code])
        else:
            raise ValueError(f"unknown escape \\{code}")
        last = m.end()
    out += raw[last:].encode()
    return out.decode("utf-8", errors="surrogateescape")


def escape(value: str) -> str:
    """C-escape ``value`` and put it in double quotes (what XLA's printer does with string attributes)."""
    data = value.encode("utf-8", errors="surrogateescape")
    if all(32 <= b < 127 and b not in (34, 92) for b in data):
        return f'"{value}"'
    parts = []
    for b in data:
        if b in _ESCAPE_OUT:
            parts.append(_ESCAPE_OUT[b])
        elif 32 <= b < 127:
            parts.append(chr(b))
        else:
            parts.append(f"\\{b:03o}")
    return '"' + "".join(parts) + '"'
