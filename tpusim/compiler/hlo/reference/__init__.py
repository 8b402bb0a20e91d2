"""The reference interpreter: tpusim's numerics oracle, evaluating HLO directly with numpy.

Every module of this package is imported here (in name order), so a module that registers op functions
with :func:`register` only has to exist: no edit of this file is needed.

    >>> from tpusim.compiler.hlo.reference import evaluate, evaluate_spmd, REFERENCE  # doctest: +SKIP
"""

import importlib
import pkgutil

from tpusim.compiler.hlo.reference.core import (
    ELEMENTWISE,
    REFERENCE,
    TOKEN,
    EvalContext,
    EvaluationError,
    Host,
    InputError,
    Token,
    UnsupportedOpcodeError,
    Value,
    evaluate,
    evaluate_instruction,
    evaluate_spmd,
    register,
)

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    importlib.import_module(f"{__name__}.{_info.name}")

from tpusim.compiler.hlo.ir import Instruction, custom_call_target  # noqa: E402
from tpusim.compiler.hlo.reference.control import CUSTOM_CALLS, register_custom_call  # noqa: E402
from tpusim.compiler.hlo.reference.exchange import CollectiveError  # noqa: E402


def cannot_run(instr: Instruction) -> str | None:
    """Why the interpreter cannot run ``instr`` as a kernel of its own (an opcode or custom-call target it
    has no function for), or None when it can."""
    if instr.opcode not in REFERENCE:
        return (
            f"the reference interpreter has no function for {instr.opcode} to run it as a fallback "
            "(docs/reference.md lists the opcodes it runs)"
        )
    target = custom_call_target(instr)
    if instr.opcode == "custom-call" and target not in CUSTOM_CALLS:
        known = ", ".join(sorted(CUSTOM_CALLS))
        return f"custom-call target {target!r} has no reference function; supported targets: {known}"
    return None


__all__ = [
    "CUSTOM_CALLS",
    "ELEMENTWISE",
    "REFERENCE",
    "TOKEN",
    "CollectiveError",
    "EvalContext",
    "EvaluationError",
    "Host",
    "InputError",
    "Token",
    "UnsupportedOpcodeError",
    "Value",
    "cannot_run",
    "evaluate",
    "evaluate_instruction",
    "evaluate_spmd",
    "register",
    "register_custom_call",
]
