"""Bitcasts between two sizes of the same tiled bytes: XLA:TPU reverses ``x[::-2]`` of f32[1001] by bitcasting
the f32[501] slice to f32[512] (``T(512)``: the operand's padding becomes elements, sliced away later), and
rolls f32[64,256] by bitcasting it to f32[61,256] (``T(8,128)``: the last rows become padding). The verifier
accepts a bitcast whose operand and result occupy the same bytes under their layouts (XLA's rule), the
reference interpreter reads the operand's bytes under the result's layout (padding as zeros), buffer
assignment gives both one buffer, and a fused one becomes a ``slice`` and a ``pad`` with zeros.

The modules of ``tests/data/xla_padded_bitcast/`` (``scripts/make_xla_padded_bitcast.py``) are XLA:TPU's
compilations for v5e and v6e, stored with their inputs and JAX's outputs, so these tests need no libtpu.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

import tpusim
from tpusim.compiler.canonical import fused_bitcasts
from tpusim.compiler.hlo import HloVerifyError, parse_module
from tpusim.compiler.hlo.ir import Module
from tpusim.compiler.hlo.reference import evaluate

DATA = Path(__file__).parent / "data" / "xla_padded_bitcast"
CHIPS = {"v5e": "tpu_v5e", "v6e": "tpu_v6e"}
PROGRAMS = ("reverse_2d_f32", "reverse_2d_s8", "reverse_step2_f32", "roll_bf16", "roll_f32", "rot90_f32")


def _xla_program(name: str, chip: str) -> tuple[Module, list[np.ndarray], list[np.ndarray]]:
    """XLA:TPU's module for ``chip``, its inputs and JAX's outputs (in the module's types)."""
    module = parse_module(gzip.decompress((DATA / name / f"{chip}.hlo.gz").read_bytes()).decode())
    entry = module.entry_computation
    results = entry.root_instruction.shape
    with np.load(DATA / name / "data.npz") as data:
        inputs = [data[f"in{i}"].astype(p.array_shape.element_type.dtype) for i, p in enumerate(entry.parameters)]
        outputs = [data["out0"].astype(results.element_type.dtype)]
    return module, inputs, outputs


@pytest.mark.parametrize("chip", sorted(CHIPS))
@pytest.mark.parametrize("name", PROGRAMS)
def test_xlas_bitcasts_between_padded_sizes_give_jaxs_answer(name: str, chip: str) -> None:
    """Reverses with negative steps (f32, s8), rolls (f32, bf16) and rot90 of sizes that are not tile multiples
    verify, equal JAX bit for bit in the reference and on the device, with no fallback and no instruction for
    the bitcast (its result shares its operand's buffer). The verifier refused every one ("bitcast ...
    changes the number of bits")."""
    module, inputs, want = _xla_program(name, chip)
    compiled = tpusim.compile_program(module, config=CHIPS[chip])
    assert compiled.fallbacks == ()
    bitcasts = {i.name for c in compiled.module.computations for i in c.instructions if i.opcode == "bitcast"}
    assert not {i.hlo for s in compiled.program.streams for i in s.instructions} & bitcasts
    result = tpusim.simulate(compiled, inputs)
    for what, values in (("reference", evaluate(module, inputs)), ("device", result.outputs)):
        assert len(values) == 1
        got = np.asarray(values[0])
        assert got.dtype == want[0].dtype and got.shape == want[0].shape, what
        np.testing.assert_array_equal(got, want[0], err_msg=what)


# ------------------------------------------------------------------------------------- the rules
GROW = """
ENTRY e {
  x = f32[5]{0:T(8)} parameter(0)
  ROOT b = f32[8]{0:T(8)} bitcast(x)
}
"""
SHRINK = """
ENTRY e {
  x = f32[10,128]{1,0:T(8,128)} parameter(0)
  ROOT b = f32[9,128]{1,0:T(8,128)} bitcast(x)
}
"""


def test_a_bitcast_may_change_the_size_within_the_same_tiled_bytes() -> None:
    """The padding of the operand's tiles becomes elements (zeros here: the reference's choice; a program's
    meaning must not depend on them), and elements that fall into the result's padding are dropped."""
    x = np.arange(1, 6, dtype=np.float32)
    np.testing.assert_array_equal(evaluate(parse_module(GROW), [x])[0], [1, 2, 3, 4, 5, 0, 0, 0])
    y = np.arange(1280, dtype=np.float32).reshape(10, 128)
    np.testing.assert_array_equal(evaluate(parse_module(SHRINK), [y])[0], y[:9])


def test_a_bitcast_that_changes_the_bytes_is_refused() -> None:
    with pytest.raises(
        HloVerifyError,
        match=r"instruction %b .*bitcast from f32\[5\]\{0:T\(8\)\} to f32\[9\]\{0:T\(8\)\} changes the number of "
        r"bits \(160 to 288\) and of bytes under their layouts \(32 to 64\)",
    ):
        parse_module(GROW.replace("f32[8]", "f32[9]"))
    with pytest.raises(HloVerifyError, match=r"bitcast from f32\[5\]\{0\} to f32\[8\]\{0\} changes the number"):
        parse_module(GROW.replace(":T(8)", ""))


FUSED = """
HloModule fused, entry_computation_layout={(f32[501]{0:T(512)})->f32[500]{0:T(512)}}

grow {
  p = f32[501]{0:T(512)} parameter(0)
  b = f32[512]{0:T(512)} bitcast(p)
  ROOT n = f32[512]{0:T(512)} negate(b)
}

shrink {
  q = f32[512]{0:T(512)} parameter(0)
  c = f32[500]{0:T(512)} bitcast(q)
  ROOT e = f32[500]{0:T(512)} exponential(c)
}

ENTRY main {
  x = f32[501]{0:T(512)} parameter(0)
  f = f32[512]{0:T(512)} fusion(x), kind=kLoop, calls=grow
  ROOT g = f32[500]{0:T(512)} fusion(f), kind=kLoop, calls=shrink
}
"""


def test_a_fused_bitcast_between_sizes_is_a_slice_and_a_pad_with_zeros() -> None:
    """Inside a fusion the vector unit works on values, not bytes: the bitcast becomes what the bytes mean."""
    module = parse_module(FUSED)
    rewritten = fused_bitcasts(module)
    assert [i.opcode for i in rewritten["grow"].instructions] == ["parameter", "constant", "pad", "negate"]
    assert [i.opcode for i in rewritten["shrink"].instructions] == ["parameter", "slice", "exponential"]
    x = np.linspace(-1, 1, 501).astype(np.float32)
    want = evaluate(module, [x])[0]
    np.testing.assert_allclose(want, np.exp(-x[:500]), rtol=1e-6)
    np.testing.assert_array_equal(evaluate(rewritten, [x])[0], want)
    result = tpusim.simulate(module, [x], config="tpu_v5e")
    np.testing.assert_allclose(result.outputs[0], want, rtol=2e-6)
