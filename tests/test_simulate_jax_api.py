"""``tpusim.simulate_jax(f, *args)`` accepts what ``jax.jit(f)`` accepts (issue 13): arguments the program
does not use (JAX drops them when lowering), Python scalars and weakly typed values (converted to the type
the program wants), arrays JAX canonicalises (float64 without x64), typed PRNG keys, and pytrees in and out.
Every case is compared with ``jax.jit(f)(*args)``: same structure, same dtypes, same values bit for bit
(the programs are exact: integer arithmetic, data movement, exactly rounded float ops).
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpusim
from tpusim.compiler.hlo.printer import print_module
from tpusim.jax_bridge import JaxLoweringError, JaxProgram, lower_for_tpu

X = jnp.arange(8, dtype=jnp.float32)
Pair = namedtuple("Pair", "first second")


def _leaf(value: Any) -> np.ndarray:
    if jax.dtypes.issubdtype(getattr(value, "dtype", None), jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(value))
    return np.asarray(value)


def assert_same_as_jit(fn: Any, *args: Any, **kwargs: Any) -> tpusim.api.SimulationResult:
    want = jax.jit(fn)(*args)
    result = tpusim.simulate_jax(fn, *args, **kwargs)
    want_leaves, want_tree = jax.tree.flatten(want)
    got_leaves, got_tree = jax.tree.flatten(result.tree)
    assert got_tree == want_tree
    for got, exp in zip(got_leaves, want_leaves):
        assert jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key) == jax.dtypes.issubdtype(
            exp.dtype, jax.dtypes.prng_key
        )
        g, w = _leaf(got), _leaf(exp)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    return result


CASES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    # unused arguments: the lowered module has fewer parameters than fn has leaves
    "unused_middle": (lambda a, b, c: a * c, (X, X + 1, X + 2)),
    "unused_first": (lambda a, b: b + 1, (X, jnp.ones(3, jnp.int32))),
    "unused_all": (lambda a, b: jnp.float32(7), (X, X)),
    "unused_in_pytree": (lambda d: d["used"] * 2, ({"unused": X, "used": X + 3, "also": jnp.zeros(5)},)),
    "passthrough": (lambda a, b: b, (X, X + 1)),
    # Python scalars and weak types: the program's type, as jax.jit takes it
    "float_scalar": (lambda a, s: a * s, (X, 3.0)),
    "int_scalar": (lambda a, s: a * s, (X, 3)),
    "bool_scalar": (lambda a, s: jnp.where(s, a, -a), (X, True)),
    "weak_into_bf16": (lambda a, s: a + s, (X.astype(jnp.bfloat16), 1.5)),
    "weak_int_into_s8": (lambda a, s: a * s, (jnp.arange(6, dtype=jnp.int8), 3)),
    "only_scalars": (lambda s, t: s * t, (2.0, 4)),
    "weak_jax_scalar": (lambda a, s: a - s, (X, jnp.asarray(2.0) * 1)),
    "numpy_float64": (lambda a: a * 2, (np.arange(4.0),)),
    "numpy_int64": (lambda a: a * 2, (np.arange(4),)),
    "numpy_scalar": (lambda a, s: a + s, (X, np.float32(0.25))),
    # pytrees in and out
    "dict_in_out": (
        lambda d: {"s": d["a"] + d["b"], "p": [d["a"], (d["b"] * 2, None)]},
        ({"a": X, "b": X + 1, "c": None},),
    ),
    "nested_tuples": (lambda t: (t[0][1], t[1]), (((X, X * 2), [X, {"z": 3.0}]),)),
    "none_leaves_out": (lambda a: (a, None, [None]), (X,)),
    "empty_out": (lambda a: {}, (X,)),
    "namedtuple": (lambda p: Pair(p.second, p.first * 2), (Pair(X, jnp.ones((2, 3), jnp.int32)),)),
    "list_of_scalars": (lambda xs: sum(xs), ([1.0, 2.0, X],)),
    "constant_closure": (lambda a: a + np.arange(8, dtype=np.float32), (X,)),
    # typed PRNG keys in and out
    "key_in": (lambda k: jax.random.bits(k, (4,)), (jax.random.key(0),)),
    "key_out": (lambda k: jax.random.split(k), (jax.random.key(3),)),
    "key_closed": (lambda: jax.random.split(jax.random.key(1), 3), ()),
    "key_in_pytree": (lambda d: jax.random.uniform(d["k"], (3,)) + d["x"][0], ({"k": jax.random.key(2), "x": X},)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_as_jit(name: str) -> None:
    fn, args = CASES[name]
    assert_same_as_jit(fn, *args, config="teaching")


def test_unused_arguments_are_not_parameters() -> None:
    """What the TPU would receive: the dropped argument is not a parameter of the simulated program."""
    result = assert_same_as_jit(lambda a, b, c: a * c, X, jnp.zeros(1000), X + 2)
    assert len(result.compiled.source.entry_computation.parameters) == 2


def test_timing_only_has_no_tree() -> None:
    result = tpusim.simulate_jax(lambda a, s: a * s, X, 2.0, timing_only=True, config="teaching")
    assert result.tree is None and result.cycles > 0


def test_on_tpu_v5e() -> None:
    """The default chip, a pytree with an unused leaf and a Python scalar."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((16, 256)), jnp.float32)
    assert_same_as_jit(lambda d, s: {"y": d["x"] * s + 1}, {"x": x, "skip": x}, 2)


def test_without_kept_index_relowers_with_keep_unused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A JAX whose lowering does not expose the kept arguments: every argument is made a parameter."""
    import jax.stages

    class Opaque:  # a Lowered without the private _lowering
        def __init__(self, lowered: Any) -> None:
            self._l = lowered

        def as_text(self, **kw: Any) -> str:
            return self._l.as_text(**kw)

        out_tree = property(lambda self: self._l.out_tree)
        out_info = property(lambda self: self._l.out_info)

    traced_lower = jax.stages.Traced.lower
    monkeypatch.setattr(jax.stages.Traced, "lower", lambda self, **kw: Opaque(traced_lower(self, **kw)))
    program = lower_for_tpu(lambda a, b, c: a * c, (X, jnp.zeros(3), X + 2))
    assert len(program.leaves) == 3 and "parameter(2)" in program.hlo


def test_mismatched_parameters_are_one_error() -> None:
    program = JaxProgram("", (X,), jax.tree.structure(0), (jnp.float32,))
    with pytest.raises(JaxLoweringError, match="takes 2 parameters"):
        program.inputs([np.float32, np.float32])
    with pytest.raises(JaxLoweringError, match="2 outputs"):
        program.outputs([np.zeros(1), np.zeros(1)])


ANNOTATED = """HloModule annotated
ENTRY main {
  p = f32[8,128]{1,0} parameter(0)
  s = f32[8,128]{1,0} custom-call(p), custom_call_target="Sharding", sharding={replicated}
  d = f32[8,128]{1,0} custom-call(s), custom_call_target="annotate_device_placement"
  a = f32[8,128]{1,0} add(d, s)
  ROOT r = f32[8,128]{1,0} custom-call(a), custom_call_target="Sharding", sharding={replicated}
}
"""


def test_annotations_are_not_fallback_kernels() -> None:
    """``Sharding`` custom-calls (JAX puts one on every typed PRNG key parameter) are removed before
    lowering, as XLA's sharding propagation removes them: no fallback kernel, the same values."""
    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    result = tpusim.simulate(ANNOTATED, [x], config="teaching")
    assert not result.fallbacks, result.fallbacks
    np.testing.assert_array_equal(result.outputs[0], 2 * x)
    key = tpusim.simulate_jax(lambda k: jax.random.bits(k, (8,)), jax.random.key(0), config="teaching")
    assert "Sharding" in print_module(key.compiled.source)
    assert not key.fallbacks, key.fallbacks


def _traced_step(x: Any, w: Any) -> Any:
    h = jnp.tanh(x @ w)  # the line the summary must name
    return h.sum()


def test_reports_name_the_user_source_line() -> None:
    """simulate_jax lowers with JAX's debug info, so the module carries each op's stack frame and the terminal
    summary names the user's file, line and function beside each hot HLO instruction, not only
    ``dot_general.1``."""
    from tpusim.report.summary import format_summary

    result = tpusim.simulate_jax(_traced_step, jnp.ones((128, 256), jnp.float32), jnp.ones((256, 128), jnp.float32))
    line = _traced_step.__code__.co_firstlineno + 1
    text = format_summary(result, 0.0, None)
    assert f"test_simulate_jax_api.py:{line} (_traced_step)" in text, text
