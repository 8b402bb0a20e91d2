"""Shared by gather and scatter: their dimension numbers in one normal form, the index array staged in SMEM,
and the per-slice code that reads each index vector into scalar registers.

Normal form (:class:`Slices`). Both ops move *slices* of an operand: one per *batch position* of the index
array (its dimensions other than ``index_vector_dim``), a box of ``sizes`` (one size per operand dimension)
starting at a vector built from the position's index vector (``start_index_map`` / ``scatter_dims_to_
operand_dims``) and, for batching dimensions, from the position itself. The *other* array (gather's result,
scatter's updates) holds the slices with the dropped dimensions (collapsed / inserted / batching, size 1)
removed; its dimensions are a permutation of the *canonical* order ``(batch..., window...)``, the window
dimensions being the kept operand dimensions in operand order (Operation Semantics: ``remapped_offset_dims``
and ``window_dims_to_operand_dims`` are monotonic).

Staging. A row-major, untiled VMEM array of ``C`` slices seen two ways holds the same bytes: as
``(C * sizes[0], sizes[1], ...)``, where slice ``g`` is the window at row ``g * sizes[0]`` with the operand's
own window sizes (so a DMA or a VPU copy moves one slice at a time, each to its own byte range, which the
scoreboard sees as independent), and as the canonical ``(batch..., window...)`` array, which a permuted view
(:func:`tpusim.compiler.lowering.views.view_shape`) turns into the other array's dimension order.

Indices. A chunk of index vectors is DMA'd into SMEM as a row-major ``(batch..., K)`` array (the index array
viewed with ``index_vector_dim`` last), and ``s.load`` reads component ``k`` of slice ``g`` from word
``g * K + k``. Register offsets are read when an instruction issues, so a handful of registers serve any
number of slices. The per-slice code is straight-line (:func:`each_slice`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod

from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.lowering.context import Lowering
from tpusim.compiler.lowering.registry import NotLowerable
from tpusim.compiler.lowering.views import view_shape
from tpusim.isa import DmaStart, MemRef, Reg, ScalarAlu, ScalarLoad, Space, Window
from tpusim.memory import Layout, Shape

__all__ = [
    "MAX_SLICES",
    "Slices",
    "each_slice",
    "gather_slices",
    "index_chunk",
    "row_major",
    "scatter_slices",
    "take_registers",
    "take_semaphores",
]

MAX_SLICES = 1 << 14
"""Most slices a gather or scatter visits one by one (each costs a few scalar instructions and one DMA or
vector instruction as the simulator executes it); beyond that the op falls back."""

MAX_COMPONENTS = 6
"""Most index-vector entries (one scalar register each) a lowered gather or scatter reads per slice."""


def _ints(instr: Instruction, key: str) -> tuple[int, ...]:
    return tuple(int(d) for d in instr.attr(key, ()))


@dataclass(frozen=True, slots=True)
class Slices:
    """Gather's or scatter's dimension numbers in normal form (see the module docstring).

    Attributes:
        operand: the operand's shape (layout included).
        indices: the index array's shape.
        other: the gathered result's or the updates' shape.
        batch: the batch shape: the index array's dimensions other than the index vector dimension.
        index_dims: operand dimension of each index-vector entry.
        batching: ``(operand dimension, batch axis)`` pairs: the slice starts at the batch position there.
        sizes: the slice's size along every operand dimension (1 on dropped dimensions).
        window_dims: the operand dimensions the other array keeps, in order.
        other_perm: other-array dimension ``i`` is canonical axis ``other_perm[i]``.
        index_order: the view of the index array as ``(batch..., K)`` (None: the implicit trailing 1).
    """

    operand: Shape
    indices: Shape
    other: Shape
    batch: tuple[int, ...]
    index_dims: tuple[int, ...]
    batching: tuple[tuple[int, int], ...]
    sizes: tuple[int, ...]
    window_dims: tuple[int, ...]
    other_perm: tuple[int, ...]
    index_order: tuple[int | None, ...]

    @property
    def count(self) -> int:
        """Number of slices."""
        return prod(self.batch)

    @property
    def components(self) -> int:
        return len(self.index_dims)

    @property
    def rows(self) -> int:
        """Extent of the first batch axis (chunks cut it); 1 without batch axes."""
        return self.batch[0] if self.batch else 1

    @property
    def per_row(self) -> int:
        """Slices per row of the first batch axis."""
        return prod(self.batch[1:])

    def canonical(self, rows: int) -> tuple[int, ...]:
        """Dimensions of the canonical ``(batch..., window...)`` array of ``rows`` rows of the first batch axis."""
        window = tuple(self.sizes[d] for d in self.window_dims)
        return ((rows, *self.batch[1:]) if self.batch else ()) + window

    def other_dims(self, rows: int) -> tuple[int, ...]:
        """The other array's dimensions for ``rows`` rows of the first batch axis."""
        canon = self.canonical(rows)
        return tuple(canon[p] for p in self.other_perm)

    @property
    def row_dim(self) -> int | None:
        """The other array's dimension that is the first batch axis (None without batch axes)."""
        return self.other_perm.index(0) if self.batch else None


def _normal_form(
    operand: Shape,
    indices: Shape,
    other: Shape,
    index_vector_dim: int,
    index_dims: tuple[int, ...],
    dropped: tuple[int, ...],
    operand_batching: tuple[int, ...],
    index_batching: tuple[int, ...],
    other_window: tuple[int, ...],
    sizes: tuple[int, ...],
) -> Slices:
    """:class:`Slices` from dimension numbers, or NotLowerable naming what does not fit together."""
    q, r = indices.rank, operand.rank
    if not 0 <= index_vector_dim <= q:
        raise NotLowerable(f"index_vector_dim {index_vector_dim} is outside the rank-{q} index array")
    axes = [a for a in range(q) if a != index_vector_dim]
    batch = tuple(indices.dimensions[a] for a in axes)
    k = indices.dimensions[index_vector_dim] if index_vector_dim < q else 1
    if k != len(index_dims):
        raise NotLowerable(f"index vectors have {k} entries for {len(index_dims)} mapped operand dimensions")
    if len(set(index_dims) | set(operand_batching)) != len(index_dims) + len(operand_batching):
        raise NotLowerable("an operand dimension is both indexed and batched, or indexed twice")
    if any(not 0 <= d < r for d in (*index_dims, *dropped, *operand_batching)):
        raise NotLowerable("a dimension number outside the operand")
    if len(operand_batching) != len(index_batching) or any(a not in axes for a in index_batching):
        raise NotLowerable("batching dimensions that do not pair up")
    batching = tuple((od, axes.index(a)) for od, a in zip(operand_batching, index_batching))
    gone = set(dropped) | set(operand_batching)
    window_dims = tuple(d for d in range(r) if d not in gone)
    ow = sorted(other_window)
    if len(ow) != len(window_dims) or other.rank != len(batch) + len(ow):
        raise NotLowerable(f"{other} does not hold {len(batch)} batch and {len(window_dims)} window dimensions")
    perm, b = [], 0
    for i in range(other.rank):
        if i in ow:
            perm.append(len(batch) + ow.index(i))
        else:
            perm.append(b)
            b += 1
    for d in gone:
        if sizes[d] != 1:
            raise NotLowerable(f"dropped operand dimension {d} has slice size {sizes[d]}, not 1")
    for d in range(r):
        if not 0 <= sizes[d] <= operand.dimensions[d]:
            raise NotLowerable(f"slice size {sizes[d]} does not fit operand dimension {d}")
    order: tuple[int | None, ...] = (*axes, index_vector_dim) if index_vector_dim < q else (*axes, None)
    sl = Slices(operand, indices, other, batch, index_dims, batching, sizes, window_dims, tuple(perm), order)
    if sl.other_dims(sl.rows) != other.dimensions:
        raise NotLowerable(f"{other.dims_str()} is not the shape the dimension numbers give")
    return sl


def gather_slices(instr: Instruction, operand: Shape, indices: Shape, out: Shape) -> Slices:
    """The normal form of a ``gather`` (XLA's GatherDimensionNumbers)."""
    return _normal_form(
        operand,
        indices,
        out,
        int(instr.attr("index_vector_dim", indices.rank)),
        _ints(instr, "start_index_map"),
        _ints(instr, "collapsed_slice_dims"),
        _ints(instr, "operand_batching_dims"),
        _ints(instr, "start_indices_batching_dims"),
        _ints(instr, "offset_dims"),
        _ints(instr, "slice_sizes"),
    )


def scatter_slices(instr: Instruction, operand: Shape, indices: Shape, updates: Shape) -> Slices:
    """The normal form of a ``scatter`` (XLA's ScatterDimensionNumbers); slice sizes come from the updates."""
    window = sorted(_ints(instr, "update_window_dims"))
    inserted = _ints(instr, "inserted_window_dims")
    batching = _ints(instr, "input_batching_dims")
    kept = [d for d in range(operand.rank) if d not in set(inserted) | set(batching)]
    if len(kept) != len(window) or any(w >= updates.rank for w in window):
        raise NotLowerable(f"{len(window)} update window dimensions for {len(kept)} operand window dimensions")
    sizes = [1] * operand.rank
    for d, w in zip(kept, window):
        sizes[d] = updates.dimensions[w]
    return _normal_form(
        operand,
        indices,
        updates,
        int(instr.attr("index_vector_dim", indices.rank)),
        _ints(instr, "scatter_dims_to_operand_dims"),
        inserted,
        batching,
        _ints(instr, "scatter_indices_batching_dims"),
        tuple(window),
        tuple(sizes),
    )


def row_major(shape: Shape) -> Shape:
    """``shape`` without tiles, in row-major order."""
    return shape.with_layout(Layout.default(shape.rank))


def take_semaphores(ctx: Lowering, n: int) -> list[int]:
    """``n`` semaphores, or NotLowerable when the core has too few free."""
    try:
        return [ctx.semaphore() for _ in range(n)]
    except CompileError as exc:
        raise NotLowerable(f"not enough free semaphores ({exc})") from None


def take_registers(ctx: Lowering, n: int) -> list[Reg]:
    """``n`` scalar registers, or NotLowerable when the core has too few free."""
    try:
        return [ctx.register() for _ in range(n)]
    except CompileError as exc:
        raise NotLowerable(f"not enough free scalar registers ({exc})") from None


def index_chunk(ctx: Lowering, sl: Slices, indices: MemRef, slot: MemRef, first: int, rows: int, sem: int) -> MemRef:
    """DMA the index vectors of rows ``first .. first+rows-1`` of the first batch axis into SMEM at ``slot``'s
    address as a row-major ``(rows, batch[1:]..., K)`` array, signalling ``sem``; returns that SMEM array."""
    view = MemRef(indices.space, indices.address, view_shape(indices.shape, sl.index_order), base=indices.base)
    dims = ((rows, *sl.batch[1:]) if sl.batch else ()) + (sl.components,)
    if sl.batch and rows != sl.rows:
        view = MemRef(view.space, view.address, view.shape, Window((first,) + (0,) * (len(dims) - 1), dims), view.base)
    dst = MemRef(Space.SMEM, slot.address, row_major(Shape(indices.shape.element_type, dims)))
    ctx.emit(DmaStart, src=view, dst=dst, sem=sem, control=True)
    return dst


def each_slice(
    ctx: Lowering,
    sl: Slices,
    smem: MemRef,
    count: int,
    first: int,
    body: Callable[[int, tuple[int | Reg, ...], int], None],
    saturate_unsigned: bool,
) -> None:
    """Emit, for each of ``count`` slices whose index vectors are the rows of ``smem`` (from
    :func:`index_chunk`; the first is slice ``first`` of the whole op), the loads of its index vector into
    registers and then ``body(g, starts, row)``: ``g`` the slice's number in the chunk, ``starts`` its start
    per operand dimension (a register for indexed dimensions, the batch position for batching dimensions, 0
    elsewhere), ``row`` its first row in the staging view (``g * sizes[0]``).

    The code is straight-line (no labels or branches): DMAs stay in flight across it, which the program
    verifier only allows between control-flow points, and the sequencer spends nothing on loop counters.
    The same registers serve every slice (instructions read them at issue).

    Args:
        saturate_unsigned: raise u32 indices at or above 2^31 (negative in a register) to 2^31 - 1, so a
            clamping window puts them at the end of the dimension as XLA does; otherwise they stay negative
            (out of bounds for a bounds check).
    """
    et = smem.element_type
    k = sl.components
    unsigned = et.name == "u32" and saturate_unsigned
    regs = take_registers(ctx, k + (1 if unsigned else 0))
    idx, high = regs[:k], regs[k] if unsigned else None
    word = Shape(et, ())
    strides = [prod(sl.batch[a + 1 :]) for a in range(len(sl.batch))]
    for g in range(count):
        at = smem.address + g * k * et.bits // 8
        for j, reg in enumerate(idx):
            ctx.emit(ScalarLoad, dst=reg, src=MemRef(Space.SMEM, at + j * et.bits // 8, word))
            if high is not None:
                ctx.emit(ScalarAlu, fn="sra", dst=high, a=reg, b=31)
                ctx.emit(ScalarAlu, fn="shr", dst=high, a=high, b=1)
                ctx.emit(ScalarAlu, fn="max", dst=reg, a=reg, b=high)
        starts: list[int | Reg] = [0] * sl.operand.rank
        for d, reg in zip(sl.index_dims, idx):
            starts[d] = reg
        for d, axis in sl.batching:
            starts[d] = (first + g) // strides[axis] % sl.batch[axis]
        body(g, tuple(starts), g * sl.sizes[0])
    for reg in regs:
        ctx.release_register(reg)


def scalar_cycles(ctx: Lowering, sl: Slices, extra: int = 0) -> int:
    """Sequencer cycles one slice takes besides its body's ``extra`` instructions (each load stalls for
    ``smem.latency_cycles``)."""
    loads = sl.components * (1 + ctx.config.smem.latency_cycles)
    unsigned = 3 * sl.components if sl.indices.element_type.name == "u32" else 0
    return loads + unsigned + extra


def staging_view(sl: Slices, stage: MemRef, count: int) -> Shape:
    """The staging array seen as ``(count * sizes[0], sizes[1], ...)`` (slice ``g`` at row ``g * sizes[0]``)."""
    dims = (count * sl.sizes[0], *sl.sizes[1:])
    return row_major(Shape(stage.element_type, dims))


def windowed(ref: MemRef, offsets: Sequence[int | Reg], sizes: Sequence[int], clamp: bool = False) -> MemRef:
    """``ref`` (a whole array) restricted to a window."""
    return MemRef(ref.space, ref.address, ref.shape, Window(tuple(offsets), tuple(sizes), clamp), ref.base)
