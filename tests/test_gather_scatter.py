"""gather and scatter lowered to the modelled hardware (tpusim/compiler/lowering/gather.py, scatter.py,
indexed.py), checked bit for bit against the reference interpreter and against JAX (XLA CPU), with the
instructions no longer fallbacks, and timed against the DMA rule of docs/model.md.

Programs come from JAX (embedding lookups, ``jnp.take``, ``take_along_axis``, ``.at[].add/.set/...``, the
gradient of an embedding lookup, ``lax.gather`` / ``lax.scatter_add`` with seeded random dimension numbers)
and from hand-written HLO for what JAX does not emit (an index vector dimension that is not last, u32 and s8
indices, text-given tiled layouts whose rows are not whole tiles). Out-of-bounds and negative indices are
clamped by gather and drop the whole window in scatter, as XLA does; duplicate indices combine in update
order. Scatter-add values are small integers where JAX is the oracle (any summation order is then exact) and
random floats where the reference is (it adds in update order, as the device does).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate
from tpusim.compiler.lowering.indexed import MAX_SLICES
from tpusim.config import load_config
from tpusim.isa import DmaStart, Space

RNG = np.random.default_rng(20240611)  # reseeded for every test (conftest.py)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint8) if a.dtype.itemsize else a


def run(fn_or_text, *args: np.ndarray, config: str = "tpu_v5e", jax_check: bool = True):  # type: ignore[no-untyped-def]
    """Simulate ``fn`` (lowered by JAX for CPU) or HLO text; assert bit equality with the reference (and with
    JAX for functions) and that no gather/scatter fell back. Returns the simulation result."""
    if isinstance(fn_or_text, str):
        module, want_jax = parse_module(fn_or_text), None
    else:
        module = parse_module(jax.jit(fn_or_text).lower(*args).as_text(dialect="hlo"))
        want_jax = np.asarray(jax.jit(fn_or_text)(*args)) if jax_check else None
    inputs = [np.asarray(a) for a in args]
    result = tpusim.simulate(module, inputs, config=config)
    reference = evaluate(module, inputs)
    for got, want in zip(result.outputs, reference):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(_bits(got), _bits(want)), f"device differs from the reference on {config}"
    if want_jax is not None:
        assert np.array_equal(_bits(np.asarray(result.outputs[0])), _bits(want_jax)), "device differs from JAX"
    fell = [(name, op, why) for _, name, op, why in result.fallbacks if op in ("gather", "scatter")]
    assert not fell, fell
    return result


# --------------------------------------------------------------------------------------------- gather from JAX
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int32, np.int8])
def test_embedding_lookup(dtype: type) -> None:
    table = (RNG.standard_normal((300, 200)) * 50).astype(dtype)
    ids = RNG.integers(-340, 340, (5, 9)).astype(np.int32)  # negative and out-of-bounds ids: clamped
    run(lambda t, i: t[i], table, ids)


def test_embedding_lookup_vmapped_and_take() -> None:
    table = RNG.standard_normal((64, 48)).astype(np.float32)
    ids = RNG.integers(0, 64, (3, 7)).astype(np.int32)
    run(jax.vmap(lambda t, i: t[i], in_axes=(None, 0)), table, ids)
    run(lambda t, i: jnp.take(t, i, axis=1, mode="clip"), table, RNG.integers(-5, 60, (4, 5)).astype(np.int32))


def test_take_along_axis_uses_batching_dims() -> None:
    x = RNG.standard_normal((16, 10)).astype(np.float32)
    idx = RNG.integers(0, 10, (16, 3)).astype(np.int32)
    run(lambda x, i: jnp.take_along_axis(x, i, axis=1), x, idx)


def _random_gather(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, lax.GatherDimensionNumbers, tuple]:
    """A valid lax.gather of random dimension numbers (batching dimensions included), indices partly out of
    bounds and negative."""
    r = int(rng.integers(1, 4))
    dims = [int(d) for d in rng.integers(2, 9, r)]
    order = [int(d) for d in rng.permutation(r)]
    batching = order[:1] if r > 1 and rng.random() < 0.3 else []
    rest = [d for d in order if d not in batching]
    indexed = rest[: int(rng.integers(1, len(rest) + 1))]
    collapsed = sorted(d for d in indexed if rng.random() < 0.6)
    sizes = [1 if d in batching or d in collapsed else int(rng.integers(1, dims[d] + 1)) for d in range(r)]
    batch = [int(b) for b in rng.integers(1, 5, int(rng.integers(0, 3)))]
    index_batching = []
    for d in batching:
        at = int(rng.integers(0, len(batch) + 1))
        batch.insert(at, dims[d])
        index_batching = [a + (a >= at) for a in index_batching] + [at]
    offsets_n = r - len(collapsed) - len(batching)
    out_rank = len(batch) + offsets_n
    offset_dims = tuple(sorted(int(d) for d in rng.choice(out_rank, offsets_n, replace=False)))
    hi = [dims[d] + 3 for d in indexed]
    indices = np.stack([rng.integers(-3, h, batch) for h in hi], axis=-1).astype(np.int32)
    operand = rng.standard_normal(dims).astype(np.float32)
    dn = lax.GatherDimensionNumbers(
        offset_dims=offset_dims,
        collapsed_slice_dims=tuple(collapsed),
        start_index_map=tuple(indexed),
        operand_batching_dims=tuple(batching),
        start_indices_batching_dims=tuple(index_batching),
    )
    return operand, indices, dn, tuple(sizes)


@pytest.mark.parametrize("seed", range(10))
def test_random_gather_dimension_numbers(seed: int) -> None:
    rng = np.random.default_rng(seed)
    operand, indices, dn, sizes = _random_gather(rng)
    mode = lax.GatherScatterMode.PROMISE_IN_BOUNDS  # a plain XLA gather: XLA clamps the starts

    def f(o: jax.Array, i: jax.Array) -> jax.Array:
        return lax.gather(o, i, dn, sizes, mode=mode)

    run(f, operand, indices, config="tpu_v5e" if seed % 2 else "teaching")


# --------------------------------------------------------------------------------------------- gather in HLO text
def _module(body: str, params: list[str]) -> str:
    lines = [f"  p{i} = {s} parameter({i})" for i, s in enumerate(params)]
    return "HloModule m\nENTRY main {\n" + "\n".join(lines) + "\n" + body + "\n}"


def test_index_vector_dim_first_and_gather_nd() -> None:
    # Index vectors along dimension 0 of s32[2,5,3]: 15 slices of f32[1,4,6] of a [9,7,6] operand.
    text = _module(
        "  ROOT g = f32[5,3,4,6] gather(p0, p1), offset_dims={2,3}, collapsed_slice_dims={0}, "
        "start_index_map={0,1}, index_vector_dim=0, slice_sizes={1,4,6}",
        ["f32[9,7,6]", "s32[2,5,3]"],
    )
    run(text, RNG.standard_normal((9, 7, 6)).astype(np.float32), RNG.integers(-4, 12, (2, 5, 3)).astype(np.int32))


@pytest.mark.parametrize("itype", ["u32", "s8", "u16"])
def test_index_types(itype: str) -> None:
    text = _module(
        "  ROOT g = bf16[6,130] gather(p0, p1), offset_dims={1}, collapsed_slice_dims={0}, "
        "start_index_map={0}, index_vector_dim=1, slice_sizes={1,130}",
        ["bf16[37,130]", f"{itype}[6]"],
    )
    dtype = {"u32": np.uint32, "s8": np.int8, "u16": np.uint16}[itype]
    ids = np.array([0, 36, 37, 5, 100, 3], dtype=dtype)
    if itype == "u32":
        ids[4] = 0xFFFFFFF0  # >= 2^31: XLA reads it as a huge index, clamped to the last row
    if itype == "s8":
        ids[1] = -7
    run(text, RNG.standard_normal((37, 130)).astype(ml_dtypes.bfloat16), ids)


def test_text_tiled_layouts_rows_not_whole_tiles() -> None:
    # (8,128) tiles: a row is one sublane of several tiles; the result has odd rows per tile too.
    text = _module(
        "  ROOT g = f32[11,200]{1,0:T(8,128)} gather(p0, p1), offset_dims={1}, collapsed_slice_dims={0}, "
        "start_index_map={0}, index_vector_dim=1, slice_sizes={1,200}",
        ["f32[37,200]{1,0:T(8,128)}", "s32[11]"],
    )
    run(text, RNG.standard_normal((37, 200)).astype(np.float32), RNG.integers(-3, 40, (11,)).astype(np.int32))


@pytest.mark.parametrize(("dtype", "rows"), [(ml_dtypes.bfloat16, 20001), (np.int8, 8003)])
def test_packed_rows_fetch_whole_words(dtype: type, rows: int) -> None:
    """A few rows of a big bf16 / int8 table: the plan fetches the 2 / 4 rows sharing each 32-bit word (whole
    runs) and picks the row by its recorded parity; the last, partial group of rows and clamped ids included."""
    table = (RNG.standard_normal((rows, 256)) * 50).astype(dtype)
    ids = np.concatenate([[rows - 1, rows - 2, rows, -1, 0, 1, 2, 3], RNG.integers(0, rows, 56)]).astype(np.int32)
    result = run(lambda t, i: t[i], table, ids)
    code = [i for s in result.compiled.program.streams for i in s.instructions if i.hlo and "gather" in i.hlo]
    assert sum(type(i).__name__ == "ScalarStore" for i in code) == len(ids)  # one parity per slice
    (pick,) = [i for i in code if isinstance(i, DmaStart) and i.src.space.value == "hbm"][1:2]
    assert pick.src.window is not None and pick.src.dims[0] == np.dtype(np.int32).itemsize // np.dtype(dtype).itemsize


def test_gather_chunks_on_the_teaching_chip() -> None:
    # The teaching chip's 64 KiB VMEM and 1 KiB SMEM force many chunks of slices (and index loads).
    table = RNG.standard_normal((500, 40)).astype(np.float32)
    ids = RNG.integers(0, 500, (300,)).astype(np.int32)
    result = run(lambda t, i: t[i], table, ids, config="teaching")
    gathers = [i for s in result.compiled.program.streams for i in s.instructions if i.hlo and "gather" in i.hlo]
    index_loads = [i for i in gathers if isinstance(i, DmaStart) and i.dst.space.value == "smem"]
    assert len(index_loads) > 2


# --------------------------------------------------------------------------------------------- scatter
@pytest.mark.parametrize("how", ["add", "set", "max", "min", "mul"])
def test_scatter_duplicates_and_dropped_windows(how: str) -> None:
    table = RNG.integers(-4, 5, (40, 24)).astype(np.float32)
    ids = RNG.integers(-45, 45, (6, 5)).astype(np.int32)
    ids[0, :3] = 7  # duplicates
    ups = RNG.integers(-3, 4, (6, 5, 24)).astype(np.float32)
    op = {"add": "add", "set": "set", "max": "max", "min": "min", "mul": "multiply"}[how]
    run(lambda t, i, u: getattr(t.at[i], op)(u), table, ids, ups)


@pytest.mark.parametrize("how", ["add", "mul", "max"])
def test_dropped_windows_leave_every_bit(how: str) -> None:
    # Denormals and -0.0 everywhere, every id out of bounds: the clamped windows land on real rows, whose
    # values must come back bit for bit (VPU arithmetic would flush the denormals).
    table = np.where(RNG.random((12, 130)) < 0.5, np.float32(1e-39), np.float32(-0.0)).astype(np.float32)
    ids = np.array([12, -13, 40, -30], np.int32)  # JAX wraps -1 .. -12 to rows; these stay out of bounds
    ups = RNG.standard_normal((4, 130)).astype(np.float32)
    op = {"add": "add", "mul": "multiply", "max": "max"}[how]
    result = run(lambda t, i, u: getattr(t.at[i], op)(u), table, ids, ups)
    assert np.array_equal(_bits(result.outputs[0]), _bits(table))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int32])
def test_scatter_add_in_update_order(dtype: type) -> None:
    # Random floats with many duplicates: bit-exact only when combined in update order, like the reference.
    table = (RNG.standard_normal((20, 130)) * 100).astype(dtype)
    ids = RNG.integers(-2, 22, (40,)).astype(np.int32)
    ups = (RNG.standard_normal((40, 130)) * 100).astype(dtype)
    run(lambda t, i, u: t.at[i].add(u), table, ids, ups, jax_check=False)


def test_embedding_gradient_is_a_lowered_scatter() -> None:
    table = RNG.standard_normal((50, 32)).astype(np.float32)
    ids = RNG.integers(0, 50, (4, 6)).astype(np.int32)
    result = run(jax.grad(lambda t, i: jnp.sum(jnp.tanh(t[i]))), table, ids, jax_check=False)
    assert {op for _, _, op, _ in result.fallbacks}.isdisjoint({"gather", "scatter"})


def test_scatter_blocks_on_the_teaching_chip() -> None:
    # A 48 KiB operand does not fit half the teaching chip's VMEM: blocks of rows, each visiting every update.
    table = RNG.integers(-9, 9, (300, 40)).astype(np.int32)
    ids = RNG.integers(-5, 305, (60,)).astype(np.int32)
    ups = RNG.integers(-9, 9, (60, 40)).astype(np.int32)
    run(lambda t, i, u: t.at[i].add(u), table, ids, ups, config="teaching")


@pytest.mark.parametrize("seed", range(4))
def test_random_scatter_dimension_numbers(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    operand, indices, gdn, sizes = _random_gather(rng)
    # The scatter that is the gather's transpose: updates have the gathered shape.
    out_shape = jax.eval_shape(lambda o, i: lax.gather(o, i, gdn, sizes), operand, indices).shape
    sdn = lax.ScatterDimensionNumbers(
        update_window_dims=gdn.offset_dims,
        inserted_window_dims=gdn.collapsed_slice_dims,
        scatter_dims_to_operand_dims=gdn.start_index_map,
        operand_batching_dims=gdn.operand_batching_dims,
        scatter_indices_batching_dims=gdn.start_indices_batching_dims,
    )
    updates = rng.integers(-5, 6, out_shape).astype(np.float32)
    mode = lax.GatherScatterMode.PROMISE_IN_BOUNDS  # a plain XLA scatter: it drops out-of-bounds windows
    operand = np.round(operand * 4)

    def f(o: jax.Array, i: jax.Array, u: jax.Array) -> jax.Array:
        return lax.scatter_add(o, i, u, sdn, mode=mode)

    run(f, operand, indices, updates, config="tpu_v5e" if seed % 2 else "teaching")


# --------------------------------------------------------------------------------------------- declines
def _fallback_reasons(text: str, *args: np.ndarray) -> dict[str, str]:
    result = tpusim.simulate(parse_module(text), list(args))
    reference = evaluate(parse_module(text), list(args))
    assert all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(result.outputs, reference))
    return {op: why for _, _, op, why in result.fallbacks}


def test_declined_forms_fall_back_with_a_reason() -> None:
    many = _module(
        "  ROOT g = f32[20000] gather(p0, p1), offset_dims={}, collapsed_slice_dims={0}, start_index_map={0}, "
        "index_vector_dim=1, slice_sizes={1}",
        ["f32[64]", "s32[20000,1]"],
    )
    why = _fallback_reasons(many, RNG.standard_normal(64).astype(np.float32), RNG.integers(0, 64, (20000, 1), np.int32))
    assert f"at most {MAX_SLICES}" in why["gather"]
    affine = (
        "HloModule m\ncomb {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  c = f32[] constant(2)\n"
        "  m = f32[] multiply(a, c)\n  ROOT r = f32[] add(m, b)\n}\nENTRY main {\n  p0 = f32[8,4] parameter(0)\n"
        "  p1 = s32[3,1] parameter(1)\n  p2 = f32[3,4] parameter(2)\n  ROOT s = f32[8,4] scatter(p0, p1, p2), "
        "update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, "
        "to_apply=comb\n}"
    )
    args = (RNG.standard_normal((8, 4)).astype(np.float32), np.array([[1], [1], [9]], np.int32))
    why = _fallback_reasons(affine, *args, RNG.standard_normal((3, 4)).astype(np.float32))
    assert "is not one add/multiply" in why["scatter"]


# --------------------------------------------------------------------------------------------- timing
def test_gather_time_follows_the_dma_rule() -> None:
    """N rows of a table too big for the VMEM plan to pay off: one DMA per row, ``dma.engines`` at a time.

    docs/model.md (HBM and DMA): a transfer holds an engine for ``dma.setup_cycles`` plus its data phase, a
    flow over ``min(hbm.channels, ceil(bytes / hbm.interleave_bytes))`` channels of the chip's HBM bandwidth,
    and completes ``hbm.latency_ns`` later; engines overlap. Model for the gather: ``N * (setup + row_bytes /
    flow_rate) / engines`` (engine bound; the HBM bound ``N * row_bytes / bandwidth`` is lower here) plus one
    latency, plus writing the result (``N * row_bytes`` at full bandwidth, the last chunk not overlapped).
    """
    n, rows, width = 2048, 40000, 512
    table = np.zeros((rows, width), np.float32)
    ids = RNG.integers(0, rows, (n,)).astype(np.int32)
    text = _module(
        f"  ROOT g = f32[{n},{width}] gather(p0, p1), offset_dims={{1}}, collapsed_slice_dims={{0}}, "
        f"start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,{width}}}",
        [f"f32[{rows},{width}]", f"s32[{n}]"],
    )
    result = tpusim.simulate(parse_module(text), [table, ids], timing_only=True)
    assert not result.fallbacks
    cfg = load_config("tpu_v5e")
    row = width * 4
    per_channel = cfg.hbm_bytes_per_cycle / cfg.hbm.channels
    flow = min(cfg.hbm.channels, -(-row // cfg.hbm.interleave_bytes)) * per_channel
    engine_bound = n * (cfg.dma.setup_cycles + row / flow) / cfg.dma.engines
    assert engine_bound > n * row / cfg.hbm_bytes_per_cycle
    model = engine_bound + cfg.cycles(cfg.hbm.latency_ns) + n * row / cfg.hbm_bytes_per_cycle
    measured = result.cycles
    assert 0.8 * model < measured < 1.3 * model, (measured, model)
    # Overlap matters: one DMA at a time would take setup + data + latency per row.
    serial = n * (cfg.dma.setup_cycles + row / flow + cfg.cycles(cfg.hbm.latency_ns))
    assert measured < serial / 10


def test_a_gather_of_too_many_slices_costs_what_its_slices_do() -> None:
    """Past ``MAX_SLICES`` a gather falls back (its slices would be that many straight-line instructions);
    the fallback declared only its bytes, so ``take_along_axis`` of 24,576 slices took 2 us where 16,384
    lowered ones take about 45 and XLA:TPU estimates 88. It now declares the cheapest plan's moves too, so
    the time keeps growing with the slices across the limit."""

    def seconds(rows: int) -> tuple[float, bool]:
        text = (f"HloModule g\nENTRY e {{\n  x = bf16[{rows},384] parameter(0)\n"
                f"  i = s32[{rows},384,1] parameter(1)\n"
                f"  ROOT g = bf16[{rows},384] gather(x, i), offset_dims={{}}, collapsed_slice_dims={{0}},"
                " start_index_map={0}, operand_batching_dims={1}, start_indices_batching_dims={1},"
                " index_vector_dim=2, slice_sizes={1,1}\n}\n")  # fmt: skip
        result = tpusim.simulate(text, config="tpu_v5e", timing_only=True)
        return result.seconds, bool(result.fallbacks)

    (lowered, fell), (past, fell_past) = seconds(MAX_SLICES // 384), seconds(64)
    assert not fell and fell_past and MAX_SLICES < 64 * 384
    assert 0.8 * 64 / (MAX_SLICES // 384) < past / lowered < 2.0 * 64 / (MAX_SLICES // 384), (lowered, past)


def test_a_scatter_into_a_transposed_layout_lays_its_result_out_on_the_vector_unit() -> None:
    """The gradient of a tied embedding (JAX's transpose of ``take``): a scatter-add of 512 rows into
    ``f32[1000,128]``, its operand row-major and its result column-major (the layout the head product's
    gradient is added in). Its result was stored by one DMA whose every element was a run of its own (128,000
    cycles); the vector unit transposes it across lanes into a block in the result's layout that one DMA stores.
    Outputs as the reference interpreter's."""
    text = """HloModule s

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY main {
  t = f32[1000,128]{1,0:T(8,128)} parameter(0)
  i = s32[512,1]{1,0:T(8,128)} parameter(1)
  u = f32[512,128]{1,0:T(8,128)} parameter(2)
  ROOT s = f32[1000,128]{0,1:T(8,128)} scatter(t, i, u), update_window_dims={1}, inserted_window_dims={0},
      scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
}
"""
    module = parse_module(text)
    rng = np.random.default_rng(0)
    inputs = [
        rng.standard_normal((1000, 128)).astype(np.float32),
        rng.integers(0, 1000, (512, 1)).astype(np.int32),
        rng.standard_normal((512, 128)).astype(np.float32),
    ]
    result = tpusim.simulate(module, inputs)
    np.testing.assert_allclose(result.outputs[0], evaluate(module, inputs)[0], rtol=1e-6, atol=1e-6)
    code = result.compiled.program.streams[0].instructions
    stores = [i for i in code if isinstance(i, DmaStart) and i.dst.space is Space.HBM]
    assert stores and all(i.src.shape.layout.minor_to_major == i.dst.shape.layout.minor_to_major for i in stores)
    assert result.cycles < 20_000, result.cycles  # (133,191 cycles with the relayout DMA)
