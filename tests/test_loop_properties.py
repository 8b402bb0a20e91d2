"""Property test of loops (issue 13, "Wrong answers in loops"): generated HLO programs whose ``while`` bodies
permute, rotate, duplicate and mix the elements of their loop state must give the reference interpreter's
outputs bit for bit, and a timing-only run must take exactly the cycles of the numeric run (the trip counts
and branch choices depend only on counters and constants, never on unflagged data).

A program is built from three kinds of steps over a list of values (the "state"):

* a **mix**: every element becomes another element of its type (a permutation within each type class,
  so swaps and rotations are common, or a duplicate), an elementwise combination of two elements of its
  type, a broadcast constant, a dynamic-update-slice of an element at the loop counter, or itself;
* a **loop**: ``while`` over ``(s32[] counter, *state)`` with a constant trip count 0-4, whose body is mixes
  and (when deep enough) a nested region;
* a **conditional** (on ``counter < k`` or the counter as a branch index) or a **call**, whose branches and
  callee hold a nested region, so loops run inside branches and callees.

The entry takes the state's initial values and an s32 scalar as parameters, runs some steps and returns
the final state, some of it combined with the parameters (loop results and loop operands used after the
loop). A failing example's message holds the program's HLO text. Set LOOP_PROPERTIES_SHRINK=1 to have
Hypothesis shrink a failing program to a minimal one (minutes) instead of reporting it as generated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

import tpusim
from tpusim.api import load_program
from tpusim.compiler.hlo.reference import evaluate
from tpusim.memory import element_type, element_type_of_dtype

# ---------------------------------------------------------------------------------------------------------
# Types and programs being written
# ---------------------------------------------------------------------------------------------------------
DTYPES = ("f32", "bf16", "s32", "u8", "pred")
SHAPES = ((), (4,), (8, 128), (3, 5, 7), (16, 256))
BINARY = {"pred": ("and", "or", "xor")}
ARITHMETIC = ("add", "multiply", "maximum", "subtract")
CONSTANTS = {
    "f32": ("1.5", "-0.75", "3"),
    "bf16": ("1.5", "-0.75", "3"),
    "s32": ("3", "-2", "7"),
    "u8": ("7", "250", "1"),
    "pred": ("true", "false"),
}


@dataclass(frozen=True)
class Type:
    dtype: str
    dims: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


S32 = Type("s32", ())
Value = tuple[str, Type]  # an instruction's name and its type


def tuple_type(types: list[Type]) -> str:
    return "(" + ", ".join(map(str, types)) + ")"


@dataclass
class Program:
    """Computations written so far (callees before their callers) and a name counter."""

    computations: list[str] = field(default_factory=list)
    count: int = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"


@dataclass
class Comp:
    """One computation being written."""

    program: Program
    lines: list[tuple[str, str]] = field(default_factory=list)  # (name, "type opcode(...)")

    def emit(self, type_text: str | Type, text: str, stem: str = "v") -> str:
        name = self.program.name(stem)
        self.lines.append((name, f"{type_text} {text}"))
        return name

    def finish(self, header: str, root: str) -> str:
        body = "\n".join(f"  {'ROOT ' if n == root else ''}{n} = {t}" for n, t in self.lines)
        return f"{header} {{\n{body}\n}}"

    def unpack(self, tup: str, types: list[Type], first: int = 0) -> list[Value]:
        """get-tuple-element of every element of ``tup`` from index ``first`` on."""
        return [(self.emit(t, f"get-tuple-element({tup}), index={first + j}", "g"), t) for j, t in enumerate(types)]


# ---------------------------------------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------------------------------------
def constant(comp: Comp, t: Type, literal: str) -> str:
    c = comp.emit(Type(t.dtype, ()), f"constant({literal})", "c")
    return c if not t.dims else comp.emit(t, f"broadcast({c}), dimensions={{}}", "b")


@st.composite
def permutation(draw: st.DrawFn, members: list[int]) -> list[int]:
    """A rotation (the simplest example: a swap), a reversal, any permutation, or the identity."""
    kind = draw(st.sampled_from(["rotate", "reverse", "shuffle", "keep"]))
    if kind == "rotate":
        by = draw(st.integers(1, max(1, len(members) - 1)))
        return members[by:] + members[:by]
    if kind == "reverse":
        return members[::-1]
    return draw(st.permutations(members)) if kind == "shuffle" else members


@st.composite
def mix(draw: st.DrawFn, comp: Comp, state: list[Value], counter: str) -> list[Value]:
    """Each element becomes a function of the state's elements of its type (see the module docstring)."""
    classes: dict[Type, list[int]] = {}
    for j, (_, t) in enumerate(state):
        classes.setdefault(t, []).append(j)
    source = list(range(len(state)))
    for members in classes.values():
        for j, k in zip(members, draw(permutation(members))):
            source[j] = k
    out: list[Value] = []
    for j, (_, t) in enumerate(state):
        peers = classes[t]
        moved = state[source[j]][0]
        kinds = ["move", "combine", "duplicate", "constant"] + (["update"] if t.dims else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "move":  # the permuted element (itself when the permutation fixes j)
            name = moved
        elif kind == "duplicate":
            name = state[draw(st.sampled_from(peers))][0]
        elif kind == "combine":
            op = draw(st.sampled_from(BINARY.get(t.dtype, ARITHMETIC)))
            other = state[draw(st.sampled_from(peers))][0]
            name = comp.emit(t, f"{op}({moved}, {other})", "m")
        elif kind == "constant":
            name = constant(comp, t, draw(st.sampled_from(CONSTANTS[t.dtype])))
        else:  # dynamic-update-slice of the moved element at the counter, its update a row of a peer
            row = state[draw(st.sampled_from(peers))][0]
            row_t = Type(t.dtype, (1, *t.dims[1:]))
            window = ", ".join(f"[0:{d}]" for d in row_t.dims)
            update = comp.emit(row_t, f"slice({row}), slice={{{window}}}", "r")
            zeros = [comp.emit(S32, "constant(0)", "z")] * (len(t.dims) - 1) if len(t.dims) > 1 else []
            starts = ", ".join([counter, *zeros])
            name = comp.emit(t, f"dynamic-update-slice({moved}, {update}, {starts})", "u")
        out.append((name, t))
    return out


@st.composite
def steps(draw: st.DrawFn, comp: Comp, state: list[Value], counter: str, depth: int, need_region: bool) -> list[Value]:
    """One or two mixes and nested regions (a region needs depth >= 1; ``need_region`` forces one)."""
    kinds = draw(st.lists(st.sampled_from(["mix", "region"] if depth >= 1 else ["mix"]), min_size=1, max_size=2))
    if need_region and "region" not in kinds:
        kinds.append("region")
    if not need_region and "mix" not in kinds:
        kinds.append("mix")
    for kind in kinds:
        state = draw(mix(comp, state, counter)) if kind == "mix" else draw(region(comp, state, counter, depth))
    return state


@st.composite
def region(draw: st.DrawFn, comp: Comp, state: list[Value], counter: str, depth: int) -> list[Value]:
    """A while loop, or (depth >= 2) a conditional or call holding a region of depth - 1."""
    kind = draw(st.sampled_from(["loop", "conditional", "call"] if depth >= 2 else ["loop"]))
    return draw({"loop": loop, "conditional": conditional, "call": call}[kind](comp, state, counter, depth))


@st.composite
def loop(draw: st.DrawFn, comp: Comp, state: list[Value], counter: str, depth: int) -> list[Value]:
    """``while`` over ``(counter, *state)``; the body mixes and may hold a region of depth - 1."""
    program, types = comp.program, [t for _, t in state]
    loop_t = tuple_type([S32, *types])
    trips = draw(st.sampled_from([1, 2, 3, 4, 0]))

    cond = Comp(program)
    p = cond.emit(loop_t, "parameter(0)", "p")
    i = cond.emit(S32, f"get-tuple-element({p}), index=0", "i")
    n = cond.emit(S32, f"constant({trips})", "n")
    lt = cond.emit("pred[]", f"compare({i}, {n}), direction=LT", "lt")
    cond_name = program.name("cond")

    body = Comp(program)
    p = body.emit(loop_t, "parameter(0)", "p")
    i = body.emit(S32, f"get-tuple-element({p}), index=0", "i")
    inner = body.unpack(p, types, first=1)
    one = body.emit(S32, "constant(1)", "one")
    i2 = body.emit(S32, f"add({i}, {one})", "i")
    new = draw(steps(body, inner, i, depth - 1, need_region=False))
    root = body.emit(loop_t, f"tuple({', '.join([i2] + [v for v, _ in new])})", "t")
    body_name = program.name("body")
    program.computations.append(cond.finish(cond_name, lt))
    program.computations.append(body.finish(body_name, root))

    zero = comp.emit(S32, "constant(0)", "z")
    init = comp.emit(loop_t, f"tuple({', '.join([zero] + [v for v, _ in state])})", "t")
    w = comp.emit(loop_t, f"while({init}), condition={cond_name}, body={body_name}", "w")
    return comp.unpack(w, types, first=1)


@st.composite
def callee(draw: st.DrawFn, program: Program, types: list[Type], depth: int, *, packed: bool) -> str:
    """A computation of ``(s32 scalar, *types)`` (one tuple parameter when ``packed``, else one parameter
    each) returning ``tuple(*types)``, holding a region of depth - 1."""
    c = Comp(program)
    if packed:
        p = c.emit(tuple_type([S32, *types]), "parameter(0)", "p")
        k = c.emit(S32, f"get-tuple-element({p}), index=0", "k")
        state = c.unpack(p, types, first=1)
    else:
        k = c.emit(S32, "parameter(0)", "k")
        state = [(c.emit(t, f"parameter({j + 1})", "a"), t) for j, t in enumerate(types)]
    new = draw(steps(c, state, k, depth - 1, need_region=True))
    root = c.emit(tuple_type(types), f"tuple({', '.join(v for v, _ in new)})", "t")
    name = program.name("branch" if packed else "callee")
    program.computations.append(c.finish(name, root))
    return name


@st.composite
def conditional(draw: st.DrawFn, comp: Comp, state: list[Value], counter: str, depth: int) -> list[Value]:
    """``conditional`` on ``counter < k`` or with the counter as branch index (out of range: the last)."""
    types = [t for _, t in state]
    operand = comp.emit(tuple_type([S32, *types]), f"tuple({', '.join([counter] + [v for v, _ in state])})", "t")
    out_t = tuple_type(types)
    if draw(st.booleans()):
        k = comp.emit(S32, f"constant({draw(st.integers(0, 4))})", "k")
        pred = comp.emit("pred[]", f"compare({counter}, {k}), direction=LT", "q")
        yes, no = (draw(callee(comp.program, types, depth, packed=True)) for _ in range(2))
        c = comp.emit(
            out_t, f"conditional({pred}, {operand}, {operand}), true_computation={yes}, false_computation={no}", "if"
        )
    else:
        branches = [draw(callee(comp.program, types, depth, packed=True)) for _ in range(draw(st.integers(2, 3)))]
        operands = ", ".join([operand] * len(branches))
        c = comp.emit(out_t, f"conditional({counter}, {operands}), branch_computations={{{', '.join(branches)}}}", "sw")
    return comp.unpack(c, types)


@st.composite
def call(draw: st.DrawFn, comp: Comp, state: list[Value], counter: str, depth: int) -> list[Value]:
    types = [t for _, t in state]
    f = draw(callee(comp.program, types, depth, packed=False))
    c = comp.emit(tuple_type(types), f"call({', '.join([counter] + [v for v, _ in state])}), to_apply={f}", "call")
    return comp.unpack(c, types)


@dataclass(frozen=True)
class Case:
    hlo: str
    inputs: tuple[np.ndarray, ...]

    def __repr__(self) -> str:  # hypothesis prints the falsifying example with this
        return "Case(\n" + self.hlo + "\n)"


def make_input(rng: np.random.Generator, t: Type) -> np.ndarray:
    dtype = element_type(t.dtype).dtype
    if t.dtype in ("f32", "bf16"):
        return np.asarray(rng.standard_normal(t.dims) * 4, np.float32).astype(dtype)
    if t.dtype == "s32":
        return rng.integers(-1000, 1000, t.dims).astype(dtype)
    if t.dtype == "u8":
        return rng.integers(0, 256, t.dims).astype(dtype)
    return np.asarray(rng.random(t.dims) < 0.5)


@st.composite
def programs(draw: st.DrawFn, min_depth: int, max_depth: int) -> Case:
    """An entry of parameters ``(*state, s32 k)`` running regions and mixes, returning the final state and
    some of it combined with the parameters (so loop operands and results both live after the loops)."""
    kinds = draw(st.lists(st.tuples(st.sampled_from(DTYPES), st.sampled_from(SHAPES)), min_size=1, max_size=2))
    classes = [Type(d, s) for d, s in kinds]
    types = draw(st.lists(st.sampled_from(classes), min_size=2, max_size=5))
    depth = draw(st.integers(min_depth, max_depth))

    program = Program()
    entry = Comp(program)
    params = [(entry.emit(t, f"parameter({j})", "x"), t) for j, t in enumerate(types)]
    k = entry.emit(S32, f"parameter({len(types)})", "k")
    state = draw(steps(entry, params, k, depth, need_region=True))
    outputs = []
    for name, t in state:
        if draw(st.booleans()):
            peer = draw(st.sampled_from([x for x, u in params if u == t]))
            name = entry.emit(t, f"{draw(st.sampled_from(BINARY.get(t.dtype, ARITHMETIC)))}({name}, {peer})", "o")
        outputs.append((name, t))
    root = entry.emit(tuple_type([t for _, t in outputs]), f"tuple({', '.join(n for n, _ in outputs)})", "out")
    hlo = "HloModule loops\n\n" + "\n\n".join([*program.computations, entry.finish("ENTRY main", root)]) + "\n"

    rng = np.random.default_rng(0)
    inputs = (*(make_input(rng, t) for t in types), np.asarray(draw(st.integers(-1, 4)), np.int32))
    return Case(hlo, inputs)


# ---------------------------------------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------------------------------------
def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit for bit, except that a NaN equals a NaN of any sign or payload."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if got.dtype.kind == "V" or got.dtype == np.bool_ or got.dtype.kind in "iu":
        return bool(np.array_equal(got, want))
    raw = element_type_of_dtype(want.dtype).raw_dtype
    nan = np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))
    return bool(np.all((got.view(raw) == want.view(raw)) | nan))


def check(case: Case) -> None:
    note(case.hlo)
    where = f"\n--- program ---\n{case.hlo}--- inputs: scalar k = {int(case.inputs[-1])} ---"
    try:
        want = evaluate(load_program(case.hlo), list(case.inputs))
        numeric = tpusim.simulate(case.hlo, list(case.inputs))
        timing = tpusim.simulate(case.hlo, list(case.inputs), timing_only=True)
    except Exception as e:  # a crash names the program too
        raise AssertionError(f"{type(e).__name__}: {e}{where}") from e
    assert len(numeric.outputs) == len(want), where
    bad = [
        f"out{j} {w.dtype}{list(w.shape)}: device {g.ravel()[:6]} reference {w.ravel()[:6]}"
        for j, (g, w) in enumerate(zip(numeric.outputs, want))
        if not same_bits(np.asarray(g), np.asarray(w))
    ]
    assert not bad, "device != reference: " + "; ".join(bad) + where
    assert timing.cycles == numeric.cycles, (
        f"timing-only run {timing.cycles:,} cycles, numeric run {numeric.cycles:,} "
        f"({timing.instructions:,} vs {numeric.instructions:,} instructions executed)" + where
    )


# Shrinking a failing program can take Hypothesis minutes (it stops after five); the suite reports the first
# failing program as generated (small ones come first) unless LOOP_PROPERTIES_SHRINK=1 asks for a minimal one.
SHRINK = os.environ.get("LOOP_PROPERTIES_SHRINK") == "1"
SETTINGS = settings(
    derandomize=True,
    deadline=None,
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, *([Phase.shrink] if SHRINK else [])],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@settings(SETTINGS, max_examples=150)
@given(programs(min_depth=1, max_depth=1))
def test_loops_permuting_and_mixing_state(case: Case) -> None:
    """One or two loops in a row (with mixes around them) over 2-5 elements of one or two types."""
    check(case)


@settings(SETTINGS, max_examples=100)
@given(programs(min_depth=2, max_depth=3))
def test_nested_loops_conditionals_and_calls(case: Case) -> None:
    """Loops in loop bodies, in conditional branches and in called computations, up to three deep."""
    check(case)
