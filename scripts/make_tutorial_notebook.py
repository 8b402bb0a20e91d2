"""docs/tutorial.md as a Jupyter notebook (docs/tutorial.ipynb): its prose as markdown cells, each ```python
block's ``>>>`` lines as one code cell (the doctest's expected outputs are left for the notebook to print).
``tests/test_tutorial_notebook.py`` checks that the committed notebook is this conversion of the page and
runs its cells in order. Usage::

    python scripts/make_tutorial_notebook.py            # (re)write docs/tutorial.ipynb
    python scripts/make_tutorial_notebook.py --check    # exit 1 if the committed notebook is stale
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "tutorial.md"
NOTEBOOK = ROOT / "docs" / "tutorial.ipynb"


def _code(lines: list[str]) -> str:
    """The Python source of a doctest block: its ``>>>`` and ``...`` lines without the prompts."""
    out = []
    for line in lines:
        if line.startswith((">>> ", "... ")):
            out.append(line[4:])
        elif line in (">>>", "..."):
            out.append("")
    return "\n".join(out)


def cells(page: str) -> list[tuple[str, str]]:
    """``(kind, source)`` of every cell: ``markdown`` for prose (and ``text`` blocks), ``code`` for
    ```python blocks."""
    out: list[tuple[str, str]] = []
    prose: list[str] = []
    block: list[str] | None = None
    for line in page.splitlines():
        if block is not None:
            if line.strip() == "```":
                out.append(("code", _code(block)))
                block = None
            else:
                block.append(line)
        elif line.strip() == "```python":
            if "".join(prose).strip():
                out.append(("markdown", "\n".join(prose).strip("\n")))
            prose = []
            block = []
        else:
            prose.append(line)
    if "".join(prose).strip():
        out.append(("markdown", "\n".join(prose).strip("\n")))
    return [(kind, source) for kind, source in out if source.strip()]


def notebook(page: str) -> dict[str, Any]:
    def cell(n: int, kind: str, source: str) -> dict[str, Any]:
        lines = source.splitlines(keepends=True)
        base: dict[str, Any] = {"cell_type": kind, "id": f"cell-{n}", "metadata": {}, "source": lines}
        if kind == "code":
            base.update(execution_count=None, outputs=[])
        return base

    return {
        "cells": [cell(n, kind, source) for n, (kind, source) in enumerate(cells(page))],
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def text(page: str) -> str:
    return json.dumps(notebook(page), indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    want = text(PAGE.read_text())
    if "--check" in sys.argv[1:]:
        if not NOTEBOOK.exists() or NOTEBOOK.read_text() != want:
            print(f"{NOTEBOOK} is stale: run python scripts/make_tutorial_notebook.py", file=sys.stderr)
            return 1
        return 0
    NOTEBOOK.write_text(want)
    print(f"wrote {NOTEBOOK}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
