"""The text summary ``tpusim run`` prints: time, unit utilisation, the costliest HLO instructions,
fallbacks, and the check against the reference."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tpusim.check import OutputCheck
from tpusim.isa import MemRef, MxuLoadWeights, MxuMatmul
from tpusim.report.analysis import hlo_index
from tpusim.report.stats import UnitStats, op_stats, unit_stats
from tpusim.report.xla_compare import format_xla

if TYPE_CHECKING:
    from tpusim.api import SimulationResult
    from tpusim.compiler.pipeline import CompiledProgram

__all__ = ["format_summary", "program_precision"]

_PRECISION_ORDER = ("bf16", "bf16_3x", "bf16_6x")


def program_precision(compiled: CompiledProgram) -> str:
    """The least accurate MXU precision the program uses for f32 operands, streamed or latched as weights
    (a product of bf16 operands is exact: "bf16_6x"; "none" without matmuls). A bf16 input does not make
    an f32 weight exact: XLA:TPU converts an f32 convolution's input to bf16 and keeps its kernel f32."""
    seen = {
        precision if operand.element_type.name == "f32" else "bf16_6x"
        for stream in compiled.program.streams
        for ins in stream.instructions
        for operand, precision in _mxu_operands(ins)
    }
    for p in _PRECISION_ORDER:
        if p in seen:
            return p
    return "none"


def _mxu_operands(ins: object) -> tuple[tuple[MemRef, str], ...]:
    """The MXU operand ``ins`` reads, with the precision it reads it at."""
    if isinstance(ins, MxuMatmul):
        return ((ins.lhs, ins.precision),)
    if isinstance(ins, MxuLoadWeights):
        return ((ins.src, ins.precision),)
    return ()


def format_summary(
    result: SimulationResult, wall_seconds: float | None = None, checks: Sequence[OutputCheck] | None = None
) -> str:
    """The summary ``tpusim run`` prints. ``wall_seconds`` is the host's time for the whole job (the command
    line's includes reading the program and writing outputs); by default the compile and run times the
    result measured."""
    if wall_seconds is None:
        wall_seconds = result.compile_seconds + result.run_seconds
    compiled = result.compiled
    cfg = compiled.config
    cycles = max(result.cycles, 1)
    lines = [
        f"program {compiled.source.name} on {cfg.name} ({cfg.clock_hz / 1e9:.2f} GHz): {result.cycles:,} cycles "
        f"= {result.seconds * 1e6:,.2f} us; {result.instructions:,} instructions executed "
        f"({compiled.program.instruction_count:,} in the program)",
        _host_line(result, wall_seconds),
        "",
    ]
    lines += _unit_lines(unit_stats(result.trace), cycles)
    lines += ["", "HLO instructions by span (first issue to last completion):"]
    where = {name: src for name, (_, _, src) in hlo_index(result).items() if src}
    for op in op_stats(result.trace)[:10]:
        line = f"  {op.hlo:32} {op.span:10,} cycles {op.span / cycles:6.1%}  {op.instructions:5,} instructions"
        lines.append(f"{line}  {where[op.hlo]}" if op.hlo in where else line)
    lines += format_xla(result)
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


def _host_line(result: SimulationResult, wall_seconds: float) -> str:
    """Where the host's time went: compiling, and the run's phases (decoding the streams is done once per
    program; the simulation rate counts the SimPy run alone)."""
    phases = result.run.host_seconds
    sim = phases.get("simulate", 0.0)
    inputs = result.inputs_seconds + phases.get("place", 0.0)  # (drawn or checked, then placed in memory)
    rest = max(0.0, result.run_seconds - inputs - sum(phases.get(k, 0.0) for k in ("decode", "simulate")))
    return (
        f"host: compiled in {result.compile_seconds:.2f} s; ran in {result.run_seconds:.2f} s: inputs "
        f"{inputs:.2f} s, decode {phases.get('decode', 0.0):.2f} s, simulation {sim:.2f} s "
        f"({result.instructions / max(sim, 1e-9):,.0f} instructions/s), trace and outputs {rest:.2f} s; "
        f"{wall_seconds:.2f} s in all"
    )


def _unit_lines(stats: list[UnitStats], cycles: int) -> list[str]:
    """One line per unit; on several chips, one line per unit role (``core0.mxu0``) with the mean busy share
    over the chips, its range, and counts summed over the chips."""
    roles: dict[str, list[UnitStats]] = {}
    for u in stats:
        roles.setdefault(u.name.split(".", 1)[1] if u.name.startswith("chip") else u.name, []).append(u)
    chips = max((len(us) for us in roles.values()), default=1)
    if chips == 1:
        lines = [f"units (busy share of {cycles:,} cycles):"]
        rows = [(u.name, [u]) for u in stats]
    else:
        lines = [
            f"units of {chips} chips (busy share of {cycles:,} cycles: mean over the chips [range]; counts summed):"
        ]
        rows = list(roles.items())
    for name, us in rows:
        shares = [u.busy_cycles / cycles for u in us]
        share = f"{sum(shares) / len(shares):6.1%}" + (f" [{min(shares):.1%}-{max(shares):.1%}]" if len(us) > 1 else "")
        if name.endswith("sync"):
            lines.append(f"  {name:24} waiting on semaphores and barriers {share} of the time")
            continue
        busy, flops = sum(u.busy_cycles for u in us), sum(u.flops for u in us)
        extra = f", {flops / busy:,.0f} flop/cycle" if flops and busy else ""
        lines.append(
            f"  {name:24} {share}  {sum(u.instructions for u in us):6,} instructions, "
            f"{sum(u.bytes for u in us):,} bytes{extra}"
        )
    return lines
