"""Generate ``tests/data/xla_byte_bitcasts/``: JAX programs whose XLA:TPU compilation reads an array's bytes
under another layout: a ``bitcast`` between two tiled layouts that order the elements differently (the same
bytes), and a ``ConcatBitcast`` that joins two ``s8`` byte views of a bf16 weight (prefetched in halves).

    python scripts/make_xla_byte_bitcasts.py   # needs libtpu (pip install 'jax[tpu]')

Programs (the script fails if XLA no longer writes the form a program is kept for):

* ``cumsum_bf16``: ``jnp.cumsum`` of bf16[16,1024] along the rows; XLA bitcasts ``bf16[16,1024]{1,0}`` to
  ``bf16[2,8,8,128]{3,1,2,0}`` under ``(8,128)(2,1)`` tiles: the same bytes, not the same element order.
  Files: ``v5e.hlo.gz``, ``v6e.hlo.gz`` and ``data.npz`` (inputs and JAX's outputs, as f32).
* ``embed_lookup_f32``: ``t[i]`` of f32[512,128] by s32[8,256] indices; XLA's fusion that wraps the indices
  ends in a bitcast of ``s32[8,256]{1,0:T(8,128)}`` to ``s32[1,2,8,128]{3,2,1,0:T(8,128)}`` (the same bytes:
  index column block ``b`` is tile ``b``, not a row-major reshape). Files as for ``cumsum_bf16``.
* ``sgd_step_bf16`` (v6e only, no data: the test computes JAX's outputs): one SGD step of a bf16 MLP
  (1024 -> 4096 -> 1024, batch 256) whose v6e module prefetches the first weight as two ``s8`` byte-view
  slices joined by a ``ConcatBitcast``. Files: ``v6e.hlo.gz``, ``v6e.json`` (XLA's ``optimal_seconds``).
* ``matmul_prefetched_bf16`` (v5e only, no data): ``x @ w`` of bf16[32,4096] by [4096,11008], whose weight
  XLA prefetches into VMEM (``S(1)``) and whose fusion bitcasts it back to the default memory space (the
  same bytes). Files: ``v5e.hlo.gz``, ``v5e.json``.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
from xla_test_data import write_programs

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "xla_byte_bitcasts"
CHIPS = {"v5e": "tpu_v5e", "v6e": "tpu_v6e"}
SGD_SHAPES = ((1024, 4096), (4096,), (4096, 1024), (1024,), (256, 1024), (256, 1024))


def sgd_step(w1: object, b1: object, w2: object, b2: object, x: object, y: object) -> object:
    """One SGD step (learning rate 0.01) of ``relu(x @ w1 + b1) @ w2 + b2`` on the mean squared error."""
    import jax
    import jax.numpy as jnp

    def loss(params: tuple[object, ...]) -> object:
        w1, b1, w2, b2 = params
        h = jax.nn.relu(x @ w1 + b1)  # type: ignore[operator]
        o = h @ w2 + b2
        return jnp.mean((o.astype(jnp.float32) - y.astype(jnp.float32)) ** 2)  # type: ignore[attr-defined]

    params = (w1, b1, w2, b2)
    grads = jax.grad(loss)(params)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)


def has_reordering_bitcast(text: str) -> bool:
    return "bf16[2,8,8,128]{3,1,2,0" in text


def has_fused_index_bitcast(text: str) -> bool:
    return "s32[1,2,8,128]{3,2,1,0:T(8,128)S(1)} bitcast(" in text


def main() -> int:
    import jax
    import jax.numpy as jnp

    from tpusim.xla_tpu import compile_with_xla

    x = np.random.default_rng(0).integers(-4, 5, size=(16, 1024)).astype(jnp.bfloat16)
    cumsum: dict[str, tuple[Callable[..., object], list[np.ndarray], Callable[[str], bool]]] = {
        "cumsum_bf16": (lambda a: jnp.cumsum(a, axis=1), [x], has_reordering_bitcast)
    }
    if write_programs(OUT, cumsum, CHIPS, "has no bitcast that reorders bf16[16,1024]"):
        return 1
    rng = np.random.default_rng(0)
    table = rng.integers(-8, 9, size=(512, 128)).astype(np.float32)  # (small integers: compact data.npz)
    indices = rng.integers(-512, 512, size=(8, 256)).astype(np.int32)
    lookup: dict[str, tuple[Callable[..., object], list[np.ndarray], Callable[[str], bool]]] = {
        "embed_lookup_f32": (lambda t, i: t[i], [table, indices], has_fused_index_bitcast)
    }
    if write_programs(OUT, lookup, CHIPS, "has no fused bitcast of the indices to s32[1,2,8,128]"):
        return 1
    specs = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in SGD_SHAPES]
    text = jax.jit(sgd_step).lower(*specs).as_text(dialect="hlo")
    compiled = compile_with_xla(text, "tpu_v6e")
    if 'custom_call_target="ConcatBitcast"' not in compiled.text or "s8[" not in compiled.text:
        print("sgd_step_bf16: XLA:TPU's v6e module has no ConcatBitcast of byte views", file=sys.stderr)
        return 1
    _store(OUT / "sgd_step_bf16", "v6e", compiled.text, compiled.optimal_seconds)
    specs = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((32, 4096), (4096, 11008))]
    text = jax.jit(lambda x, w: x @ w).lower(*specs).as_text(dialect="hlo")
    compiled = compile_with_xla(text, "tpu_v5e")
    if "S(1)} parameter" not in compiled.text:
        print("matmul_prefetched_bf16: XLA:TPU's v5e fusion reads no VMEM-prefetched operand", file=sys.stderr)
        return 1
    _store(OUT / "matmul_prefetched_bf16", "v5e", compiled.text, compiled.optimal_seconds)
    return 0


def _store(folder: Path, chip: str, text: str, seconds: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{chip}.hlo.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    (folder / f"{chip}.json").write_text(json.dumps({"optimal_seconds": seconds}, indent=1) + "\n")
    print(f"wrote {folder}")


if __name__ == "__main__":
    sys.exit(main())
