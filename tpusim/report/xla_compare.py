"""tpusim beside XLA:TPU's own estimates, for a module XLA:TPU compiled.

XLA:TPU's compiled modules carry, per fusion (and other kernels), ``"estimated_cycles"`` from its cost model,
and its ``cost_analysis()`` gives ``optimal_seconds`` for the program (:mod:`tpusim.xla_tpu`). Both are XLA's
model, not measurements of a TPU: where tpusim and XLA disagree, neither is known to be right, but the
disagreement says where to look. The kernels' cycles and ``optimal_seconds`` are two models that disagree
(at the chip's clock the cycles sum to 0.5x-3.3x ``optimal_seconds`` over the corpus of docs/model.md), so
per kernel the comparison is of shares: the kernel's part of all of XLA's estimated cycles beside its part of
tpusim's run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tpusim.compiler.buffer_assignment import sequential_computations
from tpusim.compiler.hlo.xla_forms import estimated_cycles
from tpusim.report.entries import unit_kind

if TYPE_CHECKING:
    from tpusim.api import SimulationResult

__all__ = ["XlaKernel", "format_xla", "xla_kernels", "xla_program"]

CAVEAT = "XLA's cost model, not a measurement"


@dataclass(frozen=True)
class XlaKernel:
    """One kernel of the compiled module: XLA's estimate and tpusim's span of the same instruction (and the
    instructions tpusim made of it, named ``NAME.*``)."""

    name: str
    opcode: str
    xla_cycles: int
    xla_share: float
    tpusim_cycles: int
    tpusim_share: float

    @property
    def ratio(self) -> float | None:
        """tpusim's share over XLA's (1: the two agree on how much of the program this kernel is)."""
        return self.tpusim_share / self.xla_share if self.xla_share else None


def xla_kernels(result: SimulationResult) -> list[XlaKernel]:
    """Every instruction of the source module's sequential computations with an XLA estimate, largest first
    (empty for a module without them)."""
    module = result.compiled.source
    found = []
    inner: dict[str, set[str]] = {}  # a fusion's instructions: tpusim names what it makes of them NAME.INNER
    for name in sequential_computations(module):
        for instr in module[name].instructions:
            cycles = estimated_cycles(instr)
            if cycles is not None:
                found.append((instr.name, instr.opcode, cycles))
                inner[instr.name] = {i.name for c in instr.called_computations() for i in module[c].instructions}
    if not found:
        return []
    trace = result.trace
    codes, names = trace.hlo_codes()
    total_xla = sum(c for _, _, c in found) or 1
    total = max(result.cycles, 1)
    out = []

    def part_of(n: str, name: str) -> bool:
        if n == name:
            return True
        rest = n[len(name) + 1 :] if n.startswith(name + ".") else ""
        return any(rest == i or rest.startswith(i + ".") for i in inner[name])

    # A kernel's span starts at its first instruction that does work: a semaphore wait the sequencer reaches
    # early (for a prefetch issued long before, while the previous kernel's units still run) is not its start
    # (segment_sum's copy showed 46 us for 1.4 us of work).
    waits = np.array([unit_kind(u) == "sync" for u in trace.units] or [False], bool)[trace.unit]
    for name, opcode, cycles in found:
        mine = np.fromiter((part_of(n, name) for n in names), bool, len(names))[codes]  # (per distinct name)
        working = mine & ~waits
        first = trace.start[working].min() if working.any() else trace.start[mine].min() if mine.any() else 0
        span = int(trace.end[mine].max() - first) if mine.any() else 0
        out.append(XlaKernel(name, opcode, cycles, cycles / total_xla, span, span / total))
    return sorted(out, key=lambda k: -k.xla_cycles)


def xla_program(result: SimulationResult) -> dict[str, float] | None:
    """tpusim's time beside XLA's ``optimal_seconds`` when the run compiled with XLA:TPU (else None)."""
    xla = result.xla
    if xla is None or xla.optimal_seconds <= 0:
        return None
    return {
        "optimal_seconds": xla.optimal_seconds,
        "tpusim_seconds": result.seconds,
        "ratio": result.seconds / xla.optimal_seconds,
        "flops": xla.flops,
        "bytes_accessed": xla.bytes_accessed,
    }


def format_xla(result: SimulationResult, rows: int = 10) -> list[str]:
    """The summary's lines comparing tpusim with XLA's estimates (none when there are none)."""
    program = xla_program(result)
    kernels = xla_kernels(result)
    if program is None and not kernels:
        return []
    lines = ["", f"XLA:TPU's estimates ({CAVEAT}):"]
    if program is not None:
        lines.append(
            f"  program: XLA optimal_seconds {program['optimal_seconds'] * 1e6:,.2f} us, tpusim "
            f"{program['tpusim_seconds'] * 1e6:,.2f} us (tpusim / XLA = {program['ratio']:.2f})"
        )
    if kernels:
        lines.append(f"  {'kernel':32} {'XLA cycles':>12} {'XLA share':>9}  {'tpusim cycles':>13} {'share':>6}  ratio")
        for k in kernels[:rows]:
            ratio = f"{k.ratio:5.2f}" if k.ratio is not None else "    -"
            lines.append(
                f"  {k.name[:32]:32} {k.xla_cycles:12,} {k.xla_share:9.1%}  {k.tpusim_cycles:13,} {k.tpusim_share:6.1%}"
                f"  {ratio}"
            )
    return lines
