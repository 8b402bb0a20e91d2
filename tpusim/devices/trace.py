"""Trace records: one per executed instruction, the raw material for reports.

During a run, units append plain ints to one list, 8 per record; :meth:`Trace.build` turns them into numpy
arrays at the end. No plotting here: reports live in ``tpusim/report``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from tpusim.isa import format_instruction

__all__ = ["InstructionTexts", "Trace", "TraceStream"]


class InstructionTexts(Sequence[str]):
    """The text form of each instruction of a stream, formatted when first asked for (most runs never ask:
    formatting every instruction cost as much as simulating it)."""

    __slots__ = ("_instructions", "_texts")

    def __init__(self, instructions: Sequence[Any]) -> None:
        self._instructions = instructions
        self._texts: list[str | None] = [None] * len(instructions)

    def __len__(self) -> int:
        return len(self._texts)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        t = self._texts[index]
        if t is None:
            t = self._texts[index] = format_instruction(self._instructions[index])
        return t

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"InstructionTexts({len(self)} instructions)"


# Record layout: (stream id, instruction index, unit id, issue cycle, start cycle, end cycle, bytes, flops)
Record = tuple[int, int, int, int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class TraceStream:
    """What a stream id in the trace stands for."""

    chip: int
    core: int
    hlo: tuple[str, ...]  # per instruction index: the HLO instruction name, "" when none
    text: Sequence[str]  # per instruction index: the instruction's text form (an InstructionTexts)
    sequencer: int = 0  # the core's main sequencer (0) or its async sequencer (tpusim.isa.ASYNC_SEQUENCER)


def _order(a: np.ndarray) -> np.ndarray:
    """Indices sorting records by (start, end, stream, index)."""
    if not len(a):
        return np.zeros(0, np.int64)
    # NOTE: speed. Two packed keys sort like the four when every field fits its bits (the usual case).
    top = a.max(axis=0)
    if top[5] < 1 << 31 and top[4] < 1 << 32 and top[1] < 1 << 32 and top[0] < 1 << 31:
        return np.lexsort(((a[:, 0] << 32) | a[:, 1], (a[:, 4] << 31) | a[:, 5]))
    return np.lexsort((a[:, 1], a[:, 0], a[:, 5], a[:, 4]))


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """Executed instructions as parallel arrays (one entry per execution; loops repeat indices).

    Attributes:
        stream: stream id of each entry (see ``streams``).
        index: instruction index within its stream.
        unit: unit id (see ``units``).
        issue: cycle the sequencer issued it.
        start: cycle its unit started it.
        end: cycle its effect was complete.
        bytes: bytes it moved (DMA payload) or read and wrote (compute, at vreg granularity).
        flops: arithmetic operations (2 per multiply-add on the MXU, 1 per element and op on the VPU).
        units: unit names, e.g. ``chip0.core0.mxu1``.
        streams: per stream id, its chip, core, HLO names and instruction texts.
    """

    stream: np.ndarray
    index: np.ndarray
    unit: np.ndarray
    issue: np.ndarray
    start: np.ndarray
    end: np.ndarray
    bytes: np.ndarray
    flops: np.ndarray
    units: tuple[str, ...]
    streams: tuple[TraceStream, ...]

    @staticmethod
    def build(records: list[int], units: list[str], streams: list[TraceStream]) -> Trace:
        """Arrays from records (8 ints each, one after the other: NOTE speed, a flat list converts faster),
        ordered by (start, end, stream, index) so the order never depends on event scheduling details."""
        a = np.fromiter(records, dtype=np.int64, count=len(records)).reshape(-1, 8)
        col = a[_order(a)].T.copy()  # one copy: each column contiguous
        return Trace(
            stream=col[0],
            index=col[1],
            unit=col[2],
            issue=col[3],
            start=col[4],
            end=col[5],
            bytes=col[6],
            flops=col[7],
            units=tuple(units),
            streams=tuple(streams),
        )

    def __len__(self) -> int:
        return int(self.index.size)

    @property
    def hlo(self) -> np.ndarray:
        """The HLO instruction name of each entry ("" when none)."""
        codes, names = self.hlo_codes()
        out: np.ndarray = names[codes]
        return out

    def hlo_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """Each entry's HLO instruction name as a code into the array of distinct names (a program runs few
        HLO instructions many times: per-name work is then per code, not per entry)."""
        code: dict[str, int] = {}
        tables = [np.array([code.setdefault(n, len(code)) for n in st.hlo] or [0], np.int64) for st in self.streams]
        codes = np.zeros(len(self.index), np.int64)
        for s, table in enumerate(tables):
            sel = self.stream == s
            codes[sel] = table[self.index[sel]]
        names = np.empty(max(len(code), 1), dtype=object)
        names[:] = ""
        for n, c in code.items():
            names[c] = n
        return codes, names

    def text(self, entry: int) -> str:
        return self.streams[int(self.stream[entry])].text[int(self.index[entry])]

    def unit_id(self, name: str) -> int:
        return self.units.index(name)

    def busy_cycles(self, unit: str) -> int:
        """Cycles ``unit`` was occupied (union of its [start, end) intervals)."""
        sel = self.unit == self.unit_id(unit)
        spans = sorted(zip(self.start[sel].tolist(), self.end[sel].tolist()))
        total, cur_lo, cur_hi = 0, None, None
        for lo, hi in spans:
            if cur_hi is None or lo > cur_hi:
                if cur_hi is not None:
                    total += cur_hi - cur_lo
                cur_lo, cur_hi = lo, hi
            else:
                cur_hi = max(cur_hi, hi)
        if cur_hi is not None:
            total += cur_hi - cur_lo
        return total

    def rows(self) -> list[tuple[int, str, str, int, int, int]]:
        """``(start, unit, instruction text, end, bytes, flops)`` per entry: an exact timeline for tests."""
        return [
            (int(s), self.units[int(u)], self.text(i), int(e), int(b), int(f))
            for i, (s, u, e, b, f) in enumerate(zip(self.start, self.unit, self.end, self.bytes, self.flops))
        ]
