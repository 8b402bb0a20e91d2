"""DMA engines: asynchronous copies between HBM, VMEM, SMEM and remote chips, in layout terms.

Cost rule of one transfer (every symbol a config key; derivation in ``docs/model.md``):

1. It waits for one of the core's ``dma.engines`` (FIFO), or, when it names a chip (a push through the
   interconnect), for the ICI queue of its route's first link (``ici.pushes_per_link`` at once, FIFO), then
   spends ``dma.setup_cycles``.
2. Its data phase is a flow (:mod:`tpusim.devices.flows`) of ``payload`` bytes (window elements x
   element size; a whole-array copy between identical layouts moves the whole buffer, padding included)
   through: the chip's HBM for every HBM side, at ``hbm.bandwidth_bytes_per_s / clock_hz`` bytes per
   cycle, charged ``weight = burst-rounded bytes / payload`` (each contiguous run of that side occupies
   whole ``dma.burst_bytes`` bursts); the core's local port (``dma.local_bytes_per_cycle``) for a VMEM or
   SMEM side; every ICI link on the route (``ici.link_bandwidth_bytes_per_s``), and for a route between
   slices the source chip's DCN egress and the destination chip's ingress (``dcn.bandwidth_bytes_per_s``
   each). Its own rate is capped by the channels its HBM bytes spread over
   (``min(hbm.channels, ceil(bytes / hbm.interleave_bytes))`` channels of ``bandwidth / channels``) and by
   the engine's address generation: ``dma.runs_per_cycle`` runs per cycle, where a run is a maximal set of
   elements contiguous in both the source and the destination.
3. It completes ``hbm.latency_ns`` (if a side is HBM) plus ``ici.hop_latency_ns`` per hop (and
   ``dcn.latency_ns`` per crossing of the data-center network) after its last byte moved; then the bytes
   land, and the semaphores are incremented. Pushes a core issues that signal the same semaphore of the
   same chip land in the order they were issued (a later one that finishes first waits for the earlier
   ones: ICI routes are fixed and a link delivers in order), so a receiver that counts them on one
   semaphore knows which have arrived, as a ring's per-block waits need (``docs/multichip.md``).

The engine (or queue) is released when the data phase ends, so latencies of back-to-back transfers overlap.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from math import ceil, prod
from typing import TYPE_CHECKING, Any

import numpy as np

from tpusim.devices.engine import Event, Timeout
from tpusim.devices.flows import Flow, uses_arrays
from tpusim.devices.stores import read_value, write_value
from tpusim.devices.units import Access, Issued
from tpusim.isa import Reg, Space
from tpusim.memory import Shape, geometry
from tpusim.memory.windows import window_slots, window_strides

if TYPE_CHECKING:
    from tpusim.config import ChipConfig
    from tpusim.devices.core import Core
    from tpusim.devices.decode import Decoded, OperandPlan
    from tpusim.devices.flows import FlowNetwork

__all__ = [
    "DmaEngines",
    "Transfer",
    "TransferFacts",
    "TransferPlan",
    "burst_bytes",
    "flow_specs",
    "issue_dma",
    "strided_plan",
    "transfer_plan",
]


@dataclass(frozen=True, slots=True, eq=False)
class TransferPlan:
    """The layout facts of one transfer shape (cached).

    Attributes:
        payload: bytes moved.
        runs: maximal element sets contiguous in both source and destination.
        src_runs, dst_runs: ``(start, length)`` byte arrays of each side's own contiguous runs, relative to
            the array's address.
        src_slots, dst_slots: element slots in window order, None for a raw whole-buffer copy.
        byte_runs: when both sides hold the same whole-byte elements and the runs are few, the joint runs as
            bytes relative to each array's address: ``("strided", element bytes, src array bytes, dst array
            bytes, src start, dst start, count, length, src stride, dst stride)`` when they are evenly spaced,
            else ``("runs", element bytes, src array bytes, dst array bytes, src starts, dst starts,
            lengths)``; None otherwise (the copy goes element by element).
    """

    payload: int
    runs: int
    src_runs: tuple[np.ndarray, np.ndarray]
    dst_runs: tuple[np.ndarray, np.ndarray]
    src_slots: np.ndarray | None
    dst_slots: np.ndarray | None
    byte_runs: tuple[Any, ...] | None = None
    timing_only: bool = False  # from :func:`strided_plan`: costs only, no element maps to copy with
    bursts: dict[tuple[int, int, int], int] = field(default_factory=dict)  # burst bytes by side and alignment


def _side_runs(slots_sorted: np.ndarray, shape: Shape) -> tuple[np.ndarray, np.ndarray]:
    geo = geometry(shape)
    if slots_sorted.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    breaks = np.flatnonzero(np.diff(slots_sorted) != 1) + 1
    starts = slots_sorted[np.concatenate(([0], breaks))]
    lengths = np.diff(np.concatenate(([0], breaks, [slots_sorted.size])))
    bits = geo.element_bits
    return geo.prefix_bytes + starts * bits // 8, (lengths * bits + 7) // 8


@lru_cache(maxsize=1024)
def transfer_plan(
    src: Shape,
    src_off: tuple[int, ...] | None,
    dst: Shape,
    dst_off: tuple[int, ...] | None,
    sizes: tuple[int, ...],
    gap_bytes: int = 0,
) -> TransferPlan:
    """Payload, runs and element maps of copying a ``sizes`` window between two layouts.

    A run may step over padding: when the window fills the whole destination, a gap of at most ``gap_bytes``
    between two elements that is the same on both sides (padding of the destination's tiles, padding or
    other elements of the source's) is copied with the run instead of starting a new one, as a DMA engine
    moving whole bursts does (a bf16 ``T(4,128)(2,1)`` kernel of 3 input features has a padding half in every
    other word: one run per element before)."""
    if src_off is None and dst_off is None and src == dst:
        n = src.byte_size
        one = (np.zeros(1, np.int64), np.full(1, n, np.int64))
        return TransferPlan(n, 1, one, one, None, None)
    s_off = src_off if src_off is not None else (0,) * len(sizes)
    d_off = dst_off if dst_off is not None else (0,) * len(sizes)
    s = window_slots(src, s_off, sizes)
    d = window_slots(dst, d_off, sizes)
    bits = geometry(src).element_bits
    if s.size == 0:
        empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        return TransferPlan(0, 0, empty, empty, s, d)
    whole = _fills_destination(dst, dst_off, sizes)
    order = np.argsort(s, kind="stable")
    s_sorted, d_by_s = s[order], d[order]
    ds, dd = np.diff(s_sorted), np.diff(d_by_s)
    breaks = np.flatnonzero((ds != 1) | (dd != 1)) + 1
    runs = _byte_runs(src, dst, s_sorted, d_by_s, breaks)
    joint = 1 + int(breaks.size)
    if whole and gap_bytes > 0 and joint > 1:
        joint = 1 + int(np.count_nonzero((ds != dd) | ((ds - 1) * bits > 8 * gap_bytes)))
    return TransferPlan(
        ceil(s.size * bits / 8), joint, _side_runs(s_sorted, src), _side_runs(np.sort(d), dst), s, d, runs
    )


_MAX_BYTE_RUNS = 4096  # more joint runs than this copy element by element


def _byte_runs(src: Shape, dst: Shape, s_sorted: np.ndarray, d_by_s: np.ndarray, breaks: np.ndarray) -> Any:
    """:attr:`TransferPlan.byte_runs` of a window whose element slots are ``s_sorted`` and ``d_by_s``."""
    gs, gd = geometry(src), geometry(dst)
    bits = gs.element_bits
    if src.element_type != dst.element_type or bits != gd.element_bits or bits % 8 or breaks.size >= _MAX_BYTE_RUNS:
        return None
    eb = bits // 8
    first = np.concatenate(([0], breaks))
    s_at = gs.prefix_bytes + s_sorted[first] * eb
    d_at = gd.prefix_bytes + d_by_s[first] * eb
    lengths = np.diff(np.concatenate((first, [s_sorted.size]))) * eb
    return _runs_form(eb, src, dst, s_at, d_at, lengths)


def _runs_form(eb: int, src: Shape, dst: Shape, s_at: np.ndarray, d_at: np.ndarray, lengths: np.ndarray) -> Any:
    """:attr:`TransferPlan.byte_runs` of joint runs starting at byte ``s_at`` / ``d_at`` (ascending in the
    source) of ``lengths`` bytes."""
    if s_at.size > 1:
        ds, dd = np.diff(s_at), np.diff(d_at)
        if (lengths == lengths[0]).all() and (ds == ds[0]).all() and (dd == dd[0]).all() and ds[0] > 0 and dd[0] > 0:
            pattern = (int(s_at[0]), int(d_at[0]), int(s_at.size), int(lengths[0]), int(ds[0]), int(dd[0]))
            return ("strided", eb, src.byte_size, dst.byte_size, *pattern)
    return ("runs", eb, src.byte_size, dst.byte_size, s_at.tolist(), d_at.tolist(), lengths.tolist())


_MAX_STRIDED_RUNS = 1 << 16
"""A side with more runs than this is planned element by element (the closed form enumerates runs)."""


@lru_cache(maxsize=4096)
def strided_plan(
    src: Shape,
    src_off: tuple[int, ...] | None,
    dst: Shape,
    dst_off: tuple[int, ...] | None,
    sizes: tuple[int, ...],
    gap_bytes: int = 0,
) -> TransferPlan:
    """:func:`transfer_plan`'s costs (payload, joint runs, each side's runs) without element maps, from the
    windows' strided forms (:func:`~tpusim.devices.stores.window_strides`): a timing-only run needs no
    per-element arrays, and the work grows with the runs, not the elements (the d1024 decoder block spent 42 of
    its 55 s of simulation sorting the slots of 4,200 block transfers). Falls back to :func:`transfer_plan`
    where the closed form does not apply (a raw whole-buffer copy, an empty window, no strided form, digit
    systems that do not nest, too many runs)."""
    plan = (
        None
        if src_off is None and dst_off is None and src == dst
        else _closed_form(src, src_off, dst, dst_off, sizes, gap_bytes)
    )
    return plan if plan is not None else transfer_plan(src, src_off, dst, dst_off, sizes, gap_bytes)


def _closed_form(
    src: Shape,
    src_off: tuple[int, ...] | None,
    dst: Shape,
    dst_off: tuple[int, ...] | None,
    sizes: tuple[int, ...],
    gap_bytes: int,
) -> TransferPlan | None:
    """The body of :func:`strided_plan`; None where the closed form does not apply."""
    n = prod(sizes)
    bits = geometry(src).element_bits
    form = _joint_digits(src, src_off, dst, dst_off, sizes) if n else None
    if form is None or bits != geometry(dst).element_bits:
        return None
    s0, d0, radix, s_stride, d_stride = form
    # Digits from the smallest source stride: when each stride clears everything the smaller digits reach
    # (_strided_runs checks it), walking them in that order lists the elements by slot.
    order = sorted(range(len(radix)), key=lambda k: s_stride[k])
    r = [radix[k] for k in order]
    gs, gd = [s_stride[k] for k in order], [d_stride[k] for k in order]
    side_s = _strided_runs(src, s0, r, gs)
    side_d = _strided_runs(dst, d0, r, gd)
    if side_s is None or side_d is None:
        return None
    stepping = gap_bytes > 0 and _fills_destination(dst, dst_off, sizes)
    joint, inner = 1, 1
    reset_s = reset_d = 0
    for k in range(len(r)):
        # transitions that carry into digit k (resetting the smaller ones): their jumps on both sides
        jump_s, jump_d = gs[k] - reset_s, gd[k] - reset_d
        # (a run steps over a gap that is the same on both sides and at most gap_bytes when stepping)
        stepped = jump_s == jump_d and (jump_s - 1) * bits <= 8 * gap_bytes
        if not (stepped if stepping else jump_s == jump_d == 1):
            joint += n // (inner * r[k]) * (r[k] - 1)
        reset_s += (r[k] - 1) * gs[k]
        reset_d += (r[k] - 1) * gd[k]
        inner *= r[k]
    return TransferPlan(ceil(n * bits / 8), joint, side_s, side_d, None, None, None, timing_only=True)


def _fills_destination(dst: Shape, dst_off: tuple[int, ...] | None, sizes: tuple[int, ...]) -> bool:
    """The window is the whole destination array (so a run may step over equal gaps, :func:`transfer_plan`)."""
    return dst_off is None or (not any(dst_off) and sizes == dst.dimensions)


def _joint_digits(
    src: Shape, src_off: tuple[int, ...] | None, dst: Shape, dst_off: tuple[int, ...] | None, sizes: tuple[int, ...]
) -> tuple[int, int, list[int], list[int], list[int]] | None:
    """The window's elements (row-major in ``sizes``) as one mixed-radix system with a slot stride per digit
    on each side: ``(first source slot, first destination slot, radices, source strides, destination
    strides)``; None when a side has no strided form or the two digit systems do not refine to one."""
    s_off = src_off if src_off is not None else (0,) * len(sizes)
    d_off = dst_off if dst_off is not None else (0,) * len(sizes)
    a = window_strides(src, s_off, sizes)
    b = window_strides(dst, d_off, sizes)
    if a is None or b is None:
        return None
    (s0, ra, ga), (d0, rb, gb) = a, b

    def below(radices: tuple[int, ...]) -> list[int]:  # per digit (outermost first), the elements below it
        return [prod(radices[k + 1 :]) for k in range(len(radices))]

    cuts = sorted(set(below(ra)) | set(below(rb)))
    total = prod(sizes)
    if any(hi % lo for lo, hi in zip(cuts, [*cuts[1:], total])):
        return None  # boundaries that do not nest: no common digit system
    radix = [hi // lo for lo, hi in zip(cuts, [*cuts[1:], total])]

    keep = [k for k, x in enumerate(radix) if x > 1]

    def strides(radices: tuple[int, ...], gaps: tuple[int, ...]) -> list[int]:
        # the stride of each common digit: that of the side's digit containing it, times the elements below
        # it within that digit (digits of radix 1 contain nothing)
        own = [(c, g) for c, g, x in zip(below(radices), gaps, radices) if x > 1]
        out = []
        for k in keep:
            base, g = max((c, g) for c, g in own if c <= cuts[k])
            out.append(g * (cuts[k] // base))
        return out

    return s0, d0, [radix[k] for k in keep], strides(ra, ga), strides(rb, gb)


def _strided_runs(
    shape: Shape, first: int, radix: list[int], stride: list[int]
) -> tuple[np.ndarray, np.ndarray] | None:
    """One side's own contiguous runs (``(start byte, length)`` arrays, ascending) of a window whose digits have
    ``radix`` and ``stride`` (in slots) from slot ``first``: the digits whose strides continue a run make it
    longer, the others enumerate its starts. None when the strides do not nest (a digit's stride within the
    reach of the smaller ones) or there are more than :data:`_MAX_STRIDED_RUNS` starts."""
    digits = sorted(zip(stride, radix))
    reach = 0
    for g, x in digits:
        if g <= reach:
            return None
        reach += (x - 1) * g
    length, k = 1, 0
    while k < len(digits) and digits[k][0] == length:
        length *= digits[k][1]
        k += 1
    if prod(x for _, x in digits[k:]) > _MAX_STRIDED_RUNS:
        return None
    starts = np.full(1, first, np.int64)
    for g, x in digits[k:]:
        starts = np.add.outer(np.arange(x, dtype=np.int64) * g, starts).reshape(-1)
    starts.sort()
    # runs of different outer digits may still abut (a window crossing a tile boundary): join them
    head = np.flatnonzero(np.concatenate(([True], starts[1:] != starts[:-1] + length)))
    lengths = np.diff(np.append(head, starts.size)) * length
    geo = geometry(shape)
    bits = geo.element_bits
    return geo.prefix_bytes + starts[head] * bits // 8, (lengths * bits + 7) // 8


def burst_bytes(runs: tuple[np.ndarray, np.ndarray], base: int, burst: int) -> int:
    """Bytes of whole bursts the runs occupy when the array starts at ``base``."""
    starts, lengths = runs
    if starts.size == 0:
        return 0
    a = base + starts
    return int(((a + lengths + burst - 1) // burst - a // burst).sum()) * burst


class TransferFacts:
    """What a transfer of one instruction costs, by the alignment of its windows (kept across runs).

    Attributes:
        plan: the layout facts; bytes: its payload (payload: the same as a float, as the flow network counts).
        latency: cycles from the last byte moved to completion.
        uses, cap: the flow's ``(resource, weight)`` pairs and its own rate cap (:func:`flow_specs`).
        shape: :meth:`Flow.shape_of` of them.
    """

    __slots__ = ("arrays", "bytes", "cap", "latency", "payload", "plan", "port", "shape", "uses")

    def __init__(
        self, plan: TransferPlan, latency: int, uses: list[Any], cap: float, shape: tuple[float, tuple[int, ...]]
    ) -> None:
        self.arrays: tuple[Any, Any] | None = None  # uses_arrays(uses), made when a large network needs it
        self.plan = plan
        self.bytes = plan.payload
        self.payload = float(plan.payload)  # a flow's bytes left, as the network counts them
        self.latency = latency
        self.uses = uses
        self.cap = cap
        self.shape = shape
        self.port: Any = None  # a push's first link (whose ICI queue it takes); None within the chip


class Transfer(Flow):
    """One DMA in flight: its flow through the network plus what completion must do."""

    __slots__ = (
        "copy",
        "core",
        "done",
        "dst_bank",
        "dst_sem",
        "end",
        "engines",
        "event",
        "facts",
        "index",
        "issue",
        "landed",
        "order",
        "sem",
        "start",
    )

    def __init__(
        self,
        core: Core,
        index: int,
        issue: int,
        facts: TransferFacts,
        sem: int | None,
        dst_bank: Any,
        dst_sem: int | None,
        copy: tuple[Access, Access, tuple[int, int]] | None,
        engines: DmaEngines,
    ) -> None:
        # NOTE: speed. Flow's fields are set here directly (no super().__init__ call on this hot path; on_done is
        # never read, finish() is overridden).
        self.remaining = facts.payload
        self.uses = facts.uses
        self.cap = facts.cap
        self.rate = 0.0
        self.seq = 0
        self.solo, self.sig = facts.shape
        self.core = core
        self.index = index
        self.issue = issue
        self.facts = facts
        self.sem = sem  # incremented at completion on the issuing core, and dst_sem on dst_bank
        self.dst_bank = dst_bank
        self.dst_sem = dst_sem
        # (source, destination, slot shifts of the actual windows from the plan's normalized ones); None in
        # a timing-only run, when the bytes need not move
        self.copy = copy
        self.start = 0
        self.end = 0  # the completion cycle, known when the last byte moved
        self.done = False
        self.landed = False
        # the pushes this core issued to the same semaphore that have not landed, in issue order (None when
        # it signals no other core's semaphore)
        self.order: deque[Transfer] | None = None
        self.engines = engines  # the pool it holds during its data phase
        self.event: Event | None = None

    def wait_event(self) -> Event:
        """An event that fires at completion (created on demand: a transfer nobody waits for costs none)."""
        if self.event is None:
            self.event = Event(self.core.env)
        return self.event

    def resource_arrays(self) -> tuple[Any, Any]:
        """:meth:`Flow.resource_arrays`, kept on the facts that every transfer of this window shares."""
        facts = self.facts
        if facts.arrays is None:
            facts.arrays = uses_arrays(facts.uses)
        return facts.arrays

    def finish(self, now: int) -> None:
        """The flow moved its last byte at ``now``: free the engine; complete after the latency."""
        core = self.core
        engines = self.engines
        if engines.queue:
            engines.release(now)
        else:
            engines.free += 1  # (release, inlined for the common case)
        latency = self.facts.latency
        self.end = now + latency
        if latency:
            Timeout(core.env, latency).callbacks.append(self.complete)
        else:
            self.complete()

    def complete(self, _ev: Any = None) -> None:
        """The transfer arrived: it lands now, or after the earlier pushes to its semaphore (then with them)."""
        order = self.order
        if order is None:
            self.land()
            return
        self.landed = True
        while order and order[0].landed:
            tr = order.popleft()
            tr.end = self.end if tr.end < self.end else tr.end
            tr.land()

    def land(self) -> None:
        """The bytes land (numeric runs), the semaphores count, the trace records the transfer."""
        core = self.core
        if self.copy is not None:
            self.move()
        if self.sem is not None:
            core.sems.signal(self.sem, 1)
        if self.dst_sem is not None:
            self.dst_bank.signal(self.dst_sem, 1)
        self.done = True
        core.scoreboard.dma_done(self)
        core.records.extend(
            (core.stream_id, self.index, core.units.dma_unit, self.issue, self.start, self.end, self.facts.bytes, 0)
        )
        if self.event is not None:
            self.event.succeed()

    def describe(self) -> str:
        return f"DMA {self.core.text(self.index)} (instruction {self.index})"

    __str__ = describe

    def move(self) -> None:
        """Move the bytes (at completion)."""
        assert self.copy is not None
        s, d, shifts = self.copy
        p = self.facts.plan
        assert not p.timing_only, "a timing-only transfer plan has no element maps"
        if p.src_slots is None:
            d.store.write(d.address, s.store.read(s.address, p.payload))
            return
        if p.byte_runs is not None and s.store is not d.store:
            _copy_runs(s, d, shifts, p.byte_runs)
            return
        et = s.shape.element_type
        assert et.dtype is not None
        gs, gd = geometry(s.shape), geometry(d.shape)
        width = 8 * et.raw_dtype.itemsize
        if gs.element_bits == width == gd.element_bits and et.bits >= 8:
            ss, ds = shifts
            src_raw = s.store.view(s.address + gs.prefix_bytes, gs.element_slots * et.raw_dtype.itemsize)
            src_slots, dst_slots = p.src_slots, p.dst_slots
            assert dst_slots is not None
            values = src_raw.view(et.raw_dtype)[src_slots + ss if ss else src_slots]
            if d.store.values is not None:
                d.store.values.invalidate(d.lo, d.hi)
            dst_raw = d.store.view(d.address + gd.prefix_bytes, gd.element_slots * et.raw_dtype.itemsize)
            dst_raw.view(et.raw_dtype)[dst_slots + ds if ds else dst_slots] = values
            return
        sizes = s.sizes if s.sizes is not None else s.shape.dimensions
        value = read_value(s.store, s.address, s.shape, s.offsets or (0,) * len(sizes), sizes)
        write_value(d.store, d.address, d.shape, d.offsets or (0,) * len(sizes), sizes, value)


def _copy_runs(s: Access, d: Access, shifts: tuple[int, int], runs: tuple[Any, ...]) -> None:
    """Copy a plan's joint runs as bytes between two different memories (so the two views stay valid)."""
    eb, s_bytes, d_bytes = runs[1:4]
    ss, ds = shifts[0] * eb, shifts[1] * eb
    if d.store.values is not None:
        d.store.values.invalidate(d.lo, d.hi)
    dst = d.store.view(d.address, d_bytes)
    src = s.store.view(s.address, s_bytes)
    if runs[0] == "strided":
        s0, d0, n, length, s_stride, d_stride = runs[4:]
        u8 = np.uint8
        dv = np.ndarray((n, length), u8, dst, d0 + ds, (d_stride, 1))
        dv[...] = np.ndarray((n, length), u8, src, s0 + ss, (s_stride, 1))
        return
    for a, b, n in zip(*runs[4:]):
        dst[b + ds : b + ds + n] = src[a + ss : a + ss + n]


class DmaEngines:
    """A pool of DMA engines of one core: ``count`` transfers in their data phase at once, a FIFO of waiting
    ones. A core has its ``dma.engines`` for transfers within the chip, and a queue of
    ``ici.pushes_per_link`` per ICI link for pushes to other chips (so a collective's pushes never hold back
    a kernel's tile loads, nor pushes to one link those to another).

    Args:
        cfg: the chip's config (``dma.engines``, ``dma.queue_depth``, ``dma.setup_cycles``).
        network: the flow network a transfer's data phase joins.
        count: the pool's size (default ``dma.engines``).
    """

    __slots__ = ("depth", "free", "network", "queue", "setup", "space_event")

    def __init__(self, cfg: ChipConfig, network: FlowNetwork, count: int | None = None) -> None:
        self.network = network
        self.depth = cfg.dma.queue_depth
        self.free = cfg.dma.engines if count is None else count
        self.setup = cfg.dma.setup_cycles
        self.queue: list[tuple[Transfer, int]] = []
        self.space_event: Any = None

    def submit(self, tr: Transfer, ready: int) -> None:
        """Start ``tr`` on a free engine at ``ready`` (its issue cycle or later), or queue it."""
        if self.free > 0:
            self.free -= 1
            tr.start = ready
            self.network.add(tr, ready + self.setup)
        else:
            self.queue.append((tr, ready))

    def release(self, now: int) -> None:
        """An engine finished a data phase at ``now``."""
        if self.queue:
            tr, ready = self.queue.pop(0)
            tr.start = max(now, ready)
            self.network.add(tr, tr.start + self.setup)
            if self.space_event is not None:
                ev, self.space_event = self.space_event, None
                ev.succeed()
        else:
            self.free += 1


def flow_specs(
    cfg: Any,
    plan: TransferPlan,
    src_space: Space,
    src_address: int,
    dst_space: Space,
    dst_address: int,
    same_chip: bool,
) -> tuple[list[tuple[str, int, float, float]], float]:
    """The resources a transfer's two sides use, as ``(kind, side, capacity, weight)`` roles, and its own rate
    cap (payload bytes per cycle). ``kind`` is ``local`` (the DMA port of the side's core; ``side`` 0 the
    source's, 1 the destination's) or ``hbm`` (the HBM of the side's chip; both sides on one chip are one
    resource, side 0); :func:`_facts` turns roles into the resources of the chips and cores a transfer
    connects, and adds the links of its route (:meth:`Machine.route_uses`).

    The addresses are where the plan's (normalized) windows start.
    """
    payload = max(plan.payload, 1)
    roles: list[tuple[str, int, float, float]] = []
    cap = cfg.dma.runs_per_cycle * payload / max(plan.runs, 1)
    hbm_bytes: dict[int, int] = {}
    sides = ((src_space, src_address, plan.src_runs), (dst_space, dst_address, plan.dst_runs))
    burst = cfg.dma.burst_bytes
    for side, (space, address, runs) in enumerate(sides):
        if space is Space.HBM:
            # (a function of the address modulo the burst: kept on the plan, which many transfers share)
            key = (side, address % burst, burst)
            b = plan.bursts.get(key)
            if b is None:
                b = plan.bursts[key] = burst_bytes(runs, address, burst)
            chip = 0 if same_chip else side
            hbm_bytes[chip] = hbm_bytes.get(chip, 0) + b
        else:
            roles.append(("local", side, cfg.dma.local_bytes_per_cycle, 1.0))
    for chip, b in hbm_bytes.items():
        if b == 0:  # an empty array: no burst touches HBM
            continue
        weight = b / payload
        roles.append(("hbm", chip, cfg.hbm_bytes_per_cycle, weight))
        channels = min(cfg.hbm.channels, max(1, ceil(b / cfg.hbm.interleave_bytes)))
        cap = min(cap, channels * cfg.hbm_bytes_per_cycle / cfg.hbm.channels / weight)
    return roles, cap


def _facts(core: Core, d: Decoded, key: tuple[Any, ...], dst_chip: Any, dst_core: int, s_at: int, d_at: int) -> Any:
    """The :class:`TransferFacts` of a transfer of ``d`` whose windows start at ``s_at`` / ``d_at`` (their
    normalized offsets are ``key[-4]`` and ``key[-3]``).

    NOTE: speed. What does not depend on which chips and cores the transfer connects (its plan, HBM latency,
    the resources of its two sides by role, its rate cap) is worked out once per instruction and alignment
    and kept on ``d`` (:func:`_proto`); per transfer only the roles' resources and the route's links are
    looked up (a 256-chip all-reduce resolves some 230,000 transfers, most of them once)."""
    remote = dst_chip is not core.chip
    proto_key = ("proto", remote, *key[3:])
    proto = d.extra.get(proto_key)
    if proto is None:
        proto = d.extra[proto_key] = _proto(core, d, key, remote, s_at, d_at)
    plan, latency, roles, cap = proto
    machine = core.machine
    chips, cores = (core.chip.index, dst_chip.index), (core.index, dst_core)
    uses = [(machine.resource(kind, chips[side], cores[side], capacity), w) for kind, side, capacity, w in roles]
    solo, sig = Flow.shape_of(uses, cap)  # (of the sides; the route's part is kept with the route)
    if remote:
        links, network, fastest, link_ids = machine.route_uses(
            chips[0], chips[1], d.ins.route, d.ins.tie, core.pc, core
        )
        uses += links
        latency += network
        solo, sig = min(solo, fastest), sig + link_ids
        facts = TransferFacts(plan, latency, uses, cap, (solo, sig))
        facts.port = links[0][0] if links else None
        return facts
    return TransferFacts(plan, latency, uses, cap, (solo, sig))


def _proto(
    core: Core, d: Decoded, key: tuple[Any, ...], remote: bool, s_at: int, d_at: int
) -> tuple[TransferPlan, int, list[tuple[str, int, float, float]], float]:
    """``(plan, latency without the route's, roles, cap)`` of a transfer of ``d`` (roles and cap:
    :func:`flow_specs`)."""
    sp, dp = d.plans_r[0], d.plans_w[0]
    cfg = core.cfg
    sizes = sp.sizes if sp.sizes is not None else sp.dims
    # Element maps only where the bytes move (a numeric run, or a value control flow reads); costs alone else.
    planner = transfer_plan if d.numeric else strided_plan
    plan = planner(sp.shape, key[-4], dp.shape, key[-3], sizes, cfg.dma.burst_bytes)
    latency = cfg.cycles(cfg.hbm.latency_ns) if Space.HBM in (sp.space, dp.space) else 0
    roles, cap = flow_specs(cfg, plan, sp.space, s_at, dp.space, d_at, not remote)
    return plan, latency, roles, cap


def issue_dma(core: Core, d: Decoded, t: int) -> Issued:
    """Issue handler of ``dma.start`` (registered by the core).

    A transfer's facts depend only on the layouts, the windows' offsets modulo the layouts' periods and
    their alignment, and which chip and cores it connects: for transfers within a chip they are kept on the
    decoded instruction (so later runs of the program reuse them), for other chips in the run's cache (the
    route depends on the system's topology). A transfer between fixed windows of the core's own memories
    keeps its scoreboard ranges there too.
    """
    ins = d.ins
    i = core.pc
    fixed = d.extra.get(core.place) if d.static else None
    if fixed is not None:
        # NOTE: speed. Fixed windows (the common case): everything but the memories is known.
        facts, r, w, dst_core = fixed
        dst_chip = core.chip
        copy = None
        if d.numeric:
            sp, dp = d.plans_r[0], d.plans_w[0]
            src = Access(core.stores[sp.space], sp.space, sp.address, sp.shape, sp.offsets, sp.sizes, r[1], r[2])
            dst_store = dst_chip.store(dp.space, dst_core)
            dst = Access(dst_store, dp.space, dp.address, dp.shape, dp.offsets, dp.sizes, w[1], w[2])
            copy = (src, dst, _slot_shifts(sp, dp, sp.shift, dp.shift))
    else:
        facts, r, w, dst_chip, dst_core, copy = _prepare(core, d)
    sb = core.scoreboard
    need, busy = sb.check_copy(t, r, w)
    if busy is not None:
        return core.block(d, "waits for {}, which touches the same memory", busy.wait_event(), busy)
    engines = core.units.dma if ins.chip is None else core.units.ici_queue(facts.port)
    if len(engines.queue) >= engines.depth:
        if engines.space_event is None:
            engines.space_event = Event(core.env)
        return core.block(d, "waits for room in the DMA queue", engines.space_event)
    dst_bank = dst_chip.sems[dst_core] if ins.dst_sem is not None else None
    tr = Transfer(core, i, core.first_try, facts, ins.sem, dst_bank, ins.dst_sem, copy, engines)
    if dst_bank is not None:
        order = core.cache.get((dst_bank, ins.dst_sem))
        if order is None:
            order = core.cache[(dst_bank, ins.dst_sem)] = deque()
        order.append(tr)
        tr.order = order
    sb.add_dma(tr, r, w)
    ready = need if need > t else t
    if engines.free > 0:  # (engines.submit, inlined for the common case)
        engines.free -= 1
        tr.start = ready
        engines.network.add(tr, ready + engines.setup)
    else:
        engines.submit(tr, ready)
    core.pc = i + 1
    return t + 1


def _prepare(core: Core, d: Decoded) -> tuple[TransferFacts, tuple[Any, ...], tuple[Any, ...], Any, int, Any]:
    """Resolve the operands of ``d``: ``(facts, read range, write range, destination chip and core, what
    copying needs or None)``; keeps the first four on ``d`` for fixed windows into the core's memories."""
    ins = d.ins
    i = core.pc
    sp, dp = d.plans_r[0], d.plans_w[0]
    dest = core.cache.get(i) if ins.chip is None else None
    if dest is None:
        dest = _destination(core, d)
        if ins.chip is None:  # the destination never changes: resolve it once per run
            core.cache[i] = dest
    dst_chip, dst_core, dst_store, dst_key, facts_cache = dest
    s_store, s_addr, s_off, s_lo, s_hi, s_key, s_shift = core.resolve(sp, i)
    d_store, d_addr, d_off, d_lo, d_hi, d_key, d_shift = core.resolve(dp, i, dst_store)
    burst = core.cfg.dma.burst_bytes
    s_at, d_at = s_addr + s_shift, d_addr + d_shift
    key = (core.chip.index, core.index, dst_chip.index, s_key, d_key, s_at % burst, d_at % burst)
    facts = facts_cache.get(key)
    if facts is None:
        facts = facts_cache[key] = _facts(core, d, key, dst_chip, dst_core, s_at, d_at)
    r = (sp.key, s_lo, s_hi)
    w = (dst_key, d_lo, d_hi)
    if d.static and dst_key is dp.key:
        d.extra[core.place] = (facts, r, w, dst_core)
    copy = None
    if d.numeric:
        src = Access(s_store, sp.space, s_addr, sp.shape, s_off, sp.sizes, s_lo, s_hi)
        dst = Access(d_store, dp.space, d_addr, dp.shape, d_off, dp.sizes, d_lo, d_hi)
        copy = (src, dst, _slot_shifts(sp, dp, s_shift, d_shift))
    return facts, r, w, dst_chip, dst_core, copy


def _slot_shifts(sp: OperandPlan, dp: OperandPlan, s_shift: int, d_shift: int) -> tuple[int, int]:
    """The byte shifts of the actual windows from the plan's reduced ones, in slots of each side."""
    eb_s = max(1, geometry(sp.shape).element_bits // 8)
    eb_d = max(1, geometry(dp.shape).element_bits // 8)
    return s_shift // eb_s, d_shift // eb_d


def _destination(core: Core, d: Decoded) -> tuple[Any, int, Any, Any, dict[Any, TransferFacts]]:
    """``(chip, core, memory, scoreboard key, facts cache)`` of the destination of ``d``."""
    ins, i = d.ins, core.pc
    system = core.machine
    if ins.chip is None:
        dst_chip = core.chip
    else:
        c = core.regs[ins.chip.index] if isinstance(ins.chip, Reg) else ins.chip
        if not 0 <= c < len(system.chips):
            raise core.error(i, f"destination chip {c} does not exist (the system has {len(system.chips)})")
        dst_chip = system.chips[c]
    dst_core = core.index if ins.dst_core is None else ins.dst_core
    if dst_core >= core.cfg.core.count:
        raise core.error(i, f"destination core {dst_core} does not exist (the chip has {core.cfg.core.count})")
    dp = d.plans_w[0]
    store = dst_chip.store(dp.space, dst_core)
    # scoreboard ranges name the core's own memories by their space, any other memory by itself
    own = dst_chip is core.chip and (dst_core == core.index or dp.space is Space.HBM)
    if dst_chip is core.chip:
        facts = d.extra  # kept across runs
    else:
        facts = core.cache.get(("remote", i))
        if facts is None:
            facts = core.cache[("remote", i)] = {}
    return dst_chip, dst_core, store, dp.key if own else store, facts
