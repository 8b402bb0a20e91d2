"""What every dimension of a matrix product is: the roles the dot lowering works from, for ``dot`` and for the
convolutions that are dots.

A product pairs its operands' dimensions: *batch* dimensions (one in each operand and one in the result, the
same index everywhere), *contracting* dimensions (one in each operand, summed over), *free* dimensions of one
operand (one in the result), and *unit* dimensions of size 1 that take part in nothing. ``dot`` states them
(``lhs_batch_dims`` ...; its result lists batch, lhs free, rhs free dimensions in that order).

XLA:TPU writes most of its matrix products as ``convolution`` instructions whose spatial dimensions play those
roles through their windows (its compiled modules, e.g. a batched attention product as ``window={size=4x8
stride=3x7 lhs_dilate=4x8}, dim_labels=0b1f_0o1i->01bf``). :func:`convolution_dims` finds each spatial
dimension's role from which (output, input, kernel) index triples its window relates, when every dimension
has one:

- *lhs free*: a window of one tap that reads input position ``o`` for output ``o`` (``size=1``);
- *rhs free*: a one-element input read by tap ``o`` for output ``o``, e.g. ``size=8 pad=7_7 rhs_reversal=1``:
  output ``o`` reads kernel position ``o`` only (a head dimension carried by the kernel);
- *contracting*: one output whose window holds the whole input, tap ``i`` reading position ``i``;
- *batch*: output ``o`` reads input position ``o`` with tap ``o`` (``size=W stride=W-1 lhs_dilate=W``: the
  dilation leaves one input element in each window, at its own tap);
- *unit*: size 1 everywhere.

Anything else (a real sliding window, feature or batch groups) is a convolution, lowered as one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

from tpusim.compiler.hlo.ir import ConvDims, Instruction, Window, WindowDim
from tpusim.memory import Shape
from tpusim.memory.reinterpret import merged_shape

__all__ = ["DotDims", "convolution_dims", "dims_without", "dot_dims", "folded_contraction", "oriented"]


@dataclass(frozen=True)
class DotDims:
    """The roles of a product's dimensions.

    Attributes:
        lhs_batch, rhs_batch, out_batch: paired batch dimensions of the left operand, right operand, result.
        lhs_contracting, rhs_contracting: paired contracting dimensions.
        lhs_free, out_lhs_free: the left operand's free dimensions and their result dimensions.
        rhs_free, out_rhs_free: the right operand's free dimensions and their result dimensions.
        lhs_units, rhs_units, out_units: size-1 dimensions that take part in nothing.
    """

    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    out_batch: tuple[int, ...]
    lhs_contracting: tuple[int, ...]
    rhs_contracting: tuple[int, ...]
    lhs_free: tuple[int, ...]
    out_lhs_free: tuple[int, ...]
    rhs_free: tuple[int, ...]
    out_rhs_free: tuple[int, ...]
    lhs_units: tuple[int, ...] = ()
    rhs_units: tuple[int, ...] = ()
    out_units: tuple[int, ...] = ()

    def swapped(self) -> DotDims:
        """The same product with its operands exchanged (the result is the same array: ``A @ B`` is the
        transpose of ``B.T @ A.T``, and the result's dimensions keep their places)."""
        return DotDims(
            lhs_batch=self.rhs_batch,
            rhs_batch=self.lhs_batch,
            out_batch=self.out_batch,
            lhs_contracting=self.rhs_contracting,
            rhs_contracting=self.lhs_contracting,
            lhs_free=self.rhs_free,
            out_lhs_free=self.out_rhs_free,
            rhs_free=self.lhs_free,
            out_rhs_free=self.out_lhs_free,
            lhs_units=self.rhs_units,
            rhs_units=self.lhs_units,
            out_units=self.out_units,
        )


def oriented(d: DotDims, lhs: Shape, rhs: Shape, out: Shape) -> tuple[DotDims, bool]:
    """``d`` arranged for the MXU, and whether the operands are exchanged.

    The MXU computes ``[M, K] @ [K, N]`` blocks with the last free dimension of each operand as M and N and
    the last contracting pair as K (the others lead, one product per index). Each is picked by the physical
    layouts, so the blocks are contiguous rows and lanes: N is the right operand's free dimension most minor
    in the result, M the left operand's, K the pair most minor in the left operand. The operands are exchanged
    when the result's most minor dimension belongs to the left operand (``A @ B`` computed as ``(B.T @
    A.T).T``, so the result's lanes are the right operand's columns): XLA:TPU lays out ``x @ W`` head
    projections with the sequence in lanes, for example."""
    return oriented_by_order(d, _minor_first(lhs), _minor_first(rhs), _minor_first(out), out.dimensions)


def oriented_by_order(
    d: DotDims,
    lhs_minor_first: tuple[int, ...],
    rhs_minor_first: tuple[int, ...],
    out_minor_first: tuple[int, ...],
    out_dims: tuple[int, ...],
) -> tuple[DotDims, bool]:
    """:func:`oriented` from the operands' and the result's minor-to-major orders alone (what layout choice
    has while it weighs orders, without building shapes)."""
    lanes = next((o for o in out_minor_first if out_dims[o] > 1), None)
    swap = lanes is not None and lanes in d.out_lhs_free and lanes not in d.out_rhs_free
    lhs_order = lhs_minor_first
    if swap:
        d, lhs_order = d.swapped(), rhs_minor_first
    rank_out = {o: i for i, o in enumerate(out_minor_first)}
    m = _last(d.lhs_free, d.out_lhs_free, key=lambda pair: -rank_out[pair[1]])
    n = _last(d.rhs_free, d.out_rhs_free, key=lambda pair: -rank_out[pair[1]])
    rank_lhs = {o: i for i, o in enumerate(lhs_order)}
    k = _last(d.lhs_contracting, d.rhs_contracting, key=lambda pair: -rank_lhs[pair[0]])
    return (
        DotDims(
            lhs_batch=d.lhs_batch,
            rhs_batch=d.rhs_batch,
            out_batch=d.out_batch,
            lhs_contracting=k[0],
            rhs_contracting=k[1],
            lhs_free=m[0],
            out_lhs_free=m[1],
            rhs_free=n[0],
            out_rhs_free=n[1],
            lhs_units=d.lhs_units,
            rhs_units=d.rhs_units,
            out_units=d.out_units,
        ),
        swap,
    )


def _minor_first(shape: Shape) -> tuple[int, ...]:
    return tuple(shape.effective_layout.minor_to_major)


def _last(
    a: tuple[int, ...], b: tuple[int, ...], key: Callable[[tuple[int, int]], int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The pairs ``zip(a, b)`` with the one of the largest ``key`` moved last (stable otherwise)."""
    if not a:
        return a, b
    pairs = list(zip(a, b))
    best = max(range(len(pairs)), key=lambda i: (key(pairs[i]), i))
    pairs.append(pairs.pop(best))
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


def dot_dims(instr: Instruction, lhs_rank: int, rhs_rank: int) -> DotDims:
    """The roles of a ``dot``'s dimensions (its result: batch, then lhs free, then rhs free)."""
    lb, rb = tuple(instr.attr("lhs_batch_dims", ())), tuple(instr.attr("rhs_batch_dims", ()))
    lc, rc = tuple(instr.attr("lhs_contracting_dims", ())), tuple(instr.attr("rhs_contracting_dims", ()))
    lf = tuple(d for d in range(lhs_rank) if d not in lb and d not in lc)
    rf = tuple(d for d in range(rhs_rank) if d not in rb and d not in rc)
    nb = len(lb)
    return DotDims(
        lhs_batch=lb,
        rhs_batch=rb,
        out_batch=tuple(range(nb)),
        lhs_contracting=lc,
        rhs_contracting=rc,
        lhs_free=lf,
        out_lhs_free=tuple(range(nb, nb + len(lf))),
        rhs_free=rf,
        out_rhs_free=tuple(range(nb + len(lf), nb + len(lf) + len(rf))),
    )


def convolution_dims(
    instr: Instruction, lhs: tuple[int, ...], rhs: tuple[int, ...], out: tuple[int, ...]
) -> DotDims | None:
    """The roles of a convolution's dimensions when it is a matrix product (see the module docstring), else
    None. ``lhs``, ``rhs`` and ``out`` are the operand and result dimension sizes."""
    labels = instr.attr("dim_labels")
    if not isinstance(labels, ConvDims):
        return None
    if instr.attr("feature_group_count", 1) != 1 or instr.attr("batch_group_count", 1) != 1:
        return None
    window = instr.attr("window")
    spatial = len(labels.input_spatial)
    wdims = window.dims if isinstance(window, Window) else (WindowDim(1),) * spatial
    if len(wdims) != spatial:
        return None
    roles: dict[str, list[tuple[int, int, int]]] = {"batch": [], "contract": [], "lfree": [], "rfree": [], "unit": []}
    for s, w in enumerate(wdims):
        i, k, o = labels.input_spatial[s], labels.kernel_spatial[s], labels.output_spatial[s]
        role = _spatial_role(w, lhs[i], rhs[k], out[o])
        if role is None:
            return None
        roles[role].append((i, k, o))
    units_l = [i for i, _, _ in roles["unit"]] + [i for i, _, _ in roles["rfree"]]
    units_r = [k for _, k, _ in roles["unit"]] + [k for _, k, _ in roles["lfree"]]
    units_o = [o for _, _, o in roles["unit"]] + [o for _, _, o in roles["contract"]]
    return DotDims(
        lhs_batch=tuple(i for i, _, _ in roles["batch"]),
        rhs_batch=tuple(k for _, k, _ in roles["batch"]),
        out_batch=tuple(o for _, _, o in roles["batch"]),
        lhs_contracting=(labels.input_feature, *(i for i, _, _ in roles["contract"])),
        rhs_contracting=(labels.kernel_input_feature, *(k for _, k, _ in roles["contract"])),
        lhs_free=(labels.input_batch, *(i for i, _, _ in roles["lfree"])),
        out_lhs_free=(labels.output_batch, *(o for _, _, o in roles["lfree"])),
        rhs_free=(labels.kernel_output_feature, *(k for _, k, _ in roles["rfree"])),
        out_rhs_free=(labels.output_feature, *(o for _, _, o in roles["rfree"])),
        lhs_units=tuple(units_l),
        rhs_units=tuple(units_r),
        out_units=tuple(units_o),
    )


def _spatial_role(w: WindowDim, n_in: int, n_k: int, n_out: int) -> str | None:
    """The role one spatial dimension plays, from the (output, input, kernel) index triples its window
    relates (every dimension involved is small in the forms XLA writes; a big sliding window is no product)."""
    if n_in == n_k == n_out == 1 and w.size == 1:
        return "unit"
    if n_out * w.size > 1 << 16:
        return None
    triples = set()
    dilated = (n_in - 1) * w.lhs_dilate + 1
    for o in range(n_out):
        for t in range(w.size):
            at = o * w.stride + t * w.rhs_dilate - w.pad_low  # position in the dilated, padded input
            if at < 0 or at >= dilated or at % w.lhs_dilate:
                continue
            kernel = w.size - 1 - t if w.reversal else t
            triples.add((o, at // w.lhs_dilate, kernel))
    if n_k == 1 and n_in == n_out and triples == {(o, o, 0) for o in range(n_out)}:
        return "lfree"
    if n_in == 1 and n_k == n_out and triples == {(o, 0, o) for o in range(n_out)}:
        return "rfree"
    if n_out == 1 and n_in == n_k and triples == {(0, i, i) for i in range(n_in)}:
        return "contract"
    if n_in == n_k == n_out and triples == {(o, o, o) for o in range(n_out)}:
        return "batch"
    return None


def folded_contraction(d: DotDims, lhs: Shape, rhs: Shape) -> tuple[DotDims, Shape, Shape]:
    """The product with pairs of contracting dimensions folded into one wherever both operands hold the pair
    as one dimension, in the same order (:func:`~tpusim.memory.reinterpret.merged_shape`; the shapes are
    the same bytes): a weight gradient contracting batch and sequence ``[4,65,192] x [4,65,768]`` laid out
    sequence-major is one contraction of 260, not 65 contractions of 4 (the MXU lowering and the layout
    choice's cost of a product both see it so)."""
    while len(d.lhs_contracting) >= 2:
        lc, rc = d.lhs_contracting, d.rhs_contracting
        found = None
        for j, k in itertools.permutations(range(len(lc)), 2):  # (fold pair j into pair k, in both operands)
            ls, rs = merged_shape(lhs, lc[j], lc[k]), merged_shape(rhs, rc[j], rc[k])
            if ls is not None and rs is not None:
                found = j, ls, rs
                break
        if found is None:
            break
        j, lhs, rhs = found
        d = dims_without(d, lhs=lc[j], rhs=rc[j])
    return d, lhs, rhs


_FIELDS = {
    "lhs": ("lhs_batch", "lhs_contracting", "lhs_free", "lhs_units"),
    "rhs": ("rhs_batch", "rhs_contracting", "rhs_free", "rhs_units"),
    "out": ("out_batch", "out_lhs_free", "out_rhs_free", "out_units"),
}


def dims_without(d: DotDims, **gone: int) -> DotDims:
    """``d`` for arrays seen with one dimension fewer: per array named (``lhs``, ``rhs``, ``out``), dimension
    ``gone[array]`` dropped from its roles and the later ones renumbered as in a shape without it (a fold
    merged it into a neighbour)."""
    return replace(
        d,
        **{f: tuple(x - (x > g) for x in getattr(d, f) if x != g) for a, g in gone.items() for f in _FIELDS[a]},
    )
