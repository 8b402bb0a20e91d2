"""Dependencies point one way: memory <- semantics <- compiler (parser, oracle, passes, lowering) / devices
<- api <- report, sweep, cli (docs/architecture.md).

Every ``import`` of a ``tpusim`` module anywhere in a file counts (top level, inside functions, under
``TYPE_CHECKING``): a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tpusim

ROOT = Path(tpusim.__file__).parent

BASE = {"errors", "limits", "paths", "flags", "yamlio", "lazy", "gcpause", "argtypes"}
"""Leaf modules anything may use (errors, limits, file paths, flags, YAML reading, lazy imports, pausing the
garbage collector)."""

ALLOWED: dict[str, set[str]] = {
    "memory": set(),
    "semantics": {"memory"},
    "isa": {"memory"},
    "config": set(),
    "topology": {"config"},
    "compiler.hlo": {"memory", "semantics"},
    "compiler.hlo.reference": {"compiler.hlo", "memory", "semantics"},
    "compiler": {"compiler.hlo", "memory", "semantics", "isa", "config", "topology"},
    "compiler.lowering": {"compiler", "compiler.hlo", "memory", "semantics", "isa", "config", "topology"},
    "devices": {"memory", "semantics", "isa", "config", "topology"},
}
"""What each layer may import besides itself and :data:`BASE`. Layers not listed (api and above) are checked
by :data:`FORBIDDEN`."""

FORBIDDEN: dict[str, set[str]] = {
    "api": {"report", "sweep", "cli"},  # (the result's report conveniences excepted: COMPOSERS)
    "report": {"sweep", "cli"},
    "sweep": {"cli"},
}

COMPOSERS = {"tpusim/compiler/pipeline.py": {"compiler.lowering"}, "tpusim/api.py": {"report"}}
"""Files allowed one edge outside the table: the compiler's pipeline runs the lowering after the passes
(which run before layouts exist and so must not depend on it); ``SimulationResult.summary()``,
``.to_pandas()`` and ``._repr_html_()`` import the report package on use (conveniences on the result, as
pandas' ``.plot``)."""


def layer(module: str) -> str:
    """``tpusim.compiler.hlo.reference.core`` -> ``compiler.hlo.reference``; ``tpusim.api`` -> ``api``."""
    parts = module.split(".")[1:]
    for depth in (3, 2):
        if ".".join(parts[:depth]) in ("compiler.hlo.reference", "compiler.hlo", "compiler.lowering"):
            return ".".join(parts[:depth])
    return parts[0] if parts else "tpusim"


def imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tpusim":
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "tpusim"]
    return out


def violations() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        mine = layer(module)
        for line, target in imports(path):
            theirs = layer(target)
            if theirs == mine or theirs in BASE or theirs in COMPOSERS.get(rel, set()):
                continue
            if mine in ALLOWED and theirs not in ALLOWED[mine]:
                found.append(f"{rel}:{line}: {mine} imports {target}")
            if theirs in FORBIDDEN.get(mine, set()):
                found.append(f"{rel}:{line}: {mine} imports {target}")
    return found


def test_every_import_points_down_the_layers() -> None:
    assert violations() == []


def test_the_check_sees_a_backward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from tpusim.compiler.hlo.reference import evaluate\n")
    assert imports(bad) == [(2, "tpusim.compiler.hlo.reference")]
    assert layer("tpusim.compiler.hlo.reference.core") == "compiler.hlo.reference"
    assert "compiler.hlo.reference" not in ALLOWED["compiler.lowering"]


@pytest.mark.parametrize(
    ("package", "absent"),
    [
        ("tpusim.compiler.hlo", "tpusim.compiler.hlo.reference"),  # parsing loads no oracle module
        ("tpusim.devices", "tpusim.compiler"),  # the device model knows no HLO
        ("tpusim.semantics.elementwise", "tpusim.compiler"),
    ],
)
def test_importing_a_layer_loads_nothing_above_it(package: str, absent: str) -> None:
    code = f"import sys, {package}; print(sorted(m for m in sys.modules if m.startswith('{absent}')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
