"""The one exception family of tpusim.

Every error a user can provoke with bad input is a :class:`TpusimError`. Errors about text
(shape strings, HLO modules, YAML files) carry the position and print the offending line with
a caret under the column, so the command line can show them without a traceback.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "LayoutError",
    "SourceError",
    "TpusimError",
    "caret_snippet",
    "clip_middle",
]


class TpusimError(Exception):
    """Base class of every error tpusim raises on purpose."""


def __getattr__(name: str) -> type[TpusimError]:
    if name == "RunLimitError":  # defined beside the run limits (tpusim.limits), importable here with the rest
        from tpusim.limits import RunLimitError

        return RunLimitError
    raise AttributeError(f"module 'tpusim.errors' has no attribute {name!r}")


# Control characters (but tab) shown as U+FFFD, one character for one, so the caret stays aligned.
_CONTROLS = {c: "\ufffd" for c in (*range(0, 9), *range(10, 32), *range(127, 160))}


def caret_snippet(line: str, column: int, width: int = 1) -> str:
    """Return ``line`` and a caret line pointing at 0-based ``column``, both indented by two spaces.

    Tabs before the column are kept in the caret line so the caret stays aligned.
    """
    column = max(0, min(column, len(line)))
    line = line.translate(_CONTROLS)  # (a binary file's bytes must not drive the terminal)
    pad = "".join(ch if ch == "\t" else " " for ch in line[:column])
    return f"  {line}\n  {pad}{'^' * max(1, width)}"


# Lines longer than this (a constant printed in full can be megabytes long) are clipped around the column
# in error messages, and messages longer than _MESSAGE_LIMIT are cut in the middle: the first line of an
# error stays short whatever text it quotes.
_SNIPPET_HALF_WIDTH = 60
_MESSAGE_LIMIT = 400


def clip_middle(text: str, limit: int = _MESSAGE_LIMIT) -> str:
    """``text``, or its start and end joined by ``...`` when it is longer than ``limit`` characters."""
    if len(text) <= limit:
        return text
    keep = (limit - 3) // 2
    return f"{text[:keep]}...{text[len(text) - keep :]}"


class SourceError(TpusimError):
    """An error, usually located in a piece of text.

    Args:
        message: what is wrong, as a sentence fragment without a trailing period.
        text: the whole text that was being read (a shape string, an HLO module, ...), or None
            for an error about a value built in Python.
        offset: 0-based character offset of the offending spot in ``text``.
        source: a file name, or None when the text did not come from a file.
    """

    kind = "error"

    def __init__(self, message: str, text: str | None = None, offset: int = 0, source: str | None = None) -> None:
        self.message = message
        self.text = text
        self.source = source
        self.offset = max(0, min(offset, len(text))) if text is not None else 0
        self.line = self.column = 0
        self.line_text = ""
        if text is not None:
            line_start = text.rfind("\n", 0, self.offset) + 1
            line_end = text.find("\n", self.offset)
            self.line = text.count("\n", 0, self.offset) + 1
            self.column = self.offset - line_start + 1
            self.line_text = text[line_start : line_end if line_end >= 0 else len(text)]
        super().__init__(self._format())

    def _format(self) -> str:
        message = clip_middle(self.message)
        if self.text is None:
            return f"{self.kind}: {message}" if self.source is None else f"{self.source}: {message}"
        if self.source is not None:
            where = f"{self.source}:{self.line}:{self.column}"
        elif "\n" in self.text:
            where = f"line {self.line}, column {self.column}"
        else:
            where = f"column {self.column}"
        line, col = self.line_text, self.column - 1
        if len(line) > 2 * _SNIPPET_HALF_WIDTH + 20:
            lo = max(0, col - _SNIPPET_HALF_WIDTH)
            hi = min(len(line), col + _SNIPPET_HALF_WIDTH)
            head = "..." if lo > 0 else ""
            line = head + line[lo:hi] + ("..." if hi < len(line) else "")
            col = col - lo + len(head)
        return f"{self.kind} at {where}: {message}\n{caret_snippet(line, col)}"


class LayoutError(SourceError):
    """A shape or layout string XLA would reject, or a layout that cannot describe its shape."""

    kind = "invalid shape or layout"


class ConfigError(TpusimError):
    """A configuration file or override that is wrong (unknown key, bad type, impossible value)."""
