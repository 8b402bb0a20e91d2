"""What the instruction-rewriting passes share: rewrite each instruction of every computation into a list of
instructions, fresh instruction names, and an instruction as a computation of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tpusim.compiler.hlo.ir import Attributes, Computation, Instruction, Module
from tpusim.memory import Shape

__all__ = ["rewrite_instructions", "single_computation", "unique_name"]

Rule = Callable[[Computation, Instruction, set[str]], "list[Instruction] | None"]
"""``rule(computation, instruction, names taken)``: the instructions replacing it (the last one keeps its
name), or None to keep it."""


def rewrite_instructions(module: Module, rule: Rule) -> Module:
    """Apply ``rule`` to every instruction of every computation; computations it leaves alone stay the same
    objects."""
    comps = []
    for comp in module.computations:
        taken = {i.name for i in comp.instructions}
        body: list[Instruction] = []
        changed = False
        for instr in comp.instructions:
            new = rule(comp, instr, taken)
            body += new if new is not None else [instr]
            changed = changed or new is not None
        comps.append(replace(comp, instructions=tuple(body)) if changed else comp)
    return replace(module, computations=tuple(comps))


def unique_name(name: str, taken: set[str]) -> str:
    """``name``, or ``name.2``, ``name.3``... whichever is not taken yet (then taken)."""
    k, unique = 1, name
    while unique in taken:
        k += 1
        unique = f"{name}.{k}"
    taken.add(unique)
    return unique


def single_computation(comp: Computation, instr: Instruction) -> Computation:
    """``instr`` of ``comp`` as a computation of its operands: parameter ``param.<i>`` (number ``i``) for
    operand ``i``, except scalar constants, which stay constants; its root is ``instr`` under its own name."""
    params, names = [], []
    for i, operand in enumerate(instr.operands):
        src = comp[operand]
        name = f"param.{i}"
        if src.opcode == "constant" and isinstance(src.shape, Shape) and src.shape.rank == 0:
            params.append(Instruction(name, "constant", src.shape, (), Attributes({"literal": src.attr("literal")})))
        else:
            params.append(Instruction(name, "parameter", src.shape, (), Attributes({"parameter_number": i})))
        names.append(name)
    body = Instruction(instr.name, instr.opcode, instr.shape, tuple(names), instr.attributes)
    return Computation(f"{instr.name}.single", (*params, body), instr.name)
