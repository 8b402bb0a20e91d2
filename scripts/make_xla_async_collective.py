"""Generate ``tests/data/xla_async_collective/``: an FSDP training step as XLA:TPU compiles it for v5e:2x4, with
one of its all-gathers as an *async collective fusion* (``AsyncCollectiveStart`` / ``AsyncCollectiveDone``),
and JAX's outputs for seeded inputs.

    python scripts/make_xla_async_collective.py   # needs libtpu (pip install 'jax[tpu]')

The step is ``jax.shard_map`` over 8 host CPU devices: each weight is all-gathered before use and its gradient
comes back reduce-scattered. XLA partitions it without the outputs' shardings, so every device returns the
whole updated weights (the last all-gather is the async collective fusion). Files: ``module.hlo.gz`` (XLA's
compiled per-device module) and ``outputs.npz`` (``out0``, ``out1``: JAX's global outputs; the inputs are
regenerated from :data:`SEED`, see :func:`inputs`).
"""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "xla_async_collective"
SEED = 0
SHAPES = ((64, 128), (128, 32), (64, 64))  # w1, w2, x (global)
CHIPS = 8


def inputs() -> list[np.ndarray]:
    """The global inputs (w1, w2, x)."""
    rng = np.random.default_rng(SEED)
    return [(rng.standard_normal(s) / 4).astype(np.float32) for s in SHAPES]


def main() -> int:
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from tpusim.xla_tpu import compile_with_xla

    jax.config.update("jax_use_shardy_partitioner", False)  # GSPMD annotations, as compile_with_xla reads them

    def step(w1, w2, x):  # type: ignore[no-untyped-def]
        def loss(ws):  # type: ignore[no-untyped-def]
            a = lax.all_gather(ws[0], "x", axis=0, tiled=True)
            b = lax.all_gather(ws[1], "x", axis=0, tiled=True)
            return jnp.mean(jnp.tanh(x @ a) @ b)

        g = jax.grad(loss)((w1, w2))
        return w1 - 0.1 * g[0], w2 - 0.1 * g[1]

    mesh = Mesh(np.array(jax.devices()[:CHIPS]), ("x",))
    spec = P("x")
    fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(spec,) * 3, out_specs=(spec, spec)))
    text = fn.lower(*(jax.ShapeDtypeStruct(s, jnp.float32) for s in SHAPES)).as_text(dialect="hlo")
    compiled = compile_with_xla(text, "tpu_v5e", CHIPS, (2, 4))
    if "AsyncCollectiveStart" not in compiled.text:
        print("XLA:TPU made no async collective fusion of this step (another libtpu?)", file=sys.stderr)
        return 1
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "module.hlo.gz").write_bytes(gzip.compress(compiled.text.encode(), mtime=0))
    outs = [np.asarray(o) for o in fn(*inputs())]
    np.savez_compressed(OUT / "outputs.npz", out0=outs[0], out1=outs[1])
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
