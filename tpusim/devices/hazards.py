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
"""

from __future__ import annotations

from typing import Any

from tpusim.isa import Space

__all__ = ["OWN", "MemoryKey", "Range", "Scoreboard"]

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


class Scoreboard:
    """In-flight reads and writes of one core."""

    __slots__ = ("dmas", "horizon", "readers", "w_horizon", "writers")

    def __init__(self) -> None:
        self.horizon = 0  # the latest end cycle of any compute entry
        self.w_horizon = 0  # ... of any compute entry that writes
        # Compute entries: (memory key, lo, hi) -> latest end cycle. Programs reuse buffers, so these stay small.
        self.writers: dict[Range, int] = {}
        self.readers: dict[Range, int] = {}
        self.dmas: list[tuple[Any, Any, int, int, Any, int, int]] = []  # see check

    def check(self, t: int, reads: tuple[Range, ...], writes: tuple[Range, ...]) -> tuple[int, Any]:
        """The earliest start allowed by compute hazards, and an in-flight DMA to wait for (or None).

        Args:
            t: the sequencer's clock.
            reads: ranges the new instruction reads.
            writes: ranges it writes.
        """
        need = t
        if self.horizon <= t:
            # every compute entry has ended: nothing to scan (and nothing worth keeping)
            if self.writers or self.readers:
                self.writers = {}
                self.readers = {}
        else:
            w = self.writers
            if len(w) > _PRUNE_AT:
                w = self.writers = {k: e for k, e in w.items() if e > t}
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
            if writes:
                r = self.readers
                if len(r) > _PRUNE_AT:
                    r = self.readers = {k: e for k, e in r.items() if e > t}
                for (sp, lo, hi), end in r.items():
                    if end <= need:
                        continue
                    for s2, l2, h2 in writes:
                        if s2 is sp and l2 < hi and lo < h2:
                            need = end
                            break
        # A DMA reads one range and writes one: (transfer, read key, lo, hi, write key, lo, hi).
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

        NOTE: speed. Most instructions touch one range; this is the same rule without the inner loops.
        """
        need = t
        if self.horizon <= t:
            if self.writers or self.readers:
                self.writers = {}
                self.readers = {}
        else:
            if self.w_horizon > t:  # (else every writer has ended)
                w = self.writers
                if len(w) > _PRUNE_AT:
                    w = self.writers = {k: e for k, e in w.items() if e > t}
                for (sp, l2, h2), end in w.items():
                    if end > need and sp is key and l2 < hi and lo < h2:
                        need = end
            if write:
                r = self.readers
                if len(r) > _PRUNE_AT:
                    r = self.readers = {k: e for k, e in r.items() if e > t}
                for (sp, l2, h2), end in r.items():
                    if end > need and sp is key and l2 < hi and lo < h2:
                        need = end
        if write:
            for tr, rs, rl, rh, ws, wl, wh in self.dmas:
                if (ws is key and wl < hi and lo < wh) or (rs is key and rl < hi and lo < rh):
                    return need, tr
        else:
            for tr, _, _, _, ws, wl, wh in self.dmas:
                if ws is key and wl < hi and lo < wh:
                    return need, tr
        return need, None

    def check_copy(self, t: int, read: Range, write: Range) -> tuple[int, Any]:
        """:meth:`check` for a DMA: one range read, one written.

        NOTE: speed. The same rule without the loops over the ranges.
        """
        need = t
        rk, rlo, rhi = read
        wk, wlo, whi = write
        if self.horizon <= t:
            if self.writers or self.readers:
                self.writers = {}
                self.readers = {}
        else:
            w = self.writers
            if len(w) > _PRUNE_AT:
                w = self.writers = {k: e for k, e in w.items() if e > t}
            for (sp, l2, h2), end in w.items():
                if end > need and (
                    (sp is rk and l2 < rhi and rlo < h2) or (sp is wk and l2 < whi and wlo < h2)
                ):  # fmt: skip
                    need = end
            r = self.readers
            if len(r) > _PRUNE_AT:
                r = self.readers = {k: e for k, e in r.items() if e > t}
            for (sp, l2, h2), end in r.items():
                if end > need and sp is wk and l2 < whi and wlo < h2:
                    need = end
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
        if writes and end > self.w_horizon:
            self.w_horizon = end
        w = self.writers
        for k in writes:
            if w.get(k, -1) < end:
                w[k] = end
        r = self.readers
        for k in reads:
            if r.get(k, -1) < end:
                r[k] = end

    def add_dma(self, transfer: Any, read: Range, write: Range) -> None:
        """Record an issued DMA's source and destination ranges until :meth:`dma_done`."""
        self.dmas.append((transfer, *read, *write))

    def dma_done(self, transfer: Any) -> None:
        for i, e in enumerate(self.dmas):
            if e[0] is transfer:
                del self.dmas[i]
                return

    def pending_dma(self) -> Any:
        """Some in-flight DMA of this core, or None (used by barriers to drain)."""
        return self.dmas[0][0] if self.dmas else None
