"""Where a layout puts each element, in closed form: every dimension's index as digits with strides.

A layout without ``*`` merges is separable (:func:`tpusim.memory.tiling.is_separable`): an element's slot
is a sum of one term per logical dimension. Each tiling level replaces a coordinate ``c`` by its quotient
and remainder by the tile size, so the term of dimension ``d`` is a sum of *digits* of ``c`` in a mixed
radix, each digit times the stride of the position it ends up at::

    bf16[R,C]{1,0:T(8,128)(2,1)}:   rows  c -> (c // 8) * S0 + (c % 8 // 2) * 256 + (c % 2) * 1
                                    cols  c -> (c // 128) * S1 + (c % 128) * 2

A dimension's digits, listed major to minor as :class:`Mode` ``(extent, stride)``, keep only the digits the
dimension's size reaches; the top one takes a fractional extent when a tile does not divide the size
(``c // 8`` over 12 rows takes 12/8 values: one whole step and half of the next).

Reading an array's elements in some order (the row-major order of its logical dimensions for a reshape,
its physical order for a bitcast) concatenates the dimensions' modes. Coalescing adjacent modes whose
strides continue one another (outer stride = inner extent x inner stride) gives one normal form per slot
function: two layouts read that way hold every element at the same slot exactly when their normal forms
are equal. That decides whether a reshape or a bitcast moves bytes at any array size, in time linear in
the rank and the tiling depth.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from math import prod

from tpusim.memory.shape import Shape
from tpusim.memory.tiling import geometry

__all__ = ["Mode", "dimension_modes", "normal_form"]


@dataclass(frozen=True, slots=True)
class Mode:
    """One digit of an index: it takes ``extent`` values (a fraction for the top digit of a dimension its
    tile does not divide), each step ``stride`` slots apart."""

    extent: Fraction
    stride: int


@dataclass(frozen=True, slots=True)
class _Part:
    """What one position of a tiling level's shape holds: digit ``(c // place) % radix`` of logical
    dimension ``owner``'s coordinate ``c`` (``radix`` None: unbounded, the quotient), or nothing (``owner``
    None, a size-1 dimension a tile prepended)."""

    owner: int | None
    place: int = 1
    radix: int | None = None


@lru_cache(maxsize=4096)
def dimension_modes(shape: Shape) -> tuple[tuple[Mode, ...], ...] | None:
    """Each logical dimension's digits, major to minor, such that an element's slot (as
    :meth:`~tpusim.memory.tiling.Geometry.linear_index` gives it) is the sum over dimensions and digits of
    ``digit * stride``. None when the layout is not a mixed radix per dimension: ``*`` merges mix two
    dimensions, and a later tile that does not divide an earlier tile's size splits a digit unevenly."""
    geo = geometry(shape)
    parts = [_Part(owner) for owner in geo.physical_permutation]
    for level in geo.levels:
        if level.merges:
            return None
        parts = [_Part(None)] * level.prepended + parts
        k = len(level.tile)
        head, tiled = parts[: len(parts) - k], parts[len(parts) - k :]
        quotients, remainders = [], []
        for part, t in zip(tiled, level.tile):
            if part.owner is None or t == 1:  # nothing to split, or a remainder that is always 0
                quotients.append(part)
                remainders.append(_Part(None))
                continue
            if part.radix is not None and part.radix % t:
                return None
            quotients.append(_Part(part.owner, part.place * t, None if part.radix is None else part.radix // t))
            remainders.append(_Part(part.owner, part.place, t))
        parts = head + quotients + remainders
    dims = geo.tiled_dims
    digits: list[list[tuple[int, int | None, int]]] = [[] for _ in range(shape.rank)]
    for i, part in enumerate(parts):
        if part.owner is not None:
            digits[part.owner].append((part.place, part.radix, prod(dims[i + 1 :])))
    return tuple(_used(sorted(ds, key=lambda digit: -digit[0]), shape.dimensions[d]) for d, ds in enumerate(digits))


def _used(digits: list[tuple[int, int | None, int]], size: int) -> tuple[Mode, ...]:
    """The digits (place, radix, stride; major to minor) an index below ``size`` can make nonzero, with the
    number of values each takes."""
    modes = []
    for place, radix, stride in digits:
        if place >= size:
            continue  # every index below `size` has this digit 0
        reach = Fraction(size, place)
        modes.append(Mode(reach if radix is None else min(Fraction(radix), reach), stride))
    return tuple(modes)


def normal_form(shape: Shape, order: tuple[int, ...]) -> tuple[Mode, ...] | None:
    """The slot function of ``shape``'s elements read with dimension ``order[0]`` most major, coalesced:
    size-1 digits dropped, and neighbours merged where the outer stride is the inner extent times the inner
    stride. Two shapes read in their orders place every element alike exactly when their forms are equal.
    None when :func:`dimension_modes` has no closed form for the layout."""
    modes = dimension_modes(shape)
    if modes is None:
        return None
    out: list[Mode] = []  # minor to major
    for mode in reversed([m for d in order for m in modes[d]]):
        if mode.extent == 1:
            continue
        if out and out[-1].extent.denominator == 1 and mode.stride == out[-1].extent * out[-1].stride:
            out[-1] = Mode(mode.extent * out[-1].extent, out[-1].stride)
        else:
            out.append(mode)
    return tuple(reversed(out))
