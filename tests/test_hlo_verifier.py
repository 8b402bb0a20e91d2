"""HLO verifier: real modules pass; each broken rule gives an HloVerifyError naming the computation, the
instruction, the rule and the shapes involved."""

from __future__ import annotations

import re
from dataclasses import replace

import hlo_corpus as hc
import pytest

from tpusim.compiler.hlo import HloVerifyError, parse_module, verify_module
from tpusim.compiler.hlo.ir import Attributes, Computation, Instruction, Module
from tpusim.compiler.hlo.opcodes import OPCODES
from tpusim.compiler.hlo.shape_rules import SHAPE_RULES
from tpusim.errors import TpusimError
from tpusim.memory import Shape


@pytest.mark.parametrize(("key", "text"), hc.corpus(), ids=[k for k, _ in hc.corpus()])
def test_real_modules_verify(key, text):
    verify_module(parse_module(text, verify=False))


def test_opcode_table_covers_xla():
    """Every opcode of the installed XLA (jaxlib's HloOpcode enum) is in the table, and the table's
    spellings follow hlo_opcode.h (the enum names are kCamelCase of the printed names)."""
    from jax._src.lib import xla_client

    def camel(name: str) -> str:
        return "k" + "".join(part.capitalize() for part in name.split("-"))

    renamed = {  # enum name -> printed name where the spelling is not the camel case (hlo_opcode.h)
        "kClz": "count-leading-zeros",
        "kCos": "cosine",
        "kSin": "sine",
        "kExp": "exponential",
        "kExpm1": "exponential-minus-one",
        "kLog1p": "log-plus-one",
        "kOptimizationBarrier": "opt-barrier",
        "kPopulationCount": "popcnt",
        "kTopK": "topk",
        "kAtan2": "atan2",
        "kMulhi": "mulhi",
    }
    table = {camel(n): n for n in OPCODES}
    for enum_name in xla_client.hlo.HloOpcode.__members__:
        printed = renamed.get(enum_name) or table.get(enum_name)
        assert printed in OPCODES, enum_name
    assert len(OPCODES) >= len(xla_client.hlo.HloOpcode.__members__)


def test_shape_rules_cover_the_common_opcodes():
    without = sorted(set(OPCODES) - set(SHAPE_RULES))
    # Opcodes whose result depends on data or configuration the text does not carry.
    assert without == sorted(
        [
            "custom-call",
            "parameter",
            "scan",
            "ragged-dot",
            "collective-reduce",
            "shuffle",
        ]
    )


ADD = "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] add(a, b)\n}\n"
LESS = "less {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = pred[] compare(a, b), direction=LT\n}\n"


def _fails(body: str, message: str, computations: str = ADD) -> HloVerifyError:
    text = f"HloModule m\n{computations}ENTRY main {{\n{body}\n}}\n"
    with pytest.raises(HloVerifyError) as info:
        parse_module(text, "m.hlo")
    assert re.search(message, str(info.value)), str(info.value)
    return info.value


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            " x = f32[4] parameter(0)\n y = f32[5] parameter(1)\n ROOT r = f32[4] add(x, y)",
            r"instruction %r \(m.hlo:\d+\): add needs operands of one shape, found f32\[4\] and f32\[5\]",
        ),
        (
            " x = f32[4] parameter(0)\n ROOT r = f32[4] compare(x, x), direction=LT",
            r"result f32\[4\] should be pred\[4\] \(compare of f32\[4\] and f32\[4\] gives pred\)",
        ),
        (
            " x = f32[2,3] parameter(0)\n y = f32[3,5] parameter(1)\n ROOT r = f32[2,3] dot(x, y), "
            "lhs_contracting_dims={1}, rhs_contracting_dims={0}",
            r"result f32\[2,3\] should have dimensions \[2,5\] \(dot of lhs f32\[2,3\] and rhs f32\[3,5\]",
        ),
        (
            " x = f32[2,3] parameter(0)\n y = f32[4,5] parameter(1)\n ROOT r = f32[2,5] dot(x, y), "
            "lhs_contracting_dims={1}, rhs_contracting_dims={0}",
            r"contracting dimension 1 of lhs f32\[2,3\] and 0 of rhs f32\[4,5\] have different sizes",
        ),
        (
            " x = f32[1,8,8,3] parameter(0)\n k = f32[3,3,4,8] parameter(1)\n ROOT c = f32[1,6,6,8] "
            "convolution(x, k), window={size=3x3}, dim_labels=b01f_01io->b01f",
            r"input features 3 of f32\[1,8,8,3\] != kernel input features 4 x feature_group_count 1",
        ),
        (
            " x = f32[1,8,8,3] parameter(0)\n k = f32[3,3,3,8] parameter(1)\n ROOT c = f32[1,8,8,8] "
            "convolution(x, k), window={size=3x3}, dim_labels=b01f_01io->b01f",
            r"should have dimensions \[1,6,6,8\] \(convolution of f32\[1,8,8,3\] with f32\[3,3,3,8\]\)",
        ),
        (
            " x = f32[4] parameter(0)\n z = f32[] constant(0)\n ROOT r = f32[] reduce(x, z), dimensions={0}, "
            "to_apply=less",
            r"the to_apply computation less returns pred\[\], expected f32\[\]",
        ),
        (
            " x = f32[4] parameter(0)\n z = f32[] constant(0)\n ROOT r = f32[4] reduce(x, z), dimensions={}, "
            "to_apply=neg",
            r"parameter 0 of the to_apply computation neg is f32\[4\], expected f32\[\]|should take 2 parameters",
        ),
        (
            " x = f32[2] parameter(0)\n ROOT w = f32[2] while(x), condition=neg, body=neg",
            r"the condition computation neg returns f32\[2\], expected pred\[\]",
        ),
        (
            " i = s32[] parameter(0)\n x = f32[2] parameter(1)\n ROOT c = f32[2] conditional(i, x, x), "
            "branch_computations={neg}",
            r"1 branches need 1 branch operands, found 2",
        ),
        (
            " x = f32[2] parameter(0)\n ROOT c = f32[3] call(x), to_apply=neg",
            r"the call's computation neg returns f32\[2\], expected f32\[3\]",
        ),
        (
            " x = f32[2] parameter(0)\n ROOT c = f32[2] fusion(x, x), kind=kLoop, calls=neg",
            r"the fusion's computation neg should take 2 parameters, it takes 1",
        ),
        (
            " x = f32[3] parameter(0)\n ROOT b = f32[2,3] broadcast(x), dimensions={0}",
            r"operand dimension 0 of f32\[3\] maps to result dimension 0 of f32\[2,3\]: sizes differ",
        ),
        (
            " x = f32[3,2] parameter(0)\n ROOT b = f32[2,3] broadcast(x), dimensions={1,0}",
            r"broadcast dimensions=\[1, 0\] must be increasing",
        ),
        (
            " x = f32[2,3] parameter(0)\n ROOT t = f32[3,2] transpose(x), dimensions={0,0}",
            r"dimensions=\[0, 0\] is not a permutation of the 2 dimensions of f32\[2,3\]",
        ),
        (
            " x = f32[4] parameter(0)\n ROOT s = f32[2] slice(x), slice={[3:5]}",
            r"slice range \[3:5:1\] does not fit dimension 0 \(size 4\) of f32\[4\]",
        ),
        (
            " x = f32[10,4] parameter(0)\n i = s32[3] parameter(1)\n ROOT g = f32[3,4] gather(x, i), offset_dims={}, "
            "collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,4}",
            r"offset_dims=\[\] should list 1 dimensions",
        ),
        (
            " x = (f32[], s32[]) parameter(0)\n ROOT g = f32[] get-tuple-element(x), index=2",
            r"index=2 is out of range for the 2-element tuple \(f32\[\], s32\[\]\)",
        ),
        (
            " x = f32[4] parameter(0)\n ROOT s = f32[4] sort(x), dimensions={0}, to_apply=add",
            r"the comparator computation add returns f32\[\], expected pred\[\]",
        ),
        (
            " x = f32[4] parameter(0)\n ROOT g = f32[12] all-gather(x), replica_groups={{0,1}}, dimensions={0}",
            r"all-gather of f32\[4\] over groups of 2 should give dimensions \[8\], found f32\[12\]",
        ),
        (
            " x = f32[4] parameter(0)\n ROOT g = f32[3] reduce-scatter(x), replica_groups=[1,4]<=[4], "
            "dimensions={0}, to_apply=add",
            r"reduce-scatter of f32\[4\] over groups of 4 should give dimensions \[1\], found f32\[3\]",
        ),
        (
            " x = f32[4] parameter(0)\n z = f32[] constant(0)\n ROOT p = f32[7] pad(x, z), padding=1_1_1",
            r"result f32\[7\] should be f32\[9\] \(pad of f32\[4\]\)",
        ),
        (
            " x = f32[4] parameter(0)\n y = f32[2,2] parameter(1)\n ROOT c = f32[6] concatenate(x, y), dimensions={0}",
            r"cannot concatenate f32\[4\] and f32\[2,2\] along dimension 0",
        ),
        (
            " p = s32[4] parameter(0)\n x = f32[4] parameter(1)\n ROOT s = f32[4] select(p, x, x)",
            r"the predicate of select must be pred, not s32\[4\]",
        ),
        (
            " x = f32[4] parameter(0)\n ROOT b = u8[4] bitcast-convert(x)",
            r"should have dimensions \[4,4\] \(bitcast-convert of f32\[4\] to u8\)",
        ),
        (
            " x = f32[8] parameter(0)\n ROOT f = c64[8] fft(x), fft_type=RFFT, fft_length={8}",
            r"should have dimensions \[5\] \(RFFT of f32\[8\]\)",
        ),
        (
            " x = f32[8] parameter(0)\n z = f32[] constant(0)\n ROOT w = f32[8] reduce-window(x, z), "
            "window={size=3 stride=2}, to_apply=add",
            r"result f32\[8\] should be f32\[3\] \(reduce-window of f32\[8\]\)",
        ),
        (
            " x = f32[8] parameter(0)\n s = f32[4] parameter(1)\n z = f32[] constant(0)\n ROOT w = f32[8] "
            "select-and-scatter(x, s, z), window={size=3 stride=2}, select=less, scatter=add",
            r"source f32\[4\] should have the window count \[3\] of f32\[8\]",
        ),
        (
            " x = f32[2] parameter(0)\n ROOT t = (f32[2], s32[]) tuple(x, x)",
            r"result \(f32\[2\], s32\[\]\) should be \(f32\[2\], f32\[2\]\) \(a tuple holds its operands\)",
        ),
        (" ROOT i = s32[4] iota(), iota_dimension=1", r"iota_dimension=1 is not a dimension of s32\[4\]"),
        (
            " x = f32[4] parameter(0)\n ROOT r = f32[2,3] reshape(x)",
            r"reshape from f32\[4\] to f32\[2,3\] must keep the element count and type",
        ),
        (" x = f32[4] parameter(0)\n ROOT n = s32[4] negate(x)", r"result s32\[4\] should be f32\[4\] \(negate of"),
        (" x = c64[4] parameter(0)\n ROOT n = c64[4] abs(x)", r"result c64\[4\] should be f32\[4\] \(abs of c64"),
        (
            " x = f32[4] parameter(0)\n s = f32[] parameter(1)\n ROOT d = f32[4] dynamic-slice(x, s, s), "
            "dynamic_slice_sizes={2}",
            r"dynamic-slice of a rank-1 operand needs 1 scalar start indices, found 2",
        ),
        (
            " x = f32[4,4] parameter(0)\n ROOT t = (f32[4,3], s32[4,3]) topk(x), k=2",
            r"should be \(f32\[4,2\], s32\[4,2\]\) \(top-2 of f32\[4,4\]\)",
        ),
        (
            " x = f32[4,4] parameter(0)\n ROOT t = f32[4,4] triangular-solve(x, x), left_side=true, lower=true, "
            "transpose_a=NO_TRANSPOSE\n y = f32[4,3] parameter(1)\n z = f32[4,4] triangular-solve(y, x)",
            r"triangular-solve needs square matrices a f32\[4,3\]",
        ),
        # dimension maps out of range, which passed verification and failed inside a fallback kernel (a
        # helper's sweep of the CLI)
        (
            " x = f32[8,128] parameter(0)\n i = s32[4,1] parameter(1)\n ROOT g = f32[4,128] gather(x, i), "
            "offset_dims={1}, collapsed_slice_dims={0}, start_index_map={5}, index_vector_dim=1, slice_sizes={1,128}",
            r"start_index_map \[5\] has 5, which is not a dimension of the rank-2 operand f32\[8,128\]",
        ),
        (
            " x = f32[8,128] parameter(0)\n i = s32[4,1] parameter(1)\n u = f32[4,128] parameter(2)\n ROOT s = "
            "f32[8,128] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0}, "
            "scatter_dims_to_operand_dims={7}, index_vector_dim=1, to_apply=add",
            r"scatter_dims_to_operand_dims \[7\] has 7, which is not a dimension of the rank-2 operand",
        ),
        (
            " x = c64[8,128] parameter(0)\n ROOT f = c64[8,128] fft(x), fft_type=FFT, fft_length={64}",
            r"FFT of c64\[8,128\] needs its last dimensions to be fft_length=\[64\]",
        ),
        (
            " x = f32[8,128] parameter(0)\n ROOT g = f32[8,128] all-gather(x), dimensions={5}",
            r"dimensions \[5\] has 5, which is not a dimension of the rank-2 operand f32\[8,128\]",
        ),
    ],
)
def test_broken_rules(body, message):
    neg = "neg {\n a = f32[2] parameter(0)\n ROOT n = f32[2] negate(a)\n}\n"
    err = _fails(body, message, ADD + LESS + neg)
    assert err.computation == "main" and err.instruction is not None


# ---------------------------------------------------------------------------------------------
# Structural rules, on modules built in Python (the parser already refuses most of these in text)
# ---------------------------------------------------------------------------------------------
F = Shape("f32", (2,))


def _param(name, n):
    return Instruction(name, "parameter", F, (), Attributes({"parameter_number": n}))


def _module(*instructions, root=None, extra=()):
    main = Computation("main", tuple(instructions), root or instructions[-1].name, is_entry=True)
    return Module("m", (*extra, main), "main")


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (_module(_param("p", 0), Instruction("n", "negate", F, ("q",))), r"operand %q is defined nowhere"),
        (
            _module(_param("p", 0), Instruction("n", "negate", F, ("m",)), Instruction("m", "negate", F, ("p",))),
            r"instruction %n: operand %m is defined after its use; operands must be defined before use",
        ),
        (_module(_param("p", 0), Instruction("n", "frobnicate", F, ("p",))), r"unknown opcode 'frobnicate'"),
        (_module(_param("p", 0), Instruction("n", "add", F, ("p",))), r"add takes 2 operands, found 1"),
        (
            _module(_param("p", 0), Instruction("n", "transpose", F, ("p",))),
            r"transpose needs attribute\(s\) dimensions",
        ),
        (_module(_param("p", 0), _param("q", 2)), r"parameter numbers are \[0, 2\], they must be 0..1"),
        (_module(_param("p", 0), _param("p", 1)), r"instruction %p is defined twice"),
        (_module(_param("p", 0), root="x"), r"the root %x is not an instruction of the computation"),
        (
            _module(
                _param("p", 0),
                Instruction("n", "negate", F, ("p",), Attributes({"control-predecessors": ("late",)})),
                Instruction("late", "negate", F, ("p",)),
            ),
            r"control predecessor %late is not defined before %n",
        ),
        (
            _module(_param("p", 0), Instruction("c", "call", F, ("p",), Attributes({"to_apply": "nowhere"}))),
            r"calls computation nowhere, which does not exist",
        ),
        (
            _module(
                _param("p", 0),
                Instruction("c", "async-start", F, ("p",), Attributes({"async_wrapped_opcode": "nonsense"})),
            ),
            r"async_wrapped_opcode='nonsense' is not an opcode an async op can wrap",
        ),
    ],
)
def test_structural_rules(module, message):
    with pytest.raises(HloVerifyError, match=message) as info:
        verify_module(module)
    assert isinstance(info.value, TpusimError)


def test_module_level_rules():
    ok = _module(_param("p", 0))
    with pytest.raises(HloVerifyError, match=r"the entry computation nothing does not exist"):
        verify_module(replace(ok, entry="nothing"))
    twice = Module("m", (ok.computations[0], ok.computations[0]), "main")
    with pytest.raises(HloVerifyError, match=r"computation main is defined more than once"):
        verify_module(twice)
    not_marked = Module("m", (replace(ok.computations[0], is_entry=False),), "main")
    with pytest.raises(HloVerifyError, match=r"exactly main should be marked ENTRY, found none"):
        verify_module(not_marked)
    loop_a = Computation("a", (_param("p", 0), Instruction("c", "call", F, ("p",), Attributes({"to_apply": "b"}))), "c")
    loop_b = Computation("b", (_param("p", 0), Instruction("c", "call", F, ("p",), Attributes({"to_apply": "a"}))), "c")
    cyclic = _module(
        _param("p", 0), Instruction("c", "call", F, ("p",), Attributes({"to_apply": "a"})), extra=(loop_a, loop_b)
    )
    with pytest.raises(HloVerifyError, match=r"computations call each other in a cycle: a -> b -> a"):
        verify_module(cyclic)


def test_mixed_floating_point_precision_is_accepted():
    """XLA's backends verify with allow_mixed_precision: float types may differ, integer types may not."""
    text = "ENTRY e {\n a = bf16[4] parameter(0)\n b = f32[4] parameter(1)\n ROOT r = f32[4] add(a, b)\n}"
    parse_module(text)
    with pytest.raises(HloVerifyError, match=r"add needs operands of one shape, found s32\[4\] and f32\[4\]"):
        parse_module(text.replace("bf16[4]", "s32[4]"))


def test_entry_computation_layout_must_match_the_entry():
    text = "HloModule m, entry_computation_layout={(f32[2]{0})->f32[2]{0}}\nENTRY e {\n p = f32[2] parameter(0)\n"
    parse_module(text + " ROOT n = f32[2]{0} negate(p)\n}")
    with pytest.raises(HloVerifyError, match=r"declares the result f32\[2\]\{0\} but the root %n is s32\[2\]"):
        parse_module(text + " ROOT n = s32[2] convert(p)\n}")
    with pytest.raises(HloVerifyError, match=r"declares parameters \(f32\[2\]\{0\}\) but they are \(f32\[3\]\)"):
        parse_module(text.replace("p = f32[2]", "p = f32[3]") + " ROOT n = f32[2] slice(p), slice={[0:2]}\n}")


def test_malformed_attribute_values_are_verify_errors():
    bad = _module(_param("p", 0), Instruction("t", "transpose", F, ("p",), Attributes({"dimensions": "zero"})))
    with pytest.raises(HloVerifyError, match=r"instruction %t"):
        verify_module(bad)
