"""Async collectives and their schedule, as XLA:TPU makes them for a module that has none.

JAX's partitioned modules carry plain ``all-reduce`` and ``all-gather`` instructions, each placed where its
result is first needed. XLA's TPU pipeline turns them into ``-start`` / ``-done`` pairs and its latency-hiding
scheduler moves each start as early and each done as late as the data allow, so that the compute that does
not depend on a collective runs while its data moves; by default it keeps at most one collective in flight
(``SchedulerConfig::parallel_collective_overlap_limit = 1`` and one per kind, in XLA's
``xla/service/latency_hiding_scheduler.h``). :func:`schedule_collectives` does the same in the entry
computation and in each loop body, branch and called computation, without a cost model (the lowering runs
each pair on the core's async sequencer, see ``lowering/collectives.py``; a pair's start and done stay in
one computation, as XLA's scheduler keeps them; XLA's collective pipeliner, which carries a start into the
previous iteration, is not modelled):

* every ``all-reduce`` (of one array or several: XLA's combined ones), ``all-gather``, ``reduce-scatter``
  and ``all-to-all`` of one array becomes a start that keeps the collective's name (its time and its errors
  are reported under it) and a done named ``<name>.done``, which its users then read;
* the instructions are then listed again in dependence order (operands and ``control-predecessors``, and
  each pair after the previous pair's done: one in flight), taking at each step: a start whose operands
  are ready; else a done that is due, because a user of it comes next in the original order or the next
  collective's operands are ready (it then starts as soon as it may); else the instructions in their
  original order; else a done;
* a pair with nothing between its start and its done is the plain collective again, as XLA's
  ConvertAsyncCollectivesToSync makes it.

A data-parallel step's gradient all-reduces then each overlap the backward compute of the layers before
them. Modules that already hold async collectives (XLA:TPU's own, or hand-scheduled) keep their order.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from itertools import pairwise

from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo.ir import Computation, Instruction, Module
from tpusim.compiler.hlo.opcodes import ASYNC_COLLECTIVE_STARTS
from tpusim.compiler.rewrite import unique_name
from tpusim.memory import Shape, TupleShape

__all__ = ["schedule_collectives"]

_ASYNC = frozenset({"all-reduce", "all-gather", "reduce-scatter", "all-to-all"})
"""The collectives that become pairs: ``<op>-start`` and ``<op>-done``, for a reduce-scatter and an
all-to-all XLA's ``async-start`` / ``async-done`` wrapping it."""

_WRAPPED = frozenset({"reduce-scatter", "all-to-all"})
"""The collectives whose pair is XLA's async wrapper, in its short form (``reduce-scatter-start``)."""


@dataclass(frozen=True, slots=True)
class _Pair:
    plain: Instruction  # the collective as the module has it
    start: Instruction  # (its name)
    done: Instruction  # NAME.done


def schedule_collectives(module: Module) -> Module:
    """``module`` with its all-reduces, all-gathers, reduce-scatters and all-to-alls as async pairs, scheduled
    around the compute that does not depend on them (see the module docstring); unchanged when it runs on one device or
    already has async collectives, or when no pair overlaps anything."""
    if module.replica_count * module.num_partitions == 1 or _has_async(module):
        return module
    comps = tuple(_scheduled(c) for c in module.computations)
    if all(new is old for new, old in zip(comps, module.computations)):
        return module
    return replace(module, computations=comps)


def _scheduled(comp: Computation) -> Computation:
    """``comp`` with its collectives as pairs where they overlap something (itself when none does).

    Every computation that holds collectives is scheduled on its own: the entry, and loop bodies,
    conditional branches and called computations, whose pairs then overlap the rest of each iteration (a
    scanned backward pass: a layer's weight-gradient all-reduce under its input-gradient product)."""
    pairs = _pairs(comp)
    if not pairs:
        return comp
    order = _synchronous_again(_schedule(comp, pairs), pairs)
    done = {name: p.done.name for name, p in pairs.items() if any(i is p.done for i in order)}
    if not done:
        return comp
    body = tuple(i if i.opcode.endswith("-done") else _reading(i, done) for i in order)
    return replace(comp, instructions=body, root=done.get(comp.root, comp.root))


def _has_async(module: Module) -> bool:
    return any(
        i.opcode in ASYNC_COLLECTIVE_STARTS or i.opcode == "async-start"
        for c in module.computations
        for i in c.instructions
    )


def _pairs(comp: Computation) -> dict[str, _Pair]:
    """Collective name -> its pair, for the collectives of ``comp`` that become pairs."""
    taken = {i.name for i in comp.instructions}
    out: dict[str, _Pair] = {}
    for instr in comp.instructions:
        op = instr.opcode
        if op not in _ASYNC or not instr.operands:
            continue
        operands = [comp[o].shape for o in instr.operands]
        if not all(isinstance(s, Shape) for s in operands):
            continue
        if op != "all-reduce" and (len(operands) != 1 or not isinstance(instr.shape, Shape)):
            continue  # (a variadic all-gather, reduce-scatter or all-to-all stays plain)
        if op == "all-to-all" and not instr.attr("dimensions"):
            continue  # (the tuple form stays plain)
        done_name = unique_name(f"{instr.name}.done", taken)
        if op in _WRAPPED:  # XLA's async wrapper, in its short form (reduce-scatter-start)
            shape: Shape | TupleShape = TupleShape((TupleShape((operands[0],)), instr.shape))
            wrapped = instr.attributes.replace(async_wrapped_opcode=op)
            start = replace(instr, opcode="async-start", shape=shape, attributes=wrapped)
            done = Instruction(done_name, "async-done", instr.shape, (instr.name,))
            done = replace(done, attributes=done.attributes.replace(async_wrapped_opcode=op))
        else:
            shape = instr.shape if op == "all-reduce" else TupleShape((operands[0], instr.shape))
            start = replace(instr, opcode=f"{op}-start", shape=shape)
            done = Instruction(done_name, f"{op}-done", instr.shape, (instr.name,))
        out[instr.name] = _Pair(instr, start, replace(done, loc=instr.loc))
    return out


def _reading(instr: Instruction, done: dict[str, str]) -> Instruction:
    """``instr`` reading each collective that became a pair from its done (operands, control predecessors)."""
    operands = tuple(done.get(o, o) for o in instr.operands)
    preds = instr.attr("control-predecessors", ())
    renamed = tuple(done.get(p, p) for p in preds) if isinstance(preds, tuple) else preds
    if operands == instr.operands and renamed == preds:
        return instr
    attributes = instr.attributes.replace(**{"control-predecessors": renamed}) if renamed != preds else None
    return replace(instr, operands=operands, attributes=attributes or instr.attributes)


def _synchronous_again(order: tuple[Instruction, ...], pairs: dict[str, _Pair]) -> tuple[Instruction, ...]:
    """A pair with nothing between its start and its done is the plain collective again (XLA's
    ConvertAsyncCollectivesToSync): it would overlap nothing."""
    of_done = {p.done.name: p for p in pairs.values()}
    out: list[Instruction] = []
    for instr in order:
        pair = of_done.get(instr.name)
        if pair is not None and out and out[-1] is pair.start:
            out[-1] = pair.plain
        else:
            out.append(instr)
    return tuple(out)


def _schedule(comp: Computation, pairs: dict[str, _Pair]) -> tuple[Instruction, ...]:
    """The instructions of ``comp`` with each collective of ``pairs`` as its start and done, in the order of
    the module docstring."""
    nodes: list[Instruction] = []
    kind: list[str] = []  # "start", "done" or "op"
    rank: list[int] = []  # position in the original order
    for k, instr in enumerate(comp.instructions):
        pair = pairs.get(instr.name)
        if pair is None:
            nodes.append(instr)
            kind.append("op")
            rank.append(k)
        else:
            nodes.extend((pair.start, pair.done))
            kind.extend(("start", "done"))
            rank.extend((k, k))
    index = {n.name: i for i, n in enumerate(nodes)}
    value = {name: index[p.done.name] for name, p in pairs.items()}  # a pair's result: its done
    deps: list[set[int]] = []
    for i, n in enumerate(nodes):
        named = list(n.operands)
        preds = n.attr("control-predecessors", ())
        named += list(preds) if isinstance(preds, tuple) else []
        reads = value if kind[i] != "done" else {}  # (a done reads its start)
        deps.append({reads.get(o, index.get(o, -1)) for o in named} - {-1})
    starts = [i for i, k in enumerate(kind) if k == "start"]
    for previous, start in pairwise(starts):  # one pair in flight: a start after the previous done
        deps[start].add(previous + 1)
    chained = {previous + 1: start for previous, start in pairwise(starts)}  # done -> next start
    users: list[list[int]] = [[] for _ in nodes]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    missing = [len(ds) for ds in deps]
    ready: dict[str, list[tuple[int, int]]] = {"start": [], "op": [], "done": []}
    for i, m in enumerate(missing):
        if m == 0:
            heapq.heappush(ready[kind[i]], (rank[i], i))
    order: list[Instruction] = []

    def due(d: int) -> bool:
        """Done ``d`` is due: a user of it would come next but for it, or the next pair could start."""
        nxt = chained.get(d)
        if nxt is not None and missing[nxt] == 1:
            return True
        first = ready["op"][0][0] if ready["op"] else None
        waiting = {j for _, j in ready["done"]}
        return any((first is None or rank[u] < first) and missing[u] == len(deps[u] & waiting) for u in users[d])

    while len(order) < len(nodes):
        if ready["start"]:
            _, i = heapq.heappop(ready["start"])
        else:
            i = next((j for _, j in sorted(ready["done"]) if due(j)), -1)
            if i >= 0:
                ready["done"].remove((rank[i], i))
                heapq.heapify(ready["done"])
            elif ready["op"]:
                _, i = heapq.heappop(ready["op"])
            elif ready["done"]:
                _, i = heapq.heappop(ready["done"])
            else:
                raise CompileError(f"computation {comp.name}: its instructions depend on each other in a cycle")
        order.append(nodes[i])
        for u in users[i]:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready[kind[u]], (rank[u], u))
    return tuple(order)
