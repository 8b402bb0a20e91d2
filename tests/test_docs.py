"""Examples in the README and in docs/ run as doctests, so the documentation cannot rot."""

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
    assert "pytest" in readme[marker + 2]
    assert "<!-- test-command -->" in (ROOT / ".ci" / "run").read_text()
