"""The contract between the sequencer and the compute units (MXU, VPU, XLU, fallback).

Each compute instruction class registers a :class:`ComputeSpec` in :data:`COMPUTE` (one registry,
filled by the module that owns the unit). The sequencer resolves the operands into
:class:`Access` values, asks ``cost`` for the closed-form timing (a pure function of the config and the
operands' layouts), lets ``schedule`` place the instruction on its unit's timeline, and calls ``execute``
(pure numpy on the memories) unless the run is timing-only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpusim.devices.engine import Event
from tpusim.errors import TpusimError
from tpusim.isa import MemRef, Space
from tpusim.memory import Shape

if TYPE_CHECKING:
    from tpusim.config import ChipConfig
    from tpusim.devices.core import Core
    from tpusim.devices.decode import Decoded
    from tpusim.devices.stores import ByteStore

__all__ = [
    "COMPUTE",
    "HANDLERS",
    "Access",
    "ComputeSpec",
    "Cost",
    "ExecutionError",
    "Handler",
    "Issued",
    "handles",
    "register_compute",
]


class ExecutionError(TpusimError):
    """An instruction that cannot execute (bad operand, out-of-range access, deadlock, ...).

    The message names the core, the instruction (text and index) and the HLO instruction it came from.
    """


class Access:
    """One memory operand, resolved at issue: where its bytes are and which byte range it touches.

    ``store`` is None in the templates decode keeps for static operands (costs never read memory);
    :meth:`at` gives the same operand in a run's memory.
    """

    __slots__ = ("address", "hi", "lo", "offsets", "shape", "sizes", "space", "store")

    def __init__(
        self,
        store: ByteStore,
        space: Space,
        address: int,
        shape: Shape,
        offsets: tuple[int, ...] | None,
        sizes: tuple[int, ...] | None,
        lo: int,
        hi: int,
    ) -> None:
        self.store = store
        self.space = space
        self.address = address  # absolute address of the array
        self.shape = shape
        self.offsets = offsets  # resolved window offsets, None for the whole array
        self.sizes = sizes
        self.lo = lo  # absolute byte range touched
        self.hi = hi

    @property
    def dims(self) -> tuple[int, ...]:
        return self.sizes if self.sizes is not None else self.shape.dimensions

    def at(self, store: ByteStore) -> Access:
        """This operand in ``store``."""
        return Access(store, self.space, self.address, self.shape, self.offsets, self.sizes, self.lo, self.hi)


@dataclass(frozen=True, slots=True)
class Cost:
    """Closed-form cost of one instruction on its unit.

    Attributes:
        occupancy: cycles the unit is busy (it can start the next instruction after them).
        latency: further cycles until the result is complete.
        nbytes: bytes read and written (trace).
        flops: arithmetic operations (trace).
        unit: which unit kind runs it: ``mxu``, ``vpu``, ``xlu`` or ``fallback``.
    """

    occupancy: int
    latency: int
    nbytes: int
    flops: int
    unit: str


@dataclass(frozen=True, slots=True)
class ComputeSpec:
    """How one compute instruction class runs.

    Attributes:
        refs: ``ins -> (read operands, written operands)`` as MemRefs, in a fixed order.
        check: static checks against the config at load time; returns a message or None.
        cost: ``(cfg, ins, reads, writes) -> Cost``.
        execute: ``(core, ins, reads, writes) -> None``: the numeric effect.
    """

    refs: Callable[[Any], tuple[tuple[MemRef, ...], tuple[MemRef, ...]]]
    check: Callable[[ChipConfig, Any], str | None]
    cost: Callable[[ChipConfig, Any, tuple[Access, ...], tuple[Access, ...]], Cost]
    execute: Callable[[Any, Any, tuple[Access, ...], tuple[Access, ...]], None]


COMPUTE: dict[type, ComputeSpec] = {}


def register_compute(cls: type, spec: ComputeSpec) -> None:
    COMPUTE[cls] = spec


Issued = int | Event
"""What an issue handler returns: the cycle the sequencer may issue its next instruction at, or an event to
wait for before it tries the same instruction again."""

Handler = Callable[["Core", "Decoded", int], Issued]
HANDLERS: dict[type, Handler] = {}
"""Instruction class -> issue handler ``(core, decoded, t) -> next cycle | event to wait for``."""


def handles(*classes: type) -> Callable[[Handler], Handler]:
    """Register the decorated function as the issue handler of ``classes``."""

    def register(fn: Handler) -> Handler:
        for c in classes:
            HANDLERS[c] = fn
        return fn

    return register
