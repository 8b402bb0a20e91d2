"""The types an instruction that calls a computation on its elements reads and computes in.

Under XLA's ``allow_mixed_precision`` the floating-point types of such an instruction's operands, results and
called computation may differ: XLA:TPU folds ``jnp.sort(x.astype(f32))`` of bf16 ``x`` into ``(f32, s32)
sort(bf16 x, s32 iota)`` whose comparator takes f32, and narrows an argmin's unused minimum to bf16 while its
reducer computes in f32. Such an instruction means what XLA's FloatNormalization makes of it: every operand
converted to the type of the computation parameter it feeds, the operation in those types, every result
converted to its declared type. :func:`called_types` says which types those are; ``normalize_precision``
writes the converts, the reference interpreter applies them (docs/reference.md).

Which parameter each operand feeds (Operation Semantics): reduce and reduce-window ``(acc_0..acc_N-1,
x_0..x_N-1)`` take the init values as accumulators and the inputs as elements, and compute each result as its
accumulator; sort's comparator takes operand ``k`` as parameters ``2k`` and ``2k+1``; scatter's ``to_apply``
takes the operands' then the updates' elements (the indices feed none) and computes each result as its
operand; select-and-scatter's ``select`` takes the operand, its ``scatter`` the init value (the accumulator,
as the result) and the source; map's computation takes operand ``k`` as parameter ``k`` and gives its result.
"""

from __future__ import annotations

from tpusim.compiler.hlo.ir import Instruction, Module
from tpusim.memory import ElementType, Shape

__all__ = ["CALLING", "CalledTypes", "called_types"]

Feed = tuple[str, int | None]
"""(the attribute naming a called computation, a parameter number; None: the computation's root)."""

CALLING = frozenset({"reduce", "reduce-window", "sort", "scatter", "select-and-scatter", "map"})
"""The opcodes that call a computation on their operands' elements."""

CalledTypes = tuple[tuple[ElementType | None, ...], tuple[ElementType | None, ...]]
"""(per operand, per result element): the element type it is read or computed in, None where no computation
parameter fixes one (scatter's indices, a missing computation)."""


def _feeds(opcode: str, n: int) -> tuple[tuple[Feed | None, ...], tuple[Feed, ...]]:
    """(the parameter each of ``n`` operands feeds, the one each result is computed as) for ``opcode``."""
    half = n // 2
    if opcode in ("reduce", "reduce-window"):
        accumulators: tuple[Feed, ...] = tuple(("to_apply", k) for k in range(half))
        return tuple(("to_apply", half + k) for k in range(half)) + accumulators, accumulators
    if opcode == "sort":
        pairs: tuple[Feed, ...] = tuple(("to_apply", 2 * k) for k in range(n))
        return pairs, pairs
    if opcode == "scatter":
        operands: tuple[Feed, ...] = tuple(("to_apply", k) for k in range(half))
        return (*operands, None, *(("to_apply", half + k) for k in range(half))), operands
    if opcode == "select-and-scatter":
        return (("select", 0), ("scatter", 1), ("scatter", 0)), (("scatter", 0),)
    assert opcode == "map", opcode
    return tuple(("to_apply", k) for k in range(n)), (("to_apply", None),)


def _fed_type(module: Module, instr: Instruction, feed: Feed | None) -> ElementType | None:
    """The element type of the parameter (or root) ``feed`` names, None if there is none."""
    if feed is None:
        return None
    name = instr.attr(feed[0])
    if not isinstance(name, str) or name not in module:
        return None
    comp = module[name]
    params = comp.parameters
    if feed[1] is not None and feed[1] >= len(params):
        return None
    shape = comp.root_instruction.shape if feed[1] is None else params[feed[1]].shape
    return shape.element_type if isinstance(shape, Shape) else None


def called_types(module: Module, instr: Instruction) -> CalledTypes | None:
    """The types ``instr`` reads each operand in and computes each result in (see the module docstring), or
    None when it calls no computation on its elements."""
    if instr.opcode not in CALLING:
        return None
    operands, results = _feeds(instr.opcode, len(instr.operands))
    return (
        tuple(_fed_type(module, instr, f) for f in operands),
        tuple(_fed_type(module, instr, f) for f in results),
    )
