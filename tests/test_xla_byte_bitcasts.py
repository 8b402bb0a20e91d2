"""XLA:TPU's compiled modules read arrays' bytes under other layouts, and tpusim must read them the same way.

* A ``bitcast`` between two tiled layouts means its operand's bytes, whatever the element orders say: XLA's
  ``jnp.cumsum`` of bf16[16,1024] bitcasts ``{1,0:T(8,128)(2,1)}`` to ``bf16[2,8,8,128]{3,1,2,0:T(8,128)(2,1)}``
  (column block ``c`` is tile ``c``: the same bytes). tpusim took the tiles for its tiling rules' and moved
  the elements into the new order instead (a wrong answer, error 2.05, in 25.7 us of 2-byte DMAs); such a
  bitcast now shares its operand's buffer.
* Inside a fusion too: XLA's embedding lookup ``t[i]`` wraps its s32[8,256] indices in a fusion whose root
  bitcasts ``{1,0:T(8,128)}`` to ``s32[1,2,8,128]{3,2,1,0:T(8,128)}`` (index column block ``b`` is tile ``b``).
  tpusim's kernel took it for a row-major reshape and looked rows up in a shuffled order (a wrong answer with
  exit code 0, error 6.96); such a bitcast does not fuse.
* A bitcast may change only the memory space: XLA prefetches a matmul's weight into VMEM and its fusion
  bitcasts it back to the default space. Dissolving the fusion made that a copy of the whole weight out of
  VMEM (the 90 MB weight of ``x @ w``, bf16[32,4096] by [4096,11008], then streamed in again: 334 us for
  110 us of HBM traffic); such a copy inside a fusion moves nothing and is dropped.
* A ``ConcatBitcast`` may join byte views: the v6e module of a bf16 MLP's SGD step prefetches a weight as two
  ``s8`` halves of its bytes and joins them into the bf16 weight. tpusim stopped with a bare ``ValueError``.

The modules of ``tests/data/xla_byte_bitcasts/`` (``scripts/make_xla_byte_bitcasts.py``) are XLA:TPU's
compilations, stored so these tests need no libtpu.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import tpusim
from tpusim.compiler.buffer_assignment import leaf_paths
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate

DATA = Path(__file__).parent / "data" / "xla_byte_bitcasts"
sys.path.insert(0, str(Path(__file__).parent.parent / "scripts"))
from make_xla_byte_bitcasts import SGD_SHAPES, sgd_step  # noqa: E402


def _module(name: str, chip: str) -> tpusim.compiler.hlo.ir.Module:
    return parse_module(gzip.decompress((DATA / name / f"{chip}.hlo.gz").read_bytes()).decode())


@pytest.mark.parametrize("chip", ["v5e", "v6e"])
@pytest.mark.parametrize("name", ["cumsum_bf16", "embed_lookup_f32"])
def test_a_bitcast_between_tiled_layouts_reads_the_bytes_where_they_are(name: str, chip: str) -> None:
    """JAX's outputs exactly, on the device and in the reference; the bitcast runs no instruction."""
    module = _module(name, chip)
    with np.load(DATA / name / "data.npz") as data:
        stored = [data[f"in{k}"] for k in range(sum(f.startswith("in") for f in data.files))]
        want = data["out0"]
    bf16 = name.endswith("_bf16")  # (.npz holds bf16 inputs as their f32 values)
    inputs = [a.astype(ml_dtypes.bfloat16) if bf16 and a.dtype == np.float32 else a for a in stored]
    result = tpusim.simulate(module, inputs, config=f"tpu_{chip}")
    assert result.fallbacks == ()
    for what, got in (("device", result.outputs[0]), ("reference", evaluate(module, inputs)[0])):
        np.testing.assert_array_equal(np.asarray(got).astype(np.float32), want, err_msg=what)
    bitcasts = {i.name for c in result.compiled.module.computations for i in c.instructions if i.opcode == "bitcast"}
    assert not {i.hlo for s in result.compiled.program.streams for i in s.instructions} & bitcasts


def test_a_concat_bitcast_of_byte_views_is_the_weight() -> None:
    """The SGD step's v6e module: the reference interpreter gives JAX's updated parameters (the weight joined
    from its two byte halves), and the device runs it, timing-only, in a time between the HBM floor of its
    parameters and results and 1.5x XLA's estimate (a sanity bound; the corpus tables of docs/model.md hold
    tpusim to XLA's two models). (It was 0.5x-1.5x of XLA's ``optimal_seconds``, which is 1.6x the sum of
    XLA's own per-kernel estimates here; tpusim's relayout copies cut in whole tiles took it to 0.48x.)"""
    module = _module("sgd_step_bf16", "v6e")
    rng = np.random.default_rng(1)
    args = [(rng.standard_normal(s) * 0.05).astype(ml_dtypes.bfloat16) for s in SGD_SHAPES]
    want = jax.jit(sgd_step)(*[jnp.asarray(a) for a in args])
    got = evaluate(module, args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=0.02, atol=2e-3)
    result = tpusim.simulate(module, config="tpu_v6e", timing_only=True)
    assert result.fallbacks == ()
    xla = json.loads((DATA / "sgd_step_bf16" / "v6e.json").read_text())["optimal_seconds"]
    cfg = result.compiled.config
    moved = sum(p.shape.byte_size for p in module.entry_computation.parameters)
    moved += sum(leaf.byte_size for _, leaf in leaf_paths(module.entry_computation.root_instruction.shape))
    floor = moved / cfg.hbm.bandwidth_bytes_per_s
    assert floor <= result.seconds <= 1.5 * xla, (floor, result.seconds, xla)


def test_a_fused_bitcast_out_of_vmem_moves_nothing() -> None:
    """XLA's v5e module of ``x @ w`` (bf16[32,4096] by [4096,11008]), timing-only: no instruction copies the
    weight, and the program takes at most 1.7x the weight's bytes over HBM bandwidth (the chip file's
    published figure; it read and wrote the weight three times before)."""
    module = _module("matmul_prefetched_bf16", "v5e")
    result = tpusim.simulate(module, config="tpu_v5e", timing_only=True)
    assert result.fallbacks == ()
    assert not [i for i in result.compiled.module.entry_computation.instructions if i.opcode == "copy"]
    floor = 4096 * 11008 * 2 / result.compiled.config.hbm.bandwidth_bytes_per_s
    assert result.seconds <= 1.7 * floor, (result.seconds, floor)
