"""Memories that hold real bytes, and reading / writing operand values in their exact layouts.

A :class:`ByteStore` is one memory (a chip's HBM, a core's VMEM or SMEM): a flat byte array that grows
up to its capacity as addresses are touched (a 95 GiB HBM costs only what the program uses). Addresses
come from the program; there is no allocator here. Every access is bounds-checked against the capacity.

Operand values are read and written exactly as ``tpusim.memory.pack`` lays them out. A windowed operand
goes through the element slots of its window (``Geometry.linear_index``, cached per shape and window), as
a strided numpy view of them when they form one (:func:`tpusim.memory.windows.window_strides`:
tile-aligned windows do).
"""

from __future__ import annotations

from bisect import bisect_right
from functools import lru_cache

import numpy as np

from tpusim.devices.values import CachedValue, ValueCache
from tpusim.errors import TpusimError
from tpusim.memory import Shape, geometry, pack, unpack
from tpusim.memory.packing import strided_assign
from tpusim.memory.tiling import tile_periods
from tpusim.memory.windows import window_extent, window_slots, window_strides

__all__ = [
    "Affine",
    "ByteStore",
    "MemoryAccessError",
    "affine",
    "read_value",
    "write_value",
]


WHOLE_BYTES = 256 << 20
"""Memories up to this capacity are held as one segment (see :class:`ByteStore`).

NOTE: speed. VMEM buffers are placed all over the memory; growing segments around them cost a run of the
transformer block example 32 merges, 54 MiB of zeroed copies and 12% of its run time."""


class MemoryAccessError(TpusimError):
    """An access outside a memory, or an operand that does not fit it."""


class ByteStore:
    """One memory's bytes, held in segments that exist only where the program touched the memory.

    A segment is a contiguous numpy array; touching bytes next to or across segments merges them (growing
    by doubling, so a buffer filled piece by piece costs amortized linear copying). Untouched memory reads
    as zeros. A program that places buffers far apart (a 95 GiB HBM with a buffer near its top) costs only
    the buffers. A memory of at most :data:`WHOLE_BYTES` (VMEM, SMEM) is one segment of its whole capacity
    from its first touch: the zeroed pages of a large allocation are mapped by the operating system when
    first written, so untouched ones cost address space only, and nothing is ever merged.

    Args:
        name: for messages (``hbm of chip 0``, ``vmem of chip 0 core 1``).
        capacity: bytes.
    """

    __slots__ = ("_last", "bases", "capacity", "name", "segments", "values")

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.bases: list[int] = []  # sorted segment start addresses
        self.segments: list[np.ndarray] = []  # segments[i] holds bytes bases[i] ..
        self._last: tuple[int, np.ndarray] | None = None
        self.values: ValueCache | None = None  # decoded operand values (see cached)

    @property
    def touched(self) -> int:
        """Bytes held (the sum of the segments' sizes)."""
        return sum(seg.size for seg in self.segments)

    def check(self, lo: int, hi: int) -> str | None:
        """None when ``[lo, hi)`` lies inside the memory, else a description of the problem."""
        if lo < 0 or hi > self.capacity:
            return f"bytes [{lo:#x}, {hi:#x}) fall outside {self.name} (capacity {self.capacity:#x} bytes)"
        return None

    def view(self, address: int, nbytes: int) -> np.ndarray:
        """A view of ``nbytes`` at ``address`` for reading (untouched memory reads as zeros).

        The view is valid until the next call (a later access may merge segments). Write through
        :meth:`write` or :meth:`writable`, which keep cached values (:meth:`cached`) exact.
        """
        end = address + nbytes
        last = self._last
        if last is not None and last[0] <= address and end <= last[0] + last[1].size:
            return last[1][address - last[0] : end - last[0]]
        if address < 0 or end > self.capacity:
            raise MemoryAccessError(self.check(address, end) or "")
        k = bisect_right(self.bases, address) - 1
        if k >= 0 and end <= self.bases[k] + self.segments[k].size:
            base, seg = self.bases[k], self.segments[k]
        else:
            base, seg = self._merge(address, end)
        self._last = (base, seg)
        return seg[address - base : end - base]

    def _merge(self, address: int, end: int) -> tuple[int, np.ndarray]:
        """A segment covering ``[address, end)``, absorbing every segment it overlaps.

        Segments next to it stay apart (arrays placed side by side, such as a matmul's operands, each get
        their own: touching one does not copy its neighbours)."""
        if self.capacity <= WHOLE_BYTES:
            lo, hi = 0, self.capacity
            merged = np.zeros(hi, np.uint8)
            for base, seg in zip(self.bases, self.segments):
                merged[base : base + seg.size] = seg
            self.bases[:] = [0]
            self.segments[:] = [merged]
            return lo, merged
        grain = 1 << 16
        lo = address // grain * grain
        hi = min(self.capacity, -(-end // grain) * grain)
        bases, segments = self.bases, self.segments
        k = bisect_right(bases, address) - 1
        if k >= 0 and bases[k] + segments[k].size <= address:
            lo = max(lo, bases[k] + segments[k].size)  # the segment before ends first: do not reach into it
        if k + 1 < len(bases) and bases[k + 1] >= end:
            hi = min(hi, bases[k + 1])  # nor into the next one
        first = bisect_right(bases, lo) - 1
        if first < 0 or bases[first] + segments[first].size <= lo:
            first += 1
        last = first
        while last < len(bases) and bases[last] < hi:
            last += 1
        old = list(zip(self.bases[first:last], self.segments[first:last]))
        if old:
            lo = min(lo, old[0][0])
            hi = max(hi, old[-1][0] + old[-1][1].size)
            # grow by doubling so filling a buffer piece by piece stays linear, without reaching the next one
            limit = self.bases[last] if last < len(self.bases) else self.capacity
            hi = min(max(hi, lo + 2 * sum(seg.size for _, seg in old)), limit)
        merged = np.zeros(hi - lo, np.uint8)
        for base, seg in old:
            merged[base - lo : base - lo + seg.size] = seg
        self.bases[first:last] = [lo]
        self.segments[first:last] = [merged]
        return lo, merged

    def writable(self, address: int, nbytes: int) -> np.ndarray:
        """:meth:`view` for writing: forgets the cached values the bytes hold."""
        if self.values is not None:
            self.values.invalidate(address, address + nbytes)
        return self.view(address, nbytes)

    def write(self, address: int, data: np.ndarray) -> None:
        self.writable(address, data.size)[...] = data

    def read(self, address: int, nbytes: int) -> np.ndarray:
        return self.view(address, nbytes).copy()

    def cached(
        self,
        address: int,
        shape: Shape,
        offsets: tuple[int, ...] | None,
        sizes: tuple[int, ...] | None,
        lo: int,
        hi: int,
    ) -> CachedValue:
        """:func:`read_value` of an operand whose bytes are ``[lo, hi)``, decoded once until a write touches
        them: ``.value`` (read-only) and ``.form(name, derive)`` (e.g. the MXU's f32 matrix of a bf16 block)."""
        vc = self.values
        if vc is None:
            vc = self.values = ValueCache()
        key = (address, id(shape), offsets, sizes)
        e = vc.get(key)
        if e is None:
            v = read_value(self, address, shape, offsets, sizes)
            if np.may_share_memory(v, self.view(address, shape.byte_size)):
                v = v.copy()
            e = vc.insert(key, shape, lo, hi, v)
        return e


def _window_view(raw: np.ndarray, shape: Shape, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> np.ndarray | None:
    """The window of the raw slots ``raw`` as a strided view (see :func:`window_strides`), or None."""
    form = window_strides(shape, offsets, sizes)
    if form is None:
        return None
    start, dims, strides = form
    size = raw.itemsize
    return np.ndarray(dims, raw.dtype, raw, start * size, tuple(g * size for g in strides))


class Affine:
    """Translation structure of a layout: moving a window by whole first-level tiles moves every element's
    slot by the same amount, so window facts computed at ``offsets % periods`` hold everywhere after a
    shift of ``sum((offsets // periods) * strides)`` slots.

    Attributes:
        periods: per logical dimension, the first-level tile size along it (1 for untiled dimensions).
        strides: per logical dimension, the slot shift of moving one period along it.
        element_bytes: bytes per slot.
    """

    __slots__ = ("element_bytes", "periods", "strides")

    def __init__(self, periods: tuple[int, ...], strides: tuple[int, ...], element_bytes: int) -> None:
        self.periods = periods
        self.strides = strides
        self.element_bytes = element_bytes

    def split(self, offsets: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        """``(offsets reduced by the periods, byte shift that undoes it)``: an untiled dimension's offset
        goes wholly into the shift (what ``Core.resolve`` does inline for register offsets)."""
        parts: list[int] = []
        steps = 0
        for v, period, stride in zip(offsets, self.periods, self.strides):
            q, r = (v, 0) if period == 1 else divmod(v, period)
            parts.append(r)
            steps += q * stride
        return tuple(parts), steps * self.element_bytes


@lru_cache(maxsize=1024)
def affine(shape: Shape) -> Affine | None:
    """The :class:`Affine` structure of ``shape``'s layout, or None when it has none tpusim can prove (merged
    ``*`` dimensions, sub-byte slots, tiles reaching across tiles); it is checked on sample points."""
    geo = geometry(shape)
    rank = shape.rank
    if rank == 0 or geo.element_bits % 8 or any(lvl.merges for lvl in geo.levels):
        return None
    periods = tile_periods(geo)
    dims = shape.dimensions
    origin = np.zeros((1, rank), np.int64)
    strides = []
    rng = np.random.default_rng(0)
    for d in range(rank):
        if dims[d] <= periods[d]:
            strides.append(0)
            continue
        step = np.zeros(rank, np.int64)
        step[d] = periods[d]
        g = int(geo.linear_index(origin + step)[0] - geo.linear_index(origin)[0])
        # check the shift on random points whose shifted copy stays inside the array
        pts = rng.integers(0, np.maximum(1, np.array(dims) - step), (16, rank))
        if not np.all(geo.linear_index(pts + step) - geo.linear_index(pts) == g):
            return None
        strides.append(g)
    return Affine(tuple(periods), tuple(strides), geo.element_bits // 8)


def _fast_path(shape: Shape) -> bool:
    et = shape.element_type
    assert et.dtype is not None
    return geometry(shape).element_bits == 8 * et.raw_dtype.itemsize and et.bits >= 8


def read_value(
    store: ByteStore, address: int, shape: Shape, offsets: tuple[int, ...] | None, sizes: tuple[int, ...] | None
) -> np.ndarray:
    """The value of an operand: the whole array (``offsets`` None) or a window, as a numpy array."""
    geo = geometry(shape)
    buf = store.view(address, geo.byte_size)
    if offsets is None or sizes is None:
        return unpack(buf, shape)
    et = shape.element_type
    assert et.dtype is not None
    if _fast_path(shape):
        n = geo.element_slots * et.raw_dtype.itemsize
        raw = buf[geo.prefix_bytes : geo.prefix_bytes + n].view(et.raw_dtype)
        view = _window_view(raw, shape, offsets, sizes)
        if view is not None:
            out = np.empty(sizes, raw.dtype)
            strided_assign(out.reshape(view.shape), view)
            return out.view(et.dtype)
        gathered: np.ndarray = raw[window_slots(shape, offsets, sizes)]
        return gathered.view(et.dtype).reshape(sizes)
    full = unpack(buf, shape)
    return full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))].copy()


def write_value(
    store: ByteStore,
    address: int,
    shape: Shape,
    offsets: tuple[int, ...] | None,
    sizes: tuple[int, ...] | None,
    value: np.ndarray,
) -> None:
    """Store ``value`` (exactly the operand's dimensions and dtype) into the whole array or a window.

    Writing a whole array rewrites its padding with the layout's padding value; writing a window leaves
    every other byte alone.
    """
    geo = geometry(shape)
    et = shape.element_type
    assert et.dtype is not None
    if value.dtype != et.dtype:
        raise TypeError(f"internal: writing {value.dtype} into {shape}")
    if offsets is None or sizes is None:
        pack(value, shape, out=store.writable(address, geo.byte_size))
        return
    lo, hi = window_extent(shape, offsets, sizes)
    if store.values is not None:
        store.values.invalidate(address + lo, address + hi)
    buf = store.view(address, geo.byte_size)
    if _fast_path(shape):
        n = geo.element_slots * et.raw_dtype.itemsize
        raw = buf[geo.prefix_bytes : geo.prefix_bytes + n].view(et.raw_dtype)
        bits = value.view(et.raw_dtype)
        view = _window_view(raw, shape, offsets, sizes)
        if view is not None:
            strided_assign(view, bits.reshape(view.shape))
        else:
            raw[window_slots(shape, offsets, sizes)] = bits.reshape(-1)
        return
    full = unpack(buf, shape)
    full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))] = value
    store.writable(address, geo.byte_size)[...] = pack(full, shape)
