"""Asynchronous copies and pass-through values: copy-start / copy-done, async slices (``slice-start`` /
``slice-done``), add-dependency, domain.

``copy-start`` returns ``(destination, source, u32[] context)`` and ``copy-done`` the destination (XLA's
async copy, e.g. of a prefetch between memory spaces). The start issues one DMA from the operand to the
destination part on a semaphore it keeps past its own instruction; the done waits for that semaphore and
gives it back. The instructions scheduled between them run while the copy is in flight (a reader of the
destination would in any case wait for the DMA: the scoreboard orders it). Buffer assignment lets the
start's source part be the operand and the done be the start's destination, so nothing else moves; where
their layouts differ, the rules copy.

An async slice (``slice-start`` / ``slice-done``, XLA's short form of ``async-start`` wrapping a ``slice``,
returning ``((operand), slice, s32[] context)``) is the same with a window: the start issues one DMA of the
window into the slice's buffer (element 1 of the start, which the done shares), the done waits. XLA:TPU's
compiled modules prefetch weights into VMEM this way, a few row slices at a time.

XLA:TPU's ``AllocateBuffer`` custom-call makes an array without writing it (a later instruction fills it, the
stacked outputs of a loop, say): buffer assignment gives it a buffer; one in VMEM is filled with zeros.

``add-dependency`` (a value and a token ordering it) and ``domain`` (a sharding annotation) pass their first
operand through: buffer assignment gives them its buffer and nothing runs; the rules copy only where the
layouts differ.
"""

from __future__ import annotations

from tpusim.compiler.buffer_assignment import leaf_paths
from tpusim.compiler.hlo.ir import Computation, Instruction, custom_call_target
from tpusim.compiler.hlo.xla_forms import PREPARE_ASYNC_CALL
from tpusim.compiler.lowering.context import Lowering, StateKey
from tpusim.compiler.lowering.control import copy_arrays
from tpusim.compiler.lowering.indexed import take_semaphores
from tpusim.compiler.lowering.registry import NotLowerable, lowering
from tpusim.isa import Const, DmaStart, MemRef, SemWait, Space, VpuBroadcast, Window

__all__ = [
    "lower_allocate_buffer",
    "lower_copy_done",
    "lower_copy_start",
    "lower_pass_through",
    "lower_slice_done",
    "lower_slice_start",
]

_STATE: StateKey[dict[str, tuple[int, int]]] = StateKey("async-copies")
"""``ctx.rule_state`` entry: copy-start name -> (semaphore held for it, DMAs it issued)."""


def _distinct(ctx: Lowering, comp: str, a: str, a_path: tuple[int, ...], b: str, b_path: tuple[int, ...]) -> bool:
    return ctx.buffers.buffer(comp, a, a_path).id != ctx.buffers.buffer(comp, b, b_path).id


def _allocates(ctx: Lowering, comp: Computation, instr: Instruction) -> bool:
    return custom_call_target(instr) == "AllocateBuffer"


@lowering("custom-call", when=_allocates)
def lower_allocate_buffer(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """The buffer exists, its bytes undefined until written; one in VMEM is filled with zeros (what the
    reference gives it), since XLA's programs may read it before they write it where a select discards the
    value (a loop's accumulator on its first iteration), which the program verifier would otherwise refuse."""
    for path, _ in leaf_paths(instr.shape):
        home = ctx.home(comp.name, instr.name, path)
        if home.space is Space.VMEM and home.shape.element_count:
            ctx.emit(VpuBroadcast, dst=home, src=Const(0, home.element_type), dims=())


def _prepares_async_call(ctx: Lowering, comp: Computation, instr: Instruction) -> bool:
    return custom_call_target(instr) in PREPARE_ASYNC_CALL


@lowering("custom-call", when=_prepares_async_call)
def lower_prepare_async_call(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    """No code: the handle and token order the call that follows, which tpusim runs on the TensorCore."""


@lowering("add-dependency", "domain")
def lower_pass_through(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    source = instr.operands[0]
    copy_arrays(
        ctx,
        [
            (ctx.home(comp.name, source, path), ctx.home(comp.name, instr.name, path))
            for path, _ in leaf_paths(instr.shape)
            if _distinct(ctx, comp.name, source, path, instr.name, path)
        ],
    )


@lowering("copy-start")
def lower_copy_start(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    source = instr.operands[0]
    pairs: list[tuple[MemRef, MemRef]] = []
    for part in (0, 1):
        for path, _ in leaf_paths(comp[source].shape):
            if _distinct(ctx, comp.name, source, path, instr.name, (part, *path)):
                pairs.append((ctx.home(comp.name, source, path), ctx.home(comp.name, instr.name, (part, *path))))
    pairs = [(s, d) for s, d in pairs if s.shape.element_count]
    (sem,) = take_semaphores(ctx, 1)
    for src, dst in pairs:
        ctx.emit(DmaStart, src=src, dst=dst, sem=sem)
    _hold(ctx, instr, sem, len(pairs))


def _hold(ctx: Lowering, start: Instruction, sem: int, count: int) -> None:
    """Keep ``sem`` past ``start``'s scope, for the done that waits for its ``count`` DMAs."""
    ctx.scope.semaphores.remove(sem)  # held until the done: the scope must not give it back
    held = ctx.rule_state.get(_STATE)
    if held is None:
        held = {}
        ctx.rule_state.set(_STATE, held)
    held[start.name] = (sem, count)


def _wait_for(ctx: Lowering, start: str, what: str) -> None:
    """Wait for the DMAs of ``start`` (held by :func:`_hold`) and give its semaphore back with this scope."""
    held = (ctx.rule_state.get(_STATE) or {}).pop(start, None)
    if held is None:
        raise NotLowerable(f"its operand {start} is not a {what} lowered before it")
    sem, count = held
    ctx.scope.semaphores.append(sem)  # given back when this instruction's scope ends
    if count:
        ctx.emit(SemWait, sem=sem, count=count)


def _wraps_slice(ctx: Lowering, comp: Computation, instr: Instruction) -> bool:
    if instr.opcode == "async-done":
        instr = comp[instr.operands[0]]
    wrapped = instr.async_wrapped_instruction()
    return wrapped is not None and wrapped.opcode == "slice"


@lowering("async-start", when=_wraps_slice)
def lower_slice_start(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    wrapped = instr.async_wrapped_instruction()
    assert wrapped is not None
    src, dst = ctx.home(comp.name, instr.operands[0]), ctx.home(comp.name, instr.name, (1,))
    ranges = wrapped.attr("slice")
    if any(r.stride != 1 for r in ranges):
        raise NotLowerable("an async slice with strides")
    window = Window(tuple(r.start for r in ranges), tuple(r.limit - r.start for r in ranges))
    (sem,) = take_semaphores(ctx, 1)
    count = 0
    if dst.shape.element_count:
        ctx.emit(DmaStart, src=MemRef(src.space, src.address, src.shape, window), dst=dst, sem=sem)
        count = 1
    _hold(ctx, instr, sem, count)


@lowering("async-done", when=_wraps_slice)
def lower_slice_done(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    start = instr.operands[0]
    _wait_for(ctx, start, "slice-start")
    ours, theirs = ctx.home(comp.name, instr.name), ctx.home(comp.name, start, (1,))
    if (ours.space, ours.address) != (theirs.space, theirs.address):
        copy_arrays(ctx, [(theirs, ours)])


@lowering("copy-done")
def lower_copy_done(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    start = instr.operands[0]
    _wait_for(ctx, start, "copy-start")
    copy_arrays(
        ctx,
        [
            (ctx.home(comp.name, start, (0, *path)), ctx.home(comp.name, instr.name, path))
            for path, _ in leaf_paths(instr.shape)
            if _distinct(ctx, comp.name, start, (0, *path), instr.name, path)
        ],
    )
