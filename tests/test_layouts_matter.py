"""Layouts matter: the same program under different tilings, or on awkwardly shaped arrays, moves different bytes
and takes different cycles, and each test asserts the direction together with the reason.

The programs are JAX's TPU lowerings; bytes are the payloads of the DMA engines' transfers (trace bytes of
the ``dma`` unit) and the HBM footprint of the compiled program; cycles are the simulated end of the run.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from e2e_support import run_checked

import tpusim
from tpusim.api import SimulationResult
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.ir import Module
from tpusim.compiler.options import CompileOptions
from tpusim.memory import Shape
from tpusim.report.stats import unit_stats

BF16 = ml_dtypes.bfloat16
EIGHT_BY_128 = "tpu_default"  # bf16 arrays tiled (8,128)(2,1)
SIXTEEN_BY_128 = "bf16_16x128"  # bf16 arrays tiled (16,128)


def tpu_hlo(fn: Any, *args: Any) -> Module:
    return parse_module(jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",)).as_text(dialect="hlo"))


def unit(result: SimulationResult, suffix: str) -> tuple[int, int]:
    """(busy cycles, bytes) of the units whose name ends with ``suffix``, summed."""
    stats = [u for u in unit_stats(result.trace) if u.name.split(".")[-1].startswith(suffix)]
    return sum(u.busy_cycles for u in stats), sum(u.bytes for u in stats)


def rms_norm_gelu(x: Any, y: Any, g: Any) -> Any:
    """A bf16 decoder's per-token vector work: RMS norm (f32 statistics), gain, GELU, gating multiply."""
    h = x.astype(jnp.float32)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-6) * g.astype(jnp.float32)
    return jax.nn.gelu(h).astype(jnp.bfloat16) * y


@cache
def norm_runs(tokens: int) -> dict[str, Any]:
    """``rms_norm_gelu`` on ``tokens`` rows of width 1024 under both bf16 tilings, checked against the reference."""
    rng = np.random.default_rng(tokens)
    args = [rng.standard_normal(s).astype(np.float32).astype(BF16) for s in ((tokens, 1024), (tokens, 1024), (1024,))]
    module = tpu_hlo(rms_norm_gelu, *args)
    return {t: run_checked(module, args, options=CompileOptions(tiling=t)) for t in (EIGHT_BY_128, SIXTEEN_BY_128)}


def _layout_of(run: Any, name: str) -> str:
    compiled = run.result.compiled
    shape = compiled.module.entry_computation[name].shape
    assert isinstance(shape, Shape)
    return str(shape)


def test_sixteen_row_tiles_pad_an_eight_token_batch() -> None:
    """8 tokens (a small-batch decode step): (16,128) tiles hold 16 rows, so half of every tile of the bf16
    activations is padding; the arrays take twice the HBM, the whole-array DMAs move the padding too, and the run
    takes longer. (8,128)(2,1) tiles hold exactly 8 rows: no padding."""
    runs = norm_runs(8)
    eight, sixteen = runs[EIGHT_BY_128], runs[SIXTEEN_BY_128]
    for run in runs.values():
        run.assert_ok("rms_norm_gelu on 8 tokens")
    param = eight.result.compiled.module.entry_computation.parameters[0].name
    assert _layout_of(eight, param) == "bf16[8,1024]{1,0:T(8,128)(2,1)}"
    assert _layout_of(sixteen, param) == "bf16[8,1024]{1,0:T(16,128)}"
    assert sixteen.result.compiled.hbm_bytes > 1.9 * eight.result.compiled.hbm_bytes
    dma8, dma16 = unit(eight.result, "dma")[1], unit(sixteen.result, "dma")[1]
    assert dma16 > 1.9 * dma8, (dma8, dma16)
    assert sixteen.result.cycles > eight.result.cycles, (eight.result.cycles, sixteen.result.cycles)
    # The layout moves bytes, not values: the outputs are the same bits.
    assert np.array_equal(eight.result.outputs[0].view(np.uint16), sixteen.result.outputs[0].view(np.uint16))


def test_sixteen_row_tiles_cost_vector_work_on_24_tokens() -> None:
    """24 tokens: (16,128) pads to 32 rows (two row tiles) where (8,128)(2,1) needs exactly three 8-row tiles; the
    DMAs move the same window elements, but the VPU works on whole tiles, so it is busier and the run is longer."""
    runs = norm_runs(24)
    eight, sixteen = runs[EIGHT_BY_128].result, runs[SIXTEEN_BY_128].result
    assert sixteen.compiled.hbm_bytes > eight.compiled.hbm_bytes
    assert unit(sixteen, "vpu")[0] > unit(eight, "vpu")[0]
    assert sixteen.cycles > eight.cycles


def test_without_padding_the_two_tilings_cost_alike() -> None:
    """256 tokens, a multiple of 16: neither tiling pads, so both move the same bytes; (16,128) cannot be slower
    (its tiles are one packed vector register and twice as long contiguous runs). The control for the two above."""
    runs = norm_runs(256)
    eight, sixteen = runs[EIGHT_BY_128].result, runs[SIXTEEN_BY_128].result
    assert sixteen.compiled.hbm_bytes == eight.compiled.hbm_bytes
    assert unit(sixteen, "dma")[1] == unit(eight, "dma")[1]
    assert sixteen.cycles <= eight.cycles


def _affine(a: Any, b: Any) -> Any:
    return a * 2.0 + b


@pytest.mark.parametrize("shape", [(3, 5), (4, 128), (8, 128)])
def test_awkward_3x5_costs_a_whole_tile(shape: tuple[int, int]) -> None:
    """f32[3,5] holds 15 values, but its layout T(4,128) gives it one whole (4,128) tile of 512 slots: it takes
    2048 bytes of HBM per array, its DMAs move all of them, and it costs exactly what f32[4,128] (34x the data)
    costs. f32[8,128] fills an (8,128) tile: twice the bytes."""
    a = np.ones(shape, np.float32)
    result = tpusim.simulate(tpu_hlo(_affine, a, a), [a, a])
    np.testing.assert_array_equal(result.outputs[0], a * 3)
    tile_bytes = 4 * 128 * 4 if shape[0] <= 4 else 8 * 128 * 4
    assert result.compiled.hbm_bytes == 3 * tile_bytes  # two inputs and the output
    assert unit(result, "dma")[1] == 3 * tile_bytes
    small = tpusim.simulate(tpu_hlo(_affine, np.ones((3, 5), np.float32), np.ones((3, 5), np.float32)), None)
    if shape == (4, 128):
        assert result.cycles == small.cycles  # the same tile, the same transfers, the same vector registers
    if shape == (8, 128):
        assert result.cycles > small.cycles  # twice the bytes through HBM


def _matmul(n: int) -> SimulationResult:
    a = np.zeros((n, n), BF16)
    return tpusim.simulate(tpu_hlo(lambda x, y: x @ y, a, a), None, timing_only=True)


def test_awkward_1000_matmul_pays_for_whole_weight_tiles() -> None:
    """bf16[1000,1000] @ [1000,1000] has 93% of the FLOPs of the 1024 product, and its DMAs move only its 95% of
    the bytes; but 1000 = 7 x 128 + 104, so K and N still need 8 weight tiles of 128 each, which the MXU loads and
    runs whole: its busy time shrinks only with the 1000 rows streamed (97.7%), well above the FLOP ratio."""
    small, big = _matmul(1000), _matmul(1024)
    flop_ratio = (1000 / 1024) ** 3
    assert unit(small, "dma")[1] == pytest.approx(unit(big, "dma")[1] * (1000 / 1024) ** 2, rel=0.01)
    mxu_ratio = unit(small, "mxu")[0] / unit(big, "mxu")[0]
    assert mxu_ratio > flop_ratio + 0.03, (mxu_ratio, flop_ratio)
    assert small.cycles / big.cycles > flop_ratio + 0.02
