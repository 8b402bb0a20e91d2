"""The fallback unit: runs an HLO computation from the program's kernel table on operand bytes.

This is how every HLO op runs, including those without a hardware lowering. The numbers come from an
*evaluator* ``(hlo_text, input arrays) -> output arrays`` the caller passes to ``System.run(...,
fallback_evaluator=...)``; ``tpusim.simulate`` passes the reference interpreter
(:func:`tpusim.api.reference_evaluator`). The device model itself knows no HLO.

Timing: the core's single fallback unit is busy for the kernel's declared cost
(:meth:`tpusim.isa.FallbackKernel.cycles`), with ``bytes`` = the bytes the operand blocks span.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from tpusim.devices.stores import read_value, write_value
from tpusim.devices.units import Access, ComputeSpec, Cost, register_compute
from tpusim.isa import Fallback, FallbackKernel

if TYPE_CHECKING:
    from tpusim.config import ChipConfig
    from tpusim.devices.core import Core

__all__ = ["FallbackEvaluator", "fallback_cost"]

FallbackEvaluator = Callable[[str, list[np.ndarray]], list[np.ndarray]]


def fallback_cost(kernel: FallbackKernel, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    nbytes = sum(a.hi - a.lo for a in reads + writes)
    return Cost(kernel.cycles(nbytes), 0, nbytes, kernel.flops, "fallback")


def _cost(cfg: ChipConfig, ins: Fallback, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> Cost:
    raise AssertionError("the core binds each fallback's cost to its kernel")  # see Core.decode


def _execute(core: Core, ins: Fallback, reads: tuple[Access, ...], writes: tuple[Access, ...]) -> None:
    kernel = core.machine.program.fallback(ins.kernel)
    evaluate = core.machine.fallback_evaluator
    if evaluate is None:
        raise core.error(
            ins,
            f"fallback kernel {ins.kernel!r} needs an evaluator: pass run(..., fallback_evaluator="
            "tpusim.api.reference_evaluator()) (tpusim.simulate does)",
        )
    values = [read_value(a.store, a.address, a.shape, a.offsets, a.sizes) for a in reads]
    try:
        outputs = evaluate(kernel.hlo, values)
    except Exception as e:  # the evaluator is user-replaceable: report any failure at the instruction
        # (an error's own ``message``, when it has one, leaves out where it was in the kernel's text, whose
        # lines are not the program's: core.error names the instruction and its HLO origin)
        said = getattr(e, "message", None)
        raise core.error(ins, f"fallback kernel {ins.kernel!r} failed: {type(e).__name__}: {said or e}") from e
    if len(outputs) != len(writes):
        raise core.error(
            ins, f"fallback kernel {ins.kernel!r} returned {len(outputs)} values for {len(writes)} outputs"
        )
    for k, (a, v) in enumerate(zip(writes, outputs)):
        v = np.asarray(v)
        et = a.shape.element_type
        if v.shape != a.dims or v.dtype != et.dtype:
            raise core.error(
                ins,
                f"fallback kernel {ins.kernel!r} output {k} is {v.dtype}{list(v.shape)}, "
                f"but the operand is {et}{list(a.dims)}",
            )
        write_value(a.store, a.address, a.shape, a.offsets, a.sizes, v)


def _check(cfg: ChipConfig, ins: Fallback) -> str | None:
    return None


register_compute(Fallback, ComputeSpec(lambda i: (i.inputs, i.outputs), _check, _cost, _execute))
