"""A program: instruction streams per core (and chip), labels, a symbol table and fallback kernels."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from math import ceil
from typing import Any

from tpusim.isa.instructions import (
    Branch,
    DmaStart,
    Fallback,
    Halt,
    Instruction,
    Jump,
    ScalarAlu,
    ScalarLoad,
    ScalarStore,
    SemSignal,
    SemWait,
    VpuFused,
    VpuMap,
)
from tpusim.isa.operands import IsaError, MemRef, Space

__all__ = ["ASYNC_SEQUENCER", "NAME_PATTERN", "FallbackKernel", "Program", "Stream", "StreamBuilder", "Symbol"]

ASYNC_SEQUENCER = 1
"""The ``sequencer`` of a core's second instruction stream: it issues only DMA, semaphore, scalar and
elementwise vector instructions (:data:`ASYNC_SEQUENCER_OPS`), into the core's own DMA engines and vector
unit, while the main sequencer (0) runs kernels. The compiler puts an async collective there, so that its
ring steps and reductions go on while the kernels between its ``-start`` and ``-done`` run (docs/isa.md,
"Sequencers")."""

ASYNC_SEQUENCER_OPS: tuple[type, ...] = (
    DmaStart, SemSignal, SemWait, ScalarAlu, ScalarLoad, ScalarStore, Branch, Jump, Halt, VpuMap, VpuFused,
)  # fmt: skip

NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
"""Names of symbols, kernels, labels and HLO instructions (XLA's instruction-name characters)."""


def _check_name(name: str, what: str) -> None:
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise IsaError(f"{what} name {name!r} must match {NAME_PATTERN.pattern}")


@dataclass(frozen=True, slots=True)
class Symbol:
    """A named buffer: where an array lives, so traces, verifiers and ``run`` inputs can name it.

    Attributes:
        name: unique in the program (usually the HLO value's name).
        ref: space, address and shape-with-layout of the whole array (no window, no base register).
        chip: the chip holding it; None for the same address on every chip (SPMD programs).
        core: for VMEM and SMEM, the core whose memory holds it.
    """

    name: str
    ref: MemRef
    chip: int | None = None
    core: int = 0

    def __post_init__(self) -> None:
        _check_name(self.name, "symbol")
        if self.ref.window is not None or self.ref.base is not None:
            raise IsaError(f"symbol {self.name!r}: a symbol names a whole array at a fixed address")
        if self.ref.space is Space.HBM and self.core != 0:
            raise IsaError(f"symbol {self.name!r}: HBM belongs to the chip, not to core {self.core}")


@dataclass(frozen=True, slots=True)
class FallbackKernel:
    """An HLO computation run by the reference interpreter on operand bytes, with a declared cost.

    Cost: ``fixed_cycles + ceil(cycles_per_byte * bytes + cycles_per_flop * flops)`` where ``bytes`` is the
    size of all operand blocks as the device sees them and ``flops`` is declared here by the compiler.

    Attributes:
        name: the key :class:`~tpusim.isa.instructions.Fallback` instructions use.
        hlo: an HLO module in text form; its entry parameters and results match the instruction's operands.
    """

    name: str
    hlo: str
    fixed_cycles: int = 0
    cycles_per_byte: float = 0.0
    cycles_per_flop: float = 0.0
    flops: int = 0

    def __post_init__(self) -> None:
        _check_name(self.name, "fallback kernel")
        if self.fixed_cycles < 0 or self.cycles_per_byte < 0 or self.cycles_per_flop < 0 or self.flops < 0:
            raise IsaError(f"fallback kernel {self.name!r}: costs and flops must not be negative")
        if "\n>>>" in "\n" + self.hlo:
            raise IsaError(f"fallback kernel {self.name!r}: the HLO text may not contain a line starting with '>>>'")

    def cycles(self, nbytes: int) -> int:
        return self.fixed_cycles + ceil(self.cycles_per_byte * nbytes + self.cycles_per_flop * self.flops)


@dataclass(frozen=True, slots=True)
class Stream:
    """The instruction stream of one core.

    Attributes:
        core: core index within the chip.
        chip: the chip; None runs the stream on every chip of the system (SPMD, ``s.chip_id`` tells them
            apart).
        instructions: the instructions, in order.
        labels: ``(name, index)`` pairs; a label names the instruction at ``index`` (``len(instructions)``
            for the end).
        sequencer: 0 for the core's main sequencer, :data:`ASYNC_SEQUENCER` for its async sequencer (which needs
            a main stream on the same core and chips).
    """

    core: int
    instructions: tuple[Instruction, ...]
    labels: tuple[tuple[str, int], ...] = ()
    chip: int | None = None
    sequencer: int = 0
    _targets: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "instructions", tuple(self.instructions))
        object.__setattr__(self, "labels", tuple((str(n), int(i)) for n, i in self.labels))
        targets: dict[str, int] = {}
        for name, index in self.labels:
            _check_name(name, "label")
            if name in targets:
                raise IsaError(f"{self.where}: label {name!r} is defined twice")
            if not 0 <= index <= len(self.instructions):
                raise IsaError(f"{self.where}: label {name!r} points at {index}, outside the stream")
            targets[name] = index
        object.__setattr__(self, "_targets", targets)
        for i, ins in enumerate(self.instructions):
            if isinstance(ins, (Branch, Jump)) and ins.target not in targets:
                raise IsaError(f"{self.where}: instruction {i} jumps to undefined label {ins.target!r}")
        if self.core < 0 or (self.chip is not None and self.chip < 0):
            raise IsaError(f"{self.where}: negative core or chip number")
        if self.sequencer not in (0, ASYNC_SEQUENCER):
            raise IsaError(f"{self.where}: sequencer {self.sequencer} is not 0 (main) or {ASYNC_SEQUENCER} (async)")
        if self.sequencer == ASYNC_SEQUENCER:
            for i, ins in enumerate(self.instructions):
                if not isinstance(ins, ASYNC_SEQUENCER_OPS):
                    raise IsaError(
                        f"{self.where}: instruction {i} is a {type(ins).__name__}; the async sequencer issues only "
                        + ", ".join(c.__name__ for c in ASYNC_SEQUENCER_OPS)
                    )

    @property
    def where(self) -> str:
        chip = "every chip" if self.chip is None else f"chip {self.chip}"
        seq = "'s async sequencer" if self.sequencer == ASYNC_SEQUENCER else ""
        return f"stream of core {self.core}{seq} on {chip}"

    def target(self, label: str) -> int:
        return self._targets[label]

    def labels_at(self, index: int) -> list[str]:
        return [n for n, i in self.labels if i == index]


@dataclass(frozen=True, slots=True)
class Program:
    """Everything a system runs.

    Attributes:
        streams: one per (chip, core); a stream with ``chip=None`` runs on every chip.
        symbols: named buffers.
        fallbacks: fallback kernels by name.
        name: a label for reports.
    """

    streams: tuple[Stream, ...]
    symbols: tuple[Symbol, ...] = ()
    fallbacks: tuple[FallbackKernel, ...] = ()
    name: str = "program"
    _symbols: dict[str, Symbol] = field(init=False, repr=False, compare=False, hash=False)
    _fallbacks: dict[str, FallbackKernel] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "streams", tuple(self.streams))
        object.__setattr__(self, "symbols", tuple(self.symbols))
        object.__setattr__(self, "fallbacks", tuple(self.fallbacks))
        syms: dict[str, Symbol] = {}
        for s in self.symbols:
            if s.name in syms:
                raise IsaError(f"symbol {s.name!r} is defined twice")
            syms[s.name] = s
        kernels: dict[str, FallbackKernel] = {}
        for k in self.fallbacks:
            if k.name in kernels:
                raise IsaError(f"fallback kernel {k.name!r} is defined twice")
            kernels[k.name] = k
        object.__setattr__(self, "_symbols", syms)
        object.__setattr__(self, "_fallbacks", kernels)
        seen: dict[tuple[int, int], set[int | None]] = {}
        for st in self.streams:
            chips = seen.setdefault((st.core, st.sequencer), set())
            if st.chip in chips or (st.chip is None and chips) or None in chips:
                raise IsaError(f"two streams for core {st.core} on the same chip ({st.where})")
            chips.add(st.chip)
            for i, ins in enumerate(st.instructions):
                if isinstance(ins, Fallback) and ins.kernel not in kernels:
                    raise IsaError(f"{st.where}: instruction {i} uses undefined fallback kernel {ins.kernel!r}")

    def symbol(self, name: str) -> Symbol:
        try:
            return self._symbols[name]
        except KeyError:
            raise IsaError(f"program has no symbol {name!r}; known: {', '.join(self._symbols) or 'none'}") from None

    def fallback(self, name: str) -> FallbackKernel:
        return self._fallbacks[name]

    @property
    def instruction_count(self) -> int:
        return sum(len(s.instructions) for s in self.streams)

    @staticmethod
    def single(
        instructions: Any, labels: Any = (), symbols: Any = (), fallbacks: Any = (), name: str = "program"
    ) -> Program:
        """A one-core program (core 0 of every chip)."""
        return Program((Stream(0, tuple(instructions), tuple(labels)),), tuple(symbols), tuple(fallbacks), name)


class StreamBuilder:
    """Collect instructions and labels, then :meth:`build` a :class:`Stream`.

    >>> from tpusim.isa import ScalarAlu, Branch, Reg
    >>> b = StreamBuilder(core=0)
    >>> b.emit(ScalarAlu("mov", Reg(1), 0))
    >>> b.label("loop")
    >>> b.emit(ScalarAlu("add", Reg(1), Reg(1), 1))
    >>> b.emit(Branch("lt", Reg(1), 10, "loop"))
    >>> len(b.build().instructions)
    3
    """

    def __init__(self, core: int = 0, chip: int | None = None, sequencer: int = 0) -> None:
        self.core = core
        self.chip = chip
        self.sequencer = sequencer
        self.instructions: list[Instruction] = []
        self.labels: list[tuple[str, int]] = []

    def emit(self, *instructions: Instruction) -> None:
        self.instructions.extend(instructions)

    def label(self, name: str) -> None:
        self.labels.append((name, len(self.instructions)))

    def build(self) -> Stream:
        return Stream(self.core, tuple(self.instructions), tuple(self.labels), self.chip, self.sequencer)
