"""What every collective lowering shares: the system it runs on, reserved semaphores, per-chip facts in
scalar registers, and the entry handshake.

Semaphores other chips signal. Pushes from another chip must never land on a semaphore this chip uses for
something else, so collectives use semaphores taken out of the pool for the whole program (the highest
numbers), in *banks*: one per level of async collectives open at once. A bank holds

* ``ready``: a receiver signals each of its senders on entering a collective ("my buffers are yours");
  a sender waits for one signal per receiver before its first push. A receiver cannot finish a
  collective without the sender's data, so a signal of a later collective cannot arrive early;
* ``arrive[2k + (0 | 1)]``: data pushed in the + / - direction of ring axis ``k`` (direct exchanges use
  channel 0). Each has one sender per collective, whose pushes land in the order it issued them
  (``tpusim.devices.dma``), so counts arrive in order;
* ``credit`` (bank 0 only, beside the arrival semaphores of ICI axes on systems of two or more): on the
  sender: a
  reduce-scatter whose partial sums land in the receiver's VMEM (:mod:`.collective_landing`) pushes into a
  landing buffer only with a credit the receiver signalled when it freed one.

The argument for ``ready`` holds when consecutive collectives pair a chip with the same peers. Two
collective-permutes in opposite directions around a ring do not: a chip that sent its part of the first
one can leave it and signal its next source, which may still wait for the first one's ``ready`` from
another chip, takes the signal for it and pushes into a buffer its target still reads (wrong numbers
on a line of 8 chips, found by a fuzz campaign). So each *relation* of the program's collective-permutes
(who sends to whom) has a ``ready`` and an ``arrive`` semaphore of its own, outside the banks: on each
chip, one peer signals each of them (its target, its source), in the order it runs those permutes. A
program whose only collectives are permutes of one relation uses the bank's.

Per-chip facts (ring position, neighbours, partners) are scalar arithmetic on ``s.chip_id`` for structured
groups, or a branch-free table select (``v = v0 + sum_c (chip == c) * (v_c - v0)``) otherwise, so every
chip runs the same stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo.ir import Module
from tpusim.compiler.hlo.opcodes import ASYNC_COLLECTIVE_DONES, ASYNC_COLLECTIVE_STARTS, COLLECTIVES
from tpusim.compiler.hlo.xla_forms import wrapped_collective
from tpusim.compiler.lowering.collective_plan import GroupAxis, GroupPlan, Participants, permute_pairs
from tpusim.compiler.lowering.context import ASYNC_REQUESTS, Lowering, StateKey
from tpusim.config import ChipConfig
from tpusim.isa import DmaStart, MemRef, Reg, ScalarAlu, SemSignal, SemWait, Space
from tpusim.memory import Layout, Shape, geometry
from tpusim.topology import Topology, system_topology

__all__ = [
    "LOCAL_SEMAPHORES",
    "Bank",
    "CollectiveState",
    "Facts",
    "collective_state",
    "flat_view",
    "reserved_semaphores",
]

_COLLECTIVES = COLLECTIVES | ASYNC_COLLECTIVE_STARTS
"""Collectives tpusim lowers (each also wrapped in an ``async-start``), and their own async starts."""


PARTS = 3
"""Parts of the data a collective over several torus axes moves at once, each over the axes in another
order (``collectives._axis_orders``), so a 3-D torus keeps all its axes busy in every round; a bank of an
async collective holds a local completion semaphore per part. The parts share their scratch registers
(``collective_ring.RingWork``), which keeps three parts' rings within the core's 32."""


@dataclass(frozen=True, slots=True)
class Bank:
    """Reserved semaphores of one level of open async collectives."""

    ready: int
    arrive: tuple[int, ...]
    credit: tuple[tuple[int, int], ...]  # (arrival semaphore, the credit semaphore beside it), where there is one
    # completions of this chip's pushes of an async collective (outlive its -start), one per part (PARTS)
    locals: tuple[int, ...] = ()
    # an async collective the async sequencer runs signals it after its last step; the -done waits for it
    done: int | None = None

    def credit_for(self, arrive: int) -> int | None:
        """The credit semaphore beside arrival semaphore ``arrive`` (None: there is none)."""
        return dict(self.credit).get(arrive)

    @property
    def local(self) -> int | None:
        return self.locals[0] if self.locals else None


@dataclass
class CollectiveState:
    """Per-compilation facts of the system (kept on the lowering context).

    Attributes:
        who: replicas x partitions of the run.
        topology: the chips' grid.
        banks: reserved semaphores, by async nesting level.
        open_async: ``-start`` instructions whose ``-done`` is not lowered yet: (bank, split in two parts, the
            second part on the async sequencer).
    """

    who: Participants
    topology: Topology
    banks: list[Bank]
    open_async: dict[str, tuple[int, bool, bool]] = field(default_factory=dict)
    # collective-permutes' (ready, arrive) semaphores by relation: each device's target (see the docstring);
    # empty when the module's only collectives are permutes of one relation, which use the bank's
    relations: dict[tuple[int, ...], tuple[int, int]] = field(default_factory=dict)
    async_loads: tuple[int, ...] = ()  # ASYNC_LOADS semaphores for the async sequencer's reduce-scatters
    doorbell: int | None = None  # the async sequencer waits on it for requests
    arena: tuple[object, MemRef] | None = None  # (lowering scope, VMEM) the current instruction's rings share

    def free_bank(self) -> int:
        """The lowest bank no open async collective holds.

        Raises:
            CompileError: every bank is held (more async collectives in flight than the module's computations
                showed one at a time, e.g. through a call or loop between a start and its done)."""
        held = {level for level, split, _ in self.open_async.values() if split}
        free = set(range(len(self.banks))) - held
        if not free:
            raise CompileError(
                f"{len(held)} async collectives are in flight ({', '.join(sorted(self.open_async))}); the "
                f"{len(self.banks)} semaphore banks reserved for collectives are all held"
            )
        return min(free)

    def channel(self, axis: int, step: int, part: int = 0) -> int:
        """The arrive-semaphore index of ring traffic along topology ``axis`` in direction ``step``; along the
        slices of a multi-slice system, of part ``part`` of a collective over several axes (the parts take
        that one ring at once, each counting its own arrivals)."""
        return _channel(self.topology, axis, step, part)


def _ring_axes(topology: Topology) -> list[int]:
    """The axes with rings (of two chips or more), at least axis 0."""
    return [a for a, n in enumerate(topology.shape) if n > 1] or [0]


def _channel(topology: Topology, axis: int, step: int, part: int = 0) -> int:
    """:meth:`CollectiveState.channel`."""
    axes = _ring_axes(topology)
    k = axes.index(axis) if axis in axes else 0
    if part and topology.switched[axis]:
        k = len(axes) + part - 1
    return 2 * k + (0 if step > 0 else 1)


def participants(module: Module, config: ChipConfig) -> Participants:
    """Replicas and partitions of a run: the system's chips (``ici.shape`` times ``dcn.slices``) or the
    module's own counts."""
    partitions = module.num_partitions
    declared = module.replica_count * partitions
    shape = config.ici.shape
    devices = prod(shape) * config.dcn.slices if shape is not None else declared
    if devices % partitions:
        raise CompileError(
            f"{module.name}: {devices} chips cannot hold num_partitions={partitions} (need a multiple of it)"
        )
    if declared > 1 and module.replica_count > 1 and devices != declared:
        raise CompileError(
            f"{module.name}: the module runs on replica_count x num_partitions = {declared} devices, "
            f"but the system has {devices} chips"
        )
    return Participants(devices // partitions, partitions)


def _banks_needed(module: Module) -> tuple[int, bool]:
    """(banks: the most collectives in flight at once, whether any is async). A call, loop or conditional
    whose computations hold collectives counts as one where it stands."""
    holds: dict[str, bool] = {}

    def has_collective(name: str) -> bool:
        if name not in holds:
            holds[name] = False
            holds[name] = any(
                is_collective(i.opcode) or any(has_collective(c) for c in i.called_computations())
                for i in module[name].instructions
            )
        return holds[name]

    depth, any_async = 1, False
    for comp in module.computations:
        open_now = 0
        for instr in comp.instructions:
            wrapped = wrapped_collective(module, instr) is not None
            nested = instr.opcode in ("call", "while", "conditional") and any(
                has_collective(c) for c in instr.called_computations()
            )
            if is_collective(instr.opcode) or wrapped or nested:
                depth = max(depth, open_now + 1)
            if instr.opcode in ASYNC_COLLECTIVE_STARTS or wrapped:
                open_now += 1
                any_async = True
            elif instr.opcode == "async-done" or instr.opcode in ASYNC_COLLECTIVE_DONES:
                open_now = max(0, open_now - 1)
    return depth, any_async


_STATE: StateKey[CollectiveState] = StateKey("collectives")

LOCAL_SEMAPHORES = 4
"""Semaphores a program with collectives keeps for its local transfers at least."""


def _bank_layout(module: Module, config: ChipConfig) -> tuple[int, int, bool, list[int]]:
    """(banks, ring axes with arrival semaphores, whether any collective is async, the arrival channels that
    have a credit beside them) for ``module``'s collectives on ``config``'s system."""
    topology = system_topology(config, participants(module, config).devices)
    axes = len(_ring_axes(topology))
    if topology.slices > 1:  # the slices' ring: its own arrival semaphores for every part but the first
        axes += PARTS - 1
    banks, any_async = _banks_needed(module)
    return banks, axes, any_async, _credit_channels(topology)


def _permute_relations(module: Module, who: Participants) -> list[tuple[int, ...]]:
    """The distinct relations of ``module``'s collective-permutes (sync, async and XLA's wrapped forms) that
    need semaphores of their own: none when they are the module's only collectives and all of one relation
    (the bank's ``ready`` and first arrival then serve them alone; the teaching chip's 8 semaphores hold
    no more)."""
    found: list[tuple[int, ...]] = []
    others = False
    for comp in module.computations:
        for instr in comp.instructions:
            op = wrapped_collective(module, instr) or instr
            if op.opcode in ("collective-permute", "collective-permute-start"):
                relation = tuple(permute_pairs(op, who)[0])  # each device's target (-1: none)
                if relation not in found:
                    found.append(relation)
            elif is_collective(op.opcode):
                others = True
    return found if others or len(found) > 1 else []


def _credit_channels(topology: Topology) -> list[int]:
    """The arrival channels (:meth:`CollectiveState.channel` of part 0) with a credit semaphore beside them in
    bank 0: both directions of every ICI axis on a system of two or more, whose reduce-scatters land partial
    sums in VMEM (:mod:`.collective_landing`; a single ring keeps HBM slots and its few semaphores, so the
    smallest configs still run collectives; a ring over the data-center network keeps HBM slots, as a credit
    would cross the network again; deeper banks' collectives keep HBM slots too)."""
    ici = [a for a in _ring_axes(topology) if not topology.switched[a]]
    if len(ici) < 2:
        return []
    return [_channel(topology, a, step) for a in ici for step in (1, -1)]


def _per_bank(axes: int, any_async: bool) -> int:
    """A bank's semaphores: ``ready``, two arrivals per axis and, with async collectives, a completion per
    part and ``done``."""
    return 1 + 2 * axes + (PARTS + 1 if any_async else 0)


ASYNC_LOADS = 2 * PARTS
"""Semaphores of the async sequencer: its reduce-scatter block loads signal two per part (it runs one
collective at a time, so one set serves them all); one more is its doorbell, which the main sequencer's
requests signal."""


def reserved_semaphores(module: Module, config: ChipConfig) -> int:
    """How many semaphores ``module``'s collectives reserve on ``config``'s system."""
    banks, axes, any_async, credits = _bank_layout(module, config)
    relations = _permute_relations(module, participants(module, config))
    return _reserved(banks, axes, any_async, len(credits)) + 2 * len(relations)


def _reserved(banks: int, axes: int, any_async: bool, credits: int) -> int:
    return banks * _per_bank(axes, any_async) + credits + (ASYNC_LOADS + 1 if any_async else 0)


def collective_state(ctx: Lowering) -> CollectiveState:
    """The collective state of this compilation, created (and the semaphores reserved) on first use.

    Raises:
        CompileError: too few semaphores, or an earlier instruction already used the reserved ones.
    """
    found = ctx.rule_state.get(_STATE)
    if found is not None:
        return found
    who = participants(ctx.module, ctx.config)
    topology = system_topology(ctx.config, who.devices)
    banks, axes, any_async, channels = _bank_layout(ctx.module, ctx.config)
    relations = _permute_relations(ctx.module, who)
    per_bank = _per_bank(axes, any_async)
    total = ctx.config.core.semaphores
    need = _reserved(banks, axes, any_async, len(channels)) + 2 * len(relations)
    if need + LOCAL_SEMAPHORES > total:
        raise CompileError(
            f"{ctx.hlo}: collectives on a {topology} system need {need} semaphores reserved for pushes from "
            f"other chips plus {LOCAL_SEMAPHORES} for local transfers, but a core has {total} (core.semaphores)"
        )
    reserved = list(range(total - 1, total - 1 - need, -1))
    for i, ins in enumerate(ctx.stream.instructions):
        used = {getattr(ins, "sem", None), getattr(ins, "dst_sem", None)}
        clash = {s for s in used if isinstance(s, int)} & set(reserved)
        if clash:
            raise CompileError(
                f"{ctx.hlo}: semaphore {min(clash)} is reserved for collectives, but instruction {i} before it "
                f"({ins.hlo}) uses it; lower the program's semaphore pressure"
            )
    ctx.reserve_semaphores(reserved, "collectives (other chips signal them)")
    bank_list = []
    credits = reserved[banks * per_bank : banks * per_bank + len(channels)]
    for b in range(banks):
        nums = reserved[b * per_bank : (b + 1) * per_bank]
        at = 1 + 2 * axes
        locals_ = nums[at : at + PARTS]  # (empty when not async)
        done = nums[at + PARTS] if any_async else None
        arrive = tuple(nums[1:at])
        credit = tuple((arrive[c], sem) for c, sem in zip(channels, credits)) if b == 0 else ()
        bank_list.append(Bank(nums[0], arrive, credit, tuple(locals_), done))
    if banks > ASYNC_REQUESTS and any_async:
        raise CompileError(f"{ctx.hlo}: {banks} collectives in flight at once, more than {ASYNC_REQUESTS}")
    pairs = reserved[len(reserved) - 2 * len(relations) :] if relations else []
    # (the async sequencer's loads, then its doorbell)
    extra = reserved[banks * per_bank + len(credits) : len(reserved) - len(pairs)]
    state = CollectiveState(
        who,
        topology,
        bank_list,
        async_loads=tuple(extra[:ASYNC_LOADS]),
        doorbell=extra[-1] if extra else None,
        relations={r: (pairs[2 * k], pairs[2 * k + 1]) for k, r in enumerate(relations)},
    )
    ctx.rule_state.set(_STATE, state)
    return state


def is_collective(opcode: str) -> bool:
    return opcode in _COLLECTIVES


class Facts:
    """Scalar registers holding per-chip facts for one collective (all chips run the same code)."""

    def __init__(self, ctx: Lowering, state: CollectiveState) -> None:
        self.ctx = ctx
        self.state = state
        self.me = ctx.register()
        ctx.emit(ScalarAlu, fn="chip_id", dst=self.me)

    def reg(self) -> Reg:
        return self.ctx.register()

    def alu(self, fn: str, dst: Reg, a: Reg | int, b: Reg | int | None = None) -> Reg:
        self.ctx.emit(ScalarAlu, fn=fn, dst=dst, a=a, b=b)
        return dst

    def table(self, values: list[int], dst: Reg | None = None) -> Reg:
        """A register holding ``values[chip]`` on each chip: affine in the chip id when it is, else a
        branch-free select over the chips whose value differs from chip 0's."""
        out = dst if dst is not None else self.reg()
        n = len(values)
        if n > 1 and all(values[c] - values[0] == c * (values[1] - values[0]) for c in range(n)):
            self.alu("mul", out, self.me, values[1] - values[0])
            return self.alu("add", out, out, values[0])
        self.alu("mov", out, values[0])
        t = self.reg()
        for c, v in enumerate(values):
            if c and v != values[0]:
                self.alu("eq", t, self.me, c)
                self.alu("mul", t, t, v - values[0])
                self.alu("add", out, out, t)
        self.ctx.release_register(t)
        return out

    def axis_position(self, ax: GroupAxis, dst: Reg | None = None) -> Reg:
        """This chip's position on the ring of ``ax`` (its coordinate within the group's segment)."""
        out = dst if dst is not None else self.reg()
        self.alu("div", out, self.me, ax.stride)
        self.alu("rem", out, out, ax.size)
        return self.alu("rem", out, out, ax.length)

    def axis_neighbor(self, ax: GroupAxis, pos: Reg, step: int, dst: Reg | None = None) -> Reg:
        """The chip ``step`` places further along the ring of ``ax`` (modulo the segment)."""
        out = dst if dst is not None else self.reg()
        self.alu("add", out, pos, step % ax.length)
        self.alu("rem", out, out, ax.length)
        self.alu("sub", out, out, pos)
        self.alu("mul", out, out, ax.stride)
        return self.alu("add", out, out, self.me)

    def release(self, *regs: Reg | int) -> None:
        """Give registers back (each once, however often listed; immediates among them are skipped)."""
        for r in dict.fromkeys(regs):
            if isinstance(r, Reg):
                self.ctx.release_register(r)

    def select(self, key: Reg, values: list[int]) -> Reg:
        """A register holding ``values[key]`` (branch-free, as :meth:`table` but keyed by a register)."""
        out, t = self.reg(), self.reg()
        self.alu("mov", out, values[0])
        for i, v in enumerate(values):
            if i and v != values[0]:
                self.alu("eq", t, key, i)
                self.alu("mul", t, t, v - values[0])
                self.alu("add", out, out, t)
        self.release(t)
        return out

    def rank(self, plan: GroupPlan) -> Reg:
        """A register holding this chip's rank in its group of ``plan``."""
        if plan.axes is None:
            return self.table(plan.rank_of())
        out, t = self.reg(), self.reg()
        self.alu("mov", out, 0)
        q = plan.size
        for ax in plan.axes:
            q //= ax.length
            self.axis_position(ax, t)
            self.alu("mul", t, t, q)
            self.alu("add", out, out, t)
        self.release(t)
        return out

    def member(self, plan: GroupPlan, rank: Reg, j: Reg) -> Reg:
        """The chip of rank ``j`` (a register) in this chip's group (``rank`` holds this chip's rank); groups
        with no structure take a table per call site instead (see the callers)."""
        assert plan.axes is not None
        out, t, u = self.reg(), self.reg(), self.reg()
        self.alu("mov", out, self.me)
        q = plan.size
        for ax in plan.axes:
            q //= ax.length
            for reg, src in ((t, j), (u, rank)):
                self.alu("div", reg, src, q)
                self.alu("rem", reg, reg, ax.length)
            self.alu("sub", t, t, u)
            self.alu("mul", t, t, ax.stride)
            self.alu("add", out, out, t)
        self.release(t, u)
        return out

    def handshake(self, bank: Bank, upstream: list[Reg], receivers: int) -> None:
        """Tell each chip that will push to this one that it may (``ready``), then wait until every chip
        this one pushes to (``receivers`` of them) has said so."""
        for u in upstream:
            self.ctx.emit(SemSignal, sem=bank.ready, count=1, chip=u)
        if receivers:
            self.ctx.emit(SemWait, sem=bank.ready, count=receivers)


def push(ctx: Lowering, src: object, dst: object, chip: Reg, arrive: int, sem: int) -> None:
    """A DMA into another chip's memory that signals ``arrive`` there and ``sem`` here when it lands."""
    ctx.emit(DmaStart, src=src, dst=dst, chip=chip, dst_sem=arrive, sem=sem)


def flat_view(ref: MemRef) -> MemRef | None:
    """The buffer as a 1-D array of its element slots (padding included; slots keep their width, e.g. the
    32-bit ``E(32)`` slots of TPU pred arrays), or None for sub-byte slots."""
    geo = geometry(ref.shape)
    et = ref.shape.element_type
    bits = geo.element_bits
    if et.dtype is None or bits < 8 or bits % 8 or geo.prefix_bytes:
        return None
    layout = Layout((0,), element_size_bits=bits if bits != et.bits else 0)
    return MemRef(Space.HBM, ref.address, Shape(et, (geo.byte_size * 8 // bits,), layout=layout))
