"""The MXU: a weight-stationary R x C systolic array with a weight staging buffer and a result buffer.

Timing contract (``R = mxu.rows``, ``C = mxu.cols``, ``L = mxu.weight_load_cycles``, all from the config):

* ``mxu.load_weights`` occupies the weight-load path for ``L`` cycles per bf16 part (2 or 3 parts for f32
  weights under the multi-pass precisions). Double-buffered: it may start as soon as the previous staged
  tile has been taken by a matmul (it overlaps the current stream). Single-buffered: it waits until the
  last matmul has fully drained.
* ``mxu.matmul`` of M rows occupies the input port for ``passes * ceil(M / s)`` cycles (``s`` =
  ``mxu.int8_speedup`` for 8-bit operands); its results are complete ``R - 1 + C - 1`` cycles (input and
  output skew) after its last row entered. Back-to-back matmuls stream without bubbles, also across a
  weight swap. Without double buffering one pass therefore costs ``L + M + R - 1 + C - 1 = 2R + C + M - 2``
  cycles (L = R), and a K x N weight sweep ``ceil(K/R) * ceil(N/C)`` such passes.
* ``mxu.pop`` waits for every earlier matmul of this MXU, then occupies the result port for
  ``ceil(rows / mxu.pop_rows_per_cycle)`` cycles. A matmul writing result rows an earlier pop still reads
  waits for that pop.

Numerics (:mod:`tpusim.devices.mxu_numerics`): bf16 values enter the array, their products are exact in
f32 and accumulate in f32 (BLAS order); one-pass matmuls accumulating into the same rows are evaluated as one
f32 product over their joint contraction; f32 operands are split into bf16 parts under the multi-pass
precisions as XLA does; 8-bit integers accumulate exactly in s32. The result buffer holds 32-bit words.
"""

from __future__ import annotations

from collections.abc import Callable
from math import ceil
from typing import TYPE_CHECKING, Any

import numpy as np

from tpusim.devices.mxu_numerics import BF16, ResultBuffer, is_one_pass, matmul_f32, one_pass, split_bf16
from tpusim.devices.stores import write_value
from tpusim.devices.units import Access, ComputeSpec, Cost, register_compute
from tpusim.isa import PRECISION_PASSES, MxuLoadWeights, MxuMatmul, MxuPop
from tpusim.memory.windows import window_vregs

if TYPE_CHECKING:
    from tpusim.config import ChipConfig
    from tpusim.devices.core import Core
    from tpusim.devices.values import CachedValue

__all__ = ["MxuState", "matmul_f32", "split_bf16", "timing_facts"]  # (the numerics are re-exported)

_FLOAT_INPUTS = ("bf16", "f32", "f16")
_INT_INPUTS = ("s8", "u8")


class MxuState:
    """One MXU: its timing state (next-free counters) and its numeric state (weights, result buffer)."""

    __slots__ = (
        "_result",
        "active_ready",
        "cfg",
        "double_buffered",
        "last_end",
        "load_free",
        "pending",
        "pop_free",
        "pops",
        "staged_ready",
        "staging_free",
        "stream_free",
        "weights",
        "weights_dims",
        "weights_one_pass",
        "weights_parts",
    )

    def __init__(self, cfg: ChipConfig) -> None:
        self.cfg = cfg
        self.double_buffered = cfg.mxu.double_buffered
        self.load_free = self.staging_free = self.staged_ready = self.stream_free = 0
        self.active_ready = self.last_end = self.pop_free = 0
        self.pending = False
        self.pops: list[tuple[int, int, int]] = []  # (first row, end row, end cycle) of recent pops
        self.weights: np.ndarray | None = None  # the latched K x N weights (numeric runs)
        self.weights_one_pass: np.ndarray | None = None  # ... as the one-pass input (float weights)
        self.weights_dims: tuple[int, int] | None = None
        self.weights_parts = 1
        self._result: ResultBuffer | None = None

    @property
    def result(self) -> ResultBuffer:
        """The result buffer (allocated when a numeric run first touches it)."""
        if self._result is None:
            self._result = ResultBuffer(self.cfg.mxu.result_buffer_rows, self.cfg.mxu.cols)
        return self._result

    def drop_numerics(self) -> None:
        """Forget the numeric state (after a run: nothing reads it any more)."""
        self.weights = self.weights_one_pass = None
        self._result = None

    # ------------------------------------------------------------------ timing
    def schedule(self, ins: Any, t: int, need: int, cost: Cost, core: Core, index: int) -> tuple[int, int, int]:
        """Place ``ins`` on this MXU's timeline.

        Args:
            ins: an MXU instruction.
            t: the issue cycle.
            need: the earliest start the scoreboard allows.
            cost: its closed-form cost.
            core, index: the issuing core and the instruction's index, for errors.

        Returns:
            (start, end, flops); a matmul's flops use the width of the weights latched at that point.
        """
        return MxuState.scheduler_of(ins)(self, timing_facts(ins), t, need, cost, core, index)

    @staticmethod
    def scheduler_of(ins: Any) -> Callable[..., tuple[int, int, int]]:
        """The timing method for ``ins``'s class, unbound: ``(mxu, timing_facts(ins), t, need, cost, core,
        index) -> (start, end, flops)`` (decode keeps it with the facts)."""
        if isinstance(ins, MxuMatmul):
            return MxuState.schedule_matmul
        return MxuState.schedule_load if isinstance(ins, MxuLoadWeights) else MxuState.schedule_pop

    def schedule_matmul(
        self, mx: tuple[int, ...], t: int, need: int, cost: Cost, core: Core, index: int
    ) -> tuple[int, int, int]:
        dims = self.weights_dims
        if dims is None:
            raise core.error(index, "mxu.matmul before any mxu.load_weights on this MXU")
        k, n = dims
        cols, rows, acc = mx
        if cols != k:
            raise core.error(index, f"left operand has {cols} columns but the latched weights have {k} rows")
        start = self.stream_free
        if start < t:
            start = t
        if start < need:
            start = need
        if self.double_buffered:
            if self.pending:
                if start < self.staged_ready:
                    start = self.staged_ready
                self.staging_free = start
                self.pending = False
        elif start < self.active_ready:
            start = self.active_ready
        if self.pop_free > start:  # a pop may still be reading rows this matmul overwrites
            lo, hi = acc, acc + rows
            for p_lo, p_hi, p_end in self.pops:
                if p_lo < hi and lo < p_hi and p_end > start:
                    start = p_end
        occ = cost.occupancy
        self.stream_free = start + occ
        end = start + occ + cost.latency
        if end > self.last_end:
            self.last_end = end
        return start, end, cost.flops * n

    def schedule_load(
        self, mx: tuple[int, int], t: int, need: int, cost: Cost, core: Core, index: int
    ) -> tuple[int, int, int]:
        self.weights_dims = mx
        occ = cost.occupancy
        start = need if need > t else t
        if self.load_free > start:
            start = self.load_free
        if self.double_buffered:
            if self.staging_free > start:
                start = self.staging_free
            self.staged_ready = start + occ
            self.pending = True
        else:
            if self.last_end > start:
                start = self.last_end
            self.active_ready = start + occ
        self.load_free = start + occ
        return start, start + occ, 0

    def schedule_pop(
        self, mx: tuple[int, int], t: int, need: int, cost: Cost, core: Core, index: int
    ) -> tuple[int, int, int]:
        start = need if need > t else t
        if self.pop_free > start:
            start = self.pop_free
        if self.last_end > start:
            start = self.last_end
        end = start + cost.occupancy
        self.pop_free = end
        acc, rows = mx
        self.pops = [*[p for p in self.pops if p[2] > t][-7:], (acc, acc + rows, end)]
        return start, end, 0


def timing_facts(ins: Any) -> tuple[int, ...]:
    """What the MXU's timing methods need of an instruction: a matmul's ``(columns, rows, acc)``, the
    ``(K, N)`` of loaded weights, a pop's ``(acc, rows)``."""
    if isinstance(ins, MxuMatmul):
        d = ins.lhs.dims
        return d[-1], d[-2], ins.acc
    if isinstance(ins, MxuLoadWeights):
        d = ins.src.dims
        return (d[-1], d[-2]) if ins.transpose else (d[-2], d[-1])
    return ins.acc, ins.dst.dims[-2]


def _matrix(value: np.ndarray) -> np.ndarray:
    return value.reshape(value.shape[-2], value.shape[-1])


# ---------------------------------------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------------------------------------
def _lead_ones(dims: tuple[int, ...]) -> bool:
    return all(d == 1 for d in dims[:-2])


def _vregs(cfg: ChipConfig, a: Access) -> int:
    return window_vregs(a.shape, a.offsets, a.sizes, cfg.vpu.vreg_bytes)


def _weight_parts(ins: MxuLoadWeights) -> int:
    return PRECISION_PASSES[ins.precision][0] if ins.src.element_type.name == "f32" else 1


def _check_load(cfg: ChipConfig, ins: MxuLoadWeights) -> str | None:
    if ins.mxu >= cfg.mxu.count:
        return f"MXU {ins.mxu} does not exist (the core has {cfg.mxu.count})"
    d = ins.src.dims
    if not _lead_ones(d):
        return f"weights {d}: all dimensions but the last two must be 1"
    k, n = (d[-1], d[-2]) if ins.transpose else (d[-2], d[-1])
    if k > cfg.mxu.rows or n > cfg.mxu.cols:
        return f"a {k} x {n} weight tile does not fit the {cfg.mxu.rows} x {cfg.mxu.cols} MXU"
    if ins.src.element_type.name not in _FLOAT_INPUTS + _INT_INPUTS:
        return f"the MXU takes bf16, f16, f32, s8 or u8 weights, not {ins.src.element_type}"
    return None


def _cost_load(cfg: ChipConfig, ins: MxuLoadWeights, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    v = _vregs(cfg, reads[0])
    occ = max(_weight_parts(ins) * cfg.mxu.load_cycles, ceil(v / cfg.vmem.load_vregs_per_cycle))
    return Cost(occ, 0, v * cfg.vpu.vreg_bytes, 0, "mxu")


def _exec_load(core: Core, ins: MxuLoadWeights, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> None:
    a = reads[0]
    st: MxuState = core.units.mxus[ins.mxu]
    # a cached value is a read-only snapshot: later writes to the memory do not change latched weights
    e = a.store.cached(a.address, a.shape, a.offsets, a.sizes, a.lo, a.hi)
    w = _matrix(e.value)
    t = ins.transpose
    st.weights = w.T if t else w
    st.weights_parts = _weight_parts(ins)
    st.weights_one_pass = None
    if w.dtype.kind not in "iu":
        st.weights_one_pass = _one_pass_operand(e, t)


def _check_matmul(cfg: ChipConfig, ins: MxuMatmul) -> str | None:
    if ins.mxu >= cfg.mxu.count:
        return f"MXU {ins.mxu} does not exist (the core has {cfg.mxu.count})"
    d = ins.lhs.dims
    if not _lead_ones(d):
        return f"left operand {d}: all dimensions but the last two must be 1"
    if d[-1] > cfg.mxu.rows:
        return f"contraction size {d[-1]} exceeds the MXU's {cfg.mxu.rows} rows"
    if ins.acc + d[-2] > cfg.mxu.result_buffer_rows:
        return (
            f"result rows {ins.acc}..{ins.acc + d[-2] - 1} exceed the result buffer ({cfg.mxu.result_buffer_rows} rows)"
        )
    if ins.lhs.element_type.name not in _FLOAT_INPUTS + _INT_INPUTS:
        return f"the MXU takes bf16, f16, f32, s8 or u8 operands, not {ins.lhs.element_type}"
    return None


def _passes(ins: MxuMatmul) -> int:
    return PRECISION_PASSES[ins.precision][1] if ins.lhs.element_type.name == "f32" else 1


def _cost_matmul(cfg: ChipConfig, ins: MxuMatmul, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    m, k = ins.lhs.dims[-2], ins.lhs.dims[-1]
    speed = cfg.mxu.int8_speedup if ins.lhs.element_type.name in _INT_INPUTS else 1
    v = _vregs(cfg, reads[0])
    passes = _passes(ins)
    occ = max(passes * ceil(m / speed), ceil(v / cfg.vmem.load_vregs_per_cycle))
    # flops per output column; MxuState.schedule multiplies by the width N of the latched weights.
    return Cost(occ, cfg.mxu.rows - 1 + cfg.mxu.cols - 1, v * cfg.vpu.vreg_bytes, 2 * m * k, "mxu")


def _exec_matmul(core: Core, ins: MxuMatmul, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> None:
    st: MxuState = core.units.mxus[ins.mxu]
    a = reads[0]
    w = st.weights
    if w is None:
        raise core.error(ins, "mxu.matmul before any mxu.load_weights on this MXU (numeric state)")
    dt = a.shape.element_type.dtype
    assert dt is not None
    is_int = dt.kind in "iu"
    if is_int != (w.dtype.kind in "iu"):
        raise core.error(ins, f"cannot multiply {dt} operands by {w.dtype} weights")
    buf = st.result
    if not is_int and is_one_pass(ins.precision, dt, w.dtype):
        lhs = _one_pass_operand(a.store.cached(a.address, a.shape, a.offsets, a.sizes, a.lo, a.hi), False)
        assert st.weights_one_pass is not None
        buf.accumulate(ins.acc, lhs, st.weights_one_pass, ins.accumulate)
        return
    lhs = _matrix(a.store.cached(a.address, a.shape, a.offsets, a.sizes, a.lo, a.hi).value)
    m, n = lhs.shape[0], w.shape[1]
    rows = buf.rows_of(ins.acc, m, n)
    if is_int:
        r = (lhs.astype(np.int64) @ w.astype(np.int64)).astype(np.int32)
        if ins.accumulate:
            r = (rows.view(np.int32).astype(np.int64) + r).astype(np.int32)
        rows[...] = r.view(np.uint32)
        return
    r = matmul_f32(lhs, w, ins.precision)
    if ins.accumulate:
        with np.errstate(invalid="ignore", over="ignore"):
            r = (rows.view(np.float32) + r).astype(np.float32)
    rows[...] = r.view(np.uint32)


def _one_pass_operand(e: CachedValue, transpose: bool) -> np.ndarray:
    """A float operand as the one-pass MXU input (see ``ResultBuffer.accumulate``), the same object while
    the value is cached: a bf16 matrix as it is (the result buffer converts it while joining a group's
    operands), others rounded to bf16 once."""
    return e.form(("mxu", transpose), _one_pass_transposed if transpose else _one_pass_matrix)


def _one_pass_matrix(value: np.ndarray) -> np.ndarray:
    m = _matrix(value)
    return m if m.dtype == BF16 else one_pass(m)


def _one_pass_transposed(value: np.ndarray) -> np.ndarray:
    m = _matrix(value).T
    return m if m.dtype == BF16 else one_pass(m)


def _check_pop(cfg: ChipConfig, ins: MxuPop) -> str | None:
    if ins.mxu >= cfg.mxu.count:
        return f"MXU {ins.mxu} does not exist (the core has {cfg.mxu.count})"
    d = ins.dst.dims
    if not _lead_ones(d):
        return f"result block {d}: all dimensions but the last two must be 1"
    if d[-1] > cfg.mxu.cols or ins.acc + d[-2] > cfg.mxu.result_buffer_rows:
        size = f"{cfg.mxu.result_buffer_rows} x {cfg.mxu.cols}"
        return f"popping {d[-2]} x {d[-1]} at row {ins.acc} leaves the {size} result buffer"
    if ins.dst.element_type.name not in ("f32", "bf16", "s32"):
        return f"results pop as f32, bf16 or s32, not {ins.dst.element_type}"
    return None


def _cost_pop(cfg: ChipConfig, ins: MxuPop, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    v = _vregs(cfg, writes[0])
    occ = max(ceil(ins.dst.dims[-2] / cfg.mxu.pop_rows_per_cycle), ceil(v / cfg.vmem.store_vregs_per_cycle))
    return Cost(occ, 0, v * cfg.vpu.vreg_bytes, 0, "mxu")


def _exec_pop(core: Core, ins: MxuPop, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> None:
    st: MxuState = core.units.mxus[ins.mxu]
    a = writes[0]
    rows, n = a.dims[-2], a.dims[-1]
    block = st.result.rows_of(ins.acc, rows, n)
    et = a.shape.element_type
    value = block.view(np.int32) if et.name == "s32" else block.view(np.float32).astype(et.dtype)
    write_value(a.store, a.address, a.shape, a.offsets, a.sizes, np.ascontiguousarray(value).reshape(a.dims))


register_compute(MxuLoadWeights, ComputeSpec(lambda i: ((i.src,), ()), _check_load, _cost_load, _exec_load))
register_compute(MxuMatmul, ComputeSpec(lambda i: ((i.lhs,), ()), _check_matmul, _cost_matmul, _exec_matmul))
register_compute(MxuPop, ComputeSpec(lambda i: ((), (i.dst,)), _check_pop, _cost_pop, _exec_pop))
