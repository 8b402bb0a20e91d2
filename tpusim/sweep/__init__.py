"""Sweeps: run programs over a grid of chip configs and compile options, in parallel, resumably, and compare.

``tpusim sweep SPEC.yaml`` (or :func:`run_sweep` on :func:`load_spec`); specs are described in
``docs/sweeps.md`` and shipped in ``configs/sweeps/``. The names are imported when first used.
"""

from __future__ import annotations

from typing import Any

from tpusim.lazy import lazy_attribute

_WHERE = {
    "SweepInterrupted": "tpusim.sweep.runner", "SweepResult": "tpusim.sweep.runner", "run_sweep": "tpusim.sweep.runner",
    "Point": "tpusim.sweep.spec", "SweepError": "tpusim.sweep.spec", "SweepSpec": "tpusim.sweep.spec",
    "load_spec": "tpusim.sweep.spec", "SweepWarning": "tpusim.sweep.store",
}  # fmt: skip

__all__ = [
    "Point", "SweepError", "SweepInterrupted", "SweepResult", "SweepSpec", "SweepWarning", "load_spec", "run_sweep",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    """The names above, imported when first used (``tpusim sweep --help`` needs none of them)."""
    return lazy_attribute(__name__, _WHERE, name, submodules=True)
