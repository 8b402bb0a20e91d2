"""The scalar unit: 32-bit integer ALU, scalar loads and stores, branches and jumps.

Scalar instructions execute in the sequencer at issue, always numerically (even in timing-only runs: they
steer control flow). Timing: one issue cycle each; ``s.load`` stalls the sequencer for
``smem.latency_cycles`` (``vmem.scalar_latency_cycles`` from VMEM); a taken branch or a jump costs
``core.branch_cycles`` more. Loops are real loops: the stream is never unrolled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from tpusim.devices.hazards import OWN
from tpusim.devices.limits import count_jump, limit_error
from tpusim.devices.stores import read_value, write_value
from tpusim.devices.units import Issued, handles
from tpusim.isa import Branch, Halt, Jump, Reg, ScalarAlu, ScalarLoad, ScalarStore, Space

if TYPE_CHECKING:
    from tpusim.devices.core import Core
    from tpusim.devices.decode import Decoded

__all__ = ["SCALAR_ALU", "wrap32"]


def wrap32(x: int) -> int:
    """``x`` as a 32-bit two's-complement value."""
    return ((x + 0x80000000) & 0xFFFFFFFF) - 0x80000000


def _div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _rem(a: int, b: int) -> int:
    return a - _div(a, b) * b


SCALAR_ALU: dict[str, Callable[[int, int], int]] = {
    "mov": lambda a, b: a,
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": _div,
    "rem": _rem,
    "min": min,
    "max": max,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "shl": lambda a, b: a << b if 0 <= b < 32 else 0,
    "shr": lambda a, b: (a & 0xFFFFFFFF) >> b if 0 <= b < 32 else 0,
    "sra": lambda a, b: a >> min(b, 31) if b >= 0 else (-1 if a < 0 else 0),
    "eq": lambda a, b: int(a == b),
    "ne": lambda a, b: int(a != b),
    "lt": lambda a, b: int(a < b),
    "le": lambda a, b: int(a <= b),
    "gt": lambda a, b: int(a > b),
    "ge": lambda a, b: int(a >= b),
}
"""Scalar ALU functions on Python ints; results are wrapped to 32 bits by the handler."""

_COND = {
    "eq": SCALAR_ALU["eq"],
    "ne": SCALAR_ALU["ne"],
    "lt": SCALAR_ALU["lt"],
    "le": SCALAR_ALU["le"],
    "gt": SCALAR_ALU["gt"],
    "ge": SCALAR_ALU["ge"],
}


def _record(core: Core, d: Decoded, start: int, end: int) -> None:
    core.records.extend((core.stream_id, d.index, core.scalar_unit, core.first_try, start, end, 0, 0))


_CORE_FACTS = {
    "chip_id": lambda core: core.chip.index,
    "core_id": lambda core: core.index,
    "num_chips": lambda core: len(core.machine.chips),
}


def _prepare_alu(ins: ScalarAlu) -> tuple[Any, int, int, int, int, int, bool]:
    """(function, dst, a register or -1, a immediate, b register or -1, b immediate, checks for zero).

    The function of ``chip_id``, ``core_id`` and ``num_chips`` takes the core (decoded streams are shared by
    the cores that run them)."""
    fn = ins.fn
    if fn in _CORE_FACTS:
        return _CORE_FACTS[fn], ins.dst.index, -2, 0, -1, 0, False
    a, b = ins.a, ins.b
    ar, av = (a.index, 0) if isinstance(a, Reg) else (-1, a or 0)
    br, bv = (b.index, 0) if isinstance(b, Reg) else (-1, b or 0)
    return SCALAR_ALU[fn], ins.dst.index, ar, av, br, bv, fn in ("div", "rem")


@handles(ScalarAlu)
def issue_scalar_alu(core: Core, d: Decoded, t: int) -> int:
    prep = d.extra
    if prep is None:
        prep = d.extra = _prepare_alu(d.ins)
    fn, dst, ar, av, br, bv, zero_check = prep
    regs = core.regs
    if ar == -2:
        regs[dst] = wrap32(fn(core))
    else:
        a = regs[ar] if ar >= 0 else av
        b = regs[br] if br >= 0 else bv
        if zero_check and b == 0:
            raise core.error(d.index, f"s.{d.ins.fn} by zero")
        regs[dst] = ((fn(a, b) + 0x80000000) & 0xFFFFFFFF) - 0x80000000
    core.records.extend((core.stream_id, d.index, core.scalar_unit, core.first_try, t, t + 1, 0, 0))
    core.pc = d.index + 1
    return t + 1


def _scalar_access(core: Core, d: Decoded, ref: Any) -> Any:
    if ref.is_static:
        b = core.bound.get(d.index)
        if b is None:
            b = core.bound[d.index] = ((core.access(ref, d.index),), ())
        return b[0][0]
    return core.access(ref, d.index)


@handles(ScalarLoad)
def issue_scalar_load(core: Core, d: Decoded, t: int) -> Issued:
    ins = d.ins
    a = _scalar_access(core, d, ins.src)
    need, dma = core.scoreboard.check(t, ((OWN[a.space], a.lo, a.hi),), ())
    if dma is not None:
        return core.block(d, "waits for {}, which writes the value it loads", dma.wait_event(), dma)
    start = max(t, need)
    value = read_value(a.store, a.address, a.shape, a.offsets, a.sizes).reshape(-1)[0]
    core.regs[ins.dst.index] = wrap32(int(value))
    cfg = core.cfg
    latency = cfg.smem.latency_cycles if ins.src.space is Space.SMEM else cfg.vmem.scalar_latency_cycles
    end = start + max(1, latency)
    _record(core, d, start, end)
    core.pc = d.index + 1
    return end


@handles(ScalarStore)
def issue_scalar_store(core: Core, d: Decoded, t: int) -> Issued:
    ins = d.ins
    a = _scalar_access(core, d, ins.dst)
    rng = ((OWN[a.space], a.lo, a.hi),)
    need, dma = core.scoreboard.check(t, (), rng)
    if dma is not None:
        return core.block(d, "waits for {}, which touches the value it stores", dma.wait_event(), dma)
    start = max(t, need)
    src = ins.src
    v = core.regs[src.index] if src.__class__ is Reg else src
    et = a.shape.element_type
    value = np.array(v != 0) if et.name == "pred" else np.array(v, dtype=np.int64).astype(et.dtype)
    write_value(a.store, a.address, a.shape, a.offsets, a.sizes, value.reshape(a.dims))
    _record(core, d, start, start + 1)
    core.pc = d.index + 1
    return start + 1


def _jump(core: Core, d: Decoded, t: int, label: str) -> int:
    m = core.machine
    index = d.index
    target = core.stream.target(label)
    # run limits (tpusim.limits): every endless run takes jumps, so they are checked here
    if len(core.records) >= m.max_record_ints or t > m.max_cycles:
        limit = "max_steps" if len(core.records) >= m.max_record_ints else "max_cycles"
        raise limit_error(core, index, t, limit, index if target <= index else -1)
    count_jump(core, index, target)
    core.pc = target
    end: int = t + 1 + core.cfg.core.branch_cycles
    _record(core, d, t, end)
    return end


@handles(Branch)
def issue_branch(core: Core, d: Decoded, t: int) -> int:
    prep = d.extra
    if prep is None:
        ins = d.ins
        b = ins.b
        br, bv = (b.index, 0) if isinstance(b, Reg) else (-1, b)
        back = core.stream.target(ins.target) <= d.index  # a do-while loop's back edge
        prep = d.extra = (_COND[ins.cond.lower()], ins.a.index, br, bv, back)
    cond, ar, br, bv, back = prep
    regs = core.regs
    if cond(regs[ar], regs[br] if br >= 0 else bv):
        return _jump(core, d, t, d.ins.target)
    if back and core.trips:  # the do-while loop ends: its next execution counts from 0
        core.trips.pop(d.index, None)
    core.records.extend((core.stream_id, d.index, core.scalar_unit, core.first_try, t, t + 1, 0, 0))
    core.pc = d.index + 1
    return t + 1


@handles(Jump)
def issue_jump(core: Core, d: Decoded, t: int) -> int:
    return _jump(core, d, t, d.ins.target)


@handles(Halt)
def issue_halt(core: Core, d: Decoded, t: int) -> int:
    _record(core, d, t, t + 1)
    core.pc = len(core.decoded)
    return t + 1
