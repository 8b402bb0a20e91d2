"""The VPU and the cross-lane units (XLU): instructions on whole VMEM blocks, costed per vector register.

Cost rule (all numbers from the config; ``V(x)`` = vector registers block ``x`` occupies under its layout,
padding included, see :func:`tpusim.memory.windows.window_vregs`)::

    occupancy = max(ops / issue_vregs_per_cycle,        # the op class's ALUs
                    V(sources) / vmem.load_vregs_per_cycle,
                    V(destination) / vmem.store_vregs_per_cycle)      (each rounded up)
    end       = start + occupancy + latency_cycles

``ops`` is ``max V`` over the operands for elementwise ops. The lane dimension of a block is its layout's
most minor dimension, the sublane dimension the next one. Reductions and broadcasts along the lane
dimension, transposes that move the lane or sublane dimension and copies that change the lane dimension
cross lanes: they run on an XLU at its per-vreg cost instead. Numerics: see
:mod:`tpusim.devices.vpu_numerics`.
"""

from __future__ import annotations

from dataclasses import replace
from math import ceil, log2
from typing import TYPE_CHECKING, Any

import numpy as np

from tpusim.devices.stores import read_value, write_value
from tpusim.devices.units import Access, ComputeSpec, Cost, register_compute
from tpusim.devices.vpu_numerics import apply, convert, result_types
from tpusim.errors import TpusimError
from tpusim.isa import (
    REINTERPRETS,
    VPU_FUNCTIONS,
    Const,
    MemRef,
    Reg,
    VpuBroadcast,
    VpuCopy,
    VpuFused,
    VpuIota,
    VpuMap,
    VpuReduce,
    VpuReshape,
    XluTranspose,
)
from tpusim.memory import ElementType, element_type, lane_dim, sublane_dim
from tpusim.memory.windows import window_vregs
from tpusim.semantics.combiners import ufunc_for
from tpusim.semantics.convert import flush

if TYPE_CHECKING:
    from tpusim.config import ChipConfig
    from tpusim.devices.core import Core

__all__: list[str] = []


def _v(cfg: ChipConfig, a: Access) -> int:
    return window_vregs(a.shape, a.offsets, a.sizes, cfg.vpu.vreg_bytes)


def _vpu_cost(cfg: ChipConfig, ops: int, cls: str, v_in: int, v_out: int, flops: int) -> Cost:
    c = cfg.vpu.op_class(cls)
    occ = max(
        ceil(ops / c.issue_vregs_per_cycle),
        ceil(v_in / cfg.vmem.load_vregs_per_cycle),
        ceil(v_out / cfg.vmem.store_vregs_per_cycle),
        1,
    )
    return Cost(occ, c.latency_cycles, (v_in + v_out) * cfg.vpu.vreg_bytes, flops, "vpu")


def _xlu_cost(cfg: ChipConfig, per_vreg: int, v_work: int, v_in: int, v_out: int, flops: int) -> Cost:
    occ = max(
        per_vreg * v_work, ceil(v_in / cfg.vmem.load_vregs_per_cycle), ceil(v_out / cfg.vmem.store_vregs_per_cycle), 1
    )
    return Cost(occ, cfg.xlu.latency_cycles, (v_in + v_out) * cfg.vpu.vreg_bytes, flops, "xlu")


def _read(a: Access) -> np.ndarray:
    return read_value(a.store, a.address, a.shape, a.offsets, a.sizes)


def _write(a: Access, value: np.ndarray) -> None:
    et = a.shape.element_type
    assert et.dtype is not None
    value = np.asarray(value, et.dtype)
    if value.ndim == 0:  # every source an immediate (broadcast scalars): one value for the whole window
        value = np.broadcast_to(value, a.dims)
    write_value(a.store, a.address, a.shape, a.offsets, a.sizes, np.ascontiguousarray(value).reshape(a.dims))


def _dtype(ref: MemRef) -> np.dtype:
    dt = ref.element_type.dtype
    assert dt is not None  # MemRef rejects element types without bytes
    return dt


def _no_check(cfg: ChipConfig, ins: Any) -> str | None:
    return None


def _memrefs(ops: tuple[Any, ...]) -> tuple[MemRef, ...]:
    return tuple(o for o in ops if isinstance(o, MemRef))


# ---------------------------------------------------------------------------------------------------------
# Elementwise
# ---------------------------------------------------------------------------------------------------------
def _cost_map(cfg: ChipConfig, ins: VpuMap, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    v_out = _v(cfg, writes[0])
    v_srcs = [_v(cfg, a) for a in reads]
    ops = max([v_out, *v_srcs])
    return _vpu_cost(cfg, ops, VPU_FUNCTIONS[ins.fn].cost_class, sum(v_srcs), v_out, ins.dst.element_count)


def _scalar_value(core: Core, op: Const | Reg) -> np.ndarray:
    if isinstance(op, Const):
        assert op.etype.dtype is not None
        return (
            np.asarray(op.value, dtype=op.etype.dtype)
            if op.etype.is_float
            else np.asarray(op.value).astype(op.etype.dtype)
        )
    return np.asarray(core.regs[op.index], np.int32)


def _operand_type(op: Any) -> ElementType:
    if isinstance(op, MemRef):
        return op.element_type
    return op.etype if isinstance(op, Const) else element_type("s32")


def _check_map(cfg: ChipConfig, ins: VpuMap) -> str | None:
    return result_types(ins.fn, [_operand_type(s) for s in ins.srcs], ins.dst.element_type)


def _exec_map(core: Core, ins: VpuMap, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> None:
    it = iter(reads)
    args = [_read(next(it)) if isinstance(s, MemRef) else _scalar_value(core, s) for s in ins.srcs]
    try:
        value = apply(ins.fn, args, ins.dst.element_type, ins.direction)
    except TpusimError as e:
        raise core.error(ins, f"vpu.{ins.fn}: {getattr(e, 'message', e)}") from None
    _write(writes[0], value)


def _check_fused(cfg: ChipConfig, ins: VpuFused) -> str | None:
    types = [_operand_type(s) for s in ins.srcs]
    for k, step in enumerate(ins.ops):
        problem = result_types(step.fn, [types[a] for a in step.args], step.etype)
        if problem:
            return f"step {k} ({step}): {problem}"
        types.append(step.etype)
    return None


def _cost_fused(cfg: ChipConfig, ins: VpuFused, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    v_out = _v(cfg, writes[0])
    v_in = sum(_v(cfg, a) for a in reads)
    n = ins.dst.element_count
    # a source of fewer elements is replicated in registers: one op per register of the result
    broadcast = sum(1 for a in reads if a.dims != ins.dst.dims)
    work = {"alu": broadcast * v_out, "transcendental": 0}
    depth: list[int] = [0] * len(ins.srcs)
    for step in ins.ops:
        if step.fn in REINTERPRETS:  # the register's bits, retyped: no op
            depth.append(depth[step.args[0]])
            continue
        cls = VPU_FUNCTIONS[step.fn].cost_class
        # registers the step's result needs for the block: 32-bit words hold 4 // bytes values
        work[cls] += max(1, ceil(n * max(step.etype.bits, 8) / 8 / cfg.vpu.vreg_bytes))
        depth.append(max(depth[a] for a in step.args) + cfg.vpu.op_class(cls).latency_cycles)
    alu, eup = cfg.vpu.alu, cfg.vpu.transcendental
    occ = max(
        ceil(work["alu"] / alu.issue_vregs_per_cycle),
        ceil(work["transcendental"] / eup.issue_vregs_per_cycle),
        ceil(v_in / cfg.vmem.load_vregs_per_cycle),
        ceil(v_out / cfg.vmem.store_vregs_per_cycle),
        1,
    )
    return Cost(occ, depth[-1], (v_in + v_out) * cfg.vpu.vreg_bytes, n * len(ins.ops), "vpu")


def _exec_fused(core: Core, ins: VpuFused, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> None:
    it = iter(reads)
    values = [_read(next(it)) if isinstance(s, MemRef) else _scalar_value(core, s) for s in ins.srcs]
    for k, step in enumerate(ins.ops):
        try:
            values.append(apply(step.fn, [values[a] for a in step.args], step.etype, step.direction))
        except TpusimError as e:
            raise core.error(ins, f"vpu.fused step {k} ({step}): {getattr(e, 'message', e)}") from None
    _write(writes[0], np.broadcast_to(values[-1], ins.dst.dims))


# ---------------------------------------------------------------------------------------------------------
# Reduce, broadcast, iota
# ---------------------------------------------------------------------------------------------------------
def _cost_reduce(cfg: ChipConfig, ins: VpuReduce, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    v_in, v_out = _v(cfg, reads[0]), _v(cfg, writes[0])
    if ins.accumulate:
        v_in += v_out
    flops = ins.src.element_count
    lane = lane_dim(ins.src.shape)
    if lane is not None and lane in ins.dims:
        # The registers a row spans along the lanes are first combined elementwise on the ALUs, then each
        # register left is reduced across its lanes on an XLU (as Mosaic lowers a row reduction).
        v_src = _v(cfg, reads[0])
        across = max(1, ceil(reads[0].dims[lane] / cfg.vpu.lanes))
        v_lane = ceil(v_src / across)
        cost = _xlu_cost(cfg, cfg.xlu.lane_reduce_cycles_per_vreg, v_lane, v_in, v_out, flops)
        alu = ceil((v_src - v_lane) / cfg.vpu.alu.issue_vregs_per_cycle)
        return replace(cost, occupancy=max(cost.occupancy, alu))
    ops = _v(cfg, reads[0]) + (v_out if ins.accumulate else 0)
    if sublane_dim(ins.src.shape) in ins.dims:
        ops += v_out * max(1, round(log2(cfg.vpu.sublanes)))
    return _vpu_cost(cfg, ops, "alu", v_in, v_out, flops)


def _reduce_dtype(et: ElementType) -> np.dtype:
    """f32 for floats narrower than f32, s32/u32 for integers narrower than a byte (their sums wrap to the
    same low bits), the type itself otherwise."""
    assert et.dtype is not None
    if et.is_integer and et.is_sub_byte:
        return np.dtype(np.int32 if et.kind == "signed" else np.uint32)
    if et.is_integer or et.name == "pred" or et.bits >= 32:
        return et.dtype
    return np.dtype(np.float32)


def _exec_reduce(core: Core, ins: VpuReduce, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> None:
    x = _read(reads[0])
    ct = _reduce_dtype(ins.src.element_type)
    x = x.astype(ct, copy=False)
    uf = ufunc_for(ins.fn, x.dtype)
    arith = ins.fn in ("add", "multiply")  # (denormals read as zero, a denormal result is zero)
    with np.errstate(all="ignore"):
        if arith:
            x = flush(x)
        r = uf.reduce(x, axis=ins.dims) if ins.dims else x.copy()
        if ins.accumulate:
            r = uf(_read(writes[0]).astype(ct), r)
        if arith:
            r = flush(np.asarray(r))
    _write(writes[0], convert(np.asarray(r, dtype=ct), ins.dst.element_type))


def _check_broadcast(cfg: ChipConfig, ins: VpuBroadcast) -> str | None:
    if isinstance(ins.src, MemRef) and ins.src.element_type != ins.dst.element_type:
        return f"broadcast keeps the element type ({ins.src.element_type} to {ins.dst.element_type})"
    return None


def _cost_broadcast(cfg: ChipConfig, ins: VpuBroadcast, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    v_out = _v(cfg, writes[0])
    v_in = _v(cfg, reads[0]) if reads else 0
    src_dims = ins.src.dims if isinstance(ins.src, MemRef) else ()
    expanded = {d for d in range(len(ins.dst.dims)) if d not in ins.dims}
    expanded |= {d for i, d in enumerate(ins.dims) if src_dims[i] != ins.dst.dims[d]}
    n = ins.dst.element_count
    if lane_dim(ins.dst.shape) in expanded and isinstance(ins.src, MemRef):
        return _xlu_cost(cfg, cfg.xlu.lane_broadcast_cycles_per_vreg, v_out, v_in, v_out, n)
    ops = v_out if (sublane_dim(ins.dst.shape) in expanded or not isinstance(ins.src, MemRef)) else 0
    return _vpu_cost(cfg, ops, "alu", v_in, v_out, n)


def _exec_broadcast(core: Core, ins: VpuBroadcast, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> None:
    out = ins.dst.dims
    if reads:
        x = _read(reads[0])
        shape = [1] * len(out)
        for i, d in enumerate(ins.dims):
            shape[d] = x.shape[i]
        x = x.reshape(shape)
    else:
        x = convert(_scalar_value(core, ins.src), ins.dst.element_type)  # type: ignore[arg-type]
    _write(writes[0], np.broadcast_to(x, out))


def _cost_iota(cfg: ChipConfig, ins: VpuIota, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    v = _v(cfg, writes[0])
    return _vpu_cost(cfg, v, "alu", 0, v, ins.dst.element_count)


def _exec_iota(core: Core, ins: VpuIota, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> None:
    dims = ins.dst.dims
    idx = np.arange(dims[ins.dimension], dtype=np.int64).reshape(
        [-1 if i == ins.dimension else 1 for i in range(len(dims))]
    )
    _write(writes[0], convert(np.ascontiguousarray(np.broadcast_to(idx, dims)), ins.dst.element_type))


# ---------------------------------------------------------------------------------------------------------
# Data movement inside VMEM: copy (relayout), reshape, transpose
# ---------------------------------------------------------------------------------------------------------
def _move_cost(cfg: ChipConfig, crosses: bool, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    v_in, v_out = _v(cfg, reads[0]), _v(cfg, writes[0])
    n = 0
    if crosses:
        return _xlu_cost(cfg, cfg.xlu.transpose_cycles_per_vreg, v_in, v_in, v_out, n)
    return _vpu_cost(cfg, 0, "alu", v_in, v_out, n)


def _cost_copy(cfg: ChipConfig, ins: VpuCopy, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    crosses = lane_dim(ins.src.shape) != lane_dim(ins.dst.shape)
    if ins.dst_strides is not None:  # a scatter: strided stores, across lanes on the XLU per destination vreg
        lane = lane_dim(ins.dst.shape)
        v_src, v_dst = _v(cfg, reads[0]), _v(cfg, writes[0])
        if crosses or (lane is not None and ins.dst_strides[lane] != 1):
            return _xlu_cost(cfg, cfg.xlu.transpose_cycles_per_vreg, v_dst, v_src, v_dst, 0)
        return _vpu_cost(cfg, 0, "alu", v_src, v_src, 0)
    if ins.strides is None:
        return _move_cost(cfg, crosses, reads, writes)
    lane, sublane = lane_dim(ins.src.shape), sublane_dim(ins.src.shape)
    if crosses or (lane is not None and ins.strides[lane] != 1):  # a gather across lanes
        return _move_cost(cfg, True, reads, writes)
    # Strides off the lane dimension are load addressing: one strided load per destination register (as
    # Mosaic lowers a strided load, which takes any stride but the lane dimension's); rows taken in reverse
    # order are then permuted within each register, one op per register (an estimate).
    v_out = _v(cfg, writes[0])
    ops = v_out if sublane is not None and ins.strides[sublane] < 0 else 0
    return _vpu_cost(cfg, ops, "alu", v_out, v_out, 0)


def _cost_reshape(cfg: ChipConfig, ins: VpuReshape, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    s, d = ins.src, ins.dst
    keeps = lane_dim(s.shape) == len(s.dims) - 1 and lane_dim(d.shape) == len(d.dims) - 1 and s.dims[-1:] == d.dims[-1:]
    return _move_cost(cfg, not keeps, reads, writes)


def _cost_transpose(cfg: ChipConfig, ins: XluTranspose, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    s, d = ins.src.shape, ins.dst.shape
    moved = any(
        (dd is not None and ins.permutation[dd] != sd)
        for dd, sd in ((lane_dim(d), lane_dim(s)), (sublane_dim(d), sublane_dim(s)))
    )
    return _move_cost(cfg, moved, reads, writes)


def _exec_copy(core: Core, ins: VpuCopy, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> None:
    value = _read(reads[0])
    if ins.strides is not None:
        value = value[tuple(slice(None, None, s) for s in ins.strides)]
    if ins.dst_strides is not None:  # (reads[1] is the destination: the elements between keep their values)
        whole = _read(reads[1]).copy()
        whole[tuple(slice(None, None, s) for s in ins.dst_strides)] = value
        value = whole
    _write(writes[0], value)


def _exec_reshape(core: Core, ins: VpuReshape, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> None:
    _write(writes[0], _read(reads[0]).reshape(ins.dst.dims))


def _exec_transpose(core: Core, ins: XluTranspose, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> None:
    _write(writes[0], _read(reads[0]).transpose(ins.permutation))


register_compute(VpuMap, ComputeSpec(lambda i: (_memrefs(i.srcs), (i.dst,)), _check_map, _cost_map, _exec_map))
register_compute(
    VpuReduce,
    ComputeSpec(
        lambda i: ((i.src,) + ((i.dst,) if i.accumulate else ()), (i.dst,)), _no_check, _cost_reduce, _exec_reduce
    ),
)
register_compute(
    VpuBroadcast,
    ComputeSpec(lambda i: (_memrefs((i.src,)), (i.dst,)), _check_broadcast, _cost_broadcast, _exec_broadcast),
)
register_compute(VpuIota, ComputeSpec(lambda i: ((), (i.dst,)), _no_check, _cost_iota, _exec_iota))
register_compute(
    VpuCopy,
    ComputeSpec(
        lambda i: ((i.src,) + ((i.dst,) if i.dst_strides else ()), (i.dst,)), _no_check, _cost_copy, _exec_copy
    ),
)
register_compute(VpuReshape, ComputeSpec(lambda i: ((i.src,), (i.dst,)), _no_check, _cost_reshape, _exec_reshape))
register_compute(XluTranspose, ComputeSpec(lambda i: ((i.src,), (i.dst,)), _no_check, _cost_transpose, _exec_transpose))
register_compute(VpuFused, ComputeSpec(lambda i: (_memrefs(i.srcs), (i.dst,)), _check_fused, _cost_fused, _exec_fused))
