"""Errors of the compiler passes: each names the HLO instruction and, when known, the user's source line."""

from __future__ import annotations

from tpusim.compiler.hlo.ir import Instruction
from tpusim.errors import TpusimError

__all__ = ["CompileError"]


class CompileError(TpusimError):
    """A rule a compiler pass cannot satisfy, stated with the instruction it concerns."""

    def __init__(self, message: str, instruction: Instruction | None = None, computation: str | None = None) -> None:
        self.instruction = instruction
        where = ""
        if instruction is not None:
            where = f"{computation + '/' if computation else ''}{instruction.name}"
            if instruction.loc is not None and instruction.loc.source_file:
                where += f" ({instruction.loc.source_file}:{instruction.loc.source_line})"
            where += ": "
        super().__init__(where + message)
