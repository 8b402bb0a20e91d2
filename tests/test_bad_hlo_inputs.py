"""Inputs a user can give the HLO front end and the compiler that once gave tracebacks (issue 13).

* Empty arrays (``f32[0,8]``) run on the device as XLA runs them, outputs equal to the reference
  interpreter's, in numeric and timing-only runs.
* Integers of thousands of digits, tuples nested thousands deep and bytes that are not UTF-8 are located
  :class:`~tpusim.errors.TpusimError` s with a short first line.
* Errors that once reached the compiler (or the ISA) without a location are caught by the parser or the
  verifier and name the instruction.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tpusim
from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo import HloParseError, HloVerifyError, parse_module, print_module
from tpusim.compiler.hlo.reference import evaluate
from tpusim.errors import LayoutError, TpusimError
from tpusim.memory import parse_shape
from tpusim.memory.shape_text import MAX_RANK, MAX_TUPLE_DEPTH

BF16 = ml_dtypes.bfloat16

# --------------------------------------------------------------------------------------------------------
# Empty arrays
# --------------------------------------------------------------------------------------------------------
ADD = """
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
"""

EMPTY_PROGRAMS = {
    "elementwise": """
ENTRY main {
  a = f32[0,8] parameter(0)
  b = f32[0,8] parameter(1)
  m = f32[0,8] multiply(a, b)
  ROOT c = f32[0,8] add(m, a)
}""",
    "reduce_dim0": ADD
    + """
ENTRY main {
  a = f32[0,8] parameter(0)
  z = f32[] constant(1.5)
  ROOT r = f32[8] reduce(a, z), dimensions={0}, to_apply=add
}""",
    "reduce_all": ADD
    + """
ENTRY main {
  a = f32[0,8] parameter(0)
  z = f32[] constant(-2)
  ROOT r = f32[] reduce(a, z), dimensions={0,1}, to_apply=add
}""",
    "reduce_dim1": ADD
    + """
ENTRY main {
  a = f32[0,8] parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[0] reduce(a, z), dimensions={1}, to_apply=add
}""",
    "reduce_variadic": """
argmax {
  a = f32[] parameter(0)
  i = s32[] parameter(1)
  b = f32[] parameter(2)
  j = s32[] parameter(3)
  p = pred[] compare(a, b), direction=GE
  m = f32[] select(p, a, b)
  k = s32[] select(p, i, j)
  ROOT t = (f32[], s32[]) tuple(m, k)
}
ENTRY main {
  a = f32[0,5] parameter(0)
  i = s32[0,5] parameter(1)
  lo = f32[] constant(-inf)
  none = s32[] constant(-1)
  ROOT r = (f32[5], s32[5]) reduce(a, i, lo, none), dimensions={0}, to_apply=argmax
}""",
    "transpose": """
ENTRY main {
  a = f32[0,8] parameter(0)
  ROOT t = f32[8,0] transpose(a), dimensions={1,0}
}""",
    "broadcast": """
ENTRY main {
  a = f32[3] parameter(0)
  ROOT b = f32[0,3] broadcast(a), dimensions={1}
}""",
    "broadcast_of_empty": """
ENTRY main {
  a = f32[0] parameter(0)
  ROOT b = f32[4,0] broadcast(a), dimensions={1}
}""",
    "mixed": ADD
    + """
ENTRY main {
  a = f32[0,8] parameter(0)
  x = f32[4,8] parameter(1)
  e = f32[0,8] exponential(a)
  z = f32[] constant(0)
  r = f32[8] reduce(e, z), dimensions={0}, to_apply=add
  b = f32[4,8] broadcast(r), dimensions={1}
  ROOT s = f32[4,8] add(b, x)
}""",
    "dot_empty_contraction": """
ENTRY main {
  a = f32[4,0] parameter(0)
  b = f32[0,8] parameter(1)
  ROOT d = f32[4,8] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}""",
    "concatenate_pad": """
ENTRY main {
  a = f32[0,8] parameter(0)
  x = f32[2,8] parameter(1)
  c = f32[2,8] concatenate(a, x), dimensions={0}
  z = f32[] constant(3)
  p = f32[2,8] pad(a, z), padding=1_1x0_0
  ROOT s = f32[2,8] add(c, p)
}""",
    "reduce_window_padded": ADD  # (init 0: the reference pads with the init value, XLA skips padding)
    + """
ENTRY main {
  a = f32[0,8] parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[2,8] reduce-window(a, z), window={size=1x1 pad=1_1x0_0}, to_apply=add
}""",
    "dynamic_update_slice": """
ENTRY main {
  a = f32[4,8] parameter(0)
  u = f32[0,8] parameter(1)
  i = s32[] constant(1)
  ROOT r = f32[4,8] dynamic-update-slice(a, u, i, i)
}""",
    "while_state": """
cond {
  p = (s32[], f32[0,8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT c = pred[] compare(i, n), direction=LT
}
body {
  p = (s32[], f32[0,8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  a = f32[0,8] get-tuple-element(p), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  b = f32[0,8] add(a, a)
  ROOT t = (s32[], f32[0,8]) tuple(j, b)
}
ENTRY main {
  a = f32[0,8] parameter(0)
  z = s32[] constant(0)
  t = (s32[], f32[0,8]) tuple(z, a)
  w = (s32[], f32[0,8]) while(t), condition=cond, body=body
  ROOT r = f32[0,8] get-tuple-element(w), index=1
}""",
    "fusion": """
fused {
  p0 = f32[0,8] parameter(0)
  p1 = f32[0,8] parameter(1)
  ROOT a = f32[0,8] add(p0, p1)
}
ENTRY main {
  a = f32[0,8]{1,0} parameter(0)
  c = f32[0,8]{1,0} constant({  })
  ROOT f = f32[0,8]{1,0} fusion(a, c), kind=kLoop, calls=fused
}""",
    "tuple_result": """
ENTRY main {
  a = s32[0,8] parameter(0)
  n = s32[0,8] negate(a)
  ROOT t = (s32[0,8], s32[0,8]) tuple(a, n)
}""",
}


@pytest.mark.parametrize("timing_only", [False, True], ids=["numeric", "timing"])
@pytest.mark.parametrize("name", sorted(EMPTY_PROGRAMS))
def test_empty_arrays_run_like_the_reference(name: str, timing_only: bool) -> None:
    module = parse_module(EMPTY_PROGRAMS[name], source=f"{name}.hlo")
    rng = np.random.default_rng(0)
    inputs = []
    for p in module.entry_computation.parameters:
        shape = p.array_shape
        inputs.append(rng.standard_normal(shape.dimensions).astype(shape.element_type.dtype))
    result = tpusim.simulate(module, inputs, timing_only=timing_only)
    assert result.cycles > 0
    if timing_only:
        return
    want = evaluate(module, inputs)
    assert len(result.outputs) == len(want)
    for got, ref in zip(result.outputs, want):
        assert got.shape == ref.shape and got.dtype == ref.dtype
        np.testing.assert_array_equal(got, ref)


def test_reduce_of_empty_gives_the_initial_values() -> None:
    module = parse_module(EMPTY_PROGRAMS["reduce_dim0"])
    (out,) = tpusim.simulate(module, [np.zeros((0, 8), np.float32)]).outputs
    np.testing.assert_array_equal(out, np.full(8, 1.5, np.float32))
    (a, i) = tpusim.simulate(parse_module(EMPTY_PROGRAMS["reduce_variadic"])).outputs
    np.testing.assert_array_equal(a, np.full(5, -np.inf, np.float32))
    np.testing.assert_array_equal(i, np.full(5, -1, np.int32))


@pytest.mark.parametrize("name", ["reduce_dim0", "broadcast"])
def test_empty_arrays_on_the_command_line(tmp_path, capsys, name: str) -> None:
    from tpusim.cli import main

    path = tmp_path / f"{name}.hlo"
    path.write_text(EMPTY_PROGRAMS[name])
    assert main(["run", str(path), "--check"]) == 0
    assert " ok" in capsys.readouterr().out
    assert main(["run", str(path), "--timing-only"]) == 0


def test_empty_arrays_from_jax() -> None:
    import jax.numpy as jnp

    x = jnp.zeros((0, 8), jnp.float32)
    result = tpusim.simulate_jax(lambda x: (x.sum(0), x.T * 2, jnp.mean(x, 0)), x)
    total, flipped, mean = result.tree
    np.testing.assert_array_equal(np.asarray(total), np.zeros(8, np.float32))
    assert np.asarray(flipped).shape == (8, 0)
    assert np.isnan(np.asarray(mean)).all()  # 0 / 0, as JAX gives


# --------------------------------------------------------------------------------------------------------
# Huge integers, deep nesting, high ranks, bytes that are not UTF-8
# --------------------------------------------------------------------------------------------------------
HUGE = "9" * 5000  # Python refuses to convert more than 4300 digits
WIDE = "9" * 30  # converts, but fits no 64-bit field
ADD_TEXT = "add {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT s = f32[] add(x, y)\n}\n"

HUGE_INTEGERS = {
    "dimension": "ENTRY e {\n  ROOT p = f32[N] parameter(0)\n}",
    "two_dimensions": "ENTRY e {\n  ROOT p = f32[2,N] parameter(0)\n}",
    "parameter_number": "ENTRY e {\n  ROOT p = f32[2] parameter(N)\n}",
    "index": "ENTRY e {\n  p = (f32[2]) parameter(0)\n  ROOT g = f32[2] get-tuple-element(p), index=N\n}",
    "s32_constant": "ENTRY e {\n  ROOT c = s32[] constant(N)\n}",
    "f32_constant": "ENTRY e {\n  ROOT c = f32[2] constant({1, N})\n}",
    "dimensions": "ENTRY e {\n  p = f32[2] parameter(0)\n  ROOT b = f32[2,2] broadcast(p), dimensions={N}\n}",
    "layout": "ENTRY e {\n  ROOT p = f32[2]{N} parameter(0)\n}",
    "tile": "ENTRY e {\n  ROOT p = f32[2]{0:T(N)} parameter(0)\n}",
    "memory_space": "ENTRY e {\n  ROOT p = f32[2]{0:S(N)} parameter(0)\n}",
    "slice": "ENTRY e {\n  p = f32[2] parameter(0)\n  ROOT s = f32[1] slice(p), slice={[0:N]}\n}",
    "padding": "ENTRY e {\n  p = f32[2] parameter(0)\n  z = f32[] constant(0)\n"
    + "  ROOT s = f32[3] pad(p, z), padding=0_N\n}",
    "window": ADD_TEXT
    + "ENTRY e {\n  p = f32[2] parameter(0)\n  z = f32[] constant(0)\n"
    + "  ROOT s = f32[2] reduce-window(p, z), window={size=1xN}, to_apply=add\n}",
    "replica_count": "HloModule m, replica_count=N\nENTRY e {\n  ROOT p = f32[2] parameter(0)\n}",
    "iota_groups": "ENTRY e {\n  p = f32[2] parameter(0)\n"
    + "  ROOT s = f32[2] all-gather(p), replica_groups=[1,N]<=[N], dimensions={0}\n}",
    "channel_id": "ENTRY e {\n  p = f32[2] parameter(0)\n"
    + "  ROOT s = f32[2] collective-permute(p), source_target_pairs={{0,1}}, channel_id=N\n}",
    "source_line": "ENTRY e {\n  ROOT p = f32[2] parameter(0), metadata={source_line=N}\n}",
    "signature": "ENTRY %e (p: f32[N]) -> f32[2] {\n  ROOT p = f32[2] parameter(0)\n}",
}


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0]


@pytest.mark.parametrize("digits", [HUGE, WIDE], ids=["5000_digits", "30_digits"])
@pytest.mark.parametrize("name", sorted(HUGE_INTEGERS))
def test_huge_integers_in_hlo_are_located_errors(name: str, digits: str) -> None:
    text = HUGE_INTEGERS[name].replace("N", digits)
    with pytest.raises(HloParseError) as info:
        parse_module(text, source="big.hlo")
    err = info.value
    assert err.source == "big.hlo" and text.splitlines()[err.line - 1][err.column - 1 :].startswith("999")
    assert "does not fit in 64 bits" in err.message
    assert len(_first_line(err)) < 200


def test_integers_that_fit_64_bits_still_read() -> None:
    u64 = parse_module(f"ENTRY e {{\n  ROOT c = u64[2] constant({{{2**64 - 1}, 0}})\n}}")
    assert int(u64.entry_computation["c"].attr("literal").value[0]) == 2**64 - 1
    # long digit runs that are not integers: floats, names, strings, comments
    text = (
        'ENTRY e {\n  p.123456789012345678901234 = f32[2] parameter(0), metadata={op_name="x123456789012345678901"}\n'
        "  ROOT c = f32[3] constant({0.100000000000000005551115123125782702118, 1e-123456789012345678901,"
        " 123456789012345678901234567890.5}) /* 99999999999999999999999 */\n}"
    )
    module = parse_module(text)
    assert module.entry_computation["c"].attr("literal").value[1] == 0


def test_in_range_but_huge_values_are_errors_not_crashes() -> None:
    """Values that fit 64 bits but describe absurd sizes: located verifier/parse errors or out-of-memory."""
    big = str(2**40)
    with pytest.raises(HloParseError, match="expands at most"):
        parse_module(f"ENTRY e {{\n  p = f32[2] parameter(0)\n  ROOT s = f32[2] all-gather(p), "
                     f"replica_groups=[1,{big}]<=[{big}], dimensions={{0}}\n}}")  # fmt: skip
    with pytest.raises(HloParseError, match="expands at most"):
        parse_module(f"{ADD_TEXT}ENTRY e {{\n  p = f32[2] parameter(0)\n  ROOT s = f32[2] all-reduce(p), "
                     f"replica_groups=mesh[x={big},y={big}] {{x}}, to_apply=add\n}}")  # fmt: skip
    with pytest.raises(TpusimError, match="HBM"):
        tpusim.simulate(parse_module(f"ENTRY e {{\n  ROOT p = f32[{big},{big}] parameter(0)\n}}"), timing_only=True)


@pytest.mark.parametrize("text", [f"f32[{HUGE}]", f"f32[{WIDE}]", f"f32[2]{{0:T({HUGE})}}", f"f32[2]{{{HUGE}}}"])
def test_huge_integers_in_shape_strings(text: str) -> None:
    with pytest.raises(LayoutError, match="does not fit in 64 bits") as info:
        parse_shape(text)
    assert text[info.value.column - 1 :].startswith("999")
    assert all(len(line) < 200 for line in str(info.value).splitlines())


def test_huge_dimension_on_the_command_line(tmp_path, capsys) -> None:
    from tpusim.cli import main

    assert main(["layout", f"f32[{HUGE}]"]) == 1
    err = capsys.readouterr().err
    assert "does not fit in 64 bits" in err and "Traceback" not in err and len(err.splitlines()[0]) < 200
    path = tmp_path / "big.hlo"
    path.write_text(HUGE_INTEGERS["index"].replace("N", HUGE))
    assert main(["run", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:3:" in err.splitlines()[0] and "Traceback" not in err


def _nested(depth: int, leaf: str = "f32[2]") -> str:
    return "(" * depth + leaf + ")" * depth


def test_tuples_nested_to_the_limit_parse_print_compile_and_run() -> None:
    d = MAX_TUPLE_DEPTH - 1  # (the root's tuple adds one)
    text = (
        f"ENTRY e {{\n  p = {_nested(d)} parameter(0)\n  q = {_nested(d - 1)} get-tuple-element(p), index=0\n"
        f"  c = {_nested(d)} constant({_nested(d, '{1, 2}')})\n"
        f"  ROOT t = ({_nested(d)}, {_nested(d - 1)}, {_nested(d)}) tuple(p, q, c)\n}}"
    )
    module = parse_module(text)
    assert parse_module(print_module(module)) == module
    x: object = np.arange(2, dtype=np.float32)
    for _ in range(d):
        x = (x,)
    result = tpusim.simulate(module, [x])
    want = evaluate(module, [x])
    assert len(result.outputs) == len(want) == 3
    for got, ref in zip(result.outputs, want):
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("depth", [MAX_TUPLE_DEPTH + 1, 300, 5000, 100_000])
def test_tuples_nested_too_deep_are_located_errors(depth: int) -> None:
    with pytest.raises(LayoutError, match=f"nest more than {MAX_TUPLE_DEPTH} deep") as info:
        parse_shape(_nested(depth))
    assert info.value.column == MAX_TUPLE_DEPTH + 1
    for text in [
        f"ENTRY e {{\n  ROOT p = {_nested(depth)} parameter(0)\n}}",
        f"ENTRY e (p: {_nested(depth)}) -> f32[2] {{\n  ROOT p = f32[2] parameter(0)\n}}",
        f"HloModule m, entry_computation_layout={{({_nested(depth)})->f32[2]}}\nENTRY e {{\n"
        "  ROOT p = f32[2] parameter(0)\n}",
        f"ENTRY e {{\n  ROOT p = f32[2]{{0:P({'f32[2]{0:P(' * depth}f32[2]{')}' * depth})}} parameter(0)\n}}",
    ]:
        with pytest.raises(HloParseError, match=f"nest more than {MAX_TUPLE_DEPTH} deep") as info2:
            parse_module(text, source="deep.hlo")
        assert len(_first_line(info2.value)) < 200


def test_ranks_past_the_limit_are_located_errors() -> None:
    ones = ",".join(["1"] * (MAX_RANK + 1))
    with pytest.raises(LayoutError, match=f"more than {MAX_RANK} dimensions") as info:
        parse_shape(f"f32[{ones}]")
    assert info.value.column == len("f32[") + 2 * MAX_RANK + 1  # at the first dimension too many
    with pytest.raises(HloParseError, match=f"more than {MAX_RANK} dimensions"):
        parse_module(f"ENTRY e {{\n  ROOT p = f32[{ones}] parameter(0)\n}}")
    dims = ",".join(["1"] * MAX_RANK)
    module = parse_module(f"ENTRY e {{\n  p = f32[{dims}] parameter(0)\n  ROOT n = f32[{dims}] negate(p)\n}}")
    (out,) = tpusim.simulate(module, [np.ones((1,) * MAX_RANK, np.float32)]).outputs
    assert out.shape == (1,) * MAX_RANK and out.ravel()[0] == -1


@pytest.mark.parametrize(
    ("data", "offset", "line", "column"),
    [
        (b"HloModule m\nENTRY e {\n  ROOT p = f32[2] parameter(0) // caf\xe9\n}\n", 59, 3, 38),
        (
            b"HloModule m // \xc3\xa9t\xc3\xa9\nENTRY e {\n  ROOT p = f32[2] parameter(0) // \xc3\xa9\xff\n}\n",
            67,
            3,
            37,
        ),
        (b"\x08\x00\x12\x05hello\x9f\x1b[31m", 9, 1, 10),
    ],
)
def test_files_that_are_not_utf8(tmp_path, data: bytes, offset: int, line: int, column: int) -> None:
    path = tmp_path / "bad.hlo"
    path.write_bytes(data)
    with pytest.raises(HloParseError) as info:
        tpusim.compiler.hlo.load_module(path)
    err = info.value
    assert err.source == str(path) and err.line == line
    assert err.column == column - (1 if b"\xc3\xa9\xff" in data else 0)  # (characters, not bytes)
    assert f"byte offset {offset} (line {line}, byte {column} of the line) is not UTF-8" in err.message
    assert "\x1b" not in str(err) and "\x00" not in str(err)  # the snippet does not drive the terminal


def test_non_utf8_file_on_the_command_line(tmp_path) -> None:
    import subprocess
    import sys

    path = tmp_path / "latin1.hlo"
    path.write_bytes(b"HloModule m\nENTRY e {\n  ROOT p = f32[2] parameter(0) // caf\xe9\n}\n")
    cli = "import sys; from tpusim.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", cli, "run", str(path)], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.startswith(f"tpusim run: HLO parse error at {path}:3:38: byte 0xe9 at byte offset 59")
    assert "Traceback" not in done.stderr


# --------------------------------------------------------------------------------------------------------
# Errors that once reached the compiler or the ISA without a location
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shape", "what"),
    [
        ("f32[10]{0:D(C)}", "sparse layout"),
        ("f32[10,4]{1,0:D(D,C)#(u32)*(u32)}", "sparse layout"),
        ("f32[<=10]", "dynamic dimensions"),
        ("f32[?]", "dynamic dimensions"),
    ],
)
def test_shapes_the_compiler_cannot_lay_out_name_the_instruction(shape: str, what: str) -> None:
    text = f"ENTRY e {{\n  p = {shape} parameter(0)\n  ROOT n = {shape} negate(p)\n}}"
    module = parse_module(text, source="sparse.hlo")
    with pytest.raises(CompileError, match=what) as info:
        tpusim.simulate(module, timing_only=True)
    assert _first_line(info.value).startswith("e/p (sparse.hlo:2): shape ")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("ROOT c = s32[4] add(a, b)", r"result s32\[4\] should be f32\[4\] \(add of f32\[4\] and f32\[4\]\)"),
        ("ROOT c = pred[4] multiply(a, b)", r"result pred\[4\] should be f32\[4\]"),
        ("ROOT c = s32[4] negate(a)", r"result s32\[4\] should be f32\[4\]"),
        ("ROOT c = pred[4] compare(a, b), direction=XX", "direction=XX is not a comparison direction"),
        ("ROOT c = pred[4] compare(a, b), direction=lt", "direction=lt is not a comparison direction"),
        ("ROOT c = pred[4] compare(a, b), direction=LT, type=FOO", "type=FOO is not a comparison type"),
        ("ROOT c = pred[4] compare(a, b), direction=LT, type=SIGNED", "type=SIGNED does not compare f32 values"),
        ("ROOT c = pred[4] compare(i, i), direction=LT, type=FLOAT", "type=FLOAT does not compare s32 values"),
        ("ROOT c = pred[4] compare(i, i), direction=LT, type=UNSIGNED", "type=UNSIGNED does not compare s32"),
    ],
)
def test_the_verifier_catches_inconsistent_instructions(line: str, message: str) -> None:
    text = f"ENTRY e {{\n  a = f32[4] parameter(0)\n  b = f32[4] parameter(1)\n  i = s32[4] parameter(2)\n  {line}\n}}"
    with pytest.raises(HloVerifyError, match=message) as info:
        parse_module(text, source="v.hlo")
    assert "computation e, instruction %c (v.hlo:5)" in _first_line(info.value)


def test_valid_compare_types_still_verify() -> None:
    for operand, ctype in [("f32", "TOTALORDER"), ("f32", "FLOAT"), ("s32", "SIGNED"), ("u8", "UNSIGNED")]:
        parse_module(
            f"ENTRY e {{\n  a = {operand}[4] parameter(0)\n"
            f"  ROOT c = pred[4] compare(a, a), direction=LT, type={ctype}\n}}"
        )
    parse_module(
        "ENTRY e {\n  a = pred[4] parameter(0)\n  ROOT c = pred[4] compare(a, a), direction=EQ, type=UNSIGNED\n}"
    )


@pytest.mark.parametrize(
    ("signature", "message", "column"),
    [
        ("(p: f32[8]) -> f32[4]", r"declares parameter p as f32\[8\] but parameter\(0\) %p has shape f32\[4\]", 11),
        ("(p: s32[4]) -> f32[4]", r"declares parameter p as s32\[4\]", 11),
        ("(p: f32[4], q: f32[4]) -> f32[4]", r"declares 2 parameter\(s\) \(p, q\) but has 1 parameter instruction", 10),
        ("() -> f32[4]", r"declares 0 parameter\(s\) \(none\) but has 1", 10),
    ],
)
def test_signature_parameters_must_match_the_parameters(signature: str, message: str, column: int) -> None:
    text = f"ENTRY %e {signature} {{\n  ROOT p = f32[4] parameter(0)\n}}"
    with pytest.raises(HloParseError, match=message) as info:
        parse_module(text, source="sig.hlo")
    assert (info.value.line, info.value.column) == (1, column)


def test_signatures_that_match_still_parse() -> None:
    parse_module(
        "ENTRY %e (x: f32[4,2]{0,1}) -> f32[4,2] {\n  ROOT p = f32[4,2]{1,0} parameter(0)\n}"
    )  # names, layouts
    with pytest.raises(HloParseError, match=r"computation add declares parameter y as s32\[\]"):
        parse_module(
            "add (x: f32[], y: s32[]) -> f32[] {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n"
            "  ROOT s = f32[] add(x, y)\n}\nENTRY e {\n  a = f32[4] parameter(0)\n  z = f32[] constant(0)\n"
            "  ROOT r = f32[] reduce(a, z), dimensions={0}, to_apply=add\n}"
        )


MIXED = [
    ("add", "f32", "f32", "bf16"),
    ("multiply", "bf16", "f32", "f32"),
    ("maximum", "f16", "bf16", "f32"),
    ("divide", "bf16", "bf16", "f16"),
    ("add", "f16", "f16", "f32"),
    ("exponential", "f32", None, "bf16"),
    ("negate", "bf16", None, "f32"),
    ("tanh", "f16", None, "bf16"),
    ("compare", "f32", "bf16", "pred"),
]


@pytest.mark.parametrize(("op", "a", "b", "result"), MIXED)
def test_mixed_precision_runs_like_the_reference(op: str, a: str, b: str | None, result: str) -> None:
    """XLA accepts mixed floating-point types (allow_mixed_precision): the device once stopped at an ISA
    check ("vpu.add of f32 operands gives f32, not bf16"); the compiler now converts explicitly."""
    params = f"  x = {a}[8,128] parameter(0)\n" + (f"  y = {b}[8,128] parameter(1)\n" if b else "")
    extra = ", direction=LT" if op == "compare" else ""
    text = f"ENTRY e {{\n{params}  ROOT c = {result}[8,128] {op}(x{', y' if b else ''}){extra}\n}}"
    module = parse_module(text)
    rng = np.random.default_rng(1)
    inputs = [
        rng.standard_normal((8, 128)).astype(p.array_shape.element_type.dtype)
        for p in module.entry_computation.parameters
    ]
    (got,) = tpusim.simulate(module, inputs).outputs
    (want,) = evaluate(module, inputs)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_mixed_precision_movement_and_reductions_run() -> None:
    """Copies, transposes, pads and reductions with a result type of their own run on the device and in the
    reference interpreter (which once stopped at them with "returned a wrong value"), equal bit for bit."""
    text = (
        ADD_TEXT.replace("f32", "bf16")
        + "ENTRY e {\n  x = f32[8,128] parameter(0)\n  t = bf16[128,8] transpose(x), dimensions={1,0}\n"
        "  z = bf16[] constant(0)\n  r = bf16[8] reduce(x, z), dimensions={1}, to_apply=add\n"
        "  y = f32[] constant(0)\n  p = bf16[10,128] pad(x, y), padding=1_1x0_0\n"
        "  ROOT o = (bf16[128,8], bf16[8], bf16[10,128]) tuple(t, r, p)\n}"
    )
    x = np.random.default_rng(2).standard_normal((8, 128)).astype(np.float32)
    module = parse_module(text)
    t, r, p = tpusim.simulate(module, [x]).outputs
    np.testing.assert_array_equal(t, x.T.astype(t.dtype))
    np.testing.assert_allclose(r.astype(np.float32), x.astype(r.dtype).astype(np.float32).sum(1), rtol=2e-2, atol=0.1)
    np.testing.assert_array_equal(p[1:9], x.astype(p.dtype))
    assert not p[0].any() and not p[9].any()
    for got, want in zip((t, r, p), evaluate(module, [x])):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


# XLA verifies with allow_mixed_precision on the backends whose passes write such HLO (BFloat16Propagation);
# its ShapeVerifier::CheckShape then lets an instruction define its result in another floating-point type
# than its operands give, except for the opcodes it compares with ShapesSame. The meaning (XLA's
# FloatNormalization): the operation on the operands' values, then one convert to the declared type; a
# reduction reads its elements in its init value's type. Each form: (body, expected value from x and y).
BF16_ADD = "addb {\n  a = bf16[] parameter(0)\n  b = bf16[] parameter(1)\n  ROOT s = bf16[] add(a, b)\n}\n"
MIXED_FORMS = {
    "copy": ("  ROOT r = f16[8,128] copy(x)", lambda x, y: x.astype(np.float16)),
    "transpose": ("  ROOT r = f16[128,8] transpose(x), dimensions={1,0}", lambda x, y: x.T.astype(np.float16)),
    "slice": ("  ROOT r = f16[4,64] slice(x), slice={[2:6], [64:128]}", lambda x, y: x[2:6, 64:].astype(np.float16)),
    "pad": (
        "  z = f32[] constant(0.1)\n  ROOT r = f16[10,128] pad(x, z), padding=1_1x0_0",
        lambda x, y: np.pad(x, ((1, 1), (0, 0)), constant_values=np.float32(0.1)).astype(np.float16),
    ),
    "pad_value_wider_than_the_operand": (
        "  b = bf16[8,128] convert(x)\n  z = f32[] constant(0.1)\n  ROOT r = f32[10,128] pad(b, z), padding=1_1x0_0",
        lambda x, y: np.pad(x.astype(BF16).astype(np.float32), ((1, 1), (0, 0)), constant_values=np.float32(0.1)),
    ),
    "broadcast": (
        "  b = bf16[8,128] convert(x)\n  ROOT r = f32[2,8,128] broadcast(b), dimensions={1,2}",
        lambda x, y: np.broadcast_to(x.astype(BF16).astype(np.float32), (2, 8, 128)),
    ),
    "reshape": ("  ROOT r = bf16[1024] reshape(x)", lambda x, y: x.reshape(1024).astype(BF16)),
    "concatenate": (
        "  b = bf16[8,128] convert(y)\n  ROOT r = f32[16,128] concatenate(x, b), dimensions={0}",
        lambda x, y: np.concatenate([x, y.astype(BF16).astype(np.float32)]),
    ),
    "reverse": ("  ROOT r = f16[8,128] reverse(x), dimensions={0}", lambda x, y: x[::-1].astype(np.float16)),
    "dynamic_slice": (
        "  i = s32[] constant(3)\n  j = s32[] constant(0)\n"
        "  ROOT r = f16[2,128] dynamic-slice(x, i, j), dynamic_slice_sizes={2,128}",
        lambda x, y: x[3:5].astype(np.float16),
    ),
    "dynamic_update_slice_of_a_bf16_update": (
        "  v = f32[2,128] slice(y), slice={[0:2], [0:128]}\n  u = bf16[2,128] convert(v)\n"
        "  i = s32[] constant(5)\n  j = s32[] constant(0)\n"
        "  ROOT r = f32[8,128] dynamic-update-slice(x, u, i, j)",
        lambda x, y: np.concatenate([x[:5], y[:2].astype(BF16).astype(np.float32), x[7:]]),
    ),
    "select": (
        "  c = pred[8,128] compare(x, y), direction=GT\n  b = bf16[8,128] convert(y)\n"
        "  ROOT r = f16[8,128] select(c, x, b)",
        lambda x, y: np.where(x > y, x, y.astype(BF16).astype(np.float32)).astype(np.float16),
    ),
    "reduce_in_the_init_type": (
        "  z = bf16[] constant(0)\n  ROOT r = f16[8] reduce(x, z), dimensions={1}, to_apply=addb",
        lambda x, y: x.astype(BF16).astype(np.float32).sum(1).astype(BF16).astype(np.float16),
    ),
    "reduce_window_in_the_init_type": (
        "  z = bf16[] constant(0)\n"
        "  ROOT r = bf16[8,64] reduce-window(x, z), window={size=1x2 stride=1x2}, to_apply=addb",
        lambda x, y: x.astype(BF16).astype(np.float32).reshape(8, 64, 2).sum(2).astype(BF16),
    ),
    "reduce_precision": (
        "  ROOT r = f16[8,128] reduce-precision(x), exponent_bits=5, mantissa_bits=2",
        None,
    ),
    "add_dependency": (
        "  a = token[] after-all()\n  ROOT r = f16[8,128] add-dependency(x, a)",
        lambda x, y: x.astype(np.float16),
    ),
}


@pytest.mark.parametrize("name", sorted(MIXED_FORMS))
def test_mixed_precision_forms_run_alike_on_the_device_and_in_the_reference(name: str) -> None:
    body, expect = MIXED_FORMS[name]
    text = BF16_ADD + "ENTRY e {\n  x = f32[8,128] parameter(0)\n  y = f32[8,128] parameter(1)\n" + body + "\n}"
    module = parse_module(text)
    rng = np.random.default_rng(7)
    x, y = (rng.standard_normal((8, 128)).astype(np.float32) * 3 for _ in range(2))
    (want,) = evaluate(module, [x, y])
    result = tpusim.simulate(module, [x, y], config="teaching")
    (got,) = result.outputs
    assert not result.fallbacks, result.fallbacks
    assert got.dtype == want.dtype == module.entry_computation.root_instruction.shape.element_type.dtype
    bits = np.dtype(f"u{got.dtype.itemsize}")
    np.testing.assert_array_equal(got.view(bits), want.view(bits))
    if expect is not None:
        np.testing.assert_array_equal(want.view(bits), np.asarray(expect(x, y), want.dtype).view(bits))


WHILE_STATE = (
    "cond {\n  p = (s32[], f32[4]) parameter(0)\n  i = s32[] get-tuple-element(p), index=0\n"
    "  n = s32[] constant(2)\n  ROOT c = pred[] compare(i, n), direction=LT\n}\n"
    "body {\n  p = (s32[], BODY[4]) parameter(0)\n  i = s32[] get-tuple-element(p), index=0\n"
    "  one = s32[] constant(1)\n  j = s32[] add(i, one)\n  x = BODY[4] get-tuple-element(p), index=1\n"
    "  ROOT t = (s32[], BODY[4]) tuple(j, x)\n}\n"
)
NEG = "neg {\n  p = PARAM[4] parameter(0)\n  ROOT n = PARAM[4] negate(p)\n}\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ENTRY e {\n  x = f32[4] parameter(0)\n  ROOT t = (f16[4]) tuple(x)\n}", r"a tuple holds its operands"),
        (
            "ENTRY e {\n  x = f32[4] parameter(0)\n  t = (f32[4]) tuple(x)\n"
            "  ROOT g = bf16[4] get-tuple-element(t), index=0\n}",
            r"element 0 of \(f32\[4\]\)",
        ),
        (
            "ENTRY e {\n  x = f32[4] parameter(0)\n  u = f32[2] parameter(1)\n  i = s32[] constant(1)\n"
            "  ROOT r = f16[4] dynamic-update-slice(x, u, i)\n}",
            r"dynamic-update-slice keeps the shape of f32\[4\]",
        ),
        (
            NEG.replace("PARAM", "f32")
            + "ENTRY e {\n  x = f32[4] parameter(0)\n  ROOT r = bf16[4] call(x), to_apply=neg\n}",
            r"computation neg returns f32\[4\], expected bf16\[4\]",
        ),
        (
            NEG.replace("PARAM", "bf16")
            + "ENTRY e {\n  x = f32[4] parameter(0)\n  ROOT r = bf16[4] call(x), to_apply=neg\n}",
            r"parameter 0 of the call's computation neg is bf16\[4\], expected f32\[4\]",
        ),
        (
            WHILE_STATE.replace("BODY", "bf16") + "ENTRY e {\n  x = f32[4] parameter(0)\n  z = s32[] constant(0)\n"
            "  t = (s32[], f32[4]) tuple(z, x)\n  ROOT w = (s32[], f32[4]) while(t), condition=cond, body=body\n}",
            r"parameter 0 of the body computation body is \(s32\[\], bf16\[4\]\), expected \(s32\[\], f32\[4\]\)",
        ),
        (
            WHILE_STATE.replace("BODY", "f32") + "ENTRY e {\n  x = f32[4] parameter(0)\n  z = s32[] constant(0)\n"
            "  t = (s32[], f32[4]) tuple(z, x)\n  ROOT w = (s32[], f16[4]) while(t), condition=cond, body=body\n}",
            r"while returns its loop state",
        ),
        (
            NEG.replace("PARAM", "f32") + "ENTRY e {\n  b = pred[] parameter(0)\n  x = f32[4] parameter(1)\n"
            "  ROOT r = bf16[4] conditional(b, x, x), true_computation=neg, false_computation=neg\n}",
            r"branch 0 computation neg returns f32\[4\], expected bf16\[4\]",
        ),
    ],
    ids=[
        "tuple",
        "get_tuple_element",
        "dynamic_update_slice",
        "call_result",
        "call_parameter",
        "while_body",
        "while_result",
        "conditional",
    ],
)
def test_no_change_of_precision_where_xla_forbids_it(text: str, message: str) -> None:
    """XLA's verifier compares these results (and a call's, while's or conditional's operands with the called
    computation's parameters) with ShapesSame, also under allow_mixed_precision: a located verifier error
    for both paths. The device once returned float32 outputs for a bf16 call, and the reference stopped
    mid-run."""
    with pytest.raises(HloVerifyError, match=message):
        parse_module(text)


@pytest.mark.parametrize(
    "text",
    [
        "ENTRY e {\n  p = f32[10]{0:D(C)} parameter(0)\n  ROOT n = f32[10]{0:D(C)} negate(p)\n}",
        "ENTRY e {\n  a = f32[4] parameter(0)\n  ROOT c = pred[4] compare(a, a), direction=XX\n}",
        "ENTRY %e (p: f32[8]) -> f32[4] {\n  ROOT p = f32[4] parameter(0)\n}",
        f"ENTRY e {{\n  ROOT p = {_nested(5000)} parameter(0)\n}}",
        f"ENTRY e {{\n  ROOT p = f32[{HUGE}] parameter(0)\n}}",
    ],
    ids=["sparse", "direction", "signature", "deep_tuple", "huge_dimension"],
)
def test_bad_programs_on_the_command_line(tmp_path, capsys, text: str) -> None:
    """Exit code 1, one short first line naming the file (or the instruction), no traceback."""
    from tpusim.cli import main

    path = tmp_path / "bad.hlo"
    path.write_text(text)
    assert main(["run", str(path), "--check"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tpusim run: ") and "Traceback" not in err
    first = err.splitlines()[0]
    assert len(first) < 300 and ("bad.hlo" in first or "e/p" in first)


def test_a_wrong_dtype_from_same_typed_operands_is_still_reported() -> None:
    """The reference's mixed-precision rounding applies only when a floating-point operand has another type
    than the declared result: an op function that returns f32 for bf16 operands is a bug, reported."""
    from tpusim.compiler.hlo.reference.core import mixed_precision_result

    module = parse_module("ENTRY e {\n  x = bf16[4] parameter(0)\n  ROOT r = bf16[4] negate(x)\n}")
    instr = module.entry_computation.root_instruction
    x = np.ones(4, ml_dtypes.bfloat16)
    assert mixed_precision_result(instr, [x], np.ones(4, np.float32)) is None
    assert mixed_precision_result(instr, [x.astype(np.float32)], np.ones(4, np.float32)).dtype == x.dtype
