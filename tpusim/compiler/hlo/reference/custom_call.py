"""The custom-call targets JAX emits, registered in :data:`.control.CUSTOM_CALLS`.

Found by lowering JAX 0.10 programs for CPU and TPU (``jax.jit(f).trace(...).lower(lowering_platforms=...)``):

* annotations that pass their operand through: ``Sharding`` (with_sharding_constraint, device_put),
  ``annotate_device_placement`` (memory kinds, host offloading), ``MoveToHost``/``MoveToDevice``,
  ``LayoutConstraint``, ``xla.sdy.FuncResultSharding``, and the shard_map boundaries
  ``SPMDFullToShardShape``/``SPMDShardToFullShape``/``xla.sdy.GlobalToLocalShape``/``xla.sdy.LocalToGlobalShape``
  when the local and global shapes agree (one device). A shard_map whose shapes differ only runs as its
  SPMD-partitioned per-device module: the error says so.
* CPU linear algebra (LAPACK through XLA's typed FFI), every leading dimension a batch dimension:
  ``lapack_?potrf_ffi`` (Cholesky + info), ``lapack_?trsm_ffi`` (triangular solve), ``lapack_?getrf_ffi``
  (LU, 1-based pivots, info), ``lapack_?geqrf_ffi`` and ``lapack_?orgqr_ffi``/``?ungqr_ffi`` (Householder
  QR), ``lapack_?syevd_ffi``/``?heevd_ffi`` (symmetric eigen) and ``lapack_?gesdd_ffi`` (SVD).
  ``backend_config`` carries LAPACK's character flags as bytes (``uplo = 76 : ui8`` is 'L').
* TPU linear algebra: ``Qr``, ``ProductOfElementaryHouseholderReflectors``, ``Eigh``, ``LuDecomposition``, and
  ``Cholesky`` of XLA:TPU's compiled modules (HLO ``cholesky`` with ``lower=true``, as JAX lowers it),
  ``InvertDiagBlocksUpperTriangular`` / ``...LowerTriangular`` (a triangular solve's diagonal blocks, stacked,
  each inverted), the panels of its blocked LU and QR (``LuDecompositionBlock``, ``QrDecompositionBlock``,
  ``CompactWyHelper``) and its Jacobi ``EighTpu``.
* Targets of XLA:TPU's compiled modules (``jax.jit(f).lower(...).compile().as_text()`` with libtpu):
  ``ConcatBitcast`` (operands placed one after another along the result's only grown dimension: a
  concatenate XLA makes free by placing them adjacently), ``AllocateBuffer`` (an uninitialised buffer a later
  instruction fills: zeros here), the index annotations ``AssumeGatherIndicesInBound`` and
  ``GatherScatterIndicesBitpacked`` (values pass through: the gather that reads them sees the same indices),
  ``AsyncCollectiveStart`` / ``AsyncCollectiveDone`` of XLA:TPU's async collective fusions
  (:mod:`tpusim.compiler.hlo.xla_forms`), and ``TopK`` (``jax.lax.top_k`` of a long row: the operand's rows
  sorted by the called comparator, which orders ``(value, index)`` pairs, and the first ``k`` values and
  their s32 indices kept, ``k`` from the result's shape), and ``X64SplitLow`` / ``X64SplitHigh`` /
  ``X64Combine`` (XLA:TPU keeps a 64-bit element as two 32-bit words: a c64's real and imaginary parts, a
  64-bit integer's low and high words; split takes one, combine joins them), and ``PrepareAsyncCallStart`` /
  ``PrepareAsyncCallDone`` (a handle and a token ordering a ``call-start`` on another execution thread,
  v6e's SparseCore for small scatters: no values, zeros and a token here).

Eigenvectors and singular vectors are unique only up to a sign (a phase for complex) per vector, so they
match XLA up to that choice; everything else follows LAPACK's conventions. Unknown targets raise
:class:`UnsupportedOpcodeError` listing the known ones (the dispatcher in ``control.py``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.hlo.reference.combiners import computation
from tpusim.compiler.hlo.reference.control import register_custom_call, zeros_of
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value
from tpusim.compiler.hlo.reference.linalg import (
    cholesky,
    cholesky_lower,
    householder_product,
    householder_qr,
    lu_partial_pivoting,
    pivots_to_permutation,
    triangular_solve,
    wide,
)
from tpusim.compiler.hlo.reference.sort import sort_arrays
from tpusim.compiler.hlo.xla_forms import (
    ASYNC_COLLECTIVE_DONE,
    ASYNC_COLLECTIVE_START,
    PREPARE_ASYNC_CALL,
    async_collective_result,
    concat_bitcast_order,
)
from tpusim.memory import PackError, TupleShape, pack, unpack

__all__ = ["backend_flags"]


def backend_flags(instr: Instruction) -> dict[str, int]:
    """``backend_config={uplo = 76 : ui8, ...}`` as ``{"uplo": 76, ...}`` (integers only; {} when absent)."""
    text = str(instr.attr("backend_config", "") or "")
    return {k: int(v) for k, v in re.findall(r"(\w+)\s*=\s*(-?\d+)\s*:\s*\w+", text)}


def _flag(instr: Instruction, key: str, default: str) -> str:
    return chr(backend_flags(instr).get(key, ord(default)))


def _arrays(instr: Instruction, args: Sequence[Value], n: int) -> list[np.ndarray]:
    if len(args) != n or not all(isinstance(a, np.ndarray) for a in args):
        raise EvaluationError(instr, f"custom-call {instr.attr('custom_call_target')} takes {n} array operands")
    return list(args)  # type: ignore[arg-type]


def _result_dtypes(instr: Instruction) -> list[np.dtype]:
    shapes = instr.shape.leaves() if isinstance(instr.shape, TupleShape) else [instr.shape]
    return [np.dtype(s.element_type.dtype) for s in shapes]


def _lapack(*names: str) -> tuple[str, ...]:
    """``lapack_{s,d,c,z}<name>_ffi`` for each name (``?`` in the name replaced by the type letter)."""
    return tuple(f"lapack_{p}{n}_ffi" for n in names for p in "sdcz")


# ---------------------------------------------------------------------------------------------
# Pass-through annotations
# ---------------------------------------------------------------------------------------------
@register_custom_call(
    "Sharding",
    "annotate_device_placement",
    "MoveToHost",
    "MoveToDevice",
    "LayoutConstraint",
    "xla.sdy.FuncResultSharding",
    "SPMDFullToShardShape",
    "SPMDShardToFullShape",
    "xla.sdy.GlobalToLocalShape",
    "xla.sdy.LocalToGlobalShape",
    "AssumeGatherIndicesInBound",
    "GatherScatterIndicesBitpacked",
)
def _identity(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    if len(args) == 1 and not isinstance(instr.shape, TupleShape):
        (x,) = args
        if isinstance(x, np.ndarray) and x.shape == instr.shape.dimensions:
            return x
        target = instr.attr("custom_call_target")
        raise EvaluationError(
            instr,
            f"custom-call {target} changes the shape {list(getattr(x, 'shape', ()))} -> {instr.shape}: this is a "
            "shard_map boundary of a module before SPMD partitioning; run the partitioned per-device module "
            "(jax.jit(f).lower(...).compile().as_text()) with evaluate_spmd instead",
        )
    values = tuple(args)
    return values if isinstance(instr.shape, TupleShape) else values[0]


@register_custom_call("ConcatBitcast")
def _concat_bitcast(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    arrays = _arrays(instr, args, len(args))
    assert ctx.computation is not None
    try:
        dimension, order = concat_bitcast_order(ctx.computation, instr)
    except ValueError as err:
        raise EvaluationError(instr, str(err)) from None
    if dimension is not None:
        return np.concatenate([arrays[i] for i in order], axis=dimension)
    # a concatenation of bytes: each operand's stored bytes in turn, read under the result's layout
    shapes = [ctx.operand_shape(instr, i) for i in range(len(args))]
    stored = [pack(arrays[i], shapes[i]) for i in order]  # type: ignore[arg-type]
    try:
        return unpack(np.concatenate(stored), instr.array_shape)
    except PackError as err:
        raise EvaluationError(instr, str(err)) from None


@register_custom_call(ASYNC_COLLECTIVE_START)
def _async_collective_start(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    """The collective's result in its element of the tuple; the other elements (the operands, which only the
    continuations' copies of the collective read, and the synchronisation state) zeros."""
    assert ctx.computation is not None
    try:
        at = async_collective_result(ctx.computation, instr)
    except ValueError as err:
        raise EvaluationError(instr, str(err)) from None
    (result,) = args
    parts = list(zeros_of(instr.shape))  # type: ignore[arg-type]
    parts[at] = result
    return tuple(parts)


@register_custom_call(ASYNC_COLLECTIVE_DONE)
def _async_collective_done(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    """The result the start put in the tuple, passed on by the continuations."""
    assert ctx.computation is not None
    try:
        return args[async_collective_result(ctx.computation, instr)]
    except ValueError as err:
        raise EvaluationError(instr, str(err)) from None


@register_custom_call("TopK")
def _top_k(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    (x,) = _arrays(instr, args, 1)
    shape = instr.shape
    called = instr.called_computations()
    leaves = shape.leaves() if isinstance(shape, TupleShape) else []
    if len(leaves) != 2 or len(called) != 1 or x.ndim == 0 or leaves[0].rank != x.ndim:
        raise EvaluationError(instr, "TopK takes one array and one comparator and returns (values, indices)")
    k = leaves[0].dimensions[-1]
    if k > x.shape[-1]:
        raise EvaluationError(instr, f"k={k} is more than the {x.shape[-1]} elements of a row")
    index = np.broadcast_to(np.arange(x.shape[-1], dtype=np.int32), x.shape)
    values, indices = sort_arrays(ctx, computation(ctx, instr, called[0]), [x, index], x.ndim - 1)
    return values[..., :k].copy(), indices[..., :k].copy()


@register_custom_call("X64SplitLow", "X64SplitHigh")
def _x64_split(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    (x,) = _arrays(instr, args, 1)
    (dtype,) = _result_dtypes(instr)
    if x.dtype.kind not in "ciu" or x.dtype.itemsize != 8 or dtype.itemsize != 4:
        raise EvaluationError(instr, f"splits a c64 or 64-bit integer into 32-bit words, not {x.dtype} into {dtype}")
    words = np.ascontiguousarray(x).view(np.uint32).reshape(*x.shape, 2)  # (little-endian: the low word first)
    high = instr.attr("custom_call_target") == "X64SplitHigh"
    return np.ascontiguousarray(words[..., 1 if high else 0]).view(dtype)


@register_custom_call("X64Combine")
def _x64_combine(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    low, high = _arrays(instr, args, 2)
    (dtype,) = _result_dtypes(instr)
    if low.shape != high.shape or low.dtype.itemsize != 4 or high.dtype.itemsize != 4 or dtype.itemsize != 8:
        raise EvaluationError(
            instr, f"joins two 32-bit words of one shape into a 64-bit type, not {low.dtype}, {high.dtype}"
        )
    words = np.stack([np.ascontiguousarray(low).view(np.uint32), np.ascontiguousarray(high).view(np.uint32)], -1)
    return words.view(dtype).reshape(low.shape)


@register_custom_call(*PREPARE_ASYNC_CALL)
def _prepare_async_call(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    return zeros_of(instr.shape)


@register_custom_call("AllocateBuffer")
def _allocate_buffer(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    return zeros_of(instr.shape)


# ---------------------------------------------------------------------------------------------
# LAPACK (CPU)
# ---------------------------------------------------------------------------------------------
@register_custom_call(*_lapack("potrf"))
def _potrf(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    (a,) = _arrays(instr, args, 1)
    w = wide(a)
    if _flag(instr, "uplo", "L") == "L":
        fac, info = cholesky_lower(w)
        keep = np.triu(np.ones(a.shape[-2:], bool), 1)
    else:
        fac, info = cholesky_lower(np.swapaxes(w, -1, -2).conj())
        fac = np.swapaxes(fac, -1, -2).conj()
        keep = np.tril(np.ones(a.shape[-2:], bool), -1)
    # potrf leaves the other triangle of the input untouched.
    return np.where(keep, w, fac).astype(a.dtype), info.astype(np.int32)


@register_custom_call(*_lapack("trsm"))
def _trsm(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    if len(args) == 3:  # (a, b, alpha) in some JAX versions
        a, b, alpha = _arrays(instr, args, 3)
        b = (b * alpha).astype(b.dtype)
    else:
        a, b = _arrays(instr, args, 2)
    trans = {"N": "NO_TRANSPOSE", "T": "TRANSPOSE", "C": "ADJOINT"}[_flag(instr, "trans_x", "N")]
    return triangular_solve(
        a,
        b,
        left_side=_flag(instr, "side", "L") == "L",
        lower=_flag(instr, "uplo", "L") == "L",
        unit_diagonal=_flag(instr, "diag", "N") == "U",
        transpose_a=trans,
    )


@register_custom_call(*_lapack("getrf"))
def _getrf(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    (a,) = _arrays(instr, args, 1)
    lu, piv, info = lu_partial_pivoting(a)
    return lu, (piv + 1).astype(np.int32), info.astype(np.int32)


@register_custom_call(*_lapack("geqrf"))
def _geqrf(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    (a,) = _arrays(instr, args, 1)
    return householder_qr(a)


@register_custom_call(*_lapack("orgqr", "ungqr"), "ProductOfElementaryHouseholderReflectors")
def _orgqr(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    a, tau = _arrays(instr, args, 2)
    return householder_product(a, tau)


def _eigh(a: np.ndarray, lower: bool, vectors: bool, real: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    w = wide(a)
    vals, vecs = np.linalg.eigh(w, UPLO="L" if lower else "U")
    return (vecs.astype(a.dtype) if vectors else a.copy()), vals.astype(real)


@register_custom_call(*_lapack("syevd", "heevd"))
def _syevd(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    (a,) = _arrays(instr, args, 1)
    dtypes = _result_dtypes(instr)
    v, w = _eigh(a, _flag(instr, "uplo", "L") == "L", _flag(instr, "mode", "V") == "V", dtypes[1])
    return v, w, np.zeros(a.shape[:-2], np.int32)


@register_custom_call(*_lapack("gesdd"))
def _gesdd(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    (a,) = _arrays(instr, args, 1)
    shapes = instr.shape.leaves() if isinstance(instr.shape, TupleShape) else []
    if len(shapes) != 5:
        raise EvaluationError(instr, "gesdd returns (a, s, u, vt, info)")
    mode = _flag(instr, "mode", "A")
    w = wide(a)
    real = shapes[1].element_type.dtype
    info = np.zeros(a.shape[:-2], np.int32)
    if mode == "N":
        s = np.linalg.svd(w, compute_uv=False)
        u = np.zeros(shapes[2].dimensions, a.dtype)
        vt = np.zeros(shapes[3].dimensions, a.dtype)
    else:
        u64, s, vt64 = np.linalg.svd(w, full_matrices=mode == "A")
        u, vt = u64.astype(a.dtype), vt64.astype(a.dtype)
    return a.copy(), s.astype(real), u, vt, info


# ---------------------------------------------------------------------------------------------
# TPU linear algebra
# ---------------------------------------------------------------------------------------------
@register_custom_call("Qr", "QrDecompositionBlock")  # (XLA:TPU's blocked QR: a panel's Householder form)
def _qr(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    (a,) = _arrays(instr, args, 1)
    return householder_qr(a)


@register_custom_call("Cholesky")
def _tpu_cholesky(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    """XLA:TPU's kernel for HLO ``cholesky``: JAX lowers it with ``lower=true`` and XLA's custom-call keeps no
    flag, so the lower factor (the other triangle, implementation-defined in XLA, is zero; JAX masks it)."""
    (a,) = _arrays(instr, args, 1)
    return cholesky(a, lower=True)


@register_custom_call("InvertDiagBlocksUpperTriangular", "InvertDiagBlocksLowerTriangular")
def _invert_diagonal_blocks(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    """XLA:TPU's step of a triangular solve by inverted diagonal blocks (XLA's TriangularSolveExpander): the
    blocks come stacked along the leading dimension, each inverted as an upper (lower) triangular matrix (the
    entries of the other triangle are not read)."""
    (a,) = _arrays(instr, args, 1)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise EvaluationError(instr, f"inverts square blocks, not {list(a.shape)}")
    lower = instr.attr("custom_call_target") == "InvertDiagBlocksLowerTriangular"
    part = np.tril(a) if lower else np.triu(a)
    eye = np.broadcast_to(np.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return triangular_solve(
        part, eye, left_side=True, lower=lower, unit_diagonal=False, transpose_a="NO_TRANSPOSE"
    ).astype(a.dtype)


@register_custom_call("Eigh")
def _tpu_eigh(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    """backend_config ``"lower,sort_eigenvalues,max_iter,tol"``; eigenvalues ascending either way."""
    (a,) = _arrays(instr, args, 1)
    config = str(instr.attr("backend_config", "") or "").strip('"').split(",")
    lower = config[0].strip() != "0" if config and config[0].strip() else True
    v, w = _eigh(a, lower, True, _result_dtypes(instr)[1])
    return v, w


@register_custom_call("CompactWyHelper")
def _compact_wy(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    """XLA:TPU's step of a blocked QR's compact WY form (XLA's QrExpander): its operand is ``M = (I +
    strict_upper(V^T V)) diag(-taus)``, and it returns ``T`` built a column at a time from the identity,
    ``T[:, i] = T @ M[:, i]`` (the loop XLA writes for other backends), so that the panel's reflectors
    are ``I + V T V^T``."""
    (m,) = _arrays(instr, args, 1)
    w = wide(m)
    if w.ndim < 2 or w.shape[-1] != w.shape[-2]:
        raise EvaluationError(instr, f"takes a square matrix, not {list(w.shape)}")
    t = np.broadcast_to(np.eye(w.shape[-1], dtype=w.dtype), w.shape).copy()
    for i in range(w.shape[-1]):
        t[..., :, i] = np.einsum("...ij,...j->...i", t, w[..., :, i])
    return t.astype(m.dtype)


@register_custom_call("EighTpu")
def _tpu_block_eigh(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    """XLA:TPU's Jacobi kernel of ``eigh``: the symmetric matrix as four ``[n, n]`` blocks ``(tl, tr, bl, br)``
    (padded with zero rows and columns to an even size), returning the eigenvalues in two halves and the
    transposed eigenvector matrix (eigenvector ``k`` is row ``k``, as XLA's module reads it: checked against
    JAX's ``eigh`` through XLA:TPU's compiled module) in four blocks. A Jacobi sweep never rotates a zero row and
    column, so such a row keeps its position with eigenvalue 0 and its unit vector (XLA's module then drops
    the padding's position); the other eigenpairs take the other positions, ascending (the module sorts
    them)."""
    tl, tr, bl, br = (wide(x) for x in _arrays(instr, args, 4))
    n = tl.shape[-1]
    full = np.block([[tl, tr], [bl, br]])
    live = np.flatnonzero(np.any(full != 0, axis=-1) | np.any(full != 0, axis=-2))
    w = np.zeros(2 * n)
    v = np.eye(2 * n)
    if live.size:
        vals, vecs = np.linalg.eigh(full[np.ix_(live, live)])
        w[live] = vals
        v[np.ix_(live, live)] = vecs
    dtype = np.asarray(args[0]).dtype
    v = v.T
    blocks = (v[:n, :n], v[:n, n:], v[n:, :n], v[n:, n:])
    return (w[:n].astype(dtype), w[n:].astype(dtype), *(b.astype(dtype) for b in blocks))


@register_custom_call("LuDecomposition", "LuDecompositionBlock")
def _tpu_lu(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    """``(lu, pivots, permutation)`` with 0-based pivots. XLA:TPU's blocked LU (of ``solve``) calls
    ``LuDecompositionBlock`` on each ``[m, b]`` panel: its ``b`` pivots and the permutation of its ``m`` rows."""
    (a,) = _arrays(instr, args, 1)
    lu, piv, _ = lu_partial_pivoting(a)
    return lu, piv.astype(np.int32), pivots_to_permutation(piv, a.shape[-2])
