"""Generate ``tests/data/xla_attention/``: small bf16 attention programs whose XLA:TPU compilation (v5e) tpusim
ran to wrong values with exit code 0, with their inputs and JAX's outputs.

    python scripts/make_xla_attention.py   # needs libtpu (pip install 'jax[tpu]')

* ``causal_attention_bf16``: causal attention over ``[2,4,64,32]`` in bf16 (softmax in f32). XLA fuses the
  softmax's divide into the second product's weights (a prologue of the convolution XLA writes for the
  einsum); the product's blocks overwrote the scores that prologue still read (their last reader in the
  module's order came before the product).
* ``transformer_block_bf16``: a pre-norm block (4 heads, d_model 64, a GELU MLP of 256) over ``[2,32,64]``.
  XLA bitcasts the attention output ``[2,4,16,32]{3,2,1,0}`` to ``[2,32,64]{1,2,0}`` (the same bytes, another
  order); tpusim's fusion pass took the bitcast into a vector fusion, which read it as a row-major reshape.

Files per program: ``v5e.hlo.gz`` (XLA's compiled module) and ``data.npz`` (``in<i>``: the inputs as their
exact f32 values, ``.npz`` has no bf16; ``out0``: JAX's output on the CPU, as f32).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
from xla_test_data import write_programs

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "xla_attention"


def programs() -> dict[str, tuple[Callable[..., object], list[np.ndarray]]]:
    """name -> (JAX function, inputs)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    rng = np.random.default_rng(0)

    def bf16(*shape: int, scale: float = 1.0) -> np.ndarray:
        return np.asarray(jnp.asarray(rng.standard_normal(shape) * scale, jnp.bfloat16))

    def attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.float32(np.sqrt(q.shape[-1]))
        t = q.shape[2]
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
        p = jax.nn.softmax(s.astype(jnp.float32), -1).astype(q.dtype)
        return jnp.einsum("bhqk,bhkd->bhqd", p, v)

    def norm(h: jax.Array) -> jax.Array:
        return (h - h.mean(-1, keepdims=True)) * lax.rsqrt(h.var(-1, keepdims=True) + 1e-5)

    def block(x: jax.Array, wq: jax.Array, wk: jax.Array, wv: jax.Array, wo: jax.Array, w1: jax.Array,
              w2: jax.Array) -> jax.Array:  # fmt: skip
        b, t, d = x.shape
        heads = 4
        h = norm(x.astype(jnp.float32)).astype(jnp.bfloat16)
        q, k, v = ((h @ w).reshape(b, t, heads, d // heads) for w in (wq, wk, wv))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / np.float32(np.sqrt(d // heads))
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e30)
        p = jax.nn.softmax(s, -1).astype(jnp.bfloat16)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, t, d) @ wo
        return x + jax.nn.gelu(norm(x.astype(jnp.float32)).astype(jnp.bfloat16) @ w1) @ w2

    d = 64
    weights = [bf16(d, d, scale=d**-0.5) for _ in range(4)] + [bf16(d, 4 * d, scale=d**-0.5),
                                                              bf16(4 * d, d, scale=(4 * d) ** -0.5)]  # fmt: skip
    return {
        "causal_attention_bf16": (attention, [bf16(2, 4, 64, 32) for _ in range(3)]),
        "transformer_block_bf16": (block, [bf16(2, 32, d), *weights]),
    }


def main() -> int:
    found = {name: (fn, inputs, None) for name, (fn, inputs) in programs().items()}
    return write_programs(OUT, found, {"v5e": "tpu_v5e"}, "")


if __name__ == "__main__":
    sys.exit(main())
