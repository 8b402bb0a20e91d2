"""The ``tpusim`` command line: one subcommand per job, each a configure/run pair in a registry.

Every error a user can cause (bad shape strings, HLO text, configs, inputs) is a TpusimError and is
printed as one clear message without a traceback; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tpusim.errors import TpusimError

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


@command("layout", "draw how a layout places an array in memory", _configure_layout)
def _run_layout(args: argparse.Namespace) -> int:
    from tpusim.memory.diagram import layout_diagram, layout_summary
    from tpusim.memory.shape_text import parse_shape

    shape = parse_shape(args.shape)
    if args.json:
        json.dump(layout_summary(shape), sys.stdout)
        sys.stdout.write("\n")
    out = args.out if args.out is not None or args.json else Path("reports/layout.png")
    if out is None:
        return 0
    if out.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise TpusimError(f"--out {out}: the diagram is written as .png, .svg or .pdf, not '{out.suffix}'")
    figure = layout_diagram(shape, max_rows=args.max_rows, max_cols=args.max_cols)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    geo = shape.geometry  # type: ignore[union-attr]
    print(f"wrote {out}: {shape}, {geo.byte_size} bytes, padding {geo.padding_fraction:.1%}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpusim",
        description="A cycle-level simulator of a TPU-like accelerator that runs real XLA HLO programs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS.values():
        cmd.configure(sub.add_parser(cmd.name, help=cmd.help, description=cmd.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tpusim`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except TpusimError as err:
        print(f"tpusim {args.command}: {err}", file=sys.stderr)
        return 1
    except (FileNotFoundError, IsADirectoryError, PermissionError) as err:
        print(f"tpusim {args.command}: cannot open {err.filename}: {err.strerror}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
