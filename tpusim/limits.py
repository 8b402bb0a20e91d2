"""Run limits: how far a simulation may go before it is stopped, and what stopping says.

A program whose ``while`` never ends would otherwise run (and, on the device model, keep trace records)
until the machine gives out. Two limits stop it, each a keyword of every run entry point
(:func:`tpusim.simulate`, :func:`tpusim.simulate_jax`, ``System.run``, the reference interpreter's
``evaluate``) and a flag of ``tpusim run``:

``max_steps`` (``--max-steps``)
    On the device model: instructions executed, summed over every core and chip, each loop iteration
    counting again. In the reference interpreter (``--reference``, ``--check``, fallback kernels): ``while``
    iterations, summed over every ``while`` of the run (per device of an SPMD run). A device run executes
    at least two instructions per iteration (the exit branch and the jump back), so a program whose
    device run fits a limit also fits it in the reference interpreter.
``max_cycles`` (``--max-cycles``, device model only)
    Simulated cycles.

Both are checked whenever a core takes a branch or jump back (loops are the only way a run goes on without
end; straight-line code between two checks is at most one pass through the stream) and once more when the
run ends, so a run never finishes past a limit without saying so. Hitting one raises
:class:`RunLimitError`, one line naming the loop that was running (its HLO ``while`` instruction and
computation), the iterations it had run, and the flag and keyword that raise the limit.

Defaults (:data:`DEFAULT_MAX_STEPS`, :data:`DEFAULT_MAX_CYCLES`) are finite and far above any shipped
example or test; see their notes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tpusim.errors import TpusimError

__all__ = [
    "DEFAULT_MAX_CYCLES",
    "DEFAULT_MAX_STEPS",
    "LimitHit",
    "RunLimitError",
    "check_limits",
    "interrupt_position",
    "note_interrupt",
]

DEFAULT_MAX_STEPS = 10_000_000
"""Default ``max_steps``. The largest shipped runs execute under a million device instructions (the
multi-chip training step, about 820,000; the transformer block example, 1,025); loops in the tests run at
most a few thousand. At the device model's 30,000-250,000 instructions a second an endless loop stops within
a few minutes, and its trace records (about 100 bytes per executed instruction, the one thing that grows
while a loop runs) stay near 1 GB. In the reference interpreter 10 million ``while`` iterations take minutes
to an hour, and nothing grows."""

DEFAULT_MAX_CYCLES = 2**48
"""Default ``max_cycles``: 2^48 = 281,474,976,710,656 cycles, 52 hours of simulated time at 1.5 GHz, a
million times the longest shipped run (a blocked 1024 matmul, under 3 million cycles), and well below 2^53,
past which cycle counts would no longer be exact in the floats SimPy's clock and the trace's consumers
use."""

MAX_CYCLES_CEILING = 2**53
"""The largest ``max_cycles`` accepted (cycle counts above it are not exact as floats)."""

_FLAGS = {"max_steps": "--max-steps", "max_cycles": "--max-cycles"}


class RunLimitError(TpusimError):
    """A run stopped by ``max_steps`` or ``max_cycles``: probably a loop that never ends.

    Attributes:
        hit: what was reached and where (None on a copy made by SimPy, which keeps only the message).
    """

    def __init__(self, message: str, hit: LimitHit | None = None) -> None:
        super().__init__(message)
        self.hit = hit

    @classmethod
    def of(cls, hit: LimitHit) -> RunLimitError:
        return cls(hit.message(), hit)

    def located(self, module: Any) -> RunLimitError:
        """This error with the loop's opcode and computation looked up in ``module`` (an HLO Module: the
        device model knows only the HLO instruction names its instructions carry)."""
        hit = self.hit
        if hit is None or hit.loop is None or hit.computation is not None or module is None:
            return self
        found = [(comp, comp[hit.loop]) for comp in module.computations if hit.loop in comp]
        # (hand-written modules may repeat a name in several computations: a while first)
        found.sort(key=lambda pair: pair[1].opcode != "while")
        if not found:
            return self
        comp, instr = found[0]
        line = str(instr.loc) if instr.loc is not None else None
        return RunLimitError.of(replace(hit, opcode=instr.opcode, computation=comp.name, line=line))


@dataclass(frozen=True)
class LimitHit:
    """Where a run stood when it reached a limit.

    Attributes:
        limit: ``"max_steps"`` or ``"max_cycles"``.
        value: the limit.
        loop: the HLO instruction of the loop that was running (a ``while``; on the device, the one with the
            most iterations in its current execution among the loops around the stopped instruction), or
            None when no loop was running.
        iterations: iterations that loop had completed in its current execution.
        where: the rest of the position (``at cycle 1,234 with 5,000 instructions executed (chip 0 core 0)``).
        ended: the run had already ended (a straight-line run past the limit) rather than being stopped.
        opcode, computation, line: the loop's opcode, computation and source line, when known.
        current: the HLO instruction being run, named when no loop was.
        back_edge: on the device, the loop's jump back (an instruction index), named when the loop has no HLO
            instruction (a hand-written program).
    """

    limit: str
    value: int
    loop: str | None
    iterations: int
    where: str
    ended: bool = False
    opcode: str | None = None
    computation: str | None = None
    line: str | None = None
    current: str | None = None
    back_edge: int | None = None

    def message(self) -> str:
        what = "passed" if self.ended else "reached"
        if self.loop is not None:
            opcode = self.opcode or "HLO"
            place = ", ".join(x for x in (f"computation {self.computation}" if self.computation else None,
                                          self.line) if x)  # fmt: skip
            loop = f"{opcode} %{self.loop}{f' ({place})' if place else ''} had run {self.iterations:,} iterations"
            hint = "an endless loop? "
        elif self.back_edge is not None:
            loop = f"the loop jumping back at instruction {self.back_edge} had run {self.iterations:,} iterations"
            hint = "an endless loop? "
        else:
            loop = "no loop was running" + (f" (HLO %{self.current})" if self.current else "")
            hint = ""
        flag = _FLAGS[self.limit]
        return (
            f"{self.limit}={self.value:,} {what}: {loop}, {self.where}; {hint}raise the limit with {flag} N "
            f"(Python: {self.limit}=N)"
        )


def check_limits(max_steps: Any, max_cycles: Any = None) -> None:
    """Raise a TpusimError naming the keyword when a limit is not a positive integer (or max_cycles is past
    2^53)."""
    for name, value in (("max_steps", max_steps), ("max_cycles", max_cycles)):
        if value is None and name == "max_cycles":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TpusimError(f"{name} must be a positive integer, not {str(value)[:40]!r}")
    if max_cycles is not None and max_cycles > MAX_CYCLES_CEILING:
        raise TpusimError(f"max_cycles {max_cycles:,} is past 2^53, where cycle counts stop being exact")


# ---------------------------------------------------------------------------------------------------------
# Ctrl-C
# ---------------------------------------------------------------------------------------------------------
def note_interrupt(exc: BaseException, position: str) -> None:
    """Record on a KeyboardInterrupt where the run was (the innermost engine that knows it writes first;
    outer ones keep it). The exception stays a KeyboardInterrupt for Python callers."""
    if getattr(exc, "tpusim_position", None) is None:
        exc.tpusim_position = position  # type: ignore[attr-defined]


def interrupt_position(exc: BaseException) -> str | None:
    """What :func:`note_interrupt` recorded on ``exc``, or None."""
    return getattr(exc, "tpusim_position", None)
