"""Opcode -> lowering rule. Adding an op's hardware lowering is one decorated function.

A rule is ``fn(ctx, comp, instr) -> None``: it appends instructions to ``ctx`` within ``ctx.op(...)``'s
scope. A rule may raise :class:`NotLowerable` to decline (an unusual attribute, a block that cannot fit);
the instruction then runs as a fallback, and the report lists it with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tpusim.compiler.errors import NotLowerable

if TYPE_CHECKING:
    from tpusim.compiler.hlo.ir import Computation, Instruction
    from tpusim.compiler.lowering.context import Lowering

__all__ = ["LOWERINGS", "NO_CODE", "SPECIALISED", "LowerFn", "NotLowerable", "lowering", "rule_for"]

LowerFn = Callable[["Lowering", "Computation", "Instruction"], None]
When = Callable[["Lowering", "Computation", "Instruction"], bool]

LOWERINGS: dict[str, LowerFn] = {}
"""Opcode -> hardware lowering rule."""

SPECIALISED: dict[str, list[tuple[When, LowerFn]]] = {}
"""Opcode -> rules that take precedence for the instructions their predicate accepts (e.g. integer scalars
on the scalar unit), tried in registration order before :data:`LOWERINGS`."""

NO_CODE = frozenset({"parameter", "get-tuple-element", "tuple", "opt-barrier", "after-all", "constant"})
"""Opcodes that produce no instructions: aliases whose buffers buffer assignment shares, tokens, and constants,
which the loader places in HBM before the program starts."""


def lowering(*opcodes: str, when: When | None = None) -> Callable[[LowerFn], LowerFn]:
    """Register a rule for ``opcodes``; with ``when``, only for the instructions the predicate accepts."""

    def register(fn: LowerFn) -> LowerFn:
        for op in opcodes:
            if when is not None:
                SPECIALISED.setdefault(op, []).append((when, fn))
                continue
            if op in LOWERINGS:
                raise RuntimeError(f"two lowering rules for {op!r}")
            LOWERINGS[op] = fn
        return fn

    return register


def rule_for(ctx: Lowering, comp: Computation, instr: Instruction) -> LowerFn | None:
    """The rule that lowers ``instr``: the first specialised rule that accepts it, else the opcode's rule."""
    for when, fn in SPECIALISED.get(instr.opcode, ()):
        if when(ctx, comp, instr):
            return fn
    return LOWERINGS.get(instr.opcode)
