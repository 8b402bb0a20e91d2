"""cholesky and triangular-solve, and the dense factorisations the LAPACK custom calls need.

Semantics (Operation Semantics, "Cholesky" and "TriangularSolve"):

* ``cholesky(a), lower=true`` reads the lower triangle of each (batched, trailing two dimensions) matrix
  and returns ``l`` with ``a = l l^H`` in that triangle; the other triangle is implementation-defined:
  here zeros, as XLA CPU returns. A matrix that is not positive definite gives NaNs from the first
  failing column on (XLA: implementation-defined).
* ``triangular-solve(a, b)`` solves ``op(a) x = b`` (``left_side``) or ``x op(a) = b`` reading only the
  ``lower``/upper triangle of ``a`` (its diagonal taken as ones when ``unit_diagonal``), ``op`` being
  identity, transpose or conjugate transpose (``transpose_a``).

Numerics: both run column by column (vectorised over the batch and the right-hand sides) in f64 or c128
and round once to the element type, so the oracle is at least as accurate as any backend.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value, register

__all__ = ["cholesky", "cholesky_lower", "triangular_solve", "wide"]


def wide(a: np.ndarray) -> np.ndarray:
    """``a`` in f64 (c128 for complex) for the factorisations."""
    return a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)


def cholesky_lower(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower Cholesky factor of the lower triangle of each matrix of ``a`` (f64/c128), and per matrix the
    1-based column where it failed (0: positive definite), LAPACK's ``info``."""
    n = a.shape[-1]
    fac = np.zeros_like(a)
    info = np.zeros(a.shape[:-2], dtype=np.int32)
    with np.errstate(all="ignore"):
        for j in range(n):
            row = fac[..., j, :j]
            d = a[..., j, j].real - np.sum((row * row.conj()).real, axis=-1)
            bad = ~(d > 0) & (info == 0)
            info = np.where(bad, j + 1, info)
            ljj = np.sqrt(np.where(d > 0, d, np.nan))
            fac[..., j, j] = ljj
            if j + 1 < n:
                below = a[..., j + 1 :, j] - np.einsum("...ik,...k->...i", fac[..., j + 1 :, :j], row.conj())
                fac[..., j + 1 :, j] = below / ljj[..., None]
    return fac, info


def cholesky(a: np.ndarray, lower: bool = True) -> np.ndarray:
    """XLA cholesky of ``a`` (batched), in ``a``'s dtype; the unused triangle is zero."""
    w = wide(a)
    if lower:
        out, _ = cholesky_lower(w)
    else:
        out, _ = cholesky_lower(np.swapaxes(w, -1, -2).conj())
        out = np.swapaxes(out, -1, -2).conj()
    return out.astype(a.dtype)


def triangular_solve(
    a: np.ndarray,
    b: np.ndarray,
    *,
    left_side: bool,
    lower: bool,
    unit_diagonal: bool,
    transpose_a: str,
) -> np.ndarray:
    """XLA triangular-solve (see the module docstring), in ``b``'s dtype."""
    n = a.shape[-1]
    m = wide(a)
    m = np.tril(m) if lower else np.triu(m)
    if unit_diagonal:
        idx = np.arange(n)
        m[..., idx, idx] = 1
    t = transpose_a.upper()
    if t in ("TRANSPOSE", "ADJOINT"):
        m = np.swapaxes(m, -1, -2)
        if t == "ADJOINT":
            m = m.conj()
        lower = not lower
    elif t != "NO_TRANSPOSE":
        raise ValueError(f"transpose_a={transpose_a} is not NO_TRANSPOSE, TRANSPOSE or ADJOINT")
    rhs = wide(b)
    if not left_side:
        # x M = b  <=>  M^T x^T = b^T
        m = np.swapaxes(m, -1, -2)
        rhs = np.swapaxes(rhs, -1, -2)
        lower = not lower
    x = np.zeros(np.broadcast_shapes(m.shape[:-2], rhs.shape[:-2]) + rhs.shape[-2:], dtype=np.result_type(m, rhs))
    order = range(n) if lower else range(n - 1, -1, -1)
    with np.errstate(all="ignore"):
        for i in order:
            acc = rhs[..., i, :] - np.einsum("...k,...kj->...j", m[..., i, :], x)
            x[..., i, :] = acc / m[..., i, i][..., None]
    if not left_side:
        x = np.swapaxes(x, -1, -2)
    return x.astype(b.dtype)


@register("cholesky")
def _cholesky(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    (a,) = args
    if not isinstance(a, np.ndarray) or a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise EvaluationError(instr, "operand must be a (batch of) square matrices")
    return cholesky(a, bool(instr.attr("lower", False)))


@register("triangular-solve")
def _triangular_solve(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    a, b = args
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise EvaluationError(instr, "a must be a (batch of) square matrices and b an array")
    left = bool(instr.attr("left_side", False))
    k = b.shape[-2] if left else b.shape[-1]
    if b.ndim != a.ndim or k != a.shape[-1] or a.shape[:-2] != b.shape[:-2]:
        raise EvaluationError(instr, f"b {list(b.shape)} does not fit a {list(a.shape)} (left_side={left})")
    try:
        return triangular_solve(
            a,
            b,
            left_side=left,
            lower=bool(instr.attr("lower", False)),
            unit_diagonal=bool(instr.attr("unit_diagonal", False)),
            transpose_a=str(instr.attr("transpose_a", "NO_TRANSPOSE")),
        )
    except ValueError as exc:
        raise EvaluationError(instr, str(exc)) from None


# ---------------------------------------------------------------------------------------------
# LAPACK-convention factorisations (used by the LAPACK and TPU linear-algebra custom calls)
# ---------------------------------------------------------------------------------------------
def householder_qr(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LAPACK ``geqrf``: ``R`` in the upper triangle, the Householder vectors below it, and ``tau``.

    Each reflector follows ``?larfg``: ``beta = -sign(Re alpha) * ||(alpha, x)||``,
    ``tau = (beta - alpha) / beta``, ``v = x / (alpha - beta)`` (``tau = 0`` when ``x = 0`` and alpha is real).
    """
    w = wide(a).copy()
    m, n = w.shape[-2:]
    k = min(m, n)
    tau = np.zeros((*w.shape[:-2], k), dtype=w.dtype)
    with np.errstate(all="ignore"):
        for j in range(k):
            alpha = w[..., j, j].copy()
            xnorm = np.sqrt(np.sum(np.abs(w[..., j + 1 :, j]) ** 2, axis=-1))
            trivial = (xnorm == 0) & (np.imag(alpha) == 0)
            norm = np.sqrt(np.abs(alpha) ** 2 + xnorm**2)
            beta = np.where(np.real(alpha) >= 0, -norm, norm)
            t = np.where(trivial, 0, (beta - alpha) / np.where(trivial, 1, beta))
            scale = np.where(trivial, 0, 1 / np.where(trivial, 1, alpha - beta))
            w[..., j + 1 :, j] = np.where(trivial[..., None], w[..., j + 1 :, j], w[..., j + 1 :, j] * scale[..., None])
            w[..., j, j] = np.where(trivial, alpha, beta)
            tau[..., j] = t
            if j + 1 < n:
                v = np.concatenate([np.ones((*w.shape[:-2], 1), w.dtype), w[..., j + 1 :, j]], axis=-1)
                # A <- H^H A with H^H = I - conj(tau) v v^H
                proj = np.einsum("...i,...ij->...j", v.conj(), w[..., j:, j + 1 :])
                w[..., j:, j + 1 :] -= (t.conj()[..., None, None] * v[..., :, None]) * proj[..., None, :]
    return w.astype(a.dtype), tau.astype(a.dtype)


def householder_product(a: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """LAPACK ``orgqr``/``ungqr``: the first ``n`` columns of ``H_1 ... H_k`` from ``geqrf``'s output."""
    w, t = wide(a), wide(tau)
    m, n = w.shape[-2:]
    k = t.shape[-1]
    q = np.zeros_like(w)
    idx = np.arange(min(m, n))
    q[..., idx, idx] = 1
    for j in range(k - 1, -1, -1):
        v = np.concatenate([np.ones((*w.shape[:-2], 1), w.dtype), w[..., j + 1 :, j]], axis=-1)
        proj = np.einsum("...i,...ij->...j", v.conj(), q[..., j:, :])
        q[..., j:, :] -= (t[..., j][..., None, None] * v[..., :, None]) * proj[..., None, :]
    return q.astype(a.dtype)


def lu_partial_pivoting(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LAPACK ``getrf``: packed ``L\\U``, 0-based pivot rows per step, and ``info`` (first zero pivot, 1-based).

    The pivot is the first entry of largest ``|Re| + |Im|`` (LAPACK's ``i?amax``) in the column.
    """
    w = wide(a).copy()
    m, n = w.shape[-2:]
    k = min(m, n)
    batch = w.shape[:-2]
    flat = w.reshape(-1, m, n)
    rows = np.arange(flat.shape[0])
    piv = np.zeros((flat.shape[0], k), np.int32)
    info = np.zeros(flat.shape[0], np.int32)
    with np.errstate(all="ignore"):
        for j in range(k):
            col = flat[:, j:, j]
            p = j + np.argmax(np.abs(col.real) + np.abs(col.imag) if np.iscomplexobj(col) else np.abs(col), axis=-1)
            piv[:, j] = p
            top = flat[rows, j, :].copy()
            flat[rows, j, :] = flat[rows, p, :]
            flat[rows, p, :] = top
            pivot = flat[:, j, j]
            zero = pivot == 0
            info = np.where(zero & (info == 0), j + 1, info)
            safe = np.where(zero, 1, pivot)
            flat[:, j + 1 :, j] = np.where(zero[:, None], flat[:, j + 1 :, j], flat[:, j + 1 :, j] / safe[:, None])
            flat[:, j + 1 :, j + 1 :] -= flat[:, j + 1 :, j, None] * flat[:, j, None, j + 1 :]
    return flat.reshape(w.shape).astype(a.dtype), piv.reshape((*batch, k)), info.reshape(batch)


def pivots_to_permutation(pivots: np.ndarray, m: int) -> np.ndarray:
    """The row permutation (s32) that the row swaps ``pivots`` (0-based, per step) apply to ``0..m-1``."""
    flat = pivots.reshape(-1, pivots.shape[-1])
    perm = np.broadcast_to(np.arange(m, dtype=np.int32), (flat.shape[0], m)).copy()
    rows = np.arange(flat.shape[0])
    for j in range(flat.shape[-1]):
        p = flat[:, j]
        a, b = perm[rows, j].copy(), perm[rows, p].copy()
        perm[rows, j], perm[rows, p] = b, a
    return perm.reshape((*pivots.shape[:-1], m))
