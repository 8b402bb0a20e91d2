"""Waits for synchronous DMAs moved down to where their data is needed.

Many lowerings move data with ``dma.start ...; sem.wait`` (a slice, a dynamic slice, a copy): a wait right
after the DMAs it counts. Consecutive such moves then pay their latencies one after the other (a scan body's
dynamic slices of its stacked inputs: an HBM latency each, in series), where a kernel writer has them in
flight together. This pass defers such a wait until an instruction touches one of its DMAs' destinations
(or writes a source), or until the straight-line region ends (a label, a branch, a jump, a halt, a barrier
or a signal, which may announce the data).

A semaphore only counts completions, so a deferred wait stands for every DMA outstanding on its semaphore:
it is deferred only when it drains the semaphore (its count is all the DMAs started on it since the region
began or the semaphore last drained) right after them. The DMAs of later synchronous moves on the semaphore
join it, and when it is emitted it waits for all of them; the program's own waits for those are then
reduced by what was already waited for (dropped when nothing is left). Any other DMA on the semaphore (a
kernel's prefetch, whose wait comes later) emits the deferred wait first, so it never waits for a prefetch.
Semaphores another core or chip signals (any ``sem.signal`` or DMA ``dst_sem`` in the stream), and those a
region waits on before it starts a DMA on them, are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tpusim.compiler.verify import accesses
from tpusim.isa import Barrier, Branch, DmaStart, Halt, Jump, MemRef, ScalarAlu, ScalarLoad, SemSignal, SemWait, Stream

__all__ = ["sink_waits"]

_STOPS = (Barrier, Branch, Halt, Jump, SemSignal)


@dataclass
class _Deferred:
    """The waits deferred on one semaphore: how many completions they owe, the DMAs they cover, and the first
    deferred wait (its HLO name and control flag go to the wait emitted for them)."""

    first: SemWait
    count: int = 0
    dmas: list[DmaStart] = field(default_factory=list)


def sink_waits(stream: Stream) -> Stream:
    """``stream`` with the waits of synchronous DMAs deferred as the module docstring says."""
    ins = stream.instructions
    remote = {i.sem for i in ins if isinstance(i, SemSignal)} | {
        i.dst_sem for i in ins if isinstance(i, DmaStart) and i.dst_sem is not None
    }
    draining = _draining_waits(stream, remote)
    if not draining:
        return stream
    joining = {at for dmas in draining.values() for at, _ in dmas}  # (the DMAs of synchronous moves)
    names: dict[int, list[str]] = {}
    for name, index in stream.labels:
        names.setdefault(index, []).append(name)
    out: list[Any] = []
    labels: list[tuple[str, int]] = []
    deferred: dict[int, _Deferred] = {}
    prepaid: dict[int, int] = {}  # completions already waited for ahead of the program's own waits

    def flush(sem: int) -> None:
        d = deferred.pop(sem)
        if d.count:
            out.append(replace(d.first, count=d.count))

    candidates = sorted(draining)
    following = 0  # the first candidate at or after k
    k = 0
    while k < len(ins):
        if not deferred and not any(prepaid.values()):
            # nothing is deferred or owed: up to the next candidate wait the stream is copied as it is
            while following < len(candidates) and candidates[following] < k:
                following += 1
            end = candidates[following] if following < len(candidates) else len(ins)
            if end > k:
                shift = len(out) - k
                labels += [(name, at + shift) for at in range(k, end) for name in names.get(at, ())]
                out += ins[k:end]
                k = end
                continue
        x = ins[k]
        k += 1
        if k - 1 in names or isinstance(x, _STOPS):
            for sem in list(deferred):
                flush(sem)
            prepaid.clear()  # (every semaphore is settled here: the program verifier's rule)
        at = k - 1
        labels += [(name, len(out)) for name in names.get(at, ())]
        if isinstance(x, SemWait) and (at in draining or x.sem in deferred or prepaid.get(x.sem)):
            paid = min(x.count, prepaid.get(x.sem, 0))
            prepaid[x.sem] = prepaid.get(x.sem, 0) - paid
            owed = x.count - paid
            if at in draining:
                d = deferred.setdefault(x.sem, _Deferred(x))
                d.count += owed
                d.dmas += [dma for _, dma in draining[at]]
            else:
                if x.sem in deferred:
                    flush(x.sem)
                if owed:
                    out.append(replace(x, count=owed))
            continue
        if deferred and not isinstance(x, SemWait):
            reads, writes, _, _ = accesses(x)
            for sem in list(deferred):
                d = deferred[sem]
                if _overlap([m.dst for m in d.dmas], reads + writes) or _overlap([m.src for m in d.dmas], writes):
                    flush(sem)
        if isinstance(x, DmaStart) and x.sem in deferred:
            if at in joining:  # another synchronous move: joins the deferred wait, which drains them all
                deferred[x.sem].dmas.append(x)
                deferred[x.sem].count += 1
                prepaid[x.sem] = prepaid.get(x.sem, 0) + 1
            else:  # (a prefetch whose wait comes later: the deferred wait must not wait for it too)
                flush(x.sem)
        out.append(x)
    for sem in list(deferred):
        flush(sem)
    labels += [(name, len(out)) for name in names.get(len(ins), ())]
    return Stream(stream.core, tuple(out), tuple(labels), stream.chip, stream.sequencer)


def _draining_waits(stream: Stream, remote: set[int]) -> dict[int, list[tuple[int, DmaStart]]]:
    """Index of every wait that drains its semaphore right after the local DMAs it counts (only scalar address
    arithmetic and other DMAs between them: a synchronous move) -> those DMAs, with their indices."""
    bounds = {index for _, index in stream.labels}
    out: dict[int, list[tuple[int, DmaStart]]] = {}
    outstanding: dict[int, list[tuple[int, DmaStart]]] = {}
    untracked: set[int] = set(remote)
    for k, x in enumerate(stream.instructions):
        if k in bounds or isinstance(x, _STOPS):
            outstanding.clear()
            untracked = set(remote)
        if isinstance(x, DmaStart) and x.sem is not None and x.sem not in untracked:
            local = x.chip is None and x.dst_sem is None and x.dst_core is None
            if local:
                outstanding.setdefault(x.sem, []).append((k, x))
            else:
                untracked.add(x.sem)
        elif isinstance(x, SemWait) and x.sem not in untracked:
            pending = outstanding.get(x.sem, [])
            if x.count == len(pending) and pending and _adjacent(stream, pending[0][0], k):
                out[k] = list(pending)
                outstanding[x.sem] = []
            elif x.count == len(pending):
                outstanding[x.sem] = []  # (drained, but not right after its DMAs: stays where it is)
            else:
                untracked.add(x.sem)  # (waited before any DMA here, or part of them: which ones is unknown)
    return out


def _adjacent(stream: Stream, first: int, wait: int) -> bool:
    """Whether only DMAs and scalar address arithmetic lie between the DMA at ``first`` and the wait."""
    return all(isinstance(x, (DmaStart, ScalarAlu, ScalarLoad)) for x in stream.instructions[first + 1 : wait])


def _overlap(pending: list[MemRef], refs: list[MemRef]) -> bool:
    """Whether any of ``refs`` may touch bytes of a pending DMA's array (whole arrays; any ``base`` register
    makes the address unknown)."""
    for p in pending:
        for r in refs:
            if p.space is not r.space:
                continue
            if p.base is not None or r.base is not None or p.shares_bytes(r):
                return True
    return False
