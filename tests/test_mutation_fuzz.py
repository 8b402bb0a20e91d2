"""Mutation fuzzing of the whole pipeline over the shipped examples (issue 13's proof): a bounded, seeded run of
mutants (byte flips, token deletions, swaps and replacements, duplicated lines, truncations, huge and boundary
numbers, deep tuples, resized dimensions, exchanged element types, opcodes and layouts; tests/mutation_fuzz.py)
read, parsed, verified, printed, compiled and simulated timing-only. Every mutant must run or stop with a
TpusimError whose first line stays short, within a time limit. scripts/fuzz_mutations.py runs as many more as
you like, and with ``--check`` compares each numeric run with the reference interpreter; what it found is
at the end, as regression tests.
"""

from __future__ import annotations

import random

import pytest
from mutation_fuzz import MUTATORS, STAGES, MutantRunner, load_sources, make_mutant, mutants

SEED = 13
COUNT = 200  # 15 to 35 s on two shared cores
LONGEST_FIRST_LINE = 1000  # an error's first line: a location, then a message clipped to 400 characters
TIMEOUT = 60.0  # seconds per mutant: far above the slowest (under 1 s), so only a hang trips it

SOURCES = load_sources()


def test_mutants_fail_only_with_tpusim_errors():
    # Every mutant runs, or stops with a TpusimError about the program (not one of tpusim's internal checks
    # after the verifier accepted it), whose first line stays short, within the time limit.
    findings = []
    statuses: dict[str, int] = {}
    reached = set()
    with MutantRunner(TIMEOUT) as runner:
        for mutant in mutants(SOURCES, SEED, COUNT):
            outcome = runner.run(mutant)
            statuses[outcome.status] = statuses.get(outcome.status, 0) + 1
            reached.add(outcome.stage)
            if outcome.status == "error" and outcome.message_length > LONGEST_FIRST_LINE:
                findings.append(
                    f"{mutant.name}: a {outcome.error_type} whose first line has {outcome.message_length:,} "
                    f"characters: {outcome.message}"
                )
            if outcome.is_finding or outcome.is_internal:
                findings.append(
                    f"{mutant.name} ({mutant.example}: {'; '.join(mutant.mutations)}): {outcome.status} at "
                    f"{outcome.stage}: {outcome.key}: {outcome.message}\n{outcome.traceback}"
                    f"rerun: python scripts/fuzz_mutations.py --seed {SEED} --index {mutant.index}"
                )
    assert not findings, "\n\n".join(findings)
    # The run is not vacuous: mutants stop in every stage, and some run to the end.
    assert statuses.get("ok", 0) >= COUNT // 20, statuses
    assert {"parse", "verify", "simulate"} <= reached, reached


def test_mutants_are_a_function_of_seed_and_index():
    a = [make_mutant(SOURCES, 5, i) for i in range(20)]
    assert a == [make_mutant(SOURCES, 5, i) for i in range(20)]
    assert len({m.data for m in a}) == 20
    assert make_mutant(SOURCES, 6, 0) != a[0]


@pytest.mark.parametrize("name", list(MUTATORS))
def test_each_mutator_changes_every_example(name):
    for example, data in SOURCES.items():
        rng = random.Random(f"{name}-{example}")
        changed = sum(MUTATORS[name](data, rng)[0] != data for _ in range(10))
        assert changed >= 7, (name, example, changed)


def test_huge_numbers_and_deep_tuples_are_what_they_say():
    data = SOURCES["mlp_f32.hlo"]
    rng = random.Random(0)
    digits = [MUTATORS["number"](data, rng)[1] for _ in range(60)]
    assert any("digits>" in d for d in digits) and any(d.endswith(str(2**63)) for d in digits)
    depths = {MUTATORS["tuple"](data, rng)[1].split()[2] for _ in range(60)}
    assert "2000" in depths


def test_runner_turns_a_hang_into_a_finding_and_recovers():
    mutant = make_mutant(SOURCES, SEED, 0, ("layout",))  # a mutant that compiles and runs
    with MutantRunner(timeout=0.001) as runner:
        outcome = runner.run(mutant)
        assert outcome.status == "hang" and outcome.is_finding and outcome.stage in STAGES
        runner.timeout = TIMEOUT
        assert runner.run(mutant).status == "ok"


# ------------------------------------------------------------------------------------------- regressions
# Minimal reproducers of what the fuzzer found, each fixed at its root.


def _elementwise(opcode: str, etype: str, result: str | None = None) -> str:
    from tpusim.compiler.hlo.opcodes import UNARY_ELEMENTWISE

    args = "x" if opcode in UNARY_ELEMENTWISE else "x, y"
    return (
        f"HloModule m\nENTRY main {{\n  x = {etype}[8,128] parameter(0)\n  y = {etype}[8,128] parameter(1)\n"
        f"  ROOT z = {result or etype}[8,128] {opcode}({args})\n}}\n"
    )


@pytest.mark.parametrize(
    ("opcode", "etype"),
    [("or", "bf16"), ("xor", "f32"), ("not", "f16"), ("shift-left", "f32"), ("popcnt", "bf16"),
     ("count-leading-zeros", "pred"), ("sqrt", "s32"), ("floor", "c64"), ("negate", "pred"), ("atan2", "s32"),
     ("maximum", "c64"), ("remainder", "c64")],
)  # fmt: skip
def test_elementwise_operand_types_are_checked_by_the_verifier(opcode, etype):
    # Found by the fuzzer (mutant 5-21 with --check, `add` -> `or` in the bf16 transformer block): the verifier
    # accepted bitwise, integer-only and float-only opcodes on any element type; the program compiled, ran
    # timing-only, and its numeric run failed inside numpy with a TypeError. The verifier now refuses them,
    # located, with the reference interpreter's table (XLA's shape inference).
    from tpusim.api import simulate
    from tpusim.compiler.hlo import HloVerifyError, parse_module

    text = _elementwise(opcode, etype)
    with pytest.raises(HloVerifyError, match=rf"{opcode} takes .* operands, not {etype}\[8,128\]") as err:
        parse_module(text, "bad.hlo")
    assert "instruction %z (bad.hlo:5)" in str(err.value)
    with pytest.raises(HloVerifyError):
        simulate(text, config="teaching")


@pytest.mark.parametrize(
    ("opcode", "etype", "result"),
    [("or", "pred", None), ("and", "u8", None), ("not", "s32", None), ("shift-right-logical", "u32", None),
     ("sqrt", "c64", None), ("real", "c64", "f32"), ("floor", "bf16", None), ("negate", "s8", None),
     ("maximum", "pred", None), ("remainder", "s32", None), ("atan2", "f32", None), ("abs", "u8", None)],
)  # fmt: skip
def test_elementwise_operand_types_the_reference_evaluates_stay_accepted(opcode, etype, result):
    import numpy as np

    from tpusim.api import simulate
    from tpusim.compiler.hlo import parse_module
    from tpusim.compiler.hlo.reference import evaluate
    from tpusim.compiler.hlo.reference.io import random_inputs

    module = parse_module(_elementwise(opcode, etype, result))
    inputs = random_inputs(module, 0)[0]
    want = evaluate(module, inputs)[0]
    got = simulate(module, inputs, config="tpu_v5e").outputs[0]
    assert np.array_equal(np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


REDUCER_OF_ANOTHER_PRECISION = """HloModule m
region {
  a = f32[] parameter(0)
  b = f64[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[8,128] parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[8] reduce(x, z), dimensions={1}, to_apply=region
}
"""


def test_reducer_of_another_float_precision_is_refused_or_runs():
    # Found by the fuzzer with --check (mutants 200-144, 467, 554, 2300, 4619: one parameter of a reduce or
    # reduce-window region retyped). Either the verifier refuses the module, located, or both agree: the
    # reducer's accumulator (f32) and element (f64) types differ, so the reference folds the elements into
    # the accumulator one by one (a pairwise tree called it with two elements and failed).
    import numpy as np

    from tpusim.api import simulate
    from tpusim.compiler.hlo import HloVerifyError, parse_module
    from tpusim.compiler.hlo.reference import evaluate
    from tpusim.compiler.hlo.reference.io import random_inputs

    try:
        module = parse_module(REDUCER_OF_ANOTHER_PRECISION)
    except HloVerifyError:
        return
    inputs = random_inputs(module, 0)[0]
    want = evaluate(module, inputs)[0]
    assert np.array_equal(simulate(module, inputs, config="tpu_v5e").outputs[0], want)


_SUM = "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"
SPLAT_CONSTANT_OPERANDS = {  # use: (the constant, the instructions using d = f32[1024,1536] broadcast(c))
    "transpose": ("2.3", "ROOT t = f32[1536,1024] transpose(d), dimensions={1,0}"),
    "reshape": ("2.3", "ROOT t = f32[1024,12,128] reshape(d)"),
    "reduce-precision": ("2.3", "ROOT t = f32[1024,1536] reduce-precision(d), exponent_bits=5, mantissa_bits=2"),
    "concatenate": (
        "2.3",
        "p = f32[1024,64] parameter(0)\n  ROOT t = f32[1024,1600] concatenate(d, p), dimensions={1}",
    ),
    "pad": ("2.3", "z = f32[] constant(0)\n  ROOT t = f32[1030,1540] pad(d, z), padding=3_3x2_2"),
    # (sums of 2s are exact in any order)
    "reduce-all": ("2", "z = f32[] constant(0)\n  ROOT r = f32[] reduce(d, z), dimensions={0,1}, to_apply=add"),
    "reduce-rows": ("2", "z = f32[] constant(0)\n  ROOT r = f32[1024] reduce(d, z), dimensions={1}, to_apply=add"),
}


@pytest.mark.parametrize("use", list(SPLAT_CONSTANT_OPERANDS))
def test_ops_of_a_broadcast_constant_work_block_by_block(use):
    # Found by the fuzzer (mutant 100-4263: the train step's batch resized to 0 made a dot of an empty
    # contraction, i.e. a broadcast zero, feeding a transpose): a fused op whose operand is a broadcast
    # constant got a VMEM copy of the whole operand instead of the block being emitted. A transpose, reshape,
    # reduce-precision or concatenate then stopped at an IsaError (transposing (256, 784) gives (784, 256),
    # not (512, 256)), and a reduce of all elements summed the whole array once per block: 4,194,304 for
    # 1024 x 1024 ones, a silently wrong answer.
    import numpy as np

    from tpusim.api import simulate
    from tpusim.compiler.hlo import parse_module
    from tpusim.compiler.hlo.reference import evaluate
    from tpusim.compiler.hlo.reference.io import random_inputs

    constant, root = SPLAT_CONSTANT_OPERANDS[use]
    text = (
        f"HloModule m\n{_SUM}ENTRY main {{\n  c = f32[] constant({constant})\n"
        f"  d = f32[1024,1536] broadcast(c), dimensions={{}}\n  {root}\n}}\n"
    )
    module = parse_module(text)
    inputs = random_inputs(module, 0)[0]
    want = evaluate(module, inputs)[0]
    numeric = simulate(module, inputs, config="tpu_v5e")
    assert np.array_equal(numeric.outputs[0], want)
    assert simulate(module, inputs, config="tpu_v5e", timing_only=True).cycles == numeric.cycles


@pytest.mark.parametrize(
    "window", ["size=2x2 stride=2x0", "size=0x2", "size=2x2 lhs_dilate=1x0", "size=2x2 rhs_dilate=0x1"]
)
def test_window_sizes_strides_and_dilations_must_be_positive(window):
    # Found by the fuzzer (mutant 500-552: a reduce-window's stride 1x2x2x1 made 1x2x2x0): the verifier's
    # window rule divided by the stride, a ZeroDivisionError traceback. XLA refuses non-positive sizes,
    # strides and dilations (InferWindowOutputShape); so does the verifier, located.
    from tpusim.compiler.hlo import HloVerifyError, parse_module

    text = (
        f"HloModule m\n{_SUM}ENTRY main {{\n  x = f32[8,128] parameter(0)\n  z = f32[] constant(0)\n"
        f"  ROOT r = f32[4,64] reduce-window(x, z), window={{{window}}}, to_apply=add\n}}\n"
    )
    with pytest.raises(HloVerifyError, match=r"\(w.hlo:10\): a window [a-z ]+ must be positive, not 0"):
        parse_module(text, "w.hlo")


def test_complex_values_compare_only_for_equality():
    # Found by the fuzzer (mutant 500-400: every s32 of the attention example made c64, so a causal mask's
    # compare GE took complex operands): the verifier accepted it, the program compiled and ran timing-only,
    # and the numeric run failed in a fallback kernel. Complex values have no order; the verifier says so.
    from tpusim.compiler.hlo import HloVerifyError, parse_module

    text = "HloModule m\nENTRY main {\n  x = c64[4] parameter(0)\n  ROOT c = pred[4] compare(x, x), direction=%s\n}\n"
    with pytest.raises(HloVerifyError, match=r"\(c.hlo:4\): complex operands only compare EQ or NE, not GE"):
        parse_module(text % "GE", "c.hlo")
    parse_module(text % "NE", "c.hlo")
