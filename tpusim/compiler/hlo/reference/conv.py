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
and accumulate in f32 and round once; integers wrap. Implementation: im2col (a strided window view,
copied once into patches) and one batched matmul over the groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np

from tpusim.compiler.hlo.ir import ConvDims, Instruction, Window
from tpusim.compiler.hlo.reference.core import EvalContext, EvaluationError, Value, register
from tpusim.compiler.hlo.reference.dot import accumulation_dtype
from tpusim.compiler.hlo.reference.windows import dilate_pad, windows

__all__ = ["ConvError", "convolution"]


class ConvError(ValueError):
    """Operands that do not fit the convolution's dimension numbers or group counts."""


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
    x = dilate_pad(x, window.dims, 0, first_axis=2)
    patches = windows(x, window.dims, first_axis=2)  # N C P... K...
    positions = patches.shape[2 : 2 + nsp]
    taps = w.shape[2:]
    groups = fg * bg
    nb, cg, og = n // bg, c // fg, o // groups
    # (Gb, Nb, Gf, Cg, P..., K...) -> (Gb, Gf, Nb, P..., Cg, K...) -> (G, Nb*P, Cg*K)
    p = patches.reshape(bg, nb, fg, cg, *positions, *taps)
    sp = tuple(range(4, 4 + nsp))
    kp = tuple(range(4 + nsp, 4 + 2 * nsp))
    p = p.transpose((0, 2, 1, *sp, 3, *kp)).reshape(groups, nb * prod(positions), cg * prod(taps))
    # kernel (G*Og, Cg, K...) -> (G, Cg*K, Og)
    k = w.reshape(groups, og, ci, *taps)
    k = k.transpose((0, 2, *range(3, 3 + nsp), 1)).reshape(groups, ci * prod(taps), og)
    out = np.matmul(p, k)  # G, Nb*P, Og
    out = out.reshape(groups, nb, *positions, og)
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
