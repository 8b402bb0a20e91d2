"""copy-start / copy-done, add-dependency, domain, bitcast-convert and reduce-precision on the modelled hardware
(tpusim/compiler/lowering/async_copy.py, reinterpret.py; the aliases in buffer_assignment.py), checked bit for
bit against the reference interpreter and, where JAX emits the op, against JAX (XLA CPU).
"""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate
from tpusim.isa import DmaStart, SemWait, VpuFused

RNG = np.random.default_rng(7)  # reseeded for every test (conftest.py)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def run(text: str, *args: np.ndarray, config: str = "tpu_v5e", want: np.ndarray | None = None):  # type: ignore[no-untyped-def]
    """Simulate, compare bit for bit with the reference (and ``want``), assert nothing fell back."""
    module = parse_module(text)
    result = tpusim.simulate(module, list(args), config=config)
    reference = evaluate(module, list(args))
    for got, ref in zip(result.outputs, reference):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert np.array_equal(_bits(got), _bits(ref)), "device differs from the reference"
    if want is not None:
        assert np.array_equal(_bits(result.outputs[0]), _bits(want)), "device differs from JAX"
    assert not result.fallbacks, result.fallbacks
    return result


def instructions(result, hlo: str) -> Counter:  # type: ignore[no-untyped-def]
    return Counter(type(i).__name__ for s in result.compiled.program.streams for i in s.instructions if i.hlo == hlo)


def test_copy_start_done_overlaps_the_work_between() -> None:
    text = """HloModule m
ENTRY main {
  p0 = f32[512,512] parameter(0)
  p1 = f32[512,512] parameter(1)
  cs = (f32[512,512], f32[512,512], u32[]) copy-start(p0)
  a = f32[512,512] add(p1, p1)
  b = f32[512,512] multiply(a, p1)
  cd = f32[512,512] copy-done(cs)
  ROOT r = (f32[512,512], f32[512,512]) tuple(b, cd)
}"""
    x, y = (RNG.standard_normal((512, 512)).astype(np.float32) for _ in range(2))
    result = run(text, x, y)
    start, done = instructions(result, "cs"), instructions(result, "cd")
    assert start == Counter({"DmaStart": 1}) and done == Counter({"SemWait": 1})  # the done shares the buffer
    trace = result.trace
    names = [trace.streams[trace.stream[k]].hlo[trace.index[k]] for k in range(len(trace.issue))]
    copy = next(k for k, name in enumerate(names) if name == "cs")
    vector = [k for k in range(len(names)) if trace.units[trace.unit[k]].endswith(".vpu")]
    assert min(trace.start[k] for k in vector) < trace.end[copy]  # the add runs while the copy is in flight


def test_copy_done_in_a_loop_body() -> None:
    text = """HloModule m
cond {
  s = (s32[], f32[64,128]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  s = (s32[], f32[64,128]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[64,128] get-tuple-element(s), index=1
  cs = (f32[64,128], f32[64,128], u32[]) copy-start(x)
  one = s32[] constant(1)
  j = s32[] add(i, one)
  cd = f32[64,128] copy-done(cs)
  y = f32[64,128] add(cd, x)
  ROOT t = (s32[], f32[64,128]) tuple(j, y)
}
ENTRY main {
  p0 = f32[64,128] parameter(0)
  z = s32[] constant(0)
  t = (s32[], f32[64,128]) tuple(z, p0)
  w = (s32[], f32[64,128]) while(t), condition=cond, body=body
  ROOT r = f32[64,128] get-tuple-element(w), index=1
}"""
    run(text, RNG.standard_normal((64, 128)).astype(np.float32))


def test_add_dependency_and_domain_run_no_code() -> None:
    text = """HloModule m
ENTRY main {
  p0 = f32[64,256] parameter(0)
  t = token[] after-all()
  d = f32[64,256] add-dependency(p0, t)
  e = f32[64,256] domain(d), domain={kind="sharding", entry={maximal device=0}, exit={maximal device=0}}
  ROOT r = f32[64,256] negate(e)
}"""
    result = run(text, RNG.standard_normal((64, 256)).astype(np.float32))
    assert not instructions(result, "d") and not instructions(result, "e")


@pytest.mark.parametrize(
    ("src", "dst", "moves"),
    [
        ("f32[64,256]", "s32[64,256]", 0),  # same layout: the operand's buffer
        ("bf16[40,300]", "u16[40,300]", 0),
        ("f32[64,256]{1,0:T(8,128)}", "u32[64,256]{0,1:T(8,128)}", 1),  # layouts differ: one relayout DMA
        ("f32[64,100]", "u8[64,100,4]", 2),  # narrowing: through a row-major scratch buffer
        ("s16[30,20,2]", "f32[30,20]", 2),  # widening
    ],
)
def test_bitcast_convert(src: str, dst: str, moves: int) -> None:
    text = f"HloModule m\nENTRY main {{\n  p0 = {src} parameter(0)\n  ROOT r = {dst} bitcast-convert(p0)\n}}"
    module = parse_module(text)
    shape = module.entry_computation.parameters[0].shape
    x = RNG.integers(0, 256, shape.element_count * shape.element_type.bits // 8, dtype=np.uint8)
    x = x.view(shape.element_type.dtype).reshape(shape.dimensions)
    result = run(text, x)
    assert instructions(result, "r")["DmaStart"] == moves


def test_bitcast_convert_from_jax() -> None:
    x = RNG.standard_normal((16, 128)).astype(np.float32)
    f = jax.jit(lambda x: lax.bitcast_convert_type(x, jnp.int32) ^ 0x5555)
    run(jax.jit(f).lower(x).as_text(dialect="hlo"), x, want=np.asarray(f(x)))


SPECIAL = [0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, np.nan, 1e-40, -3e-39, 65504.0, 65520.0, 6e-5, 3.4e38, 1.0000001]


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize(("exponent", "mantissa"), [(8, 7), (5, 10), (4, 3), (5, 2), (2, 0), (8, 23), (11, 52)])
def test_reduce_precision_against_jax(dtype: type, exponent: int, mantissa: int) -> None:
    x = np.concatenate([np.array(SPECIAL * 10, np.float32), (RNG.standard_normal(1908) * 1e3).astype(np.float32)])
    with np.errstate(over="ignore"):  # f16 overflows to inf: more special values
        x = x.reshape(16, 128).astype(dtype)
    f = jax.jit(lambda x: lax.reduce_precision(x, exponent, mantissa))
    result = run(f.lower(x).as_text(dialect="hlo"), x, want=np.asarray(f(x)))
    lowered = [i for s in result.compiled.program.streams for i in s.instructions if isinstance(i, VpuFused)]
    src_exponent, src_mantissa = {np.float32: (8, 23), ml_dtypes.bfloat16: (8, 7), np.float16: (5, 10)}[dtype]
    assert bool(lowered) == (exponent < src_exponent or mantissa < src_mantissa)  # else a plain copy


def test_reduce_precision_fused_with_elementwise_ops() -> None:
    x = RNG.standard_normal((40, 300)).astype(np.float32)
    f = jax.jit(lambda x: jnp.tanh(lax.reduce_precision(x * 3.0, 5, 10)) + 1.0)
    result = run(f.lower(x).as_text(dialect="hlo"), x)
    code = result.compiled.program.streams[0].instructions
    assert sum(isinstance(i, DmaStart) for i in code) == 2  # one fusion: one block in, one out
    assert any(isinstance(i, VpuFused) and i.dst.element_type.name == "u32" for i in code)  # rounding on the bits


def test_every_dma_is_waited() -> None:
    text = """HloModule m
ENTRY main {
  p0 = f32[8,128] parameter(0)
  cs = (f32[8,128], f32[8,128], u32[]) copy-start(p0)
  cd = f32[8,128] copy-done(cs)
  ROOT r = f32[8,128] add(cd, cd)
}"""
    result = run(text, RNG.standard_normal((8, 128)).astype(np.float32))
    code = result.compiled.program.streams[0].instructions
    sems = Counter(i.sem for i in code if isinstance(i, DmaStart))
    waited = Counter()
    for i in code:
        if isinstance(i, SemWait):
            waited[i.sem] += i.count
    assert sems == waited
