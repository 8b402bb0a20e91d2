"""One caller per sequential computation, as XLA's FlattenCallGraph makes it.

JAX emits a jitted helper once and calls it from every place that uses it, so one ``while`` body or
``conditional`` branch may run for two different instructions. tpusim's buffer assignment gives a
computation's values one set of buffers, and joins a loop's state (or a conditional's result) with the
caller's value; shared by two callers, the two callers' values would share bytes: the second call's result
overwrote the first's, or buffer assignment refused the program. :func:`flatten_call_graph` gives every call
site but the first its own copy of the computation (and, in turn, of the computations the copy runs), as XLA
does before its buffer assignment. Computations run inside one instruction (fusion bodies, reducers) stay
shared: they have no buffers of their own.
"""

from __future__ import annotations

from dataclasses import replace

from tpusim.compiler.hlo.ir import SEQUENTIAL_CALLS, Computation, Module
from tpusim.compiler.rewrite import unique_name

__all__ = ["flatten_call_graph"]


def flatten_call_graph(module: Module) -> Module:
    """``module`` with each sequential computation called from one instruction only (see the module
    docstring); the module itself when that already holds."""
    comps: dict[str, Computation] = {c.name: c for c in module.computations}
    taken = set(comps)
    claimed: dict[str, str] = {}  # computation some instruction already runs -> the original it copies
    order = [module.entry]
    k = 0
    while k < len(order):  # callers before callees: a copy's own callees are then copied in turn
        name = order[k]
        k += 1
        comp = comps[name]
        body = list(comp.instructions)
        for i, instr in enumerate(body):
            keys = SEQUENTIAL_CALLS.get(instr.opcode, ())
            changes = {}
            for key in keys:
                value = instr.attr(key)
                if value is None:
                    continue
                names = value if isinstance(value, tuple) else (value,)
                own = tuple(_own(n, comps, taken, claimed, order) for n in names)
                if own != names:
                    changes[key] = own if isinstance(value, tuple) else own[0]
            if changes:
                body[i] = replace(instr, attributes=instr.attributes.replace(**changes))
        if body != list(comp.instructions):
            comps[name] = replace(comp, instructions=tuple(body))
    if all(comps[c.name] is c for c in module.computations) and len(comps) == len(module.computations):
        return module
    # each copy just before its original (which the module defines before its callers)
    copies: dict[str, list[Computation]] = {}
    for name, original in claimed.items():
        if name != original:
            copies.setdefault(original, []).append(comps[name])
    listed = [c for old in module.computations for c in (*copies.get(old.name, ()), comps[old.name])]
    return replace(module, computations=tuple(listed))


def _own(name: str, comps: dict[str, Computation], taken: set[str], claimed: dict[str, str], order: list[str]) -> str:
    """``name`` for its first call site, else a new copy of it (queued in ``order`` to flatten its callees;
    ``claimed`` maps each computation run so far to the original it copies)."""
    if name not in claimed:
        claimed[name] = name
        order.append(name)
        return name
    copy = unique_name(f"{name}.clone", taken)
    taken.add(copy)
    comps[copy] = replace(comps[name], name=copy)
    claimed[copy] = claimed[name]
    order.append(copy)
    return copy
