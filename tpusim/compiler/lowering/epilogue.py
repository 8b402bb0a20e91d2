"""Epilogues: an elementwise kernel applied to a matrix product's result blocks on their way out.

XLA:TPU fuses an activation, a scaling, a bias, a residual add or an output convert into the matmul that
feeds it: each result block is transformed in registers after it leaves the MXU, and only the transformed
block goes to HBM. Run as its own kernel, the activation would read and write the whole result once more
(for an 8192^3 bf16 matmul, 256 MB through HBM: +5.9% against the +1.3% XLA's fused ReLU measured).

:func:`find_epilogues` picks, before lowering, each ``dot`` whose one user is a loop fusion of elementwise
ops with the dot's dimensions, element type and layout. Besides the dot's result the fusion may read other
arrays (*side* operands): a bias broadcast along the result's rows (through the reshapes and broadcasts
JAX writes), a residual of the result's shape. The dot's rule then loads each result block's window of
every side operand while the block accumulates, appends the :func:`epilogue_chain` to the block and writes
the fusion's home; the fusion's rule emits nothing. Decided on the laid-out module and only for one
TensorCore; a dot that falls back (its own result computed, :func:`~tpusim.compiler.lowering.sequential.
lower_instruction` then drops the pairing), or whose side operands have no byte-identical view at the
result's rank, leaves its user to run as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from tpusim.compiler.blocks import on_vpu
from tpusim.compiler.hlo.ir import Computation, Instruction, Module
from tpusim.compiler.lowering.immediates import scalar_constant
from tpusim.isa import FusedOp, Operand
from tpusim.memory import Shape

__all__ = ["Chain", "Side", "epilogue_chain", "find_epilogues", "with_users"]


@dataclass(frozen=True)
class Side:
    """A side operand of an epilogue: fusion parameter ``parameter`` seen at the result's rank, ``order[d]``
    being the parameter's dimension along result dimension ``d`` (None: the operand is broadcast along it;
    a :func:`~tpusim.memory.reinterpret.view_shape` order)."""

    parameter: int
    order: tuple[int | None, ...]


@dataclass(frozen=True)
class Chain:
    """An epilogue fusion as one ``vpu.fused``: ``block`` is the parameter holding the dot's result (value
    0); ``sources`` are values 1.. (immediates, and side operands whose result-block windows the dot loads);
    ``steps`` compute the rest, the last being the fusion's result."""

    block: int
    sources: tuple[Operand | Side, ...]
    steps: tuple[FusedOp, ...]


def with_users(module: Module) -> Iterator[tuple[Computation, dict[str, list[Instruction]]]]:
    """Every computation of ``module`` that runs as code (not a fusion's body), with each value's users
    (each user once)."""
    fused = {i.attr("calls") for c in module.computations for i in c.instructions if i.opcode == "fusion"}
    for comp in module.computations:
        if comp.name in fused:
            continue
        users: dict[str, list[Instruction]] = {}
        for instr in comp.instructions:
            for o in dict.fromkeys(instr.operands):
                users.setdefault(o, []).append(instr)
        yield comp, users


def find_epilogues(module: Module) -> dict[tuple[str, str], str]:
    """``(computation, dot) -> fusion`` for every dot whose result only an elementwise loop fusion reads."""
    found: dict[tuple[str, str], str] = {}
    for comp, users in with_users(module):
        at = {instr.name: k for k, instr in enumerate(comp.instructions)}
        for instr in comp.instructions:
            mine = users.get(instr.name, [])
            if instr.opcode != "dot" or len(mine) != 1:
                continue
            user = mine[0]
            # The dot's code computes the fusion, so the fusion's other operands must be there when the dot
            # runs: parameters and constants always are, anything else must be lowered before the dot (the
            # two products of a SwiGLU's gate pair only the second with the fusion).
            ready = all(
                o == instr.name or comp[o].opcode in ("parameter", "constant") or at[o] < at[instr.name]
                for o in user.operands
            )
            if ready and _applies(module, instr, user):
                found[comp.name, instr.name] = user.name
    return found


def _applies(module: Module, dot: Instruction, user: Instruction) -> bool:
    if user.opcode != "fusion" or user.attr("kind") != "kLoop" or user.operands.count(dot.name) != 1:
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
        epilogue_chain(module[user.attr("calls")], user.operands.index(dot.name), module)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class _Part:
    """A value computed from side parameter ``parameter`` alone (scalars aside), not yet at the result's
    shape: ``placement[i]`` is the parameter dimension along its dimension ``i`` (None: a size-1 one)."""

    parameter: int
    placement: tuple[int | None, ...]
    value: int  # its number in the chain (placeholder numbering, see epilogue_chain)


def epilogue_chain(fused: Computation, block: int = 0, module: Module | None = None) -> Chain:
    """``fused`` as one ``vpu.fused`` on result blocks, parameter ``block`` being the block: scalar constants
    (and broadcasts of them) are immediates; other parameters are side operands, used at the result's
    shape directly or through reshapes that only add or drop size-1 dimensions and broadcasts.

    ``module`` (the one holding ``fused``) lets a nested loop fusion that only relayouts a value count as
    that value (:func:`_relayout`).

    Raises:
        ValueError: ``fused`` holds something else (an array constant, a reshape of the block, a side operand
            combined with another before it is broadcast ...).
    """
    root = fused[fused.root].shape
    if not isinstance(root, Shape):
        raise ValueError("a tuple result")
    rank = root.rank
    full: dict[str, int] = {}  # values at the result's shape -> number (steps: -1, -2, ... until renumbered)
    consts: dict[str, int] = {}  # scalar immediates -> number
    parts: dict[str, _Part] = {}
    sources: list[Operand | Side] = []
    side_source: dict[int, int] = {}  # parameter -> the number of its source
    side_rank: dict[int, int] = {}
    ops: list[FusedOp] = []

    def use_full(name: str) -> int:
        """The number of operand ``name`` of a step at the result's shape."""
        if name in full:
            return full[name]
        if name in consts:
            return consts[name]
        part = parts[name]
        at = fused[name].shape
        if not isinstance(at, Shape) or at.dimensions != root.dimensions:
            raise ValueError(f"{name}: a side operand combined before it is broadcast")
        _settle(part, part.placement)
        return part.value

    def _settle(part: _Part, order: tuple[int | None, ...]) -> None:
        """The side operand of ``part`` is seen at the result's rank with ``order``."""
        k = side_source[part.parameter] - 1
        side = sources[k]
        assert isinstance(side, Side)
        if side.order and side.order != order:
            raise ValueError(f"parameter {part.parameter} is broadcast two ways")
        sources[k] = Side(part.parameter, order)

    for instr in fused.instructions:
        shape = instr.shape
        if not isinstance(shape, Shape):
            raise ValueError(f"{instr.name}: a tuple")
        op = instr.opcode
        if op == "parameter":
            number = instr.attr("parameter_number", 0)
            if number == block:
                full[instr.name] = 0
            else:
                sources.append(Side(number, ()))
                side_source[number] = len(sources)
                side_rank[number] = shape.rank
                parts[instr.name] = _Part(number, tuple(range(shape.rank)), len(sources))
        elif op == "constant" and shape.rank == 0:
            const = scalar_constant(instr)
            if const is None:
                raise ValueError(f"a {shape.element_type} constant")
            sources.append(const)
            consts[instr.name] = len(sources)
        elif op == "broadcast" and instr.operands[0] in consts:
            consts[instr.name] = consts[instr.operands[0]]  # a scalar stays an immediate
        elif _relayout(module, fused, instr):  # the same values in another layout: a chain works on values
            src = instr.operands[0]
            if src in full:
                full[instr.name] = full[src]
            elif src in consts:
                consts[instr.name] = consts[src]
            elif src in parts:
                parts[instr.name] = parts[src]
            else:
                raise ValueError(f"{instr.name}: a relayout of {src}, which the chain does not hold")
        elif op in ("broadcast", "reshape", "bitcast") and instr.operands[0] in parts:
            part = parts[instr.operands[0]]
            placement = _placed(fused[instr.operands[0]].shape, part.placement, instr)
            if shape.dimensions == root.dimensions and op == "broadcast":
                _settle(part, placement)
                full[instr.name] = part.value
            else:
                parts[instr.name] = _Part(part.parameter, placement, part.value)
        elif on_vpu(fused, instr):
            if op == "compare" and instr.attr("type") == "TOTALORDER":
                raise ValueError("a total-order comparison")
            direction = instr.attr("direction") if op == "compare" else None
            mine = [parts[o] for o in instr.operands if o in parts]
            if mine and shape.dimensions != root.dimensions:  # a step on a side operand before its broadcast
                if any(m.parameter != mine[0].parameter or m.placement != mine[0].placement for m in mine) or any(
                    o not in parts and o not in consts for o in instr.operands
                ):
                    raise ValueError(f"{instr.name}: side operands combined before they are broadcast")
                args = tuple(parts[o].value if o in parts else consts[o] for o in instr.operands)
                ops.append(FusedOp(op, shape.element_type, args, direction))
                parts[instr.name] = _Part(mine[0].parameter, mine[0].placement, -len(ops))
                continue
            if shape.dimensions != root.dimensions:
                raise ValueError(f"{instr.name}: not at the result's shape")
            args = tuple(use_full(o) for o in instr.operands)
            ops.append(FusedOp(op, shape.element_type, args, direction))
            full[instr.name] = -len(ops)
        else:
            raise ValueError(f"{op} is not an elementwise step")
    if not ops or full.get(fused.root) != -len(ops):
        raise ValueError("the root is not the last elementwise step")
    for s in sources:
        if isinstance(s, Side) and (
            len(s.order) != rank or sorted(o for o in s.order if o is not None) != list(range(side_rank[s.parameter]))
        ):
            raise ValueError(f"parameter {s.parameter} is not seen whole at the result's shape")
    base = 1 + len(sources)  # values: block, sources, then one per step

    def value(n: int) -> int:
        return base - n - 1 if n < 0 else n

    steps = tuple(FusedOp(op.fn, op.etype, tuple(value(a) for a in op.args), op.direction) for op in ops)
    return Chain(block, tuple(sources), steps)


def _relayout(module: Module | None, fused: Computation, instr: Instruction) -> bool:
    """``instr`` only changes its operand's layout: a ``copy`` of the same shape, or a nested loop fusion
    that is one (XLA:TPU's ``copy_fusion`` changing an int8 array's tiling inside a dequantisation)."""
    if len(instr.operands) != 1 or not isinstance(instr.shape, Shape):
        return False
    src, dst = fused[instr.operands[0]].shape, instr.shape
    if not isinstance(src, Shape) or (src.dimensions, src.element_type) != (dst.dimensions, dst.element_type):
        return False
    if instr.opcode == "copy":
        return True
    if instr.opcode != "fusion" or instr.attr("kind") != "kLoop" or module is None:
        return False
    body = module[instr.attr("calls")]
    root = body.root_instruction
    return root.opcode == "copy" and len(body.instructions) == 2 and body[root.operands[0]].opcode == "parameter"


def _placed(src: object, placement: tuple[int | None, ...], instr: Instruction) -> tuple[int | None, ...]:
    """Where a side parameter's dimensions are in ``instr``'s result (a reshape adding or dropping size-1
    dimensions, or a broadcast), given their ``placement`` in its operand ``src``.

    Raises:
        ValueError: a reshape that moves elements, or a broadcast that repeats a value along a dimension
            other than the result's own.
    """
    shape = instr.shape
    assert isinstance(src, Shape) and isinstance(shape, Shape)
    if instr.opcode == "broadcast":
        dims = instr.attr("dimensions") or ()
        out: list[int | None] = [None] * shape.rank
        for i, d in enumerate(dims):
            out[d] = placement[i]
        return tuple(out)
    kept = [(n, p) for n, p in zip(src.dimensions, placement) if n != 1]
    if [n for n in shape.dimensions if n != 1] != [n for n, _ in kept]:
        raise ValueError(f"{instr.name}: a reshape that moves elements")
    it = iter(p for _, p in kept)
    return tuple(None if n == 1 else next(it) for n in shape.dimensions)
