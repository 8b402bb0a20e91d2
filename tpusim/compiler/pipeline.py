"""The compiler pipeline: HLO module -> instruction stream, one plain pass after another.

``compile_module`` is the whole compiler; each step is a function of the previous step's result, and
``TPUSIM_DEBUG=2`` prints the module (or program) after each one.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import numpy as np

from tpusim.compiler.buffer_assignment import BufferAssignment, assign_buffers, leaf_paths
from tpusim.compiler.canonical import canonicalize
from tpusim.compiler.collective_schedule import schedule_collectives
from tpusim.compiler.conv_fold import fold_narrow_windows
from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo import verify_module
from tpusim.compiler.hlo.ir import Module
from tpusim.compiler.hlo.opcodes import talks_to_other_devices
from tpusim.compiler.hlo.printer import print_module
from tpusim.compiler.layout_assignment import Relayout, assign_layouts
from tpusim.compiler.lowering import lower_module, megacore_cores
from tpusim.compiler.lowering.collective_sync import LOCAL_SEMAPHORES, reserved_semaphores
from tpusim.compiler.lowering.epilogue import find_epilogues
from tpusim.compiler.lowering.prologue import find_prologues
from tpusim.compiler.memory_spaces import keep_on_chip, scalar_parameters_in_smem
from tpusim.compiler.options import CompileOptions
from tpusim.compiler.passes import prepare_module
from tpusim.compiler.precision import normalize_precision
from tpusim.compiler.tiling_rules import load_tiling_rules
from tpusim.compiler.verify import verify_program
from tpusim.config import ChipConfig
from tpusim.flags import debug_level, verify_enabled
from tpusim.gcpause import paused_gc
from tpusim.isa import MemRef, Program, Space, Symbol
from tpusim.isa.text import print_program
from tpusim.memory import Shape

__all__ = ["CompileOptions", "CompiledProgram", "check_supported", "compile_module"]


@dataclass(frozen=True)
class CompiledProgram:
    """A program ready to load: code, where inputs go, where outputs come from, and constant data.

    Attributes:
        program: the instruction streams, fallback kernels, and symbols ``arg<i>[.<j>...]`` (entry parameter
            leaves), ``out<j>`` (entry result leaves) and ``const<k>`` (constants to place before the run).
        source: the module as given (its parameters and results define the program's inputs and outputs).
        module: the module as lowered (after fusion and layout assignment).
        buffers: its HBM buffer assignment.
        inputs: per entry parameter, the HBM arrays of its array leaves.
        outputs: the HBM arrays of the entry result's leaves, flattened in order.
        constants: ``(HBM array, value)`` to write before the program starts (symbols ``const<k>``).
        relayouts: layout-changing copies inserted by layout assignment.
        fallbacks: ``(computation, instruction, opcode, reason)`` of instructions run as fallbacks.
        hbm_bytes: the highest HBM byte the program touches.
        config: the chip it was compiled for.
        options: the compile options.
    """

    program: Program
    source: Module
    module: Module
    buffers: BufferAssignment
    inputs: tuple[tuple[MemRef, ...], ...]
    outputs: tuple[MemRef, ...]
    constants: tuple[tuple[MemRef, np.ndarray], ...]
    relayouts: tuple[Relayout, ...]
    fallbacks: tuple[tuple[str, str, str, str], ...]
    hbm_bytes: int
    config: ChipConfig
    options: CompileOptions


def _debug(stage: str, text_fn: object) -> None:
    if debug_level() >= 2:
        print(f"===== after {stage} =====\n{text_fn() if callable(text_fn) else text_fn}", file=sys.stderr)


def compile_module(module: Module, config: ChipConfig, options: CompileOptions | None = None) -> CompiledProgram:
    """Compile an HLO module for a chip.

    Raises:
        CompileError / OutOfMemoryError: naming the instruction, buffer and sizes involved.
    """
    with paused_gc():  # (an unrolled program is hundreds of thousands of long-lived objects: tpusim.gcpause)
        return _compile(module, config, options)


def _compile(module: Module, config: ChipConfig, options: CompileOptions | None) -> CompiledProgram:
    options = options or CompileOptions()
    source = module
    check_supported(module)
    module = canonicalize(module)  # XLA:TPU's compiled forms as plain HLO (nested fusions, ConcatBitcast, ...)
    module = normalize_precision(module)  # mixed float types made explicit converts (XLA's FloatNormalization)
    rules = load_tiling_rules(options.tiling, sublanes=config.vpu.sublanes, lanes=config.vpu.lanes)
    checking = verify_enabled()
    module = fold_narrow_windows(module, config.vmem.bytes)  # weight gradients: a window axis beside the features
    module = prepare_module(module, options)  # fuse elementwise chains; unfuse what fusions cannot hold
    if options.async_collectives:  # collectives as async pairs around independent compute, if semaphores allow
        scheduled = schedule_collectives(module)
        room = config.core.semaphores - LOCAL_SEMAPHORES
        if scheduled is not module and reserved_semaphores(scheduled, config) <= room:
            module = scheduled
    _debug("prepare", lambda: print_module(module))
    if checking:
        verify_module(module)
    laid_out = assign_layouts(module, rules, config)  # every array value gets a complete tiled layout
    module = laid_out.module
    # VMEM-resident buffers (S(1)) are per core: a program split across TensorCores, or one that exchanges
    # data with other chips (its collectives move HBM arrays), keeps its values in HBM.
    single = megacore_cores(module, config, options) == 1 and not talks_to_other_devices(module)
    if laid_out.chosen:  # tpusim laid the module out: it also decides what stays in VMEM (XLA's MSA)
        module = keep_on_chip(module, loop_state=single)
    module = scalar_parameters_in_smem(module)  # scalar arguments read from SMEM by the scalar unit
    _debug("layout assignment", lambda: print_module(module))
    if checking:
        verify_module(module)
    resident = int(config.vmem.bytes * options.resident_vmem_fraction) if single else 0
    vreg = config.vpu.sublanes * config.vpu.lanes * 4
    # An epilogue fusion's code runs inside its product's: its result is live from the product on.
    epilogues = find_epilogues(module)
    early = {(comp, user): dot for (comp, dot), user in epilogues.items()}
    # A prologue fusion's code runs inside its product's: its operands are read until the product.
    held = {
        (comp, o): dot for (comp, fusion), dot in find_prologues(module).items() for o in module[comp][fusion].operands
    }
    buffers = assign_buffers(  # by liveness
        module, config.hbm.bytes, config.smem.bytes, resident, vreg, early, held, laid_out.byte_bitcasts
    )
    lowered = lower_module(module, buffers, config, options, rules, epilogues)  # tile loops of ISA instructions
    _debug("lowering", lambda: print_program(lowered.program))
    if checking:
        verify_program(lowered.program, config)  # in bounds, aligned, defined before use, every DMA waited
    entry = module.entry_computation
    inputs = tuple(
        tuple(_ref(buffers, entry.name, p.name, path, shape) for path, shape in leaf_paths(p.shape))
        for p in entry.parameters
    )
    root_leaves = leaf_paths(entry.root_instruction.shape)
    outputs = tuple(_ref(buffers, entry.name, entry.root, path, shape) for path, shape in root_leaves)
    constants = _constants(module, buffers) + lowered.constants
    symbols = [
        Symbol(f"arg{i}" + "".join(f".{j}" for j in path), ref)
        for i, p in enumerate(entry.parameters)
        for (path, _), ref in zip(leaf_paths(p.shape), inputs[i])
    ]
    symbols += [Symbol(f"out{j}", ref) for j, ref in enumerate(outputs)]
    symbols += [Symbol(f"const{k}", ref) for k, (ref, _) in enumerate(constants)]
    return CompiledProgram(
        program=replace(lowered.program, symbols=tuple(symbols)),
        source=source,
        module=module,
        buffers=buffers,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        relayouts=laid_out.relayouts,
        fallbacks=lowered.fallbacks,
        hbm_bytes=lowered.hbm_bytes,
        config=config,
        options=options,
    )


def check_supported(module: Module) -> None:
    """Reject, naming the instruction, shapes the compiler cannot lay out: sparse layouts (``D(C)`` ...) and
    dynamic dimensions (``<=N``, ``?``); both are valid HLO that tpusim does not simulate."""
    for comp in module.computations:
        for instr in comp.instructions:
            for _, leaf in leaf_paths(instr.shape):
                if leaf.layout is not None and leaf.layout.is_sparse:
                    raise CompileError(
                        f"shape {leaf} has a sparse layout (D(...)); tpusim compiles dense arrays only",
                        instr,
                        comp.name,
                    )
                if any(leaf.dynamic):
                    raise CompileError(
                        f"shape {leaf} has dynamic dimensions (<=N or ?); tpusim compiles static shapes only",
                        instr,
                        comp.name,
                    )


def _ref(buffers: BufferAssignment, comp: str, value: str, path: tuple[int, ...], shape: Shape) -> MemRef:
    return MemRef(Space.HBM, buffers.buffer(comp, value, path).offset, shape)


def _constants(module: Module, buffers: BufferAssignment) -> tuple[tuple[MemRef, np.ndarray], ...]:
    out: list[tuple[MemRef, np.ndarray]] = []
    seen: set[int] = set()
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
        if buffer_id in seen:
            continue
        seen.add(buffer_id)
        value = np.asarray(literal.value, dtype=leaf.element_type.dtype).reshape(leaf.dimensions)
        out.append((MemRef(Space.HBM, buffers.buffers[buffer_id].offset, leaf), value))
    return tuple(out)
