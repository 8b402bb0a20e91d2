"""Examples in the README, in docs/ and in tpusim's docstrings run as doctests, so the documentation cannot rot."""

import doctest
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_examples_run(path: Path) -> None:
    result = doctest.testfile(str(path), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    marker = readme.index("<!-- test-command -->")
    assert readme[marker + 1] == "```sh"
    command = readme[marker + 2]
    assert all(step in command for step in ("ruff check", "ruff format --check", "mypy", "pytest")), command
    assert "<!-- test-command -->" in (ROOT / ".ci" / "run").read_text()


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted((ROOT / "tpusim").rglob("*.py")):
        if any(line.lstrip().startswith(">>> ") and "+SKIP" not in line for line in path.read_text().splitlines()):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("name", _modules_with_examples())
def test_module_examples_run(name: str) -> None:
    """The ``>>>`` examples in tpusim's docstrings."""
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
