"""The program verifier: checks a compiled instruction stream before it runs.

Rules (each violation is a :class:`ProgramVerifyError` naming the instruction, its index and its HLO op):

1. Every memory operand lies inside its memory (HBM, VMEM, SMEM capacities from the chip config).
2. VMEM operands start on a vector-register boundary (``sublanes x lanes x 4`` bytes), the granularity of
   VMEM transactions.
3. Operands are defined before use: a VMEM or SMEM byte is read only after an earlier instruction (in
   program order) wrote it, and a scalar register only after an earlier instruction set it.
4. Every DMA is waited on: along the stream, the signals a DMA (or a ``sem.signal``) adds to a semaphore of
   its own core are consumed by ``sem.wait`` before the next label, jump, branch or halt, and no wait
   consumes more than is outstanding. Programs with remote DMAs or signals (several chips or cores) are
   exempt from this rule: their semaphores are fed from elsewhere.

It is on in the test suite (``TPUSIM_VERIFY=1``) and off by default, as in tinygrad's SPEC flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from tpusim.config import ChipConfig
from tpusim.errors import TpusimError
from tpusim.isa import (
    Branch,
    DmaStart,
    Halt,
    Jump,
    MemRef,
    Program,
    Reg,
    ScalarAlu,
    ScalarLoad,
    SemSignal,
    SemWait,
    Space,
    Stream,
    VpuReduce,
    format_instruction,
)

__all__ = ["ProgramVerifyError", "verify_program"]

_WRITE_FIELDS = frozenset({"dst", "outputs"})


class ProgramVerifyError(TpusimError):
    """A compiled program that breaks a rule of the verifier."""


def _memrefs(value: object) -> Iterator[MemRef]:
    if isinstance(value, MemRef):
        yield value
    elif isinstance(value, tuple):
        for v in value:
            yield from _memrefs(v)


def accesses(ins: object) -> tuple[list[MemRef], list[MemRef], list[Reg], list[Reg]]:
    """(memory read, memory written, registers read, registers written) by one instruction."""
    reads: list[MemRef] = []
    writes: list[MemRef] = []
    reg_reads: list[Reg] = []
    reg_writes: list[Reg] = []
    for f in dataclasses.fields(ins):  # type: ignore[arg-type]
        value = getattr(ins, f.name)
        refs = list(_memrefs(value))
        (writes if f.name in _WRITE_FIELDS else reads).extend(refs)
        for ref in refs:
            reg_reads.extend(ref.registers)
        if isinstance(value, Reg):
            (reg_writes if f.name == "dst" and isinstance(ins, (ScalarAlu, ScalarLoad)) else reg_reads).append(value)
    if isinstance(ins, VpuReduce) and ins.accumulate:
        reads.append(ins.dst)
    return reads, writes, reg_reads, reg_writes


class _Coverage:
    """Byte ranges written so far, per space (merged sorted intervals)."""

    def __init__(self) -> None:
        self.ranges: dict[Space, list[tuple[int, int]]] = {}

    def add(self, space: Space, lo: int, hi: int) -> None:
        merged: list[tuple[int, int]] = []
        for a, b in self.ranges.get(space, []):
            if b < lo or a > hi:
                merged.append((a, b))
            else:
                lo, hi = min(a, lo), max(b, hi)
        merged.append((lo, hi))
        self.ranges[space] = sorted(merged)

    def covers(self, space: Space, lo: int, hi: int) -> bool:
        return any(a <= lo and hi <= b for a, b in self.ranges.get(space, []))


def _extent(ref: MemRef) -> tuple[int, int]:
    return ref.address, ref.address + ref.shape.byte_size


def verify_program(program: Program, config: ChipConfig) -> None:
    """Raise :class:`ProgramVerifyError` at the first rule a program breaks (see the module docstring)."""
    remote = any(
        (isinstance(i, DmaStart) and (i.chip is not None or i.dst_core is not None))
        or (isinstance(i, SemSignal) and (i.chip is not None or i.core is not None))
        for s in program.streams
        for i in s.instructions
    )
    for stream in program.streams:
        # What other cores of the chip push into this core's memories (megacore's shared scalars) counts as
        # written: the receiver waits on a semaphore for it.
        pushed = [
            i.dst
            for s in program.streams
            if s is not stream and s.chip == stream.chip
            for i in s.instructions
            if isinstance(i, DmaStart) and i.chip is None and i.dst_core == stream.core
        ]
        # The core's other sequencer writes the same memories (the async sequencer's requests: semaphores
        # order them).
        pushed += [
            ref
            for s in program.streams
            if s is not stream and s.chip == stream.chip and s.core == stream.core
            for i in s.instructions
            for ref in accesses(i)[1]
        ]
        _verify_stream(stream, config, check_semaphores=not remote and len(program.streams) == 1, pushed=pushed)


def _verify_stream(stream: Stream, config: ChipConfig, check_semaphores: bool, pushed: list[MemRef]) -> None:
    capacity = {Space.HBM: config.hbm.bytes, Space.VMEM: config.vmem.bytes, Space.SMEM: config.smem.bytes}
    vreg = config.vpu.sublanes * config.vpu.lanes * 4
    written = _Coverage()
    for ref in pushed:
        written.add(ref.space, *_extent(ref))
    set_regs: set[int] = set()
    outstanding: dict[int, list[int]] = {}  # semaphore -> instruction indices of unconsumed signals
    labels = {index for _, index in stream.labels}

    def fail(i: int, why: str) -> ProgramVerifyError:
        ins = stream.instructions[i]
        return ProgramVerifyError(f"instruction {i} `{format_instruction(ins)}`: {why}")

    def settle(i: int, where: str) -> None:
        for sem, starts in outstanding.items():
            if starts:
                raise fail(starts[0], f"signals semaphore {sem} but nothing waits for it before {where}")

    for i, ins in enumerate(stream.instructions):
        if check_semaphores and i in labels:
            settle(i, f"the label at instruction {i}")
        reads, writes, reg_reads, reg_writes = accesses(ins)
        for ref in reads + writes:
            _, hi = _extent(ref)
            if hi > capacity[ref.space]:
                raise fail(
                    i, f"{ref.space.value} operand ends at byte {hi}, past the {capacity[ref.space]}-byte memory"
                )
            if ref.space is Space.VMEM and ref.address % vreg:
                raise fail(i, f"VMEM operand at {ref.address:#x} is not aligned to {vreg} bytes (one vector register)")
        for ref in reads:
            if ref.space is not Space.HBM and not written.covers(ref.space, *_extent(ref)):
                raise fail(i, f"reads {ref.space.value}[{ref.address:#x}] before anything wrote it")
        for reg in reg_reads:
            if reg.index not in set_regs:
                raise fail(i, f"reads register {reg} before anything set it")
        for ref in writes:
            written.add(ref.space, *_extent(ref))
        set_regs.update(r.index for r in reg_writes)
        if not check_semaphores:
            continue
        if isinstance(ins, DmaStart) and ins.sem is not None:
            outstanding.setdefault(ins.sem, []).append(i)
        elif isinstance(ins, SemSignal):
            outstanding.setdefault(ins.sem, []).extend([i] * ins.count)
        elif isinstance(ins, SemWait):
            pending = outstanding.get(ins.sem, [])
            if len(pending) < ins.count:
                raise fail(
                    i, f"waits for {ins.count} signals on semaphore {ins.sem} but only {len(pending)} are outstanding"
                )
            del pending[: ins.count]
        elif isinstance(ins, (Jump, Branch, Halt)):
            settle(i, f"the {type(ins).__name__.lower()} at instruction {i}")
    if check_semaphores:
        settle(len(stream.instructions) - 1 if stream.instructions else 0, "the end of the stream")
