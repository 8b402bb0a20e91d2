"""Data movement lowered as DMAs (tpusim/compiler/lowering/movement.py), checked end to end against the
reference interpreter on tpu_v5e and on the teaching chip (whose tiny VMEM forces many blocks), plus the
instruction patterns the rules promise: a dynamic-update-slice in place writes only its update, a scan
that stacks its outputs copies nothing else per iteration, a byte-preserving bitcast is one DMA.
"""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from e2e_support import run_checked

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference.io import random_inputs
from tpusim.isa import DmaStart, Jump, VpuCopy
from tpusim.isa.text import print_program

CHIPS = ("tpu_v5e", "teaching")


def module(body: str, params: list[str]) -> str:
    lines = [f"  p{i} = {s} parameter({i})" for i, s in enumerate(params)]
    return "HloModule m\nENTRY main {\n" + "\n".join(lines) + "\n" + body + "\n}"


CASES = {
    "dynamic_slice_constant": module(
        "  a = s32[] constant(3)\n  b = s32[] constant(200)\n"
        "  ROOT r = f32[4,64] dynamic-slice(p0, a, b), dynamic_slice_sizes={4,64}",
        ["f32[16,256]"],
    ),
    "dynamic_update_slice_constant": module(
        "  a = s32[] constant(5)\n  b = s32[] constant(-7)\n  ROOT r = f32[16,256] dynamic-update-slice(p0, p1, a, b)",
        ["f32[16,256]", "f32[4,64]"],
    ),
    "copy_transposing": module("  ROOT r = f32[40,300]{0,1} copy(p0)", ["f32[40,300]"]),
    "copy_retiling": module("  ROOT r = f32[40,300]{1,0:T(2,128)} copy(p0)", ["f32[40,300]{1,0:T(8,128)}"]),
    "bitcast_transposing": module("  ROOT r = f32[300,40]{1,0} bitcast(p0)", ["f32[40,300]{0,1}"]),
    "bitcast_flatten": module("  ROOT r = f32[12000]{0} bitcast(p0)", ["f32[40,300]{1,0}"]),
    "bitcast_type": module("  ROOT r = s32[40,300]{1,0} bitcast(p0)", ["f32[40,300]{1,0}"]),
    "bitcast_split_major": module("  ROOT r = f32[5,8,300]{2,1,0} bitcast(p0)", ["f32[40,300]{1,0}"]),
    "reshape_unit": module("  ROOT r = f32[1,8,128] reshape(p0)", ["f32[8,128]"]),
    "reshape_lanes": module("  ROOT r = f32[20,600] reshape(p0)", ["f32[40,300]"]),
    "reshape_bf16": module("  ROOT r = bf16[2,16,256] reshape(p0)", ["bf16[32,256]"]),
    "reverse_major": module("  ROOT r = f32[6,8,128] reverse(p0), dimensions={0}", ["f32[6,8,128]"]),
    "reverse_rows": module("  ROOT r = f32[40,300] reverse(p0), dimensions={0}", ["f32[40,300]"]),
    "reverse_both": module("  ROOT r = s32[12,20] reverse(p0), dimensions={0,1}", ["s32[12,20]"]),
    "slice": module("  ROOT r = f32[20,100] slice(p0), slice={[3:23], [17:117]}", ["f32[40,300]"]),
    "slice_strided": module("  ROOT r = f32[10,100] slice(p0), slice={[3:23:2], [17:117]}", ["f32[40,300]"]),
    # strides along the lanes and the rows (XLA's module for a[::3, :100:7]), and a packed type
    "slice_strided_lanes": module("  ROOT r = f32[100,15] slice(p0), slice={[0:300:3], [0:100:7]}", ["f32[300,256]"]),
    "slice_strided_bf16": module("  ROOT r = bf16[13,40] slice(p0), slice={[1:50:4], [5:125:3]}", ["bf16[50,130]"]),
    # A fusion reading a VMEM-resident operand (S(1)) in place: a block's window of it must keep the block's
    # rows when a slice or a concatenate inside the fusion windows it again (rows 8.. of both read rows 0..,
    # found by a sweep: jnp.roll over both axes, and XLA's module of a negative pad)
    "resident_pad_then_lane_concatenate": module(
        "  z = f32[] constant(0)\n  p = f32[10,128] pad(p0, z), padding=1_0x0_0\n"
        "  a = f32[10,28] slice(p), slice={[0:10], [100:128]}\n  b = f32[10,100] slice(p), slice={[0:10], [0:100]}\n"
        "  ROOT r = f32[10,128] concatenate(a, b), dimensions={1}",
        ["f32[9,128]"],
    ),
    "resident_operand_sliced_in_a_fusion": (
        "HloModule m\nfc {\n  p = f32[16,256]{1,0:T(8,128)S(1)} parameter(0)\n"
        "  s = f32[15,100]{1,0} slice(p), slice={[1:16], [0:100]}\n  ROOT n = f32[15,100]{1,0} negate(s)\n}\n"
        "ENTRY main {\n  x = f32[16,256]{1,0} parameter(0)\n  c = f32[16,256]{1,0:T(8,128)S(1)} copy(x)\n"
        "  ROOT f = f32[15,100]{1,0} fusion(c), kind=kLoop, calls=fc\n}"
    ),
    # a bitcast that reads its operand in another order than the logical one (XLA's, of an attention output):
    # not a row-major reshape, which a vector fusion computed
    "bitcast_of_another_order_then_copy": module(
        "  b = bf16[2,32,64]{1,2,0:T(8,128)(2,1)} bitcast(p0)\n  ROOT c = bf16[2,32,64]{2,1,0:T(8,128)(2,1)} copy(b)",
        ["bf16[2,4,16,32]{3,2,1,0:T(8,128)(2,1)}"],
    ),
    # XLA:TPU's fused bitcast of bf16[8,256]{1,0} as bf16[8,2,128]{2,0,1} (jnp.cumsum): under (8,128) tiles its
    # bytes hold column block c as tile c, a row-major reshape, not the elements in physical order
    "fused_bitcast_whose_tiles_make_it_a_reshape": (
        "HloModule m\nfc {\n  p = bf16[8,256]{1,0:T(8,128)(2,1)} parameter(0)\n"
        "  ROOT b = bf16[8,2,128]{2,0,1:T(8,128)(2,1)} bitcast(p)\n}\n"
        "ENTRY main {\n  x = bf16[8,256]{1,0:T(8,128)(2,1)} parameter(0)\n"
        "  ROOT f = bf16[8,2,128]{2,0,1:T(8,128)(2,1)} fusion(x), kind=kLoop, calls=fc\n}"
    ),
    "concatenate_lanes": module(
        "  ROOT r = f32[40,500] concatenate(p0, p1), dimensions={1}", ["f32[40,300]", "f32[40,200]"]
    ),
    "concatenate_rows": module(
        "  ROOT r = bf16[70,300] concatenate(p0, p1), dimensions={0}", ["bf16[40,300]", "bf16[30,300]"]
    ),
    "pad": module("  c = f32[] constant(1.5)\n  ROOT r = f32[50,310] pad(p0, c), padding=3_7x-2_12", ["f32[40,300]"]),
    "pad_interior": module(
        "  c = f32[] constant(-1)\n  ROOT r = f32[9,12] pad(p0, c), padding=1_1_1x-1_0_2", ["f32[4,5]"]
    ),
    "pad_value_operand": module("  ROOT r = bf16[48,130] pad(p0, p1), padding=0_8x1_1", ["bf16[40,128]", "bf16[]"]),
    # negative padding cuts every row while the columns have interior padding: the result is all fill (found by
    # fuzzing: the operand's empty bounding box was cut into chunks of 0 rows)
    # a dimension whose low padding lies beyond the result (negative high padding cuts its one element) while
    # another has interior padding: the fill boxes ran past the result (found by a fuzz)
    "pad_low_beyond_a_cut_dimension": module(
        "  c = pred[] constant(true)\n  ROOT r = pred[190,1] pad(p0, c), padding=0_0_2x2_-2_1", ["pred[64,1]"]
    ),
    "pad_all_cut_with_interior": module(
        "  c = f32[] constant(-1)\n  ROOT r = f32[2,5] pad(p0, c), padding=2_-4x0_0_1", ["f32[4,3]"]
    ),
}


def opcounts(result) -> Counter:  # type: ignore[no-untyped-def]
    return Counter(type(i).__name__ for s in result.compiled.program.streams for i in s.instructions)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_reference_without_fallback(name: str, chip: str) -> None:
    m = parse_module(CASES[name])
    checked = run_checked(m, random_inputs(m, 3)[0], config=chip)
    checked.assert_ok(f"{name} on {chip}")
    assert not checked.result.fallbacks, checked.result.fallbacks


def test_rule_choices_follow_contiguous_runs() -> None:
    """A relayout that only changes the tiling keeps long runs: one DMA. A transposing relayout would move
    single elements (runs of 1): on tpu_v5e it goes through VMEM and the XLU instead."""

    def ops(name: str, chip: str = "tpu_v5e") -> Counter:
        m = parse_module(CASES[name])
        return opcounts(run_checked(m, random_inputs(m)[0], config=chip).result)

    assert ops("copy_retiling") == Counter(DmaStart=1, SemWait=1, Halt=1)
    assert ops("copy_transposing")["VpuCopy"] >= 1
    # A module without tiles has its orders chosen by the compiler (JAX's default layout mode): the text's
    # orders give each bitcast its meaning (here a transpose, there a row-major split or a flatten). A split
    # of major dimensions is then laid out where the operand's bytes are, so nothing moves; the transposed
    # result takes its compact layout (the one that pads least, 300 in lanes), so its bytes move through the
    # XLU; a flatten changes the tiling (T(8,128) rows to T(1024) vectors) whatever the order.
    assert ops("bitcast_transposing")["XluTranspose"] == 1
    assert ops("bitcast_split_major") == Counter(Halt=1)
    assert ops("bitcast_flatten")["DmaStart"] == 2
    assert ops("reshape_unit") == Counter(Halt=1)  # no byte moves: the result shares the operand's buffer
    assert ops("reverse_major") == Counter(DmaStart=6, SemWait=1, Halt=1)  # one DMA per slab
    assert ops("reverse_rows")["VpuCopy"] == 1  # rows share tiles: mirrored in VMEM, by one copy at stride -1


def test_a_strided_slice_gathers_in_vmem_at_the_cost_of_its_covering_window() -> None:
    """A strided slice reads the tiles its window covers into VMEM and gathers there (strided loads across
    rows, the XLU across lanes): it costs about what slicing the covering window costs (plus a second HBM
    latency, in and out of VMEM), not a DMA per element (which took 17 us for XLA's ``a[::3, :100:7]`` of
    f32[300,256], 24x the covering window)."""

    def run(body: str) -> tpusim.SimulationResult:
        m = parse_module(module(body, ["f32[300,256]"]))
        return run_checked(m, random_inputs(m)[0], config="tpu_v5e").result

    strided = run("  ROOT r = f32[100,15] slice(p0), slice={[0:300:3], [0:100:7]}")
    window = run("  ROOT r = f32[298,99] slice(p0), slice={[0:298], [0:99]}")
    assert opcounts(strided)["DmaStart"] <= 2 and opcounts(strided)["VpuCopy"] == 1
    assert strided.cycles <= 2 * window.cycles, (strided.cycles, window.cycles)


def test_a_reverse_along_the_lanes_is_one_cross_lane_copy_per_block() -> None:
    """``x[:, ::-1]`` of f32[1024,1024]: one ``vpu.copy`` at stride -1 per block, on the XLU (it took one copy
    per column, 1,024 of them, each reading every row: 99.8 us; XLA estimates 11.4 us)."""
    result = tpusim.simulate(
        module("  ROOT r = f32[1024,1024] reverse(p0), dimensions={1}", ["f32[1024,1024]"]), config="tpu_v5e",
        timing_only=True,
    )  # fmt: skip
    copies = [i for s in result.compiled.program.streams for i in s.instructions if isinstance(i, VpuCopy)]
    assert copies and all(c.strides == (1, -1) for c in copies) and len(copies) <= 16
    assert result.seconds < 20e-6


def test_a_slice_with_strides_wider_than_a_tile_picks_its_elements_by_dma() -> None:
    """``a[::256, ::256]`` of f32[2048,2048]: 64 single elements in distinct tiles, DMA'd side by side (1 us);
    gathering them would read the whole 16 MiB window into VMEM, which fell back at 20.6 us."""
    result = tpusim.simulate(
        module("  ROOT r = f32[8,8] slice(p0), slice={[0:2048:256], [0:2048:256]}", ["f32[2048,2048]"]),
        config="tpu_v5e", timing_only=True,
    )  # fmt: skip
    assert not result.fallbacks and opcounts(result)["VpuCopy"] == 0
    assert result.seconds < 2e-6


def test_a_strided_window_loads_from_a_tile_boundary() -> None:
    """``a[::3, ::-2]`` of bf16[1000,1030] (laid out lanes first): each block's window started at an odd row of
    the packed bf16 pairs, so its DMA moved single elements (449 us); it loads from the tile boundary and the
    copy reads one row in (XLA estimates 2.2 us)."""
    text = module("  ROOT r = bf16[334,515] slice(p0), slice={[0:1000:3], [1:1030:2]}", ["bf16[1000,1030]{0,1}"])
    assert tpusim.simulate(text, config="tpu_v5e", timing_only=True).seconds < 15e-6


def test_interior_padding_scatters_in_vmem() -> None:
    """Padding between elements: the operand is loaded once and one ``vpu.copy`` with ``dst_strides`` places
    it in the filled result (it was one DMA per element: 1,304 DMAs, 15.5 us for f32[20,65]; XLA's
    estimate is 0.08 us)."""
    text = module("  c = f32[] constant(-1)\n  ROOT r = f32[42,196] pad(p0, c), padding=1_2_1x0_3_2", ["f32[20,65]"])
    m = parse_module(text)
    checked = run_checked(m, random_inputs(m)[0], config="tpu_v5e")
    checked.assert_ok("interior padding")
    scatters = [i for s in checked.result.compiled.program.streams for i in s.instructions if isinstance(i, VpuCopy)]
    assert [c.dst_strides for c in scatters] == [(2, 3)]
    assert checked.result.seconds < 2e-6


def test_a_stride_along_tiled_rows_is_gathered_and_one_along_untiled_slabs_is_a_dma_per_slab() -> None:
    """Every other row of f32[2048,1024]: one DMA per row would write rows that share (8,128) tiles, one after
    the other (1024 DMAs, each waiting for the one before); gathered in VMEM blocks it streams at about the
    speed of an elementwise op over the whole array. Every other slab of f32[64,8,128]: each index is whole
    tiles, one DMA each."""

    def run(body: str, param: str) -> tpusim.SimulationResult:
        return tpusim.simulate(module(body, [param]), config="tpu_v5e", timing_only=True)

    rows = run(
        "  s = f32[1024,1024] slice(p0), slice={[0:2048:2], [0:1024]}\n  ROOT r = f32[1024,1024] negate(s)",
        "f32[2048,1024]",
    )  # (the slice's result in VMEM, as tpusim and XLA place it before the negate)
    whole = run("  ROOT r = f32[2048,1024] negate(p0)", "f32[2048,1024]")  # reads as much, writes twice that
    assert opcounts(rows)["VpuCopy"] >= 1 and opcounts(rows)["DmaStart"] < 100, opcounts(rows)
    assert rows.cycles <= 1.25 * whole.cycles, (rows.cycles, whole.cycles)
    slabs = run("  ROOT r = f32[32,8,128] slice(p0), slice={[0:64:2], [0:8], [0:128]}", "f32[64,8,128]")
    assert opcounts(slabs) == Counter(DmaStart=32, SemWait=1, Halt=1)


@pytest.mark.parametrize("etype", ["bf16", "s8"])
def test_a_window_starting_inside_a_packed_tile_loads_whole_tiles(etype: str) -> None:
    """``x[1:]`` of a packed bf16 or int8 array: its window starts inside the tiles' packed rows, so a DMA of
    it moved single elements (244 us for bf16[1024,1024], where ``x[2:]`` takes 5.5 us). The blocks load
    whole tiles and the vector unit reads each block one row in."""

    def text(n: int, start: int) -> str:
        return module(
            f"  ROOT r = {etype}[{n - start},{n}] slice(p0), slice={{[{start}:{n}], [0:{n}]}}", [f"{etype}[{n},{n}]"]
        )

    m = parse_module(text(200, 1))
    run_checked(m, random_inputs(m)[0], config="tpu_v5e").assert_ok("x[1:]")
    shifted, aligned = (tpusim.simulate(text(1024, k), config="tpu_v5e", timing_only=True).cycles for k in (1, 32))
    assert shifted <= 1.5 * aligned, (shifted, aligned)  # (was 53x for s8, 44x for bf16)


DYNAMIC = module(
    "  ds = f32[4,64] dynamic-slice(p0, p2, p3), dynamic_slice_sizes={4,64}\n"
    "  dus = f32[16,256] dynamic-update-slice(p0, p1, p3, p2)\n"
    "  ROOT t = (f32[4,64], f32[16,256]) tuple(ds, dus)",
    ["f32[16,256]", "f32[4,64]", "s32[]", "s32[]"],
)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("i,j", [(3, 100), (-5, 250), (15, -1), (2**31 - 1, 0)])
def test_dynamic_offsets_from_registers_clamp_like_xla(chip: str, i: int, j: int) -> None:
    m = parse_module(DYNAMIC)
    x, u = random_inputs(m, 1)[0][:2]
    checked = run_checked(m, [x, u, np.int32(i), np.int32(j)], config=chip)
    checked.assert_ok(f"offsets ({i}, {j})")
    assert not checked.result.fallbacks
    # p0 is an entry parameter, so the update cannot be in place: copy, then the update window.
    dmas = [i for i in checked.result.compiled.program.streams[0].instructions if isinstance(i, DmaStart)]
    moved = [(d.dst.dims, d.dst.window is not None) for d in dmas if d.hlo == "dus" and d.dst.space.value == "hbm"]
    assert moved == [((16, 256), False), ((4, 64), True)]


def test_unsigned_offsets_beyond_2_31_clamp_to_the_end() -> None:
    text = module(
        "  ROOT r = f32[4,64] dynamic-slice(p0, p1, p2), dynamic_slice_sizes={4,64}", ["f32[16,256]", "u32[]", "u32[]"]
    )
    m = parse_module(text)
    x = random_inputs(m, 2)[0][0]
    checked = run_checked(m, [x, np.uint32(2**31 + 5), np.uint32(7)], config="teaching")
    checked.assert_ok("u32 offsets")
    np.testing.assert_array_equal(checked.result.outputs[0], x[12:16, 7:71])


def test_dynamic_update_slice_in_place_writes_only_the_update() -> None:
    # The operand is a temporary that dies at the update: buffer assignment puts the result in its buffer.
    text = module(
        "  t = f32[16,256] add(p0, p0)\n  a = s32[] constant(8)\n  b = s32[] constant(128)\n"
        "  ROOT r = f32[16,256] dynamic-update-slice(t, p1, a, b)",
        ["f32[16,256]", "f32[4,64]"],
    )
    m = parse_module(text)
    checked = run_checked(m, random_inputs(m)[0], config="tpu_v5e")
    checked.assert_ok("in-place update")
    compiled = checked.result.compiled
    assert compiled.buffers.buffer("main", "t").id == compiled.buffers.buffer("main", "r").id
    dus = [i for i in compiled.program.streams[0].instructions if isinstance(i, DmaStart) and i.hlo == "r"]
    assert len(dus) == 1 and dus[0].dst.dims == (4, 64)


def _scan(xs: jax.Array) -> tuple[jax.Array, jax.Array]:
    def body(c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        c = c * 0.5 + x
        return c, c * 2.0

    return jax.lax.scan(body, jnp.zeros(xs.shape[1:], xs.dtype), xs)


@pytest.mark.parametrize("chip", CHIPS)
def test_scan_stacking_outputs_copies_only_the_update(chip: str) -> None:
    from tpusim import simulate_jax

    xs = np.random.default_rng(0).standard_normal((6, 8, 128)).astype(np.float32)
    result = simulate_jax(_scan, xs, config=chip)
    want = jax.jit(_scan)(xs)
    for got, ref in zip(result.outputs, jax.tree.leaves(want)):
        np.testing.assert_allclose(got, np.asarray(ref), rtol=1e-6, atol=1e-6)
    assert not result.fallbacks
    stream = result.compiled.program.streams[0]
    labels = dict(stream.labels)
    top = next(i for n, i in labels.items() if n.endswith(".cond"))
    end = max(i for i, ins in enumerate(stream.instructions) if isinstance(ins, Jump))
    # the stacked outputs f32[6,8,128] are loop state (in VMEM on one core, copied out after the loop): each
    # iteration writes its one row of them
    writes = [
        ins
        for ins in stream.instructions[top:end]
        if isinstance(ins, DmaStart) and ins.dst.shape.dimensions == (6, 8, 128)
    ]
    assert len(writes) == 1, "\n".join(map(str, writes))
    assert writes[0].dst.window is not None and writes[0].dst.dims == (1, 8, 128)
    big = [ins for ins in stream.instructions[top:end] if isinstance(ins, DmaStart) and ins.src.dims == (6, 8, 128)]
    assert not big, "a full copy of the stacked array runs every iteration"


def test_program_text_round_trips_dynamic_windows() -> None:
    """The DMA windows with register offsets and clamping print in the ISA text form."""
    m = parse_module(DYNAMIC)
    x, u = random_inputs(m)[0][:2]
    checked = run_checked(m, [x, u, np.int32(1), np.int32(2)], config="teaching")
    text = print_program(checked.result.compiled.program)
    assert "clamp]" in text
    assert not any(isinstance(i, VpuCopy) for i in checked.result.compiled.program.streams[0].instructions)


@pytest.mark.parametrize("chip", CHIPS)
def test_jax_data_movement(chip: str) -> None:
    """JAX's TPU lowering of flips, pads, concatenations, a traced dynamic slice and update, against JAX."""
    from tpusim import simulate_jax

    def f(x: jax.Array, i: jax.Array) -> tuple[jax.Array, ...]:
        window = jax.lax.dynamic_slice(x, (i, 0), (4, 128))
        return (
            jnp.flip(x, 0),
            jnp.flip(x, 1),
            jnp.pad(x, ((1, 2), (3, 4)), constant_values=-1.0),
            jnp.concatenate([x, x[:, :64]], axis=1),
            window,
            jax.lax.dynamic_update_slice(x, window * 2.0, (i + 3, 0)),
            jnp.roll(x[:21], (1, 1), axis=(0, 1)),  # (a row count that is not a whole number of blocks)
        )

    x = np.random.default_rng(1).standard_normal((24, 128)).astype(np.float32)
    i = np.int32(17)
    result = simulate_jax(f, x, i, config=chip)
    assert not result.fallbacks, result.fallbacks
    for got, want in zip(result.outputs, jax.jit(f)(x, i)):
        np.testing.assert_array_equal(got, np.asarray(want))


def test_a_reshape_merging_dimensions_above_the_tiles_costs_the_same_per_byte_at_any_size() -> None:
    """f32[B,512,1024] -> f32[B*512,1024] moves no byte at any B (issue 19: above 4 M elements the layouts
    were not compared and B = 16 paid a 32 MiB copy, 2x the cycles per byte of B = 8)."""
    per_byte = []
    for batch in (8, 16):
        rows = batch * 512
        text = (
            f"HloModule m\nENTRY main {{\n  p = f32[{batch},512,1024] parameter(0)\n"
            f"  r = f32[{rows},1024] reshape(p)\n  c = f32[] constant(2)\n"
            f"  b = f32[{rows},1024] broadcast(c), dimensions={{}}\n  ROOT m = f32[{rows},1024] multiply(r, b)\n}}"
        )
        result = tpusim.simulate(text, config="tpu_v5e", timing_only=True)
        per_byte.append(result.cycles / (rows * 1024 * 4))
    assert per_byte[1] == pytest.approx(per_byte[0], rel=0.02)


def test_a_relayout_moving_the_lanes_to_the_top_blocks_along_another_dimension() -> None:
    """``bf16[64,32,16,48]`` from ``{0,3,2,1}`` (the 64 in the lanes) to ``{3,1,2,0}`` (the 64 most major): blocks
    of a few rows of the output's top dimension each loaded the whole lane tiles from the first row (the
    load starts at the tile boundary), growing prefixes of the input: 84 MB of DMA for a 3 MB array, 147 us.
    The blocks now cut a dimension that is no input's lanes: the DMAs move at most 4x the array."""
    text = (
        "HloModule r\nENTRY main {\n  a = bf16[64,32,16,48]{0,3,2,1} parameter(0)\n"
        "  ROOT c = bf16[64,32,16,48]{3,1,2,0} copy(a)\n}"
    )
    m = parse_module(text)
    checked = run_checked(m, random_inputs(m, 2)[0], config="tpu_v5e")
    checked.assert_ok("relayout")
    stream = checked.result.compiled.program.streams[0].instructions
    moved = sum(i.src.element_count for i in stream if isinstance(i, DmaStart))  # (window elements)
    assert moved <= 4 * 64 * 32 * 16 * 48, moved


def test_a_kv_cache_with_the_sequence_in_lanes_takes_its_new_position_through_the_vector_unit() -> None:
    """A decode step writes one position of a KV cache stored ``{1,3,2,0}`` (the sequence in lanes, as
    XLA:TPU lays out such caches): as a DMA every element is a run of its own (2,048 runs, 2,112 cycles for
    4 KiB); the vector unit crosses lanes on an XLU and stores the touched tiles instead (about 270 cycles).
    Outputs as the reference interpreter's."""
    text = """HloModule kv
ENTRY main {
  c = bf16[4,256,8,64]{1,3,2,0:T(8,128)(2,1)} parameter(0)
  u = bf16[4,1,8,64]{3,2,1,0:T(8,128)(2,1)} parameter(1)
  i = s32[] parameter(2)
  z = s32[] constant(0)
  n = bf16[4,256,8,64]{1,3,2,0:T(8,128)(2,1)S(1)} negate(c)
  v = bf16[4,1,8,64]{3,2,1,0:T(8,128)(2,1)S(1)} negate(u)
  d = bf16[4,256,8,64]{1,3,2,0:T(8,128)(2,1)S(1)} dynamic-update-slice(n, v, z, i, z, z)
  ROOT r = bf16[4,256,8,64]{1,3,2,0:T(8,128)(2,1)} negate(d)
}
"""
    mod = parse_module(text)
    inputs = list(random_inputs(mod)[0])
    inputs[2] = np.int32(77)
    checked = run_checked(mod, inputs, config="tpu_v5e")
    checked.assert_ok("kv cache update")
    result = checked.result
    code = result.compiled.program.streams[0].instructions
    assert [type(i) for i in code if i.hlo == "d" and isinstance(i, (DmaStart, VpuCopy))] == [VpuCopy]
    assert not [i for i in code if isinstance(i, DmaStart) and i.hlo == "d"]
    trace = result.trace
    span = [int(e - s) for s, e, h in zip(trace.start, trace.end, trace.hlo) if h == "d"]
    assert max(span) < 1000, span  # (2,112 cycles as a DMA)


def test_a_text_bitcast_of_an_array_to_a_scalar_takes_its_first_bytes() -> None:
    """XLA:TPU's loop over a vmapped dynamic slice bitcasts the tiled s32[1,2] of a row's two indices to the
    s32[] index of its first column; tpusim ran it as a fallback kernel ('changes the byte size': the
    scalar is an SMEM word of its own)."""
    text = """
HloModule first, is_scheduled=true
ENTRY main (x: f32[16,300], ix: s32[1,2]) -> f32[1,10] {
  x = f32[16,300]{1,0:T(8,128)} parameter(0)
  ix = s32[1,2]{1,0:T(1,128)S(1)} parameter(1)
  row = s32[]{:T(128)S(1)} bitcast(ix)
  zero = s32[]{:T(128)} constant(0)
  ROOT y = f32[1,10]{1,0:T(1,128)} dynamic-slice(x, row, zero), dynamic_slice_sizes={1,10}
}
"""
    x = np.arange(16 * 300, dtype=np.float32).reshape(16, 300)
    ix = np.array([[7, 3]], np.int32)
    result = tpusim.simulate(text, [x, ix], config="tpu_v5e")
    np.testing.assert_array_equal(result.outputs[0], x[7:8, :10])
    assert not result.fallbacks


@pytest.mark.parametrize(
    ("shape", "source", "target"),
    [
        ("f32[2048,2048]", "{1,0:T(8,128)}", "{0,1:T(8,128)}"),
        ("f32[256,32,128]", "{2,1,0:T(8,128)}", "{0,1,2:T(8,128)}"),
    ],
)
def test_a_transposing_copy_moves_each_byte_once(shape: str, source: str, target: str) -> None:
    """A timing-outlier hunt against XLA's per-kernel estimates: relayouts were cut into blocks of a few of their
    input's lanes (16 of 128 for a 2-D transpose, 2 of 128 for cumsum's 3-D one), so each block's load read
    from its lane tile's start and each block was charged every register it touched: the 2-D transpose read
    the array 4.5x over, the 3-D one moved it 17x through the XLUs (600x XLA's estimate for a 16 MiB one).
    Blocks are now whole tiles of the inputs too: each byte is read, crossed and written once, at the HBM
    floor."""
    text = f"HloModule t\nENTRY main {{\n  x = {shape}{source} parameter(0)\n  ROOT c = {shape}{target} copy(x)\n}}\n"
    result = tpusim.simulate(text, config="tpu_v5e", timing_only=True)
    nbytes = result.compiled.source.entry_computation.parameters[0].shape.byte_size
    trace, moved = result.trace, {"dma": 0, "xlu": 0}
    for i in range(len(trace)):
        unit = trace.units[int(trace.unit[i])].split(".")[-1]
        if unit[:3] in moved:
            moved[unit[:3]] += int(trace.bytes[i])
    assert moved == {"dma": 2 * nbytes, "xlu": 2 * nbytes}  # (in and out, once each)
    floor = 2 * nbytes / result.compiled.config.hbm.bandwidth_bytes_per_s
    assert floor <= result.seconds <= 1.25 * floor
