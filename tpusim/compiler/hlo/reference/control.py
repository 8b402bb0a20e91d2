"""Control flow and structure: constants, tuples, calls, fusion, while, conditional, async wrappers,
tokens, opt-barrier, rng-get-and-update-state and the custom-call dispatcher.

Semantics follow XLA's operation semantics (https://openxla.org/xla/operation_semantics: Call,
Conditional, While, Tuple, AfterAll, OptimizationBarrier, CustomCall) and ``HloEvaluator``'s behaviour where
that document is silent:

* ``conditional`` with an index: an index < 0 or >= N runs ``branch_computations[N-1]`` (operation
  semantics, Conditional: an S32 ``branch_index`` out of range runs the last branch as the default).
* ``async-start`` runs the wrapped computation at once; its value is
  ``((operands...), result, contexts...)`` as the shape declares; ``async-done`` returns ``result``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tpusim.compiler.hlo.ir import Instruction, Literal, custom_call_target
from tpusim.compiler.hlo.reference.core import (
    REFERENCE,
    TOKEN,
    EvalContext,
    EvaluationError,
    RefFn,
    UnsupportedOpcodeError,
    Value,
    check_value,
    register,
)
from tpusim.limits import note_interrupt
from tpusim.memory import AnyShape, TupleShape

__all__ = ["CUSTOM_CALLS", "literal_value", "register_custom_call", "zeros_of"]


def literal_value(lit: Literal) -> Value:
    """The value of a constant's literal (tuple literals give tuples)."""
    if lit.value is None:
        return tuple(literal_value(e) for e in lit.tuple_elements)
    return lit.value


def zeros_of(shape: AnyShape) -> Value:
    """A zero value of ``shape`` (tokens for token shapes)."""
    if isinstance(shape, TupleShape):
        return tuple(zeros_of(e) for e in shape.elements)
    if shape.element_type.dtype is None:
        return TOKEN
    return np.zeros(shape.dimensions, dtype=shape.element_type.dtype)


@register("constant", elementwise=True)
def _constant(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    lit = instr.attr("literal")
    if not isinstance(lit, Literal):
        raise EvaluationError(instr, "constant has no literal value")
    return literal_value(lit)


@register("tuple", elementwise=True)
def _tuple(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return tuple(args)


@register("get-tuple-element", elementwise=True)
def _get_tuple_element(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    value = args[0]
    index = instr.attr("index")
    if not isinstance(value, tuple) or not 0 <= index < len(value):
        raise EvaluationError(instr, f"index {index} is out of range of the operand tuple")
    return value[index]


@register("opt-barrier", "domain")
def _identity(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return args[0]


@register("add-dependency")
def _add_dependency(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return args[0]  # operand 1 is a token that only orders execution


@register("after-all")
def _after_all(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return TOKEN


@register("call")
def _call(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return ctx.call(instr.attr("to_apply"), args)


@register("fusion")
def _fusion(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return ctx.call(instr.attr("calls"), args)


@register("while")
def _while(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    condition, body = instr.attr("condition"), instr.attr("body")
    state = args[0]
    frame = ctx.enter_loop(instr)  # counts iterations for the run limit (max_steps)
    try:
        while True:
            keep_going = ctx.call(condition, [state])
            if not bool(np.asarray(keep_going)):
                return state
            ctx.iterate(frame)
            state = ctx.call(body, [state])
    except KeyboardInterrupt as exc:  # Ctrl-C: where, from the innermost loop (outer ones keep it)
        note_interrupt(exc, ctx.position())
        raise
    finally:
        ctx.leave_loop(frame)


@register("conditional")
def _conditional(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    branches = instr.attr("branch_computations")
    selector = np.asarray(args[0])
    if branches is not None:
        index = int(selector)
        if not 0 <= index < len(branches):
            index = len(branches) - 1  # XLA: an out-of-range index runs the last branch
        return ctx.call(branches[index], [args[1 + index]])
    if bool(selector):
        return ctx.call(instr.attr("true_computation"), [args[1]])
    return ctx.call(instr.attr("false_computation"), [args[2]])


# ---------------------------------------------------------------------------------------------
# Async wrappers
# ---------------------------------------------------------------------------------------------
def package_start(instr: Instruction, operands: Sequence[Value], result: Value) -> Value:
    """The value of an ``*-start`` instruction: the result itself if the shape says so, else the tuple
    ``(operands, result, contexts...)`` its shape declares (contexts are zeros)."""
    shape = instr.shape
    if check_value(result, shape) is None:
        return result
    if not isinstance(shape, TupleShape) or len(shape.elements) < 2:
        raise EvaluationError(instr, f"cannot hold the result in the declared shape {shape}")
    single = len(operands) == 1 and not isinstance(shape.elements[0], TupleShape)
    ops: Value = operands[0] if single else tuple(operands)
    return (ops, result, *(zeros_of(s) for s in shape.elements[2:]))


@register("async-start")
def _async_start(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    wrapped = instr.async_wrapped_instruction()  # XLA's short form, e.g. custom-call-start(...)
    if wrapped is not None:
        fn = REFERENCE.get(wrapped.opcode)
        if fn is None:
            raise UnsupportedOpcodeError(instr, f"the wrapped opcode {wrapped.opcode!r} has no reference function")
        result = fn(ctx, wrapped, args)
    else:
        result = ctx.call(instr.attr("calls"), args)
    return package_start(instr, args, result)


@register("async-update")
def _async_update(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return args[0]


@register("async-done")
def _async_done(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    started = args[0]
    if check_value(started, instr.shape) is None:
        return started
    if not isinstance(started, tuple) or len(started) < 2:
        raise EvaluationError(instr, "operand is not the value of an async-start")
    return started[1]


@register("copy-start")
def _copy_start(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    shape = instr.shape
    # XLA: copy-start produces (destination, source, u32[] context).
    extra = tuple(zeros_of(s) for s in shape.elements[2:]) if isinstance(shape, TupleShape) else ()
    return (_copy_value(args[0]), args[0], *extra)


@register("copy-done")
def _copy_done(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    started = args[0]
    if not isinstance(started, tuple):
        raise EvaluationError(instr, "operand is not the value of a copy-start")
    return started[0]


def _copy_value(value: Value) -> Value:
    if isinstance(value, tuple):
        return tuple(_copy_value(v) for v in value)
    return value.copy() if isinstance(value, np.ndarray) else value


# ---------------------------------------------------------------------------------------------
# rng-get-and-update-state
# ---------------------------------------------------------------------------------------------
@register("rng-get-and-update-state")
def _rng_get_and_update_state(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    """Returns the 128-bit state as u64[2] (low word first) and adds ``delta`` to it, modulo 2**128."""
    delta = int(instr.attr("delta", 0))
    state = ctx.rng_state
    ctx.rng_state = (state + delta) % (1 << 128)
    return np.array([state & (2**64 - 1), state >> 64], dtype=np.uint64)


# ---------------------------------------------------------------------------------------------
# custom-call dispatch
# ---------------------------------------------------------------------------------------------
CUSTOM_CALLS: dict[str, RefFn] = {}
"""custom_call_target -> reference function ``fn(ctx, instr, args) -> Value``."""


def register_custom_call(*targets: str) -> Callable[[RefFn], RefFn]:
    """Decorator filling :data:`CUSTOM_CALLS` for the given ``custom_call_target`` names."""

    def deco(fn: RefFn) -> RefFn:
        for target in targets:
            if target in CUSTOM_CALLS and CUSTOM_CALLS[target] is not fn:
                raise RuntimeError(f"reference for custom-call target {target!r} registered twice")
            CUSTOM_CALLS[target] = fn
        return fn

    return deco


@register("custom-call")
def _custom_call(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    target = custom_call_target(instr)
    fn = CUSTOM_CALLS.get(target)
    if fn is None:
        known = ", ".join(sorted(CUSTOM_CALLS)) or "none"
        raise UnsupportedOpcodeError(
            instr, f"custom-call target {target!r} has no reference implementation; supported targets: {known}"
        )
    return fn(ctx, instr, args)
