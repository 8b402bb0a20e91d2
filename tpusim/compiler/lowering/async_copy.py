"""Asynchronous copies and pass-through values: copy-start / copy-done, add-dependency, domain.

``copy-start`` returns ``(destination, source, u32[] context)`` and ``copy-done`` the destination (XLA's
async copy, e.g. of a prefetch between memory spaces). The start issues one DMA from the operand to the
destination part on a semaphore it keeps past its own instruction; the done waits for that semaphore and
gives it back. The instructions scheduled between them run while the copy is in flight (a reader of the
destination would in any case wait for the DMA: the scoreboard orders it). Buffer assignment lets the
start's source part be the operand and the done be the start's destination, so nothing else moves; where
their layouts differ, the rules copy.

``add-dependency`` (a value and a token ordering it) and ``domain`` (a sharding annotation) pass their first
operand through: buffer assignment gives them its buffer and nothing runs; the rules copy only where the
layouts differ.
"""

from __future__ import annotations

from tpusim.compiler.buffer_assignment import leaf_paths
from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.lowering.context import Lowering
from tpusim.compiler.lowering.control import copy_arrays
from tpusim.compiler.lowering.indexed import take_semaphores
from tpusim.compiler.lowering.registry import NotLowerable, lowering
from tpusim.isa import DmaStart, MemRef, SemWait

__all__ = ["lower_copy_done", "lower_copy_start", "lower_pass_through"]

_STATE = "async-copies"
"""``ctx.rule_state`` key: copy-start name -> (semaphore held for it, DMAs it issued)."""


def _distinct(ctx: Lowering, comp: str, a: str, a_path: tuple[int, ...], b: str, b_path: tuple[int, ...]) -> bool:
    return ctx.buffers.buffer(comp, a, a_path).id != ctx.buffers.buffer(comp, b, b_path).id


@lowering("add-dependency", "domain")
def lower_pass_through(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    source = instr.operands[0]
    copy_arrays(
        ctx,
        [
            (ctx.home(comp.name, source, path), ctx.home(comp.name, instr.name, path))
            for path, _ in leaf_paths(instr.shape)
            if _distinct(ctx, comp.name, source, path, instr.name, path)
        ],
    )


@lowering("copy-start")
def lower_copy_start(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    source = instr.operands[0]
    pairs: list[tuple[MemRef, MemRef]] = []
    for part in (0, 1):
        for path, _ in leaf_paths(comp[source].shape):
            if _distinct(ctx, comp.name, source, path, instr.name, (part, *path)):
                pairs.append((ctx.home(comp.name, source, path), ctx.home(comp.name, instr.name, (part, *path))))
    pairs = [(s, d) for s, d in pairs if s.shape.element_count]
    (sem,) = take_semaphores(ctx, 1)
    for src, dst in pairs:
        ctx.emit(DmaStart, src=src, dst=dst, sem=sem)
    ctx.scope.semaphores.remove(sem)  # held until the copy-done: the scope must not give it back
    ctx.rule_state.setdefault(_STATE, {})[instr.name] = (sem, len(pairs))


@lowering("copy-done")
def lower_copy_done(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    start = instr.operands[0]
    held = ctx.rule_state.get(_STATE, {}).pop(start, None)
    if held is None:
        raise NotLowerable(f"its operand {start} is not a copy-start lowered before it")
    sem, count = held
    ctx.scope.semaphores.append(sem)  # given back when this instruction's scope ends
    if count:
        ctx.emit(SemWait, sem=sem, count=count)
    copy_arrays(
        ctx,
        [
            (ctx.home(comp.name, start, (0, *path)), ctx.home(comp.name, instr.name, path))
            for path, _ in leaf_paths(instr.shape)
            if _distinct(ctx, comp.name, start, (0, *path), instr.name, path)
        ],
    )
