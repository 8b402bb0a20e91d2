"""The main job in Python: compile an HLO program for a chip, run it on the device model, read the outputs.

>>> import numpy as np, tpusim
>>> hlo = '''HloModule add
... ENTRY main {
...   x = f32[8,128] parameter(0)
...   ROOT y = f32[8,128] add(x, x)
... }'''
>>> result = tpusim.simulate(hlo, [np.ones((8, 128), np.float32)], config="teaching")
>>> float(result.outputs[0][0, 0]), result.cycles > 0
(2.0, True)
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from tpusim.compiler.buffer_assignment import leaf_paths
from tpusim.compiler.errors import CompileError
from tpusim.compiler.hlo import load_module, parse_module
from tpusim.compiler.hlo.ir import Module
from tpusim.compiler.hlo.parser import read_hlo_text
from tpusim.compiler.hlo.reference.core import TOKEN, DeviceState, Host
from tpusim.compiler.hlo.reference.io import DEFAULT_SEED, random_inputs
from tpusim.compiler.options import CompileOptions
from tpusim.compiler.pipeline import CompiledProgram, compile_module
from tpusim.compiler.verify import accesses
from tpusim.config import ChipConfig, check_overrides, load_config
from tpusim.devices import Chip, FallbackEvaluator, RunMonitor, RunResult, Trace
from tpusim.errors import TpusimError
from tpusim.isa import Space
from tpusim.limits import DEFAULT_MAX_CYCLES, DEFAULT_MAX_STEPS, RunLimitError
from tpusim.yamlio import shorten

__all__ = [
    "COMPILERS",
    "InputError",
    "SimulationResult",
    "compile_checked",
    "inputs_matter",
    "inputs_read",
    "load_program",
    "reference_evaluator",
    "simulate",
    "simulate_chips",
    "simulate_jax",
    "through_xla",
]


class InputError(TpusimError):
    """Inputs that do not match the program's parameters."""


@dataclass(frozen=True)
class SimulationResult:
    """What a simulation produced.

    Attributes:
        outputs: the program's outputs (the entry root flattened), or empty for a timing-only run.
        cycles: simulated cycles until the last instruction or transfer completed.
        compiled: the compiled program (module as lowered, buffers, fallbacks, relayouts).
        run: the device model's result (trace, memories, events).
        tree: for :func:`simulate_jax`, the outputs in the function's own structure.
        compile_seconds: wall time compiling (0 when given a compiled program).
        run_seconds: wall time simulating (drawing and placing inputs, running the device model, reading
            outputs).
        inputs_seconds: the part of ``run_seconds`` spent drawing random inputs and checking inputs.
        xla: with ``compiler="xla"``, what XLA:TPU made of the program (its compiled text and its
            ``cost_analysis()`` estimate, :class:`tpusim.xla_tpu.XlaCompiled`); None otherwise.
    """

    outputs: tuple[np.ndarray, ...]
    cycles: int
    compiled: CompiledProgram
    run: RunResult
    tree: Any = field(default=None, compare=False)
    compile_seconds: float = 0.0
    run_seconds: float = 0.0
    xla: Any = field(default=None, compare=False)
    inputs_seconds: float = 0.0

    @property
    def seconds(self) -> float:
        return self.cycles / self.compiled.config.clock_hz

    @property
    def trace(self) -> Trace:
        return self.run.trace

    @property
    def instructions(self) -> int:
        """Instructions executed (each loop iteration counts)."""
        return self.run.instructions

    @property
    def fallbacks(self) -> tuple[tuple[str, str, str, str], ...]:
        return self.compiled.fallbacks

    # Conveniences on the result that the report package computes, imported on use (the one place the API
    # reaches up to report, see docs/architecture.md): the text summary, notebook HTML and a DataFrame.
    def summary(self) -> str:
        """The summary ``tpusim run`` prints (:func:`tpusim.report.summary.format_summary`)."""
        from tpusim.report.summary import format_summary

        return format_summary(self)

    def _repr_html_(self) -> str:
        """What a notebook shows for a result: :func:`tpusim.report.notebook.summary_html` (the summary
        tables and the timeline)."""
        from tpusim.report.notebook import summary_html

        return summary_html(self)

    def to_pandas(self) -> Any:
        """Per-HLO-op metrics as a pandas DataFrame (:func:`tpusim.report.to_pandas`; needs pandas)."""
        from tpusim.report.frames import to_pandas

        return to_pandas(self)


def load_program(program: str | Path | Module) -> Module:
    """An HLO module from a Module, HLO text, or the path of a file holding HLO text.

    A string is HLO text when it holds a ``{`` (every computation has one; a header is optional), else a
    path.

    Raises:
        InputError: a string that is neither HLO text nor the path of an existing file.
    """
    if isinstance(program, Module):
        return program
    found = _text_or_path(program)
    return load_module(found) if isinstance(found, Path) else parse_module(found)


def _text_or_path(program: str | Path) -> str | Path:
    """``program`` as HLO text (a string holding a ``{``), else as the path of an existing file.

    Raises:
        InputError: a string that is neither.
    """
    if isinstance(program, Path):
        return program
    text = str(program)
    if "{" in text:
        return text
    if not Path(text).exists():
        raise InputError(f"{shorten(text)!r} is not HLO text (no computation in braces) and no file has that path")
    return Path(text)


COMPILERS = ("tpusim", "xla")
"""``tpusim``: tpusim's own compiler lays out, fuses and schedules the module. ``xla``: XLA's own TPU compiler
(libtpu, offline) compiles it first and tpusim runs what XLA made, as given (:mod:`tpusim.xla_tpu`)."""


_TILED_LAYOUT = re.compile(r"\{[\d,]*:T\(")
"""A layout with tiles, as XLA's layout assignment writes them (``{1,0:T(8,128)(2,1)}``)."""


def through_xla(
    program: str | Path | Module, config: ChipConfig, chips: int = 1, shape: tuple[int, ...] | None = None
) -> tuple[Module, Any]:
    """``program`` compiled by XLA:TPU for ``chips`` chips of ``config``: the compiled module and what XLA said
    of it (:class:`tpusim.xla_tpu.XlaCompiled`).

    Raises:
        LibtpuMissingError: libtpu is not installed; XlaCompileError: XLA refused the module or the chip;
        InputError: ``dcn.slices`` above 1 (XLA:TPU's deviceless compile here is for one slice).
    """
    from tpusim.compiler.hlo.printer import print_module
    from tpusim.xla_tpu import compile_with_xla

    if config.dcn.slices > 1:
        raise InputError(
            f"the XLA:TPU compiler compiles for one slice, not dcn.slices = {config.dcn.slices}; "
            "use tpusim's own compiler for several slices"
        )

    if isinstance(program, Module):
        text = print_module(program)
    else:
        found = _text_or_path(program)
        text = read_hlo_text(found) if isinstance(found, Path) else found
    if _TILED_LAYOUT.search(text):
        # XLA's front end takes modules before layout assignment: its own error says only "Tiled layout is not
        # supported yet"
        raise InputError(
            "the module already has tiled layouts (it is a compiled module, XLA:TPU's or tpusim's): run it as it "
            "is, with tpusim's compiler (the default), rather than compiling it again with XLA:TPU"
        )
    xla = compile_with_xla(text, config, chips, shape)
    module = parse_module(xla.text, f"XLA:TPU's compilation for {xla.topology}")
    _refuse_f64_pairs(module)
    return module, xla


_X64 = ("X64SplitLow", "X64SplitHigh", "X64Combine")


def _refuse_f64_pairs(module: Module) -> None:
    """XLA:TPU computes f64 as pairs of f32 values (its ``X64Split``/``X64Combine`` of f64), an arithmetic
    tpusim does not model (tried: products and infinities came out wrong): refused when its module is read,
    not half way through the run."""
    for comp in module.computations:
        for instr in comp.instructions:
            if instr.opcode != "custom-call" or instr.attr("custom_call_target") not in _X64:
                continue
            if any("f64" in str(s) for s in (instr.shape, *(comp[o].shape for o in instr.operands))):
                raise InputError(
                    f"{instr.name}: XLA:TPU computes f64 as pairs of f32 values ({instr.attr('custom_call_target')}), "
                    "whose arithmetic tpusim does not model; run f64 programs with tpusim's own compiler (the default)"
                )


def _check_arguments(
    program: Any,
    config: Any,
    options: Any,
    timing_only: Any = False,
    chips: Any = None,
    *,
    inputs: Any = None,
    overrides: Any = (),
    seed: Any = 0,
    topology: Any = None,
    monitor: Any = None,
) -> None:
    """One clear error for an argument of the wrong type, before it fails deep inside (``chips="2"`` was a
    TypeError from the topology, ``timing_only="no"`` a run without numerics, ``options={}`` an
    AttributeError, ``seed=-1`` numpy's error, ``overrides="mxu.rows=64"`` one override per character)."""
    check_overrides(overrides)
    if inputs is not None and not isinstance(inputs, (list, tuple)):
        raise InputError(f"inputs must be a list or tuple with one value per entry parameter, not {inputs!r:.60}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise InputError(f"seed must be a whole number from 0 to 2**64 - 1, not {seed!r:.60}")
    if (
        topology is not None
        and not isinstance(topology, str)
        and not (
            isinstance(topology, (tuple, list))
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in topology)
        )
    ):
        raise InputError(
            f"topology must be a text like '2x4' or a tuple of chip counts like (2, 4), not {topology!r:.60}"
        )
    if monitor is not None and not isinstance(monitor, RunMonitor):
        raise InputError(f"monitor must be a tpusim.devices.RunMonitor, not {monitor!r:.60}")
    if not isinstance(program, (str, Path, Module, CompiledProgram)) or (isinstance(program, str) and not program):
        raise InputError(f"program must be HLO text, a path, a Module or a compiled program, not {program!r:.60}")
    if not isinstance(config, (str, Path, ChipConfig)):
        raise InputError(f"config must be a preset name, a YAML path or a ChipConfig, not {config!r:.60}")
    if options is not None and not isinstance(options, CompileOptions):
        raise InputError(f"options must be a CompileOptions (tpusim.CompileOptions(...)), not {options!r:.60}")
    if not isinstance(timing_only, bool):
        raise InputError(f"timing_only must be True or False, not {timing_only!r:.60}")
    if chips is not None and (isinstance(chips, bool) or not isinstance(chips, int) or chips < 1):
        raise InputError(f"chips must be a whole number of at least 1, not {chips!r:.60}")


def _compiler(compiler: str) -> str:
    if compiler not in COMPILERS:
        raise InputError(f"compiler must be one of {', '.join(COMPILERS)}, not {compiler!r}")
    return compiler


def _config(config: ChipConfig | str | Path, overrides: Sequence[str] | dict[str, Any]) -> ChipConfig:
    if isinstance(config, ChipConfig):
        if not overrides:
            return config
        from tpusim.config import override_values, with_overrides

        # typed as --set types them (1.5e9 a number; a bad tag or a huge integer a ConfigError)
        if isinstance(overrides, dict):
            return with_overrides(config, dict(overrides))
        return with_overrides(config, override_values(list(overrides)))
    return load_config(config, overrides=dict(overrides) if isinstance(overrides, dict) else list(overrides))


def _flatten_inputs(module: Module, inputs: Sequence[Any], only: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """Check inputs against the entry parameters and key them by the program's symbols (``only`` those
    parameters: drawn inputs of a timing-only run, the others left as zeroed memory)."""
    params = module.entry_computation.parameters
    if len(inputs) != len(params):
        raise InputError(f"the program takes {len(params)} inputs, {len(inputs)} were given")
    out: dict[str, np.ndarray] = {}
    for i, (p, value) in enumerate(zip(params, inputs)):
        if only is not None and i not in only:
            continue
        for path, shape in leaf_paths(p.shape):
            leaf = value
            for j in path:
                if not isinstance(leaf, (tuple, list)):
                    raise InputError(f"input {i} ({p.name}) must be a tuple matching {p.shape}")
                leaf = leaf[j]
            if leaf is TOKEN:
                continue
            array = np.asarray(leaf)
            if not array.dtype.isnative:  # (the same values in the other byte order: no conversion of values)
                array = array.astype(array.dtype.newbyteorder("="))
            where = f"input {i} ({p.name}{''.join(f'[{j}]' for j in path)})"
            if array.dtype != shape.element_type.dtype:
                raise InputError(
                    f"{where} has dtype {array.dtype} but the program wants {shape.element_type} "
                    f"({shape.element_type.dtype}); convert it first (tpusim never converts silently)"
                )
            if array.shape != shape.dimensions:
                raise InputError(f"{where} has shape {array.shape} but the program wants {list(shape.dimensions)}")
            out[_symbol("arg", i, path)] = array
    return out


def _symbol(prefix: str, i: int, path: tuple[int, ...]) -> str:
    return f"{prefix}{i}" + "".join(f".{j}" for j in path)


def compile_program(
    program: str | Path | Module,
    *,
    config: ChipConfig | str | Path = "tpu_v5e",
    overrides: Sequence[str] = (),
    options: CompileOptions | None = None,
) -> CompiledProgram:
    """Compile ``program`` for ``config`` without running it: its layouts, buffers, instruction stream and
    fallbacks. Pass the result to :func:`simulate` to run it (as often as you like, compiling once).

    Raises:
        HloParseError, HloVerifyError, ConfigError, CompileError (all TpusimError): naming the file position,
            key or instruction at fault.
    """
    _check_arguments(program, config, options, overrides=overrides)
    return compile_checked(load_program(program), _config(config, overrides), options)


def compile_checked(module: Module, config: ChipConfig, options: CompileOptions | None = None) -> CompiledProgram:
    """:func:`~tpusim.compiler.pipeline.compile_module`, then a check that the reference interpreter (the
    fallback evaluator :func:`simulate` gives the device) can run every fallback kernel, so a program that
    could only fail when the device reached such a kernel is rejected before it runs.

    Raises:
        CompileError: naming the instruction the interpreter cannot run and why it fell back.
    """
    from tpusim.compiler.hlo.reference import cannot_run

    compiled = compile_module(module, config, options)
    for comp, name, _, reason in compiled.fallbacks:
        instr = compiled.module[comp][name]
        problem = cannot_run(instr)
        if problem is not None:
            raise CompileError(f"{reason}, and {problem}", instr, comp)
    return compiled


def simulate(
    program: str | Path | Module | CompiledProgram,
    inputs: Sequence[Any] | None = None,
    *,
    config: ChipConfig | str | Path = "tpu_v5e",
    overrides: Sequence[str] = (),
    options: CompileOptions | None = None,
    timing_only: bool = False,
    seed: int = DEFAULT_SEED,
    host: Host | None = None,
    chips: int | None = None,
    topology: str | tuple[int, ...] | None = None,
    monitor: RunMonitor | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_cycles: int = DEFAULT_MAX_CYCLES,
    compiler: str = "tpusim",
) -> SimulationResult:
    """Compile ``program`` for ``config`` and simulate it.

    Args:
        program: HLO text, a path to an HLO file, a parsed Module, or an already compiled program.
        inputs: one value per entry parameter (numpy arrays of exactly the parameter's dtype and shape;
            tuples for tuple parameters). None: seeded random inputs (see ``tpusim.compiler.hlo.reference.io``;
            none for a timing-only run that reads no value, see :func:`inputs_matter`).
        config: a chip config, a preset name (``tpu_v5e``, ``teaching`` ...) or a YAML path.
        overrides: config overrides such as ``"mxu.rows=256"``.
        options: compile options (tiling rule set, matmul precision, fusion).
        timing_only: skip numeric work where timing does not depend on data; outputs are then empty.
        seed: seed of the random inputs.
        host: the host side of infeed, outfeed, send and recv (a
            :class:`tpusim.compiler.hlo.reference.core.Host`; its queues are consumed and filled by the run).
        chips: run on this many chips (an SPMD-partitioned module, or one module as replicas); every input
            and output then has a leading chip axis (see :func:`simulate_chips`).
        topology: the chips' grid, ``"2x4"`` or ``(2, 4)`` (default: the config's ``ici.shape``, or one
            chosen for ``chips``); with ``dcn.slices`` above 1, the grid of one slice, and ``chips`` counts
            all slices' chips.
        monitor: a :class:`tpusim.devices.RunMonitor` another thread may read for progress while it runs.
        max_steps: instructions the device may execute (every core and chip, each loop iteration again);
            past it the run stops with :class:`tpusim.limits.RunLimitError` naming the loop (an endless
            ``while``). Fallback kernels' reference runs take it as their ``while`` iteration limit.
        max_cycles: simulated cycles the run may take, likewise. See :mod:`tpusim.limits` for both.
        compiler: ``tpusim`` (tpusim's own compiler) or ``xla`` (XLA:TPU compiles the module first, with
            libtpu offline; ``result.xla`` then holds its estimate). See :data:`COMPILERS`.

    Returns:
        Outputs, cycles, the compiled program and the device run (trace, memories).

    Raises:
        RunLimitError: the run reached ``max_steps`` or ``max_cycles``.
        LibtpuMissingError: ``compiler="xla"`` without libtpu installed (the message says how to install it).
        InputError: an argument of the wrong type (``chips="2"``, ``options={...}``, ``timing_only="no"``).
    """
    _check_arguments(
        program, config, options, timing_only, chips, inputs=inputs, overrides=overrides, seed=seed,
        topology=topology, monitor=monitor,
    )  # fmt: skip
    xla = None
    if _compiler(compiler) == "xla":
        if isinstance(program, CompiledProgram):
            raise InputError(
                "compiler='xla' compiles the program: pass HLO text, a file or a module, not a compiled one"
            )
        many = chips is not None or topology is not None
        shape = tuple(int(d) for d in topology.split("x")) if isinstance(topology, str) else topology
        program, xla = through_xla(program, _config(config, overrides), chips or 1 if many else 1, shape)
    if chips is not None or topology is not None:
        if host is not None:
            raise InputError("host transfers are not supported in a run of several chips")
        result = simulate_chips(
            program, inputs, chips=chips, topology=topology, config=config, overrides=overrides,
            options=options, timing_only=timing_only, seed=seed, monitor=monitor, max_steps=max_steps,
            max_cycles=max_cycles,
        )  # fmt: skip
        return replace(result, xla=xla)
    began = time.perf_counter()
    if isinstance(program, CompiledProgram):
        compiled = program
    else:
        compiled = compile_checked(load_program(program), _config(config, overrides), options)
    compiled_at = time.perf_counter()
    module = compiled.source
    declared = module.replica_count * module.num_partitions
    if declared > 1:
        raise InputError(
            f"{module.name} runs on {declared} devices (replica_count x num_partitions); simulate it with "
            f"chips={declared}"
        )
    if inputs is None:
        read = inputs_read(compiled, timing_only)
        placed = _flatten_inputs(module, random_inputs(module, seed, only=read)[0], read) if read else {}
    else:
        placed = _flatten_inputs(module, inputs)
    drawn = time.perf_counter() - compiled_at
    placed.update({f"const{k}": value for k, (_, value) in enumerate(compiled.constants)})
    try:
        run = Chip(compiled.config).run(
            compiled.program,
            placed,
            timing_only=timing_only,
            fallback_evaluator=reference_evaluator(host, max_steps),
            monitor=monitor,
            max_steps=max_steps,
            max_cycles=max_cycles,
        )
    except RunLimitError as e:  # name the loop's computation (the device knows only HLO names)
        raise e.located(compiled.module) from None
    outputs = () if timing_only else tuple(run.read(f"out{j}") for j in range(len(compiled.outputs)))
    done = time.perf_counter()
    compile_seconds = compiled_at - began if not isinstance(program, CompiledProgram) else 0.0
    return SimulationResult(
        outputs, run.cycles, compiled, run, None, compile_seconds, done - compiled_at, xla, inputs_seconds=drawn
    )


def inputs_matter(compiled: CompiledProgram, timing_only: bool) -> bool:
    """Whether a run reads any of its inputs' values (:func:`inputs_read`)."""
    return bool(inputs_read(compiled, timing_only))


def inputs_read(compiled: CompiledProgram, timing_only: bool) -> tuple[int, ...]:
    """The entry parameters whose values a run reads: all in a numeric run; in a timing-only run those whose
    buffers an instruction that applies its effect anyway (``control``: loop conditions and the indices of
    data-dependent windows) touches. Drawing random values for the others is wasted work (2.4 of the 5.6 s of
    an 8192^3 matmul's timing-only run; 4.5 of the 9 s of four chips running a scanned 8-layer model from
    XLA:TPU, whose loop counts from a constant), and they start from zeroed memory with the same timing."""
    every = tuple(range(len(compiled.inputs)))
    if not timing_only:
        return every
    spans = [[(r.address, r.address + r.shape.byte_size) for r in refs] for refs in compiled.inputs]
    read: set[int] = set()
    for stream in compiled.program.streams:
        for ins in stream.instructions:
            if not getattr(ins, "control", False):
                continue
            reads, writes, _, _ = accesses(ins)
            for ref in reads + writes:
                if ref.space is not Space.HBM:
                    continue
                lo, hi = ref.address, ref.address + ref.shape.byte_size
                read.update(i for i, leaf in enumerate(spans) if any(a < hi and lo < b for a, b in leaf))
    return tuple(sorted(read))


def reference_evaluator(
    host: Host | None = None, max_steps: int = DEFAULT_MAX_STEPS, *, stateful: bool = True
) -> FallbackEvaluator:
    """The fallback evaluator :func:`simulate` gives the device model: each fallback kernel's HLO text
    (parsed once) run by the reference interpreter.

    Args:
        host: the host queues infeed/outfeed kernels read and write (by default a fresh one, or with
            ``stateful`` False a fresh one per kernel).
        max_steps: the interpreter's step budget per kernel.
        stateful: keep the device's RNG state and host queues from one kernel to the next (one chip's
            run); False starts every kernel afresh.
    """
    from tpusim.compiler.hlo.reference import evaluate

    queues = host if host is not None or not stateful else Host()
    state = DeviceState() if stateful else None

    def run(hlo: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return list(evaluate(_parsed_kernel(hlo), inputs, host=queues, state=state, max_steps=max_steps))

    return run


@lru_cache(maxsize=64)
def _parsed_kernel(hlo: str) -> Module:
    """A fallback kernel's HLO text parsed once (kernels run many times in loops)."""
    return parse_module(hlo)


def simulate_jax(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> SimulationResult:
    """Lower ``fn(*args)`` with JAX for TPU and simulate it (keyword arguments as for :func:`simulate`).

    The HLO is JAX's TPU lowering (``jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))``), so the
    program is the one a TPU would compile; ``result.tree`` holds the outputs in ``fn``'s structure (None for
    a timing-only run). ``args`` are what ``jax.jit(fn)`` accepts: pytrees, Python scalars and weakly typed
    values (converted to the type the program wants), arguments the program does not use, PRNG keys (see
    :mod:`tpusim.jax_bridge`).
    """
    from tpusim.jax_bridge import lower_for_tpu

    if not callable(fn):
        raise InputError(f"simulate_jax takes the function to lower first, not {fn!r:.60}")
    program = lower_for_tpu(fn, args)
    module = parse_module(program.hlo)
    dtypes = [p.shape.element_type.dtype if hasattr(p.shape, "element_type") else None
              for p in module.entry_computation.parameters]  # fmt: skip
    result = simulate(module, program.inputs(dtypes), **kwargs)
    tree = None if kwargs.get("timing_only") else program.outputs(result.outputs)
    return replace(result, tree=tree)


# ---------------------------------------------------------------------------------------------------------
# Many chips
# ---------------------------------------------------------------------------------------------------------
def simulate_chips(
    program: str | Path | Module | CompiledProgram,
    inputs: Sequence[Any] | None = None,
    *,
    chips: int | None = None,
    topology: str | tuple[int, ...] | None = None,
    config: ChipConfig | str | Path = "tpu_v5e",
    overrides: Sequence[str] = (),
    options: CompileOptions | None = None,
    timing_only: bool = False,
    seed: int = DEFAULT_SEED,
    monitor: RunMonitor | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_cycles: int = DEFAULT_MAX_CYCLES,
) -> SimulationResult:
    """Compile ``program`` for a system of chips and run every chip's copy of it in one simulation.

    Chip ``d`` runs device ``d`` of the module (``replica * num_partitions + partition``, XLA's flattened
    id): a per-device module of an SPMD-partitioned program, or one module as ``chips`` replicas.

    Args:
        inputs: one value per entry parameter, each with a leading chip axis (``x[d]`` is chip ``d``'s);
            None: seeded random inputs per chip (none for a timing-only run that reads no value, see
            :func:`inputs_matter`).
        chips: number of chips (default: the topology's, else the module's replica_count x num_partitions).
        topology: the grid, ``"2x4"`` or ``(2, 4)`` (default: ``ici.shape`` of the config, or chosen).
        Others as for :func:`simulate`.

    Returns:
        Outputs with a leading chip axis; ``compiled.config.ici.shape`` is the topology used.

    Raises:
        ConfigError: a topology that does not hold ``chips`` chips or is not a slice of the chip.
        InputError: inputs without the chip axis or of the wrong shape or type.
    """
    from tpusim.config import with_overrides
    from tpusim.devices import System
    from tpusim.topology import parse_topology, system_topology

    began = time.perf_counter()
    if isinstance(program, CompiledProgram):
        compiled = program
        cfg = compiled.config
        module = compiled.source
        shape = cfg.ici.shape
        if shape is None:
            raise InputError("a compiled program for many chips must be compiled with ici.shape set")
        topo = system_topology(cfg, chips, shape)
    else:
        module = load_program(program)
        cfg = _config(config, overrides)
        shape = parse_topology(topology) if isinstance(topology, str) else topology
        if chips is None and shape is None:
            chips = module.replica_count * module.num_partitions
        topo = system_topology(cfg, chips, shape)
        cfg = with_overrides(cfg, {"ici.shape": topo.slice_shape})
        compiled = compile_checked(module, cfg, options)
    compiled_at = time.perf_counter()
    n = topo.chips
    placed: dict[str, Any] = {}
    read = inputs_read(compiled, timing_only) if inputs is None else None
    if inputs is not None or read:
        per_device = random_inputs(module, seed, n, only=read) if inputs is None else _split_chips(module, inputs, n)
        flat = [_flatten_inputs(module, per_device[d], read) for d in range(n)]
        placed = {k: [f[k] for f in flat] for k in (flat[0] if flat else {})}
    drawn = time.perf_counter() - compiled_at
    placed.update({f"const{k}": value for k, (_, value) in enumerate(compiled.constants)})
    system = System(compiled.config, n, topo.slice_shape)
    try:
        run = system.run(
            compiled.program, placed, timing_only=timing_only, monitor=monitor, max_steps=max_steps,
            max_cycles=max_cycles, fallback_evaluator=reference_evaluator(max_steps=max_steps, stateful=False),
        )  # fmt: skip
    except RunLimitError as e:  # name the loop's computation (the device knows only HLO names)
        raise e.located(compiled.module) from None
    outputs: tuple[np.ndarray, ...] = ()
    if not timing_only:
        outputs = tuple(np.stack([run.read(f"out{j}", chip=d) for d in range(n)]) for j in range(len(compiled.outputs)))
    compile_seconds = compiled_at - began if not isinstance(program, CompiledProgram) else 0.0
    return SimulationResult(
        outputs, run.cycles, compiled, run, None, compile_seconds, time.perf_counter() - compiled_at,
        inputs_seconds=drawn,
    )  # fmt: skip


def _split_chips(module: Module, inputs: Sequence[Any], n: int) -> list[list[Any]]:
    """Inputs with a leading chip axis -> per chip, its inputs."""
    from tpusim.memory import TupleShape

    params = module.entry_computation.parameters
    if len(inputs) != len(params):
        raise InputError(f"the program takes {len(params)} inputs, {len(inputs)} were given")

    def take(value: Any, shape: Any, d: int, where: str) -> Any:
        if isinstance(shape, TupleShape):
            if not isinstance(value, (tuple, list)) or len(value) != len(shape.elements):
                raise InputError(f"{where} must be a tuple matching {shape}")
            return tuple(take(v, s, d, f"{where}[{i}]") for i, (v, s) in enumerate(zip(value, shape.elements)))
        if value is TOKEN:
            return value
        array = np.asarray(value)
        if array.shape != (n, *shape.dimensions):
            raise InputError(
                f"{where} has shape {array.shape}; with {n} chips it needs a leading chip axis: "
                f"{(n, *shape.dimensions)}"
            )
        return array[d]

    return [[take(v, p.shape, d, f"input {i} ({p.name})") for i, (v, p) in enumerate(zip(inputs, params))]
            for d in range(n)]  # fmt: skip
