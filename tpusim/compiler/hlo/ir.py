"""The HLO IR: frozen values for modules, computations, instructions and their attributes.

This is the contract between the HLO parser, the printer, the verifier, the reference interpreter
and the compiler. Every node is a frozen, slotted dataclass; collections are tuples; attribute values
are the typed values below (or :class:`Raw` for text kept verbatim), so two parses of the same text
compare equal.

Opcodes are XLA's spellings (``add``, ``get-tuple-element``, ``all-reduce-start`` ...). Operands are
names of instructions of the same computation; called computations are names in the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tpusim.memory import AnyShape, Shape, TupleShape

__all__ = [
    "SEQUENTIAL_CALLS",
    "Attributes",
    "Computation",
    "ConvDims",
    "Instruction",
    "Literal",
    "Module",
    "PadDim",
    "ProgramShape",
    "Raw",
    "ReplicaGroups",
    "SliceDim",
    "SourceLoc",
    "Window",
    "WindowDim",
    "custom_call_target",
    "has_tiled_layouts",
    "sequential_callees",
]


# ---------------------------------------------------------------------------------------------
# Attribute values
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Raw:
    """An attribute value kept as the exact text that followed ``name=`` (sharding, backend_config, ...)."""

    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class SliceDim:
    """One dimension of ``slice={[start:limit:stride], ...}``."""

    start: int
    limit: int
    stride: int = 1


@dataclass(frozen=True, slots=True)
class PadDim:
    """One dimension of ``padding=low_high_interior x ...`` (pad instruction); low/high may be negative."""

    low: int
    high: int
    interior: int = 0


@dataclass(frozen=True, slots=True)
class WindowDim:
    """One dimension of a ``window={size=... stride=... pad=... lhs_dilate=... rhs_dilate=... rhs_reversal=...}``."""

    size: int
    stride: int = 1
    pad_low: int = 0
    pad_high: int = 0
    lhs_dilate: int = 1  # XLA's base_dilation
    rhs_dilate: int = 1  # XLA's window_dilation
    reversal: bool = False

    @property
    def trivial(self) -> bool:
        """Every output position reads its own operand position alone (size 1, no stride, pad or dilation)."""
        return (self.size, self.stride, self.pad_low, self.pad_high, self.lhs_dilate, self.rhs_dilate) == (
            1, 1, 0, 0, 1, 1
        )  # fmt: skip

    def covers(self, extent: int) -> bool:
        """True when every window over an operand dimension of ``extent`` holds the whole dimension: the
        reduce-window is then a reduction of that dimension broadcast back along it (XLA:TPU writes a row
        maximum kept at full size, softmax's, as a window of ``2 * extent - 1`` padded ``extent - 1`` each side).
        """
        if self.lhs_dilate != 1 or self.rhs_dilate != 1 or extent < 1:
            return False
        outputs = (extent + self.pad_low + self.pad_high - self.size) // self.stride + 1
        return outputs >= 1 and (outputs - 1) * self.stride <= self.pad_low and self.size - self.pad_low >= extent


@dataclass(frozen=True, slots=True)
class Window:
    dims: tuple[WindowDim, ...]


@dataclass(frozen=True, slots=True)
class ConvDims:
    """Convolution dimension numbers, from ``dim_labels=b01f_01io->b01f``.

    ``*_spatial`` list the spatial dimension numbers in label order (``0``, ``1``, ...).
    """

    input_batch: int
    input_feature: int
    input_spatial: tuple[int, ...]
    kernel_input_feature: int
    kernel_output_feature: int
    kernel_spatial: tuple[int, ...]
    output_batch: int
    output_feature: int
    output_spatial: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReplicaGroups:
    """``replica_groups`` in any printed form (``{{0,1},{2,3}}``, ``[2,2]<=[4]``, ``[2,2]<=[2,2]T(1,0)``).

    Attributes:
        groups: the explicit groups, expanded from the iota form when needed.
        text: the text as written, printed back unchanged.
    """

    groups: tuple[tuple[int, ...], ...]
    text: str


@dataclass(frozen=True, slots=True, eq=False)
class Literal:
    """A constant's value: a numpy array with the constant's shape and element type (a tuple literal holds
    a tuple of Literals in ``tuple_elements``)."""

    shape: AnyShape
    value: np.ndarray | None = None
    tuple_elements: tuple[Literal, ...] = ()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Literal) or self.shape != other.shape:
            return False
        if self.value is None or other.value is None:
            return self.value is other.value and self.tuple_elements == other.tuple_elements
        a, b = self.value, other.value
        return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()

    def __hash__(self) -> int:
        return hash((self.shape, None if self.value is None else self.value.tobytes(), self.tuple_elements))


@dataclass(frozen=True, slots=True)
class ProgramShape:
    """A computation's signature, e.g. the module header's ``entry_computation_layout={(f32[2]{0})->f32[]}``.

    Attributes:
        parameters: the parameter shapes, in parameter-number order.
        result: the result shape.
        text: the text as written (kept for reference; not part of equality).
    """

    parameters: tuple[AnyShape, ...]
    result: AnyShape
    text: str = field(default="", compare=False)

    def __str__(self) -> str:
        return "(" + ", ".join(str(p) for p in self.parameters) + ")->" + str(self.result)


class Attributes:
    """An ordered, immutable ``name -> value`` mapping of an instruction's (or module's) attributes.

    Keeps the order of the text so the printer writes attributes back where they were.
    """

    __slots__ = ("_items", "_map")
    _items: tuple[tuple[str, Any], ...]
    _map: dict[str, Any]

    def __init__(self, items: Any = ()) -> None:
        pairs = tuple(items.items() if isinstance(items, dict) else items)
        object.__setattr__(self, "_items", pairs)
        object.__setattr__(self, "_map", dict(pairs))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Attributes are immutable")

    def __getitem__(self, name: str) -> Any:
        return self._map[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self._map.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._map

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> tuple[tuple[str, Any], ...]:
        return self._items

    def replace(self, **changes: Any) -> Attributes:
        """A copy with some values changed or added (added ones go last)."""
        out = [(k, changes.pop(k) if k in changes else v) for k, v in self._items]
        return Attributes(out + list(changes.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attributes) and self._items == other._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"Attributes({dict(self._items)!r})"


# ---------------------------------------------------------------------------------------------
# Nodes
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SourceLoc:
    """Where an instruction came from: its place in the HLO text and, from ``metadata``, in user code."""

    line: int
    column: int = 1
    hlo_file: str | None = None
    op_name: str | None = None
    source_file: str | None = None
    source_line: int | None = None
    source_function: str | None = None  # from the stack-frame tables JAX writes (FunctionNames)

    @property
    def user_code(self) -> str | None:
        """``file:line`` of the user's code, with ``(function)`` when the HLO names it; None when unknown."""
        if not self.source_file:
            return None
        where = f"{self.source_file}:{self.source_line}"
        return f"{where} ({self.source_function})" if self.source_function else where

    def __str__(self) -> str:
        user = f" ({self.source_file}:{self.source_line})" if self.source_file else ""
        where = f"{self.hlo_file}:" if self.hlo_file else "line "
        return f"{where}{self.line}{user}"


@dataclass(frozen=True, slots=True)
class Instruction:
    """One HLO instruction ``name = shape opcode(operands), attributes``.

    Attributes:
        name: the instruction's name without the ``%`` sigil.
        opcode: XLA's opcode spelling.
        shape: the result shape (with the layout written in the text, if any).
        operands: operand instruction names, in order.
        attributes: typed attribute values; special operand-position values live here too:
            ``parameter_number`` (int) for ``parameter(N)``, ``literal`` (:class:`Literal`) for constants.
        loc: source location (not part of equality).
    """

    name: str
    opcode: str
    shape: AnyShape
    operands: tuple[str, ...] = ()
    attributes: Attributes = field(default_factory=Attributes)
    loc: SourceLoc | None = field(default=None, compare=False)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attributes.get(name, default)

    @property
    def array_shape(self) -> Shape:
        """The result shape, which must be an array shape."""
        assert isinstance(self.shape, Shape), f"{self.name} has tuple shape {self.shape}"
        return self.shape

    def async_wrapped_instruction(self) -> Instruction | None:
        """For an ``async-start`` written in XLA's short form (``custom-call-start(...)``, no ``calls=``), the
        wrapped operation as an instruction of its own: same name and operands, the wrapped opcode, the
        async value's result shape (element 1 of the tuple) and the wrapped op's attributes. None otherwise."""
        wrapped = self.attributes.get("async_wrapped_opcode")
        if self.opcode != "async-start" or wrapped is None:
            return None
        shape = self.shape
        if not isinstance(shape, Shape) and len(shape.elements) > 1:
            shape = shape.elements[1]
        skip = ("async_wrapped_opcode", "async_execution_thread")
        attributes = Attributes((k, v) for k, v in self.attributes.items() if k not in skip)
        return Instruction(self.name, wrapped, shape, self.operands, attributes, self.loc)

    def called_computations(self) -> tuple[str, ...]:
        """Names of the computations this instruction calls, in attribute order."""
        out: list[str] = []
        for key, value in self.attributes.items():
            if key in _CALL_ATTRIBUTES:
                out.extend(value if isinstance(value, tuple) else (value,))
        return tuple(out)


SEQUENTIAL_CALLS: dict[str, tuple[str, ...]] = {
    "while": ("condition", "body"),
    "call": ("to_apply",),
    "conditional": ("branch_computations", "true_computation", "false_computation"),
}
"""Per opcode, the attributes naming the computations it runs as code of their own (a loop's condition and
body, a conditional's branches, a called computation), not inside one instruction as a fusion or a reducer."""


def sequential_callees(instr: Instruction) -> tuple[str, ...]:
    """The computations ``instr`` runs as code of their own (:data:`SEQUENTIAL_CALLS`), in the order its
    attributes give them (a conditional's branches in branch order)."""
    out: list[str] = []
    for key in SEQUENTIAL_CALLS.get(instr.opcode, ()):
        value = instr.attr(key)
        if value is not None:
            out.extend(value if isinstance(value, tuple) else (value,))
    return tuple(out)


def has_tiled_layouts(module: Module) -> bool:
    """Whether some value of ``module`` has a tiled layout: a module laid out already (XLA:TPU's compiled
    ones), whose layouts the compiler keeps, rather than one whose layouts it chooses (JAX's)."""
    return any(_tiled(i.shape) for c in module.computations for i in c.instructions)


def _tiled(shape: AnyShape) -> bool:
    if isinstance(shape, TupleShape):
        return any(_tiled(e) for e in shape.elements)
    return shape.has_tiles


def custom_call_target(instr: Instruction) -> str:
    """The ``custom_call_target`` of ``instr`` as a plain string ('' when it has none)."""
    return str(instr.attr("custom_call_target", "")).strip('"')


# Attributes whose values are computation names (a str, or a tuple of str for branch_computations).
_CALL_ATTRIBUTES = frozenset(
    {
        "to_apply",
        "calls",
        "condition",
        "body",
        "branch_computations",
        "true_computation",
        "false_computation",
        "select",
        "scatter",
        "comparator",
        "called_computations",
    }
)


@dataclass(frozen=True, slots=True)
class Computation:
    """A named list of instructions with one root.

    Attributes:
        name: without ``%``.
        instructions: in text order (the printer keeps it).
        root: name of the ROOT instruction (the last one when none is marked).
        is_entry: True for the module's ENTRY computation.
        attributes: text after the body's ``}``-free header, e.g. ``execution_thread="main"``.
    """

    name: str
    instructions: tuple[Instruction, ...]
    root: str
    is_entry: bool = False
    attributes: Attributes = field(default_factory=Attributes)
    _by_name: dict[str, Instruction] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {i.name: i for i in self.instructions})

    def __getitem__(self, name: str) -> Instruction:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def root_instruction(self) -> Instruction:
        return self._by_name[self.root]

    @property
    def parameters(self) -> tuple[Instruction, ...]:
        """Parameter instructions ordered by parameter number."""
        params = [i for i in self.instructions if i.opcode == "parameter"]
        return tuple(sorted(params, key=lambda i: i.attr("parameter_number")))


@dataclass(frozen=True, slots=True)
class Module:
    """An HLO module.

    Attributes:
        name: the name after ``HloModule``.
        computations: in text order.
        entry: name of the entry computation.
        attributes: header attributes (``entry_computation_layout``, ``replica_count``, ``num_partitions``,
            ``is_scheduled``, ``input_output_alias`` ...), typed where they have meaning, :class:`Raw` otherwise.
        sections: tables printed after the header (``FileNames``, ``FunctionNames``, ``FileLocations``,
            ``StackFrames``) as ``(title, lines)`` pairs, kept to print back.
    """

    name: str
    computations: tuple[Computation, ...]
    entry: str
    attributes: Attributes = field(default_factory=Attributes)
    sections: tuple[tuple[str, tuple[str, ...]], ...] = ()
    _by_name: dict[str, Computation] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {c.name: c for c in self.computations})

    def __getitem__(self, name: str) -> Computation:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def entry_computation(self) -> Computation:
        return self._by_name[self.entry]

    @property
    def replica_count(self) -> int:
        return int(self.attributes.get("replica_count", 1))

    @property
    def num_partitions(self) -> int:
        return int(self.attributes.get("num_partitions", 1))
