"""Prologues: an elementwise kernel applied to a matrix product's weight windows on their way into VMEM.

XLA:TPU fuses a producer of a matmul operand into the matmul: int8 weights dequantised to bf16
(``convert`` then a per-column scale) are read from HBM as int8 and converted in VMEM, window by window,
just before the MXU latches them. Run as its own kernel, the dequantisation writes the bf16 weights to
HBM and the product reads them back: three times the weights' int8 bytes of extra traffic on a product
that is bound by reading them.

:func:`find_prologues` picks, before lowering, each loop fusion of elementwise ops whose one user is a
``dot`` reading it as its right operand, placed right before the dot (so nothing between them can take the
memory the fusion reads, which dies at the fusion as buffer assignment sees it). Its *source* is the
fusion's parameter of the result's dimensions; any other parameter is a side operand broadcast to them
(:func:`~tpusim.compiler.lowering.epilogue.epilogue_chain`). When the fusion's turn comes, its rule asks
the dot's (:func:`~tpusim.compiler.lowering.dot.absorbs`) whether the product can apply the chain to its
weight windows (a 2-D right operand that is not folded, side operands small enough to load whole, VMEM
for the staged windows, no byte shared with the dot's result); if so the fusion emits nothing and the dot
loads each window of the source, runs the chain on the VPU into the weight slot and multiplies. A dot that
then cannot plan it after all emits the fusion's own code first (:func:`~tpusim.compiler.lowering.dot.
emit_taking_prologue`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpusim.compiler.blocks import on_vpu
from tpusim.compiler.hlo.ir import Computation, Instruction, Module
from tpusim.compiler.lowering.epilogue import Chain, epilogue_chain, with_users
from tpusim.compiler.rewrite import single_computation
from tpusim.isa import MemRef
from tpusim.memory import Shape

__all__ = ["PRODUCTS", "Prologue", "find_prologues", "producer_computation", "prologue_chain"]

PRODUCTS = frozenset({"dot", "convolution"})
"""Opcodes whose right operand may take a prologue (a convolution only where it is a matrix product, which
the dot's rule decides)."""


@dataclass(frozen=True)
class Prologue:
    """A producer fusion as the dot applies it to its right operand's windows: the fusion's name (its code
    is stamped with it), the source it reads (the home of its parameter ``chain.block``), the chain, and the
    side operands' homes in the order of the chain's :class:`Side` sources."""

    name: str
    source: MemRef
    chain: Chain
    sides: tuple[MemRef, ...]


def producer_computation(module: Module, comp: Computation, instr: Instruction) -> Computation | None:
    """What ``instr`` computes as a computation of its operands (parameter ``i`` is operand ``i``): a loop
    fusion's body, or a one-instruction computation for an elementwise instruction outside any fusion (a
    bare ``convert`` of int8 weights; scalar constant operands stay constants); None for anything else."""
    if instr.opcode == "fusion":
        return module[instr.attr("calls")] if instr.attr("kind") == "kLoop" else None
    if not on_vpu(comp, instr):
        return None
    return single_computation(comp, instr)


def prologue_chain(fused: Computation, module: Module | None = None) -> Chain:
    """``fused`` as one ``vpu.fused`` on windows of its source: the parameter of the result's dimensions
    (the largest one when several are) is the block, every other parameter a side operand.

    Raises:
        ValueError: no such parameter, or a step :func:`epilogue_chain` does not take.
    """
    root = fused.root_instruction.shape
    if not isinstance(root, Shape):
        raise ValueError("a tuple result")
    full = [
        p
        for p in fused.parameters
        if isinstance(p.shape, Shape) and p.shape.dimensions == root.dimensions and p.shape.element_count > 1
    ]
    if not full:
        raise ValueError("no parameter of the result's dimensions")
    main = max(full, key=lambda p: p.shape.byte_size if isinstance(p.shape, Shape) else 0)
    return epilogue_chain(fused, main.attr("parameter_number", 0), module)


def find_prologues(module: Module) -> dict[tuple[str, str], str]:
    """``(computation, fusion) -> dot`` for every elementwise loop fusion that only a dot's right operand
    reads and that comes right before the dot (or a convolution's)."""
    found: dict[tuple[str, str], str] = {}
    for comp, users in with_users(module):
        for before, instr in zip(comp.instructions, comp.instructions[1:]):
            if instr.opcode not in PRODUCTS or len(instr.operands) != 2 or instr.operands[1] != before.name:
                continue
            if instr.operands[0] == before.name or [u.name for u in users.get(before.name, [])] != [instr.name]:
                continue
            if _applies(module, comp, before):
                found[comp.name, before.name] = instr.name
    return found


def _applies(module: Module, comp: Computation, producer: Instruction) -> bool:
    body = producer_computation(module, comp, producer)
    if body is None or not isinstance(producer.shape, Shape):
        return False
    try:
        prologue_chain(body, module)
    except ValueError:
        return False
    return True
