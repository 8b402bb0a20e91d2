"""A data-parallel training step of an MLP on 8 chips gives JAX's new weights and the reference
interpreter's 8-device answer.

The step is ``jax.shard_map`` over 8 host CPU devices: each device computes the gradients of its slice of
the batch and ``pmean`` averages them (all-reduces), so every chip ends with the same updated weights.
XLA's per-device module (with its combined all-reduce) runs on 8 simulated chips.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate_spmd
from tpusim.compiler.options import CompileOptions

CHIPS, BATCH, D_IN, HIDDEN, D_OUT = 8, 32, 64, 128, 16


def _step():  # type: ignore[no-untyped-def]
    """The shipped SPMD example's step (``scripts/make_spmd_example.py``): SGD on an MLP, ``pmean`` of the
    gradients over the ``data`` axis."""
    scripts = str(Path(__file__).resolve().parent.parent / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from make_spmd_example import step

    return step


@pytest.mark.parametrize("topology", [None, "2x4"])
def test_data_parallel_mlp_step_on_8_chips(topology: str | None) -> None:
    mesh = Mesh(np.array(jax.devices()[:CHIPS]), ("data",))
    replicated, sharded = P(), P("data")
    fn = jax.jit(
        jax.shard_map(_step(), mesh=mesh, in_specs=(replicated,) * 4 + (sharded,) * 2, out_specs=(replicated,) * 4)
    )
    rng = np.random.default_rng(11)
    params = [
        rng.standard_normal((D_IN, HIDDEN), np.float32) * 0.1,
        rng.standard_normal(HIDDEN).astype(np.float32) * 0.1,
        rng.standard_normal((HIDDEN, D_OUT), np.float32) * 0.1,
        rng.standard_normal(D_OUT).astype(np.float32) * 0.1,
    ]
    x = rng.standard_normal((CHIPS * BATCH, D_IN), np.float32)
    y = rng.standard_normal((CHIPS * BATCH, D_OUT), np.float32)
    module = parse_module(fn.lower(*params, x, y).compile().as_text())
    assert sum(i.opcode == "all-reduce" for c in module.computations for i in c.instructions) >= 1
    per_chip = [[*params, x[d * BATCH : (d + 1) * BATCH], y[d * BATCH : (d + 1) * BATCH]] for d in range(CHIPS)]
    inputs = [np.stack([chip[i] for chip in per_chip]) for i in range(6)]
    # f32 dots in six bf16 passes, as JAX computes them on the CPU (HIGHEST)
    result = tpusim.simulate(
        module, inputs, chips=CHIPS, topology=topology, options=CompileOptions(matmul_precision="highest")
    )
    assert result.fallbacks == ()
    want_jax = [np.asarray(o) for o in fn(*params, x, y)]
    want_ref = evaluate_spmd(module, per_chip)
    for i, got in enumerate(result.outputs):
        for chip in range(CHIPS):
            np.testing.assert_allclose(got[chip], want_jax[i], rtol=1e-5, atol=1e-6, err_msg=f"weight {i} chip {chip}")
            np.testing.assert_allclose(got[chip], want_ref[chip][i], rtol=1e-5, atol=1e-6)
        assert np.array_equal(got, np.broadcast_to(got[:1], got.shape)), "every chip holds the same weights"
