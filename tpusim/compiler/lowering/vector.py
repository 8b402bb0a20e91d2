"""Vector operations on the VPU, tile by tile: elementwise ops, XLA loop fusions, and the data-movement and
reduction ops a fusion may hold (broadcast, transpose, reshape, slice, concatenate, pad, iota, convert,
select, clamp, compare, copy, reduce, dynamic-slice).

A fused computation runs block by block (see :mod:`.blocks`): the inputs of block k+1 are DMA'd from HBM
into one VMEM buffer set while block k is computed from the other, each fused instruction writes its block
to VMEM (no HBM round trip between fused ops), and the result block is DMA'd out while the next block
computes. A single HLO op outside a fusion is lowered the same way, as a fusion of one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import ml_dtypes

from tpusim.compiler.blocks import (
    BLOCK_TARGET_BYTES,
    NEED_RULES,
    Need,
    Plan,
    block_shape,
    on_vpu,
    plan_needs,
    reduction_split,
    tile_granule,
)
from tpusim.compiler.hlo.ir import Computation, Instruction, SliceDim
from tpusim.compiler.lowering.context import Lowering, StateKey, VmemExhausted
from tpusim.compiler.lowering.control import read_scalar
from tpusim.compiler.lowering.dot import absorbs
from tpusim.compiler.lowering.immediates import scalar_constant
from tpusim.compiler.lowering.registry import NotLowerable, lowering
from tpusim.compiler.lowering.reinterpret import emit_reduce_precision
from tpusim.compiler.rewrite import single_computation
from tpusim.isa import (
    REDUCE_FUNCTIONS,
    REINTERPRETS,
    Barrier,
    Const,
    DmaStart,
    FusedOp,
    MemRef,
    Operand,
    Reg,
    SemWait,
    Space,
    VpuBroadcast,
    VpuCopy,
    VpuFused,
    VpuIota,
    VpuMap,
    VpuReduce,
    VpuReshape,
    Window,
    XluTranspose,
)
from tpusim.memory import ElementType, Shape
from tpusim.memory.reinterpret import LayoutViewError, bytes_agree, free_transpose, physical_is_logical, view_shape

__all__ = ["DMA_FIRST", "combiner", "lower_vector", "reduce_identity"]

DMA_FIRST = frozenset({"copy", "bitcast", "reshape", "slice", "concatenate", "pad"})
"""Ops whose rule outside a fusion is in :mod:`.movement`: DMAs, or this module's path where cheaper."""

# Ops that run as "a fusion of one" when they appear outside a fusion.
# (A bitcast-convert outside a fusion is a DMA or nothing: reinterpret.py.)
_SINGLE_OPS = sorted(set(NEED_RULES) - {"parameter", "constant", "dynamic-slice"} - DMA_FIRST - REINTERPRETS)
RING = 4
"""VMEM buffer sets per blocked input and output: two blocks' inputs are in flight while one block computes,
and the spare set lets a refill start although the compute of the block before it (on another XLU or VPU
slot) may still read its buffer. Two sets in lockstep (both refilled only after both computed) left HBM idle
for a latency and a compute every other block: a row sum streamed at 58% of HBM's bandwidth, 93% so. A core
with few semaphores (each set takes two) gets two sets, one block in flight."""
"""Largest output block aimed for: big enough to amortise DMA set-up, small enough to pipeline."""


def combiner(ctx: Lowering, name: str) -> str | None:
    """The VPU reduce function a reducer computation applies (``add`` for ``ROOT r = add(p0, p1)``), or None."""
    comp = ctx.module[name]
    root = comp.root_instruction
    params = {p.name for p in comp.parameters}
    if len(params) == 2 and root.opcode in REDUCE_FUNCTIONS and set(root.operands) == params:
        return root.opcode
    return None


def reduce_identity(fn: str, et: ElementType) -> float | int | bool | None:
    """The value of element type ``et`` that combining with under reduce function ``fn`` changes nothing, or
    None (pred arithmetic is logic: add and maximum are or, multiply and minimum are and)."""
    if et.name == "pred":
        return fn in ("multiply", "minimum", "and") if fn in REDUCE_FUNCTIONS else None
    if et.is_float:
        return {"add": 0.0, "multiply": 1.0, "maximum": float("-inf"), "minimum": float("inf")}.get(fn)
    info = ml_dtypes.iinfo(et.dtype)  # (numpy's iinfo does not know s4/u4 and the other narrow integers)
    table: dict[str, int] = {"add": 0, "multiply": 1, "maximum": int(info.min), "minimum": int(info.max)}
    table |= {"or": 0, "xor": 0, "and": -1 if et.kind == "signed" else int(info.max)}
    return table.get(fn)


def _is_identity(fn: str, init: Const) -> bool:
    """True when combining with ``init`` changes nothing (so a reduce need not apply it)."""
    identity = reduce_identity(fn, init.etype)
    return identity is not None and Const(identity, init.etype) == init


@dataclass
class _Emitter:
    """Emits the blocks of one fused computation."""

    ctx: Lowering
    comp: Computation  # the fused computation
    plan: Plan
    inputs: dict[str, MemRef]  # parameter name -> HBM array of the operand
    outputs: list[tuple[str, MemRef]]  # (root value, HBM array) pairs
    block: int
    hoisted: dict[str, MemRef] = field(default_factory=dict)
    scalars: dict[str, Reg] = field(default_factory=dict)
    inlined: frozenset[str] = frozenset()
    windows: dict[str, Instruction] = field(default_factory=dict)  # inputs only a dynamic-slice reads (its window)
    sems: tuple[int, ...] = ()  # one per buffer set for inputs, then one per set for outputs
    index: int = 0  # the block being emitted
    last: bool = True  # it is the last block
    at: tuple[int, int] = (0, 0)  # its (start, size)
    first: int = 0  # the first block this core emits
    # Megacore, an accumulating reduction split across the cores: (this core, HBM homes of the partial
    # results of cores 1.., filled by them) while a core emits its share; None otherwise.
    partials: tuple[int, list[MemRef]] | None = None
    homes: dict[str, MemRef] = field(default_factory=dict)  # results computed where they live (_written_home)

    def __post_init__(self) -> None:
        self.inlined = self._chains()
        self.windows = {n: ds for n in self.inputs if (ds := self._dynamic_window(n)) is not None}
        self.homes = self._written_home()

    def _written_home(self) -> dict[str, MemRef]:
        """The results computed straight into their home in VMEM (a resident value, as a kernel stores its
        output block where the next kernel reads it), by root: those whose blocks have the home's layout
        and whose home shares no byte with an input or another output. The others are computed into
        block buffers and copied to their homes by DMA (a copy as long as the computation for a VMEM home:
        each threefry round's results)."""
        if self.plan.accumulate is not None or self.ctx.share is not None:
            return {}
        found = {}
        for k, (root, home) in enumerate(self.outputs):
            others = [*self.inputs.values(), *(ref for j, (_, ref) in enumerate(self.outputs) if j != k)]
            instr = self.comp[root]
            if home.space is not Space.VMEM or instr.opcode in ("parameter", "constant") or root in self.scalars:
                continue
            if not home.shape.lays_out_like(instr.array_shape):
                continue
            if any(o.shares_bytes(home) for o in others):
                continue
            found[root] = home
        return found

    def _chains(self) -> frozenset[str]:
        """Elementwise values folded into their one elementwise user's ``vpu.fused`` chain (kept in vector
        registers instead of a VMEM block)."""
        users: dict[str, list[str]] = {}
        for name in self.plan.order:
            for o in set(self.comp[name].operands):
                users.setdefault(o, []).append(name)
        roots = {r for r, _ in self.outputs}
        out = set()
        for name in self.plan.order:
            mine = users.get(name, [])
            if (
                name not in roots
                and (_chainable(self, self.comp[name]) or self._register_broadcast(name))
                and len(mine) == 1
                and _chainable(self, self.comp[mine[0]])
                and self.comp[mine[0]].operands.count(name) == 1
            ):
                out.add(name)
        return frozenset(out)

    def _register_broadcast(self, name: str) -> bool:
        """A broadcast its elementwise user can read as a ``vpu.fused`` source of size 1 along the new
        dimensions (replicated in registers, as a fused kernel does, not stored as a whole block): its
        dimensions in order, from a value computed or loaded in the block."""
        instr = self.comp[name]
        if instr.opcode != "broadcast" or not isinstance(instr.shape, Shape):
            return False
        dims = tuple(instr.attr("dimensions", ()))
        operand = self.comp[instr.operands[0]]
        return list(dims) == sorted(dims) and operand.opcode != "constant" and not self._in_place(operand.name)

    # ------------------------------------------------------------------ buffers
    def _loaded(self, name: str) -> bool:
        instr = self.comp[name]
        return instr.opcode == "parameter" or (instr.opcode == "constant" and instr.array_shape.rank > 0)

    def _dynamic_window(self, name: str) -> Instruction | None:
        """The dynamic-slice that is the only reader of input ``name`` (a parameter every block shares, in
        HBM, with scalar start indices): its window alone is loaded, at the indices the registers hold when
        the load issues, clamped as XLA clamps them (a ``fori_loop`` reading one 256-row slice of an 8 MB
        array per iteration loaded all 8 MB each time)."""
        instr = self.comp[name]
        source = self.inputs.get(name)
        if instr.opcode != "parameter" or source is None or source.window is not None or name not in self.plan.needs:
            return None
        if source.space is Space.VMEM or self.plan.needs[name][0] is not None:
            return None
        readers = [i for i in self.comp.instructions if name in i.operands]
        if len(readers) != 1 or readers[0].opcode != "dynamic-slice" or readers[0].operands[0] != name:
            return None
        ds = readers[0]
        if name in ds.operands[1:] or not all(
            o in self.scalars or self._constant_scalar(o) is not None for o in ds.operands[1:]
        ):
            return None
        return ds

    def _start_index(self, name: str) -> int | Reg:
        """A dynamic-slice start index: its scalar register, or its constant."""
        reg = self.scalars.get(name)
        if reg is not None:
            return reg
        const = self._constant_scalar(name)
        assert const is not None
        return int(const.value)

    def _in_place(self, name: str) -> bool:
        """An input already in VMEM (a resident value): the vector unit reads its block where it is, with no
        DMA into a block buffer (a TPU kernel's vector loads read VMEM at any sublane)."""
        ref = self.inputs.get(name)
        return ref is not None and ref.space is Space.VMEM and self.comp[name].opcode == "parameter"

    def allocate(self) -> tuple[list[dict[str, MemRef]], dict[str, MemRef]]:
        """VMEM buffers: one set per semaphore pair for per-block inputs and outputs, one for everything else."""
        sets: list[dict[str, MemRef]] = [{} for _ in range(len(self.sems) // 2)]
        single: dict[str, MemRef] = {}
        roots = {r for r, _ in self.outputs}
        for name in self.plan.order:
            instr = self.comp[name]
            if name in self.scalars or name in self.inlined or self._in_place(name) or name in self.homes:
                continue
            if self._constant_scalar(name) is not None and name not in roots:
                continue
            shape, _ = block_shape(instr.array_shape, self.plan.needs[name], 0, self.block + self._room(name))
            window = self.windows.get(name)
            if window is not None:
                shape = Shape(shape.element_type, window.array_shape.dimensions, layout=shape.layout)
            varies = self.plan.needs[name][0] is not None
            if (self._loaded(name) or name in roots) and varies and self.plan.extent > self.block:
                for buffers in sets:
                    buffers[name] = self.ctx.vmem(shape)
            else:
                single[name] = self.ctx.vmem(shape)
        return sets, single

    def _constant_scalar(self, name: str) -> Const | None:
        instr = self.comp[name]
        if instr.opcode == "constant" and instr.array_shape.rank == 0:
            const = scalar_constant(instr)
            if const is None:
                raise NotLowerable(f"a {instr.array_shape.element_type} constant on the VPU")
            return const
        if instr.opcode == "broadcast" and self._constant_scalar(instr.operands[0]) is not None:
            return self._constant_scalar(instr.operands[0])
        return None

    # ------------------------------------------------------------------ emission
    def run(self) -> None:
        ctx = self.ctx
        nblocks = -(-self.plan.extent // self.block)
        # Megacore: the output blocks are independent, each core computes a contiguous share of them. An
        # accumulating reduction (one output, its operand cut into blocks) gives each core a share of the
        # operand's blocks: the others leave their partial results in HBM, core 0 combines them.
        mine = list(ctx.split(nblocks))
        if self.plan.accumulate is not None and len(mine) < nblocks:
            assert ctx.share is not None
            self.partials = (ctx.share[0], self._partial_homes())
        self.first = mine[0]
        sets, single = self.allocate()
        ring = len(self.sems) // 2
        ahead = max(1, ring - 2)
        sem_in, sem_out = self.sems[:ring], self.sems[ring:]
        self._hoist(single)
        pending_out = [0] * ring
        issued = [self._issue_inputs(k, sets[j], single, sem_in[j]) for j, k in enumerate(mine[:ahead])]
        for i, k in enumerate(mine):
            r = i % ring
            if i + ahead < len(mine):
                j = (i + ahead) % ring
                issued.append(self._issue_inputs(mine[i + ahead], sets[j], single, sem_in[j]))
            if issued[i]:
                ctx.emit(SemWait, sem=sem_in[r], count=issued[i])
            if pending_out[r]:
                ctx.emit(SemWait, sem=sem_out[r], count=pending_out[r])
                pending_out[r] = 0
            buffers = {**single, **sets[r]}
            start, size = k * self.block, min(self.block, self.plan.extent - k * self.block)
            self.index, self.last = k, k == nblocks - 1
            if self.partials is not None:  # core 0 finishes the reduction after its own last block
                self.last = self.partials[0] == 0 and k == mine[-1]
            values = self._compute_block(buffers, start, size)
            if self.plan.accumulate is not None and not self.last:
                if self.partials is not None and self.partials[0] > 0 and k == mine[-1]:
                    self._leave_partial(values[self.plan.accumulate])
                continue  # the outputs are whole, and complete after the last block
            for root, hbm in self.outputs:
                src = values[root]
                if not isinstance(src, MemRef):
                    src = self._materialize(root, buffers, start, size, src)
                dst = self._window(hbm, (self.plan.tiled, 0), start, size)
                if src == dst:  # (computed where it lives)
                    continue
                ctx.emit(DmaStart, src=src, dst=dst, sem=sem_out[r])
                pending_out[r] += 1
        for i in range(ring):
            if pending_out[i]:
                ctx.emit(SemWait, sem=sem_out[i], count=pending_out[i])

    def _partial_homes(self) -> list[MemRef]:
        """HBM homes for the partial results of cores 1.. of a split accumulating reduction: allocated while
        core 0's share is emitted (the first), found again by the others."""
        ctx = self.ctx
        assert ctx.share is not None and self.plan.accumulate is not None
        key: StateKey[list[MemRef]] = StateKey(f"megacore-partials:{ctx.hlo}")
        if ctx.share[0] == 0:
            name = self.plan.accumulate
            shape, _ = block_shape(self.comp[name].array_shape, self.plan.needs[name], 0, self.block)
            ctx.rule_state.set(key, [ctx.scratch(shape) for _ in range(1, ctx.share[1])])
        homes = ctx.rule_state.get(key)
        assert homes is not None, "core 0's share allocates the partial homes first"
        return homes

    def _leave_partial(self, value: Operand) -> None:
        """A core other than 0: its partial result to HBM, then the barrier core 0 waits at to combine."""
        assert self.partials is not None and isinstance(value, MemRef)
        core, homes = self.partials
        home = homes[core - 1]
        sem = self.ctx.semaphore()
        self.ctx.emit(DmaStart, src=value, dst=MemRef(home.space, home.address, value.shape), sem=sem)
        self.ctx.emit(SemWait, sem=sem, count=1)
        self.ctx.emit(Barrier)

    def combine_partials(self, fn: str, dst: MemRef) -> None:
        """Core 0, after its last block: wait for the other cores' partial results and combine them."""
        assert self.partials is not None
        ctx = self.ctx
        ctx.emit(Barrier)
        sem = ctx.semaphore()
        loaded = []
        for home in self.partials[1]:
            temp = ctx.vmem(dst.shape)
            ctx.emit(DmaStart, src=MemRef(home.space, home.address, dst.shape), dst=temp, sem=sem)
            loaded.append(temp)
        ctx.emit(SemWait, sem=sem, count=len(loaded))
        for temp in loaded:
            ctx.emit(VpuMap, fn=fn, dst=dst, srcs=(dst, temp))

    def _window(self, hbm: MemRef, need: tuple[int | None, int], start: int, size: int) -> MemRef:
        """The block's window of an input or output array; of a window of one (a row of an outer split,
        :func:`_outer_split`), the block's part of that window."""
        if hbm.window is None:
            block, offsets = block_shape(hbm.shape, need, start, size)
            if block.dimensions == hbm.shape.dimensions:
                return hbm
            return MemRef(hbm.space, hbm.address, hbm.shape, Window(offsets, block.dimensions), hbm.base)
        seen = Shape(hbm.element_type, hbm.window.sizes, layout=hbm.shape.layout)
        block, offsets = block_shape(seen, need, start, size)
        base = hbm.window.offsets
        moved = tuple(b + o for b, o in zip(base, offsets))  # type: ignore[operator]
        return MemRef(hbm.space, hbm.address, hbm.shape, Window(moved, block.dimensions), hbm.base)

    def _block_ref(self, ref: MemRef, name: str, start: int, size: int) -> MemRef:
        """The VMEM buffer of ``name`` with the shape of this block (a partial last block is smaller)."""
        shape, _ = block_shape(self.comp[name].array_shape, self.plan.needs[name], start, size)
        return ref if shape == ref.shape else MemRef(ref.space, ref.address, shape)

    def _alignment(self, name: str) -> tuple[int, int] | None:
        """(tile size, offset in the array of the first block's start) along the need's dimension of an input
        loaded block by block, when a tile cuts that dimension; None otherwise (inputs read in place or
        shared by every block)."""
        dim, off = self.plan.needs[name]
        if dim is None or not self._loaded(name) or self._in_place(name) or self.comp[name].opcode != "parameter":
            return None
        source = self.inputs[name]
        base = source.window.offsets[dim] if source.window is not None else 0
        granule = tile_granule(source.shape, dim)
        if not isinstance(base, int) or granule <= 1:
            return None
        return granule, base + off

    def _slack(self, name: str, start: int) -> int:
        """Rows (along its need's dimension) the load of an input's block at ``start`` reads before it: the
        block's start in the array modulo the tile there, so that the DMA moves whole tiles (a window that
        starts inside a packed bf16 or int8 tile, ``x[1:]``, moved its elements one by one) and the block
        is a window of the loaded rows, which the vector unit reads at any sublane."""
        aligned = self._alignment(name)
        return 0 if aligned is None else (aligned[1] + start) % aligned[0]

    def _room(self, name: str) -> int:
        """The most :meth:`_slack` of any block of ``name`` (its block buffers are that much longer)."""
        aligned = self._alignment(name)
        if aligned is None:
            return 0
        granule, first = aligned
        return first % granule if self.block % granule == 0 else granule - 1

    def _loaded_block(self, buffer: MemRef, name: str, start: int, size: int) -> tuple[MemRef, MemRef]:
        """(what the load of ``name``'s block at ``start`` writes, the block the computation reads): the same
        buffer, or with :meth:`_slack` rows, the loaded rows and the block's window of them."""
        slack = self._slack(name, start)
        loaded = self._block_ref(buffer, name, start - slack, size + slack)
        if not slack:
            return loaded, loaded
        dim = self.plan.needs[name][0]
        assert dim is not None
        offsets = tuple(slack if d == dim else 0 for d in range(loaded.shape.rank))
        sizes = tuple(size if d == dim else n for d, n in enumerate(loaded.shape.dimensions))
        return loaded, MemRef(loaded.space, loaded.address, loaded.shape, Window(offsets, sizes))

    def _hoist(self, single: dict[str, MemRef]) -> None:
        """Load the inputs every block shares once, and the scalars dynamic offsets need."""
        ctx = self.ctx
        shared = [n for n in self.plan.order if self._loaded(n) and self.plan.needs[n][0] is None and n in single]
        if shared:
            sem = ctx.semaphore()
            for name in shared:
                src, window = self._source(name), self.windows.get(name)
                if window is not None:
                    starts = tuple(self._start_index(o) for o in window.operands[1:])
                    src = MemRef(
                        src.space, src.address, src.shape, Window(starts, window.array_shape.dimensions, True), src.base
                    )
                ctx.emit(DmaStart, src=src, dst=single[name], sem=sem)
            ctx.emit(SemWait, sem=sem, count=len(shared))
            self.hoisted = {n: single[n] for n in shared}

    def _source(self, name: str) -> MemRef:
        instr = self.comp[name]
        if instr.opcode == "parameter":
            return self.inputs[name]
        return self.ctx.constant_array(instr)

    def _issue_inputs(self, k: int, buffers: dict[str, MemRef], single: dict[str, MemRef], sem: int) -> int:
        start, size = k * self.block, min(self.block, self.plan.extent - k * self.block)
        count = 0
        for name in self.plan.order:
            if not self._loaded(name) or name in self.hoisted:
                continue
            dst = buffers.get(name, single.get(name))
            if dst is None:
                continue
            slack = self._slack(name, start)
            src = self._window(self._source(name), self.plan.needs[name], start - slack, size + slack)
            self.ctx.emit(DmaStart, src=src, dst=self._loaded_block(dst, name, start, size)[0], sem=sem)
            count += 1
        return count

    def _materialize(self, name: str, buffers: dict[str, MemRef], start: int, size: int, value: Operand) -> MemRef:
        dst = self._block_ref(buffers[name], name, start, size) if name in buffers else None
        if dst is None:
            shape, _ = block_shape(self.comp[name].array_shape, self.plan.needs[name], start, size)
            dst = self.ctx.vmem(shape)
        self.ctx.emit(VpuBroadcast, dst=dst, src=value, dims=())
        return dst

    def _compute_block(self, buffers: dict[str, MemRef], start: int, size: int) -> dict[str, Operand]:
        values: dict[str, Operand] = {}
        self.at = (start, size)
        for name in self.plan.order:
            instr = self.comp[name]
            const = self._constant_scalar(name)
            if const is not None:
                values[name] = const
                continue
            if name in self.scalars:
                values[name] = self.scalars[name]
                continue
            if name in self.inlined or (name in self.plan.after and not self.last):
                continue
            if self._in_place(name):
                values[name] = self._window(self.inputs[name], self.plan.needs[name], start, size)
                continue
            if self._loaded(name):
                whole = name in self.windows  # (its buffer holds the window alone)
                values[name] = buffers[name] if whole else self._loaded_block(buffers[name], name, start, size)[1]
                continue
            home = self.homes.get(name)
            if home is not None:
                dst = self._window(home, (self.plan.tiled, 0), start, size)
            else:
                dst = self._block_ref(buffers[name], name, start, size)
            if any(o in self.inlined for o in instr.operands):
                self._emit_chain(name, dst, values)
            else:
                srcs = [values[o] for o in instr.operands]
                view = _free_view(instr, dst, srcs)
                if view is not None:  # the same bytes as the operand's block: nothing moves
                    values[name] = view
                    continue
                _EMITTERS.get(instr.opcode, _emit_elementwise)(self, instr, dst, srcs, start)
            values[name] = dst
        return values

    def _emit_chain(self, head: str, dst: MemRef, values: dict[str, Operand]) -> None:
        """One ``vpu.fused`` for ``head`` and the inlined elementwise values it is built from."""
        leaves: list[str] = []
        steps: list[str] = []

        def collect(name: str) -> None:
            for o in self.comp[name].operands:
                if o in self.inlined and self.comp[o].opcode != "broadcast":
                    collect(o)
                elif o not in leaves:
                    leaves.append(o)
            steps.append(name)

        collect(head)
        srcs = tuple(self._broadcast_source(n, values, dst) if n in self.inlined else values[n] for n in leaves)
        number = {n: i for i, n in enumerate(leaves)} | {n: len(leaves) + i for i, n in enumerate(steps)}
        ops = tuple(
            FusedOp(
                fn=self.comp[n].opcode,
                etype=self.comp[n].array_shape.element_type,
                args=tuple(number[o] for o in self.comp[n].operands),
                direction=self.comp[n].attr("direction") if self.comp[n].opcode == "compare" else None,
            )
            for n in steps
        )
        self.ctx.emit(VpuFused, dst=dst, srcs=srcs, ops=ops)

    def _broadcast_source(self, name: str, values: dict[str, Operand], dst: MemRef) -> Operand:
        """The block of broadcast ``name``'s operand seen with ``dst``'s rank, size 1 along the dimensions the
        broadcast adds (a view: the same bytes); the broadcast itself into a block when the operand's block
        is a window of a bigger array, which no view describes."""
        instr = self.comp[name]
        value = values[instr.operands[0]]
        if not isinstance(value, MemRef):
            return value  # a scalar: every step broadcasts it
        dims = tuple(instr.attr("dimensions", ()))
        order = tuple(dims.index(d) if d in dims else None for d in range(dst.shape.rank))
        if value.window is None:
            try:
                return MemRef(value.space, value.address, view_shape(value.shape, order), base=value.base)
            except LayoutViewError:
                pass
        like, _ = block_shape(instr.array_shape, self.plan.needs[name], *self.at)
        block = self.ctx.vmem(like)
        self.ctx.emit(VpuBroadcast, dst=block, src=value, dims=dims)
        return block

    def operand_ref(self, value: Operand, operand: str) -> MemRef:
        """A VMEM block for ``operand`` when its value is a splatted constant (ops other than VpuMap need
        memory): the operand's block in the block being emitted, not the whole array (a transpose of a
        broadcast constant filled all 256x784 and met a 512x256 block of its result)."""
        if isinstance(value, MemRef):
            return value
        like, _ = block_shape(self.comp[operand].array_shape, self.plan.needs[operand], *self.at)
        ref = self.ctx.vmem(like)
        self.ctx.emit(VpuBroadcast, dst=ref, src=value, dims=())
        return ref


def _chainable(em: _Emitter, instr: Instruction) -> bool:
    """True for an elementwise op the VPU computes that ``vpu.fused`` can hold."""
    if not on_vpu(em.comp, instr):
        return False
    if instr.opcode == "compare" and instr.attr("type") == "TOTALORDER":
        return not em.comp[instr.operands[0]].array_shape.element_type.is_float
    return True


def _emit_elementwise(em: _Emitter, instr: Instruction, dst: MemRef, srcs: list[Operand], start: int) -> None:
    fn = instr.opcode
    if not on_vpu(em.comp, instr):
        raise NotLowerable(f"{fn} has no VPU function for its types")
    direction = None
    if fn == "compare":
        direction = instr.attr("direction")
        if instr.attr("type") == "TOTALORDER" and em.comp[instr.operands[0]].array_shape.element_type.is_float:
            raise NotLowerable("a total-order float comparison")
    em.ctx.emit(VpuMap, fn=fn, dst=dst, srcs=tuple(srcs), direction=direction)


def _emit_broadcast(em: _Emitter, instr: Instruction, dst: MemRef, srcs: list[Operand], start: int) -> None:
    src = srcs[0]
    dims = instr.attr("dimensions", ())
    if not isinstance(src, MemRef):
        dims = ()
    em.ctx.emit(VpuBroadcast, dst=dst, src=src, dims=tuple(dims))


def _emit_transpose(em: _Emitter, instr: Instruction, dst: MemRef, srcs: list[Operand], start: int) -> None:
    src = em.operand_ref(srcs[0], instr.operands[0])
    em.ctx.emit(XluTranspose, dst=dst, src=src, permutation=tuple(instr.attr("dimensions")))


def _free_view(instr: Instruction, dst: MemRef, srcs: list[Operand]) -> MemRef | None:
    """The operand's block seen as ``dst``'s shape, when a transpose or reshape leaves every byte where it is
    (a transpose whose layouts permute with it, a reshape of unit or major dimensions): then it costs
    nothing, as on the TPU, where such an op is a bitcast of the buffer."""
    src = srcs[0] if srcs else None
    if (
        instr.opcode not in ("transpose", "reshape", "bitcast", "broadcast")
        or not isinstance(src, MemRef)
        or src.window is not None
    ):
        return None
    if instr.opcode == "broadcast":  # of every dimension in order: the identity (JAX's broadcast_in_dim)
        identity = tuple(instr.attr("dimensions", ())) == tuple(range(dst.shape.rank)) and src.dims == dst.dims
        same = identity and _unit_free(src.shape) == _unit_free(dst.shape)
    elif instr.opcode == "transpose":
        same = free_transpose(src.shape, tuple(instr.attr("dimensions")), dst.shape)
    else:  # (a bitcast means its operand's bytes read in each shape's physical order, a reshape row-major)
        row_major = instr.opcode == "reshape"
        same = (src.dims != dst.dims or not row_major) and bytes_agree(src.shape, dst.shape, row_major) is True
    return MemRef(src.space, src.address, dst.shape, base=src.base) if same else None


def _unit_free(shape: Shape) -> tuple[object, ...]:
    """What places a shape's elements, size-1 dimensions aside when no tile cuts them: two shapes of the same
    dimensions with equal keys hold every element at the same byte (``{3,2,0,1}`` and ``{3,2,1,0}`` when
    dimension 1 has size 1)."""
    layout = shape.effective_layout
    tiled = len(layout.tiles[0].dimensions) if layout.tiles else 0
    physical = list(reversed(layout.minor_to_major))
    untiled = physical[: max(0, shape.rank - tiled)]
    kept = tuple(d for d in physical if shape.dimensions[d] > 1 or d not in untiled)
    return shape.dimensions, kept, replace(layout, minor_to_major=())


def _emit_reshape(em: _Emitter, instr: Instruction, dst: MemRef, srcs: list[Operand], start: int) -> None:
    if instr.opcode == "bitcast" and not (
        physical_is_logical(em.comp[instr.operands[0]].array_shape) and physical_is_logical(instr.array_shape)
    ):
        # (a bitcast reads its operand in physical order: a row-major reshape only when that is the logical one)
        raise NotLowerable(f"a bitcast of {em.comp[instr.operands[0]].array_shape} that moves bytes")
    src = em.operand_ref(srcs[0], instr.operands[0])
    if src.dims == dst.dims:
        em.ctx.emit(VpuCopy, dst=dst, src=src)
    else:
        em.ctx.emit(VpuReshape, dst=dst, src=src)


def _emit_copy(em: _Emitter, instr: Instruction, dst: MemRef, srcs: list[Operand], start: int) -> None:
    if not isinstance(srcs[0], MemRef):
        em.ctx.emit(VpuBroadcast, dst=dst, src=srcs[0], dims=())
    else:
        em.ctx.emit(VpuCopy, dst=dst, src=srcs[0])


def _sub(ref: MemRef, offsets: tuple[int | Reg, ...], sizes: tuple[int, ...], clamp: bool = False) -> MemRef:
    """The window ``offsets`` / ``sizes`` of ``ref``'s block, which may itself be a window of a bigger array
    (an operand read in place in VMEM, :meth:`_Emitter._in_place`: the block's rows of the whole value):
    offsets count from the block, so they add to its window's.

    Raises:
        NotLowerable: a register offset into a window that does not start at 0, or clamping on either
            side (the clamp's bounds are the array's, not the block's)."""
    if tuple(sizes) == ref.dims and all(isinstance(o, int) and o == 0 for o in offsets):
        return ref
    if ref.window is not None:
        base = ref.window.offsets
        if ref.window.clamp or (clamp and any(not isinstance(b, int) or b for b in base)):
            raise NotLowerable("a clamped window of a window, or a window of a clamped one")
        offsets = tuple(_add(b, o) for b, o in zip(base, offsets))
    return MemRef(ref.space, ref.address, ref.shape, Window(tuple(offsets), tuple(sizes), clamp), ref.base)


def _add(a: int | Reg, b: int | Reg) -> int | Reg:
    """``a + b`` where at most one is a register (or the register is added to 0)."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(a, int) and a == 0:
        return b
    if isinstance(b, int) and b == 0:
        return a
    raise NotLowerable("a register offset into a window at another offset")


def _emit_slice(em: _Emitter, instr: Instruction, dst: MemRef, srcs: list[Operand], start: int) -> None:
    src = em.operand_ref(srcs[0], instr.operands[0])
    tiled = em.plan.needs[instr.name][0]  # (its block starts where the slice does: blocks._slice, stride 1)
    offsets = tuple(0 if d == tiled else s.start for d, s in enumerate(instr.attr("slice")))
    strides = tuple(1 if d == tiled else s.stride for d, s in enumerate(instr.attr("slice")))
    if all(k == 1 for k in strides):
        em.ctx.emit(VpuCopy, dst=dst, src=_sub(src, offsets, dst.dims))
        return
    spans = tuple((n - 1) * k + 1 if n else 0 for n, k in zip(dst.dims, strides))
    em.ctx.emit(VpuCopy, dst=dst, src=_sub(src, offsets, spans), strides=strides)


def _emit_concatenate(em: _Emitter, instr: Instruction, dst: MemRef, srcs: list[Operand], start: int) -> None:
    axis = instr.attr("dimensions")[0]
    at = 0
    for operand, value in zip(instr.operands, srcs):
        src = em.operand_ref(value, operand)
        offsets = tuple(at if d == axis else 0 for d in range(len(dst.dims)))
        em.ctx.emit(VpuCopy, dst=_sub(dst, offsets, src.dims), src=src)
        at += src.dims[axis]


def _emit_pad(em: _Emitter, instr: Instruction, dst: MemRef, srcs: list[Operand], start: int) -> None:
    pads = instr.attr("padding")
    if any(p.interior for p in pads):
        raise NotLowerable("interior padding")
    em.ctx.emit(VpuBroadcast, dst=dst, src=srcs[1], dims=())
    src = em.operand_ref(srcs[0], instr.operands[0])
    src_off, dst_off, sizes = [], [], []
    for p, n in zip(pads, src.dims):
        lo = max(0, -p.low)
        hi = n - max(0, -p.high)
        src_off.append(lo)
        dst_off.append(max(0, p.low))
        sizes.append(max(0, hi - lo))
    if all(sizes):
        em.ctx.emit(VpuCopy, dst=_sub(dst, tuple(dst_off), tuple(sizes)), src=_sub(src, tuple(src_off), tuple(sizes)))


def _emit_iota(em: _Emitter, instr: Instruction, dst: MemRef, srcs: list[Operand], start: int) -> None:
    dim = instr.attr("iota_dimension")
    em.ctx.emit(VpuIota, dst=dst, dimension=dim)
    need_dim, off = em.plan.needs[instr.name]
    if need_dim == dim and start + off:
        et = dst.element_type
        em.ctx.emit(
            VpuMap, fn="add", dst=dst, srcs=(dst, Const(start + off if not et.is_float else float(start + off), et))
        )


def _emit_reduce(em: _Emitter, instr: Instruction, dst: MemRef, srcs: list[Operand], start: int) -> None:
    fn = combiner(em.ctx, instr.attr("to_apply"))
    if fn is None:
        raise NotLowerable("a reduce whose combiner is not a single add/multiply/maximum/minimum/and/or/xor")
    src = em.operand_ref(srcs[0], instr.operands[0])
    accumulating = em.plan.accumulate == instr.name
    accumulate = accumulating and em.index > em.first  # later blocks add to the first's result
    em.ctx.emit(VpuReduce, fn=fn, dst=dst, src=src, dims=tuple(instr.attr("dimensions")), accumulate=accumulate)
    if accumulating and em.partials is not None and em.partials[0] == 0 and em.last:
        em.combine_partials(fn, dst)  # megacore: the other cores' shares
    init = srcs[1]
    if accumulate or (isinstance(init, Const) and _is_identity(fn, init)):
        return
    if accumulating and em.partials is not None and em.partials[0] > 0:
        return  # core 0 combines the init value, once
    if isinstance(init, MemRef):
        init = em.operand_ref(init, instr.operands[1])
        full = em.ctx.vmem(Shape(dst.element_type, dst.dims, layout=dst.shape.layout))
        em.ctx.emit(VpuBroadcast, dst=full, src=init, dims=())
        init = full
    em.ctx.emit(VpuMap, fn=fn, dst=dst, srcs=(dst, init))


def _emit_dynamic_slice(em: _Emitter, instr: Instruction, dst: MemRef, srcs: list[Operand], start: int) -> None:
    src = em.operand_ref(srcs[0], instr.operands[0])
    if em.windows.get(instr.operands[0]) is instr:  # (only the window was loaded)
        em.ctx.emit(VpuCopy, dst=dst, src=src)
        return
    offsets: list[int | Reg] = []
    for operand, value in zip(instr.operands[1:], srcs[1:]):
        if isinstance(value, Const):
            offsets.append(max(0, int(value.value)))
        elif isinstance(value, Reg):
            offsets.append(value)
        else:
            raise NotLowerable(f"dynamic-slice index {operand} is not a scalar input")
    em.ctx.emit(VpuCopy, dst=dst, src=_sub(src, tuple(offsets), dst.dims, clamp=True))


_EMITTERS = {
    "broadcast": _emit_broadcast,
    "transpose": _emit_transpose,
    "reshape": _emit_reshape,
    "bitcast": _emit_reshape,
    "copy": _emit_copy,
    "slice": _emit_slice,
    "concatenate": _emit_concatenate,
    "pad": _emit_pad,
    "iota": _emit_iota,
    "reduce": _emit_reduce,
    "dynamic-slice": _emit_dynamic_slice,
    "reduce-precision": emit_reduce_precision,
}


def _tiled_dimension(shape: Shape) -> int | None:
    """The output dimension to block: the most major physical dimension larger than one."""
    dims = _major_dimensions(shape)
    return dims[0] if dims else None


def _major_dimensions(shape: Shape) -> list[int]:
    """The dimensions larger than one, physically most major first."""
    return [d for d in reversed(shape.effective_layout.minor_to_major) if shape.dimensions[d] > 1]


def _cuts_input_lanes(comp: Computation, plan: Plan) -> bool:
    """Whether ``plan`` blocks an input of rank 3 or more along its lane dimension (its most minor, tiled)
    where that dimension is shorter than two lane tiles: each block, a few of its elements, would load whole
    lane tiles. (A longer one is cut in whole lane tiles.)"""
    for instr in comp.instructions:
        need = plan.needs.get(instr.name)
        if instr.opcode != "parameter" or need is None or need[0] is None or not isinstance(instr.shape, Shape):
            continue
        shape = instr.shape
        layout = shape.effective_layout
        if not (layout.tiles and shape.rank > 2 and need[0] == layout.minor_to_major[0]):
            continue
        if shape.dimensions[need[0]] < 2 * layout.tiles[0].dimensions[-1]:
            return True
    return False


def lower_fused(
    ctx: Lowering,
    comp: Computation,
    inputs: dict[str, MemRef],
    outputs: list[tuple[str, MemRef]],
    nested: bool = False,
) -> None:
    """Lower the fused computation ``comp`` whose parameters read ``inputs`` and whose root values are
    written to ``outputs``.

    Plans are tried in turn: blocks along the outputs' most major dimension (or one block); and, for a
    reduction, blocks along a reduced dimension that accumulate (:func:`~.blocks.reduction_split`), tried
    first when the outputs would be one block but the reduce's operand is bigger than a block should be.
    Block sizes start near :data:`BLOCK_TARGET_BYTES` and halve (below the tile size when they must) until
    the blocks fit VMEM. A row of an outer split (``nested``) is split again only when the instruction has
    all the VMEM it can get: blocks of one index of two dimensions leave nothing to pipeline, and the rows
    with more VMEM do (the decoder's attention softmax: 1.8x slower so).
    """
    roots = [r for r, _ in outputs]
    first = comp[roots[0]].array_shape
    same = all(comp[r].array_shape.dimensions == first.dimensions for r in roots)
    tiled = _tiled_dimension(first) if same else None
    plans: list[Plan] = []
    try:
        plans.append(plan_needs(comp, roots, tiled))
    except NotLowerable:
        if tiled is None:
            raise
        plans.append(plan_needs(comp, roots, None))
    if same and _cuts_input_lanes(comp, plans[0]):
        # The outputs' most major dimension is a short lane dimension of an input (a relayout that moves the
        # lanes to the top, bf16[64,32,16,48] {0,3,2,1} -> {3,1,2,0}): a block of a few of its elements would
        # load whole lane tiles. Block along the next major output dimension that is no such input's lanes.
        for d in _major_dimensions(first)[1:]:
            if d == first.effective_layout.minor_to_major[0]:
                break  # (the outputs' lanes: blocks of a few of them would store single elements)
            # (the outputs' second-minor dimension is cut in whole tiles of it, tile_granule: f32[1024,32,128]
            # {2,1,0} -> {0,1,2} in blocks of 2 of the source's 128 lanes charged all 4,096 source registers
            # to each of its 64 blocks, 600x XLA's estimate; blocks of 8 of the 32 rows are whole tiles of both)
            try:
                other = plan_needs(comp, roots, d)
            except NotLowerable:
                continue
            if not _cuts_input_lanes(comp, other):
                plans[0] = other
                break
    split = reduction_split(comp, roots)
    if split is not None:
        try:
            accumulating = plan_needs(comp, roots, None, split)
        except NotLowerable:
            pass
        else:
            operand = comp[comp[split[0]].operands[0]].array_shape
            if plans[0].extent == 1 and operand.byte_size > BLOCK_TARGET_BYTES:
                plans.insert(0, accumulating)  # one output block: stream the operand instead
            else:
                plans.append(accumulating)  # only when the outputs' blocks do not fit
    ring = RING if ctx.free_semaphores() >= 2 * RING + 4 else 2
    sems = tuple(ctx.semaphore() for _ in range(2 * ring))
    for plan in plans:
        if _lower_plan(ctx, comp, plan, inputs, outputs, sems):
            return
    for sem in sems:  # (each row of an outer split takes its own)
        ctx.release_semaphore(sem)
    outer = plans[0].tiled is not None and plans[0].extent > 1 and not (nested and ctx.can_widen())
    if outer and _outer_split(ctx, comp, plans[0], inputs, outputs):
        return
    raise NotLowerable("its blocks do not fit in VMEM")


def _outer_split(
    ctx: Lowering, comp: Computation, plan: Plan, inputs: dict[str, MemRef], outputs: list[tuple[str, MemRef]]
) -> bool:
    """When one index of the blocked dimension is already too much for VMEM (the softmax of attention scores
    ``[batch, heads, queries, keys]``: one batch element is 32 MB), lower the computation once per index
    of it, each a computation with that dimension 1 whose blocks cut the next one (each input and output a
    window of its array at that index). Not when an iota counts along the dimension; False (nothing
    emitted) then or when a row does not lower either."""
    sub = _with_unit_dimension(comp, plan)
    if sub is None:
        return False
    mark = ctx.checkpoint()
    try:
        for i in range(plan.extent):
            sub_inputs = {n: _indexed(ref, plan.needs.get(n), i) for n, ref in inputs.items()}
            sub_outputs = [(n, _indexed(ref, plan.needs.get(n), i)) for n, ref in outputs]
            lower_fused(ctx, sub, sub_inputs, sub_outputs, nested=True)
            # Each row waits for its own transfers before it ends: the next reuses its VMEM and semaphores
            # (the scoreboard orders the reuse of the bytes).
            ctx.release_since(mark)
    except NotLowerable:
        ctx.rollback(mark)
        return False
    return True


def _indexed(ref: MemRef, need: Need | None, i: int) -> MemRef:
    """Index ``need``'s offset + ``i`` of the array (or window) ``ref`` along ``need``'s dimension, a window."""
    if need is None or need[0] is None:
        return ref
    dim, offset = need
    window = ref.window or Window((0,) * ref.shape.rank, ref.shape.dimensions)
    offsets = list(window.offsets)
    offsets[dim] += offset + i  # type: ignore[operator, index]
    sizes = tuple(1 if d == dim else n for d, n in enumerate(window.sizes))
    return MemRef(ref.space, ref.address, ref.shape, Window(tuple(offsets), sizes), ref.base)


def _with_unit_dimension(comp: Computation, plan: Plan) -> Computation | None:
    """``comp`` with every value's blocked dimension (per ``plan``) of size 1 (slices along it start at 0), or
    None when a value cannot be cut so (an iota counting along it)."""
    body = []
    for instr in comp.instructions:
        need = plan.needs.get(instr.name)
        dim = need[0] if need is not None else None
        if dim is None or not isinstance(instr.shape, Shape):
            body.append(instr)
            continue
        if instr.opcode == "iota" and instr.attr("iota_dimension") == dim:
            return None
        dims = tuple(1 if d == dim else n for d, n in enumerate(instr.shape.dimensions))
        attrs = instr.attributes
        if instr.opcode == "slice":
            ranges = list(instr.attr("slice"))
            ranges[dim] = SliceDim(0, 1)
            attrs = attrs.replace(slice=tuple(ranges))
        body.append(
            Instruction(
                instr.name,
                instr.opcode,
                Shape(instr.shape.element_type, dims, layout=instr.shape.layout),
                instr.operands,
                attrs,
                instr.loc,
            )
        )
    return Computation(f"{comp.name}.row", tuple(body), comp.root)


def _lower_plan(
    ctx: Lowering,
    comp: Computation,
    plan: Plan,
    inputs: dict[str, MemRef],
    outputs: list[tuple[str, MemRef]],
    sems: tuple[int, ...],
) -> bool:
    """Emit ``plan`` with the largest block that fits VMEM; False (nothing emitted) when none does."""
    extent = plan.extent
    if plan.accumulate is not None:
        reduce = comp[plan.accumulate]
        operand = comp[reduce.operands[0]].array_shape
        dim = plan.needs[reduce.operands[0]][0]
        assert dim is not None
        granule = tile_granule(operand, dim)
        row_bytes = max(1, operand.byte_size // max(1, extent))
        # One block at a time is in flight, so a block should outlast the HBM latency several times over.
        cfg = ctx.config
        target = max(BLOCK_TARGET_BYTES, int(4 * cfg.cycles(cfg.hbm.latency_ns) * cfg.hbm_bytes_per_cycle))
    else:
        first = comp[outputs[0][0]].array_shape
        granule = tile_granule(first, plan.tiled) if plan.tiled is not None else 1
        row_bytes = max(1, _blocked_bytes(comp, plan, [r for r, _ in outputs]) // max(1, extent))
        target = BLOCK_TARGET_BYTES
    # Part-tile output blocks rather than too few to pipeline (a row sum's T(1024) result), never below the
    # tiles of the inputs cut along the same dimension: a block of part of their tiles loads from the tile's
    # start and charges every register it touches (x.T of f32[4096,4096] in blocks of 16 of the input's 128
    # lanes read 4.5x the array and transposed each register 8 times), so whole tiles of both when they fit.
    floor = _input_granule(comp, plan)
    granule = math.lcm(granule, floor)
    while granule > floor and granule % 2 == 0 and 2 * granule * row_bytes > target:
        granule //= 2
    block = min(extent, max(granule, min(extent, target // row_bytes) // granule * granule))
    if ctx.share is not None and plan.accumulate is None:  # megacore: at least one block per core
        per_core = -(-extent // ctx.share[1])
        block = min(block, max(granule, -(-per_core // granule) * granule))
    scalars = _scalar_inputs(ctx, comp, plan, inputs)
    mark = ctx.checkpoint()
    while True:
        try:
            _Emitter(ctx, comp, plan, inputs, outputs, block, scalars=scalars, sems=sems).run()
            return True
        except VmemExhausted:
            ctx.rollback(mark)
            if block <= 1 or extent == 1:
                return False
            # whole tiles while possible, then fewer rows than a tile holds
            block = block // 2 // granule * granule if block >= 2 * granule else max(1, block // 2)


def _blocked_bytes(comp: Computation, plan: Plan, roots: list[str]) -> int:
    """Bytes one pass over ``plan`` moves in blocks: its outputs and every input cut along the blocked
    dimension (a row sum reads 4 KB per 4-byte result: sizing its blocks by the outputs alone made the whole
    16 MB input one block, with nothing to overlap its transfer)."""
    total = sum(comp[r].array_shape.byte_size for r in roots)
    for instr in comp.instructions:
        need = plan.needs.get(instr.name)
        if instr.opcode != "parameter" or need is None or need[0] is None or not isinstance(instr.shape, Shape):
            continue
        shape = instr.shape
        total += shape.byte_size * plan.extent // max(1, shape.dimensions[need[0]])
    return total


def _input_granule(comp: Computation, plan: Plan) -> int:
    """The largest first-level tile size along the blocked dimension among the inputs cut along it."""
    out = 1
    for instr in comp.instructions:
        need = plan.needs.get(instr.name)
        if instr.opcode == "parameter" and need is not None and need[0] is not None and isinstance(instr.shape, Shape):
            out = max(out, tile_granule(instr.shape, need[0]))
    return out


def _scalar_inputs(ctx: Lowering, comp: Computation, plan: Plan, inputs: dict[str, MemRef]) -> dict[str, Reg]:
    """Dynamic-slice offsets that are parameters are read into scalar registers once, up front."""
    out: dict[str, Reg] = {}
    for name in plan.order:
        instr = comp[name]
        if instr.opcode != "dynamic-slice":
            continue
        for operand in instr.operands[1:]:
            if comp[operand].opcode == "parameter" and operand not in out:
                reg = read_scalar(ctx, inputs[operand])
                out[operand] = reg
    return out


def _as_fusion(ctx: Lowering, comp: Computation, instr: Instruction) -> tuple[Computation, dict[str, MemRef]]:
    """A one-instruction computation for an op outside a fusion, with its operands as parameters."""
    single = single_computation(comp, instr)
    inputs = {
        p.name: ctx.home(comp.name, instr.operands[p.attr("parameter_number")])
        for p in single.instructions
        if p.opcode == "parameter"
    }
    return single, inputs


def _taken_by_product(ctx: Lowering, comp: Computation, instr: Instruction) -> bool:
    """Whether the product ``instr`` feeds computes it on its weight windows instead (see prologue.py); then
    ``instr`` emits nothing."""
    dot = ctx.prologues.get((comp.name, instr.name))
    if dot is not None and absorbs(ctx, comp, instr.name, dot):
        ctx.prologued.add((comp.name, instr.name))
        return True
    return False


@lowering(*_SINGLE_OPS)
def lower_vector(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    if not isinstance(instr.shape, Shape):
        raise NotLowerable(f"{instr.opcode} with a tuple result")
    if _taken_by_product(ctx, comp, instr):
        return
    if (
        instr.opcode == "transpose"
        and ctx.buffers.buffer(comp.name, instr.name).id == ctx.buffers.buffer(comp.name, instr.operands[0]).id
    ):
        return  # a transpose that moves no byte shares its operand's buffer
    fused, inputs = _as_fusion(ctx, comp, instr)
    lower_fused(ctx, fused, inputs, [(instr.name, ctx.home(comp.name, instr.name))])


@lowering("fusion")
def lower_fusion(ctx: Lowering, comp: Computation, instr: Instruction) -> None:
    if _taken_by_product(ctx, comp, instr):
        return
    fused = ctx.module[instr.attr("calls")]
    inputs: dict[str, MemRef] = {}
    for p in fused.parameters:
        operand = instr.operands[p.attr("parameter_number")]
        if not isinstance(p.shape, Shape):
            raise NotLowerable("a fusion parameter that is a tuple")
        inputs[p.name] = ctx.home(comp.name, operand)
    root = fused.root_instruction
    if root.opcode == "tuple":
        outputs = [(o, ctx.home(comp.name, instr.name, (i,))) for i, o in enumerate(root.operands)]
    else:
        outputs = [(root.name, ctx.home(comp.name, instr.name))]
    for r, _ in outputs:
        if not isinstance(fused[r].shape, Shape):
            raise NotLowerable("a fusion output that is a tuple")
    lower_fused(ctx, fused, inputs, outputs)
