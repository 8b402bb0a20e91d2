"""Environment flags, read in one place.

- ``TPUSIM_DEBUG``: 0 (default) quiet; 2 prints the module or program after each compiler pass.
- ``TPUSIM_VERIFY``: 1 checks every compiled program with :func:`tpusim.compiler.verify.verify_program`
  (on in the test suite, off by default for speed).
"""

from __future__ import annotations

import os

__all__ = ["debug_level", "verify_enabled"]


def debug_level() -> int:
    try:
        return int(os.environ.get("TPUSIM_DEBUG", "0"))
    except ValueError:
        return 0


def verify_enabled() -> bool:
    return os.environ.get("TPUSIM_VERIFY", "0") not in ("", "0", "false", "no")
