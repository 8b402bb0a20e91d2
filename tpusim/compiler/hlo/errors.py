"""Errors of the HLO front end: text that is not HLO, and modules that break HLO's rules."""

from __future__ import annotations

from tpusim.errors import SourceError, TpusimError, clip_middle

__all__ = ["HloParseError", "HloVerifyError"]


class HloParseError(SourceError):
    """HLO text that cannot be read: says where (file, line, column), shows the line with a caret under the
    offending spot, and says what was expected and what was found."""

    kind = "HLO parse error"


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
        prefix = f"HLO verification error in {site}: " if site else "HLO verification error: "
        super().__init__(prefix + clip_middle(message))  # (shapes of long tuples can be megabytes of text)
