"""Recurrent models written with lax.scan, run through simulate_jax against JAX on CPU: the loop-state bugs
of issue 13 showed in them as 10-20% errors per step (a GRU over a batch-major sequence) while the
reference interpreter was right.

The device computes f32 matmuls at the highest precision here (six bf16 passes, an f32-accurate product), so
what remains is f32 rounding and transcendental approximations: 1e-4 relative to the largest output.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import tpusim
from tpusim.compiler.options import CompileOptions

HIGHEST = CompileOptions(matmul_precision="highest")


def _gru(params: dict[str, jax.Array], xs: jax.Array) -> jax.Array:
    """A GRU cell (the gate equations of Cho et al. 2014, as flax.linen.GRUCell writes them) scanned over a
    batch-major sequence xs[batch, time, features]; returns every step's hidden state, batch-major."""
    wi, wh, b = params["wi"], params["wh"], params["b"]
    hidden = wh.shape[0]

    def step(h: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        gi = x @ wi + b
        gh = h @ wh
        r = jax.nn.sigmoid(gi[:, :hidden] + gh[:, :hidden])
        z = jax.nn.sigmoid(gi[:, hidden : 2 * hidden] + gh[:, hidden : 2 * hidden])
        n = jnp.tanh(gi[:, 2 * hidden :] + r * gh[:, 2 * hidden :])
        h = (1.0 - z) * n + z * h
        return h, h

    h0 = jnp.zeros((xs.shape[0], hidden), xs.dtype)
    _, hs = lax.scan(step, h0, jnp.swapaxes(xs, 0, 1))
    return jnp.swapaxes(hs, 0, 1)


def test_gru_over_a_batch_major_sequence_matches_jax() -> None:
    rng = np.random.default_rng(13)
    features, hidden = 32, 128
    params = {
        "wi": jnp.asarray(rng.standard_normal((features, 3 * hidden)) / np.sqrt(features), jnp.float32),
        "wh": jnp.asarray(rng.standard_normal((hidden, 3 * hidden)) / np.sqrt(hidden), jnp.float32),
        "b": jnp.asarray(rng.standard_normal(3 * hidden) * 0.1, jnp.float32),
    }
    xs = jnp.asarray(rng.standard_normal((8, 5, features)), jnp.float32)
    got = tpusim.simulate_jax(_gru, params, xs, options=HIGHEST)
    want = np.asarray(jax.jit(_gru)(params, xs))
    err = np.abs(np.asarray(got.tree) - want)
    assert err.max() <= 1e-4 * np.abs(want).max(), (err.max(axis=(0, 2)), np.abs(want).max())
    timing = tpusim.simulate_jax(_gru, params, xs, options=HIGHEST, timing_only=True)
    assert timing.cycles == got.cycles


def test_scan_with_bias_matches_jax_at_every_step() -> None:
    rng = np.random.default_rng(7)
    xs = jnp.asarray(rng.standard_normal((4, 8, 128)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((128, 256)), jnp.float32)
    b = jnp.asarray(rng.standard_normal(256), jnp.float32)

    def f(xs: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
        return lax.scan(lambda c, x: (c, x @ w + b), 0.0, xs)[1]

    got = np.asarray(tpusim.simulate_jax(f, xs, w, b, options=HIGHEST).tree)
    want = np.asarray(jax.jit(f)(xs, w, b))
    for step in range(4):
        err = np.abs(got[step] - want[step]).max()
        assert err <= 1e-5 * np.abs(want).max(), (step, err)


def test_a_scan_bodys_slices_of_its_inputs_are_in_flight_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scan over four stacked inputs slices each of them every step, a DMA and a wait apiece; with each wait
    right after its DMA the four latencies came one after the other (an LSTM LM's gradient spent about 500k
    of its 1.33M cycles so). A wait that drains its semaphore is deferred until the data is needed
    (tpusim/compiler/lowering/wait_sinking.py), so the slices are in flight together: the same answer, the
    program verifier's semaphore accounting holds, and at most 85% of the time."""
    import tpusim.compiler.lowering as lowering

    def scan(c: Any, xs: Any, ys: Any, zs: Any, ws: Any) -> Any:
        def step(c: Any, xyzw: Any) -> Any:
            x, y, z, w = xyzw
            c = c * 0.5 + x * y - z + w
            return c, c

        return jax.lax.scan(step, c, (xs, ys, zs, ws))

    rng = np.random.default_rng(0)
    args = [rng.standard_normal((8, 128)).astype(np.float32)]
    args += [rng.standard_normal((16, 8, 128)).astype(np.float32) for _ in range(4)]
    want = jax.jit(scan)(*args)
    result = tpusim.simulate_jax(scan, *args)
    for got, w in zip(jax.tree_util.tree_leaves(result.tree), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(w), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(lowering, "sink_waits", lambda stream: stream)
    serial = tpusim.simulate_jax(scan, *args)
    assert result.cycles <= 0.85 * serial.cycles, (result.cycles, serial.cycles)
