"""Block planning for vector (VPU) operations: which output dimension to cut into blocks, and which part of
every fused value each block needs.

An output is cut along one dimension ``t`` (its most major physical dimension larger than one). Working
back from the root, each instruction of the fused computation learns a *need* ``(dim, offset)``: block
``k`` of the output needs rows ``offset + k*b .. offset + (k+1)*b`` of that instruction's dimension
``dim``, and all of its other dimensions; ``dim`` None means the instruction does not vary along ``t`` and
is needed whole by every block. Each opcode has a rule (:data:`NEED_RULES`) mapping its own need to its
operands'; an opcode without one, or two users needing different things, makes the plan fail and the
caller uses a single block or falls back.

A reduction whose reduced dimension is too big for one block is cut along that dimension instead
(:func:`reduction_split`): the outputs are computed whole, every block of the reduce's operand is reduced
into the same result with ``accumulate``, and the instructions that use the reduce's result run once,
after the last block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

from tpusim.compiler.errors import NotLowerable
from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.isa import REINTERPRETS, VPU_FUNCTIONS, vpu_computes
from tpusim.memory import Shape

__all__ = [
    "BLOCK_TARGET_BYTES",
    "NEED_RULES",
    "Need",
    "Plan",
    "block_shape",
    "on_vpu",
    "plan_needs",
    "reduction_split",
    "tile_granule",
]

Need = tuple[int | None, int]
"""(dimension of the instruction that follows the tiled output dimension, or None; offset along it)."""

NeedRule = Callable[[Instruction, Need, list[Shape]], list[Need | None]]
"""(instruction, its need, operand shapes) -> each operand's need (None: the operand is not needed)."""

NEED_RULES: dict[str, NeedRule] = {}

ELEMENTWISE_OPS = frozenset(VPU_FUNCTIONS)

BLOCK_TARGET_BYTES = 1 << 19
"""About what one block of a vector kernel moves (its outputs and the inputs cut with them)."""
"""HLO opcodes whose operands have the result's dimensions (or are scalars) and that the VPU computes."""


def on_vpu(comp: Computation, instr: Instruction) -> bool:
    """Whether ``instr`` (of ``comp``) is an elementwise VPU function (:func:`tpusim.isa.vpu_computes`)."""
    if instr.opcode not in VPU_FUNCTIONS or not isinstance(instr.shape, Shape):
        return False
    bits = (comp[o].array_shape.element_type.bits for o in instr.operands)
    return vpu_computes(instr.opcode, bits, instr.shape.element_type.bits)


def rule(*opcodes: str) -> Callable[[NeedRule], NeedRule]:
    def register(fn: NeedRule) -> NeedRule:
        for op in opcodes:
            NEED_RULES[op] = fn
        return fn

    return register


@rule(*ELEMENTWISE_OPS, "reduce-precision")
def _elementwise(instr: Instruction, need: Need, operands: list[Shape]) -> list[Need | None]:
    if any(s.element_type.is_complex for s in [*operands, instr.array_shape]):
        raise NotLowerable("complex numbers on the VPU (it computes real 32-bit lanes)")
    bits = (s.element_type.bits for s in operands)
    if instr.opcode in REINTERPRETS and not vpu_computes(instr.opcode, bits, instr.array_shape.element_type.bits):
        raise NotLowerable(f"a {instr.opcode} between widths (not elementwise)")
    dim, off = need
    return [(dim, off) if s.rank == instr.array_shape.rank else (None, 0) for s in operands]


@rule("broadcast")
def _broadcast(instr: Instruction, need: Need, operands: list[Shape]) -> list[Need | None]:
    dim, off = need
    dims = instr.attr("dimensions", ())
    if dim is None or dim not in dims:
        return [(None, 0)]
    return [(dims.index(dim), off)]


@rule("transpose")
def _transpose(instr: Instruction, need: Need, operands: list[Shape]) -> list[Need | None]:
    dim, off = need
    return [(None if dim is None else instr.attr("dimensions")[dim], off)]


@rule("reshape", "bitcast")
def _reshape(instr: Instruction, need: Need, operands: list[Shape]) -> list[Need | None]:
    dim, off = need
    if dim is None:
        return [(None, 0)]
    out, src = instr.array_shape.dimensions, operands[0].dimensions
    before = prod(out[:dim])
    for j in range(len(src)):
        if prod(src[:j]) == before and src[j] == out[dim]:
            return [(j, off)]
    raise NotLowerable(
        f"reshape {operands[0].dims_str()} -> {instr.array_shape.dims_str()} splits the blocked dimension"
    )


@rule("slice")
def _slice(instr: Instruction, need: Need, operands: list[Shape]) -> list[Need | None]:
    dim, off = need
    if dim is None:
        return [(None, 0)]
    s = instr.attr("slice")[dim]
    if s.stride != 1:
        raise NotLowerable("a strided slice along the blocked dimension")
    return [(dim, off + s.start)]


@rule("concatenate")
def _concatenate(instr: Instruction, need: Need, operands: list[Shape]) -> list[Need | None]:
    dim, off = need
    if dim is not None and dim == instr.attr("dimensions")[0]:
        raise NotLowerable("concatenating along the blocked dimension")
    return [(dim, off) for _ in operands]


@rule("pad")
def _pad(instr: Instruction, need: Need, operands: list[Shape]) -> list[Need | None]:
    dim, off = need
    if dim is not None:
        p = instr.attr("padding")[dim]
        if (p.low, p.high, p.interior) != (0, 0, 0):
            raise NotLowerable("padding along the blocked dimension")
    return [(dim, off), (None, 0)]


@rule("reduce")
def _reduce(instr: Instruction, need: Need, operands: list[Shape]) -> list[Need | None]:
    dim, off = need
    if len(operands) != 2:
        raise NotLowerable("a variadic reduce")
    reduced = instr.attr("dimensions")
    kept = [d for d in range(operands[0].rank) if d not in reduced]
    return [(None if dim is None else kept[dim], off), (None, 0)]


@rule("iota", "constant", "parameter")
def _leaf(instr: Instruction, need: Need, operands: list[Shape]) -> list[Need | None]:
    return []


@rule("dynamic-slice")
def _dynamic_slice(instr: Instruction, need: Need, operands: list[Shape]) -> list[Need | None]:
    dim, _ = need
    if dim is not None:
        raise NotLowerable("a dynamic-slice along the blocked dimension")
    return [(None, 0) for _ in operands]


@dataclass(frozen=True)
class Plan:
    """Where each value of a fused computation comes from, per block.

    Attributes:
        tiled: the blocked dimension of the outputs (None: one block holds everything).
        extent: the outputs' size along ``tiled`` (1 when None).
        needs: per needed instruction name, its need.
        order: needed instructions in computation order.
        accumulate: the reduce whose operand is cut into the blocks (its result accumulates over them), or
            None; ``tiled`` is then None and ``extent`` is the size of the operand's cut dimension.
        after: the instructions that use the accumulated result: they run after the last block only.
    """

    tiled: int | None
    extent: int
    needs: dict[str, Need]
    order: tuple[str, ...]
    accumulate: str | None = None
    after: frozenset[str] = frozenset()


def plan_needs(comp: Computation, roots: list[str], tiled: int | None, split: tuple[str, int] | None = None) -> Plan:
    """Propagate needs from ``roots`` (blocked along ``tiled``) to every instruction of ``comp``; with
    ``split = (reduce, dim)``, the outputs are whole and the blocks cut operand dimension ``dim`` of that
    reduce instead."""
    needs: dict[str, Need] = {r: (None if split else tiled, 0) for r in roots}
    for instr in reversed(comp.instructions):
        need = needs.get(instr.name)
        if need is None:
            continue
        rule_fn = NEED_RULES.get(instr.opcode)
        if rule_fn is None:
            raise NotLowerable(f"{instr.opcode} has no vector lowering")
        operand_shapes = [comp[o].shape for o in instr.operands]
        if not all(isinstance(s, Shape) for s in operand_shapes) or not isinstance(instr.shape, Shape):
            raise NotLowerable(f"{instr.opcode} on tuples")
        wants = rule_fn(instr, need, operand_shapes)  # type: ignore[arg-type]
        if split is not None and instr.name == split[0]:
            wants = [(split[1], 0), (None, 0)]
        for operand, wanted in zip(instr.operands, wants):
            if wanted is None:
                continue
            have = needs.get(operand)
            if have is not None and have != wanted:
                raise NotLowerable(f"{operand} is needed both as {have} and {wanted} per block")
            needs[operand] = wanted
    order = tuple(i.name for i in comp.instructions if i.name in needs)
    if split is not None:
        reduce = comp[split[0]]
        after = _users_of(comp, reduce.name, order)
        extent = comp[reduce.operands[0]].array_shape.dimensions[split[1]]
        return Plan(None, extent, needs, order, reduce.name, after)
    extent = 1 if tiled is None else comp[roots[0]].array_shape.dimensions[tiled]
    return Plan(tiled, extent, needs, order)


def _users_of(comp: Computation, name: str, order: tuple[str, ...]) -> frozenset[str]:
    """Instructions of ``order`` that use ``name``'s value, directly or through others."""
    found = {name}
    for other in order:
        if any(o in found for o in comp[other].operands):
            found.add(other)
    return frozenset(found - {name})


def reduction_split(comp: Computation, roots: list[str]) -> tuple[str, int] | None:
    """``(reduce, dimension)`` when the blocks can cut a reduced dimension: ``comp`` holds one reduce (of
    one operand), every root uses its result, and the cut is its operand's most major physical dimension
    among the reduced ones with more than one element."""
    reduces = [i for i in comp.instructions if i.opcode == "reduce"]
    if len(reduces) != 1 or len(reduces[0].operands) != 2:
        return None
    reduce = reduces[0]
    order = tuple(i.name for i in comp.instructions)
    users = _users_of(comp, reduce.name, order) | {reduce.name}
    if not all(r in users for r in roots):
        return None
    operand = comp[reduce.operands[0]].array_shape
    dims = set(reduce.attr("dimensions"))
    for d in reversed(operand.effective_layout.minor_to_major):
        if d in dims and operand.dimensions[d] > 1:
            return reduce.name, d
    return None


def block_shape(shape: Shape, need: Need, start: int, size: int) -> tuple[Shape, tuple[int, ...]]:
    """The block of ``shape`` one block needs (its shape, in ``shape``'s layout) and its offsets in the array."""
    dim, off = need
    dims = list(shape.dimensions)
    offsets = [0] * shape.rank
    if dim is not None:
        dims[dim] = size
        offsets[dim] = off + start
    return Shape(shape.element_type, tuple(dims), layout=shape.layout), tuple(offsets)


def tile_granule(shape: Shape, dim: int) -> int:
    """The first-level tile size along ``dim`` (1 when no tile cuts it): block sizes along ``dim`` are
    multiples of it, so a block is whole tiles."""
    layout = shape.effective_layout
    if not layout.tiles:
        return 1
    tile = layout.tiles[0].dimensions
    physical = list(reversed(layout.minor_to_major))
    position = physical.index(dim) - (len(physical) - len(tile))
    return tile[position] if position >= 0 and tile[position] > 0 else 1
