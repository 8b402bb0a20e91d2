"""Mixed floating-point precision (tpusim/compiler/precision.py): XLA:TPU's compiled modules declare some
results in another floating-point type than their operands give (XLA verifies with allow_mixed_precision);
the verifier accepts them, ``normalize_precision`` makes the conversion an explicit ``convert``, and the
reference interpreter gives the same values.

The modules of ``tests/data/xla_mixed_precision/`` (``scripts/make_xla_mixed_precision.py``) are XLA:TPU's
compilations for v5e and v6e, stored with their inputs and JAX's outputs, so these tests need no libtpu.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tpusim
from tpusim.compiler.hlo import HloVerifyError, parse_module
from tpusim.compiler.hlo.ir import Module
from tpusim.compiler.hlo.reference import evaluate
from tpusim.compiler.precision import normalize_precision

DATA = Path(__file__).parent / "data" / "xla_mixed_precision"
CHIPS = {"v5e": "tpu_v5e", "v6e": "tpu_v6e"}
PROGRAMS = ("argmin", "pad_f32_value", "softmax_bf16_logits")


def _xla_program(name: str, chip: str) -> tuple[Module, list[np.ndarray], list[np.ndarray]]:
    """XLA:TPU's module for ``chip``, its inputs (in the parameters' types) and JAX's outputs."""
    module = parse_module(gzip.decompress((DATA / name / f"{chip}.hlo.gz").read_bytes()).decode())
    with np.load(DATA / name / "data.npz") as data:
        inputs = [data[f"in{i}"] for i in range(len(module.entry_computation.parameters))]
        outputs = [data[k] for k in sorted(data) if k.startswith("out")]
    params = module.entry_computation.parameters
    return module, [a.astype(p.array_shape.element_type.dtype) for a, p in zip(inputs, params)], outputs


@pytest.mark.parametrize("chip", sorted(CHIPS))
@pytest.mark.parametrize("name", PROGRAMS)
def test_xlas_mixed_precision_modules_give_jaxs_answer(name: str, chip: str) -> None:
    """A fused f32 broadcast of bf16 values (softmax in f32 over bf16 logits), a variadic reduce whose value
    result XLA narrowed to bf16 (argmin: the indices exactly), and an f32 pad of bf16 values with an f32
    padding value (0.1, not its bf16 rounding) verify, run on the device and in the reference interpreter,
    and equal JAX. They were refused by the verifier, or failed mid-run in a fallback kernel."""
    module, inputs, want = _xla_program(name, chip)
    result = tpusim.simulate(module, inputs, config=CHIPS[chip])
    for what, values in (("reference", evaluate(module, inputs)), ("device", result.outputs)):
        assert len(values) == len(want)
        for got, expected in zip(values, want):
            got = np.asarray(got)
            assert got.dtype == expected.dtype and got.shape == expected.shape, what
            if expected.dtype.kind == "f":
                np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7, err_msg=what)
            else:
                np.testing.assert_array_equal(got, expected, err_msg=what)


# ------------------------------------------------------------------------------------- the rewrite
ARGMIN = """
argmin {
  a = f32[] parameter(0)
  i = s32[] parameter(1)
  b = f32[] parameter(2)
  j = s32[] parameter(3)
  lt = pred[] compare(a, b), direction=LT
  eq = pred[] compare(a, b), direction=EQ
  first = pred[] compare(i, j), direction=LT
  tie = pred[] and(eq, first)
  take = pred[] or(lt, tie)
  v = f32[] select(take, a, b)
  k = s32[] select(take, i, j)
  ROOT t = (f32[], s32[]) tuple(v, k)
}

ENTRY e {
  x = f32[8,128]{1,0:T(8,128)} parameter(0)
  iota = s32[8,128]{1,0:T(8,128)} iota(), iota_dimension=1
  inf = f32[] constant(inf)
  zero = s32[] constant(0)
  ROOT r = (bf16[8]{0:T(256)(128)(2,1)}, s32[8]{0:T(128)}) reduce(x, iota, inf, zero), dimensions={1}, to_apply=argmin
}
"""


def test_a_narrowed_result_of_a_variadic_reduce_becomes_a_convert_of_its_element() -> None:
    """The reduce computes in its reducer's f32 and a convert gives the declared bf16; the indices pass
    through unchanged. Values equal the module's before the rewrite, bit for bit."""
    module = parse_module(ARGMIN)
    after = normalize_precision(module)
    entry = after.entry_computation
    assert [i.opcode for i in entry.instructions][-5:] == [
        "reduce",
        "get-tuple-element",
        "convert",
        "get-tuple-element",
        "tuple",
    ]
    inner = entry[entry[entry.root].operands[1]]
    assert str(entry[inner.operands[0]].shape) == "(f32[8]{0}, s32[8]{0:T(128)})"  # (f32 tiles left to layout)
    x = np.random.default_rng(3).standard_normal((8, 128)).astype(np.float32)
    before_values, after_values = evaluate(module, [x]), evaluate(after, [x])
    np.testing.assert_array_equal(before_values[1], np.argmin(x, axis=1))
    np.testing.assert_array_equal(before_values[0], x.min(axis=1).astype(ml_dtypes.bfloat16))
    for a, b in zip(before_values, after_values):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    (values, indices) = tpusim.simulate(module, [x], config="teaching").outputs
    np.testing.assert_array_equal(indices, np.argmin(x, axis=1))
    np.testing.assert_array_equal(values, before_values[0])


def test_a_broadcast_that_widens_converts_its_operand_first() -> None:
    text = "ENTRY e {\n  x = bf16[8] parameter(0)\n  ROOT b = f32[8,128] broadcast(x), dimensions={0}\n}"
    entry = normalize_precision(parse_module(text)).entry_computation
    assert [(i.opcode, str(i.shape)) for i in entry.instructions] == [
        ("parameter", "bf16[8]"),
        ("convert", "f32[8]"),
        ("broadcast", "f32[8,128]"),
    ]


def test_only_floating_point_precision_may_change_in_moves() -> None:
    """As XLA's verifier under allow_mixed_precision (SameElementType ignoring floating-point precision), for
    user HLO as for XLA:TPU's: a float type may change in a broadcast, reshape, concatenate or pad value, an
    integer one may not (a located error)."""
    pad = (
        "ENTRY e {\n  x = bf16[8] parameter(0)\n  z = f32[] constant(0.1)\n  ROOT p = f32[10] pad(x, z), padding=1_1\n}"
    )
    parse_module("ENTRY e {\n  x = bf16[8] parameter(0)\n  ROOT b = f32[8,128] broadcast(x), dimensions={0}\n}")
    parse_module(pad)
    with pytest.raises(
        HloVerifyError,
        match=r"instruction %b .*broadcast changes the element type from s32\[8\] to f32\[8,128\] \(only a "
        r"float's precision may\)",
    ):
        parse_module("ENTRY e {\n  x = s32[8] parameter(0)\n  ROOT b = f32[8,128] broadcast(x), dimensions={0}\n}")
    with pytest.raises(HloVerifyError, match=r"instruction %p .*padding value f32\[\] and operand s32\[8\]"):
        parse_module(pad.replace("bf16[8]", "s32[8]").replace("f32[10]", "s32[10]"))
