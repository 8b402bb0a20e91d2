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
    "Op",
    "Tolerance",
    "assert_close",
    "check_against_jax",
    "check_spmd_against_jax",
    "convolution_text",
    "hlo_of",
    "jax_outputs",
    "module_tolerance",
    "ops_module",
    "run_hlo_on_xla",
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

# Keyed by (opcode or category, element type name); "*" matches every type. Anything absent is EXACT:
# integer and pred arithmetic, comparisons, data movement, convert, select, collectives on integers, and
# the correctly rounded float ops (add, subtract, multiply, divide, sqrt, remainder, rounding ...) which
# XLA CPU and the reference both compute with one IEEE rounding (bit for bit, denormal flushing included).
#
# Transcendentals: XLA CPU evaluates them with its own polynomial approximations; the reference gives
# the correctly rounded f32/f64 value. The figures are the maximum differences measured by
# tests/test_reference_elementwise.py::test_measured_differences (1536 points per type: every special
# value paired with every other, seeded random values; `pytest -s -k measured` prints them) plus one ulp
# of margin for inputs outside that sample. bf16 and the f8 types measured 0 ulp: the few-ulp f32 error
# vanishes in their rounding. f16 expm1 differs by 2 ulp (XLA evaluates it step by step in f16).
TOLERANCES: dict[tuple[str, str], Tolerance] = {}

_MEASURED_ULPS: dict[str, dict[str, int]] = {
    # opcode: {type: max measured ulp difference}
    "rsqrt": {"f32": 1, "f64": 1},
    "cbrt": {"f32": 1, "f64": 2},
    "exponential": {"f32": 1, "f64": 1},
    "exponential-minus-one": {"f32": 3, "f64": 3, "f16": 2},
    "log": {"f32": 1, "f64": 0},
    "log-plus-one": {"f32": 2, "f64": 52},
    "sine": {"f32": 1, "f64": 0},
    "cosine": {"f32": 1, "f64": 0},
    "tan": {"f32": 1, "f64": 1},
    "tanh": {"f32": 3, "f64": 7},
    "logistic": {"f32": 2, "f64": 2},
    "erf": {"f32": 3, "f64": 6},
    "power": {"f32": 0, "f64": 1},
    "atan2": {"f32": 1, "f64": 1},
}
for _op, _per_type in _MEASURED_ULPS.items():
    for _t in ("f32", "f64", "bf16", "f16", "f8e4m3fn", "f8e5m2"):
        _m = _per_type.get(_t, 0)
        TOLERANCES[(_op, _t)] = Tolerance(ulps=_m + 1, why=f"XLA CPU's own approximation: measured {_m} ulp, +1 margin")

# Complex ops: XLA computes c64 with f32 parts (products, hypot, sin*cosh ...); the reference in c128 then
# rounds, so parts that cancel differ by many ulp of the part but little relative to |z|. Measured max
# |reference - XLA| / |XLA|: c64 2.5e-6 (sine), c128 4.1e-15 (sine).
for _op in ("abs", "sign", "sqrt", "exponential", "log", "tanh", "sine", "cosine", "multiply", "divide", "power",
            "rsqrt", "exponential-minus-one", "log-plus-one", "tan", "logistic"):  # fmt: skip
    TOLERANCES[(_op, "c64")] = Tolerance(rtol=4e-6, why="f32 part arithmetic in XLA: measured 2.5e-6 of abs(z)")
    TOLERANCES[(_op, "c128")] = Tolerance(rtol=8e-15, why="f64 part arithmetic in XLA: measured 4.1e-15 of abs(z)")

# Heavy ops (dot, convolution, reductions, FFT, linear algebra, batch norm): the rows and measurements of
# the heavy-op tests (tests/heavy_checks.py), kept here so the table is one table.
_F32C = ("f32", "c64")
_F64C = ("f64", "c128")
_NARROW16 = ("bf16", "f16")


def _rows(ops: Sequence[str], dtypes: Sequence[str], tol: Tolerance) -> None:
    for op in ops:
        for dt in dtypes:
            TOLERANCES[(op, dt)] = tol


_rows(("dot", "convolution"), _F32C, Tolerance(ulps=8, atol=2e-5, rtol=1e-5, why="f32 sums in another order"))
_rows(("dot", "convolution"), _F64C, Tolerance(ulps=8, atol=1e-13, rtol=1e-13, why="f64 sum order"))
_rows(("dot", "convolution"), _NARROW16, Tolerance(ulps=1, why="one rounding of an f32 sum computed in another order"))
_rows(("reduce", "reduce-window"), _F32C, Tolerance(ulps=16, atol=1e-5, rtol=1e-5, why="f32 sum order"))
_rows(("reduce", "reduce-window"), _F64C, Tolerance(ulps=16, atol=1e-13, rtol=1e-12, why="f64 sum order"))
_rows(("reduce", "reduce-window"), ("bf16",), Tolerance(ulps=2, atol=3e-2, why="XLA CPU rounds partial sums to bf16"))
_rows(("reduce", "reduce-window"), ("f16",), Tolerance(ulps=2, atol=4e-3, why="XLA CPU rounds partial sums to f16"))
_rows(("fft",), _F32C, Tolerance(ulps=8, atol=2e-5, rtol=1e-5, why="f32 FFT butterflies against an f64 FFT"))
_rows(("fft",), _F64C, Tolerance(ulps=8, atol=1e-12, rtol=1e-12, why="FFT rounding"))
_rows(
    ("cholesky", "triangular-solve", "custom-call"),
    _F32C,
    Tolerance(ulps=64, atol=5e-5, rtol=5e-5, why="f32 LAPACK against an f64 factorisation, cond < 100"),
)
_rows(
    ("cholesky", "triangular-solve", "custom-call"),
    _F64C,
    Tolerance(ulps=64, atol=1e-12, rtol=1e-12, why="f64 LAPACK against the reference's f64 factorisation"),
)
_rows(
    ("batch-norm-training", "batch-norm-inference", "batch-norm-grad"),
    ("f32", "c64"),
    Tolerance(ulps=16, atol=1e-5, rtol=1e-5, why="mean/variance sums in another order"),
)
_rows(
    ("batch-norm-training", "batch-norm-inference", "batch-norm-grad"),
    _NARROW16,
    Tolerance(ulps=1, why="f32 statistics rounded once"),
)

# Programs built from many ops (reductions in another order, fused f32 intermediates): relative error.
TOLERANCES[("composite", "f32")] = Tolerance(ulps=64, atol=1e-6, rtol=1e-5, why="sum order and transcendentals")
TOLERANCES[("composite", "c64")] = Tolerance(ulps=64, atol=1e-6, rtol=1e-5, why="sum order and transcendentals")
TOLERANCES[("composite", "f64")] = Tolerance(ulps=64, atol=1e-13, rtol=1e-12, why="sum order")
TOLERANCES[("composite", "c128")] = Tolerance(ulps=64, atol=1e-13, rtol=1e-12, why="sum order")
for _t in ("bf16", "f16"):
    TOLERANCES[("composite", _t)] = Tolerance(ulps=2, atol=1e-2, rtol=1e-2, why="f32 intermediates kept by fusions")
# A deep bf16 program run unfused (a transformer block): the reference rounds to bf16 after every HLO op,
# XLA CPU keeps f32 inside its fusions. Along the block's longest chain there are 12 such roundings (layer
# norm, qkv, scores, softmax, attention, wo, residual, layer norm, w1, gelu, w2, residual), each off by at
# most half a bf16 ulp (u = 2^-8) of a value of the output's scale (layer norm keeps it near 1): 12 u/2 = 6u.
# The row allows 8u = 2^-5 absolute plus relative; over 40 input draws the worst error used 0.61 of it
# (the composite row's 1e-2 failed 11 of the 40).
TOLERANCES[("deep", "bf16")] = Tolerance(ulps=2, atol=2**-5, rtol=2**-5, why="a bf16 rounding per unfused op, 12 deep")
TOLERANCES[("deep", "f32")] = TOLERANCES[("composite", "f32")]


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
    flat = np.asarray(a).reshape(-1)
    if bits == 64:
        raw = flat.view(np.int64)
        out = np.where(raw < 0, -(raw & 0x7FFF_FFFF_FFFF_FFFF) - 1, raw)
    else:
        raw = flat.view(f"u{a.dtype.itemsize}").astype(np.int64)
        sign = np.int64(1) << (bits - 1)
        mag = raw & (sign - 1)
        out = np.where(raw & sign, -mag - 1, mag)
    return out.reshape(np.shape(a))


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise distance in ulp between two float arrays of the same dtype (NaN vs NaN is 0; NaN vs
    a number is huge)."""
    a, b = np.asarray(a), np.asarray(b)
    with np.errstate(invalid="ignore"):
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
    if kind == "complex" and not tol.exact:
        w128, g128 = want.astype(np.complex128), got.astype(np.complex128)
        with np.errstate(all="ignore"):
            err = np.abs(g128 - w128)
            part_ulps = np.maximum(ulp_distance(got.real, want.real), ulp_distance(got.imag, want.imag))
            bad = (part_ulps > tol.ulps) & ~(err <= tol.atol + tol.rtol * np.abs(w128))
        if np.any(bad):
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise AssertionError(
                f"{what}: {int(np.sum(bad))} of {want.size} elements differ beyond {tol}; first at {first}: "
                f"reference {got[first]!r}, JAX {want[first]!r}"
            )
        return
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
    inputs = [np.asarray(jax.numpy.asarray(a)) for a in jax.tree_util.tree_leaves(args)]  # JAX's dtypes
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


# ---------------------------------------------------------------------------------------------
# HLO text straight to XLA CPU (for ops and attributes JAX's API cannot express)
# ---------------------------------------------------------------------------------------------
def convolution_text(lhs: str, rhs: str, out: str, attrs: str) -> str:
    """HLO text of a module computing one ``convolution`` of two parameters (shapes as HLO text)."""
    return (
        f"HloModule conv\nENTRY e {{\n  a = {lhs} parameter(0)\n  b = {rhs} parameter(1)\n"
        f"  ROOT c = {out} convolution(a, b), {attrs}\n}}\n"
    )


def run_hlo_on_xla(text: str, *args: np.ndarray) -> list[np.ndarray]:
    """Compile HLO ``text`` with XLA's CPU backend (through jaxlib) and run it on ``args``; the outputs are
    flattened. Uses jaxlib internals (HLO text -> StableHLO -> PjRt compile), pinned by the jax version of
    the test extra."""
    import jax._src.lib as jaxlib_mod
    from jax._src.interpreters import mlir as jmlir
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir as mlir_ir

    module = jaxlib_mod.hlo.hlo_module_from_text(text)
    stablehlo = xla_client._xla.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    device = jax.devices("cpu")[0]
    with jmlir.make_ir_context():
        parsed = mlir_ir.Module.parse(stablehlo)
        exe = device.client.compile_and_load(str(parsed), xla_client.DeviceList((device,)), xla_client.CompileOptions())
    with jax.enable_x64(True):
        buffers = [jax.device_put(np.asarray(a), device) for a in args]
        results = exe.execute_sharded(buffers)
        return [np.asarray(r[0]) for r in results.disassemble_into_single_device_arrays()]


@dataclass(frozen=True)
class Op:
    """One instruction of a generated test module: ``r<k> = <result>[n] <opcode>(p<i>, ...)<attrs_text>``.

    Attributes:
        opcode: the HLO opcode.
        result: the result element type name.
        operands: parameter numbers of the operands.
        attrs_text: the attribute text as XLA reads it (``", direction=LT"``).
        attrs: the same attributes as typed IR values (until the parser lands, tests build IR by hand).
    """

    opcode: str
    result: str
    operands: tuple[int, ...]
    attrs_text: str = ""
    attrs: tuple[tuple[str, Any], ...] = ()


def ops_module(param_types: Sequence[str], dims: Sequence[int], ops: Sequence[Op]) -> tuple[str, Any]:
    """An HLO module (text for XLA, IR for the reference) whose parameters have ``param_types`` and dimensions
    ``dims`` and whose root tuple holds one result per op."""
    from tpusim.compiler.hlo import ir
    from tpusim.memory import Shape, TupleShape

    d = ",".join(map(str, dims))
    lines = [f"  p{i} = {t}[{d}] parameter({i})" for i, t in enumerate(param_types)]
    instrs = [
        ir.Instruction(f"p{i}", "parameter", Shape(t, tuple(dims)), (), ir.Attributes({"parameter_number": i}))
        for i, t in enumerate(param_types)
    ]
    for k, op in enumerate(ops):
        operands = ", ".join(f"p{i}" for i in op.operands)
        lines.append(f"  r{k} = {op.result}[{d}] {op.opcode}({operands}){op.attrs_text}")
        instrs.append(
            ir.Instruction(
                f"r{k}",
                op.opcode,
                Shape(op.result, tuple(dims)),
                tuple(f"p{i}" for i in op.operands),
                ir.Attributes(op.attrs),
            )
        )
    shapes = ", ".join(f"{op.result}[{d}]" for op in ops)
    names = ", ".join(f"r{k}" for k in range(len(ops)))
    lines.append(f"  ROOT out = ({shapes}) tuple({names})")
    instrs.append(
        ir.Instruction(
            "out",
            "tuple",
            TupleShape(tuple(Shape(op.result, tuple(dims)) for op in ops)),
            tuple(f"r{k}" for k in range(len(ops))),
        )
    )
    text = "HloModule ops\n\nENTRY main {\n" + "\n".join(lines) + "\n}\n"
    comp = ir.Computation("main", tuple(instrs), "out", is_entry=True)
    return text, ir.Module("ops", (comp,), "main")
