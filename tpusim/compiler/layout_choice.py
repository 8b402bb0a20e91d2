"""Choosing dimension orders for a module that has none yet (JAX's lowering), as XLA:TPU's layout assignment does.

JAX hands the compiler a module whose layouts are placeholders (the default order everywhere, no tiles) and,
under ``jax.jit``'s default layout mode, lets the compiler pick the layouts of the parameters and results too.
The order a value is stored in decides what tiles cost: ``bf16[4,256,8,64]`` row-major puts the 64-wide head
dimension in the 128 lanes (half of every vector register and DMA is padding) and pairs heads in packed
words, so slicing one head is a DMA of single elements; stored ``{1,3,2,0}`` (physical ``[4,8,64,256]``, the
sequence in lanes) it has no padding, and a head projection can write it directly. XLA:TPU chooses the
latter; :func:`choose_orders` finds such orders by cost:

- **Candidates.** Per array value, the default order and every order that moves two dimensions to the two
  minor (tiled) positions, the others keeping their default order (XLA's choices on the corpus all have
  this form).
Costs are in cycles of the chip:

- **Storage cost.** Bytes the tiled layout occupies (padding included) over HBM bandwidth, times the times the
  value is written and read (forwarding it, in a tuple or a loop's state, moves no byte), plus a tie-break
  towards the default order. A dynamic slice reads, and an update in place writes, only its window: it
  costs the window's bytes or its runs of contiguous elements under the order, whichever is more (a window
  one wide in the lane dimension is one run per element).
- **Loops.** Every cost of a loop body (storage, edges, products, windows) counts once per iteration: a
  ``while`` whose condition compares a counter below a constant (``lax.scan``, ``fori_loop``) runs its body
  that many times, its caller's weight times. A scan's ``f32[128,16,32]`` input stored compactly (the 128
  steps in the lanes) cost a 512-run slice and a relayout per step; weighed per iteration, its steps stay
  major and each step's slice is whole rows (an RNN scan: 133 -> 74 us on v5e).
- **Edge cost.** Where an instruction needs its operand in another order than the one chosen, moving the
  operand's bytes twice (a relayout): elementwise operations want their operands in the result's order, a transpose the
  permuted order, a reshape an order that makes it a bitcast (its groups of merged dimensions contiguous and
  its tiled dimensions unchanged), a reduce its kept dimensions in the result's order, a fusion what its
  fused computation needs of each parameter, a matrix product its operands streaming (K in lanes for the
  left, K or N for the right) and its result's lanes one operand's free dimension (the MXU lowering
  exchanges the operands, :func:`tpusim.compiler.dot_dims.oriented`); a product also costs the MXU
  cycles of the blocks its orders give (a weight tile of R x C streams at least R rows, so an 8-row M wastes
  most of each pass).
- **Search.** Every value starts at its cheapest storage; then each value in turn takes the order of least
  total cost given its neighbours', each product's operands and result take the best orders together, and
  so do the two ends of each edge, until nothing changes (iterated conditional modes with joint moves, a
  few sweeps).

Entry parameters and results the text leaves to the compiler keep their default order unless another order
wastes fewer bytes to padding (then they take the best of those): the program cannot rearrange its inputs
for free, as XLA:TPU's device layouts show (:func:`compact_orders`). Where such a parameter's order serves
its users badly, layout assignment gives them a copy of it (``tpusim.compiler.layout_assignment``), whose
order this search chooses freely, the relayout charged as an edge.

Values that are one buffer (a tuple's elements, loop state, a called computation's parameters and its
caller's operands) are one variable. Values inside fused computations follow their fusion's result: each
takes the order its user needs, so the fused transposes and reshapes are free views.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, partial
from itertools import permutations, product
from math import ceil
from math import prod as _prod
from typing import Any

from tpusim.compiler.dot_dims import DotDims, dot_dims, oriented_by_order
from tpusim.compiler.hlo.ir import Computation, Instruction, Module
from tpusim.compiler.hlo.opcodes import ELEMENTWISE
from tpusim.compiler.tiling_rules import TilingRules
from tpusim.config import ChipConfig
from tpusim.memory import Layout, Shape

__all__ = ["choose_orders", "compact_orders"]

Order = tuple[int, ...]
"""Physical order: dimension numbers from the most major to the most minor (``reversed(minor_to_major)``)."""

Key = tuple[str, str]  # (computation, instruction)

_ELEMENTWISE_LIKE = ELEMENTWISE | {"bitcast-convert", "reduce-precision", "map"}
_SAME_ORDER = frozenset({"slice", "pad", "reverse", "concatenate", "dynamic-slice", "dynamic-update-slice"})
_FORWARDERS = frozenset({"tuple", "get-tuple-element", "while", "call", "conditional", "opt-barrier"})
_SWEEPS = 8
_WINDOWED = frozenset({"dynamic-slice", "dynamic-update-slice"})
"""Readers of their first operand's window only (a slice, or an update in place)."""


def choose_orders(
    module: Module, rules: TilingRules, config: ChipConfig, free_entry: Callable[[Instruction], bool]
) -> dict[Key, Order]:
    """The physical order chosen for every array value of ``module`` (sequential and fused computations) on the
    chip ``config``; ``free_entry(parameter)`` says which entry parameters (and, for the root, whether the
    result) the compiler may lay out as it likes, the others keeping the text's order."""
    problem = _Problem(module, rules, config, free_entry)
    problem.build()
    problem.solve()
    return problem.result()


def compact_orders(shape: Shape, rules: TilingRules) -> list[Order]:
    """The orders a parameter or result may take: its default order when that wastes no more bytes to padding
    than any other, else the orders that waste least (XLA:TPU's device layout for ``jax.jit``'s default layout
    mode: a ``bf16[512,8,64]`` weight is stored ``{0,2,1}``, a ``bf16[2048,2048]`` one row-major even where a
    transpose follows)."""
    sizes = {
        o: shape.with_layout(rules.layout_for(shape, tuple(reversed(o)))).byte_size for o in candidates(shape.rank)
    }
    least = min(sizes.values())
    default = _default(shape.rank)
    if sizes[default] == least:
        return [default]
    return [o for o in sizes if sizes[o] == least]


def _default(rank: int) -> Order:
    return tuple(range(rank))


def candidates(rank: int) -> list[Order]:
    """The default order and every order with two chosen dimensions most minor (others in default order)."""
    out = [_default(rank)]
    if rank < 2:
        return out
    for a, b in permutations(range(rank), 2):
        order = (*(d for d in range(rank) if d not in (a, b)), a, b)
        if order not in out:
            out.append(order)
    return out


@dataclass
class _Var:
    shape: Shape
    keys: list[Key]
    options: list[Order]
    storage: dict[Order, float] = field(default_factory=dict)
    order: Order = ()
    fixed: bool = False
    accesses: int = 1


@dataclass
class _Edge:
    """``operand`` of ``instr`` (in ``comp``): the cost of the pair (result order, operand order)."""

    comp: Computation
    instr: Instruction
    result: int  # variable index
    operand: int
    index: int  # operand number
    cost: Callable[[Order, Order], float]


class _Problem:
    def __init__(
        self, module: Module, rules: TilingRules, config: ChipConfig, free_entry: Callable[[Instruction], bool]
    ) -> None:
        self.module = module
        self.rules = rules
        self.config = config
        self.rate = config.hbm_bytes_per_cycle
        # what a kernel pays beyond its bytes: a DMA in and one out, each set up and waiting for HBM
        self.kernel_cycles = 2 * (config.dma.setup_cycles + config.cycles(config.hbm.latency_ns))
        self.free_entry = free_entry
        self.var_of: dict[tuple[str, str, tuple[int, ...]], int] = {}
        self.vars: list[_Var] = []
        self.edges: list[_Edge] = []
        self.fusions: list[tuple[Computation, Instruction, int]] = []
        self.dots: list[tuple[int, int | None, int | None, DotDims, Shape, Shape, Shape]] = []
        self._dot_cache: dict[Any, float] = {}  # (dot, orders) and (roles, sized operands) -> MXU cycles
        self._sized_cache: dict[tuple[Shape, Order], tuple[Shape, Order]] = {}
        self.touching: dict[int, list[_Edge]] = {}
        self.dots_at: dict[int, list[int]] = {}
        self.weight: dict[str, int] = {}  # computation -> how many times it runs per run of the entry
        self.windows: list[tuple[int, tuple[int, ...], int]] = []  # (variable, window, weight) of dynamic slices
        self.dot_weights: list[int] = []  # per product: how many times it runs (its computation's weight)

    # ------------------------------------------------------------------ variables
    def _leaf(self, comp: str, name: str, path: tuple[int, ...] = ()) -> int | None:
        return self.var_of.get((comp, name, path))

    def _union(self, a: tuple[str, str, tuple[int, ...]], b: tuple[str, str, tuple[int, ...]]) -> None:
        va, vb = self.var_of.get(a), self.var_of.get(b)
        if va is None or vb is None or va == vb:
            return
        keep, gone = self.vars[va], self.vars[vb]
        if keep.shape.dimensions != gone.shape.dimensions:
            return
        keep.keys += gone.keys
        keep.fixed |= gone.fixed
        keep.accesses += gone.accesses
        for k, v in list(self.var_of.items()):
            if v == vb:
                self.var_of[k] = va

    def build(self) -> None:
        sequential = _sequential(self.module)
        self.weight = _weights(self.module, sequential)
        for name in sequential:
            comp = self.module[name]
            for instr in comp.instructions:
                for path, leaf in _leaves(instr.shape):
                    if leaf.rank == 0 or leaf.element_type.kind == "token":
                        continue
                    self.var_of[(name, instr.name, path)] = len(self.vars)
                    self.vars.append(_Var(leaf, [(name, instr.name)], candidates(leaf.rank)))
        entry = self.module.entry_computation
        boundary = {self._leaf(entry.name, p.name, path) for p in entry.parameters for path, _ in _leaves(p.shape)}
        boundary |= {self._leaf(entry.name, entry.root, path) for path, _ in _leaves(entry.root_instruction.shape)}
        for p in entry.parameters:
            if not self.free_entry(p):
                for path, _ in _leaves(p.shape):
                    v = self._leaf(entry.name, p.name, path)
                    if v is not None:
                        self.vars[v].fixed = True
                        self.vars[v].order = _physical(_leaf_shape(p.shape, path))
        if not self.free_entry(entry.root_instruction):
            for path, _ in _leaves(entry.root_instruction.shape):
                v = self._leaf(entry.name, entry.root, path)
                if v is not None:
                    self.vars[v].fixed = True
                    self.vars[v].order = _physical(_leaf_shape(entry.root_instruction.shape, path))
        for name in sequential:
            self._links(self.module[name])
        for name in sequential:
            comp = self.module[name]
            for instr in comp.instructions:
                self._instruction_edges(comp, instr)
        live = sorted(set(self.var_of.values()))
        for v in live:
            var = self.vars[v]
            if v in boundary and not var.fixed:
                var.options = compact_orders(var.shape, self.rules)
            var.storage = {o: self._storage(var, o) for o in var.options}
        for v, window, weight in self.windows:
            var = self.vars[v]
            for o in var.options:
                var.storage[o] += weight * self._window_cost(var.shape, o, window)
        for v in live:
            var = self.vars[v]
            if not var.fixed:
                var.order = min(var.options, key=lambda o: var.storage[o])

    def _links(self, comp: Computation) -> None:
        """Values that are one buffer become one variable (tuple forwarding, loop state, calls)."""
        c = comp.name
        for instr in comp.instructions:
            op = instr.opcode
            if op == "get-tuple-element":
                for path, _ in _leaves(instr.shape):
                    self._union((c, instr.operands[0], (instr.attr("index"), *path)), (c, instr.name, path))
            elif op in ("tuple", "opt-barrier"):
                for i, o in enumerate(instr.operands):
                    for path, _ in _leaves(comp[o].shape):
                        target = (i, *path) if op == "tuple" else path
                        self._union((c, o, path), (c, instr.name, target))
            elif op == "while":
                body, cond = self.module[instr.attr("body")], self.module[instr.attr("condition")]
                for path, _ in _leaves(instr.shape):
                    self._union((c, instr.name, path), (c, instr.operands[0], path))
                    self._union((c, instr.name, path), (body.name, body.parameters[0].name, path))
                    self._union((c, instr.name, path), (cond.name, cond.parameters[0].name, path))
                    self._union((c, instr.name, path), (body.name, body.root, path))
            elif op in ("call", "conditional"):
                callees = instr.called_computations()
                for n, callee in enumerate(callees):
                    sub = self.module[callee]
                    passed = instr.operands[n + 1 : n + 2] if op == "conditional" else instr.operands
                    for p, o in zip(sub.parameters, passed):
                        for path, _ in _leaves(p.shape):
                            self._union((c, o, path), (callee, p.name, path))
                    for path, _ in _leaves(instr.shape):
                        self._union((c, instr.name, path), (callee, sub.root, path))
        weight = self.weight.get(c, 1)
        for instr in comp.instructions:
            v = self._leaf(c, instr.name)
            if v is not None:  # (forwarders move no bytes; a dynamic slice reads and an update in place writes
                # a window: costed apart)
                self.vars[v].accesses += weight * sum(
                    1
                    for other in comp.instructions
                    for k, o in enumerate(other.operands)
                    if o == instr.name
                    and other.opcode not in _FORWARDERS
                    and not (k == 0 and other.opcode in _WINDOWED)
                )

    def _padded(self, shape: Shape, order: Order) -> int:
        return shape.with_layout(self.rules.layout_for(shape, tuple(reversed(order)))).byte_size

    def _storage(self, var: _Var, order: Order) -> float:
        size = self._padded(var.shape, order)
        inversions = sum(1 for i in range(len(order)) for j in range(i + 1, len(order)) if order[i] > order[j])
        return size * var.accesses / self.rate + inversions * 1e-3

    def _window_cost(self, shape: Shape, order: Order, window: tuple[int, ...]) -> float:
        """Cycles a DMA of a ``window`` of ``shape`` stored in ``order`` takes at least: its bytes, or its runs
        of contiguous elements (at most a tile row along the lanes; one element each where the window is one
        wide in the lane dimension: a scan's input with the time axis in lanes, sliced one step at a time)."""
        run = min(window[order[-1]], self.config.vpu.lanes)
        elements = _prod(window)
        runs = ceil(elements / max(run, 1))
        return max(runs / self.config.dma.runs_per_cycle, elements * shape.element_type.bits / 8 / self.rate)

    # ------------------------------------------------------------------ edges
    def _instruction_edges(self, comp: Computation, instr: Instruction) -> None:
        op = instr.opcode
        r = self._leaf(comp.name, instr.name)
        if r is None or op in _FORWARDERS or op == "parameter":
            return
        shapes = [comp[o].shape for o in instr.operands]
        weight = self.weight.get(comp.name, 1)
        if op == "dynamic-update-slice" and isinstance(shapes[1], Shape):
            self.windows.append((r, shapes[1].dimensions, weight))
        elif op == "dynamic-slice" and (v := self._leaf(comp.name, instr.operands[0])) is not None:
            self.windows.append((v, instr.array_shape.dimensions, weight))
        if op == "fusion":
            self.fusions.append((comp, instr, r))
            fused = self.module[instr.attr("calls")]
            for i, o in enumerate(instr.operands):
                v, shape = self._leaf(comp.name, o), shapes[i]
                if v is not None and isinstance(shape, Shape):
                    cost = _fusion_cost(self.module, fused, i, 2 * shape.byte_size / self.rate, self.config.vpu.lanes)
                    self._edge(comp, instr, r, v, i, cost)
            return
        if op == "dot":
            lhs, rhs = shapes
            assert isinstance(lhs, Shape) and isinstance(rhs, Shape)
            dims = dot_dims(instr, lhs.rank, rhs.rank)
            a, b = self._leaf(comp.name, instr.operands[0]), self._leaf(comp.name, instr.operands[1])
            self.dots.append((r, a, b, dims, lhs, rhs, instr.array_shape))
            self.dot_weights.append(self.weight.get(comp.name, 1))
            return
        for i, o in enumerate(instr.operands):
            v = self._leaf(comp.name, o)
            shape = shapes[i]
            if v is None or not isinstance(shape, Shape):
                continue
            rule = _rule(instr, i, shape)
            if rule is not None:
                size = 2 * shape.byte_size / self.rate
                if op == "copy":  # a relayout copy is a kernel of its own: a round trip through HBM
                    size += self.kernel_cycles
                self._edge(comp, instr, r, v, i, _relayout_cost(rule, size))

    def _edge(self, comp: Computation, instr: Instruction, r: int, o: int, i: int, cost: Callable[..., float]) -> None:
        # (the search weighs each pair of orders many times; a cost is a function of the pair alone; an edge in a
        # loop body is paid every iteration)
        weight = self.weight.get(comp.name, 1)
        weighted = cost if weight == 1 else (lambda ro, oo: weight * cost(ro, oo))
        self.edges.append(_Edge(comp, instr, r, o, i, cache(weighted)))

    # ------------------------------------------------------------------ search
    def solve(self) -> None:
        live = sorted(set(self.var_of.values()))
        touching: dict[int, list[_Edge]] = {v: [] for v in live}
        for e in self.edges:
            touching[e.result].append(e)
            if e.operand != e.result:
                touching[e.operand].append(e)
        dots_at: dict[int, list[int]] = {v: [] for v in live}
        for n, (r, a, b, *_rest) in enumerate(self.dots):
            for v in {r, a, b} - {None}:
                dots_at[v].append(n)  # type: ignore[index]
        self.touching, self.dots_at = touching, dots_at
        for _ in range(_SWEEPS):
            changed = False
            for v in live:
                var = self.vars[v]
                if var.fixed or len(var.options) == 1:
                    continue
                best = min(var.options, key=partial(self._local, v))
                if best != var.order:
                    var.order = best
                    changed = True
            for r, a, b, *_ in self.dots:
                changed |= self._joint([v for v in (r, a, b) if v is not None])
            for e in self.edges:
                if e.result != e.operand:
                    changed |= self._joint([e.result, e.operand])
            if not changed:
                break

    def _order(self, v: int | None) -> Order | None:
        return None if v is None else self.vars[v].order

    def _local(self, v: int, order: Order, skip: int | None = None) -> float:
        """Variable ``v``'s storage and the cost of every edge and product it takes part in (but product
        ``skip``), were it stored in ``order``."""
        var = self.vars[v]
        saved, var.order = var.order, order
        total = var.storage[order]
        for e in self.touching[v]:
            ro, oo = self._order(e.result), self._order(e.operand)
            if ro and oo:
                total += e.cost(ro, oo)
        for n in self.dots_at[v]:
            if n != skip:
                total += self._dot_cost(n)
        var.order = saved
        return total

    def _joint(self, members: list[int]) -> bool:
        """Choose the orders of ``members`` together (each alone would stay where an edge or a product between
        them holds it: the best head projection needs the weight and the result to move at once, a head split
        its reshape's operand and result). True when an order changed."""
        members = [v for v in dict.fromkeys(members) if not self.vars[v].fixed and len(self.vars[v].options) > 1]
        if len(members) < 2:
            return False
        edges = list({id(e): e for v in members for e in self.touching[v]}.values())
        dots = sorted({n for v in members for n in self.dots_at[v]})

        def total() -> float:
            cost = sum(self.vars[v].storage[self.vars[v].order] for v in members)
            for e in edges:
                ro, oo = self._order(e.result), self._order(e.operand)
                if ro and oo:
                    cost += e.cost(ro, oo)
            return cost + sum(self._dot_cost(n) for n in dots)

        current = {v: self.vars[v].order for v in members}
        best, best_cost = current, total()
        for choice in product(*(self.vars[v].options for v in members)):
            for v, o in zip(members, choice):
                self.vars[v].order = o
            cost = total()
            if cost < best_cost - 1e-9:
                best, best_cost = dict(zip(members, choice)), cost
        for v in members:
            self.vars[v].order = best[v]
        return best != current

    def _dot_cost(self, n: int) -> float:
        r, a, b, dims, lhs, rhs, out = self.dots[n]
        ro = self._order(r) or _physical(out)
        ao = self._order(a) or _physical(lhs)
        bo = self._order(b) or _physical(rhs)
        key = (n, ao, bo, ro)
        cost = self._dot_cache.get(key)
        if cost is None:
            sized = tuple(self._sized(s, o) for s, o in ((lhs, ao), (rhs, bo), (out, ro)))
            same = (dims, sized)  # products of the same shapes in the same orders (the heads of a block) cost alike
            cost = self._dot_cache.get(same)
            if cost is None:
                cost = self._dot_cache[same] = dot_cost(dims, sized[0], sized[1], sized[2], self.config)
            self._dot_cache[key] = cost
        return cost * self.dot_weights[n]

    def _sized(self, shape: Shape, order: Order) -> tuple[Shape, Order]:
        key = (shape, order)
        sized = self._sized_cache.get(key)
        if sized is None:
            sized = self._sized_cache[key] = (
                shape.with_layout(self.rules.layout_for(shape, tuple(reversed(order)))),
                order,
            )
        return sized

    # ------------------------------------------------------------------ result
    def result(self) -> dict[Key, Order]:
        out: dict[Key, Order] = {}
        for (comp, name, path), v in self.var_of.items():
            if not path:
                out[(comp, name)] = self.vars[v].order
        for _, instr, r in self.fusions:
            fused = self.module[instr.attr("calls")]
            _fused_orders(self.module, fused, self.vars[r].order, out, self.config.vpu.lanes)
        return out


def _weights(module: Module, sequential: list[str]) -> dict[str, int]:
    """How many times each sequential computation runs per run of the entry: a loop body and condition its
    loop's trip count times their caller's (a ``while`` whose condition compares a counter below a constant,
    as ``lax.scan`` and ``fori_loop`` write it; once otherwise)."""
    weight = {module.entry: 1}
    for name in sequential:  # (callers first)
        here = weight.get(name, 1)
        for instr in module[name].instructions:
            if instr.opcode == "while":
                trips = _trip_count(module[instr.attr("condition")])
                for sub in (instr.attr("body"), instr.attr("condition")):
                    weight[sub] = max(weight.get(sub, 0), here * trips)
            elif instr.opcode in ("call", "conditional"):
                for sub in instr.called_computations():
                    weight[sub] = max(weight.get(sub, 0), here)
    return weight


def _trip_count(cond: Computation) -> int:
    """``N`` of a condition ``compare(counter, constant(N)), direction=LT`` (1 when it is not of that form)."""
    root = cond.root_instruction
    if root.opcode != "compare" or root.attr("direction", None) != "LT":
        return 1
    bound = cond[root.operands[1]]
    if bound.opcode != "constant" or bound.array_shape.rank:
        return 1
    try:
        return max(1, int(bound.attr("literal").value))
    except (TypeError, ValueError):
        return 1


# --------------------------------------------------------------------------------------------- rules
def _rule(instr: Instruction, i: int, operand: Shape) -> Callable[[Order, Order], bool] | None:
    """When operand ``i`` in order ``oo`` costs nothing for ``instr`` with result order ``ro``: a predicate of
    ``(ro, oo)``, or None when any order serves."""
    op = instr.opcode
    if operand.rank == 0:
        return None
    result = instr.array_shape
    required = operand_order(instr, i, operand, result)
    if op == "reduce":
        if i >= len(instr.operands) // 2:
            return None
        kept = [d for d in range(operand.rank) if d not in instr.attr("dimensions")]
        return lambda ro, oo: [kept.index(d) for d in oo if d in kept] == list(ro)
    if required is None:
        return None
    return lambda ro, oo: required(ro) == oo


def operand_order(instr: Instruction, i: int, operand: Shape, result: Shape) -> Callable[[Order], Order | None] | None:
    """The order of operand ``i`` that makes ``instr`` cost nothing beyond its work, as a function of the
    result's order (None: any order; the function returns None when no order does)."""
    op = instr.opcode
    if op == "broadcast":
        dims = tuple(instr.attr("dimensions", ()))
        return lambda ro: tuple(dims.index(d) for d in ro if d in dims)
    if op == "transpose":
        perm = tuple(instr.attr("dimensions"))
        return lambda ro: tuple(perm[d] for d in ro)
    if op in ("reshape", "bitcast"):
        return lambda ro: reshape_order(operand.dimensions, result.dimensions, ro)
    if op == "reduce":
        kept = [d for d in range(operand.rank) if d not in instr.attr("dimensions")]
        reduced = [d for d in range(operand.rank) if d not in kept]

        def through(ro: Order) -> Order:  # the kept dimensions in the result's order, reduced ones as by default
            mapped = iter(kept[d] for d in ro)
            return tuple(d if d in reduced else next(mapped) for d in range(operand.rank))

        return through
    if op in _ELEMENTWISE_LIKE or op in _SAME_ORDER:
        return (lambda ro: ro) if operand.rank == result.rank else None
    return None


def reshape_order(src: tuple[int, ...], dst: tuple[int, ...], dst_order: Order) -> Order | None:
    """The order of a reshape's operand (dimensions ``src``) that makes the reshape to ``dst`` stored in
    ``dst_order`` move no byte of the untiled arrays: each group of dimensions the reshape merges or splits is
    contiguous and row-major in both orders, and the groups come in the same sequence. Size-1 dimensions go
    most major. None when no order does."""
    groups = _groups(src, dst)
    if groups is None:
        return None
    owner = {d: g for g, (_, ds) in enumerate(groups) for d in ds}
    placed = [d for d in dst_order if dst[d] != 1]  # (size-1 dimensions may sit anywhere)
    position = {d: k for k, d in enumerate(placed)}
    for _, ds in groups:
        at = [position[d] for d in ds]
        if at != list(range(at[0], at[0] + len(at))):
            return None  # the group is not contiguous, or not row-major, in the result's order
    seq: list[int] = []
    for d in placed:
        if not seq or seq[-1] != owner[d]:
            seq.append(owner[d])
    units = tuple(d for d in range(len(src)) if src[d] == 1)
    return units + tuple(d for g in seq for d in groups[g][0])


def _groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]] | None:
    """The reshape's groups: runs of operand and result dimensions (size-1 dimensions left out) with equal
    products, in row-major order."""
    s = [d for d in range(len(src)) if src[d] != 1]
    t = [d for d in range(len(dst)) if dst[d] != 1]
    out: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    i = j = 0
    while i < len(s) and j < len(t):
        gs, gt = [s[i]], [t[j]]
        ps, pt = src[s[i]], dst[t[j]]
        i, j = i + 1, j + 1
        while ps != pt:
            if ps < pt and i < len(s):
                gs.append(s[i])
                ps *= src[s[i]]
                i += 1
            elif pt < ps and j < len(t):
                gt.append(t[j])
                pt *= dst[t[j]]
                j += 1
            else:
                return None
        out.append((tuple(gs), tuple(gt)))
    if i != len(s) or j != len(t):
        return None
    return out


def dot_cost(
    dims: DotDims, lhs: tuple[Shape, Order], rhs: tuple[Shape, Order], out: tuple[Shape, Order], config: ChipConfig
) -> float:
    """Cycles of a product for these orders, as the MXU lowering would arrange it
    (:func:`tpusim.compiler.dot_dims.oriented`): its MXU passes (each ``R x C`` weight tile streams the
    block's M rows, at least ``R`` cycles: the next tile's load), plus moving twice the bytes of an operand that
    must be transposed window by window (the left one without K in its lanes, the right one with neither K nor
    N) and of a result whose lanes are not N."""
    (a, ao), (b, bo), (c, co) = lhs, rhs, out
    d, swap = oriented_by_order(dims, ao[::-1], bo[::-1], co[::-1], c.dimensions)
    if swap:
        (a, ao), (b, bo) = (b, bo), (a, ao)
    if not d.lhs_contracting:
        return 0.0
    mxu, rate = config.mxu, config.hbm_bytes_per_cycle
    size = a.dimensions
    m = size[d.lhs_free[-1]] if d.lhs_free else 1
    k = size[d.lhs_contracting[-1]]
    n = b.dimensions[d.rhs_free[-1]] if d.rhs_free else 1
    products = _prod(size[x] for x in (*d.lhs_batch, *d.lhs_free[:-1], *d.lhs_contracting[:-1]))
    products *= _prod(b.dimensions[x] for x in d.rhs_free[:-1])
    cycles = products * ceil(k / mxu.rows) * ceil(n / mxu.cols) * max(m, mxu.rows) / mxu.count
    # A dimension the products loop over that sits in an operand's tiles makes each product's window a
    # stride through every tile: element by element for the DMA engines.
    runs = config.dma.runs_per_cycle
    for shape, order, used in (
        (a, ao, {*d.lhs_free[-1:], *d.lhs_contracting[-1:]}),
        (b, bo, {*d.rhs_free[-1:], *d.rhs_contracting[-1:]}),
        (c, co, {*d.out_lhs_free[-1:], *d.out_rhs_free[-1:]}),
    ):
        if any(shape.dimensions[x] > 1 and x not in used for x in order[-2:]):
            cycles += _prod(shape.dimensions) / runs
    if ao[-1] not in d.lhs_contracting:
        cycles += 2 * a.byte_size / rate
    if bo[-1] not in d.rhs_contracting and bo[-1] not in d.rhs_free:
        cycles += 2 * b.byte_size / rate
    if co[-1] not in d.out_rhs_free:
        cycles += 2 * c.byte_size / rate
    return cycles


def _relayout_cost(free: Callable[[Order, Order], bool], size: float) -> Callable[[Order, Order], float]:
    return lambda ro, oo: 0.0 if free(ro, oo) else size


def _fusion_cost(
    module: Module, fused: Computation, i: int, size: float, lanes: int
) -> Callable[[Order, Order], float]:
    """The relayout cost (``size`` cycles) of fusion parameter ``i`` for a result order and an operand order."""
    cache: dict[Order, Order | None] = {}

    def cost(ro: Order, oo: Order) -> float:
        if ro not in cache:
            orders: dict[Key, Order] = {}
            _fused_orders(module, fused, ro, orders, lanes)
            param = next(p for p in fused.parameters if p.attr("parameter_number") == i)
            cache[ro] = orders.get((fused.name, param.name))
        want = cache[ro]
        return 0.0 if want is None or want == oo else size

    return cost


def _fused_orders(module: Module, fused: Computation, root: Order, out: dict[Key, Order], lanes: int) -> None:
    """Orders for the values of a fused computation whose root is stored in ``root``: each value takes the
    order its first user (from the root back) needs; values no rule reaches keep the default. A value the
    fusion computes whose wanted order would put a dimension of a few elements in the lanes under a long one
    (the ``[n, m, 2]`` broadcast of ``jnp.repeat(x, 2, axis=1)``, reshaped to ``[n, 2m]``) swaps its two most
    minor dimensions: its blocks would hold ``lanes / 2`` times their values (a 64x blow-up of VMEM and of
    the vector work), where the user's reshape then crosses lanes once."""
    orders: dict[str, Order] = {fused.root: root}
    for instr in reversed(fused.instructions):
        ro = orders.get(instr.name)
        if ro is None or not isinstance(instr.shape, Shape):
            continue
        for i, o in enumerate(instr.operands):
            shape = fused[o].shape
            if o in orders or not isinstance(shape, Shape) or shape.rank == 0:
                continue
            fn = operand_order(instr, i, shape, instr.array_shape)
            want = fn(ro) if fn is not None else None
            if want is not None and sorted(want) == list(range(shape.rank)):
                if fused[o].opcode != "parameter" and _lane_starved(shape, want, lanes):
                    want = (*want[:-2], want[-1], want[-2])
                orders[o] = want
    for instr in fused.instructions:
        if isinstance(instr.shape, Shape):
            out[(fused.name, instr.name)] = orders.get(instr.name, _default(instr.shape.rank))


def _lane_starved(shape: Shape, order: Order, lanes: int) -> bool:
    """Whether ``order`` lays a dimension of at most ``lanes / 16`` elements along the lanes while the next
    dimension would fill them (so that swapping the two fills at least 8 times the lanes)."""
    if len(order) < 2:
        return False
    minor, next_minor = shape.dimensions[order[-1]], shape.dimensions[order[-2]]
    return 0 < minor * 16 <= lanes and next_minor >= lanes


# --------------------------------------------------------------------------------------------- helpers
def _sequential(module: Module) -> list[str]:
    from tpusim.compiler.buffer_assignment import sequential_computations

    return sequential_computations(module)


def _leaves(shape: object) -> list[tuple[tuple[int, ...], Shape]]:
    from tpusim.compiler.buffer_assignment import leaf_paths

    return leaf_paths(shape)  # type: ignore[arg-type]


def _leaf_shape(shape: object, path: tuple[int, ...]) -> Shape:
    for i in path:
        shape = shape.elements[i]  # type: ignore[attr-defined]
    assert isinstance(shape, Shape)
    return shape


def _physical(shape: Shape) -> Order:
    return tuple(reversed((shape.layout or Layout.default(shape.rank)).minor_to_major))
