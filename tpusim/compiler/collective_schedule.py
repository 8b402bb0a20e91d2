"""Async collectives and their schedule, as XLA:TPU makes them for a module that has none.

JAX's partitioned modules carry plain ``all-reduce`` and ``all-gather`` instructions, each placed where its
result is first needed. XLA's TPU pipeline turns them into ``-start`` / ``-done`` pairs and its latency-hiding
scheduler moves each start as early and each done as late as the data allow, so that the compute that does
not depend on a collective runs while its data moves; by default it keeps at most one collective in flight
(``SchedulerConfig::parallel_collective_overlap_limit = 1`` and one per kind, in XLA's
``xla/service/latency_hiding_scheduler.h``). :func:`schedule_collectives` does the same in the entry
computation (the code that runs once: there the DMA sequencer forwards a pair's ring steps, see
``lowering/collectives.py``), without a cost model:

* every ``all-reduce`` and ``all-gather`` of one array becomes a start named ``<name>.start`` and a done that
  keeps the collective's name, so its users are unchanged;
* the instructions are then listed again in dependence order (operands and ``control-predecessors``, and
  each pair after the previous pair's done: one in flight), taking at each step: a start whose operands
  are ready; else a done that is due, because a user of it comes next in the original order or the next
  collective's operands are ready (it then starts as soon as it may); else the instructions in their
  original order; else a done.

A data-parallel step's gradient all-reduces then each overlap the backward compute of the layers before
them. Modules that already hold async collectives (XLA:TPU's own, or hand-scheduled) keep their order.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from itertools import pairwise

from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo.ir import Computation, Instruction, Module
from tpusim.compiler.hlo.opcodes import ASYNC_COLLECTIVE_STARTS
from tpusim.compiler.rewrite import unique_name
from tpusim.memory import Shape, TupleShape

__all__ = ["schedule_collectives"]

_ASYNC = {"all-reduce": "all-reduce", "all-gather": "all-gather"}
"""The collectives that become pairs (their start and done opcodes are ``<op>-start`` and ``<op>-done``)."""


def schedule_collectives(module: Module) -> Module:
    """``module`` with the entry computation's all-reduces and all-gathers as async pairs, scheduled around
    the compute that does not depend on them (see the module docstring); unchanged when it runs on one
    device or already has async collectives."""
    if module.replica_count * module.num_partitions == 1 or _has_async(module):
        return module
    entry = module.entry_computation
    pairs = _pairs(entry)
    if not pairs:
        return module
    body = _schedule(entry, pairs)
    comps = tuple(replace(c, instructions=body) if c.name == entry.name else c for c in module.computations)
    return replace(module, computations=comps)


def _has_async(module: Module) -> bool:
    return any(
        i.opcode in ASYNC_COLLECTIVE_STARTS or i.opcode == "async-start"
        for c in module.computations
        for i in c.instructions
    )


def _pairs(comp: Computation) -> dict[str, tuple[Instruction, Instruction]]:
    """Collective name -> (start, done) for the collectives of ``comp`` that become pairs."""
    taken = {i.name for i in comp.instructions}
    out: dict[str, tuple[Instruction, Instruction]] = {}
    for instr in comp.instructions:
        op = _ASYNC.get(instr.opcode)
        if op is None or len(instr.operands) != 1 or not isinstance(instr.shape, Shape):
            continue
        operand = comp[instr.operands[0]].shape
        if not isinstance(operand, Shape):
            continue
        name = unique_name(f"{instr.name}.start", taken)
        shape = instr.shape if op == "all-reduce" else TupleShape((operand, instr.shape))
        start = replace(instr, name=name, opcode=f"{op}-start", shape=shape)
        done = Instruction(instr.name, f"{op}-done", instr.shape, (name,), loc=instr.loc)
        out[instr.name] = (start, done)
    return out


def _schedule(comp: Computation, pairs: dict[str, tuple[Instruction, Instruction]]) -> tuple[Instruction, ...]:
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
            nodes.extend(pair)
            kind.extend(("start", "done"))
            rank.extend((k, k))
    index = {n.name: i for i, n in enumerate(nodes)}
    deps: list[set[int]] = []
    for n in nodes:
        named = list(n.operands)
        preds = n.attr("control-predecessors", ())
        named += list(preds) if isinstance(preds, tuple) else []
        deps.append({index[o] for o in named if o in index})
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
