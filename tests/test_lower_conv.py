"""``convolution`` on the MXUs (tpusim/compiler/lowering/conv.py) end to end: JAX programs (conv_general_dilated
in many configurations, a small NHWC conv net forward and its jax.grad) and hand-written HLO, simulated on
tpu_v5e and on the teaching chip (8x8 MXU, 64 KiB VMEM: many blocks, partial tiles), compared with the
reference interpreter; the convolutions must lower (no fallback). Also: the MXUs of a large convolution are
busy close to its flops over the MXU peak, and what declines says why.
"""

from __future__ import annotations

from collections.abc import Callable
from math import ceil
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from e2e_support import run_checked
from jax_oracle import convolution_text

import tpusim
from tpusim.compiler.dot_dims import convolution_dims
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.ir import Module
from tpusim.compiler.hlo.reference.io import random_inputs
from tpusim.compiler.options import CompileOptions
from tpusim.isa import MxuMatmul

CHIPS = ("teaching", "tpu_v5e")
HIGHEST = CompileOptions(matmul_precision="highest")
NHWC = ("NHWC", "HWIO", "NHWC")


def conv(
    x: Any,
    w: Any,
    strides: tuple[int, ...] = (1, 1),
    padding: Any = "SAME",
    lhs: tuple[int, ...] | None = None,
    rhs: tuple[int, ...] | None = None,
    dn: tuple[str, str, str] = NHWC,
    fg: int = 1,
    bg: int = 1,
    out: Any = None,
) -> Any:
    return jax.lax.conv_general_dilated(
        x,
        w,
        strides,
        padding,
        lhs_dilation=lhs,
        rhs_dilation=rhs,
        dimension_numbers=dn,
        feature_group_count=fg,
        batch_group_count=bg,
        preferred_element_type=out,
    )


def data(shape: tuple[int, ...], dtype: Any = np.float32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + len(shape) * 7 + sum(shape))
    if np.dtype(dtype).kind == "i":
        return rng.integers(-8, 8, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


BF16 = ml_dtypes.bfloat16
X = (2, 8, 8, 3)
W = (3, 3, 3, 8)
# name -> (function, argument shapes, argument dtype)
CASES: dict[str, tuple[Callable[..., Any], tuple[tuple[int, ...], ...], Any]] = {
    "same_stride1": (lambda x, w: conv(x, w), (X, W), np.float32),
    "valid_stride1": (lambda x, w: conv(x, w, padding="VALID"), (X, W), np.float32),
    "same_stride2": (lambda x, w: conv(x, w, (2, 2)), (X, W), np.float32),
    "valid_stride2": (lambda x, w: conv(x, w, (2, 2), "VALID"), (X, W), np.float32),
    "rhs_dilation": (lambda x, w: conv(x, w, rhs=(2, 2)), (X, W), np.float32),
    "lhs_dilation": (lambda x, w: conv(x, w, lhs=(2, 2), padding=((2, 1), (2, 1))), (X, W), np.float32),
    "stride3_lhs2_window5": (
        lambda x, w: conv(x, w, (3, 2), lhs=(2, 3), padding=((1, 2), (2, 0))),
        ((1, 9, 7, 5), (5, 5, 5, 6)),
        np.float32,
    ),
    "negative_padding": (
        lambda x, w: conv(x, w, padding=((-1, 2), (1, -2))),
        ((1, 10, 9, 5), (3, 3, 5, 6)),
        np.float32,
    ),
    "nchw_oihw": (
        lambda x, w: conv(x, w, (2, 1), dn=("NCHW", "OIHW", "NCHW")),
        ((2, 3, 9, 8), (8, 3, 3, 3)),
        np.float32,
    ),
    "depthwise": (lambda x, w: conv(x, w, fg=16), ((2, 9, 9, 16), (3, 3, 1, 16)), np.float32),
    "depthwise_stride2_multiplier2": (lambda x, w: conv(x, w, (2, 2), fg=8), ((2, 9, 9, 8), (3, 3, 1, 16)), np.float32),
    "grouped": (lambda x, w: conv(x, w, fg=2), ((2, 6, 6, 8), (3, 3, 4, 8)), np.float32),
    "batch_groups": (lambda x, w: conv(x, w, bg=2), ((4, 6, 6, 4), (3, 3, 4, 8)), np.float32),
    "conv1d": (
        lambda x, w: conv(x, w, (1,), dn=("NWC", "WIO", "NWC")),
        ((2, 16, 5), (3, 5, 4)),
        np.float32,
    ),
    "conv3d": (
        lambda x, w: conv(x, w, (1, 2, 1), dn=("NDHWC", "DHWIO", "NDHWC")),
        ((2, 6, 5, 4, 3), (3, 2, 3, 3, 4)),
        np.float32,
    ),
    "bf16": (lambda x, w: conv(x, w), (X, W), BF16),
    "bf16_to_f32": (lambda x, w: conv(x, w, (2, 2), out=jnp.float32), ((2, 9, 9, 16), (3, 3, 16, 8)), BF16),
    "int8_to_s32": (lambda x, w: conv(x, w, out=jnp.int32), (X, W), np.int8),
    "many_blocks_with_edges": (lambda x, w: conv(x, w), ((1, 20, 19, 5), (3, 3, 5, 6)), np.float32),
}


def jax_module(fn: Callable[..., Any], *args: Any) -> Module:
    return parse_module(jax.jit(fn).lower(*args).as_text(dialect="hlo"))


def convolutions(m: Module) -> int:
    return sum(i.opcode == "convolution" for c in m.computations for i in c.instructions)


def check(m: Module, args: list[Any], chip: str, options: CompileOptions | None = HIGHEST) -> tpusim.SimulationResult:
    checked = run_checked(m, args, config=chip, options=options)
    checked.assert_ok(f"on {chip}")
    fell = [f for f in checked.result.fallbacks if f[2] == "convolution"]
    assert not fell, fell
    return checked.result


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_reference(name: str, chip: str) -> None:
    fn, shapes, dtype = CASES[name]
    args = [data(s, dtype, i) for i, s in enumerate(shapes)]
    m = jax_module(fn, *args)
    assert convolutions(m) == 1
    check(m, args, chip)


HLO_CASES = {
    # window reversal as XLA prints it, with an asymmetric window and padding
    "window_reversal": (
        "f32[2,7,7,3]",
        "f32[3,2,3,4]",
        "f32[2,7,6,4] convolution(x, w), window={size=3x2 pad=1_1x0_0 rhs_reversal=1x0}, dim_labels=b01f_01io->b01f",
    ),
    # every label in an unusual position, stride, padding and window dilation at once
    "scrambled_dim_labels": (
        "f32[4,7,3,9]",
        "f32[5,3,4,3]",
        "f32[3,5,2,3] convolution(x, w), window={size=3x3 stride=3x2 pad=0_1x1_0 rhs_dilate=1x2}, "
        "dim_labels=f0b1_o1i0->1f0b",
    ),
    # no spatial dimensions: a matmul written as a convolution
    "no_spatial": ("f32[16,24]", "f32[24,40]", "f32[16,40] convolution(x, w), dim_labels=bf_io->bf"),
    # the batch stored below the spatial dimensions (XLA:TPU's layout for NHWC convolutions), with a stride,
    # a batch that does not fill a tile's sublanes, and base dilation (phases)
    "batch_below_spatial": (
        "f32[3,9,7,5]{3,0,2,1}",
        "f32[3,3,5,4]",
        "f32[3,5,13,4]{3,0,2,1} convolution(x, w), window={size=3x3 stride=2x1 pad=1_1x1_1 lhs_dilate=1x2}, "
        "dim_labels=b01f_01io->b01f",
    ),
}


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("name", sorted(HLO_CASES))
def test_hlo_text_cases(name: str, chip: str) -> None:
    x, w, body = HLO_CASES[name]
    m = parse_module(
        f"HloModule c\nENTRY main {{\n  x = {x} parameter(0)\n  w = {w} parameter(1)\n  ROOT y = {body}\n}}"
    )
    shapes = [m.entry_computation.parameters[i].array_shape.dimensions for i in (0, 1)]
    check(m, [data(s, np.float32, i) for i, s in enumerate(shapes)], chip)


def conv_net(x: Any, w1: Any, w2: Any, w3: Any) -> Any:
    """A flax-like NHWC net: 3x3 conv, relu, strided 3x3 conv, relu, depthwise 3x3 conv, mean."""
    y = jax.nn.relu(conv(x, w1))
    y = jax.nn.relu(conv(y, w2, (2, 2)))
    y = conv(y, w3, fg=y.shape[-1])
    return jnp.mean(y**2)


NET_SHAPES = ((2, 8, 8, 3), (3, 3, 3, 8), (3, 3, 8, 16), (3, 3, 1, 16))


@pytest.mark.parametrize("chip", CHIPS)
def test_conv_net_forward_and_gradient(chip: str) -> None:
    """Forward and jax.grad with respect to the input and every kernel: the input-gradient convolutions (base
    dilation for the strided layer, flipped kernels), the weight-gradient convolutions (batch and feature
    swapped, window dilation for the strided layer, batch groups for the depthwise layer) all lower."""
    args = [data(s, np.float32, i) * (0.3 if i else 1.0) for i, s in enumerate(NET_SHAPES)]
    forward = jax_module(conv_net, *args)
    backward = jax_module(jax.grad(conv_net, argnums=(0, 1, 2, 3)), *args)
    assert convolutions(forward) == 3
    assert convolutions(backward) >= 8
    for m in (forward, backward):
        check(m, args, chip)


@pytest.mark.parametrize("chip", CHIPS)
def test_default_precision_is_one_bf16_pass(chip: str) -> None:
    """f32 operands at DEFAULT take one bf16 pass: the result matches the reference run on operands rounded to
    bf16 (tpusim.check.emulate_one_pass) up to f32 summation order."""
    fn, shapes, dtype = CASES["same_stride2"]
    args = [data(s, dtype, i) for i, s in enumerate(shapes)]
    checked = run_checked(jax_module(fn, *args), args, config=chip)
    assert checked.precision == "bf16"
    checked.assert_ok("one pass")


MIXED_CONV = """HloModule mixed
ENTRY e {
  x = bf16[2,8,8,64] parameter(0)
  w = f32[3,3,64,64] parameter(1)
  ROOT c = f32[2,8,8,64] convolution(x, w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}
"""


def test_a_bf16_input_does_not_make_an_f32_kernel_exact() -> None:
    """XLA:TPU converts an f32 convolution's input to bf16 itself and keeps the kernel f32 (its module of
    ``conv(x, w) + b`` in f32); at DEFAULT the MXU takes one bf16 pass of the kernel. The check compares with
    the one-pass emulation, not with exact f32 products under the f32-exact bound (a false MISMATCH, error
    2e-3 against 1e-4, on XLA's modules of four f32 convolutions)."""
    m = parse_module(MIXED_CONV)
    args = [data((2, 8, 8, 64), BF16), data((3, 3, 64, 64), np.float32, 1)]
    checked = run_checked(m, args)
    assert checked.precision == "bf16"
    checked.assert_ok("one pass of the f32 kernel")


def test_mxu_busy_close_to_flops_over_peak() -> None:
    """A bf16 3x3 convolution with 128 input and output features on tpu_v5e (4 MXUs of 128x128).

    Its MXU work is ``2 * N*OH*OW * 9 * 128 * 128`` flops (padding taps included: the MXU multiplies the
    zeros); at ``2 * 128 * 128`` flops per MXU-cycle that is ``ideal`` cycles over the four MXUs. Asserted:
    the rows the matmuls stream add up to exactly that work (no wasted rows or tiles); every matmul streams
    at least 128 rows, so the 128-cycle weight loads hide behind the previous tile; and each MXU is busy
    (union of its instructions' [start, end)) for at most ``1.3 x ideal / 4``: the excess is one result
    drain (rows + cols - 2 = 254 cycles) plus pops per block, about 20% here with 4 blocks.
    """
    x, w = data((8, 16, 16, 128), BF16), data((3, 3, 128, 128), BF16, 1)
    result = tpusim.simulate(jax_module(lambda x, w: conv(x, w), x, w), [x, w], config="tpu_v5e", timing_only=True)
    assert not result.fallbacks
    cfg = result.compiled.config.mxu
    flops = 2 * 8 * 16 * 16 * 9 * 128 * 128
    ideal = flops / (2 * cfg.rows * cfg.cols)
    matmuls = [i for i in result.compiled.program.streams[0].instructions if isinstance(i, MxuMatmul)]
    streamed = sum(i.lhs.dims[-2] for i in matmuls)
    assert streamed * cfg.rows == ideal * cfg.rows  # rows x (K tiles of 128) = positions x 9 taps x 128 features
    assert all(i.lhs.dims == (128, 128) for i in matmuls)
    busy = [result.trace.busy_cycles(f"chip0.core0.mxu{k}") for k in range(cfg.count)]
    for b in busy:
        assert ideal / cfg.count <= b <= 1.3 * ideal / cfg.count, (busy, ideal)


def test_each_mxu_streams_at_least_a_weight_load_of_rows_per_tile_on_a_wide_mxu() -> None:
    """On tpu_v6e (256x256 MXUs, a weight tile latches in 256 cycles) a 3x3 convolution of 64 features
    (found in XLA's compiled convnet) cut its 2,048 output positions into blocks of 512 shared by the four
    MXUs: 128 rows per weight tile, so every MXU waited on its next tile's load half the time. Blocks are
    now big enough for each MXU's share to cover a load (the same rule as ``mxu.double_buffered``'s)."""
    x, w = data((8, 16, 16, 64), np.float32), data((3, 3, 64, 64), np.float32, 1)
    module = jax_module(lambda x, w: conv(x, w), x, w)
    result = tpusim.simulate(module, [x, w], config="tpu_v6e", timing_only=True)
    assert not result.fallbacks
    cfg = result.compiled.config.mxu
    matmuls = [i for i in result.compiled.program.streams[0].instructions if isinstance(i, MxuMatmul)]
    assert matmuls and all(i.lhs.dims[-2] >= cfg.load_cycles for i in matmuls)


@pytest.mark.parametrize("where", ["input", "output"])
def test_a_batch_stored_in_sublanes_is_blocked_whole(where: str) -> None:
    """A 1x1 convolution with stride 2 whose input or output stores the batch below the spatial dimensions
    (``{3,0,2,1}``, XLA:TPU's NHWC layout; tpusim's own layout choice picks it for results where it pads
    least): blocked one batch element at a time, each block moved single packed bf16 elements of every tile
    (the output case, of bf16[16,56,56,256] by [1,1,256,512], took 4,227 us where XLA:TPU estimates 54). Both
    cost at most 1.25x the row-major convolution."""
    x, y = ("bf16[16,56,56,256]", "bf16[16,28,28,512]")  # (28 rows pad to 32 in bf16 tiles; {3,0,2,1} pads none)
    cycles = []
    row, sub = "{3,2,1,0:T(8,128)(2,1)}", "{3,0,2,1:T(8,128)(2,1)}"  # (tiled: the layouts are the text's)
    for lx, ly in ((row, row), (sub if where == "input" else row, sub if where == "output" else row)):
        text = (
            f"HloModule c\nENTRY main {{\n  x = {x}{lx} parameter(0)\n  w = bf16[1,1,256,512]{row} parameter(1)\n"
            f"  ROOT y = {y}{ly} convolution(x, w), window={{size=1x1 stride=2x2}}, dim_labels=b01f_01io->b01f\n}}"
        )
        m = parse_module(text)
        checked = run_checked(m, random_inputs(m, 3)[0], config="tpu_v5e")
        checked.assert_ok(f"{lx} -> {ly}")
        assert not checked.result.fallbacks
        cycles.append(checked.result.cycles)
    assert cycles[1] <= 1.25 * cycles[0], cycles


def test_instructions_scale_with_tiles_not_elements() -> None:
    """Four times the batch gives about four times the MXU instructions (more blocks of the same tiles), and
    the count is ``blocks x K tiles x MXUs``: one instruction per tile pass, whatever the image holds."""
    counts = []
    for n in (2, 8):
        x, w = data((n, 16, 16, 128), BF16), data((3, 3, 128, 128), BF16, 1)
        compiled = tpusim.simulate(
            jax_module(lambda x, w: conv(x, w), x, w), [x, w], config="tpu_v5e", timing_only=True
        ).compiled
        matmuls = [i for i in compiled.program.streams[0].instructions if isinstance(i, MxuMatmul)]
        rows = sum(i.lhs.dims[-2] for i in matmuls)
        assert rows == n * 16 * 16 * ceil(9 * 128 / 128)
        counts.append(len(matmuls))
    assert counts[1] == 4 * counts[0]


def test_declines_with_reason() -> None:
    """f16 operands (one MXU pass would round them to bf16) and a kernel too big for the teaching chip's VMEM
    fall back to the reference semantics, exact, with the reason in the run's fallback list."""
    x16, w16 = data(X, np.float16), data(W, np.float16, 1)
    r = check_fallback(jax_module(lambda x, w: conv(x, w), x16, w16), [x16, w16])
    assert r == "a f16 x f16 convolution (the MXU multiplies bf16, f32 through bf16 passes, and int8)"
    x, w = data((1, 3, 3, 512)), data((3, 3, 512, 8), seed=1)
    r = check_fallback(jax_module(lambda x, w: conv(x, w), x, w), [x, w])
    assert r == "its blocks do not fit in VMEM"


def check_fallback(m: Module, args: list[Any]) -> str:
    checked = run_checked(m, args, config="teaching", options=HIGHEST)
    checked.assert_ok("fallback")
    (reason,) = [f[3] for f in checked.result.fallbacks if f[2] == "convolution"]
    return reason


def random_convolution(rng: np.random.Generator) -> tuple[Module, list[np.ndarray]]:
    """A convolution with random dim_labels, groups, batch groups, strides, padding (negative too), both
    dilations and reversal, on one or two spatial dimensions."""
    n = int(rng.integers(1, 3))
    fg = int(rng.choice([1, 1, 2, 3]))
    bg = 1 if fg > 1 else int(rng.choice([1, 1, 2]))
    cg, og, nb = (int(v) for v in rng.integers(1, [5, 4, 3]))
    windows, sizes, outs = [], [], []
    while len(windows) < n:
        k, s, d, ld, i = (int(v) for v in rng.integers([1, 1, 1, 1, 3], [4, 4, 3, 3, 9]))
        lo, hi, rev = (int(v) for v in rng.integers([-1, -1, 0], [3, 3, 2]))
        span, padded = (k - 1) * d + 1, (i - 1) * ld + 1 + lo + hi
        if padded >= span:
            windows.append((k, s, f"{lo}_{hi}", ld, d, rev))
            sizes.append(i)
            outs.append((padded - span) // s + 1)
    spatial = [str(j) for j in range(n)]
    labels = [list(rng.permutation(["b", "f", *spatial])), list(rng.permutation(["i", "o", *spatial]))]
    labels.append(list(rng.permutation(["b", "f", *spatial])))
    extent = [
        {"b": nb * bg, "f": cg * fg} | dict(zip(spatial, sizes)),
        {"i": cg, "o": og * fg * bg} | {str(j): w[0] for j, w in enumerate(windows)},
        {"b": nb, "f": og * fg * bg} | dict(zip(spatial, outs)),
    ]
    et = str(rng.choice(["f32", "bf16"]))
    shapes = [[e[c] for c in lab] for lab, e in zip(labels, extent)]
    text = "x".join
    window = " ".join(
        f"{key}={text(str(w[i]) for w in windows)}"
        for i, key in enumerate(("size", "stride", "pad", "lhs_dilate", "rhs_dilate", "rhs_reversal"))
    )
    groups = f", feature_group_count={fg}" if fg > 1 else f", batch_group_count={bg}" if bg > 1 else ""
    x, w, y = (f"{et}[{','.join(map(str, s))}]" for s in shapes)
    dims = "_".join("".join(lab) for lab in labels[:2]) + "->" + "".join(labels[2])
    m = parse_module(
        f"HloModule r\nENTRY main {{\n  x = {x} parameter(0)\n  w = {w} parameter(1)\n"
        f"  ROOT y = {y} convolution(x, w), window={{{window}}}, dim_labels={dims}{groups}\n}}"
    )
    dtype = np.float32 if et == "f32" else BF16
    return m, [rng.standard_normal(s).astype(dtype) for s in shapes[:2]]


@pytest.mark.parametrize("seed", range(24))
def test_random_configurations(seed: int) -> None:
    """24 seeded random convolutions on the teaching chip (a sweep of 450 such found no mismatch)."""
    m, args = random_convolution(np.random.default_rng(seed))
    check(m, args, "teaching")


# Matrix products XLA:TPU writes as convolutions (every form found in the compiled corpus, tests/data/corpus):
# lhs, rhs, result, window and dim_labels, and the contraction length K of each result element.
_PRODUCT_FORMS = [
    ("bf16[16,24]", "bf16[24,40]", "bf16[16,40]", "dim_labels=bf_io->bf", 24),
    ("f32[24,16]", "f32[24,40]", "f32[16,40]", "dim_labels=fb_io->bf", 24),
    ("bf16[16,24]", "bf16[40,24]", "bf16[16,40]", "dim_labels=bf_oi->bf", 24),
    ("bf16[16,24]", "bf16[24,40]", "bf16[40,16]", "dim_labels=bf_io->fb", 24),
    ("bf16[4,16,24]", "bf16[24,40,1]", "bf16[4,16,40]", "window={size=1}, dim_labels=0bf_io0->0bf", 24),
    ("bf16[4,16,24]", "bf16[40,24,1]", "bf16[4,16,40]", "window={size=1}, dim_labels=0bf_oi0->0bf", 24),
    (  # an attention head projection: the heads are a spatial dimension of the kernel
        "bf16[4,16,24,1]", "bf16[24,8,16,1]", "bf16[4,16,8,16]",
        "window={size=1x8 pad=0_0x7_7 rhs_reversal=0x1}, dim_labels=0bf1_i1o0->0b1f", 24,
    ),
    (  # the output projection: the heads are contracted as a spatial dimension
        "bf16[4,16,8,24]", "bf16[8,24,40,1]", "bf16[4,16,40,1]", "window={size=1x8}, dim_labels=0b1f_1io0->0bf1", 192,
    ),
    (  # attention scores: batch and heads paired through lhs dilation and stride
        "bf16[4,16,8,24]", "bf16[4,16,8,24]", "bf16[4,8,16,16]",
        "window={size=4x8 stride=3x7 lhs_dilate=4x8}, dim_labels=0b1f_0o1i->01bf", 24,
    ),
    (
        "f32[8,16,24]", "f32[8,24,40]", "f32[8,16,40]",
        "window={size=8 stride=7 lhs_dilate=8}, dim_labels=0bf_0io->0bf", 24,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("lhs", "rhs", "out", "attrs", "k"), _PRODUCT_FORMS)
def test_xla_tpu_products_written_as_convolutions_run_on_the_mxu_as_products(
    lhs: str, rhs: str, out: str, attrs: str, k: int
) -> None:
    """Each form is recognised as a product (the MXUs stream views of the operands, each multiply-add once, no
    im2col staging) and gives the reference interpreter's values."""
    module = parse_module(convolution_text(lhs, rhs, out, attrs))
    params = module.entry_computation.parameters
    xs = [data(p.shape.dimensions, p.shape.element_type.dtype, seed=i) for i, p in enumerate(params)]
    conv = module.entry_computation.root_instruction
    shapes = [module.entry_computation[o].array_shape.dimensions for o in conv.operands]
    assert convolution_dims(conv, *shapes, conv.array_shape.dimensions) is not None
    checked = run_checked(module, xs)
    checked.assert_ok(attrs)
    assert not checked.result.fallbacks
    trace = checked.result.trace
    mxu = np.isin(trace.unit, [trace.units.index(u) for u in trace.units if ".mxu" in u])
    useful = 2 * k * int(np.prod(module.entry_computation.root_instruction.shape.dimensions))
    assert int(trace.flops[mxu].sum()) == useful


@pytest.mark.parametrize(("dtype", "size", "stride"), [(np.float32, 5, 1), (BF16, 3, 1), (BF16, 3, 2)])
def test_a_depthwise_filter_gradient_runs_on_the_vpu(
    dtype: Any, size: int, stride: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gradient of a depthwise convolution with respect to its kernel is a convolution whose 64 batch
    groups each multiply one channel of the input by the same channel of the output gradient: no channel is
    contracted, so the MXU lowering multiplied one column per pass (the 5x5 filter gradient of [4,24,24,64]
    took 380,000 cycles, XLA:TPU estimates 5,300). On the VPU (channels in the lanes, one multiply and one
    reduce per output position; a strided copy first for a strided convolution's dilated window) it matches
    the reference (one bf16 pass for f32, as the MXU rounds) with no matmul, in at most half the program's
    time."""
    import tpusim.compiler.lowering.conv as lowering

    x, w = data((4, 24, 24, 64), dtype), data((size, size, 1, 64), dtype, 1)

    def depthwise(x: Any, w: Any) -> Any:  # (stride 2: the gradient's window is dilated 2x2)
        return conv(x, w, (stride, stride), fg=64)

    m = jax_module(jax.grad(lambda w, x: jnp.sum(depthwise(x, w) ** 2).astype(jnp.float32)), w, x)
    grads = [i.name for c in m.computations for i in c.instructions if i.attr("batch_group_count", 1) == 64]
    assert len(grads) == 1
    checked = run_checked(m, [w, x], config="tpu_v5e")
    checked.assert_ok("filter gradient")
    program = checked.result.compiled.program
    assert not [i for s in program.streams for i in s.instructions if isinstance(i, MxuMatmul) and i.hlo == grads[0]]
    vpu = tpusim.simulate(m, [w, x], config="tpu_v5e", timing_only=True).cycles
    monkeypatch.setattr(lowering, "lower_filter_gradient", lambda *args: False)
    mxu = tpusim.simulate(m, [w, x], config="tpu_v5e", timing_only=True).cycles
    assert vpu < 0.5 * mxu, (vpu, mxu)  # (the whole program: the forward convolution too)
