"""Epilogues: an elementwise kernel applied to a matrix product's result blocks on their way out.

XLA:TPU fuses an activation, a scaling or an output convert into the matmul that feeds it: each result block
is transformed in registers after it leaves the MXU, and only the transformed block goes to HBM. Run as its
own kernel, the activation would read and write the whole result once more (for an 8192^3 bf16 matmul, 256 MB
through HBM: +5.9% against the +1.3% XLA's fused ReLU measured).

:func:`find_epilogues` picks, before lowering, each ``dot`` whose one user is a loop fusion that applies
elementwise ops to it alone (scalar constants aside) with the dot's dimensions, element type and layout; the
dot's rule then appends :func:`epilogue_chain` to every result block and writes the fusion's home, and the
fusion's rule emits nothing. Decided on the laid-out module and only for one TensorCore, so a dot that falls
back (its own result computed, :func:`~tpusim.compiler.lowering.sequential.lower_instruction` then drops the
pairing) leaves its user to run as before.
"""

from __future__ import annotations

from tpusim.compiler.hlo.ir import Computation, Instruction, Module
from tpusim.compiler.lowering.immediates import scalar_constant
from tpusim.isa import VPU_FUNCTIONS, FusedOp, Operand
from tpusim.memory import Shape

__all__ = ["epilogue_chain", "find_epilogues"]


def find_epilogues(module: Module) -> dict[tuple[str, str], str]:
    """``(computation, dot) -> fusion`` for every dot whose result only an elementwise loop fusion reads."""
    found: dict[tuple[str, str], str] = {}
    fused = {i.attr("calls") for c in module.computations for i in c.instructions if i.opcode == "fusion"}
    for comp in module.computations:
        if comp.name in fused:
            continue
        users: dict[str, list[Instruction]] = {}
        for instr in comp.instructions:
            for o in instr.operands:
                users.setdefault(o, []).append(instr)
        for instr in comp.instructions:
            mine = users.get(instr.name, [])
            if instr.opcode != "dot" or len(mine) != 1:
                continue
            user = mine[0]
            if _applies(module, instr, user):
                found[comp.name, instr.name] = user.name
    return found


def _applies(module: Module, dot: Instruction, user: Instruction) -> bool:
    if user.opcode != "fusion" or user.attr("kind") != "kLoop" or user.operands != (dot.name,):
        return False
    if not isinstance(dot.shape, Shape) or not isinstance(user.shape, Shape):
        return False
    a, b = dot.shape, user.shape
    if a.dimensions != b.dimensions or a.element_type != b.element_type:
        return False
    la, lb = a.effective_layout, b.effective_layout
    if (la.minor_to_major, la.tiles) != (lb.minor_to_major, lb.tiles):  # (memory spaces may differ)
        return False
    try:
        epilogue_chain(module[user.attr("calls")])
    except ValueError:
        return False
    return True


def epilogue_chain(fused: Computation) -> tuple[tuple[Operand, ...], tuple[FusedOp, ...]]:
    """The ``vpu.fused`` sources after the result block (value 0) and the steps of ``fused``: its one
    parameter is the block, scalar constants (and broadcasts of them) are immediates.

    Raises:
        ValueError: ``fused`` holds something else (another parameter, an array constant, a reshape ...).
    """
    number: dict[str, int] = {}
    consts: list[Operand] = []
    ops: list[FusedOp] = []
    for instr in fused.instructions:
        shape = instr.shape
        if not isinstance(shape, Shape):
            raise ValueError(f"{instr.name}: a tuple")
        if instr.opcode == "parameter":
            if instr.attr("parameter_number", 0) != 0:
                raise ValueError("a second parameter")
            number[instr.name] = 0
        elif instr.opcode == "constant" and shape.rank == 0:
            const = scalar_constant(instr)
            if const is None:
                raise ValueError(f"a {shape.element_type} constant")
            consts.append(const)
            number[instr.name] = len(consts)
        elif instr.opcode == "broadcast" and instr.operands[0] in number and number[instr.operands[0]] > 0:
            number[instr.name] = number[instr.operands[0]]  # a scalar stays an immediate
        elif instr.opcode in VPU_FUNCTIONS:
            direction = instr.attr("direction") if instr.opcode == "compare" else None
            if instr.opcode == "compare" and instr.attr("type") == "TOTALORDER":
                raise ValueError("a total-order comparison")
            ops.append(FusedOp(instr.opcode, shape.element_type, tuple(number[o] for o in instr.operands), direction))
            number[instr.name] = -len(ops)  # placeholder: renumbered below
        else:
            raise ValueError(f"{instr.opcode} is not an elementwise step")
    if not ops or number.get(fused.root) != -len(ops):
        raise ValueError("the root is not the last elementwise step")
    base = 1 + len(consts)  # values: block, constants, then one per step

    def value(n: int) -> int:
        return base - n - 1 if n < 0 else n

    steps = tuple(FusedOp(op.fn, op.etype, tuple(value(a) for a in op.args), op.direction) for op in ops)
    return tuple(consts), steps
