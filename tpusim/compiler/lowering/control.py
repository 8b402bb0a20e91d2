"""Control flow on the scalar unit: while, conditional and call, with predicates read at run time.

A loop is not unrolled: its condition and body are lowered once, inline, between labels. The condition's
``pred[]`` result is copied from HBM into SMEM, loaded into a scalar register and branched on, so the trip
count is whatever the data says. Buffer assignment has put the loop state in place; where it could not
(see :mod:`tpusim.compiler.buffer_assignment`), the state is copied in before the loop or copied back at
the end of an iteration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpusim.compiler.buffer_assignment import leaf_paths
from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.lowering.context import Lowering, VmemExhausted
from tpusim.compiler.lowering.registry import lowering
from tpusim.compiler.lowering.sequential import lower_computation
from tpusim.isa import Branch, DmaStart, Jump, MemRef, Reg, ScalarAlu, ScalarLoad, SemWait, Space
from tpusim.memory import Shape

__all__ = ["Copy", "copy_arrays", "read_scalar"]


@dataclass
class Copy:
    """One whole-array copy of a parallel assignment; ``control``: it carries a value control flow reads, so
    it moves its bytes even in a timing-only run."""

    src: MemRef
    dst: MemRef
    control: bool = False


def copy_arrays(ctx: Lowering, copies: Sequence[Copy | tuple[MemRef, MemRef]]) -> None:
    """Copy each ``src`` to its ``dst`` (whole arrays, any layouts; a :class:`Copy` or a ``(src, dst)`` pair)
    as one parallel assignment: every destination receives the value its source held before any of the
    copies, whatever the order of the arrays in memory (the end of a loop iteration that swaps or rotates
    its state: ``(a, b) <- (b, a)``).

    Copies whose destination no other pending copy reads run together, then the next round; when only
    cycles remain, one destination's old value is first saved in a temporary and its readers read that.
    """
    given = [c if isinstance(c, Copy) else Copy(*c) for c in copies]
    pending = [c for c in given if not _same(c.src, c.dst)]
    while pending:
        ready = [c for c in pending if not any(o is not c and _overlap(c.dst, o.src) for o in pending)]
        if not ready:  # every destination is still to be read: break a cycle through a temporary
            first = pending[0]
            keep = _temporary(ctx, first.dst)
            _copy_round(ctx, [Copy(first.dst, keep, first.control)])
            for c in pending:
                if c is not first and _overlap(first.dst, c.src):
                    if not _same(first.dst, c.src):
                        raise CompileError(
                            f"internal: {ctx.hlo}: copies of partly overlapping arrays {c.src} and {first.dst}"
                        )
                    c.src = keep
            continue
        _copy_round(ctx, ready)
        pending = [c for c in pending if all(c is not r for r in ready)]


def _temporary(ctx: Lowering, like: MemRef) -> MemRef:
    """Room for a copy of ``like`` in its own memory where it fits (a rotated loop state in VMEM is saved in
    VMEM, not through HBM: two HBM latencies per iteration of threefry's loop), else in HBM."""
    if like.space is Space.SMEM:
        return ctx.smem(like.shape)
    if like.space is Space.VMEM:
        try:
            return ctx.vmem(like.shape)
        except VmemExhausted:
            pass
    return ctx.scratch(like.shape)


def _copy_round(ctx: Lowering, copies: list[Copy]) -> None:
    """One round of copies. With megacore, a copy into SMEM runs on every core emitted to (each keeps its
    own SMEM), a copy into HBM on the first of them only."""
    sem = ctx.semaphore()
    cores = ctx.targets
    counts = dict.fromkeys(cores, 0)
    with ctx.segment():
        for c in copies:
            to = cores if c.dst.space is Space.SMEM else cores[:1]
            with ctx.on(to):
                ctx.emit(DmaStart, src=c.src, dst=c.dst, sem=sem, control=c.control)
            for core in to:
                counts[core] += 1
        for core in cores:
            if counts[core]:
                with ctx.on((core,)):
                    ctx.emit(SemWait, sem=sem, count=counts[core], control=any(c.control for c in copies))
    # Waited for: free for the next round. Held to the end of the instruction, each branch of a conditional
    # kept one, and a switch of more branches than semaphores did not compile.
    ctx.release_semaphore(sem)


def _same(a: MemRef, b: MemRef) -> bool:
    return (a.space, a.address, a.shape) == (b.space, b.address, b.shape)


def _overlap(a: MemRef, b: MemRef) -> bool:
    return a.space is b.space and a.address < b.address + _size(b) and b.address < a.address + _size(a)


def _size(ref: MemRef) -> int:
    return max(1, ref.shape.byte_size)


def read_scalar(ctx: Lowering, src: MemRef) -> Reg:
    """Load the one integer or pred element of an array into a fresh scalar register (straight from SMEM when
    it lives there, else through an SMEM word a DMA fills)."""
    if src.space is Space.SMEM:
        reg = ctx.register()
        ctx.emit(ScalarLoad, dst=reg, src=src, control=True)
        return reg
    shape = Shape(src.element_type, ())
    slot = ctx.smem(shape)
    sem = ctx.semaphore()
    with ctx.segment():
        ctx.emit(DmaStart, src=src, dst=slot, sem=sem, control=True)
        ctx.emit(SemWait, sem=sem, count=1, control=True)
    ctx.release_semaphore(sem)
    reg = ctx.register()
    ctx.emit(ScalarLoad, dst=reg, src=slot, control=True)
    return reg


def _result_copies(ctx: Lowering, callee: str, comp: Computation, instr: Instruction) -> list[Copy]:
    root = ctx.module[callee].root
    return [
        Copy(ctx.home(callee, root, path), ctx.home(comp.name, instr.name, path)) for path, _ in leaf_paths(instr.shape)
    ]


@lowering("while")
def lower_while(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    cond, body = instr.attr("condition"), instr.attr("body")
    operand = instr.operands[0]
    carries = ctx.control_slice.carries
    copy_arrays(
        ctx,
        [
            Copy(
                ctx.home(comp.name, operand, path),
                ctx.home(comp.name, instr.name, path),
                carries(comp.name, instr.name, path),
            )
            for path, _ in leaf_paths(instr.shape)
            if (comp.name, instr.name, path) in ctx.buffers.copy_in
        ],
    )
    top, done = ctx.label(f"{instr.name}.cond"), ctx.label(f"{instr.name}.exit")
    # Megacore: a barrier before the loop when the cores have accesses outstanding, so none of the loop's
    # own barriers is there for what came before it; the loop's segments are synchronised from that clean
    # state, and the back edge adds a barrier only when what is outstanding at the end of the body
    # conflicts with something the loop touches.
    ctx.flush()
    ctx.place_label(top)
    with ctx.loop_body() as touched:
        lower_computation(ctx, cond)
        flag = read_scalar(ctx, ctx.home(cond, ctx.module[cond].root))
        ctx.emit(Branch, cond="eq", a=flag, b=0, target=done, control=True)
        ctx.release_register(flag)
        leaving = ctx.accesses()
        _lower_body(ctx, comp, instr, body)
    ending = ctx.accesses()
    barrier = ctx.back_edge(touched[0])
    ctx.emit(Jump, target=top, control=True)
    ctx.place_label(done)
    if barrier:
        ctx.restore(leaving)
    else:  # the exit is reached after the first condition or after a later one, from the body's end
        ctx.restore(leaving, ending)


def _lower_body(ctx: Lowering, comp: Computation, instr: Instruction, body: str) -> None:
    """The loop body, then the copies back of the loop state buffer assignment could not put in place."""
    lower_computation(ctx, body)
    carries = ctx.control_slice.carries
    root = ctx.module[body].root
    copy_arrays(
        ctx,
        [
            Copy(
                ctx.home(body, root, path), ctx.home(comp.name, instr.name, path), carries(comp.name, instr.name, path)
            )
            for path, _ in leaf_paths(instr.shape)
            if (body, path) in ctx.buffers.copy_back
        ],
    )


@lowering("conditional")
def lower_conditional(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    branches = instr.attr("branch_computations")
    if branches is None:  # predicate form: true branch first
        branches = (instr.attr("true_computation"), instr.attr("false_computation"))
        selector = read_scalar(ctx, ctx.home(comp.name, instr.operands[0]))
        # pred true selects branch 0: turn the predicate into an index.
        ctx.emit(ScalarAlu, fn="eq", dst=selector, a=selector, b=0, control=True)
    else:
        selector = read_scalar(ctx, ctx.home(comp.name, instr.operands[0]))
        # XLA runs the last branch for an index outside [0, N).
        last = len(branches) - 1
        negative, clamped = ctx.label(f"{instr.name}.negative"), ctx.label(f"{instr.name}.clamped")
        below = ctx.register()
        ctx.emit(ScalarAlu, fn="lt", dst=below, a=selector, b=0, control=True)
        ctx.emit(Branch, cond="ne", a=below, b=0, target=negative, control=True)
        ctx.emit(ScalarAlu, fn="min", dst=selector, a=selector, b=last, control=True)
        ctx.emit(Jump, target=clamped, control=True)
        ctx.place_label(negative)
        ctx.emit(ScalarAlu, fn="mov", dst=selector, a=last, control=True)
        ctx.place_label(clamped)
        ctx.release_register(below)
    targets = [ctx.label(f"{instr.name}.b{i}") for i in range(len(branches))]
    end = ctx.label(f"{instr.name}.end")
    for i, target in enumerate(targets[:-1]):
        ctx.emit(Branch, cond="eq", a=selector, b=i, target=target, control=True)
    ctx.emit(Jump, target=targets[-1], control=True)
    entering = ctx.accesses()
    ends = []
    for branch, target in zip(branches, targets):
        ctx.place_label(target)
        ctx.restore(entering)
        lower_computation(ctx, branch)
        copy_arrays(ctx, _result_copies(ctx, branch, comp, instr))
        ends.append(ctx.accesses())
        ctx.emit(Jump, target=end, control=True)
    ctx.place_label(end)
    ctx.restore(*ends)  # megacore: after the join, what any branch left outstanding


@lowering("call")
def lower_call(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    callee = instr.attr("to_apply")
    lower_computation(ctx, callee)
    copy_arrays(ctx, _result_copies(ctx, callee, comp, instr))
