"""Real HLO modules for the HLO front-end tests, generated with JAX on the host CPU.

Every function below is lowered in several of the forms XLA prints:

* ``short``: ``jax.jit(f).lower(*args).as_text(dialect="hlo")`` (JAX's short, parsable form);
* ``debug``: the same with ``debug_info=True`` (metadata and the stack-frame tables);
* ``tpu``: ``jax.jit(f).trace(*args).lower(lowering_platforms=("tpu",))`` (lowered for TPU on any machine);
* ``optimized``: the CPU-compiled module (fusions, ``%names``, scheduled, metadata), printed with
  ``print_large_constants`` so that constants are complete;
* ``elided``: ``compiled.as_text()``, which elides large constants as ``{...}``.

The 8 host devices come from tests/conftest.py (XLA_FLAGS set before jax is imported).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

FORMS = ("short", "debug", "tpu", "optimized")

# Constants embedded in `consts` below; the tests compare the parsed literals with them bit for bit.
CONSTANTS: dict[str, np.ndarray] = {
    "f32": np.array([np.nan, np.inf, -np.inf, -0.0, 1e-30, 3.4e38, 1e-45, 0.1], np.float32),
    "bf16": np.array([1.5, -2.25, -0.0, np.inf, 0.1], jnp.bfloat16),
    "c64": np.array([1 + 2j, -0.5j, complex(np.inf, -0.0)], np.complex64),
    "pred": np.array([True, False, True]),
    "s8": np.array([-128, 127, 0], np.int8),
    "u32": np.array([2**32 - 1, 0], np.uint32),
    "f8": np.array([448.0, -0.0, 0.015625], jnp.float8_e4m3fn),
    "f16": np.array([1.0, 65504.0, -6e-8], np.float16),
    "big": np.arange(1000, dtype=np.float32).reshape(10, 100) / 7,
}


def _mlp(x: Any, w1: Any, w2: Any) -> Any:
    return jax.nn.relu(x @ w1) @ w2


def _attention(q: Any, k: Any, v: Any) -> Any:
    s = jnp.einsum("bqd,bkd->bqk", q, k) / 4.0
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, -1), v)


def _conv(x: Any, k: Any) -> Any:
    return lax.conv_general_dilated(
        x, k, (2, 2), ((1, 1), (1, 1)), rhs_dilation=(2, 2), dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _grouped_conv(x: Any, k: Any) -> Any:
    return lax.conv_general_dilated(
        x,
        k,
        (1, 1),
        ((1, 2), (0, 1)),
        lhs_dilation=(2, 2),
        feature_group_count=2,
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
    )


def _while(x: Any) -> Any:
    return lax.fori_loop(0, 10, lambda i, c: c * 2 + i, x)


def _scan(xs: Any) -> Any:
    return lax.scan(lambda c, x: (c + x, c * x), jnp.zeros(xs.shape[1:]), xs)


def _cond(i: Any, x: Any) -> Any:
    return lax.switch(i, [lambda v: v + 1, lambda v: v * 2, lambda v: v - 3], x) + lax.cond(x > 0, jnp.sin, jnp.cos, x)


def _sort(a: Any, b: Any) -> Any:
    return lax.sort((a, b), num_keys=1, is_stable=True), jnp.argsort(a), lax.top_k(a, 2)


def _gather_scatter(x: Any, idx: Any) -> Any:
    return x[idx], x.at[idx].add(1.0), x.at[idx, 2].set(5.0), x.at[idx].max(2.0)


def _fft(x: Any) -> Any:
    return jnp.fft.fft(x), jnp.fft.irfft(jnp.fft.rfft2(x)), jnp.fft.ifft(x.astype(jnp.complex64))


def _rng(key: Any) -> Any:
    return jax.random.normal(key, (3,)), jax.random.bits(key, (2, 2))


def _windows(x: Any) -> Any:
    pool = lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    grad = jax.grad(lambda y: lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID").sum())(x)
    return pool, grad, lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "VALID", (1, 2, 1, 1))


def _consts(x: Any) -> Any:
    return tuple(
        x.astype(v.dtype) + jnp.asarray(v) if v.dtype != np.bool_ else jnp.asarray(v) ^ (x > 0)
        for v in CONSTANTS.values()
    )


def _shape_ops(x: Any, v: Any) -> Any:
    return (
        jnp.pad(x, ((1, 2), (0, 3))),
        lax.pad(x, 0.0, ((1, -1, 1), (0, 0, 2))),
        x[1:3, ::2],
        jnp.concatenate([x, x], 0),
        x.T,
        jnp.flip(x, 1),
        jnp.clip(x, 0, 1),
        lax.dynamic_slice(x, (v[0].astype(jnp.int32), 2), (2, 2)),
        lax.dynamic_update_slice(x, jnp.zeros((1, 2)), (1, v[1].astype(jnp.int32))),
        jnp.cumsum(x, 0),
        lax.reduce_precision(x, 5, 10),
        lax.bitcast_convert_type(x, jnp.int32),
        lax.bitcast_convert_type(x, jnp.uint8),
        jnp.round(x),
        lax.population_count(x.astype(jnp.int32)),
        lax.clz(x.astype(jnp.int32)),
        lax.rem(x, 2.0),
        jnp.arctan2(x, x),
        lax.shift_right_logical(x.astype(jnp.int32), 2),
        lax.cbrt(x) + lax.erf(x) + jnp.tan(x) + lax.logistic(x) + jnp.expm1(x) + jnp.log1p(x),
        jnp.isfinite(x),
        x @ v,
        jnp.broadcast_to(v, (3, 4, 6)),
        jnp.reshape(x, (6, 4)),
        lax.complex(x, x),
        jnp.abs(lax.complex(x, x)),
        lax.iota(jnp.int32, 5),
        jnp.argmax(x, axis=1),
    )


def _linalg(a: Any) -> Any:
    return jnp.linalg.cholesky(a), jax.scipy.linalg.solve_triangular(a, a, lower=True)


def _collectives(a: Any) -> Any:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    spec = jax.sharding.PartitionSpec

    def body(x: Any) -> Any:
        s = lax.psum(x, "x")
        g = lax.all_gather(x, "y", tiled=True)
        p = lax.ppermute(x, "y", [(i, (i + 1) % 4) for i in range(4)])
        t = lax.all_to_all(x, "y", 1, 1, tiled=True)
        rs = lax.psum_scatter(x, "y", scatter_dimension=1, tiled=True)
        return s, g, p, t, rs, lax.axis_index("y")

    out_specs = (spec("x", "y"), spec("x", None), spec("x", "y"), spec("x", "y"), spec("x", "y"), spec())
    return jax.shard_map(body, mesh=mesh, in_specs=spec("x", "y"), out_specs=out_specs, check_vma=False)(a)


def _sharded(a: Any, b: Any) -> Any:
    return jnp.tanh(a @ b).sum(axis=0)


f32 = jnp.float32
FUNCTIONS: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "mlp": (_mlp, (jnp.ones((4, 8), f32), jnp.ones((8, 16), f32), jnp.ones((16, 2), f32))),
    "attention": (_attention, (jnp.ones((2, 8, 16), f32),) * 3),
    "conv": (_conv, (jnp.ones((1, 8, 8, 3), f32), jnp.ones((3, 3, 3, 4), f32))),
    "grouped_conv": (_grouped_conv, (jnp.ones((2, 4, 5, 5), f32), jnp.ones((6, 2, 3, 3), f32))),
    "while": (_while, (jnp.float32(1),)),
    "scan": (_scan, (jnp.ones((5, 3), f32),)),
    "cond": (_cond, (jnp.int32(1), jnp.float32(2))),
    "sort": (_sort, (jnp.ones((5,), f32), jnp.ones((5,), jnp.int32))),
    "gather_scatter": (_gather_scatter, (jnp.ones((10, 4), f32), jnp.array([1, 3, 5]))),
    "fft": (_fft, (jnp.ones((8, 8), f32),)),
    "rng": (_rng, (jax.random.key(0),)),
    "windows": (_windows, (jnp.ones((1, 8, 8, 3), f32),)),
    "consts": (_consts, (jnp.float32(1),)),
    "shape_ops": (_shape_ops, (jnp.ones((4, 6), f32), jnp.ones((6,), f32))),
    "linalg": (_linalg, (jnp.eye(4, dtype=f32),)),
    "collectives": (_collectives, (jnp.ones((8, 16), f32),)),
}


def function_line(name: str, text: str) -> int:
    """The line in this file of the first source line of function ``name`` containing ``text``."""
    fn = FUNCTIONS[name][0]
    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if text in line:
            return start + i
    raise KeyError(text)


@cache
def hlo_text(name: str, form: str) -> str:
    """The HLO text of corpus function ``name`` in ``form`` (see the module docstring)."""
    fn, args = FUNCTIONS[name]
    jitted = jax.jit(fn)
    if form == "short":
        return jitted.lower(*args).as_text(dialect="hlo")
    if form == "debug":
        return jitted.lower(*args).as_text(dialect="hlo", debug_info=True)
    if form == "tpu":
        return jitted.trace(*args).lower(lowering_platforms=("tpu",)).as_text(dialect="hlo")
    compiled = jitted.lower(*args).compile()
    if form == "elided":
        return compiled.as_text()
    if form == "optimized":
        from jax._src.lib import xla_client

        options = xla_client.hlo.HloPrintOptions()
        options.print_large_constants = True
        modules = compiled.runtime_executable().hlo_modules()
        return "\n\n".join(m.to_string(options) for m in modules)
    raise ValueError(form)


@cache
def sharded_tpu_text() -> str:
    """A TPU lowering with shardings on the arguments (sharding attributes, num_partitions)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x", "y"))
    args = (jax.ShapeDtypeStruct((8, 16), f32, sharding=sharding), jax.ShapeDtypeStruct((16, 4), f32))
    return jax.jit(_sharded).trace(*args).lower(lowering_platforms=("tpu",)).as_text(dialect="hlo")


# Automatic SPMD partitioning over a 2x4 mesh ("a", "b"): the compiled modules print some replica groups in
# the mesh form (mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_1'}). Each entry: input
# partition spec, the reduction, and the replica groups the reduction's all-reduce must have (devices
# sharing the reduced mesh axis: "a" groups differ by 4, "b" groups are consecutive).
SPMD_CASES = {
    "ab_sum0": (("a", "b"), lambda x: jnp.sum(x @ x.T, 0), ((0, 4), (1, 5), (2, 6), (3, 7))),
    "ba_sum1": (("b", "a"), lambda x: jnp.sum(x, 1), ((0, 4), (1, 5), (2, 6), (3, 7))),
    "both_sum0": ((("a", "b"),), lambda x: jnp.sum(x, 0), ((0, 1, 2, 3, 4, 5, 6, 7),)),
    "b_max0": (("b",), lambda x: jnp.max(x, 0), ((0, 1, 2, 3), (4, 5, 6, 7))),
}


@cache
def spmd_text(case: str) -> str:
    """The CPU-compiled (SPMD-partitioned) module of SPMD_CASES[case]."""
    from jax._src.lib import xla_client

    spec, fn, _ = SPMD_CASES[case]
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
    compiled = jax.jit(fn, in_shardings=sharding).lower(jnp.ones((8, 16), f32)).compile()
    options = xla_client.hlo.HloPrintOptions()
    options.print_large_constants = True
    return "\n\n".join(m.to_string(options) for m in compiled.runtime_executable().hlo_modules())


def corpus() -> list[tuple[str, str]]:
    """(id, text) of every module of the corpus, in every form."""
    out = [(f"{name}-{form}", hlo_text(name, form)) for name in FUNCTIONS for form in FORMS]
    out.append(("sharded-tpu", sharded_tpu_text()))
    out.extend((f"spmd-{case}", spmd_text(case)) for case in SPMD_CASES)
    return out


def xla_parse(text: str) -> Any:
    """XLA's own parser (from jaxlib), for cross-checking the printer."""
    from jax._src.lib import xla_client

    return xla_client.hlo.hlo_module_from_text(text)


SAMPLES = {
    "jax_mlp_short.hlo": ("mlp", "short"),
    "jax_attention_debug.hlo": ("attention", "debug"),
    "jax_collectives_optimized.hlo": ("collectives", "optimized"),
    "jax_linalg_tpu.hlo": ("linalg", "tpu"),
    "jax_windows_optimized.hlo": ("windows", "optimized"),
}


def write_samples(directory: str = "hlo_samples") -> None:
    """Regenerate the committed JAX samples (run from tests/ with the 8-device XLA_FLAGS of conftest.py).

    Absolute paths of this checkout are cut from the metadata so the files do not depend on it.
    """
    import os
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent) + os.sep
    for file, (name, form) in SAMPLES.items():
        text = hlo_text(name, form).replace(root, "")
        Path(directory, file).write_text(text)
    Path(directory, "jax_sharded_tpu.hlo").write_text(sharded_tpu_text().replace(root, ""))
