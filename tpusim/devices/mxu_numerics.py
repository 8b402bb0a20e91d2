"""What the MXU computes: bf16 passes with f32 accumulation, the f32 splits of the multi-pass precisions, and
the result buffer.

The rule (``docs/model.md``, "MXU numerics"):

* Float operands enter the array as bf16 values: bf16 (and f16 or f32 under the one-pass precision, rounded
  to nearest even) values. The product of two bf16 values is exact in f32 (8 + 8 significand bits), and the
  array accumulates in f32, as the MXU's f32 accumulators do.
* The f32 sums are computed by a BLAS ``sgemm`` (numpy's matmul), so the order of the f32 additions is the
  library's, not the systolic array's: results are within f32 accumulation error of the hardware, not bit
  for bit, and deterministic on one machine (one numpy and BLAS build).
* Consecutive one-pass matmuls that accumulate into the same result rows with weights of the same width form
  one group: its outputs are the result rows' earlier value (when the first matmul accumulates) plus ONE
  f32 product of the group's operands concatenated along the contraction, evaluated when something needs
  the rows (a pop, a matmul that overlaps them differently, a multi-pass or integer matmul). A K x N weight
  sweep accumulated into one block of rows is therefore one f32 dot product per output, as XLA's dot with
  f32 accumulation computes it.
* f32 operands under ``bf16_3x`` / ``bf16_6x`` are split as XLA's dot-algorithm rewriter does (hi =
  truncation to bf16, lo = rounded remainder; passes lo*hi + hi*lo, NaN to 0, + hi*hi; ``bf16_6x``: three
  parts, mid*mid + hi*lo + lo*hi + hi*mid + mid*hi, NaN to 0, + hi*hi); each pass is an f32 product, the
  passes are summed in f32 in that order and added to the result rows.
* 8-bit integers: exact products and sums, wrapped to s32.

The result buffer holds 32-bit words (f32 or s32 bit patterns).
"""

from __future__ import annotations

from collections import OrderedDict

import ml_dtypes
import numpy as np

from tpusim.isa import PRECISION_PASSES

__all__ = ["BF16", "ResultBuffer", "matmul_f32", "one_pass", "split_bf16"]

BF16 = np.dtype(ml_dtypes.bfloat16)
_CONCAT_LIMIT = 32 << 20  # bytes of concatenated group operands kept for reuse (an LHS panel, weight columns)
_SPARES = 2  # evicted joined arrays kept per shape, to be filled by the next join of that shape


def _truncate_bf16(x: np.ndarray) -> np.ndarray:
    """f32 with the low 16 bits cleared (exactly representable in bf16)."""
    return (np.ascontiguousarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def split_bf16(x: np.ndarray, parts: int) -> list[np.ndarray]:
    """Split f32 ``x`` into ``parts`` bf16-valued f32 arrays as XLA's dot-algorithm rewriter does.

    1 part: ``x`` rounded to bf16 (nearest even). 2: truncated high part and the rounded remainder.
    3: truncated high, truncated middle, rounded low.
    """
    x = np.asarray(x, np.float32)
    if parts == 1:
        return [x.astype(BF16).astype(np.float32)]
    out = []
    rest = x
    with np.errstate(invalid="ignore", over="ignore"):
        for _ in range(parts - 1):
            hi = _truncate_bf16(rest)
            out.append(hi)
            rest = (rest - hi).astype(np.float32)
        out.append(rest.astype(BF16).astype(np.float32))
    return out


def one_pass(x: np.ndarray) -> np.ndarray:
    """A float operand as the one-pass MXU input: its values rounded to bf16, as a C-contiguous f32 matrix."""
    if x.dtype == BF16:
        return np.ascontiguousarray(x, np.float32)
    return np.ascontiguousarray(np.asarray(x, np.float32).astype(BF16), np.float32)


def _pass(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One pass of bf16-valued f32 operands: exact products, f32 sums."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.ascontiguousarray(a, np.float32) @ np.ascontiguousarray(b, np.float32)


def _nan_to_zero(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) <= np.float32(np.inf), x, np.float32(0))


def is_one_pass(precision: str, lhs: np.dtype, w: np.dtype) -> bool:
    """Float operands that take one bf16 pass (else they are split, see :func:`matmul_f32`)."""
    return not (PRECISION_PASSES[precision][1] > 1 and (lhs == np.float32 or w == np.float32))


def matmul_f32(lhs: np.ndarray, w: np.ndarray, precision: str) -> np.ndarray:
    """``lhs @ w`` as one MXU matmul computes it for float operands (see the module docstring)."""
    if is_one_pass(precision, lhs.dtype, w.dtype):
        return _pass(one_pass(lhs), one_pass(w))
    n = 2 if PRECISION_PASSES[precision][1] == 3 else 3
    a, b = split_bf16(lhs, n), split_bf16(w, n)
    order = [(1, 0), (0, 1)] if n == 2 else [(1, 1), (0, 2), (2, 0), (0, 1), (1, 0)]
    with np.errstate(invalid="ignore", over="ignore"):
        acc = _pass(a[order[0][0]], b[order[0][1]])
        for i, j in order[1:]:
            acc = (acc + _pass(a[i], b[j])).astype(np.float32)
        out: np.ndarray = (_nan_to_zero(acc) + _pass(a[0], b[0])).astype(np.float32)
        return out


class _Group:
    """One-pass matmuls accumulating into rows ``[acc, acc + m)`` x columns ``[0, n)``, not yet evaluated."""

    __slots__ = ("acc", "base", "lhs", "m", "n", "w")

    def __init__(self, acc: int, m: int, n: int, base: np.ndarray | None) -> None:
        self.acc = acc
        self.m = m
        self.n = n
        self.base = base  # the rows' f32 value the group adds to; None when its first matmul overwrote them
        self.lhs: list[np.ndarray] = []
        self.w: list[np.ndarray] = []


class ResultBuffer:
    """An MXU's result buffer: ``rows x cols`` 32-bit words and the one-pass groups pending on them."""

    __slots__ = ("_concat", "_concat_bytes", "_spare", "cols", "groups", "rows", "words")

    def __init__(self, rows: int, cols: int) -> None:
        self.rows = rows
        self.cols = cols
        self.words = np.zeros((rows, cols), np.uint32)
        self.groups: list[_Group] = []
        self._concat: OrderedDict[tuple[int, ...], tuple[tuple[np.ndarray, ...], np.ndarray]] = OrderedDict()
        self._concat_bytes = 0
        self._spare: dict[tuple[int, ...], list[np.ndarray]] = {}

    def rows_of(self, acc: int, m: int, n: int) -> np.ndarray:
        """The words of rows ``[acc, acc + m)``, columns ``[0, n)``, pending groups evaluated first."""
        self.settle(acc, acc + m)
        return self.words[acc : acc + m, :n]

    def accumulate(self, acc: int, lhs: np.ndarray, w: np.ndarray, add: bool) -> None:
        """A one-pass matmul into rows ``acc..``; ``add``: accumulate into them.

        The operands hold bf16 values: bf16 matrices (any strides), or f32 ones already rounded to bf16
        (:func:`one_pass`). They are kept, not copied: they must be read-only snapshots (cached values)."""
        m, n = lhs.shape[0], w.shape[1]
        for g in self.groups:
            if g.acc == acc and g.m == m and g.n == n:
                if not add:  # overwrites exactly the group's words: its pending sum no longer matters
                    g.base = None
                    g.lhs.clear()
                    g.w.clear()
                g.lhs.append(lhs)
                g.w.append(w)
                return
        self.settle(acc, acc + m)
        base = self.words[acc : acc + m, :n].view(np.float32).copy() if add else None
        g = _Group(acc, m, n, base)
        g.lhs.append(lhs)
        g.w.append(w)
        self.groups.append(g)

    def settle(self, lo: int, hi: int) -> None:
        """Evaluate the pending groups on rows ``[lo, hi)``."""
        if not self.groups:
            return
        keep = []
        for g in self.groups:
            if g.acc < hi and lo < g.acc + g.m:
                self._evaluate(g)
            else:
                keep.append(g)
        self.groups = keep

    def _evaluate(self, g: _Group) -> None:
        # the product lands in the result words directly; base + product == product + base (IEEE addition
        # commutes), so adding the base afterwards in place gives the same bits
        out = self.words[g.acc : g.acc + g.m, : g.n].view(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            np.matmul(self._joined(g.lhs, 1), self._joined(g.w, 0), out=out)
            if g.base is not None:
                np.add(out, g.base, out=out)
        self._trim()

    def _joined(self, parts: list[np.ndarray], axis: int) -> np.ndarray:
        """The parts as one f32 matrix (``np.concatenate(parts, axis)`` converting bf16 to f32 on the way),
        reused while the same arrays come again (cached operand values are the same objects until their
        memory is written)."""
        if len(parts) == 1 and parts[0].dtype == np.float32:
            return parts[0]
        key = (axis, *map(id, parts))
        hit = self._concat.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], parts)):
            self._concat.move_to_end(key)
            return hit[1]
        shape = list(parts[0].shape)
        shape[axis] = sum(p.shape[axis] for p in parts)
        spares = self._spare.get(tuple(shape))
        out = spares.pop() if spares else np.empty(shape, np.float32)
        np.concatenate(parts, axis=axis, out=out)  # (bf16 -> f32 is exact)
        self._concat[key] = (tuple(parts), out)  # the parts are kept, so their ids stay theirs
        self._concat_bytes += out.nbytes
        return out

    def _trim(self) -> None:
        """Drop the least recently used joined operands beyond the byte limit, keeping their arrays for the next
        joins of the same shape (a fresh array of megabytes costs more in page faults than the copy into it).

        Called only between evaluations, so no array handed out by :meth:`_joined` is still in use."""
        while self._concat_bytes > _CONCAT_LIMIT and len(self._concat) > 1:
            _, (_, old) = self._concat.popitem(last=False)
            self._concat_bytes -= old.nbytes
            spares = self._spare.setdefault(old.shape, [])
            if len(spares) < _SPARES:
                spares.append(old)
