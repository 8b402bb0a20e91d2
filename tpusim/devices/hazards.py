"""The scoreboard of one core: which in-flight instructions read or write which address ranges.

An instruction must not read memory an earlier, still running instruction writes (RAW), nor write memory
one reads or writes (WAR, WAW). Compute instructions have a known end cycle when they issue, so a hazard
on one only delays the new instruction's start (its unit waits, the sequencer goes on). A DMA's end is
only known when it happens, so a hazard on an in-flight DMA stalls the sequencer until it completes.

Ranges are byte ranges ``[lo, hi)`` in a memory key: :data:`OWN` names the issuing core's own memories by
their space (so decoded instructions, shared between cores and runs, can hold their ranges); a DMA's range
in another core's or chip's memory is keyed by that memory object itself. A windowed operand is
tracked by the byte extent of its window, a conservative over-estimate. Compute entries keep the latest
end cycle per range (exact for the hazard bound, which is a maximum) and are dropped lazily once the
sequencer's clock (which never goes back) passes them; DMA entries are dropped when the transfer completes.

NOTE: speed. Each table also keeps the bounding box ``[lo, hi)`` of its ranges' addresses (of any memory); a
range outside the box overlaps none of them, so most checks scan nothing (an entry that overlaps a range
always overlaps the box, so the answers are exactly those of the full scans).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpusim.isa import Space

if TYPE_CHECKING:
    from tpusim.devices.dma import Transfer

__all__ = ["OWN", "MemoryKey", "Range", "Scoreboard", "box_of"]

Range = tuple[Any, int, int]  # (memory key, lo, hi)


class MemoryKey:
    """The scoreboard's name for one of the issuing core's own memories (hashed by identity: cheap)."""

    __slots__ = ("space",)

    def __init__(self, space: Space) -> None:
        self.space = space

    def __repr__(self) -> str:
        return f"MemoryKey({self.space.value})"


OWN: dict[Space, MemoryKey] = {s: MemoryKey(s) for s in Space}
"""Memory keys of the core's own HBM (its chip's), VMEM and SMEM."""

_PRUNE_AT = 32  # entries before dead ones (end cycle passed) are dropped
_EMPTY = (1 << 62, -1)  # an empty bounding box: no range overlaps it


class Scoreboard:
    """In-flight reads and writes of one core."""

    __slots__ = (
        "dma_reads",
        "dma_writes",
        "dmas",
        "horizon",
        "readers",
        "readers_box",
        "w_horizon",
        "writers",
        "writers_box",
    )

    def __init__(self) -> None:
        self.horizon = 0  # the latest end cycle of any compute entry
        self.w_horizon = 0  # ... of any compute entry that writes
        # Compute entries: (memory key, lo, hi) -> latest end cycle. Programs reuse buffers, so these stay small.
        self.writers: dict[Range, int] = {}
        self.readers: dict[Range, int] = {}
        self.writers_box = self.readers_box = _EMPTY  # bounding boxes (lo, hi) of the entries' addresses
        self.dmas: list[tuple[Transfer, Any, int, int, Any, int, int]] = []  # see check
        self.dma_reads = self.dma_writes = _EMPTY  # bounding boxes of the in-flight DMAs' read / write ranges

    def _clear(self) -> None:
        self.writers = {}
        self.readers = {}
        self.writers_box = self.readers_box = _EMPTY

    def _live_writers(self, t: int) -> dict[Range, int]:
        w = self.writers = {k: e for k, e in self.writers.items() if e > t}
        self.writers_box = _box(w)
        return w

    def _live_readers(self, t: int) -> dict[Range, int]:
        r = self.readers = {k: e for k, e in self.readers.items() if e > t}
        self.readers_box = _box(r)
        return r

    def check(
        self, t: int, reads: tuple[Range, ...], writes: tuple[Range, ...], box: tuple[int, int] | None = None
    ) -> tuple[int, Any]:
        """The earliest start allowed by compute hazards, and an in-flight DMA to wait for (or None).

        Args:
            t: the sequencer's clock.
            reads: ranges the new instruction reads.
            writes: ranges it writes.
            box: the bounding box of all of them, when known (tables outside it are not scanned).
        """
        need = t
        q_lo, q_hi = box if box is not None else (0, 1 << 62)
        if self.horizon <= t:
            # every compute entry has ended: nothing to scan (and nothing worth keeping)
            if self.writers or self.readers:
                self._clear()
        else:
            w = self.writers
            b_lo, b_hi = self.writers_box
            if self.w_horizon <= t or not (q_lo < b_hi and b_lo < q_hi):
                w = {}  # no writer is alive or near
            elif len(w) > _PRUNE_AT:
                w = self._live_writers(t)
            for (sp, lo, hi), end in w.items():
                if end <= need:
                    continue
                for s2, l2, h2 in reads:
                    if s2 is sp and l2 < hi and lo < h2:
                        need = end
                        break
                else:
                    for s2, l2, h2 in writes:
                        if s2 is sp and l2 < hi and lo < h2:
                            need = end
                            break
            b_lo, b_hi = self.readers_box
            if writes and q_lo < b_hi and b_lo < q_hi:
                r = self.readers
                if len(r) > _PRUNE_AT:
                    r = self._live_readers(t)
                for (sp, lo, hi), end in r.items():
                    if end <= need:
                        continue
                    for s2, l2, h2 in writes:
                        if s2 is sp and l2 < hi and lo < h2:
                            need = end
                            break
        # A DMA reads one range and writes one: (transfer, read key, lo, hi, write key, lo, hi).
        if not self.dmas:
            return need, None
        b_lo, b_hi = self.dma_writes
        c_lo, c_hi = self.dma_reads
        if not ((q_lo < b_hi and b_lo < q_hi) or (q_lo < c_hi and c_lo < q_hi)):
            return need, None
        for tr, rs, rl, rh, ws, wl, wh in self.dmas:
            for s2, l2, h2 in reads:
                if s2 is ws and l2 < wh and wl < h2:
                    return need, tr
            for s2, l2, h2 in writes:
                if (s2 is ws and l2 < wh and wl < h2) or (s2 is rs and l2 < rh and rl < h2):
                    return need, tr
        return need, None

    def check_one(self, t: int, key: Any, lo: int, hi: int, write: bool) -> tuple[int, Any]:
        """:meth:`check` for an instruction with one range ``(key, lo, hi)``, read or written.

        NOTE: speed. Most instructions touch one range; this is the same rule without the inner loops, and
        with the bounding boxes.
        """
        need = t
        if self.horizon <= t:
            if self.writers or self.readers:
                self._clear()
        else:
            b_lo, b_hi = self.writers_box
            if self.w_horizon > t and lo < b_hi and b_lo < hi:  # (else no writer is alive or near)
                w = self.writers
                if len(w) > _PRUNE_AT:
                    w = self._live_writers(t)
                for (sp, l2, h2), end in w.items():
                    if end > need and sp is key and l2 < hi and lo < h2:
                        need = end
            if write:
                b_lo, b_hi = self.readers_box
                if lo < b_hi and b_lo < hi:
                    r = self.readers
                    if len(r) > _PRUNE_AT:
                        r = self._live_readers(t)
                    for (sp, l2, h2), end in r.items():
                        if end > need and sp is key and l2 < hi and lo < h2:
                            need = end
        if self.dmas:
            b_lo, b_hi = self.dma_writes
            if write:
                c_lo, c_hi = self.dma_reads
                if (lo < b_hi and b_lo < hi) or (lo < c_hi and c_lo < hi):
                    for tr, rs, rl, rh, ws, wl, wh in self.dmas:
                        if (ws is key and wl < hi and lo < wh) or (rs is key and rl < hi and lo < rh):
                            return need, tr
            elif lo < b_hi and b_lo < hi:
                for tr, _, _, _, ws, wl, wh in self.dmas:
                    if ws is key and wl < hi and lo < wh:
                        return need, tr
        return need, None

    def check_copy(self, t: int, read: Range, write: Range) -> tuple[int, Any]:
        """:meth:`check` for a DMA: one range read, one written.

        NOTE: speed. The same rule without the loops over the ranges, and with the bounding boxes.
        """
        need = t
        rk, rlo, rhi = read
        wk, wlo, whi = write
        if self.horizon <= t:
            if self.writers or self.readers:
                self._clear()
        else:
            b_lo, b_hi = self.writers_box
            if self.w_horizon > t and ((rlo < b_hi and b_lo < rhi) or (wlo < b_hi and b_lo < whi)):
                w = self.writers
                if len(w) > _PRUNE_AT:
                    w = self._live_writers(t)
                for (sp, l2, h2), end in w.items():
                    if end > need and (
                        (sp is rk and l2 < rhi and rlo < h2) or (sp is wk and l2 < whi and wlo < h2)
                    ):  # fmt: skip
                        need = end
            b_lo, b_hi = self.readers_box
            if wlo < b_hi and b_lo < whi:
                r = self.readers
                if len(r) > _PRUNE_AT:
                    r = self._live_readers(t)
                for (sp, l2, h2), end in r.items():
                    if end > need and sp is wk and l2 < whi and wlo < h2:
                        need = end
        if self.dmas:
            b_lo, b_hi = self.dma_writes
            c_lo, c_hi = self.dma_reads
            if (rlo < b_hi and b_lo < rhi) or (wlo < b_hi and b_lo < whi) or (wlo < c_hi and c_lo < whi):
                for tr, rs, rl, rh, ws, wl, wh in self.dmas:
                    if ws is rk and wl < rhi and rlo < wh:
                        return need, tr
                    if (ws is wk and wl < whi and wlo < wh) or (rs is wk and rl < whi and wlo < rh):
                        return need, tr
        return need, None

    def add(self, reads: tuple[Range, ...], writes: tuple[Range, ...], end: int) -> None:
        """Record an issued compute instruction's ranges until cycle ``end``."""
        if end > self.horizon:
            self.horizon = end
        if writes:
            if end > self.w_horizon:
                self.w_horizon = end
            b_lo, b_hi = self.writers_box
            w = self.writers
            for k in writes:
                if w.get(k, -1) < end:
                    w[k] = end
                if k[1] < b_lo:
                    b_lo = k[1]
                if k[2] > b_hi:
                    b_hi = k[2]
            self.writers_box = (b_lo, b_hi)
        if reads:
            b_lo, b_hi = self.readers_box
            r = self.readers
            for k in reads:
                if r.get(k, -1) < end:
                    r[k] = end
                if k[1] < b_lo:
                    b_lo = k[1]
                if k[2] > b_hi:
                    b_hi = k[2]
            self.readers_box = (b_lo, b_hi)

    def add_dma(self, transfer: Any, read: Range, write: Range) -> None:
        """Record an issued DMA's source and destination ranges until :meth:`dma_done`."""
        self.dmas.append((transfer, *read, *write))
        _, lo, hi = read
        b_lo, b_hi = self.dma_reads
        if lo < b_lo or hi > b_hi:
            self.dma_reads = (lo if lo < b_lo else b_lo, hi if hi > b_hi else b_hi)
        _, lo, hi = write
        b_lo, b_hi = self.dma_writes
        if lo < b_lo or hi > b_hi:
            self.dma_writes = (lo if lo < b_lo else b_lo, hi if hi > b_hi else b_hi)

    def dma_done(self, transfer: Any) -> None:
        dmas = self.dmas
        if dmas[0][0] is transfer:  # (transfers mostly complete in order)
            e = dmas.pop(0)
        else:
            for i, e in enumerate(dmas):
                if e[0] is transfer:
                    del dmas[i]
                    break
            else:
                return
        _, _, rl, rh, _, wl, wh = e
        r_lo, r_hi = self.dma_reads
        w_lo, w_hi = self.dma_writes
        if dmas and rl != r_lo and rh != r_hi and wl != w_lo and wh != w_hi:
            return  # the boxes still bound the rest (and only a bound matters)
        r_lo = w_lo = _EMPTY[0]
        r_hi = w_hi = _EMPTY[1]
        for _, _, rl, rh, _, wl, wh in dmas:
            if rl < r_lo:
                r_lo = rl
            if rh > r_hi:
                r_hi = rh
            if wl < w_lo:
                w_lo = wl
            if wh > w_hi:
                w_hi = wh
        self.dma_reads = (r_lo, r_hi)
        self.dma_writes = (w_lo, w_hi)

    def pending_dma(self) -> Transfer | None:
        """Some in-flight DMA of this core, or None (used by barriers to drain)."""
        return self.dmas[0][0] if self.dmas else None


def box_of(ranges: tuple[Range, ...]) -> tuple[int, int]:
    """The bounding box ``(lo, hi)`` of some ranges (for :meth:`Scoreboard.check`)."""
    if not ranges:
        return _EMPTY
    return min(r[1] for r in ranges), max(r[2] for r in ranges)


def _box(table: dict[Range, int]) -> tuple[int, int]:
    """The bounding box of a table's ranges."""
    if not table:
        return _EMPTY
    return min(k[1] for k in table), max(k[2] for k in table)
