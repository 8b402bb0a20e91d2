"""Decoded operand values kept with a memory until a write touches their bytes.

Unpacking an operand from its tiled bytes costs as much as a small matmul, and matmul loops read the same
blocks again and again (an LHS panel for every weight column, weight tiles for every row block). A
:class:`ValueCache` belongs to one :class:`~tpusim.devices.stores.ByteStore`; it keeps the value of a window
(and forms derived from it, such as the MXU's f32 matrix) until a write overlaps the window's bytes. Every
write path of the store calls :meth:`ValueCache.invalidate`, so a cached value always equals what
:func:`~tpusim.devices.stores.read_value` would return.

Cached arrays are read-only and never alias the memory: holding one is holding a snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["CachedValue", "ValueCache"]

_PAGE_BITS = 16  # entries are indexed by the 64 KiB pages of memory their bytes touch
_LIMIT_BYTES = 64 << 20  # of cached arrays per memory (each core has its own VMEM); least recently used go first


class CachedValue:
    """One window's value (read-only) and the forms derived from it."""

    __slots__ = ("cache", "forms", "hi", "key", "lo", "nbytes", "shape", "value")

    def __init__(self, cache: ValueCache, key: Any, shape: Any, lo: int, hi: int, value: np.ndarray) -> None:
        self.cache = cache
        self.key = key
        self.shape = shape  # keeps the Shape alive, so its id in the key stays its own
        self.lo = lo
        self.hi = hi
        value.flags.writeable = False
        self.value = value
        self.forms: dict[Any, np.ndarray] = {}
        self.nbytes = value.nbytes

    def form(self, name: Any, derive: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """``derive(value)``, made once (read-only; it may be a view of the value)."""
        out = self.forms.get(name)
        if out is None:
            out = derive(self.value)
            out.flags.writeable = False
            self.forms[name] = out
            if not np.may_share_memory(out, self.value):  # (a view of the value costs nothing more)
                self.nbytes += out.nbytes
                self.cache.nbytes += out.nbytes
                self.cache.trim()
        return out


class ValueCache:
    """Values of windows of one memory, by a key that determines the value given the window's bytes."""

    __slots__ = ("entries", "nbytes", "pages")

    def __init__(self) -> None:
        self.entries: dict[Any, CachedValue] = {}  # in order of last use
        self.pages: dict[int, set[Any]] = {}  # page -> keys of the entries touching it
        self.nbytes = 0

    def get(self, key: Any) -> CachedValue | None:
        """The entry under ``key`` (marked as used), or None."""
        e = self.entries.pop(key, None)
        if e is not None:
            self.entries[key] = e
        return e

    def insert(self, key: Any, shape: Any, lo: int, hi: int, value: np.ndarray) -> CachedValue:
        """Keep ``value`` (a new array, never a view into memory) for the bytes ``[lo, hi)``."""
        e = CachedValue(self, key, shape, lo, hi, value)
        self.entries[key] = e
        for p in _page_range(lo, hi):
            self.pages.setdefault(p, set()).add(key)
        self.nbytes += e.nbytes
        self.trim()
        return e

    def trim(self) -> None:
        """Drop the least recently used entries beyond the byte limit (never the last one)."""
        while self.nbytes > _LIMIT_BYTES and len(self.entries) > 1:
            self._drop(next(iter(self.entries)))

    def invalidate(self, lo: int, hi: int) -> None:
        """Forget every value whose bytes overlap ``[lo, hi)``."""
        if not self.entries:
            return
        r = _page_range(lo, hi)
        if len(r) > len(self.entries):
            keys = [k for k, e in self.entries.items() if e.lo < hi and lo < e.hi]
        else:
            keys = []
            pages = self.pages
            entries = self.entries
            for p in r:
                for k in pages.get(p, ()):
                    e = entries[k]
                    if e.lo < hi and lo < e.hi:
                        keys.append(k)
        for k in keys:
            if k in self.entries:
                self._drop(k)

    def _drop(self, key: Any) -> None:
        e = self.entries.pop(key)
        self.nbytes -= e.nbytes
        for p in _page_range(e.lo, e.hi):
            s = self.pages[p]
            s.discard(key)
            if not s:
                del self.pages[p]


def _page_range(lo: int, hi: int) -> range:
    """Pages of ``[lo, hi)`` (an empty range belongs to the page of ``lo``)."""
    return range(lo >> _PAGE_BITS, ((hi if hi > lo else lo + 1) - 1 >> _PAGE_BITS) + 1)
