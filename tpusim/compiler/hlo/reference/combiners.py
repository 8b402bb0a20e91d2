"""Applying ``to_apply`` computations to whole arrays: reductions, ordered scatter combines, key expressions.

Shared by reduce, reduce-window, select-and-scatter, scatter and sort. Nothing here loops per element in
Python: a computation recognised as one numpy ufunc (``ROOT add(p0, p1)``) runs as that ufunc; any other
computation is applied with :meth:`EvalContext.vectorized_call` over whole arrays, a logarithmic number
of times for a reduction (pairwise tree) and once per *duplicate rank* for a scatter.

Denormals: a recognised f32/f64 ``add`` or ``multiply`` reduction reads denormal operands as zero and
flushes a denormal result, as XLA CPU (DAZ/FTZ) and TPUs do (``reduce([1e-40, 0])`` is 0 there; partial
sums are not flushed one by one: the order is unspecified anyway).

Numerics decision: a recognised floating-point ``add`` or ``multiply`` reduction over a type narrower
than f32 (bf16, f16, f8) accumulates in f32 and rounds once to the result type, as TPUs do; the result is
the correctly rounded sum up to f32 error, the value every reduction order approximates. XLA leaves the
order unspecified (Operation Semantics, "Reduce"), and XLA CPU rounds each partial sum to the narrow type
in a tree (a bf16 sum of 4096 ones is 4096 there too, but sums that cancel differ by several bf16 ulp: the
tests' tolerance rows say by how much). f32 and f64 sums use numpy's pairwise summation (O(log n) ulp).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.hlo.reference.core import ELEMENTWISE, REFERENCE, EvalContext, EvaluationError, Value
from tpusim.memory import Shape
from tpusim.semantics.combiners import NARROW_FLOATS, exact_identity, ufunc_for
from tpusim.semantics.convert import compute_dtype, flush, round_result

__all__ = [
    "apply_ordered",
    "as_arrays",
    "binary_ufunc",
    "combine",
    "computation",
    "is_projection",
    "reduce_last_axis",
]

_COMMUTATIVE = {"add", "multiply", "maximum", "minimum", "and", "or", "xor"}


def computation(ctx: EvalContext, instr: Instruction, name: str) -> Computation:
    """The computation ``name`` called by ``instr`` (an :class:`EvaluationError` when it is missing)."""
    if ctx.module is None or name not in ctx.module:
        raise EvaluationError(instr, f"called computation {name!r} is not in the module")
    return ctx.module[name]


def binary_ufunc(comp: Computation) -> str | None:
    """The opcode when ``comp`` is exactly ``ROOT op(parameter(0), parameter(1))`` of a commutative,
    associative elementwise op (add, multiply, maximum, minimum, and, or, xor), else None."""
    params = comp.parameters
    root = comp.root_instruction
    if len(params) != 2 or root.opcode not in _COMMUTATIVE or len(root.operands) != 2:
        return None
    if set(root.operands) != {params[0].name, params[1].name}:
        return None
    if params[0].shape != params[1].shape or getattr(params[0].shape, "rank", 1) != 0:
        return None
    return root.opcode


def is_projection(comp: Computation) -> int | None:
    """``i`` when ``comp``'s root is its ``parameter(i)`` itself (``ROOT p1`` is a scatter that overwrites)."""
    root = comp.root_instruction
    return root.attr("parameter_number") if root.opcode == "parameter" else None


def as_arrays(value: Value, n: int) -> list[np.ndarray]:
    """A computation result as a list of ``n`` arrays (a tuple root gives its elements)."""
    out = list(value) if isinstance(value, tuple) else [value]
    if len(out) != n or not all(isinstance(v, np.ndarray) for v in out):
        # A ValueError: the op's dispatcher reports it under the instruction's name.
        raise ValueError(f"the called computation returned {len(out)} values, expected {n} arrays")
    return out  # type: ignore[return-value]


def combine(ctx: EvalContext, name: str, lhs: Sequence[np.ndarray], rhs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``name(lhs..., rhs...)`` elementwise over whole arrays (the reduction-computation calling convention)."""
    return as_arrays(ctx.vectorized_call(name, [*lhs, *rhs]), len(lhs))


def _accumulator(opcode: str, dtype: np.dtype) -> np.dtype:
    """The type a recognised reduction accumulates in: f32 for sums and products of narrow floats."""
    return np.dtype(np.float32) if dtype in NARROW_FLOATS and opcode in ("add", "multiply") else dtype


def reduce_last_axis(
    ctx: EvalContext,
    comp: Computation,
    arrays: Sequence[np.ndarray],
    inits: Sequence[np.ndarray],
    valid: np.ndarray | None = None,
    *,
    exact_zero: bool = False,
) -> list[np.ndarray]:
    """Reduce the last axis of every array in ``arrays`` together with ``comp``, then combine with ``inits``.

    Args:
        ctx: the evaluation context.
        comp: the reduction computation (2N scalar parameters, N results).
        arrays: N arrays of equal shape ``(..., K)``.
        inits: N scalars, the init values (XLA's reduce requires them to be identities of ``comp``;
            reduce-window does not: there each window's result is ``init`` combined with its in-bounds
            elements only).
        valid: None, or a pred array of the arrays' shape: only the elements where it is true take part
            (reduce-window's padding and base-dilation holes are false).
        exact_zero: a recognised float sum of -0.0s is -0.0, as XLA's reduce-window computes it (init, then
            each element); without it numpy's sum starts at +0.0, as XLA CPU's reduce gives +0.0 for a
            sum of -0.0s with init -0.0.

    Returns:
        N arrays of shape ``(...)``: ``comp(init, reduce(x))`` per position, ``init`` when K == 0 or no
        element is valid.
    """
    n = len(arrays)
    k = arrays[0].shape[-1]
    if k == 0:
        return [np.broadcast_to(i, a.shape[:-1]).astype(a.dtype) for i, a in zip(inits, arrays)]
    opcode = binary_ufunc(comp) if n == 1 else None
    identity = None
    if opcode is not None:
        a = arrays[0]
        acc = _accumulator(opcode, a.dtype)
        identity = exact_identity(opcode, acc)
    if opcode is not None and (valid is None or identity is not None):
        if valid is not None and identity is not None:  # elements out of bounds become the identity
            a = np.where(valid, a.astype(acc, copy=False), identity)
        uf = ufunc_for(opcode, acc)
        if uf in (np.add, np.multiply):  # denormal operands read as zero, a denormal result is zero (DAZ/FTZ)
            start = exact_identity(opcode, acc) if exact_zero else None
            red = flush(uf.reduce(flush(a.astype(acc, copy=False)), axis=-1, dtype=acc, initial=start))
            reduced = flush(np.asarray(uf(flush(np.asarray(inits[0]).astype(acc)), red)))
        else:
            reduced = np.asarray(uf(np.asarray(inits[0]).astype(acc), uf.reduce(a, axis=-1)))
        return [reduced.astype(arrays[0].dtype)]
    params = comp.parameters
    if any(params[i].shape != params[n + i].shape for i in range(n)):
        # Accumulators of another type than the elements (XLA's mixed precision): a pairwise tree would call
        # the computation with two elements, so fold the elements into the accumulators one by one.
        folded = [np.broadcast_to(i, arrays[0].shape[:-1]) for i in inits]
        for j in range(k):
            step = combine(ctx, comp.name, folded, [x[..., j] for x in arrays])
            folded = step if valid is None else [np.where(valid[..., j], y, f) for y, f in zip(step, folded)]
        return [np.asarray(f) for f in folded]
    cur = [np.asarray(a) for a in arrays]
    have = None if valid is None else np.asarray(valid, dtype=bool)
    while k > 1:
        even = k // 2 * 2
        left = [a[..., 0:even:2] for a in cur]
        right = [a[..., 1:even:2] for a in cur]
        out = combine(ctx, comp.name, left, right)
        if have is not None:  # a pair with one valid element keeps it; with none, either (still invalid)
            lv, rv = have[..., 0:even:2], have[..., 1:even:2]
            out = [np.where(lv & rv, o, np.where(lv, x, y)) for o, x, y in zip(out, left, right)]
            pair = lv | rv
            have = np.concatenate([pair, have[..., -1:]], axis=-1) if k % 2 else pair
        if k % 2:
            out = [np.concatenate([o, a[..., -1:]], axis=-1) for o, a in zip(out, cur)]
        cur = out
        k = cur[0].shape[-1]
    last = [a[..., 0] for a in cur]
    res = combine(ctx, comp.name, [np.broadcast_to(i, last[0].shape) for i in inits], last)
    if have is None:
        return res
    return [np.where(have[..., 0], r, np.broadcast_to(i, r.shape)).astype(r.dtype) for r, i in zip(res, inits)]


def duplicate_rounds(targets: np.ndarray) -> list[np.ndarray]:
    """Split positions ``0..len(targets)-1`` into rounds in which no target repeats.

    Round ``r`` holds, for every target, its ``r``-th occurrence in ``targets`` order, so applying the rounds
    one after the other applies the updates of each target in their original order.
    """
    n = targets.shape[0]
    if n == 0:
        return []
    order = np.argsort(targets, kind="stable")
    st = targets[order]
    starts = np.ones(n, dtype=bool)
    starts[1:] = st[1:] != st[:-1]
    run_start = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    rank = np.arange(n) - run_start
    by_rank = np.argsort(rank, kind="stable")
    counts = np.bincount(rank)
    return np.split(order[by_rank], np.cumsum(counts)[:-1])


def apply_ordered(
    ctx: EvalContext,
    comp: Computation,
    outputs: list[np.ndarray],
    targets: np.ndarray,
    updates: Sequence[np.ndarray],
) -> None:
    """``out[t] = comp(out[t], update)`` for each (target, update) in order, on flat output arrays, in place.

    Args:
        ctx: the evaluation context.
        comp: the combiner (2N scalar parameters: N current values, then N updates; N results).
        outputs: N flat (1-D) arrays, modified in place.
        targets: flat positions, int64, one per update, in application order.
        updates: N 1-D arrays of update values, aligned with ``targets``.
    """
    n = len(outputs)
    if targets.size == 0:
        return
    proj = is_projection(comp)
    if proj is not None and proj >= n:
        # Overwrite: the last update of each target wins.
        rev = targets[::-1]
        _, first_in_rev = np.unique(rev, return_index=True)
        keep = targets.size - 1 - first_in_rev
        for o, u in zip(outputs, updates):
            o[targets[keep]] = u[keep]
        return
    if proj is not None:
        return  # ROOT parameter(i < N): the operand keeps its value
    opcode = binary_ufunc(comp) if n == 1 else None
    if opcode is not None and not _is_float(outputs[0].dtype):
        # ufunc.at applies the updates unbuffered, one after the other, in index order.
        ufunc_for(opcode, outputs[0].dtype).at(outputs[0], targets, updates[0])
        return
    for idx in duplicate_rounds(targets):
        t = targets[idx]
        if opcode is not None:
            outputs[0][t] = _float_binary(opcode, outputs[0][t], updates[0][idx])
            continue
        res = combine(ctx, comp.name, [o[t] for o in outputs], [u[idx] for u in updates])
        for o, r in zip(outputs, res):
            o[t] = r


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind in "fc" or dtype in NARROW_FLOATS


def _float_binary(opcode: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``opcode(a, b)`` as XLA CPU's float arithmetic: narrow floats in f32, denormal operands and results
    flushed to zero (convert.py), rounded back to the type (``ufunc.at`` would neither widen nor flush)."""
    wide = compute_dtype(a.dtype)
    r = ufunc_for(opcode, wide)(flush(a.astype(wide, copy=False)), flush(b.astype(wide, copy=False)))
    return round_result(flush(np.asarray(r)), a.dtype)


def _scalar(shape: object) -> bool:
    return isinstance(shape, Shape) and shape.rank == 0


def key_expression(comp: Computation, root: str, param: int) -> list[Instruction] | None:
    """The instructions computing ``root`` from ``parameter(param)`` alone (and scalar constants), in
    dependency order, when all of them are elementwise (so they can run on whole arrays); None otherwise."""
    order: list[Instruction] = []
    seen: set[str] = set()

    def visit(name: str) -> bool:
        if name in seen:
            return True
        ins = comp[name]
        if ins.opcode == "parameter":
            if ins.attr("parameter_number") != param:
                return False
        elif ins.opcode in ("constant", "bitcast-convert") and _scalar(ins.shape):
            pass  # XLA:TPU's total-order key of a float: its bits as s32, xor 0x7fffffff where negative
        elif ins.opcode not in ELEMENTWISE:
            return False
        for op in ins.operands:
            if not visit(op):
                return False
        seen.add(name)
        order.append(ins)
        return True

    return order if visit(root) else None


def run_expression(ctx: EvalContext, instrs: Sequence[Instruction], value: np.ndarray) -> np.ndarray:
    """Evaluate the elementwise instructions ``instrs`` (from :func:`key_expression`) on a whole array."""
    env: dict[str, Value] = {}
    for ins in instrs:
        if ins.opcode == "parameter":
            env[ins.name] = value
            continue
        env[ins.name] = REFERENCE[ins.opcode](ctx, ins, [env[o] for o in ins.operands])
    out = env[instrs[-1].name]
    assert isinstance(out, np.ndarray)
    return out
