"""Layout arithmetic for data-movement lowerings: byte-identical views of an array, and what a DMA costs.

A *view* describes the same bytes as another logical shape: the dimensions permuted (the layout's
``minor_to_major`` permuted with them) and size-1 dimensions inserted as the most major physical
dimensions. The physical dimension sequence and the tiles stay the same, so :func:`tpusim.memory.pack`
gives the same bytes for the viewed array: a lowering may hand either description to a DMA or a compute
unit. ``f32[K,M]{1,0:T(8,128)}`` viewed with order ``(1, 0)`` is ``f32[M,K]{0,1:T(8,128)}``; ``f32[N]``
viewed with order ``(None, 0)`` is ``f32[1,N]`` whose new dimension is physically outermost.

DMA estimates follow the DMA engine's rule (docs/isa.md, ``dma.start``): the data phase takes at least
``bytes / (HBM bytes per cycle)`` per HBM side and ``runs / dma.runs_per_cycle``, a run being a maximal
set of elements contiguous in both the source and the destination.
"""

from __future__ import annotations

from math import prod

import numpy as np

from tpusim.compiler.lowering.registry import NotLowerable
from tpusim.config import ChipConfig
from tpusim.isa import MemRef, Space
from tpusim.memory import Shape, geometry, reinterpret

__all__ = ["DmaSide", "dma_cycles", "joint_runs", "ref_dma_cycles", "static_offsets", "view_ref", "view_shape"]

_SAMPLE_ELEMENTS = 1 << 16
"""Run counts of bigger transfers are measured on a slab of about this many elements and scaled."""


def view_shape(shape: Shape, order: tuple[int | None, ...]) -> Shape:
    """:func:`tpusim.memory.reinterpret.view_shape`, declining (NotLowerable) where no view exists."""
    try:
        return reinterpret.view_shape(shape, order)
    except reinterpret.LayoutViewError as err:
        raise NotLowerable(str(err)) from None


def view_ref(ref: MemRef, order: tuple[int | None, ...]) -> MemRef:
    """A whole-array reference seen through :func:`view_shape` (same space, same address)."""
    if ref.window is not None:
        raise ValueError("views are taken of whole arrays")
    return MemRef(ref.space, ref.address, view_shape(ref.shape, order), base=ref.base)


def _slots(shape: Shape, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> np.ndarray:
    grid = np.indices(sizes, dtype=np.int64).reshape(len(sizes), prod(sizes))  # (a scalar: one point)
    grid += np.asarray(offsets, np.int64).reshape(-1, 1)
    return geometry(shape).linear_index(grid.T)


def joint_runs(
    src: Shape, src_offsets: tuple[int, ...], dst: Shape, dst_offsets: tuple[int, ...], sizes: tuple[int, ...]
) -> int:
    """Maximal element sets contiguous in both layouts when copying a ``sizes`` window (an estimate above
    :data:`_SAMPLE_ELEMENTS` elements: measured on the first slab of the source's outer physical
    dimensions and scaled by the element count)."""
    count = prod(sizes)
    if count == 0:
        return 0
    if src == dst and src_offsets == dst_offsets and sizes == src.dimensions:
        return 1
    sample = list(sizes)
    for d in reversed(src.effective_layout.minor_to_major):  # shrink the most major dimensions first
        if prod(sample) <= _SAMPLE_ELEMENTS:
            break
        rest = prod(sample) // sample[d]
        sample[d] = max(1, _SAMPLE_ELEMENTS // max(rest, 1))
    s = _slots(src, src_offsets, tuple(sample))
    t = _slots(dst, dst_offsets, tuple(sample))
    order = np.argsort(s, kind="stable")
    s, t = s[order], t[order]
    runs = 1 + int(np.count_nonzero((np.diff(s) != 1) | (np.diff(t) != 1)))
    return -(-runs * count // prod(sample))


class DmaSide:
    """One side of a planned transfer: memory space, array shape and window offsets."""

    __slots__ = ("offsets", "shape", "space")

    def __init__(self, space: Space, shape: Shape, offsets: tuple[int, ...] | None = None) -> None:
        self.space = space
        self.shape = shape
        self.offsets = offsets if offsets is not None else (0,) * shape.rank


def static_offsets(ref: MemRef) -> tuple[int, ...] | None:
    """A window's offsets, with register offsets estimated at 0 (None: the whole array)."""
    if ref.window is None:
        return None
    return tuple(o if isinstance(o, int) else 0 for o in ref.window.offsets)


def ref_dma_cycles(config: ChipConfig, src: MemRef, dst: MemRef) -> float:
    """:func:`dma_cycles` of a DMA from ``src`` to ``dst`` (register offsets estimated at 0)."""
    sides = [DmaSide(r.space, r.shape, static_offsets(r)) for r in (src, dst)]
    return dma_cycles(config, sides[0], sides[1], tuple(src.dims))


def dma_cycles(config: ChipConfig, src: DmaSide, dst: DmaSide, sizes: tuple[int, ...]) -> float:
    """Estimated data-phase cycles of one DMA alone (setup and latency excluded): the larger of the HBM
    time of its bytes (per HBM side) and its run count over ``dma.runs_per_cycle``."""
    payload = prod(sizes) * geometry(src.shape).element_bits / 8
    hbm_sides = (src.space is Space.HBM) + (dst.space is Space.HBM)
    data = hbm_sides * payload / config.hbm_bytes_per_cycle
    local = payload / config.dma.local_bytes_per_cycle if hbm_sides < 2 else 0.0
    runs = joint_runs(src.shape, src.offsets, dst.shape, dst.offsets, sizes)
    return max(data, local, runs / config.dma.runs_per_cycle)
