"""Window geometry shared by convolution, reduce-window and select-and-scatter.

XLA's windowed ops see the operand after *base dilation* (``lhs_dilate``: ``d - 1`` holes between
neighbours) and *padding* (``pad_low``/``pad_high``, negative values crop), then place windows of
``size`` taps spaced ``rhs_dilate`` apart at every ``stride``-th position (Operation Semantics,
"ConvWithGeneralPadding" and "ReduceWindow"). Here the padded, dilated operand is materialised once and
every window is a strided numpy view of it, so no per-window Python loop is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tpusim.compiler.hlo.ir import Window, WindowDim

__all__ = ["dilate_pad", "output_sizes", "window_taps", "windows"]


def dilate_pad(a: np.ndarray, dims: Sequence[WindowDim], fill: object, first_axis: int = 0) -> np.ndarray:
    """``a`` with base dilation and (possibly negative) padding applied to axes ``first_axis...``.

    Args:
        a: the operand.
        dims: one window dimension per dilated axis, in axis order.
        fill: the value of holes and padding.
        first_axis: the axis ``dims[0]`` applies to.

    Returns:
        A new array (holes and padding set to ``fill``).
    """
    if all(d.lhs_dilate == 1 and d.pad_low == 0 and d.pad_high == 0 for d in dims):
        return a
    shape = list(a.shape)
    place: list[slice] = [slice(None)] * a.ndim
    crop: list[slice] = [slice(None)] * a.ndim
    for i, d in enumerate(dims):
        ax = first_axis + i
        n = a.shape[ax]
        dilated = (n - 1) * d.lhs_dilate + 1 if n > 0 else 0
        lo, hi = max(d.pad_low, 0), max(d.pad_high, 0)
        shape[ax] = lo + dilated + hi
        place[ax] = slice(lo, lo + dilated, d.lhs_dilate)
        start = max(-d.pad_low, 0)
        stop = shape[ax] - max(-d.pad_high, 0)
        crop[ax] = slice(start, max(start, stop))
    out = np.full(shape, fill, dtype=a.dtype)
    out[tuple(place)] = a
    return out[tuple(crop)]


def output_sizes(padded: Sequence[int], dims: Sequence[WindowDim]) -> tuple[int, ...]:
    """Number of window positions along each axis of the padded, dilated operand."""
    out = []
    for n, d in zip(padded, dims):
        span = (d.size - 1) * d.rhs_dilate + 1
        out.append(0 if n < span or d.size == 0 else (n - span) // d.stride + 1)
    return tuple(out)


def windows(a: np.ndarray, dims: Sequence[WindowDim], first_axis: int = 0) -> np.ndarray:
    """All windows of ``a`` (already dilated and padded) as a strided view.

    Returns:
        A read-only view of shape ``a.shape[:first_axis] + positions + a.shape[first_axis+k:] + taps``
        where ``positions`` are the window positions per windowed axis and ``taps`` the window sizes.
    """
    k = len(dims)
    axes = tuple(range(first_axis, first_axis + k))
    spans = [(d.size - 1) * d.rhs_dilate + 1 for d in dims]
    positions = output_sizes([a.shape[ax] for ax in axes], dims)
    if any(p == 0 for p in positions) or any(d.size == 0 for d in dims):
        shape = list(a.shape)
        for ax, p in zip(axes, positions):
            shape[ax] = p
        return np.zeros((*shape, *(d.size for d in dims)), dtype=a.dtype)
    if a.dtype.isbuiltin == 2:  # ml_dtypes types: numpy's stride tricks rebuild f8e5m2 ('<f1') and fail
        raw = sliding_window_view(a.view(np.dtype(f"u{a.dtype.itemsize}")), spans, axis=axes)
        view = raw.view(a.dtype)
    else:
        view = sliding_window_view(a, spans, axis=axes)
    sel: list[slice] = [slice(None)] * view.ndim
    for i, (ax, d) in enumerate(zip(axes, dims)):
        sel[ax] = slice(None, None, d.stride)
        sel[a.ndim + i] = slice(None, None, d.rhs_dilate)
    return view[tuple(sel)]


def window_taps(window: Window) -> int:
    """Number of taps (elements) in one window."""
    return prod(d.size for d in window.dims)
