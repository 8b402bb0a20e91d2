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
]


class TpusimError(Exception):
    """Base class of every error tpusim raises on purpose."""


def caret_snippet(line: str, column: int, width: int = 1) -> str:
    """Return ``line`` and a caret line pointing at 0-based ``column``, both indented by two spaces.

    Tabs before the column are kept in the caret line so the caret stays aligned.
    """
    column = max(0, min(column, len(line)))
    pad = "".join(ch if ch == "\t" else " " for ch in line[:column])
    return f"  {line}\n  {pad}{'^' * max(1, width)}"


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
        if self.text is None:
            return f"{self.kind}: {self.message}" if self.source is None else f"{self.source}: {self.message}"
        if self.source is not None:
            where = f"{self.source}:{self.line}:{self.column}"
        elif "\n" in self.text:
            where = f"line {self.line}, column {self.column}"
        else:
            where = f"column {self.column}"
        return f"{self.kind} at {where}: {self.message}\n{caret_snippet(self.line_text, self.column - 1)}"


class LayoutError(SourceError):
    """A shape or layout string XLA would reject, or a layout that cannot describe its shape."""

    kind = "invalid shape or layout"


class ConfigError(TpusimError):
    """A configuration file or override that is wrong (unknown key, bad type, impossible value)."""
