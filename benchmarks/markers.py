"""Rewrite the text between a pair of HTML comment markers in a document (the benchmarks' ``--write``)."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def write_between(path: Path, begin: str, end: str, block: str) -> int:
    """Replace what lies between ``begin`` and ``end`` in ``path`` with ``block``; 0, or 1 (with a message on
    stderr) when the file does not have the pair exactly once."""
    text = path.read_text()
    new, n = re.subn(re.escape(begin) + r".*?" + re.escape(end), lambda _: f"{begin}\n{block}\n{end}", text, flags=re.S)
    if n != 1:
        print(f"{path}: no {begin} ... {end} markers", file=sys.stderr)
        return 1
    path.write_text(new)
    return 0
