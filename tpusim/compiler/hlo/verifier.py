"""Checking a module against HLO's rules (a small cousin of XLA's HloVerifier).

Module level: one entry computation, unique computation names, every called computation exists, no
computation calls itself (directly or not). Computation level: unique instruction names, the root
exists, parameter numbers are 0..n-1, every operand and control predecessor is defined before use.
Instruction level: the opcode is known, the operand count fits the opcode, required attributes are
present, and the opcode's shape rule holds (``shape_rules.SHAPE_RULES``), including the signatures of
called computations (a reduce's ``to_apply`` takes 2N scalars and returns N, a while body maps its state
to itself, ...). Every failure is an :class:`HloVerifyError` naming the computation, the instruction,
the rule and the shapes involved.
"""

from __future__ import annotations

import tpusim.compiler.hlo.shape_rules_ops  # noqa: F401  (registers the remaining shape rules)
from tpusim.compiler.hlo.errors import HloVerifyError
from tpusim.compiler.hlo.ir import Computation, Instruction, Module, ProgramShape
from tpusim.compiler.hlo.opcodes import OPCODES
from tpusim.compiler.hlo.shape_rules import SHAPE_RULES, RuleError, compatible
from tpusim.errors import TpusimError
from tpusim.gcpause import paused_gc
from tpusim.memory import AnyShape

__all__ = ["verify_module"]


def verify_module(module: Module) -> None:
    """Raise :class:`HloVerifyError` at the first rule ``module`` breaks.

    Args:
        module: a parsed or hand-built module.
    """
    with paused_gc():  # (rules allocate little, but a large module makes each collection expensive)
        _verify(module)


def _verify(module: Module) -> None:
    names: set[str] = set()
    for c in module.computations:
        if c.name in names:
            raise HloVerifyError(f"computation {c.name} is defined more than once")
        names.add(c.name)
    if module.entry not in module:
        raise HloVerifyError(f"the entry computation {module.entry} does not exist")
    for key in ("replica_count", "num_partitions"):
        value = module.attributes.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise HloVerifyError(f"the HloModule header's {key} must be at least 1, not {value}")
    entries = [c.name for c in module.computations if c.is_entry]
    if entries != [module.entry]:
        raise HloVerifyError(f"exactly {module.entry} should be marked ENTRY, found {entries or 'none'}")
    for computation in module.computations:
        _verify_computation(module, computation)
    _check_call_graph(module)
    _check_entry_layout(module)


def _where(ins: Instruction) -> str | None:
    return str(ins.loc) if ins.loc is not None else None


def _verify_computation(module: Module, comp: Computation) -> None:
    seen: dict[str, AnyShape] = {}
    for ins in comp.instructions:
        if ins.name in seen:
            raise HloVerifyError(f"instruction %{ins.name} is defined twice", comp.name, ins.name, _where(ins))
        _verify_instruction(module, comp, ins, seen)
        seen[ins.name] = ins.shape
    if comp.root not in seen:
        raise HloVerifyError(f"the root %{comp.root} is not an instruction of the computation", comp.name)
    numbers = sorted(p.attr("parameter_number", -1) for p in comp.instructions if p.opcode == "parameter")
    if numbers != list(range(len(numbers))):
        raise HloVerifyError(f"parameter numbers are {numbers}, they must be 0..{len(numbers) - 1}", comp.name)


def _verify_instruction(module: Module, comp: Computation, ins: Instruction, seen: dict[str, AnyShape]) -> None:
    def fail(message: str) -> HloVerifyError:
        return HloVerifyError(message, comp.name, ins.name, _where(ins))

    info = OPCODES.get(ins.opcode)
    if info is None:
        raise fail(f"unknown opcode '{ins.opcode}'")
    wrapped = ins.attributes.get("async_wrapped_opcode")
    if wrapped is not None and (
        ins.opcode not in ("async-start", "async-update", "async-done") or wrapped not in OPCODES
    ):
        raise fail(f"async_wrapped_opcode={wrapped!r} is not an opcode an async op can wrap")
    spec = OPCODES[wrapped] if wrapped is not None and ins.opcode == "async-start" else info
    for operand in ins.operands:
        if operand not in seen:
            where = "after its use" if operand in comp else "nowhere in the computation"
            raise fail(f"operand %{operand} is defined {where}; operands must be defined before use")
    for pred in ins.attr("control-predecessors", ()) if isinstance(ins.attr("control-predecessors"), tuple) else ():
        if pred not in seen:
            raise fail(f"control predecessor %{pred} is not defined before %{ins.name}")
    n = len(ins.operands)
    if n < spec.min_operands or (spec.max_operands is not None and n > spec.max_operands):
        raise fail(f"{spec.name} takes {spec.arity_text()}, found {n}")
    missing = sorted(spec.required - set(ins.attributes))
    if missing:
        raise fail(f"{spec.name} needs attribute(s) {', '.join(missing)}")
    for callee in ins.called_computations():
        if callee not in module:
            raise fail(f"calls computation {callee}, which does not exist")
    check = SHAPE_RULES.get(ins.opcode)
    if check is None:
        return
    try:
        check(ins, [seen[o] for o in ins.operands], module)
    except RuleError as err:
        raise fail(str(err)) from None
    except (AttributeError, TypeError, ValueError, IndexError, KeyError, TpusimError) as err:
        raise fail(f"malformed attributes for {ins.opcode}: {type(err).__name__}: {err}") from None


def _check_entry_layout(module: Module) -> None:
    """The header's entry_computation_layout must describe the entry computation (layouts may differ)."""
    layout = module.attributes.get("entry_computation_layout")
    if not isinstance(layout, ProgramShape):
        return
    entry = module.entry_computation
    params = [p.shape for p in entry.parameters]
    if len(params) != len(layout.parameters) or not all(map(compatible, params, layout.parameters)):
        declared = ", ".join(str(p) for p in layout.parameters)
        actual = ", ".join(str(p) for p in params)
        raise HloVerifyError(f"entry_computation_layout declares parameters ({declared}) but they are ({actual})")
    if not compatible(entry.root_instruction.shape, layout.result):
        raise HloVerifyError(
            f"entry_computation_layout declares the result {layout.result} but the root "
            f"%{entry.root} is {entry.root_instruction.shape}",
            entry.name,
        )


def _check_call_graph(module: Module) -> None:
    """No computation may reach itself through calls."""
    state: dict[str, int] = {}
    for start in module.computations:
        if state.get(start.name):
            continue
        stack = [(start.name, iter(_callees(module, start.name)))]
        state[start.name] = 1
        while stack:
            name, it = stack[-1]
            callee = next(it, None)
            if callee is None:
                state[name] = 2
                stack.pop()
            elif state.get(callee) == 1:
                cycle = [n for n, _ in stack] + [callee]
                raise HloVerifyError(f"computations call each other in a cycle: {' -> '.join(cycle)}", name)
            elif not state.get(callee):
                state[callee] = 1
                stack.append((callee, iter(_callees(module, callee))))


def _callees(module: Module, name: str) -> list[str]:
    out: list[str] = []
    for ins in module[name].instructions:
        out.extend(c for c in ins.called_computations() if c in module)
    return out
