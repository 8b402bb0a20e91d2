"""Command-line value types shared by ``tpusim``'s commands: argparse names the flag and prints the reason
as a usage error (exit status 2), instead of a traceback from deep inside a run."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["at_least", "between"]


def at_least(low: int) -> Callable[[str], int]:
    """An integer of at least ``low`` (0: a seed; 1: a count)."""
    return between(low, None)


def between(low: int, high: int | None) -> Callable[[str], int]:
    """An integer from ``low`` to ``high`` (None: no upper bound)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{text} is less than {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{text} is more than {high}")
        return value

    parse.__name__ = "int"  # (argparse's message for a non-integer says "invalid int value")
    return parse
