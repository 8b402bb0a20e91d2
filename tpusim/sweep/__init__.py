"""Sweeps: run programs over a grid of chip configs and compile options, in parallel, resumably, and compare.

``tpusim sweep SPEC.yaml`` (or :func:`run_sweep` on :func:`load_spec`); specs are described in
``docs/sweeps.md`` and shipped in ``configs/sweeps/``. The names are imported when first used.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

_WHERE = {
    "SweepInterrupted": "runner", "SweepResult": "runner", "run_sweep": "runner",
    "Point": "spec", "SweepError": "spec", "SweepSpec": "spec", "load_spec": "spec", "SweepWarning": "store",
}  # fmt: skip

__all__ = [
    "Point", "SweepError", "SweepInterrupted", "SweepResult", "SweepSpec", "SweepWarning", "load_spec", "run_sweep",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    """The names above, imported when first used (``tpusim sweep --help`` needs none of them)."""
    if name in _WHERE:
        return getattr(importlib.import_module(f"tpusim.sweep.{_WHERE[name]}"), name)
    if importlib.util.find_spec(f"tpusim.sweep.{name}") is not None:  # a submodule, as an eager import set it
        return importlib.import_module(f"tpusim.sweep.{name}")
    raise AttributeError(f"module 'tpusim.sweep' has no attribute {name!r}")
