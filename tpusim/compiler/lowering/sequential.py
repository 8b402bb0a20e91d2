"""Lowering a sequential computation: each HLO instruction, in order, through the rule registry."""

from __future__ import annotations

from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.lowering.context import Lowering
from tpusim.compiler.lowering.fallback import lower_fallback
from tpusim.compiler.lowering.registry import NO_CODE, NotLowerable, rule_for

__all__ = ["lower_computation", "lower_instruction"]


def lower_computation(ctx: Lowering, name: str) -> None:
    """Append the code of computation ``name`` (entry, loop body, branch ...) to the stream."""
    comp = ctx.module[name]
    for instr in comp.instructions:
        lower_instruction(ctx, comp, instr)


def lower_instruction(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """Lower one instruction with its registered rule, or as a fallback when it has none or declines."""
    if instr.opcode in NO_CODE:
        return
    rule = rule_for(ctx, comp, instr)
    with ctx.op(comp, instr):
        if rule is None:
            lower_fallback(ctx, comp, instr, f"no hardware lowering for {instr.opcode}")
            return
        mark = ctx.checkpoint()
        try:
            rule(ctx, comp, instr)
        except NotLowerable as why:
            ctx.rollback(mark)
            lower_fallback(ctx, comp, instr, str(why))
