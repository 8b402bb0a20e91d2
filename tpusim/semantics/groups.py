"""Which devices a collective groups together: XLA's ``CollectiveOpGroupMode``
(xla/service/collective_ops_utils.h), on plain values.

Devices: device ``d`` is replica ``d // P``, partition ``d % P`` (P = partitions); ``d`` is XLA's flattened
id.

* no ``channel_id``: cross-replica; ``replica_groups`` hold replica ids, applied within each partition;
* ``channel_id`` and ``use_global_device_ids=true``: flattened ids; the groups hold device ids;
* ``channel_id``, ``use_global_device_ids`` false or absent (all-reduce, all-gather, reduce-scatter):
  cross-replica-and-partition; each group of replicas takes every partition of those replicas;
* ``channel_id`` on (ragged-)all-to-all, collective-permute, collective-broadcast: cross-partition; the groups
  (or source-target pairs) hold partition ids, applied within each replica.

Empty ``replica_groups`` mean one group of every replica (partition, device). The order of a group is the
order of concatenation (all-gather, all-to-all) and of reduction (all-reduce, reduce-scatter).
"""

from __future__ import annotations

from collections.abc import Sequence

from tpusim.semantics.errors import SemanticsError

__all__ = [
    "CROSS_PARTITION",
    "CROSS_REPLICA",
    "CROSS_REPLICA_AND_PARTITION",
    "FLATTENED_ID",
    "GroupError",
    "group_mode",
    "participant_groups",
]

CROSS_REPLICA = "cross-replica"
CROSS_PARTITION = "cross-partition"
CROSS_REPLICA_AND_PARTITION = "cross-replica-and-partition"
FLATTENED_ID = "flattened-id"

_NO_GLOBAL_IDS = frozenset(
    {"all-to-all", "ragged-all-to-all", "collective-permute", "collective-broadcast", "collective-permute-start"}
)


class GroupError(SemanticsError):
    """Replica groups that name devices the run does not have."""


def group_mode(opcode: str, has_channel: bool, use_global_device_ids: bool) -> str:
    """XLA's CollectiveOpGroupMode of a collective (see the module docstring)."""
    if not has_channel:
        return CROSS_REPLICA
    if opcode in _NO_GLOBAL_IDS:
        return CROSS_PARTITION
    return FLATTENED_ID if use_global_device_ids else CROSS_REPLICA_AND_PARTITION


def participant_groups(mode: str, listed: Sequence[Sequence[int]], replicas: int, partitions: int) -> list[list[int]]:
    """The groups of device ids a collective of ``mode`` with ``replica_groups`` ``listed`` works in, each in
    its concatenation/reduction order.

    Raises:
        GroupError: a group names an id the run does not have.
    """
    limit = {CROSS_REPLICA: replicas, CROSS_PARTITION: partitions}.get(mode, replicas * partitions)
    if mode == CROSS_REPLICA_AND_PARTITION:
        limit = replicas
    base = [list(g) for g in listed] or [list(range(limit))]
    for g in base:
        for i in g:
            if not 0 <= i < limit:
                raise GroupError(f"{mode} group {g} names id {i}, but the run has only {limit} of them")
    if mode == CROSS_REPLICA:
        return [[r * partitions + p for r in g] for p in range(partitions) for g in base]
    if mode == CROSS_PARTITION:
        return [[r * partitions + p for p in g] for r in range(replicas) for g in base]
    if mode == CROSS_REPLICA_AND_PARTITION:
        return [[r * partitions + p for r in g for p in range(partitions)] for g in base]
    return base
