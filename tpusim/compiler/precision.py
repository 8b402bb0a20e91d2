"""Mixed floating-point precision made explicit, as XLA's FloatNormalization does before code generation.

HLO lets the floating-point types of an instruction's operands and result differ (XLA verifies with
``allow_mixed_precision``; BFloat16Propagation produces such modules: ``f32 add(bf16, bf16)``,
``bf16 exponential(f32)``; XLA:TPU's fusions: ``f32 broadcast(bf16)``, ``f32 pad(bf16, f32 value)``, an
argmin's ``(bf16, s32) reduce(f32, s32, ...)`` whose reducer computes in f32). The vector unit computes in
one type, so each such instruction becomes: its operands converted to the compute type, the operation in
that type, and a ``convert`` to the declared result type. The compute type is f64 when an f64 takes part,
f32 otherwise: narrow floats are computed in f32 anyway (by XLA, by the reference interpreter and by the
VPU), so this changes no rounding. Data movement (copy, transpose, slice, pad, reverse, dynamic-slice,
gather, add-dependency, broadcast, reshape, concatenate, and the update of a dynamic-update-slice) moves its
operands converted to the result type, which is the same as converting what it moved (and keeps a pad value
in the wider type: ``f32 pad(bf16 x, f32 0.1)`` pads with 0.1, not its bf16 rounding). reduce-precision and
the collectives compute in their operand's type and convert the result. An instruction that calls a
computation on its elements (reduce, reduce-window, sort, scatter, select-and-scatter, map; variadic or not)
reads each operand in the type of the computation parameter it feeds and converts each result to its declared
type (``hlo.called_types``: XLA:TPU's ``(f32, s32) sort(bf16 x, s32 iota)`` with an f32 comparator sorts x
converted to f32). (XLA's verifier allows no change of precision for tuple, get-tuple-element, call, while,
conditional and the result of dynamic-update-slice; the shape rules refuse those.) The reference
interpreter computes the same values by its own rule (``mixed_precision_result``; ``called_arguments`` and
``declared_results`` for the instructions that call a computation).
"""

from __future__ import annotations

from dataclasses import replace

from tpusim.compiler.hlo.called_types import CALLING, called_types
from tpusim.compiler.hlo.ir import Attributes, Computation, Instruction, Module
from tpusim.compiler.hlo.opcodes import ELEMENTWISE
from tpusim.compiler.rewrite import rewrite_instructions, unique_name
from tpusim.memory import AnyShape, ElementType, Layout, Shape, TupleShape, element_type

__all__ = ["normalize_precision"]

# Operations computed elementwise in one type (whose result type follows their operands').
_COMPUTE = ELEMENTWISE - {
    "convert",
    "copy",
    "is-finite",
    "real",
    "imag",
    "abs",  # (real/imag/abs of complex give the component type; abs of floats is handled below)
    "complex",
}
# Operations that only move values: the operands (at these positions; None: all) converted to the result type.
_MOVE: dict[str, tuple[int, ...] | None] = {
    "copy": (0,),
    "transpose": (0,),
    "slice": (0,),
    "pad": (0, 1),
    "dynamic-update-slice": (0, 1),
    "reverse": (0,),
    "dynamic-slice": (0,),
    "gather": (0,),
    "add-dependency": (0,),
    "broadcast": (0,),
    "reshape": (0,),
    "concatenate": None,
}
# Operations computed in their (one) floating-point operand type, the result then converted.
_THEN_CONVERT = {
    "reduce-precision",
    "all-reduce",
    "all-gather",
    "all-to-all",
    "reduce-scatter",
    "collective-permute",
    "collective-broadcast",
}


def _float(shape: object) -> str | None:
    """The float element type name of an array shape, or None."""
    if isinstance(shape, Shape) and shape.element_type.is_float:
        return shape.element_type.name
    return None


def _retyped(shape: Shape, etype: str) -> Shape:
    """``shape`` with element type ``etype``, keeping its dimension order; its tiles, which depend on the
    element width, are left to layout assignment."""
    layout = Layout(shape.layout.minor_to_major) if shape.layout is not None else None
    return Shape(element_type(etype), shape.dimensions, shape.dynamic, layout)


def normalize_precision(module: Module) -> Module:
    """Give every mixed-precision instruction explicit converts (see the module docstring)."""
    return rewrite_instructions(module, lambda comp, instr, taken: _normalized(module, comp, instr, taken))


def _normalized(module: Module, comp: Computation, instr: Instruction, taken: set[str]) -> list[Instruction] | None:
    """The instructions replacing a mixed-precision ``instr`` (the last one keeps its name), or None."""
    op = instr.opcode
    result = instr.shape
    if op in CALLING:
        return _calling(module, comp, instr, taken)
    if not isinstance(result, Shape):
        return None
    operands = [comp[o].shape for o in instr.operands]
    if op in _COMPUTE or (op == "abs" and _float(result)):
        positions = [k for k, s in enumerate(operands) if _float(s)]  # (select's predicate stays)
        types = {_float(operands[k]) for k in positions} | ({_float(result)} if op != "compare" else set())
        types.discard(None)
        if len(types) < 2:
            return None
        compute = "f64" if "f64" in types else "f32"
    elif op in _MOVE:
        compute = _float(result)  # type: ignore[assignment]
        moved = _MOVE[op]
        positions = [k for k in (range(len(operands)) if moved is None else moved) if k < len(operands)]
        if compute is None or all(_float(operands[k]) in (compute, None) for k in positions):
            return None
    elif op in _THEN_CONVERT:
        kinds = {_float(s) for s in operands} - {None}
        if len(kinds) != 1 or _float(result) in (None, *kinds):
            return None
        compute, positions = kinds.pop(), []  # type: ignore[assignment]
    else:
        return None
    out: list[Instruction] = []
    names = list(instr.operands)
    for k in positions:
        shape = operands[k]
        assert isinstance(shape, Shape)
        if shape.element_type.name == compute:
            continue
        name = unique_name(f"{names[k]}.{compute}", taken)
        wide = _retyped(shape, compute)
        out.append(Instruction(name, "convert", wide, (names[k],), Attributes(), instr.loc))
        names[k] = name
    declared = result.element_type.name
    if op == "compare" or declared == compute:
        out.append(replace(instr, operands=tuple(names)))
        return out
    inner = unique_name(f"{instr.name}.{compute}", taken)
    wide = _retyped(result, compute)
    out.append(replace(instr, name=inner, shape=wide, operands=tuple(names)))
    out.append(Instruction(instr.name, "convert", result, (inner,), Attributes(), instr.loc))
    return out


def _calling(module: Module, comp: Computation, instr: Instruction, taken: set[str]) -> list[Instruction] | None:
    """An instruction that calls a computation on its elements (reduce, reduce-window, sort, scatter,
    select-and-scatter, map) whose operands or results have other float types than that computation takes:
    each operand converted to the type of the parameter it feeds, the instruction in those types, each result
    converted to its declared type (an element of a tuple through get-tuple-element)."""
    types = called_types(module, instr)
    assert types is not None
    reads, computes = (tuple(_float_name(t) for t in ts) for ts in types)
    declared = instr.shape.elements if isinstance(instr.shape, TupleShape) else (instr.shape,)
    if len(declared) != len(computes):
        return None
    out: list[Instruction] = []
    operands = list(instr.operands)
    for k, (source, kind) in enumerate(zip(instr.operands, reads)):
        x = _in_type(comp[source].shape, kind)
        if x is not comp[source].shape:
            operands[k] = unique_name(f"{source}.{kind}", taken)
            out.append(Instruction(operands[k], "convert", x, (source,), Attributes(), instr.loc))
    computed = [_in_type(shape, kind) for shape, kind in zip(declared, computes)]
    if all(c is d for c, d in zip(computed, declared)):
        return [*out, replace(instr, operands=tuple(operands))] if out else None
    inner = unique_name(f"{instr.name}.computed", taken)
    tupled = isinstance(instr.shape, TupleShape)
    computed_shape = TupleShape(tuple(computed)) if tupled else computed[0]
    out.append(replace(instr, name=inner, shape=computed_shape, operands=tuple(operands)))
    if not tupled:
        return [*out, Instruction(instr.name, "convert", instr.shape, (inner,), Attributes(), instr.loc)]
    parts = []
    for k, (shape, wide) in enumerate(zip(declared, computed)):
        part = unique_name(f"{instr.name}.{k}", taken)
        out.append(Instruction(part, "get-tuple-element", wide, (inner,), Attributes({"index": k}), instr.loc))
        if wide is not shape:
            converted = unique_name(f"{part}.convert", taken)
            out.append(Instruction(converted, "convert", shape, (part,), Attributes(), instr.loc))
            part = converted
        parts.append(part)
    return [*out, Instruction(instr.name, "tuple", instr.shape, tuple(parts), Attributes(), instr.loc)]


def _float_name(t: ElementType | None) -> str | None:
    return t.name if t is not None and t.is_float else None


def _in_type(shape: AnyShape, kind: str | None) -> AnyShape:
    """``shape`` in the float type ``kind`` if it is an array of another float type; else ``shape`` itself."""
    if kind is None or not isinstance(shape, Shape) or _float(shape) in (kind, None):
        return shape
    return _retyped(shape, kind)
