"""The tutorial as a notebook (docs/tutorial.ipynb): the committed file is the conversion of docs/tutorial.md,
and its code cells run in order, as a notebook kernel would run them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _maker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "make_tutorial_notebook", ROOT / "scripts" / "make_tutorial_notebook.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_notebook_is_the_tutorial_page() -> None:
    maker = _maker()
    assert maker.NOTEBOOK.read_text() == maker.text(maker.PAGE.read_text()), "run scripts/make_tutorial_notebook.py"


def test_the_notebook_cells_run_in_order() -> None:
    doc = json.loads((ROOT / "docs" / "tutorial.ipynb").read_text())
    code = [c for c in doc["cells"] if c["cell_type"] == "code"]
    assert len(code) >= 5
    namespace: dict[str, object] = {"__name__": "__main__"}
    for n, cell in enumerate(code):
        exec(compile("".join(cell["source"]), f"tutorial.ipynb cell {n}", "exec"), namespace)
    assert "result" in namespace  # the simulation the tutorial reads
