"""Generate ``examples/spmd/dp_train_step_f32_8chips.hlo``: one data-parallel training step of an MLP as XLA
partitions it for 8 devices, ready for ``tpusim run ... --chips 8``.

    python scripts/make_spmd_example.py

The step is ``jax.shard_map`` over 8 host CPU devices: each device computes the gradients of its slice of
the batch, ``pmean`` averages them (an all-reduce), and every device applies the same update. The file is
XLA's per-device module (``jax.jit(...).lower(...).compile().as_text()``: CPU-optimised, with fusions and
the combined all-reduce), so regenerating it with another JAX may change its text; tests run the committed
file, they do not require it byte for byte.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # (after the flags above, which JAX reads when it starts)
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "examples" / "spmd" / "dp_train_step_f32_8chips.hlo"  # (apart from the one-chip examples)
CHIPS, BATCH, D_IN, HIDDEN, D_OUT = 8, 32, 256, 512, 128


def step(w1, b1, w2, b2, x, y):  # type: ignore[no-untyped-def]
    """SGD on a two-layer MLP's mean squared error, gradients averaged over the ``data`` axis."""

    def loss(params):  # type: ignore[no-untyped-def]
        w1, b1, w2, b2 = params
        h = jnp.tanh(x @ w1 + b1)
        return jnp.mean((h @ w2 + b2 - y) ** 2)

    grads = jax.lax.pmean(jax.grad(loss)((w1, b1, w2, b2)), "data")
    return tuple(p - 0.1 * g for p, g in zip((w1, b1, w2, b2), grads))


def module_text() -> str:
    mesh = Mesh(np.array(jax.devices()[:CHIPS]), ("data",))
    replicated, sharded = P(), P("data")
    fn = jax.jit(
        jax.shard_map(step, mesh=mesh, in_specs=(replicated,) * 4 + (sharded,) * 2, out_specs=(replicated,) * 4)
    )
    f32 = jnp.float32
    specs = [
        jax.ShapeDtypeStruct((D_IN, HIDDEN), f32), jax.ShapeDtypeStruct((HIDDEN,), f32),
        jax.ShapeDtypeStruct((HIDDEN, D_OUT), f32), jax.ShapeDtypeStruct((D_OUT,), f32),
        jax.ShapeDtypeStruct((CHIPS * BATCH, D_IN), f32), jax.ShapeDtypeStruct((CHIPS * BATCH, D_OUT), f32),
    ]  # fmt: skip
    text = fn.lower(*specs).compile().as_text()
    head = (
        f"// One data-parallel SGD step of an MLP ({D_IN}-{HIDDEN}-{D_OUT}, batch {BATCH} per chip) on {CHIPS} chips:\n"
        "// XLA's per-device module of jax.shard_map with pmean (scripts/make_spmd_example.py). Run it with\n"
        "//   tpusim run examples/spmd/dp_train_step_f32_8chips.hlo --chips 8 --topology 2x4 --check\n"
    )
    return head + text


def main() -> int:
    OUT.write_text(module_text())
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
