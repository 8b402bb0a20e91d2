"""cholesky, triangular-solve and the linear-algebra custom calls against XLA CPU and JAX on CPU.

JAX on CPU lowers linear algebra to LAPACK custom calls (``lapack_spotrf_ffi``, ...), so the ``cholesky``
and ``triangular-solve`` opcodes are checked on HLO text compiled by XLA CPU. Decompositions that are
unique (Cholesky, triangular solve, Householder QR, LU with partial pivoting) compare elementwise;
eigenvectors and singular vectors only up to sign, so those programs compare reconstructions.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from heavy_checks import check_hlo, reference_of_text
from jax_oracle import check_against_jax, hlo_of, jax_outputs

from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate

RNG = np.random.default_rng(5)  # reseeded for every test (conftest.py)


def _spd(batch: tuple[int, ...], n: int, dtype: object = np.float32) -> np.ndarray:
    a = RNG.standard_normal((*batch, n, n))
    if np.dtype(dtype).kind == "c":
        a = a + 1j * RNG.standard_normal((*batch, n, n))
    spd = a @ np.swapaxes(a, -1, -2).conj() + n * np.eye(n)
    return spd.astype(dtype)


def _tri(batch: tuple[int, ...], n: int, dtype: object = np.float32) -> np.ndarray:
    a = RNG.standard_normal((*batch, n, n)) * 0.3 + 2 * np.eye(n)
    if np.dtype(dtype).kind == "c":
        a = a + 0.3j * RNG.standard_normal((*batch, n, n))
    return a.astype(dtype)


def _name(dtype: object) -> str:
    return {np.float32: "f32", np.float64: "f64", np.complex64: "c64"}[dtype]  # type: ignore[index]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
@pytest.mark.parametrize("lower", [True, False])
def test_cholesky_opcode_against_xla(dtype: object, lower: bool) -> None:
    t = _name(dtype)
    text = f"""HloModule m
ENTRY e {{
  a = {t}[2,5,5] parameter(0)
  ROOT c = {t}[2,5,5] cholesky(a), lower={str(lower).lower()}
}}
"""
    check_hlo(text, _spd((2,), 5, dtype))


def test_cholesky_of_a_matrix_that_is_not_positive_definite_gives_nans() -> None:
    text = """HloModule m
ENTRY e {
  a = f32[3,3] parameter(0)
  ROOT c = f32[3,3] cholesky(a), lower=true
}
"""
    a = np.array([[4, 2, 0], [2, -5, 0], [0, 0, 1]], np.float32)
    got = reference_of_text(text, a)[0]
    assert got[0, 0] == 2 and np.isnan(got[1, 1])


@pytest.mark.parametrize(
    ("left", "lower", "trans", "unit"),
    list(itertools.product([True, False], [True, False], ["NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"], [False, True])),
)
def test_triangular_solve_opcode_against_xla(left: bool, lower: bool, trans: str, unit: bool) -> None:
    bshape = "2,4,3" if left else "2,3,4"
    text = f"""HloModule m
ENTRY e {{
  a = c64[2,4,4] parameter(0)
  b = c64[{bshape}] parameter(1)
  ROOT x = c64[{bshape}] triangular-solve(a, b), left_side={str(left).lower()}, lower={str(lower).lower()}, ATTRS
}}
""".replace("ATTRS", f"unit_diagonal={str(unit).lower()}, transpose_a={trans}")
    b = (RNG.standard_normal((2, 4, 3) if left else (2, 3, 4)) + 1j).astype(np.complex64)
    check_hlo(text, _tri((2,), 4, np.complex64), b)


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_jax_cholesky_uses_lapack_potrf(dtype: object) -> None:
    assert "potrf" in hlo_of(jnp.linalg.cholesky, _spd((), 4, dtype))
    check_against_jax(jnp.linalg.cholesky, _spd((3,), 6, dtype))


@pytest.mark.parametrize(("lower", "trans", "unit"), list(itertools.product([True, False], [0, 1, 2], [False, True])))
def test_jax_solve_triangular_uses_lapack_trsm(lower: bool, trans: int, unit: bool) -> None:
    def f(a: jax.Array, b: jax.Array) -> jax.Array:
        return jax.scipy.linalg.solve_triangular(a, b, lower=lower, trans=trans, unit_diagonal=unit)

    check_against_jax(f, _tri((), 5), RNG.standard_normal((5, 3)).astype(np.float32))


def test_jax_qr_lu_solve_inv_det() -> None:
    a = _tri((2,), 5) + RNG.standard_normal((2, 5, 5)).astype(np.float32)
    b = RNG.standard_normal((2, 5, 2)).astype(np.float32)
    check_against_jax(lambda x: jnp.linalg.qr(x), a)
    check_against_jax(lambda x: (jax.scipy.linalg.lu(x[0]), jax.lax.linalg.lu(x)), a)
    check_against_jax(lambda x, y: (jnp.linalg.solve(x, y), jnp.linalg.inv(x), jnp.linalg.det(x)), a, b)


def test_jax_complex_qr() -> None:
    check_against_jax(lambda x: jnp.linalg.qr(x), _tri((), 4, np.complex64) + 0.5j)


def _reconstruct_eigh(w: np.ndarray, v: np.ndarray) -> np.ndarray:
    return (v * w[..., None, :]) @ np.swapaxes(v, -1, -2).conj()


def test_jax_eigh_and_svd_up_to_vector_signs() -> None:
    a = _spd((2,), 5) / 5

    def f(x: jax.Array) -> tuple[jax.Array, ...]:
        w, v = jnp.linalg.eigh(x)
        u, s, vt = jnp.linalg.svd(x[..., :4])
        return w, v, u, s, vt

    got = evaluate(parse_module(hlo_of(f, a)), [a])
    want = jax_outputs(f, a)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)  # eigenvalues
    np.testing.assert_allclose(_reconstruct_eigh(got[0], got[1]), a, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.abs(got[1]), np.abs(want[1]), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(got[3], want[3], rtol=1e-5, atol=1e-5)  # singular values
    u, s, vt = got[2], got[3], got[4]
    np.testing.assert_allclose((u[..., :4] * s[..., None, :]) @ vt, a[..., :4], rtol=1e-4, atol=1e-4)


def test_tpu_lowered_linear_algebra_custom_calls() -> None:
    # The TPU lowering of qr/eigh/lu uses the Qr, ProductOfElementaryHouseholderReflectors, Eigh and
    # LuDecomposition custom calls; the reference must agree with JAX's CPU results of the same functions.
    a = _tri((), 5) + RNG.standard_normal((5, 5)).astype(np.float32)
    s = _spd((), 5) / 5

    def f(x: jax.Array, y: jax.Array) -> tuple[jax.Array, ...]:
        q, r = jnp.linalg.qr(x)
        lu, piv, perm = jax.lax.linalg.lu(x)
        w, _ = jnp.linalg.eigh(y)
        return q, r, lu, piv, perm, w

    text = jax.jit(f).trace(a, s).lower(lowering_platforms=("tpu",)).as_text("hlo")
    for target in ("Qr", "ProductOfElementaryHouseholderReflectors", "Eigh", "LuDecomposition"):
        assert f'custom_call_target="{target}"' in text
    got = evaluate(parse_module(text), [a, s])
    want = jax_outputs(f, a, s)
    for g, w in zip(got, want):
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)
        else:
            np.testing.assert_array_equal(g, w)


def test_xla_tpu_cholesky_and_inverted_diagonal_blocks() -> None:
    """XLA:TPU's compiled cho_solve calls its Cholesky kernel (JAX's ``cholesky``, lower=true, keeps no flag)
    and inverts the factor's diagonal blocks, stacked, as upper triangular matrices; both were refused
    ('has no reference function'). The module below has their shapes and layouts."""
    text = """
HloModule chol, is_scheduled=true
ENTRY main (m: f32[16,16], blocks: f32[2,16,16]) -> (f32[16,16], f32[2,16,16]) {
  m = f32[16,16]{1,0:T(8,128)} parameter(0)
  blocks = f32[2,16,16]{2,1,0:T(8,128)} parameter(1)
  l = f32[16,16]{1,0:T(8,128)S(1)} custom-call(m), custom_call_target="Cholesky"
  inv = f32[2,16,16]{1,2,0:T(8,128)S(1)} custom-call(blocks), custom_call_target="InvertDiagBlocksUpperTriangular"
  ROOT t = (f32[16,16]{1,0:T(8,128)}, f32[2,16,16]{1,2,0:T(8,128)}) tuple(l, inv)
}
"""
    m = _spd((), 16)
    blocks = np.triu(RNG.standard_normal((2, 16, 16))).astype(np.float32) + 4 * np.eye(16, dtype=np.float32)
    below = np.tril(RNG.standard_normal((2, 16, 16)), -1).astype(np.float32)  # not read
    factor, inv = evaluate(parse_module(text), [m, blocks + below])
    np.testing.assert_allclose(factor, np.linalg.cholesky(m.astype(np.float64)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(inv @ blocks, np.broadcast_to(np.eye(16), (2, 16, 16)), atol=1e-5)
    assert not np.triu(factor, 1).any() and not np.tril(inv, -1).any()


def test_xla_tpu_inverts_lower_triangular_diagonal_blocks() -> None:
    """XLA:TPU's compiled ``solve_triangular(lower=True)`` (a megacore fuzz campaign, v5p) inverts its
    diagonal blocks as lower triangular matrices: 'has no reference function' before."""
    text = """
HloModule tri, is_scheduled=true
ENTRY main (blocks: f32[3,8,8]) -> f32[3,8,8] {
  blocks = f32[3,8,8]{2,1,0:T(8,128)} parameter(0)
  ROOT inv = f32[3,8,8]{1,2,0:T(8,128)} custom-call(blocks), custom_call_target="InvertDiagBlocksLowerTriangular"
}
"""
    blocks = np.tril(RNG.standard_normal((3, 8, 8))).astype(np.float32) + 4 * np.eye(8, dtype=np.float32)
    above = np.triu(RNG.standard_normal((3, 8, 8)), 1).astype(np.float32)  # not read
    (inv,) = evaluate(parse_module(text), [blocks + above])
    np.testing.assert_allclose(inv @ blocks, np.broadcast_to(np.eye(8), (3, 8, 8)), atol=1e-5)
    assert not np.triu(inv, 1).any()


def test_xla_tpu_blocked_lu_and_qr_panels() -> None:
    """XLA:TPU's blocked ``solve`` and ``qr`` factor ``[m, b]`` panels with ``LuDecompositionBlock`` (the
    panel's ``b`` pivots and the permutation of its ``m`` rows) and ``QrDecompositionBlock`` (the panel's
    Householder form and taus, as ``Qr``): both were 'no reference function' (megacore fuzz campaign)."""
    text = """
HloModule panels, is_scheduled=true
ENTRY main (a: f32[12,8]) -> ((f32[12,8], s32[8], s32[12]), (f32[12,8], f32[8])) {
  a = f32[12,8]{1,0:T(8,128)} parameter(0)
  lu = (f32[12,8]{1,0:T(8,128)}, s32[8]{0:T(128)}, s32[12]{0:T(128)}) custom-call(a),
    custom_call_target="LuDecompositionBlock"
  qr = (f32[12,8]{1,0:T(8,128)}, f32[8]{0:T(128)}) custom-call(a), custom_call_target="QrDecompositionBlock"
  ROOT t = ((f32[12,8], s32[8], s32[12]), (f32[12,8], f32[8])) tuple(lu, qr)
}
"""
    a = RNG.standard_normal((12, 8)).astype(np.float32)
    lu, piv, perm, house, taus = evaluate(parse_module(text), [a])
    lower = np.tril(lu.astype(np.float64), -1)[:, :8] + np.eye(12, 8)
    upper = np.triu(lu.astype(np.float64)[:8])
    np.testing.assert_allclose(a[perm].astype(np.float64), lower @ upper, atol=1e-5)
    assert sorted(perm.tolist()) == list(range(12)) and piv.shape == (8,)
    r = np.triu(house.astype(np.float64)[:8])
    np.testing.assert_allclose(np.abs(r), np.abs(np.linalg.qr(a.astype(np.float64))[1]), atol=1e-5)
    assert taus.shape == (8,)


def test_xla_tpu_jacobi_eigh_blocks() -> None:
    """XLA:TPU's ``eigh`` (megacore fuzz campaign: 'no reference function') pads the matrix to an even size
    and passes it as four blocks to ``EighTpu``, which returns the eigenvalues in two halves and the
    transposed eigenvectors in four blocks; the zero padding keeps its position (eigenvalue 0, unit vector),
    which the module then drops."""
    text = """
HloModule eigh, is_scheduled=true
ENTRY main {
  tl = f32[5,5]{1,0:T(8,128)} parameter(0)
  tr = f32[5,5]{1,0:T(8,128)} parameter(1)
  bl = f32[5,5]{1,0:T(8,128)} parameter(2)
  br = f32[5,5]{1,0:T(8,128)} parameter(3)
  ROOT e = (f32[5], f32[5], f32[5,5], f32[5,5], f32[5,5], f32[5,5]) custom-call(tl, tr, bl, br),
    custom_call_target="EighTpu"
}
"""
    a = RNG.standard_normal((9, 9))
    full = np.zeros((10, 10), np.float32)
    full[:9, :9] = a + a.T
    w_top, w_bottom, *blocks = evaluate(parse_module(text), [full[:5, :5], full[:5, 5:], full[5:, :5], full[5:, 5:]])
    w = np.concatenate([w_top, w_bottom]).astype(np.float64)
    vt = np.block([[blocks[0], blocks[1]], [blocks[2], blocks[3]]]).astype(np.float64)
    np.testing.assert_allclose(full @ vt.T, vt.T * w, atol=1e-4)
    np.testing.assert_allclose(np.sort(w[:9]), np.linalg.eigvalsh(full[:9, :9].astype(np.float64)), atol=1e-4)
    assert w[9] == 0 and np.array_equal(vt[9], np.eye(10)[9])


def test_xla_tpu_compact_wy_helper_builds_the_reflectors_product() -> None:
    """A blocked QR of more than one panel (XLA:TPU's ``qr`` of 300x200) builds each panel's compact WY form
    with ``CompactWyHelper`` from ``M = (I + strict_upper(V^T V)) diag(-taus)``: ``I + V T V^T`` is then the
    product of the panel's reflectors ``H_i = I - tau_i v_i v_i^T`` (XLA's 300x200 QR from its compiled
    module equals JAX's to 2e-7 with it)."""
    text = """
HloModule wy, is_scheduled=true
ENTRY main {
  m = f32[6,6]{1,0:T(8,128)} parameter(0)
  ROOT t = f32[6,6]{1,0:T(8,128)} custom-call(m), custom_call_target="CompactWyHelper"
}
"""
    v = np.tril(RNG.standard_normal((10, 6)), -1) + np.eye(10, 6)  # unit lower trapezoidal reflectors
    taus = 2 / np.sum(v * v, axis=0)  # (each H_i then a true reflection)
    m = (np.eye(6) + np.triu(v.T @ v, 1)) * -taus[None, :]
    (t,) = evaluate(parse_module(text), [m.astype(np.float32)])
    product = np.eye(10)
    for i in range(6):
        product = product @ (np.eye(10) - taus[i] * np.outer(v[:, i], v[:, i]))
    np.testing.assert_allclose(np.eye(10) + v @ t.astype(np.float64) @ v.T, product, atol=1e-5)
