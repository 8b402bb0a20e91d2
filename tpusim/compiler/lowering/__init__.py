"""Lowering: every HLO instruction of a layout- and buffer-assigned module becomes ISA instructions.

Per-opcode rules live in :data:`registry.LOWERINGS` (filled by the modules imported below); anything
without a rule, or whose rule declines, runs as a fallback (:mod:`.fallback`).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tpusim.compiler.buffer_assignment import BufferAssignment
from tpusim.compiler.hlo.ir import Module
from tpusim.compiler.hlo.opcodes import talks_to_other_devices
from tpusim.compiler.lowering.context import Lowering
from tpusim.compiler.lowering.registry import LOWERINGS, NotLowerable, lowering
from tpusim.compiler.lowering.sequential import lower_computation
from tpusim.compiler.lowering.wait_sinking import sink_waits
from tpusim.compiler.options import CompileOptions
from tpusim.compiler.tiling_rules import TilingRules
from tpusim.config import ChipConfig
from tpusim.isa import Halt, MemRef, Program

__all__ = [
    "LOWERINGS",
    "Lowered",
    "NotLowerable",
    "lower_module",
    "lowering",
    "megacore_cores",
]

# Every module of this package registers its rules when imported: import them all, so a new lowering is
# one new module.
for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")


@dataclass(frozen=True)
class Lowered:
    program: Program
    fallbacks: tuple[tuple[str, str, str, str], ...]
    hbm_bytes: int
    constants: tuple[tuple[MemRef, np.ndarray], ...]


def megacore_cores(module: Module, config: ChipConfig, options: CompileOptions) -> int:
    """How many TensorCores of the chip the program's streams use: ``core.count`` with megacore, except for
    programs of several devices (collectives, sends and receives, device ids), which run on core 0."""
    if not options.megacore or config.core.count == 1 or talks_to_other_devices(module):
        return 1
    return config.core.count


def lower_module(
    module: Module,
    buffers: BufferAssignment,
    config: ChipConfig,
    options: CompileOptions,
    rules: TilingRules,
    epilogues: Mapping[tuple[str, str], str] | None = None,
) -> Lowered:
    """Lower the entry computation (and, through control flow, everything it calls): for core 0, or with
    megacore for every core of the chip (one stream each, see :mod:`.sequential`)."""
    cores = megacore_cores(module, config, options)
    ctx = Lowering(module, buffers, config, options, rules, cores=cores, epilogues=epilogues)
    ctx.init_pools(reserved_registers=len(ctx.async_registers))
    ctx.start_async()  # (the write position of the async sequencer's request ring, when it may be used)
    lower_computation(ctx, module.entry)
    ctx.finish_async()  # (the async sequencer's dispatcher ends its stream)
    for b in ctx.streams:
        if not b.sequencer:
            b.emit(Halt())
    # (waits of synchronous DMAs deferred to where their data is needed: see wait_sinking)
    program = Program(tuple(sink_waits(b.build()) for b in ctx.streams), (), tuple(ctx.kernels), name=module.name)
    return Lowered(program, tuple(ctx.fallen_back), ctx.hbm_peak + ctx.async_hbm_used, tuple(ctx.constants))
