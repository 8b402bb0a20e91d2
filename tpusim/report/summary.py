"""The text summary ``tpusim run`` prints: time, unit utilisation, the costliest HLO instructions,
fallbacks, and the check against the reference."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tpusim.check import OutputCheck
from tpusim.isa import MxuMatmul
from tpusim.report.stats import op_stats, unit_stats

if TYPE_CHECKING:
    from tpusim.api import SimulationResult
    from tpusim.compiler.pipeline import CompiledProgram

__all__ = ["format_summary", "program_precision"]

_PRECISION_ORDER = ("bf16", "bf16_3x", "bf16_6x")


def program_precision(compiled: CompiledProgram) -> str:
    """The least accurate MXU precision the program uses for f32 operands ("none" without matmuls)."""
    seen = {
        ins.precision if ins.lhs.element_type.name == "f32" else "bf16_6x"
        for stream in compiled.program.streams
        for ins in stream.instructions
        if isinstance(ins, MxuMatmul)
    }
    for p in _PRECISION_ORDER:
        if p in seen:
            return p
    return "none"


def format_summary(result: SimulationResult, wall_seconds: float, checks: Sequence[OutputCheck] | None = None) -> str:
    compiled = result.compiled
    cfg = compiled.config
    cycles = max(result.cycles, 1)
    lines = [
        f"program {compiled.source.name} on {cfg.name} ({cfg.clock_hz / 1e9:.2f} GHz): {result.cycles:,} cycles "
        f"= {result.seconds * 1e6:,.2f} us; {result.instructions:,} instructions executed "
        f"({compiled.program.instruction_count:,} in the program)",
        f"compiled in {result.compile_seconds:.2f} s, simulated in {result.run_seconds:.2f} s "
        f"({result.instructions / max(result.run_seconds, 1e-9):,.0f} instructions/s); "
        f"{wall_seconds:.2f} s in all",
        "",
        f"units (busy share of {result.cycles:,} cycles):",
    ]
    for u in unit_stats(result.trace):
        if u.name.endswith(".sync"):
            lines.append(f"  {u.name:24} waiting on semaphores and barriers {u.busy_cycles / cycles:6.1%} of the time")
            continue
        extra = f", {u.flops / u.busy_cycles:,.0f} flop/cycle" if u.flops and u.busy_cycles else ""
        lines.append(f"  {u.name:24} {u.busy_cycles / cycles:6.1%}  {u.instructions:6,} instructions, "
                     f"{u.bytes:,} bytes{extra}")  # fmt: skip
    lines += ["", "HLO instructions by span (first issue to last completion):"]
    for op in op_stats(result.trace)[:10]:
        lines.append(f"  {op.hlo:32} {op.span:10,} cycles {op.span / cycles:6.1%}  {op.instructions:5,} instructions")
    if compiled.fallbacks:
        lines += ["", "fallbacks (reference semantics on device bytes, with a declared cost):"]
        lines += [f"  {comp}/{name} ({opcode}): {why}" for comp, name, opcode, why in compiled.fallbacks]
    if compiled.relayouts:
        lines += ["", "relayout copies inserted by layout assignment:"]
        lines += [
            f"  {r.computation}/{r.name}: {r.from_shape} -> {r.to_shape} ({r.reason})" for r in compiled.relayouts
        ]
    if checks is not None:
        lines += ["", "check against the reference interpreter:"] + [f"  {c}" for c in checks]
    return "\n".join(lines)
