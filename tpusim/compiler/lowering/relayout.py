"""Storing a VMEM block where its home lays the elements out differently.

A DMA between two layouts moves a run of elements contiguous in both at a time (``docs/isa.md``,
``dma.start``): between layouts that put different dimensions in the lanes (``f32[1000,128]{1,0}`` stored as
``{0,1}``) every run is one element. A kernel lays such a block out in registers instead, crossing lanes on
an XLU (``vpu.copy``), and stores whole tiles. :func:`store` takes whichever of the two is estimated cheaper.
"""

from __future__ import annotations

from dataclasses import replace

from tpusim.compiler.lowering.context import Lowering, VmemExhausted
from tpusim.compiler.lowering.views import ref_dma_cycles, static_offsets
from tpusim.isa import DmaStart, MemRef, Space, VpuCopy
from tpusim.memory import Shape, lane_dim
from tpusim.memory.windows import window_vregs

__all__ = ["store"]


def store(ctx: Lowering, src: MemRef, dst: MemRef, sem: int) -> int:
    """Write ``src`` to ``dst`` (memory references of the same dimensions, any memories and layouts); returns
    how many DMAs it started on ``sem`` (0 or 1). A block in VMEM may take the vector path: into ``dst``
    itself when it is in VMEM, else into a VMEM buffer in ``dst``'s layout that one DMA then stores."""
    if src.space is not Space.VMEM or lane_dim(src.shape) == lane_dim(dst.shape):
        ctx.emit(DmaStart, src=src, dst=dst, sem=sem)
        return 1
    cfg = ctx.config
    # (the vector copy's cost: the registers it crosses lanes for, or stores where the window is narrow)
    vregs = max(window_vregs(r.shape, static_offsets(r), tuple(r.dims), ctx.vreg_bytes) for r in (src, dst))
    crossing = vregs * cfg.xlu.transpose_cycles_per_vreg / cfg.xlu.count
    staged = None
    if dst.space is not Space.VMEM:
        like = Shape(dst.element_type, src.dims, layout=replace(dst.shape.effective_layout, memory_space=1))
        try:
            staged = ctx.vmem(like)
        except VmemExhausted:
            ctx.emit(DmaStart, src=src, dst=dst, sem=sem)
            return 1
        crossing += ref_dma_cycles(cfg, staged, dst)
    if ref_dma_cycles(cfg, src, dst) <= crossing:
        ctx.emit(DmaStart, src=src, dst=dst, sem=sem)
        return 1
    if staged is None:
        ctx.emit(VpuCopy, dst=dst, src=src)
        return 0
    ctx.emit(VpuCopy, dst=staged, src=src)
    ctx.emit(DmaStart, src=staged, dst=dst, sem=sem)
    return 1
