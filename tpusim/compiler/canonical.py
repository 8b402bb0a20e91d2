"""XLA:TPU's compiled forms rewritten as the plain HLO tpusim's lowerings know, before anything else runs.

A module XLA:TPU compiled (``jax.jit(f).lower(...).compile().as_text()`` with libtpu) carries forms of its own;
each rewrite keeps the module's values and its decisions (layouts, memory spaces, schedule):

1. **Nested fusions.** XLA:TPU wraps a fused bitcast or broadcast of a kernel's operand in a fusion of its own
   inside the kernel's fused computation; the inner computation is inlined, so a fused computation is flat.
2. **ConcatBitcast of prefetched slices.** XLA:TPU prefetches a weight into VMEM as a few async row slices
   (``slice-start`` / ``slice-done``) whose buffers it places side by side, so that a ``ConcatBitcast`` of them
   is the weight at no cost. When the slices tile one contiguous range of one array, the group becomes one
   async slice of that range: it starts where the first slice started and is waited for where the
   ``ConcatBitcast`` was, so the weight streams in while the instructions between run, as on the TPU. Any
   other ``ConcatBitcast`` becomes a ``concatenate`` of its operands in result order
   (:func:`tpusim.compiler.hlo.xla_forms.concat_bitcast_order`).
3. **Bitcasts** say what they mean through layouts: ``bitcast(x{0,1}) -> {1,0}`` of a square array is its
   transpose. Inside a fused computation each becomes the chain its layouts imply: ``transpose`` to the
   operand's physical order, ``reshape`` to the result's physical dimensions, ``transpose`` to the result's
   order, each step leaving every byte where it is (so the vector unit moves nothing for it) and identity
   steps left out. Outside fusions the same happens in a module not laid out yet (no tiles anywhere), whose
   orders layout assignment will choose afresh: the text's orders fix the bitcast's meaning, which must not
   change with them. In a laid-out module a bitcast outside a fusion stays one (its buffer is shared). A
   fused bitcast between two sizes of one tiled array (``f32[501]{0:T(512)}`` to ``f32[512]{0:T(512)}``, the
   operand's padding becoming elements) is a ``slice`` to the sizes both hold and a ``pad`` with zeros.
4. **Whole-row windows.** A ``reduce-window`` whose every window holds whole dimensions (XLA:TPU's softmax
   keeps a row maximum at full width as a 511-tap window over 256 columns) is a ``reduce`` of those
   dimensions and a ``broadcast`` back: one lane reduction per row instead of one window per element.
5. **Async collective fusions** (:mod:`tpusim.compiler.hlo.xla_forms`). The start fusion's root
   ``AsyncCollectiveStart(collective)`` becomes the tuple it stands for (the collective's operands, its
   result, zeros for the synchronisation state), so the collective runs there; a done fusion's root
   ``AsyncCollectiveDone`` becomes the result it is passed; a continuation's copy of the collective (same
   ``channel_id``, kept for its meaning) becomes the parameter that carries the result. The collective then
   runs once, at the start, without overlapping the continuations' compute (an approximation: on the TPU
   the continuations advance it).
6. **Calls on another execution thread.** v6e offloads small scatters to its SparseCore: a ``call-start``
   (``async_execution_thread="sparsecore"``) and its ``call-done``, after a ``PrepareAsyncCallStart`` /
   ``PrepareAsyncCallDone`` handshake. tpusim models no SparseCore: the pair becomes a plain ``call`` of the
   same computation where the start was, run by the TensorCore (the handshake lowers to no code).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np

from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo.ir import (
    Attributes,
    Computation,
    Instruction,
    Literal,
    Module,
    PadDim,
    SliceDim,
    custom_call_target,
    has_tiled_layouts,
)
from tpusim.compiler.hlo.xla_forms import (
    ASYNC_COLLECTIVE_DONE,
    ASYNC_COLLECTIVE_START,
    async_collective_result,
    concat_bitcast_order,
    same_array,
)
from tpusim.compiler.hlo.xla_forms import CONCAT_BITCAST as _CONCAT
from tpusim.compiler.passes import drop_unused, inline_instruction
from tpusim.compiler.rewrite import unique_name
from tpusim.memory import Layout, Shape, TupleShape, geometry
from tpusim.memory.reinterpret import bytes_agree

__all__ = [
    "async_collective_fusions",
    "canonicalize",
    "concat_bitcasts",
    "flatten_fusions",
    "fused_bitcasts",
    "threaded_calls",
    "whole_row_windows",
]


def canonicalize(module: Module) -> Module:
    """Apply the rewrites of the module docstring, in order."""
    module = async_collective_fusions(whole_row_windows(fused_bitcasts(concat_bitcasts(flatten_fusions(module)))))
    return threaded_calls(module)


# --------------------------------------------------------------------------------------------- 1. fusions
def flatten_fusions(module: Module) -> Module:
    """Inline every fusion that sits inside a fused computation (repeatedly, for deeper nesting)."""
    for _ in range(64):
        fused = {i.attr("calls") for c in module.computations for i in c.instructions if i.opcode == "fusion"}
        changed = False
        comps = []
        for comp in module.computations:
            if comp.name not in fused or not any(i.opcode == "fusion" for i in comp.instructions):
                comps.append(comp)
                continue
            taken = {i.name for i in comp.instructions}
            body: list[Instruction] = []
            for instr in comp.instructions:
                if instr.opcode == "fusion":
                    body += inline_instruction(comp, instr, module[instr.attr("calls")], taken)
                    changed = True
                else:
                    body.append(instr)
            comps.append(replace(comp, instructions=tuple(body)))
        if not changed:
            return module
        module = drop_unused(replace(module, computations=tuple(comps)))
    return module


# --------------------------------------------------------------------------------------------- 2. ConcatBitcast
def concat_bitcasts(module: Module) -> Module:
    comps = []
    for comp in module.computations:
        concats = [i for i in comp.instructions if i.opcode == "custom-call" and custom_call_target(i) == _CONCAT]
        comps.append(_rewrite_concats(comp, concats) if concats else comp)
    return replace(module, computations=tuple(comps))


def _user_names(comp: Computation) -> dict[str, list[str]]:
    """Each value's users, by name, in instruction order (a user once per operand it reads the value as)."""
    users: dict[str, list[str]] = {}
    for instr in comp.instructions:
        for o in instr.operands:
            users.setdefault(o, []).append(instr.name)
    return users


def _rewrite_concats(comp: Computation, concats: list[Instruction]) -> Computation:
    users = _user_names(comp)
    replaced: dict[str, Instruction] = {}
    dropped: set[str] = set()
    added: dict[str, list[Instruction]] = {}  # instructions to put before a replaced one
    names = {i.name for i in comp.instructions}
    for concat in concats:
        try:
            dimension, order = concat_bitcast_order(comp, concat)
        except ValueError as err:
            raise CompileError(f"{concat.name}: {err}") from None
        # A concatenation of bytes is one of the operands' arrays (joined along their one dimension), whose
        # bytes the result then reads: a bitcast.
        joined = (
            concat if dimension is not None else _byte_view(comp, concat, unique_name(f"{concat.name}.bytes", names))
        )
        merged = _merged_slices(comp, joined, dimension or 0, order, users, concat)
        if merged is None:
            attrs = Attributes({"dimensions": (dimension or 0,)})
            operands = tuple(concat.operands[i] for i in order)
            replaced[concat.name] = Instruction(joined.name, "concatenate", joined.shape, operands, attrs, concat.loc)
        else:
            start, done_of = merged
            replaced[start.name] = start
            replaced[concat.name] = done_of
            dropped.update(o for o in concat.operands)  # the dones
            dropped.update(comp[o].operands[0] for o in concat.operands if comp[o].operands[0] != start.name)
        if joined is not concat:
            bitcast = Instruction(concat.name, "bitcast", concat.shape, (joined.name,), Attributes(), concat.loc)
            added[concat.name] = [replaced[concat.name]]
            replaced[concat.name] = bitcast
    body: list[Instruction] = []
    for i in comp.instructions:
        if i.name not in dropped or i.name in replaced:
            body += [*added.get(i.name, []), replaced.get(i.name, i)]
    return replace(comp, instructions=tuple(body))


def _byte_view(comp: Computation, concat: Instruction, name: str) -> Instruction:
    """The array a concatenation of bytes joins (its operands' type and layout, their lengths added), named
    ``name``: the ConcatBitcast's result is a bitcast of it."""
    first = comp[concat.operands[0]].shape
    assert isinstance(first, Shape)
    length = sum(comp[o].array_shape.dimensions[0] for o in concat.operands)
    return Instruction(
        name, "concatenate", replace(first, dimensions=(length,)), concat.operands, Attributes(), concat.loc
    )


def _merged_slices(
    comp: Computation,
    concat: Instruction,
    dimension: int,
    order: tuple[int, ...],
    users: dict[str, list[str]],
    call: Instruction | None = None,
) -> tuple[Instruction, Instruction] | None:
    """``(async slice of the whole range, its done named and shaped as ``concat``)`` when the operands of the
    ConcatBitcast ``call`` (``concat`` itself unless given) are async slices, each used only there, tiling one
    contiguous range of one array along ``dimension``; else None."""
    call = concat if call is None else call
    dones = [comp[call.operands[i]] for i in order]
    if any(d.opcode != "async-done" or users.get(d.name) != [call.name] for d in dones):
        return None
    starts = [comp[d.operands[0]] for d in dones]
    wrapped = [s.async_wrapped_instruction() for s in starts]
    if any(
        w is None or w.opcode != "slice" or users.get(s.name) != [d.name] for w, s, d in zip(wrapped, starts, dones)
    ):
        return None
    ranges = [w.attr("slice") for w in wrapped]  # type: ignore[union-attr]
    if len({s.operands for s in starts}) != 1 or any(r.stride != 1 for rs in ranges for r in rs):
        return None
    others = {tuple(r for d, r in enumerate(rs) if d != dimension) for rs in ranges}
    spans = [(rs[dimension].start, rs[dimension].limit) for rs in ranges]
    if len(others) != 1 or any(a[1] != b[0] for a, b in pairwise(spans)):
        return None
    first = min(starts, key=lambda s: comp.instructions.index(s))
    whole = list(ranges[0])
    whole[dimension] = SliceDim(spans[0][0], spans[-1][1])
    shape = first.shape
    assert isinstance(shape, TupleShape)
    start_shape = TupleShape((shape.elements[0], concat.shape, *shape.elements[2:]))
    start = replace(first, shape=start_shape, attributes=first.attributes.replace(slice=tuple(whole)))
    done = Instruction(concat.name, "async-done", concat.shape, (first.name,), Attributes(), concat.loc)
    return start, done


# --------------------------------------------------------------------------------------------- 3. bitcasts
def fused_bitcasts(module: Module) -> Module:
    """Bitcasts as the moves they mean, in fused computations, and everywhere in a module without tiles."""
    fused = {i.attr("calls") for c in module.computations for i in c.instructions if i.opcode == "fusion"}
    untiled = not has_tiled_layouts(module)
    comps = []
    for comp in module.computations:
        inside = comp.name in fused
        if not (inside or untiled) or not any(i.opcode == "bitcast" for i in comp.instructions):
            comps.append(comp)
            continue
        taken = {i.name for i in comp.instructions}
        body: list[Instruction] = []
        for instr in comp.instructions:
            body += _bitcast_meaning(comp, instr, taken, inside) if instr.opcode == "bitcast" else [instr]
        comps.append(replace(comp, instructions=tuple(body)))
    return replace(module, computations=tuple(comps))


def _bitcast_meaning(comp: Computation, instr: Instruction, taken: set[str], fused: bool) -> list[Instruction]:
    """The transpose / reshape / transpose chain a bitcast's layouts imply (see the module docstring); one
    that reads every element where it was is a copy in a fusion, a reshape (a shared buffer) outside."""
    x, y = comp[instr.operands[0]].array_shape, instr.array_shape
    same = replace(instr, opcode="copy" if fused else "reshape")
    if x.dimensions == y.dimensions and x.effective_layout.minor_to_major == y.effective_layout.minor_to_major:
        return [same] if x.element_type == y.element_type else [instr]
    if x.element_type != y.element_type:
        return [instr]  # (a bitcast between types: none occurs in fusions XLA:TPU writes)
    if x.element_count != y.element_count:
        return _padded_bitcast_meaning(x, y, instr, taken) or [instr]
    if bytes_agree(x, y) is not True:
        # The tiles make the bytes mean something else than the elements in physical order (XLA:TPU's
        # bf16[8,256]{1,0} as bf16[8,2,128]{2,0,1} under (8,128) tiles: column block c is the c-th tile): a
        # row-major reshape when that is what the bytes hold, else the bitcast stays (its byte meaning).
        if bytes_agree(x, y, row_major=True) is True:
            return [replace(instr, opcode="reshape")]
        return [instr]
    px = tuple(reversed(x.effective_layout.minor_to_major))  # physical order, major to minor
    py = tuple(reversed(y.effective_layout.minor_to_major))
    base = replace(x.effective_layout, memory_space=0)
    steps: list[tuple[str, tuple[int, ...], dict[str, object]]] = []  # (opcode, dims, attributes)
    if px != tuple(range(x.rank)):
        steps.append(("transpose", tuple(x.dimensions[p] for p in px), {"dimensions": px}))
    physical_y = tuple(y.dimensions[p] for p in py)
    if physical_y != (steps[-1][1] if steps else x.dimensions):
        steps.append(("reshape", physical_y, {}))
    q = tuple(py.index(d) for d in range(y.rank))
    if q != tuple(range(y.rank)):
        steps.append(("transpose", y.dimensions, {"dimensions": q}))
    out: list[Instruction] = []
    source = instr.operands[0]
    for n, (opcode, dims, attrs) in enumerate(steps):
        last = n == len(steps) - 1
        name = instr.name if last else unique_name(f"{instr.name}.{opcode}", taken)
        layout = y.effective_layout if last else replace(base, minor_to_major=tuple(range(len(dims) - 1, -1, -1)))
        shape = Shape(x.element_type, dims, layout=layout)
        out.append(Instruction(name, opcode, shape, (source,), Attributes(attrs), instr.loc))
        source = name
    return out or [same]


def _padded_bitcast_meaning(x: Shape, y: Shape, instr: Instruction, taken: set[str]) -> list[Instruction] | None:
    """A bitcast between two sizes of one tiled array (XLA:TPU's ``f32[501]{0:T(512)}`` to ``f32[512]{0:T(512)}``:
    same layout, same tiled dimensions, so every index both shapes hold sits at the same byte) as a ``slice``
    to the sizes both hold and a ``pad`` with zeros, the value the reference interpreter gives the operand's
    padding (docs/reference.md); None for any other change of size, which keeps its bitcast."""
    lx, ly = replace(x.effective_layout, memory_space=0), replace(y.effective_layout, memory_space=0)
    if lx != ly or not lx.tiles or x.rank != y.rank or geometry(x).tiled_dims != geometry(y).tiled_dims:
        return None
    common = tuple(min(a, b) for a, b in zip(x.dimensions, y.dimensions))
    out: list[Instruction] = []
    source = instr.operands[0]
    if common != x.dimensions:
        name = unique_name(f"{instr.name}.slice", taken) if common != y.dimensions else instr.name
        limits = tuple(SliceDim(0, c) for c in common)
        shape = y if name == instr.name else Shape(x.element_type, common, layout=lx)
        out.append(Instruction(name, "slice", shape, (source,), Attributes({"slice": limits}), instr.loc))
        source = name
    if common != y.dimensions:
        zero = unique_name(f"{instr.name}.zero", taken)
        scalar = Shape(y.element_type, (), layout=Layout(()))
        literal = Literal(scalar, np.zeros((), y.element_type.dtype))
        out.append(Instruction(zero, "constant", scalar, (), Attributes({"literal": literal}), instr.loc))
        padding = tuple(PadDim(0, b - c) for b, c in zip(y.dimensions, common))
        out.append(Instruction(instr.name, "pad", y, (source, zero), Attributes({"padding": padding}), instr.loc))
    return out


# --------------------------------------------------------------------------------------------- 4. windows
def whole_row_windows(module: Module) -> Module:
    comps = []
    for comp in module.computations:
        taken = {i.name for i in comp.instructions}
        body: list[Instruction] = []
        for instr in comp.instructions:
            body += _as_reduce(comp, instr, taken) or [instr]
        comps.append(replace(comp, instructions=tuple(body)) if len(body) != len(comp.instructions) else comp)
    return replace(module, computations=tuple(comps))


def _as_reduce(comp: Computation, instr: Instruction, taken: set[str]) -> list[Instruction] | None:
    """``reduce`` + ``broadcast`` for a one-operand reduce-window whose windows each hold whole dimensions."""
    if instr.opcode != "reduce-window" or len(instr.operands) != 2 or not isinstance(instr.shape, Shape):
        return None
    operand = comp[instr.operands[0]].array_shape
    window = instr.attr("window")
    if window is None:
        return None
    whole = [d for d, w in enumerate(window.dims) if w.size > 1 and w.covers(operand.dimensions[d])]
    if not whole or not all(w.trivial or d in whole for d, w in enumerate(window.dims)):
        return None
    keep = [d for d in range(operand.rank) if d not in whole]
    order = instr.shape.effective_layout.minor_to_major
    kept_order = tuple(keep.index(d) for d in order if d in keep)
    reduced_shape = Shape(
        instr.shape.element_type, tuple(operand.dimensions[d] for d in keep), layout=Layout(kept_order)
    )
    name = unique_name(f"{instr.name}.reduce", taken)
    attrs = Attributes({"dimensions": tuple(whole), "to_apply": instr.attr("to_apply")})
    reduced = Instruction(name, "reduce", reduced_shape, instr.operands, attrs, instr.loc)
    broadcast = Instruction(
        instr.name, "broadcast", instr.shape, (name,), Attributes({"dimensions": tuple(keep)}), instr.loc
    )
    return [reduced, broadcast]


# --------------------------------------------------------------------------------------------- 5. async collectives
def async_collective_fusions(module: Module) -> Module:
    """XLA:TPU's async collective fusions as a plain collective at the start (see the module docstring).

    The continuations and the done are found by data flow, not by name: a fusion reading the element of a
    start (or of a continuation) that carries the result runs that collective on, and the parameter it reads
    it through carries the result (XLA's channel ids are not unique across collectives)."""
    starts: dict[str, tuple[int, object]] = {}  # start's computation -> (element of the result, channel_id)
    comps = {c.name: c for c in module.computations}
    for comp in module.computations:
        root = comp[comp.root]
        if root.opcode == "custom-call" and custom_call_target(root) == ASYNC_COLLECTIVE_START:
            at = _result_at(comp, root)
            collective = comp[root.operands[0]]
            starts[comp.name] = (at, collective.attr("channel_id"))
            comps[comp.name] = _started(comp, root, collective, at)
    if not starts:
        return module
    for caller in module.computations:
        tuples: dict[str, tuple[int, object]] = {}  # value -> (element carrying a result, its channel)
        arrays: dict[str, object] = {}  # value -> the channel whose result it is
        for instr in caller.instructions:
            callee = instr.attr("calls") if instr.opcode == "fusion" else None
            if callee in starts:
                tuples[instr.name] = starts[callee]
            elif instr.opcode == "get-tuple-element" and instr.operands[0] in tuples:
                at, channel = tuples[instr.operands[0]]
                if instr.attr("index") == at:
                    arrays[instr.name] = channel
            elif isinstance(callee, str) and any(o in arrays for o in instr.operands):
                carrying = {k: arrays[o] for k, o in enumerate(instr.operands) if o in arrays}
                comps[callee], at_out = _continued(comps[callee], carrying)
                if at_out is not None:
                    tuples[instr.name] = at_out
    return replace(module, computations=tuple(comps[c.name] for c in module.computations))


def _continued(comp: Computation, carrying: dict[int, object]) -> tuple[Computation, tuple[int, object] | None]:
    """A continuation or done fused computation whose parameters ``carrying`` (number -> channel) carry
    started collectives' results: the done returns the result; a continuation's copies of the collective read
    it from that parameter. Also where the rewritten computation's root tuple passes a result on."""
    params = {i.attr("parameter_number"): i for i in comp.instructions if i.opcode == "parameter"}
    by_channel = {channel: params[k] for k, channel in carrying.items() if k in params}
    root = comp[comp.root]
    if root.opcode == "custom-call" and custom_call_target(root) == ASYNC_COLLECTIVE_DONE:
        result = root.operands[_result_at(comp, root)]
        if result not in {p.name for p in by_channel.values()}:
            raise CompileError(f"computation {comp.name}: {root.name} does not return a started collective's result")
        return _live(replace(comp, root=result)), None
    alias: dict[str, str] = {}
    for instr in comp.instructions:
        param = by_channel.get(instr.attr("channel_id")) if instr.attr("channel_id") is not None else None
        if param is not None and instr.opcode != "parameter" and same_array(param.shape, instr.shape):
            alias[instr.name] = param.name
    if alias:
        kept = [i for i in comp.instructions if i.name not in alias]
        body = [replace(i, operands=tuple(alias.get(o, o) for o in i.operands)) for i in kept]
        comp = _live(replace(comp, instructions=tuple(body), root=alias.get(comp.root, comp.root)))
    root = comp[comp.root]
    names = {p.name: channel for channel, p in by_channel.items()}
    if root.opcode == "tuple":
        for k, o in enumerate(root.operands):
            if o in names:
                return comp, (k, names[o])
    return comp, None


def _result_at(comp: Computation, custom_call: Instruction) -> int:
    try:
        return async_collective_result(comp, custom_call)
    except ValueError as err:
        raise CompileError(f"computation {comp.name}: {err}") from None


def _started(comp: Computation, root: Instruction, collective: Instruction, at: int) -> Computation:
    """The start's computation with its root the tuple it stands for."""
    assert isinstance(root.shape, TupleShape)
    taken = {i.name for i in comp.instructions}
    body = [i for i in comp.instructions if i.name != root.name]
    parts: list[str] = []
    for k, shape in enumerate(root.shape.elements):
        if k < len(collective.operands):
            parts.append(collective.operands[k])
        elif k == at:
            parts.append(collective.name)
        else:
            assert isinstance(shape, Shape)
            zero = unique_name(f"{root.name}.state{k}", taken)
            literal = Literal(shape, np.zeros(shape.dimensions, shape.element_type.dtype))
            body.append(Instruction(zero, "constant", shape, (), Attributes({"literal": literal})))
            parts.append(zero)
    body.append(Instruction(root.name, "tuple", root.shape, tuple(parts), loc=root.loc))
    return replace(comp, instructions=tuple(body))


def _live(comp: Computation) -> Computation:
    """``comp`` without the instructions its root does not need (parameters stay)."""
    need = {comp.root}
    for instr in reversed(comp.instructions):
        if instr.name in need:
            need.update(instr.operands)
    body = tuple(i for i in comp.instructions if i.name in need or i.opcode == "parameter")
    return replace(comp, instructions=body)


# --------------------------------------------------------------------------------------------- 6. threaded calls
def threaded_calls(module: Module) -> Module:
    """Every ``call-start`` on another execution thread whose only user is its ``call-done`` as a ``call`` at the
    start, named as the done (see the module docstring)."""
    comps = []
    for comp in module.computations:
        users = _user_names(comp)
        calls: dict[str, Instruction] = {}  # start -> the call that replaces it
        dones: set[str] = set()
        for instr in comp.instructions:
            wrapped = instr.async_wrapped_instruction()
            after = users.get(instr.name, [])
            if wrapped is None or wrapped.opcode != "call" or instr.attr("async_execution_thread") is None:
                continue
            if len(after) != 1 or comp[after[0]].opcode != "async-done":
                continue
            done = comp[after[0]]
            calls[instr.name] = replace(wrapped, name=done.name, shape=done.shape)
            dones.add(done.name)
        if not calls:
            comps.append(comp)
            continue
        body = tuple(calls.get(i.name, i) for i in comp.instructions if i.name not in dones)
        comps.append(replace(comp, instructions=body))
    return replace(module, computations=tuple(comps))
