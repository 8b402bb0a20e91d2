"""The error of the semantics package."""

from __future__ import annotations

__all__ = ["SemanticsError"]


class SemanticsError(ValueError):
    """Operands an operation does not accept (the message says which and why)."""
