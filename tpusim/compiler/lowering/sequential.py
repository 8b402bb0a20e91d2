"""Lowering a sequential computation: each HLO instruction, in order, through the rule registry.

With megacore (:attr:`Lowering.cores` > 1) every instruction is emitted into the streams of the cores that
run it: control flow (``while``, ``conditional``, ``call``) and instructions whose results live in SMEM (the
scalar unit's loop counters and offsets) on every core, so that each core follows the same path through the
program; a rule that splits its work (:meth:`Lowering.split`: dots, convolutions, vector blocks, full
reductions) once per core, each core emitting its share with its own VMEM, semaphores and registers;
everything else whole on one core, the cores taking turns (core 0 for what keeps state between instructions
or talks to the host). After each instruction, :meth:`Lowering.synchronise` puts a chip barrier in front of
it where it touches HBM bytes another core touched since the last barrier.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpusim.compiler.buffer_assignment import leaf_paths
from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.lowering.context import Lowering, Mark
from tpusim.compiler.lowering.fallback import lower_fallback
from tpusim.compiler.lowering.registry import NO_CODE, LowerFn, NotLowerable, rule_for
from tpusim.compiler.verify import accesses
from tpusim.isa import DmaStart, MemRef, SemWait, Space

__all__ = ["CONTROL_FLOW", "lower_computation", "lower_instruction"]

CONTROL_FLOW = frozenset({"while", "conditional", "call"})
"""Opcodes whose rules run on every core and synchronise the cores themselves."""

SERIAL = frozenset(
    {"copy-start", "copy-done", "async-start", "async-update", "async-done", "infeed", "outfeed", "send",
     "send-done", "recv", "recv-done", "rng-get-and-update-state", "custom-call", "rng", "rng-bit-generator"}
)  # fmt: skip
"""Opcodes that stay on core 0 when they do not split: their rules keep state from one instruction to the
next (an async copy's semaphore) or their fallbacks talk to the host in program order."""


def lower_computation(ctx: Lowering, name: str) -> None:
    """Append the code of computation ``name`` (entry, loop body, branch ...) to the stream."""
    comp = ctx.module[name]
    for instr in comp.instructions:
        lower_instruction(ctx, comp, instr)


def lower_instruction(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """Lower one instruction with its registered rule, or as a fallback when it has none or declines."""
    if instr.opcode in NO_CODE or (comp.name, instr.name) in ctx.epilogued:
        return  # (an epilogue: the dot that feeds it computed it, see epilogue.py)
    rule = rule_for(ctx, comp, instr)
    with ctx.op(comp, instr):
        if ctx.cores == 1:
            _lower(ctx, comp, instr, rule)
            return
        outer = ctx.in_segment
        try:
            if rule is not None and instr.opcode in CONTROL_FLOW:
                ctx.in_segment = False
                with ctx.on(ctx.all_cores):
                    _lower(ctx, comp, instr, rule)
                return
            ctx.in_segment = True
            start = ctx.positions()
            smem, hbm = _homes(ctx, comp, instr)
            if smem and not hbm:  # scalars every core keeps: every core computes them
                with ctx.on(ctx.all_cores):
                    _lower(ctx, comp, instr, rule)
            else:
                _lower_split(ctx, comp, instr, rule, lone=not smem and instr.opcode not in SERIAL)
                if smem:  # core 0 computed SMEM words the others need too: push them to their SMEM
                    words = [ctx.home(comp.name, instr.name, path) for path in smem]
                    _share_smem(ctx, _written(ctx.stream.instructions[start[0] :], words))
            ctx.synchronise(start)
        finally:
            ctx.in_segment = outer


def _lower(ctx: Lowering, comp: Computation, instr: Instruction, rule: LowerFn | None) -> bool:
    """The rule's code, or a fallback; True when the rule lowered it."""
    if rule is None:
        lower_fallback(ctx, comp, instr, f"no hardware lowering for {instr.opcode}")
        return False
    mark = ctx.checkpoint()
    try:
        rule(ctx, comp, instr)
    except NotLowerable as declined:
        ctx.rollback(mark)
        why = declined
        if ctx.widen_scope():  # declined in its half of the free VMEM: try again with all of it
            try:
                rule(ctx, comp, instr)
                return True
            except NotLowerable as again:
                ctx.rollback(mark)
                why = again
        share, ctx.share = ctx.share, None
        try:
            lower_fallback(ctx, comp, instr, str(why))
        finally:
            ctx.share = share
        return False
    return True


def _lower_split(ctx: Lowering, comp: Computation, instr: Instruction, rule: LowerFn | None, lone: bool) -> None:
    """Core 0 emits the instruction; when its rule took a share of the work (:meth:`Lowering.split`), every
    other core emits its own share the same way, in its own VMEM, semaphores and registers. An instruction
    that does not split runs on one core: with ``lone``, the cores take such instructions in turn (so that
    independent ones run side by side), else core 0."""
    mark = ctx.checkpoint()
    ctx.claimed = False
    ctx.split_log = []
    try:
        with ctx.on((0,)):
            ctx.share = (0, ctx.cores)
            lowered = _lower(ctx, comp, instr, rule)
            if not lowered or not ctx.claimed or rule is None:
                if lone and ctx.lone_turn:
                    _lower_lone(ctx, comp, instr, rule, mark, lone)
                elif lone:  # core 0's turn: what it emitted stands
                    ctx.lone_turn = (ctx.lone_turn + 1) % ctx.cores
                return
            spare, planned = ctx.split_items % ctx.cores, ctx.split_log
            for core in range(1, ctx.cores):
                ctx.release_since(mark)
                ctx.split_log = []
                with ctx.on((core,)):
                    ctx.share = (core, ctx.cores)
                    try:
                        rule(ctx, comp, instr)
                    except NotLowerable:
                        ctx.split_log = []  # core 0's share lowered, this one does not: whole on one core
                if ctx.split_log != planned:
                    # The cores planned different blockings (a VMEM plan that fits one share and not
                    # another): their shares would not tile the work. Whole, on one core.
                    _lower_lone(ctx, comp, instr, rule, mark, lone)
                    return
            if spare:  # the next split instruction's spare blocks go to the next core
                ctx.spare_turn = (ctx.spare_turn + 1) % ctx.cores
    finally:
        ctx.share = None
        ctx.claimed = False


def _lower_lone(
    ctx: Lowering, comp: Computation, instr: Instruction, rule: LowerFn | None, mark: Mark, lone: bool
) -> None:
    """The whole instruction on one core (the next in turn with ``lone``, else core 0), unsplit."""
    ctx.rollback(mark)
    ctx.share = None
    core = ctx.lone_turn if lone else 0
    with ctx.on((core,)):
        _lower(ctx, comp, instr, rule)
    if lone:
        ctx.lone_turn = (ctx.lone_turn + 1) % ctx.cores


def _homes(ctx: Lowering, comp: Computation, instr: Instruction) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The leaves of the instruction's result that SMEM holds (every core keeps its own copy), and the
    others."""
    leaves, buffers = ctx.buffers.leaves, ctx.buffers.buffers
    smem: list[tuple[int, ...]] = []
    hbm: list[tuple[int, ...]] = []
    for path, _ in leaf_paths(instr.shape):
        index = leaves.get((comp.name, instr.name, path))
        (smem if index is not None and buffers[index].space == "smem" else hbm).append(path)
    return smem, hbm


def _written(instructions: Sequence[object], words: list[MemRef]) -> list[MemRef]:
    """The SMEM ``words`` the instructions write (a copy-start's context word, say, is never written)."""
    stored = [
        (r.address, r.address + r.byte_size) for i in instructions for r in accesses(i)[1] if r.space is Space.SMEM
    ]
    return [w for w in words if any(lo < w.address + w.byte_size and w.address < hi for lo, hi in stored)]


def _share_smem(ctx: Lowering, words: list[MemRef]) -> None:
    """DMA core 0's SMEM ``words`` into the same words of every other core, which wait for them."""
    if not words:
        return
    sem = ctx.semaphore()
    with ctx.on((0,)):
        for core in range(1, ctx.cores):
            for ref in words:
                ctx.emit(DmaStart, src=ref, dst=ref, dst_core=core, dst_sem=sem)
    for core in range(1, ctx.cores):
        with ctx.on((core,)):
            ctx.emit(SemWait, sem=sem, count=len(words))
