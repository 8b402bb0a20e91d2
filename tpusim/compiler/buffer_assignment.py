"""Buffer assignment: an HBM address for every array value the program keeps in memory.

Which values share one buffer (an *alias class*):

- a ``get-tuple-element``, ``tuple`` or ``opt-barrier`` result and the array leaves it forwards, and a
  ``reshape`` or ``bitcast`` whose two layouts hold the elements at the same bytes (a bitcast to a
  tile-padded shape too: ``tpusim.memory.reinterpret.bytes_in_place``);
- the parameters of a ``call`` or ``conditional`` branch and the caller's operands;
- a ``while`` loop's state: the loop result, the body's and the condition's parameters, and, when it is
  safe, the loop operand (if the loop is its last use) and the body's result (if the state it replaces
  is dead by the time it is produced; otherwise the lowering copies it back at the end of an iteration);
- an async ``-done`` (and ``async-update``) and the part of its start that holds the result; a ``copy-done``
  and its ``copy-start``'s destination, and the start's source part and its operand;
- an ``add-dependency`` or ``domain`` and its (first) operand, and a ``bitcast-convert`` between types of one
  width whose layouts agree, when their layouts match;
- a ``dynamic-update-slice`` and its operand, when the operand dies there and is writable (not an entry
  parameter or constant): the update is then done in place, as XLA does.

Fusion computations and the scalar computations of reduce, sort, scatter ... have no buffers of their own:
their values live in VMEM during the operation that runs them.

Allocation is by liveness in schedule (text) order: entry parameters first, then constants (both live for
the whole run), then every other class first-fit into the lowest free range that is not live at the same
time, aligned to :data:`ALIGNMENT` bytes. A while body's temporaries get a region that is live while the
loop runs; a conditional's branches share one region. Running out of HBM is an :class:`OutOfMemoryError`
naming the buffer, the memory and the sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo.ir import Computation, Instruction, Module, sequential_callees
from tpusim.compiler.hlo.opcodes import ASYNC_COLLECTIVE_DONES, ELEMENTWISE
from tpusim.errors import TpusimError
from tpusim.memory import AnyShape, Layout, Shape, TupleShape
from tpusim.memory.reinterpret import bytes_agree, bytes_in_place, free_transpose

__all__ = ["ALIASES", "ALIGNMENT", "Buffer", "BufferAssignment", "OutOfMemoryError", "assign_buffers"]

_ASYNC_DONES = ASYNC_COLLECTIVE_DONES | {"async-done"}

ALIGNMENT = 512
"""Buffer alignment in bytes (the 512-byte native DMA access size of TPUv4i: Jouppi et al., "Ten Lessons From
Three Generations Shaped Google's TPUv4i", ISCA 2021)."""

Key = tuple[str, str, tuple[int, ...]]  # (computation, instruction, leaf index path)


class OutOfMemoryError(TpusimError):
    """A program whose buffers do not fit a memory."""


@dataclass(frozen=True, slots=True)
class Buffer:
    """One allocation, in HBM, VMEM (values whose layout says ``S(1)``) or (integer scalars) SMEM.

    Attributes:
        id: index in :attr:`BufferAssignment.buffers`.
        offset: byte address in its memory.
        size: bytes (the shape's byte size, padding included).
        shape: the array shape with the layout its bytes are stored in.
        kind: ``parameter``, ``constant``, ``output``, ``loop-state`` or ``temporary``.
        label: ``computation/instruction{index}`` of the value that defines it, for messages and traces.
        space: ``hbm``; ``vmem`` for a value resident in VMEM between the instructions that use it (its layout
            says ``S(1)``: XLA:TPU's memory-space assignment, or tpusim's); or ``smem`` for an integer or pred
            scalar the scalar unit works on (loop counters, dynamic offsets): stored as plain 4-byte words, not
            in a tiled 512-byte row.
    """

    id: int
    offset: int
    size: int
    shape: Shape
    kind: str
    label: str
    space: str = "hbm"


@dataclass(frozen=True)
class BufferAssignment:
    """Where each array leaf of each value of the sequential computations lives.

    Attributes:
        buffers: all buffers, by id.
        leaves: ``(computation, instruction, index path) -> buffer id`` for every array leaf.
        hbm_bytes: the highest HBM byte any buffer reaches.
        smem_bytes: the SMEM bytes scalar buffers take (from address 0; lowerings allocate above).
        vmem_bytes: the VMEM bytes resident buffers take (from address 0; each instruction's own VMEM blocks
            are allocated above).
        vmem_tops: ``(computation, instruction) -> byte`` above every resident buffer live while that
            instruction runs (its own VMEM blocks may start there; at most :attr:`vmem_bytes`).
        copy_back: while loops whose body result leaf does not share the loop state buffer:
            ``(body computation, leaf index path)`` pairs the lowering must copy at the end of an iteration.
        copy_in: while loops whose operand leaf does not share the state buffer: ``(computation, while
            instruction, leaf index path)`` the lowering copies before the loop starts.
        byte_bitcasts: ``(computation, bitcast)`` pairs that mean their operand's bytes read under the
            result's layout (:class:`~tpusim.compiler.layout_assignment.LayoutAssignment`): one buffer when
            the byte sizes are equal, a byte copy otherwise.
    """

    buffers: tuple[Buffer, ...]
    leaves: dict[Key, int]
    hbm_bytes: int
    smem_bytes: int = 0
    vmem_bytes: int = 0
    copy_back: frozenset[tuple[str, tuple[int, ...]]] = field(default_factory=frozenset)
    copy_in: frozenset[Key] = field(default_factory=frozenset)
    vmem_tops: Mapping[tuple[str, str], int] = field(default_factory=dict)
    byte_bitcasts: frozenset[tuple[str, str]] = field(default_factory=frozenset)

    def vmem_top(self, computation: str, instruction: str) -> int:
        """Where VMEM is free of live residents while ``instruction`` runs (:attr:`vmem_tops`; the top of every
        resident for an instruction it does not list)."""
        return self.vmem_tops.get((computation, instruction), self.vmem_bytes)

    def buffer(self, computation: str, value: str, index: tuple[int, ...] = ()) -> Buffer:
        try:
            return self.buffers[self.leaves[(computation, value, index)]]
        except KeyError:
            raise TpusimError(f"no HBM buffer for {computation}/{value}{list(index) if index else ''}") from None

    def value_buffers(self, computation: str, value: str, shape: AnyShape) -> list[Buffer]:
        """The buffers of every array leaf of a value, in leaf order."""
        return [self.buffer(computation, value, path) for path, _ in leaf_paths(shape)]


def _holds(comp: Computation, held: Mapping[tuple[str, str], str]) -> dict[str, int]:
    """Value -> the last position that reads it beyond its users: :func:`async_holds`, and ``held``'s values
    of ``comp`` until their instruction."""
    out = async_holds(comp)
    at = {instr.name: i for i, instr in enumerate(comp.instructions)}
    for (name, value), until in held.items():
        if name == comp.name and until in at:
            out[value] = max(out.get(value, at[until]), at[until])
    return out


def async_holds(comp: Computation) -> dict[str, int]:
    """Value -> position of the done until which an async start reads it.

    An ``all-reduce-start`` or an ``async-start`` (a reduce-scatter's) runs on the core's async sequencer
    while the main sequencer goes on (``lowering/collectives.py``): it reads its operands until its done
    (through any ``async-update``), so their buffers, in HBM or VMEM, are not reused before."""
    out: dict[str, int] = {}
    for at, instr in enumerate(comp.instructions):
        if instr.opcode not in ("all-reduce-done", "async-done") or not instr.operands:
            continue
        start = comp[instr.operands[0]]
        while start.opcode == "async-update" and start.operands:
            start = comp[start.operands[0]]
        if start.opcode in ("all-reduce-start", "async-start"):
            for o in start.operands:
                out[o] = max(out.get(o, at), at)
    return out


def leaf_paths(shape: AnyShape, prefix: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], Shape]]:
    """Array leaves of a shape (tokens excluded) with their index paths, depth first."""
    if isinstance(shape, TupleShape):
        out: list[tuple[tuple[int, ...], Shape]] = []
        for i, e in enumerate(shape.elements):
            out.extend(leaf_paths(e, (*prefix, i)))
        return out
    return [] if shape.element_type.kind == "token" else [(prefix, shape)]


def sequential_computations(module: Module) -> list[str]:
    """The entry and the computations run as code of their own (while, call, conditional), callers first."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        order.append(name)
        for instr in module[name].instructions:
            for callee in sequential_callees(instr):
                visit(callee)

    visit(module.entry)
    return order


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Key, Key] = {}

    def add(self, k: Key) -> None:
        self.parent.setdefault(k, k)

    def find(self, k: Key) -> Key:
        root = k
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[k] != root:
            self.parent[k], k = root, self.parent[k]
        return root

    def union(self, a: Key, b: Key) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


@dataclass
class _Class:
    """An alias class: the values that share one buffer."""

    members: list[Key]
    owner: str  # the outermost computation a member is defined in
    shape: Shape  # the largest member shape (they normally agree)
    kind: str = "temporary"
    buffer: int | None = None
    space: str = "hbm"


class _Planner:
    def __init__(
        self,
        module: Module,
        hbm_capacity: int,
        smem_capacity: int,
        vmem_budget: int,
        vmem_alignment: int,
        live_from: Mapping[tuple[str, str], str],
        held: Mapping[tuple[str, str], str] | None = None,
        byte_bitcasts: frozenset[tuple[str, str]] = frozenset(),
    ) -> None:
        self.module = module
        self.byte_bitcasts = byte_bitcasts
        self.live_from = live_from
        self.held = held or {}
        self.vmem_alignment = vmem_alignment
        self.capacity = hbm_capacity
        self.smem_capacity = smem_capacity
        self.vmem_budget = vmem_budget
        self.order = sequential_computations(module)
        self.depth = {name: i for i, name in enumerate(self.order)}
        self.uf = _UnionFind()
        self.shapes: dict[Key, Shape] = {}
        self.kinds: dict[Key, str] = {}  # members that fix a class's kind: parameter, constant
        self.loop_state: set[Key] = set()
        # body computation -> (computation holding the while, while instruction, its position, condition)
        self.loops: dict[str, tuple[str, str, int, str]] = {}
        self.copy_back: set[tuple[str, tuple[int, ...]]] = set()
        self.copy_in: set[Key] = set()
        self.position: dict[tuple[str, str], int] = {}
        self.last_use: dict[tuple[str, str], int] = {}
        self.leaf_reads: dict[Key, int] = {}  # last position that reads a leaf's data (not forwarding)
        self.buffers: list[Buffer] = []
        self.extents: dict[tuple[str, str], int] = {}  # (computation, space) -> bytes its placement spans

    def _hold_operands(self) -> None:
        """Operands of async starts stay live until their dones (:func:`async_holds`), and the values of
        ``held`` until the instruction it names (:func:`assign_buffers`)."""
        for name in self.order:
            comp = self.module[name]
            for o, at in _holds(comp, self.held).items():
                self.last_use[(name, o)] = max(self.last_use.get((name, o), 0), at)
                for path, _ in leaf_paths(comp[o].shape):
                    self.leaf_reads[(name, o, path)] = max(self.leaf_reads.get((name, o, path), 0), at)

    # ------------------------------------------------------------------ aliases
    def leaves(self, comp: str, instr: Instruction) -> list[Key]:
        return [(comp, instr.name, path) for path, _ in leaf_paths(instr.shape)]

    def build(self) -> None:
        for name in self.order:
            comp = self.module[name]
            for i, instr in enumerate(comp.instructions):
                self.position[(name, instr.name)] = i
                for o in instr.operands:
                    self.last_use[(name, o)] = i
                    # get-tuple-element and tuple only forward leaves (they are members of the leaves'
                    # classes themselves); anything else reads every leaf of the operand.
                    if instr.opcode not in ("get-tuple-element", "tuple"):
                        for path, _ in leaf_paths(comp[o].shape):
                            self.leaf_reads[(name, o, path)] = i
                for path, shape in leaf_paths(instr.shape):
                    self.uf.add((name, instr.name, path))
                    self.shapes[(name, instr.name, path)] = shape
                if instr.opcode == "while":
                    self.loops[instr.attr("body")] = (name, instr.name, i, instr.attr("condition"))
            self.last_use[(name, comp.root)] = len(comp.instructions)
            for path, _ in leaf_paths(comp.root_instruction.shape):
                self.leaf_reads[(name, comp.root, path)] = len(comp.instructions)
        self._hold_operands()
        entry = self.module.entry_computation
        for p in entry.parameters:
            for key in self.leaves(entry.name, p):
                self.kinds[key] = "parameter"
        # Forwarding first (one value under several names), then the choices to overwrite a value in place,
        # each made knowing every name its buffer's current value goes by (a loop body's root may forward
        # the old state a dynamic-update-slice would otherwise update in place).
        for name in self.order:
            comp = self.module[name]
            for instr in comp.instructions:
                self._alias(comp, instr)
        for name in self.order:
            comp = self.module[name]
            for instr in comp.instructions:
                if instr.opcode == "dynamic-update-slice":
                    target = (name, instr.operands[0], ())
                    if self._overwritable(name, target, self.position[(name, instr.name)]):
                        self.uf.union(target, (name, instr.name, ()))
                elif instr.opcode == "while":
                    self._alias_loop_operand(comp, instr)
        for name in self.order:
            for instr in self.module[name].instructions:
                if instr.opcode == "while":
                    self._alias_loop_results(self.module[name], instr)

    def _members(self, key: Key) -> list[Key]:
        root = self.uf.find(key)
        return [k for k in self.shapes if self.uf.find(k) == root]

    def _overwritable(self, comp: str, key: Key, position: int) -> bool:
        """True when the buffer of ``key`` may be overwritten by the instruction at ``position`` of ``comp``.

        It may not be an entry parameter or constant, nothing in ``comp`` may read it after ``position``,
        and its other members must be dead: inside a loop body, the loop's state (the while operand if it
        died at the loop, the loop result, the condition's view of the state) is fair game, since the body
        produces the next state."""
        loop = self.loops.get(comp)
        for m in self._members(key):
            if m in self.kinds:
                return False
            if m[0] == comp:
                if self.leaf_reads.get(m, -1) > position:
                    return False
                continue
            if loop is None:
                return False
            parent, while_name, at, cond = loop
            if m[0] == cond:
                continue
            if m[0] != parent:
                return False
            defined, last = self.position[(parent, m[1])], self.last_use.get((parent, m[1]), -1)
            if not (m[1] == while_name or defined > at or last <= at):
                return False
        return True

    def _alias(self, comp: Computation, instr: Instruction) -> None:
        """Put the buffers ``instr``'s result shares with other values in one class (:data:`ALIASES`)."""
        rule = ALIASES.get(instr.opcode)
        if rule is not None:
            rule(self, comp, instr)

    def union_same(self, a: Key, b: Key, shape: AnyShape) -> None:
        """Share one buffer between every leaf of ``a`` and ``b`` (both of ``shape``) that has one layout."""
        for path, _ in leaf_paths(shape):
            x, y = (a[0], a[1], a[2] + path), (b[0], b[1], b[2] + path)
            if x in self.shapes and self.shapes.get(x) == self.shapes.get(y):
                self.uf.union(x, y)

    def _alias_loop_operand(self, comp: Computation, instr: Instruction) -> None:
        """The loop operand's leaves share the state's buffers when the loop is their last use, or when the
        body passes them on unchanged in the operand's layout and memory space (a ``fori_loop`` reading
        slices of an input it carries in HBM: the loop never writes that buffer, so it need not be a copy of
        the input, 8 MB per run before; a state kept in VMEM is still copied there once)."""
        c = comp.name
        here = self.position[(c, instr.name)]
        body = self.module[instr.attr("body")]
        for path, _ in leaf_paths(instr.shape):
            state = (c, instr.name, path)
            operand = (c, instr.operands[0], path)
            if self.uf.find(operand) == self.uf.find(state):
                continue
            unchanged = _passed_on(body, path) and self.shapes.get(operand) == self.shapes.get(state)
            # (an operand in another memory would take the state there: in HBM, read and copied back there
            # every iteration, where one copy into VMEM before the loop does)
            dies = _same_memory(self, operand, state) and self._overwritable(c, operand, here)
            if dies or unchanged:
                self.uf.union(state, operand)
            else:
                self.copy_in.add(state)

    def _alias_loop_results(self, comp: Computation, instr: Instruction) -> None:
        """The body's result may be built right in the loop state's buffer, when the old state is dead by the
        time it is produced (after every computation's own aliases are known)."""
        c = comp.name
        body = self.module[instr.attr("body")]
        for path, _ in leaf_paths(instr.shape):
            state_key = (c, instr.name, path)
            state = self.uf.find(state_key)
            if self.uf.find((body.name, body.root, path)) == state:
                continue
            producer = self._producer(body, body.root, path)
            if producer is None:
                self.copy_back.add((body.name, path))
                continue
            at = self.position[(body.name, producer)]
            # The new state's buffer is first written by the earliest member of the producer's class (the
            # operand a dynamic-update-slice updates in place is written before the update is): the old
            # state must be dead by then. An elementwise producer that is that first writer may read the
            # old state where it writes the new one (XLA's CanShareOperandBufferWithUser).
            first = min(self.position[(m[0], m[1])] for m in self._members((body.name, producer, ())))
            reads = first == at and self._reads_state_elementwise(body, producer, state_key)
            if self._overwritable(body.name, state_key, first if reads else first - 1):
                self.uf.union(state, (body.name, producer, ()))
            else:
                self.copy_back.add((body.name, path))

    def _reads_state_elementwise(self, comp: Computation, producer: str, state: Key) -> bool:
        """True when ``producer`` computes each output element from the same element of the state leaf: an
        elementwise op, or a loop fusion of elementwise ops (and broadcast scalars), reading the state only
        as a same-shaped operand. Such a producer may write the new state where it reads the old."""
        instr = comp[producer]
        if instr.opcode == "fusion":
            fused = self.module[instr.attr("calls")]
            pointwise = all(
                i.opcode in ELEMENTWISE
                or i.opcode in ("parameter", "constant")
                or (i.opcode == "broadcast" and fused[i.operands[0]].array_shape.rank == 0)
                for i in fused.instructions
            )
            if not pointwise or not isinstance(instr.shape, Shape):
                return False
        elif instr.opcode not in ELEMENTWISE:
            return False
        root = self.uf.find(state)
        for o in instr.operands:
            key = (comp.name, o, ())
            same = key in self.shapes and self.uf.find(key) == root
            if same and self.shapes[key].dimensions != instr.array_shape.dimensions:
                return False
        return True

    def _producer(self, comp: Computation, value: str, path: tuple[int, ...]) -> str | None:
        """The instruction that computes leaf ``path`` of ``value`` as a fresh array of ``comp`` (through tuples
        and get-tuple-elements of tuples), or None when that leaf is a parameter, constant or other alias."""
        instr = comp[value]
        while True:
            if path and instr.opcode == "tuple":
                instr, path = comp[instr.operands[path[0]]], path[1:]
            elif instr.opcode == "get-tuple-element" and comp[instr.operands[0]].opcode == "tuple":
                instr = comp[comp[instr.operands[0]].operands[instr.attr("index")]]
            else:
                break
        if path or instr.opcode in ("parameter", "constant", "get-tuple-element", "tuple", "opt-barrier"):
            return None
        key = (comp.name, instr.name, ())
        if key not in self.shapes:
            return None
        # Only a buffer of this body's own (not already shared with another loop state, a parameter, ...).
        for m in self._members(key):
            if m[0] != comp.name or m in self.kinds or m in self.loop_state:
                return None
        return instr.name

    # ------------------------------------------------------------------ allocation
    def allocate(self) -> BufferAssignment:
        classes: dict[Key, _Class] = {}
        for key, shape in self.shapes.items():
            root = self.uf.find(key)
            cls = classes.get(root)
            if cls is None:
                classes[root] = cls = _Class([], key[0], shape)
            cls.members.append(key)
            if self.depth[key[0]] < self.depth[cls.owner]:
                cls.owner = key[0]
            if shape.byte_size > cls.shape.byte_size:
                cls.shape = shape
            if key in self.kinds:
                cls.kind = self.kinds[key]
            elif key in self.loop_state and cls.kind == "temporary":
                cls.kind = "loop-state"
        entry = self.module.entry_computation
        outputs = set()
        for path, _ in leaf_paths(entry.root_instruction.shape):
            root = self.uf.find((entry.name, entry.root, path))
            outputs.add(root)
            if classes[root].kind == "temporary":
                classes[root].kind = "output"
        for cls in classes.values():
            if cls.kind not in ("parameter", "output") and all(
                self.shapes[m].effective_layout.memory_space == 1 for m in cls.members
            ):
                cls.space = "vmem"  # the module keeps it in VMEM (S(1)); entry parameters and outputs live in HBM
        self.classes = classes
        self._fit_vmem()
        offset = 0
        # Entry parameters in parameter order, then constants: live for the whole run.
        for p in entry.parameters:
            for path, _ in leaf_paths(p.shape):
                offset = self._place(classes[self.uf.find((entry.name, p.name, path))], offset)
        vmem_constants = 0
        for cls in classes.values():
            if cls.kind == "constant" and cls.buffer is None:
                if cls.space == "vmem":
                    vmem_constants = self._place(cls, vmem_constants)
                else:
                    offset = self._place(cls, offset)
        smem = self._place_scalars({r: c for r, c in classes.items() if r not in outputs})
        peak = self._allocate_scope(entry.name, offset, space="hbm")
        vmem = self._allocate_scope(entry.name, vmem_constants, space="vmem")
        leaves = {k: classes[self.uf.find(k)].buffer for k in self.shapes}
        return BufferAssignment(
            tuple(self.buffers),
            leaves,  # type: ignore[arg-type]
            peak,
            smem,
            vmem,
            frozenset(self.copy_back),
            frozenset(self.copy_in),
            byte_bitcasts=self.byte_bitcasts,
        )

    def _fit_vmem(self) -> int:
        """Move VMEM classes to HBM, largest first, until the resident buffers fit :attr:`vmem_budget` (a module
        whose ``S(1)`` values do not fit with the VMEM tpusim's own blocks need still runs, its biggest
        residents in HBM); returns the resident bytes. The cut is found by bisection over the class sizes."""
        resident = sorted((c for c in self.classes.values() if c.space == "vmem"), key=lambda c: c.shape.byte_size)
        if self.vmem_budget <= 0:
            for c in resident:
                c.space = "hbm"
            return 0

        def need(keep: int) -> int:  # the VMEM extent when the `keep` smallest classes stay resident
            for i, c in enumerate(resident):
                c.space = "vmem" if i < keep else "hbm"
            constants = sum(self._align(c.shape.byte_size, "vmem") for c in resident[:keep] if c.kind == "constant")
            self.extents = {}
            return self._allocate_scope(self.module.entry, constants, place=False, space="vmem")

        lo, hi = 0, len(resident)  # need(lo) fits; find the largest keep that fits
        if need(hi) <= self.vmem_budget:
            lo = hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if need(mid) <= self.vmem_budget:
                lo = mid
            else:
                hi = mid - 1
        extent = need(lo)
        self.extents = {}
        return extent

    def _place_scalars(self, classes: dict[Key, _Class]) -> int:
        """Integer and pred scalars the program computes (not its inputs, outputs or constants; ``classes``
        holds no outputs) live in
        SMEM, one word each, where the scalar unit reads and writes them directly (as TPUs keep loop counters
        and offsets). Returns the SMEM bytes used; what does not fit (half of SMEM at most) stays in HBM."""
        limit = self.smem_capacity // 2
        at = 0
        for cls in classes.values():
            scalar = all(_smem_word(self.shapes[m]) for m in cls.members)
            if not scalar or cls.kind not in ("temporary", "loop-state") or cls.buffer is not None or at + 4 > limit:
                continue
            first = cls.members[0]
            label = f"{first[0]}/{first[1]}" + (str(list(first[2])) if first[2] else "")
            shape = cls.shape.with_layout(Layout(()))
            cls.buffer = len(self.buffers)
            self.buffers.append(Buffer(cls.buffer, at, shape.byte_size, shape, cls.kind, label, "smem"))
            at += 4
        return at

    def _align(self, n: int, space: str) -> int:
        unit = self.vmem_alignment if space == "vmem" else ALIGNMENT
        return -(-n // unit) * unit

    def _place(self, cls: _Class, at: int) -> int:
        if cls.buffer is not None:
            return at
        first = cls.members[0]
        label = f"{first[0]}/{first[1]}" + (str(list(first[2])) if first[2] else "")
        size = cls.shape.byte_size
        capacity = self.capacity if cls.space == "hbm" else self.vmem_budget
        if at + size > capacity:
            raise OutOfMemoryError(
                f"{cls.space.upper()} is full: {cls.kind} buffer {label} ({cls.shape}, {size} bytes) would end at "
                f"byte {at + size}, but {cls.space.upper()} holds {capacity} bytes"
            )
        cls.buffer = len(self.buffers)
        self.buffers.append(Buffer(cls.buffer, at, size, cls.shape, cls.kind, label, cls.space))
        return self._align(at + size, cls.space)

    def _intervals(self, comp_name: str, space: str) -> list[tuple[int, int, _Class | None, tuple[str, ...], int]]:
        """Live intervals (start, end, class or None for a nested region, callees, bytes) of a scope's classes
        in ``space``."""
        comp = self.module[comp_name]
        out: list[tuple[int, int, _Class | None, tuple[str, ...], int]] = []
        for cls in self.classes.values():
            if cls.owner != comp_name or cls.buffer is not None or cls.space != space:
                continue
            local = [k for k in cls.members if k[0] == comp_name]
            start = min(self.position[(k[0], self.live_from.get((k[0], k[1]), k[1]))] for k in local)
            end = max(max(self.last_use.get((k[0], k[1]), 0), self.position[(k[0], k[1])]) for k in local)
            if cls.kind == "output":
                end = len(comp.instructions)
            out.append((start, end, cls, (), self._align(cls.shape.byte_size, space)))
        for i, instr in enumerate(comp.instructions):
            callees = sequential_callees(instr)
            if callees:
                need = max(self._scope_extent(c, space) for c in callees)
                if need:
                    out.append((i, i, None, callees, need))
        return out

    def _scope_extent(self, comp_name: str, space: str) -> int:
        """Bytes a computation's own buffers and nested calls take when first-fit places them from offset 0:
        the region its caller reserves for it, which must hold the placement :meth:`_allocate_scope` makes
        (first fit can need more than the peak of live bytes, when freed ranges are too small to reuse)."""
        extent = self.extents.get((comp_name, space))
        if extent is None:
            extent = self.extents[(comp_name, space)] = self._allocate_scope(comp_name, 0, place=False, space=space)
        return extent

    def _allocate_scope(self, comp_name: str, base: int, place: bool = True, *, space: str) -> int:
        """First-fit allocation of a scope's classes in ``space`` above ``base``; returns the highest byte used.
        With ``place=False``, only measures: the same layout, nothing assigned."""
        placed: list[tuple[int, int, int, int]] = []  # (start, end, offset, size)
        peak = base
        for start, end, cls, callees, size in sorted(self._intervals(comp_name, space), key=lambda t: (t[0], -t[4])):
            at = base
            for s, e, o, z in sorted(placed, key=lambda t: t[2]):
                if s <= end and start <= e and at < o + z and o < at + size:
                    at = self._align(o + z, space)
            if place and cls is not None:
                self._place(cls, at)
            elif place:
                for callee in callees:  # branches of a conditional share the region
                    peak = max(peak, self._allocate_scope(callee, at, space=space))
            placed.append((start, end, at, size))
            peak = max(peak, at + size)
        return peak


def assign_buffers(
    module: Module,
    hbm_capacity_bytes: int,
    smem_capacity_bytes: int = 0,
    vmem_budget_bytes: int = 0,
    vmem_alignment: int = 4096,
    live_from: Mapping[tuple[str, str], str] | None = None,
    held: Mapping[tuple[str, str], str] | None = None,
    byte_bitcasts: frozenset[tuple[str, str]] = frozenset(),
) -> BufferAssignment:
    """Assign buffers to a layout-assigned module (every array shape must carry its final layout): HBM for
    arrays (aligned to :data:`ALIGNMENT`), VMEM for the arrays whose layout says ``S(1)`` as long as they fit
    ``vmem_budget_bytes`` (the largest move to HBM until they do; aligned to ``vmem_alignment``, one vector
    register), SMEM (up to half of ``smem_capacity_bytes``) for integer scalars the program computes.

    ``live_from`` maps ``(computation, value)`` to an earlier instruction of that computation from whose
    position the value's buffer is live: an epilogue fusion, whose code runs inside its matrix product's, so
    its result must not share bytes with what the product reads. ``held`` maps ``(computation, value)`` to a
    later instruction until which the value is read: the operands of a prologue fusion, whose code runs
    inside the matrix product after it (``lowering/prologue.py``), so the product's buffers and blocks must
    not overwrite them. ``byte_bitcasts`` lists the bitcasts that mean their operand's bytes
    (:attr:`BufferAssignment.byte_bitcasts`)."""
    planner = _Planner(
        module,
        hbm_capacity_bytes,
        smem_capacity_bytes,
        vmem_budget_bytes,
        vmem_alignment,
        live_from or {},
        held,
        byte_bitcasts,
    )
    planner.build()
    assignment = planner.allocate()
    spans = live_spans(module, assignment, live_from, held)
    check_disjoint(module, assignment, spans)
    return replace(assignment, vmem_tops=_vmem_tops(module, assignment, spans))


def _vmem_tops(
    module: Module, assignment: BufferAssignment, spans: Mapping[str, Mapping[int, tuple[int, int]]]
) -> dict[tuple[str, str], int]:
    """Per instruction of the sequential computations, the byte above every VMEM buffer live at it."""
    out: dict[tuple[str, str], int] = {}
    buffers = assignment.buffers
    for name, live in spans.items():
        vmem = [
            (lo, hi, buffers[b].offset + buffers[b].size) for b, (lo, hi) in live.items() if buffers[b].space == "vmem"
        ]
        for i, instr in enumerate(module[name].instructions):
            out[(name, instr.name)] = max((top for lo, hi, top in vmem if lo <= i <= hi), default=0)
    return out


def live_spans(
    module: Module,
    assignment: BufferAssignment,
    live_from: Mapping[tuple[str, str], str] | None = None,
    held: Mapping[tuple[str, str], str] | None = None,
) -> dict[str, dict[int, tuple[int, int]]]:
    """Per sequential computation, per buffer, the positions ``(first, last)`` it holds a live value.

    Worked out afresh from the module, not from the planner's intervals: in each sequential computation a
    leaf is live from the instruction that defines it to the last one that names it (the root's leaves to
    the end), and everything live where a computation is run (its ``while``, ``call`` or ``conditional`` in
    the caller, the loop state included) is live throughout it; a value of ``live_from`` from its
    instruction's position, a value of ``held`` to its instruction's (see :func:`assign_buffers`)."""
    live_from = live_from or {}
    held = held or {}
    callers: dict[str, list[tuple[str, int]]] = {}
    for name in sequential_computations(module):
        for i, instr in enumerate(module[name].instructions):
            for callee in sequential_callees(instr):
                callers.setdefault(callee, []).append((name, i))
    spans: dict[str, dict[int, tuple[int, int]]] = {}  # computation -> buffer id -> (first, last) position

    def own_spans(name: str) -> dict[int, tuple[int, int]]:
        comp = module[name]
        last: dict[str, int] = {comp.root: len(comp.instructions)}
        for i, instr in enumerate(comp.instructions):
            for o in instr.operands:
                last[o] = max(last.get(o, i), i)
        for o, done in _holds(comp, held).items():
            last[o] = max(last.get(o, done), done)
        at = {instr.name: i for i, instr in enumerate(comp.instructions)}
        out: dict[int, tuple[int, int]] = {}
        for i, instr in enumerate(comp.instructions):
            first = at[live_from.get((name, instr.name), instr.name)]
            for path, _ in leaf_paths(instr.shape):
                b = assignment.leaves.get((name, instr.name, path))
                if b is None:
                    continue
                lo, hi = out.get(b, (first, i))
                out[b] = (min(lo, first), max(hi, last.get(instr.name, i)))
        return out

    def live(name: str) -> dict[int, tuple[int, int]]:
        if name in spans:
            return spans[name]
        comp = module[name]
        out = spans[name] = own_spans(name)
        whole = (0, len(comp.instructions))
        for caller, at in callers.get(name, []):
            for b, (lo, hi) in live(caller).items():
                if lo <= at <= hi:
                    out[b] = whole
        return out

    return {name: live(name) for name in sequential_computations(module)}


def check_disjoint(
    module: Module, assignment: BufferAssignment, spans: Mapping[str, Mapping[int, tuple[int, int]]] | None = None
) -> None:
    """Raise an internal :class:`CompileError` when two buffers that hold values live at the same time
    (``spans``, default :func:`live_spans`) share bytes: a wrong answer caught at compile time instead of a
    silent one at run time."""
    if spans is None:
        spans = live_spans(module, assignment)
    buffers = assignment.buffers
    for name, live in spans.items():
        intervals = sorted(
            ((buffers[b], lo, hi) for b, (lo, hi) in live.items() if buffers[b].size),
            key=lambda t: (t[0].space, t[0].offset),
        )
        for n, (a, lo, hi) in enumerate(intervals):
            for b, blo, bhi in intervals[n + 1 :]:
                if b.space != a.space or b.offset >= a.offset + a.size:
                    break
                if blo <= hi and lo <= bhi:
                    raise CompileError(
                        f"internal: buffer assignment put {a.label} ({a.space} {a.offset:#x}, {a.size} bytes) and "
                        f"{b.label} ({b.space} {b.offset:#x}, {b.size} bytes) in the same bytes, both live in {name}"
                    )


# ---------------------------------------------------------------------------------------------------------
# Alias rules: which values share one buffer, per opcode
# ---------------------------------------------------------------------------------------------------------
AliasRule = Callable[[_Planner, Computation, Instruction], None]

ALIASES: dict[str, AliasRule] = {}
"""Opcode -> the rule putting its result's leaves in the buffer classes of the values they are (forwarded
tuple elements, free reshapes and transposes, loop state, async pairs ...). Opcodes without a rule get
buffers of their own."""


def _aliases(*opcodes: str) -> Callable[[AliasRule], AliasRule]:
    def add(fn: AliasRule) -> AliasRule:
        for op in opcodes:
            ALIASES[op] = fn
        return fn

    return add


def _one_buffer(p: _Planner, comp: Computation, instr: Instruction) -> None:
    p.uf.union((comp.name, instr.operands[0], ()), (comp.name, instr.name, ()))


@_aliases("constant")
def _constant(p: _Planner, comp: Computation, instr: Instruction) -> None:
    for key in p.leaves(comp.name, instr):
        p.kinds[key] = "constant"


@_aliases("get-tuple-element")
def _get_tuple_element(p: _Planner, comp: Computation, instr: Instruction) -> None:
    index = instr.attr("index")
    for key in p.leaves(comp.name, instr):
        p.uf.union((comp.name, instr.operands[0], (index, *key[2])), key)


def _passed_on(body: Computation, path: tuple[int, ...]) -> bool:
    """Whether the loop body's result at ``path`` (one element of its root tuple) is its parameter's element
    there, unchanged."""
    root = body.root_instruction
    if len(path) != 1 or root.opcode != "tuple":
        return False
    source = body[root.operands[path[0]]]
    return (
        source.opcode == "get-tuple-element"
        and source.operands[0] == body.parameters[0].name
        and source.attr("index") == path[0]
    )


@_aliases("tuple")
def _tuple(p: _Planner, comp: Computation, instr: Instruction) -> None:
    for i, o in enumerate(instr.operands):
        for path, _ in leaf_paths(comp[o].shape):
            p.uf.union((comp.name, o, path), (comp.name, instr.name, (i, *path)))


def _to_word(comp: Computation, instr: Instruction) -> bool:
    """Whether ``instr`` takes the one element of an array (``u32[1]``, a slice of a key or a rotation table)
    as an integer scalar: the scalar is an SMEM word of its own (buffer assignment's SMEM rule), so the
    scalar arithmetic on it runs on the scalar unit, where sharing the array's buffer put it in HBM, each
    operation a DMA round trip (threefry's rotation amounts: 2,400 cycles per round)."""
    return _smem_word(instr.shape) and comp[instr.operands[0]].array_shape.rank > 0


def _smem_word(shape: AnyShape) -> bool:
    """An integer or pred scalar of at most 32 bits: what SMEM holds (one word)."""
    if not isinstance(shape, Shape) or shape.rank:
        return False
    et = shape.element_type
    return (et.is_integer or et.name == "pred") and et.bits <= 32


@_aliases("reshape")
def _reshape(p: _Planner, comp: Computation, instr: Instruction) -> None:
    # A reshape that moves no byte (its layouts' digit forms agree, tpusim.memory.digits): one buffer; but not
    # an array's one element taken as a scalar the scalar unit computes on (an SMEM word of its own).
    if _to_word(comp, instr):
        return
    if bytes_agree(comp[instr.operands[0]].array_shape, instr.array_shape, row_major=True):
        _one_buffer(p, comp, instr)


@_aliases("bitcast")
def _bitcast(p: _Planner, comp: Computation, instr: Instruction) -> None:
    # A bitcast whose result is its operand's bytes where they are (XLA: "a bitcast moves nothing"): one buffer,
    # no code; a tile-padded one among them (f32[501]{0:T(512)} -> f32[512]{0:T(512)}) reads the operand's
    # padding as elements, which XLA's programs only slice away.
    # A bitcast of tiled text layouts means the bytes themselves (XLA's), whatever the types and tiles.
    src, dst = comp[instr.operands[0]].array_shape, instr.array_shape
    if _to_word(comp, instr):
        return
    if ((comp.name, instr.name) in p.byte_bitcasts and src.byte_size == dst.byte_size) or bytes_in_place(src, dst):
        _one_buffer(p, comp, instr)


@_aliases("transpose")
def _transpose(p: _Planner, comp: Computation, instr: Instruction) -> None:
    # A transpose whose layouts permute with it reads every byte where it is: one buffer.
    if free_transpose(comp[instr.operands[0]].array_shape, tuple(instr.attr("dimensions")), instr.array_shape):
        _one_buffer(p, comp, instr)


@_aliases("bitcast-convert")
def _bitcast_convert(p: _Planner, comp: Computation, instr: Instruction) -> None:
    # Same width, same dimensions and layout: the result's bytes are the operand's.
    a, b = comp[instr.operands[0]].shape, instr.shape
    if (
        isinstance(a, Shape)
        and isinstance(b, Shape)
        and a.element_type.bits == b.element_type.bits
        and a.dimensions == b.dimensions
        and a.effective_layout == b.effective_layout
    ):
        _one_buffer(p, comp, instr)


@_aliases("opt-barrier")
def _opt_barrier(p: _Planner, comp: Computation, instr: Instruction) -> None:
    # No code: the result is the operand's bytes, so it must lay them out as the operand does (layout
    # assignment gives it the operand's layouts; the memory space may differ, the buffer's class decides it).
    # Sharing bytes under another layout would reinterpret them.
    for path, shape in leaf_paths(instr.shape):
        source = (comp.name, instr.operands[0], path)
        have = p.shapes.get(source, shape)
        if _bytes_layout(have) != _bytes_layout(shape):
            raise CompileError(f"internal: {instr.name} element {list(path)} is {shape} but its operand's is {have}")
        p.uf.union(source, (comp.name, instr.name, path))


def _same_memory(p: _Planner, a: Key, b: Key) -> bool:
    """Whether two values' layouts put them in one memory space (``S(n)``)."""
    x, y = p.shapes.get(a), p.shapes.get(b)
    return x is not None and y is not None and x.effective_layout.memory_space == y.effective_layout.memory_space


def _bytes_layout(shape: Shape) -> Layout:
    """How a shape's layout places its bytes (its memory space aside)."""
    return replace(shape.effective_layout, memory_space=0)


@_aliases("call", "conditional")
def _call(p: _Planner, comp: Computation, instr: Instruction) -> None:
    for n, callee in enumerate(sequential_callees(instr)):
        passed = instr.operands[n + 1 : n + 2] if instr.opcode == "conditional" else instr.operands
        for param, o in zip(p.module[callee].parameters, passed):
            for path, _ in leaf_paths(param.shape):
                p.uf.union((comp.name, o, path), (callee, param.name, path))


@_aliases("while")
def _while(p: _Planner, comp: Computation, instr: Instruction) -> None:
    # The loop state, the condition's parameter and the body's parameter are one value.
    cond, body = p.module[instr.attr("condition")], p.module[instr.attr("body")]
    for path, _ in leaf_paths(instr.shape):
        state = (comp.name, instr.name, path)
        p.loop_state.add(state)
        for sub in (cond, body):
            p.uf.union(state, (sub.name, sub.parameters[0].name, path))


@_aliases(*_ASYNC_DONES, "async-update")
def _async_result(p: _Planner, comp: Computation, instr: Instruction) -> None:
    # The result an async pair computes lives in the start's buffer: the done (or update) reads it from
    # there, so it shares it when the layouts agree (all-reduce-start is the result itself; the other
    # starts hold it at index 1, async-update is its start again).
    start = comp[instr.operands[0]]
    part = () if start.opcode == "all-reduce-start" or instr.opcode == "async-update" else (1,)
    for path, shape in leaf_paths(instr.shape):
        source = (comp.name, start.name, part + path)
        if p.shapes.get(source) == shape:
            p.uf.union(source, (comp.name, instr.name, path))


@_aliases("async-start")
def _async_start(p: _Planner, comp: Computation, instr: Instruction) -> None:
    # XLA's short form (slice-start ...): element 0 of the start holds the operands themselves.
    if instr.async_wrapped_instruction() is not None:
        for i, o in enumerate(instr.operands):
            p.union_same((comp.name, o, ()), (comp.name, instr.name, (0, i)), comp[o].shape)


@_aliases("add-dependency", "domain")
def _pass_through(p: _Planner, comp: Computation, instr: Instruction) -> None:
    # The value passes through unchanged (add-dependency's second operand is a token).
    p.union_same((comp.name, instr.operands[0], ()), (comp.name, instr.name, ()), instr.shape)


@_aliases("copy-start")
def _copy_start(p: _Planner, comp: Computation, instr: Instruction) -> None:
    # (destination, source, context): the source part is the operand itself.
    p.union_same((comp.name, instr.operands[0], ()), (comp.name, instr.name, (1,)), comp[instr.operands[0]].shape)


@_aliases("copy-done")
def _copy_done(p: _Planner, comp: Computation, instr: Instruction) -> None:
    p.union_same((comp.name, instr.operands[0], (0,)), (comp.name, instr.name, ()), instr.shape)
