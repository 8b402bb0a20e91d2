"""One caller per loop body and branch (tpusim.compiler.call_graph, as XLA's FlattenCallGraph)."""

from __future__ import annotations

from tpusim.compiler.call_graph import flatten_call_graph
from tpusim.compiler.hlo import parse_module, print_module

# A helper loop (`outer`) run by two whiles of the entry; its body runs an inner loop (`inner`), which the
# copy of `outer` must then run from a copy of its own.
SHARED = """HloModule shared

inner_cond {
  p = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(2)
  ROOT lt = pred[] compare(i, n), direction=LT
}

inner {
  p = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8] get-tuple-element(p), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  y = f32[8] add(x, x)
  ROOT t = (s32[], f32[8]) tuple(j, y)
}

outer_cond {
  p = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

outer {
  p = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8] get-tuple-element(p), index=1
  zero = s32[] constant(0)
  s = (s32[], f32[8]) tuple(zero, x)
  w = (s32[], f32[8]) while(s), condition=inner_cond, body=inner
  y = f32[8] get-tuple-element(w), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (s32[], f32[8]) tuple(j, y)
}

ENTRY main {
  x = f32[8] parameter(0)
  zero = s32[] constant(0)
  s = (s32[], f32[8]) tuple(zero, x)
  a = (s32[], f32[8]) while(s), condition=outer_cond, body=outer
  b = (s32[], f32[8]) while(a), condition=outer_cond, body=outer
  ROOT t = ((s32[], f32[8]), (s32[], f32[8])) tuple(a, b)
}
"""


def _runs(module: object) -> dict[str, list[str]]:
    """Computation -> the instructions (computation/name) that run it."""
    out: dict[str, list[str]] = {}
    for comp in module.computations:  # type: ignore[attr-defined]
        for instr in comp.instructions:
            if instr.opcode == "while":
                for key in ("condition", "body"):
                    out.setdefault(instr.attr(key), []).append(f"{comp.name}/{instr.name}")
    return out


def test_every_loop_body_and_condition_has_one_caller_and_copies_copy_their_callees() -> None:
    flat = flatten_call_graph(parse_module(SHARED))
    runs = _runs(flat)
    assert all(len(callers) == 1 for callers in runs.values()), runs
    assert runs["outer"] == ["main/a"] and runs["outer.clone"] == ["main/b"]
    assert runs["inner"] == ["outer/w"] and runs["inner.clone"] == ["outer.clone/w"]
    assert runs["outer_cond.clone"] == ["main/b"]
    # the printed module parses back (each copy is defined before its callers)
    assert parse_module(print_module(flat)) == flat


def test_a_module_whose_computations_have_one_caller_is_left_as_it_is() -> None:
    single = SHARED.replace("  b = (s32[], f32[8]) while(a), condition=outer_cond, body=outer\n", "")
    single = single.replace("tuple(a, b)", "tuple(a, a)")
    module = parse_module(single)
    assert flatten_call_graph(module) is module
