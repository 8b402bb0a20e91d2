"""Planning collectives onto the chips of a system: who talks to whom, and over which rings.

Devices are XLA's flattened ids (``replica * num_partitions + partition``), and device ``d`` runs on chip
``d`` of the system's topology (:mod:`tpusim.topology`). Which devices a collective groups follows
``replica_groups`` / ``channel_id`` / ``use_global_device_ids`` as :mod:`tpusim.semantics.groups` reads them,
the reading the reference interpreter uses too, so the oracle and the lowering cannot disagree about the
groups.

A group is *structured* when it is an aligned block of the grid: on each axis it spans a contiguous run of
``L`` coordinates starting at a multiple of ``L``, and its rank order is row-major over those axes in some
order. Then each axis is one ring (or line) of the group and the per-chip facts (position on the ring,
neighbours) are a few scalar operations on the chip id. Any other group is one logical ring in rank order,
whose per-chip facts come from a table.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo.ir import Instruction, Module
from tpusim.compiler.hlo.replica_groups import instruction_groups, instruction_mode
from tpusim.semantics.groups import CROSS_PARTITION, GroupError
from tpusim.topology import Topology

__all__ = ["GroupAxis", "GroupPlan", "Participants", "permute_pairs", "plan_groups"]


@dataclass(frozen=True, slots=True)
class GroupAxis:
    """One ring of a structured group: ``length`` chips along topology ``axis``.

    Attributes:
        axis: the topology axis.
        length: chips of the group along it (``L``), a divisor of the axis length.
        stride: chip-id distance between neighbours on the axis.
        size: the axis length.
        wraps: the group's segment is a whole axis with wraparound links (a ring, not a line).
        switched: the axis is the slices of a multi-slice system, joined by the data-center network.
    """

    axis: int
    length: int
    stride: int
    size: int
    wraps: bool
    switched: bool = False


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """The groups of one collective and how they sit on the topology.

    Attributes:
        groups: device groups, each in rank order.
        size: devices per group.
        axes: for structured groups, their rings in rank order (most major first); None otherwise.
    """

    groups: tuple[tuple[int, ...], ...]
    size: int
    axes: tuple[GroupAxis, ...] | None

    def rank_of(self) -> list[int]:
        """Per device, its rank in its group."""
        out = [0] * sum(len(g) for g in self.groups)
        for g in self.groups:
            for r, d in enumerate(g):
                out[d] = r
        return out

    def member(self, device: int, rank: int) -> int:
        """The device of rank ``rank`` in ``device``'s group."""
        for g in self.groups:
            if device in g:
                return g[rank]
        raise KeyError(device)


@dataclass(frozen=True, slots=True)
class Participants:
    """Device counts of a run: ``devices = replicas x partitions`` (device ``d`` runs on chip ``d``)."""

    replicas: int
    partitions: int

    @property
    def devices(self) -> int:
        return self.replicas * self.partitions


def _fail(instr: Instruction, message: str) -> CompileError:
    return CompileError(f"{instr.name} ({instr.opcode}): {message}")


def plan_groups(module: Module, instr: Instruction, who: Participants, topology: Topology) -> GroupPlan:
    """The participant groups of ``instr`` and their placement on ``topology``.

    Raises:
        CompileError: groups naming devices the run does not have, a device in no group or in two,
            groups of different sizes.
    """
    try:
        groups = instruction_groups(instr, who.replicas, who.partitions)
    except GroupError as e:
        raise _fail(instr, f"{e} (the run has {who.replicas} replicas x {who.partitions} partitions)") from None
    rg = instr.attr("replica_groups")
    text = getattr(rg, "text", "{}")
    seen: dict[int, int] = {}
    for gi, g in enumerate(groups):
        for d in g:
            if d in seen:
                raise _fail(instr, f"device {d} is in two groups of replica_groups={text}")
            seen[d] = gi
    missing = [d for d in range(who.devices) if d not in seen]
    if missing:
        raise _fail(
            instr,
            f"replica_groups={text} leave device{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(str, missing[:8]))} out (every device of the run must be in one group)",
        )
    sizes = sorted({len(g) for g in groups})
    if len(sizes) != 1:
        raise _fail(instr, f"replica_groups={text} have groups of different sizes {sizes}")
    groups_t = tuple(tuple(g) for g in groups)
    return GroupPlan(groups_t, sizes[0], _structure(groups_t, topology))


def _structure(groups: tuple[tuple[int, ...], ...], topo: Topology) -> tuple[GroupAxis, ...] | None:
    """The rings of structured groups (see the module docstring), or None."""
    shape = None
    for g in groups:
        s = _group_structure(g, topo)
        if s is None or (shape is not None and s != shape):
            return None
        shape = s
    return shape


def _group_structure(g: tuple[int, ...], topo: Topology) -> tuple[GroupAxis, ...] | None:
    coords = [topo.coords(d) for d in g]
    axes = [a for a in range(len(topo.shape)) if len({c[a] for c in coords}) > 1]
    lengths, starts = {}, {}
    for a in axes:
        values = sorted({c[a] for c in coords})
        n = len(values)
        if values != list(range(values[0], values[0] + n)) or values[0] % n or topo.shape[a] % n:
            return None
        lengths[a], starts[a] = n, values[0]
    if prod(lengths.values()) != len(g):
        return None
    pos_rank = {tuple(c[a] - starts[a] for a in axes): r for r, c in enumerate(coords)}
    if len(pos_rank) != len(g):
        return None
    # rank distance of one step along each axis; row-major order puts the largest step first
    step: dict[int, int] = {}
    for i, a in enumerate(axes):
        unit = tuple(1 if j == i else 0 for j in range(len(axes)))
        rank = pos_rank.get(unit)
        if rank is None:
            return None
        step[a] = rank
    order = sorted(axes, key=lambda a: -step[a])
    expect = 1
    for a in reversed(order):
        if step[a] != expect:
            return None
        expect *= lengths[a]
    for p, r in pos_rank.items():
        if sum(x * step[a] for x, a in zip(p, axes)) != r:
            return None
    return tuple(
        GroupAxis(a, lengths[a], topo.strides[a], topo.shape[a], whole and topo.wrap[a], topo.switched[a])
        for a in order
        for whole in (lengths[a] == topo.shape[a],)
    )


def permute_pairs(instr: Instruction, who: Participants) -> tuple[list[int], list[int]]:
    """``(target, source)`` per device for a collective-permute (-1: none), in device ids.

    ``source_target_pairs`` hold partition ids (with ``channel_id``: cross-partition, within each replica)
    or replica ids (without: cross-replica, within each partition), as the reference reads them.

    Raises:
        CompileError: an id out of range, or a device that is the source or target of two pairs.
    """
    cross_partition = instruction_mode(instr) == CROSS_PARTITION
    limit = who.partitions if cross_partition else who.replicas
    pairs = [(int(a), int(b)) for a, b in instr.attr("source_target_pairs", ())]
    for a, b in pairs:
        if not (0 <= a < limit and 0 <= b < limit):
            kind = "partition" if cross_partition else "replica"
            raise _fail(instr, f"pair {{{a},{b}}} names a {kind} id outside 0..{limit - 1}")
    for k, name in ((0, "source"), (1, "target")):
        ids = [p[k] for p in pairs]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise _fail(instr, f"id {dup[0]} is the {name} of several source_target_pairs")
    target = [-1] * who.devices
    source = [-1] * who.devices
    outer = who.replicas if cross_partition else who.partitions
    for o in range(outer):
        for a, b in pairs:
            if cross_partition:
                da, db = o * who.partitions + a, o * who.partitions + b
            else:
                da, db = a * who.partitions + o, b * who.partitions + o
            target[da] = db
            source[db] = da
    return target, source
