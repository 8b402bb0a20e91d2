"""Command-line value types shared by ``tpusim``'s commands: argparse names the flag and prints the reason
as a usage error (exit status 2), instead of a traceback from deep inside a run."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["at_least", "between"]


def at_least(low: int) -> Callable[[str], int]:
    """An integer of at least ``low`` (0: a seed; 1: a count)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{text} is less than {low}")
        return value

    parse.__name__ = "int"  # (argparse's message for a non-integer says "invalid int value")
    return parse


def between(low: int, high: int) -> Callable[[str], int]:
    """An integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not from {low} to {high}")
        return value

    parse.__name__ = "int"
    return parse
