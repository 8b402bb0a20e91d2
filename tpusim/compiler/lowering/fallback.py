"""The fallback lowering: run an HLO instruction's reference semantics on its operand bytes.

Every instruction without a hardware lowering (sort, fft, gather, scatter, custom-call, ...) becomes one
``fallback`` instruction whose kernel is a small HLO module holding just that instruction (and the
computations it calls). The device unpacks the operands from HBM, evaluates the kernel with the reference
interpreter and packs the results back, so the numbers are exactly the oracle's.

Declared cost (documented in docs/compiler.md): the operands and results stream through HBM once, and
the work runs at the VPU's peak elementwise rate::

    cycles = FIXED_CYCLES + bytes * clock_hz / hbm_bandwidth + flops / (sublanes * lanes * alu_vregs_per_cycle)

``flops`` comes from :data:`FLOP_ESTIMATES` (per opcode; the result's element count otherwise). A gather
adds what its slices would cost moved one by one by the gather lowering's cheapest plan
(:func:`.gather.gather_cycles`): the lowering declines gathers of too many slices for straight-line code,
and a declared cost of bytes alone made such a gather 50 times cheaper than the same one lowered.
``FIXED_CYCLES`` is an estimate of launch overhead, not a published figure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from math import ceil, log2, prod

from tpusim.compiler.buffer_assignment import leaf_paths
from tpusim.compiler.hlo.ir import Attributes, Computation, Instruction, Module
from tpusim.compiler.hlo.printer import print_module
from tpusim.compiler.lowering.context import Lowering
from tpusim.compiler.lowering.gather import gather_cycles
from tpusim.isa import Fallback, FallbackKernel, MemRef
from tpusim.memory import AnyShape, Shape, TupleShape

__all__ = ["FIXED_CYCLES", "FLOP_ESTIMATES", "kernel_module", "lower_fallback"]

FIXED_CYCLES = 100
"""Cycles charged per fallback for starting it (an estimate)."""


def _elements(shape: AnyShape) -> int:
    return sum(s.element_count for _, s in leaf_paths(shape))


def _sort_flops(instr: Instruction, operands: list[AnyShape]) -> int:
    shape = operands[0]
    assert isinstance(shape, Shape)
    n = shape.dimensions[instr.attr("dimensions", (0,))[0]] if shape.rank else 1
    return int(_elements(shape) * max(1.0, log2(max(n, 2))) * len(operands))


def _fft_flops(instr: Instruction, operands: list[AnyShape]) -> int:
    n = prod(instr.attr("fft_length", (1,)))
    return int(5 * _elements(operands[0]) * max(1.0, log2(max(n, 2))))


def _cubic(instr: Instruction, operands: list[AnyShape]) -> int:
    shape = operands[0]
    assert isinstance(shape, Shape)
    n = shape.dimensions[-1] if shape.rank else 1
    return _elements(shape) * n


def _dot_flops(instr: Instruction, operands: list[AnyShape]) -> int:
    """2 x (result elements) x (contracted length): a multiply and an add per product."""
    lhs = operands[0]
    assert isinstance(lhs, Shape)
    k = prod(lhs.dimensions[d] for d in instr.attr("lhs_contracting_dims", ()))
    return 2 * _elements(instr.shape) * k


def _conv_flops(instr: Instruction, operands: list[AnyShape]) -> int:
    """2 x (result elements) x (kernel elements per output feature)."""
    kernel = operands[1]
    assert isinstance(kernel, Shape)
    labels = instr.attr("dim_labels")
    out_features = kernel.dimensions[labels.kernel_output_feature] if labels is not None else 1
    return 2 * _elements(instr.shape) * (kernel.element_count // max(1, out_features))


def _window_flops(instr: Instruction, operands: list[AnyShape]) -> int:
    """One operation per window tap per output (select-and-scatter: per source element, a select and an add)."""
    window = instr.attr("window")
    taps = prod(d.size for d in window.dims) if window is not None else 1
    counted = operands[1] if instr.opcode == "select-and-scatter" else instr.shape
    return taps * _elements(counted) * (2 if instr.opcode == "select-and-scatter" else 1)


FLOP_ESTIMATES: dict[str, Callable[[Instruction, list[AnyShape]], int]] = {
    "dot": _dot_flops,
    "reduce-window": _window_flops,
    "select-and-scatter": _window_flops,
    "convolution": _conv_flops,
    "sort": _sort_flops,
    "topk": _sort_flops,
    "fft": _fft_flops,
    "cholesky": _cubic,
    "triangular-solve": _cubic,
    "gather": lambda i, ops: _elements(i.shape),
    "scatter": lambda i, ops: 2 * _elements(ops[-1]),
}
"""Opcode -> estimated elementwise operations of one execution."""


def kernel_module(module: Module, comp: Computation, instr: Instruction) -> Module:
    """A module whose entry takes the array leaves of ``instr``'s operands (in order) as parameters and
    returns ``instr``'s result, with the computations ``instr`` calls."""
    body: list[Instruction] = []
    names: list[str] = []
    number = 0

    def rebuild(shape: AnyShape, hint: str) -> str:
        nonlocal number
        if isinstance(shape, TupleShape):
            parts = [rebuild(e, f"{hint}.{i}") for i, e in enumerate(shape.elements)]
            body.append(Instruction(f"{hint}.tuple", "tuple", shape, tuple(parts)))
            return f"{hint}.tuple"
        if shape.element_type.kind == "token":
            body.append(Instruction(f"{hint}.token", "after-all", shape))
            return f"{hint}.token"
        name = f"arg{number}"
        body.append(Instruction(name, "parameter", shape, (), Attributes({"parameter_number": number})))
        number += 1
        return name

    for i, operand in enumerate(instr.operands):
        names.append(rebuild(comp[operand].shape, f"operand{i}"))
    body.append(replace(instr, operands=tuple(names), loc=None))
    entry = Computation("fallback_main", tuple(body), instr.name, is_entry=True)
    called: list[str] = []

    def collect(name: str) -> None:
        if name in called:
            return
        for inner in module[name].instructions:
            for callee in inner.called_computations():
                collect(callee)
        called.append(name)

    for callee in instr.called_computations():
        collect(callee)
    comps = (*(module[c] for c in called), entry)
    return Module(f"fallback_{instr.name}", comps, entry.name)


def lower_fallback(ctx: Lowering, comp: Computation, instr: Instruction, reason: str) -> None:
    """Emit ``instr`` as a fallback instruction on its HBM buffers.
    Whether the fallback evaluator can run the kernel is checked where the evaluator is chosen
    (:func:`tpusim.api.compile_program` checks the reference interpreter's coverage).
    """
    inputs: list[MemRef] = []
    operand_shapes: list[AnyShape] = []
    for operand in instr.operands:
        inputs += ctx.home_leaves(comp.name, operand)
        operand_shapes.append(comp[operand].shape)
    outputs = ctx.home_leaves(comp.name, instr.name)  # none for ops that only have effects (outfeed, send)
    cfg = ctx.config
    flops = FLOP_ESTIMATES.get(instr.opcode, lambda i, ops: _elements(i.shape))(instr, operand_shapes)
    vpu_rate = cfg.vpu.sublanes * cfg.vpu.lanes * cfg.vpu.alu.issue_vregs_per_cycle
    # a gather the hardware path declined (too many slices): its slices cost what they would moved one by one
    moves = gather_cycles(ctx, comp, instr) if instr.opcode == "gather" else None
    kernel = FallbackKernel(
        name=f"k{len(ctx.kernels)}.{instr.name}",
        hlo=print_module(kernel_module(ctx.module, comp, instr)),
        fixed_cycles=FIXED_CYCLES + ceil(moves or 0),
        cycles_per_byte=cfg.clock_hz / cfg.hbm.bandwidth_bytes_per_s,
        cycles_per_flop=1.0 / vpu_rate,
        flops=int(flops),
    )
    ctx.kernels.append(kernel)
    ctx.fallen_back.append((comp.name, instr.name, instr.opcode, reason))
    ctx.emit(Fallback, kernel=kernel.name, inputs=tuple(inputs), outputs=tuple(outputs))
