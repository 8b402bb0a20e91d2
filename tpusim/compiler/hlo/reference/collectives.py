"""Collectives over N devices, their async start/done forms, replica-id and partition-id, and the host
transfers (infeed, outfeed, host send/recv).

Which devices a collective groups together (XLA's ``CollectiveOpGroupMode``) is
:mod:`tpusim.semantics.groups`.

The order of a group is the order of concatenation (all-gather, all-to-all) and of reduction
(all-reduce, reduce-scatter: ``((v0 + v1) + v2) + ...`` with the ``to_apply`` computation). A device no
pair sends to in a collective-permute gets zeros (XLA's operation semantics, CollectivePermute:
https://openxla.org/xla/operation_semantics).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tpusim.compiler.hlo.ir import Instruction, ReplicaGroups
from tpusim.compiler.hlo.reference.control import package_start
from tpusim.compiler.hlo.reference.core import TOKEN, EvalContext, EvaluationError, Value, check_value, register
from tpusim.compiler.hlo.reference.exchange import CollectiveError
from tpusim.compiler.hlo.replica_groups import instruction_groups, instruction_mode
from tpusim.memory import TupleShape
from tpusim.semantics.groups import CROSS_PARTITION, GroupError

__all__ = ["participant_groups"]


def participant_groups(ctx: EvalContext, instr: Instruction) -> list[list[int]]:
    """The groups of device ids ``instr`` works in, each in its concatenation/reduction order."""
    try:
        return instruction_groups(instr, ctx.num_replicas, ctx.num_partitions)
    except GroupError as e:
        raise CollectiveError(instr, str(e)) from None


def _my_group(ctx: EvalContext, instr: Instruction) -> tuple[list[int], int]:
    groups = [g for g in participant_groups(ctx, instr) if ctx.device_id in g]
    if len(groups) != 1:
        what = "no group" if not groups else f"{len(groups)} groups"
        raise CollectiveError(instr, f"device {ctx.device_id} is in {what} of replica_groups={_groups_text(instr)}")
    group = groups[0]
    return group, group.index(ctx.device_id)


def _groups_text(instr: Instruction) -> str:
    rg = instr.attr("replica_groups")
    return rg.text if isinstance(rg, ReplicaGroups) else "{}"


def exchange(ctx: EvalContext, instr: Instruction, value: Value) -> list[Any]:
    """Every device's ``value`` at collective ``instr``, by device id (the device itself when alone)."""
    if ctx.exchange is None:
        if ctx.num_devices != 1:
            raise CollectiveError(instr, f"a run of {ctx.num_devices} devices needs evaluate_spmd")
        return [value]
    return ctx.exchange.meet(ctx.device_id, instr, value)


def _operands(args: Sequence[Value]) -> list[np.ndarray]:
    return [a for a in args if isinstance(a, np.ndarray)]


def _result(instr: Instruction, values: list[np.ndarray]) -> Value:
    """One array, or a tuple when the instruction has several operands (variadic collectives)."""
    return tuple(values) if isinstance(instr.shape, TupleShape) or len(values) != 1 else values[0]


def _reduce(ctx: EvalContext, instr: Instruction, contributions: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Reduce the contributions (one list of operands per participant, in group order) with ``to_apply``."""
    name = instr.attr("to_apply")
    acc = list(contributions[0])
    for other in contributions[1:]:
        acc = [np.asarray(ctx.vectorized_call(name, [a, b])) for a, b in zip(acc, other)]
    return acc


# ---------------------------------------------------------------------------------------------
# Collectives
# ---------------------------------------------------------------------------------------------
def all_reduce(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> list[np.ndarray]:
    group, _ = _my_group(ctx, instr)
    everyone = exchange(ctx, instr, tuple(_operands(args)))
    return _reduce(ctx, instr, [list(everyone[d]) for d in group])


@register("all-reduce")
def _all_reduce(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return _result(instr, all_reduce(ctx, instr, args))


@register("all-reduce-start")
def _all_reduce_start(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    values = all_reduce(ctx, instr, args)
    return package_start(instr, args, values[0] if len(values) == 1 else tuple(values))


def all_gather(ctx: EvalContext, instr: Instruction, args: Sequence[Value]) -> list[np.ndarray]:
    group, _ = _my_group(ctx, instr)
    (axis,) = instr.attr("dimensions", (0,))
    everyone = exchange(ctx, instr, tuple(_operands(args)))
    n = len(everyone[group[0]])
    return [np.concatenate([everyone[d][k] for d in group], axis=axis) for k in range(n)]


@register("all-gather")
def _all_gather(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return _result(instr, all_gather(ctx, instr, args))


@register("all-gather-start")
def _all_gather_start(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    values = all_gather(ctx, instr, args)
    return package_start(instr, args, values[0] if len(values) == 1 else tuple(values))


@register("reduce-scatter")
def _reduce_scatter(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    group, rank = _my_group(ctx, instr)
    (axis,) = instr.attr("dimensions", (0,))
    everyone = exchange(ctx, instr, tuple(_operands(args)))
    reduced = _reduce(ctx, instr, [list(everyone[d]) for d in group])
    out = []
    for r in reduced:
        if r.shape[axis] % len(group):
            raise EvaluationError(instr, f"dimension {axis} of size {r.shape[axis]} does not split into {len(group)}")
        out.append(np.split(r, len(group), axis=axis)[rank].copy())
    return _result(instr, out)


@register("all-to-all")
def _all_to_all(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    group, rank = _my_group(ctx, instr)
    ops = _operands(args)
    everyone = exchange(ctx, instr, tuple(ops))
    dims = instr.attr("dimensions")
    k = len(group)
    if dims:  # array form: split dimension d into k chunks, chunk j goes to participant j, concatenated on d
        (axis,) = dims
        if ops[0].shape[axis] % k:
            raise EvaluationError(instr, f"dimension {axis} of size {ops[0].shape[axis]} does not split into {k}")
        chunks = [np.split(everyone[d][0], k, axis=axis)[rank] for d in group]
        return np.concatenate(chunks, axis=axis)
    if len(ops) != k:  # tuple form: operand j goes to participant j; result i comes from participant i
        raise EvaluationError(instr, f"the tuple form needs one operand per participant ({k}), got {len(ops)}")
    return tuple(everyone[d][rank].copy() for d in group)


@register("ragged-all-to-all")
def _ragged_all_to_all(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    """Operands (input, output, input_offsets, send_sizes, output_offsets, recv_sizes): update ``i`` of each
    sender goes to participant ``i // (updates / group size)``, rows ``input[input_offsets[i]:][:send_sizes[i]]``
    written at ``output_offsets[i]`` of that participant's ``output`` (jax.lax.ragged_all_to_all; XLA's
    ragged-all-to-all). Rows nobody writes keep the receiver's ``output``."""
    group, rank = _my_group(ctx, instr)
    data, output, in_off, sizes, out_off = (np.asarray(a) for a in args[:5])
    everyone = exchange(ctx, instr, (data, in_off, sizes, out_off))
    out = output.copy()
    for sender in group:
        s_data, s_in, s_sizes, s_out = everyone[sender]
        per_peer = len(s_sizes) // len(group)
        if per_peer * len(group) != len(s_sizes):
            raise EvaluationError(instr, f"{len(s_sizes)} updates do not split over {len(group)} participants")
        for i in range(rank * per_peer, (rank + 1) * per_peer):
            n, src, dst = int(s_sizes[i]), int(s_in[i]), int(s_out[i])
            if n < 0 or src < 0 or dst < 0 or src + n > s_data.shape[0] or dst + n > out.shape[0]:
                raise EvaluationError(
                    instr, f"update {i} of device {sender} ({n} rows from {src} to {dst}) is out of bounds"
                )
            out[dst : dst + n] = s_data[src : src + n]
    return out


def _permute_pairs(instr: Instruction) -> tuple[tuple[int, int], ...]:
    pairs = instr.attr("source_target_pairs", ())
    return tuple((int(a), int(b)) for a, b in pairs)


def collective_permute(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    ops = _operands(args)
    if len(args) == 4 and instr.opcode.startswith("collective-permute") and not isinstance(instr.shape, TupleShape):
        raise EvaluationError(instr, "the in-place collective-permute (4 operands with start indices) is not supported")
    everyone = exchange(ctx, instr, tuple(ops))
    cross_partition = instruction_mode(instr) == CROSS_PARTITION
    me = ctx.partition_id if cross_partition else ctx.replica_id
    sources = [s for s, t in _permute_pairs(instr) if t == me]
    if len(sources) > 1:
        raise CollectiveError(instr, f"id {me} is the target of several pairs (sources {sources})")
    if not sources:
        values = [np.zeros_like(o) for o in ops]  # no pair targets this device: zeros
    else:
        s = sources[0]
        limit = ctx.num_partitions if cross_partition else ctx.num_replicas
        if not 0 <= s < limit:
            raise CollectiveError(instr, f"source id {s} is out of range (the run has {limit})")
        src = ctx.replica_id * ctx.num_partitions + s if cross_partition else s * ctx.num_partitions + ctx.partition_id
        values = [v.copy() for v in everyone[src]]
    return values[0] if len(values) == 1 else tuple(values)


@register("collective-permute")
def _collective_permute(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return collective_permute(ctx, instr, args)


@register("collective-permute-start")
def _collective_permute_start(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return package_start(instr, args, collective_permute(ctx, instr, args))


@register("collective-broadcast")
def _collective_broadcast(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    group, _ = _my_group(ctx, instr)
    everyone = exchange(ctx, instr, tuple(_operands(args)))
    root = [v.copy() for v in everyone[group[0]]]  # the first id of each group broadcasts
    return _result(instr, root)


@register("all-reduce-done", "all-gather-done", "collective-permute-done")
def _collective_done(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    started = args[0]
    if check_value(started, instr.shape) is None:
        return started
    if not isinstance(started, tuple) or len(started) < 2:
        raise EvaluationError(instr, f"operand is not the value of a {instr.opcode.replace('-done', '-start')}")
    return started[1]


@register("replica-id")
def _replica_id(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return np.array(ctx.replica_id, dtype=np.uint32)


@register("partition-id")
def _partition_id(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return np.array(ctx.partition_id, dtype=np.uint32)


# ---------------------------------------------------------------------------------------------
# Host transfers
# ---------------------------------------------------------------------------------------------
def _data_shape(instr: Instruction) -> TupleShape:
    shape = instr.shape
    if not isinstance(shape, TupleShape) or not shape.elements:
        raise EvaluationError(instr, f"expected a (data, ..., token) tuple shape, got {shape}")
    return shape


@register("infeed")
def _infeed(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    data_shape = _data_shape(instr).elements[0]
    if not ctx.host.infeed:
        raise EvaluationError(instr, f"the infeed queue of device {ctx.device_id} is empty (expected {data_shape})")
    value = ctx.host.infeed.popleft()
    why = check_value(value, data_shape)
    if why is not None:
        raise EvaluationError(instr, f"infeed value does not match {data_shape}: {why}")
    return (value, TOKEN)


@register("outfeed")
def _outfeed(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    ctx.host.outfeed.append(args[0])
    return TOKEN


def _channel(instr: Instruction) -> int:
    channel = instr.attr("channel_id")
    if channel is None:
        raise EvaluationError(instr, "send/recv needs a channel_id")
    if not instr.attr("is_host_transfer"):
        raise EvaluationError(
            instr,
            "device-to-device send/recv is not supported by the reference interpreter (only is_host_transfer=true;"
            " collective-permute expresses device-to-device transfers)",
        )
    return int(channel)


@register("send")
def _send(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    channel = _channel(instr)
    ctx.host.sent.setdefault(channel, []).append(args[0])
    return (args[0], np.zeros((), np.uint32), TOKEN)


@register("send-done")
def _send_done(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    return TOKEN


@register("recv")
def _recv(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    channel = _channel(instr)
    data_shape = _data_shape(instr).elements[0]
    queue = ctx.host.recv.get(channel)
    if not queue:
        raise EvaluationError(instr, f"no host data left for recv on channel {channel} (expected {data_shape})")
    value = queue.popleft()
    why = check_value(value, data_shape)
    if why is not None:
        raise EvaluationError(instr, f"host data for channel {channel} does not match {data_shape}: {why}")
    return (value, np.zeros((), np.uint32), TOKEN)


@register("recv-done")
def _recv_done(ctx: EvalContext, instr: Instruction, args: Sequence[Any]) -> Value:
    started = args[0]
    if not isinstance(started, tuple) or len(started) < 3:
        raise EvaluationError(instr, "operand is not the value of a recv")
    return (started[0], TOKEN)
