"""Hand-written ISA programs: what a compiler emits, written out by hand, to read and to benchmark with.

:func:`matmul_relu_loop_nest` is ``relu(A @ B + bias)`` as a loop nest that is not unrolled: output tiles of
``tile x tile`` and K steps of ``kstep`` rows, double-buffered DMAs of dynamic-slice windows of A and B
(addresses from scalar registers), one MXU per 128 output columns (load weights, then a matmul that
overwrites the result rows on the first K step and accumulates on later ones), pops into a VMEM tile, a VPU
epilogue (add the bias, max with 0) and a DMA of the tile to HBM.

    >>> from tpusim.devices import Chip
    >>> program = matmul_relu_loop_nest(256, tile=256)
    >>> program.instruction_count, Chip("tpu_v5e").run(program, timing_only=True).instructions
    (39, 48)
"""

from __future__ import annotations

from tpusim.isa.instructions import (
    Branch,
    DmaStart,
    Jump,
    MxuLoadWeights,
    MxuMatmul,
    MxuPop,
    ScalarAlu,
    SemWait,
    VpuMap,
)
from tpusim.isa.operands import Const, MemRef, Reg, Space, Window
from tpusim.isa.program import Program, StreamBuilder, Symbol
from tpusim.memory import Shape, element_type, parse_shape

__all__ = ["matmul_relu_loop_nest"]

_MXU_COLS = 128  # output columns per MXU (the 128x128 MXUs of TPU v4/v5)


def _array(text: str) -> Shape:
    shape = parse_shape(text)
    assert isinstance(shape, Shape)
    return shape


def matmul_relu_loop_nest(size: int, tile: int = 512, kstep: int = 128) -> Program:
    """``c = relu(a @ b + bias)`` for bf16 ``a``, ``b`` of ``[size, size]`` and f32 ``c``, ``bias[tile, tile]``
    (the bias of every output tile), as a loop nest for a chip with ``tile / 128`` MXUs of 128x128.

    Symbols: ``a``, ``b``, ``c`` in HBM and ``bias`` in VMEM. VMEM use: two A and two B buffers, the output
    tile and the bias (about 2.5 MiB for ``tile=512``).

    Raises:
        ValueError: ``size`` is not a multiple of ``tile``, or ``tile`` of ``kstep`` and 128.
    """
    if size % tile or tile % _MXU_COLS or size % kstep:
        raise ValueError(f"size {size} must be a multiple of tile {tile} and kstep {kstep}, and tile of 128")
    tiles, steps, mxus = size // tile, size // kstep, tile // _MXU_COLS
    a_s = _array(f"bf16[{size},{size}]{{1,0:T(8,128)(2,1)}}")
    c_s = _array(f"f32[{size},{size}]{{1,0:T(8,128)}}")
    a_buf = _array(f"bf16[{tile},{kstep}]{{1,0:T(8,128)(2,1)}}")
    b_buf = _array(f"bf16[{kstep},{tile}]{{1,0:T(8,128)(2,1)}}")
    out = _array(f"f32[{tile},{tile}]{{1,0:T(8,128)}}")
    a_at, b_at, c_at = 0, a_s.byte_size, 2 * a_s.byte_size
    half = max(a_buf.byte_size, b_buf.byte_size)  # the second buffer of A and of B sits this far above the first
    a_vm, b_vm = 0, 2 * half
    out_vm = 4 * half
    bias_vm = out_vm + out.byte_size
    r = Reg
    # s1 tile row, s2 tile column, s3 K step, s4 A row offset, s5 B column offset, s6 K offset, s7 next K
    # offset, s8 buffer offset of this step, s9 of the next step
    s = StreamBuilder()

    def load(k: Reg, base: Reg | None) -> None:
        s.emit(
            DmaStart(
                MemRef(Space.HBM, a_at, a_s, Window((r(4), k), (tile, kstep))),
                MemRef(Space.VMEM, a_vm, a_buf, base=base),
                sem=0,
            ),
            DmaStart(
                MemRef(Space.HBM, b_at, a_s, Window((k, r(5)), (kstep, tile))),
                MemRef(Space.VMEM, b_vm, b_buf, base=base),
                sem=0,
            ),
        )

    s.emit(ScalarAlu("mov", r(1), 0))
    s.label("rows")
    s.emit(ScalarAlu("mov", r(2), 0), ScalarAlu("mul", r(4), r(1), tile))
    s.label("cols")
    s.emit(ScalarAlu("mul", r(5), r(2), tile), ScalarAlu("mov", r(3), 0), ScalarAlu("mov", r(6), 0))
    s.emit(ScalarAlu("mov", r(8), 0))
    load(r(6), None)
    s.label("k")
    s.emit(ScalarAlu("add", r(7), r(6), kstep), ScalarAlu("xor", r(9), r(8), half))
    s.emit(Branch("ge", r(3), steps - 1, "compute"))
    load(r(7), r(9))  # the next step's operands arrive while this one computes
    s.label("compute")
    s.emit(SemWait(0, 2))
    for first in (True, False):  # the first K step overwrites the result rows, later ones accumulate
        s.label("first" if first else "accumulate")
        if first:
            s.emit(Branch("ne", r(3), 0, "accumulate"))
        for j in range(mxus):
            weights = MemRef(Space.VMEM, b_vm, b_buf, Window((0, _MXU_COLS * j), (kstep, _MXU_COLS)), base=r(8))
            s.emit(MxuLoadWeights(j, weights))
            s.emit(MxuMatmul(j, MemRef(Space.VMEM, a_vm, a_buf, base=r(8)), acc=0, accumulate=not first))
        if first:
            s.emit(Jump("next"))
    s.label("next")
    s.emit(ScalarAlu("add", r(3), r(3), 1), ScalarAlu("mov", r(6), r(7)), ScalarAlu("mov", r(8), r(9)))
    s.emit(Branch("lt", r(3), steps, "k"))
    tile_ref = MemRef(Space.VMEM, out_vm, out)
    for j in range(mxus):
        s.emit(MxuPop(j, MemRef(Space.VMEM, out_vm, out, Window((0, _MXU_COLS * j), (tile, _MXU_COLS)))))
    s.emit(
        VpuMap("add", tile_ref, (tile_ref, MemRef(Space.VMEM, bias_vm, out))),
        VpuMap("maximum", tile_ref, (tile_ref, Const(0.0, element_type("f32")))),
        DmaStart(tile_ref, MemRef(Space.HBM, c_at, c_s, Window((r(4), r(5)), (tile, tile))), sem=1),
    )
    s.emit(ScalarAlu("add", r(2), r(2), 1), Branch("lt", r(2), tiles, "cols"))
    s.emit(ScalarAlu("add", r(1), r(1), 1), Branch("lt", r(1), tiles, "rows"))
    s.emit(SemWait(1, tiles * tiles))
    symbols = (
        Symbol("a", MemRef(Space.HBM, a_at, a_s)),
        Symbol("b", MemRef(Space.HBM, b_at, a_s)),
        Symbol("c", MemRef(Space.HBM, c_at, c_s)),
        Symbol("bias", MemRef(Space.VMEM, bias_vm, out)),
    )
    return Program((s.build(),), symbols, name=f"relu(A@B+bias) {size}^3")
