"""Helpers of the heavy-op reference tests (dot, conv, reduce, gather/scatter, sort, linalg, fft, rng, ...).

* The tolerance rows of these ops, added to the one table :data:`jax_oracle.TOLERANCES` (``setdefault``:
  a row already in the table wins). Each row states the measurement behind it (max error seen against
  JAX 0.10.2 on CPU, then a margin).
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


# Figures: max |reference - JAX| on N(0,1) inputs, JAX 0.10.2 CPU (script in the heavy-ops report). ulp counts
# explode where a sum cancels to ~0, so each row pairs a few ulp with an absolute floor for unit-scale data.
#
# Matmul-like sums: the reference multiplies in f32 with numpy's BLAS, XLA CPU with its own kernels; both
# round every partial sum, in different orders. Measured max abs error: dot 9.5e-7 (K=8), 5.7e-6 (K=64),
# 5.7e-5 (K=512); conv 3.1e-5 (3x3x16 taps), 7.7e-5 (5x5x64). The rows cover contractions up to ~1000 terms
# of unit data; longer ones must pass their own tolerance.
_rows(("dot", "convolution"), _F32, Tolerance(ulps=8, atol=1e-4, rtol=1e-5, why="f32 sums in another order"))
_rows(("dot", "convolution"), ("f64", "c128"), Tolerance(ulps=8, atol=1e-13, rtol=1e-13, why="f64 sum order"))
# Narrow results: both accumulate in f32 and round once (measured: bf16 dots K<=4096 and convs bit-identical);
# a last-bit difference of the f32 sum may still move the rounding by one ulp.
_rows(("dot", "convolution"), _NARROW, Tolerance(ulps=1, why="one rounding of an f32 sum computed in another order"))
# Reductions: XLA leaves the order open; the reference sums pairwise (numpy), XLA CPU in vectorised partial
# sums. Measured max abs error of f32 sums: 4.8e-7 (n=10), 2.4e-6 (100), 9.1e-6 (1000), 3.1e-5 (10000).
_rows(("reduce", "reduce-window"), _F32, Tolerance(ulps=16, atol=4e-5, rtol=1e-5, why="f32 sum order"))
_rows(("reduce", "reduce-window"), ("f64", "c128"), Tolerance(ulps=16, atol=1e-13, rtol=1e-12, why="f64 sum order"))
# Narrow types: the reference accumulates in f32 and rounds once (TPU-like, see combiners.py); XLA CPU rounds
# every partial sum to bf16/f16 (in a tree). Measured on n=10 sums: 1 bf16 ulp (6.3e-2 at 8), 9.8e-4 abs in
# f16 where the sum cancels; it grows with n (bf16 n=100: 0.2, n=10000: 2.0), so the rows hold for short
# reductions (n <= ~16, windows) of unit data only.
_rows(("reduce", "reduce-window"), ("bf16",), Tolerance(ulps=2, atol=3e-2, why="XLA CPU rounds partial sums to bf16"))
_rows(("reduce", "reduce-window"), ("f16",), Tolerance(ulps=2, atol=4e-3, why="XLA CPU rounds partial sums to f16"))
# FFT: the reference transforms in f64 and rounds once; XLA CPU works in f32. Measured max abs error on unit
# data: 4.8e-7 (n=8), 2.4e-6 (n=64), 1.5e-5 (n=1024).
_rows(("fft",), _F32, Tolerance(ulps=8, atol=2e-5, rtol=1e-5, why="f32 FFT butterflies against an f64 FFT"))
_rows(("fft",), ("f64", "c128"), Tolerance(ulps=8, atol=1e-12, rtol=1e-12, why="FFT rounding"))
# Dense linear algebra: the reference factorises in f64 and rounds once; LAPACK (CPU) in f32. Measured max abs
# error (n=4/16/64, cond < 100): cholesky 1.2e-7/4.8e-7/9.5e-7, trsm 1.2e-7/2.4e-7/6.0e-7, QR 1.2e-7/7.8e-7/
# 2.0e-6, LU 3.2e-8/1.4e-6/1.5e-5.
_rows(
    ("cholesky", "triangular-solve", "custom-call"),
    _F32,
    Tolerance(ulps=64, atol=5e-5, rtol=5e-5, why="f32 LAPACK against an f64 factorisation, n <= 64, cond < 100"),
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
