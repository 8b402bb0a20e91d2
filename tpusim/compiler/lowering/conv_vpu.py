"""The weight gradient of a depthwise convolution on the VPU: a convolution whose batch groups each hold one
input batch element and give one output feature (``batch_group_count`` = batch = output features; JAX's
gradient of a depthwise ``feature_group_count = C`` convolution with respect to its kernel).

Each output element ``out[o..., g] = sum_k sum_t lhs[k, o + t - pad, g] * rhs[k, t, g]`` multiplies a window
of one channel of the input by the same channel of the output gradient, summed over the batch and the
positions: no channel is contracted, so an MXU pass would multiply one column (the im2col lowering of
:mod:`.conv` spent 380,000 cycles on the 5x5 filter gradient of a [4,24,24,64] input, where XLA:TPU
estimates 5,300). Here the channels lie in the lanes: per chunk of the contracted batch ``k``, the input's
padded region and the gradient are staged in VMEM (zero padding; the next chunk loads while this one
computes), and for each output position one ``vpu.fused`` multiplies the input's window at that position
by the gradient (in f32) and one ``vpu.reduce`` sums it over the batch and the window into the position's
row of an f32 accumulator (adding to the previous chunks'). f32 operands at one bf16 pass (XLA's DEFAULT on
TPU) are rounded to bf16 first, as the MXU would round them. The accumulator goes out converted to the
result's type. A dilated window (the filter gradient of a strided convolution: ``rhs_dilate`` = its
stride) is gathered by a strided copy first. Declined (the MXU lowering runs): strides, base dilation,
reversal, feature groups, other types than f32 and bf16, and more output positions than
:data:`MAX_POSITIONS`.
"""

from __future__ import annotations

from itertools import product
from math import prod

from tpusim.compiler.hlo.ir import Computation, ConvDims, Instruction
from tpusim.compiler.lowering.context import Lowering, VmemExhausted
from tpusim.compiler.lowering.dot import matmul_precision
from tpusim.compiler.lowering.staging import Inbound, Outbound, Rows
from tpusim.compiler.lowering.windowed import MAX_TAPS
from tpusim.isa import Const, FusedOp, MemRef, SemWait, VpuCopy, VpuFused, VpuReduce, Window
from tpusim.memory import element_type

__all__ = ["MAX_POSITIONS", "lower_filter_gradient"]

MAX_POSITIONS = MAX_TAPS
"""Most output positions (two VPU instructions each per chunk, as a reduce-window's taps)."""

_F32, _BF16 = element_type("f32"), element_type("bf16")


def lower_filter_gradient(ctx: Lowering, comp: Computation, instr: Instruction, lhs: MemRef, rhs: MemRef,
                          out: MemRef) -> bool:  # fmt: skip
    """Emit ``instr`` on the VPU when it is a depthwise filter gradient (module docstring); False otherwise."""
    dims, window = instr.attr("dim_labels"), instr.attr("window")
    groups = int(instr.attr("batch_group_count", 1))
    if (
        not isinstance(dims, ConvDims)
        or window is None
        or groups == 1
        or int(instr.attr("feature_group_count", 1)) != 1
    ):
        return False
    ls, rs, os = lhs.shape.dimensions, rhs.shape.dimensions, out.shape.dimensions
    k = ls[dims.input_feature]
    if (
        ls[dims.input_batch] != groups
        or rs[dims.kernel_output_feature] != groups
        or os[dims.output_feature] != groups
        or os[dims.output_batch] != 1
        or rs[dims.kernel_input_feature] != k
    ):
        return False
    if any(d.stride != 1 or d.lhs_dilate != 1 or d.reversal for d in window.dims):
        return False
    types = {lhs.element_type.name, rhs.element_type.name, out.element_type.name}
    positions = [os[d] for d in dims.output_spatial]
    if not types <= {"f32", "bf16"} or prod(positions) > MAX_POSITIONS:
        return False
    # f32 operands at one bf16 pass (XLA's DEFAULT on TPU) are rounded to bf16 first, as the MXU would
    one_pass = "f32" in types and matmul_precision(instr, ctx.options.matmul_precision, "f32") == "bf16"
    taps = [(d.pad_low, d.size, d.rhs_dilate) for d in window.dims]
    gradient = _FilterGradient(ctx, dims, taps, lhs, rhs, out, k, positions, one_pass)
    chunk = k
    mark = ctx.checkpoint()
    while True:  # the contracted batch in chunks that fit VMEM, halved until one does
        try:
            gradient.emit(chunk)
            return True
        except VmemExhausted:
            ctx.rollback(mark)
            if chunk == 1:
                return False
            chunk = max(1, chunk // 2)


class _FilterGradient:
    def __init__(
        self,
        ctx: Lowering,
        dims: ConvDims,
        taps: list[tuple[int, int, int]],
        lhs: MemRef,
        rhs: MemRef,
        out: MemRef,
        k: int,
        positions: list[int],
        one_pass: bool,
    ) -> None:
        self.ctx, self.dims, self.taps, self.lhs, self.rhs, self.out = ctx, dims, taps, lhs, rhs, out
        self.k, self.positions = k, positions
        # per operand (value 0 and 1 of the fused chain): bf16 then f32, or f32
        rounded = [one_pass and ref.element_type.name == "f32" for ref in (lhs, rhs)]
        steps: list[FusedOp] = []
        for value, narrow in enumerate(rounded):
            if narrow:
                steps.append(FusedOp("convert", _BF16, (value,)))
                value = 1 + len(steps)
            steps.append(FusedOp("convert", _F32, (value,)))
        wide = [i + 2 for i, st in enumerate(steps) if st.etype == _F32]  # (the two f32 operands)
        steps.append(FusedOp("multiply", _F32, (wide[0], wide[1])))
        self.steps = tuple(steps)
        lanes = ctx.config.vpu.lanes
        self.groups = lhs.shape.dimensions[dims.input_batch]
        self.spatial = [lhs.shape.dimensions[d] for d in dims.input_spatial]
        # canonical orders: [k, spatial..., g] for both operands, [1, positions..., g] for the result
        self.lhs_order = (dims.input_feature, *dims.input_spatial, dims.input_batch)
        self.rhs_order = (dims.kernel_input_feature, *dims.kernel_spatial, dims.kernel_output_feature)
        self.out_order = (dims.output_batch, *dims.output_spatial, dims.output_feature)
        self.rows_l, self.rows_r = Rows(lhs.element_type, lanes), Rows(rhs.element_type, lanes)
        self.acc_rows = Rows(_F32, lanes)

    def emit(self, chunk: int) -> None:
        ctx = self.ctx
        sizes = [t for _, t, _ in self.taps]
        spans = [(t - 1) * d + 1 for _, t, d in self.taps]  # a window's extent in the input
        strides = [d for _, _, d in self.taps]
        padded = [p + n - 1 for p, n in zip(self.positions, spans)]  # (the padded input the windows cover)
        outbound = Outbound(ctx, self.out, self.acc_rows, self.out_order, [1, *self.positions, self.groups])
        staged_l = Inbound(ctx, self.lhs, self.rows_l, self.lhs_order, [chunk, *padded, self.groups],
                           [chunk, *self.spatial, self.groups])  # fmt: skip
        staged_r = Inbound(ctx, self.rhs, self.rows_r, self.rhs_order, [chunk, *sizes, self.groups],
                           [chunk, *sizes, self.groups])  # fmt: skip
        products = ctx.vmem(self.acc_rows.shape([chunk, *sizes, self.groups]))
        acc = outbound.blocks[0]
        rows = self.acc_rows.ref(acc, [prod(self.positions), self.groups])  # (the accumulator, a row per position)
        starts = list(range(0, self.k, chunk))
        sems = [ctx.semaphore(), ctx.semaphore()]
        # per spatial dimension, the input's part inside the padded region (negative padding crops it) and
        # where that part sits in the region; the rest of the region is zeros
        inside = [(max(0, -lo), max(0, min(e, lo + n) - max(0, lo)), max(0, lo))
                  for (lo, _, _), n, e in zip(self.taps, self.spatial, padded)]  # fmt: skip
        padding = any(at > 0 or at + m < e for (_, m, at), e in zip(inside, padded))
        fill = Const(0, self.lhs.element_type) if padding else None
        # a dilated window (the filter gradient of a strided convolution) is gathered into a block first
        gathered = ctx.vmem(self.rows_l.shape([chunk, *sizes, self.groups])) if max(strides) > 1 else None

        def load(i: int) -> int:
            k0 = starts[i]
            kc = min(chunk, self.k - k0)
            slot, sem = i % 2, sems[i % 2]
            first, size = [k0, *(a for a, _, _ in inside), 0], [kc, *(m for _, m, _ in inside), self.groups]
            local = [0, *(at for _, _, at in inside), 0]
            n = staged_l.load(slot, sem, first, size, local, [kc, *padded, self.groups], fill)
            n += staged_r.load(slot, sem, [k0, *[0] * len(sizes), 0], [kc, *sizes, self.groups],
                               [0] * (len(sizes) + 2), [kc, *sizes, self.groups], None)  # fmt: skip
            return n

        loaded = [0] * len(starts)
        loaded[0] = load(0)
        for i, k0 in enumerate(starts):
            kc = min(chunk, self.k - k0)
            if i + 1 < len(starts):
                loaded[i + 1] = load(i + 1)
            ctx.emit(SemWait, sem=sems[i % 2], count=loaded[i])
            xs = self.rows_l.ref(staged_l.stage(i % 2), [kc, *padded, self.groups])
            ys = self.rows_r.ref(staged_r.stage(i % 2), [kc, *sizes, self.groups])
            tmp = self.acc_rows.ref(products, [kc, *sizes, self.groups])
            flat = self.acc_rows.ref(products, [1, kc, *sizes, self.groups])  # (the same bytes, a unit axis added)
            block = self.rows_l.ref(gathered, [kc, *sizes, self.groups]) if gathered is not None else None
            summed = tuple(range(1, len(sizes) + 2))
            for p, at in enumerate(product(*(range(n) for n in self.positions))):  # (row-major: p is at's row)
                xw = MemRef(xs.space, xs.address, xs.shape, Window((0, *at, 0), (kc, *spans, self.groups)))
                if block is not None:
                    ctx.emit(VpuCopy, dst=block, src=xw, strides=(1, *strides, 1))
                    xw = block
                ctx.emit(VpuFused, dst=tmp, srcs=(xw, ys), ops=self.steps)
                dst = MemRef(rows.space, rows.address, rows.shape, Window((p, 0), (1, self.groups)))
                ctx.emit(VpuReduce, fn="add", dst=dst, src=flat, dims=summed, accumulate=i > 0)
        extent = [1, *self.positions, self.groups]
        outbound.finish(0, extent, extent)
        sem = ctx.semaphore()
        ctx.emit(SemWait, sem=sem, count=outbound.store(0, sem, extent, [0] * len(extent), extent))
