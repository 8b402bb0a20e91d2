"""sort (several operands, any comparator) and topk.

XLA's sort orders the elements along one dimension so that the comparator (a ``less-than`` over the
2N scalars ``lhs_0, rhs_0, lhs_1, rhs_1, ...``) holds between neighbours; ``is_stable`` keeps equal
elements in their input order (Operation Semantics, "Sort"). Two strategies, same result:

* **Key comparators** (what JAX emits): the comparator is recognised as a lexicographic order of *keys*:
  ``compare(f(lhs_k), f(rhs_k)), direction=LT|GT`` or ``or(lt_0, and(eq_0, <rest>))``, where ``f`` is any
  chain of elementwise ops (JAX canonicalises -0 and NaN this way before a TOTALORDER compare). ``f`` is
  evaluated on whole operands, the keys mapped to integers with the compare type's order, and one stable
  ``np.lexsort`` sorts every row.
* **Any other comparator**: a bottom-up stable merge sort whose merges rank every element in the other
  run by a vectorised binary search, calling the comparator on whole arrays of pairs (O(log^2 n) calls).

Float orders: TOTALORDER is IEEE totalOrder (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN). The
default FLOAT compare treats -0 and +0 as equal; NaN compares false both ways in IEEE, which is no
ordering at all, so XLA leaves the result undefined: here NaNs sort after +inf (numpy's choice).

topk returns the ``k`` largest (or smallest) elements of the last dimension and their s32 indices, in
order, ties broken by the lower index, floats ordered by totalOrder (as XLA's TopK decomposition does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tpusim.compiler.hlo.ir import Computation, Instruction
from tpusim.compiler.hlo.reference.combiners import computation, key_expression, run_expression
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value, register
from tpusim.memory import ELEMENT_TYPES, TupleShape

__all__ = ["SortKey", "comparator_keys", "order_keys", "sort_arrays", "topk"]


@dataclass(frozen=True, slots=True)
class SortKey:
    """One key of a lexicographic comparator.

    Attributes:
        operand: which sort operand the key is computed from.
        descending: True for ``direction=GT``.
        compare_type: the compare's type (``TOTALORDER``, ``FLOAT``, ``SIGNED``, ``UNSIGNED``) or None.
        expression: elementwise instructions computing the key from ``parameter(2 * operand)``.
    """

    operand: int
    descending: bool
    compare_type: str | None
    expression: tuple[Instruction, ...]


def _same_expression(comp: Computation, a: str, b: str, pa: int, pb: int) -> bool:
    """True when instruction ``a`` computes from ``parameter(pa)`` what ``b`` computes from ``parameter(pb)``."""
    if a == b:
        return _free_of(comp, a, {pa, pb})
    x, y = comp[a], comp[b]
    if x.opcode == "parameter" and y.opcode == "parameter":
        return x.attr("parameter_number") == pa and y.attr("parameter_number") == pb
    if x.opcode != y.opcode or x.shape != y.shape or x.attributes != y.attributes:
        return False
    if len(x.operands) != len(y.operands):
        return False
    return all(_same_expression(comp, p, q, pa, pb) for p, q in zip(x.operands, y.operands))


def _free_of(comp: Computation, name: str, params: set[int]) -> bool:
    ins = comp[name]
    if ins.opcode == "parameter":
        return ins.attr("parameter_number") not in params
    return all(_free_of(comp, o, params) for o in ins.operands)


def _parameter_of(comp: Computation, name: str) -> set[int]:
    ins = comp[name]
    if ins.opcode == "parameter":
        return {int(ins.attr("parameter_number"))}
    out: set[int] = set()
    for o in ins.operands:
        out |= _parameter_of(comp, o)
    return out


def _compare_key(comp: Computation, name: str, directions: tuple[str, ...]) -> tuple[SortKey, str] | None:
    """``compare(f(lhs_k), f(rhs_k))`` with a direction in ``directions`` -> (key, direction)."""
    ins = comp[name]
    if ins.opcode != "compare" or len(ins.operands) != 2:
        return None
    direction = str(ins.attr("direction", "")).upper()
    if direction not in directions:
        return None
    a, b = ins.operands
    params = _parameter_of(comp, a)
    if len(params) != 1:
        return None
    p = next(iter(params))
    k, swapped = divmod(p, 2)
    other = 2 * k + (0 if swapped else 1)
    if not _same_expression(comp, a, b, p, other):
        return None
    lhs_param = 2 * k
    key_root = a if not swapped else b
    expr = key_expression(comp, key_root, lhs_param)
    if expr is None:
        return None
    descending = (direction == "GT") != bool(swapped)
    ctype = ins.attr("type")
    key = SortKey(k, descending, str(ctype).upper() if ctype is not None else None, tuple(expr))
    return key, direction


def comparator_keys(comp: Computation) -> list[SortKey] | None:
    """The lexicographic keys ``comp`` orders by, or None when it is not recognised as a key comparator."""
    keys: list[SortKey] = []
    name = comp.root
    while True:
        single = _compare_key(comp, name, ("LT", "GT"))
        if single is not None:
            keys.append(single[0])
            return keys
        ins = comp[name]
        if ins.opcode != "or" or len(ins.operands) != 2:
            return None
        for first, rest_and in (ins.operands, ins.operands[::-1]):
            lt = _compare_key(comp, first, ("LT", "GT"))
            conj = comp[rest_and]
            if lt is None or conj.opcode != "and" or len(conj.operands) != 2:
                continue
            for eq_name, rest in (conj.operands, conj.operands[::-1]):
                eq = _compare_key(comp, eq_name, ("EQ",))
                if eq is None or not _same_key(comp, lt[0], eq[0], first, eq_name):
                    continue
                keys.append(lt[0])
                name = rest
                break
            else:
                continue
            break
        else:
            return None


def _same_key(comp: Computation, lt: SortKey, eq: SortKey, lt_name: str, eq_name: str) -> bool:
    """The EQ compare of a lexicographic step compares the same key as its LT compare."""
    a, b = comp[lt_name].operands, comp[eq_name].operands
    return lt.operand == eq.operand and (
        (a[0] == b[0] and a[1] == b[1]) or (a[0] == b[1] and a[1] == b[0]) or lt.expression == eq.expression
    )


_FLOATS = frozenset(t.dtype for t in ELEMENT_TYPES.values() if t.kind == "float" and t.dtype is not None)
_SMALL_INTS = frozenset(
    t.dtype for t in ELEMENT_TYPES.values() if t.is_integer and t.dtype is not None and t.name != "u64"
)


def _orderable(key: np.ndarray, compare_type: str | None, descending: bool) -> np.ndarray:
    """Integers whose ascending order is the key order (reversed when ``descending``)."""
    if key.dtype == np.bool_ or key.dtype in _SMALL_INTS:
        out = key.astype(np.int64)
    elif key.dtype.kind == "u":
        out = key.astype(np.uint64)
    elif key.dtype in _FLOATS:
        f = key.astype(np.float64)
        if compare_type != "TOTALORDER":
            # IEEE order: -0 == +0; every NaN one value, after +inf (see the module docstring).
            f = np.where(np.isnan(f), np.nan, np.where(f == 0, 0.0, f))
        bits = f.view(np.int64)
        out = bits ^ ((bits >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))
    else:
        raise TypeError(f"cannot order sort keys of type {key.dtype}")
    return ~out if descending else out


def order_keys(ctx: EvalContext, keys: Sequence[SortKey], operands: Sequence[np.ndarray]) -> np.ndarray:
    """Stable sort permutation along the last axis for ``keys`` over ``operands`` (last axis = sort axis)."""
    cols = []
    for key in keys:
        value = run_expression(ctx, key.expression, operands[key.operand])
        value = np.broadcast_to(value, operands[0].shape)
        cols.append(_orderable(value, key.compare_type, key.descending))
    if len(cols) == 1:
        return np.argsort(cols[0], axis=-1, kind="stable")
    return np.lexsort(cols[::-1], axis=-1)


def _merge_sort(ctx: EvalContext, comp: Computation, operands: Sequence[np.ndarray]) -> np.ndarray:
    """Stable permutation along the last axis for an arbitrary comparator (see the module docstring)."""
    shape = operands[0].shape
    n = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    perm = np.broadcast_to(np.arange(n, dtype=np.int64), (rows, n)).copy()
    flat = [np.asarray(o, order="C").reshape(rows, n) for o in operands]
    row = np.arange(rows)[:, None]
    pos = np.arange(n, dtype=np.int64)[None, :]
    width = 1
    while width < n:
        cur = [f[row, perm] for f in flat]  # values in current order
        run = pos // width
        start = run * width
        partner = np.where(run % 2 == 0, start + width, start - width)
        plen = np.clip(n - partner, 0, width)
        in_left = run % 2 == 0
        # Left elements count partner elements strictly less (comp(b, a)); right elements count partner
        # elements not greater (!comp(b, a)). Both are prefixes of the sorted partner run.
        lo = np.zeros((rows, n), np.int64)
        hi = np.broadcast_to(plen, (rows, n)).copy()
        while True:
            active = lo < hi
            if not active.any():
                break
            mid = (lo + hi) // 2
            other = np.clip(np.broadcast_to(partner, (rows, n)) + mid, 0, n - 1)
            # Left elements ask partner[mid] < element; right ones element < partner[mid] (then negate).
            args: list[np.ndarray] = []
            for c in cur:
                theirs = c[row, other]
                args += [np.where(in_left, theirs, c), np.where(in_left, c, theirs)]
            less = ctx.vectorized_call(comp.name, args)
            if not isinstance(less, np.ndarray) or less.dtype != np.bool_:
                raise ValueError(f"sort comparator {comp.name} must return pred")
            go_right = np.where(in_left, less, ~less)
            lo = np.where(active & go_right, mid + 1, lo)
            hi = np.where(active & ~go_right, mid, hi)
        offset = pos - start
        merged_start = np.where(in_left, start, partner)
        target = merged_start + offset + lo
        new_perm = np.empty_like(perm)
        new_perm[np.broadcast_to(row, (rows, n)), target] = perm
        perm = new_perm
        width *= 2
    return perm.reshape(shape)


def sort_arrays(ctx: EvalContext, comp: Computation, operands: Sequence[np.ndarray], dim: int) -> list[np.ndarray]:
    """Sort ``operands`` together along ``dim`` with comparator ``comp``."""
    moved = [np.moveaxis(o, dim, -1) for o in operands]
    if moved[0].shape[-1] <= 1:
        return [o.copy() for o in operands]
    keys = comparator_keys(comp)
    perm = order_keys(ctx, keys, moved) if keys is not None else _merge_sort(ctx, comp, moved)
    return [np.moveaxis(np.take_along_axis(m, perm, axis=-1), -1, dim) for m in moved]


@register("sort")
def _sort(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    if not args or not all(isinstance(a, np.ndarray) for a in args):
        raise EvaluationError(instr, "takes one or more array operands")
    operands = [np.asarray(a) for a in args]
    if any(o.shape != operands[0].shape for o in operands):
        raise EvaluationError(instr, f"operands have different dimensions {[list(o.shape) for o in operands]}")
    dims = tuple(instr.attr("dimensions", (0,)))
    if len(dims) != 1 or not -operands[0].ndim <= int(dims[0]) < max(operands[0].ndim, 1):
        raise EvaluationError(instr, f"dimensions={list(dims)} must name one dimension of the operands")
    comp = computation(ctx, instr, instr.attr("to_apply"))
    if len(comp.parameters) != 2 * len(operands):
        raise EvaluationError(
            instr, f"comparator {comp.name} takes {len(comp.parameters)} parameters, expected {2 * len(operands)}"
        )
    if operands[0].ndim == 0:
        out = [o.copy() for o in operands]
    else:
        out = sort_arrays(ctx, comp, operands, int(dims[0]) % operands[0].ndim)
    return tuple(out) if isinstance(instr.shape, TupleShape) else out[0]


def topk(x: np.ndarray, k: int, largest: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest (``largest``) or smallest elements along the last axis, and their int32 indices."""
    if not 0 <= k <= x.shape[-1]:
        raise ValueError(f"k={k} is outside [0, {x.shape[-1]}]")
    keys = _orderable(x, "TOTALORDER", largest)
    idx = np.argsort(keys, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, idx, axis=-1), idx.astype(np.int32)


@register("topk")
def _topk(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    if len(args) != 1 or not isinstance(args[0], np.ndarray) or args[0].ndim == 0:
        raise EvaluationError(instr, "takes one array operand of rank >= 1")
    k = int(instr.attr("k", -1))
    try:
        return topk(args[0], k, bool(instr.attr("largest", True)))
    except ValueError as exc:
        raise EvaluationError(instr, str(exc)) from None
