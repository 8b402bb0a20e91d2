"""Dot strength reduction: a ``dot`` one of whose operands has no free dimension is a multiply and a reduce.

``einsum("bi,bi->b")`` is a batch of vector-vector products: on the MXU each is a 1 x K x 1 pass (its weight
latch and its pop for one value), so the batch ran at a fraction of a percent of the MXU's peak (256 rows of
512: 119 us on v5e, where XLA estimates 1.4 us). XLA's algebraic simplifier rewrites such a dot (its "dot
strength reduction") into an elementwise ``multiply`` and a ``reduce`` over the contracting dimensions, which
XLA:TPU runs on the vector unit; :func:`reduce_vector_dots` does the same, before fusion, so that the two
become one vector kernel:

* each operand transposed to (batch dimensions, free dimensions, contracting dimensions), the right one's
  paired with the left one's, and converted to the accumulation type (f32 for narrower floats, as the MXU
  accumulates; the result type otherwise); the one without free dimensions (a vector per batch index: a
  matrix-vector product) broadcast along the other's;
* ``multiply``, then ``reduce`` with ``add`` over the contracting dimensions, then a ``convert`` to the
  result type where it is narrower.

A matrix-vector product on the MXU is one row per weight tile it latches; with a contraction or columns of
at most :data:`_SHORT` the tile is almost all padding too, and the vector unit does the few multiply-adds
instead: a mixture of experts' gradient weighting 64 tokens' expert outputs by their gates (``[4,64,128] x
[64,4]``, 64 products of 1 x 4 x 128) took 21,800 cycles on the MXU. Longer ones keep the MXU: reduced, a
decode step's scores against a KV cache (``[4,8,64] x [4,256,8,64]``: 64 long, 256 columns) reduced the
cache across lanes after widening it to f32, 1.5x slower than the MXU's passes.

Only modules tpusim lays out itself (no tiled layout anywhere): an XLA:TPU module keeps its own choices.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

import numpy as np

from tpusim.compiler.dot_dims import dot_dims
from tpusim.compiler.hlo.ir import Attributes, Computation, Instruction, Literal, Module, has_tiled_layouts
from tpusim.compiler.rewrite import unique_name
from tpusim.memory import ElementType, Shape, element_type

__all__ = ["reduce_vector_dots"]

_SHORT = 8
"""A matrix-vector product is reduced here when its contraction or its columns are at most this many (its
MXU weight tiles at least 94% padding)."""


def reduce_vector_dots(module: Module) -> Module:
    """``module`` with every dot whose operands have no free dimension as a multiply and a reduce (see the
    module docstring); the same object when there is none, or when the module is laid out already."""
    if has_tiled_layouts(module):
        return module
    adders: dict[str, Computation] = {}
    taken = {c.name for c in module.computations}
    comps = []
    for comp in module.computations:
        names = {i.name for i in comp.instructions}
        body: list[Instruction] = []
        for instr in comp.instructions:
            body += _reduced(comp, instr, names, adders, taken) or [instr]
        comps.append(replace(comp, instructions=tuple(body)) if len(body) != len(comp.instructions) else comp)
    if not adders:
        return module
    return replace(module, computations=(*adders.values(), *comps))


def _accumulation(et: ElementType) -> ElementType | None:
    """The type a product of ``et`` results accumulates in (None: not reduced here)."""
    if et.is_complex or et.name == "pred":
        return None
    if et.is_float:
        return et if et.bits >= 32 else element_type("f32")
    return et


def _reduced(
    comp: Computation, instr: Instruction, names: set[str], adders: dict[str, Computation], taken: set[str]
) -> list[Instruction] | None:
    if instr.opcode != "dot" or not isinstance(instr.shape, Shape) or len(instr.operands) != 2:
        return None
    lhs, rhs = (comp[o].shape for o in instr.operands)
    if not isinstance(lhs, Shape) or not isinstance(rhs, Shape):
        return None
    dims = dot_dims(instr, lhs.rank, rhs.rank)
    acc = _accumulation(instr.shape.element_type)
    if (dims.lhs_free and dims.rhs_free) or not dims.lhs_contracting or acc is None:
        return None
    if dims.lhs_free or dims.rhs_free:  # a matrix-vector product: only where the MXU's tiles would be padding
        contraction = prod(lhs.dimensions[d] for d in dims.lhs_contracting)
        columns = prod(lhs.dimensions[d] for d in dims.lhs_free) * prod(rhs.dimensions[d] for d in dims.rhs_free)
        if dims.lhs_units or dims.rhs_units or dims.out_units or min(contraction, columns) > _SHORT:
            return None
    out: list[Instruction] = []

    def operand(name: str, shape: Shape, order: tuple[int, ...]) -> str:
        if order != tuple(range(shape.rank)):
            shape = Shape(shape.element_type, tuple(shape.dimensions[d] for d in order))
            moved = unique_name(f"{instr.name}.operand", names)
            out.append(Instruction(moved, "transpose", shape, (name,), Attributes({"dimensions": order}), instr.loc))
            name = moved
        if shape.element_type != acc:
            wide = unique_name(f"{instr.name}.operand", names)
            out.append(Instruction(wide, "convert", Shape(acc, shape.dimensions), (name,), Attributes(), instr.loc))
            name = wide
        return name

    a = operand(instr.operands[0], lhs, dims.lhs_batch + dims.lhs_free + dims.lhs_contracting)
    b = operand(instr.operands[1], rhs, dims.rhs_batch + dims.rhs_free + dims.rhs_contracting)
    batch = tuple(lhs.dimensions[d] for d in dims.lhs_batch)
    free = tuple(lhs.dimensions[d] for d in dims.lhs_free) + tuple(rhs.dimensions[d] for d in dims.rhs_free)
    full = Shape(acc, batch + free + tuple(lhs.dimensions[d] for d in dims.lhs_contracting))
    # (the operand without free dimensions, a vector per batch index, is broadcast along the other's)
    kept = tuple(range(len(batch))) + tuple(range(len(batch) + len(free), full.rank))
    if dims.rhs_free:
        a = _broadcast(a, full, kept, instr, names, out)
    elif dims.lhs_free:
        b = _broadcast(b, full, kept, instr, names, out)
    product = unique_name(f"{instr.name}.product", names)
    out.append(Instruction(product, "multiply", full, (a, b), Attributes(), instr.loc))
    zero = unique_name(f"{instr.name}.zero", names)
    scalar = Shape(acc, ())
    out.append(
        Instruction(zero, "constant", scalar, (), Attributes({"literal": Literal(scalar, np.zeros((), acc.dtype))}))
    )
    adder = _adder(acc, adders, taken)
    summed = Shape(acc, batch + free)
    reduced = instr.name if acc == instr.shape.element_type else unique_name(f"{instr.name}.sum", names)
    contracting = tuple(range(len(batch) + len(free), full.rank))
    attrs = Attributes({"dimensions": contracting, "to_apply": adder})
    out.append(
        Instruction(
            reduced, "reduce", summed if reduced != instr.name else instr.shape, (product, zero), attrs, instr.loc
        )
    )
    if reduced != instr.name:
        out.append(Instruction(instr.name, "convert", instr.shape, (reduced,), Attributes(), instr.loc))
    return out


def _broadcast(
    name: str, full: Shape, kept: tuple[int, ...], instr: Instruction, names: set[str], out: list[Instruction]
) -> str:
    """``name`` broadcast to ``full`` along the dimensions not in ``kept``."""
    wide = unique_name(f"{instr.name}.operand", names)
    attrs = Attributes({"dimensions": kept})
    out.append(Instruction(wide, "broadcast", full, (name,), attrs, instr.loc))
    return wide


def _adder(et: ElementType, adders: dict[str, Computation], taken: set[str]) -> str:
    """The name of an ``add`` reducer of ``et`` scalars (made once per type)."""
    known = adders.get(et.name)
    if known is None:
        name = unique_name(f"strength_reduced_add.{et.name}", taken)
        scalar = Shape(et, ())
        params = tuple(
            Instruction(p, "parameter", scalar, (), Attributes({"parameter_number": k})) for k, p in enumerate("xy")
        )
        root = Instruction("sum", "add", scalar, ("x", "y"), Attributes())
        known = adders[et.name] = Computation(name, (*params, root), "sum")
    return known.name
