"""The text form of programs: one instruction per line, printed by :func:`print_program` and read back by
:func:`parse_program` into an equal :class:`~tpusim.isa.program.Program`.

Layout of a program text (``#`` starts a comment outside fallback blocks)::

    program "matmul"
    symbol x hbm[0x0] f32[128,256]{1,0:T(8,128)}
    fallback sort.1 fixed_cycles=100 cycles_per_byte=0.5 cycles_per_flop=0.0 flops=0 <<<
    HloModule sort ...
    >>>
    stream core=0 chip=*
      dma.start hbm[0x0] f32[128,256]{1,0:T(8,128)}[0:128,0:128] -> vmem[0x0] f32[128,128]{1,0:T(8,128)} sem=3 @fusion.3
      sem.wait sem=3 count=1
    loop:
      s.add s1 <- s1, 1
      br.lt s1, 8 -> loop

An instruction is ``mnemonic operands keywords [control] [@hlo]``. Memory operands read
``space[address] shape`` or ``space[sN+address] shape``, optionally followed by a window
``[start:limit, sN:+size ...]`` (`` clamp`` before the ``]`` clamps dynamic starts); constants read
``f32(1.5)``; registers ``s3``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from tpusim.errors import LayoutError, SourceError
from tpusim.isa.instructions import (
    Barrier,
    Branch,
    DmaStart,
    Fallback,
    FusedOp,
    Halt,
    Instruction,
    Jump,
    MxuLoadWeights,
    MxuMatmul,
    MxuPop,
    ScalarAlu,
    ScalarLoad,
    ScalarStore,
    SemSignal,
    SemWait,
    VpuBroadcast,
    VpuCopy,
    VpuFused,
    VpuIota,
    VpuMap,
    VpuReduce,
    VpuReshape,
    XluTranspose,
)
from tpusim.isa.operands import Const, IsaError, MemRef, Operand, Reg, Scalar, Space, Window
from tpusim.isa.ops import SCALAR_FUNCTIONS, VPU_FUNCTIONS
from tpusim.isa.program import NAME_PATTERN, FallbackKernel, Program, Stream, Symbol
from tpusim.memory import ELEMENT_TYPES, Shape, ShapeReader

__all__ = ["IsaParseError", "format_instruction", "mnemonic", "parse_instruction", "parse_program", "print_program"]


class IsaParseError(SourceError):
    """Program text that cannot be read; says where, shows the line and points at the column."""

    kind = "ISA parse error"


# ---------------------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------------------
def _kw(**items: Any) -> str:
    out = []
    for k, v in items.items():
        if v is None or v is False:
            continue
        if v is True:
            out.append(k)
        elif isinstance(v, tuple):
            out.append(f"{k}=({','.join(map(str, v))})")
        else:
            out.append(f"{k}={v}")
    return (" " + " ".join(out)) if out else ""


def _srcs(ops: tuple[Any, ...]) -> str:
    return ", ".join(map(str, ops))


_PRINTERS: dict[type, Callable[[Any], str]] = {
    DmaStart: lambda i: (
        f"dma.start {i.src} -> {i.dst}"
        + _kw(
            sem=i.sem,
            chip=i.chip,
            dst_core=i.dst_core,
            dst_sem=i.dst_sem,
            route=i.route,
            tie=None if i.tie == 1 else i.tie,
        )
    ),
    SemSignal: lambda i: "sem.signal" + _kw(sem=i.sem, count=i.count, core=i.core, chip=i.chip, fence=i.fence),
    SemWait: lambda i: "sem.wait" + _kw(sem=i.sem, count=i.count),
    Barrier: lambda i: "barrier" + _kw(id=i.id, scope=i.scope),
    MxuLoadWeights: lambda i: (
        f"mxu.load_weights {i.src}" + _kw(mxu=i.mxu, transpose=i.transpose, precision=i.precision)
    ),
    MxuMatmul: lambda i: (
        f"mxu.matmul {i.lhs}" + _kw(mxu=i.mxu, acc=i.acc, accumulate=i.accumulate, precision=i.precision)
    ),
    MxuPop: lambda i: f"mxu.pop {i.dst}" + _kw(mxu=i.mxu, acc=i.acc),
    VpuMap: lambda i: f"vpu.{i.fn} {i.dst} <- {_srcs(i.srcs)}" + _kw(direction=i.direction),
    VpuFused: lambda i: f"vpu.fused {i.dst} <- {_srcs(i.srcs)} ops=[{' '.join(map(str, i.ops))}]",
    VpuReduce: lambda i: f"vpu.reduce {i.dst} <- {i.src}" + _kw(fn=i.fn, dims=i.dims, accumulate=i.accumulate),
    VpuBroadcast: lambda i: f"vpu.broadcast {i.dst} <- {i.src}" + _kw(dims=i.dims),
    VpuIota: lambda i: f"vpu.iota {i.dst}" + _kw(dimension=i.dimension),
    VpuCopy: lambda i: f"vpu.copy {i.dst} <- {i.src}" + _kw(strides=i.strides, dst_strides=i.dst_strides),
    VpuReshape: lambda i: f"vpu.reshape {i.dst} <- {i.src}",
    XluTranspose: lambda i: f"xlu.transpose {i.dst} <- {i.src}" + _kw(permutation=i.permutation),
    ScalarAlu: lambda i: (
        f"s.{i.fn} {i.dst}" + (f" <- {_srcs(tuple(x for x in (i.a, i.b) if x is not None))}" if i.a is not None else "")
    ),
    ScalarLoad: lambda i: f"s.load {i.dst} <- {i.src}",
    ScalarStore: lambda i: f"s.store {i.dst} <- {i.src}",
    Branch: lambda i: f"br.{i.cond.lower()} {i.a}, {i.b} -> {i.target}",
    Jump: lambda i: f"jmp {i.target}",
    Halt: lambda i: "halt",
    Fallback: lambda i: (
        f"fallback {_srcs(i.inputs)} -> {_srcs(i.outputs)}".replace("fallback  ->", "fallback ->")
        + _kw(kernel=i.kernel)
    ),
}


def mnemonic(ins: Instruction) -> str:
    """The first word :func:`format_instruction` writes (``dma.start``, ``vpu.add``, ``s.mov``, ``br.lt`` ...),
    without formatting the operands."""
    if isinstance(ins, (VpuMap, ScalarAlu)):
        return f"{ins.op.value}.{ins.fn}"
    if isinstance(ins, Branch):
        return f"br.{ins.cond.lower()}"
    return ins.op.value


def format_instruction(ins: Instruction) -> str:
    """One instruction as a line of text (no indentation)."""
    text = _PRINTERS[type(ins)](ins)
    if ins.control:
        text += " control"
    if ins.hlo is not None:
        if NAME_PATTERN.fullmatch(ins.hlo) is None:
            raise IsaError(f"HLO name {ins.hlo!r} cannot be printed (it must match {NAME_PATTERN.pattern})")
        text += f" @{ins.hlo}"
    return text


def print_program(program: Program) -> str:
    """The program as text; :func:`parse_program` reads it back into an equal program."""
    lines = [f"program {json.dumps(program.name)}"]
    for s in program.symbols:
        lines.append(f"symbol {s.name} {s.ref}" + _kw(chip=s.chip, core=s.core or None))
    for k in program.fallbacks:
        lines.append(
            f"fallback {k.name}"
            + _kw(
                fixed_cycles=k.fixed_cycles,
                cycles_per_byte=repr(float(k.cycles_per_byte)),
                cycles_per_flop=repr(float(k.cycles_per_flop)),
                flops=k.flops,
            )
            + " <<<"
        )
        lines.extend(k.hlo.split("\n"))
        lines.append(">>>")
    for st in program.streams:
        lines.append(
            f"stream core={st.core} chip={'*' if st.chip is None else st.chip}"
            + (f" sequencer={st.sequencer}" if st.sequencer else "")
        )
        for i, ins in enumerate(st.instructions):
            lines.extend(f"{name}:" for name in st.labels_at(i))
            lines.append("  " + format_instruction(ins))
        lines.extend(f"{name}:" for name in st.labels_at(len(st.instructions)))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------------
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_INT = re.compile(r"[-+]?(0[xX][0-9a-fA-F]+|\d+)")
_REG = re.compile(r"s(\d+)\b")
_WS = re.compile(r"[ \t]*")
_SPACES = {s.value: s for s in Space}


class _Cursor:
    """Reads one line of ``text`` (``pos`` .. ``end``) and reports errors at their offset in the text."""

    def __init__(self, text: str, pos: int, end: int, source: str | None) -> None:
        self.text, self.pos, self.end, self.source = text, pos, end, source

    def error(self, message: str, offset: int | None = None) -> IsaParseError:
        return IsaParseError(message, self.text, self.pos if offset is None else offset, self.source)

    def ws(self) -> None:
        m = _WS.match(self.text, self.pos, self.end)
        self.pos = m.end() if m else self.pos

    def peek(self, n: int = 1) -> str:
        self.ws()
        return self.text[self.pos : min(self.pos + n, self.end)]

    def at_end(self) -> bool:
        self.ws()
        return self.pos >= self.end or self.text[self.pos] == "#"

    def found(self) -> str:
        if self.at_end():
            return "end of line"
        m = re.compile(r"\S+").match(self.text, self.pos, self.end)
        return repr(m.group(0)) if m else "end of line"

    def eat(self, s: str) -> bool:
        if self.peek(len(s)) == s:
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str, what: str) -> None:
        if not self.eat(s):
            raise self.error(f"expected {what} ({s!r}), found {self.found()}")

    def name(self, what: str) -> str:
        self.ws()
        m = _NAME.match(self.text, self.pos, self.end)
        if m is None:
            raise self.error(f"expected {what}, found {self.found()}")
        self.pos = m.end()
        return m.group(0)

    def integer(self, what: str) -> int:
        self.ws()
        m = _INT.match(self.text, self.pos, self.end)
        if m is None:
            raise self.error(f"expected {what} (an integer), found {self.found()}")
        self.pos = m.end()
        return int(m.group(0), 0)

    def is_reg(self) -> bool:
        self.ws()
        m = _REG.match(self.text, self.pos, self.end)
        return m is not None and self.text[m.end() : m.end() + 1] not in ("[", "(")

    def reg(self, what: str = "a scalar register") -> Reg:
        self.ws()
        m = _REG.match(self.text, self.pos, self.end)
        if m is None:
            raise self.error(f"expected {what} (s<number>), found {self.found()}")
        self.pos = m.end()
        return Reg(int(m.group(1)))

    def scalar(self, what: str) -> Scalar:
        return self.reg() if self.is_reg() else self.integer(what)

    def int_tuple(self, what: str) -> tuple[int, ...]:
        self.expect("(", f"the start of {what}")
        out: list[int] = []
        if not self.eat(")"):
            while True:
                out.append(self.integer(what))
                if self.eat(")"):
                    break
                self.expect(",", f"',' or ')' in {what}")
        return tuple(out)

    # -- operands
    def memref(self) -> MemRef:
        self.ws()
        start = self.pos
        space_name = self.name("a memory space (hbm, vmem, smem)")
        if space_name not in _SPACES:
            raise self.error(f"unknown memory space {space_name!r}; expected hbm, vmem or smem", start)
        self.expect("[", "an address")
        base = None
        if self.is_reg():
            base = self.reg()
            self.expect("+", "'+' between base register and address")
        address = self.integer("an address")
        self.expect("]", "the end of the address")
        self.ws()
        reader = ShapeReader(self.text, self.pos, self.source)
        try:
            shape = reader.read_shape()
        except LayoutError as e:
            raise self.error(f"bad shape: {e.message}", e.offset) from None
        if not isinstance(shape, Shape):
            raise self.error("a memory operand needs an array shape, not a tuple", self.pos)
        self.pos = min(reader.pos, self.end)  # (the shape reader skips blanks, newlines included)
        window = self.window() if self.text[self.pos : self.pos + 1] == "[" else None
        try:
            return MemRef(_SPACES[space_name], address, shape, window, base)
        except IsaError as e:
            raise self.error(str(e), start) from None

    def window(self) -> Window:
        self.ws()
        start = self.pos
        self.expect("[", "a window")
        offsets: list[Scalar] = []
        sizes: list[int] = []
        clamp = False
        while True:
            if self.is_reg():
                offsets.append(self.reg())
                self.expect(":", "':' after a window start")
                self.expect("+", "'+size' after a register start")
                sizes.append(self.integer("a window size"))
            else:
                lo = self.integer("a window start")
                self.expect(":", "':' after a window start")
                hi = self.integer("a window limit")
                offsets.append(lo)
                sizes.append(hi - lo)
            if self.peek(5) == "clamp":
                self.pos += 5
                clamp = True
                self.expect("]", "the end of the window")
                break
            if self.eat("]"):
                break
            self.expect(",", "',' or ']' in a window")
        try:
            return Window(tuple(offsets), tuple(sizes), clamp)
        except IsaError as e:
            raise self.error(str(e), start) from None

    def operand(self) -> Operand:
        self.ws()
        m = _NAME.match(self.text, self.pos, self.end)
        if m is not None and m.group(0) in _SPACES and self.text[m.end() : m.end() + 1] == "[":
            return self.memref()
        if self.is_reg():
            return self.reg()
        if m is not None and m.group(0) in ELEMENT_TYPES and self.text[m.end() : m.end() + 1] == "(":
            start = self.pos
            self.pos = m.end() + 1
            close = self.text.find(")", self.pos, self.end)
            if close < 0:
                raise self.error("expected ')' closing the constant")
            literal = self.text[self.pos : close].strip()
            et = ELEMENT_TYPES[m.group(0)]
            try:
                value: float | int = float(literal) if et.is_float else int(literal, 0)
                self.pos = close + 1
                return Const(value, et)
            except (ValueError, IsaError) as e:
                raise self.error(f"bad constant {literal!r} of type {et}: {e}", start) from None
        raise self.error(f"expected a memory block, register or constant, found {self.found()}")

    def operand_list(self) -> tuple[Operand, ...]:
        out = [self.operand()]
        while self.eat(","):
            out.append(self.operand())
        return tuple(out)

    def memref_list(self) -> tuple[MemRef, ...]:
        """Memory blocks separated by commas; empty when the next thing is not a block (``->``, a keyword)."""
        if self.at_end() or not any(self.peek(len(s) + 1) == s + "[" for s in ("hbm", "vmem", "smem")):
            return ()
        out = [self.memref()]
        while self.eat(","):
            out.append(self.memref())
        return tuple(out)


# Keyword value readers.
def _v_int(c: _Cursor, key: str) -> int:
    return c.integer(key)


def _v_scalar(c: _Cursor, key: str) -> Scalar:
    return c.scalar(key)


def _v_name(c: _Cursor, key: str) -> str:
    return c.name(key)


def _v_tuple(c: _Cursor, key: str) -> tuple[int, ...]:
    return c.int_tuple(key)


def _v_steps(c: _Cursor, key: str) -> tuple[FusedOp, ...]:
    """``[fn[/DIR]:etype(a,b) ...]``"""
    c.expect("[", "'[' starting the fused steps")
    steps: list[FusedOp] = []
    while not c.eat("]"):
        start = c.pos
        fn = c.name("a fused step (fn:type(args))")
        direction = c.name("a comparison direction") if c.eat("/") else None
        c.expect(":", "':' before the step's result type")
        et_at = c.pos
        et = c.name("an element type")
        if et not in ELEMENT_TYPES:
            raise c.error(f"unknown element type {et!r}", et_at)
        args = c.int_tuple("the step's operands")
        try:
            steps.append(FusedOp(fn, ELEMENT_TYPES[et], args, direction))
        except IsaError as e:
            raise c.error(str(e), start) from None
        if c.at_end():
            raise c.error("expected ']' closing the fused steps")
    return tuple(steps)


def _v_float(c: _Cursor, key: str) -> float:
    c.ws()
    m = re.compile(r"[-+]?(inf|nan|[0-9.]+([eE][-+]?\d+)?)").match(c.text, c.pos, c.end)
    if m is None:
        raise c.error(f"expected a number for {key}, found {c.found()}")
    c.pos = m.end()
    return float(m.group(0))


_FLAGS = {"transpose", "accumulate", "control", "clamp", "fence"}


def _keywords(c: _Cursor, allowed: dict[str, Callable[[_Cursor, str], Any]]) -> tuple[dict[str, Any], str | None]:
    """Read ``key=value`` and flag words up to the end of the line; returns them and the ``@hlo`` name."""
    out: dict[str, Any] = {}
    hlo = None
    while not c.at_end():
        if c.eat("@"):
            hlo = c.name("an HLO instruction name after '@'")
            if not c.at_end():
                raise c.error(f"expected the end of the line after @{hlo}, found {c.found()}")
            break
        start = c.pos
        key = c.name("a keyword")
        if key in out:
            raise c.error(f"keyword {key!r} given twice", start)
        if c.eat("="):
            if key not in allowed or key in _FLAGS:
                raise c.error(f"unknown keyword {key!r}; expected one of {', '.join(sorted(allowed)) or 'none'}", start)
            out[key] = allowed[key](c, key)
        else:
            if key not in _FLAGS or key not in allowed:
                raise c.error(f"unexpected word {key!r}", start)
            out[key] = True
    return out, hlo


_CONTROL = {"control": _v_name}


def _parse_dma(c: _Cursor, mnemonic: str) -> dict[str, Any]:
    src = c.memref()
    c.expect("->", "'->' between DMA source and destination")
    dst = c.memref()
    keys = {"sem": _v_int, "chip": _v_scalar, "dst_core": _v_int, "dst_sem": _v_int, "route": _v_tuple, "tie": _v_int}
    kw, hlo = _keywords(c, {**keys, **_CONTROL})
    return {"cls": DmaStart, "src": src, "dst": dst, **kw, "hlo": hlo}


def _simple(cls: type, keys: dict[str, Callable[[_Cursor, str], Any]]) -> Callable[[_Cursor, str], dict[str, Any]]:
    def parse(c: _Cursor, mnemonic: str) -> dict[str, Any]:
        kw, hlo = _keywords(c, {**keys, **_CONTROL})
        return {"cls": cls, **kw, "hlo": hlo}

    return parse


def _with_ref(cls: type, field: str, keys: dict[str, Callable[[_Cursor, str], Any]]) -> Callable[..., dict[str, Any]]:
    def parse(c: _Cursor, mnemonic: str) -> dict[str, Any]:
        ref = c.memref()
        kw, hlo = _keywords(c, {**keys, **_CONTROL})
        return {"cls": cls, field: ref, **kw, "hlo": hlo}

    return parse


def _unary_block(cls: type, keys: dict[str, Callable[[_Cursor, str], Any]]) -> Callable[..., dict[str, Any]]:
    def parse(c: _Cursor, mnemonic: str) -> dict[str, Any]:
        dst = c.memref()
        c.expect("<-", "'<-' before the source")
        src = c.operand() if cls is VpuBroadcast else c.memref()
        kw, hlo = _keywords(c, {**keys, **_CONTROL})
        return {"cls": cls, "dst": dst, "src": src, **kw, "hlo": hlo}

    return parse


def _parse_vpu_map(c: _Cursor, mnemonic: str) -> dict[str, Any]:
    dst = c.memref()
    c.expect("<-", "'<-' before the sources")
    srcs = c.operand_list()
    kw, hlo = _keywords(c, {"direction": _v_name, **_CONTROL})
    return {"cls": VpuMap, "fn": mnemonic[4:], "dst": dst, "srcs": srcs, **kw, "hlo": hlo}


def _parse_vpu_fused(c: _Cursor, mnemonic: str) -> dict[str, Any]:
    dst = c.memref()
    c.expect("<-", "'<-' before the sources")
    srcs = c.operand_list()
    kw, hlo = _keywords(c, {"ops": _v_steps, **_CONTROL})
    return {"cls": VpuFused, "dst": dst, "srcs": srcs, **kw, "hlo": hlo}


def _parse_scalar_alu(c: _Cursor, mnemonic: str) -> dict[str, Any]:
    dst = c.reg()
    args: list[Scalar] = []
    if c.eat("<-"):
        args.append(c.scalar("an operand"))
        while c.eat(","):
            c.ws()
            if len(args) == 2:
                raise c.error(f"{mnemonic} takes at most 2 operands")
            args.append(c.scalar("an operand"))
    kw, hlo = _keywords(c, dict(_CONTROL))
    a, b = ([*args, None, None])[:2]
    return {"cls": ScalarAlu, "fn": mnemonic[2:], "dst": dst, "a": a, "b": b, **kw, "hlo": hlo}


def _parse_sload(c: _Cursor, mnemonic: str) -> dict[str, Any]:
    dst = c.reg()
    c.expect("<-", "'<-' before the source")
    src = c.memref()
    kw, hlo = _keywords(c, dict(_CONTROL))
    return {"cls": ScalarLoad, "dst": dst, "src": src, **kw, "hlo": hlo}


def _parse_sstore(c: _Cursor, mnemonic: str) -> dict[str, Any]:
    dst = c.memref()
    c.expect("<-", "'<-' before the value")
    src = c.scalar("the value")
    kw, hlo = _keywords(c, dict(_CONTROL))
    return {"cls": ScalarStore, "dst": dst, "src": src, **kw, "hlo": hlo}


def _parse_branch(c: _Cursor, mnemonic: str) -> dict[str, Any]:
    a = c.reg()
    c.expect(",", "',' between the branch operands")
    b = c.scalar("the second branch operand")
    c.expect("->", "'->' before the branch target")
    target = c.name("a label")
    kw, hlo = _keywords(c, dict(_CONTROL))
    return {"cls": Branch, "cond": mnemonic[3:], "a": a, "b": b, "target": target, **kw, "hlo": hlo}


def _parse_jump(c: _Cursor, mnemonic: str) -> dict[str, Any]:
    target = c.name("a label")
    kw, hlo = _keywords(c, dict(_CONTROL))
    return {"cls": Jump, "target": target, **kw, "hlo": hlo}


def _parse_fallback(c: _Cursor, mnemonic: str) -> dict[str, Any]:
    inputs = c.memref_list()
    c.expect("->", "'->' before the fallback outputs")
    outputs = c.memref_list()
    kw, hlo = _keywords(c, {"kernel": _v_name, **_CONTROL})
    return {"cls": Fallback, "inputs": inputs, "outputs": outputs, **kw, "hlo": hlo}


_PARSERS: dict[str, Callable[[_Cursor, str], dict[str, Any]]] = {
    "dma.start": _parse_dma,
    "sem.signal": _simple(
        SemSignal, {"sem": _v_int, "count": _v_int, "core": _v_int, "chip": _v_scalar, "fence": _v_name}
    ),
    "sem.wait": _simple(SemWait, {"sem": _v_int, "count": _v_int}),
    "barrier": _simple(Barrier, {"id": _v_int, "scope": _v_name}),
    "halt": _simple(Halt, {}),
    "mxu.load_weights": _with_ref(MxuLoadWeights, "src", {"mxu": _v_int, "transpose": _v_name, "precision": _v_name}),
    "mxu.matmul": _with_ref(
        MxuMatmul, "lhs", {"mxu": _v_int, "acc": _v_int, "accumulate": _v_name, "precision": _v_name}
    ),
    "mxu.pop": _with_ref(MxuPop, "dst", {"mxu": _v_int, "acc": _v_int}),
    "vpu.fused": _parse_vpu_fused,
    "vpu.reduce": _unary_block(VpuReduce, {"fn": _v_name, "dims": _v_tuple, "accumulate": _v_name}),
    "vpu.broadcast": _unary_block(VpuBroadcast, {"dims": _v_tuple}),
    "vpu.iota": _with_ref(VpuIota, "dst", {"dimension": _v_int}),
    "vpu.copy": _unary_block(VpuCopy, {"strides": _v_tuple, "dst_strides": _v_tuple}),
    "vpu.reshape": _unary_block(VpuReshape, {}),
    "xlu.transpose": _unary_block(XluTranspose, {"permutation": _v_tuple}),
    "s.load": _parse_sload,
    "s.store": _parse_sstore,
    "jmp": _parse_jump,
    "fallback": _parse_fallback,
}

_REQUIRED = {
    MxuLoadWeights: ("mxu",),
    MxuMatmul: ("mxu",),
    MxuPop: ("mxu",),
    SemSignal: ("sem",),
    SemWait: ("sem",),
    VpuReduce: ("fn", "dims"),
    VpuIota: ("dimension",),
    VpuFused: ("ops",),
    XluTranspose: ("permutation",),
    Fallback: ("kernel",),
}


def _parser_for(mnemonic: str) -> Callable[[_Cursor, str], dict[str, Any]] | None:
    if mnemonic in _PARSERS:
        return _PARSERS[mnemonic]
    if mnemonic.startswith("vpu.") and mnemonic[4:] in VPU_FUNCTIONS:
        return _parse_vpu_map
    if mnemonic.startswith("s.") and mnemonic[2:] in SCALAR_FUNCTIONS:
        return _parse_scalar_alu
    if mnemonic.startswith("br.") and mnemonic[3:] in ("eq", "ne", "lt", "le", "gt", "ge"):
        return _parse_branch
    return None


def _instruction_at(c: _Cursor) -> Instruction:
    c.ws()
    start = c.pos
    mnemonic = c.name("an instruction")
    parse = _parser_for(mnemonic)
    if parse is None:
        raise c.error(f"unknown instruction {mnemonic!r}", start)
    fields = parse(c, mnemonic)
    cls = fields.pop("cls")
    for key in _REQUIRED.get(cls, ()):
        if key not in fields:
            raise c.error(f"{mnemonic} needs {key}=...", start)
    if fields.get("hlo") is None:
        fields.pop("hlo", None)
    try:
        ins: Instruction = cls(**fields)
        return ins
    except IsaError as e:
        raise c.error(str(e), start) from None


def parse_instruction(text: str) -> Instruction:
    """Read one instruction line (as :func:`format_instruction` prints it)."""
    c = _Cursor(text, 0, len(text), None)
    ins = _instruction_at(c)
    if not c.at_end():
        raise c.error(f"expected the end of the line, found {c.found()}")
    return ins


_LABEL = re.compile(r"[ \t]*([A-Za-z_][A-Za-z0-9_.\-]*):[ \t]*(#.*)?$")


def parse_program(text: str, source: str | None = None) -> Program:
    """Read a program text.

    Args:
        text: the program, as :func:`print_program` writes it.
        source: a file name for error messages.

    Returns:
        The program.

    Raises:
        IsaParseError: with the line and column of the first problem.
    """
    name = "program"
    symbols: list[Symbol] = []
    kernels: list[FallbackKernel] = []
    streams: list[Stream] = []
    current: dict[str, Any] | None = None
    lines = text.split("\n")
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)

    def finish_stream() -> None:
        if current is not None:
            try:
                streams.append(
                    Stream(
                        current["core"],
                        tuple(current["ins"]),
                        tuple(current["labels"]),
                        current["chip"],
                        current["sequencer"],
                    )
                )
            except IsaError as e:
                raise IsaParseError(str(e), text, current["offset"], source) from None

    i = 0
    while i < len(lines):
        line, off = lines[i], offsets[i]
        c = _Cursor(text, off, off + len(line), source)
        i += 1
        if c.at_end():
            continue
        m = _LABEL.match(line)
        if m is not None:
            if current is None:
                raise c.error("a label must follow a 'stream' line")
            current["labels"].append((m.group(1), len(current["ins"])))
            continue
        word_at = c.pos
        word = c.name("a directive or an instruction")
        if word == "program":
            c.ws()
            try:
                name, end = json.JSONDecoder().raw_decode(text, c.pos)
            except json.JSONDecodeError:
                raise c.error("expected the program name as a quoted string") from None
            c.pos = end
        elif word == "symbol":
            sym_name = c.name("a symbol name")
            ref = c.memref()
            kw, _ = _keywords(c, {"chip": _v_int, "core": _v_int})
            try:
                symbols.append(Symbol(sym_name, ref, kw.get("chip"), kw.get("core", 0)))
            except IsaError as e:
                raise c.error(str(e), word_at) from None
        elif word == "fallback" and current is None:
            k_name = c.name("a kernel name")
            kw = {}
            while not c.eat("<<<"):
                key = c.name("a kernel keyword or '<<<'")
                c.expect("=", "'='")
                if key in ("fixed_cycles", "flops"):
                    kw[key] = c.integer(key)
                elif key in ("cycles_per_byte", "cycles_per_flop"):
                    kw[key] = _v_float(c, key)
                else:
                    raise c.error(f"unknown kernel keyword {key!r}")
            body: list[str] = []
            while i < len(lines) and lines[i] != ">>>":
                body.append(lines[i])
                i += 1
            if i >= len(lines):
                raise c.error(f"fallback kernel {k_name!r} is not closed by a '>>>' line", word_at)
            i += 1
            try:
                kernels.append(FallbackKernel(k_name, "\n".join(body), **kw))
            except IsaError as e:
                raise c.error(str(e), word_at) from None
            continue
        elif word == "stream":
            finish_stream()
            kw, _ = _keywords(
                c, {"core": _v_int, "chip": lambda cc, k: None if cc.eat("*") else cc.integer(k), "sequencer": _v_int}
            )
            if "core" not in kw:
                raise c.error("a stream needs core=N", word_at)
            current = {
                "core": kw["core"], "chip": kw.get("chip"), "sequencer": kw.get("sequencer", 0), "ins": [],
                "labels": [], "offset": word_at,
            }  # fmt: skip
        else:
            if current is None:
                raise c.error(f"expected 'program', 'symbol', 'fallback' or 'stream', found {word!r}", word_at)
            c.pos = word_at
            current["ins"].append(_instruction_at(c))
        if not c.at_end():
            raise c.error(f"expected the end of the line, found {c.found()}")
    finish_stream()
    try:
        return Program(tuple(streams), tuple(symbols), tuple(kernels), name)
    except IsaError as e:
        raise IsaParseError(str(e), text, 0, source) from None
