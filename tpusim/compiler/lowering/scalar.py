"""Integer scalars on the scalar unit: loop counters, trip-count tests and dynamic offsets.

Buffer assignment keeps the integer and pred scalars a program computes in SMEM words. An elementwise
operation whose result and operands are such scalars (or constants) runs as a few scalar instructions,
``s.load`` the operands, one ALU operation, ``s.store`` the result, instead of a trip through VMEM and the
vector unit. The scalar ALU works on 32-bit two's-complement words, so the rule takes 32-bit integers and
pred, and signed comparisons only (unsigned ones keep the vector path).
"""

from __future__ import annotations

from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.lowering.context import Lowering
from tpusim.compiler.lowering.registry import lowering
from tpusim.compiler.memory_spaces import scalar_word
from tpusim.isa import Reg, Scalar, ScalarAlu, ScalarLoad, ScalarStore, Space

__all__: list[str] = []

_ALU = {"add": "add", "subtract": "sub", "multiply": "mul", "and": "and", "or": "or", "xor": "xor",
        "maximum": "max", "minimum": "min"}  # fmt: skip
_SIGNED_ONLY = frozenset({"maximum", "minimum", "compare"})
_OPCODES = (*_ALU, "compare", "select", "not", "negate", "convert", "copy")


def _immediate(instr: Instruction) -> int:
    value = int(instr.attr("literal").value)
    return value - (1 << 32) if value >= 1 << 31 else value  # a u32 constant as the 32-bit word it is


def _applies(ctx: Lowering, comp: Computation, instr: Instruction) -> bool:
    if not scalar_word(instr.shape) or ctx.home(comp.name, instr.name).space is not Space.SMEM:
        return False
    for o in instr.operands:
        operand = comp[o]
        if not scalar_word(operand.shape):
            return False
        if operand.opcode != "constant" and ctx.home(comp.name, o).space is not Space.SMEM:
            return False
        if instr.opcode in _SIGNED_ONLY and operand.array_shape.element_type.kind == "unsigned":
            return False
    return True


def _operand(ctx: Lowering, comp: Computation, name: str) -> Scalar:
    instr = comp[name]
    if instr.opcode == "constant":
        return _immediate(instr)
    reg = ctx.register()
    ctx.emit(ScalarLoad, dst=reg, src=ctx.home(comp.name, name))
    return reg


@lowering(*_OPCODES, when=_applies)
def lower_scalar(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    ops = [_operand(ctx, comp, o) for o in instr.operands]
    out = ctx.register()
    op = instr.opcode
    if op in _ALU:
        ctx.emit(ScalarAlu, fn=_ALU[op], dst=out, a=ops[0], b=ops[1])
    elif op == "compare":
        ctx.emit(ScalarAlu, fn=instr.attr("direction").lower(), dst=out, a=ops[0], b=ops[1])
    elif op == "select":  # b + p * (a - b): exact in wrapping 32-bit arithmetic, as p is 0 or 1
        ctx.emit(ScalarAlu, fn="sub", dst=out, a=_reg(ctx, ops[1]), b=ops[2])
        ctx.emit(ScalarAlu, fn="mul", dst=out, a=out, b=ops[0])
        ctx.emit(ScalarAlu, fn="add", dst=out, a=out, b=ops[2])
    elif op == "not":
        mask = 1 if instr.array_shape.element_type.name == "pred" else -1
        ctx.emit(ScalarAlu, fn="xor", dst=out, a=_reg(ctx, ops[0]), b=mask)
    elif op == "negate":
        ctx.emit(ScalarAlu, fn="sub", dst=out, a=_reg(ctx, 0), b=ops[0])
    elif op == "convert" and instr.array_shape.element_type.name == "pred":
        ctx.emit(ScalarAlu, fn="ne", dst=out, a=_reg(ctx, ops[0]), b=0)
    else:  # copy, or convert between 32-bit integers and from pred: the same word
        ctx.emit(ScalarAlu, fn="mov", dst=out, a=ops[0])
    ctx.emit(ScalarStore, dst=ctx.home(comp.name, instr.name), src=out)


def _reg(ctx: Lowering, value: Scalar) -> Reg:
    """``value`` in a register (the ALU's first operand is a register or an immediate)."""
    if isinstance(value, Reg):
        return value
    reg = ctx.register()
    ctx.emit(ScalarAlu, fn="mov", dst=reg, a=value)
    return reg
