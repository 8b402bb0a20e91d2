"""The discrete-event engine: SimPy, wrapped so the rest of tpusim sees one small surface.

Time is an integer cycle count of the chip's one clock. ``events_scheduled`` reads SimPy's private event
counter; it is the one place that does, for the event-budget test (tests/test_event_budget.py).
"""

from __future__ import annotations

import copy
from typing import Any

import simpy

__all__ = ["Environment", "Event", "Timeout", "events_scheduled", "make_env"]

Environment = simpy.Environment
Event = simpy.Event  # NOTE: speed. Event(env) and Timeout(env, delay) skip env.event()'s bound-class wrapper
Timeout = simpy.Timeout


def make_env() -> simpy.Environment:
    """A fresh environment starting at cycle 0."""
    return simpy.Environment(initial_time=0)


def events_scheduled(env: Any) -> int:
    """Events scheduled in ``env`` so far (SimPy's private ``_eid`` counter; pinned to simpy 4.1).

    ``_eid`` is an ``itertools.count``; a copy yields the next id, which is the number scheduled so far.
    """
    return int(next(copy.copy(env._eid)))
