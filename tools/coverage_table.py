"""Generate the generated sections of docs/reference.md: the HLO coverage table and the tolerance table.

The coverage table lists every opcode of the parser's table (``tpusim.compiler.hlo.opcodes.OPCODES``) with
whether the reference interpreter has a function for it (``REFERENCE``) and how the compiler runs it on the
device (``tpusim.compiler.lowering``: ``LOWERINGS``, ``SPECIALISED``, ``NO_CODE``, else the fallback). The tolerance
table is ``tests/jax_oracle.TOLERANCES`` (with the heavy-op rows of ``tests/heavy_checks``).

    python tools/coverage_table.py            # print both sections
    python tools/coverage_table.py --write    # rewrite them in docs/reference.md

tests/test_reference_core.py fails when docs/reference.md differs from what this script writes.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reference.md"
SECTIONS = ("coverage", "tolerances")

# Opcodes the reference handles outside the REFERENCE registry, and why.
HANDLED_BY_CORE = {"parameter": "bound by the caller (evaluate / ctx.call)"}


def _device(op: str) -> str:
    """How the compiler runs ``op`` on the device: ``yes`` (a lowering rule), ``some`` (a rule for some
    instances, the rest fall back), ``no code`` (buffer aliasing or data the loader places), ``fallback``,
    or ``**no**`` (no rule and no reference function: a compile error)."""
    from tpusim.compiler.hlo.reference import REFERENCE
    from tpusim.compiler.lowering import LOWERINGS
    from tpusim.compiler.lowering.registry import NO_CODE, SPECIALISED

    if op in LOWERINGS:
        return "yes"
    if op in NO_CODE:
        return "no code"
    if op in SPECIALISED:
        return "some"
    return "fallback" if op in REFERENCE else "**no**"


def coverage_table() -> str:
    """The markdown coverage table (one row per opcode of the parser's table, then reference-only ones)."""
    from tpusim.compiler.hlo.opcodes import OPCODES
    from tpusim.compiler.hlo.reference import REFERENCE

    rows = ["| opcode | parsed | reference | device |", "| --- | --- | --- | --- |"]
    for op in sorted(set(OPCODES) | set(REFERENCE)):
        parsed = "yes" if op in OPCODES else "alias"
        ref = "yes" if op in REFERENCE else ("core" if op in HANDLED_BY_CORE else "**no**")
        rows.append(f"| `{op}` | {parsed} | {ref} | {_device(op)} |")
    missing = sorted(op for op in OPCODES if op not in REFERENCE and op not in HANDLED_BY_CORE)
    rows.append("")
    rows.append(f"{len(OPCODES)} parsed opcodes; the reference lacks {len(missing)}: {', '.join(missing) or 'none'}.")
    return "\n".join(rows)


def tolerance_table() -> str:
    """The markdown tolerance table: every non-exact row of the one table."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        jax_oracle = importlib.import_module("jax_oracle")
    finally:
        sys.path.pop(0)
    groups: dict[tuple[str, int, float, float, str], list[str]] = {}
    for (key, dtype), tol in jax_oracle.TOLERANCES.items():
        if not tol.exact:
            groups.setdefault((key, tol.ulps, tol.atol, tol.rtol, tol.why), []).append(dtype)
    rows = ["| key | types | ulps | atol | rtol | why |", "| --- | --- | --- | --- | --- | --- |"]
    for (key, ulps, atol, rtol, why), types in sorted(groups.items()):
        why = why.replace("|", "\\|")
        rows.append(f"| `{key}` | {', '.join(sorted(types))} | {ulps} | {atol:g} | {rtol:g} | {why} |")
    rows.append("")
    rows.append("Every (opcode or category, type) not listed is exact (bit for bit).")
    return "\n".join(rows)


def render(doc: str) -> str:
    """``doc`` with its generated sections replaced by the current tables."""
    tables = {"coverage": coverage_table(), "tolerances": tolerance_table()}
    for name in SECTIONS:
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        if begin not in doc or end not in doc:
            raise SystemExit(f"{DOC}: markers {begin} / {end} are missing")
        head, rest = doc.split(begin, 1)
        _, tail = rest.split(end, 1)
        doc = f"{head}{begin}\n{tables[name]}\n{end}{tail}"
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite the sections in {DOC.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    if args.write:
        DOC.write_text(render(DOC.read_text()))
    else:
        print(coverage_table())
        print()
        print(tolerance_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
