"""What each trace entry did, in numbers a report can add up: unit kind, HBM traffic, memory operands.

The trace stores, per executed instruction, its unit, cycles, bytes and flops, plus the text of every
instruction of every stream. :func:`decode_trace` parses each distinct instruction once (the text form
round-trips exactly, ``docs/isa.md``) and spreads the facts over the entries as numpy arrays.

Memory operands are tracked as whole arrays (``MemRef.address`` .. ``+ byte_size``): a window's offsets may
live in registers, so its exact extent is unknown after the run; the array holds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from tpusim.config import ChipConfig
from tpusim.devices import Trace
from tpusim.isa import DmaStart, Instruction, MemRef, Program, Space, format_instruction, mnemonic, parse_instruction

__all__ = ["KINDS", "Extent", "TraceFacts", "decode_trace", "unit_kind"]

KINDS = ("mxu", "vpu", "xlu", "dma", "fallback", "scalar", "sync")
"""Unit kinds, from the unit names of the trace (``chip0.core0.mxu1`` is an ``mxu``)."""

Extent = tuple[str, int, int, int, int]
"""A memory range ``(space, chip, core, lo, hi)``: ``core`` is -1 for HBM (shared by a chip's cores)."""

_WRITE_FIELDS = frozenset({"dst", "outputs"})


def unit_kind(unit: str) -> str:
    """``chip0.core0.mxu1`` -> ``mxu``."""
    return re.sub(r"\d+$", "", unit.rsplit(".", 1)[-1])


@dataclass(frozen=True, slots=True)
class _Facts:
    """Facts about one instruction of one stream."""

    mnemonic: str
    reads: tuple[Extent, ...]
    writes: tuple[Extent, ...]
    hbm_sides: int  # DMA: 1 bit for an HBM source, 2 for an HBM destination
    src_space: str  # DMA: the source's memory space ("" for other instructions)
    dst_space: str  # DMA: the destination's memory space
    dst_chip: int  # DMA: the destination chip (-1: named by a register, unknown after the run)
    dst_core: int  # DMA: the destination core
    latency: int  # DMA: cycles from the data phase's end to completion (-1: unknown, a remote transfer)
    remote: bool


@dataclass(frozen=True, eq=False)
class TraceFacts:
    """Per-entry facts of a trace (arrays align with the trace's entries).

    Attributes:
        trace: the trace.
        kind: unit kind of each entry (see :data:`KINDS`), as an object array.
        chip, core: where each entry ran.
        hbm_read, hbm_write: DMA payload bytes read from / written to HBM by each entry.
        src_space, dst_space: DMAs: the memory space of each side (``hbm``, ``vmem``, ``smem``); "" otherwise.
        dst_chip, dst_core: DMAs: where the destination is (``dst_chip`` -1 when a register named it).
        data_end: DMAs: the cycle the data phase ended (the engine was free again); others: ``end``.
        reads, writes: per entry, the memory extents its instruction reads and writes.
        mnemonic: per entry, the instruction's mnemonic (``dma.start``, ``mxu.matmul`` ...).
        hlo: per entry, the HLO instruction name ("" when none).
        fallback: per entry, True for fallback kernels.
        remote: DMAs that name a chip (pushes: the core's ICI queues carry them, not its DMA engines).
        remote_dmas: DMAs to another chip (their link hops are not in the trace).
    """

    trace: Trace
    kind: np.ndarray
    chip: np.ndarray
    core: np.ndarray
    hbm_read: np.ndarray
    hbm_write: np.ndarray
    src_space: np.ndarray
    dst_space: np.ndarray
    dst_chip: np.ndarray
    dst_core: np.ndarray
    data_end: np.ndarray
    reads: tuple[tuple[Extent, ...], ...]
    writes: tuple[tuple[Extent, ...], ...]
    mnemonic: tuple[str, ...]
    hlo: tuple[str, ...]
    fallback: np.ndarray
    remote: np.ndarray
    remote_dmas: int


def _extent(ref: MemRef, chip: int, core: int) -> Extent:
    return (ref.space.value, chip, -1 if ref.space is Space.HBM else core, ref.address, ref.address + ref.byte_size)


def _refs(value: object) -> list[MemRef]:
    if isinstance(value, MemRef):
        return [value]
    if isinstance(value, tuple):
        return [v for v in value if isinstance(v, MemRef)]
    return []


def _instruction_facts(ins: Instruction, chip: int, core: int, cfg: ChipConfig) -> _Facts:
    reads: list[Extent] = []
    writes: list[Extent] = []
    hbm_sides, latency, remote = 0, 0, False
    src_space = dst_space = ""
    dst_chip, dst_core = chip, core
    if isinstance(ins, DmaStart):
        remote = ins.chip is not None
        dst_chip = ins.chip if isinstance(ins.chip, int) else (chip if ins.chip is None else -1)
        dst_core = ins.dst_core if ins.dst_core is not None else core
        src_space, dst_space = ins.src.space.value, ins.dst.space.value
        reads.append(_extent(ins.src, chip, core))
        if not remote or isinstance(ins.chip, int):
            writes.append(_extent(ins.dst, dst_chip, dst_core))
        hbm_sides = (ins.src.space is Space.HBM) | ((ins.dst.space is Space.HBM) << 1)
        latency = cfg.cycles(cfg.hbm.latency_ns) if hbm_sides else 0
        if remote:
            latency = -1
    else:
        for name in getattr(ins, "__dataclass_fields__", {}):
            refs = _refs(getattr(ins, name))
            (writes if name in _WRITE_FIELDS else reads).extend(_extent(r, chip, core) for r in refs)
    return _Facts(
        mnemonic(ins), tuple(reads), tuple(writes), hbm_sides, src_space, dst_space, dst_chip, dst_core, latency, remote
    )


def _program_streams(trace: Trace, program: Program | None) -> list[tuple[Instruction, ...] | None]:
    """Each trace stream's instructions from the program, when it ran it: the devices number their cores chip by
    chip, each chip taking the program's streams for it in order, main sequencers' first
    (``tpusim.devices.chip.Machine.start``).
    A stream that does not match (length, core, first and last text) is None and gets parsed from its text."""
    if program is None:
        return [None] * len(trace.streams)
    chips = max((s.chip for s in trace.streams), default=-1) + 1
    streams = sorted(program.streams, key=lambda st: st.sequencer)
    order = [st for chip in range(chips) for st in streams if st.chip is None or st.chip == chip]
    out: list[tuple[Instruction, ...] | None] = []
    for k, ts in enumerate(trace.streams):
        st = order[k] if k < len(order) else None
        same = (
            st is not None
            and st.core == ts.core
            and st.sequencer == ts.sequencer
            and len(st.instructions) == len(ts.text)
            and (not ts.text or (format_instruction(st.instructions[0]) == ts.text[0]
                                 and format_instruction(st.instructions[-1]) == ts.text[-1]))
        )  # fmt: skip
        out.append(tuple(st.instructions) if same and st is not None else None)
    return out


def decode_trace(trace: Trace, config: ChipConfig, program: Program | None = None) -> TraceFacts:
    """Facts about every entry of ``trace`` (see :class:`TraceFacts`); with the ``program`` that ran, its
    instructions are used instead of parsing their texts (the same values, much faster)."""
    unit_kinds = np.array([unit_kind(u) for u in trace.units] or [""], dtype=object)
    table: list[_Facts] = []
    hlo_table: list[str] = []
    offsets = []
    for s, known in zip(trace.streams, _program_streams(trace, program)):
        offsets.append(len(table))
        if known is None:
            for text, hlo in zip(s.text, s.hlo):
                table.append(_instruction_facts(parse_instruction(text), s.chip, s.core, config))
                hlo_table.append(hlo)
            continue
        # NOTE: speed. The compiler appends one object wherever an instruction repeats: its facts are worked
        # out once per object, not per index (and no text is printed: the mnemonic comes from the object).
        seen: dict[int, _Facts] = {}
        for ins, hlo in zip(known, s.hlo):
            got = seen.get(id(ins))
            if got is None:
                got = seen[id(ins)] = _instruction_facts(ins, s.chip, s.core, config)
            table.append(got)
            hlo_table.append(hlo)
    n = len(trace)
    fid = (np.asarray(offsets, np.int64)[trace.stream] + trace.index) if n else np.zeros(0, np.int64)
    facts = [table[i] for i in fid.tolist()]
    sides = np.fromiter((f.hbm_sides for f in facts), np.int64, n)
    latency = np.fromiter((f.latency for f in facts), np.int64, n)
    chips = np.array([s.chip for s in trace.streams] or [0], np.int64)
    cores = np.array([s.core for s in trace.streams] or [0], np.int64)
    kind = unit_kinds[trace.unit] if n else np.zeros(0, object)
    is_dma = kind == "dma"
    # A DMA frees its engine when its last byte moves; it completes `latency` cycles later (docs/model.md).
    # Remote transfers add link hops the trace does not name: their whole span counts as the data phase.
    data_end = np.where(is_dma & (latency > 0), trace.end - np.maximum(latency, 0), trace.end)
    data_end = np.maximum(data_end, trace.start)
    return TraceFacts(
        trace=trace,
        kind=kind,
        chip=chips[trace.stream] if n else np.zeros(0, np.int64),
        core=cores[trace.stream] if n else np.zeros(0, np.int64),
        hbm_read=np.where(is_dma & ((sides & 1) > 0), trace.bytes, 0),
        hbm_write=np.where(is_dma & ((sides & 2) > 0), trace.bytes, 0),
        src_space=np.array([f.src_space for f in facts], dtype=object),
        dst_space=np.array([f.dst_space for f in facts], dtype=object),
        dst_chip=np.fromiter((f.dst_chip for f in facts), np.int64, n),
        dst_core=np.fromiter((f.dst_core for f in facts), np.int64, n),
        data_end=data_end,
        reads=tuple(f.reads for f in facts),
        writes=tuple(f.writes for f in facts),
        mnemonic=tuple(f.mnemonic for f in facts),
        hlo=tuple(hlo_table[i] for i in fid.tolist()),
        fallback=kind == "fallback",
        remote=np.fromiter((f.remote for f in facts), bool, n),
        remote_dmas=sum(1 for f in facts if f.remote),
    )
