"""Operands of tpusim instructions: memory spaces, scalar registers, constants and memory references.

A :class:`MemRef` names an array in a memory *in layout terms*: the bytes at ``address`` are exactly
``tpusim.memory.pack(array, shape)`` for the array ``shape`` describes (layout, tiles and padding
included). An optional :class:`Window` selects a rectangle of that array (XLA's slice / dynamic-slice):
the operand's logical value is then the window, in row-major order of its sizes. Offsets may be scalar
registers, read when the instruction issues; with ``clamp`` they are clamped into range as XLA's
dynamic-slice does, without it an out-of-range window is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from math import prod

from tpusim.errors import TpusimError
from tpusim.memory import ElementType, Shape, element_type

__all__ = ["Const", "IsaError", "MemRef", "Operand", "Reg", "Scalar", "Space", "Window"]


class IsaError(TpusimError):
    """An instruction or program that breaks a rule of the ISA (bad operand, unknown label, ...)."""


class Space(Enum):
    """Address spaces. HBM is per chip and shared by its cores; VMEM and SMEM belong to one core."""

    HBM = "hbm"
    VMEM = "vmem"
    SMEM = "smem"


@dataclass(frozen=True, slots=True)
class Reg:
    """Scalar register ``s<index>`` (32-bit, two's complement)."""

    index: int

    def __post_init__(self) -> None:
        if self.index < 0:
            raise IsaError(f"scalar register index {self.index} is negative")

    def __str__(self) -> str:
        return f"s{self.index}"


Scalar = int | Reg
"""A scalar operand: an immediate integer or a register."""


@dataclass(frozen=True, slots=True, eq=False)
class Const:
    """A constant splatted over a vector operand, e.g. ``f32(1.5)``, ``s32(-3)``, ``pred(1)``.

    Two constants are equal when they print the same (so NaN equals NaN and -0.0 differs from 0.0).
    """

    value: float | int | bool
    etype: ElementType

    def __post_init__(self) -> None:
        if not isinstance(self.etype, ElementType):
            object.__setattr__(self, "etype", element_type(self.etype))
        if self.etype.dtype is None or self.etype.is_complex:
            raise IsaError(f"a constant cannot have element type {self.etype}")
        if not self.etype.is_float and not isinstance(self.value, (int, bool)):
            raise IsaError(f"constant {self.value!r} of integer type {self.etype} must be an integer")

    def _key(self) -> tuple[str, str]:
        v = self.value
        return self.etype.name, float(v).hex() if self.etype.is_float else str(int(v))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Const) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        v = self.value
        text = repr(float(v)) if self.etype.is_float else str(int(v))
        return f"{self.etype.name}({text})"


@dataclass(frozen=True, slots=True)
class Window:
    """A rectangle of an array: per dimension an offset (immediate or register) and a size.

    Attributes:
        offsets: start index per dimension; a :class:`Reg` is read at issue (dynamic-slice).
        sizes: extent per dimension.
        clamp: clamp each start into ``[0, dim - size]`` as XLA's dynamic-slice does; without it a window
            that leaves the array is an error.
    """

    offsets: tuple[Scalar, ...]
    sizes: tuple[int, ...]
    clamp: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", tuple(self.offsets))
        object.__setattr__(self, "sizes", tuple(int(s) for s in self.sizes))
        if len(self.offsets) != len(self.sizes):
            raise IsaError(f"window has {len(self.offsets)} offsets but {len(self.sizes)} sizes")
        for s in self.sizes:
            if s < 0:
                raise IsaError(f"window size {s} is negative")
        for o in self.offsets:
            if not isinstance(o, Reg) and o < 0:
                raise IsaError(f"window offset {o} is negative")

    @property
    def is_static(self) -> bool:
        return not any(isinstance(o, Reg) for o in self.offsets)

    def __str__(self) -> str:
        parts = []
        for o, s in zip(self.offsets, self.sizes):
            parts.append(f"{o}:+{s}" if isinstance(o, Reg) else f"{o}:{o + s}")
        return "[" + ",".join(parts) + (" clamp" if self.clamp else "") + "]"


@dataclass(frozen=True, slots=True)
class MemRef:
    """An array (or a window of one) at an address of a memory space.

    Attributes:
        space: the memory.
        address: byte address of the array's first byte (``shape.byte_size`` bytes follow).
        shape: element type, dimensions and layout of the whole array.
        window: the rectangle the instruction reads or writes; None for the whole array.
        base: a register added to ``address`` at issue (address arithmetic in loops); None for none.
    """

    space: Space
    address: int
    shape: Shape
    window: Window | None = None
    base: Reg | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.space, Space):
            object.__setattr__(self, "space", Space(self.space))
        if not isinstance(self.shape, Shape):
            raise IsaError(f"a memory reference needs an array shape, not {self.shape}")
        if True in self.shape.dynamic:  # (an unbounded dimension is a dynamic one)
            raise IsaError(f"a memory reference needs a static shape, not {self.shape}")
        if self.shape.element_type.dtype is None:
            raise IsaError(f"element type {self.shape.element_type} has no bytes")
        if self.address < 0:
            raise IsaError(f"address {self.address:#x} is negative")
        w = self.window
        if w is not None:
            if len(w.sizes) != self.shape.rank:
                raise IsaError(f"window {w} has {len(w.sizes)} dimensions but {self.shape} has {self.shape.rank}")
            for i, (o, s, d) in enumerate(zip(w.offsets, w.sizes, self.shape.dimensions)):
                if s > d:
                    raise IsaError(f"window {w} is {s} wide in dimension {i} but {self.shape} has only {d}")
                if not isinstance(o, Reg) and o + s > d and not w.clamp:
                    raise IsaError(f"window {w} ends at {o + s} in dimension {i}, past the size {d} of {self.shape}")

    # ------------------------------------------------------------------ derived facts
    @property
    def dims(self) -> tuple[int, ...]:
        """Logical dimensions of the operand's value (the window's sizes, or the array's dimensions)."""
        return self.window.sizes if self.window is not None else self.shape.dimensions

    @property
    def element_type(self) -> ElementType:
        return self.shape.element_type

    @property
    def element_count(self) -> int:
        return prod(self.dims)

    @property
    def byte_size(self) -> int:
        """Bytes of the whole array in memory (padding included)."""
        return self.shape.byte_size

    @property
    def is_static(self) -> bool:
        """True when neither the address nor the window depends on a register."""
        return self.base is None and (self.window is None or self.window.is_static)

    @property
    def registers(self) -> tuple[Reg, ...]:
        regs = [self.base] if self.base is not None else []
        if self.window is not None:
            regs += [o for o in self.window.offsets if isinstance(o, Reg)]
        return tuple(regs)

    def shares_bytes(self, other: MemRef) -> bool:
        """Whether the two whole arrays (windows aside; static addresses) share a byte of one memory."""
        return (
            self.space == other.space
            and self.address < other.address + other.shape.byte_size
            and other.address < self.address + self.shape.byte_size
        )

    def __str__(self) -> str:
        base = f"{self.base}+" if self.base is not None else ""
        text = f"{self.space.value}[{base}{self.address:#x}] {self.shape}"
        return text + (str(self.window) if self.window is not None else "")


Operand = MemRef | Const | Reg
"""A vector-unit source: a memory block, a splatted constant, or a splatted scalar register."""
