"""Shared by the end-to-end tests (programs suite, layouts, golden snapshots): run a program on the device
model and check every output against the reference interpreter with the tolerance of ``tpusim.check``.

The oracle follows what the device computes for f32 matmuls (see ``tpusim.check``'s docstring):

* ``matmul_precision="highest"`` (six bf16 passes, f32-accurate): the exact reference, bound
  ``TOLERANCES[("f32", "bf16_6x")]``;
* ``"default"`` (one bf16 pass, XLA's DEFAULT on TPU): the reference run on ``emulate_one_pass(module)``,
  which rounds the f32 operands of every dot and convolution to bf16 first, bound ``("f32", "bf16")``.
  That emulation is only exact for the FIRST matmul of a chain: when a later matmul's operand is the result
  of an earlier one, the device's and the reference's values differ in the last f32 bits (summation order),
  and the bf16 rounding of the two can land on neighbouring bf16 values, a 2^-8 relative step that no f32
  bound covers. Programs with chained f32 matmuls therefore run at ``highest`` (see each case's reason).

bf16 matmuls are exact products with f32 accumulation on both sides, so they run at the default.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

import tpusim
from tpusim.api import SimulationResult
from tpusim.check import OutputCheck, compare_outputs, emulate_one_pass
from tpusim.compiler.hlo import load_module
from tpusim.compiler.hlo.ir import Module
from tpusim.compiler.hlo.reference import evaluate
from tpusim.compiler.hlo.reference.core import Host
from tpusim.compiler.options import CompileOptions
from tpusim.report.summary import program_precision

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES_DIR = ROOT / "examples"

__all__ = ["EXAMPLES_DIR", "ROOT", "Checked", "example_module", "examples", "module_opcodes", "run_checked"]


@dataclass(frozen=True)
class Checked:
    """A device run and its comparison with the reference interpreter."""

    result: SimulationResult
    checks: tuple[OutputCheck, ...]
    precision: str

    @property
    def fallback_opcodes(self) -> frozenset[str]:
        return frozenset(op for _, _, op, _ in self.result.fallbacks)

    def assert_ok(self, what: str) -> None:
        bad = [str(c) for c in self.checks if not c.ok]
        assert not bad, f"{what} (MXU precision {self.precision}): " + "; ".join(bad)


def run_checked(
    module: Module,
    inputs: Sequence[Any],
    *,
    config: str = "tpu_v5e",
    options: CompileOptions | None = None,
    overrides: Sequence[str] = (),
    host: Callable[[], Host] | None = None,
) -> Checked:
    """Simulate ``module`` on ``inputs`` and compare every output with the reference interpreter.

    ``host`` makes the host side of infeed/outfeed/send/recv; device and reference each get a fresh one,
    and what the program sends to the host must agree as well."""
    device_host, reference_host = (host(), host()) if host is not None else (None, None)
    result = tpusim.simulate(
        module, list(inputs), config=config, options=options, overrides=overrides, host=device_host
    )
    precision = program_precision(result.compiled)
    exact = frozenset(n for _, n, op, _ in result.fallbacks if op in ("dot", "convolution"))
    oracle = emulate_one_pass(module, exact) if precision == "bf16" else module
    reference = evaluate(oracle, list(inputs), host=reference_host)
    if device_host is not None and reference_host is not None:
        for got, want in zip(device_host.outfeed, reference_host.outfeed, strict=True):
            assert np.array_equal(np.asarray(got), np.asarray(want)), "outfeed values differ from the reference"
        assert {k: [np.asarray(v).tolist() for v in vs] for k, vs in device_host.sent.items()} == {
            k: [np.asarray(v).tolist() for v in vs] for k, vs in reference_host.sent.items()
        }, "values sent to the host differ from the reference"
    assert len(result.outputs) == len(reference), f"{len(result.outputs)} outputs, the reference has {len(reference)}"
    for i, (d, r) in enumerate(zip(result.outputs, reference)):
        assert d.dtype == r.dtype and d.shape == r.shape, f"out{i}: {d.dtype}{d.shape} vs reference {r.dtype}{r.shape}"
    return Checked(result, tuple(compare_outputs(result.outputs, reference, precision)), precision)


def module_opcodes(module: Module) -> frozenset[str]:
    """Every opcode in every computation of ``module``."""
    return frozenset(i.opcode for c in module.computations for i in c.instructions)


@cache
def examples() -> dict[str, Any]:
    """``scripts/make_examples.py``'s registry (name -> Example: function, arguments, description)."""
    scripts = str(ROOT / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from make_examples import EXAMPLES

    return EXAMPLES


@cache
def example_module(name: str) -> Module:
    """The committed ``examples/<name>.hlo``, parsed."""
    return load_module(EXAMPLES_DIR / f"{name}.hlo")
