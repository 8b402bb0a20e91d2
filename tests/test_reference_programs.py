"""Realistic JAX programs run by the reference from their HLO text and compared with JAX on CPU.

Each program mixes the heavy ops with the ordinary ones the way models do: attention, a transformer
block in f32 and bf16, a small conv net and its gradient, top-k sampling, embedding gather/scatter,
dropout with jax.random, a spectral convolution, a Gaussian-process solve. Tolerances are the
``composite`` rows of the one table (sum order, fused f32 intermediates); the transformer block run unfused
takes the ``deep`` rows (a bf16 rounding per op along a 12-op chain).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_oracle import assert_close, check_against_jax, hlo_of, jax_outputs, tolerance_for

from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import EvaluationError, UnsupportedOpcodeError, evaluate
from tpusim.memory import element_type_of_dtype

RNG = np.random.default_rng(0)  # reseeded for every test (conftest.py)


def _r(*shape: int, dtype: object = np.float32, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1]).astype(q.dtype)
    mask = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))
    scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_causal_attention(dtype: object) -> None:
    q, k, v = (_r(2, 8, 2, 16, dtype=dtype) for _ in range(3))
    check_against_jax(attention, q, k, v, tol="composite")


def layer_norm(x: jax.Array, g: jax.Array, b: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    mu = x32.mean(-1, keepdims=True)
    var = ((x32 - mu) ** 2).mean(-1, keepdims=True)
    return ((x32 - mu) * jax.lax.rsqrt(var + 1e-5) * g + b).astype(x.dtype)


def transformer_block(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    b, t, d = x.shape
    h = layer_norm(x, p["g1"], p["b1"])
    qkv = (h @ p["wqkv"]).reshape(b, t, 3, 2, d // 2)
    x = x + attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]).reshape(b, t, d) @ p["wo"]
    h = layer_norm(x, p["g2"], p["b2"])
    return x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]


def _block_params(d: int, dtype: object) -> dict[str, np.ndarray]:
    return {
        "g1": np.ones(d, np.float32),
        "b1": np.zeros(d, np.float32),
        "g2": _r(d, scale=0.1) + 1,
        "b2": _r(d, scale=0.1),
        "wqkv": _r(d, 3 * d, dtype=dtype, scale=d**-0.5),
        "wo": _r(d, d, dtype=dtype, scale=d**-0.5),
        "w1": _r(d, 4 * d, dtype=dtype, scale=d**-0.5),
        "w2": _r(4 * d, d, dtype=dtype, scale=(4 * d) ** -0.5),
    }


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_transformer_block(dtype: object) -> None:
    check_against_jax(transformer_block, _r(2, 8, 16, dtype=dtype), _block_params(16, dtype), tol="deep")


def convnet(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    dn = ("NHWC", "HWIO", "NHWC")
    y = jax.lax.conv_general_dilated(x, params["c1"], (1, 1), "SAME", dimension_numbers=dn)
    y = jax.nn.relu(y + params["b1"])
    y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    y = jax.lax.conv_general_dilated(y, params["c2"], (2, 2), "SAME", dimension_numbers=dn, feature_group_count=2)
    y = jax.nn.relu(y)
    y = jax.lax.reduce_window(y, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "SAME") / 4
    return y.reshape(y.shape[0], -1) @ params["w"]


def _convnet_params() -> dict[str, np.ndarray]:
    return {
        "c1": _r(3, 3, 3, 8, scale=0.3),
        "b1": _r(8, scale=0.1),
        "c2": _r(3, 3, 4, 8, scale=0.3),
        "w": _r(32, 5, scale=0.2),
    }


def test_convnet_forward_and_gradient() -> None:
    params, x = _convnet_params(), _r(2, 8, 8, 3)
    labels = np.array([1, 4], np.int32)

    def loss(p: dict[str, jax.Array], images: jax.Array, y: jax.Array) -> jax.Array:
        logits = convnet(p, images)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

    check_against_jax(convnet, params, x, tol="composite")
    check_against_jax(jax.grad(loss), params, x, labels, tol="composite")


def test_top_k_sampling_and_sorting() -> None:
    def f(logits: jax.Array, key: jax.Array) -> tuple[jax.Array, ...]:
        vals, idx = jax.lax.top_k(logits, 4)
        choice = jax.random.categorical(jax.random.key(key), vals, axis=-1)
        order = jnp.argsort(-logits, axis=-1, stable=True)
        return jnp.take_along_axis(idx, choice[:, None], axis=1), order[:, :3], jnp.sort(logits, axis=0)

    check_against_jax(f, np.round(_r(3, 12), 1), np.int32(0), tol="composite")


def test_embedding_gather_and_its_scatter_add_gradient() -> None:
    table, ids = _r(10, 4), np.array([[1, 3, 3], [9, 0, 1]], np.int32)

    def loss(t: jax.Array, i: jax.Array) -> jax.Array:
        return jnp.sum(jnp.tanh(t[i]).sum(-1) ** 2)

    check_against_jax(lambda t, i: (loss(t, i), jax.grad(loss)(t, i)), table, ids, tol="composite")


def test_segment_ops_and_out_of_bounds_modes() -> None:
    data, seg = _r(12), np.array([0, 0, 1, 4, 4, 4, 2, 7, 9, -1, 3, 3], np.int32)

    def f(d: jax.Array, s: jax.Array) -> tuple[jax.Array, ...]:
        return (
            jax.ops.segment_sum(d, s, num_segments=8),
            jax.ops.segment_max(d, s, num_segments=8),
            jnp.zeros(8).at[s].add(d, mode="drop"),
            jnp.zeros(8).at[s].max(d, mode="clip"),
            jnp.arange(8.0).at[s].set(d, mode="drop"),
            jnp.arange(8.0).at[s].get(mode="fill", fill_value=-1.0),
        )

    check_against_jax(f, data, seg, tol="composite")


def test_dropout_with_jax_random() -> None:
    def f(x: jax.Array, seed: jax.Array) -> tuple[jax.Array, ...]:
        k1, k2 = jax.random.split(jax.random.key(seed))
        keep = jax.random.bernoulli(k1, 0.8, x.shape)
        noise = jax.random.normal(k2, x.shape) * 0.01 + jax.random.uniform(k2, x.shape)
        return jnp.where(keep, x / 0.8, 0.0) + noise, keep

    check_against_jax(f, _r(4, 6), np.int32(3), tol="composite")


def test_spectral_convolution_with_fft() -> None:
    def f(x: jax.Array, k: jax.Array) -> jax.Array:
        n = x.shape[-1]
        return jnp.fft.irfft(jnp.fft.rfft(x) * jnp.fft.rfft(k, n=n), n=n)

    check_against_jax(f, _r(3, 32), _r(5), tol="composite")


def test_gaussian_process_posterior_with_cholesky_and_triangular_solve() -> None:
    def f(xs: jax.Array, ys: jax.Array, xq: jax.Array) -> tuple[jax.Array, jax.Array]:
        def kern(a: jax.Array, b: jax.Array) -> jax.Array:
            return jnp.exp(-0.5 * (a[:, None] - b[None, :]) ** 2)

        chol = jnp.linalg.cholesky(kern(xs, xs) + 0.1 * jnp.eye(xs.shape[0]))
        alpha = jax.scipy.linalg.cho_solve((chol, True), ys)
        v = jax.scipy.linalg.solve_triangular(chol, kern(xs, xq), lower=True)
        return kern(xq, xs) @ alpha, jnp.diag(kern(xq, xq) - v.T @ v)

    check_against_jax(
        f, np.linspace(-3, 3, 9, dtype=np.float32), _r(9), np.linspace(-2, 2, 5, dtype=np.float32), tol="composite"
    )


def test_sharding_and_memory_placement_annotations_pass_values_through() -> None:
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))

    def f(x: jax.Array) -> jax.Array:
        y = jax.lax.with_sharding_constraint(jnp.sin(x), NamedSharding(mesh, P("x")))
        return y @ y.T

    x = _r(4, 6)
    text = hlo_of(f, x)
    assert 'custom_call_target="Sharding"' in text
    check_against_jax(f, x, tol="composite")
    pinned = NamedSharding(mesh, P(), memory_kind="pinned_host")
    text = jax.jit(lambda a: jax.device_put(a * 2, pinned)).trace(x).lower(lowering_platforms=("tpu",)).as_text("hlo")
    assert 'custom_call_target="annotate_device_placement"' in text
    np.testing.assert_array_equal(evaluate(parse_module(text), [x])[0], x * 2)


def test_unknown_custom_call_target_is_named_with_the_known_ones() -> None:
    text = """HloModule m
ENTRY e {
  x = f32[4] parameter(0)
  ROOT y = f32[4] custom-call(x), custom_call_target="my_fused_kernel"
}
"""
    message = r"^%y \(custom-call.*\): custom-call target 'my_fused_kernel' has no .*; supported targets: .*Sharding"
    with pytest.raises(UnsupportedOpcodeError, match=message):
        evaluate(parse_module(text), [np.zeros(4, np.float32)])


def test_shard_map_before_partitioning_explains_what_to_run() -> None:
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    f = jax.shard_map(lambda a: a * 2, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    x = _r(4, 3)
    module = parse_module(hlo_of(f, x))
    with pytest.raises(EvaluationError, match=r"shard_map boundary .* evaluate_spmd"):
        evaluate(module, [x])


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_xla_cpu_optimized_modules(dtype: object) -> None:
    # What users dump after XLA's passes: fusions, custom fusions around dots, layouts, bitcasts.
    check_against_jax(
        transformer_block, _r(2, 8, 16, dtype=dtype), _block_params(16, dtype), tol="composite", optimized=True
    )
    check_against_jax(convnet, _convnet_params(), _r(2, 8, 8, 3), tol="composite", optimized=True)


def _check_tpu_lowering(fn: object, *args: object) -> None:
    """Run JAX's TPU lowering of ``fn`` on the reference; compare with JAX's CPU results (same math)."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",)).as_text("hlo")
    module = parse_module(text)
    got = evaluate(module, [np.asarray(a) for a in jax.tree_util.tree_leaves(args)])
    want = jax_outputs(fn, *args)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(g, w, tolerance_for("composite", element_type_of_dtype(w.dtype).name), f"output {i}")


def test_tpu_lowered_programs() -> None:
    x = _r(4, 6)
    _check_tpu_lowering(transformer_block, _r(2, 8, 16), _block_params(16, np.float32))
    _check_tpu_lowering(jax.grad(lambda p, im: convnet(p, im).sum()), _convnet_params(), _r(2, 8, 8, 3))
    _check_tpu_lowering(lambda a: (jnp.sort(a), jax.lax.top_k(a, 2), jnp.argsort(a, axis=0)), x)
    spd = x @ x.T + 4 * np.eye(4, dtype=np.float32)
    _check_tpu_lowering(lambda a, b: jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(a), True), b), spd, x)
