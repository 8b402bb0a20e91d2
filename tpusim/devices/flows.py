"""Bandwidth sharing: a processor-sharing fluid model of concurrent transfers.

Every transfer is a :class:`Flow` through one or more :class:`Resource` s (a chip's HBM, a core's local DMA
port, an ICI link), each with a capacity in bytes per cycle. A flow uses ``weight`` bytes of a resource per
payload byte (more than 1 when short runs waste whole bursts). Rates are the weighted max-min fair
allocation (progressive filling), also capped per flow, recomputed whenever a flow starts or ends; a
flow's completion is rounded up to a whole cycle, where the rates are recomputed.

Events (DESIGN principle 1: a few per transfer, never one per burst or cycle): one timer at a time. When
every flow in the network crosses the same set of resources, a new flow can only slow the others down, so
a start needs no event of its own: the timer is set at the earliest possible completion (each flow at the
rate it would have alone from its start) and the starts in between are applied in order when it fires; a
timer that turns out early just sets the next one. Otherwise every start is an event, as the plain model
has it. Both give the same cycles. (Playing the known starts forward to the exact next completion saves
about 6% of the events but costs more Python time than it saves; measured.)
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from math import ceil
from typing import Any

import numpy as np

from tpusim.devices.engine import Timeout

__all__ = ["Flow", "FlowNetwork", "Resource", "resource", "uses_arrays"]

_EPS = 1e-6  # bytes: a flow with less left is finished (float rounding)
_INF = float("inf")


_CAPACITIES: list[float] = []
"""Every resource's capacity by its number (for the array filling, :func:`_rates_arrays`)."""


class Resource:
    """A shared bandwidth: ``capacity`` bytes per cycle (``number``: its place in :data:`_CAPACITIES`)."""

    __slots__ = ("capacity", "name", "number")

    def __init__(self, name: str, capacity: float) -> None:
        self.name = name
        self.capacity = capacity
        self.number = len(_CAPACITIES)
        _CAPACITIES.append(capacity)

    def __repr__(self) -> str:
        return f"Resource({self.name!r}, {self.capacity})"


_RESOURCES: dict[tuple[Any, str, float], Resource] = {}


def resource(key: Any, name: str, capacity: float) -> Resource:
    """The resource ``key`` (one object per key, name and capacity: a resource holds no state of a run, so
    facts that name resources can be kept across runs)."""
    k = (key, name, capacity)
    r = _RESOURCES.get(k)
    if r is None:
        r = _RESOURCES[k] = Resource(name, capacity)
    return r


class Flow:
    """One transfer's data phase.

    Args:
        payload: bytes to move.
        uses: ``(resource, weight)`` pairs.
        cap: the flow's own rate limit in payload bytes per cycle.
        on_done: called with the cycle the last byte moved.
    """

    __slots__ = ("arrays", "cap", "on_done", "rate", "remaining", "seq", "sig", "solo", "uses")

    def __init__(
        self,
        payload: float,
        uses: list[tuple[Resource, float]],
        cap: float,
        on_done: Callable[[int], None] | None,
        shape: tuple[float, tuple[int, ...]] | None = None,
    ) -> None:
        self.remaining = float(payload)
        self.uses = uses
        self.cap = cap
        self.on_done = on_done
        self.rate = 0.0
        self.seq = 0
        self.arrays: tuple[np.ndarray, np.ndarray] | None = None  # resource numbers and weights (made when used)
        # (rate alone, which resources it crosses); callers that start many equal flows pass it precomputed
        self.solo, self.sig = shape if shape is not None else Flow.shape_of(uses, cap)

    def resource_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The numbers of the resources the flow crosses and its weights on them, as arrays (made once)."""
        if self.arrays is None:
            self.arrays = uses_arrays(self.uses)
        return self.arrays

    def finish(self, now: int) -> None:
        """Called by the network with the cycle the last byte moved (subclasses override it)."""
        if self.on_done is not None:
            self.on_done(now)

    @staticmethod
    def shape_of(uses: list[tuple[Resource, float]], cap: float) -> tuple[float, tuple[int, ...]]:
        return min([cap] + [r.capacity / w for r, w in uses]), tuple(id(r) for r, _ in uses)


class FlowNetwork:
    """All flows of a system, advanced by one self-rescheduling timer."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.active: list[Flow] = []
        self.pending: list[tuple[int, int, Flow]] = []  # heap of (start cycle, seq, flow)
        self.last = 0  # cycle the remaining bytes and rates refer to
        self.seq = 0
        self.gen = 0
        self.timer_at: int | None = None
        self.busy = False
        self.sigs: dict[tuple[int, ...], int] = {}  # resource sets of active and pending flows -> count
        # NOTE: speed. From _MANY active flows their bytes left and rates live in arrays (the flows' own
        # attributes are stale until the count drops again): advancing, finding the finished ones and the
        # next completion are array operations, with the loops' arithmetic element by element (a 256-chip
        # all-reduce keeps ~800 flows in flight over 110,000 network events).
        self._rem: np.ndarray | None = None
        self._rate: np.ndarray | None = None
        self._parts: list[tuple[np.ndarray, np.ndarray]] = []  # (array mode) each flow's resource_arrays()

    def add(self, flow: Flow, start: int) -> None:
        """Start ``flow`` at cycle ``start`` (not before the current cycle)."""
        self.seq += 1
        flow.seq = self.seq
        sigs = self.sigs
        sigs[flow.sig] = sigs.get(flow.sig, 0) + 1
        heapq.heappush(self.pending, (start, self.seq, flow))
        if self.busy:
            return
        now = self.env.now
        if start <= now:
            self._process(now)
            return
        timer = self.timer_at
        if timer is not None and len(sigs) <= 1:
            # NOTE: speed. One resource set (see the module docstring): the new flow cannot end before it would
            # alone, so if that is not before the pending timer, the timer stands.
            last = self.last
            if (start if start > last else last) + flow.remaining / flow.solo >= timer:
                return
        self._schedule(now)

    # ------------------------------------------------------------------ internals
    def _process(self, now: int) -> None:
        """Apply the starts up to ``now`` in order, then finish the flows that are done at ``now``."""
        self.busy = True
        pending = self.pending
        try:
            while True:
                while pending and pending[0][0] <= now:
                    at = pending[0][0]
                    self._advance(at)
                    new = []
                    while pending and pending[0][0] == at:
                        new.append(heapq.heappop(pending)[2])
                    self._join(new)
                    active = self.active
                    if len(active) == 1:  # (_rates, inlined for the common case)
                        active[0].rate = active[0].solo
                    else:
                        self._rates()
                self._advance(now)
                done = self._finished()
                if not done:
                    break  # nothing done (NOTE: speed: the common case builds no lists)
                sigs = self.sigs
                for f in done:
                    n = sigs[f.sig] - 1
                    if n:
                        sigs[f.sig] = n
                    else:
                        del sigs[f.sig]
                if len(self.active) > 1:
                    self._rates()
                elif self.active:
                    self.active[0].rate = self.active[0].solo
                for f in done:
                    f.finish(now)
        finally:
            self.busy = False
        self._schedule(now)

    def _advance(self, at: int) -> None:
        """Move the active flows' bytes left to cycle ``at`` (from ``self.last``, at their rates)."""
        dt = at - self.last
        if dt > 0:
            if self._rem is not None:
                assert self._rate is not None
                self._rem -= self._rate * dt
            else:
                for f in self.active:
                    f.remaining -= f.rate * dt
            self.last = at

    def _join(self, new: list[Flow]) -> None:
        """Make ``new`` flows active (at the end, in order; their rates are set by the caller)."""
        self.active.extend(new)
        if self._rem is not None:
            assert self._rate is not None
            self._rem = np.concatenate((self._rem, [f.remaining for f in new]))
            self._rate = np.concatenate((self._rate, np.zeros(len(new))))
            self._parts.extend(f.resource_arrays() for f in new)
        elif len(self.active) >= _MANY:
            self._rem = np.array([f.remaining for f in self.active], dtype=np.float64)
            self._rate = np.array([f.rate for f in self.active], dtype=np.float64)
            self._parts = [f.resource_arrays() for f in self.active]

    def _finished(self) -> list[Flow]:
        """Take the flows done by now out of the active ones (the others keep their order); [] if none."""
        active = self.active
        rem = self._rem
        if rem is None:
            for f in active:
                if f.remaining <= _EPS:
                    break
            else:
                return []
            done = [f for f in active if f.remaining <= _EPS]
            self.active = [f for f in active if f.remaining > _EPS]
            return done
        assert self._rate is not None
        idx = np.flatnonzero(rem <= _EPS)
        if not idx.size:
            return []
        done = []
        for i in idx.tolist():
            f = active[i]
            f.remaining = float(rem[i])
            done.append(f)
        parts = self._parts
        for i in reversed(idx.tolist()):
            del active[i]
            del parts[i]
        rem, rate = np.delete(rem, idx), np.delete(self._rate, idx)
        if len(active) >= _MANY:
            self._rem, self._rate = rem, rate
        else:  # (back to the flows' own attributes)
            for f, r, x in zip(active, rem.tolist(), rate.tolist()):
                f.remaining, f.rate = r, x
            self._rem = self._rate = None
            self._parts = []
        return done

    def _rates(self) -> None:
        """Weighted max-min fair rates by progressive filling."""
        flows = self.active
        if len(flows) <= 1:
            for f in flows:
                f.rate = f.solo
            return
        if len(self.sigs) == 1:
            self._rates_shared(flows)
            if self._rem is not None:
                self._rate = np.array([f.rate for f in flows], dtype=np.float64)
            return
        if len(flows) >= _MANY:
            rates = _rates_arrays(flows, self._parts if self._rem is not None else None)
            if self._rem is not None:
                self._rate = rates
            else:
                for f, rate in zip(flows, rates.tolist()):
                    f.rate = rate
            return
        used: dict[Resource, float] = {}
        unfrozen = flows
        while unfrozen:
            wsum: dict[Resource, float] = {}
            for f in unfrozen:
                for r, w in f.uses:
                    wsum[r] = wsum.get(r, 0.0) + w
            level = min(f.cap for f in unfrozen)
            for r, s in wsum.items():
                level = min(level, (r.capacity - used.get(r, 0.0)) / s)
            level = max(level, 0.0)
            tight = {r for r, s in wsum.items() if (r.capacity - used.get(r, 0.0)) / s <= level * (1 + 1e-12)}
            rest = []
            for f in unfrozen:
                if f.cap <= level * (1 + 1e-12) or any(r in tight for r, _ in f.uses):
                    f.rate = level
                    for r, w in f.uses:
                        used[r] = used.get(r, 0.0) + level * w
                else:
                    rest.append(f)
            if len(rest) == len(unfrozen):  # no progress (cannot happen with positive capacities)
                for f in rest:
                    f.rate = level
                break
            unfrozen = rest

    @staticmethod
    def _rates_shared(flows: list[Flow]) -> None:
        """Progressive filling when every flow crosses the same resources (in the same order)."""
        left = [r.capacity for r, _ in flows[0].uses]
        idx = range(len(left))
        unfrozen = flows
        while unfrozen:
            level = _INF
            for f in unfrozen:
                if f.cap < level:
                    level = f.cap
            for i in idx:
                w = 0.0
                for f in unfrozen:
                    w += f.uses[i][1]
                x = left[i] / w
                if x < level:
                    level = x
            lim = level * (1 + 1e-12)
            capped = [f for f in unfrozen if f.cap <= lim]
            if not capped or len(capped) == len(unfrozen):
                for f in unfrozen:
                    f.rate = level
                return
            for f in capped:
                f.rate = f.cap
                for i in idx:
                    left[i] -= f.cap * f.uses[i][1]
            unfrozen = [f for f in unfrozen if f.cap > lim]

    def _schedule(self, now: int) -> None:
        t = _INF
        last = self.last
        if self._rem is not None:
            assert self._rate is not None
            moving = self._rate > 0
            if moving.any():
                t = float((last + self._rem[moving] / self._rate[moving]).min())
        else:
            for f in self.active:
                if f.rate > 0:
                    x = last + f.remaining / f.rate
                    if x < t:
                        t = x
        pending = self.pending
        if pending:
            if len(self.sigs) <= 1:
                # One resource set: starts only slow flows down; the earliest completion is bounded below by
                # each pending flow running alone from its start.
                for s, _, f in pending:
                    x = (s if s > last else last) + f.remaining / f.solo
                    if x < t:
                        t = x
            elif pending[0][0] < t:
                t = pending[0][0]
        if t == _INF:
            return
        nxt = ceil(t - 1e-9)
        if nxt < now:
            nxt = now
        timer = self.timer_at
        if timer is not None and timer <= nxt:
            return
        self.gen += 1
        self.timer_at = nxt
        Timeout(self.env, nxt - now, self.gen).callbacks.append(self._fire)

    def _fire(self, ev: Any) -> None:
        if ev.value != self.gen:
            return  # superseded by an earlier timer
        now = self.timer_at  # (the current timer fires at its cycle: env.now)
        assert now is not None
        self.timer_at = None
        self._process(now)


def uses_arrays(uses: list[tuple[Resource, float]]) -> tuple[np.ndarray, np.ndarray]:
    """``(resource numbers, weights)`` of ``(resource, weight)`` pairs."""
    return np.array([r.number for r, _ in uses], dtype=np.int64), np.array([w for _, w in uses], dtype=np.float64)


_MANY = 48
"""Flows from which :meth:`FlowNetwork._rates` fills with arrays (the per-call setup costs more below)."""


def _rates_arrays(flows: list[Flow], parts: list[tuple[np.ndarray, np.ndarray]] | None = None) -> np.ndarray:
    """:meth:`FlowNetwork._rates`'s progressive filling on arrays, with the same arithmetic in the same order
    (sums accumulate entry by entry in the flows' order, as the loop does), so the rates are equal to the bit:
    the flows' rates, in order (``parts``: their :meth:`Flow.resource_arrays`, when the caller keeps them).
    NOTE: speed; a 256-chip all-reduce has about 800 flows in flight."""
    if parts is None:
        parts = [f.resource_arrays() for f in flows]
    numbers = np.concatenate([a[0] for a in parts])
    w_ = np.concatenate([a[1] for a in parts])
    flow = np.repeat(np.arange(len(flows)), [len(a[0]) for a in parts])
    numbered, res = np.unique(numbers, return_inverse=True)
    capacity = np.array(_CAPACITIES, dtype=np.float64)[numbered]
    caps = np.array([f.cap for f in flows], dtype=np.float64)
    n_res = len(numbered)
    used = np.zeros(n_res)
    rates = np.zeros(len(flows))
    unfrozen = np.ones(len(flows), dtype=bool)
    while True:
        live = unfrozen[flow]
        r_live = res[live]
        wsum = np.bincount(r_live, weights=w_[live], minlength=n_res)
        present = np.bincount(r_live, minlength=n_res) > 0
        share = (capacity[present] - used[present]) / wsum[present]
        level = min(float(caps[unfrozen].min()), float(share.min()))
        level = max(level, 0.0)
        lim = level * (1 + 1e-12)
        tight = np.zeros(n_res, dtype=bool)
        tight[present] = share <= lim
        touches = np.zeros(len(flows), dtype=bool)
        touches[flow[live & tight[res]]] = True
        freeze = unfrozen & ((caps <= lim) | touches)
        if not freeze.any():  # no progress (cannot happen with positive capacities)
            rates[unfrozen] = level
            break
        rates[freeze] = level
        entries = freeze[flow]
        np.add.at(used, res[entries], level * w_[entries])
        unfrozen &= ~freeze
        if not unfrozen.any():
            break
    return rates
