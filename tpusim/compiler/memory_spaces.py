"""Memory-space assignment: which values stay in VMEM between the instructions that make and use them.

An HLO instruction's result goes to HBM unless it is kept on chip. XLA:TPU's memory-space assignment keeps
most intermediates of a small program in VMEM (its compiled modules mark them ``S(1)``: in the corpus nearly
every value between two fusions), so each kernel streams its operands from VMEM, not HBM. tpusim does the
same for a module it lays out itself: every intermediate array value is marked ``S(1)``, and buffer
assignment keeps in VMEM those that fit the resident budget at the same time (the largest move to HBM
first, :func:`tpusim.compiler.buffer_assignment.assign_buffers`).

Not kept on chip: the entry parameters and results (the host reads and writes HBM), constants, integer and
pred scalars (SMEM's, for the scalar unit), control flow's values (loop state, branch and call results: one
buffer across computations), async copies' parts, and the values of instructions that talk to the host or
other devices.
"""

from __future__ import annotations

from dataclasses import replace

from tpusim.compiler.buffer_assignment import sequential_computations
from tpusim.compiler.hlo.ir import Computation, Instruction, Module
from tpusim.compiler.passes import on_chip_shape
from tpusim.memory import Shape

__all__ = ["keep_on_chip"]

_NOT_RESIDENT = frozenset(
    {"parameter", "constant", "tuple", "get-tuple-element", "while", "conditional", "call", "opt-barrier"}
    | {"infeed", "outfeed", "send", "send-done", "recv", "recv-done", "custom-call", "after-all"}
    | {"copy-start", "copy-done", "add-dependency", "domain", "rng-get-and-update-state"}
)


def keep_on_chip(module: Module) -> Module:
    """Mark every intermediate array value of the sequential computations ``S(1)`` (see the module
    docstring)."""
    comps = []
    sequential = set(sequential_computations(module))
    for comp in module.computations:
        if comp.name not in sequential:
            comps.append(comp)
            continue
        returned = _returned(comp)
        body = tuple(_resident(i, returned) for i in comp.instructions)
        comps.append(replace(comp, instructions=body))
    return replace(module, computations=tuple(comps))


def _resident(instr: Instruction, returned: set[str]) -> Instruction:
    shape = instr.shape
    if (
        instr.opcode in _NOT_RESIDENT
        or instr.opcode.endswith(("-start", "-done", "-update"))
        or not isinstance(shape, Shape)
        or shape.element_type.kind == "token"
        or shape.rank == 0
        or instr.name in returned
    ):
        return instr
    return replace(instr, shape=on_chip_shape(shape))


def _returned(comp: Computation) -> set[str]:
    """The values a computation returns (its root and, through tuples, their elements): they are another
    computation's values too (the entry's are the program's outputs), so they keep their memory."""
    out: set[str] = set()
    work = [comp.root]
    while work:
        name = work.pop()
        out.add(name)
        instr = comp[name]
        if instr.opcode == "tuple":
            work += list(instr.operands)
    return out
