"""Memory-space assignment: which values stay in VMEM between the instructions that make and use them.

An HLO instruction's result goes to HBM unless it is kept on chip. XLA:TPU's memory-space assignment keeps
most intermediates of a small program in VMEM (its compiled modules mark them ``S(1)``: in the corpus nearly
every value between two fusions), so each kernel streams its operands from VMEM, not HBM. tpusim does the
same for a module it lays out itself: every intermediate array value is marked ``S(1)``, and buffer
assignment keeps in VMEM those that fit the resident budget at the same time (the largest move to HBM
first, :func:`tpusim.compiler.buffer_assignment.assign_buffers`).

A ``while`` loop's state is one buffer across the loop, its body and its condition. Its array elements are
kept on chip too, as XLA:TPU keeps a scan's state in VMEM (its compiled scans' ``while`` tuples are ``S(1)``):
their layouts say ``S(1)`` in the loop's, the body's and the condition's views of the state, buffer
assignment copies them in once before the first iteration, and an element read after the loop is read where
the loop left it, or, when the computation returns it (a program result) or an instruction that may share its
buffer reads it, copied out once to a value with its old name and memory.

Integer and pred scalar entry parameters (an index, a position, a step count) arrive in HBM like every
parameter; one the program reads is copied into SMEM once, where the scalar unit reads it
(:func:`scalar_parameters_in_smem`), instead of a DMA and a vector instruction per use.

Not kept on chip: the entry parameters and results (the host reads and writes HBM), constants, integer and
pred scalars (SMEM's, for the scalar unit), branch and call results (one buffer across computations), the
state of a loop whose whole tuple is read after it, async copies' parts, and the values of instructions that
talk to the host or other devices.
"""

from __future__ import annotations

from dataclasses import replace

from tpusim.compiler.buffer_assignment import sequential_computations
from tpusim.compiler.hlo.ir import Attributes, Computation, Instruction, Module
from tpusim.compiler.passes import on_chip_shape
from tpusim.compiler.rewrite import unique_name
from tpusim.memory import AnyShape, Shape, TupleShape

__all__ = ["keep_on_chip", "scalar_parameters_in_smem", "scalar_word"]

_NOT_RESIDENT = frozenset(
    {"parameter", "constant", "tuple", "get-tuple-element", "while", "conditional", "call", "opt-barrier"}
    | {"infeed", "outfeed", "send", "send-done", "recv", "recv-done", "custom-call", "after-all"}
    | {"copy-start", "copy-done", "add-dependency", "domain", "rng-get-and-update-state"}
)


def keep_on_chip(module: Module, loop_state: bool = True) -> Module:
    """Mark every intermediate array value of the sequential computations ``S(1)``, and with ``loop_state`` the
    loops' state (see the module docstring; a program on several cores keeps no value on chip, and its loop
    state needs no copy out)."""
    comps = []
    sequential = set(sequential_computations(module))
    state = _resident_state(module, sequential) if loop_state else {}
    for comp in module.computations:
        if comp.name not in sequential:
            comps.append(comp)
            continue
        kept = state.get(comp.name, frozenset())
        returned = _returned(comp, kept)
        body = [_with_state(_resident(i, returned), comp, kept, state) for i in comp.instructions]
        body = _forwarded(_copied_out(body, comp, state, returned), comp.root)
        comps.append(replace(comp, instructions=tuple(body)))
    return replace(module, computations=tuple(comps))


def scalar_parameters_in_smem(module: Module) -> Module:
    """The module with a ``copy`` of each 32-bit integer or pred scalar entry parameter the program reads, read
    by the parameter's users instead: buffer assignment keeps the integer scalars a program computes in SMEM,
    so the copy is one DMA into SMEM and the scalar arithmetic on the value runs on the scalar unit (a
    dynamic slice at a clamped scalar position took 6.6 us, its index arithmetic a DMA and a vector
    instruction per operation)."""
    entry = module.entry_computation
    users = {i.name: 0 for i in entry.instructions}
    for instr in entry.instructions:
        for o in instr.operands:
            users[o] += 1
    words = [p for p in entry.parameters if users[p.name] and scalar_word(p.shape)]
    if not words:
        return module
    taken = {i.name for c in module.computations for i in c.instructions}
    copies = {p.name: unique_name(f"{p.name}.smem", taken) for p in words}
    # The parameters first (they depend on nothing), then the copies side by side, so that their DMAs are in
    # flight together: JAX declares each parameter where it is first used, and a copy waited for before the
    # next parameter's started took one HBM latency per scalar argument, in series.
    body: list[Instruction] = [i for i in entry.instructions if i.opcode == "parameter"]
    body += [Instruction(copies[p.name], "copy", p.shape, (p.name,), Attributes(), p.loc) for p in words]
    for instr in entry.instructions:
        if instr.opcode == "parameter":
            continue
        operands = tuple(copies.get(o, o) for o in instr.operands)
        body.append(replace(instr, operands=operands) if operands != instr.operands else instr)
    entry = replace(entry, instructions=tuple(body))
    return replace(module, computations=tuple(entry if c.is_entry else c for c in module.computations))


def scalar_word(shape: object) -> bool:
    """A shape the scalar unit computes on: a 32-bit integer or a pred scalar (SMEM words)."""
    if not isinstance(shape, Shape) or shape.rank:
        return False
    et = shape.element_type
    return et.name == "pred" or (et.is_integer and et.bits == 32)


def _forwarded(body: list[Instruction], root: str) -> list[Instruction]:
    """``body`` with each tuple (but the root), optimization barrier and element taken from one in its values'
    memories: they forward their operands' buffers (an inlined call's results), which one memory must hold."""
    shapes: dict[str, AnyShape] = {}
    tuples: dict[str, TupleShape] = {}  # the tuples made here (not parameters' or loops')
    out = []
    for instr in body:
        if instr.opcode == "tuple" and instr.name != root and all(o in shapes for o in instr.operands):
            made = tuples[instr.name] = TupleShape(tuple(shapes[o] for o in instr.operands))
            instr = replace(instr, shape=made)
        elif instr.opcode == "fusion" and isinstance(instr.shape, TupleShape):
            tuples[instr.name] = instr.shape  # (a multi-output fusion's elements, in the memories _resident says)
        elif instr.opcode == "opt-barrier" and instr.operands[0] in shapes:
            # (its operand's bytes: jax.checkpoint's barriers kept the values they pass in HBM)
            instr = replace(instr, shape=shapes[instr.operands[0]])
            if isinstance(instr.shape, TupleShape):
                tuples[instr.name] = instr.shape
        elif instr.opcode == "get-tuple-element" and instr.operands[0] in tuples:
            instr = replace(instr, shape=tuples[instr.operands[0]].elements[instr.attr("index")])
        shapes[instr.name] = instr.shape
        out.append(instr)
    return out


_SHARING = frozenset(
    {"tuple", "get-tuple-element", "bitcast", "reshape", "transpose", "copy", "opt-barrier", "while", "call"}
    | {"conditional", "dynamic-update-slice", "bitcast-convert", "add-dependency", "domain", "copy-start"}
)
"""Instructions whose result may share their operand's buffer (and so put it where their own value lives)."""


def _copied_out(
    body: list[Instruction], comp: Computation, state: dict[str, frozenset[int]], returned: set[str]
) -> list[Instruction]:
    """``body`` with each element of a loop's on-chip state that is read after the loop taken as the state's
    element (``S(1)``): the element the computation returns (a program result) under a new name, copied out
    to a value of its old name, shape and memory, as is one that an instruction that may share its buffer
    reads (:data:`_SHARING`: a bitcast of it may be a result); any other is read where the loop left it (it
    was copied out to HBM too, and its readers loaded it back)."""
    loops = {i.name: state[f"{comp.name}/{i.name}"] for i in body if f"{comp.name}/{i.name}" in state}
    if not loops:
        return body
    taken = {i.name for i in comp.instructions}
    readers: dict[str, set[str]] = {}
    for instr in comp.instructions:
        for o in instr.operands:
            readers.setdefault(o, set()).add(instr.opcode)
    out: list[Instruction] = []
    for instr in body:
        kept = loops.get(instr.operands[0]) if instr.opcode == "get-tuple-element" else None
        if kept is None or instr.attr("index") not in kept or not isinstance(instr.shape, Shape):
            out.append(instr)
            continue
        if instr.name not in returned and not readers.get(instr.name, set()) & _SHARING:
            out.append(replace(instr, shape=on_chip_shape(instr.shape)))
            continue
        element = unique_name(f"{instr.name}.state", taken)
        out.append(replace(instr, name=element, shape=on_chip_shape(instr.shape)))
        out.append(Instruction(instr.name, "copy", instr.shape, (element,), Attributes()))
    return out


def _resident_state(module: Module, sequential: set[str]) -> dict[str, frozenset[int]]:
    """Per loop body and condition (and, keyed ``computation/while``, per loop): the top-level state elements
    kept on chip (the array elements of a loop only read after it element by element)."""
    callers: dict[str, int] = {}
    for comp in module.computations:
        for instr in comp.instructions:
            for attr in ("body", "condition", "calls", "to_apply"):
                name = instr.attr(attr, None)
                if isinstance(name, str):
                    callers[name] = callers.get(name, 0) + 1
    out: dict[str, frozenset[int]] = {}
    for comp in module.computations:
        if comp.name not in sequential:
            continue
        for instr in comp.instructions:
            if instr.opcode != "while" or not isinstance(instr.shape, TupleShape):
                continue
            body, cond = instr.attr("body"), instr.attr("condition")
            if callers.get(body) != 1 or callers.get(cond) != 1 or body not in sequential or cond not in sequential:
                continue  # (a computation several loops run has one state type for all of them)
            if comp.root == instr.name or any(
                instr.name in i.operands and i.opcode != "get-tuple-element" for i in comp.instructions
            ):
                continue  # (the whole state is read after the loop: it keeps its memory)
            kept = frozenset(k for k, leaf in enumerate(instr.shape.elements) if _state_leaf(leaf))
            if kept:
                out[body] = out[cond] = kept
                out[f"{comp.name}/{instr.name}"] = kept
    return out


def _state_leaf(shape: object) -> bool:
    return isinstance(shape, Shape) and shape.rank > 0 and shape.element_type.kind != "token"


def _with_state(
    instr: Instruction, comp: Computation, kept: frozenset[int], state: dict[str, frozenset[int]]
) -> Instruction:
    """``instr`` with the kept state elements ``S(1)`` where it is, or forwards, a view of the loop state: the
    loop itself, and in a body or condition its parameter, the elements taken from it and the root tuple."""
    if instr.opcode == "while":
        own = state.get(f"{comp.name}/{instr.name}")
        return replace(instr, shape=_state_shape(instr.shape, own)) if own else instr
    if not kept:
        return instr
    if instr.opcode == "parameter" or (instr.opcode == "tuple" and instr.name == comp.root):
        return replace(instr, shape=_state_shape(instr.shape, kept))
    if instr.opcode == "get-tuple-element" and instr.attr("index") in kept:
        source = comp[instr.operands[0]]
        if source.opcode == "parameter" and isinstance(instr.shape, Shape):
            return replace(instr, shape=on_chip_shape(instr.shape))
    return instr


def _state_shape(shape: AnyShape, kept: frozenset[int]) -> AnyShape:
    if not isinstance(shape, TupleShape):
        return shape
    return replace(
        shape,
        elements=tuple(
            on_chip_shape(e) if k in kept and isinstance(e, Shape) else e for k, e in enumerate(shape.elements)
        ),
    )


def _resident(instr: Instruction, returned: set[str]) -> Instruction:
    shape = instr.shape
    if instr.opcode == "fusion" and isinstance(shape, TupleShape) and instr.name not in returned:
        # a multi-output fusion's results, each an intermediate like a single result (its elements are
        # taken out by get-tuple-elements, which forward them: _forwarded)
        elements = tuple(
            on_chip_shape(e) if isinstance(e, Shape) and e.rank and e.element_type.kind != "token" else e
            for e in shape.elements
        )
        return replace(instr, shape=replace(shape, elements=elements))
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


def _returned(comp: Computation, kept: frozenset[int] = frozenset()) -> set[str]:
    """The values a computation returns (its root and, through tuples, their elements): they are another
    computation's values too (the entry's are the program's outputs), so they keep their memory; but the
    elements of a loop body's root in the ``kept`` state positions are the next state, kept on chip."""
    out: set[str] = set()
    work = [comp.root]
    while work:
        name = work.pop()
        out.add(name)
        instr = comp[name]
        if instr.opcode == "tuple":
            work += [o for k, o in enumerate(instr.operands) if not (name == comp.root and k in kept)]
    return out
