"""The end-to-end suite: JAX programs (and hand-written HLO for what JAX cannot emit) compiled for a chip, run
on the device model on real bytes, every output compared with the reference interpreter.

Integers, predicates and data movement must match bit for bit; float outputs within ``tpusim.check``'s
bound for their element type and the MXU precision the program used (see ``e2e_support`` for how f32
matmul programs are checked). The table below is one row per program, like JAX's ``OpRecord`` lists:

* ``jax`` rows are lowered for TPU (``jax.jit(f).trace(*args).lower(lowering_platforms=("tpu",))``),
  exactly the program a TPU would receive;
* ``xla`` rows are the module XLA's own CPU pipeline made from a JAX program (fusions, bitcasts, copies:
  the forms an optimised dump holds);
* ``hand`` rows are HLO text for the opcodes JAX never emits (:data:`NOT_FROM_JAX` says why for each).

Together they contain every opcode of the reference interpreter (``test_every_reference_opcode_is_covered``).
Operations without a hardware lowering run as fallbacks (reference semantics on the device's bytes);
``pytest -s -k fallback_report`` prints which ran that way.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from e2e_support import EXAMPLES_DIR, Checked, example_module, examples, module_opcodes, run_checked
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.ir import Module
from tpusim.compiler.hlo.reference import REFERENCE
from tpusim.compiler.hlo.reference.core import Host
from tpusim.compiler.options import CompileOptions

BF16 = ml_dtypes.bfloat16


@dataclass(frozen=True)
class Case:
    """One program of the suite.

    Attributes:
        name: test id.
        source: ``jax`` (TPU lowering), ``xla`` (XLA CPU-optimised module of a JAX program) or ``hand``.
        make: seeded RNG -> (HLO text or parsed module, inputs).
        config: chip preset.
        precision: ``CompileOptions.matmul_precision``.
        why: the reason for a non-default chip or precision.
        xfail: if set, the known defect that makes this case fail today.
    """

    name: str
    source: str
    make: Callable[[np.random.Generator], tuple[str | Module, list[Any]]]
    config: str = "tpu_v5e"
    precision: str = "default"
    why: str = ""
    xfail: str = ""
    host: Callable[[], Host] | None = None

    @property
    def options(self) -> CompileOptions:
        return CompileOptions(matmul_precision=self.precision)


CASES: dict[str, Case] = {}

CHAINED = "chained f32 matmuls: the one-pass emulation does not hold past the first (see e2e_support)"
TEACHING = "the teaching chip (8x8 MXU, 8x8 vector registers): every tile count is different from tpu_v5e's"


def _add(case: Case) -> None:
    assert case.name not in CASES, case.name
    CASES[case.name] = case


def jax_case(name: str, **kw: Any) -> Callable[[Callable[[np.random.Generator], tuple]], Callable]:
    """Register ``build(rng) -> (fn, *args)`` as a program lowered for TPU (``xla=True``: XLA CPU-optimised)."""
    optimized = kw.pop("xla", False)

    def register(build: Callable[[np.random.Generator], tuple]) -> Callable:
        def make(rng: np.random.Generator) -> tuple[str, list[Any]]:
            fn, *args = build(rng)
            if optimized:
                text = jax.jit(fn).lower(*args).compile().as_text()
            else:
                text = jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",)).as_text(dialect="hlo")
            return text, [np.asarray(a) for a in jax.tree.leaves(args)]

        _add(Case(name, "xla" if optimized else "jax", make, **kw))
        return build

    return register


def hand_case(
    name: str, text: str, inputs: Callable[[np.random.Generator], list[Any]] | None = None, **kw: Any
) -> None:
    """Register hand-written HLO ``text``; ``inputs(rng)`` or seeded random inputs of the parameters."""

    def make(rng: np.random.Generator) -> tuple[str, list[Any]]:
        if inputs is not None:
            return text, inputs(rng)
        from tpusim.compiler.hlo.reference.io import random_inputs

        return text, random_inputs(parse_module(text), int(rng.integers(1 << 31)))[0]

    _add(Case(name, "hand", make, **kw))


def normal(rng: np.random.Generator, *shape: int, dtype: Any = np.float32, std: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32).astype(dtype)


def weight(rng: np.random.Generator, *shape: int, dtype: Any = np.float32) -> np.ndarray:
    """1/sqrt(fan_in) initialisation, as real models start (keeps softmax and losses well conditioned)."""
    return normal(rng, *shape, dtype=dtype, std=float(1 / np.sqrt(np.prod(shape[:-1]))))


# ============================================================================================ examples/
# The committed example programs, run from their files with the inputs their generator describes.
def _example_case(name: str) -> None:
    precision = "highest" if name.endswith("f32") else "default"

    def make(rng: np.random.Generator) -> tuple[Module, list[Any]]:
        return example_module(name), examples()[name].inputs(int(rng.integers(1 << 31)))

    why = CHAINED if precision == "highest" else ""
    if name == "convnet_f32":
        why = "its convolutions may run as fallbacks (exact f32), which the one-pass emulation would round to bf16"
    _add(Case(f"example_{name}", "jax", make, precision=precision, why=why))


for _name in sorted(examples()):
    _example_case(_name)


# ============================================================================================ model blocks
@jax_case("mlp_bf16_teaching", config="teaching", why=TEACHING)
def _mlp_teaching(rng: np.random.Generator) -> tuple:
    def mlp(x: Any, w1: Any, w2: Any) -> Any:
        return jax.nn.relu(x @ w1) @ w2

    return mlp, normal(rng, 24, 40, dtype=BF16), weight(rng, 40, 72, dtype=BF16), weight(rng, 72, 16, dtype=BF16)


@jax_case("dense_f32_one_pass")
def _dense(rng: np.random.Generator) -> tuple:
    """One f32 matmul at DEFAULT precision (one bf16 pass), checked against the one-pass emulation."""
    return (lambda x, w, b: jnp.tanh(x @ w + b)), normal(rng, 128, 384), weight(rng, 384, 256), normal(rng, 256)


@jax_case("matmul_f32_awkward_3x5x7")
def _awkward(rng: np.random.Generator) -> tuple:
    return (lambda a, b: a @ b), normal(rng, 3, 5), normal(rng, 5, 7)


@jax_case("matmul_int8_to_s32")
def _int8(rng: np.random.Generator) -> tuple:
    def f(a: Any, b: Any) -> Any:
        return lax.dot(a, b, preferred_element_type=jnp.int32)

    return f, rng.integers(-128, 128, (64, 256)).astype(np.int8), rng.integers(-128, 128, (256, 128)).astype(np.int8)


@jax_case("batched_einsum_bf16")
def _einsum(rng: np.random.Generator) -> tuple:
    def f(a: Any, b: Any) -> Any:
        return jnp.einsum("bij,bjk->bik", a, b, preferred_element_type=jnp.float32)

    return f, normal(rng, 4, 64, 128, dtype=BF16), normal(rng, 4, 128, 96, dtype=BF16)


@jax_case("layer_norm_softmax_bf16")
def _ln_softmax(rng: np.random.Generator) -> tuple:
    def f(x: Any, g: Any) -> Any:
        h = x.astype(jnp.float32)
        h = (h - h.mean(-1, keepdims=True)) * lax.rsqrt(h.var(-1, keepdims=True) + 1e-5) * g
        return jax.nn.softmax(h, -1).astype(jnp.bfloat16)

    return f, normal(rng, 4, 64, 256, dtype=BF16), normal(rng, 256)


@jax_case("attention_bf16_teaching", config="teaching", why=TEACHING)
def _attention_teaching(rng: np.random.Generator) -> tuple:
    def f(q: Any, k: Any, v: Any) -> Any:
        s = jnp.einsum("bqd,bkd->bqk", q, k).astype(jnp.float32) / 4.0
        return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, -1).astype(q.dtype), v)

    return f, *(normal(rng, 2, 16, 16, dtype=BF16) for _ in range(3))


def _conv(x: Any, k: Any, stride: int = 1, groups: int = 1) -> Any:
    return lax.conv_general_dilated(
        x, k, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups
    )


@jax_case("convnet_train_step_f32", precision="highest", why=CHAINED)
def _conv_train(rng: np.random.Generator) -> tuple:
    """Conv net forward and backward: gradient convolutions, select-and-scatter of max pooling, SGD update."""

    def loss(k1: Any, k2: Any, w: Any, x: Any, y: Any) -> Any:
        h = lax.reduce_window(jax.nn.relu(_conv(x, k1)), -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        h = jax.nn.relu(_conv(h, k2, groups=2))
        logits = jnp.mean(h, (1, 2)) @ w
        return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(logits), -1))

    def step(k1: Any, k2: Any, w: Any, x: Any, y: Any) -> Any:
        value, grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(k1, k2, w, x, y)
        return value, *(p - 0.1 * g for p, g in zip((k1, k2, w), grads))

    y = jax.nn.one_hot(rng.integers(0, 10, 4), 10)
    return step, weight(rng, 3, 3, 3, 8), weight(rng, 3, 3, 4, 16), weight(rng, 16, 10), normal(rng, 4, 8, 8, 3), y


@jax_case("conv_strided_bf16")
def _conv_strided(rng: np.random.Generator) -> tuple:
    return (
        (lambda x, k: _conv(x, k, stride=2)),
        normal(rng, 2, 16, 16, 8, dtype=BF16),
        weight(rng, 3, 3, 8, 16, dtype=BF16),
    )


# ============================================================================================ control flow
@jax_case("while_fori_loop_matmul", precision="highest", why=CHAINED)
def _fori(rng: np.random.Generator) -> tuple:
    def f(x: Any, w: Any) -> Any:
        return lax.fori_loop(0, 5, lambda i, h: jnp.tanh(h @ w) + i.astype(jnp.float32), x)

    return f, normal(rng, 16, 128), weight(rng, 128, 128)


@jax_case("while_data_dependent")
def _while(rng: np.random.Generator) -> tuple:
    def f(x: Any) -> Any:
        return lax.while_loop(lambda c: c[1] < 100.0, lambda c: (c[0] + 1, c[1] * 1.5 + 1.0), (jnp.int32(0), x))

    return f, np.float32(0.5)


@jax_case("scan_rnn_bf16")
def _scan(rng: np.random.Generator) -> tuple:
    def f(h: Any, xs: Any, w: Any) -> Any:
        def cell(h: Any, x: Any) -> Any:
            h = jnp.tanh((h @ w).astype(jnp.float32) + x.astype(jnp.float32)).astype(h.dtype)
            return h, h.sum()

        return lax.scan(cell, h, xs)

    return f, normal(rng, 8, 128, dtype=BF16), normal(rng, 6, 8, 128, dtype=BF16), weight(rng, 128, 128, dtype=BF16)


@jax_case("scan_cumulative_ops")
def _cumulative(rng: np.random.Generator) -> tuple:
    def f(x: Any) -> Any:
        return jnp.cumsum(x, 0), lax.cummax(x, 1), jnp.cumprod(x[:4] * 0.5, 0)

    return f, normal(rng, 16, 128)


@jax_case("cond_two_branches")
def _cond(rng: np.random.Generator) -> tuple:
    def f(p: Any, x: Any) -> Any:
        return lax.cond(p > 0, lambda x: jnp.sin(x) * 2.0, lambda x: jnp.cos(x) - 1.0, x)

    return f, np.float32(1.0), normal(rng, 8, 256)


@jax_case("switch_three_branches")
def _switch(rng: np.random.Generator) -> tuple:
    def f(i: Any, x: Any) -> Any:
        return lax.switch(i, [jnp.exp, lambda x: x * x, lambda x: -x], x)

    return f, np.int32(1), normal(rng, 16, 128)


@jax_case("remat_gradient")
def _remat(rng: np.random.Generator) -> tuple:
    return jax.grad(lambda x: jax.checkpoint(lambda y: jnp.sin(jnp.sin(y)))(x).sum()), normal(rng, 8, 128)


# ============================================================================================ elementwise
@jax_case("unary_f32")
def _unary(rng: np.random.Generator) -> tuple:
    def f(x: Any) -> Any:
        a = jnp.abs(x) + 0.1
        return (
            jnp.exp(x), jnp.log(a), jnp.log1p(a), jnp.expm1(x), jnp.tanh(x), jnp.sin(x), jnp.cos(x),
            jnp.tan(x), jnp.sqrt(a), lax.rsqrt(a), jnp.cbrt(x), lax.erf(x), jnp.sign(x), jnp.floor(x * 3),
            jnp.ceil(x * 3), jnp.round(x * 3), lax.round(x * 3, lax.RoundingMethod.AWAY_FROM_ZERO), -x,
            jnp.isfinite(x / (x - x)),
        )  # fmt: skip

    return f, normal(rng, 8, 256)


@jax_case("binary_f32")
def _binary(rng: np.random.Generator) -> tuple:
    def f(x: Any, y: Any) -> Any:
        return (
            x + y, x - y, x * y, x / y, jnp.maximum(x, y), jnp.minimum(x, y), jnp.abs(x) ** y, jnp.arctan2(x, y),
            lax.rem(x, y), jnp.clip(x, -0.5, 0.5), jnp.where(x > y, x, y), x >= y, jnp.nextafter(x, y),
        )  # fmt: skip

    return f, normal(rng, 16, 128), normal(rng, 16, 128)


@jax_case("elementwise_bf16")
def _bf16(rng: np.random.Generator) -> tuple:
    def f(x: Any, y: Any) -> Any:
        return jax.nn.gelu(x) * y + jnp.exp(-x * x), jnp.maximum(x, y) - lax.rsqrt(jnp.abs(y) + 1)

    return f, normal(rng, 32, 256, dtype=BF16), normal(rng, 32, 256, dtype=BF16)


@jax_case("integer_s32")
def _s32(rng: np.random.Generator) -> tuple:
    def f(a: Any, b: Any) -> Any:
        s = b & 31
        return (
            a + b, a - b, a * b, a // (b | 1), a % (b | 1), a << s, a >> s, lax.shift_right_logical(a, s), a & b,
            a | b, a ^ b, ~a, lax.population_count(a), lax.clz(a), jnp.abs(a), jnp.sign(a), jnp.maximum(a, b),
            jnp.clip(a, -100, 100), a < b, a == b,
        )  # fmt: skip

    return (
        f,
        rng.integers(-(2**31), 2**31, (8, 128)).astype(np.int32),
        rng.integers(-1000, 1000, (8, 128)).astype(np.int32),
    )


@jax_case("integer_narrow_unsigned")
def _narrow(rng: np.random.Generator) -> tuple:
    def f(a: Any, b: Any, c: Any) -> Any:
        return a + a, a * a, a >> 3, b - b // 3, c * c, (a < 128) | (b > 7)

    return (
        f,
        rng.integers(0, 256, (16, 128)).astype(np.uint8),
        rng.integers(-(2**15), 2**15, (16, 128)).astype(np.int16),
        rng.integers(0, 2**32, (16, 128)).astype(np.uint32),
    )


@jax_case("convert_chain")
def _convert(rng: np.random.Generator) -> tuple:
    def f(x: Any) -> Any:
        b = x.astype(jnp.bfloat16)
        return (
            b, b.astype(jnp.int32), (x * 100).astype(jnp.int8), x.astype(jnp.float16), x > 0,
            (x > 0).astype(jnp.float32), (x * 1e3).astype(jnp.uint16), x.astype(jnp.float8_e4m3fn),
        )  # fmt: skip

    return f, normal(rng, 16, 128, std=3.0)


@jax_case("bitcast_and_reduce_precision")
def _bits(rng: np.random.Generator) -> tuple:
    def f(x: Any) -> Any:
        i = lax.bitcast_convert_type(x, jnp.int32)
        return i, lax.bitcast_convert_type(i ^ 1, jnp.float32), lax.reduce_precision(x, 5, 10)

    return f, normal(rng, 8, 128)


@jax_case("complex_c64")
def _complex(rng: np.random.Generator) -> tuple:
    def f(re: Any, im: Any) -> Any:
        z = lax.complex(re, im)
        w = z * z + jnp.exp(z) / (z + 2.0)
        return jnp.real(w), jnp.imag(w), w

    return f, normal(rng, 8, 128), normal(rng, 8, 128)


@jax_case("complex_abs_c64")
def _complex_abs(rng: np.random.Generator) -> tuple:
    return (lambda z: jnp.abs(z)), (normal(rng, 8, 128) + 1j * normal(rng, 8, 128)).astype(np.complex64)


# ============================================================================================ data movement
@jax_case("movement_ops")
def _movement(rng: np.random.Generator) -> tuple:
    def f(x: Any, y: Any) -> Any:
        return (
            x.T, jnp.flip(x, (0, 1)), x.reshape(64, 32), jnp.concatenate([x, y], 0), x[1:7:2, 3:100:5],
            jnp.pad(x, ((1, 2), (3, 0))), lax.pad(x, 0.0, ((1, -1, 1), (0, 0, 0))), jnp.broadcast_to(y[0], (4, 8, 256)),
            jnp.arange(48, dtype=jnp.int32).reshape(6, 8), jnp.tile(y[:2, :8], (3, 2)),
        )  # fmt: skip

    return f, normal(rng, 8, 256), normal(rng, 4, 256)


@jax_case("dynamic_slice_update")
def _dynamic(rng: np.random.Generator) -> tuple:
    def f(x: Any, i: Any, j: Any) -> Any:
        s = lax.dynamic_slice(x, (i, j), (8, 128))
        return s, lax.dynamic_update_slice(x, s * 2.0, (j, i)), lax.dynamic_slice(x, (i + 100, j), (8, 128))

    return f, normal(rng, 64, 512), np.int32(5), np.int32(130)


@jax_case("awkward_shapes_3x5_1000x1000")
def _awkward_shapes(rng: np.random.Generator) -> tuple:
    def f(a: Any, b: Any) -> Any:
        return a * 2.0 + 1.0, (b - b.mean()).T, b[:3, :5] + a

    return f, normal(rng, 3, 5), normal(rng, 1000, 1000)


@jax_case("gather_embedding")
def _gather(rng: np.random.Generator) -> tuple:
    def f(table: Any, ids: Any) -> Any:
        return table[ids].mean(1), jnp.take_along_axis(table[:16], ids[:, :1] % 16, 0)

    return f, normal(rng, 512, 128), rng.integers(0, 512, (16, 8)).astype(np.int32)


@jax_case("scatter_segment_sum")
def _scatter(rng: np.random.Generator) -> tuple:
    def f(x: Any, seg: Any) -> Any:
        return jax.ops.segment_sum(x, seg, 16), jnp.zeros((16, 128)).at[seg].max(x)

    return f, normal(rng, 64, 128), rng.integers(0, 16, 64).astype(np.int32)


# ============================================================================================ reductions
@jax_case("reductions")
def _reduce(rng: np.random.Generator) -> tuple:
    def f(x: Any, i: Any) -> Any:
        return (
            x.sum(1), x.max(0), x.min((0, 1)), jnp.prod(x[:, :8] * 0.5 + 1, 1), jnp.argmax(x, 1), jnp.any(x > 2.5, 0),
            jnp.all(x > -3, 1), i.sum(0), jnp.bitwise_xor.reduce(i, 1),
        )  # fmt: skip

    return f, normal(rng, 32, 256), rng.integers(-50, 50, (32, 256)).astype(np.int32)


@jax_case("reduce_bf16_mean_var")
def _reduce_bf16(rng: np.random.Generator) -> tuple:
    return (lambda x: (x.mean((0, 2)), x.var(-1))), normal(rng, 8, 16, 256, dtype=BF16)


@jax_case("pooling_windows")
def _pool(rng: np.random.Generator) -> tuple:
    def f(x: Any) -> Any:
        avg = lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME") / 9.0
        mx = lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 1, 1, 1), ((0, 0), (1, 0), (0, 1), (0, 0)))
        return (
            avg,
            mx,
            jax.grad(lambda y: lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID").sum())(x),
        )

    return f, normal(rng, 2, 16, 16, 8)


# ============================================================================================ sort, fft, linalg, rng
@jax_case("sort_topk")
def _sort(rng: np.random.Generator) -> tuple:
    def f(x: Any, k: Any) -> Any:
        return jnp.sort(x, 1), jnp.argsort(x[0]), lax.sort((k, x), dimension=1, num_keys=1), lax.top_k(x, 5)

    return f, normal(rng, 8, 128), rng.integers(0, 10, (8, 128)).astype(np.int32)


@jax_case("fft_c64")
def _fft(rng: np.random.Generator) -> tuple:
    return (lambda x: (jnp.fft.fft(x), jnp.fft.irfft(jnp.fft.rfft(x.real), 64))), (
        normal(rng, 4, 64) + 1j * normal(rng, 4, 64)
    ).astype(np.complex64)


@jax_case("cholesky_triangular_solve")
def _linalg(rng: np.random.Generator) -> tuple:
    def f(a: Any, b: Any) -> Any:
        spd = a @ a.T + 16 * jnp.eye(16)
        c = jnp.linalg.cholesky(spd)
        return c, lax.linalg.triangular_solve(c, b, left_side=True, lower=True)

    return f, normal(rng, 16, 16), normal(rng, 16, 8)


@jax_case("linalg_custom_calls")
def _custom(rng: np.random.Generator) -> tuple:
    def f(a: Any) -> Any:
        q, r = jnp.linalg.qr(a)
        lu, piv, perm = lax.linalg.lu(a)
        return q @ r, lu, piv, perm, jnp.linalg.eigh(a + a.T)[0]

    return f, normal(rng, 8, 8)


@jax_case("random_threefry")
def _threefry(rng: np.random.Generator) -> tuple:
    def f(seed: Any) -> Any:
        key = jax.random.key(seed)
        return (
            jax.random.normal(key, (8, 128)),
            jax.random.randint(key, (16,), 0, 100),
            jax.random.bernoulli(key, 0.3, (8,)),
        )

    return f, np.uint32(42)


@jax_case("random_bit_generator")
def _rbg(rng: np.random.Generator) -> tuple:
    def f(state: Any) -> Any:
        new, bits = lax.rng_bit_generator(state, (8, 128), dtype=jnp.uint32)
        return new, bits, lax.rng_uniform(0.0, 1.0, (4,))

    return f, rng.integers(0, 2**32, 4).astype(np.uint32)


# ============================================================================================ collectives
_MESH: list[Mesh] = []


def _one_device_mesh() -> Mesh:
    if not _MESH:
        _MESH.append(jax.make_mesh((1,), ("x",), devices=jax.devices()[:1]))
    return _MESH[0]


@jax_case("collectives_one_device_mesh")
def _collectives(rng: np.random.Generator) -> tuple:
    """shard_map on a one-device mesh: all-reduce, all-gather, collective-permute, reduce-scatter, partition-id."""
    mesh = _one_device_mesh()

    def body(a: Any) -> Any:
        s = lax.psum(a, "x")
        g = lax.all_gather(a, "x", tiled=True)
        p = lax.ppermute(a, "x", [(0, 0)])
        rs = lax.psum_scatter(a, "x", tiled=True)
        return s + p, g, rs, lax.axis_index("x")

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P(), P(), P("x"), P()), check_vma=False))
    return f, jax.device_put(normal(rng, 8, 128), NamedSharding(mesh, P("x")))


# ============================================================================================ XLA-optimised
@jax_case("xla_fused_mlp_f32", xla=True, precision="highest", why=CHAINED)
def _xla_mlp(rng: np.random.Generator) -> tuple:
    """XLA's CPU pipeline output: loop fusions, bitcasts and layout copies."""

    def f(x: Any, w1: Any, w2: Any) -> Any:
        h = jax.nn.gelu(x @ w1)
        return (h @ w2).T.reshape(-1) * 2.0

    return f, normal(rng, 32, 64), weight(rng, 64, 128), weight(rng, 128, 32)


@jax_case("xla_fused_elementwise", xla=True)
def _xla_ew(rng: np.random.Generator) -> tuple:
    def f(x: Any, y: Any) -> Any:
        return jnp.exp(x) * y + 1.0, jnp.swapaxes(x.reshape(4, 8, 64), 0, 1) - 1.0

    return f, normal(rng, 32, 64), normal(rng, 32, 64)


# ============================================================================================ hand-written HLO
NOT_FROM_JAX: dict[str, str] = {
    "acos": "JAX expands arccos into atan2/sqrt before HLO",
    "acosh": "JAX expands arccosh into log/sqrt",
    "asin": "JAX expands arcsin into atan2/sqrt",
    "asinh": "JAX expands arcsinh into log/sqrt",
    "atan": "JAX lowers arctan as atan2(x, 1)",
    "atanh": "JAX expands arctanh into log1p",
    "cosh": "JAX expands cosh into exponentials",
    "sinh": "JAX expands sinh into exponentials",
    "mulhi": "newer than JAX 0.10's XLA; no JAX API",
    "bitcast": "only XLA's layout passes create bitcasts (the xla_* rows may hold one too)",
    "copy": "only XLA's layout passes create copies",
    "fusion": "only XLA's fusion passes create fusions",
    "batch-norm-training": "JAX writes batch norm from elementwise ops; XLA keeps this op for other front ends",
    "batch-norm-inference": "as batch-norm-training",
    "batch-norm-grad": "as batch-norm-training",
    "async-start": "asynchronous wrappers are made by XLA's scheduling passes",
    "async-update": "as async-start",
    "async-done": "as async-start",
    "copy-start": "made by XLA's memory-space assignment",
    "copy-done": "as copy-start",
    "all-reduce-start": "made by XLA's async-collective conversion",
    "all-reduce-done": "as all-reduce-start",
    "all-gather-start": "as all-reduce-start",
    "all-gather-done": "as all-reduce-start",
    "collective-permute-start": "as all-reduce-start",
    "collective-permute-done": "as all-reduce-start",
    "all-to-all": "JAX drops all_to_all on a one-device mesh, and the device model runs one device",
    "collective-broadcast": "no JAX API",
    "ragged-all-to-all": "jax.lax.ragged_all_to_all needs several devices (XLA CPU cannot run it either)",
    "replica-id": "JAX's axis_index lowers to partition-id under shard_map",
    "after-all": "JAX programs without ordered effects carry no tokens",
    "logistic": "JAX writes logistic (jax.nn.sigmoid, lax.logistic) as 1 / (1 + exp(-x))",
    "add-dependency": "made by XLA passes",
    "domain": "made by XLA's sharding propagation",
    "get-dimension-size": "JAX has no dynamic shapes",
    "set-dimension-size": "JAX has no dynamic shapes",
    "rng-get-and-update-state": "made by XLA's rng expansion",
    "map": "jax.lax.map lowers to a while loop",
    "infeed": "no JAX API since host callbacks replaced it",
    "outfeed": "as infeed",
    "send": "JAX uses send/recv only for host callbacks with ordered effects",
    "send-done": "as send",
    "recv": "as send",
    "recv-done": "as send",
}
"""Reference opcodes JAX's TPU lowering never emits, and why; the hand-written rows below cover them."""

V = "f32[8,128]"

hand_case(
    "hand_unary_not_from_jax",
    f"""HloModule inverse_trig
ENTRY main {{
  x = {V} parameter(0)
  one = f32[] constant(1.5)
  ones = {V} broadcast(one), dimensions={{}}
  xp = {V} add(x, ones)
  a = {V} acos(x)
  b = {V} asin(x)
  c = {V} atan(x)
  d = {V} atanh(x)
  e = {V} asinh(x)
  f = {V} cosh(x)
  g = {V} sinh(x)
  h = {V} acosh(xp)
  i = {V} logistic(x)
  ROOT r = ({V}, {V}, {V}, {V}, {V}, {V}, {V}, {V}, {V}) tuple(a, b, c, d, e, f, g, h, i)
}}""",
    lambda rng: [rng.uniform(-0.99, 0.99, (8, 128)).astype(np.float32)],
)

hand_case(
    "hand_mulhi_bitcast_copy",
    """HloModule mulhi
ENTRY main {
  x = u32[16,128] parameter(0)
  y = s32[16,128] parameter(1)
  m = u32[16,128] mulhi(x, x)
  n = s32[16,128] mulhi(y, y)
  b = s32[16,128]{1,0} bitcast(n)
  c = s32[16,128] copy(b)
  ROOT r = (u32[16,128], s32[16,128], s32[16,128]) tuple(m, n, c)
}""",
    lambda rng: [
        rng.integers(0, 2**32, (16, 128)).astype(np.uint32),
        rng.integers(-(2**31), 2**31, (16, 128)).astype(np.int32),
    ],
)

hand_case(
    "hand_batch_norm",
    """HloModule bn
ENTRY main {
  x = f32[4,8,8,16] parameter(0)
  scale = f32[16] parameter(1)
  offset = f32[16] parameter(2)
  mean = f32[16] parameter(3)
  dy = f32[4,8,8,16] parameter(4)
  tr = (f32[4,8,8,16], f32[16], f32[16]) batch-norm-training(x, scale, offset), epsilon=0.001, feature_index=3
  v = f32[16] get-tuple-element(tr), index=2
  bi = f32[4,8,8,16] batch-norm-inference(x, scale, offset, mean, v), epsilon=0.001, feature_index=3
  gr = (f32[4,8,8,16], f32[16], f32[16]) batch-norm-grad(x, scale, mean, v, dy), epsilon=0.001, feature_index=3
  ROOT out = ((f32[4,8,8,16], f32[16], f32[16]), f32[4,8,8,16], (f32[4,8,8,16], f32[16], f32[16])) tuple(tr, bi, gr)
}""",
)

hand_case(
    "hand_async_and_copy_start",
    f"""HloModule async
wrapped {{
  a = {V} parameter(0)
  b = {V} parameter(1)
  ROOT m = {V} multiply(a, b)
}}
ENTRY main {{
  x = {V} parameter(0)
  y = {V} parameter(1)
  s = (({V}, {V}), {V}, s32[]) async-start(x, y), calls=wrapped
  u = (({V}, {V}), {V}, s32[]) async-update(s)
  d = {V} async-done(u)
  cs = ({V}, {V}, u32[]) copy-start(d)
  cd = {V} copy-done(cs)
  ROOT r = {V} add(cd, x)
}}""",
)

hand_case(
    "hand_fusion",
    f"""HloModule fused
fused_computation {{
  p0 = {V} parameter(0)
  p1 = {V} parameter(1)
  e = {V} exponential(p0)
  ROOT m = {V} multiply(e, p1)
}}
ENTRY main {{
  x = {V} parameter(0)
  y = {V} parameter(1)
  ROOT f = {V} fusion(x, y), kind=kLoop, calls=fused_computation
}}""",
)

# HLO broadcasts clamp's scalar bounds and select's scalar predicate implicitly (passes.explicit_broadcasts).
hand_case(
    "hand_clamp_scalar_bounds_select_scalar_predicate",
    """HloModule m
ENTRY main {
  lo = f32[] parameter(0)
  x = f32[130,257] parameter(1)
  hi = f32[] parameter(2)
  k = pred[] parameter(3)
  c = f32[130,257] clamp(lo, x, hi)
  ROOT r = f32[130,257] select(k, c, x)
}""",
    lambda rng: [np.float32(-0.5), normal(rng, 130, 257), np.float32(0.5), np.array(True)],
)

# A scalar copied into a temporary (an SMEM-sized DMA of a rank-0 array).
hand_case(
    "hand_scalar_copy",
    """HloModule m
ENTRY main {
  p0 = u8[] parameter(0)
  c = u8[] copy(p0)
  ROOT r = u8[] add(c, c)
}""",
)

# Instruction names repeat across computations (XLA dumps never do it; hand-written HLO often does): each
# computation's fusions must stay its own (they once shared the name fused.r, and branches ran each other's).
hand_case(
    "hand_names_repeat_across_branches",
    """HloModule m
b0 {
  x = f32[7] parameter(0)
  c = f32[] constant(1)
  cb = f32[7] broadcast(c), dimensions={}
  ROOT r = f32[7] add(x, cb)
}
b1 {
  x = f32[7] parameter(0)
  c = f32[] constant(2)
  cb = f32[7] broadcast(c), dimensions={}
  ROOT r = f32[7] add(x, cb)
}
ENTRY main {
  k = pred[] parameter(0)
  x = f32[7] parameter(1)
  ROOT out = f32[7] conditional(k, x, x), true_computation=b0, false_computation=b1
}""",
    lambda rng: [np.array(True), np.zeros(7, np.float32)],
)

hand_case(
    "hand_names_repeat_in_loop_body_and_entry",
    """HloModule m
cond {
  s = (s32[], f32[7]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  s = (s32[], f32[7]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[7] get-tuple-element(s), index=1
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  c = f32[] constant(1)
  cb = f32[7] broadcast(c), dimensions={}
  r = f32[7] add(x, cb)
  ROOT t = (s32[], f32[7]) tuple(i2, r)
}
ENTRY main {
  x = f32[7] parameter(0)
  z = s32[] constant(0)
  t = (s32[], f32[7]) tuple(z, x)
  w = (s32[], f32[7]) while(t), condition=cond, body=body
  y = f32[7] get-tuple-element(w), index=1
  c = f32[] constant(100)
  cb = f32[7] broadcast(c), dimensions={}
  ROOT r = f32[7] add(y, cb)
}""",
)

hand_case(
    "hand_tokens_domain_dependency",
    f"""HloModule tokens
ENTRY main {{
  x = {V} parameter(0)
  t0 = token[] after-all()
  t1 = token[] after-all(t0)
  y = {V} add-dependency(x, t1)
  d = {V} domain(y), domain={{kind="sharding", entry={{maximal device=0}}, exit={{replicated}}}}
  ROOT z = {V} negate(d)
}}""",
)


hand_case(
    "hand_dynamic_dimension_size",
    """HloModule dyn
ENTRY main {
  x = f32[64] parameter(0)
  n = s32[] parameter(1)
  d = f32[<=64] set-dimension-size(x, n), dimensions={0}
  a = s32[] get-dimension-size(d), dimensions={0}
  b = s32[] get-dimension-size(x), dimensions={0}
  ROOT r = (s32[], s32[]) tuple(a, b)
}""",
    lambda rng: [normal(rng, 64), np.int32(40)],
    xfail="the device needs static shapes: set-dimension-size's f32[<=64] result has no memory reference",
)

hand_case(
    "hand_rng_get_and_update_state",
    """HloModule rng_state
ENTRY main {
  a = u64[2] rng-get-and-update-state(), delta=5
  b = u64[2] rng-get-and-update-state(), delta=7
  ROOT r = (u64[2], u64[2]) tuple(a, b)
}""",
)

hand_case(
    "hand_map",
    f"""HloModule mapped
fma {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = f32[] parameter(2)
  m = f32[] multiply(a, b)
  ROOT s = f32[] add(m, c)
}}
ENTRY main {{
  x = {V} parameter(0)
  y = {V} parameter(1)
  z = {V} parameter(2)
  ROOT r = {V} map(x, y, z), dimensions={{0,1}}, to_apply=fma
}}""",
)

hand_case(
    "hand_collectives_one_device",
    f"""HloModule collectives
sum {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}
ENTRY main {{
  x = {V} parameter(0)
  r = u32[] replica-id()
  a2a = {V} all-to-all(x), replica_groups={{{{0}}}}, dimensions={{0}}
  cb = {V} collective-broadcast(x), replica_groups={{{{0}}}}
  ars = {V} all-reduce-start(x), replica_groups={{}}, to_apply=sum
  ard = {V} all-reduce-done(ars)
  ags = ({V}, {V}) all-gather-start(x), replica_groups={{{{0}}}}, dimensions={{0}}
  agd = {V} all-gather-done(ags)
  cps = ({V}, {V}, u32[], u32[]) collective-permute-start(x), source_target_pairs={{{{0,0}}}}
  cpd = {V} collective-permute-done(cps)
  ROOT out = (u32[], {V}, {V}, {V}, {V}, {V}) tuple(r, a2a, cb, ard, agd, cpd)
}}""",
)

hand_case(
    "hand_ragged_all_to_all",
    """HloModule ragged
ENTRY main {
  operand = s32[8] parameter(0)
  output = s32[8] parameter(1)
  in_off = s32[1] parameter(2)
  send = s32[1] parameter(3)
  out_off = s32[1] parameter(4)
  recv = s32[1] parameter(5)
  ROOT r = s32[8] ragged-all-to-all(operand, output, in_off, send, out_off, recv), channel_id=1, replica_groups={{0}}
}""",
    lambda rng: [
        rng.integers(0, 100, 8).astype(np.int32),
        np.full(8, -1, np.int32),
        np.array([2], np.int32),
        np.array([5], np.int32),
        np.array([1], np.int32),
        np.array([5], np.int32),
    ],
)

hand_case(
    "hand_host_transfers",
    f"""HloModule host_io
ENTRY main {{
  x = {V} parameter(0)
  t0 = token[] after-all()
  in = ({V}, token[]) infeed(t0)
  v = {V} get-tuple-element(in), index=0
  t1 = token[] get-tuple-element(in), index=1
  r = (s32[4], u32[], token[]) recv(t1), channel_id=5, is_host_transfer=true
  rd = (s32[4], token[]) recv-done(r), channel_id=5, is_host_transfer=true
  k = s32[4] get-tuple-element(rd), index=0
  t2 = token[] get-tuple-element(rd), index=1
  w = {V} add(v, x)
  t3 = token[] outfeed(w, t2), outfeed_shape={V}
  s = (s32[4], u32[], token[]) send(k, t3), channel_id=6, is_host_transfer=true
  sd = token[] send-done(s), channel_id=6, is_host_transfer=true
  ROOT out = ({V}, s32[4]) tuple(w, k)
}}""",
    host=lambda: Host(
        infeed=[np.arange(8 * 128, dtype=np.float32).reshape(8, 128)], recv={5: [np.arange(4, dtype=np.int32)]}
    ),
)


# ============================================================================================ the tests
@cache
def built(name: str) -> tuple[Module, list[Any]]:
    """The case's parsed module and inputs (lowered once per session)."""
    case = CASES[name]
    program, inputs = case.make(np.random.default_rng(zlib.crc32(name.encode())))
    return (program if isinstance(program, Module) else parse_module(program)), inputs


@cache
def ran(name: str) -> Checked:
    case = CASES[name]
    module, inputs = built(name)
    return run_checked(module, inputs, config=case.config, options=case.options, host=case.host)


def _params() -> list[Any]:
    marks = {n: [pytest.mark.xfail(reason=c.xfail, strict=True)] if c.xfail else [] for n, c in CASES.items()}
    return [pytest.param(n, id=n, marks=marks[n]) for n in CASES]


@pytest.mark.parametrize("name", _params())
def test_program_matches_reference(name: str) -> None:
    """Every output of the device run matches the reference interpreter within tpusim.check's bound."""
    run, case = ran(name), CASES[name]
    run.assert_ok(f"{name} on {case.config}" + (f" ({case.why})" if case.why else ""))
    assert run.result.cycles > 0


def test_suite_size_and_realistic_blocks() -> None:
    """At least 40 JAX-generated programs, the realistic blocks among them."""
    assert sum(c.source in ("jax", "xla") for c in CASES.values()) >= 40
    for needed in ("transformer_block_f32", "transformer_block_bf16", "convnet_f32", "train_step_f32"):
        assert f"example_{needed}" in CASES
    for needed in ("convnet_train_step_f32", "while_fori_loop_matmul", "scan_rnn_bf16", "cond_two_branches"):
        assert needed in CASES


def test_every_reference_opcode_is_covered() -> None:
    """The programs together hold every opcode the reference interpreter supports; the JAX programs hold every
    one JAX can produce, and the opcodes only hand-written rows hold are exactly the listed ones."""
    by_source: dict[str, set[str]] = {"jax": set(), "xla": set(), "hand": set()}
    for name, case in CASES.items():
        by_source[case.source] |= module_opcodes(built(name)[0])
    everything = set(REFERENCE)
    missing = everything - by_source["jax"] - by_source["xla"] - by_source["hand"]
    assert not missing, f"no program holds {sorted(missing)}"
    not_from_jax = everything - by_source["jax"]
    assert not_from_jax == set(NOT_FROM_JAX), (
        f"JAX programs lack {sorted(not_from_jax - set(NOT_FROM_JAX))} (add a JAX program) and now produce "
        f"{sorted(set(NOT_FROM_JAX) - not_from_jax)} (remove them from NOT_FROM_JAX)"
    )


def test_examples_are_up_to_date() -> None:
    """The committed examples are what scripts/make_examples.py generates with this JAX."""
    stale = [n for n, ex in examples().items() if ex.file_text() != (EXAMPLES_DIR / f"{n}.hlo").read_text()]
    assert not stale, f"regenerate with `python scripts/make_examples.py`: {stale}"


def test_fallback_report() -> None:
    """Print which opcodes ran as fallbacks in the suite, with one reason each (``pytest -s -k fallback_report``);
    every fallback must name its reason."""
    fell: dict[str, dict[str, str]] = {}
    for name, case in CASES.items():
        if case.xfail:
            continue
        for _, _, opcode, why in ran(name).result.fallbacks:
            assert why, f"{name}: fallback of {opcode} without a reason"
            fell.setdefault(opcode, {}).setdefault(name, why)
    print(f"\nopcodes that ran as fallbacks in the suite ({len(fell)}):")
    for opcode in sorted(fell):
        programs = fell[opcode]
        print(f"  {opcode:26} in {', '.join(sorted(programs))}: {next(iter(programs.values()))}")


def _readme_commands() -> list[str]:
    text = (EXAMPLES_DIR / "README.md").read_text()
    return [line.split("#")[0].strip() for line in text.splitlines() if line.startswith("tpusim run examples/")]


def test_examples_readme_commands_run(capsys: pytest.CaptureFixture[str]) -> None:
    """Every ``tpusim run examples/...`` command of examples/README.md exits 0 (so every ``--check`` passes)."""
    from tpusim.cli import main

    commands = _readme_commands()
    assert "tpusim run examples/transformer_block_bf16.hlo --check" in commands  # the README's first command
    for command in commands:
        status = main(command.split()[1:])
        out = capsys.readouterr().out
        assert status == 0, f"{command} exited {status}:\n{out[-2000:]}"
        if "--check" in command:
            assert "check against the reference interpreter" in out and "MISMATCH" not in out, command
