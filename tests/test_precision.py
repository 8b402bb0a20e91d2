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
PROGRAMS = ("argmin", "pad_f32_value", "softmax_bf16_logits", "sort_f32_of_bf16")


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
    result XLA narrowed to bf16 (argmin: the indices exactly), an f32 pad of bf16 values with an f32
    padding value (0.1, not its bf16 rounding) and an ``(f32, s32) sort(bf16, s32 iota)`` whose comparator
    takes f32 (``jnp.sort(x.astype(f32))``) verify, run on the device and in the reference interpreter, and
    equal JAX. They were refused by the verifier, or failed mid-run in a fallback kernel."""
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


# ------------------------------------------------------------------------------- called computations
SORT = """
less {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  i = s32[] parameter(2)
  j = s32[] parameter(3)
  ROOT lt = pred[] compare(a, b), direction=LT
}

ENTRY e {
  x = bf16[4,128]{1,0:T(8,128)(2,1)} parameter(0)
  iota = s32[4,128]{1,0:T(8,128)} iota(), iota_dimension=1
  ROOT s = (f32[4,128]{1,0:T(8,128)}, s32[4,128]{1,0:T(8,128)}) sort(x, iota), dimensions={1}, to_apply=less
}
"""


def test_a_sort_reads_its_operands_in_its_comparators_type() -> None:
    """XLA:TPU's ``(f32, s32) sort(bf16, s32)`` with an f32 comparator: the operand converted to f32 and
    sorted, the indices carried along; the rewrite's module, the reference and the device agree (the
    reference called the comparator with bf16 values and failed)."""
    module = parse_module(SORT)
    entry = normalize_precision(module).entry_computation
    assert [(i.opcode, str(i.shape)) for i in entry.instructions][-2:] == [
        ("convert", "f32[4,128]{1,0}"),
        ("sort", "(f32[4,128]{1,0:T(8,128)}, s32[4,128]{1,0:T(8,128)})"),
    ]
    x = np.random.default_rng(5).standard_normal((4, 128)).astype(ml_dtypes.bfloat16)
    wide = x.astype(np.float32)
    want = np.sort(wide, axis=1), np.argsort(wide, axis=1, kind="stable").astype(np.int32)
    for what, values in (
        ("reference", evaluate(module, [x])),
        ("rewritten", evaluate(normalize_precision(module), [x])),
        ("device", tpusim.simulate(module, [x], config="teaching").outputs),
    ):
        for got, expected in zip(values, want):
            assert np.asarray(got).dtype == expected.dtype, what
            np.testing.assert_array_equal(got, expected, err_msg=what)


def test_a_sort_in_a_narrower_comparator_type_rounds_its_values() -> None:
    """An f32 operand sorted by a bf16 comparator is read in bf16 (as a reduce reads its inputs in its
    reducer's type), and the declared f32 result is a convert of the bf16 values."""
    text = SORT.replace("bf16[4,128]{1,0:T(8,128)(2,1)}", "f32[4,128]{1,0:T(8,128)}").replace(
        "f32[] parameter", "bf16[] parameter"
    )
    x = np.random.default_rng(6).standard_normal((4, 128)).astype(np.float32)
    values, _ = evaluate(parse_module(text), [x])
    np.testing.assert_array_equal(values, np.sort(x.astype(ml_dtypes.bfloat16).astype(np.float32), axis=1))
    np.testing.assert_array_equal(evaluate(normalize_precision(parse_module(text)), [x])[0], values)


CALLERS = """
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT g = pred[] compare(a, b), direction=GE
}

ENTRY e {
  x = bf16[8,128] parameter(0)
  u = bf16[2,128] parameter(1)
  idx = s32[2,1] constant({{1}, {6}})
  sc = f32[8,128] scatter(x, idx, u), update_window_dims={1}, inserted_window_dims={0},
    scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
  src = bf16[4,128] parameter(2)
  zero = bf16[] constant(0)
  ss = f32[8,128] select-and-scatter(x, src, zero), window={size=2x1 stride=2x1}, select=ge, scatter=add
  m = f32[8,128] map(x, x), dimensions={0,1}, to_apply=add
  rw = f32[4,128] reduce-window(x, zero), window={size=2x1 stride=2x1}, to_apply=add
  ROOT t = (f32[8,128], f32[8,128], f32[8,128], f32[4,128]) tuple(sc, ss, m, rw)
}
"""


def test_every_instruction_that_calls_a_computation_reads_in_its_type() -> None:
    """scatter, select-and-scatter, map and reduce-window of bf16 operands whose computations take f32:
    each operand (a scatter's updates, a select-and-scatter's source and init, a reduce-window's init too)
    is converted to the f32 its computation takes; the rewrite gives the reference's values and the device
    runs it."""
    module = parse_module(CALLERS)
    rng = np.random.default_rng(7)
    x, u, src = (rng.standard_normal(s).astype(ml_dtypes.bfloat16) for s in ((8, 128), (2, 128), (4, 128)))
    wide = x.astype(np.float32)
    scattered = wide.copy()
    scattered[[1, 6]] += u.astype(np.float32)
    picked = np.zeros((8, 128), np.float32)
    rows = np.arange(0, 8, 2)[:, None] + (wide[1::2] >= wide[0::2]).astype(int) * 0 + (wide[1::2] > wide[0::2])
    np.put_along_axis(picked, rows, src.astype(np.float32), axis=0)
    want = [scattered, picked, wide + wide, wide[0::2] + wide[1::2]]
    rewritten = normalize_precision(module)
    assert "convert" in [i.opcode for i in rewritten.entry_computation.instructions]
    for what, values in (
        ("reference", evaluate(module, [x, u, src])),
        ("rewritten", evaluate(rewritten, [x, u, src])),
        ("device", tpusim.simulate(module, [x, u, src], config="teaching").outputs),
    ):
        for got, expected in zip(values, want):
            assert np.asarray(got).dtype == np.float32, what
            np.testing.assert_array_equal(got, expected, err_msg=what)


def test_a_comparator_of_another_integer_type_is_refused() -> None:
    """Only floating-point precision may differ between an operand and the computation it feeds."""
    text = SORT.replace("bf16[4,128]{1,0:T(8,128)(2,1)}", "s16[4,128]{1,0:T(8,128)(2,1)}").replace(
        "(f32[4,128]{1,0:T(8,128)}, s32", "(s16[4,128]{1,0:T(8,128)}, s32"
    )
    with pytest.raises(
        HloVerifyError,
        match=r"instruction %s .*parameter 0 of the comparator computation less is f32\[\], expected s16\[\]",
    ):
        parse_module(text)
