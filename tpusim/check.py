"""Comparing device outputs with the reference interpreter, with stated and justified tolerances.

Integers, predicates and data movement must match bit for bit. Floating-point outputs are compared by
``max |device - reference| / max(1, max |reference|)`` against :data:`TOLERANCES`, chosen by the element
type and by the MXU precision the program's dots and convolutions used (:func:`tolerance`):

- the device computes elementwise math with the reference's own functions, so elementwise-only programs
  match to rounding of the result type;
- an MXU pass rounds f32 operands to bf16 (8 significant bits, relative error 2^-9 each), so one pass
  (DEFAULT) leaves about 2^-8 relative error per product, which sums to a few 1e-3 and, with
  cancellation, up to ~2e-2 of the largest output; three passes (HIGH) leave ~2^-16, six (HIGHEST) are
  f32-accurate;
- sums are accumulated in a different order than the reference (per weight tile, then across tiles),
  which for f32 costs a few ulp of the largest partial sum;
- a bf16 result is rounded once from f32 on both sides, so one bf16 ulp (2^-8 relative) may differ.

A program whose f32 matmuls ran one bf16 pass (XLA's DEFAULT on TPU) is not compared with the exact
reference: the error of rounding the operands depends on the data and can be large after cancellation.
It is compared with the reference run on :func:`emulate_one_pass` of the module, which rounds every f32
operand of a dot or convolution to bf16 first, exactly what one MXU pass does; what remains is the
summation order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from tpusim.compiler.hlo.ir import Computation, Instruction, Module
from tpusim.memory import ElementType, Shape, element_type_of_dtype

__all__ = ["TOLERANCES", "OutputCheck", "compare_outputs", "emulate_one_pass", "tolerance"]

TOLERANCES: dict[tuple[str, str], float] = {
    # (element type, MXU precision of the program's matmuls: none | bf16 | bf16_3x | bf16_6x) -> bound
    ("f32", "none"): 1e-5,
    ("f32", "bf16_6x"): 1e-4,
    ("f32", "bf16_3x"): 1e-3,
    # Against the one-pass emulation: operands are already rounded, but in a chain of matmuls the later
    # operands differ from the emulation's in their last f32 bits, and where that flips a bf16 rounding the
    # products differ by one bf16 ulp (2^-8) of that operand; measured up to 1.2e-3 on the shipped examples.
    ("f32", "bf16"): 5e-3,
    ("f64", "none"): 1e-12,
    ("bf16", "none"): 2**-7,
    ("bf16", "bf16"): 2**-6,
    ("f16", "none"): 2**-10,
    ("f8", "none"): 2**-2,
}
"""Relative error bounds (see the module docstring for the reasoning behind each)."""


@dataclass(frozen=True, slots=True)
class OutputCheck:
    """One output compared: its index, element type, the error found, the bound, and the verdict."""

    index: int
    element_type: str
    error: float
    bound: float
    exact: bool

    @property
    def ok(self) -> bool:
        return self.error <= self.bound

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "MISMATCH"
        kind = "bit-exact required" if self.exact else f"relative error bound {self.bound:.1e}"
        return f"out{self.index} ({self.element_type}): max error {self.error:.3e} ({kind}) {verdict}"


def tolerance(et: ElementType, precision: str) -> tuple[float, bool]:
    """The bound for an output of type ``et`` and whether it must be bit-exact."""
    if not (et.is_float or et.is_complex):
        return 0.0, True
    name = "f8" if et.name.startswith("f8") or et.name.startswith("f4") else et.name
    if et.is_complex:
        name = "f32" if et.name == "c64" else "f64"
    return TOLERANCES.get((name, precision), TOLERANCES.get((name, "none"), 2**-7)), False


def compare_outputs(device: Sequence[np.ndarray], reference: Sequence[np.ndarray], precision: str) -> list[OutputCheck]:
    """Compare each device output with the reference output."""
    out = []
    for i, (d, r) in enumerate(zip(device, reference)):
        et = element_type_of_dtype(r.dtype)
        bound, exact = tolerance(et, precision)
        if exact:
            error = 0.0 if np.array_equal(d.view(et.raw_dtype), r.view(et.raw_dtype)) else float("inf")
        else:
            dv: np.ndarray = np.asarray(d, np.complex128 if et.is_complex else np.float64)
            rv: np.ndarray = np.asarray(r, dv_type(et))
            same_nan = np.isnan(dv) == np.isnan(rv)
            finite = np.isfinite(rv) & np.isfinite(dv)
            same_inf = (dv == rv) | finite | np.isnan(rv)
            if not (same_nan.all() and same_inf.all()):
                error = float("inf")
            elif finite.any():
                scale = max(1.0, float(np.max(np.abs(rv[finite]))))
                error = float(np.max(np.abs(dv[finite] - rv[finite]))) / scale
            else:
                error = 0.0
        out.append(OutputCheck(i, et.name, error, bound, exact))
    return out


def dv_type(et: ElementType) -> type:
    return np.complex128 if et.is_complex else np.float64


def emulate_one_pass(module: Module, exact: frozenset[str] = frozenset()) -> Module:
    """``module`` with every f32 operand of a dot or convolution rounded to bf16 (and back to f32).

    Args:
        module: the program as given.
        exact: names of dots and convolutions that did not run on the MXU (fallbacks compute them in f32);
            a compiled name ``x.y`` (an instruction ``y`` inlined from ``x``) also exempts ``y``.
    """
    comps = []
    for comp in module.computations:
        body: list[Instruction] = []
        names = {i.name for i in comp.instructions}
        for instr in comp.instructions:
            skip = instr.name in exact or any(e.endswith("." + instr.name) for e in exact)
            if instr.opcode in ("dot", "convolution") and not skip:
                operands = []
                for o in instr.operands:
                    shape = comp[o].shape
                    if isinstance(shape, Shape) and shape.element_type.name == "f32":
                        low, back = f"{o}.bf16", f"{o}.bf16.f32"
                        while low in names or back in names:
                            low, back = low + "_", back + "_"
                        names |= {low, back}
                        body.append(
                            Instruction(low, "convert", shape.with_element_type("bf16").with_layout(None), (o,))
                        )
                        body.append(Instruction(back, "convert", shape.with_layout(None), (low,)))
                        operands.append(back)
                    else:
                        operands.append(o)
                instr = replace(instr, operands=tuple(operands))
            body.append(instr)
        comps.append(Computation(comp.name, tuple(body), comp.root, comp.is_entry, comp.attributes))
    return replace(module, computations=tuple(comps))
