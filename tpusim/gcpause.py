"""Pausing Python's cyclic garbage collector while a phase builds many long-lived objects.

Parsing, compiling and decoding a large program each allocate hundreds of thousands of small objects that
live for the whole run and form no reference cycles. The collector would rescan the growing heap again and
again (its full collections grow with the number of live objects): for the 4-layer d1024 decoder it cost
about a quarter of the compile and decode time. The simulation likewise keeps every trace record and
transfer fact to the end of the run (full collections were 40% of a 256-chip all-reduce). Objects those
phases drop are still freed at once by reference counting; only cycles wait for the collector, which runs
again when the phase ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_gc"]


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside the block (re-enabled after it only if it was enabled before, so
    nested phases and a caller's own ``gc.disable()`` are respected)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
