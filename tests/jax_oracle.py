"""JAX as the oracle of the reference interpreter: HLO text from JAX programs, and comparisons with JAX's
own results under ONE tolerance table.

Usage (tests of both reference engineers)::

    from jax_oracle import check_against_jax, hlo_of
    check_against_jax(lambda x, y: jnp.tanh(x) * y, x, y)          # tolerance from the module's opcodes
    check_against_jax(mlp, x, w, tol="composite")                    # a named row of TOLERANCES
    check_spmd_against_jax(shard_mapped_fn, mesh, x)                 # per-device module, 8 host devices

Comparison rule: integers, pred and every exact row compare bit for bit (NaNs compare equal to NaNs of any
sign or payload; -0 and +0 differ). A float row passes an element when its distance in units in the last
place (ulp, counted on the totally ordered bit patterns of the element type) is at most ``ulps``, or its
absolute error is at most ``atol``, or its relative error is at most ``rtol``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from tpusim.memory import element_type_of_dtype

__all__ = [
    "TOLERANCES",
    "Tolerance",
    "assert_close",
    "check_against_jax",
    "check_spmd_against_jax",
    "hlo_of",
    "jax_outputs",
    "tolerance_for",
    "ulp_distance",
]


@dataclass(frozen=True)
class Tolerance:
    """How far the reference may be from JAX for one (opcode or category, dtype).

    Attributes:
        ulps: maximum distance in ulp of the element type.
        atol: or maximum absolute difference.
        rtol: or maximum difference relative to JAX's value.
        why: the measurement or argument behind the numbers.
    """

    ulps: int = 0
    atol: float = 0.0
    rtol: float = 0.0
    why: str = "exact: XLA defines the result bit for bit"

    @property
    def exact(self) -> bool:
        return self.ulps == 0 and self.atol == 0 and self.rtol == 0

    def loosest(self, other: Tolerance) -> Tolerance:
        if self.exact:
            return other
        if other.exact:
            return self
        ulps, atol, rtol = max(self.ulps, other.ulps), max(self.atol, other.atol), max(self.rtol, other.rtol)
        return Tolerance(ulps, atol, rtol, f"{self.why}; {other.why}")


EXACT = Tolerance()
_FLOATS_32 = ("f32", "c64")
_NARROW = ("bf16", "f16")

# Keyed by (opcode or category, element type name); "*" matches every type. Anything absent is EXACT:
# integer and pred arithmetic, comparisons, data movement, convert, select, collectives on integers, and
# the correctly rounded float ops (add, subtract, multiply, divide, sqrt, remainder ...) which XLA CPU and
# numpy both compute with IEEE instructions and round once.
# Measurements: tests/test_reference_elementwise.py::test_measured_ulps prints the max ulp difference of
# the reference against jax.jit on CPU over 20000 points per (op, dtype) (log-uniform magnitudes).
TOLERANCES: dict[tuple[str, str], Tolerance] = {}


def _rows(ops: Sequence[str], dtypes: Sequence[str], tol: Tolerance) -> None:
    for op in ops:
        for dt in dtypes:
            TOLERANCES[(op, dt)] = tol


# Filled with measured figures in the rows below (see docs/reference.md, "Tolerances").
_rows(
    ("exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "logistic", "erf", "power", "cbrt",
     "sine", "cosine", "tan", "atan2", "rsqrt"),
    (*_FLOATS_32, "f64", "c128"),
    Tolerance(ulps=4, why="XLA CPU evaluates transcendentals with its own polynomial approximations"),
)
_rows(
    ("exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "logistic", "erf", "power", "cbrt",
     "sine", "cosine", "tan", "atan2", "rsqrt"),
    _NARROW,
    Tolerance(ulps=1, why="computed in f32 then rounded: an f32 error of a few ulp moves at most one bf16/f16 ulp"),
)
# Programs built from many ops (reductions in another order, fused f32 intermediates): relative error.
_rows(("composite",), ("f32", "c64"), Tolerance(ulps=64, atol=1e-6, rtol=1e-5, why="sum order and transcendentals"))
_rows(("composite",), ("f64", "c128"), Tolerance(ulps=64, atol=1e-13, rtol=1e-12, why="sum order"))
_rows(("composite",), _NARROW, Tolerance(ulps=2, atol=1e-2, rtol=1e-2, why="f32 intermediates kept by XLA fusions"))


def tolerance_for(key: str, dtype: str) -> Tolerance:
    """The row for ``(key, dtype)``, then ``(key, "*")``, else exact."""
    return TOLERANCES.get((key, dtype)) or TOLERANCES.get((key, "*")) or EXACT


def module_tolerance(module: Any, dtype: str) -> Tolerance:
    """The loosest row over every opcode of ``module`` for outputs of element type ``dtype``."""
    tol = EXACT
    for comp in module.computations:
        for ins in comp.instructions:
            tol = tol.loosest(tolerance_for(ins.opcode, dtype))
    return tol


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------
def _ordered_bits(a: np.ndarray) -> np.ndarray:
    """Float bit patterns mapped to int64 so that numeric order is integer order (-0 just below +0)."""
    bits = a.dtype.itemsize * 8
    raw = np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}").astype(np.int64)
    if bits == 64:
        raw = np.ascontiguousarray(a).view(np.int64)
        return np.where(raw < 0, -(raw & 0x7FFF_FFFF_FFFF_FFFF) - 1, raw)
    sign = np.int64(1) << (bits - 1)
    mag = raw & (sign - 1)
    return np.where(raw & sign, -mag - 1, mag)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise distance in ulp between two float arrays of the same dtype (NaN vs NaN is 0; NaN vs
    a number is huge)."""
    a, b = np.asarray(a), np.asarray(b)
    nan_a, nan_b = np.isnan(a.astype(np.float64)), np.isnan(b.astype(np.float64))
    d = np.abs(_ordered_bits(a) - _ordered_bits(b)).astype(np.float64)
    d = np.where(nan_a & nan_b, 0.0, d)
    return np.where(nan_a ^ nan_b, np.inf, d)


def assert_close(got: np.ndarray, want: np.ndarray, tol: Tolerance, what: str = "output") -> None:
    """Fail with a precise message unless ``got`` matches ``want`` (same dtype and shape) within ``tol``."""
    want = np.asarray(want)
    assert isinstance(got, np.ndarray), f"{what}: got {type(got).__name__}, want an array"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, JAX gives {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, JAX gives {want.shape}"
    kind = element_type_of_dtype(want.dtype).kind
    if kind == "complex":
        real = want.real.dtype
        assert_close(np.ascontiguousarray(got.real).astype(real), want.real, tol, what + ".real")
        assert_close(np.ascontiguousarray(got.imag).astype(real), want.imag, tol, what + ".imag")
        return
    if kind != "float":
        bad = got != want
    else:
        ulps = ulp_distance(got, want)
        if tol.exact:
            bad = ulps > 0
        else:
            g64, w64 = got.astype(np.float64), want.astype(np.float64)
            with np.errstate(all="ignore"):
                err = np.abs(g64 - w64)
                bad = (ulps > tol.ulps) & ~(err <= tol.atol) & ~(err <= tol.rtol * np.abs(w64))
    if np.any(bad):
        idx = np.argwhere(np.asarray(bad))
        first = tuple(int(i) for i in idx[0]) if idx.size else ()
        g, w = np.asarray(got)[first], np.asarray(want)[first]
        extra = f", {float(ulp_distance(g, w))} ulp" if kind == "float" else ""
        raise AssertionError(
            f"{what}: {int(np.sum(bad))} of {want.size} elements differ beyond {tol}; first at {first}: "
            f"reference {g!r}, JAX {w!r}{extra}"
        )


# ---------------------------------------------------------------------------------------------
# JAX programs
# ---------------------------------------------------------------------------------------------
def hlo_of(fn: Callable[..., Any], *args: Any, optimized: bool = False) -> str:
    """The HLO text JAX produces for ``fn(*args)``: before XLA's passes, or the CPU-optimized module
    (fusions, layouts, bitcasts) when ``optimized``. Unused arguments are kept as parameters."""
    lowered = jax.jit(fn, keep_unused=True).lower(*args)
    return lowered.compile().as_text() if optimized else lowered.as_text(dialect="hlo")


def jax_outputs(fn: Callable[..., Any], *args: Any) -> list[np.ndarray]:
    """``fn(*args)`` run by JAX (jit, CPU), outputs flattened to numpy arrays."""
    out = jax.jit(fn, keep_unused=True)(*args)
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(out)]


def _parse(text: str) -> Any:
    from tpusim.compiler.hlo import parse_module

    return parse_module(text)


def check_against_jax(
    fn: Callable[..., Any],
    *args: Any,
    tol: Tolerance | str | None = None,
    optimized: bool = False,
) -> list[np.ndarray]:
    """Parse JAX's HLO of ``fn(*args)``, run the reference on it and compare with JAX's outputs.

    Args:
        fn: a jittable function.
        args: its (array) arguments.
        tol: a :class:`Tolerance`, the key of a row of :data:`TOLERANCES` (per output dtype), or None for
            the loosest row over the module's opcodes.
        optimized: run XLA's CPU-optimized module instead of the one JAX hands to XLA.

    Returns:
        The reference outputs.
    """
    from tpusim.compiler.hlo.reference import evaluate

    module = _parse(hlo_of(fn, *args, optimized=optimized))
    inputs = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
    got = evaluate(module, inputs)
    want = jax_outputs(fn, *args)
    assert len(got) == len(want), f"reference gives {len(got)} outputs, JAX {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        dt = element_type_of_dtype(w.dtype).name
        t = tol if isinstance(tol, Tolerance) else tolerance_for(tol, dt) if tol else module_tolerance(module, dt)
        assert_close(g, w, t, f"output {i}")
    return got


def check_spmd_against_jax(
    fn: Callable[..., Any], mesh: Any, *args: Any, tol: Tolerance | str | None = None
) -> list[list[np.ndarray]]:
    """Compile ``fn`` (a jitted shard_map program) over ``mesh``, run its per-device (SPMD-partitioned)
    module with :func:`evaluate_spmd` on the shards JAX gives each device, and compare every device's
    outputs with the matching shards of JAX's results.

    ``args`` must already be placed with their shardings (``jax.device_put(x, NamedSharding(...))``).
    Partition ``p`` is ``mesh.devices.flat[p]``.
    """
    from tpusim.compiler.hlo.reference import evaluate_spmd

    compiled = jax.jit(fn).lower(*args).compile()
    module = _parse(compiled.as_text())
    devices = list(mesh.devices.flat)
    leaves = jax.tree_util.tree_leaves(args)

    def shard(arr: Any, dev: Any) -> np.ndarray:
        index = arr.sharding.devices_indices_map(arr.shape)[dev]
        return np.asarray(arr)[index]

    per_device = [[shard(a, d) for a in leaves] for d in devices]
    got = evaluate_spmd(module, per_device)
    outs = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    for p, dev in enumerate(devices):
        want = [shard(o, dev) for o in outs]
        assert len(got[p]) == len(want), f"device {p}: reference gives {len(got[p])} outputs, JAX {len(want)}"
        for i, (g, w) in enumerate(zip(got[p], want)):
            dt = element_type_of_dtype(w.dtype).name
            t = tol if isinstance(tol, Tolerance) else tolerance_for(tol, dt) if tol else module_tolerance(module, dt)
            assert_close(g, w, t, f"device {p} output {i}")
    return got
