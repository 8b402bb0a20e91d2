"""Inputs a user can give the HLO front end and the compiler that once gave tracebacks (issue 13).

* Empty arrays (``f32[0,8]``) run on the device as XLA runs them, outputs equal to the reference
  interpreter's, in numeric and timing-only runs.
* Integers of thousands of digits, tuples nested thousands deep and bytes that are not UTF-8 are located
  :class:`~tpusim.errors.TpusimError` s with a short first line.
* Errors that once reached the compiler (or the ISA) without a location are caught by the parser or the
  verifier and name the instruction.
"""

from __future__ import annotations

import numpy as np
import pytest

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate

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
