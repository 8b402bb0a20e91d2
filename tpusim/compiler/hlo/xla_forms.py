"""XLA:TPU's own forms in its compiled modules, as plain HLO semantics both the reference interpreter and
the compiler read.

- ``ConcatBitcast``: a concatenation XLA makes free by placing its operands next to each other in memory; the
  text's operand order need not be their order in the result (:func:`concat_bitcast_order`).
- Async slices (``slice-start`` / ``slice-done``): the sliced array and where a slice starts
  (:func:`slice_source`).
- XLA's cost model's estimate of an instruction, ``"estimated_cycles"`` in its ``backend_config``
  (:func:`estimated_cycles`).
- Async collective fusions: XLA:TPU splits a collective it overlaps with compute into a fusion whose root is
  the custom call ``AsyncCollectiveStart(collective)``, continuation fusions that pass its state along, and a
  fusion whose root is ``AsyncCollectiveDone(...)``. The start's value is the tuple (the collective's
  operands, its result, synchronisation state); each continuation and the done take those elements as their
  first parameters, in that order, and repeat the collective on the operands for its meaning only (same
  ``channel_id``); the done's value is the result it was passed (:func:`async_collective_result`).
"""

from __future__ import annotations

import re
from dataclasses import replace

from tpusim.compiler.hlo.ir import Computation, Instruction, Module, custom_call_target
from tpusim.compiler.hlo.opcodes import COLLECTIVES
from tpusim.memory import Shape, TupleShape

__all__ = [
    "ASYNC_COLLECTIVE_DONE",
    "ASYNC_COLLECTIVE_START",
    "CONCAT_BITCAST",
    "PREPARE_ASYNC_CALL",
    "async_collective_result",
    "concat_bitcast_order",
    "estimated_cycles",
    "same_array",
    "slice_source",
    "wrapped_collective",
]

_ESTIMATE = re.compile(r'"estimated_cycles"\s*:\s*"?(\d+)')
_NO_ESTIMATE = 2**63 - 1
"""XLA's ``estimated_cycles`` of a kernel it does not estimate (v6e's SparseCore scatter): INT64_MAX."""

CONCAT_BITCAST = "ConcatBitcast"
ASYNC_COLLECTIVE_START = "AsyncCollectiveStart"
ASYNC_COLLECTIVE_DONE = "AsyncCollectiveDone"
PREPARE_ASYNC_CALL = ("PrepareAsyncCallStart", "PrepareAsyncCallDone")
"""XLA:TPU's handshake before a ``call-start`` on another execution thread (v6e offloads small scatters to its
SparseCore): a handle, then a token the call-start takes; they carry no values."""


def wrapped_collective(module: Module, instr: Instruction) -> Instruction | None:
    """The collective an ``async-start`` runs: XLA's short form (``reduce-scatter-start(...)``), or a called
    computation holding only its parameters and that collective (renamed after the start, on its operands)."""
    if instr.opcode != "async-start":
        return None
    op = instr.async_wrapped_instruction()
    called = instr.attr("calls")
    if op is None and isinstance(called, str):
        callee = module[called]
        root = callee[callee.root]
        params = {i.name: i.attr("parameter_number") for i in callee.instructions if i.opcode == "parameter"}
        if len(callee.instructions) == len(params) + 1 and all(o in params for o in root.operands):
            op = replace(root, name=instr.name, operands=tuple(instr.operands[params[o]] for o in root.operands))
    return op if op is not None and op.opcode in COLLECTIVES else None


def async_collective_result(comp: Computation, custom_call: Instruction) -> int:
    """Where the collective's result is, for an ``AsyncCollectiveStart`` (the element of its tuple) or an
    ``AsyncCollectiveDone`` (the operand): after the collective's own operands.

    Raises:
        ValueError: the collective is not found, or the element there does not have its result's shape."""
    start = custom_call_target(custom_call) == ASYNC_COLLECTIVE_START
    found = [comp[o] for o in custom_call.operands if o in comp and comp[o].attr("channel_id") is not None]
    if len(found) != 1:
        raise ValueError(f"{custom_call.name}: expected one collective among its operands, found {len(found)}")
    collective = found[0]
    at = len(collective.operands)
    if start:
        shape = custom_call.shape
        there = shape.elements[at] if isinstance(shape, TupleShape) and at < len(shape.elements) else None
    else:
        there = comp[custom_call.operands[at]].shape if at < len(custom_call.operands) else None
    if there is None or not same_array(there, collective.shape):
        raise ValueError(
            f"{custom_call.name}: element {at} is not the result of {collective.name} ({collective.shape}); this "
            "form of XLA:TPU's async collective fusion is not supported"
        )
    return at


def same_array(a: object, b: object) -> bool:
    """Same element type and dimensions (layouts and memory spaces aside)."""
    return (
        isinstance(a, Shape)
        and isinstance(b, Shape)
        and a.element_type == b.element_type
        and a.dimensions == b.dimensions
    )


def concat_bitcast_order(comp: Computation, instr: Instruction) -> tuple[int | None, tuple[int, ...]]:
    """How a ``ConcatBitcast`` custom-call assembles its result: ``(dimension, operand order)``; dimension
    None for a concatenation of bytes: one-dimensional operands whose stored bytes, one after the other, are
    the result's (XLA:TPU prefetches a bf16 weight as two ``s8`` byte-view slices and joins them so).

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
        arrays = [s for s in shapes if isinstance(s, Shape)]
        byte_form = (
            all(len(o) == 1 for o in dims)
            and len({s.element_type for s in arrays}) == 1
            and sum(s.byte_size for s in arrays) == result.byte_size
        )
        if not byte_form:
            raise ValueError(f"ConcatBitcast of {[list(d) for d in dims]} into {result} is not a concatenation")
    starts = [slice_source(comp, o, 0 if dimension is None else dimension) for o in instr.operands]
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
    """XLA:TPU's ``estimated_cycles`` for ``instr`` from its ``backend_config`` (XLA's cost model, at the chip's
    clock), or None when the text has none or XLA's placeholder for none."""
    config = instr.attributes.get("backend_config")
    if config is None:
        return None
    found = _ESTIMATE.search(str(getattr(config, "text", config)))
    if found is None or int(found.group(1)) >= _NO_ESTIMATE:
        return None
    return int(found.group(1))
