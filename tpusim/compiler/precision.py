"""Mixed floating-point precision made explicit, as XLA's FloatNormalization does before code generation.

HLO lets the floating-point types of an instruction's operands and result differ (XLA verifies with
``allow_mixed_precision``; BFloat16Propagation produces such modules: ``f32 add(bf16, bf16)``,
``bf16 exponential(f32)``). The vector unit computes in one type, so each such instruction becomes:
its operands converted to the compute type, the operation in that type, and a ``convert`` to the declared
result type. The compute type is f64 when an f64 takes part, f32 otherwise: narrow floats are computed in
f32 anyway (by XLA, by the reference interpreter and by the VPU), so this changes no rounding. Data
movement (copy, transpose, slice, pad, reverse, dynamic-slice, gather, add-dependency, and the update of a
dynamic-update-slice) moves its operands converted to the result type, which is the same as converting what
it moved. reduce-precision and the collectives compute in their operand's type and convert the result. A
reduction reads its input in its initial value's type (the type its computation takes) and converts its
result to the declared type. (XLA's verifier allows no change of precision for tuple, get-tuple-element,
call, while, conditional and the result of dynamic-update-slice; the shape rules refuse those.) The
reference interpreter computes the same values by its own rule (``mixed_precision_result``).
"""

from __future__ import annotations

from dataclasses import replace

from tpusim.compiler.hlo.ir import Attributes, Computation, Instruction, Module
from tpusim.compiler.hlo.opcodes import ELEMENTWISE
from tpusim.compiler.rewrite import rewrite_instructions, unique_name
from tpusim.memory import Shape, element_type

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
# Operations that only move values: operands converted to the result type.
_MOVE = {
    "copy": (0,),
    "transpose": (0,),
    "slice": (0,),
    "pad": (0, 1),
    "dynamic-update-slice": (0, 1),
    "reverse": (0,),
    "dynamic-slice": (0,),
    "gather": (0,),
    "add-dependency": (0,),
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


def normalize_precision(module: Module) -> Module:
    """Give every mixed-precision instruction explicit converts (see the module docstring)."""
    return rewrite_instructions(module, _normalized)


def _normalized(comp: Computation, instr: Instruction, taken: set[str]) -> list[Instruction] | None:
    """The instructions replacing a mixed-precision ``instr`` (the last one keeps its name), or None."""
    op = instr.opcode
    result = instr.shape
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
    elif op in ("reduce", "reduce-window") and len(operands) == 2:
        return _reduction(comp, instr, taken)
    elif op in _MOVE:
        compute = _float(result)  # type: ignore[assignment]
        positions = [k for k in _MOVE[op] if k < len(operands)]
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
        wide = Shape(element_type(compute), shape.dimensions, shape.dynamic)
        out.append(Instruction(name, "convert", wide, (names[k],), Attributes(), instr.loc))
        names[k] = name
    declared = result.element_type.name
    if op == "compare" or declared == compute:
        out.append(replace(instr, operands=tuple(names)))
        return out
    inner = unique_name(f"{instr.name}.{compute}", taken)
    wide = Shape(element_type(compute), result.dimensions, result.dynamic)
    out.append(replace(instr, name=inner, shape=wide, operands=tuple(names)))
    out.append(Instruction(instr.name, "convert", result, (inner,), Attributes(), instr.loc))
    return out


def _reduction(comp: Computation, instr: Instruction, taken: set[str]) -> list[Instruction] | None:
    """A single-input reduce or reduce-window whose input, initial value and result float types differ."""
    x, init = (comp[o].shape for o in instr.operands)
    result = instr.shape
    assert isinstance(result, Shape)
    kind = _float(init)
    if kind is None or (_float(x) in (kind, None) and _float(result) in (kind, None)):
        return None
    out: list[Instruction] = []
    source = instr.operands[0]
    if _float(x) not in (kind, None):
        assert isinstance(x, Shape)
        source = unique_name(f"{source}.{kind}", taken)
        converted = Shape(element_type(kind), x.dimensions, x.dynamic)
        out.append(Instruction(source, "convert", converted, (instr.operands[0],), Attributes(), instr.loc))
    operands = (source, instr.operands[1])
    if _float(result) in (kind, None):
        out.append(replace(instr, operands=operands))
        return out
    inner = unique_name(f"{instr.name}.{kind}", taken)
    wide = Shape(element_type(kind), result.dimensions, result.dynamic)
    out.append(replace(instr, name=inner, shape=wide, operands=operands))
    out.append(Instruction(instr.name, "convert", result, (inner,), Attributes(), instr.loc))
    return out
