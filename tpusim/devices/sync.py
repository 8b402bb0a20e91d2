"""Semaphores and barriers.

A core's semaphores are counters only that core waits on; DMAs and other cores (``sem.signal`` with a
``core`` or ``chip``) increment them. A signal from the issuing core takes effect at once; one to another
core arrives at the sender's issue cycle (plus ``ici.hop_latency_ns`` per hop from another chip), via one
timed event. ``sem.wait`` is free when the count is already there, else it costs the event that wakes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpusim.devices.engine import Event
from tpusim.devices.units import Issued, handles
from tpusim.isa import Barrier, Reg, SemSignal, SemWait

if TYPE_CHECKING:
    from tpusim.devices.core import Core
    from tpusim.devices.decode import Decoded

__all__ = ["BarrierState", "Semaphores"]


class Semaphores:
    """The semaphores of one core (its main sequencer and its async sequencer share them)."""

    __slots__ = ("env", "values", "waiting")

    def __init__(self, env: Any, count: int) -> None:
        self.env = env
        self.values = [0] * count
        # (semaphore, count, event) of each sequencer's sem.wait that has to wait (at most one per sequencer)
        self.waiting: list[tuple[int, int, Any]] = []

    def signal(self, sem: int, count: int = 1) -> None:
        values = self.values
        values[sem] += count
        if self.waiting:
            for w in [w for w in self.waiting if w[0] == sem and values[sem] >= w[1]]:
                self.waiting.remove(w)
                w[2].succeed()  # (the sequencer then takes the count, or waits again if the other took it)


class BarrierState:
    """One barrier id in one scope: arrivals of the current round."""

    __slots__ = ("arrived", "event", "expected", "latest")

    def __init__(self, env: Any, expected: int) -> None:
        self.expected = expected
        self.arrived = 0
        self.latest = 0
        self.event = env.event()


def _record(core: Core, d: Decoded, start: int, end: int) -> None:
    core.records.extend((core.stream_id, d.index, core.sync_unit, core.first_try, start, end, 0, 0))


@handles(SemWait)
def issue_sem_wait(core: Core, d: Decoded, t: int) -> Issued:
    ins = d.ins
    bank = core.sems
    v = bank.values[ins.sem]
    if v >= ins.count:
        bank.values[ins.sem] = v - ins.count
        core.records.extend((core.stream_id, d.index, core.sync_unit, core.first_try, core.first_try, t + 1, 0, 0))
        core.pc = d.index + 1
        return t + 1
    ev = Event(core.env)
    bank.waiting.append((ins.sem, ins.count, ev))
    return core.block(
        d, "waits for semaphore {} to reach {} (it holds {}) and nothing left to run can signal it", ev, ins.sem,
        ins.count, v,
    )  # fmt: skip


@handles(SemSignal)
def issue_sem_signal(core: Core, d: Decoded, t: int) -> int:
    ins = d.ins
    system = core.machine
    chip_index = core.chip.index
    if ins.chip is not None:
        chip_index = core.regs[ins.chip.index] if isinstance(ins.chip, Reg) else ins.chip
        if not 0 <= chip_index < len(system.chips):
            raise core.error(d.index, f"chip {chip_index} does not exist (the system has {len(system.chips)})")
    target_core = core.index if ins.core is None else ins.core
    if target_core >= core.cfg.core.count:
        raise core.error(d.index, f"core {target_core} does not exist (the chip has {core.cfg.core.count})")
    bank = system.chips[chip_index].sems[target_core]
    if bank is core.sems and not ins.fence:
        bank.signal(ins.sem, ins.count)
    else:
        arrive = max(t, core.max_end) if ins.fence else t  # (a fenced signal leaves when the compute before it ends)
        if bank is not core.sems:
            arrive += core.cfg.network_cycles(*system.topology.crossings(core.chip.index, chip_index))
        delay = arrive - core.env.now
        if delay <= 0:
            bank.signal(ins.sem, ins.count)
        else:
            sem, count = ins.sem, ins.count
            core.env.timeout(delay).callbacks.append(lambda _ev: bank.signal(sem, count))
    _record(core, d, t, t + 1)
    core.pc = d.index + 1
    return t + 1


@handles(Barrier)
def issue_barrier(core: Core, d: Decoded, t: int) -> Issued:
    ins = d.ins
    ev = core.barrier_event
    if ev is None:
        dma = core.scoreboard.pending_dma()
        if dma is not None:
            return core.block(d, "drains before the barrier: waits for {}", dma.wait_event(), dma)
        ready = max(t, core.max_end)
        key = (ins.scope, ins.id, core.chip.index if ins.scope == "chip" else None)
        state = core.machine.barrier(key)
        state.arrived += 1
        state.latest = max(state.latest, ready)
        ev = state.event
        core.barrier_event = ev
        if state.arrived == state.expected:
            core.machine.release_barrier(key, state)
    if not ev.processed:
        return core.block(d, f"waits at barrier {ins.id} ({ins.scope}) for the other cores to arrive", ev)
    core.barrier_event = None
    end = max(t, int(ev.value))
    _record(core, d, core.first_try, end)
    core.pc = d.index + 1
    return end
