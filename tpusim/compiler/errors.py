"""Errors of the compiler passes: each names the HLO instruction and, when known, the user's source line."""

from __future__ import annotations

from tpusim.compiler.hlo.ir import Instruction
from tpusim.errors import TpusimError

__all__ = ["CompileError", "NotLowerable"]


class CompileError(TpusimError):
    """A rule a compiler pass cannot satisfy, stated with the instruction it concerns."""

    def __init__(self, message: str, instruction: Instruction | None = None, computation: str | None = None) -> None:
        self.instruction = instruction
        where = ""
        if instruction is not None:
            where = f"{computation + '/' if computation else ''}{instruction.name}"
            loc = instruction.loc
            if loc is not None:  # the HLO text's place, then the user code's from metadata
                where += f" ({loc.hlo_file + ':' if loc.hlo_file else 'line '}{loc.line}"
                where += f"; {loc.source_file}:{loc.source_line})" if loc.source_file else ")"
            where += ": "
        super().__init__(where + message)


class NotLowerable(CompileError):
    """Raised by a lowering rule (or the block planning it relies on) that cannot handle this instance; the
    instruction falls back."""
