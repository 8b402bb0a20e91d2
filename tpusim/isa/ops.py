"""The instruction kinds of the tpusim ISA, their text mnemonics and the groups they fall into.

One :class:`Op` per instruction class; the groups are plain frozensets so that a pass can ask
``instr.op in OpGroup.MXU``. Per-function tables (which VPU functions exist, their arity and cost class,
the scalar ALU functions, the compare directions) live here too, because the text parser, the verifier and
the devices all need the same lists.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Final

__all__ = [
    "COMPARE_DIRECTIONS",
    "PRECISIONS",
    "PRECISION_PASSES",
    "REDUCE_FUNCTIONS",
    "REINTERPRETS",
    "SCALAR_FUNCTIONS",
    "VPU_FUNCTIONS",
    "Op",
    "OpGroup",
    "VpuFunction",
    "vpu_computes",
]


class Op(Enum):
    """One value per instruction class; ``value`` is the mnemonic (or its prefix, for families)."""

    # -- data movement: asynchronous DMA, completion signalled on a semaphore
    DMA_START = "dma.start"
    # -- synchronisation
    SEM_SIGNAL = "sem.signal"
    SEM_WAIT = "sem.wait"
    BARRIER = "barrier"
    # -- matrix unit (weight-stationary systolic array)
    MXU_LOAD_WEIGHTS = "mxu.load_weights"
    MXU_MATMUL = "mxu.matmul"
    MXU_POP = "mxu.pop"
    # -- vector unit on VMEM blocks (family: vpu.<function>)
    VPU_MAP = "vpu"
    VPU_REDUCE = "vpu.reduce"
    VPU_BROADCAST = "vpu.broadcast"
    VPU_IOTA = "vpu.iota"
    VPU_COPY = "vpu.copy"
    VPU_RESHAPE = "vpu.reshape"
    VPU_FUSED = "vpu.fused"
    # -- cross-lane unit
    XLU_TRANSPOSE = "xlu.transpose"
    # -- scalar unit: ALU (family: s.<function>), memory, control flow
    SCALAR_ALU = "s"
    SCALAR_LOAD = "s.load"
    SCALAR_STORE = "s.store"
    BRANCH = "br"
    JUMP = "jmp"
    HALT = "halt"
    # -- escape hatch: a reference HLO computation on operand bytes, with a declared cost
    FALLBACK = "fallback"


class OpGroup:
    """Op groups as plain sets."""

    DMA: Final = frozenset({Op.DMA_START})
    SYNC: Final = frozenset({Op.SEM_SIGNAL, Op.SEM_WAIT, Op.BARRIER})
    MXU: Final = frozenset({Op.MXU_LOAD_WEIGHTS, Op.MXU_MATMUL, Op.MXU_POP})
    VPU: Final = frozenset(
        {Op.VPU_MAP, Op.VPU_FUSED, Op.VPU_REDUCE, Op.VPU_BROADCAST, Op.VPU_IOTA, Op.VPU_COPY, Op.VPU_RESHAPE}
    )
    XLU: Final = frozenset({Op.XLU_TRANSPOSE})
    SCALAR: Final = frozenset({Op.SCALAR_ALU, Op.SCALAR_LOAD, Op.SCALAR_STORE})
    CONTROL: Final = frozenset({Op.BRANCH, Op.JUMP, Op.HALT})
    FALLBACK: Final = frozenset({Op.FALLBACK})
    # Instructions that compute on memory (the ones a trace charges bytes and flops to).
    COMPUTE: Final = MXU | VPU | XLU | FALLBACK


class VpuFunction:
    """One elementwise VPU function: its HLO opcode name, operand count and cost class.

    Attributes:
        name: the HLO opcode (``add``, ``exponential``, ``compare`` ...); the mnemonic is ``vpu.<name>``.
        arity: number of source operands.
        cost_class: ``alu`` (the vector ALUs) or ``transcendental`` (the slower EUP path), a key of
            ``vpu.op_classes`` in the chip config.
    """

    __slots__ = ("arity", "cost_class", "name")

    def __init__(self, name: str, arity: int, cost_class: str) -> None:
        self.name = name
        self.arity = arity
        self.cost_class = cost_class

    def __repr__(self) -> str:
        return f"VpuFunction({self.name!r}, {self.arity}, {self.cost_class!r})"


def _functions() -> dict[str, VpuFunction]:
    alu1 = (
        "negate",
        "abs",
        "sign",
        "not",
        "floor",
        "ceil",
        "round-nearest-afz",
        "round-nearest-even",
        "is-finite",
        "popcnt",
        "count-leading-zeros",
        "copy",
        "convert",
        "bitcast-convert",
        "real",
        "imag",
    )
    alu2 = (
        "add",
        "subtract",
        "multiply",
        "maximum",
        "minimum",
        "and",
        "or",
        "xor",
        "shift-left",
        "shift-right-arithmetic",
        "shift-right-logical",
        "compare",
    )
    eup1 = (
        "exponential",
        "exponential-minus-one",
        "log",
        "log-plus-one",
        "tanh",
        "logistic",
        "sqrt",
        "rsqrt",
        "cbrt",
        "sine",
        "cosine",
        "tan",
        "erf",
    )
    eup2 = ("divide", "remainder", "power", "atan2")
    alu3 = ("select", "clamp")
    table: dict[str, VpuFunction] = {}
    for names, arity, cls in (
        (alu1, 1, "alu"),
        (alu2, 2, "alu"),
        (eup1, 1, "transcendental"),
        (eup2, 2, "transcendental"),
        (alu3, 3, "alu"),
    ):
        for n in names:
            table[n] = VpuFunction(n, arity, cls)
    # real/imag are listed by XLA as elementwise but tpusim's VPU has no complex numbers.
    del table["real"], table["imag"]
    return table


VPU_FUNCTIONS: Final[dict[str, VpuFunction]] = _functions()
"""Elementwise VPU functions by HLO opcode name."""

REINTERPRETS: Final = frozenset({"bitcast-convert"})
"""VPU functions that only retype a register's bits: free in a ``vpu.fused`` chain."""


def vpu_computes(fn: str, operand_bits: Iterable[int], result_bits: int) -> bool:
    """Whether HLO opcode ``fn`` is an elementwise VPU function on operands of ``operand_bits`` bits each
    giving ``result_bits``: a ``bitcast-convert`` only between types of one width (between widths it adds or
    removes a dimension, which no elementwise step does)."""
    return fn in VPU_FUNCTIONS and (fn not in REINTERPRETS or all(b == result_bits for b in operand_bits))


REDUCE_FUNCTIONS: Final = ("add", "multiply", "maximum", "minimum", "and", "or", "xor")
"""Combiners ``vpu.reduce`` supports (the monoids XLA reductions use)."""

COMPARE_DIRECTIONS: Final = ("EQ", "NE", "LT", "LE", "GT", "GE")
"""Directions of ``vpu.compare`` (XLA's ``comparison_direction``) and of ``br.<dir>`` (lower case)."""

SCALAR_FUNCTIONS: Final[dict[str, int]] = {
    # name -> number of source operands
    "mov": 1,
    "add": 2,
    "sub": 2,
    "mul": 2,
    "div": 2,
    "rem": 2,
    "min": 2,
    "max": 2,
    "and": 2,
    "or": 2,
    "xor": 2,
    "shl": 2,
    "shr": 2,
    "sra": 2,
    "eq": 2,
    "ne": 2,
    "lt": 2,
    "le": 2,
    "gt": 2,
    "ge": 2,
    "chip_id": 0,
    "core_id": 0,
    "num_chips": 0,
}
"""Scalar ALU functions (``s.<name> dst, a, b``) and their operand counts."""

PRECISIONS: Final = ("bf16", "bf16_3x", "bf16_6x")
"""MXU precision modes for f32 operands: one bf16 pass (XLA DEFAULT), three (HIGH), six (HIGHEST)."""

PRECISION_PASSES: Final[dict[str, tuple[int, int]]] = {"bf16": (1, 1), "bf16_3x": (2, 3), "bf16_6x": (3, 6)}
"""Per precision: (bf16 weight parts loaded, bf16 passes streamed) for f32 operands."""
