"""The compiler pipeline: HLO module -> instruction stream, one plain pass after another.

``compile_module`` is the whole compiler; each step is a function of the previous step's result, and
``TPUSIM_DEBUG=2`` prints the module (or program) after each one.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np

from tpusim.compiler.buffer_assignment import BufferAssignment, assign_buffers, leaf_paths
from tpusim.compiler.hlo.ir import Module
from tpusim.compiler.hlo.printer import print_module
from tpusim.compiler.layout_assignment import Relayout, assign_layouts
from tpusim.compiler.lowering import lower_module
from tpusim.compiler.lowering.context import CompileOptions
from tpusim.compiler.passes import prepare_module
from tpusim.compiler.tiling_rules import load_tiling_rules
from tpusim.config import ChipConfig
from tpusim.isa import MemRef, Program, Space
from tpusim.isa.text import print_program
from tpusim.memory import Shape, pack

__all__ = ["CompileOptions", "CompiledProgram", "compile_module"]


@dataclass(frozen=True)
class CompiledProgram:
    """A program ready to load: code, where inputs go, where outputs come from, and constant data.

    Attributes:
        program: the instruction streams and fallback kernels.
        module: the module as lowered (after fusion and layout assignment).
        buffers: its HBM buffer assignment.
        inputs: per entry parameter, the HBM arrays of its array leaves.
        outputs: the HBM arrays of the entry result's leaves, flattened in order.
        constants: ``(HBM array, bytes)`` to write before the program starts.
        relayouts: layout-changing copies inserted by layout assignment.
        fallbacks: ``(computation, instruction, opcode, reason)`` of instructions run as fallbacks.
        hbm_bytes: the highest HBM byte the program touches.
        config: the chip it was compiled for.
        options: the compile options.
    """

    program: Program
    module: Module
    buffers: BufferAssignment
    inputs: tuple[tuple[MemRef, ...], ...]
    outputs: tuple[MemRef, ...]
    constants: tuple[tuple[MemRef, bytes], ...]
    relayouts: tuple[Relayout, ...]
    fallbacks: tuple[tuple[str, str, str, str], ...]
    hbm_bytes: int
    config: ChipConfig
    options: CompileOptions


def _debug(stage: str, text_fn: object) -> None:
    if os.environ.get("TPUSIM_DEBUG", "0") >= "2":
        print(f"===== after {stage} =====\n{text_fn() if callable(text_fn) else text_fn}", file=sys.stderr)


def compile_module(module: Module, config: ChipConfig, options: CompileOptions | None = None) -> CompiledProgram:
    """Compile an HLO module for a chip.

    Raises:
        CompileError / OutOfMemoryError: naming the instruction, buffer and sizes involved.
    """
    options = options or CompileOptions()
    rules = load_tiling_rules(options.tiling, sublanes=config.vpu.sublanes, lanes=config.vpu.lanes)
    module = prepare_module(module, options)  # fuse elementwise chains; unfuse what fusions cannot hold
    _debug("prepare", lambda: print_module(module))
    laid_out = assign_layouts(module, rules)  # every array value gets a complete tiled layout
    module = laid_out.module
    _debug("layout assignment", lambda: print_module(module))
    buffers = assign_buffers(module, config.hbm.bytes)  # HBM addresses by liveness, in-place loop state
    lowered = lower_module(module, buffers, config, options, rules)  # tile loops of ISA instructions
    _debug("lowering", lambda: print_program(lowered.program))
    entry = module.entry_computation
    inputs = tuple(
        tuple(
            MemRef(Space.HBM, buffers.buffer(entry.name, p.name, path).offset, shape)
            for path, shape in leaf_paths(p.shape)
        )
        for p in entry.parameters
    )
    outputs = tuple(
        MemRef(Space.HBM, buffers.buffer(entry.name, entry.root, path).offset, shape)
        for path, shape in leaf_paths(entry.root_instruction.shape)
    )
    return CompiledProgram(
        program=lowered.program,
        module=module,
        buffers=buffers,
        inputs=inputs,
        outputs=outputs,
        constants=_constants(module, buffers) + lowered.constants,
        relayouts=laid_out.relayouts,
        fallbacks=lowered.fallbacks,
        hbm_bytes=lowered.hbm_bytes,
        config=config,
        options=options,
    )


def _constants(module: Module, buffers: BufferAssignment) -> tuple[tuple[MemRef, bytes], ...]:
    out: list[tuple[MemRef, bytes]] = []
    for (comp, name, path), buffer_id in buffers.leaves.items():
        instr = module[comp][name]
        if instr.opcode != "constant":
            continue
        literal = instr.attr("literal")
        for i in path:
            literal = literal.tuple_elements[i]
        leaf = instr.shape
        for i in path:
            leaf = leaf.elements[i]  # type: ignore[union-attr]
        assert isinstance(leaf, Shape)
        value = np.asarray(literal.value, dtype=leaf.element_type.dtype).reshape(leaf.dimensions)
        ref = MemRef(Space.HBM, buffers.buffers[buffer_id].offset, leaf)
        out.append((ref, pack(value, leaf).tobytes()))
    return tuple(out)
