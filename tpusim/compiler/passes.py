"""HLO-to-HLO passes that run before layout assignment.

0. ``zero_sized``: an instruction whose result holds no element becomes an empty constant, and one that reads
   empty operands into a non-empty result (a reduce of ``f32[0,8]``, a pad or a concatenate of empty
   arrays, a dot over an empty contraction) becomes the broadcast or copy it equals, as XLA's
   ZeroSizedHloElimination and algebraic simplifier do: no lowering ever sees an empty array.
0. ``drop_annotations``: shape-preserving annotation custom-calls (``Sharding`` that JAX puts on typed PRNG
   keys and sharded values, ``annotate_device_placement``) are removed, their users reading the operand,
   as XLA's sharding propagation removes them before code generation.
0. ``explicit_broadcasts``: a ``clamp`` with scalar bounds or a ``select`` with a scalar predicate (HLO
   broadcasts those implicitly) gets explicit ``broadcast`` operands, so every later stage sees operands
   of the result's dimensions.
1. ``inline_calls``: replace every ``call`` by the instructions of the computation it calls (XLA's
   CallInliner), so fusion can see through JAX's nested ``jit`` functions.
2. ``unfuse``: a fusion whose computation holds an operation the vector unit cannot run inside a fusion
   (a dot, convolution, gather, sort, ...) is dissolved into its instructions; each then gets its own
   lowering (the MXU for the dot, for example) and the elementwise rest is fused again by step 3.
3. ``fuse``: greedy producer-into-consumer fusion of vector operations, as XLA's instruction fusion does:
   an operation joins the fusion of its users when all of its users are in that fusion and the fusion can
   still be cut into blocks (:func:`tpusim.compiler.blocks.plan_needs`). Intermediate values of a
   fusion never travel through HBM.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tpusim.compiler.blocks import BLOCK_TARGET_BYTES, NEED_RULES, plan_needs
from tpusim.compiler.call_graph import flatten_call_graph
from tpusim.compiler.dot_strength import reduce_vector_dots
from tpusim.compiler.errors import NotLowerable
from tpusim.compiler.hlo.ir import Attributes, Computation, Instruction, Literal, Module, custom_call_target
from tpusim.compiler.options import CompileOptions
from tpusim.compiler.rewrite import rewrite_instructions, unique_name
from tpusim.memory import Shape, TupleShape
from tpusim.memory.reinterpret import bitcast_is_reshape
from tpusim.memory.shape import Layout

__all__ = [
    "drop_annotations",
    "drop_unused",
    "explicit_broadcasts",
    "fuse",
    "inline_calls",
    "inline_instruction",
    "prepare_module",
    "unfuse",
    "zero_sized",
]


def on_chip_shape(shape: Shape) -> Shape:
    """``shape`` kept in VMEM: its layout's memory space ``S(1)``."""
    layout = shape.layout or Layout.default(shape.rank)
    return shape.with_layout(replace(layout, memory_space=1))


# Operations a fusion may hold (those with a block rule); parameters are a fusion's inputs.
FUSIBLE = frozenset(NEED_RULES) - {"parameter"}


def prepare_module(module: Module, options: CompileOptions) -> Module:
    """Make the module ready for lowering: explicit broadcasts, inline calls, a copy of each loop body and
    branch per caller, vector-vector dots as multiplies and reduces, dissolve unsupported fusions, fuse."""
    module = drop_annotations(module)
    module = explicit_broadcasts(module)
    module = inline_calls(module)
    module = flatten_call_graph(module)  # one caller per loop body and branch: each call its own buffers
    module = zero_sized(module)
    module = reduce_vector_dots(module)  # batches of vector-vector dots: a multiply and a reduce
    module = unfuse(module)
    return fuse(module) if options.fuse else module


# --------------------------------------------------------------------------------------------- annotations
_ANNOTATIONS = frozenset(
    {"Sharding", "annotate_device_placement", "xla.sdy.FuncResultSharding"}
    # XLA:TPU's notes on gather indices: the values pass through (tpusim.compiler.hlo.reference.custom_call)
    | {"AssumeGatherIndicesInBound", "GatherScatterIndicesBitpacked"}
)


def drop_annotations(module: Module) -> Module:
    """Remove every annotation custom-call (:data:`_ANNOTATIONS`) of one array operand whose result has the
    operand's shape: its users (and a root) read the operand instead."""
    comps = []
    for comp in module.computations:
        alias: dict[str, str] = {}
        for instr in comp.instructions:
            if instr.opcode != "custom-call" or custom_call_target(instr) not in _ANNOTATIONS:
                continue
            if len(instr.operands) != 1 or not isinstance(instr.shape, Shape):
                continue
            operand = comp[instr.operands[0]].shape
            if isinstance(operand, Shape) and (operand.element_type, operand.dimensions) == (
                instr.shape.element_type,
                instr.shape.dimensions,
            ):
                alias[instr.name] = alias.get(instr.operands[0], instr.operands[0])
        if not alias:
            comps.append(comp)
            continue
        body = tuple(
            replace(i, operands=tuple(alias.get(o, o) for o in i.operands))
            for i in comp.instructions
            if i.name not in alias
        )
        comps.append(replace(comp, instructions=body, root=alias.get(comp.root, comp.root)))
    return replace(module, computations=tuple(comps))


# --------------------------------------------------------------------------------------------- broadcasts
_SCALAR_OPERANDS = {"clamp": (0, 2), "select": (0,)}  # operands HLO lets be scalars (Operation Semantics)


def explicit_broadcasts(module: Module) -> Module:
    """Give every implicitly broadcast scalar operand (``clamp``'s bounds, ``select``'s predicate) an explicit
    ``broadcast`` instruction of the result's dimensions, named ``OPERAND.bcast`` (made unique)."""
    comps = []
    for comp in module.computations:
        taken = {i.name for i in comp.instructions}
        body: list[Instruction] = []
        for instr in comp.instructions:
            positions = _SCALAR_OPERANDS.get(instr.opcode, ())
            shape = instr.shape
            if not positions or not isinstance(shape, Shape) or shape.rank == 0:
                body.append(instr)
                continue
            operands = list(instr.operands)
            for k in positions:
                scalar = comp[operands[k]].shape
                if isinstance(scalar, Shape) and scalar.rank == 0:
                    name = unique_name(f"{operands[k]}.bcast", taken)
                    wide = Shape(scalar.element_type, shape.dimensions)
                    attrs = Attributes({"dimensions": ()})
                    body.append(Instruction(name, "broadcast", wide, (operands[k],), attrs, instr.loc))
                    operands[k] = name
            body.append(replace(instr, operands=tuple(operands)))
        comps.append(replace(comp, instructions=tuple(body)) if len(body) != len(comp.instructions) else comp)
    return replace(module, computations=tuple(comps))


# --------------------------------------------------------------------------------------------- empty arrays
# Opcodes whose instructions stay even with an empty result: inputs, control flow and operations with effects
# beyond their value (XLA's ZeroSizedHloElimination skips side effects; loops and calls keep their bodies).
_KEEP_EMPTY = frozenset(
    {"parameter", "constant", "while", "conditional", "call", "custom-call", "send", "send-done", "recv"}
    | {"recv-done", "infeed", "outfeed", "after-all", "rng-get-and-update-state", "add-dependency", "domain"}
)


def _is_empty(shape: object) -> bool:
    return isinstance(shape, Shape) and 0 in shape.dimensions


def zero_sized(module: Module) -> Module:
    """Take empty arrays out of the program (see the module docstring, step 0)."""
    return rewrite_instructions(module, _without_empty)


def _empty_constant(instr: Instruction) -> Instruction:
    shape = instr.array_shape
    value = np.zeros(shape.dimensions, shape.element_type.dtype)
    return Instruction(instr.name, "constant", shape, (), Attributes({"literal": Literal(shape, value)}), instr.loc)


def _without_empty(comp: Computation, instr: Instruction, taken: set[str]) -> list[Instruction] | None:
    """What replaces ``instr`` (the last instruction takes its name), or None to keep it."""
    op = instr.opcode
    if op in _KEEP_EMPTY or op.endswith(("-start", "-update", "-done")):
        return None
    if _is_empty(instr.shape):
        return [_empty_constant(instr)]
    operands = [comp[o] for o in instr.operands]
    if not any(_is_empty(o.shape) for o in operands):
        return None
    out: list[Instruction] = []

    def fill(value: str, shape: Shape, name: str) -> str:
        """Append ``broadcast(value)`` (converted to ``shape``'s type) named ``name``; return ``name``."""
        scalar = comp[value].array_shape if value in comp else next(i.array_shape for i in out if i.name == value)
        if scalar.element_type != shape.element_type:
            converted = unique_name(f"{name}.convert", taken)
            attrs = Attributes()
            out.append(Instruction(converted, "convert", Shape(shape.element_type, ()), (value,), attrs, instr.loc))
            value = converted
        attrs = Attributes({"dimensions": ()})
        out.append(Instruction(name, "broadcast", shape, (value,), attrs, instr.loc))
        return name

    def fill_all(values: list[str]) -> list[Instruction]:
        if isinstance(instr.shape, Shape):
            fill(values[0], instr.shape, instr.name)
            return out
        shapes = [s for s in instr.shape.elements if isinstance(s, Shape)]
        parts = [fill(v, s, unique_name(f"{instr.name}.{k}", taken)) for k, (v, s) in enumerate(zip(values, shapes))]
        out.append(Instruction(instr.name, "tuple", instr.shape, tuple(parts), Attributes(), instr.loc))
        return out

    def zero() -> str:
        element = instr.array_shape.element_type
        name = unique_name(f"{instr.name}.zero", taken)
        literal = Literal(Shape(element, ()), np.zeros((), element.dtype))
        out.append(Instruction(name, "constant", Shape(element, ()), (), Attributes({"literal": literal}), instr.loc))
        return name

    def copy(value: str) -> list[Instruction]:
        return [Instruction(instr.name, "copy", instr.shape, (value,), Attributes(), instr.loc)]

    n = len(operands)
    if op in ("reduce", "reduce-window") and any(_is_empty(o.shape) for o in operands[: n // 2]):
        return fill_all(list(instr.operands[n // 2 :]))  # every window holds only the initial value
    if op in ("dot", "convolution") and isinstance(instr.shape, Shape):
        return fill_all([zero()])  # an empty contraction sums nothing
    if op == "pad" and _is_empty(operands[0].shape):
        return fill_all([instr.operands[1]])
    if op == "select-and-scatter" and _is_empty(operands[1].shape):
        return fill_all([instr.operands[2]])
    if op == "concatenate":
        kept = tuple(o.name for o in operands if not _is_empty(o.shape))
        return copy(kept[0]) if len(kept) == 1 else [replace(instr, operands=kept)]
    if op == "dynamic-update-slice" and _is_empty(operands[1].shape):
        return copy(instr.operands[0])
    if op == "scatter" and n == 3 and _is_empty(operands[2].shape):
        return copy(instr.operands[0])
    return None


# --------------------------------------------------------------------------------------------- inlining
def inline_instruction(
    comp: Computation, instr: Instruction, callee: Computation, taken: set[str], on_chip: bool = False
) -> list[Instruction]:
    """The instructions of ``callee`` renamed into ``comp``, its parameters replaced by ``instr``'s operands and
    its root renamed to ``instr.name`` (with ``instr``'s shape: the caller's layout and memory space); the other
    names get ``instr.name`` as prefix. With ``on_chip`` (a dissolved fusion), the other values are kept in
    VMEM (``S(1)``): they were a kernel's intermediates, which never leave the chip."""
    rename: dict[str, str] = {}
    for inner in callee.instructions:
        if inner.opcode == "parameter":
            rename[inner.name] = instr.operands[inner.attr("parameter_number")]
        elif inner.name == callee.root:
            rename[inner.name] = instr.name
        else:
            name = f"{instr.name}.{inner.name}"
            while name in taken:
                name += "_"
            taken.add(name)
            rename[inner.name] = name
    out = []
    seen: dict[str, object] = {p.name: comp[rename[p.name]].shape for p in callee.parameters}
    for inner in callee.instructions:
        if inner.opcode == "parameter":
            continue
        seen[inner.name] = inner.shape
        if (
            on_chip
            and inner.opcode == "copy"
            and inner.name != callee.root
            and _same_but_space(seen[inner.operands[0]], inner.shape)
        ):
            # A copy that only changes the memory space (XLA:TPU's fused bitcast of a VMEM-prefetched operand
            # to the default space) moved nothing inside the kernel: its users read the operand.
            rename[inner.name] = rename[inner.operands[0]]
            continue
        shape = inner.shape
        if inner.name == callee.root and _same_dims(shape, instr.shape):
            shape = instr.shape
        elif on_chip and isinstance(shape, Shape) and shape.rank > 0 and inner.name != callee.root:
            shape = on_chip_shape(shape)
        operands = tuple(rename[o] for o in inner.operands)
        out.append(replace(inner, name=rename[inner.name], operands=operands, shape=shape))
    if callee.root_instruction.opcode == "parameter":  # the callee returns a parameter unchanged
        out.append(Instruction(instr.name, "copy", instr.shape, (rename[callee.root],), Attributes(), instr.loc))
    return out


def _same_but_space(a: object, b: object) -> bool:
    """Same array in the same layout, the memory space aside."""
    if not (isinstance(a, Shape) and isinstance(b, Shape)) or (a.element_type, a.dimensions) != (
        b.element_type,
        b.dimensions,
    ):
        return False
    return replace(a.effective_layout, memory_space=0) == replace(b.effective_layout, memory_space=0)


def _same_dims(a: object, b: object) -> bool:
    if isinstance(a, TupleShape) and isinstance(b, TupleShape):
        return len(a.elements) == len(b.elements) and all(_same_dims(x, y) for x, y in zip(a.elements, b.elements))
    return (
        isinstance(a, Shape)
        and isinstance(b, Shape)
        and (a.element_type, a.dimensions) == (b.element_type, b.dimensions)
    )


def _rewrite(module: Module, should_inline, on_chip: bool = False) -> Module:  # type: ignore[no-untyped-def]
    comps = []
    changed = False
    for comp in module.computations:
        taken = {i.name for i in comp.instructions}
        body: list[Instruction] = []
        for instr in comp.instructions:
            callee = should_inline(instr)
            if callee is None:
                body.append(instr)
                continue
            body += inline_instruction(comp, instr, module[callee], taken, on_chip)
            changed = True
        comps.append(replace(comp, instructions=tuple(body)) if changed else comp)
    return drop_unused(replace(module, computations=tuple(comps))) if changed else module


def drop_unused(module: Module) -> Module:
    """The module without the computations nothing reachable from the entry calls."""
    used: set[str] = set()

    def visit(name: str) -> None:
        if name in used:
            return
        used.add(name)
        for instr in module[name].instructions:
            for callee in instr.called_computations():
                visit(callee)

    visit(module.entry)
    return replace(module, computations=tuple(c for c in module.computations if c.name in used))


def inline_calls(module: Module) -> Module:
    """Replace ``call`` instructions by the called computation's instructions (repeatedly, for nesting)."""
    for _ in range(64):
        new = _rewrite(module, lambda i: i.attr("to_apply") if i.opcode == "call" else None)
        if new is module:
            return module
        module = new
    return module


def unfuse(module: Module) -> Module:
    """Dissolve fusions that hold operations without a vector block rule, bitcasts that move bytes (XLA's
    fused bitcast between tiled layouts that order the elements differently) or pads with interior padding;
    their intermediates stay in VMEM."""

    def computable(i: Instruction, fused: Computation) -> bool:
        if i.opcode == "bitcast":
            return _reshaping_bitcast(i, fused)
        return (i.opcode in FUSIBLE and not _interior_pad(i)) or i.opcode == "parameter"

    def target(instr: Instruction) -> str | None:
        if instr.opcode != "fusion":
            return None
        fused = module[instr.attr("calls")]
        body = [i for i in fused.instructions if i.name != fused.root or i.opcode != "tuple"]
        if all(computable(i, fused) for i in body) and _array_results(fused):
            return None
        return fused.name

    return _rewrite(module, target, on_chip=True)


def _array_results(fused: Computation) -> bool:
    """The fusion's result is an array, or a tuple of arrays each computed inside it (a multi-output
    fusion: one kernel reads its operands once for all of them)."""
    root = fused.root_instruction
    if isinstance(root.shape, Shape):
        return True
    return root.opcode == "tuple" and all(
        isinstance(fused[o].shape, Shape) and fused[o].opcode != "parameter" for o in root.operands
    )


# --------------------------------------------------------------------------------------------- fusion
def fuse(module: Module) -> Module:
    """Greedily fuse vector operations in every computation that runs as code (not inside fusions)."""
    fused_names = {i.attr("calls") for c in module.computations for i in c.instructions if i.opcode == "fusion"}
    applied = {callee for c in module.computations for i in c.instructions for callee in i.called_computations()}
    new_comps: list[Computation] = []
    extra: list[Computation] = []
    taken = {c.name for c in module.computations}  # (instruction names repeat across computations)
    for comp in module.computations:
        if comp.name in fused_names or (comp.name in applied and not _runs_as_code(module, comp.name)):
            new_comps.append(comp)
            continue
        comp, made = _fuse_computation(comp, taken)
        new_comps.append(comp)
        extra += made
    return replace(module, computations=tuple(extra) + tuple(new_comps))


def _runs_as_code(module: Module, name: str) -> bool:
    """True for computations run by while/conditional (as opposed to reducers, comparators, fusions)."""
    for comp in module.computations:
        for instr in comp.instructions:
            if instr.opcode == "while" and name in (instr.attr("condition"), instr.attr("body")):
                return True
            if instr.opcode == "conditional" and name in instr.called_computations():
                return True
    return False


def _fuse_computation(comp: Computation, taken: set[str]) -> tuple[Computation, list[Computation]]:
    """Fuse ``comp``'s vector operations; the new computations get names not in ``taken`` (added to it)."""
    users: dict[str, list[str]] = {i.name: [] for i in comp.instructions}
    for instr in comp.instructions:
        for o in set(instr.operands):
            users[o].append(instr.name)
    group: dict[str, str] = {}  # member -> leader
    members: dict[str, list[str]] = {}
    for instr in reversed(comp.instructions):
        name = instr.name
        if not _fusible(instr, comp):
            continue
        if name != comp.root and users[name]:
            leaders = {group.get(u) for u in users[name]}
            if len(leaders) == 1 and None not in leaders:
                leader = leaders.pop()
                assert leader is not None
                if _still_plannable(comp, members[leader] + [name], leader):
                    group[name] = leader
                    members[leader].append(name)
                    continue
        group[name] = name
        members[name] = [name]
    made: list[Computation] = []
    replaced: dict[str, list[Instruction]] = {}
    drop: set[str] = set()
    siblings = _siblings(comp, members, users)
    for leader, names in members.items():
        kin = siblings.get(leader)
        if kin is not None:
            if kin[0] != leader:
                continue  # (made with its first)
            instrs, fused = _make_sibling_fusion(comp, kin, members, taken)
            made.append(fused)
            replaced[leader] = instrs
            replaced.update((other, []) for other in kin[1:])
            drop.update(n for g in kin for n in members[g] if n not in kin)
            continue
        if len(names) < 2:
            continue
        fusion, fused = _make_fusion(comp, leader, names, unique_name(f"fused.{leader}", taken))
        made.append(fused)
        replaced[leader] = [fusion]
        drop.update(n for n in names if n != leader)
    if not made:
        return comp, []
    body = [r for i in comp.instructions if i.name not in drop for r in replaced.get(i.name, [i])]
    if siblings:
        body = _topological(body)
    return _inline_scalar_broadcasts(replace(comp, instructions=tuple(body)), made)


def _inline_scalar_broadcasts(comp: Computation, made: list[Computation]) -> tuple[Computation, list[Computation]]:
    """A broadcast of a scalar constant (alone, or the fusion of the two) that only fusions made here read is
    computed inside each of them instead of as a kernel of its own writing the whole array for them to read
    back (XLA duplicates such cheap producers into their consumers): JAX's lowering shares one broadcast of
    each GELU constant between all the layers of a model, and as its users are in different fusions it was
    left a kernel (64 MB per constant for the d1024 decoder's MLP). The fusions stay as they were grouped;
    only the parameter becomes the broadcast."""
    fused = {c.name: c for c in made}
    users: dict[str, list[Instruction]] = {i.name: [] for i in comp.instructions}
    for instr in comp.instructions:
        for o in dict.fromkeys(instr.operands):
            users[o].append(instr)
    shared: dict[str, tuple[Instruction, Instruction]] = {}
    for i in comp.instructions:
        pair = _scalar_broadcast(comp, i, fused)
        if (
            pair is not None
            and i.name != comp.root
            and users[i.name]
            and all(u.opcode == "fusion" and u.attr("calls") in fused for u in users[i.name])
        ):
            shared[i.name] = pair
    if not shared:
        return comp, made
    body = []
    for instr in comp.instructions:
        if instr.name in shared:
            continue
        if instr.opcode == "fusion" and any(o in shared for o in instr.operands):
            inner = fused[instr.attr("calls")]
            fused[inner.name] = _broadcast_inside(inner, [shared.get(o) for o in instr.operands])
            instr = replace(instr, operands=tuple(o for o in instr.operands if o not in shared))
        body.append(instr)
    kept = {o for i in body for o in i.operands} | {comp.root}
    body = [i for i in body if not (i.opcode == "constant" and i.name not in kept and _scalar(i.shape))]
    gone = {i.attr("calls") for i in comp.instructions if i.name in shared and i.opcode == "fusion"}
    return replace(comp, instructions=tuple(body)), [fused[c.name] for c in made if c.name not in gone]


def _scalar_broadcast(
    comp: Computation, instr: Instruction, fused: dict[str, Computation]
) -> tuple[Instruction, Instruction] | None:
    """(constant, broadcast) when ``instr`` broadcasts a scalar constant, or is a fusion made of just that."""
    if instr.opcode == "broadcast":
        src = comp[instr.operands[0]]
        return (src, instr) if src.opcode == "constant" and _scalar(src.shape) else None
    if instr.opcode == "fusion" and instr.attr("calls") in fused and not instr.operands:
        inner = fused[instr.attr("calls")]
        if len(inner.instructions) == 2:
            const, bcast = inner.instructions
            if const.opcode == "constant" and _scalar(const.shape) and bcast.opcode == "broadcast":
                return const, bcast
    return None


def _scalar(shape: object) -> bool:
    return isinstance(shape, Shape) and shape.rank == 0


def _broadcast_inside(inner: Computation, inlined: list[tuple[Instruction, Instruction] | None]) -> Computation:
    """``inner`` with each parameter whose entry of ``inlined`` is a (scalar constant, broadcast) pair computed
    in place (both copied in, the broadcast under the parameter's name), the other parameters renumbered."""
    names = {i.name for i in inner.instructions}
    params = [i for i in inner.instructions if i.opcode == "parameter"]
    params.sort(key=lambda i: i.attr("parameter_number"))
    body: list[Instruction] = []
    number = 0
    for p, pair in zip(params, inlined):
        if pair is None:
            body.append(replace(p, attributes=p.attributes.replace(parameter_number=number)))
            number += 1
            continue
        const, bcast = pair
        copy = replace(const, name=unique_name(f"{p.name}.constant", names))
        body += [copy, replace(bcast, name=p.name, operands=(copy.name,))]
    body += [i for i in inner.instructions if i.opcode != "parameter"]
    return replace(inner, instructions=tuple(body))


_SIBLING_BYTES = 1 << 16
"""A shared operand must be at least this big for two kernels to become one multi-output fusion."""

_SIBLING_OUTPUTS = 8
"""The most sibling kernels one multi-output fusion takes (its blocks hold every result's)."""


def _siblings(
    comp: Computation, members: dict[str, list[str]], users: dict[str, list[str]]
) -> dict[str, tuple[str, ...]]:
    """Groups of fusions (each member's leader -> the group, in program order) to make one multi-output
    fusion, as XLA's multi-output fusion does for siblings: each reads a large array another member reads,
    none needs another's result, their results have the same dimensions (so one blocking serves them all)
    cut into more than one block, and the group still plans; at most :data:`_SIBLING_OUTPUTS` of them. One
    kernel then reads the shared array once (a row sum and a row maximum of ``x`` stream ``x`` once, not
    twice; seven activations of one input, once instead of four times in pairs)."""
    group = {n: leader for leader, names in members.items() for n in names}
    reads: dict[str, set[str]] = {}  # leader -> arrays its fusion reads from outside
    for leader, names in members.items():
        inside = set(names)
        reads[leader] = {o for n in names for o in comp[n].operands if o not in inside}
    order = {i.name: k for k, i in enumerate(comp.instructions)}
    depends = _dependencies(comp, group)
    leaders = sorted(members, key=order.__getitem__)
    out: dict[str, tuple[str, ...]] = {}
    for a in leaders:
        if a in out or not _multi_output_candidate(comp, a):
            continue
        chosen, shared_reads = [a], set(reads[a])
        for b in leaders:
            if len(chosen) == _SIBLING_OUTPUTS:
                break
            if b in chosen or b in out or not _multi_output_candidate(comp, b):
                continue
            shared = [o for o in reads[b] & shared_reads if _byte_size(comp[o].shape) >= _SIBLING_BYTES]
            if not shared or any(b in depends[c] or c in depends[b] for c in chosen):
                continue
            if comp[a].array_shape.dimensions != comp[b].array_shape.dimensions:
                continue
            if _plannable_group(comp, members, (*chosen, b)):
                chosen.append(b)
                shared_reads |= reads[b]
        if len(chosen) > 1:
            ordered = tuple(sorted(chosen, key=order.__getitem__))
            out.update((c, ordered) for c in ordered)
    return out


def _byte_size(shape: Shape | TupleShape) -> int:
    return shape.byte_size if isinstance(shape, Shape) else 0


def _multi_output_candidate(comp: Computation, leader: str) -> bool:
    shape = comp[leader].shape
    return isinstance(shape, Shape) and any(d > 1 for d in shape.dimensions) and leader != comp.root


def _dependencies(comp: Computation, group: dict[str, str]) -> dict[str, set[str]]:
    """For every fusion leader, the leaders whose results it needs, directly or through others."""
    before: dict[str, set[str]] = {}
    for instr in comp.instructions:
        mine: set[str] = set()
        for o in instr.operands:
            mine |= before.get(o, set())
            if o in group and group[o] == o and group.get(instr.name) != o:
                mine.add(o)
        before[instr.name] = mine
    out: dict[str, set[str]] = {}
    for name, leader in group.items():
        out.setdefault(leader, set()).update(before.get(name, set()) - {leader})
    return out


def _plannable_group(comp: Computation, members: dict[str, list[str]], group: tuple[str, ...]) -> bool:
    _, fused = _make_fusion(comp, group[0], [n for g in group for n in members[g]])
    roots = list(group)
    first = fused[roots[0]].array_shape
    tiled = next((d for d in reversed(first.effective_layout.minor_to_major) if first.dimensions[d] > 1), None)
    try:
        plan_needs(fused, roots, tiled)
    except NotLowerable:
        return False
    return True


def _make_sibling_fusion(
    comp: Computation, group: tuple[str, ...], members: dict[str, list[str]], taken: set[str]
) -> tuple[list[Instruction], Computation]:
    """One fusion computing every leader of ``group`` (a tuple of their results), and each leader's name
    given to the get-tuple-element of its result (its users need no change)."""
    name = unique_name(f"fusion.{group[0]}", taken)
    fusion, fused = _make_fusion(
        comp, group[0], [n for g in group for n in members[g]], unique_name(f"fused.{name}", taken)
    )
    root = Instruction(
        unique_name(f"{name}.tuple", taken), "tuple", TupleShape(tuple(comp[g].shape for g in group)), group
    )
    fused = replace(fused, instructions=(*fused.instructions, root), root=root.name)
    fusion = replace(fusion, name=name, shape=root.shape)
    gtes = [
        Instruction(
            leader, "get-tuple-element", comp[leader].shape, (name,), Attributes({"index": k}), comp[leader].loc
        )
        for k, leader in enumerate(group)
    ]
    return [fusion, *gtes], fused


def _topological(body: list[Instruction]) -> list[Instruction]:
    """``body`` in an order where every operand comes before its users, as close to the given order as that
    allows (a multi-output fusion takes the place of the first of its two kernels, whose operands may come
    later)."""
    import heapq

    position = {i.name: k for k, i in enumerate(body)}
    waiting = {i.name: {o for o in i.operands if o in position} for i in body}
    users: dict[str, list[str]] = {}
    for i in body:
        for o in waiting[i.name]:
            users.setdefault(o, []).append(i.name)
    ready = [position[n] for n, w in waiting.items() if not w]
    heapq.heapify(ready)
    out: list[Instruction] = []
    while ready:
        instr = body[heapq.heappop(ready)]
        out.append(instr)
        for u in users.get(instr.name, []):
            waiting[u].discard(instr.name)
            if not waiting[u]:
                heapq.heappush(ready, position[u])
    assert len(out) == len(body), "a cycle among fused instructions"
    return out


def _fusible(instr: Instruction, comp: Computation) -> bool:
    if not isinstance(instr.shape, Shape) or instr.shape.element_type.kind in ("token", "complex"):
        return False
    if instr.opcode == "bitcast":
        # A bitcast joins a new kernel only as a row-major reshape of layouts the text left untiled; one between
        # tiled layouts (XLA:TPU's) means its bytes and costs nothing outside (it shares its operand's buffer).
        operand = comp[instr.operands[0]].shape
        if not (isinstance(operand, Shape) and not operand.has_tiles and _reshaping_bitcast(instr, comp)):
            return False
    if _interior_pad(instr):
        return False  # (a kernel's blocks hold no gaps between elements; lowering/movement.py pads in VMEM)
    # Integer scalars stay outside fusions: they run on the scalar unit (lowering/scalar.py).
    integer_scalar = instr.shape.rank == 0 and (
        instr.shape.element_type.is_integer or instr.shape.element_type.name == "pred"
    )
    return instr.opcode in FUSIBLE and not integer_scalar


def _reshaping_bitcast(instr: Instruction, comp: Computation) -> bool:
    """A bitcast a kernel may compute: one that means a row-major reshape (:func:`bitcast_is_reshape`). Any
    other shares its operand's buffer or moves its bytes outside kernels (lowering/movement.py)."""
    operand = comp[instr.operands[0]].shape
    return isinstance(operand, Shape) and isinstance(instr.shape, Shape) and bitcast_is_reshape(operand, instr.shape)


def _interior_pad(instr: Instruction) -> bool:
    """A pad with gaps between the operand's elements (``jax.lax.associative_scan``'s interleaving)."""
    return instr.opcode == "pad" and any(p.interior for p in instr.attr("padding", ()))


def _make_fusion(
    comp: Computation, leader: str, names: list[str], name: str | None = None
) -> tuple[Instruction, Computation]:
    inside = set(names)
    ordered = [i for i in comp.instructions if i.name in inside]
    params: dict[str, Instruction] = {}
    body: list[Instruction] = []
    for instr in ordered:
        for o in instr.operands:
            if o not in inside and o not in params:
                params[o] = Instruction(
                    f"param.{len(params)}",
                    "parameter",
                    comp[o].shape,
                    (),
                    Attributes({"parameter_number": len(params)}),
                )
        renamed = tuple(params[o].name if o in params else o for o in instr.operands)
        body.append(replace(instr, operands=renamed))
    fused = Computation(name or f"fused.{leader}", (*params.values(), *body), leader)
    head = comp[leader]
    fusion = Instruction(
        leader, "fusion", head.shape, tuple(params), Attributes({"kind": "kLoop", "calls": fused.name}), head.loc
    )
    return fusion, fused


def _still_plannable(comp: Computation, names: list[str], leader: str) -> bool:
    """True when the fusion of ``names`` (rooted at ``leader``) can still be cut into blocks, and no reduce in
    it would need its whole operand in every block: batch norm's statistics over N, H and W, fused into the
    normalisation cut along N, recomputed every reduction over the whole array for each of its blocks
    (232 us for f32[16,28,28,256], XLA:TPU estimates 139); such a reduce stays a kernel of its own."""
    _, fused = _make_fusion(comp, leader, names)
    root = fused.root_instruction.array_shape
    tiled = next((d for d in reversed(root.effective_layout.minor_to_major) if root.dimensions[d] > 1), None)
    try:
        plan = plan_needs(fused, [leader], tiled)
    except NotLowerable:
        return False
    if plan.tiled is None or root.byte_size <= BLOCK_TARGET_BYTES:
        return True  # (one block: nothing is computed twice)
    for instr in fused.instructions:
        if instr.opcode != "reduce" or instr.name not in plan.needs:
            continue
        operand = fused[instr.operands[0]]
        need = plan.needs.get(operand.name)
        if need is not None and need[0] is None and operand.array_shape.byte_size > BLOCK_TARGET_BYTES:
            return False
    return True
