"""Narrow convolutions with a long window: one window axis folded into the input features.

tpusim's convolution lowering (:mod:`tpusim.compiler.lowering.conv`) builds the MXUs' LHS block one window
tap at a time, a vector copy of the tap's input features for every output position of a block. A copy costs
the vector registers it writes, a sublane row each whatever its width, so with few input features most of
each copy is empty lanes. The weight gradient of an ordinary convolution is the extreme case: JAX's
``grad`` of a 3x3 convolution of a bf16 ``[8,32,32,64]`` batch with respect to its kernel is a convolution
whose window is the whole 32x32 image and whose input features are the 8 batch elements, so its 1,024 taps
were 2,048 copies of 8 lanes, 86% of the kernel on the vector unit and 98,000 cycles on v5e, where XLA's
own estimate for that kernel is 12,100 cycles.

:func:`fold_narrow_windows` rewrites such a convolution, before fusion, into the same sum with the longest
window axis ``a`` moved into the features (stride 1, no dilation):

* the input, padded along ``a`` as the window pads it, is cut into the ``O_a`` windows its output positions
  read (``slice``, ``concatenate``), and each window's ``K_a`` positions are placed beside its features
  (``reshape``, ``transpose``, ``reshape``): input features ``K_a * F``, axis ``a`` as long as the output;
* the kernel's taps along ``a`` likewise join its input features in the same order, leaving a window of
  one along ``a``.

Each output position then reads ``K_a * F`` features of one input position along ``a``, which is the sum it
had; the LHS is built in ``K_a`` times fewer, ``K_a`` times wider copies. The cost is one pass over the
input, ``O_a * K_a / (O_a + K_a - 1)`` times its size, on the vector unit. A convolution is folded when its
input features are fewer than :data:`NARROW`, its longest window axis has at least :data:`LONG_WINDOW` taps
and no fewer than output positions (the shape of a weight gradient, whose window is the image), and the
input grows at most :data:`MOST_GROWTH` times (a forward 3x3 convolution never qualifies), to at most
:data:`VMEM_SHARE` of VMEM.

Only modules tpusim lays out itself (no tiled layout anywhere): an XLA:TPU module keeps its own choices.
"""

from __future__ import annotations

import numpy as np

from tpusim.compiler.hlo.ir import (
    Attributes,
    Computation,
    ConvDims,
    Instruction,
    Literal,
    Module,
    PadDim,
    SliceDim,
    Window,
    WindowDim,
    has_tiled_layouts,
)
from tpusim.compiler.rewrite import rewrite_instructions, unique_name
from tpusim.memory import Shape

__all__ = ["LONG_WINDOW", "MOST_GROWTH", "NARROW", "VMEM_SHARE", "fold_narrow_windows"]

NARROW = 32
"""Input features below this many use at most a quarter of a copy's 128 lanes."""

LONG_WINDOW = 4
"""Window taps along the folded axis from which the copies saved outweigh the pass that folds them."""

MOST_GROWTH = 4.0
"""The folded input is at most this many times the input (``O_a * K_a / (O_a + K_a - 1)``)."""

VMEM_SHARE = 1 / 16
"""The folded input takes at most this share of VMEM: its features are ``K_a`` times wider, and the lowering
stages blocks holding all of them (the teaching chip's 64 KiB cannot hold a block of 12 x 4 features)."""


def fold_narrow_windows(module: Module, vmem_bytes: int) -> Module:
    """``module`` with every narrow convolution with a long window folded (see the module docstring) where
    the folded input takes at most :data:`VMEM_SHARE` of ``vmem_bytes``; the same object when there is none,
    or when the module is laid out already."""
    if has_tiled_layouts(module):
        return module
    folded = rewrite_instructions(module, lambda c, i, taken: _folded(c, i, taken, vmem_bytes * VMEM_SHARE))
    changed = any(a is not b for a, b in zip(folded.computations, module.computations))
    return folded if changed else module


def _axis(instr: Instruction, lhs: Shape, dn: ConvDims, window: Window, budget: float) -> int | None:
    """The window axis to fold (the folded input at most ``budget`` bytes), or None."""
    features = lhs.dimensions[dn.input_feature]
    if features >= NARROW or int(instr.attr("feature_group_count", 1)) != 1:
        return None
    if int(instr.attr("batch_group_count", 1)) != 1 or len(window.dims) != len(dn.input_spatial):
        return None
    if any(w.stride != 1 or w.lhs_dilate != 1 or w.rhs_dilate != 1 or w.reversal for w in window.dims):
        return None
    best = None
    for a, w in enumerate(window.dims):
        if w.size < LONG_WINDOW or w.pad_low < 0 or w.pad_high < 0:
            continue
        length = lhs.dimensions[dn.input_spatial[a]] + w.pad_low + w.pad_high
        out = length - w.size + 1
        if out < 1 or out > w.size or out * w.size > MOST_GROWTH * (out + w.size - 1):
            continue
        if lhs.byte_size // lhs.dimensions[dn.input_spatial[a]] * out * w.size > budget:
            continue
        if best is None or w.size > window.dims[best].size:
            best = a
    return best


def _folded(comp: Computation, instr: Instruction, taken: set[str], budget: float) -> list[Instruction] | None:
    if instr.opcode != "convolution" or len(instr.operands) != 2 or not isinstance(instr.shape, Shape):
        return None
    dn, window = instr.attr("dim_labels"), instr.attr("window")
    lhs, rhs = (comp[o].shape for o in instr.operands)
    if not isinstance(dn, ConvDims) or not isinstance(window, Window):
        return None
    if not isinstance(lhs, Shape) or not isinstance(rhs, Shape):
        return None
    a = _axis(instr, lhs, dn, window, budget)
    if a is None:
        return None
    out: list[Instruction] = []

    def add(hint: str, opcode: str, shape: Shape, operands: tuple[str, ...], **attrs: object) -> str:
        name = unique_name(f"{instr.name}.{hint}", taken)
        out.append(Instruction(name, opcode, shape, operands, Attributes(attrs), instr.loc))
        return name

    w = window.dims[a]
    s, f = dn.input_spatial[a], dn.input_feature
    et = lhs.element_type
    # The input padded along a as the window pads it (the other axes keep their padding in the window).
    source, dims = instr.operands[0], list(lhs.dimensions)
    if w.pad_low or w.pad_high:
        scalar = Shape(et, ())
        zero = add("zero", "constant", scalar, (), literal=Literal(scalar, np.zeros((), et.dtype)))
        padding = tuple(PadDim(w.pad_low, w.pad_high) if d == s else PadDim(0, 0) for d in range(lhs.rank))
        dims[s] += w.pad_low + w.pad_high
        source = add("padded", "pad", Shape(et, tuple(dims)), (source, zero), padding=padding)
    length, k = dims[s], w.size
    o = length - k + 1
    # Each output position's window along a, one after the other: [.., O*K (at s), ..], then [.., O, K, ..].
    pieces = []
    for p in range(o):
        limits = tuple(SliceDim(p, p + k) if d == s else SliceDim(0, n) for d, n in enumerate(dims))
        cut = tuple(k if d == s else n for d, n in enumerate(dims))
        pieces.append(add("window", "slice", Shape(et, cut), (source,), slice=limits))
    joined = tuple(o * k if d == s else n for d, n in enumerate(dims))
    source = add("windows", "concatenate", Shape(et, joined), tuple(pieces), dimensions=(s,)) if o > 1 else pieces[0]
    split = (*dims[:s], o, k, *dims[s + 1 :])
    source = add("split", "reshape", Shape(et, split), (source,))
    # K beside the features (K major), then the two as one feature dimension: the input's own numbering.
    fs = f + (f > s)  # the feature dimension in the split shape
    order = [d for d in range(len(split)) if d != s + 1]
    order.insert(order.index(fs), s + 1)
    moved = tuple(split[d] for d in order)
    source = add("beside", "transpose", Shape(et, moved), (source,), dimensions=tuple(order))
    new_lhs = tuple(o if d == s else dims[f] * k if d == f else n for d, n in enumerate(dims))
    lhs_name = add("folded", "reshape", Shape(et, new_lhs), (source,))
    # The kernel's taps along a beside its input features, in the same order, and a window of one along a.
    ks, ki = dn.kernel_spatial[a], dn.kernel_input_feature
    rt = rhs.element_type
    order = [d for d in range(rhs.rank) if d != ks]
    order.insert(order.index(ki), ks)
    moved = tuple(rhs.dimensions[d] for d in order)
    kernel = instr.operands[1]
    if order != list(range(rhs.rank)):
        kernel = add("kernel", "transpose", Shape(rt, moved), (kernel,), dimensions=tuple(order))
    # (K, F) -> (1, K * F), the 1 back at a's place: the other dimensions keep their order, so it is a reshape
    merged = {d: rhs.dimensions[d] for d in range(rhs.rank)} | {ks: 1, ki: rhs.dimensions[ks] * rhs.dimensions[ki]}
    rhs_name = add("kernel", "reshape", Shape(rt, tuple(merged[d] for d in range(rhs.rank))), (kernel,))
    dims_out = tuple(WindowDim(1) if j == a else d for j, d in enumerate(window.dims))
    attributes = Attributes((key, Window(dims_out) if key == "window" else v) for key, v in instr.attributes.items())
    out.append(Instruction(instr.name, "convolution", instr.shape, (lhs_name, rhs_name), attributes, instr.loc))
    return out
