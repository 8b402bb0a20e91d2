"""convolution: XLA's ConvGeneralDilated with dimension labels, groups and window reversal.

Semantics (Operation Semantics, "Conv (convolution)"): the input is base-dilated (``lhs_dilate``) and
padded, the kernel taps are spaced ``rhs_dilate`` apart (and flipped along ``reversal`` dimensions);
each output element is the sum over input features and taps of input x kernel.

* ``feature_group_count`` G: the input features split into G contiguous groups, the kernel's output
  features too; group g of the output only sees group g of the input.
* ``batch_group_count`` B: the input batch splits into B contiguous groups (the output batch is the
  input batch / B) and the output features into B contiguous groups; output feature group g only sees
  input batch group g (this is the weight gradient of a grouped convolution).

Numerics: the same accumulation rule as dot (:func:`.dot.accumulation_dtype`): narrow floats multiply
and accumulate in f32 and round once; integers wrap. Implementation: batched matmuls over the groups,
either one per kernel tap of the input elements the tap meets (holes and padding skipped), summed tap by
tap, or im2col (the dilated, padded input, a patch matrix, one matmul), whichever moves fewer elements.
Sparse windows take the first: XLA:TPU writes attention's P@V with batch and heads as spatial dimensions,
base-dilated 64-fold, whose patch matrix would take 28 GB at sequence 1024.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from math import prod
from typing import Any

import numpy as np

from tpusim.compiler.hlo.ir import ConvDims, Instruction, Window, WindowDim
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value, register
from tpusim.compiler.hlo.reference.dot import accumulation_dtype
from tpusim.compiler.hlo.reference.windows import dilate_pad, output_sizes, windows

__all__ = ["ConvError", "convolution"]


class ConvError(ValueError):
    """Operands that do not fit the convolution's dimension numbers or group counts."""


_Hits = tuple[int, list[tuple[slice, slice] | None]]
"""Window positions along one dimension, and per tap the positions that meet input elements and those elements."""


def _tap_hits(n: int, d: WindowDim) -> _Hits:
    """The window positions along an input dimension of ``n`` elements, and per tap the positions whose tap
    lands on an input element (not on a hole of the base dilation or on padding) with those elements (None:
    no position does). Both are arithmetic progressions (the tap reads position ``p`` at ``p * stride + c``
    of the dilated input, a real element when that is a multiple of ``lhs_dilate``), so slices."""
    dilated = (n - 1) * d.lhs_dilate + 1 if n > 0 else 0
    size = output_sizes([d.pad_low + dilated + d.pad_high], [d])[0]
    at = np.arange(size)
    hits: list[tuple[slice, slice] | None] = []
    for t in range(d.size):
        q = at * d.stride + t * d.rhs_dilate - d.pad_low  # where the tap reads, in the dilated input
        real = (q >= 0) & (q < dilated) & (q % d.lhs_dilate == 0)
        hits.append(_progressions(at[real], q[real] // d.lhs_dilate))
    return size, hits


def _progressions(at: np.ndarray, src: np.ndarray) -> tuple[slice, slice] | None:
    if at.size == 0:
        return None
    step_at, step_src = (int(at[1] - at[0]), int(src[1] - src[0])) if at.size > 1 else (1, 1)
    return slice(int(at[0]), int(at[-1]) + 1, step_at), slice(int(src[0]), int(src[-1]) + 1, step_src)


def _tap_traffic(hits: list[_Hits], xg: tuple[int, ...], og: int) -> int:
    """Elements :func:`_sum_by_taps` moves: per tap, the input elements it meets and their products, read and
    added into the sums."""
    bg, nb, fg, cg = xg[:4]
    total = 0
    for taps in product(*(range(len(h)) for _, h in hits)):
        pairs = [p for p in (hits[i][1][t] for i, t in enumerate(taps)) if p is not None]
        if len(pairs) == len(hits):
            met = prod(len(range(at.start, at.stop, at.step)) for at, _ in pairs)
            total += bg * fg * nb * met * (cg + 3 * og)
    return total


def _patch_traffic(hits: list[_Hits], xg: tuple[int, ...], dims: Sequence[WindowDim]) -> int:
    """Elements :func:`_sum_by_patches` moves: the dilated, padded input, and the patch matrix written and read."""
    bg, nb, fg, cg = xg[:4]
    padded = prod((n - 1) * d.lhs_dilate + 1 + max(d.pad_low, 0) + max(d.pad_high, 0) for n, d in zip(xg[4:], dims))
    patches = bg * fg * nb * cg * prod(size for size, _ in hits) * prod(d.size for d in dims)
    return bg * nb * fg * cg * padded + 2 * patches


def _sum_by_taps(xg: np.ndarray, wg: np.ndarray, hits: list[_Hits]) -> np.ndarray:
    """The sums, one batched matmul per kernel tap of the input elements the tap meets (slices of the input:
    holes and padding skipped), added tap by tap: memory of the arrays' order, work of the real products."""
    nb, cg = xg.shape[1], xg.shape[3]
    groups, og = wg.shape[:2]
    nsp = len(hits)
    out = np.zeros((groups, nb, *(size for size, _ in hits), og), wg.dtype)
    for taps in product(*(range(len(h)) for _, h in hits)):
        pairs = [p for p in (hits[i][1][t] for i, t in enumerate(taps)) if p is not None]
        if len(pairs) < nsp:
            continue
        sources: tuple[Any, ...] = (slice(None),) * 4 + tuple(src for _, src in pairs)
        seen = xg[sources]  # Gb Nb Gf Cg V...
        v = seen.shape[4:]
        rows = np.moveaxis(seen, 3, -1).transpose((0, 2, 1, *range(3, 3 + nsp), 3 + nsp))
        tap: tuple[Any, ...] = (Ellipsis, *taps)
        sums = np.matmul(rows.reshape(groups, nb * prod(v), cg), wg[tap].transpose((0, 2, 1)))
        targets: tuple[Any, ...] = (slice(None), slice(None), *(at for at, _ in pairs))
        out[targets] += sums.reshape(groups, nb, *v, og)
    return out


def _sum_by_patches(xg: np.ndarray, wg: np.ndarray, dims: Sequence[WindowDim]) -> np.ndarray:
    """The sums by im2col: the dilated, padded input, its windows copied once into a patch matrix, and one
    batched matmul over the groups. Fast for dense windows (few taps on holes or padding)."""
    nb, cg = xg.shape[1], xg.shape[3]
    groups, og = wg.shape[:2]
    nsp = len(dims)
    x = dilate_pad(xg, dims, 0, first_axis=4)
    patches = windows(x, dims, first_axis=4)  # Gb Nb Gf Cg P... K...
    positions, taps = patches.shape[4 : 4 + nsp], patches.shape[4 + nsp :]
    sp, kp = tuple(range(4, 4 + nsp)), tuple(range(4 + nsp, 4 + 2 * nsp))
    p = patches.transpose((0, 2, 1, *sp, 3, *kp)).reshape(groups, nb * prod(positions), cg * prod(taps))
    k = wg.transpose((0, 2, *range(3, 3 + nsp), 1)).reshape(groups, cg * prod(taps), og)
    return np.matmul(p, k).reshape(groups, nb, *positions, og)


def convolution(
    lhs: np.ndarray,
    rhs: np.ndarray,
    window: Window,
    dims: ConvDims,
    result: np.dtype,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
) -> np.ndarray:
    """XLA convolution of ``lhs`` (input) with ``rhs`` (kernel).

    Args:
        lhs: the input, laid out as ``dims`` says.
        rhs: the kernel.
        window: one window dimension per spatial dimension (in label order ``0, 1, ...``).
        dims: the dimension numbers (``dim_labels``).
        result: the result's numpy dtype.
        feature_group_count, batch_group_count: group counts (at most one of them above 1).

    Returns:
        The output in the layout ``dims`` gives for it.

    Raises:
        ConvError: shapes that do not fit the dimension numbers and group counts.
    """
    nsp = len(dims.input_spatial)
    if len(window.dims) != nsp or len(dims.kernel_spatial) != nsp or len(dims.output_spatial) != nsp:
        raise ConvError(f"window has {len(window.dims)} dimensions for {nsp} spatial dimensions")
    fg, bg = int(feature_group_count), int(batch_group_count)
    if fg < 1 or bg < 1 or (fg > 1 and bg > 1):
        raise ConvError(f"feature_group_count={fg} and batch_group_count={bg}: both >= 1, at most one above 1")
    acc = accumulation_dtype(result)
    x = lhs.transpose((dims.input_batch, dims.input_feature, *dims.input_spatial)).astype(acc)  # N C S...
    w = rhs.transpose((dims.kernel_output_feature, dims.kernel_input_feature, *dims.kernel_spatial)).astype(acc)
    n, c = x.shape[:2]
    o, ci = w.shape[:2]
    if tuple(d.size for d in window.dims) != w.shape[2:]:
        sizes = [d.size for d in window.dims]
        raise ConvError(f"window sizes {sizes} differ from the kernel's spatial sizes {list(w.shape[2:])}")
    if c % fg or ci * fg != c:
        raise ConvError(f"input features {c} != kernel input features {ci} x feature_group_count {fg}")
    if o % (fg * bg):
        raise ConvError(f"kernel output features {o} are not divisible by the group count {fg * bg}")
    if n % bg:
        raise ConvError(f"input batch {n} is not divisible by batch_group_count {bg}")
    flips = tuple(2 + i for i, d in enumerate(window.dims) if d.reversal)
    if flips:
        w = np.flip(w, flips)
    groups = fg * bg
    # Groups g = (batch group, feature group), as both counts split their dimensions: input (Gb, Nb, Gf, Cg,
    # S...), kernel (G, Og, Cg, K...); the sums (G, Nb, P..., Og).
    xg = x.reshape(bg, n // bg, fg, c // fg, *x.shape[2:])
    wg = w.reshape(groups, o // groups, ci, *w.shape[2:])
    hits = [_tap_hits(x.shape[2 + i], d) for i, d in enumerate(window.dims)]
    by_taps = _tap_traffic(hits, xg.shape, wg.shape[1])
    by_patches = _patch_traffic(hits, xg.shape, window.dims)
    out = _sum_by_taps(xg, wg, hits) if by_taps < by_patches else _sum_by_patches(xg, wg, window.dims)
    positions = out.shape[2:-1]
    nb, og = out.shape[1], out.shape[-1]
    out = np.moveaxis(out, -1, 1).reshape(groups * og, nb, *positions)  # (G, Og) -> O
    out = np.moveaxis(out, 0, 1)  # Nb, O, P...
    order = (dims.output_batch, dims.output_feature, *dims.output_spatial)
    out = out.transpose(np.argsort(order))
    if np.dtype(result) == np.bool_:
        return out != 0
    return out.astype(result)


@register("convolution")
def _convolution(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> Value:
    if len(args) != 2 or not all(isinstance(a, np.ndarray) for a in args):
        raise EvaluationError(instr, "takes two array operands: input and kernel")
    lhs, rhs = args
    assert isinstance(lhs, np.ndarray) and isinstance(rhs, np.ndarray)
    dims = instr.attr("dim_labels")
    if not isinstance(dims, ConvDims):
        raise EvaluationError(instr, "has no dim_labels")
    window = instr.attr("window") or Window(())
    result = instr.array_shape.element_type.dtype
    assert result is not None
    try:
        return convolution(
            lhs,
            rhs,
            window,
            dims,
            result,
            int(instr.attr("feature_group_count", 1)),
            int(instr.attr("batch_group_count", 1)),
        )
    except ConvError as exc:
        raise EvaluationError(instr, f"{exc} (input {list(lhs.shape)}, kernel {list(rhs.shape)})") from None
