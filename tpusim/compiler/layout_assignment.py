"""Layout assignment: give every array value of the module a complete tiled layout.

Rules, in order of precedence:

1. A layout written in the HLO text with tiles is kept as written; one with only ``minor_to_major`` keeps
   that order and takes its tiles from the rule set. The entry computation's parameters and result follow
   the module header's ``entry_computation_layout`` where it gives tiles. In a module not yet laid out (no
   tiles anywhere: JAX's lowering, which prints the default order on every shape as a placeholder), the
   order of the other values is the compiler's to choose, as in XLA's layout assignment: the default order,
   except that an operand of ``dot`` puts its batch dimensions most major (the per-head arrays of attention
   then keep each head's rows and columns in whole tiles).
2. Values that are the same buffer share one layout: a ``get-tuple-element`` has its tuple element's layout,
   a ``tuple`` its operands'; the parameters of a ``while`` body and condition, of ``call`` and
   ``conditional`` branches and of fusion computations take their caller's operand layouts.
3. Everything else gets the rule set's layout (``configs/tiling/``).

Where two layouts of one buffer disagree (a computation root that must match its caller's result, a
computation called twice with operands in different layouts), an explicit ``copy`` instruction that
changes the layout is inserted; the lowering turns it into a relayout DMA whose cost depends on both
layouts' contiguous runs. Each inserted copy is listed in :attr:`LayoutAssignment.relayouts`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tpusim.compiler.hlo.ir import (
    Attributes,
    Computation,
    Instruction,
    Module,
    ProgramShape,
    has_tiled_layouts,
    sequential_callees,
)
from tpusim.compiler.hlo.opcodes import talks_to_other_devices
from tpusim.compiler.layout_choice import choose_orders
from tpusim.compiler.rewrite import unique_name
from tpusim.compiler.tiling_rules import TilingRules
from tpusim.config import ChipConfig
from tpusim.errors import TpusimError
from tpusim.memory import AnyShape, Layout, Shape, TupleShape

__all__ = ["LayoutAssignment", "Relayout", "assign_layouts"]


@dataclass(frozen=True, slots=True)
class Relayout:
    """An inserted layout-changing copy: ``name = copy(source)`` in ``computation``, and why."""

    computation: str
    name: str
    source: str
    from_shape: AnyShape
    to_shape: AnyShape
    reason: str


@dataclass(frozen=True, slots=True)
class LayoutAssignment:
    """The laid-out module, the copies inserted to change layouts, whether tpusim chose the orders (the
    module had no tiles: JAX's lowering) rather than keeping the module's own, and the ``(computation,
    bitcast)`` pairs whose operand and result the text laid out with tiles: those mean their operand's bytes
    read under the result's layout (XLA's bitcast, as the reference interpreter reads it), where a bitcast
    between untiled text layouts means its elements in each layout's dimension order."""

    module: Module
    relayouts: tuple[Relayout, ...]
    chosen: bool = False
    byte_bitcasts: frozenset[tuple[str, str]] = frozenset()


class LayoutAssignmentError(TpusimError):
    """A module whose layouts cannot be made consistent."""


def _with_rule_layout(shape: AnyShape, rules: TilingRules) -> AnyShape:
    if isinstance(shape, TupleShape):
        return TupleShape(tuple(_with_rule_layout(e, rules) for e in shape.elements))
    layout = shape.layout
    if layout is not None and (layout.tiles or shape.element_type.kind == "token"):
        return shape  # the text's tiled layout wins
    return shape.with_layout(rules.layout_for(shape, layout.minor_to_major if layout is not None else None))


def _called(instr: Instruction) -> tuple[str, ...]:
    if instr.opcode == "fusion":
        return (instr.attr("calls"),) if instr.attr("calls") is not None else ()
    return sequential_callees(instr)


def _param_requirements(instr: Instruction) -> list[tuple[str, tuple[int, ...]]]:
    """(callee, operand indices passed as its parameters) for the computations an instruction calls."""
    every = tuple(range(len(instr.operands)))
    if instr.opcode == "conditional":
        # Operand 0 is the predicate or branch index; branch i takes operand i + 1.
        return [(c, (i + 1,)) for i, c in enumerate(_called(instr))]
    if instr.opcode in ("while", "call", "fusion"):
        return [(c, every) for c in _called(instr)]
    return []


class _Assigner:
    def __init__(self, module: Module, rules: TilingRules, config: ChipConfig) -> None:
        self.module = module
        self.rules = rules
        self.param_shapes: dict[str, tuple[AnyShape, ...]] = {}
        self.root_shapes: dict[str, AnyShape] = {}
        self.relayouts: list[Relayout] = []
        self.done: dict[str, Computation] = {}
        # A module without any tile has not been laid out: its intermediate orders are placeholders.
        self.free_orders = not has_tiled_layouts(module)
        self.preferred: dict[tuple[str, str], tuple[int, ...]] = {}
        self.byte_bitcasts = frozenset(
            (comp.name, i.name)
            for comp in module.computations
            for i in comp.instructions
            if i.opcode == "bitcast" and _tiled(i.shape) and _tiled(comp[i.operands[0]].shape)
        )
        # (A program of several devices keeps the default orders: its collectives exchange arrays whose
        # layouts every device must agree on.)
        self.boundary_copies: set[str] = set()
        if self.free_orders and not talks_to_other_devices(module):
            self.module = module = self._boundary_copies(module)
            chosen = choose_orders(module, rules, config, _free_to_choose)
            self.preferred = {k: tuple(reversed(order)) for k, order in chosen.items()}

    def _boundary_copies(self, module: Module) -> Module:
        """The module with a ``copy`` of each entry parameter, read by the parameter's users instead, and of
        the result: a parameter is stored in its default order or one that wastes less to padding
        (:func:`~tpusim.compiler.layout_choice.compact_orders`), and a result likewise, but the copies'
        orders are chosen freely, so a product whose operand arrives with its batch in the lanes reads it
        relaid out, and a product writes its result in the order its MXU passes prefer (XLA:TPU relays such
        values out too). Copies that end up in their source's layout are taken out again
        (:meth:`_elide_boundary_copies`)."""
        entry = module.entry_computation
        taken = {i.name for i in entry.instructions}
        moved: dict[str, str] = {}
        body: list[Instruction] = []
        for instr in entry.instructions:
            body.append(replace(instr, operands=tuple(moved.get(o, o) for o in instr.operands)))
            shape = instr.shape
            if instr.opcode == "parameter" and _free_to_choose(instr) and isinstance(shape, Shape) and shape.rank >= 2:
                name = unique_name(f"{instr.name}.relayout", taken)
                body.append(Instruction(name, "copy", shape, (instr.name,), Attributes(), instr.loc))
                moved[instr.name] = name
        root = moved.get(entry.root, entry.root)
        result = next(i for i in body if i.name == root)
        if _free_to_choose(entry.root_instruction) and isinstance(result.shape, Shape) and result.shape.rank >= 2:
            # Likewise the result: computed in the order its producer prefers, then copied into its own.
            name = unique_name(f"{entry.root}.relayout", taken)
            body.append(Instruction(name, "copy", result.shape, (root,), Attributes(), result.loc))
            moved[root], root = name, name
        if not moved:
            return module
        self.boundary_copies = set(moved.values())
        comps = tuple(replace(c, instructions=tuple(body), root=root) if c is entry else c for c in module.computations)
        return replace(module, computations=comps)

    def _elide_boundary_copies(self, comp: Computation) -> Computation:
        """``comp`` without the boundary copies whose layout is their parameter's (they would move nothing)."""
        shapes = {i.name: i.shape for i in comp.instructions}
        gone = {
            i.name: i.operands[0]
            for i in comp.instructions
            if i.name in self.boundary_copies and shapes[i.operands[0]] == i.shape
        }
        if not gone:
            return comp

        def source(name: str) -> str:  # (a copy of a copy: the result's copy of a parameter's)
            while name in gone:
                name = gone[name]
            return name

        body = tuple(
            replace(i, operands=tuple(source(o) for o in i.operands)) for i in comp.instructions if i.name not in gone
        )
        return replace(comp, instructions=body, root=source(comp.root))

    def run(self) -> LayoutAssignment:
        entry = self.module.entry_computation
        header = self.module.attributes.get("entry_computation_layout")
        params = [p.shape for p in entry.parameters]
        result: AnyShape = entry.root_instruction.shape
        if isinstance(header, ProgramShape) and len(header.parameters) == len(params):
            params = [_prefer_tiled(h, p) for h, p in zip(header.parameters, params)]
            result = _prefer_tiled(header.result, result)
        if self.free_orders:  # JAX's default layout mode: the compiler lays out parameters and results
            params = [
                self._chosen(entry.name, p.name, s) if _free_to_choose(p) else s
                for p, s in zip(entry.parameters, params)
            ]
            if _free_to_choose(entry.root_instruction):
                result = self._chosen(entry.name, entry.root, result)
        self.param_shapes[entry.name] = tuple(_with_rule_layout(p, self.rules) for p in params)
        self.root_shapes[entry.name] = _with_rule_layout(result, self.rules)
        for comp in self._caller_first_order():
            self.done[comp.name] = self._assign(comp)
        self.done[entry.name] = self._elide_boundary_copies(self.done[entry.name])
        computations = tuple(self.done.get(c.name, c) for c in self.module.computations)
        return LayoutAssignment(
            replace(self.module, computations=computations),
            tuple(self.relayouts),
            bool(self.preferred),
            self.byte_bitcasts,
        )

    def _chosen(self, comp: str, name: str, shape: AnyShape) -> AnyShape:
        order = self.preferred.get((comp, name))
        if order is None or not isinstance(shape, Shape):
            return shape
        return shape.with_layout(Layout(order))

    def _caller_first_order(self) -> list[Computation]:
        order: list[str] = []
        seen: set[str] = set()

        def visit(name: str) -> None:
            if name in seen or name not in self.module:
                return
            seen.add(name)
            for instr in self.module[name].instructions:
                for callee in instr.called_computations():
                    visit(callee)
            order.append(name)

        visit(self.module.entry)
        for comp in self.module.computations:  # computations nobody calls still get layouts
            visit(comp.name)
        return [self.module[n] for n in reversed(order)]

    def _assign(self, comp: Computation) -> Computation:
        self.current = comp.name
        shapes: dict[str, AnyShape] = {}
        out: list[Instruction] = []
        required_params = self.param_shapes.get(comp.name)
        for instr in comp.instructions:
            shape = self._shape_of(instr, shapes, required_params)
            instr = replace(instr, shape=shape)
            instr = self._match_callees(comp, instr, shapes, out)
            shapes[instr.name] = instr.shape
            out.append(instr)
        root = comp.root
        wanted = self.root_shapes.get(comp.name)
        if wanted is not None and shapes[root] != wanted:
            reason = f"result of {comp.name} must have its caller's layout"
            root = self._relayout(comp.name, root, shapes[root], wanted, out, shapes, reason)
        return replace(comp, instructions=tuple(out), root=root)

    def _shape_of(
        self, instr: Instruction, shapes: dict[str, AnyShape], required_params: tuple[AnyShape, ...] | None
    ) -> AnyShape:
        op = instr.opcode
        if op == "parameter" and required_params is not None:
            number = instr.attr("parameter_number")
            if number >= len(required_params):
                raise LayoutAssignmentError(
                    f"{instr.name}: parameter {number} but the caller passes {len(required_params)} operands"
                )
            return required_params[number]
        if op == "get-tuple-element":
            source = shapes[instr.operands[0]]
            assert isinstance(source, TupleShape)
            return source.elements[instr.attr("index")]
        if op == "tuple":
            return TupleShape(tuple(shapes[o] for o in instr.operands))
        if op in ("while", "opt-barrier"):  # (the operand's own buffers, so its layouts)
            return shapes[instr.operands[0]]
        if self.free_orders and isinstance(instr.shape, Shape) and op != "parameter":
            order = self.preferred.get((self.current, instr.name), Layout.default(instr.shape.rank).minor_to_major)
            return instr.shape.with_layout(self.rules.layout_for(instr.shape, order))
        return _with_rule_layout(instr.shape, self.rules)

    def _match_callees(
        self, comp: Computation, instr: Instruction, shapes: dict[str, AnyShape], out: list[Instruction]
    ) -> Instruction:
        """Record what the instruction's callees must accept; insert operand copies on conflicts."""
        operands = list(instr.operands)
        for callee, indices in _param_requirements(instr):
            wanted = tuple(shapes[operands[i]] for i in indices)
            have = self.param_shapes.get(callee)
            if have is None:
                self.param_shapes[callee] = wanted
                if instr.opcode == "while" and callee == instr.attr("body"):
                    self.root_shapes[callee] = shapes[operands[0]]
                elif instr.opcode in ("call", "conditional"):
                    self.root_shapes[callee] = instr.shape
                continue
            # The callee was laid out for another caller: convert this caller's operands to match.
            for i, target in zip(indices, have):
                if shapes[operands[i]] != target:
                    reason = f"operand {i} of {instr.name}: {callee} was laid out for another caller"
                    operands[i] = self._relayout(
                        comp.name, operands[i], shapes[operands[i]], target, out, shapes, reason
                    )
        return replace(instr, operands=tuple(operands)) if tuple(operands) != instr.operands else instr

    def _relayout(
        self,
        comp: str,
        source: str,
        have: AnyShape,
        want: AnyShape,
        out: list[Instruction],
        shapes: dict[str, AnyShape],
        reason: str,
    ) -> str:
        """Append instructions that produce ``source`` in layout ``want``; return the new value's name."""
        if isinstance(want, Shape):
            name = _fresh(f"{source}.relayout", shapes)
            out.append(Instruction(name, "copy", want, (source,), Attributes()))
            shapes[name] = want
            self.relayouts.append(Relayout(comp, name, source, have, want, reason))
            return name
        assert isinstance(have, TupleShape)
        parts = []
        for i, (h, w) in enumerate(zip(have.elements, want.elements)):
            element = _fresh(f"{source}.{i}", shapes)
            out.append(Instruction(element, "get-tuple-element", h, (source,), Attributes({"index": i})))
            shapes[element] = h
            parts.append(element if h == w else self._relayout(comp, element, h, w, out, shapes, reason))
        name = _fresh(f"{source}.relayout", shapes)
        out.append(Instruction(name, "tuple", want, tuple(parts), Attributes()))
        shapes[name] = want
        return name


def _free_to_choose(instr: Instruction) -> bool:
    """An entry parameter or result whose text gives no order of its own (none, or the default one JAX prints
    as a placeholder): under ``jax.jit``'s default layout mode the compiler picks its layout."""
    layout = instr.shape.layout if isinstance(instr.shape, Shape) else None
    return layout is None or layout.minor_to_major == Layout.default(instr.shape.rank).minor_to_major  # type: ignore[union-attr]


def _prefer_tiled(header: AnyShape, text: AnyShape) -> AnyShape:
    """The header's shape where it carries tiles, else the instruction's own."""
    if isinstance(header, TupleShape) and isinstance(text, TupleShape):
        return TupleShape(tuple(_prefer_tiled(h, t) for h, t in zip(header.elements, text.elements)))
    if isinstance(header, Shape) and header.has_tiles:
        return header
    return text


def _fresh(base: str, taken: dict[str, AnyShape]) -> str:
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}{n}"
    return name


def _tiled(shape: AnyShape) -> bool:
    return isinstance(shape, Shape) and shape.has_tiles


def assign_layouts(module: Module, rules: TilingRules, config: ChipConfig) -> LayoutAssignment:
    """Give every array value of ``module`` a complete layout for the chip ``config`` (see the module
    docstring for the rules)."""
    return _Assigner(module, rules, config).run()
