"""Helpers of the heavy-op reference tests (dot, conv, reduce, gather/scatter, sort, linalg, fft, rng, ...).

* The tolerance rows of these ops, added to the one table :data:`jax_oracle.TOLERANCES` (``setdefault``:
  a row already in the table wins). Each row states the measurement behind it; the figures come from
  ``tests/test_reference_*.py`` runs against JAX 0.10.2 on CPU (max error seen, then a margin).
* :func:`check_hlo`: run HLO text on the reference and on XLA CPU and compare, for modules JAX's API
  cannot express (a batch_group_count convolution, a non-commutative scatter, an odd comparator).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax_oracle import TOLERANCES, Tolerance, assert_close, module_tolerance, run_hlo_on_xla

from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate
from tpusim.memory import element_type_of_dtype

__all__ = ["check_hlo", "reference_of_text"]

_F32 = ("f32", "c64")
_NARROW = ("bf16", "f16")
_ROWS: dict[tuple[str, str], Tolerance] = {}


def _rows(ops: tuple[str, ...], dtypes: tuple[str, ...], tol: Tolerance) -> None:
    for op in ops:
        for dt in dtypes:
            _ROWS[(op, dt)] = tol


# Matmul-like sums: the reference multiplies in f32 with numpy's BLAS (its own blocking and FMA use),
# XLA CPU with Eigen; both round every partial sum, in different orders. Measured: at most a few ulp of
# the result, more where the sum cancels, so an absolute floor scaled to inputs of magnitude ~1.
_rows(("dot", "convolution"), _F32, Tolerance(ulps=8, atol=2e-5, rtol=1e-5, why="f32 sums in another order"))
_rows(("dot", "convolution"), ("f64", "c128"), Tolerance(ulps=8, atol=1e-13, rtol=1e-13, why="f64 sum order"))
# Narrow results: both accumulate in f32 and round once; a last-bit difference of the f32 sum can move the
# rounding by one ulp of the narrow type.
_rows(("dot", "convolution"), _NARROW, Tolerance(ulps=1, why="one rounding of an f32 sum computed in another order"))
# Reductions: XLA leaves the order open; the reference sums pairwise (numpy), XLA CPU in vectorised
# partial sums. Measured max 3 ulp on 1000-element f32 sums of normal data; an absolute floor for cancellation.
_rows(("reduce", "reduce-window"), _F32, Tolerance(ulps=16, atol=1e-5, rtol=1e-5, why="f32 sum order"))
_rows(("reduce", "reduce-window"), ("f64", "c128"), Tolerance(ulps=16, atol=1e-13, rtol=1e-12, why="f64 sum order"))
# Narrow types: the reference accumulates in f32 and rounds once (TPU-like, see combiners.py); XLA CPU rounds
# every partial sum to bf16/f16 (in a tree). Measured on sums of <= 10 N(0,1) terms: up to 5 bf16 ulp at
# 0.17, 16 f16 ulp where the sum cancels to 0.024; bounded by a few ulp of the inputs' magnitude (~1).
_rows(("reduce", "reduce-window"), ("bf16",), Tolerance(ulps=2, atol=3e-2, why="XLA CPU rounds partial sums to bf16"))
_rows(("reduce", "reduce-window"), ("f16",), Tolerance(ulps=2, atol=4e-3, why="XLA CPU rounds partial sums to f16"))
# FFT: the reference transforms in f64 and rounds once; XLA CPU (DUCC) works in f32 (measured <= 4 ulp on
# length-8..64 transforms, relative to the largest coefficient).
_rows(("fft",), _F32, Tolerance(ulps=8, atol=2e-5, rtol=1e-5, why="f32 FFT butterflies against an f64 FFT"))
_rows(("fft",), ("f64", "c128"), Tolerance(ulps=8, atol=1e-12, rtol=1e-12, why="FFT rounding"))
# Dense linear algebra: the reference factorises in f64 and rounds once; LAPACK (CPU) in f32. Errors scale
# with the condition number; the test matrices are well conditioned (cond < 100).
_rows(
    ("cholesky", "triangular-solve", "custom-call"),
    _F32,
    Tolerance(ulps=64, atol=5e-5, rtol=5e-5, why="f32 LAPACK against an f64 factorisation, cond < 100"),
)
_rows(
    ("cholesky", "triangular-solve", "custom-call"),
    ("f64", "c128"),
    Tolerance(ulps=64, atol=1e-12, rtol=1e-12, why="f64 LAPACK against the reference's f64 factorisation"),
)
_rows(
    ("batch-norm-training", "batch-norm-inference", "batch-norm-grad"),
    _F32,
    Tolerance(ulps=16, atol=1e-5, rtol=1e-5, why="mean/variance sums in another order"),
)
_rows(
    ("batch-norm-training", "batch-norm-inference", "batch-norm-grad"),
    _NARROW,
    Tolerance(ulps=1, why="f32 statistics rounded once"),
)
for _key, _tol in _ROWS.items():
    TOLERANCES.setdefault(_key, _tol)


def reference_of_text(text: str, *args: Any) -> list[np.ndarray]:
    """Parse HLO ``text`` and run it on the reference."""
    return evaluate(parse_module(text), [np.asarray(a) for a in args])


def check_hlo(text: str, *args: Any, tol: Tolerance | None = None) -> list[np.ndarray]:
    """Run HLO ``text`` on the reference and on XLA CPU; compare every output (module tolerance by default).

    Returns:
        The reference outputs.
    """
    module = parse_module(text)
    got = evaluate(module, [np.asarray(a) for a in args])
    want = run_hlo_on_xla(text, *args)
    assert len(got) == len(want), f"reference gives {len(got)} outputs, XLA {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        t = tol if tol is not None else module_tolerance(module, element_type_of_dtype(w.dtype).name)
        assert_close(g, w, t, f"output {i}")
    return got
