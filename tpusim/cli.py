"""The ``tpusim`` command line: one subcommand per job, each a configure/run pair in a registry.

Every error a user can cause (bad shape strings, HLO text, configs, inputs) is a TpusimError and is
printed as one clear message without a traceback; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpusim.argtypes import at_least
from tpusim.errors import TpusimError

if TYPE_CHECKING:
    from tpusim.api import SimulationResult
    from tpusim.check import OutputCheck
    from tpusim.compiler.hlo.ir import Module

__all__ = ["main"]


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, configure: Callable[[argparse.ArgumentParser], None]):
    """Register ``run`` as the subcommand ``name``."""

    def wrap(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = Command(name, help, configure, run)
        return run

    return wrap


# --------------------------------------------------------------------------------------- layout
def _configure_layout(p: argparse.ArgumentParser) -> None:
    p.add_argument("shape", help="a shape with its layout, e.g. 'bf16[16,256]{1,0:T(8,128)(2,1)}' (quote it)")
    p.add_argument("--out", type=Path, help="write the diagram here (.png or .svg; default reports/layout.png)")
    p.add_argument("--json", action="store_true", help="print shape, physical shape, byte size, padding fraction "
                   "and the linear position of every element as JSON (draws only if --out is given)")  # fmt: skip
    p.add_argument("--max-rows", type=int, default=16, help="most grid rows to draw (default 16)")
    p.add_argument("--max-cols", type=int, default=256, help="most grid columns to draw (default 256)")


def _drawn_by_matplotlib(path: Path) -> bool:
    """Whether ``path`` is a picture matplotlib wrote (its PNG and SVG files name it in their first kilobytes,
    its PDF files in their last): an earlier diagram, which a new one may replace."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
            f.seek(max(0, path.stat().st_size - 4096))
            tail = f.read(4096)
    except OSError:
        return False
    return b"matplotlib" in head.lower() or b"matplotlib" in tail.lower()


@command("layout", "draw how a layout places an array in memory", _configure_layout)
def _run_layout(args: argparse.Namespace) -> int:
    from tpusim.memory import Shape
    from tpusim.memory.diagram import MAX_DRAWN_CELLS, MAX_POSITIONS, layout_diagram, layout_summary
    from tpusim.memory.shape_text import parse_shape
    from tpusim.paths import check_output_path

    shape = parse_shape(args.shape)
    if not isinstance(shape, Shape):  # (a tuple: its elements each have their own layout)
        raise TpusimError(f"a layout diagram needs an array shape, not the tuple {shape}")
    out = args.out if args.out is not None or args.json else Path("reports/layout.png")
    if out is not None:  # checked before anything is printed or drawn
        if out.suffix.lower() not in (".png", ".svg", ".pdf"):
            raise TpusimError(f"--out {out}: the diagram is written as .png, .svg or .pdf, not '{out.suffix}'")
        check_output_path(out, "--out", folder=False)
        if out.is_file() and not _drawn_by_matplotlib(out):
            raise TpusimError(f"--out {out}: the file exists and is not a diagram tpusim drew; it would be "
                              "overwritten: choose another file")  # fmt: skip
        if args.max_rows < 1 or args.max_cols < 1 or args.max_rows * args.max_cols > MAX_DRAWN_CELLS:
            raise TpusimError(f"--max-rows {args.max_rows} --max-cols {args.max_cols}: each must be at least 1 and "
                              f"together at most {MAX_DRAWN_CELLS:,} cells")  # fmt: skip
    if args.json:
        summary = layout_summary(shape)
        json.dump(summary, sys.stdout)
        sys.stdout.write("\n")
        if summary["linear_positions_truncated"]:
            print(f"tpusim layout: linear_positions left out: {shape} has more than {MAX_POSITIONS:,} elements "
                  "(draw its first tiles with --out FILE.png)", file=sys.stderr)  # fmt: skip
    if out is None:
        return 0
    if not shape.element_count:
        raise TpusimError(f"{shape} has no elements: there is nothing to draw (--json describes it)")
    figure = layout_diagram(shape, max_rows=args.max_rows, max_cols=args.max_cols)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    geo = shape.geometry
    print(f"wrote {out}: {shape}, {geo.byte_size} bytes, padding {geo.padding_fraction:.1%}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------------------- run / compile
def shipped_presets(folder: str = "") -> list[str]:
    """Names of the YAML files shipped in the package's configs folder (``""``: chip configs; ``"tiling"``:
    tiling rule sets), as ``--config`` and ``--tiling`` accept them."""
    from tpusim.config import CONFIG_DIR

    return sorted(path.stem for path in (CONFIG_DIR / folder).glob("*.yaml"))


def _add_chip_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", type=Path, help="an HLO text file (as JAX or XLA print it)")
    p.add_argument("--config", default="tpu_v5e", help="chip config: a preset name or a YAML path (default tpu_v5e; "
                   f"presets: {', '.join(shipped_presets())})")  # fmt: skip
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set mxu.rows=256 (repeatable)")  # fmt: skip
    p.add_argument("--tiling", default="tpu_default", help="tiling rule set: a name or a YAML path (default "
                   f"tpu_default; shipped: {', '.join(shipped_presets('tiling'))})")  # fmt: skip
    p.add_argument("--matmul-precision", default="default", choices=("default", "high", "highest"),
                   help="what DEFAULT precision means for f32 dots: 1, 3 or 6 bf16 passes")  # fmt: skip
    p.add_argument("--no-fuse", action="store_true", help="do not fuse elementwise operations")
    p.add_argument(
        "--sync-collectives",
        action="store_true",
        help="run each collective where the module puts it (no async pairs around other compute)",
    )
    p.add_argument("--no-megacore", action="store_true",
                   help="run on one TensorCore of a two-core chip (v4, v5p), not split across both")  # fmt: skip
    p.add_argument("--compiler", default="tpusim", choices=("tpusim", "xla"),
                   help="tpusim: tpusim's own compiler (default); xla: XLA's own TPU compiler compiles the program "
                        "first (needs libtpu: pip install 'jax[tpu]') and tpusim runs its compiled module, "
                        "printing XLA's estimates beside its own")  # fmt: skip


def _configure_run(p: argparse.ArgumentParser) -> None:
    _add_chip_options(p)
    p.add_argument("--inputs", type=Path, help="inputs as .npz keyed arg0..argN-1 (default: seeded random inputs)")
    p.add_argument("--out", type=Path, help="write the outputs as .npz keyed out0..outM-1")
    p.add_argument("--seed", type=at_least(0), default=None, help="seed of the random inputs (default 0)")
    p.add_argument("--timing-only", action="store_true", help="skip numeric work where timing does not need it")
    p.add_argument("--check", action="store_true", help="compare the outputs with the reference interpreter")
    p.add_argument("--reference", action="store_true", help="run only the reference interpreter (the numpy oracle)")
    p.add_argument(
        "--replicas", type=at_least(1), default=None, help="with --reference: devices to run (replicas/partitions)"
    )
    p.add_argument(
        "--chips",
        type=at_least(1),
        default=None,
        help="run on N chips (an SPMD per-device module or N replicas); inputs and outputs get a leading axis of N",
    )
    p.add_argument(
        "--topology",
        default=None,
        help="the chips' grid, e.g. 2x4 (default: ici.shape or one for "
        "--chips); with --set dcn.slices=N, the grid of each of N slices joined by the data-center network",
    )
    from tpusim.limits import DEFAULT_MAX_CYCLES, DEFAULT_MAX_STEPS

    p.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, metavar="N",
                   help=f"stop the run after N instructions executed on the device (with --reference: N while "
                        f"iterations); default {DEFAULT_MAX_STEPS:,}")  # fmt: skip
    p.add_argument("--max-cycles", type=int, default=None, metavar="N",
                   help=f"stop the run after N simulated cycles (default 2^48 = {DEFAULT_MAX_CYCLES:,})")  # fmt: skip
    from tpusim.report.command import add_report_argument

    add_report_argument(p)


def _options(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from tpusim.compiler.options import CompileOptions

    return CompileOptions(
        tiling=args.tiling,
        matmul_precision=args.matmul_precision,
        fuse=not args.no_fuse,
        megacore=not args.no_megacore,
        async_collectives=not args.sync_collectives,
    )


@command("run", "compile an HLO program, simulate it and summarise the timing", _configure_run)
def _run_run(args: argparse.Namespace) -> int:
    """``tpusim run PROGRAM``; with ``--chips N`` / ``--topology AxB`` on many chips, where every input and
    output has a leading chip axis.

    The cyclic collector is paused for the whole command (tpusim.gcpause), and what the run leaves alive
    (the decoded program stays cached for later runs) is frozen before it is enabled again: the collections
    that scanned those objects between the phases and on the way out took 12% of a four-block decoder's
    command. (Objects alive at the end are never scanned again in this process: a cycle among them that
    becomes garbage later is not reclaimed; one-shot processes and test sessions do not notice.)"""
    import gc

    from tpusim.gcpause import paused_gc

    with paused_gc():
        try:
            return _run(args)
        finally:
            gc.freeze()


def _run(args: argparse.Namespace) -> int:
    import time

    import numpy as np

    from tpusim.api import load_program, simulate
    from tpusim.compiler.hlo.reference.io import (
        DEFAULT_SEED,
        load_inputs,
        random_inputs,
        run_reference_command,
        save_outputs,
    )
    from tpusim.config import load_config
    from tpusim.devices import RunMonitor
    from tpusim.report.progress import Activity, run_status
    from tpusim.report.summary import format_summary

    # flags that would be silently ignored, and output paths: a run must not end by finding them unwritable
    # or by overwriting what the user gave (the report folder is checked below, once the config is known)
    if args.timing_only:
        ignored = [flag for flag, on in (("--out", args.out is not None), ("--check", args.check)) if on]
        if ignored:
            raise TpusimError(f"--timing-only computes no output values: {' and '.join(ignored)} would do nothing")
    if args.out is not None:
        from tpusim.paths import check_output_path, same_file

        check_output_path(args.out, "--out", folder=False)
        for flag, given in (("the program", args.program), ("--inputs", args.inputs), ("--config", args.config)):
            if given is not None and same_file(args.out, given):
                raise TpusimError(f"--out {args.out} is {flag}: choose another file, it would be overwritten")
        import zipfile

        if args.out.is_file() and not zipfile.is_zipfile(args.out):  # (an earlier run's outputs may be replaced)
            raise TpusimError(f"--out {args.out}: the file exists and is not an .npz of outputs; it would be "
                              "overwritten: choose another file")  # fmt: skip
    if args.reference:
        # (the simulator's flags are refused, not ignored: --chips gave outputs without a leading chip axis; a
        # chip config is read, so that one that does not exist or a bad --set is said, as in any run)
        load_config(args.config, overrides=args.overrides)
        clash = [flag for flag, on in (("--report", args.report is not None), ("--check", args.check),
                                        ("--timing-only", args.timing_only),
                                        ("--max-cycles (the oracle has no cycles)", args.max_cycles is not None),
                                        ("--chips (the oracle takes --replicas)", args.chips is not None),
                                        ("--topology", args.topology is not None),
                                        ("--compiler xla", args.compiler != "tpusim"),
                                        ("--tiling", args.tiling != "tpu_default"),
                                        ("--matmul-precision", args.matmul_precision != "default"),
                                        ("--no-fuse", args.no_fuse), ("--sync-collectives", args.sync_collectives),
                                        ("--no-megacore", args.no_megacore))
                 if on]  # fmt: skip
        if clash:
            raise TpusimError(f"--reference runs only the numpy oracle; it cannot be combined with {', '.join(clash)}")
        return run_reference_command(args)
    if args.replicas is not None:
        raise TpusimError("--replicas is the devices --reference runs; the simulator takes --chips (and --topology)")
    module = load_program(args.program)
    config = load_config(args.config, overrides=args.overrides)
    many = args.chips is not None or args.topology is not None
    topology = None
    if many:
        from tpusim.topology import parse_topology, system_topology

        shape = parse_topology(args.topology) if args.topology else None
        declared = module.replica_count * module.num_partitions
        topology = system_topology(config, args.chips or (None if shape else declared), shape)
    n = topology.chips if topology is not None else 1
    xla = None
    if args.compiler == "xla":  # XLA:TPU compiles it; the rest of the run (and --check) uses its module
        from tpusim.api import through_xla

        if args.tiling != "tpu_default":
            raise TpusimError(f"--tiling {args.tiling}: XLA's compiled module carries its own layouts; the tiling "
                              "rules are tpusim's compiler's (--compiler tpusim)")  # fmt: skip

        module, xla = through_xla(args.program, config, n, topology.shape if topology is not None else None)
    if args.report is not None:
        from tpusim.report.command import report_folder

        report_folder(args, config.name)  # (chosen and checked now, kept for the report at the end)
    began = time.perf_counter()
    monitor = RunMonitor()
    # shown on a terminal only: compiling, then simulated cycles, instructions/s and an ETA when known
    with Activity(f"{args.program.name} on {config.name}", probe=lambda: run_status(monitor)):
        # compiled (HBM checked) before any input is read or drawn: a program that does not fit fails at once
        compiled = _compile_for_run(module, config, args, topology)
        compiled_in = time.perf_counter() - began
        seed = DEFAULT_SEED if args.seed is None else args.seed
        drawing = time.perf_counter()
        # (a timing-only run without --inputs leaves them to simulate, which draws the same seeded ones only
        # when some instruction reads a value: api.inputs_matter)
        per_device = (
            load_inputs(args.inputs, module, n) if args.inputs
            else None if args.timing_only
            else random_inputs(module, seed, n)
        )  # fmt: skip
        inputs = (
            None if per_device is None
            else [_stack([d[i] for d in per_device]) for i in range(len(per_device[0]))] if many
            else per_device[0]
        )  # fmt: skip
        drawn = time.perf_counter() - drawing  # (loaded or drawn here: the host line counts it as inputs)
        result = simulate(
            compiled, inputs, timing_only=args.timing_only, seed=seed, chips=n if many else None,
            topology=topology.slice_shape if topology is not None else None, monitor=monitor,
            max_steps=args.max_steps, max_cycles=_max_cycles(args),
        )  # fmt: skip
        result = dataclasses.replace(
            result,
            compile_seconds=compiled_in,
            xla=xla,
            run_seconds=result.run_seconds + drawn,
            inputs_seconds=result.inputs_seconds + drawn,
        )
    wall = time.perf_counter() - began
    checks = None
    if args.check and not args.timing_only:
        assert per_device is not None  # (a numeric run draws or loads its inputs)
        checks = _check(module, result, per_device, many, args.max_steps)
    print(format_summary(result, wall, checks))
    if many:
        from tpusim.report.links import format_links

        print()
        print(format_links(result))
    if args.out is not None and result.outputs:  # the outputs first: a failing report must not lose them
        save_outputs(args.out, [np.asarray(o) for o in result.outputs])
        print(f"wrote {args.out}", file=sys.stderr)
    if args.report is not None:
        from tpusim.report import command as report_command

        report_command.write_run_report(args, result, wall)
    return 1 if checks is not None and not all(c.ok for c in checks) else 0


def _compile_for_run(module: Module, config: Any, args: argparse.Namespace, topology: Any) -> Any:
    """Compile ``module`` as ``simulate`` would (on many chips with ``ici.shape`` set to the topology)."""
    from tpusim.api import compile_checked

    if topology is not None:
        from tpusim.config import with_overrides

        config = with_overrides(config, {"ici.shape": topology.slice_shape})
    return compile_checked(module, config, _options(args))


def _stack(values: list[Any]) -> Any:
    """Per-chip values (arrays, or tuples of them) -> one value with a leading chip axis."""
    import numpy as np

    if isinstance(values[0], tuple):
        return tuple(_stack([v[j] for v in values]) for j in range(len(values[0])))
    return np.stack([np.asarray(v) for v in values])


def _max_cycles(args: argparse.Namespace) -> int:
    from tpusim.limits import DEFAULT_MAX_CYCLES

    return DEFAULT_MAX_CYCLES if args.max_cycles is None else args.max_cycles


def _check(
    module: Module, result: SimulationResult, per_device: list[list[Any]], many: bool, max_steps: int
) -> list[OutputCheck]:
    """``--check``: the outputs against the reference interpreter (one pass of bf16 where the program's dots
    ran that way; ``evaluate_spmd`` on many chips), limited to ``max_steps`` while iterations."""
    from tpusim.check import compare_outputs, emulate_one_pass
    from tpusim.compiler.hlo.reference import evaluate, evaluate_spmd
    from tpusim.compiler.hlo.reference.io import stack_devices
    from tpusim.report.summary import program_precision

    precision = program_precision(result.compiled)
    exact = frozenset(name for _, name, opcode, _ in result.compiled.fallbacks if opcode in ("dot", "convolution"))
    oracle = emulate_one_pass(module, exact) if precision == "bf16" else module
    if many:
        reference = stack_devices(evaluate_spmd(oracle, per_device, num_devices=len(per_device), max_steps=max_steps))
    else:
        reference = evaluate(oracle, list(per_device[0]), max_steps=max_steps)
    return compare_outputs(result.outputs, reference, precision)


def _configure_compile(p: argparse.ArgumentParser) -> None:
    _add_chip_options(p)
    stages = "the module after layout assignment, the buffer assignment, or the instructions (default)"
    p.add_argument("--emit", choices=("layouts", "buffers", "asm"), default="asm", help=f"print {stages}")


@command("compile", "compile an HLO program and print a stage of the result", _configure_compile)
def _run_compile(args: argparse.Namespace) -> int:
    from tpusim.api import compile_checked, load_program
    from tpusim.compiler.hlo.printer import print_module
    from tpusim.config import load_config
    from tpusim.isa.text import print_program

    config = load_config(args.config, overrides=args.overrides)
    module = load_program(args.program)
    if args.compiler == "xla":
        from tpusim.api import through_xla

        module, _ = through_xla(args.program, config)
    compiled = compile_checked(module, config, _options(args))
    if args.emit == "layouts":
        print(print_module(compiled.module))
        for r in compiled.relayouts:
            print(f"// relayout {r.computation}/{r.name}: {r.from_shape} -> {r.to_shape} ({r.reason})")
    elif args.emit == "buffers":
        print(f"// HBM: {compiled.hbm_bytes} bytes used of {compiled.config.hbm.bytes}")
        print(f"{'offset':>12} {'bytes':>10}  {'kind':11} value : shape")
        for b in sorted(compiled.buffers.buffers, key=lambda b: b.offset):
            print(f"{b.offset:#12x} {b.size:10d}  {b.kind:11} {b.label} : {b.shape}")
    else:
        print(print_program(compiled.program))
    return 0


# --------------------------------------------------------------------------------------- report / sweep
def _configure_report(p: argparse.ArgumentParser) -> None:
    from tpusim.report.command import configure_report

    configure_report(p)


@command("report", "render a report folder (report.md, plots) again from its summary.json", _configure_report)
def _run_report(args: argparse.Namespace) -> int:
    from tpusim.report.command import run_report

    return run_report(args)


def _configure_sweep(p: argparse.ArgumentParser) -> None:
    from tpusim.sweep.command import configure_sweep

    configure_sweep(p)


@command("sweep", "run programs over a grid of configs and options, in parallel and resumably", _configure_sweep)
def _run_sweep(args: argparse.Namespace) -> int:
    from tpusim.sweep.command import run_sweep_command

    return run_sweep_command(args)


# --------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpusim",
        description="A cycle-level simulator of a TPU-like accelerator that runs real XLA HLO programs.",
    )
    from tpusim import __version__

    parser.add_argument("--version", action="version", version=f"tpusim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS.values():
        cmd.configure(sub.add_parser(cmd.name, help=cmd.help, description=cmd.help))
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a batch system's time limit), raised where the command is, so that it stops as on
    Ctrl-C: a sweep stops its workers and writes its tables, a run says where it was; exit status 143."""

    exit_code = 143  # the shell's 128 + SIGTERM


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tpusim`` console script."""
    args = build_parser().parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        return _main(args)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _main(args: argparse.Namespace) -> int:
    try:
        return COMMANDS[args.command].run(args)
    except TpusimError as err:
        print(f"tpusim {args.command}: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 1)
    except KeyboardInterrupt as err:  # Ctrl-C: one line saying where the run was, the shell's 128 + SIGINT
        from tpusim.limits import interrupt_position

        where = interrupt_position(err)
        print(f"tpusim {args.command}: interrupted" + (f" {where}" if where else ""), file=sys.stderr)
        return getattr(err, "exit_code", 130)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as err:
        print(f"tpusim {args.command}: cannot open {err.filename}: {err.strerror}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (`tpusim run ... | head`): stop quietly
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
