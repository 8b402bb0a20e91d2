"""Ops on the bits of values: bitcast-convert (moves bytes) and reduce-precision (VPU integer ops on a view).

**bitcast-convert** (XLA: reinterpret each element's bits). Same width: when the two layouts hold the
elements at the same bytes, buffer assignment gives the result the operand's buffer and nothing runs;
otherwise one DMA copies the operand, seen with the result's element type (the same bytes), into the result's
layout. Different widths: each wide element is ``k`` narrow ones along a new minor dimension, least
significant first (little-endian, as the reference and TPUs give), which is exactly how the two arrays'
untiled row-major bytes line up; so two DMAs go through a row-major HBM scratch buffer. Sub-byte, pred and
complex element types are declined (they fall back).

**reduce-precision** runs in a fusion like any elementwise op: :func:`emit_reduce_precision` is its
vector emitter (``elementwise._EMITTERS``). A VMEM block of f32 (bf16, f16) values seen as u32 (u16) holds
the same bytes, so the rounding is integer VPU work on that view, one ``vpu.fused`` chain (XLA's
``EmitReducePrecisionIR``, as the reference ``tpusim.semantics.convert.reduce_precision``):
round the mantissa to nearest even by adding a bias and masking; send exponents above the reduced range to
inf and below it to signed zero; keep NaNs.
"""

from __future__ import annotations

from typing import Any

from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.lowering.context import Lowering
from tpusim.compiler.lowering.indexed import row_major, take_semaphores
from tpusim.compiler.lowering.registry import NotLowerable, lowering
from tpusim.isa import Const, DmaStart, FusedOp, MemRef, Operand, SemWait, Space, VpuCopy, VpuFused
from tpusim.memory import ElementType, Shape, element_type

__all__ = ["emit_reduce_precision", "lower_bitcast_convert"]


def _bit_type_ok(et: ElementType) -> bool:
    return et.dtype is not None and not et.is_complex and et.name != "pred" and et.bits >= 8


@lowering("bitcast-convert")
def lower_bitcast_convert(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    src, dst = ctx.home(comp.name, instr.operands[0]), ctx.home(comp.name, instr.name)
    if ctx.buffers.buffer(comp.name, instr.operands[0]).id == ctx.buffers.buffer(comp.name, instr.name).id:
        return  # buffer assignment found the bytes agree: the result is the operand's buffer
    a, b = src.element_type, dst.element_type
    if not (_bit_type_ok(a) and _bit_type_ok(b)):
        raise NotLowerable(f"a bitcast-convert from {a} to {b} (pred, complex and sub-byte types are not moved)")
    if src.shape.element_count == 0:
        return
    (sem,) = take_semaphores(ctx, 1)
    if a.bits == b.bits:
        seen = Shape(b, src.shape.dimensions, layout=src.shape.layout)  # the same bytes, typed as the result
        ctx.emit(DmaStart, src=MemRef(src.space, src.address, seen, base=src.base), dst=dst, sem=sem)
        ctx.emit(SemWait, sem=sem, count=1)
        return
    flat_src, flat_dst = row_major(src.shape), row_major(dst.shape)
    if flat_src.byte_size != flat_dst.byte_size:
        raise NotLowerable(f"{src.shape} and {dst.shape} differ in size")
    scratch = ctx.scratch(flat_src)
    ctx.emit(DmaStart, src=src, dst=scratch, sem=sem)
    ctx.emit(SemWait, sem=sem, count=1)
    ctx.emit(DmaStart, src=MemRef(Space.HBM, scratch.address, flat_dst), dst=dst, sem=sem)
    ctx.emit(SemWait, sem=sem, count=1)


_FORMATS = {"f32": (8, 23, "u32"), "bf16": (8, 7, "u16"), "f16": (5, 10, "u16")}
"""Float type -> (exponent bits, mantissa bits, the unsigned type of its width)."""


def _as(ref: MemRef, et: ElementType) -> MemRef:
    """The same bytes typed ``et`` (equal width)."""
    shape = Shape(et, ref.shape.dimensions, layout=ref.shape.layout)
    return MemRef(ref.space, ref.address, shape, ref.window, ref.base)


def reduce_precision_steps(
    float_type: str, exponent_bits: int, mantissa_bits: int
) -> tuple[list[int], list[tuple[str, str, tuple[int, ...], str | None]]]:
    """The ``vpu.fused`` chain of reduce-precision on a ``float_type`` value.

    Returns:
        ``(constants, steps)``: the chain's sources are ``[bits, value, *constants]`` (the block seen as the
        unsigned type, then as the float type); ``steps`` are ``(fn, type name, args, direction)``.
    """
    src_exp, src_mant, ut = _FORMATS[float_type]
    nbits = element_type(ut).bits
    mask = (1 << nbits) - 1
    consts: list[int] = []
    ops: list[tuple[str, str, tuple[tuple[str, int], ...], str | None]] = []
    bits: tuple[str, int] = ("src", 0)
    value: tuple[str, int] = ("src", 1)

    def op(fn: str, etype: str, *args: tuple[str, int], direction: str | None = None) -> tuple[str, int]:
        ops.append((fn, etype, args, direction))
        return ("step", len(ops) - 1)

    def c(v: int) -> tuple[str, int]:
        consts.append(v & mask)
        return ("const", len(consts) - 1)

    r = bits
    if mantissa_bits < src_mant:
        drop = src_mant - mantissa_bits
        last_kept = 1 << drop
        t = op("shift-right-logical", ut, r, c(drop))
        t = op("and", ut, t, c(1))
        t = op("add", ut, t, c((last_kept >> 1) - 1))
        r = op("add", ut, r, t)
        r = op("and", ut, r, c(~(last_kept - 1)))
    if exponent_bits < src_exp:
        exp_mask = ((1 << src_exp) - 1) << src_mant
        src_bias = (1 << (src_exp - 1)) - 1
        new_bias = (1 << (exponent_bits - 1)) - 1
        exponent = op("and", ut, r, c(exp_mask))
        signed_zero = op("and", ut, r, c(1 << (nbits - 1)))
        over = op("compare", "pred", exponent, c((src_bias + new_bias) << src_mant), direction="GT")
        under = op("compare", "pred", exponent, c((src_bias - new_bias) << src_mant), direction="LE")
        inf = op("or", ut, signed_zero, c(exp_mask))
        r = op("select", ut, over, inf, r)
        r = op("select", ut, under, signed_zero, r)
    nan = op("compare", "pred", value, value, direction="NE")
    r = op("select", ut, nan, bits, r)

    def number(v: tuple[str, int]) -> int:
        kind, i = v
        return i if kind == "src" else 2 + i if kind == "const" else 2 + len(consts) + i

    out = [(fn, et, tuple(number(a) for a in args), d) for fn, et, args, d in ops]
    return consts, out


def emit_reduce_precision(em: Any, instr: Instruction, dst: MemRef, srcs: list[Operand], start: int) -> None:
    """The vector emitter of reduce-precision (see the module docstring)."""
    et = dst.element_type
    if et.name not in _FORMATS:
        raise NotLowerable(f"reduce-precision of {et} on the VPU (f32, bf16 and f16 are rounded as integers)")
    e, m = int(instr.attr("exponent_bits")), int(instr.attr("mantissa_bits"))
    src = em.operand_ref(srcs[0], instr.operands[0])
    src_exp, src_mant, ut_name = _FORMATS[et.name]
    ut = element_type(ut_name)
    if m >= src_mant and e >= src_exp:
        em.ctx.emit(VpuCopy, dst=dst, src=src)
        return
    consts, steps = reduce_precision_steps(et.name, e, m)
    sources = (_as(src, ut), src, *(Const(v, ut) for v in consts))
    ops = tuple(FusedOp(fn=fn, etype=element_type(t), args=args, direction=d) for fn, t, args, d in steps)
    em.ctx.emit(VpuFused, dst=_as(dst, ut), srcs=sources, ops=ops)
