"""Errors of the HLO front end: text that is not HLO, and modules that break HLO's rules."""

from __future__ import annotations

from tpusim.errors import SourceError, TpusimError, caret_snippet

__all__ = ["HloParseError", "HloVerifyError"]

# Lines longer than this (a constant printed in full can be megabytes long) are clipped around the
# column in error messages.
_SNIPPET_HALF_WIDTH = 60


class HloParseError(SourceError):
    """HLO text that cannot be read: says where (file, line, column), shows the line with a caret under the
    offending spot, and says what was expected and what was found."""

    kind = "HLO parse error"

    def _format(self) -> str:
        if self.text is None or len(self.line_text) <= 2 * _SNIPPET_HALF_WIDTH + 20:
            return super()._format()
        col = self.column - 1
        lo = max(0, col - _SNIPPET_HALF_WIDTH)
        hi = min(len(self.line_text), col + _SNIPPET_HALF_WIDTH)
        head = "..." if lo > 0 else ""
        tail = "..." if hi < len(self.line_text) else ""
        clipped = head + self.line_text[lo:hi] + tail
        where = (
            f"{self.source}:{self.line}:{self.column}"
            if self.source is not None
            else (f"line {self.line}, column {self.column}")
        )
        return f"{self.kind} at {where}: {self.message}\n{caret_snippet(clipped, col - lo + len(head))}"


class HloVerifyError(TpusimError):
    """A module that parses but breaks a rule of HLO: a wrong operand count, a shape that does not follow
    from the operands, a call to a computation that does not exist or has the wrong signature, ...

    Attributes:
        computation: the computation's name, or None for module-level rules.
        instruction: the instruction's name, or None.
        rule: what was checked, as a short sentence fragment.
    """

    def __init__(
        self, message: str, computation: str | None = None, instruction: str | None = None, where: str | None = None
    ) -> None:
        self.computation = computation
        self.instruction = instruction
        self.rule = message
        site = ""
        if computation is not None:
            site = f"computation {computation}"
            if instruction is not None:
                site += f", instruction %{instruction}"
        if where:
            site += f" ({where})" if site else where
        super().__init__((f"HLO verification error in {site}: " if site else "HLO verification error: ") + message)
