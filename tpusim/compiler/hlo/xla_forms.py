"""XLA:TPU's own forms in its compiled modules, as plain HLO semantics both the reference interpreter and
the compiler read.

- ``ConcatBitcast``: a concatenation XLA makes free by placing its operands next to each other in memory; the
  text's operand order need not be their order in the result (:func:`concat_bitcast_order`).
- Async slices (``slice-start`` / ``slice-done``): the sliced array and where a slice starts
  (:func:`slice_source`).
- XLA's cost model's estimate of an instruction, ``"estimated_cycles"`` in its ``backend_config``
  (:func:`estimated_cycles`).
"""

from __future__ import annotations

import re

from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.memory import Shape, TupleShape

__all__ = ["CONCAT_BITCAST", "concat_bitcast_order", "estimated_cycles", "slice_source"]

_ESTIMATE = re.compile(r'"estimated_cycles"\s*:\s*"?(\d+)')

CONCAT_BITCAST = "ConcatBitcast"


def concat_bitcast_order(comp: Computation, instr: Instruction) -> tuple[int, tuple[int, ...]]:
    """How a ``ConcatBitcast`` custom-call assembles its result: ``(dimension, operand order)``.

    XLA:TPU makes the concatenation free by placing its operands next to each other in memory, so the operand
    order in the text need not be their order in the result: a weight prefetched as four row slices
    ``[128:256], [256:384], [384:512], [0:128]`` is one ``ConcatBitcast`` of the four that is the weight
    itself. When every operand is the result of a ``slice-done`` (or a ``slice``) of one array along the
    concatenated dimension, the operands go in the order of their slice starts; otherwise in the text's order.
    The dimension is the one in which the result is the sum of its operands' sizes, the others equal.

    Raises:
        ValueError: the shapes do not describe a concatenation.
    """
    result = instr.shape
    shapes = [comp[o].shape for o in instr.operands]
    dims = [s.dimensions for s in shapes if isinstance(s, Shape)]
    if isinstance(result, TupleShape) or not dims or len(dims) != len(instr.operands):
        raise ValueError("ConcatBitcast takes array operands and has an array result")
    want = result.dimensions
    dimension = next(
        (
            d
            for d in range(len(want))
            if all(len(o) == len(want) and all(o[e] == want[e] for e in range(len(want)) if e != d) for o in dims)
            and sum(o[d] for o in dims) == want[d]
        ),
        None,
    )
    if dimension is None:
        raise ValueError(f"ConcatBitcast of {[list(d) for d in dims]} into {result} is not a concatenation")
    starts = [slice_source(comp, o, dimension) for o in instr.operands]
    order = tuple(range(len(dims)))
    known = [s for s in starts if s is not None]
    if len(known) == len(starts) and len({s[0] for s in known}) == 1:
        order = tuple(sorted(order, key=lambda i: known[i][1]))
    return dimension, order


def slice_source(comp: Computation, name: str, dimension: int) -> tuple[str, int] | None:
    """``(sliced array, start in dimension)`` when ``name`` is a slice, or the done of an async slice."""
    instr = comp[name]
    if instr.opcode == "async-done":
        instr = comp[instr.operands[0]]
    wrapped = instr.async_wrapped_instruction() or instr
    if wrapped.opcode != "slice":
        return None
    return wrapped.operands[0], wrapped.attr("slice")[dimension].start


def estimated_cycles(instr: Instruction) -> int | None:
    """XLA:TPU's ``estimated_cycles`` for ``instr`` from its ``backend_config`` (XLA's cost model, in its own
    cycles), or None when the text has none."""
    config = instr.attributes.get("backend_config")
    if config is None:
        return None
    found = _ESTIMATE.search(str(getattr(config, "text", config)))
    return int(found.group(1)) if found else None
